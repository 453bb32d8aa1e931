"""Interactions of combined conditions: does shifting two factors at once hurt more than the sum of each alone?

For a predeclared combination A+B (``perturbations/study.yaml``: ``combinations``), every base episode whose
clean, A, B and A+B rollouts are all valid (each perturbed one with its clean twin's fingerprints) is a
quadruple (c, a, b, ab) of outcomes, 1 for success. Since the combined rollout reuses exactly the single factors'
draws, the interaction

    dSR(A+B) - dSR(A) - dSR(B) = mean of (a + b - ab - c)

is estimated pair by pair on the same base episodes: per task over its quadruples, the macro as the equal-weight
mean over tasks (null when a task has no quadruple, as every macro). Positive: the combination hurts more than
the two shifts alone add up to (compounding; LIBERO-Plus reports such negative compositional effects); negative:
less (sub-additive).

- **Interval** (calibrated, as every headline here: its coverage measured, :data:`MEASURED_COVERAGE`): the
  interaction is a difference of two paired differences, D1 - D2 with D1 = mean(b - ab) (what adding A costs on
  top of B) and D2 = mean(c - a) = dSR(A). Each gets Tango's interval at 97.5% per task; MOVER combines them
  into the difference's, with the two estimates' correlation taken from the four outcomes of each base
  episode jointly where it is negative (A and B failing on the same episodes), and square-and-add into the
  macro's (:func:`interaction_interval`). A is the combination's first factor.
- **Test of additivity**: the exact stratified sign-flip test of the per-episode contrast a + b - ab - c, with
  the macro's weights (1 / (n_tasks n_t)): under the null the contrast's sign is exchangeable within every
  episode (the outcomes under the two single shifts exchangeable with those under clean and under both). Its
  null distribution is a convolution on an integer lattice, exact. Holm across the combinations.
- **Verdict**, read off the interval extended to 0 where the Holm-adjusted test does not reject
  (``statistics.decision``): COMPOUNDING (above 0), SUB-ADDITIVE (below 0), ADDITIVE (inside +-margin), else
  UNDERPOWERED. Not rejecting additivity is never reported as additive unless the interval says so.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.analysis.sections import Section, register_section
from robocasa_shift.core.conditions import CLEAN, Condition

# The interval of each of the two paired differences: 97.5%, so that their difference covers 95% (union bound).
COMPONENT_LEVEL = 0.975
VERDICT_NAMES = {stats.DEGRADED: "COMPOUNDING", stats.IMPROVED: "SUB-ADDITIVE", stats.NO_CHANGE: "ADDITIVE",
                 stats.UNDERPOWERED: "UNDERPOWERED"}
METHOD = (
    "interaction = dSR(A+B) - dSR(A) - dSR(B) = mean over base episodes valid under clean, A, B and A+B of "
    "(a + b - ab - c), per task, then the equal-weight mean over tasks; interval: the difference of two paired "
    "differences, mean(b - ab) - mean(c - a), each with Tango's interval at 97.5% per task, combined by MOVER for a "
    "difference of correlated estimates (r the per-episode correlation of b - ab and c - a where negative, else 0) "
    "and over tasks by square-and-add, A the combination's first factor; "
    "coverage measured by simulation; test of additivity: exact stratified sign-flip test of the per-episode contrast a + b - ab - c "
    "with the macro's weights, Holm across the combinations; the interval is extended to reach 0 where it does not "
    "reject; verdict: COMPOUNDING above 0, SUB-ADDITIVE below 0, ADDITIVE inside +-margin, else UNDERPOWERED"
)
# Measured by :func:`coverage_grid` (seed 0, 2,000 studies per cell): quoted beside the interval.
MEASURED_COVERAGE = (
    "worst cell 0.9705 (mean 0.993) over 2,772 cells: clean success 0.6 / 0.8 / 0.95 x dSR(A), dSR(B) 0 / 0.2 / 0.3 "
    "x interaction -0.1 / 0 / 0.1 x 1 / 2 / 4 tasks x 10 / 20 / 50 / 200 episodes x independent, half and fully "
    "dependent outcomes; worst 0.969 (mean 0.986) over 120 random dependent joints (a Gaussian copula) at 1 x 20 / "
    "50 / 200, 2 x 50 and 4 x 200; 2,000 studies each (the interval before any extension to 0, which only widens it; "
    "`robocasa-shift check-coverage`, seed 0)"
)


def _quadruples(rows: pd.DataFrame, condition: Condition) -> pd.DataFrame:
    """(task, episode, c, a, b, ab) over the episodes valid under clean and the three perturbed conditions."""
    a, b = (str(s) for s in condition.shifts)
    frames = []
    for name, label in ((CLEAN, "c"), (a, "a"), (b, "b"), (str(condition), "ab")):
        chosen = rows[(rows["condition"] == name) & rows["valid"]][["task", "episode", "success"]]
        frames.append(chosen.rename(columns={"success": label}))
    merged = frames[0]
    for frame in frames[1:]:
        merged = merged.merge(frame, on=["task", "episode"])
    return merged.sort_values(["task", "episode"], kind="stable").reset_index(drop=True)


def additivity_test(per_task: Sequence[np.ndarray]) -> Dict[str, Any]:
    """The exact stratified sign-flip test of per-episode contrasts (integers, here in -2..2), macro-weighted.

    Args:
        per_task: each task's contrasts (one per episode; every task needs at least one episode).

    Returns:
        ``{"p", "p_greater", "p_less", "exact", "n_nonzero"}``: two-sided and one-sided p-values (greater:
        compounding).
    """
    n = [len(v) for v in per_task]
    magnitudes = [np.abs(np.asarray(v, dtype=np.int64)) for v in per_task]
    totals = [int(m.sum()) for m in magnitudes]
    weights, exact = stats._lattice(n, totals)
    pmfs = []
    for m in magnitudes:
        pmf = np.ones(1)
        for size in sorted(set(m.tolist()) - {0}):
            k = int(np.sum(m == size))
            spread = np.zeros(k * size + 1)
            spread[::size] = stats._half_pmf(k)
            pmf = np.convolve(pmf, spread)
        pmfs.append(pmf)
    null = stats._convolve(pmfs, weights)
    centre2 = sum(t * w for t, w in zip(totals, weights))
    observed = sum(int(np.sum(np.where(np.asarray(v) > 0, m, 0))) * w for v, m, w in zip(per_task, magnitudes, weights))
    distance = np.abs(2 * np.arange(null.size) - centre2)
    return {"p": min(1.0, float(null[distance >= abs(2 * observed - centre2)].sum())),
            "p_greater": min(1.0, float(null[observed:].sum())), "p_less": min(1.0, float(null[:observed + 1].sum())),
            "exact": exact, "n_nonzero": int(sum(int(np.count_nonzero(m)) for m in magnitudes))}


QUADRUPLE_BITS = (np.arange(16)[:, None] >> np.arange(4)) & 1  # outcome index c + 2a + 4b + 8ab -> (c, a, b, ab)


def quadruple_counts(c: np.ndarray, a: np.ndarray, b: np.ndarray, ab: np.ndarray) -> List[int]:
    """How many episodes had each of the 16 outcomes (c, a, b, ab), index c + 2a + 4b + 8ab."""
    index = np.asarray(c, int) + 2 * np.asarray(a, int) + 4 * np.asarray(b, int) + 8 * np.asarray(ab, int)
    return np.bincount(index, minlength=16).tolist()


def _paired_counts(quads: np.ndarray, reference: int, other: int) -> np.ndarray:
    """SS, SF, FS, FF of one paired difference from (..., 16) quadruple counts."""
    out = []
    for r, o in ((1, 1), (1, 0), (0, 1), (0, 0)):
        mask = (QUADRUPLE_BITS[:, reference] == r) & (QUADRUPLE_BITS[:, other] == o)
        out.append(quads[..., mask].sum(axis=-1))
    return np.stack(out, axis=-1)


def component_correlation(quads: np.ndarray) -> np.ndarray:
    """Per task, the sample correlation of the two per-episode differences b - ab and c - a (0 where either is
    constant): the dependence MOVER must not leave out when A and B fail on the same episodes."""
    quads = np.asarray(quads, dtype=float)
    x1 = (QUADRUPLE_BITS[:, 2] - QUADRUPLE_BITS[:, 3]).astype(float)  # b - ab of each outcome
    x2 = (QUADRUPLE_BITS[:, 0] - QUADRUPLE_BITS[:, 1]).astype(float)  # c - a
    n = quads.sum(axis=-1)
    m1, m2 = quads @ x1 / n, quads @ x2 / n
    v1, v2 = quads @ (x1 * x1) / n - m1 ** 2, quads @ (x2 * x2) / n - m2 ** 2
    cov = quads @ (x1 * x2) / n - m1 * m2
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where((v1 > 1e-12) & (v2 > 1e-12), cov / np.sqrt(np.maximum(v1 * v2, 1e-300)), 0.0)
    return np.clip(r, -1.0, 1.0)


def interaction_interval(quads: np.ndarray, level: float = COMPONENT_LEVEL) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The calibrated interval of the macro of D1 - D2 from each task's four outcomes per episode (vectorised).

    Args:
        quads: (..., n_tasks, 16) counts of the outcomes (c, a, b, ab), index c + 2a + 4b + 8ab
            (:func:`quadruple_counts`); D1 = mean(b - ab), D2 = mean(c - a), on the same episodes.
        level: the level of each component's interval (Tango's, :func:`statistics.task_interval`).

    Per task, the interaction's interval is MOVER's for a difference of correlated estimates (Zou & Donner
    2008), r the sample correlation of the two per-episode differences (:func:`component_correlation`) where it
    is negative, else 0: I - sqrt((D1 - l1)^2 + (u2 - D2)^2 - 2 r (D1 - l1)(u2 - D2)), and the upper bound alike. The four cells of
    a base episode are one draw, so when A and B fail on the same episodes (r < 0) the interval widens; taken
    as uncorrelated it covered 0.928-0.946 at correlations near -0.6, not improving with the pair count. The
    macro's: the tasks' combined by square-and-add, as :func:`statistics.macro_interval` does. Coverage
    measured by :func:`coverage_grid` (:data:`MEASURED_COVERAGE`).

    Returns:
        (macro estimate, lower, upper), bounds clipped to [-2, 2].
    """
    z = stats.normal_quantile(1 - (1 - level) / 2)
    quads = np.asarray(quads, dtype=float)
    c1, c2 = _paired_counts(quads, 2, 3), _paired_counts(quads, 0, 1)
    # only a negative correlation enters: it widens the interval. A positive one estimated from few discordant
    # episodes is often near 1 and would shrink the interval to nothing (coverage 0.78 at 10 episodes).
    r = np.minimum(component_correlation(quads), 0.0)
    n = c1.sum(axis=-1)
    d1, d2 = (c1[..., 1] - c1[..., 2]) / n, (c2[..., 1] - c2[..., 2]) / n
    l1, u1 = stats.task_interval(c1[..., 1], c1[..., 2], n, z)
    l2, u2 = stats.task_interval(c2[..., 1], c2[..., 2], n, z)
    estimate = d1 - d2
    below = np.sqrt(np.maximum((d1 - l1) ** 2 + (u2 - d2) ** 2 - 2 * r * (d1 - l1) * (u2 - d2), 0.0))
    above = np.sqrt(np.maximum((u1 - d1) ** 2 + (d2 - l2) ** 2 - 2 * r * (u1 - d1) * (d2 - l2), 0.0))
    k = estimate.shape[-1]
    macro = estimate.mean(axis=-1)
    lower = macro - np.sqrt((below ** 2).sum(axis=-1)) / k
    upper = macro + np.sqrt((above ** 2).sum(axis=-1)) / k
    return macro, np.maximum(lower, -2.0), np.minimum(upper, 2.0)


def interactions(rows: pd.DataFrame, conditions: Sequence[str], tasks: Sequence[str],
                 summary_conditions: Mapping[str, Mapping[str, Any]],
                 min_effect: float = stats.MIN_EFFECT) -> Dict[str, Any]:
    """Every combined condition of ``conditions`` whose two single conditions are in the table too, as
    ``{condition: {...}}`` (see the module docstring for the estimate, interval, test and verdict).

    Args:
        rows: the paired rows (replicate 0, fingerprint mismatches already invalid).
        conditions: the table's conditions, in display order.
        tasks: the table's tasks.
        summary_conditions: the summary's per-condition measures (each single condition's dSR is quoted beside).
    """
    out: Dict[str, Any] = {}
    for text in conditions:
        condition = Condition.parse(text)
        if len(condition.shifts) != 2:
            continue
        first, second = (str(s) for s in condition.shifts)
        if first not in summary_conditions or second not in summary_conditions:
            continue
        quads = _quadruples(rows, condition)
        per_task: Dict[str, Dict[str, Any]] = {}
        contrasts, quad_counts = [], []
        for task in tasks:
            q = quads[quads["task"] == task]
            c, a, b, ab = (q[k].to_numpy(dtype=bool) for k in ("c", "a", "b", "ab"))
            n = len(q)
            if n == 0:
                per_task[task] = {"n": 0, "interaction": None, "interval": None, "dsr_a": None, "dsr_b": None,
                                  "dsr_ab": None}
                continue
            contrast = a.astype(int) + b.astype(int) - ab.astype(int) - c.astype(int)
            quad = quadruple_counts(c, a, b, ab)
            estimate, lower, upper = interaction_interval(np.array([[quad]], float))
            per_task[task] = {"n": n, "interaction": float(contrast.mean()),
                              "interval": [float(lower[0]), float(upper[0])],
                              "dsr_a": float(np.mean(c.astype(int) - a)), "dsr_b": float(np.mean(c.astype(int) - b)),
                              "dsr_ab": float(np.mean(c.astype(int) - ab))}
            contrasts.append(contrast)
            quad_counts.append(quad)
        missing = [t for t in tasks if per_task[t]["n"] == 0]
        complete = bool(tasks) and not missing

        def macro(key: str) -> Optional[float]:
            return float(np.mean([per_task[t][key] for t in tasks])) if complete else None

        interval = None
        test = None
        if complete:
            _, lower, upper = interaction_interval(np.array([quad_counts], float))
            interval = [float(lower[0]), float(upper[0])]
            test = additivity_test(contrasts)
        out[text] = {
            "a": first, "b": second, "n_quadruples": int(len(quads)), "missing_tasks": missing,
            "interaction": macro("interaction"), "dsr_a": macro("dsr_a"), "dsr_b": macro("dsr_b"),
            "dsr_ab": macro("dsr_ab"), "interval_calibrated": interval, "additivity_test": test,
            "per_task": per_task,
        }
    adjusted = stats.holm_adjust({c: (v["additivity_test"] or {}).get("p") for c, v in out.items()})
    for text, value in out.items():
        if value["additivity_test"] is not None:
            value["additivity_test"]["p_holm"] = adjusted[text]
        chosen = stats.decision(value["interval_calibrated"], adjusted[text], None, min_effect)
        value["interval_shown"] = None if chosen is None else chosen["interval"]
        value["extended_to_zero"] = None if chosen is None else chosen["extended_to_zero"]
        value["verdict"] = None if chosen is None else VERDICT_NAMES[chosen["verdict"]]
    return out


def interaction_rows(summary: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The summary's interactions as table rows (``interactions.csv``): macro, then per task."""
    rows = []
    for condition, value in (summary.get("interactions") or {}).items():
        lo, hi = value["interval_calibrated"] or (None, None)
        rows.append({"condition": condition, "task": "macro", "n": value["n_quadruples"], "dsr_a": value["dsr_a"],
                     "dsr_b": value["dsr_b"], "dsr_ab": value["dsr_ab"], "interaction": value["interaction"],
                     "calibrated_lo": lo, "calibrated_hi": hi,
                     "additivity_p_holm": (value["additivity_test"] or {}).get("p_holm"), "verdict": value["verdict"]})
        for task, t in value["per_task"].items():
            lo, hi = t["interval"] or (None, None)
            rows.append({"condition": condition, "task": task, "n": t["n"], "dsr_a": t["dsr_a"], "dsr_b": t["dsr_b"],
                         "dsr_ab": t["dsr_ab"], "interaction": t["interaction"], "calibrated_lo": lo,
                         "calibrated_hi": hi, "additivity_p_holm": None, "verdict": None})
    return rows


INTERACTION_COLUMNS = ("condition", "task", "n", "dsr_a", "dsr_b", "dsr_ab", "interaction", "calibrated_lo",
                       "calibrated_hi", "additivity_p_holm", "verdict")


# --------------------------------------------------------------------------- coverage


def quadruple_probabilities(clean: float, dsr_a: float, dsr_b: float, interaction: float,
                            dependence: float) -> np.ndarray:
    """P of the 16 outcomes (c, a, b, ab), index c + 2a + 4b + 8ab, with success rates clean, clean - dsr_a,
    clean - dsr_b and clean - dsr_a - dsr_b - interaction: a mixture (weight ``dependence``) of the comonotone
    joint (one latent difficulty decides every condition) and independent outcomes.

    Raises:
        ValueError: a success rate outside [0, 1].
    """
    rates = np.array([clean, clean - dsr_a, clean - dsr_b, clean - dsr_a - dsr_b - interaction])
    if np.any(rates < -1e-12) or np.any(rates > 1 + 1e-12):
        raise ValueError(f"success rates {rates.tolist()} outside [0, 1]")
    rates = np.clip(rates, 0.0, 1.0)
    index = np.arange(16)
    bits = (index[:, None] >> np.arange(4)) & 1
    independent = np.prod(np.where(bits == 1, rates, 1 - rates), axis=1)
    comonotone = np.zeros(16)
    edges = np.sort(np.concatenate([[0.0, 1.0], rates]))
    for lo, hi in zip(edges[:-1], edges[1:]):
        if hi > lo:
            u = (lo + hi) / 2
            outcome = (u < rates).astype(int)
            comonotone[int(outcome @ (1 << np.arange(4)))] += hi - lo
    return dependence * comonotone + (1 - dependence) * independent


def coverage_cell(clean: float, dsr_a: float, dsr_b: float, interaction: float, n_tasks: int, n: int,
                  dependence: float, studies: int, rng: np.random.Generator) -> float:
    """The share of simulated studies whose interval (before any extension to 0) covers the true interaction."""
    p = quadruple_probabilities(clean, dsr_a, dsr_b, interaction, dependence)
    return joint_coverage(p, interaction, n_tasks, n, studies, rng)


def joint_coverage(p: np.ndarray, interaction: float, n_tasks: int, n: int, studies: int,
                   rng: np.random.Generator) -> float:
    """Coverage of the interval (before any extension to 0) for outcomes drawn from the 16-cell joint ``p``."""
    draws = rng.multinomial(n, p / p.sum(), size=(studies, n_tasks))  # (studies, tasks, 16)
    _, lower, upper = interaction_interval(draws)
    return float(np.mean((lower <= interaction + 1e-9) & (interaction - 1e-9 <= upper)))


def coverage_grid(studies: int = 2000, seed: int = 0, clean: Sequence[float] = (0.6, 0.8, 0.95),
                  dsr: Sequence[float] = (0.0, 0.2, 0.3), interaction: Sequence[float] = (-0.1, 0.0, 0.1),
                  n_tasks: Sequence[int] = (1, 2, 4), n_pairs: Sequence[int] = (10, 20, 50, 200),
                  dependence: Sequence[float] = (0.0, 0.5, 1.0)) -> List[Dict[str, Any]]:
    """Every feasible cell of the grid with its measured coverage; each cell from its own stream (seed, index)."""
    out = []
    index = 0
    for c in clean:
        for da in dsr:
            for db in dsr:
                for i in interaction:
                    if not 0 <= c - da - db - i <= 1 or not 0 <= c - da <= 1 or not 0 <= c - db <= 1:
                        continue
                    for k in n_tasks:
                        for n in n_pairs:
                            for d in dependence:
                                rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
                                index += 1
                                out.append({"clean": c, "dsr_a": da, "dsr_b": db, "interaction": i, "n_tasks": k,
                                            "n": n, "dependence": d,
                                            "coverage": coverage_cell(c, da, db, i, k, n, d, studies, rng)})
    return out


def random_dependent_joint(rng: np.random.Generator, draws: int = 200_000) -> Optional[np.ndarray]:
    """A random 16-cell joint of (c, a, b, ab) with dependent failures, or None when a rate falls outside [0.02, 0.98].

    Success rates: clean uniform in [0.5, 0.95], dSR(A) and dSR(B) in [0, 0.35], interaction in [-0.1, 0.2];
    the four outcomes are thresholds of four correlated normal variables (a Gaussian copula) whose correlation
    comes from two random factors, so failures under A, B and A+B fall on the same episodes to a random degree.
    The joint is the empirical one of ``draws`` draws: the true interaction is computed from it, so it is exact
    for the cell it defines.
    """
    clean = rng.uniform(0.5, 0.95)
    dsr_a, dsr_b, interaction = rng.uniform(0.0, 0.35), rng.uniform(0.0, 0.35), rng.uniform(-0.1, 0.2)
    rates = np.array([clean, clean - dsr_a, clean - dsr_b, clean - dsr_a - dsr_b - interaction])
    if rates.min() < 0.02 or rates.max() > 0.98:
        return None
    loadings = rng.normal(size=(4, 2)) * rng.uniform(0.0, 1.5)
    covariance = loadings @ loadings.T + np.eye(4)
    scale = np.sqrt(np.diag(covariance))
    latent = rng.multivariate_normal(np.zeros(4), covariance / np.outer(scale, scale), size=draws)
    thresholds = np.array([stats.normal_quantile(r) for r in rates])
    index = (latent < thresholds).astype(int) @ (1 << np.arange(4))
    return np.bincount(index, minlength=16) / draws


INTERACTION_CONTRAST = QUADRUPLE_BITS[:, 1] + QUADRUPLE_BITS[:, 2] - QUADRUPLE_BITS[:, 3] - QUADRUPLE_BITS[:, 0]
RANDOM_DESIGNS = ((1, 20), (1, 50), (1, 200), (2, 50), (4, 200))


def random_dependent_coverage(cells: int = 120, studies: int = 2000, seed: int = 0,
                              designs: Sequence[Tuple[int, int]] = RANDOM_DESIGNS) -> List[Dict[str, Any]]:
    """Coverage on ``cells`` random dependent joints (:func:`random_dependent_joint`) at each (tasks, episodes)."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x494E54,)))
    out = []
    while len(out) < cells * len(designs):
        p = random_dependent_joint(rng)
        if p is None:
            continue
        truth = float(p @ INTERACTION_CONTRAST)
        index = len(out) // len(designs)
        for k, n in designs:
            out.append({"cell": index, "n_tasks": k, "n": n, "interaction": truth,
                        "rates": [float(p[QUADRUPLE_BITS[:, j] == 1].sum()) for j in range(4)],
                        "coverage": joint_coverage(p, truth, k, n, studies, rng)})
    return out


register_section(Section(
    "interactions",
    lambda d: {"interactions": interactions(d.paired_rows, d.conditions, d.tasks, d.summary_conditions, d.min_effect),
               "interaction_method": {"estimate": METHOD, "coverage": MEASURED_COVERAGE}},
    tables=lambda summary: {"interactions": pd.DataFrame(interaction_rows(summary),
                                                         columns=list(INTERACTION_COLUMNS)).astype(object)},
    report="robocasa_shift.report.page:interaction_section", order=20))


__all__ = ["COMPONENT_LEVEL", "INTERACTION_COLUMNS", "MEASURED_COVERAGE", "METHOD", "additivity_test",
           "component_correlation", "coverage_cell", "coverage_grid", "interaction_interval", "interaction_rows",
           "interactions", "joint_coverage", "quadruple_counts", "quadruple_probabilities", "random_dependent_coverage",
           "random_dependent_joint"]
