"""``diff-runs A B``: do two runs of the same keys hold the same records, field for field?

A record's outcome, subgoal steps, fingerprints, seeds, perturbation read-backs and measurements
are functions of the key, the code and the installed simulator: a rerun on the same machine (or a
faster harness) must reproduce them exactly. Only what a clock or the machine decides is left out
(``VOLATILE``). Either side may be a run directory or a digest file written by ``--save`` (JSON:
key -> the record without its volatile fields), so a reference run can be kept beside the code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

from robocasa_shift.core.records import RolloutKey
from robocasa_shift.rundir.store import RunStore

# wall-clock timings, the renderer's name and the summaries of the step and frame logs: not results
VOLATILE = ("timing", "wall_s", "renderer", "step_log", "frame_log")


def key_text(rec: Dict[str, Any]) -> str:
    return RolloutKey(rec["phase"], rec["task"], int(rec["episode"]), rec["condition"], int(rec.get("replicate", 0))).id


def run_digest(source: Path | str) -> Dict[str, Dict[str, Any]]:
    """Key -> record without its volatile fields, from a run directory or a saved digest."""
    source = Path(source)
    if source.is_file():
        return json.loads(source.read_text())
    return {key_text(rec): {k: v for k, v in sorted(rec.items()) if k not in VOLATILE} for rec in RunStore(source).records()}


def diff_runs(a: Path | str, b: Path | str, ignore: Sequence[str] = ()) -> Dict[str, Any]:
    """Keys only one side has, and per shared key the fields that differ (with both values).

    ``ignore`` names fields left out on purpose, e.g. ``spec_hash`` when a reference run predates a
    protocol file that its conditions do not use (the perturbations' own parameters are still compared).
    """
    da, db = run_digest(a), run_digest(b)
    differing: Dict[str, List[Dict[str, Any]]] = {}
    for key in sorted(set(da) & set(db)):
        fields = sorted((set(da[key]) | set(db[key])) - set(ignore))
        diffs = [{"field": f, "a": da[key].get(f), "b": db[key].get(f)} for f in fields if da[key].get(f) != db[key].get(f)]
        if diffs:
            differing[key] = diffs
    only_a, only_b = sorted(set(da) - set(db)), sorted(set(db) - set(da))
    return {"a": str(a), "b": str(b), "ignored": sorted(ignore), "shared": len(set(da) & set(db)), "identical": len(set(da) & set(db)) - len(differing),
            "differing": differing, "only_a": only_a, "only_b": only_b,
            "passed": not differing and not only_a and not only_b}


__all__ = ["VOLATILE", "diff_runs", "run_digest"]
