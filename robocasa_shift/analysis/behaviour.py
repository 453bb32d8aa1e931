"""Behaviour beyond success, from step logs: how a rollout moved, paired with its clean twin, and by stage.

Per rollout (:func:`rollout_metrics`, from its step log and record): the control step at which each subgoal
latched, the end effector's path length and idle steps, the arm commands' jerk, and the steps to success. Per
condition (:func:`paired_differences`): the mean of perturbed minus clean over the pairs where both rollouts have
the metric, with a 95% Student-t interval over pairs; the time spent in each stage (steps from the previous
subgoal's latch to this one's) is compared the same way, so a shift that slows the approach but not the lift
shows as a difference in one stage only.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
from scipy import stats

from robocasa_shift.core.steplog import StepLog

IDLE_M = 0.001  # an end-effector move below this (metres per control step) counts as idle
METRICS = ("path_length_m", "idle_steps", "jerk", "steps_to_success")


def latch_steps(latched: np.ndarray, n_subgoals: int) -> List[Optional[int]]:
    """The control step (1-based: steps taken) after which each subgoal had latched, None when it never did."""
    counts = np.asarray(latched, dtype=np.int64)
    out: List[Optional[int]] = []
    for j in range(n_subgoals):
        hit = np.flatnonzero(counts >= j + 1)
        out.append(int(hit[0]) + 1 if hit.size else None)
    return out


def rollout_metrics(log: StepLog, success: Optional[bool]) -> Dict[str, Any]:
    """The behaviour metrics of one rollout (layout in the module docstring)."""
    moves = np.linalg.norm(np.diff(log.eef_pos, axis=0), axis=1) if len(log.eef_pos) > 1 else np.zeros(0)
    arm = log.arm
    jerk = float(np.mean(np.sum(np.diff(arm, n=3, axis=0) ** 2, axis=1))) if len(arm) > 3 else None
    names = list(log.meta.get("stage_names") or [])
    latches = latch_steps(log.latched, len(names))
    stage_steps: Dict[str, Optional[int]] = {}
    previous: Optional[int] = 0
    for name, at in zip(names, latches):
        stage_steps[name] = at - previous if at is not None and previous is not None else None
        previous = at
    return {"path_length_m": float(moves.sum()), "idle_steps": int(np.count_nonzero(moves < IDLE_M)),
            "jerk": jerk, "steps_to_success": log.steps if success else None,
            "latch_steps": dict(zip(names, latches)), "stage_steps": stage_steps}


def mean_interval(values: Sequence[float], level: float = 0.95) -> Dict[str, Any]:
    """Mean with a Student-t interval (None below two values)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "interval": None}
    mean = float(x.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "interval": None}
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"n": n, "mean": mean, "interval": [mean - half, mean + half]}


def paired_differences(pairs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per condition, per metric and per stage: perturbed minus clean over the pairs where both have a value.

    Args:
        pairs: ``{"condition", "clean": metrics, "perturbed": metrics}`` per rollout pair.
    """
    out: Dict[str, Any] = {}
    for cond in sorted({p["condition"] for p in pairs}):
        mine = [p for p in pairs if p["condition"] == cond]
        metrics = {m: mean_interval([p["perturbed"][m] - p["clean"][m] for p in mine
                                     if p["perturbed"][m] is not None and p["clean"][m] is not None])
                   for m in METRICS}
        stages = sorted({s for p in mine for s in p["clean"]["stage_steps"]},
                        key=lambda s: list(mine[0]["clean"]["stage_steps"]).index(s))
        by_stage = {s: mean_interval([p["perturbed"]["stage_steps"][s] - p["clean"]["stage_steps"][s] for p in mine
                                      if p["perturbed"]["stage_steps"].get(s) is not None
                                      and p["clean"]["stage_steps"].get(s) is not None])
                    for s in stages}
        out[cond] = {"pairs": len(mine), "metrics": metrics, "stage_steps": by_stage}
    return out


__all__ = ["IDLE_M", "METRICS", "latch_steps", "mean_interval", "paired_differences", "rollout_metrics"]
