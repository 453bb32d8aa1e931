"""Intervals, exact tests, verdicts, power and the coverage checks behind the headline (macro dSR).

The headline of a study is the macro dSR: the equal-weight mean over tasks of each task's paired
degradation, dSR_t = (b_t - c_t) / n_t, where b_t counts the S->F pairs (clean success, perturbed
failure), c_t the F->S pairs and n_t the valid pairs of task t. Everything here works from the four
per-task counts (SS, SF, FS, FF) alone, in numpy (no scipy), vectorised where the scans and the
coverage simulation need it.

- :func:`task_interval`: one task's calibrated interval, Tango's score interval for a paired
  difference with a continuity correction of 1/2 (coverage measured exactly by enumeration:
  :func:`one_task_coverage`).
- :func:`macro_interval` / :func:`calibrated_interval`: the macro's calibrated interval, the
  per-task intervals combined by square-and-add (MOVER); with one task it is :func:`task_interval`.
- :func:`signflip_test`: the exact stratified sign-flip test that matches the macro (pair weights
  1 / (n_tasks * n_t)), by convolution of per-task distributions; :func:`signflip_p_values` is the
  same test for many tables at once.
- :func:`equivalence_p`: the two one-sided tests at +-margin that the calibrated interval inverts.
- :func:`decide` / :func:`decision` / :func:`verdict`: interval and verdict as ONE object. The
  interval shown is the calibrated one, extended to reach 0 whenever the verdict's exact test (after
  Holm) does not reject; the verdict is read off that interval alone, so an interval that excludes 0
  always carries DEGRADED or IMPROVED and never UNDERPOWERED or NO CHANGE DETECTED.
- :func:`random_outcome_power`, :func:`minimum_detectable_dsr`, :func:`plan_pairs`: power of the
  headline test over random pair outcomes (exact, or Monte Carlo with a fixed seed and its standard
  error), the smallest detectable shift and the pair count a wanted shift needs, each both as the
  smallest value with the power and as the smallest from which every larger one has it.
- :func:`stratified_trend_test`: the exact stratified trend test of a factor's levels within base
  episode (does dSR rise with the level?).
- :func:`coverage_grid`: the simulation that measures how often the intervals (the paper's
  percentile pair bootstrap and the calibrated one, for the macro and per task) cover a known truth.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from functools import lru_cache, reduce
from statistics import NormalDist
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.errors import AnalysisError

# Two-sided 95%: the 0.975 quantile of the standard normal (Wilson intervals, normal approximations).
Z95 = 1.959963984540054
ALPHA = 0.05
# The equivalence tests (two one-sided tests at +-margin) run at ALPHA / 2 per side: a single
# condition reads NO CHANGE DETECTED exactly when its 95% calibrated interval lies inside the margin.
EQUIVALENCE_ALPHA = ALPHA / 2
POWER = 0.80
MIN_EFFECT = 0.10
CONTINUITY = 0.5  # Tango's score numerator |b - c - n delta| is reduced by this much
MDE_STEP = 0.005

DEGRADED = "DEGRADED"
IMPROVED = "IMPROVED"
NO_CHANGE = "NO CHANGE DETECTED"
UNDERPOWERED = "UNDERPOWERED"
VERDICTS = (DEGRADED, IMPROVED, NO_CHANGE, UNDERPOWERED)
# A comparison of two runs (A - B in success, B the baseline) reads from the reader's side: a difference above 0
# means A succeeds more than its baseline. Words for (above 0, below 0) of the quantity an interval bounds.
REGRESSED = "REGRESSED"
DSR_DIRECTIONS = (DEGRADED, IMPROVED)  # dSR = clean - perturbed success: above 0 is worse
SUCCESS_DIFF_DIRECTIONS = (IMPROVED, REGRESSED)  # success A - baseline B: above 0 is better
COMPARE_VERDICTS = (IMPROVED, REGRESSED, NO_CHANGE, UNDERPOWERED)

TASK_METHOD = (
    "Tango's score interval for a paired difference (b - c) / n with a continuity correction of 1/2: the dSR values "
    "delta whose score statistic (|b - c - n delta| - 1/2) / sqrt(n (2 p21~ + delta (1 - delta))), p21~ the "
    "restricted maximum-likelihood F->S probability, stays within +-1.96"
)
CALIBRATED_METHOD = (
    "per task: " + TASK_METHOD + "; the macro: the per-task intervals combined by square-and-add (MOVER): "
    "macro - sqrt(sum_t (d_t - l_t)^2) / n_tasks, macro + sqrt(sum_t (u_t - d_t)^2) / n_tasks (with one task, the "
    "task's interval); the interval shown is extended to reach 0 whenever the verdict's exact test does not "
    "reject after Holm, so it excludes 0 exactly when the verdict is DEGRADED or IMPROVED; coverage measured by "
    "`robocasa-shift check-coverage`"
)
PERCENTILE_METHOD = "percentile pair bootstrap, the paper's method, shown for comparison"

# Measured by `robocasa-shift check-coverage` (seed 0, 2,000 studies per cell, 1,000 bootstrap resamples; the
# one-task column exactly, by enumeration). Quoted on the report page and in summary.json beside the intervals.
MEASURED_COVERAGE = {
    "grid": "clean success 0.6 / 0.8 / 0.95 x per-task dSR 0 / 0.2 / 0.5 x 1 / 2 / 3 / 4 / 8 tasks x 10 / 20 / 50 "
            "pairs x clean/perturbed dependence (concordance) -0.5 / 0 / 0.5 / 1, then the same with all tasks but one "
            "at the ceiling and two near-ceiling shifts (924 cells; 2,000 studies each, Monte Carlo standard error "
            "about 0.005; `robocasa-shift check-coverage`, seed 0)",
    "calibrated": "worst cell 0.947 for the macro (4 tasks x 50 pairs, clean 0.8, dSR 0.5, concordance -0.5) and 0.952 "
                  "per task; one task, exactly by enumeration: at least 0.953 at 10, 20, 30 and 50 pairs wherever at "
                  "most 70% of the pairs are discordant (0.904 at 10 pairs when nearly every pair is discordant)",
    "percentile": "worst cell 0.392 (4 tasks x 10 pairs, three at the ceiling, the fourth at clean 0.95 and dSR 0.05: "
                  "a zero-width interval in 61% of the studies); 0.88 at worst when the tasks are alike",
}

# The same, in a few words, for table headers and the figure.
COVERAGE_SHORT = {"calibrated": "measured coverage at least 0.947", "percentile": "measured coverage as low as 0.39"}

MULTIPLICITY = (
    "DEGRADED / IMPROVED: the exact test is Holm-adjusted across the perturbed conditions (per task: across the "
    "conditions within the task). NO CHANGE DETECTED is controlled too: the equivalence tests (two one-sided tests "
    "at +-margin, each at 0.025) are Holm-adjusted across the same family, so the chance that any NO CHANGE "
    "DETECTED of a run hides a shift as large as the margin is at most 0.025 (per task: per task)"
)

POWER_ASSUMPTION = (
    "random pair outcomes: in every task each pair is independently S->F with probability (r_t + dSR) / 2 and "
    "F->S with probability (r_t - dSR) / 2, where r_t is the task's observed share of discordant pairs, raised to "
    "dSR where it is smaller (then the perturbation only ever hurts: no F->S pair, the most favourable case); "
    "every task moves by the same dSR; power of the two-sided exact stratified sign-flip test at alpha 0.05, "
    "unadjusted, computed exactly (by Monte Carlo with a fixed seed, 2,000 studies and its standard error stated, "
    "where the tasks' pair counts differ, or where tasks of different discordance hold more than 400 pairs); the "
    "minimum detectable dSR is read on a 0.005 grid, as the smallest value with power >= 0.8 and as the "
    "smallest from which every larger one has it"
)

# The lattice of the exact test holds sum_t m_t * w_t + 1 points; above this it is rounded (``exact`` false).
MAX_LATTICE = 2_000_000

_NORMAL = NormalDist()


def normal_quantile(p: float) -> float:
    """The standard normal quantile (``statistics.NormalDist``; scipy is not a dependency)."""
    return _NORMAL.inv_cdf(p)


def student_t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (a positive integer) degrees of freedom, in closed form
    (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    sin, cos = math.sin(theta), math.cos(theta)
    if df % 2 == 1:
        total, term = 0.0, cos if df > 1 else 0.0
        for k in range(1, (df - 1) // 2 + 1):  # cos, (2/3) cos^3, (2*4)/(3*5) cos^5, ...
            total += term
            term *= cos * cos * (2 * k) / (2 * k + 1)
        return min(1.0, 2.0 / math.pi * (theta + sin * total))
    total, term = 0.0, 1.0
    for k in range(1, df // 2 + 1):  # 1, cos^2 / 2, (1*3)/(2*4) cos^4, ...
        total += term
        term *= cos * cos * (2 * k - 1) / (2 * k)
    return min(1.0, sin * total)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 0.5) of Student's t with ``df`` degrees of freedom, by bisection on the closed form."""
    if not 0.5 < p < 1 or df < 1:
        raise AnalysisError(f"student_t_quantile needs 0.5 < p < 1 and df >= 1, got p {p}, df {df}")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while student_t_cdf_two_sided(hi, df) < target:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if student_t_cdf_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


def _normal_sf(x: np.ndarray) -> np.ndarray:
    """1 - Phi(x), elementwise."""
    x = np.asarray(x, dtype=float)
    return 0.5 * np.vectorize(math.erfc, otypes=[float])(x / math.sqrt(2.0)) if x.size else x


# --------------------------------------------------------------------------- one task's interval


def _tango_statistic(b: np.ndarray, c: np.ndarray, n: np.ndarray, delta: np.ndarray, cc: float) -> np.ndarray:
    """Tango's score statistic for H0: p_SF - p_FS = delta, numerator reduced by ``cc`` (decreasing in delta)."""
    a = 2.0 * n
    bq = -b - c + (2.0 * n - b + c) * delta
    cq = -c * delta * (1.0 - delta)
    p21 = (-bq + np.sqrt(np.maximum(bq * bq - 4.0 * a * cq, 0.0))) / (2.0 * a)
    variance = n * (2.0 * np.maximum(p21, 0.0) + delta * (1.0 - delta))
    numerator = b - c - n * delta
    numerator = np.sign(numerator) * np.maximum(np.abs(numerator) - cc, 0.0)
    positive = variance > 0
    t = np.divide(numerator, np.sqrt(np.where(positive, variance, 1.0)))
    # a zero variance (no discordant pair at delta 0 or +-1): 0 where the numerator is 0, else +-inf
    return np.where(positive, t, np.sign(numerator) * np.where(numerator == 0, 0.0, np.inf))


def task_interval(sf, fs, n, z=Z95, cc: float = CONTINUITY, iterations: int = 46) -> Tuple[np.ndarray, np.ndarray]:
    """One task's calibrated interval of dSR = (sf - fs) / n (vectorised; ``z`` may be an array).

    Tango's asymptotic score interval for the difference of paired proportions (Tango 1998; one of
    the intervals Fagerland, Lydersen & Laake 2014 recommend), with a continuity correction of 1/2
    on the score's numerator: the set of delta with |T(delta)| <= z, found by bisection on each side
    (T decreases in delta). Why this one, measured exactly over every (p_SF, p_FS) on a 0.01 grid
    (:func:`one_task_coverage`):

    - the adjusted Wald interval used before covered 0.87-0.89 at 10 to 50 pairs (e.g. 0.876 at 20
      pairs, p_FS 0.10), and at 20 pairs with no discordant pair it claimed +-0.096;
    - Tango's interval without the correction and Bonett-Price's adjusted Wald reach 0.93-0.94 at worst;
    - with the correction it covers at least 0.950 at 10, 20, 30 and 50 pairs wherever at most 70%
      of the pairs are discordant (0.904 at 10 pairs only when nearly every pair is discordant), and
      gives +-0.200 at 20 pairs without a discordant pair. The price is width: about 0.03 wider than
      Tango's at 20 pairs.

    Returns:
        (lower, upper), clipped to [-1, 1].
    """
    b, c, n, z = (np.asarray(v, dtype=float) for v in np.broadcast_arrays(sf, fs, n, z))
    if b.size > 256:  # many tables (scans, simulations): each distinct (sf, fs, n, z) once
        keys, inverse = np.unique(np.stack([b.ravel(), c.ravel(), n.ravel(), z.ravel()], axis=1), axis=0,
                                  return_inverse=True)
        if keys.shape[0] < b.size // 2:
            lower, upper = task_interval(keys[:, 0], keys[:, 1], keys[:, 2], keys[:, 3], cc, iterations)
            inverse = inverse.ravel()
            return lower[inverse].reshape(b.shape), upper[inverse].reshape(b.shape)
    d = (b - c) / n
    lo, hi = d.copy(), np.ones_like(d)
    upper_is_one = _tango_statistic(b, c, n, hi, cc) >= -z
    for _ in range(iterations):
        middle = (lo + hi) / 2
        keep = _tango_statistic(b, c, n, middle, cc) >= -z
        lo, hi = np.where(keep, middle, lo), np.where(keep, hi, middle)
    upper = np.where(upper_is_one, 1.0, lo)
    lo, hi = -np.ones_like(d), d.copy()
    lower_is_minus_one = _tango_statistic(b, c, n, lo, cc) <= z
    for _ in range(iterations):
        middle = (lo + hi) / 2
        keep = _tango_statistic(b, c, n, middle, cc) <= z
        hi, lo = np.where(keep, middle, hi), np.where(keep, lo, middle)
    lower = np.where(lower_is_minus_one, -1.0, hi)
    return np.clip(lower, -1.0, 1.0), np.clip(upper, -1.0, 1.0)


@lru_cache(maxsize=64)
def _task_interval_table(n: int, z: float = Z95) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`task_interval` of every (sf, fs) at ``n`` pairs, as (n + 1, n + 1) arrays (simulations index them)."""
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    lower, upper = task_interval(b, c, n, z)
    invalid = b + c > n
    lower[invalid], upper[invalid] = np.nan, np.nan
    return lower, upper


# --------------------------------------------------------------------------- the macro's interval


def macro_interval(counts: np.ndarray, z=Z95) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The calibrated interval of the macro dSR over tasks (vectorised over leading axes).

    Args:
        counts: (..., n_tasks, 4) pair counts SS, SF, FS, FF; every task needs at least one pair.
        z: normal quantile of the two-sided level (a scalar, or an array over the leading axes).

    Returns:
        (macro, lower, upper), each of shape ``counts.shape[:-2]``; bounds clipped to [-1, 1].

    Each task's :func:`task_interval` [l_t, u_t] around d_t is combined by square-and-add (MOVER,
    Zou & Donner 2008): macro -+ sqrt(sum_t (d_t - l_t)^2) / n_tasks resp. (u_t - d_t). With one task
    it is that task's interval, so a one-task study's headline and its task agree. Why this one:

    - The adjusted Wald interval used before (the estimate +- 1.96 sqrt(sum_t v_t) / n_tasks with
      0.5 added to each cell) covered 0.92 with two tasks under negatively dependent outcomes
      (concordance -1) and 0.88 with one task (2,000 studies per cell).
    - MOVER of Wilson-based (Newcombe) intervals under-covered (0.89-0.91 at 10 pairs): Wilson's
      half-widths shrink by 1 / (1 + z^2 / n), which a sum over tasks does not undo. The corrected
      Tango intervals do not shrink that way; MOVER of uncorrected Tango intervals reached 0.92-0.93.
    - Measured (``check-coverage``, :data:`MEASURED_COVERAGE`): at least 0.947 in every cell of the
      grid, 1 to 8 tasks, under every dependence model in it (0.94 when every pair is as discordant
      as the rates allow, concordance -1, outside the grid), against as low as 0.39 for the percentile bootstrap near
      the ceiling. It is wider than the Wald interval was (0.257 against 0.200 for the percentile
      bootstrap at 4 x 20, concordance 0.5).
    - It never collapses: a task whose pairs all moved the same way (or none moved) keeps the width
      its pair count allows, where the percentile bootstrap resamples a constant.
    """
    counts = np.asarray(counts, dtype=float)
    ss, sf, fs, ff = (counts[..., i] for i in range(4))
    n = counts.sum(axis=-1)
    k = counts.shape[-2]
    d = (sf - fs) / n
    z = np.asarray(z, dtype=float)
    z_tasks = z[..., None] if z.ndim else z
    lower_t, upper_t = task_interval(sf, fs, n, z_tasks)
    macro = d.mean(axis=-1)
    lower = macro - np.sqrt(((d - lower_t) ** 2).sum(axis=-1)) / k
    upper = macro + np.sqrt(((upper_t - d) ** 2).sum(axis=-1)) / k
    return macro, np.maximum(lower, -1.0), np.minimum(upper, 1.0)


def _check_counts(per_task_counts: Sequence[Sequence[int]]) -> Optional[np.ndarray]:
    counts = np.asarray(per_task_counts, dtype=float).reshape(-1, 4)
    if counts.shape[0] == 0 or np.any(counts.sum(axis=1) == 0):
        return None
    return counts


def calibrated_interval(per_task_counts: Sequence[Sequence[int]], level: float = 0.95) -> Optional[List[float]]:
    """:func:`macro_interval` of one condition as a JSON-ready [lo, hi] (before any extension to 0); None
    without tasks or pairs."""
    counts = _check_counts(per_task_counts)
    if counts is None:
        return None
    _, lower, upper = macro_interval(counts, normal_quantile(1 - (1 - level) / 2))
    return [float(lower), float(upper)]


def equivalence_p(counts: np.ndarray, margin: float = MIN_EFFECT, rounds: int = 4, points: int = 48) -> np.ndarray:
    """p-value of the equivalence test that the calibrated interval inverts (vectorised over leading axes).

    The two one-sided tests of H0: dSR >= +margin and H0: dSR <= -margin, whose p-value is the
    smallest a at which the (1 - 2a) calibrated interval lies inside [-margin, +margin]: so p <= a
    exactly when that interval is inside the margin (a = 0.025: the 95% interval). The interval's z
    at which a bound reaches the margin is found on nested grids over [0, 8] (``rounds`` grids of
    ``points``: z to about 1e-6); p = 1 when even the z = 0 interval (the estimate with its
    continuity correction) reaches the margin.

    Args:
        counts: (..., n_tasks, 4) pair counts.
    """
    counts = np.asarray(counts, dtype=float)
    shape = counts.shape[:-2]
    fractions = np.linspace(0.0, 1.0, points)
    results = []
    for side in (+1, -1):
        def inside(z: np.ndarray) -> np.ndarray:
            grid = np.broadcast_to(counts[..., None, :, :], z.shape + counts.shape[-2:])
            _, lower, upper = macro_interval(grid, z)
            return (upper <= margin + 1e-12) if side > 0 else (lower >= -margin - 1e-12)

        lo_z, hi_z = np.zeros(shape), np.full(shape, 8.0)
        ends = inside(np.stack([lo_z, hi_z], axis=-1))
        at_zero, at_top = ends[..., 0], ends[..., 1]
        for _ in range(rounds):
            z = lo_z[..., None] + (hi_z - lo_z)[..., None] * fractions
            last = np.clip(inside(z).sum(axis=-1) - 1, 0, points - 2)  # inside is true up to the crossing
            lo_z = np.take_along_axis(z, last[..., None], axis=-1)[..., 0]
            hi_z = np.take_along_axis(z, last[..., None] + 1, axis=-1)[..., 0]
        z_star = np.where(at_top, 8.0, lo_z)
        results.append(np.where(at_zero, _normal_sf(z_star), 1.0))
    return np.maximum(results[0], results[1])


# --------------------------------------------------------------------------- the exact stratified sign-flip test


def _log_factorials(n: int) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1, dtype=float)))])


def _binomial_pmf(m: int, p: float) -> np.ndarray:
    """P[Binomial(m, p) = k] for k = 0..m, in log space so large m stays finite."""
    k = np.arange(m + 1)
    if p <= 0.0:
        return (k == 0).astype(float)
    if p >= 1.0:
        return (k == m).astype(float)
    logf = _log_factorials(m)
    return np.exp(logf[m] - logf[k] - logf[m - k] + k * math.log(p) + (m - k) * math.log1p(-p))


def _lattice(n_pairs: Sequence[int], discordant: Sequence[int]) -> Tuple[List[int], bool]:
    """Integer weights w_t proportional to 1/n_t, and whether they are exact.

    The statistic sum_t S_t / n_t (S_t the S->F count among task t's m_t discordant pairs) is
    sum_t S_t * w_t / lcm(n) with w_t = lcm(n) / n_t: an integer lattice, so ties and the
    two-sided tail are exact. When lcm(n) makes the lattice larger than MAX_LATTICE (many tasks
    with coprime pair counts) the weights are rounded to a lattice of that size instead.
    """
    lcm = reduce(lambda x, y: x * y // math.gcd(x, y), n_pairs, 1)
    weights = [lcm // n for n in n_pairs]
    divisor = reduce(math.gcd, weights, 0) or 1
    weights = [w // divisor for w in weights]
    if sum(m * w for m, w in zip(discordant, weights)) + 1 <= MAX_LATTICE:
        return weights, True
    scale = (MAX_LATTICE - 1) / max(sum(m / n for m, n in zip(discordant, n_pairs)), 1e-12)
    return [max(1, int(round(scale / n))) for n in n_pairs], False


def _convolve(pmfs: Sequence[np.ndarray], weights: Sequence[int]) -> np.ndarray:
    """The distribution of sum_t w_t * K_t for independent K_t with the given pmfs (K_t = 0..m_t)."""
    total = np.ones(1)
    for pmf, w in zip(pmfs, weights):
        size = (pmf.size - 1) * w + 1
        if size * total.size <= 4_000_000:  # small: numpy's direct convolution of the spread-out pmf
            spread = np.zeros(size)
            spread[::w] = pmf
            total = np.convolve(total, spread)
            continue
        out = np.zeros(total.size + size - 1)
        for k, pk in enumerate(pmf):
            if pk:
                out[k * w: k * w + total.size] += pk * total
        total = out
    return total


@lru_cache(maxsize=4096)
def _half_pmf(m: int) -> np.ndarray:
    """Binomial(m, 1/2), cached: every null distribution of the sign-flip test is built from these."""
    return _binomial_pmf(m, 0.5)


def _tail_masks(size: int, centre2: int) -> np.ndarray:
    """|2s - M| for every lattice point s (M = centre2 = sum of m_t w_t): the two-sided distance."""
    return np.abs(2 * np.arange(size) - centre2)


def _lattice_p_values(null: np.ndarray, centre2: int) -> np.ndarray:
    """The two-sided p-value of every lattice point: the null mass at least as far from the centre.

    The points at distance >= |2s - centre2| are the two tails s' <= min(s, centre2 - s) and
    s' >= max(s, centre2 - s); their masses come from one cumulative sum.
    """
    s = np.arange(null.size)  # the lattice is 0..centre2
    cdf = np.empty(null.size + 1)
    cdf[0] = 0.0
    np.cumsum(null, out=cdf[1:])  # cdf[i] = mass of the points < i
    low = np.minimum(s, centre2 - s)
    high = centre2 - low
    both = cdf[low + 1] + (cdf[-1] - cdf[high])
    both[low == high] = cdf[-1]  # the centre itself: every point is at least as far
    return np.minimum(both, 1.0)


@lru_cache(maxsize=4096)
def _signflip_table(n_pairs: Tuple[int, ...], discordant: Tuple[int, ...]) -> Tuple[Tuple[int, ...], bool, np.ndarray]:
    """(weights, exact, two-sided p-value of every lattice point) of one stratified design."""
    weights, exact = _lattice(list(n_pairs), list(discordant))
    null = _convolve([_half_pmf(m) for m in discordant], weights)
    centre2 = sum(m * w for m, w in zip(discordant, weights))
    return tuple(weights), exact, _lattice_p_values(null, centre2)


@dataclass(frozen=True)
class SignFlipResult:
    """The stratified sign-flip test of one condition (or one comparison of two conditions)."""

    p: float  # two-sided
    p_greater: float  # H1: the weighted S->F excess is positive (degradation)
    p_less: float  # H1: it is negative (improvement)
    exact: bool
    n_discordant: int

    def to_json(self) -> Dict[str, Any]:
        return {"p": self.p, "p_greater": self.p_greater, "p_less": self.p_less, "exact": self.exact,
                "n_discordant": self.n_discordant}


def signflip_test(n_pairs: Sequence[int], sf: Sequence[int], fs: Sequence[int]) -> SignFlipResult:
    """Exact stratified sign-flip (permutation) test of the macro paired difference.

    Under the null hypothesis the perturbation changes nothing: within every pair the clean and
    the perturbed outcome are exchangeable, so each discordant pair is S->F or F->S with
    probability 1/2, independently. The statistic is the macro itself,
    T = (1/n_tasks) sum_t (SF_t - FS_t) / n_t, i.e. per-pair differences weighted by
    1/(n_tasks * n_t), the weights of the headline. Its null distribution is the convolution of
    the per-task Binomial(m_t, 1/2) distributions of SF_t (m_t = SF_t + FS_t) on an integer
    lattice (:func:`_lattice`), so the cost is sum_t m_t * lattice size, never 2^n. With one task
    it is McNemar's exact test.

    Args:
        n_pairs: valid pairs per task (tasks without pairs must be left out by the caller).
        sf, fs: S->F and F->S counts per task.

    Returns:
        Two-sided and one-sided p-values (the two-sided one: P[|T| >= |T_obs|]).
    """
    if not n_pairs:
        raise AnalysisError("signflip_test needs at least one task with pairs")
    discordant = [int(b) + int(c) for b, c in zip(sf, fs)]
    weights, exact = _lattice(list(map(int, n_pairs)), discordant)
    null = _convolve([_half_pmf(m) for m in discordant], weights)
    centre2 = sum(m * w for m, w in zip(discordant, weights))
    observed = sum(int(b) * w for b, w in zip(sf, weights))
    distance = _tail_masks(null.size, centre2)
    p = float(null[distance >= abs(2 * observed - centre2)].sum())
    return SignFlipResult(
        p=min(1.0, p),
        p_greater=min(1.0, float(null[observed:].sum())),
        p_less=min(1.0, float(null[: observed + 1].sum())),
        exact=exact,
        n_discordant=sum(discordant),
    )


def signflip_p_values(counts: np.ndarray) -> np.ndarray:
    """Two-sided :func:`signflip_test` p-values of many tables at once (tables sharing a design share its null).

    Args:
        counts: (n_tables, n_tasks, 4) pair counts; every task needs at least one pair.

    Returns:
        (n_tables,) p-values, equal to ``signflip_test(...).p`` up to float summation order.
    """
    counts = np.asarray(counts, dtype=np.int64)
    n = counts.sum(axis=-1)
    sf, m = counts[..., 1], counts[..., 1] + counts[..., 2]
    design = np.concatenate([n, m], axis=1)
    dims = design.max(axis=0) + 1
    if float(np.prod(dims.astype(float))) < 2.0 ** 62:
        _, first, inverse = np.unique(np.ravel_multi_index(design.T, dims), return_index=True, return_inverse=True)
        keys = design[first]
    else:
        keys, inverse = np.unique(design, axis=0, return_inverse=True)
    order = np.argsort(inverse.ravel(), kind="stable")
    bounds = np.searchsorted(inverse.ravel()[order], np.arange(len(keys) + 1))
    out = np.empty(counts.shape[0])
    k = counts.shape[1]
    for index, key in enumerate(keys.tolist()):
        rows = order[bounds[index]:bounds[index + 1]]
        weights, _, p_table = _signflip_table(tuple(key[:k]), tuple(key[k:]))
        out[rows] = p_table[sf[rows] @ np.asarray(weights)]
    return out


# --------------------------------------------------------------------------- interval and verdict, one object


def decide(lower: np.ndarray, upper: np.ndarray, rejects: np.ndarray, equivalent: np.ndarray,
           min_effect: float = MIN_EFFECT,
           directions: Tuple[str, str] = DSR_DIRECTIONS) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The interval shown and its verdict, from the calibrated interval and the two tests (vectorised).

    Args:
        lower, upper: the calibrated interval.
        rejects: whether the verdict's exact test rejects "no change" after Holm.
        equivalent: whether the Holm-adjusted equivalence test rejects "a change of at least the margin".
        directions: the words for an interval above and below 0; which is which depends on what the
            interval bounds (:data:`DSR_DIRECTIONS` for a dSR, :data:`SUCCESS_DIFF_DIRECTIONS` for a
            success difference against a baseline).

    Returns:
        (lower, upper, verdict): the interval extended to reach 0 where the test does not reject,
        and the verdict read off that interval: for a dSR DEGRADED when it lies above 0, IMPROVED below 0,
        NO CHANGE DETECTED when it lies inside +-``min_effect`` and the equivalence test rejects,
        UNDERPOWERED otherwise. So an interval that excludes 0 is DEGRADED or IMPROVED, and a
        direction is claimed only where both the exact test and the interval support it.
    """
    lower, upper = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    rejects, equivalent = np.asarray(rejects, dtype=bool), np.asarray(equivalent, dtype=bool)
    lower = np.where(rejects, lower, np.minimum(lower, 0.0))
    upper = np.where(rejects, upper, np.maximum(upper, 0.0))
    inside = (lower >= -min_effect - 1e-12) & (upper <= min_effect + 1e-12) & equivalent
    code = np.select([lower > 0, upper < 0, inside], [0, 1, 2], default=3)
    words = np.array([directions[0], directions[1], NO_CHANGE, UNDERPOWERED], dtype=object)
    return lower, upper, words[code]


def decision(interval: Optional[Sequence[float]], p_adjusted: Optional[float], p_equivalence: Optional[float] = None,
             min_effect: float = MIN_EFFECT, alpha: float = ALPHA, equivalence_alpha: float = EQUIVALENCE_ALPHA,
             directions: Tuple[str, str] = DSR_DIRECTIONS) -> Optional[Dict[str, Any]]:
    """:func:`decide` for one condition or task: ``{"interval", "verdict", "extended_to_zero"}``, or None.

    Args:
        interval: the calibrated interval (:func:`calibrated_interval`).
        p_adjusted: the verdict's exact test, Holm-adjusted (rejects below ``alpha``).
        p_equivalence: the equivalence test's p-value, Holm-adjusted (rejects below
            ``equivalence_alpha``); None skips it (a single condition: the interval alone).
    """
    if interval is None or p_adjusted is None:
        return None
    equivalent = True if p_equivalence is None else p_equivalence < equivalence_alpha
    lower, upper, verdicts = decide(np.array([interval[0]]), np.array([interval[1]]),
                                    np.array([p_adjusted < alpha]), np.array([equivalent]), min_effect, directions)
    shown = [float(lower[0]), float(upper[0])]
    return {"interval": shown, "verdict": str(verdicts[0]),
            "extended_to_zero": bool(shown[0] != interval[0] or shown[1] != interval[1])}


def verdict(estimate: Optional[float], p_adjusted: Optional[float], interval: Optional[Sequence[float]],
            min_effect: float = MIN_EFFECT, alpha: float = ALPHA,
            p_equivalence: Optional[float] = None) -> Optional[str]:
    """One of :data:`VERDICTS` (see :func:`decide`), or None when there is nothing to judge."""
    if estimate is None:
        return None
    chosen = decision(interval, p_adjusted, p_equivalence, min_effect, alpha)
    return None if chosen is None else chosen["verdict"]


# --------------------------------------------------------------------------- power over random outcomes


def signflip_power(n_pairs: Sequence[int], discordant: Sequence[int], shift: float, alpha: float = ALPHA) -> float:
    """Power of the two-sided :func:`signflip_test` conditional on ``discordant`` pairs per task.

    A true dSR of ``shift`` in every task makes each of the m_t discordant pairs S->F with
    probability (1 + shift * n_t / m_t) / 2. A building block: the power a study has is over random
    discordant counts too (:func:`random_outcome_power`).
    """
    weights, _, p_values = _signflip_table(tuple(int(n) for n in n_pairs), tuple(int(m) for m in discordant))
    reject = p_values <= alpha + 1e-12
    alternative = _convolve(
        [_binomial_pmf(m, min(1.0, 0.5 * (1 + shift * n / m)) if m else 0.5) for n, m in zip(n_pairs, discordant)],
        weights,
    )
    return float(alternative[reject].sum())


def pair_probabilities(discordance: float, shift: float) -> Tuple[float, float]:
    """(p_SF, p_FS) of the power model: discordance max(r, shift), S->F minus F->S = shift."""
    r = min(1.0, max(float(discordance), float(shift)))
    return (r + shift) / 2.0, max((r - shift) / 2.0, 0.0)


@lru_cache(maxsize=64)
def _binomial_rejection(total: int, alpha: float) -> np.ndarray:
    """c_M for M = 0..total: the largest S <= M/2 whose two-sided exact binomial p-value is <= alpha (-1: none)."""
    logf = _log_factorials(total)
    out = np.full(total + 1, -1, dtype=np.int64)
    for m in range(1, total + 1):
        half = m // 2
        s = np.arange(half + 1)
        cdf = np.cumsum(np.exp(logf[m] - logf[s] - logf[m - s] - m * math.log(2.0)))
        p = np.minimum(1.0, 2.0 * cdf)
        p[s * 2 == m] = 1.0
        ok = np.flatnonzero(p <= alpha + 1e-12)
        out[m] = ok[-1] if ok.size else -1
    return out


def _trinomial_joint(n: int, p_sf: float, p_fs: float) -> np.ndarray:
    """P[SF = a, discordant = m] for one task, as an (n + 1, n + 1) array indexed [a, m]."""
    logf = _log_factorials(n)
    a, m = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    valid = a <= m
    rest = 1.0 - p_sf - p_fs

    def xlog(count: np.ndarray, p: float) -> np.ndarray:
        return np.where(count > 0, count * (math.log(p) if p > 0 else -np.inf), 0.0)

    with np.errstate(invalid="ignore"):
        log_p = (logf[n] - logf[np.where(valid, a, 0)] - logf[np.where(valid, m - a, 0)] - logf[n - m]
                 + xlog(a, p_sf) + xlog(m - a, p_fs) + xlog(n - m, rest))
    return np.where(valid, np.exp(np.where(valid, log_p, -np.inf)), 0.0)


def _equal_pairs_power(n: int, p_sf: Sequence[float], p_fs: Sequence[float], alpha: float) -> float:
    """Exact power when every task has ``n`` pairs: the test is then the binomial test of S = sum SF_t given M."""
    k = len(p_sf)
    total = k * n
    critical = _binomial_rejection(total, alpha)
    if len(set(zip(p_sf, p_fs))) == 1:
        # identical tasks: M ~ Binomial(kn, q), S | M ~ Binomial(M, pi)
        q = p_sf[0] + p_fs[0]
        if q <= 0:
            return 0.0
        pi = p_sf[0] / q
        pm = _binomial_pmf(total, q)
        ms = np.flatnonzero((pm > 1e-15) & (critical >= 0))
        if not ms.size:
            return 0.0
        # P[S = s | M = m] for every m kept, s = 0..max(m): one (len(ms), max + 1) table
        logf = _log_factorials(total)
        s_values = np.arange(ms.max() + 1)
        valid = s_values[None, :] <= ms[:, None]
        safe = np.where(valid, ms[:, None] - s_values[None, :], 0)
        log_p = logf[ms][:, None] - logf[s_values][None, :] - logf[safe]
        if 0 < pi < 1:
            log_p = log_p + s_values[None, :] * math.log(pi) + safe * math.log1p(-pi)
        else:  # pi 0 or 1: all the mass on s = 0 or s = m
            log_p = np.where((s_values[None, :] == 0) if pi <= 0 else (s_values[None, :] == ms[:, None]), 0.0, -np.inf)
        pmf = np.where(valid, np.exp(log_p), 0.0)
        c = critical[ms]
        cdf = np.cumsum(pmf, axis=1)
        rows = np.arange(ms.size)
        lower_tail = cdf[rows, c]  # S <= c
        upper_tail = cdf[rows, ms] - cdf[rows, ms - c - 1]  # S >= m - c (c < m / 2, so m - c - 1 >= 0)
        return float(np.sum(pm[ms] * (lower_tail + upper_tail)))
    # tasks differ in discordance: the joint of (S, M) by 2-D convolution of the tasks' joints
    shape = (total + 1, total + 1)
    spectrum = np.ones((shape[0], shape[1] // 2 + 1), dtype=complex)
    for a, b in zip(p_sf, p_fs):
        spectrum *= np.fft.rfft2(_trinomial_joint(n, a, b), s=shape)
    joint = np.clip(np.fft.irfft2(spectrum, s=shape), 0.0, None)
    s, m = np.meshgrid(np.arange(total + 1), np.arange(total + 1), indexing="ij")
    c = critical[m]
    reject = (s <= m) & (c >= 0) & ((s <= c) | (s >= m - c))
    return float(joint[reject].sum())


@dataclass(frozen=True)
class PowerResult:
    """Power of the headline test at one design and shift."""

    power: float
    method: str  # "exact" or "monte carlo"
    standard_error: float  # 0 when exact
    studies: int  # Monte Carlo studies (0 when exact)


MC_STUDIES = 2000
MAX_EXACT_JOINT = 400  # total pairs above which tasks with different discordance go to Monte Carlo
VERDICT_POWER_ASSUMPTION = (
    "power of the verdict, not of the test alone: the probability that the condition reads DEGRADED (the exact "
    "stratified sign-flip test rejects at alpha 0.05, unadjusted, AND the calibrated interval lies above 0) over "
    "random pair outcomes: in every task each pair is independently S->F with probability (r_t + dSR) / 2 and "
    "F->S with probability (r_t - dSR) / 2, where r_t is the task's observed share of discordant pairs, raised to "
    "dSR where it is smaller (then the perturbation only ever hurts: no F->S pair, the most favourable case); "
    "every task moves by the same dSR; computed exactly by enumerating every outcome where a design has at most "
    "200,000 of them, else by Monte Carlo (a fixed seed, 4,000 studies, common random numbers across dSR and "
    "pair counts, its standard error stated); the minimum detectable dSR is read on a 0.005 grid, as the smallest "
    "value with power >= 0.8 and as the smallest from which every larger one has it"
)
MAX_EXACT_OUTCOMES = 200_000  # designs with more joint outcomes go to Monte Carlo
VERDICT_MC_STUDIES = 4000


def random_outcome_power(n_pairs: Sequence[int], discordance: Sequence[float], shift: float, alpha: float = ALPHA,
                         studies: int = MC_STUDIES, seed: int = 0) -> PowerResult:
    """Power of the two-sided exact stratified sign-flip test over random pair outcomes.

    Each task's pairs are independent: S->F with probability (r_t + shift) / 2, F->S with (r_t -
    shift) / 2, r_t = max(discordance_t, shift) (:func:`pair_probabilities`). Exact when every task
    has the same pair count (the test is then the binomial test of the summed S->F count given the
    summed discordant count; tasks of different discordance need a 2-D convolution, exact up to
    :data:`MAX_EXACT_JOINT` pairs in all); otherwise Monte Carlo over ``studies`` simulated studies
    from ``seed``, every study tested with the exact test, with its standard error.
    """
    n_pairs = [int(n) for n in n_pairs]
    probabilities = [pair_probabilities(r, shift) for r in discordance]
    p_sf, p_fs = [p[0] for p in probabilities], [p[1] for p in probabilities]
    if len(set(n_pairs)) == 1 and (len(set(probabilities)) == 1 or len(n_pairs) * n_pairs[0] <= MAX_EXACT_JOINT):
        return PowerResult(_equal_pairs_power(n_pairs[0], p_sf, p_fs, alpha), "exact", 0.0, 0)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x504F57,)))
    return _monte_carlo_power(n_pairs, p_sf, p_fs, alpha, rng.random((studies, sum(n_pairs))))


def _monte_carlo_power(n_pairs: Sequence[int], p_sf: Sequence[float], p_fs: Sequence[float], alpha: float,
                       uniforms: np.ndarray) -> PowerResult:
    """Power from the given uniforms (one per pair and study): common random numbers across shifts."""
    edges = np.cumsum([0] + list(n_pairs))
    sf = np.stack([(uniforms[:, a:b] < p).sum(axis=1) for a, b, p in zip(edges[:-1], edges[1:], p_sf)], axis=1)
    fs = np.stack([((uniforms[:, a:b] >= p) & (uniforms[:, a:b] < p + q)).sum(axis=1)
                   for a, b, p, q in zip(edges[:-1], edges[1:], p_sf, p_fs)], axis=1)
    counts = np.stack([np.asarray(n_pairs)[None, :] - sf - fs, sf, fs, np.zeros_like(sf)], axis=-1)
    rejected = signflip_p_values(counts) <= alpha + 1e-12
    power = float(rejected.mean())
    studies = uniforms.shape[0]
    return PowerResult(power, "monte carlo", math.sqrt(max(power * (1 - power), 1e-12) / studies), studies)


@dataclass(frozen=True)
class DetectableShift:
    """The minimum detectable dSR of a design, read two ways (exact tests saw-tooth)."""

    first: Optional[float]  # the smallest grid value with power >= target
    stable: Optional[float]  # the smallest from which every larger grid value has it
    method: str
    standard_error: float  # Monte Carlo standard error of the power at ``first`` (0 when exact)
    studies: int
    step: float
    power_at_first: Optional[float]

    def to_json(self) -> Dict[str, Any]:
        return {"mde_dsr": self.first, "mde_dsr_stable": self.stable, "method": self.method,
                "power_at_mde": self.power_at_first, "monte_carlo_standard_error": self.standard_error,
                "monte_carlo_studies": self.studies, "grid_step": self.step}


def _uniform_columns(studies: int, n_tasks: int, n: int, seed: int) -> np.ndarray:
    """(studies, n_tasks, n) uniforms built from fixed 32-column blocks: the first columns never change with n."""
    blocks = [np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x564552, j))).random((studies, n_tasks, 32))
              for j in range(-(-n // 32))]
    return np.concatenate(blocks, axis=2)[:, :, :n]


def minimum_detectable_dsr(n_pairs: Sequence[int], discordance: Sequence[float], alpha: float = ALPHA,
                           power: float = POWER, step: float = MDE_STEP, studies: int = VERDICT_MC_STUDIES,
                           seed: int = 0) -> DetectableShift:
    """The smallest true macro dSR that reads DEGRADED with probability ``power``, on a ``step`` grid up to 1.

    The power of the verdict (:func:`verdict_power`, assumption :data:`VERDICT_POWER_ASSUMPTION`): the test
    rejecting is not enough, the calibrated interval must lie above 0 too. ``first`` is the smallest grid
    value with the power, ``stable`` the smallest from which every larger grid value has it (they differ where
    exact tests saw-tooth). Exact designs are evaluated at every grid point. Monte Carlo designs use common
    random numbers across shifts and are evaluated on a 0.05 grid, refined to ``step`` inside every 0.05
    bracket where the curve crosses ``power`` (``method`` says so).
    """
    n_pairs = [int(n) for n in n_pairs]
    if not n_pairs or min(n_pairs) == 0:
        return DetectableShift(None, None, "none", 0.0, 0, step, None)
    grid = [round(step * i, 10) for i in range(1, int(round(1 / step)) + 1)]
    exact = _outcome_count(n_pairs) <= MAX_EXACT_OUTCOMES
    uniforms = None if exact else _uniform_columns(studies, len(n_pairs), max(n_pairs), seed)
    results: Dict[int, PowerResult] = {}

    def evaluate(i: int) -> bool:
        if i not in results:
            results[i] = verdict_power(n_pairs, discordance, grid[i], alpha, uniforms=uniforms)
        return results[i].power >= power

    if exact:
        for i in range(len(grid)):
            evaluate(i)
        method = "exact"
    else:
        every = max(1, int(round(0.05 / step)))
        coarse = list(range(every - 1, len(grid), every))
        passes = [evaluate(i) for i in coarse]
        for (a, pa), (b, pb) in zip([(-1, False)] + list(zip(coarse, passes)), list(zip(coarse, passes))):
            if pa != pb:  # a crossing inside (a, b]: every grid point there
                for i in range(a + 1, b):
                    evaluate(i)
        method = "monte carlo (0.05 grid, refined around the crossings)"
    indices = sorted(results)
    enough = {i: results[i].power >= power for i in indices}
    first_index = next((i for i in indices if enough[i]), None)
    stable_index = None
    if enough[indices[-1]]:
        failing = [i for i in indices if not enough[i]]
        stable_index = next(i for i in indices if i > failing[-1]) if failing else indices[0]
    first = None if first_index is None else results[first_index]
    return DetectableShift(
        first=None if first_index is None else grid[first_index],
        stable=None if stable_index is None else grid[stable_index],
        method=method,
        standard_error=0.0 if first is None else first.standard_error,
        studies=0 if exact else studies, step=step,
        power_at_first=None if first is None else first.power,
    )


@dataclass(frozen=True)
class PairPlan:
    """Base episodes per task a wanted verdict needs (equal across tasks)."""

    first: Optional[int]  # the smallest pair count with power >= target
    stable: Optional[int]  # the smallest from which every pair count up to ``checked_up_to`` has it
    checked_up_to: int
    power: Dict[int, PowerResult]  # the verdict's power at every pair count scanned


def plan_pairs(n_tasks: int, shift: float, discordance: float | Sequence[float], alpha: float = ALPHA,
               power: float = POWER, max_pairs: int = 2000, verdict: str = DEGRADED, min_effect: float = MIN_EFFECT,
               studies: int = VERDICT_MC_STUDIES, seed: int = 0) -> PairPlan:
    """Base episodes per task at which a true macro dSR of ``shift`` reads ``verdict`` with probability ``power``.

    The verdict's power (:func:`verdict_power`: DEGRADED at ``shift``, or NO CHANGE DETECTED, usually at a
    ``shift`` of 0), exact where the outcomes can be enumerated, else Monte Carlo with common random numbers
    across pair counts. Every pair count from 1 upward is checked, because the power can saw-tooth in n:
    ``first`` is the smallest pair count with the power, ``stable`` the smallest from which every pair count
    scanned has it; the scan goes on to max(2 * first, first + 20) (``checked_up_to``). ``first`` None: more
    than ``max_pairs``.
    """
    rates = [float(discordance)] * n_tasks if isinstance(discordance, (int, float)) else list(discordance)
    if len(rates) != n_tasks:
        raise AnalysisError(f"{len(rates)} discordance rates for {n_tasks} tasks")
    powers: Dict[int, PowerResult] = {}
    uniforms: Optional[np.ndarray] = None
    first = None
    # below the smallest design at which some outcome gives the verdict, its power is exactly 0
    n = smallest_reachable(n_tasks, verdict, alpha, min_effect, max_pairs) or max_pairs + 1
    powers.update({m: PowerResult(0.0, "exact", 0.0, 0) for m in range(1, min(n, max_pairs + 1))})
    limit = max_pairs
    while n <= limit:
        design = [n] * n_tasks
        if _outcome_count(design) > MAX_EXACT_OUTCOMES and (uniforms is None or uniforms.shape[2] < n):
            uniforms = _uniform_columns(studies, n_tasks, max(2 * n, 64), seed)
        powers[n] = verdict_power(design, rates, shift, alpha, verdict=verdict, min_effect=min_effect, studies=studies,
                                  seed=seed, uniforms=None if uniforms is None else uniforms[:, :, :n])
        if first is None and powers[n].power >= power:
            first = n
            limit = min(max_pairs, max(2 * n, n + 20))
        n += 1
    if first is None:
        return PairPlan(None, None, max_pairs, powers)
    stable = first
    for m in sorted(powers):
        if m >= first and powers[m].power < power:
            stable = m + 1
    return PairPlan(first, stable if stable <= limit else None, limit, powers)


# --------------------------------------------------------------------------- power of the verdict




def _task_outcomes(n: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every (sf, fs) with sf + fs <= n, as two arrays."""
    sf, fs = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = sf + fs <= n
    return sf[keep], fs[keep]


def _verdict_codes(n_pairs: Sequence[int], sf: np.ndarray, fs: np.ndarray, alpha: float,
                   min_effect: float) -> np.ndarray:
    """0 DEGRADED, 1 IMPROVED, 2 NO CHANGE DETECTED, 3 UNDERPOWERED of many tables of one condition (unadjusted).

    Args:
        sf, fs: (n_tables, n_tasks) counts. The test rejects at ``alpha`` (a single condition: no Holm family),
            and NO CHANGE needs the 95% interval inside +-``min_effect`` (the equivalence test at 0.025 inverts it).
    """
    n = np.asarray(n_pairs, dtype=np.int64)
    k = len(n)
    lower_t, upper_t = np.empty(sf.shape), np.empty(sf.shape)
    for t, size in enumerate(n.tolist()):
        if size <= 60:  # small designs: the cached table of every (sf, fs)
            lo, hi = _task_interval_table(size)
            lower_t[:, t], upper_t[:, t] = lo[sf[:, t], fs[:, t]], hi[sf[:, t], fs[:, t]]
            continue
        keys, inverse = np.unique(sf[:, t] * (size + 1) + fs[:, t], return_inverse=True)  # each distinct (sf, fs) once
        lo, hi = task_interval(keys // (size + 1), keys % (size + 1), size)
        lower_t[:, t], upper_t[:, t] = lo[inverse.ravel()], hi[inverse.ravel()]
    d = (sf - fs) / n[None, :]
    macro = d.mean(axis=1)
    lower = np.maximum(macro - np.sqrt(((d - lower_t) ** 2).sum(axis=1)) / k, -1.0)
    upper = np.minimum(macro + np.sqrt(((upper_t - d) ** 2).sum(axis=1)) / k, 1.0)
    if len(set(n.tolist())) == 1:  # equal weights: the binomial test of the summed S->F count given the discordant
        total, m = int(n.sum()), (sf + fs).sum(axis=1)
        critical = _binomial_rejection(total, alpha)[m]
        s = sf.sum(axis=1)
        rejects = (critical >= 0) & ((s <= critical) | (s >= m - critical))
    else:
        counts = np.stack([n[None, :] - sf - fs, sf, fs, np.zeros_like(sf)], axis=-1)
        rejects = signflip_p_values(counts) <= alpha + 1e-12
    lower, upper, verdicts = decide(lower, upper, rejects, np.ones_like(rejects), min_effect)
    return np.select([verdicts == DEGRADED, verdicts == IMPROVED, verdicts == NO_CHANGE], [0, 1, 2], default=3)


@lru_cache(maxsize=8)
def _enumerated_verdicts(n_pairs: Tuple[int, ...], alpha: float, min_effect: float):
    """Every joint outcome of a design with its verdict code: ((sf, fs) per task, codes)."""
    per_task = [_task_outcomes(n) for n in n_pairs]
    index = np.stack(np.meshgrid(*[np.arange(len(o[0])) for o in per_task], indexing="ij"), axis=-1).reshape(
        -1, len(n_pairs))
    sf = np.stack([o[0][index[:, t]] for t, o in enumerate(per_task)], axis=1)
    fs = np.stack([o[1][index[:, t]] for t, o in enumerate(per_task)], axis=1)
    return sf, fs, _verdict_codes(n_pairs, sf, fs, alpha, min_effect)


def _outcome_count(n_pairs: Sequence[int]) -> float:
    return float(np.prod([(n + 1) * (n + 2) / 2 for n in n_pairs]))


VERDICT_INDEX = {DEGRADED: 0, IMPROVED: 1, NO_CHANGE: 2, UNDERPOWERED: 3}


def verdict_power(n_pairs: Sequence[int], discordance: Sequence[float], shift: float, alpha: float = ALPHA,
                  verdict: str = DEGRADED, min_effect: float = MIN_EFFECT, studies: int = VERDICT_MC_STUDIES,
                  seed: int = 0, uniforms: Optional[np.ndarray] = None) -> PowerResult:
    """P(the condition's verdict is ``verdict``) at a true macro dSR of ``shift`` (:data:`VERDICT_POWER_ASSUMPTION`).

    DEGRADED needs the exact test to reject AND the calibrated interval to lie above 0, so its power is at
    most the test's (:func:`random_outcome_power`). Exact (every joint outcome enumerated) where a design has at
    most :data:`MAX_EXACT_OUTCOMES` of them; else Monte Carlo over ``studies`` studies from ``seed`` (or the
    ``uniforms`` given, one per pair and study: common random numbers across shifts and pair counts).
    """
    n_pairs = [int(n) for n in n_pairs]
    code = VERDICT_INDEX[verdict]
    probabilities = [pair_probabilities(r, shift) for r in discordance]
    if _outcome_count(n_pairs) <= MAX_EXACT_OUTCOMES:
        sf, fs, codes = _enumerated_verdicts(tuple(n_pairs), float(alpha), float(min_effect))
        chosen = codes == code
        log_p = np.zeros(int(chosen.sum()))
        for t, (n, (p_sf, p_fs)) in enumerate(zip(n_pairs, probabilities)):
            table = np.log(np.maximum(_trinomial_joint(n, p_sf, p_fs), 1e-300))  # [a, m]: a S->F of m discordant
            a = sf[chosen, t]
            log_p += table[a, a + fs[chosen, t]]
        return PowerResult(float(np.exp(log_p).sum()), "exact", 0.0, 0)
    if uniforms is None:
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x564552,)))
        uniforms = rng.random((studies, len(n_pairs), max(n_pairs)))
    sf = np.stack([(uniforms[:, t, :n] < p).sum(axis=1) for t, (n, (p, _)) in enumerate(zip(n_pairs, probabilities))],
                  axis=1)
    fs = np.stack([((uniforms[:, t, :n] >= p) & (uniforms[:, t, :n] < p + q)).sum(axis=1)
                   for t, (n, (p, q)) in enumerate(zip(n_pairs, probabilities))], axis=1)
    power = float((_verdict_codes(n_pairs, sf, fs, alpha, min_effect) == code).mean())
    count = uniforms.shape[0]
    return PowerResult(power, "monte carlo", math.sqrt(max(power * (1 - power), 1e-12) / count), count)


@dataclass(frozen=True)
class Reachable:
    """Which decisive verdicts some outcome of a design can give (one condition, before any Holm adjustment)."""

    degraded: bool  # every pair S->F: the most favourable outcome for DEGRADED
    no_change: bool  # no discordant pair: the narrowest interval around 0

    def to_json(self) -> Dict[str, bool]:
        return {"degraded": self.degraded, "no_change": self.no_change}


def reachable_verdicts(n_pairs: Sequence[int], alpha: float = ALPHA, min_effect: float = MIN_EFFECT) -> Reachable:
    """Could any outcome of this design read DEGRADED, or NO CHANGE DETECTED? Checked on the extreme outcomes.

    DEGRADED is easiest when every pair went S->F (the largest statistic, the interval furthest above 0),
    NO CHANGE DETECTED when no pair is discordant (the narrowest interval around 0); the Holm adjustment of a
    run only makes both harder, so False means no outcome of the design could have given it.
    """
    n = [int(v) for v in n_pairs]
    if not n or min(n) <= 0:
        return Reachable(False, False)
    every_sf = np.array([n])
    none = np.zeros((1, len(n)), dtype=np.int64)
    codes_sf = _verdict_codes(n, every_sf, none, alpha, min_effect)
    codes_none = _verdict_codes(n, none, none, alpha, min_effect)
    return Reachable(bool(codes_sf[0] == 0), bool(codes_none[0] == 2))


def smallest_reachable(n_tasks: int, verdict: str, alpha: float = ALPHA, min_effect: float = MIN_EFFECT,
                       max_pairs: int = 2000) -> Optional[int]:
    """The fewest base episodes per task (equal across ``n_tasks`` tasks) at which ``verdict`` is reachable."""
    field = {DEGRADED: "degraded", NO_CHANGE: "no_change"}[verdict]
    for n in range(1, max_pairs + 1):
        if getattr(reachable_verdicts([n] * n_tasks, alpha, min_effect), field):
            return n
    return None


# --------------------------------------------------------------------------- severity: the trend over levels


@dataclass(frozen=True)
class TrendResult:
    """The exact stratified trend test of one factor over its levels."""

    p_increasing: float  # H1: perturbed failures rise with the level (dSR grows)
    p_decreasing: float
    n_episodes: int  # base episodes valid under every level
    n_informative: int  # of those, the ones failing under some but not all levels
    exact: bool


def stratified_trend_test(failures: Sequence[np.ndarray]) -> TrendResult:
    """Does dSR rise with the level? Exact, within base episode, stratified by task like the macro.

    Args:
        failures: per task, an (n_episodes, n_levels) 0/1 array: whether each base episode's
            perturbed rollout failed at each level (levels in order L1, L2, ...; only episodes
            valid under every level).

    Under the null hypothesis the level does not matter: within a base episode (its clean twin is
    shared, so dSR differences between levels are differences in perturbed failures) the failures
    are exchangeable across levels, so the levels at which an episode failed are a uniformly random
    subset of its size. The statistic is sum_t (1 / n_t) sum_e sum_l l * f_el, the level-weighted
    macro failure count (a slope of macro dSR over the levels, tasks weighted as in the macro); its
    exact null distribution is the convolution of the episodes' subset-sum distributions on the
    integer lattice of :func:`_lattice`. One-sided: ``p_increasing`` small supports "dSR rises with
    the level", a trend (not that every step rises); a large one is no evidence either way.
    """
    tasks = [np.asarray(f, dtype=np.int64) for f in failures if np.asarray(f).size]
    if not tasks:
        raise AnalysisError("stratified_trend_test needs at least one task with base episodes")
    n_levels = tasks[0].shape[1]
    levels = np.arange(1, n_levels + 1)
    subset_pmfs: Dict[int, Tuple[np.ndarray, int]] = {}
    for size in range(n_levels + 1):
        sums = [sum(c) for c in itertools.combinations(levels.tolist(), size)]
        low = min(sums)
        pmf = np.bincount(np.asarray(sums) - low).astype(float)
        subset_pmfs[size] = (pmf / pmf.sum(), low)
    task_pmfs, spans, observed, n_pairs = [], [], [], []
    for f in tasks:
        sizes = f.sum(axis=1)
        pmf, offset = np.ones(1), 0
        for size in sizes:
            part, low = subset_pmfs[int(size)]
            pmf, offset = np.convolve(pmf, part), offset + low
        task_pmfs.append(pmf)
        spans.append(pmf.size - 1)
        observed.append(int((f * levels).sum()) - offset)
        n_pairs.append(f.shape[0])
    weights, exact = _lattice(n_pairs, spans)
    null = _convolve(task_pmfs, weights)
    statistic = sum(o * w for o, w in zip(observed, weights))
    informative = int(sum(((f.sum(axis=1) > 0) & (f.sum(axis=1) < n_levels)).sum() for f in tasks))
    return TrendResult(p_increasing=min(1.0, float(null[statistic:].sum())),
                       p_decreasing=min(1.0, float(null[: statistic + 1].sum())),
                       n_episodes=int(sum(n_pairs)), n_informative=informative, exact=exact)


# --------------------------------------------------------------------------- coverage: one task, exactly


def one_task_coverage(n: int, p_sf: np.ndarray, p_fs: np.ndarray, alpha: float = ALPHA,
                      interval: Optional[Callable[[np.ndarray, np.ndarray, int], Tuple[np.ndarray, np.ndarray]]] = None,
                      extend: bool = True) -> np.ndarray:
    """Exact coverage of a one-task interval of dSR = p_sf - p_fs at ``n`` pairs, by enumerating every (b, c).

    Args:
        p_sf, p_fs: arrays of true S->F and F->S probabilities (p_sf + p_fs <= 1).
        interval: ``interval(b, c, n) -> (lower, upper)``; default :func:`task_interval`.
        extend: extend the interval to 0 where McNemar's exact test does not reject at ``alpha``
            (as the published interval of a single condition is).
    """
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    b, c = b[keep], c[keep]
    lower, upper = (interval or task_interval)(b, c, n)
    if extend:
        counts = np.stack([n - b - c, b, c, np.zeros_like(b)], axis=-1)[:, None, :]
        rejects = signflip_p_values(counts) <= alpha + 1e-12
        lower, upper = np.where(rejects, lower, np.minimum(lower, 0)), np.where(rejects, upper, np.maximum(upper, 0))
    logf = _log_factorials(n)
    log_comb = logf[n] - logf[b] - logf[c] - logf[n - b - c]
    p_sf, p_fs = np.atleast_1d(np.asarray(p_sf, dtype=float)), np.atleast_1d(np.asarray(p_fs, dtype=float))
    rest = np.clip(1 - p_sf - p_fs, 0, 1)

    def xlog(count: np.ndarray, p: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(count[None, :] > 0, count[None, :] * np.log(p[:, None]), 0.0)

    probability = np.exp(log_comb[None, :] + xlog(b, p_sf) + xlog(c, p_fs) + xlog(n - b - c, rest))
    delta = (p_sf - p_fs)[:, None]
    covered = (lower[None, :] <= delta + 1e-9) & (delta - 1e-9 <= upper[None, :])
    return (probability * covered).sum(axis=1)


@dataclass(frozen=True)
class ExactCoverage:
    """The worst exact one-task coverage over a (p_SF, p_FS) grid at one pair count."""

    n_pairs: int
    worst: float
    p_sf: float
    p_fs: float
    max_discordance: float  # the grid holds p_SF + p_FS <= this
    mean: float


def one_task_worst_coverage(n: int, step: float = 0.01, max_discordance: float = 1.0,
                            interval=None, extend: bool = True) -> ExactCoverage:
    """:func:`one_task_coverage` over every (p_SF, p_FS) on a ``step`` grid with p_SF + p_FS <= ``max_discordance``."""
    grid = np.round(np.arange(0, 1 + step / 2, step), 10)
    p_sf, p_fs = (v.ravel() for v in np.meshgrid(grid, grid, indexing="ij"))
    keep = p_sf + p_fs <= max_discordance + 1e-9
    p_sf, p_fs = p_sf[keep], p_fs[keep]
    coverage = one_task_coverage(n, p_sf, p_fs, interval=interval, extend=extend)
    worst = int(np.argmin(coverage))
    return ExactCoverage(n, float(coverage[worst]), float(p_sf[worst]), float(p_fs[worst]), max_discordance,
                         float(coverage.mean()))


# --------------------------------------------------------------------------- coverage: the simulation grid


CLEAN_SUCCESS = (0.6, 0.8, 0.95)
TRUE_DSR = (0.0, 0.2, 0.5)
N_TASKS = (1, 2, 3, 4, 8)
N_PAIRS = (10, 20, 50)
CONCORDANCE = 0.5
CONCORDANCES = (-0.5, 0.0, 0.5, 1.0)
# Near-ceiling (clean success, dSR) pairs of the heterogeneous cells, beside the grid's own: small shifts of a task
# close to the ceiling while the other tasks sit at it, where the percentile bootstrap collapses most often.
NEAR_CEILING = ((0.95, 0.05), (1.0, 0.1))


def cell_probabilities(clean_success: float, dsr: float, concordance: float = CONCORDANCE) -> np.ndarray:
    """Per-task pair probabilities (SS, SF, FS, FF) with the given marginals.

    The clean and perturbed outcomes have success rates p1 = clean_success and
    p2 = clean_success - dsr. ``concordance`` in [0, 1] mixes the most concordant joint the marginals
    allow (comonotone: FS = max(p2 - p1, 0); 1 is the perturbation that only ever hurts) with
    independence (0); in [-1, 0) it mixes independence with the most discordant joint
    (countermonotone: SS = max(p1 + p2 - 1, 0)): negatively dependent outcomes, where the perturbed
    rollout tends to fail exactly where the clean one succeeded and vice versa.
    """
    p1, p2 = clean_success, clean_success - dsr
    if not (0.0 <= p2 <= 1.0):
        raise AnalysisError(f"clean success {p1} and dSR {dsr} give a perturbed success rate {p2} outside [0, 1]")
    if not -1.0 <= concordance <= 1.0:
        raise AnalysisError(f"concordance {concordance} outside [-1, 1]")
    independent = np.array([p1 * p2, p1 * (1 - p2), (1 - p1) * p2, (1 - p1) * (1 - p2)])
    if concordance >= 0:
        both = min(p1, p2)
        extreme = np.array([both, p1 - both, p2 - both, 1 - max(p1, p2)])
    else:
        both = max(p1 + p2 - 1, 0.0)
        extreme = np.array([both, p1 - both, p2 - both, 1 - p1 - p2 + both])
    weight = abs(concordance)
    return np.clip(weight * extreme + (1 - weight) * independent, 0.0, 1.0)


def percentile_bootstrap_macro(counts: np.ndarray, n_boot: int, rng: np.random.Generator,
                               quantiles: Tuple[float, float] = (0.025, 0.975)
                               ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The paper's interval for many studies at once: within-task pair bootstrap, macro, percentiles.

    Args:
        counts: (n_studies, n_tasks, 4) pair counts SS, SF, FS, FF.
        n_boot: resamples per study.

    Resampling n_t pairs with replacement draws the (SF, FS) counts of a resample from a
    multinomial with the observed shares; that is drawn as SF* ~ Binomial(n, SF/n), then
    FS* ~ Binomial(n - SF*, FS / (n - SF)), which is the same distribution and vectorises.

    Returns:
        (lower, upper) of the macro per study, and (task_lower, task_upper) of every task's own
        percentile interval, (n_studies, n_tasks) (``numpy.quantile``, linear).
    """
    n_studies, n_tasks, _ = counts.shape
    total = np.zeros((n_studies, n_boot))
    task_lower, task_upper = np.zeros((n_studies, n_tasks)), np.zeros((n_studies, n_tasks))
    for t in range(n_tasks):
        n = counts[:, t, :].sum(axis=1).astype(np.int64)
        sf, fs = counts[:, t, 1].astype(np.int64), counts[:, t, 2].astype(np.int64)
        sf_star = rng.binomial(n[:, None], (sf / n)[:, None], size=(n_studies, n_boot))
        rest = n - sf
        share = np.divide(fs, rest, out=np.zeros(n_studies), where=rest > 0)
        fs_star = rng.binomial(n[:, None] - sf_star, np.minimum(share, 1.0)[:, None])
        task = (sf_star - fs_star) / n[:, None]
        task_lower[:, t], task_upper[:, t] = np.quantile(task, quantiles, axis=1)
        total += task
    macro = total / n_tasks
    lower, upper = np.quantile(macro, quantiles, axis=1)
    return lower, upper, task_lower, task_upper


@lru_cache(maxsize=16)
def _binomial_p_table(total: int) -> np.ndarray:
    """Two-sided exact binomial p-values P[S, M] (M = 0..total): the sign-flip test of equal-pair designs."""
    logf = _log_factorials(total)
    out = np.ones((total + 1, total + 1))
    for m in range(1, total + 1):
        s = np.arange(m + 1)
        cdf = np.cumsum(np.exp(logf[m] - logf[s] - logf[m - s] - m * math.log(2.0)))
        p = np.minimum(1.0, 2.0 * cdf[np.minimum(s, m - s)])
        p[2 * s == m] = 1.0
        out[: m + 1, m] = p
    return out


@dataclass(frozen=True)
class CoverageCell:
    """Coverage of the intervals in one cell of the grid.

    ``calibrated`` and ``task_calibrated`` are the intervals as published for a single condition:
    extended to 0 where the exact test (the sign-flip test, McNemar's per task) does not reject.
    """

    clean_success: float
    dsr: float
    n_tasks: int
    n_pairs: int
    studies: int
    percentile: float
    calibrated: float
    percentile_zero_width: float  # share of studies whose percentile interval has zero width
    calibrated_width: float  # mean width of the calibrated interval
    percentile_width: float
    concordance: float = CONCORDANCE
    ceiling_tasks: int = 0  # tasks at clean success 1 with nothing changing (their dSR is 0)
    task_percentile: float = float("nan")
    task_calibrated: float = float("nan")
    task_calibrated_width: float = float("nan")

    @property
    def true_macro(self) -> float:
        return self.dsr * (self.n_tasks - self.ceiling_tasks) / self.n_tasks

    @property
    def in_range(self) -> bool:
        """True when both true success rates lie in [0.05, 0.95] (ceiling tasks aside), where 0.93 is promised."""
        perturbed = self.clean_success - self.dsr
        return 0.05 - 1e-9 <= min(self.clean_success, perturbed) and max(self.clean_success, perturbed) <= 0.95 + 1e-9

    def to_json(self) -> Dict[str, Any]:
        return {**self.__dict__, "in_range": self.in_range, "true_macro": self.true_macro}


def coverage_cell(clean_success: float, dsr: float, n_tasks: int, n_pairs: int, studies: int, n_boot: int,
                  rng: np.random.Generator, concordance: float = CONCORDANCE, ceiling_tasks: int = 0) -> CoverageCell:
    """Simulate ``studies`` studies of one cell and measure every interval's coverage.

    The first ``n_tasks - ceiling_tasks`` tasks have the cell's pair probabilities; the others sit
    at the ceiling (every pair S->S), so the true macro dSR is dsr * (n_tasks - ceiling_tasks) / n_tasks.
    Per-task coverage is over the tasks that are not at the ceiling.
    """
    if not 0 <= ceiling_tasks < n_tasks:
        raise AnalysisError(f"ceiling tasks {ceiling_tasks} must be fewer than the {n_tasks} tasks")
    probabilities = cell_probabilities(clean_success, dsr, concordance)
    moving = n_tasks - ceiling_tasks
    counts = np.zeros((studies, n_tasks, 4))
    counts[:, :moving] = rng.multinomial(n_pairs, probabilities / probabilities.sum(), size=(studies, moving))
    counts[:, moving:, 0] = n_pairs
    truth = dsr * moving / n_tasks
    sf, fs = counts[..., 1].astype(np.int64), counts[..., 2].astype(np.int64)
    # the published intervals of a single condition: extended to 0 where the exact test does not reject
    p_table = _binomial_p_table(n_tasks * n_pairs)
    rejects = p_table[sf.sum(axis=1), (sf + fs).sum(axis=1)] <= ALPHA + 1e-12
    _, lower, upper = macro_interval(counts)
    lower, upper, _ = decide(lower, upper, rejects, np.zeros(studies, dtype=bool))
    # the truth is exact; 1e-9 absorbs float noise at the bounds (a point interval at 0 covers 0)
    covered = (lower <= truth + 1e-9) & (truth - 1e-9 <= upper)
    task_lo, task_hi = _task_interval_table(n_pairs)
    t_lower, t_upper = task_lo[sf[:, :moving], fs[:, :moving]], task_hi[sf[:, :moving], fs[:, :moving]]
    task_rejects = _binomial_p_table(n_pairs)[sf[:, :moving], (sf + fs)[:, :moving]] <= ALPHA + 1e-12
    t_lower, t_upper, _ = decide(t_lower, t_upper, task_rejects, np.zeros(task_rejects.shape, dtype=bool))
    task_covered = (t_lower <= dsr + 1e-9) & (dsr - 1e-9 <= t_upper)
    p_lower, p_upper, pt_lower, pt_upper = percentile_bootstrap_macro(counts, n_boot, rng)
    p_covered = (p_lower <= truth + 1e-9) & (truth - 1e-9 <= p_upper)
    pt_covered = (pt_lower[:, :moving] <= dsr + 1e-9) & (dsr - 1e-9 <= pt_upper[:, :moving])
    return CoverageCell(
        clean_success=clean_success, dsr=dsr, n_tasks=n_tasks, n_pairs=n_pairs, studies=studies,
        percentile=float(p_covered.mean()), calibrated=float(covered.mean()),
        percentile_zero_width=float(np.mean(p_upper - p_lower < 1e-12)),
        calibrated_width=float(np.mean(upper - lower)), percentile_width=float(np.mean(p_upper - p_lower)),
        concordance=float(concordance), ceiling_tasks=int(ceiling_tasks),
        task_percentile=float(pt_covered.mean()), task_calibrated=float(task_covered.mean()),
        task_calibrated_width=float(np.mean(t_upper - t_lower)),
    )


def _coverage_job(job: Tuple[int, float, float, int, int, int, int, int, float, int]) -> Tuple[CoverageCell, float]:
    """One cell in a worker process: its own stream (seed, cell index), so the result ignores the pool."""
    index, c, d, k, n, studies, n_boot, seed, concordance, ceiling = job
    started = time.perf_counter()
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
    return coverage_cell(c, d, k, n, studies, n_boot, rng, concordance, ceiling), time.perf_counter() - started


def coverage_grid(
    clean_success: Iterable[float] = CLEAN_SUCCESS,
    true_dsr: Iterable[float] = TRUE_DSR,
    n_tasks: Iterable[int] = N_TASKS,
    n_pairs: Iterable[int] = N_PAIRS,
    studies: int = 2000,
    n_boot: int = 1000,
    seed: int = 0,
    concordance: float | Iterable[float] = CONCORDANCE,
    workers: int = 1,
    progress: Optional[Callable[[CoverageCell, float], None]] = None,
    ceiling: bool = False,
) -> List[CoverageCell]:
    """Every cell of the grid, in grid order (concordance, clean success, dSR, tasks, pairs), then the ceiling cells.

    Each cell draws from its own stream (seed, cell index), so a cell's result is the same alone,
    in any order and with any number of ``workers`` (processes).

    Args:
        concordance: one value or several (each a grid of its own).
        ceiling: also, for every concordance, clean success, dSR > 0, task count > 1 and pair count, the
            cell where all tasks but one sit at the ceiling (every pair S->S): heterogeneous tasks, where
            the percentile bootstrap collapses.
        progress: called with each finished cell and its seconds (the CLI prints it), or None.
    """
    grid = coverage_plan(clean_success, true_dsr, n_tasks, n_pairs, concordance, ceiling)
    jobs = [(i, c, d, k, n, studies, n_boot, seed, r, z) for i, (r, c, d, k, n, z) in enumerate(grid)]
    results: List[Optional[CoverageCell]] = [None] * len(jobs)
    if workers <= 1:
        finished: Iterable[Tuple[int, Tuple[CoverageCell, float]]] = ((job[0], _coverage_job(job)) for job in jobs)
        for index, (cell, seconds) in finished:
            results[index] = cell
            if progress is not None:
                progress(cell, seconds)
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=workers) as pool:
            for (index, *_), (cell, seconds) in zip(jobs, pool.map(_coverage_job, jobs)):
                results[index] = cell
                if progress is not None:
                    progress(cell, seconds)
    return [cell for cell in results if cell is not None]


def coverage_plan(clean_success: Iterable[float] = CLEAN_SUCCESS, true_dsr: Iterable[float] = TRUE_DSR,
                  n_tasks: Iterable[int] = N_TASKS, n_pairs: Iterable[int] = N_PAIRS,
                  concordance: float | Iterable[float] = CONCORDANCE,
                  ceiling: bool = False) -> List[Tuple[float, float, float, int, int, int]]:
    """The cells of :func:`coverage_grid` in order, as (concordance, clean, dSR, tasks, pairs, ceiling tasks).

    The grid first; then, with ``ceiling``, every cell with dSR > 0 and more than one task again with all
    tasks but one at the ceiling, and the :data:`NEAR_CEILING` pairs in that heterogeneous setting.
    """
    concordances = [float(concordance)] if isinstance(concordance, (int, float)) else [float(v) for v in concordance]
    clean_success, true_dsr, n_tasks, n_pairs = list(clean_success), list(true_dsr), list(n_tasks), list(n_pairs)
    grid = [(r, c, d, k, n, 0) for r in concordances for c in clean_success for d in true_dsr for k in n_tasks
            for n in n_pairs]
    if ceiling:
        grid += [(r, c, d, k, n, k - 1) for r in concordances for c in clean_success for d in true_dsr if d > 0
                 for k in n_tasks if k > 1 for n in n_pairs]
        grid += [(r, c, d, k, n, k - 1) for r in concordances for c, d in NEAR_CEILING
                 for k in n_tasks if k > 1 for n in n_pairs]
    return grid


def coverage_failures(cells: Iterable[CoverageCell], threshold: float = 0.93) -> List[CoverageCell]:
    """The cells where a calibrated interval (macro or per task) falls below ``threshold`` while coverage is
    promised (in range)."""
    return [cell for cell in cells if cell.in_range and min(cell.calibrated, _or_one(cell.task_calibrated)) < threshold]


def _or_one(value: float) -> float:
    return 1.0 if value != value else value  # NaN (no per-task column) counts as no failure


# --------------------------------------------------------------------------- small statistics


def wilson_interval(successes: int, n: int, z: float = Z95) -> Optional[List[float]]:
    """Wilson score interval of a binomial proportion; None when n == 0."""
    if n <= 0:
        return None
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return [max(0.0, centre - half_width), min(1.0, centre + half_width)]


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b (S->F) and c (F->S).

    p = min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)]), and 1 when b + c == 0.
    Computed in exact integer arithmetic, so it stays accurate for hundreds of pairs.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / (1 << n))


def holm_adjust(p_values: Mapping[str, Optional[float]]) -> Dict[str, Optional[float]]:
    """Holm step-down adjusted p-values over the non-null entries; nulls stay null.

    The i-th smallest of m p-values becomes max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    named = sorted(((p, name) for name, p in p_values.items() if p is not None), key=lambda item: item[0])
    m = len(named)
    adjusted: Dict[str, Optional[float]] = {name: None for name in p_values}
    running_max = 0.0
    for rank, (p, name) in enumerate(named):
        running_max = max(running_max, min(1.0, (m - rank) * p))
        adjusted[name] = running_max
    return adjusted
