"""Localise-and-crop (FailBench Sec. 4.4) and video clips: what an export records so that a judge can be shown
the region that settles the attempt, or an MP4 instead of PNG frames.

**Localise.** FailBench asks a VLM for one rectangle around the outcome-relevant region of four frames
spanning the attempt. The simulator knows where the task's objects are, so the export records that
rectangle exactly: the task-relevant points (the objects and targets its stage spec names: ``object``,
``target``, ``support`` arguments), read through the environment's ``ObjectPoints`` capability (the backend
contract, ``core/backend.py``), projected into each third-person camera at every clip frame (pinhole
projection with the camera's pose and vertical field of view, as the renderer draws it), the bounding box over the whole clip of those the camera sees, widened by :data:`MARGIN`
of the image (at least :data:`MIN_MARGIN_PX`) and to at least :data:`MIN_SIDE` of it, inside the image (none
seen: no box, the image is shown whole). Wrist (moving)
cameras get no box and are shown whole, as in FailBench; so is every camera of a backend without the
capability.

**Crop.** ``JudgeSet.sample(..., crop=True)`` cuts every image of a camera with a box to that box, at its
own size (FailBench's best rendering, Table 9: the native cut).

**Video.** ``export-judge --video`` also writes each camera's clip as an MP4 (``mp4v``, :data:`VIDEO_FPS`
frames per second, the clip's fixed frame count: its duration does not give the outcome away);
``JudgeSet.sample(..., inputs="video")`` gives its bytes.
"""

from __future__ import annotations

import io
import os
import tempfile
from typing import Any, List, Optional, Sequence

import numpy as np

from robocasa_shift.core.backend import ObjectPoints

MARGIN = 0.12
MIN_MARGIN_PX = 12
MIN_SIDE = 0.25
VIDEO_FPS = 4


def relevant_points(env, stage_spec) -> List[np.ndarray]:
    """World positions (3,) of the task's outcome-relevant points now (see the module docstring)."""
    if not isinstance(env, ObjectPoints):
        return []
    names = stage_spec.point_names() if stage_spec is not None else []
    return [np.array(p, dtype=float).reshape(3) for p in env.outcome_points(names)]


def camera_frame(env, camera: str):
    """(position, rotation with columns camera x, y, z, vertical field of view in degrees), or None when the
    environment does not offer the ``ObjectPoints`` capability."""
    if not isinstance(env, ObjectPoints):
        return None
    pos, rot, fovy = env.camera_frame(camera)
    return np.asarray(pos, float).reshape(3), np.asarray(rot, float).reshape(3, 3), float(fovy)


def project(frame, size: int, points: Sequence[np.ndarray]) -> np.ndarray:
    """Pixel (column, row) of each point in a ``size`` x ``size`` image (top row first); NaN behind the camera."""
    pos, rot, fovy = frame
    t = np.tan(np.deg2rad(fovy) / 2.0)
    out = np.full((len(points), 2), np.nan)
    for i, p in enumerate(points):
        x, y, z = rot.T @ (np.asarray(p, float) - pos)  # camera frame: it looks along -z, y up
        if z >= -1e-6:
            continue
        out[i] = [((x / -z) / t + 1.0) * size / 2.0 - 0.5, (1.0 - (y / -z) / t) * size / 2.0 - 0.5]
    return out


def box(pixels: Sequence[np.ndarray], size: int) -> Optional[List[int]]:
    """The widened bounding box ``[x0, y0, x1, y1]`` (pixels, x1/y1 exclusive) of the projected points the camera
    sees (inside the image); None when it sees none, and the judge is shown the image whole.

    Points off the image are left out: a box built around them would be a sliver at the edge that shows none of
    what settles the attempt. A box clipped at an edge to less than :data:`MIN_SIDE` is widened inward again.
    """
    stacked = np.concatenate([np.asarray(p, float).reshape(-1, 2) for p in pixels]) if len(pixels) else np.zeros((0, 2))
    margin = max(MARGIN * size, MIN_MARGIN_PX)
    keep = np.isfinite(stacked).all(axis=1) & (stacked >= 0).all(axis=1) & (stacked < size).all(axis=1)
    if not keep.any():
        return None
    lo, hi = stacked[keep].min(axis=0) - margin, stacked[keep].max(axis=0) + margin + 1
    side = MIN_SIDE * size
    for axis in (0, 1):
        if hi[axis] - lo[axis] < side:
            centre = (hi[axis] + lo[axis]) / 2.0
            lo[axis], hi[axis] = centre - side / 2.0, centre + side / 2.0
    lo, hi = np.maximum(lo, 0.0), np.minimum(hi, float(size))
    for axis in (0, 1):  # clipped at an edge below the minimum side: widen it inward from that edge
        if hi[axis] - lo[axis] < side - 1e-6:
            if lo[axis] <= 0.0:
                hi[axis] = min(float(size), max(hi[axis], side))
            elif hi[axis] >= size:
                lo[axis] = max(0.0, min(lo[axis], size - side))
    x0, y0 = (int(max(0, np.floor(v))) for v in lo)
    x1, y1 = (int(min(size, np.ceil(v))) for v in hi)
    return [x0, y0, x1, y1] if x1 > x0 and y1 > y0 else None


# How a box is rendered into a judge's input (FailBench App. C, Table 9): the native cut (the main mode),
# the whole frame with everything outside the box blacked out, and the cut resized to the frame's size.
CROP_MODES = ("cut", "blackout", "upscaled")


def crop_mode(crop: Any) -> Optional[str]:
    """A crop setting as a mode: False/None -> None (full frames), True -> 'cut', a mode -> itself."""
    if crop in (None, False):
        return None
    if crop is True:
        return "cut"
    if crop not in CROP_MODES:
        raise ValueError(f"unknown crop mode {crop!r}; known: {', '.join(CROP_MODES)}")
    return crop


def crop_png(data: bytes, rect: Sequence[int], max_side: int = 4096, mode: str = "cut") -> bytes:
    """A PNG rendered to the box ``[x0, y0, x1, y1]``: cut at its own size (FailBench's native cut), the whole
    frame blacked out outside the box, or the cut resized (bicubic) to the frame's size; the same input gives
    the same bytes. An image that is not a PNG or has more than ``max_side`` pixels a side is refused."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as source:
        if source.format != "PNG" or max(source.size) > max_side:
            raise ValueError(f"not a PNG of at most {max_side} pixels a side")
        image = np.asarray(source.convert("RGB"))
    x0, y0, x1, y1 = (int(v) for v in rect)
    if not (0 <= x0 < x1 <= image.shape[1] and 0 <= y0 < y1 <= image.shape[0]):
        raise ValueError(f"box {list(rect)} is not inside a {image.shape[1]}x{image.shape[0]} image")
    if mode == "blackout":
        out = np.zeros_like(image)
        out[y0:y1, x0:x1] = image[y0:y1, x0:x1]
    else:
        out = np.ascontiguousarray(image[y0:y1, x0:x1], dtype=np.uint8)
        if mode == "upscaled":
            out = np.asarray(Image.fromarray(out).resize((image.shape[1], image.shape[0]), Image.BICUBIC))
        elif mode != "cut":
            raise ValueError(f"unknown crop mode {mode!r}; known: {', '.join(CROP_MODES)}")
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(out, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def mp4_bytes(frames: Sequence[np.ndarray], fps: int = VIDEO_FPS) -> bytes:
    """uint8 RGB frames as an MP4 (``mp4v``; the same frames give the same bytes)."""
    import cv2

    frames = [np.ascontiguousarray(f, dtype=np.uint8) for f in frames]
    height, width = frames[0].shape[:2]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "clip.mp4")
        writer = cv2.VideoWriter(path, cv2.VideoWriter_fourcc(*"mp4v"), float(fps), (width, height))
        if not writer.isOpened():
            raise RuntimeError("OpenCV cannot write MP4 (mp4v) here")
        try:
            for frame in frames:
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        finally:
            writer.release()
        with open(path, "rb") as handle:
            return handle.read()


def is_mp4(data: bytes) -> bool:
    """An ISO base media file (its first box is ``ftyp``)."""
    return len(data) >= 12 and data[4:8] == b"ftyp"


__all__ = ["MARGIN", "MIN_SIDE", "VIDEO_FPS", "box", "camera_frame", "crop_png", "is_mp4", "mp4_bytes", "project",
           "relevant_points"]
