"""Behaviour beyond success, from step logs: how a rollout moved, paired with its clean twin, and by stage.

Per rollout (:func:`rollout_metrics`, from its step log and record): the control step at which each subgoal
latched, the end effector's path length and idle steps, the arm commands' jerk, the steps to success and, from a
log with contacts, the steps in contact with the scene or with an object not to be hit and the drops (the held
object let go with nothing but the robot under it). Per condition (:func:`paired_differences`): the mean of
perturbed minus clean over the pairs where both rollouts have the metric, with a 95% Student-t interval over pairs.
Per stage the same: the steps spent in it (from the previous subgoal's latch to its own) and its contact steps and
drops (the first unreached stage's window runs to the rollout's end), so a shift that slows the approach but not
the lift shows as a difference in one stage only.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift.core.conditions import CLEAN
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.steplog import CONTACT_COLUMNS, StepLog, StepLogError

IDLE_M = 0.001  # an end-effector move below this (metres per control step) counts as idle
DROP_M = 0.02  # an object let go in the air that falls this far before landing is dropped
METRICS = ("path_length_m", "idle_steps", "jerk", "steps_to_success", "scene_contact_steps", "object_collision_steps",
           "drops")
STAGE_METRICS = ("stage_steps", "stage_contact_steps", "stage_drops")


def latch_steps(latched: np.ndarray, n_subgoals: int) -> List[Optional[int]]:
    """The control step (1-based: steps taken) after which each subgoal had latched, None when it never did."""
    counts = np.asarray(latched, dtype=np.int64)
    out: List[Optional[int]] = []
    for j in range(n_subgoals):
        hit = np.flatnonzero(counts >= j + 1)
        out.append(int(hit[0]) + 1 if hit.size else None)
    return out


def contact_events(contacts: np.ndarray) -> Dict[str, np.ndarray]:
    """Per step, from a log's ``contacts`` (``CONTACT_COLUMNS``): ``scene`` and ``object``, the robot touching the
    scene or an object it should not hit, ``contact`` either; ``drop``, the held object let go with nothing but the
    robot under it that then falls at least :data:`DROP_M` before anything else holds it (or the log ends), so a
    placement released just above its support is no drop."""
    c = np.asarray(contacts, dtype=np.int64).reshape(-1, len(CONTACT_COLUMNS))
    holding, supported, height = c[:, 2] > 0, c[:, 3] > 0, c[:, 4]
    before = np.concatenate([[False], holding[:-1]])
    drop = np.zeros(len(c), dtype=bool)
    for t in np.flatnonzero(before & ~holding & ~supported):
        caught = np.flatnonzero(supported[t:] | holding[t:])
        landed = t + int(caught[0]) if caught.size else len(c) - 1
        drop[t] = height[t] - height[t:landed + 1].min() >= DROP_M * 1000
    scene, other = c[:, 0] > 0, c[:, 1] > 0
    return {"scene": scene, "object": other, "contact": scene | other, "drop": drop}


def rollout_metrics(log: StepLog, success: Optional[bool]) -> Dict[str, Any]:
    """The behaviour metrics of one rollout (layout in the module docstring); the contact metrics are None for a log
    without contacts."""
    moves = np.linalg.norm(np.diff(log.eef_pos, axis=0), axis=1) if len(log.eef_pos) > 1 else np.zeros(0)
    arm = log.arm
    jerk = float(np.mean(np.sum(np.diff(arm, n=3, axis=0) ** 2, axis=1))) if len(arm) > 3 else None
    names = list(log.meta.get("stage_names") or [])
    latches = latch_steps(log.latched, len(names))
    events = contact_events(log.contacts) if log.contacts is not None else None
    stage_steps: Dict[str, Optional[int]] = {}
    stage_contacts: Dict[str, Optional[int]] = {}
    stage_drops: Dict[str, Optional[int]] = {}
    previous: Optional[int] = 0
    for name, at in zip(names, latches):
        stage_steps[name] = at - previous if at is not None and previous is not None else None
        # the stage's steps: after the previous latch up to its own (the first unreached one: to the rollout's end)
        window = slice(previous, at if at is not None else log.steps) if previous is not None else None
        stage_contacts[name] = int(events["contact"][window].sum()) if events and window else None
        stage_drops[name] = int(events["drop"][window].sum()) if events and window else None
        previous = at
    return {"path_length_m": float(moves.sum()), "idle_steps": int(np.count_nonzero(moves < IDLE_M)),
            "jerk": jerk, "steps_to_success": log.steps if success else None,
            "scene_contact_steps": int(events["scene"].sum()) if events else None,
            "object_collision_steps": int(events["object"].sum()) if events else None,
            "drops": int(events["drop"].sum()) if events else None,
            "latch_steps": dict(zip(names, latches)), "stage_steps": stage_steps,
            "stage_contact_steps": stage_contacts, "stage_drops": stage_drops}


def mean_interval(values: Sequence[float], level: float = 0.95) -> Dict[str, Any]:
    """Mean with a Student-t interval (None below two values)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return {"n": 0, "mean": None, "interval": None}
    mean = float(x.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "interval": None}
    from scipy import stats  # here, not at the top: the audit imports this module and rarely needs it

    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return {"n": n, "mean": mean, "interval": [mean - half, mean + half]}


def paired_differences(pairs: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Per condition, per metric and per stage: perturbed minus clean over the pairs where both have a value.

    Args:
        pairs: ``{"condition", "clean": metrics, "perturbed": metrics}`` per rollout pair.
    """
    def diffs(mine, get) -> Dict[str, Any]:
        values = [(get(p["perturbed"]), get(p["clean"])) for p in mine]
        return mean_interval([a - b for a, b in values if a is not None and b is not None])

    out: Dict[str, Any] = {}
    for cond in sorted({p["condition"] for p in pairs}):
        mine = [p for p in pairs if p["condition"] == cond]
        order = list(mine[0]["clean"]["stage_steps"])
        stages = sorted({s for p in mine for s in p["clean"]["stage_steps"]}, key=order.index)
        out[cond] = {"pairs": len(mine), "metrics": {m: diffs(mine, lambda x, m=m: x.get(m)) for m in METRICS}}
        for per_stage in STAGE_METRICS:
            out[cond][per_stage] = {s: diffs(mine, lambda x, s=s, k=per_stage: (x.get(k) or {}).get(s)) for s in stages}
    return out


def run_behaviour(store, records: Iterable[Mapping[str, Any]], task: str, phase: str = "formal") -> Dict[str, Any]:
    """:func:`paired_differences` of ``task``'s ``phase`` rollouts in a run directory, from their step logs: every valid
    record with a readable log (``store``: its :class:`~robocasa_shift.rundir.store.RunStore`; a log that is not
    sound fails the audit and is left out here), each perturbed one paired with its clean twin."""
    metrics: Dict[RolloutKey, Dict[str, Any]] = {}
    for rec in records:
        key = RolloutKey.from_record(rec)
        if key.phase != phase or key.task != task or not rec.get("valid"):
            continue
        try:
            log = store.step_log(rec)
        except StepLogError:
            continue
        if log is not None:
            metrics[key] = rollout_metrics(log, rec.get("success"))
    pairs = []
    for key, m in sorted(metrics.items()):
        clean = metrics.get(RolloutKey(key.phase, key.task, key.episode, CLEAN, key.replicate))
        if key.condition != CLEAN and clean is not None:
            pairs.append({"condition": key.condition, "clean": clean, "perturbed": m})
    return paired_differences(pairs)


def formal_behaviour(store, records: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """Task -> :func:`run_behaviour` of its formal rollouts, for the tasks with at least one logged pair."""
    tasks = sorted({str(rec.get("task")) for rec in records if rec.get("phase") == "formal"})
    out = {task: run_behaviour(store, records, task) for task in tasks}
    return {task: b for task, b in out.items() if b}


def differences(expected: Any, found: Any, where: str = "behaviour", limit: int = 5) -> List[str]:
    """Where ``found`` differs from ``expected`` (JSON values; numbers within 1e-9 relative), at most ``limit``."""
    out: List[str] = []

    def walk(a: Any, b: Any, path: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                if k not in a or k not in b:
                    out.append(f"{path}.{k}: {'missing' if k not in b else 'not in the step logs'}")
                else:
                    walk(a[k], b[k], f"{path}.{k}")
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                walk(x, y, f"{path}[{i}]")
        elif isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{path}: {b!r}, the step logs give {a!r}")
        elif a != b:
            out.append(f"{path}: {str(b)[:60]}, the step logs give {str(a)[:60]}")

    walk(expected, found, where)
    return out


__all__ = ["DROP_M", "IDLE_M", "METRICS", "STAGE_METRICS", "contact_events", "differences", "formal_behaviour", "latch_steps", "mean_interval", "paired_differences", "rollout_metrics",
           "run_behaviour"]
