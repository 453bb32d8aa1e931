"""A localiser's boxes of a judge set (``SET/boxes/NAME.json``): where they live and how they are read.

Written by ``robocasa-shift localise`` (``judging/localiser.py``), read by ``judge --boxes NAME``; read as
untrusted, like every file of a shared judge set.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from robocasa_shift.errors import BadInput
from robocasa_shift.judging.judgeset import JudgeSet, JudgeSetError, is_sample_id
from robocasa_shift.rundir.files import MAX_JSON_BYTES, read_json

BOXES_DIR = "boxes"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


def boxes_path(judge_set: Path | str, name: str) -> Path:
    if not _NAME.match(name or ""):
        raise BadInput(f"localiser output name {name!r}: letters, digits, '_', '.', '+', '-' (at most 64)")
    return Path(judge_set) / BOXES_DIR / f"{name}.json"


def read_boxes(js: JudgeSet, name: str) -> Dict[str, Any]:
    """``SET/boxes/NAME.json``, checked: made for this judge set, known samples and cameras, boxes in the images.

    Raises:
        FileNotFoundError: no such boxes file.
        JudgeSetError: a file that is not a boxes file of this set (names the file and what is wrong).
    """
    path = boxes_path(js.root, name)
    data = read_json(path, js.root, MAX_JSON_BYTES, "boxes file")
    if not isinstance(data, dict) or not isinstance(data.get("boxes"), dict):
        raise JudgeSetError(f"{path}: not a boxes file (no 'boxes' object)")
    if data.get("export_hash") != js.export_hash:
        raise JudgeSetError(f"{path}: made for judge set {str(data.get('export_hash'))[:12]}, not {js.export_hash[:12]}")
    for sid, by_camera in data["boxes"].items():
        if not is_sample_id(sid) or sid not in js.by_id:
            raise JudgeSetError(f"{path}: sample {str(sid)[:60]!r} is not in the judge set")
        row = js.by_id[sid]
        if not isinstance(by_camera, dict):
            raise JudgeSetError(f"{path}: boxes of {sid} are not an object")
        for camera, box in by_camera.items():
            if row["cameras"].get(camera) != "third_person":
                raise JudgeSetError(f"{path}: {sid} has no third-person camera {str(camera)[:40]!r}")
            if box is not None and not (isinstance(box, list) and len(box) == 4 and all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 4096 for v in box)
                    and box[0] < box[2] and box[1] < box[3]):
                raise JudgeSetError(f"{path}: box of {sid} / {camera} is {json.dumps(box)[:60]}, not [x0, y0, x1, y1] "
                                    f"with x0 < x1, y0 < y1 in pixels")
    return data


def localiser_boxes(js: JudgeSet, name: str, sample_ids: Sequence[str]) -> Dict[str, Dict[str, Optional[List[int]]]]:
    """The boxes of ``sample_ids`` from ``SET/boxes/NAME.json`` (a sample it lacks: refused, localise it first)."""
    try:
        boxes = read_boxes(js, name)["boxes"]
    except FileNotFoundError:
        raise JudgeSetError(f"no boxes file {boxes_path(js.root, name)}: run `robocasa-shift localise` first") from None
    missing = [sid for sid in sample_ids if sid not in boxes]
    if missing:
        raise JudgeSetError(f"boxes {name!r} lack {len(missing)} sample(s), e.g. {missing[0]}: rerun `localise`")
    return {sid: boxes[sid] for sid in sample_ids}
