"""The run directory: a manifest, one JSON file per rollout, written atomically.

Layout::

    D/manifest.json             spec hashes, study seed, versions, renderer, seed rule, first command
    D/commands.jsonl            every command run on D, appended
    D/plan.json                 every key planned on D: the rollouts the audit expects
    D/records/<phase>/<task>/<episode>__<condition>__r<replicate>.json
    D/records/.../<episode>__<condition>__r<replicate>.steps.npz   its step log, with --log-steps
    D/history/...               records superseded by --retry-errors
    D/.lock                     held with flock while a process writes to D (shared by Gymnasium envs)
    D/.plan.lock                held by a Gymnasium env while it claims a key or updates the manifest

Each record is written to a temporary file, fsynced, renamed over its final
name and the directory fsynced, so a killed process (or a lost power supply)
leaves either the whole record or none of it; a rerun skips the keys already
recorded. The lock is held by the kernel (``flock``), so it dies with the
process that held it. A command holds it exclusively; the Gymnasium environments of
``robocasa_shift.gym`` (a vector env's sub-envs run in several processes) share it and
take ``.plan.lock`` for each change of the plan or the manifest, so a command never
runs beside them and they never claim one key twice.

Records are read defensively: a file that is not a record (truncated JSON, a
stray JSON without a key, ``"valid": "false"``) is skipped with a warning
naming it, and listed by :meth:`RunStore.unreadable_records` (the audit fails
on it); it never stops a command. Secret policy options (see
:func:`robocasa_shift.config.is_secret_option`) are redacted in everything the
store writes: the manifest's ``policy_options`` and ``command`` and every line
of ``commands.jsonl``.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import hashlib
import json
import math
import os
import shlex
import sys
import warnings
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple

from robocasa_shift.config import redact_argv, redact_options, redact_text
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.framelog import FrameLog, FrameLogError, frame_log_path, max_file_bytes, max_frame_bytes
from robocasa_shift.core.steplog import StepLog, StepLogError, log_path, max_log_bytes
from robocasa_shift.errors import RunDirError, RunDirLocked
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    MAX_RECORD_BYTES,
    append_text,
    atomic_write_bytes,
    atomic_write_json,
    clean_orphans,
    move,
    open_lock,
    read_bytes,
)
from robocasa_shift.seeding import PHASES

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


# --------------------------------------------------------------------------- reading records defensively

_NUMBER = (int, float)
_TYPE_WORDS = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "an object",
               None: "null"}
# The type of every record field (a tuple: any of them; None: may be null). A bool is never taken for an int.
RECORD_FIELD_TYPES: Dict[str, Tuple[Any, ...]] = {
    "phase": (str,), "task": (str,), "episode": (int,), "condition": (str,), "replicate": (int,),
    "backend": (str,), "policy": (str,), "spec_hash": (str,), "stage_spec_hash": (str,), "study_seed": (int,),
    "env_seed": (int,), "policy_seed": (int,), "horizon": (int,), "n_stages": (int,), "stage_names": (list,),
    "env_fingerprint": (str, None), "policy_rng_fingerprint": (str, None), "success": (bool, None),
    "steps": (int,), "truncated": (bool,), "stages_completed": (int,), "first_incomplete": (int, None),
    "stage_steps": (list,), "stage_error": (str, None), "perturbation": (dict, None), "valid": (bool,),
    "error": (str, None), "error_kind": (str, None), "renderer": (str, None), "wall_s": _NUMBER, "timing": (dict,),
    "policy_calls": (int,), "frames_rendered": (int,), "step_log": (dict, None), "frame_log": (dict, None),
    "asset_kit": (str, None), "asset_kit_sha256": (str, None), "source": (dict, None),
}
# The type of every manifest field a command reads (when present): a forged manifest is refused by name.
MANIFEST_FIELD_TYPES: Dict[str, Tuple[type, ...]] = {
    "backend": (str,), "policy": (dict,), "policy_options": (dict,), "render_profile": (str,), "spec_hash": (str,),
    "study_seed": (int,), "stage_spec_hashes": (dict,), "task_variants": (dict,), "env_config": (dict,),
    "versions": (dict,), "executions": (list,), "renderer": (dict,), "simulator": (dict,), "spec_files": (dict,),
    "command": (str,), "created": (str,), "seed_rule": (str,), "merged_from": (list,), "imported": (dict,),
}
# Fields a record file must have: those without a default in ``Record``.
REQUIRED_RECORD_FIELDS = tuple(f.name for f in fields(Record) if f.default is MISSING and f.default_factory is MISSING)


def _type_ok(value: Any, allowed: Tuple[Any, ...]) -> bool:
    if value is None:
        return None in allowed
    if isinstance(value, bool):
        return bool in allowed
    return any(t is not None and t is not bool and isinstance(value, t) for t in allowed)


def record_problem(data: Any) -> Optional[str]:
    """What makes ``data`` (parsed JSON) not a record, or None when it is one.

    Checks that it is an object, has every required field, and that each known field has its type
    (``"valid": "false"`` is refused, not read as true) and the key is usable (a known phase,
    episode and replicate >= 0, a non-empty task and condition).
    """
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    missing = [name for name in REQUIRED_RECORD_FIELDS if name not in data]
    if missing:
        return f"missing field(s) {', '.join(missing)}"
    for name, allowed in RECORD_FIELD_TYPES.items():
        if name in data and not _type_ok(data[name], allowed):
            want = "a number" if allowed == _NUMBER else " or ".join(_TYPE_WORDS[t] for t in allowed)
            return f"field '{name}' must be {want}, got {json.dumps(data[name])[:60]}"
    if data["phase"] not in PHASES:
        return f"field 'phase' must be one of {', '.join(PHASES)}, got {data['phase']!r}"
    for name in ("task", "condition"):
        if not data[name].strip() or "/" in data[name] or data[name] in (".", "..") or "\x00" in data[name]:
            return f"field '{name}' must be a non-empty name without '/', got {data[name]!r}"
    for name in ("episode", "replicate"):
        if not 0 <= data.get(name, 0) < 2**31:
            return f"field '{name}' must be >= 0 (and < 2^31), got {data[name]}"
    for name, allowed in RECORD_FIELD_TYPES.items():  # numbers a table can hold: 64-bit integers, finite floats
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**63:
            return f"field '{name}' is out of range, got {value}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"field '{name}' must be a finite number, got {value}"
    for name, kinds in (("stage_names", (str,)), ("stage_steps", (int, type(None)))):
        items = data.get(name) or []
        if not all(isinstance(v, kinds) and not isinstance(v, bool) for v in items):
            return f"field '{name}' must list {'names' if name == 'stage_names' else 'steps or nulls'}"
        if name == "stage_steps" and any(v is not None and not -2**63 <= v < 2**63 for v in items):
            return f"field '{name}' is out of range"
    return None


def parse_record(raw: bytes) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(record, None)`` from a record file's bytes, or ``(None, problem)`` when they are not a record."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}; truncated?)"
    problem = record_problem(data)
    return (None, problem) if problem else (data, None)


_WARNED: set = set()  # unreadable files already reported in this process (every command reads records often)


def _warn_unreadable(path: Path, problem: str) -> None:
    if (str(path), problem) not in _WARNED:
        _WARNED.add((str(path), problem))
        warnings.warn(f"skipping unreadable record {path}: {problem}", RuntimeWarning, stacklevel=3)


def _read_json(path: Path, what: str, root: Optional[Path] = None) -> Any:
    """A JSON file of the run directory (manifest, plan); a corrupt one is a :class:`RunDirError` naming it.

    Read as :func:`robocasa_shift.rundir.files.read_bytes` reads: a regular file reached without a
    link below ``root``, of at most ``MAX_JSON_BYTES``.
    """
    try:
        return json.loads(read_bytes(path, root, MAX_JSON_BYTES, f"run's {what}").decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise RunDirError(f"{path}: the run's {what} is not valid JSON ({exc}); restore it from a copy, "
                          f"or start a new --run-dir") from None


class RunStore:
    """Reads and writes one run directory."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._lock_fd: Optional[int] = None

    # ------------------------------------------------------------------ lock

    def lock(self, shared: bool = False) -> "RunStore":
        """Take the run directory's lock or refuse if another process holds it.

        The lock file is opened without following a link (a planted ``.lock`` link is refused, never
        truncated); once held exclusively, temporary files left by killed writers are removed.
        ``shared``: the lock of a Gymnasium environment, held beside other such environments' (each
        change of the plan or the manifest then goes through :meth:`plan_lock`); a command's
        exclusive lock refuses them and they refuse it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        fd = open_lock(self.root / ".lock", self.root)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip()
            os.close(fd)
            raise RunDirLocked(
                f"run directory {self.root} is in use by another process ({holder or 'unknown'}); "
                f"wait for it to finish or use another --run-dir"
            ) from None
        if shared:  # other holders may be writing: their temporary files are not orphans
            os.pwrite(fd, f"Gymnasium environments, pid {os.getpid()} among them".ljust(60).encode(), 0)
        else:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()} since {_dt.datetime.now().isoformat(timespec='seconds')}".encode())
            clean_orphans(self.root)
        self._lock_fd = fd
        return self

    @contextlib.contextmanager
    def plan_lock(self) -> Iterator[None]:
        """Hold ``D/.plan.lock`` (blocking, briefly): one holder of a shared lock at a time reads and changes
        the plan or the manifest."""
        fd = open_lock(self.root / ".plan.lock", self.root)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

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

    def require_manifest(self, command: str) -> Dict[str, Any]:
        """The run's manifest; a folder without one is not a run directory, and ``command`` writes nothing into it.

        Raises:
            RunDirError: ``D/manifest.json`` does not exist.
        """
        manifest = self.manifest()
        if manifest is None:
            raise RunDirError(f"{self.root}: not a run directory (no {MANIFEST}; a command that runs rollouts writes "
                              f"one); {command} wrote nothing")
        return manifest

    def manifest(self) -> Optional[Dict[str, Any]]:
        """The run's manifest, or None before the first command wrote one."""
        if not os.path.lexists(self.manifest_path):
            return None
        manifest = _read_json(self.manifest_path, "manifest", self.root)
        if not isinstance(manifest, dict):
            raise RunDirError(f"{self.manifest_path}: the run's manifest is not a JSON object")
        for name, types in MANIFEST_FIELD_TYPES.items():
            value = manifest.get(name)
            if name in manifest and (not isinstance(value, types) or isinstance(value, bool)):
                raise RunDirError(f"{self.manifest_path}: field {name!r} must be {' or '.join(_TYPE_WORDS[t] for t in types)}, "
                                  f"got {json.dumps(value)[:60]}; restore the manifest from a copy")
        if "policy" in manifest and not isinstance(manifest["policy"].get("name"), str):
            raise RunDirError(f"{self.manifest_path}: field 'policy' has no name; restore the manifest from a copy")
        return manifest

    @staticmethod
    def redacted(manifest: Dict[str, Any]) -> Dict[str, Any]:
        """``manifest`` with secret policy options (values and the command line) replaced by a placeholder."""
        out = dict(manifest)
        if isinstance(out.get("policy_options"), dict):
            out["policy_options"] = redact_options(out["policy_options"])
        if isinstance(out.get("command"), str):
            out["command"] = redact_text(out["command"])
        return out

    def ensure_manifest(self, manifest: Dict[str, Any]) -> Dict[str, Any]:
        """Write the manifest of a new run, or check that this command matches the existing one.

        Secret policy options are redacted before anything is compared or written.
        """
        manifest = self.redacted(manifest)
        existing = self.manifest()
        if existing is None:
            manifest = {**manifest, "created": _dt.datetime.now().isoformat(timespec="seconds")}
            atomic_write_json(self.manifest_path, manifest, self.root)
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
                atomic_write_json(self.manifest_path, merged, self.root)
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
            atomic_write_json(self.manifest_path, {**manifest, "executions": seen + [execution]}, self.root)

    def log_command(self, extra: Optional[Dict[str, Any]] = None) -> None:
        """Append this command (time, argv, pid and ``extra``) to ``D/commands.jsonl``."""
        self.root.mkdir(parents=True, exist_ok=True)
        entry = {
            "time": _dt.datetime.now().isoformat(timespec="seconds"),
            "argv": " ".join(shlex.quote(a) for a in redact_argv(sys.argv)),
            "pid": os.getpid(),
            **(extra or {}),
        }
        append_text(self.root / "commands.jsonl", json.dumps(entry) + "\n", self.root)

    # ------------------------------------------------------------------ plan

    @property
    def plan_path(self) -> Path:
        """``D/plan.json``: every key any command on this run directory planned."""
        return self.root / PLAN

    def planned_keys(self) -> List[RolloutKey]:
        """Every key a command on this run directory planned: the rollouts the audit expects."""
        if not os.path.lexists(self.plan_path):
            return []
        plan = _read_json(self.plan_path, "plan", self.root)
        try:
            return [RolloutKey.from_id(k) for k in plan["keys"]]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise RunDirError(f"{self.plan_path}: not a plan (expected {{\"keys\": [\"phase/task/episode/"
                              f"condition/rN\", ...]}}); restore it from a copy, or start a new --run-dir") from None

    def add_to_plan(self, keys: Iterable[RolloutKey]) -> None:
        """Add ``keys`` to the plan (a sorted set, rewritten atomically); planning a key twice changes nothing."""
        merged = sorted(set(self.planned_keys()) | set(keys))
        atomic_write_json(self.plan_path, {"keys": [k.id for k in merged]}, self.root)

    def drop_from_plan(self, keys: Iterable[RolloutKey]) -> None:
        """Take ``keys`` out of the plan (a Gymnasium env's claim on a key it never stepped)."""
        kept = sorted(set(self.planned_keys()) - set(keys))
        atomic_write_json(self.plan_path, {"keys": [k.id for k in kept]}, self.root)

    # ------------------------------------------------------------------ records

    def record_path(self, key: RolloutKey, base: str = "records") -> Path:
        """Where the record of ``key`` lives (under ``records/`` or ``history/``)."""
        name = f"{key.episode:04d}__{_condition_slug(key.condition)}__r{key.replicate}.json"
        return self.root / base / key.phase / key.task / name

    def write(self, record: Record, step_log: Optional[bytes] = None, frame_log: Optional[bytes] = None) -> Path:
        """Write ``record`` atomically at its key's path; return the path.

        Its step log and frame log are written first (beside the record, see ``engine/step_logger.py`` and
        ``engine/frame_logger.py``), so a record that names a log always has it; a record written without one
        removes a stale log of its key.
        """
        path = self.record_path(record.key)
        for sidecar, data in ((log_path(path), step_log), (frame_log_path(path), frame_log)):
            if data is not None:
                atomic_write_bytes(sidecar, data, self.root)
            elif os.path.lexists(sidecar):
                sidecar.unlink()
        atomic_write_json(path, record.to_json(), self.root)
        return path

    def step_log(self, record: Dict[str, Any]) -> Optional[StepLog]:
        """The step log of a record (None when it has none), checked against the hash the record holds.

        Raises:
            StepLogError: the file is missing, changed since it was written, or is not a step log.
        """
        info = record.get("step_log")
        if not info:
            return None
        if not isinstance(info, dict):
            raise StepLogError(f"record {RolloutKey.from_record(record).id}: field 'step_log' is not an object")
        path = log_path(self.record_path(RolloutKey.from_record(record)))
        cap = max_log_bytes(info)
        data = self._sidecar(path, info, cap, StepLogError, "step log")
        return StepLog.read(data, str(path), cap)

    def frame_log_bytes(self, record: Dict[str, Any]) -> Optional[bytes]:
        """The bytes of a record's frame log (None when it has none), checked against the size and hash the record
        holds; nothing is decompressed.

        Raises:
            FrameLogError: the file is missing, larger than the record says, or changed since it was written.
        """
        info = record.get("frame_log")
        if not info:
            return None
        if not isinstance(info, dict):
            raise FrameLogError(f"record {RolloutKey.from_record(record).id}: field 'frame_log' is not an object")
        path = frame_log_path(self.record_path(RolloutKey.from_record(record)))
        return self._sidecar(path, info, max_file_bytes(info), FrameLogError, "frame log")

    def frame_log(self, record: Dict[str, Any]) -> Optional[FrameLog]:
        """The frame log of a record (None when it has none): :meth:`frame_log_bytes`, decoded within the size its
        record declares.

        Raises:
            FrameLogError: as :meth:`frame_log_bytes`, or the file is not a frame log.
        """
        data = self.frame_log_bytes(record)
        if data is None:
            return None
        path = frame_log_path(self.record_path(RolloutKey.from_record(record)))
        return FrameLog.read(data, str(path), max_frame_bytes(record["frame_log"]))

    def _sidecar(self, path: Path, info: Dict[str, Any], cap: int, error: type, what: str) -> bytes:
        """A log file's bytes (at most ``cap``), refused with ``error`` unless its SHA-256 is the one in ``info``."""
        try:
            data = read_bytes(path, self.root, cap, what)
        except OSError as exc:
            raise error(f"{path}: the record names a {what} that cannot be read "
                        f"({exc.strerror or str(exc)[:200]})") from None
        found = hashlib.sha256(data).hexdigest()
        if found != info.get("sha256"):
            raise error(f"{path}: {what} changed since it was written (sha256 {found}, "
                        f"the record holds {str(info.get('sha256'))[:64]})")
        return data

    def supersede(self, key: RolloutKey) -> None:
        """Move the current record of ``key`` (and its step and frame logs) into the history (before re-running it)."""
        path = self.record_path(key)
        if not path.exists():
            return
        stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S%f")
        dest = self.record_path(key, base="history").with_suffix(f".{stamp}.json")
        for sidecar in (log_path, frame_log_path):
            if os.path.lexists(sidecar(path)):
                move(sidecar(path), sidecar(dest), self.root)
        move(path, dest, self.root)

    def record_files(self, base: str = "records") -> Iterator[Path]:
        """Every record file, sorted (temporary files of a write in progress excluded)."""
        root = self.root / base
        if root.exists():
            yield from sorted(p for p in root.rglob("*.json") if not p.name.startswith("."))

    def read_entries(self, base: str = "records") -> Tuple[List[Tuple[str, Dict[str, Any]]], List[Tuple[str, str]]]:
        """Every record file of the run, read: ``(records, unreadable)``.

        ``records`` holds ``(file, record)`` for each file that is a record; ``unreadable`` holds
        ``(file, problem)`` for each that is not (files relative to the run directory).
        """
        good, bad = [], []
        for path in self.record_files(base):
            file = str(path.relative_to(self.root))
            try:
                record, problem = parse_record(read_bytes(path, self.root, MAX_RECORD_BYTES, "record"))
            except OSError as exc:
                record, problem = None, f"cannot be read ({exc.strerror})"
            if record is None:
                bad.append((file, problem))
            else:
                good.append((file, record))
        return good, bad

    def record_entries(self, base: str = "records") -> List[Tuple[str, Dict[str, Any]]]:
        """Every record of the run with the file it came from (relative to the run directory).

        A file that is not a record is skipped with a warning naming it (see :meth:`unreadable_records`).
        """
        good, bad = self.read_entries(base)
        for file, problem in bad:
            _warn_unreadable(self.root / file, problem)
        return good

    def unreadable_records(self, base: str = "records") -> List[Tuple[str, str]]:
        """``(file, problem)`` for every file under ``base`` that is not a readable record."""
        return self.read_entries(base)[1]

    def records(self, base: str = "records") -> List[Dict[str, Any]]:
        """Every record of the run, as written (one dict per record file)."""
        return [rec for _, rec in self.record_entries(base)]

    def recorded_keys(self) -> Dict[RolloutKey, bool]:
        """Keys already recorded, mapped to whether their record is valid."""
        return {RolloutKey.from_record(r): r.get("valid", True) is True for r in self.records()}
