"""Reading a judge set (an export directory): its manifest checked against its hash, its images against theirs.

What a judge is given is a :class:`JudgeSample`: the instruction, the task's name
and the images it asked for. The label, the stage depth, the condition and the
pairing stay with the scorer (``JudgeSet.table``).
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift.errors import RunDirError, UnknownNameError
from robocasa_shift.judging.export import (
    EXPORT_JSON,
    FAILURE_ORIGINS,
    FORMAT,
    MANIFEST,
    SAMPLE_ID,
    STRATA,
    VERSION,
    is_sample_id,
)
from robocasa_shift.rundir.files import (
    MAX_FILE_BYTES,
    MAX_IMAGE_BYTES,
    MAX_JSON_BYTES,
    inside,
    read_bytes,
)

# What a judge may ask for: the end frames, the start and end frames, the whole clip (start and end included), or
# the clip as an MP4 per camera (judge sets exported with --video).
INPUTS = ("end", "start_end", "clip", "video")
# The largest image a judge is given (pixels per side); export-judge makes at most 1024.
MAX_IMAGE_SIDE = 4096
ROLES = ("third_person", "wrist")
_STR, _INT = (str,), (int,)
# Row fields and their types (None: may be null); what the judges and the scorer read.
ROW_FIELDS: Dict[str, tuple] = {
    "sample_id": _STR, "instruction": _STR, "task": _STR, "condition": _STR, "factor": _STR, "level": (str, None),
    "episode": _INT, "replicate": _INT, "pair_id": _STR, "episode_key": _STR, "success": (bool,), "stratum": _STR,
    "n_stages": _INT, "stages_completed": _INT, "first_incomplete": (int, None), "steps": _INT, "horizon": _INT,
    "cameras": (dict,), "clip": (dict,), "start": (dict,), "end": (dict,), "media_sha256": (dict,),
    "failure_origin": (str, None),
}


def row_problem(row: Any) -> Optional[str]:
    """What makes ``row`` (one line of a judge set's manifest) unusable, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    if not is_sample_id(row.get("sample_id")):
        return (f"sample_id {str(row.get('sample_id'))[:60]!r} is not a sample id (letters, digits, '_', '.', '+', "
                f"'-'; at most 200)")
    for name, allowed in ROW_FIELDS.items():
        value = row.get(name)
        ok = (value is None and None in allowed) or (
            value is not None and not (isinstance(value, bool) and bool not in allowed)
            and any(t is not None and isinstance(value, t) for t in allowed))
        if not ok:
            return f"field {name!r} is {json.dumps(value)[:60]}"
    if row.get("failure_origin") not in (None, *FAILURE_ORIGINS):
        return f"field 'failure_origin' is {json.dumps(row['failure_origin'])[:60]}; one of {', '.join(FAILURE_ORIGINS)}"
    if row["stratum"] not in STRATA or row["horizon"] < 1 or min(row["steps"], row["n_stages"], row["stages_completed"]) < 0:
        return "stratum, horizon, steps or stage counts out of range"
    cameras = row["cameras"]
    if not cameras or not all(isinstance(c, str) and role in ROLES for c, role in cameras.items()):
        return f"cameras must map camera names to {' or '.join(ROLES)}"
    images = [*row["start"].items(), *row["end"].items(),
              *((c, p) for c, paths in row["clip"].items() for p in (paths if isinstance(paths, list) else [None]))]
    if set(row["start"]) != set(cameras) or set(row["end"]) != set(cameras) or set(row["clip"]) != set(cameras) \
            or any(not row["clip"][c] for c in cameras):
        return "start, end and clip must name images of every camera"
    hashes = row["media_sha256"]
    for _, relative in images:
        if not isinstance(relative, str) or not isinstance(hashes.get(relative), str):
            return f"image {str(relative)[:80]!r} has no hash in media_sha256"
    return _optional_problem(row, cameras, hashes)


def _optional_problem(row: Mapping[str, Any], cameras: Mapping[str, str], hashes: Mapping[str, Any]) -> Optional[str]:
    """What is wrong with a row's optional ``boxes`` (camera -> [x0, y0, x1, y1] or null) and ``video``
    (camera -> an MP4 path with a hash), or None."""
    boxes = row.get("boxes", {})
    if not isinstance(boxes, dict) or not set(boxes) <= set(cameras):
        return "boxes must map cameras of the sample to a box or null"
    for rect in boxes.values():
        if rect is not None and not (isinstance(rect, list) and len(rect) == 4
                                     and all(isinstance(v, int) and not isinstance(v, bool) for v in rect)
                                     and 0 <= rect[0] < rect[2] <= MAX_IMAGE_SIDE
                                     and 0 <= rect[1] < rect[3] <= MAX_IMAGE_SIDE):
            return f"box {json.dumps(rect)[:60]} is not [x0, y0, x1, y1] inside an image"
    video = row.get("video", {})
    if not isinstance(video, dict) or not set(video) <= set(cameras):
        return "video must map cameras of the sample to MP4 files"
    for relative in video.values():
        if not isinstance(relative, str) or not relative.endswith(".mp4") or not isinstance(hashes.get(relative), str):
            return f"video {str(relative)[:80]!r} has no hash in media_sha256"
    return None


class JudgeSetError(RunDirError):
    """A judge set that is incomplete or changed since it was exported."""


@dataclass
class JudgeSample:
    """One sample as a judge sees it.

    Attributes:
        sample_id: the sample's name (a predictions file's key).
        instruction: the task's language instruction.
        task: the backend's name of the task.
        cameras: camera name -> role (``third_person`` or ``wrist``), third-person first.
        images: ``start`` / ``end`` -> camera -> PNG bytes, and ``clip`` -> camera -> list of PNG bytes
            (only what the judge's ``inputs`` asked for).
    """

    sample_id: str
    instruction: str
    task: str
    cameras: Dict[str, str]
    images: Dict[str, Any] = field(default_factory=dict)

    def frame(self, which: str, camera: str) -> np.ndarray:
        """The ``start`` or ``end`` frame of ``camera`` as a uint8 (H, W, 3) array."""
        return decode_png(self.images[which][camera])

    def clip(self, camera: str) -> List[np.ndarray]:
        """The clip of ``camera`` (frames in time order, the end frame last)."""
        return [decode_png(data) for data in self.images["clip"][camera]]


def camera_order(cameras: Mapping[str, str]) -> List[str]:
    """Camera names of a sample, third-person first, then by name (the order judges stack them in)."""
    return sorted(cameras, key=lambda c: (cameras[c] != "third_person", c))


def decode_png(data: bytes) -> np.ndarray:
    """A PNG's pixels as uint8 (H, W, 3); its size is checked before anything is decompressed.

    Raises:
        JudgeSetError: not a PNG, a PNG that cannot be decoded, or more than :data:`MAX_IMAGE_SIDE` per side.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "PNG":
                raise JudgeSetError(f"an image of the judge set is {image.format}, not PNG")
            if max(image.size) > MAX_IMAGE_SIDE:
                raise JudgeSetError(f"an image of the judge set is {image.size[0]}x{image.size[1]} pixels, more "
                                    f"than {MAX_IMAGE_SIDE} per side")
            return np.asarray(image.convert("RGB"))
    except JudgeSetError:
        raise
    except Exception as exc:  # PIL raises many kinds on a forged file (incl. DecompressionBombError)
        raise JudgeSetError(f"an image of the judge set cannot be decoded ({type(exc).__name__}: "
                            f"{str(exc)[:200]})") from None


class JudgeSet:
    """An export directory, read and checked: ``manifest.jsonl`` must hash to ``export.json``'s ``export_hash``.

    Every file is read as a shared directory's files are (``rundir.files.read_bytes``: regular files
    reached without a link, never blocking, size-capped), and every row is checked (:func:`row_problem`:
    a well-formed ``sample_id``, fields of their types, a hash for every image) before anything uses it.

    Raises:
        JudgeSetError: not an export directory (no ``export.json``), another format, a manifest that changed,
            or a row that is not a sample (the message names the line).
    """

    def __init__(self, root: Path | str):
        self.root = Path(root)
        path = self.root / EXPORT_JSON
        texts = []
        for name, cap in ((EXPORT_JSON, MAX_JSON_BYTES), (MANIFEST, MAX_FILE_BYTES)):
            try:
                texts.append(read_bytes(self.root / name, self.root, cap, f"judge set's {name}"))
            except FileNotFoundError:
                raise JudgeSetError(f"{self.root}: no {name}; not a judge set "
                                    f"(make one with `robocasa-shift export-judge RUN_DIR --out DIR`)") from None
            except OSError as exc:
                raise JudgeSetError(f"{self.root / name}: cannot be read ({exc.strerror or exc})") from None
        try:
            self.info: Dict[str, Any] = json.loads(texts[0].decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise JudgeSetError(f"{path}: not JSON ({str(exc)[:200]})") from None
        if not isinstance(self.info, dict):
            raise JudgeSetError(f"{path}: not a JSON object")
        text = texts[1]
        if self.info.get("format") != FORMAT or self.info.get("version") != VERSION:
            raise JudgeSetError(f"{path}: format {str(self.info.get('format'))[:80]!r} version "
                                f"{str(self.info.get('version'))[:20]!r}, expected {FORMAT!r} version {VERSION}")
        found = hashlib.sha256(text).hexdigest()
        if found != self.info.get("export_hash"):
            raise JudgeSetError(f"{self.root / MANIFEST} changed since it was exported: sha256 {found}, "
                                f"export.json holds {str(self.info.get('export_hash'))[:64]}")
        source = self.info.get("source")
        if not (isinstance(source, dict) and isinstance(source.get("backend"), str)):
            raise JudgeSetError(f"{path}: no source backend")
        self.rows: List[Dict[str, Any]] = []
        for number, line in enumerate(text.decode("utf-8", errors="replace").splitlines(), start=1):
            if not line:
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError) as exc:
                raise JudgeSetError(f"{self.root / MANIFEST}, line {number}: not JSON ({str(exc)[:120]})") from None
            problem = row_problem(row)
            if problem:
                raise JudgeSetError(f"{self.root / MANIFEST}, line {number}: {problem}; not a sample of a judge set")
            self.rows.append(row)
        self.by_id = {row["sample_id"]: row for row in self.rows}
        if len(self.by_id) != len(self.rows):
            raise JudgeSetError(f"{self.root / MANIFEST}: a sample_id appears more than once")

    @property
    def export_hash(self) -> str:
        return self.info["export_hash"]

    def table(self):
        """One row per sample with the scorer's columns (label, stratum, condition, pairing), as a DataFrame."""
        import pandas as pd

        columns = ["sample_id", "task", "condition", "factor", "level", "episode", "replicate", "pair_id",
                   "episode_key", "success", "stratum", "n_stages", "stages_completed", "first_incomplete", "steps",
                   "horizon", "failure_origin"]
        return pd.DataFrame([{c: row.get(c) for c in columns} for row in self.rows], columns=columns)

    def image_bytes(self, row: Mapping[str, Any], relative: str) -> bytes:
        """An image of ``row``, checked against the hash the manifest holds for it.

        Only a regular file inside the set is read: an absolute path, a ``..``, a symbolic link (anywhere on
        the way), a FIFO or device, or a file over ``MAX_IMAGE_BYTES`` is refused before it is opened or read.
        """
        try:
            path = inside(self.root, relative, "image")
        except OSError:
            raise JudgeSetError(f"{self.root / MANIFEST}: sample {row['sample_id']} names an image outside the set") from None
        try:
            data = read_bytes(path, self.root, MAX_IMAGE_BYTES, "judge-set image")
        except OSError as exc:
            raise JudgeSetError(f"{path}: cannot read an image of sample {row['sample_id']} ({exc.strerror})") from None
        if hashlib.sha256(data).hexdigest() != row["media_sha256"].get(relative):
            raise JudgeSetError(f"{path}: image changed since it was exported (its hash is not the manifest's)")
        return data

    def sample(self, sample_id: str, inputs: str = "end", crop: Any = False,
               boxes: Optional[Mapping[str, Any]] = None) -> JudgeSample:
        """What a judge that reads ``inputs`` (one of :data:`INPUTS`) is given for ``sample_id``.

        With ``crop`` (localise-and-crop, ``judging/crops.py``: True or a mode of ``CROP_MODES``), every image of
        a camera the export gave a box is rendered to it (wrist cameras, and cameras without a box, whole);
        ``video`` cannot be cropped. ``boxes`` (camera -> box or None) replaces the export's boxes: a localiser's
        (``judging/localiser.py``).
        """
        from robocasa_shift.judging.crops import crop_mode

        crop = crop_mode(crop)
        if boxes is not None and crop is None:  # a localiser's boxes crop with the native cut unless told otherwise
            crop = "cut"
        if inputs not in INPUTS:
            raise UnknownNameError("judge input", inputs, list(INPUTS))
        row = self.by_id[sample_id]
        images: Dict[str, Any] = {}
        if inputs == "video":
            if crop:
                raise JudgeSetError("video input cannot be cropped; crop PNG inputs (end, start_end, clip)")
            if not row.get("video"):
                raise JudgeSetError(f"sample {sample_id} has no video: export the judge set with --video")
            images["video"] = {c: self.image_bytes(row, p) for c, p in row["video"].items()}
        elif inputs == "clip":
            images["clip"] = {c: [self.image_bytes(row, p) for p in paths] for c, paths in row["clip"].items()}
            images["start"] = {c: frames[0] for c, frames in images["clip"].items()}
            images["end"] = {c: frames[-1] for c, frames in images["clip"].items()}
        else:
            images["end"] = {c: self.image_bytes(row, p) for c, p in row["end"].items()}
            if inputs == "start_end":
                images["start"] = {c: self.image_bytes(row, p) for c, p in row["start"].items()}
        if crop:
            from robocasa_shift.judging.crops import crop_png

            if boxes is None:
                boxes = row.get("boxes") or {}
                if not boxes and "boxes" not in row:
                    raise JudgeSetError(f"sample {sample_id} has no boxes: export the judge set again to crop it")

            def cut(data: bytes, camera: str, rect) -> bytes:
                try:
                    return crop_png(data, rect, mode=crop)
                except Exception as exc:  # PIL raises many kinds on a forged file (a truncated PNG: OSError)
                    raise JudgeSetError(f"sample {sample_id}: an image of camera {camera} cannot be cropped "
                                        f"({type(exc).__name__}: {str(exc)[:200]})") from None

            for which, by_camera in images.items():
                for camera, rect in boxes.items():
                    if rect is None or camera not in by_camera:
                        continue
                    value = by_camera[camera]
                    by_camera[camera] = [cut(d, camera, rect) for d in value] if isinstance(value, list) \
                        else cut(value, camera, rect)
        cameras = {c: row["cameras"][c] for c in camera_order(row["cameras"])}
        return JudgeSample(sample_id, row["instruction"], row["task"], cameras, images)

    def samples(self, sample_ids: Optional[Sequence[str]] = None, inputs: str = "end",
                crop: Any = False, boxes: Optional[Mapping[str, Mapping[str, Any]]] = None) -> List[JudgeSample]:
        ids = sample_ids if sample_ids is not None else list(self.by_id)
        return [self.sample(sid, inputs, crop, None if boxes is None else boxes[sid]) for sid in ids]


__all__ = ["INPUTS", "SAMPLE_ID", "JudgeSample", "JudgeSet", "JudgeSetError", "camera_order", "decode_png",
           "is_sample_id", "row_problem"]
