"""Time-varying alarm thresholds by functional conformal prediction (SAFE's procedure, as the pooled-AUC report
reimplements it in its Sec. 3.4), beside the constant thresholds of ``detection.select_threshold``.

Pure numpy / pandas over boundary-score tables (``detection.BOUNDARY_COLUMNS``). A score trajectory is
indexed by boundary (its i-th action-chunk boundary), restricted to a window.

The procedure, for one miscoverage level ``alpha`` and one calibration split:

1. take the score trajectories of the calibration rollouts (clean validation successes) and
   *extend-align* them to one length (the longest): a trajectory shorter than it keeps its last value;
2. split them at random (a seeded permutation) into a fitting part (``fit_fraction``, 30%) and a
   calibration part (the rest);
3. on the fitting part, the mean trajectory ``m(t)`` and the modulation ``s(t)`` (SAFE's ``Tfunc``: the
   largest absolute deviation from ``m(t)`` at each time over the fitting trajectories whose sup-norm
   deviation is within their ``ceil((n_fit + 1)(1 - alpha))``-th smallest, all of them when that
   exceeds ``n_fit``; at least ``MIN_MODULATION`` times the largest ``|m|``, so a flat stretch does not
   divide by 0);
4. on the calibration part, the one-sided nonconformity ``R_i = max_t (y_i(t) - m(t)) / s(t)`` and its
   ``ceil((n_cal + 1)(1 - alpha))``-th smallest value ``q`` (the band is ``+inf``, never alarming, when
   that rank exceeds ``n_cal``);
5. the band ``m(t) + q s(t)``: a rollout alarms at its first boundary whose score exceeds the band
   (strictly; NaN never alarms), the band held at its last value past the aligned length.

:func:`sweep` repeats it over a grid of ``alpha`` and calibration splits (seeds) and reports, on the
test rollouts, the realised false-alarm rate, the catch rate and the effective alarm position (the
alarm's fraction of the window for caught failures, 1.0 for a miss), averaged over splits, with their
spread across splits (the sensitivity to the calibration split).
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.errors import AnalysisError
from robocasa_shift.analysis import monitor_detection as detection

ALPHAS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)  # the report's grid (Sec. 8)
N_SPLITS = 10  # calibration splits per alpha (the report's 10 CP seeds)
FIT_FRACTION = 0.3
MIN_MODULATION = 1e-6


def _conformal_rank(n: int, alpha: float) -> int:
    return int(math.ceil((n + 1) * (1.0 - alpha)))


def align(curves: Sequence[np.ndarray], length: Optional[int] = None) -> np.ndarray:
    """Extend-align trajectories to ``length`` (default: the longest): each keeps its last value to the end.

    Raises:
        AnalysisError: an empty trajectory, or one longer than ``length``.
    """
    curves = [np.asarray(c, dtype=float).reshape(-1) for c in curves]
    if any(c.size == 0 for c in curves):
        raise AnalysisError("a score trajectory without boundaries cannot be aligned")
    length = max(c.size for c in curves) if length is None else int(length)
    if any(c.size > length for c in curves):
        raise AnalysisError(f"a trajectory is longer than the aligned length {length}")
    return np.stack([np.concatenate([c, np.full(length - c.size, c[-1])]) for c in curves]) if curves \
        else np.zeros((0, length))


def _filled(matrix: np.ndarray, low: float) -> np.ndarray:
    """NaN (undefined: never alarms) read as ``low``, a value below every band."""
    return np.where(np.isnan(matrix), low, matrix)


def fit_band(fit: np.ndarray, calibration: np.ndarray, alpha: float) -> np.ndarray:
    """The upper band ``m + q s`` of aligned trajectories (rows): ``m``, ``s`` from ``fit``, ``q`` from ``calibration``.

    Args:
        fit: (n_fit, T) aligned trajectories, n_fit >= 1.
        calibration: (n_cal, T) aligned trajectories, n_cal >= 1.
        alpha: miscoverage level in (0, 1).

    Returns:
        The band, (T,) (all +inf when the conformal rank exceeds ``n_cal``).
    """
    fit, calibration = np.asarray(fit, dtype=float), np.asarray(calibration, dtype=float)
    if fit.ndim != 2 or calibration.ndim != 2 or not len(fit) or not len(calibration) \
            or fit.shape[1] != calibration.shape[1]:
        raise AnalysisError("fit_band needs two non-empty (n, T) arrays of one length T")
    if not 0 < alpha < 1:
        raise AnalysisError(f"alpha {alpha!r} must lie in (0, 1)")
    finite = np.concatenate([fit[np.isfinite(fit)], calibration[np.isfinite(calibration)]])
    low = float(finite.min()) if finite.size else 0.0
    fit, calibration = _filled(fit, low), _filled(calibration, low)
    mean = fit.mean(axis=0)
    deviation = np.abs(fit - mean)
    sup = deviation.max(axis=1)
    rank = _conformal_rank(len(fit), alpha)
    keep = sup <= np.sort(sup)[rank - 1] if rank <= len(fit) else np.ones(len(fit), dtype=bool)
    floor = MIN_MODULATION * max(1.0, float(np.abs(mean).max()))
    modulation = np.maximum(deviation[keep].max(axis=0), floor)
    residual = ((calibration - mean) / modulation).max(axis=1)
    rank = _conformal_rank(len(calibration), alpha)
    if rank > len(calibration):
        return np.full(mean.shape, np.inf)
    return mean + np.sort(residual)[rank - 1] * modulation


def first_crossing(curve: np.ndarray, band: np.ndarray) -> Optional[int]:
    """The first index whose score exceeds the band (the band held at its last value past its end); None if none."""
    curve = np.asarray(curve, dtype=float)
    band = np.asarray(band, dtype=float)
    if curve.size > band.size:
        band = np.concatenate([band, np.full(curve.size - band.size, band[-1])])
    above = np.where(np.isnan(curve), False, curve > band[: curve.size])
    hits = np.flatnonzero(above)
    return int(hits[0]) if hits.size else None


def trajectories(scores: pd.DataFrame, limits: Mapping[str, Optional[int]]) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
    """Each rollout's in-window (scores, steps) along its boundaries, by rollout id."""
    df = detection.check_boundary_scores(scores)
    rollouts, inside = detection._in_window(df, limits)
    kept = df[inside]
    return {rid: (part["score"].to_numpy(dtype=float), part["step"].to_numpy(dtype=float))
            for rid, part in kept.groupby("rollout_id", sort=False)}


def _split(n: int, fraction: float, rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(n)
    n_fit = min(max(1, int(round(fraction * n))), n - 1)
    return order[:n_fit], order[n_fit:]


def evaluate_band(band: np.ndarray, curves: Mapping[str, Tuple[np.ndarray, np.ndarray]],
                  rollouts: pd.DataFrame) -> Dict[str, Any]:
    """False-alarm rate, catch rate and effective alarm position of a band on ``rollouts`` (rows with
    rollout_id, success, window_end)."""
    return _evaluate(band, _Padded(curves, rollouts))


class _Padded:
    """The trajectories of a set of rollouts as NaN-padded matrices (scores, steps), with their outcomes."""

    def __init__(self, curves: Mapping[str, Tuple[np.ndarray, np.ndarray]], rollouts: pd.DataFrame):
        ids = rollouts["rollout_id"].tolist()
        length = max([len(curves.get(r, (np.zeros(0),))[0]) for r in ids] + [1])
        self.values = np.full((len(ids), length), np.nan)
        self.steps = np.full((len(ids), length), np.nan)
        for i, rid in enumerate(ids):
            values, steps = curves.get(rid, (np.zeros(0), np.zeros(0)))
            self.values[i, : len(values)] = values
            self.steps[i, : len(steps)] = steps
        self.success = rollouts["success"].to_numpy(dtype=bool)
        self.window_end = np.maximum(rollouts["window_end"].to_numpy(dtype=float), 1.0)


def _evaluate(band: np.ndarray, padded: _Padded) -> Dict[str, Any]:
    band = np.asarray(band, dtype=float)
    length = padded.values.shape[1]
    if band.size < length:
        band = np.concatenate([band, np.full(length - band.size, band[-1])])
    with np.errstate(invalid="ignore"):
        above = padded.values > band[None, :length]  # NaN compares False: never an alarm
    alarmed = above.any(axis=1)
    first = above.argmax(axis=1)
    step = padded.steps[np.arange(len(first)), first]
    success, failed = padded.success, ~padded.success
    n_s, n_f = int(success.sum()), int(failed.sum())
    positions = np.where(alarmed, step / padded.window_end, 1.0)[failed]
    return {"n_successes": n_s, "n_failures": n_f,
            "false_alarm_rate": int((alarmed & success).sum()) / n_s if n_s else None,
            "catch_rate": int((alarmed & failed).sum()) / n_f if n_f else None,
            "effective_alarm_position": float(positions.mean()) if positions.size else None}


def _stats(values: List[Optional[float]]) -> Dict[str, Optional[float]]:
    kept = np.array([v for v in values if v is not None], dtype=float)
    if not kept.size:
        return {"mean": None, "sd": None, "min": None, "max": None}
    return {"mean": float(kept.mean()), "sd": float(kept.std(ddof=1)) if kept.size > 1 else 0.0,
            "min": float(kept.min()), "max": float(kept.max())}


def sweep(scores: pd.DataFrame, splits: Mapping[str, Mapping[str, Sequence[int]]],
          limits: Mapping[str, Optional[int]], alphas: Sequence[float] = ALPHAS, n_splits: int = N_SPLITS,
          seed: int = 0, fit_fraction: float = FIT_FRACTION,
          evaluations: Optional[Mapping[str, Sequence[str]]] = None) -> pd.DataFrame:
    """Functional conformal thresholds over ``alphas`` x ``n_splits`` calibration splits, evaluated on test rollouts.

    Calibrated on the clean validation successes (every task pooled, as one threshold serves every task);
    evaluated on the test rollouts of each entry of ``evaluations`` (name -> conditions; default
    ``{"all": every condition, "clean": ["clean"]}``).

    Returns:
        One row per (evaluation, alpha): n_calibration, false_alarm_rate / catch_rate /
        effective_alarm_position as mean, sd, min and max over the splits (columns ``<measure>_<stat>``),
        n_splits, and ``finite_bands`` (splits whose band could alarm at all).

    Raises:
        AnalysisError: fewer than two calibration trajectories (nothing to split).
    """
    df = detection.add_split_column(detection.check_boundary_scores(scores), splits)
    ep = detection.episode_scores(df, limits)
    curves = trajectories(df, limits)
    calibration_ids = ep.loc[(ep[detection.SPLIT_COLUMN] == detection.VALIDATION)
                             & (ep["condition"] == detection.CLEAN) & ep["success"], "rollout_id"].tolist()
    calibration_ids = [r for r in calibration_ids if r in curves]
    if len(calibration_ids) < 2:
        raise AnalysisError(f"functional conformal prediction needs at least two clean validation successes "
                            f"with boundaries in the window, found {len(calibration_ids)}")
    aligned = align([curves[r][0] for r in calibration_ids])
    test = ep[ep[detection.SPLIT_COLUMN] == detection.TEST]
    if evaluations is None:
        evaluations = {detection.ALL_CONDITIONS: sorted(test["condition"].unique().tolist()),
                       detection.CLEAN: [detection.CLEAN]}
    rng = np.random.default_rng(int(seed))
    parts = [_split(len(aligned), fit_fraction, rng) for _ in range(int(n_splits))]
    rows = []
    for name, conditions in evaluations.items():
        rollouts = test[test["condition"].isin(list(conditions))]
        padded = _Padded(curves, rollouts)
        for alpha in alphas:
            results, finite = [], 0
            for fit_idx, cal_idx in parts:
                band = fit_band(aligned[fit_idx], aligned[cal_idx], float(alpha))
                finite += int(np.isfinite(band).any())
                results.append(_evaluate(band, padded))
            row: Dict[str, Any] = {"evaluation": name, "alpha": float(alpha), "n_calibration": len(aligned),
                                   "n_test": int(len(rollouts)), "n_splits": len(parts), "finite_bands": finite}
            for measure in ("false_alarm_rate", "catch_rate", "effective_alarm_position"):
                for stat, value in _stats([r[measure] for r in results]).items():
                    row[f"{measure}_{stat}"] = value
            rows.append(row)
    return pd.DataFrame(rows)


def constant_point(scores: pd.DataFrame, splits, limits, target_fa: float,
                   conditions: Sequence[str]) -> Dict[str, Any]:
    """Today's constant threshold (``detection.select_threshold`` at ``target_fa`` on clean validation successes)
    on the same test rollouts, in :func:`sweep`'s terms (one value: no calibration split)."""
    df = detection.add_split_column(detection.check_boundary_scores(scores), splits)
    ep = detection.episode_scores(df, limits)
    threshold = detection.select_threshold(detection._calibration_successes(ep), target_fa)
    test_ids = set(ep.loc[(ep[detection.SPLIT_COLUMN] == detection.TEST) & ep["condition"].isin(list(conditions)),
                          "rollout_id"])
    point = detection.summarize_alarms(detection._alarms_of(df, test_ids, threshold, limits), threshold)
    return {"threshold": threshold, "false_alarm_rate": point.false_alarm_rate, "catch_rate": point.catch_rate,
            "effective_alarm_position": point.mean_alarm_position_fraction}


__all__ = ["ALPHAS", "FIT_FRACTION", "N_SPLITS", "align", "constant_point", "evaluate_band", "first_crossing",
           "fit_band", "sweep", "trajectories"]
