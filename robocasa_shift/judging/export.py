"""Export a run as a labelled judge benchmark: one sample per rollout, frames replayed in the simulator.

A sample is what a success judge sees (the instruction and frames of the attempt)
next to what the harness knows about it (the official outcome, how far it got,
its condition and its paired twin). Frames come from replaying the rollout's
logged actions (``--log-steps``) through the simulator, so no policy is involved
and remote or unseeded policies export too; a rollout without a log is re-run
with its policy only when that policy runs in this process with its generators
(any other is refused with the reason). Either way the replay must reproduce
the record (the fingerprint before the perturbation, the outcome, every
subgoal's latch step) or the sample is left out and listed.

Clips have a fixed length: ``frames`` frames at evenly spaced steps over the
attempt, then the end frame. A success ends at its first success and a failure
at the horizon, so a clip's duration would give the label away; a fixed frame
count does not (what the ``length-only`` baseline of ``score-judge`` reads is
exactly that duration, to show how much it would give).

Layout of an export directory::

    export.json          format, version, settings, source run, counts, strata, export_hash
    manifest.jsonl       one sample per line (fields: SAMPLE_FIELDS), sorted by sample_id
    media/<sample_id>/<camera>-<k>.png   clip frames k = 00 .. frames (the last is the end frame)
    samples/<sample_id>.json             the row as written (resume), or why it was left out

``export_hash`` is the SHA-256 of the manifest's bytes, and every row holds the
SHA-256 of each of its images, so a score names the exact set it was computed on.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.engine.replay import (
    REPRODUCED_FIELDS,
    observation_transform,
    study_from_manifest,
)
from robocasa_shift.engine.rollout import Observer, inject, prepare_episode, run_rollout
from robocasa_shift.errors import (
    BadInput,
    RunDirError,
    StateUnsupported,
    UnknownNameError,
)
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    clean_orphans,
    confined,
    read_json,
)
from robocasa_shift.rundir.store import RunStore

FORMAT = "robocasa-shift judge set"
VERSION = 1
EXPORT_JSON = "export.json"
MANIFEST = "manifest.jsonl"
# Which cameras a sample holds, by role.
CAMERA_CHOICES = {"third": ("third_person",), "wrist": ("wrist",), "both": ("third_person", "wrist")}
# Failure strata by stage depth; successes are their own stratum.
SUCCESS = "success"
NO_SUBGOAL = "no_subgoal"      # never latched the first subgoal
MID_TASK = "mid_task"          # latched some subgoals, not all
NEAR_SUCCESS = "near_success"  # latched every subgoal, yet the official check failed
STRATA = (SUCCESS, NO_SUBGOAL, MID_TASK, NEAR_SUCCESS)
# Where a failure came from (FailBench 3.1: 75% of its failures occur naturally): organic, planned, synthetic.
ORGANIC = "organic"
FAILURE_ORIGINS = (ORGANIC, "planned", "synthetic")
SAMPLE_FIELDS = (
    "sample_id", "instruction", "task", "condition", "factor", "level", "phase", "episode", "replicate", "pair_id",
    "episode_key", "success", "stratum", "n_stages", "stages_completed", "first_incomplete", "stage_names", "steps",
    "horizon", "cameras", "frame_steps", "clip", "start", "end", "media_sha256", "replayed_from", "boxes", "video",
    "failure_origin")


class ExportError(BadInput):
    """An export that cannot be made as asked (settings out of range, a policy that cannot be re-run)."""


@dataclass(frozen=True)
class ExportSettings:
    """What each sample holds, and which rollouts are sampled.

    Attributes:
        cameras: ``third``, ``wrist`` or ``both`` (every camera of the role).
        frames: clip frames at evenly spaced steps over the attempt, before the end frame.
        size: square image size in pixels.
        max_per_cell: at most this many samples per (task, phase, condition) cell; the same base episodes
            in every cell of a task and phase (a seeded order), so pairs stay whole.
        seed: the order a ``max_per_cell`` sample takes its episodes in.
        video: also write each camera's clip as an MP4 (``judging/crops.py``), an input mode beside the PNGs.
        per_failure_type: at most this many failures of each type (stratum: no_subgoal, mid_task, near_success)
            per task, in the seeded order (FailBench's balanced sampling per failure type); successes are kept.
    """

    cameras: str = "both"
    frames: int = 8
    size: int = 224
    max_per_cell: Optional[int] = None
    seed: int = 0
    video: bool = False
    per_failure_type: Optional[int] = None

    def __post_init__(self):
        if self.cameras not in CAMERA_CHOICES:
            raise UnknownNameError("camera choice", self.cameras, list(CAMERA_CHOICES))
        if not 1 <= self.frames <= 256:
            raise ExportError(f"frames must be 1-256, got {self.frames}")
        if not 16 <= self.size <= 1024:
            raise ExportError(f"size must be 16-1024 pixels, got {self.size}")
        if self.max_per_cell is not None and self.max_per_cell < 1:
            raise ExportError(f"max_per_cell must be at least 1, got {self.max_per_cell}")
        if self.per_failure_type is not None and self.per_failure_type < 1:
            raise ExportError(f"per_failure_type must be at least 1, got {self.per_failure_type}")


def frame_steps(steps: int, frames: int) -> List[int]:
    """Control steps whose post-step state a clip shows: ``frames`` evenly over [0, steps), then ``steps``."""
    return [int(s) for s in (np.arange(frames) * steps) // frames] + [int(steps)]


# A sample's name: what export-judge makes (task.phase.eNNNN.rN.condition, ':' as '-'), safe in a file name, a
# CSV cell or a shell line. A judge set whose manifest holds another is refused when it is read.
SAMPLE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,199}")


def is_sample_id(value: Any) -> bool:
    """Whether ``value`` is a well-formed sample id (see :data:`SAMPLE_ID`)."""
    return isinstance(value, str) and SAMPLE_ID.fullmatch(value) is not None


def sample_id(key: RolloutKey) -> str:
    """A sample's name: readable, unique per rollout key, safe as a file name."""
    condition = key.condition.replace(":", "-")
    return f"{key.task}.{key.phase}.e{key.episode:04d}.r{key.replicate}.{condition}"


def pair_id(key: RolloutKey) -> str:
    """Shared by every condition of one base episode and replicate: a perturbed sample's clean twin has it too."""
    return f"{key.task}.{key.phase}.e{key.episode:04d}.r{key.replicate}"


def stratum(success: bool, stages_completed: int, n_stages: int) -> str:
    """The difficulty stratum of a rollout, by how far it got (see ``STRATA``)."""
    if success:
        return SUCCESS
    if stages_completed == 0:
        return NO_SUBGOAL
    return NEAR_SUCCESS if stages_completed >= n_stages else MID_TASK


def select(records: Sequence[Mapping[str, Any]], settings: ExportSettings) -> List[Mapping[str, Any]]:
    """The valid records to export: all, or ``max_per_cell`` per (task, phase, condition), in a seeded order of the
    phase's base episodes shared by its conditions (so pairs stay whole)."""
    valid = [r for r in records if r.get("valid", True) and r.get("success") is not None]
    if settings.per_failure_type is not None:
        valid = _balance_failure_types(valid, settings)
    if settings.max_per_cell is None:
        return sorted(valid, key=lambda r: RolloutKey.from_record(r).id)
    chosen: List[Mapping[str, Any]] = []
    # A cell is (task, phase, condition): base episodes are drawn per phase, so a phase that ran only some
    # conditions (screening runs clean only) never takes a cell's places from the pairs of another phase.
    for task, phase in sorted({(r["task"], r["phase"]) for r in valid}):
        mine = [r for r in valid if r["task"] == task and r["phase"] == phase]
        units = sorted({(r["episode"], r.get("replicate", 0)) for r in mine})
        stream = seeding.derive_seed(settings.seed, stream="judge-export", task=task, phase=phase)
        rank = {units[i]: position for position, i in enumerate(np.random.default_rng(stream).permutation(len(units)))}
        for condition in sorted({r["condition"] for r in mine}):
            cell = sorted((r for r in mine if r["condition"] == condition),
                          key=lambda r: rank[(r["episode"], r.get("replicate", 0))])
            chosen += cell[: settings.max_per_cell]
    return sorted(chosen, key=lambda r: RolloutKey.from_record(r).id)


def _balance_failure_types(records: List[Mapping[str, Any]], settings: ExportSettings) -> List[Mapping[str, Any]]:
    """At most ``per_failure_type`` failures of each stratum per task, in a seeded order; successes all kept."""
    kept = [r for r in records if r["success"]]
    for task in sorted({r["task"] for r in records}):
        for name in STRATA[1:]:
            failures = sorted((r for r in records if r["task"] == task and not r["success"]
                               and stratum(False, int(r["stages_completed"]), int(r["n_stages"])) == name),
                              key=lambda r: RolloutKey.from_record(r).id)
            stream = seeding.derive_seed(settings.seed, stream="judge-export-failure-type", task=task, phase=name)
            order = np.random.default_rng(stream).permutation(len(failures))
            kept += [failures[i] for i in order[: settings.per_failure_type]]
    return kept


def png_bytes(image: np.ndarray) -> bytes:
    """A uint8 (H, W, 3) image as PNG bytes (lossless; the same pixels give the same bytes)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


class FrameSampler(Observer):
    """Grabs the given cameras at the given steps (0: after the perturbation, before any action); with ``points``
    (env -> world points), also where those points project in each of ``box_cameras`` (``judging/crops.py``)."""

    def __init__(self, cameras: Sequence[str], size: int, steps: Sequence[int], transform=None, points=None,
                 box_cameras: Sequence[str] = ()):
        self.cameras, self.size, self.transform = list(cameras), size, transform
        self.wanted = set(steps)
        self.frames: Dict[int, List[np.ndarray]] = {}
        self.points, self.box_cameras = points, list(box_cameras)
        self.pixels: Dict[str, List[np.ndarray]] = {}

    def _grab(self, env, step: int) -> None:
        if step in self.wanted:
            images = [env.render(c, self.size) for c in self.cameras]
            self.frames[step] = [self.transform(i) for i in images] if self.transform else images
            if self.points is not None:
                from robocasa_shift.judging.crops import camera_frame, project

                where = self.points(env)
                for camera in self.box_cameras:
                    frame = camera_frame(env, camera)
                    if frame is not None and where:
                        self.pixels.setdefault(camera, []).append(project(frame, self.size, where))

    def on_start(self, env) -> None:
        self.frames, self.pixels = {}, {}
        self._grab(env, 0)

    def on_step(self, step, action, env, latched) -> None:
        self._grab(env, step)


def replay_actions(env, protocol, key: RolloutKey, stage_spec, actions: np.ndarray, sampler: FrameSampler,
                   record: Mapping[str, Any]) -> List[str]:
    """Step ``actions`` from the key's initial state (perturbation injected), grabbing frames; what differs
    from ``record`` (fingerprint, outcome, latch steps), in words."""
    problems = []
    fingerprint = prepare_episode(env, protocol, key)
    if record.get("env_fingerprint") and fingerprint != record["env_fingerprint"]:
        problems.append(f"initial state fingerprint {fingerprint[:12]} differs from the record's "
                        f"{record['env_fingerprint'][:12]}")
    inject(env, protocol, key)
    tracker = StageTracker(stage_spec)
    sampler.on_start(env)
    success = False
    for step, action in enumerate(actions, start=1):
        env.step(action)
        tracker.update(env, step)
        success = env.is_success()
        sampler.on_step(step, action, env, [])
        if success and step < len(actions):
            problems.append(f"succeeded at step {step}, before the recorded end at {len(actions)}")
            break
    result = tracker.result()
    if success != record["success"]:
        problems.append(f"success recorded {record['success']}, replayed {success}")
    if result.stage_steps != record["stage_steps"]:
        problems.append(f"stage_steps recorded {record['stage_steps']}, replayed {result.stage_steps}")
    return problems


class ExportJob:
    """A job for the executors: render one rollout's clip, from its logged actions or by re-running its policy."""

    size = 1

    def __init__(self, record: Mapping[str, Any], actions: Optional[np.ndarray], roles: Sequence[str],
                 settings: ExportSettings):
        self.record = {k: record[k] for k in ("phase", "task", "episode", "condition", "replicate", "success",
                                              "steps", "stage_steps", "env_fingerprint") if k in record}
        self.actions, self.roles, self.settings = actions, tuple(roles), settings

    @property
    def key(self) -> RolloutKey:
        return RolloutKey.from_record(self.record)

    def run(self, cache) -> List[Dict[str, Any]]:
        from robocasa_shift.core.backend import cameras_for_roles

        from robocasa_shift.judging import crops

        key = self.key
        env, spec = cache.env(key.task), cache.stage_spec(key.task)
        cameras = cameras_for_roles(env, self.roles)
        steps = frame_steps(int(self.record["steps"]), self.settings.frames)
        fixed = [c for c in cameras if c not in env.wrist_cameras]  # moving (wrist) cameras are never cropped
        sampler = FrameSampler(cameras, self.settings.size, steps, observation_transform(cache.protocol, key.condition),
                               points=lambda e: crops.relevant_points(e, spec), box_cameras=fixed)
        if self.actions is not None:
            problems = replay_actions(env, cache.protocol, key, spec, self.actions, sampler, self.record)
            replayed = "step_log"
        else:
            rerun = run_rollout(env, cache.policy, key, cache.protocol, spec, cache.config.backend, observer=sampler)
            problems = [f"{name} recorded {self.record[name]}, re-run {getattr(rerun, name)}"
                        for name in REPRODUCED_FIELDS if getattr(rerun, name) != self.record[name]]
            replayed = "policy_rerun"
        result: Dict[str, Any] = {"sample_id": sample_id(key), "replayed_from": replayed, "problems": problems,
                                  "instruction": env.task.instruction, "horizon": int(env.task.horizon),
                                  "cameras": {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in cameras}}
        if not problems:
            missing = [s for s in steps if s not in sampler.frames]
            if missing:
                result["problems"] = [f"no frame at steps {missing}"]
            else:
                result["frames"] = {c: [png_bytes(sampler.frames[s][i]) for s in steps] for i, c in enumerate(cameras)}
                result["frame_steps"] = steps
                result["boxes"] = {c: crops.box(sampler.pixels.get(c, []), self.settings.size) for c in fixed}
                if self.settings.video:
                    result["videos"] = {c: crops.mp4_bytes([sampler.frames[s][i] for s in steps])
                                        for i, c in enumerate(cameras)}
        return [{"export": result}]

    def unrun(self, study, kind: str, message: str, protocol=None) -> List[Dict[str, Any]]:
        return [{"export": {"sample_id": sample_id(self.key), "error": f"{kind}: {message}"}}]


def rerun_refusal(policy_name: str) -> Optional[str]:
    """Why rollouts of ``policy_name`` without step logs cannot be re-run here (None when they can)."""
    from robocasa_shift.policies import POLICIES

    return getattr(POLICIES.get(policy_name), "state_refusal", None)  # set by policies whose generators live on a server


class ExportStore:
    """An export directory: per-sample files while it is made (resumable), then the manifest and its hash."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def sample_path(self, sid: str) -> Path:
        return self.root / "samples" / f"{sid}.json"

    def sample(self, sid: str) -> Optional[Dict[str, Any]]:
        path = self.sample_path(sid)
        if not os.path.lexists(path):
            return None
        try:
            row = read_json(path, self.root, MAX_JSON_BYTES, "sample file")
        except (OSError, RunDirError):
            return None  # a torn file (or a link, a FIFO): made again
        return row if isinstance(row, dict) else None

    def settings_path(self) -> Path:
        return self.root / "samples" / "settings.json"

    def ensure_settings(self, identity: Dict[str, Any]) -> None:
        """Write the export's identity, or check a resumed export was started with the same one."""
        path = self.settings_path()
        if os.path.lexists(path):
            found = read_json(path, self.root, MAX_JSON_BYTES, "export settings")
            if not isinstance(found, dict):
                raise RunDirError(f"{path}: not a JSON object; use another --out")
            differ = sorted(k for k in set(found) | set(identity) if found.get(k) != identity.get(k))
            if differ:
                raise RunDirError(f"{self.root} holds an export made with other settings or from another run "
                                  f"({', '.join(differ)} differ); use another --out, or the same settings")
            return
        atomic_write_json(path, identity, self.root)

    def write_sample(self, result: Dict[str, Any], record: Mapping[str, Any], protocol) -> Dict[str, Any]:
        """Write one job's result: its images, then its row (a row names only images already on disk)."""
        sid = result["sample_id"]
        if "frames" not in result:
            row = {"sample_id": sid, "excluded": result.get("error") or "; ".join(result.get("problems") or []),
                   "error": bool(result.get("error"))}
            atomic_write_json(self.sample_path(sid), row, self.root)
            return row
        clip: Dict[str, List[str]] = {}
        hashes: Dict[str, str] = {}
        for camera, frames in result["frames"].items():
            clip[camera] = []
            for k, data in enumerate(frames):
                relative = f"media/{sid}/{camera}-{k:02d}.png"
                atomic_write_bytes(self.root / relative, data, self.root)
                clip[camera].append(relative)
                hashes[relative] = hashlib.sha256(data).hexdigest()
        videos: Dict[str, str] = {}
        for camera, data in (result.get("videos") or {}).items():
            relative = f"media/{sid}/{camera}.mp4"
            atomic_write_bytes(self.root / relative, data, self.root)
            videos[camera] = relative
            hashes[relative] = hashlib.sha256(data).hexdigest()
        key = RolloutKey.from_record(record)
        condition = protocol.condition(key.condition)
        completed, n_stages = int(record["stages_completed"]), int(record["n_stages"])
        row = {
            "sample_id": sid, "instruction": result["instruction"], "task": key.task, "condition": key.condition,
            "factor": condition.factor or "clean", "level": condition.level, "phase": key.phase, "episode": key.episode,
            "replicate": key.replicate, "pair_id": pair_id(key), "episode_key": f"{key.task}.{key.phase}.e{key.episode:04d}",
            "success": bool(record["success"]), "stratum": stratum(bool(record["success"]), completed, n_stages),
            "n_stages": n_stages, "stages_completed": completed, "first_incomplete": record.get("first_incomplete"),
            "stage_names": list(record.get("stage_names") or []), "steps": int(record["steps"]),
            "horizon": result["horizon"], "cameras": result["cameras"], "frame_steps": result["frame_steps"],
            "clip": clip, "start": {c: paths[0] for c, paths in clip.items()},
            "end": {c: paths[-1] for c, paths in clip.items()}, "media_sha256": hashes,
            "replayed_from": result["replayed_from"], "boxes": result.get("boxes") or {},
            # where a failure came from: the policy's own rollouts here; planned (staged) or synthetic (constructed)
            # failures only enter through an imported set
            "failure_origin": None if record["success"] else ORGANIC,
        }
        if videos:
            row["video"] = videos
        atomic_write_json(self.sample_path(sid), row, self.root)
        return row

    def finish(self, sids: Iterable[str], info: Dict[str, Any]) -> Dict[str, Any]:
        """Assemble ``manifest.jsonl`` from the rows of ``sids`` and write ``export.json``; return it."""
        rows, excluded = [], []
        for sid in sorted(sids):
            row = self.sample(sid)
            if row is None:
                excluded.append({"sample_id": sid, "reason": "not made"})
            elif "excluded" in row:
                excluded.append({"sample_id": sid, "reason": row["excluded"]})
            else:
                rows.append(row)
        text = "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows)
        atomic_write_text(self.root / MANIFEST, text, self.root)
        strata: Dict[str, Dict[str, int]] = {}
        for row in rows:
            strata.setdefault(row["task"], {s: 0 for s in STRATA})[row["stratum"]] += 1
        export = {"format": FORMAT, "version": VERSION, **info, "samples": len(rows), "excluded": excluded,
                  "strata": strata, "export_hash": hashlib.sha256(text.encode()).hexdigest()}
        atomic_write_json(self.root / EXPORT_JSON, export, self.root)
        return export


def export_judge(run_dir: Path | str, out: Path | str, settings: ExportSettings = ExportSettings(),
                 execution: ExecutionConfig = ExecutionConfig(), policy_options: Optional[Dict[str, Any]] = None,
                 trust_run_dir: bool = False, retry_errors: bool = False) -> Dict[str, Any]:
    """Export ``run_dir``'s valid rollouts as a judge set in ``out`` (resumable); returns ``export.json``.

    Raises:
        RunDirError: not a run directory, or ``out`` holds an export of other settings or another run.
        StateUnsupported: rollouts without step logs whose policy cannot be re-run here (the reason says why).
        StepLogError: a step log that changed since its record was written.
    """
    store = RunStore(run_dir)
    manifest = store.manifest()
    if manifest is None:
        raise RunDirError(f"{run_dir}: no manifest.json; not a run directory")
    if not (isinstance(manifest.get("backend"), str) and isinstance(manifest.get("policy"), dict)
            and isinstance(manifest["policy"].get("name"), str)):
        raise RunDirError(f"{run_dir}/manifest.json: no backend or policy name; not a run directory's manifest")
    records = select(store.records(), settings)
    by_id = {sample_id(RolloutKey.from_record(r)): r for r in records}
    unsafe = sorted(sid for sid in by_id if not is_sample_id(sid))
    if unsafe:
        raise RunDirError(f"{run_dir}: {len(unsafe)} record(s) whose task or condition make no usable sample id, "
                          f"e.g. {unsafe[0][:80]!r} (letters, digits, '_', '.', '+', '-')")
    export = ExportStore(out)
    Path(out).mkdir(parents=True, exist_ok=True)
    clean_orphans(out)  # temporary files of a killed export
    with confined(out):
        return _export(store, manifest, records, by_id, export, run_dir, settings, execution, policy_options,
                       trust_run_dir, retry_errors)


def _export(store: RunStore, manifest: Dict[str, Any], records, by_id, export: ExportStore, run_dir, settings,
            execution: ExecutionConfig, policy_options, trust_run_dir: bool, retry_errors: bool) -> Dict[str, Any]:
    from robocasa_shift.study.executors import make_executor
    from robocasa_shift.study.runner import progress_iter

    export.ensure_settings({"settings": asdict(settings), "run_spec_hash": manifest.get("spec_hash"),
                            "run_created": manifest.get("created"), "policy": manifest.get("policy"),
                            "backend": manifest["backend"]})
    todo = []
    for sid, record in by_id.items():
        row = export.sample(sid)
        if row is None or (retry_errors or row.get("error")) and "excluded" in row:
            todo.append(record)
    unlogged = [r for r in todo if not r.get("step_log")]
    study = StudyConfig(backend=manifest["backend"], policy=manifest["policy"]["name"],
                        render_profile=manifest.get("render_profile", "fast"))
    if unlogged:
        why = rerun_refusal(manifest["policy"]["name"])
        if why is not None:
            raise StateUnsupported(
                f"{len(unlogged)} rollout(s) of {run_dir} have no step log, and policy {manifest['policy']['name']!r} "
                f"cannot be re-run here to render them: {why}. Record the study with --log-steps (then the export "
                f"replays the logged actions, no policy involved), or export only logged runs")
        study = study_from_manifest(manifest, policy_options, trust_run_dir)
    roles = CAMERA_CHOICES[settings.cameras]
    started = time.perf_counter()
    if todo:
        from robocasa_shift.core.specs import load_protocol

        protocol = load_protocol()
        jobs = [ExportJob(r, store.step_log(r).action if r.get("step_log") else None, roles, settings) for r in todo]
        executor = make_executor(study, execution.resolved())
        try:
            for result in progress_iter(executor.run_jobs(jobs), len(jobs), "samples", execution.progress):
                payload = result["export"]
                export.write_sample(payload, by_id[payload["sample_id"]], protocol)
        finally:
            executor.close()
    info = {"settings": asdict(settings),
            "source": {"run_dir": str(run_dir), "spec_hash": manifest.get("spec_hash"), "backend": manifest["backend"],
                       "policy": manifest.get("policy"), "render_profile": manifest.get("render_profile", "fast"),
                       "records_selected": len(records)},
            "wall_s_this_command": round(time.perf_counter() - started, 1), "made": len(todo)}
    return export.finish(by_id, info)


__all__ = ["CAMERA_CHOICES", "ExportJob", "ExportSettings", "ExportStore", "SAMPLE_FIELDS", "SAMPLE_ID", "STRATA",
           "export_judge", "frame_steps", "is_sample_id", "pair_id", "sample_id", "select", "stratum"]
