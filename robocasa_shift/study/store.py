"""The run directory: a manifest, one JSON file per rollout, written atomically.

Layout::

    D/manifest.json             spec hashes, study seed, versions, renderer, seed rule, first command
    D/commands.jsonl            every command run on D, appended
    D/plan.json                 every key planned on D: the rollouts the audit expects
    D/records/<phase>/<task>/<episode>__<condition>__r<replicate>.json
    D/history/...               records superseded by --retry-errors
    D/.lock                     held with flock while a process writes to D

Each record is written to a temporary file and renamed over its final name,
so a killed process leaves either the whole record or none of it; a rerun
skips the keys already recorded. The lock is held by the kernel (``flock``),
so it dies with the process that held it.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.errors import RunDirError, RunDirLocked

MANIFEST = "manifest.json"
PLAN = "plan.json"
# Manifest fields that must agree between every command writing to one run directory.
IDENTITY_FIELDS = ("spec_hash", "study_seed", "backend", "policy", "versions", "stage_spec_hashes", "env_config")


def _agree(a: Any, b: Any) -> bool:
    """Equal, or for mappings equal on every key both have (a run grows task by task)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_agree(a[k], b[k]) for k in set(a) & set(b))
    return a == b


def _condition_slug(condition: str) -> str:
    return condition.replace(":", "-")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file and rename it over ``path``: readers see all of it or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write_json(path: Path, data: Any) -> None:
    """``atomic_write_text`` of ``data`` as indented JSON with sorted keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, allow_nan=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._lock_fd: Optional[int] = None

    # ------------------------------------------------------------------ lock

    def lock(self) -> "RunStore":
        """Take the run directory's lock or refuse if another process holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip()
            os.close(fd)
            raise RunDirLocked(
                f"run directory {self.root} is in use by another process ({holder or 'unknown'}); "
                f"wait for it to finish or use another --run-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} since {_dt.datetime.now().isoformat(timespec='seconds')}".encode())
        self._lock_fd = fd
        return self

    def unlock(self) -> None:
        """Release the lock (the kernel releases it too when the process dies)."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> "RunStore":
        return self.lock()

    def __exit__(self, *exc) -> None:
        self.unlock()

    # ------------------------------------------------------------------ manifest

    @property
    def manifest_path(self) -> Path:
        """``D/manifest.json``."""
        return self.root / MANIFEST

    def manifest(self) -> Optional[Dict[str, Any]]:
        """The run's manifest, or None before the first command wrote one."""
        if not self.manifest_path.exists():
            return None
        with open(self.manifest_path) as f:
            return json.load(f)

    def ensure_manifest(self, manifest: Dict[str, Any]) -> Dict[str, Any]:
        """Write the manifest of a new run, or check that this command matches the existing one."""
        existing = self.manifest()
        if existing is None:
            manifest = {**manifest, "created": _dt.datetime.now().isoformat(timespec="seconds")}
            atomic_write_json(self.manifest_path, manifest)
            existing = manifest
        else:
            for name in IDENTITY_FIELDS:
                if name in manifest and not _agree(existing.get(name), manifest[name]):
                    raise RunDirError(
                        f"run directory {self.root} was made with a different {name}:\n"
                        f"  in the run:       {json.dumps(existing.get(name), sort_keys=True)}\n"
                        f"  in this command:  {json.dumps(manifest[name], sort_keys=True)}\n"
                        f"use a new --run-dir for a different study"
                    )
            # Facts learned later (e.g. a stage spec of another task) are added, never changed.
            merged = dict(existing)
            for name, value in manifest.items():
                if isinstance(value, dict) and isinstance(existing.get(name), dict):
                    merged[name] = {**value, **existing[name]}
                else:
                    merged.setdefault(name, value)
            if merged != existing:
                atomic_write_json(self.manifest_path, merged)
                existing = merged
        return existing

    def note_execution(self, execution: Dict[str, Any]) -> None:
        """Add an execution setting (executor, workers, threads per worker, batch) to the manifest's list.

        Thread counts change only speed; the batch size can change the records of a policy whose
        outputs depend on the batch's composition, so both are kept with the run.
        """
        manifest = self.manifest() or {}
        seen = manifest.get("executions", [])
        if execution not in seen:
            atomic_write_json(self.manifest_path, {**manifest, "executions": seen + [execution]})

    def log_command(self, extra: Optional[Dict[str, Any]] = None) -> None:
        """Append this command (time, argv, pid and ``extra``) to ``D/commands.jsonl``."""
        self.root.mkdir(parents=True, exist_ok=True)
        entry = {
            "time": _dt.datetime.now().isoformat(timespec="seconds"),
            "argv": " ".join(shlex.quote(a) for a in sys.argv),
            "pid": os.getpid(),
            **(extra or {}),
        }
        with open(self.root / "commands.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")

    # ------------------------------------------------------------------ plan

    @property
    def plan_path(self) -> Path:
        """``D/plan.json``: every key any command on this run directory planned."""
        return self.root / PLAN

    def planned_keys(self) -> List[RolloutKey]:
        """Every key a command on this run directory planned: the rollouts the audit expects."""
        if not self.plan_path.exists():
            return []
        with open(self.plan_path) as f:
            return [RolloutKey.from_id(k) for k in json.load(f)["keys"]]

    def add_to_plan(self, keys: Iterable[RolloutKey]) -> None:
        """Add ``keys`` to the plan (a sorted set, rewritten atomically); planning a key twice changes nothing."""
        merged = sorted(set(self.planned_keys()) | set(keys))
        atomic_write_json(self.plan_path, {"keys": [k.id for k in merged]})

    # ------------------------------------------------------------------ records

    def record_path(self, key: RolloutKey, base: str = "records") -> Path:
        """Where the record of ``key`` lives (under ``records/`` or ``history/``)."""
        name = f"{key.episode:04d}__{_condition_slug(key.condition)}__r{key.replicate}.json"
        return self.root / base / key.phase / key.task / name

    def write(self, record: Record) -> Path:
        """Write ``record`` atomically at its key's path; return the path."""
        path = self.record_path(record.key)
        atomic_write_json(path, record.to_json())
        return path

    def supersede(self, key: RolloutKey) -> None:
        """Move the current record of ``key`` into the history (before re-running it)."""
        path = self.record_path(key)
        if not path.exists():
            return
        stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S%f")
        dest = self.record_path(key, base="history").with_suffix(f".{stamp}.json")
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)

    def record_files(self, base: str = "records") -> Iterator[Path]:
        """Every record file, sorted (temporary files of a write in progress excluded)."""
        root = self.root / base
        if root.exists():
            yield from sorted(p for p in root.rglob("*.json") if not p.name.startswith("."))

    def record_entries(self, base: str = "records") -> List[Tuple[str, Dict[str, Any]]]:
        """Every record of the run with the file it came from (relative to the run directory)."""
        out = []
        for path in self.record_files(base):
            with open(path) as f:
                out.append((str(path.relative_to(self.root)), json.load(f)))
        return out

    def records(self, base: str = "records") -> List[Dict[str, Any]]:
        """Every record of the run, as written (one dict per record file)."""
        return [rec for _, rec in self.record_entries(base)]

    def recorded_keys(self) -> Dict[RolloutKey, bool]:
        """Keys already recorded, mapped to whether their record is valid."""
        return {RolloutKey.from_record(r): bool(r.get("valid", True)) for r in self.records()}
