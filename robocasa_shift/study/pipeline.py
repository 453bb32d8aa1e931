"""The formal matrix around single runs: the suite screening chose, dry-run estimates, merging shards."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.steplog import MAX_LOG_BYTES, log_path
from robocasa_shift.errors import RunDirError
from robocasa_shift.rundir.files import MAX_RECORD_BYTES, atomic_write_bytes, atomic_write_json, read_bytes
from robocasa_shift.rundir.store import IDENTITY_FIELDS, RunStore, parse_record
from robocasa_shift.study.plan import pending_keys


def formal_suite(run_dir: Path | str) -> Optional[List[str]]:
    """The tasks screening retained in ``run_dir`` (``suite.json``), or None before screening."""
    path = Path(run_dir) / "suite.json"
    return json.loads(path.read_text())["tasks"] if path.exists() else None


def estimate(run_dir: Path | str, keys: Sequence[RolloutKey], workers: int) -> Dict[str, Any]:
    """Rollouts left and an ETA from the per-rollout wall times already measured in ``run_dir``."""
    store = RunStore(run_dir)
    todo = pending_keys(store, keys)
    walls: Dict[str, List[float]] = {}
    for rec in store.records():
        walls.setdefault(rec["task"], []).append(float(rec.get("wall_s") or 0.0))
    per_task = {t: sum(v) / len(v) for t, v in walls.items() if v}
    fallback = sum(per_task.values()) / len(per_task) if per_task else None
    seconds = None
    if fallback is not None:
        seconds = sum(per_task.get(k.task, fallback) for k in todo) / max(1, workers)
    return {"planned": len(keys), "pending": len(todo), "eta_s": seconds, "measured_s_per_rollout": per_task}


def merge(out: Path | str, sources: Sequence[Path | str]) -> Dict[str, Any]:
    """Combine shard run directories into ``out``; refuse mismatched manifests and duplicate keys.

    Each record is placed by the key inside it, never by its file name (a misnamed record would
    otherwise overwrite another), and written atomically. A file that is not a record is skipped
    and returned in ``unreadable``: the merged plan still expects its key, so the audit reports it
    missing until it is run again.

    Returns:
        ``records`` (current records merged), ``sources``, ``unreadable`` (``(file, problem)`` pairs).

    Raises:
        RunDirError: a source without a manifest, manifests that differ, a key recorded twice, or an
            ``out`` that already holds records.
    """
    out = Path(out)
    stores = [RunStore(s) for s in sources]
    manifests = [s.manifest() for s in stores]
    for src, m in zip(sources, manifests):
        if m is None:
            raise RunDirError(f"{src} has no manifest.json: not a run directory")
    first = manifests[0]
    for src, m in zip(sources[1:], manifests[1:]):
        for name in IDENTITY_FIELDS:
            a, b = first.get(name), m.get(name)
            if isinstance(a, dict) and isinstance(b, dict) and name == "stage_spec_hashes":
                clash = [t for t in set(a) & set(b) if a[t] != b[t]]
                if clash:
                    raise RunDirError(f"{src}: stage spec hashes of {clash} differ from {sources[0]}")
            elif a != b:
                raise RunDirError(f"{src}: manifest field {name} differs from {sources[0]}:\n  {json.dumps(a)}\n  {json.dumps(b)}")
    target = RunStore(out)
    seen: Dict[RolloutKey, str] = {}
    copies: Dict[Path, bytes] = {}
    unreadable: List[Tuple[str, str]] = []
    for src, store in zip(sources, stores):
        for base in ("records", "history"):
            for path in store.record_files(base):
                name = str(Path(src) / path.relative_to(store.root))
                try:  # a regular file reached without a link below the shard, never blocking
                    raw = read_bytes(path, store.root, MAX_RECORD_BYTES, "record")
                except OSError as exc:
                    unreadable.append((name, f"cannot be read ({exc.strerror})"))
                    continue
                rec, problem = parse_record(raw)
                if rec is None:
                    unreadable.append((name, problem))
                    continue
                key = RolloutKey.from_record(rec)
                if base == "records":
                    if key in seen:
                        raise RunDirError(f"duplicate key {key.id} in {seen[key]} and {name}")
                    seen[key] = name
                    dest = target.record_path(key)
                else:
                    dest = _history_path(target, key, path.name, copies)
                copies[dest] = raw
                if rec.get("step_log") and os.path.lexists(log_path(path)):  # the audit checks its hash
                    try:
                        copies[log_path(dest)] = read_bytes(log_path(path), store.root, MAX_LOG_BYTES, "step log")
                    except OSError as exc:
                        raise RunDirError(f"{log_path(path)}: step log cannot be read ({exc.strerror})") from None
    with target:
        if any(True for _ in target.record_files()):
            raise RunDirError(f"{out} already holds records; merge into a new directory")
        merged = dict(first)
        merged["stage_spec_hashes"] = {k: v for m in manifests for k, v in (m.get("stage_spec_hashes") or {}).items()}
        merged["merged_from"] = [str(s) for s in sources]
        atomic_write_json(target.manifest_path, target.redacted(merged), target.root)
        target.log_command({"merged_from": [str(s) for s in sources]})
        for dest, raw in copies.items():
            atomic_write_bytes(dest, raw, target.root)  # the bytes read and checked above, never a second, later read
        for store in stores:
            target.add_to_plan(store.planned_keys())
    return {"records": len(seen), "sources": len(sources), "unreadable": unreadable}


def _history_path(target: RunStore, key: RolloutKey, name: str, taken: Dict[Path, bytes]) -> Path:
    """Where a superseded record of ``key`` goes in ``target``: by its key, keeping its time stamp, never over another."""
    parts = name.split(".")
    stamp = parts[1] if len(parts) == 3 else "merged"
    dest = target.record_path(key, base="history").with_suffix(f".{stamp}.json")
    n = 1
    while dest in taken:
        dest = target.record_path(key, base="history").with_suffix(f".{stamp}-{n}.json")
        n += 1
    return dest
