"""The statistics of the monitor study's feature-set analyses (``monitoring/feature_sets.py``): linear CKA between
two representations, PLS directions targeting a residual, and per-task contrasts summarised over held-out tasks
(the mean, a t-interval over tasks, the tasks where it is positive, the exact sign-flip p).

Pure numpy (scipy's t quantile) over arrays and per-task values; nothing here reads a run or fits a monitor.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift.analysis.monitor_detection import MIN_TASKS_FOR_INTERVAL

MAX_SIGNFLIP_TASKS = 16  # 2^16 sign assignments: beyond that the p-value is not enumerated


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two representations of the same rows: ||Yc' Xc||_F^2 / (||Xc' Xc||_F ||Yc' Yc||_F), with Xc
    and Yc column-centred. 1 for Y an orthogonal rotation or a rescaling of X; for single columns, their squared
    correlation. NaN when either is constant."""
    xc = np.asarray(x, dtype=np.float64) - np.asarray(x, dtype=np.float64).mean(axis=0)
    yc = np.asarray(y, dtype=np.float64) - np.asarray(y, dtype=np.float64).mean(axis=0)
    # the n x n Gram form: the same value, and cheap for few rows of wide sets
    kx, ky = xc @ xc.T, yc @ yc.T
    denominator = math.sqrt(float((kx * kx).sum()) * float((ky * ky).sum()))
    return float((kx * ky).sum()) / denominator if denominator > 0 else math.nan


def signflip_p(deltas: Sequence[float]) -> Optional[float]:
    """Exact two-sided sign-flip p of per-task differences: the share of the 2^k sign assignments whose mean is at
    least as far from 0 as the observed one (None with no task or more than :data:`MAX_SIGNFLIP_TASKS`)."""
    d = np.asarray([v for v in deltas if v is not None and np.isfinite(v)], dtype=np.float64)
    if not len(d) or len(d) > MAX_SIGNFLIP_TASKS:
        return None
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    means = np.abs(signs @ d) / len(d)
    return float(np.mean(means >= abs(d.mean()) - 1e-12))


def task_summary(per_task: Mapping[str, Optional[float]]) -> Dict[str, Any]:
    """Mean over tasks of a per-task difference, its 95% t-interval over tasks (none below 3), the tasks where it
    is positive and the exact sign-flip p."""
    values = [v for v in per_task.values() if v is not None and np.isfinite(v)]
    k = len(values)
    out: Dict[str, Any] = {"mean": float(np.mean(values)) if k else None, "n_tasks": k,
                           "positive": f"{sum(v > 0 for v in values)}/{k}", "signflip_p": signflip_p(values),
                           "ci95": [None, None]}
    if k >= MIN_TASKS_FOR_INTERVAL:
        from scipy import stats

        half = stats.t.ppf(0.975, k - 1) * float(np.std(values, ddof=1)) / math.sqrt(k)
        out["ci95"] = [out["mean"] - half, out["mean"] + half]
    return out


def pls_directions(x: np.ndarray, target: np.ndarray, k: int) -> np.ndarray:
    """The rotation R (columns: k PLS1 directions, NIPALS) such that ``x @ R`` are the PLS scores of ``x`` (already
    centred) for the centred ``target``: each weight vector is ``x' target`` of the deflated data, normalised."""
    x = np.asarray(x, dtype=np.float64).copy()
    y = np.asarray(target, dtype=np.float64) - np.mean(target)
    weights, loadings = [], []
    for _ in range(k):
        w = x.T @ y
        norm = np.linalg.norm(w)
        if norm < 1e-12:
            break
        w /= norm
        t = x @ w
        tt = float(t @ t)
        if tt < 1e-12:
            break
        p = x.T @ t / tt
        x -= np.outer(t, p)
        y = y - t * float(t @ y) / tt
        weights.append(w)
        loadings.append(p)
    if not weights:
        return np.zeros((x.shape[1], 0))
    w_mat, p_mat = np.column_stack(weights), np.column_stack(loadings)
    return w_mat @ np.linalg.pinv(p_mat.T @ w_mat)


__all__ = ["MAX_SIGNFLIP_TASKS", "linear_cka", "pls_directions", "signflip_p", "task_summary"]
