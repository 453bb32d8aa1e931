"""Write another harness's results as a run directory of this one (``robocasa-shift import-results``).

The run directory is built beside its destination and moved into place in one rename, so a
refused or interrupted import leaves nothing half-written. Its manifest's ``imported`` block says
where the results came from (format, reader version, the source file's SHA-256), what the source
could not tell, and whether the same key in two imported runs is provably the same rollout.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import pandas as pd

from robocasa_shift.analysis.imported import summarize
from robocasa_shift.core.records import Record
from robocasa_shift.errors import BadInput, RunDirError
from robocasa_shift.importing.sources import FORMATS, READERS, UNKNOWN, Source, instruction_leaks
from robocasa_shift.rundir.files import atomic_write_json
from robocasa_shift.rundir.store import RunStore

NOTE = "Imported results: the harness did not run these rollouts"


def _suite_hash(source: Source) -> str:
    """One hash per suite: two imports of one suite compare, two suites never do."""
    text = json.dumps({"format": source.format, **source.suite}, sort_keys=True)
    return "imported-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _record(source: Source, ep, spec_hash: str, policy: str, file_sha: str) -> Record:
    steps = ep.steps or 0
    return Record(
        phase="formal", task=ep.task, episode=ep.episode, condition=ep.condition, replicate=0,
        backend=f"imported:{source.format}", policy=policy, spec_hash=spec_hash, stage_spec_hash=spec_hash,
        study_seed=source.seed or 0, env_seed=-1 if source.seed is None else source.seed, policy_seed=-1,
        horizon=steps, n_stages=1, stage_names=["success"], success=ep.success, steps=steps,
        stages_completed=int(ep.success), first_incomplete=None if ep.success else 1,
        stage_steps=[steps if ep.success else None],
        source={"format": source.format, "sha256": file_sha, "name": ep.variant, "line": ep.line,
                "twin_episode": ep.twin_episode, "unpaired": ep.unpaired_reason, "instruction": ep.instruction,
                "details": ep.details, "unknown": list(UNKNOWN)},
    )


def frame_of(records) -> pd.DataFrame:
    """The imported records as the table :func:`robocasa_shift.analysis.imported.summarize` reads."""
    rows = [{"task": r["task"], "condition": r["condition"], "episode": r["episode"], "success": bool(r["success"]),
             "twin_episode": (r.get("source") or {}).get("twin_episode"),
             "unpaired_reason": (r.get("source") or {}).get("unpaired")} for r in records]
    frame = pd.DataFrame(rows, columns=["task", "condition", "episode", "success", "twin_episode", "unpaired_reason"])
    frame["twin_episode"] = pd.to_numeric(frame["twin_episode"], errors="coerce")
    return frame


def import_results(fmt: str, path: Path, run_dir: Path, classification: Optional[Path] = None,
                   policy: Optional[str] = None) -> Dict[str, Any]:
    """Read ``path`` in format ``fmt`` and write ``run_dir`` (which must not exist or be empty)."""
    if fmt not in READERS:
        raise BadInput(f"unknown format {fmt!r}; known: {', '.join(sorted(READERS))}")
    if fmt == "liberoplus" and classification is None:
        raise BadInput("liberoplus needs --classification (LIBERO-Plus's task_classification.json)")
    if fmt != "liberoplus" and classification is not None:
        raise BadInput(f"--classification is for liberoplus only, not {fmt}")
    run_dir = Path(run_dir)
    if os.path.lexists(run_dir) and (not run_dir.is_dir() or run_dir.is_symlink() or any(run_dir.iterdir())):
        raise RunDirError(f"{run_dir} exists and is not an empty folder; import into a new --run-dir")
    source = READERS[fmt](Path(path), classification) if fmt == "liberoplus" else READERS[fmt](Path(path))
    from robocasa_shift.rundir.files import read_bytes
    from robocasa_shift.importing.sources import MAX_SOURCE_BYTES

    file_sha = hashlib.sha256(read_bytes(path, max_bytes=MAX_SOURCE_BYTES)).hexdigest()
    spec_hash = _suite_hash(source)
    policy = policy or source.policy or "unknown"
    for ep in source.episodes:  # a task names a folder of the run directory
        if len(ep.task) > 200 or "/" in ep.task or "\x00" in ep.task or ep.task.strip() in ("", ".", ".."):
            raise BadInput(f"{path}:{ep.line}: task name {ep.task[:60]!r}... cannot name a task here "
                           f"(at most 200 characters, no '/')")
    keys = [(e.task, e.condition, e.episode) for e in source.episodes]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise BadInput(f"{path}: two rollouts of task {dup[0]!r}, condition {dup[1]!r}, episode {dup[2]}")
    leaks = instruction_leaks(source.episodes)
    imported = {
        "format": fmt, "reader": FORMATS[fmt], "source_file": Path(path).name, "source_sha256": file_sha,
        "classification_sha256": source.suite.get("classification_sha256"),
        "episodes": len(source.episodes), "unknown": list(UNKNOWN), "note": NOTE,
        "cross_run_pairing": source.cross_run_pairing or "provable: the same key is the same rollout setting",
        "cross_run_pairable": source.cross_run_pairing is None,
        "instruction_leaks": len(leaks),
    }
    manifest = {"backend": f"imported:{fmt}", "policy": {"name": policy}, "spec_hash": spec_hash,
                "study_seed": source.seed or 0, "imported": imported}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    # a folder this call creates (never one that was there): the only thing it ever removes
    staging = Path(tempfile.mkdtemp(prefix=f".{run_dir.name}.importing-", dir=run_dir.parent))
    try:
        store = RunStore(staging)
        store.ensure_manifest(manifest)
        records = []
        for ep in source.episodes:
            record = _record(source, ep, spec_hash, policy, file_sha)
            store.write(record)
            records.append(record.to_json())
        summary = summarize(frame_of(records))
        summary.update({"imported": imported, "instruction_leaks": leaks[:200]})
        atomic_write_json(staging / "analysis" / "imported.json", summary, staging)
        if os.path.lexists(run_dir):
            run_dir.rmdir()  # empty, checked above
        os.rename(staging, run_dir)
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging)
    return summary
