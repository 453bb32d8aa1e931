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
from robocasa_shift.judging.export import EXPORT_JSON, FORMAT, MANIFEST, VERSION

# What a judge may ask for: the end frames, the start and end frames, or the whole clip (start and end included).
INPUTS = ("end", "start_end", "clip")


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
    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        if image.format != "PNG":
            raise JudgeSetError(f"an image of the judge set is {image.format}, not PNG")
        return np.asarray(image.convert("RGB"))


class JudgeSet:
    """An export directory, read and checked: ``manifest.jsonl`` must hash to ``export.json``'s ``export_hash``.

    Raises:
        JudgeSetError: not an export directory (no ``export.json``), another format, or a manifest that changed.
    """

    def __init__(self, root: Path | str):
        self.root = Path(root)
        path = self.root / EXPORT_JSON
        try:
            self.info: Dict[str, Any] = json.loads(path.read_text())
            text = (self.root / MANIFEST).read_bytes()
        except FileNotFoundError as exc:
            raise JudgeSetError(f"{self.root}: no {Path(exc.filename).name}; not a judge set "
                                f"(make one with `robocasa-shift export-judge RUN_DIR --out DIR`)") from None
        except ValueError as exc:
            raise JudgeSetError(f"{path}: not JSON ({exc})") from None
        if self.info.get("format") != FORMAT or self.info.get("version") != VERSION:
            raise JudgeSetError(f"{path}: format {self.info.get('format')!r} version {self.info.get('version')!r}, "
                                f"expected {FORMAT!r} version {VERSION}")
        found = hashlib.sha256(text).hexdigest()
        if found != self.info.get("export_hash"):
            raise JudgeSetError(f"{self.root / MANIFEST} changed since it was exported: sha256 {found}, "
                                f"export.json holds {self.info.get('export_hash')}")
        self.rows: List[Dict[str, Any]] = [json.loads(line) for line in text.decode().splitlines() if line]
        self.by_id = {row["sample_id"]: row for row in self.rows}

    @property
    def export_hash(self) -> str:
        return self.info["export_hash"]

    def table(self):
        """One row per sample with the scorer's columns (label, stratum, condition, pairing), as a DataFrame."""
        import pandas as pd

        columns = ["sample_id", "task", "condition", "factor", "level", "episode", "replicate", "pair_id",
                   "episode_key", "success", "stratum", "n_stages", "stages_completed", "first_incomplete", "steps",
                   "horizon"]
        return pd.DataFrame([{c: row.get(c) for c in columns} for row in self.rows], columns=columns)

    def image_bytes(self, row: Mapping[str, Any], relative: str) -> bytes:
        """An image of ``row``, checked against the hash the manifest holds for it."""
        path = self.root / relative
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise JudgeSetError(f"{self.root / MANIFEST}: sample {row['sample_id']} names an image outside the set")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise JudgeSetError(f"{path}: cannot read an image of sample {row['sample_id']} ({exc.strerror})") from None
        if hashlib.sha256(data).hexdigest() != row["media_sha256"].get(relative):
            raise JudgeSetError(f"{path}: image changed since it was exported (its hash is not the manifest's)")
        return data

    def sample(self, sample_id: str, inputs: str = "end") -> JudgeSample:
        """What a judge that reads ``inputs`` (one of :data:`INPUTS`) is given for ``sample_id``."""
        if inputs not in INPUTS:
            raise UnknownNameError("judge input", inputs, list(INPUTS))
        row = self.by_id[sample_id]
        images: Dict[str, Any] = {}
        if inputs == "clip":
            images["clip"] = {c: [self.image_bytes(row, p) for p in paths] for c, paths in row["clip"].items()}
            images["start"] = {c: frames[0] for c, frames in images["clip"].items()}
            images["end"] = {c: frames[-1] for c, frames in images["clip"].items()}
        else:
            images["end"] = {c: self.image_bytes(row, p) for c, p in row["end"].items()}
            if inputs == "start_end":
                images["start"] = {c: self.image_bytes(row, p) for c, p in row["start"].items()}
        cameras = {c: row["cameras"][c] for c in camera_order(row["cameras"])}
        return JudgeSample(sample_id, row["instruction"], row["task"], cameras, images)

    def samples(self, sample_ids: Optional[Sequence[str]] = None, inputs: str = "end") -> List[JudgeSample]:
        return [self.sample(sid, inputs) for sid in (sample_ids if sample_ids is not None else list(self.by_id))]


__all__ = ["INPUTS", "JudgeSample", "JudgeSet", "JudgeSetError", "camera_order", "decode_png"]
