"""Branch studies: which trunks and checkpoints, run as jobs on the executors, stored, resumed.

``branch(run_dir, ...)`` selects trunks among a run's records (by default the
failures the shift caused, S->F pairs, and clean failures), then runs two kinds
of job on the study's executor:

1. a :class:`TrunkJob` per trunk: re-run the key with snapshots; the caller checks
   that the re-run reproduces the stored record (fingerprints, stage steps,
   outcome) and writes the snapshots and the trunk's verdict;
2. a :class:`CheckpointJob` per branched checkpoint of each reproduced trunk:
   replay fidelity, then the branches (``checkpoints.run_checkpoint``). These run on
   a fresh set of worker processes (also with one worker), so every restore
   happens in a process that never recorded a snapshot.

The caller is the one writer of ``RUN_DIR/branching/<name>/`` (it holds the run
directory's lock); every file is written atomically, so a killed command resumes
where it stopped, with nothing lost and nothing run twice. ``--retry-errors``
re-runs invalid units (the old result moves to ``history/``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from robocasa_shift.branching.checkpoints import (
    BranchSettings,
    check_branchable,
    record_trunk,
    run_checkpoint,
)
from robocasa_shift.branching.snapshot import TrunkTape
from robocasa_shift.config import ExecutionConfig
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.replay import study_from_manifest
from robocasa_shift.errors import BadInput, RunDirError
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    UnsafeFile,
    atomic_write_bytes,
    atomic_write_json,
    inside,
    is_regular_file,
    move,
    read_bytes,
)
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.executors import make_executor
from robocasa_shift.study.runner import progress_iter
from robocasa_shift.study.worker import StudyCache

BRANCHING = "branching"
# The documented maximum of one trunk's snapshot file, and of what its arrays may declare (a 400-step
# robosuite trunk with 100 checkpoints: 1.2 MB on disk, 3.6 MB of arrays).
MAX_SNAPSHOT_BYTES = 256 * 2**20
SELECTION_KINDS = ("shift_failure", "clean_failure")
# Record fields a trunk's re-run must reproduce before any of its checkpoints is branched.
TRUNK_FIELDS = ("env_fingerprint", "policy_rng_fingerprint", "success", "steps", "stage_steps")
# Settings of a branch study that must agree between the commands writing to it.
IDENTITY = ("settings", "run_spec_hash", "policy", "backend", "threads")


@dataclass(frozen=True)
class Selection:
    """Which trunks, and which of their checkpoints, to branch.

    Attributes:
        kinds: ``shift_failure`` (perturbed failures whose clean twin succeeded) and/or ``clean_failure``.
        tasks, conditions: keep only these (None: all).
        keys: explicit rollout key ids (``formal/Lift/0003/base:L2/r0``), instead of ``kinds``.
        steps: explicit checkpoint steps (chunk boundaries), instead of the stride.
        max_trunks: at most this many, taken round-robin over (condition, task) in sorted order, so a
            small selection spans conditions and tasks.
        phase: the phase whose records are searched.
    """

    kinds: Tuple[str, ...] = SELECTION_KINDS
    tasks: Optional[Tuple[str, ...]] = None
    conditions: Optional[Tuple[str, ...]] = None
    keys: Tuple[str, ...] = ()
    steps: Tuple[int, ...] = ()
    max_trunks: Optional[int] = None
    phase: str = "formal"

    def __post_init__(self):
        unknown = [k for k in self.kinds if k not in SELECTION_KINDS]
        if unknown:
            from robocasa_shift.errors import UnknownNameError

            raise UnknownNameError("selection kind", unknown[0], list(SELECTION_KINDS))
        if self.max_trunks is not None and self.max_trunks < 1:
            raise BadInput(f"max_trunks must be >= 1, got {self.max_trunks}")

    def record(self) -> Dict[str, Any]:
        return {"kinds": list(self.kinds), "tasks": self.tasks and list(self.tasks),
                "conditions": self.conditions and list(self.conditions), "keys": list(self.keys),
                "steps": list(self.steps), "max_trunks": self.max_trunks, "phase": self.phase}


@dataclass(frozen=True)
class Trunk:
    """A selected trunk: its key, why it was selected, its clean twin's outcome and its stored record."""

    key: RolloutKey
    selection: str
    clean_success: Optional[bool]
    stored: Dict[str, Any]


def select_trunks(records: Sequence[Dict[str, Any]], selection: Selection) -> List[Trunk]:
    """The trunks ``selection`` picks from a run's records (valid records only).

    Raises:
        BadInput: an explicit key that has no valid record (the message names it).
    """
    valid = {RolloutKey.from_record(r): r for r in records if r.get("valid") is True}
    clean = {k.pair_id: r.get("success") for k, r in valid.items() if k.condition == specs.CLEAN}
    if selection.keys:
        chosen = []
        for text in selection.keys:
            try:
                key = RolloutKey.from_id(text)
            except ValueError:
                raise BadInput(f"key {text!r}: expected phase/task/episode/condition/r<replicate>, "
                               f"e.g. formal/Lift/0003/base:L2/r0") from None
            if key not in valid:
                raise BadInput(f"key {text}: no valid record of it in this run directory")
            chosen.append(Trunk(key, "requested", clean.get(key.pair_id), valid[key]))
        return chosen
    groups: Dict[Tuple[str, str], List[Trunk]] = {}
    for key in sorted(valid, key=lambda k: (k.condition, k.task, k.episode, k.replicate)):
        record = valid[key]
        if key.phase != selection.phase or record.get("success") is not False:
            continue
        if selection.tasks and key.task not in selection.tasks:
            continue
        if selection.conditions and key.condition not in selection.conditions:
            continue
        twin = clean.get(key.pair_id)
        kind = "clean_failure" if key.condition == specs.CLEAN else "shift_failure" if twin is True else None
        if kind in selection.kinds:
            groups.setdefault((key.condition, key.task), []).append(Trunk(key, kind, twin, record))
    chosen, queues = [], [list(g) for _, g in sorted(groups.items())]
    while any(queues) and (selection.max_trunks is None or len(chosen) < selection.max_trunks):
        for queue in queues:
            if queue and (selection.max_trunks is None or len(chosen) < selection.max_trunks):
                chosen.append(queue.pop(0))
    return chosen


def branch_steps(chunk_steps: Sequence[int], selection: Selection, stride: int) -> Tuple[List[int], List[int]]:
    """(steps to branch, requested steps that are not chunk boundaries)."""
    if selection.steps:
        boundaries, asked = set(chunk_steps), sorted(set(selection.steps))
        return [s for s in asked if s in boundaries], [s for s in asked if s not in boundaries]
    return list(chunk_steps)[::stride], []


def checkpoint_steps(where: Path, info: Dict[str, Any], record: Dict[str, Any], selection: Selection,
                     stride: int) -> List[int]:
    """A recorded trunk's ``checkpoint_steps``, checked against the record it re-ran before any of them is used:
    integers within the record's steps, strictly increasing, at most one per ``stride`` steps of it (or the
    explicit ``--steps`` asked for, and only those).

    Raises:
        RunDirError: a forged or stale list (the message names the trunk file ``where``).
    """
    steps, n = info.get("checkpoint_steps"), record.get("steps")
    problem = None
    if type(n) is not int or n < 0:
        problem = "its record has no step count"
    elif not (isinstance(steps, list) and all(type(s) is int for s in steps)):
        problem = "checkpoint_steps is not a list of steps"
    else:
        most = len(set(selection.steps)) if selection.steps else -(-n // stride)
        if len(steps) > most:
            problem = (f"checkpoint_steps lists {len(steps)} steps, more than this study branches of a {n}-step "
                       f"trunk ({most})")
        elif any(not 0 <= s < n for s in steps):
            problem = f"checkpoint_steps holds a step outside the record's 0..{n - 1}"
        elif any(b <= a for a, b in zip(steps, steps[1:])):
            problem = "checkpoint_steps is not strictly increasing"
        elif selection.steps and not set(steps) <= set(selection.steps):
            problem = "checkpoint_steps holds steps that were not asked for"
    if problem:
        raise RunDirError(f"{where}: {problem}; delete this trunk file to record the trunk again")
    return steps


# --------------------------------------------------------------------------- jobs (run in worker processes)


def _unrun(kind: str, payload: Dict[str, Any], error_kind: str, message: str) -> List[Dict[str, Any]]:
    return [{kind: {**payload, "valid": False, "error": message, "error_kind": error_kind}}]


class TrunkJob:
    """Re-run one trunk with snapshots; the result carries the new record and the snapshot file's bytes."""

    size = 1

    def __init__(self, key: RolloutKey):
        self.key = key

    def run(self, cache: StudyCache) -> List[Dict[str, Any]]:
        record, tape = record_trunk(cache.env(self.key.task), cache.policy, self.key, cache.protocol,
                                    cache.stage_spec(self.key.task), cache.config.backend)
        data = tape.to_bytes()  # before the events replay moves the environment
        try:  # task events (first grasp attempt, drop, target contact), replayed from the tape's states
            from robocasa_shift.branching.events import trunk_events

            events = trunk_events(cache.env(self.key.task), tape, cache.stage_spec(self.key.task), cache.config.backend)
        except Exception as exc:  # noqa: BLE001 - informative only: never invalidates the trunk
            events = {"error": f"{type(exc).__name__}: {exc}"}
        return [{"trunk": {**self.key.to_json(), "record": record.to_json(), "tape": data,
                           "chunk_steps": tape.chunk_steps, "events": events}}]

    def unrun(self, study, kind: str, message: str, protocol=None) -> List[Dict[str, Any]]:
        return _unrun("trunk", self.key.to_json(), kind, message)


_TAPE: Dict[str, Any] = {}  # the last snapshot file read in this process: consecutive jobs share a trunk


def read_snapshot(path: Path | str, sha256: str, root: Optional[Path | str] = None) -> TrunkTape:
    """The snapshot file at ``path`` (a regular file reached without a link below ``root``, at most
    ``MAX_SNAPSHOT_BYTES``), refused unless its SHA-256 is the one recorded when it was written.

    The bytes hashed are the bytes read: nothing is read twice.

    Raises:
        RunDirError: the file cannot be read, is a link, FIFO or device, too large, changed, or not a snapshot.
    """
    try:
        data = read_bytes(path, root, MAX_SNAPSHOT_BYTES, "snapshot file")
    except OSError as exc:
        raise RunDirError(f"{path}: snapshot file cannot be read ({exc.strerror or exc})") from None
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise RunDirError(f"{path}: snapshot file sha256 {found}, recorded {sha256}: it changed since it was written")
    return TrunkTape.read(data, str(path), MAX_SNAPSHOT_BYTES)


def _read_tape(path: str, sha256: str, root: Optional[str] = None) -> TrunkTape:
    """:func:`read_snapshot`, kept while consecutive jobs of one process read the same trunk."""
    if _TAPE.get("path") != path or _TAPE.get("sha256") != sha256:
        _TAPE.update(path=path, sha256=sha256, tape=read_snapshot(path, sha256, root))
    return _TAPE["tape"]


class CheckpointJob:
    """Fidelity and branches at one checkpoint of a recorded trunk."""

    def __init__(self, key: RolloutKey, step: int, snapshot: str, sha256: str, settings: BranchSettings,
                 root: Optional[str] = None):
        self.key, self.step, self.snapshot, self.sha256, self.settings = key, step, snapshot, sha256, settings
        self.root = root  # the run directory: the snapshot is read without a link below it
        self.size = 1 + len(settings.interventions) * settings.k_expanded  # rollouts it may run

    def run(self, cache: StudyCache) -> List[Dict[str, Any]]:
        tape = _read_tape(self.snapshot, self.sha256, self.root)
        result = run_checkpoint(cache.env(self.key.task), cache.policy, self.key, cache.protocol,
                                cache.stage_spec(self.key.task), cache.config.backend, tape, self.step, self.settings)
        return [{"checkpoint": result}]

    def unrun(self, study, kind: str, message: str, protocol=None) -> List[Dict[str, Any]]:
        return _unrun("checkpoint", {**self.key.to_json(), "step": self.step}, kind, message)


# --------------------------------------------------------------------------- the branch store


def _slug(key: RolloutKey) -> str:
    return f"{key.episode:04d}__{key.condition.replace(':', '-')}__r{key.replicate}"


class BranchStore:
    """``RUN_DIR/branching/<name>/`` (layout in ``robocasa_shift.branching``)."""

    def __init__(self, run_dir: Path | str, name: str = "default"):
        if not name or "/" in name or name.startswith("."):
            raise BadInput(f"branch study name {name!r}: use a plain folder name")
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / BRANCHING / name

    def trunk_path(self, key: RolloutKey, suffix: str = ".json") -> Path:
        return self.root / "trunks" / key.phase / key.task / f"{_slug(key)}{suffix}"

    def checkpoint_path(self, key: RolloutKey, step: int, base: str = "checkpoints") -> Path:
        return self.root / base / key.phase / key.task / _slug(key) / f"s{step:04d}.json"

    def manifest(self) -> Optional[Dict[str, Any]]:
        return _read(self.root / "manifest.json", self.run_dir)

    def ensure_manifest(self, manifest: Dict[str, Any]) -> None:
        """Write the manifest of a new branch study, or refuse settings that differ from its own."""
        existing = self.manifest()
        if existing is None:
            atomic_write_json(self.root / "manifest.json",
                              {**manifest, "created": _dt.datetime.now().isoformat(timespec="seconds")}, self.run_dir)
            return
        for field in IDENTITY:
            if existing.get(field) != manifest.get(field):
                raise RunDirError(f"{self.root}: this branch study was made with {field} = "
                                  f"{json.dumps(existing.get(field), sort_keys=True)}, this command asks for "
                                  f"{json.dumps(manifest.get(field), sort_keys=True)}; give another --name")

    def trunk(self, key: RolloutKey) -> Optional[Dict[str, Any]]:
        return _read(self.trunk_path(key), self.run_dir)

    def checkpoint(self, key: RolloutKey, step: int) -> Optional[Dict[str, Any]]:
        return _read(self.checkpoint_path(key, step), self.run_dir)

    def snapshot_path(self, key: RolloutKey, info: Dict[str, Any]) -> Path:
        """The snapshot file a trunk's JSON names, checked: a regular ``.npz`` file inside this branch study,
        reached without a symbolic link, with a recorded SHA-256.

        Raises:
            RunDirError: the trunk names an absolute path, a ``..``, a link, a FIFO or device, or no hash
                (the message names the trunk file, never anything about what lies outside).
        """
        where = self.trunk_path(key)
        name, digest = info.get("snapshot_file"), info.get("snapshot_sha256")
        try:
            path = inside(self.root, name, "snapshot_file")
        except UnsafeFile as exc:
            raise RunDirError(f"{where}: {exc}; delete this trunk file to record the trunk again") from None
        if not str(name).endswith(".npz") or not is_regular_file(path, self.run_dir):
            raise RunDirError(f"{where}: snapshot_file {str(name)[:200]!r} is not a regular .npz file of this branch "
                              f"study (missing, a link, a FIFO or a device); delete this trunk file to record the "
                              f"trunk again")
        if not (isinstance(digest, str) and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)):
            raise RunDirError(f"{where}: snapshot_sha256 is not a SHA-256; delete this trunk file to record it again")
        return path

    def write_trunk(self, info: Dict[str, Any], tape: Optional[bytes]) -> None:
        """Write the snapshots first and the verdict after, so a verdict always has its snapshots."""
        key = RolloutKey.from_record(info)
        if tape is not None:
            atomic_write_bytes(self.trunk_path(key, ".npz"), tape, self.run_dir)
            info = {**info, "snapshot_file": str(self.trunk_path(key, ".npz").relative_to(self.root)),
                    "snapshot_sha256": hashlib.sha256(tape).hexdigest()}
        self._supersede(self.trunk_path(key), "trunks")
        atomic_write_json(self.trunk_path(key), info, self.run_dir)

    def write_checkpoint(self, result: Dict[str, Any]) -> None:
        key = RolloutKey.from_record(result)
        self._supersede(self.checkpoint_path(key, result["step"]), "checkpoints")
        atomic_write_json(self.checkpoint_path(key, result["step"]), result, self.run_dir)

    def _supersede(self, path: Path, base: str) -> None:
        """Move an existing file into ``history/`` before it is replaced (a retried unit)."""
        if os.path.lexists(path):
            stamp = _dt.datetime.now().strftime("%Y%m%dT%H%M%S%f")
            dest = self.root / "history" / path.relative_to(self.root / base).with_suffix(f".{stamp}.json")
            move(path, dest, self.run_dir)


def _read(path: Path, root: Optional[Path] = None) -> Optional[Dict[str, Any]]:
    """A JSON object of a branch study, or None when the file is absent; read without following a link
    below ``root`` (the run directory), never blocking, at most ``MAX_JSON_BYTES``."""
    if not os.path.lexists(path):
        return None
    try:
        data = json.loads(read_bytes(path, root, MAX_JSON_BYTES, "branch study file").decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise RunDirError(f"{path}: not readable JSON ({getattr(exc, 'strerror', None) or exc})") from None
    if not isinstance(data, dict):
        raise RunDirError(f"{path}: expected a JSON object")
    return data


# --------------------------------------------------------------------------- the command


def _trunk_verdict(trunk: Trunk, result: Dict[str, Any]) -> Dict[str, Any]:
    """The trunk's JSON from its job's result: reproduced or not, and its stage/outcome facts."""
    info = {**trunk.key.to_json(), "selection": trunk.selection, "clean_success": trunk.clean_success}
    if "record" not in result:
        return {**info, "valid": False, "reproduced": False, "error": result.get("error"),
                "error_kind": result.get("error_kind")}
    record = result["record"]
    mismatch = [f"{name}: stored {trunk.stored.get(name)!r}, re-run {record.get(name)!r}"
                for name in TRUNK_FIELDS if trunk.stored.get(name) != record.get(name)]
    if not record.get("valid"):
        mismatch.insert(0, f"the re-run is invalid: {record.get('error')}")
    return {**info, "valid": bool(record.get("valid")), "reproduced": not mismatch,
            "mismatch": "; ".join(mismatch) or None, "error": record.get("error"),
            "error_kind": record.get("error_kind"),
            **{k: record.get(k) for k in ("success", "steps", "horizon", "stage_names", "stage_steps",
                                          "first_incomplete", "wall_s")}, "events": result.get("events")}


def branch(run_dir: Path | str, selection: Selection = Selection(), settings: BranchSettings = BranchSettings(),
           execution: ExecutionConfig = ExecutionConfig(), name: str = "default",
           policy_options: Optional[Dict[str, Any]] = None, trust_run_dir: bool = False,
           retry_errors: bool = False, dry_run: bool = False) -> Dict[str, Any]:
    """Branch the selected trunks of ``run_dir``; returns counts (and, with ``dry_run``, only the plan).

    Raises:
        RunDirError: not a run directory, or a branch study of this name made with other settings.
        StateUnsupported: the run's policy cannot snapshot its state (the reason says why).
        BadInput: an explicit key without a valid record; settings out of range.
    """
    store = RunStore(run_dir)
    manifest = store.manifest()
    if manifest is None:
        raise RunDirError(f"{run_dir}: no manifest.json; not a run directory")
    study = study_from_manifest(manifest, policy_options, trust_run_dir)
    execution = execution.resolved()
    trunks = select_trunks(store.records(), selection)
    bstore = BranchStore(store.root, name)
    cache = StudyCache(study)
    try:
        check_branchable(cache.policy)  # refused before anything runs
        # settings.record() builds each intervention: unknown names and tampered specs are refused here
        branch_manifest = {"settings": settings.record(), "selection": selection.record(),
                           "run_spec_hash": manifest.get("spec_hash"), "study_seed": manifest.get("study_seed"),
                           "policy": cache.policy.identity(), "backend": study.backend, "threads": execution.threads}
    finally:
        cache.close()
    if dry_run:
        return plan_summary(bstore, trunks, settings, selection, execution, retry_errors)
    counts = {"trunks_selected": len(trunks), "trunks_run": 0, "trunks_reproduced": 0, "checkpoints_run": 0,
              "checkpoints_invalid": 0, "fidelity_failed": 0}
    with store:  # the run directory's lock: one writer
        bstore.ensure_manifest(branch_manifest)
        for trunk in trunks:  # a recorded trunk's steps are checked against its record before any work
            info = bstore.trunk(trunk.key)
            if info and info.get("reproduced"):
                checkpoint_steps(bstore.trunk_path(trunk.key), info, trunk.stored, selection, settings.stride)
        todo = [t for t in trunks if _pending(bstore.trunk(t.key), retry_errors)]
        if todo:
            executor = make_executor(study, execution)
            try:
                by_key = {t.key: t for t in todo}
                for result in progress_iter(executor.run_jobs([TrunkJob(t.key) for t in todo]), len(todo), "trunks",
                                            execution.progress):
                    payload = result["trunk"]
                    trunk = by_key[RolloutKey.from_record(payload)]
                    verdict = _trunk_verdict(trunk, payload)
                    tape = payload.get("tape")
                    if tape is not None:
                        steps = payload["chunk_steps"]
                        branched, off = branch_steps(steps, selection, settings.stride)
                        verdict.update(chunk_steps=steps, checkpoint_steps=branched, steps_not_at_boundaries=off)
                    bstore.write_trunk(verdict, tape)
                    counts["trunks_run"] += 1
            finally:
                executor.close()
        jobs = checkpoint_jobs(bstore, trunks, settings, retry_errors, selection)
        counts["trunks_reproduced"] = sum(bool((bstore.trunk(t.key) or {}).get("reproduced")) for t in trunks)
        if jobs:
            executor = make_executor(study, execution)
            if hasattr(executor, "inline"):
                executor.inline = False  # restores run in processes that never recorded a snapshot
            try:
                for result in progress_iter(executor.run_jobs(jobs), len(jobs), "checkpoints", execution.progress):
                    checkpoint = result["checkpoint"]
                    bstore.write_checkpoint(checkpoint)
                    counts["checkpoints_run"] += 1
                    counts["checkpoints_invalid"] += int(not checkpoint.get("valid"))
                    counts["fidelity_failed"] += int(bool(checkpoint.get("fidelity")) and not checkpoint["fidelity"]["ok"])
            finally:
                executor.close()
    counts["branch_dir"] = str(bstore.root)
    return counts


def _pending(existing: Optional[Dict[str, Any]], retry_errors: bool) -> bool:
    """A unit runs when it has no result yet, or an invalid one and ``retry_errors``."""
    return existing is None or (retry_errors and not existing.get("valid"))


def checkpoint_jobs(bstore: BranchStore, trunks: Iterable[Trunk], settings: BranchSettings,
                    retry_errors: bool, selection: Selection = Selection()) -> List[CheckpointJob]:
    """The checkpoint units still to run, trunk by trunk (consecutive units share a snapshot file).

    Raises:
        RunDirError: a trunk file whose checkpoint steps do not fit its record (:func:`checkpoint_steps`); checked
            for every trunk before any job is made.
    """
    recorded = [(trunk, info) for trunk in trunks for info in [bstore.trunk(trunk.key)]
                if info and info.get("reproduced")]
    steps_of = {trunk.key: checkpoint_steps(bstore.trunk_path(trunk.key), info, trunk.stored, selection,
                                            settings.stride) for trunk, info in recorded}
    jobs = []
    for trunk, info in recorded:
        snapshot = None
        for step in steps_of[trunk.key]:
            if _pending(bstore.checkpoint(trunk.key, step), retry_errors):
                snapshot = snapshot or str(bstore.snapshot_path(trunk.key, info))  # checked once, before any job runs
                jobs.append(CheckpointJob(trunk.key, step, snapshot, info["snapshot_sha256"], settings,
                                          str(bstore.run_dir)))
    return jobs


def plan_summary(bstore: BranchStore, trunks: Sequence[Trunk], settings: BranchSettings, selection: Selection,
                 execution: ExecutionConfig, retry_errors: bool) -> Dict[str, Any]:
    """What a run would do: trunks, checkpoints and branch rollouts (at K and if every one expanded), and an ETA.

    Trunks not yet recorded are estimated from their stored record: ``policy_calls`` chunk boundaries,
    and the run's own measured seconds per control step for the task.
    """
    n_int = len(settings.interventions)
    trunk_runs = checkpoints = low = high = 0
    seconds = 0.0
    for trunk in trunks:
        info = bstore.trunk(trunk.key)
        record = trunk.stored
        per_step = (record.get("wall_s") or 0.0) / max(1, record.get("steps") or 1)
        horizon = int(record.get("horizon") or 0)
        if info is None or (retry_errors and not info.get("valid")):
            trunk_runs += 1
            seconds += per_step * (record.get("steps") or 0)
            calls = int(record.get("policy_calls") or 0)
            chunk = (record.get("steps") or 0) / max(1, calls)
            steps = [round(i * chunk) for i in range(calls)]
            steps = branch_steps(steps, selection, settings.stride)[0] if not selection.steps else list(selection.steps)
        elif info.get("reproduced"):
            steps = [s for s in checkpoint_steps(bstore.trunk_path(trunk.key), info, record, selection, settings.stride)
                     if _pending(bstore.checkpoint(trunk.key, s), retry_errors)]
        else:
            steps = []
        checkpoints += len(steps)
        for step in steps:
            remaining = max(0, horizon - step) if settings.budget == "inherited" else settings.fresh_budget
            k_low = settings.k_fixed or settings.k_initial  # a fixed-K reference runs every branch up to it
            low += 1 + n_int * k_low
            high += 1 + n_int * (settings.k_fixed or settings.k_expanded)
            # fidelity replays the trunk's own remainder; branches may run to the budget
            seconds += per_step * ((record.get("steps", 0) - step) + n_int * k_low * remaining)
    workers = max(1, execution.workers)
    return {"dry_run": True, "trunks_selected": len(trunks), "trunks_to_record": trunk_runs,
            "checkpoints": checkpoints, "branch_rollouts_at_k": low, "branch_rollouts_if_all_expanded": high,
            "eta_s": round(seconds / workers, 1), "workers": workers,
            "trunks": [{"key": t.key.id, "selection": t.selection} for t in trunks]}


__all__ = ["BRANCHING", "BranchStore", "CheckpointJob", "MAX_SNAPSHOT_BYTES", "SELECTION_KINDS", "Selection", "Trunk",
           "TrunkJob", "branch", "branch_steps", "checkpoint_jobs", "checkpoint_steps", "plan_summary", "read_snapshot",
           "select_trunks"]
