"""Across base episodes: the survival curve (fraction still succeeding vs severity) with a pointwise and a
simultaneous band, the median breaking point with an interval, and the held-out confirmation check.

The breaking point B of a base episode is the smallest grid severity at which it failed (+inf when it never
broke up to the maximum); episodes that failed clean have no breaking point and are left out (counted apart).
S(s) = P(B > s) is estimated by the empirical survival function: the pointwise band is Wilson's score interval
at each severity, the simultaneous band the Dvoretzky-Kiefer-Wolfowitz band (holds at every severity at once),
and the median's interval is the distribution-free order-statistic interval.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Sequence

from scipy import stats

from robocasa_shift.sweep.search import BROKE, NEVER_BROKE, EpisodeBreak

LEVEL = 0.95


def wilson(successes: int, n: int, level: float = LEVEL) -> List[float]:
    """Wilson's score interval for a proportion ([0, 1] when n is 0)."""
    if n == 0:
        return [0.0, 1.0]
    z = stats.norm.ppf(0.5 + level / 2)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def dkw_half_width(n: int, level: float = LEVEL) -> float:
    """Half width of the DKW band: P(sup |S_n - S| > eps) <= 2 exp(-2 n eps^2)."""
    return 1.0 if n == 0 else min(1.0, math.sqrt(math.log(2 / (1 - level)) / (2 * n)))


def breaking_points(breaks: Sequence[EpisodeBreak], severities: Sequence[float]) -> List[float]:
    """Each clean-successful episode's breaking severity (+inf when it never broke)."""
    return [severities[b.critical] if b.verdict == BROKE else math.inf
            for b in breaks if b.verdict in (BROKE, NEVER_BROKE)]


def median_interval(points: Sequence[float], level: float = LEVEL) -> Dict[str, Any]:
    """The median breaking point and its order-statistic interval (ranks from Binomial(n, 1/2)); +inf entries
    stand for "beyond the maximum" and are written as None."""
    values = sorted(points)
    n = len(values)
    if n == 0:
        return {"median": None, "interval": None, "beyond_max": False}
    alpha = 1 - level
    lo_rank = int(stats.binom.ppf(alpha / 2, n, 0.5))  # P(X <= lo_rank - 1) <= alpha / 2
    if stats.binom.cdf(lo_rank, n, 0.5) <= alpha / 2:
        lo_rank += 1
    lo_rank = max(lo_rank, 1)
    hi_rank = n + 1 - lo_rank
    median = values[(n - 1) // 2] if n % 2 else 0.5 * (values[n // 2 - 1] + values[n // 2])

    def finite(x: float) -> Optional[float]:
        return None if math.isinf(x) else float(x)

    return {"median": finite(median), "beyond_max": math.isinf(median),
            "interval": [finite(values[lo_rank - 1]), finite(values[hi_rank - 1])],
            "coverage": float(stats.binom.cdf(hi_rank - 1, n, 0.5) - stats.binom.cdf(lo_rank - 1, n, 0.5))}


def survival_curve(breaks: Sequence[EpisodeBreak], severities: Sequence[float], level: float = LEVEL) -> Dict[str, Any]:
    """The curve at every grid severity, with both bands, the median breaking point and the counts."""
    points = breaking_points(breaks, severities)
    n = len(points)
    eps = dkw_half_width(n, level)
    rows = []
    for s in severities:
        alive = sum(1 for b in points if b > s)
        rate = alive / n if n else None
        rows.append({"severity": s, "surviving": alive, "n": n, "rate": rate,
                     "pointwise": wilson(alive, n, level),
                     "simultaneous": [max(0.0, (rate or 0) - eps), min(1.0, (rate or 0) + eps)] if n else [0.0, 1.0]})
    return {"n": n, "level": level, "points": rows, "median_breaking_point": median_interval(points, level),
            "failed_clean": sum(1 for b in breaks if b.verdict not in (BROKE, NEVER_BROKE)),
            "never_broke": sum(1 for b in breaks if b.verdict == NEVER_BROKE),
            "non_monotone": [b.episode for b in breaks if b.non_monotone]}


def confirm(curve: Dict[str, Any], held_out: Dict[float, Sequence[bool]], level: float = LEVEL) -> Dict[str, Any]:
    """Check the curve's success rates on held-out base episodes at severities declared before they ran.

    At each declared severity the held-out rate and the curve's rate are two independent proportions; the point
    is confirmed when Newcombe's interval for their difference (hybrid Wilson) holds 0, each at level
    1 - (1 - ``level``) / k for k points (Bonferroni: all of them hold together at ``level``).

    Args:
        held_out: severity -> the held-out episodes' successes there (clean-successful episodes only).
    """
    rows = {row["severity"]: row for row in curve["points"]}
    k = max(1, len(held_out))
    each = 1 - (1 - level) / k
    out = []
    for s, outcomes in sorted(held_out.items()):
        if s not in rows:
            raise ValueError(f"severity {s} is not on the curve's grid")
        row = rows[s]
        m, hits = len(outcomes), sum(bool(o) for o in outcomes)
        p1, p2 = (row["rate"] or 0.0), (hits / m if m else 0.0)
        l1, u1 = wilson(row["surviving"], row["n"], each)
        l2, u2 = wilson(hits, m, each)
        low = p2 - p1 - math.sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2)
        high = p2 - p1 + math.sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2)
        out.append({"severity": s, "curve_rate": row["rate"], "held_out_rate": p2 if m else None, "held_out_n": m,
                    "difference_interval": [low, high], "confirmed": bool(m) and low <= 0 <= high})
    return {"level": level, "points": out, "passed": bool(out) and all(p["confirmed"] for p in out)}


__all__ = ["LEVEL", "breaking_points", "confirm", "dkw_half_width", "median_interval", "survival_curve", "wilson"]
