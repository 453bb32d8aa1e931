"""The formal matrix around single runs: the suite screening chose, dry-run estimates, merging shards."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift.config import StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.framelog import MAX_FILE_BYTES, frame_log_path
from robocasa_shift.core.steplog import MAX_LOG_BYTES, log_path
from robocasa_shift.errors import RunDirError
from robocasa_shift.rundir.files import MAX_RECORD_BYTES, atomic_write_bytes, atomic_write_json, read_bytes
from robocasa_shift.rundir.store import IDENTITY_FIELDS, RunStore, parse_record
from robocasa_shift.study.plan import pending_keys


def formal_suite(run_dir: Path | str) -> Optional[List[str]]:
    """The tasks screening retained in ``run_dir`` (``suite.json``), or None before screening."""
    path = Path(run_dir) / "suite.json"
    return json.loads(path.read_text())["tasks"] if path.exists() else None


PROBE_STEPS = 10  # control steps a dry run's probe times per task (after two resets)


def probe(study: StudyConfig, task: str, steps: int = PROBE_STEPS) -> Dict[str, float]:
    """What a rollout of ``task`` costs this machine on the simulator's side, from a short probe in this process: the
    environment's build, a reset between rollouts (the second: the first compiles and caches), a control step with
    zero actions and one 128 px frame of each camera. ``rollout_s`` is at most a reset and the full horizon of steps,
    both cameras rendered at every step (a policy reading once per chunk of k steps renders k times fewer; its own
    inference time is not in it)."""
    import time

    import numpy as np

    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.backend import BaseEpisode

    backend = get_backend(study.backend, asset_kit=study.asset_kit)
    t0 = time.perf_counter()
    env = backend.make(task, render_profile=study.render_profile, stock_simulator=study.stock_simulator)
    make_s = time.perf_counter() - t0
    try:
        episode = BaseEpisode("formal", 0)
        env.reset(0, episode)
        t0 = time.perf_counter()
        env.reset(0, episode)
        reset_s = time.perf_counter() - t0
        zeros = np.zeros(env.action_dim)
        t0 = time.perf_counter()
        for _ in range(steps):
            env.step(zeros)
        step_s = (time.perf_counter() - t0) / steps
        cameras = list(env.third_person_cameras[:1]) + list(env.wrist_cameras[:1])
        for camera in cameras:  # the first frame of a camera builds its context and buffers
            env.render(camera, 128)
        t0 = time.perf_counter()
        for camera in cameras:
            env.render(camera, 128)
        frames_s = time.perf_counter() - t0
    finally:
        env.close()
    horizon = backend.task(task).horizon
    return {"make_s": make_s, "reset_s": reset_s, "step_s": step_s, "frames_s": frames_s, "horizon": horizon,
            "rollout_s": reset_s + horizon * (step_s + frames_s)}


def estimate(run_dir: Path | str, keys: Sequence[RolloutKey], workers: int, study: Optional[StudyConfig] = None,
             probed: Optional[Dict[str, Dict[str, float]]] = None) -> Dict[str, Any]:
    """Rollouts left and an ETA: per task, from the wall times already measured in ``run_dir``, or else (given the
    ``study``) from a short :func:`probe` on this machine (kept in ``probed`` for the next estimate). ``scaling``
    says what other worker counts would take: rollouts spread over the workers (a Ray cluster's CPUs alike), each
    worker building its environment first."""
    store = RunStore(run_dir)
    todo = pending_keys(store, keys)
    walls: Dict[str, List[float]] = {}
    for rec in store.records():
        walls.setdefault(rec["task"], []).append(float(rec.get("wall_s") or 0.0))
    per_task = {t: sum(v) / len(v) for t, v in walls.items() if v}
    probed = {} if probed is None else probed
    probes: Dict[str, Dict[str, float]] = {}
    if study is not None:
        for task in sorted({k.task for k in todo} - set(per_task)):
            probes[task] = probed[task] = probed.get(task) or probe(study, task)
    known = {**per_task, **{t: p["rollout_s"] for t, p in probes.items()}}
    fallback = sum(per_task.values()) / len(per_task) if per_task else None
    serial = None
    if all(k.task in known for k in todo) or fallback is not None:
        serial = sum(known.get(k.task, fallback) for k in todo)
    start_up = max((p["make_s"] + p["reset_s"] for p in probes.values()), default=0.0)

    def eta(n: int) -> Optional[float]:
        return None if serial is None else serial / max(1, min(n, len(todo) or 1)) + start_up

    return {"planned": len(keys), "pending": len(todo), "eta_s": eta(workers), "measured_s_per_rollout": per_task,
            "probed": probes, "serial_s": serial,
            "scaling": {n: eta(n) for n in sorted({1, 2, 4, 8, 16, 64, workers})}}


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
                for field, sidecar, cap, what in (("step_log", log_path, MAX_LOG_BYTES, "step log"),
                                                  ("frame_log", frame_log_path, MAX_FILE_BYTES, "frame log")):
                    if rec.get(field) and os.path.lexists(sidecar(path)):  # the audit checks its hash
                        try:
                            copies[sidecar(dest)] = read_bytes(sidecar(path), store.root, cap, what)
                        except OSError as exc:
                            raise RunDirError(f"{sidecar(path)}: {what} cannot be read ({exc.strerror})") from None
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
