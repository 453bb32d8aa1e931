"""The recoverability estimator (RESCUE, Sec. III-B): Jeffreys lower quantile, expansion, horizon.

With ``k`` successes in ``n`` branches, the success probability of a
(checkpoint, intervention) is estimated by the lower ``q`` quantile of the
Jeffreys posterior Beta(k + 1/2, n - k + 1/2): with few branches it leans
toward "not recoverable" rather than declaring recovery from a few lucky
rollouts. A checkpoint is recoverable at criterion ``tau`` when its estimate
reaches ``tau``; the horizon is the latest recoverable checkpoint, with no
assumption that recoverability decreases with time.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

Q = 0.25  # the lower posterior quantile
TAU = 0.5  # the primary recovery criterion
TAUS_REPORTED = (0.3, 0.5, 0.7)
K_INITIAL = 4
K_EXPANDED = 16


def jeffreys_quantile(k: int, n: int, q: float) -> float:
    """The ``q`` quantile of the Jeffreys posterior Beta(k + 1/2, n - k + 1/2) of ``k`` successes in ``n``."""
    from scipy.stats import beta

    if not 0 <= k <= n or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    return float(beta.ppf(q, k + 0.5, n - k + 0.5))


def jeffreys_lower(k: int, n: int, q: float = Q) -> float:
    """The estimate: the lower ``q`` quantile of the Jeffreys posterior."""
    return jeffreys_quantile(k, n, q)


def central_interval(k: int, n: int, mass: float = 0.5) -> Tuple[float, float]:
    """The central ``mass`` posterior interval (0.5: the 25% and 75% quantiles)."""
    tail = (1.0 - mass) / 2.0
    return jeffreys_quantile(k, n, tail), jeffreys_quantile(k, n, 1.0 - tail)


def needs_expansion(k: int, n: int, tau: float = TAU) -> bool:
    """True when the central 50% posterior interval straddles ``tau``: the verdict is not yet clear."""
    low, high = central_interval(k, n)
    return low < tau < high


def recoverability_horizon(steps: Sequence[int], estimates: Sequence[Optional[float]], tau: float = TAU) -> Optional[int]:
    """The latest step whose estimate reaches ``tau``; None when none does (estimates of None are skipped)."""
    recoverable = [s for s, e in zip(steps, estimates) if e is not None and e >= tau]
    return max(recoverable) if recoverable else None


def combined_estimate(by_intervention: Mapping[str, Optional[float]]) -> Optional[float]:
    """The repertoire's estimate at one checkpoint: the best of its interventions (None when none ran)."""
    values = [v for v in by_intervention.values() if v is not None]
    return max(values) if values else None


def _binomial(n: int, p: float) -> List[float]:
    return [math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(n + 1)]


def operating_characteristic(p: float, tau: float = TAU, q: float = Q, k_initial: int = K_INITIAL,
                             k_expanded: int = K_EXPANDED, k_fixed: int = 32) -> Dict[str, float]:
    """Exactly, at a true success probability ``p``: P(recoverable) under the adaptive rule (``k_initial``
    branches, expanded to ``k_expanded`` when the central 50% posterior interval straddles ``tau``), under a
    fixed ``k_fixed`` branches, and P(the two disagree) when the fixed reference reuses the adaptive branches and
    adds the rest (as ``branch --k-fixed`` runs it).

    Returns:
        ``{"p", "adaptive", "fixed", "disagree", "expanded"}`` (``expanded``: P(the rule expands)).
    """
    recoverable_fixed = [jeffreys_lower(j, k_fixed, q) >= tau for j in range(k_fixed + 1)]
    adaptive = fixed = disagree = expanded = 0.0
    for first, weight in enumerate(_binomial(k_initial, p)):
        if k_expanded > k_initial and needs_expansion(first, k_initial, tau):
            expanded += weight
            outcomes = [(first + more, k_expanded, weight * w) for more, w in enumerate(_binomial(k_expanded - k_initial, p))]
        else:
            outcomes = [(first, k_initial, weight)]
        for k, n, w in outcomes:
            verdict = jeffreys_lower(k, n, q) >= tau
            adaptive += w * verdict
            for extra, w2 in enumerate(_binomial(k_fixed - n, p)):
                reference = recoverable_fixed[k + extra]
                fixed += w * w2 * reference
                disagree += w * w2 * (verdict != reference)
    return {"p": float(p), "adaptive": adaptive, "fixed": fixed, "disagree": disagree, "expanded": expanded}


OC_PROBABILITIES = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


__all__ = ["K_EXPANDED", "K_INITIAL", "Q", "TAU", "TAUS_REPORTED", "central_interval", "combined_estimate",
           "jeffreys_lower", "jeffreys_quantile", "needs_expansion", "OC_PROBABILITIES", "operating_characteristic",
           "recoverability_horizon"]
