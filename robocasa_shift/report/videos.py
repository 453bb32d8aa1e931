"""Paired videos: chosen pairs written side by side as MP4 files, from logged frames or re-run with frame capture.

A run made with ``--log-frames`` kept every formal rollout's third-person frames beside its record
(:mod:`robocasa_shift.core.framelog`): a pair whose two logs are there, unchanged (the SHA-256 its records
hold), is filmed from them with no simulator at all. Otherwise, rollouts being deterministic given their
key, the pair is re-run (:mod:`robocasa_shift.engine.replay`); the re-run must reproduce the recorded
outcome and subgoal completion steps exactly, and the page says so when it does not.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.backends import get_backend
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.framelog import FrameLogError
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.specs import load_stage_spec
from robocasa_shift.engine.replay import FrameCapture, Replayer
from robocasa_shift.extras import require
from robocasa_shift.policies import POLICIES
from robocasa_shift.rundir.files import atomic_write_bytes
from robocasa_shift.rundir.store import RunStore

VIDEO_SCALE = 2  # frames are upscaled for viewing
MIN_PANEL_WIDTH = 320  # small frames (the fake backend's 64 px) are upscaled further, so the overlay text has room
VIDEO_FPS = 20  # the control rate: videos play in real time
MARGIN = 6  # pixels of white left of and right of every overlay line


def panel_scale(frame_width: int) -> int:
    """The integer upscaling of a frame: at least :data:`VIDEO_SCALE`, and enough for :data:`MIN_PANEL_WIDTH`."""
    return max(VIDEO_SCALE, -(-MIN_PANEL_WIDTH // max(int(frame_width), 1)))


def put_fitted(image: np.ndarray, text: str, origin: Tuple[int, int], scale: float, color, thickness: int = 1) -> None:
    """``cv2.putText``, the font shrunk until the line ends :data:`MARGIN` pixels inside the image (never cut)."""
    import cv2

    font = cv2.FONT_HERSHEY_SIMPLEX
    room = image.shape[1] - origin[0] - MARGIN
    while scale > 0.2 and cv2.getTextSize(text, font, scale, thickness)[0][0] > room:
        scale *= 0.9
    cv2.putText(image, text, origin, font, scale, color, thickness, cv2.LINE_AA)


def _panel(frames: List[np.ndarray], title: str, goals: List[str], done: Dict[str, int], step: int, flash: bool,
           outcome: Optional[str]) -> np.ndarray:
    import cv2

    scale = panel_scale(frames[0].shape[1])
    tiles = [cv2.resize(f, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST) for f in frames]
    body = np.concatenate(tiles, axis=0)
    if flash:
        cv2.rectangle(body, (0, 0), (body.shape[1] - 1, body.shape[0] - 1), (60, 200, 60), 6)
    w = body.shape[1]
    head = np.full((28, w, 3), 255, np.uint8)
    put_fitted(head, f"{title}  step {step}", (MARGIN, 19), 0.5, (0, 0, 0))
    foot = np.full((18 * len(goals) + 30, w, 3), 255, np.uint8)
    for i, g in enumerate(goals):
        ok = g in done
        color = (40, 150, 40) if ok else (150, 150, 150)
        text = f"{'[x]' if ok else '[ ]'} g{i + 1} {g}" + (f" @{done[g]}" if ok else "")
        put_fitted(foot, text, (MARGIN, 16 + 18 * i), 0.42, color)
    if outcome:
        color = (40, 150, 40) if outcome == "SUCCESS" else (200, 40, 40)
        put_fitted(foot, outcome, (MARGIN, 18 * len(goals) + 22), 0.6, color, 2)
    return np.concatenate([head, body, foot], axis=0)


def stage_steps_text(goals: List[str], steps: List[Optional[int]]) -> str:
    """Subgoal steps in words: ``g1 grasp_object @7, g2 carry_to_target not reached``."""
    return ", ".join(f"g{i + 1} {g} " + ("not reached" if s is None else f"@{s}")
                     for i, (g, s) in enumerate(zip(goals, steps)))


def compose_video(path: Path, left: FrameCapture, right: FrameCapture, titles: Tuple[str, str], goals: List[str],
                  outcomes: Tuple[bool, bool]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="robocasa-shift-video-") as scratch:
        # ffmpeg writes to a private folder; the finished file goes through the one safe writer
        encoded = Path(scratch) / f"video{Path(path).suffix}"
        _encode(encoded, left, right, titles, goals, outcomes)
        atomic_write_bytes(path, encoded.read_bytes())


def _encode(path: Path, left: FrameCapture, right: FrameCapture, titles: Tuple[str, str], goals: List[str],
            outcomes: Tuple[bool, bool]) -> None:
    import imageio.v2 as imageio

    n = max(len(left.frames), len(right.frames))
    writer = imageio.get_writer(path, fps=VIDEO_FPS, codec="libx264", quality=7, macro_block_size=1,
                                ffmpeg_log_level="error", pixelformat="yuv420p")
    try:
        for t in range(n):
            panels = []
            for cap, title, success in zip((left, right), titles, outcomes):
                i = min(t, len(cap.frames) - 1)
                done = {g: s for s, g in cap.latched if s <= i}
                flash = any(s == i for s, _ in cap.latched)
                end = i == len(cap.frames) - 1
                panels.append(_panel(cap.frames[i], title, goals, done, i, flash, ("SUCCESS" if success else "FAILURE") if end else None))
            frame = np.concatenate([panels[0], np.full((panels[0].shape[0], 8, 3), 255, np.uint8), panels[1]], axis=1)
            if frame.shape[0] % 2 or frame.shape[1] % 2:  # yuv420p needs even sizes
                frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), constant_values=255)
            writer.append_data(frame)
    finally:
        writer.close()


def select_pairs(df: pd.DataFrame, per_kind: int = 2) -> List[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
    """Up to ``per_kind`` S->F and F->S pairs, preferring different conditions and tasks."""
    if df.empty:  # no records: not even the columns
        return []
    df = df[(df["phase"] == "formal") & (df["replicate"] == 0) & df["valid"]]
    clean = df[df["condition"] == "clean"].set_index(["task", "episode"])
    chosen = []
    for kind, (c_ok, p_ok) in (("S->F", (True, False)), ("F->S", (False, True))):
        used_conditions, used_tasks, picked = set(), set(), []
        candidates = []
        for _, row in df[df["condition"] != "clean"].iterrows():
            key = (row["task"], row["episode"])
            if key in clean.index and bool(clean.loc[key, "success"]) == c_ok and bool(row["success"]) == p_ok:
                candidates.append((row["condition"], row["task"], int(row["episode"]), row, clean.loc[key]))
        # severe conditions first, then spread over conditions and tasks
        candidates.sort(key=lambda c: (-max(s.level_index for s in Condition.parse(c[0]).shifts), c[0], c[1], c[2]))
        for cond, task, ep, row, twin in candidates:
            if len(picked) == per_kind:
                break
            if cond in used_conditions and task in used_tasks and len(candidates) > per_kind:
                continue
            used_conditions.add(cond)
            used_tasks.add(task)
            picked.append((kind, twin.to_dict() | {"task": task, "episode": ep}, row.to_dict()))
        chosen += picked
    return chosen


def records_digest(clean: Mapping[str, Any], perturbed: Mapping[str, Any]) -> str:
    """SHA-256 of a pair's two stored records (canonical JSON): a kept video belongs to exactly these records."""
    text = json.dumps([clean, perturbed], sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# A kept entry of report/videos.json: these fields, these types (anything else and the pair is filmed again).
KEPT_FIELDS = {"file": str, "kind": str, "task": str, "episode": int, "condition": str, "reproduced": bool,
               "problems": list, "records_sha256": str}
SOURCES = ("logged", "re-run")  # where a video's frames came from: the run's frame logs, or a re-run


def _earlier_videos(run_dir: Path, out: Path) -> Dict[str, Dict[str, Any]]:
    """The previous report's video entries by file name, each checked field by field; {} when there is none or
    it is not one (the file is data from the run directory: a forged one costs a re-run, never a wrong video)."""
    from robocasa_shift.errors import RunDirError
    from robocasa_shift.rundir.files import MAX_JSON_BYTES, is_regular_file, read_json

    path = out / "videos.json"
    if not is_regular_file(path, run_dir):
        return {}
    try:
        entries = read_json(path, run_dir, MAX_JSON_BYTES, "earlier report's video list")
    except RunDirError:
        return {}
    kept = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and all(isinstance(entry.get(k), t) and not (t is int and isinstance(entry.get(k), bool))
                                           for k, t in KEPT_FIELDS.items()) \
                and all(isinstance(p, str) for p in entry["problems"]) and is_regular_file(out / entry["file"], run_dir):
            # a list written before frames were logged has no source: its videos were re-run
            kept[entry["file"]] = {**{k: entry[k] for k in KEPT_FIELDS},
                                   "source": entry["source"] if entry.get("source") in SOURCES else "re-run"}
    return kept


def _logged_captures(store: RunStore, clean: Mapping[str, Any], perturbed: Mapping[str, Any]
                     ) -> Optional[Tuple[FrameCapture, FrameCapture]]:
    """The pair's frames as the run logged them (``--log-frames``), or None when either record has none or its file
    is missing, changed since it was written or not a frame log (the pair is then re-run, as without logs)."""
    captures = []
    for record in (clean, perturbed):
        try:
            log = store.frame_log(record)
        except FrameLogError:
            log = None
        if log is None or log.steps != record.get("steps"):
            return None
        capture = FrameCapture(list(log.meta["cameras"]), int(log.delta.shape[2]))
        capture.frames = list(log.frames)
        capture.latched = sorted((step, name) for name, step in zip(record.get("stage_names") or [],
                                                                     record.get("stage_steps") or [])
                                 if isinstance(step, int))
        captures.append(capture)
    return captures[0], captures[1]


def _has_logged_frames(store: RunStore, clean: Mapping[str, Any], perturbed: Mapping[str, Any]) -> bool:
    """Both records name a frame log whose file is there with the size and SHA-256 they hold (nothing decoded)."""
    try:
        return all(store.frame_log_bytes(r) is not None for r in (clean, perturbed))
    except FrameLogError:
        return False


def _plan(run_dir: Path, df: pd.DataFrame, out: Path, per_kind: int) -> List[Tuple[List[RolloutKey], Dict[str, Any]]]:
    """The selected pairs, each with its keys and its entry: ``kept`` (the previous report filmed these same two
    records), ``source`` ``logged`` (the run logged both rollouts' frames) or ``re-run``."""
    pairs = select_pairs(df, per_kind)
    if not pairs:
        return []
    store = RunStore(run_dir)
    manifest = store.manifest() or {}
    if (manifest.get("policy") or {}).get("driver"):  # an external loop (robocasa_shift.gym): nothing to re-run
        return []
    stored = {RolloutKey.from_record(r): r for r in store.records()}
    earlier = _earlier_videos(run_dir, out)
    plan = []
    for n, (kind, clean_row, pert_row) in enumerate(pairs, start=1):
        task, ep, cond = clean_row["task"], int(clean_row["episode"]), pert_row["condition"]
        keys = [RolloutKey("formal", task, ep, c) for c in ("clean", cond)]
        digest = records_digest(stored[keys[0]], stored[keys[1]])
        name = f"pair_{n}_{task}_{ep:04d}_{cond.replace(':', '-').replace('+', '_')}.mp4"
        entry = {"file": name, "kind": kind, "task": task, "episode": ep, "condition": cond, "records_sha256": digest,
                 "clean_stage_steps": stored[keys[0]].get("stage_steps"),
                 "perturbed_stage_steps": stored[keys[1]].get("stage_steps"),
                 "subgoals": load_stage_spec(manifest["backend"], task).names,
                 "source": "logged" if _has_logged_frames(store, stored[keys[0]], stored[keys[1]]) else "re-run"}
        before = earlier.get(name)
        same = before is not None and all(before[k] == entry[k] for k in ("kind", "task", "episode", "condition",
                                                                           "records_sha256"))
        plan.append((keys, {**entry, **({"reproduced": before["reproduced"], "problems": before["problems"],
                                         "source": before["source"], "kept": True} if same else {})}))
    return plan


def check_video_dependencies(run_dir: Path, manifest: Mapping[str, Any], df: pd.DataFrame, per_kind: int) -> None:
    """Before the report writes anything: what filming its pairs needs, installed (imageio with ffmpeg; and the run's
    backend and the optional modules its policy ``requires`` when a pair must be re-run: one neither kept from the
    previous report nor logged by the run).

    Raises:
        DependencyMissing: the ``report`` extra, or the extra the backend or policy needs (``--videos 0`` leaves the
            videos out).
        BackendUnavailable: the run's backend cannot run here.
    """
    policy = manifest.get("policy") if isinstance(manifest.get("policy"), dict) else {}
    if per_kind <= 0 or policy.get("driver") or not select_pairs(df, per_kind):
        return
    purpose = "the report's pair videos (--videos 0 leaves them out)"
    require("imageio", "report", purpose)
    require("imageio_ffmpeg", "report", purpose)
    if all(entry.get("kept") or entry["source"] == "logged" for _, entry in _plan(run_dir, df, run_dir / "report",
                                                                                  per_kind)):
        return
    get_backend(str(manifest.get("backend"))).check_available()
    for module, extra in getattr(POLICIES.get(str(policy.get("name"))), "requires", ()):
        require(module, extra, f"{purpose}, which re-run policy {policy.get('name')!r},")


def make_videos(run_dir: Path, df: pd.DataFrame, out: Path, per_kind: int = 2,
                policy_options: Optional[Mapping[str, Any]] = None, trust_run_dir: bool = False,
                progress: bool = False) -> List[Dict[str, Any]]:
    """Write one side-by-side MP4 per selected pair: from the frames the run logged (``--log-frames``) where both
    rollouts have them, else by re-running the pair with frame capture.

    A pair the previous report already filmed from the same two records (``records_sha256``) keeps its video:
    a report made again, or of a copied run, films nothing it has. ``progress``: a bar on stderr with the
    pairs filmed and the time left.
    """
    from tqdm import tqdm

    plan = _plan(run_dir, df, out, per_kind)
    todo = [(keys, entry) for keys, entry in plan if not entry.get("kept")]
    if not todo:
        return [entry for _, entry in plan]
    store = RunStore(run_dir)
    manifest = store.manifest() or {}
    stored = {RolloutKey.from_record(r): r for r in store.records()}
    rerun = []
    for keys, entry in todo:
        logged = _logged_captures(store, stored[keys[0]], stored[keys[1]]) if entry["source"] == "logged" else None
        if logged is None:
            entry["source"] = "re-run"
            rerun.append((keys, entry))
            continue
        clean, perturbed = logged
        compose_video(out / entry["file"], clean, perturbed, ("clean", entry["condition"]), entry["subgoals"],
                      (bool(stored[keys[0]].get("success")), bool(stored[keys[1]].get("success"))))
        entry.update({"reproduced": True, "problems": [], "kept": False})
    if rerun:
        bar = tqdm(total=len(rerun), desc="pair videos (2 rollouts re-run each)", unit="pair", disable=not progress,
                   dynamic_ncols=True)
        with Replayer(manifest, policy_options, trust_run_dir) as replayer, bar:
            for keys, entry in rerun:
                clean, perturbed = replayer.replay_all(keys, stored)
                compose_video(out / entry["file"], clean.capture, perturbed.capture, ("clean", entry["condition"]),
                              entry["subgoals"], (bool(clean.record.success), bool(perturbed.record.success)))
                entry.update({"reproduced": clean.reproduced and perturbed.reproduced,
                              "problems": clean.problems + perturbed.problems, "kept": False,
                              "clean_stage_steps": clean.record.stage_steps,
                              "perturbed_stage_steps": perturbed.record.stage_steps})
                bar.update(1)
    return [entry for _, entry in plan]
