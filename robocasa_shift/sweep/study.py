"""Run a sweep: the derived protocol, the search per base episode, the held-out confirmation, ``summary.json``.

Every rollout goes through the normal engine (:class:`~robocasa_shift.study.worker.StudyCache` under the derived
protocol): pairing fingerprints, step logs and records as in a formal run, written into the run directory under
their keys (``formal`` episodes for the curve, ``confirmation`` episodes for the check), so a sweep resumes where
it stopped and the audit reads it as any run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from robocasa_shift.analysis.behaviour import run_behaviour
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.conditions import CLEAN
from robocasa_shift.core.records import RolloutKey, unlatched_success
from robocasa_shift.errors import BadInput
from robocasa_shift.rundir.files import atomic_write_json
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.runner import study_manifest
from robocasa_shift.study.worker import StudyCache
from robocasa_shift.sweep import curve as curves
from robocasa_shift.sweep.search import EpisodeBreak, cost, find_break
from robocasa_shift.sweep.spec import write_derived_spec

SUMMARY = "sweep/summary.json"
DECLARED = "sweep/confirmation.json"


class InvalidRollout(Exception):
    """A rollout of the sweep whose record is invalid: its episode has no breaking point."""


def run_sweep(run_dir: Path | str, task: str, factor: str, episodes: Sequence[int], severities: Sequence[float],
              study: StudyConfig = StudyConfig(), mode: str = "bisect", confirm_episodes: Sequence[int] = (),
              confirm_severities: Sequence[float] = ()) -> Dict[str, Any]:
    """Sweep ``factor`` on ``task``: per formal base episode the breaking point on the ``severities`` grid, the
    survival curve, and (given ``confirm_episodes``) the check on held-out ``confirmation`` episodes at
    ``confirm_severities`` (points of the grid; declared in ``sweep/confirmation.json`` before any of them runs).

    Returns:
        The summary also written to ``sweep/summary.json``.

    Raises:
        BadInput: a severity off the range or a confirmation severity off the grid.
        UnknownNameError: an unknown task, factor or policy.
    """
    frozen = specs.load_protocol(verify=True)
    frozen.factor(factor)
    derived = write_derived_spec(run_dir, frozen, factor, severities)
    grid = [float(s) for s in sorted(severities)]
    declared = sorted(float(s) for s in confirm_severities)
    off_grid = [s for s in declared if s not in grid]
    if off_grid:
        raise BadInput(f"confirmation severities {off_grid} are not on the sweep's grid {grid}")
    if confirm_episodes and not declared:
        raise BadInput("held-out episodes need the severities they confirm (--confirm-severities)")
    cache = StudyCache(study, protocol=derived)
    store = RunStore(run_dir)
    conditions = [CLEAN] + [f"{factor}:L{i + 1}" for i in range(len(grid))]
    cache.check_names([task], conditions)
    try:
        with store:
            origin = json.loads((Path(run_dir) / "sweep/spec/derived.json").read_text())
            store.ensure_manifest({**study_manifest(cache, [task]), "sweep": origin})
            recorded = {RolloutKey.from_record(r): r for r in store.records()}

            def outcome(phase: str, episode: int, level: int) -> bool:
                key = RolloutKey(phase, task, episode, CLEAN if level < 0 else conditions[level + 1])
                rec = recorded.get(key)
                if rec is None:
                    record, log, frames = cache.run_keys_logged([key])[0]
                    store.add_to_plan([key])
                    store.write(record, log, frames)
                    rec = recorded[key] = record.to_json()
                if rec.get("valid") is not True:
                    raise InvalidRollout(f"{key.id}: {rec.get('error')}")
                return bool(rec.get("success"))

            breaks: List[EpisodeBreak] = []
            invalid: List[Dict[str, Any]] = []
            for ep in episodes:
                try:
                    breaks.append(find_break(ep, len(grid), lambda i: outcome("formal", ep, i), mode))
                except InvalidRollout as exc:
                    invalid.append({"episode": ep, "error": str(exc)})
            stages = {b.episode: _broke_at(recorded, task, b, conditions) for b in breaks}
            curve = curves.survival_curve(breaks, grid)
            summary: Dict[str, Any] = {
                "task": task, "factor": factor, "mode": mode, "severities": grid,
                "parameters": {f"L{i + 1}": derived.factor(factor).level(f"L{i + 1}") for i in range(len(grid))},
                "frozen_spec_hash": frozen.spec_hash, "derived_spec_hash": derived.spec_hash,
                "episodes": [{**b.to_json(), "critical_severity": grid[b.critical] if b.critical is not None else None,
                              "broke_at_stage": stages[b.episode]} for b in breaks],
                "invalid": invalid, "curve": curve, "cost": cost(breaks, len(grid)),
            }
            if study.log_steps:
                summary["behaviour"] = run_behaviour(store, list(recorded.values()), task)
            if confirm_episodes:
                summary["confirmation"] = _confirm(run_dir, curve, grid, declared, confirm_episodes, outcome)
            summary["unlatched_successes"] = unlatched_successes(recorded, conditions, grid)
            atomic_write_json(Path(run_dir) / SUMMARY, summary, store.root)
    finally:
        cache.close()
    return summary


def unlatched_successes(recorded: Dict[RolloutKey, Dict[str, Any]], conditions: Sequence[str],
                        grid: Sequence[float]) -> List[Dict[str, Any]]:
    """The sweep's successes whose subgoals did not all latch (see :func:`~robocasa_shift.core.records.unlatched_success`),
    each with its severity and first unlatched subgoal: counted as successes, never as a stage they stopped at."""
    out = []
    for key in sorted(recorded):
        first = unlatched_success(recorded[key])
        if first is not None:
            level = conditions.index(key.condition)
            out.append({"phase": key.phase, "episode": key.episode, "condition": key.condition,
                        "severity": grid[level - 1] if level else 0.0, "first_unlatched": first})
    return out


def _broke_at(recorded: Dict[RolloutKey, Dict[str, Any]], task: str, b: EpisodeBreak,
              conditions: Sequence[str]) -> Optional[str]:
    """The stage the episode's rollout at its breaking point did not reach (None unless it broke)."""
    if b.critical is None:
        return None
    rec = recorded[RolloutKey("formal", task, b.episode, conditions[b.critical + 1])]
    names, done = rec.get("stage_names") or [], int(rec.get("stages_completed") or 0)
    return names[done] if done < len(names) else None


def _confirm(run_dir: Path | str, curve: Dict[str, Any], grid: Sequence[float], declared: Sequence[float],
             episodes: Sequence[int], outcome) -> Dict[str, Any]:
    """Declare the confirmation (severities, episodes) before it runs, then run and judge it; a declaration already
    in the run directory must be this one."""
    path = Path(run_dir) / DECLARED
    declaration = {"severities": list(declared), "episodes": list(episodes), "phase": "confirmation"}
    if path.exists():
        if json.loads(path.read_text()) != declaration:
            raise BadInput(f"{path} declares {path.read_text().strip()}; a confirmation is declared once, before it "
                           f"runs: use a new --run-dir")
    else:
        atomic_write_json(path, declaration, Path(run_dir))
    held: Dict[float, List[bool]] = {s: [] for s in declared}
    failed_clean = invalid = 0
    for ep in episodes:
        try:
            if not outcome("confirmation", ep, -1):
                failed_clean += 1
                continue
            results = {s: outcome("confirmation", ep, grid.index(s)) for s in declared}
        except InvalidRollout:
            invalid += 1
            continue
        for s, ok in results.items():
            held[s].append(ok)
    return {**curves.confirm(curve, held), "declared": declaration, "failed_clean": failed_clean,
            "invalid": invalid}


def resolution_grid(resolution: float, maximum: float) -> List[float]:
    """The grid bisection searches to ``resolution``: multiples of it up to ``maximum`` (the maximum included)."""
    if not (math.isfinite(resolution) and resolution > 0):
        raise BadInput(f"--resolution must be a positive number, got {resolution}")
    points = int(math.ceil(maximum / resolution - 1e-9))
    return [round(min(maximum, resolution * (i + 1)), 6) for i in range(points)]


__all__ = ["DECLARED", "SUMMARY", "resolution_grid", "run_sweep"]
