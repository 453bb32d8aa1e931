"""A VLM localiser: the box a served model draws around the outcome-deciding region, in place of the simulator's.

FailBench's localise-and-crop pipeline asks one VLM (the localiser) for the region that decides the
outcome, crops to it, and asks another (the detector) for the verdict; its App. C swaps the two. The
export's boxes come from the simulator (an oracle localiser: what cropping can give); this module
asks a model behind an OpenAI-compatible endpoint instead, with the same transport, deadlines, caps
and key handling as the ``openai`` judge, and writes ``SET/boxes/NAME.json``. ``judge --crop --boxes
NAME`` then crops to those boxes, so any localiser can be paired with any detector and the pipelines
compared with ``score-judge --compare``.

Only third-person cameras are localised (wrist cameras move with the hand and are shown whole, as
with the export's boxes). A reply without a readable box inside the image leaves that camera whole,
recorded as ``null``; a failed request is an error for the sample, and a rerun asks again.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from robocasa_shift.errors import BadInput, PolicyServerError
from robocasa_shift.judging.judgeset import JudgeSample, JudgeSet, JudgeSetError, is_sample_id
from robocasa_shift.judging.openai_judge import OpenAIJudge
from robocasa_shift.rundir.files import MAX_JSON_BYTES, atomic_write_text, confined, read_json

LOCALISER_PROMPT = ("You are given a robot task instruction and one camera image of the attempt's final state. Find "
                    "the region that decides whether the task succeeded (the objects involved and where they should "
                    "be). Answer with JSON only: {\"box\": [x0, y0, x1, y1]} in pixels of this image, x to the right "
                    "and y down from the top-left corner, or {\"box\": null} if the region is not visible.")
BOXES_DIR = "boxes"
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_BOX = re.compile(r"\{[^{}]*\"box\"[^{}]*\}", re.DOTALL)


def parse_box(text: str, width: int, height: int) -> Optional[List[int]]:
    """``[x0, y0, x1, y1]`` from a reply, rounded and checked to lie inside a ``width`` x ``height`` image."""
    for match in reversed(_BOX.findall(text)):
        try:
            box = json.loads(match).get("box")
        except (ValueError, RecursionError, AttributeError):
            continue
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                                 for v in box)):
            return None
        x0, y0, x1, y1 = (int(round(v)) for v in box)
        x0, y0, x1, y1 = max(0, x0), max(0, y0), min(width, x1), min(height, y1)
        return [x0, y0, x1, y1] if x1 > x0 and y1 > y0 else None
    return None


def _image_size(data: bytes) -> tuple:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        return image.size


class OpenAILocaliser(OpenAIJudge):
    """Boxes from a VLM behind an OpenAI-compatible endpoint (options as the ``openai`` judge's)."""

    name = "openai-localiser"

    def __init__(self, **options: Any):
        options.setdefault("max_tokens", 64)
        options.pop("inputs", None)
        super().__init__(inputs="end", **options)
        if options.get("prompt_file") is None:
            self.system_prompt = LOCALISER_PROMPT
            self.prompt_sha256 = hashlib.sha256(LOCALISER_PROMPT.encode()).hexdigest()

    def localise(self, sample: JudgeSample) -> Dict[str, Optional[List[int]]]:
        """A box (or None) per third-person camera of ``sample``, from its end frame."""
        import base64

        boxes: Dict[str, Optional[List[int]]] = {}
        for camera, role in sample.cameras.items():
            if role != "third_person":
                continue
            image = sample.images["end"][camera]
            width, height = _image_size(image)
            body = {"model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
                    "messages": [{"role": "system", "content": self.system_prompt},
                                 {"role": "user", "content": [
                                     {"type": "text", "text": f"Task instruction: {sample.instruction}"},
                                     {"type": "text", "text": f"Camera {camera}, {width}x{height} pixels:"},
                                     {"type": "image_url", "image_url": {
                                         "url": "data:image/png;base64," + base64.b64encode(image).decode()}}]}]}
            boxes[camera] = parse_box(self._ask(body), width, height)
        return boxes


def boxes_path(judge_set: Path | str, name: str) -> Path:
    if not _NAME.match(name or ""):
        raise BadInput(f"localiser output name {name!r}: letters, digits, '_', '.', '+', '-' (at most 64)")
    return Path(judge_set) / BOXES_DIR / f"{name}.json"


def localise_set(judge_set: Path | str, name: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """Ask the localiser for every sample's boxes; write ``SET/boxes/NAME.json``; return what was written.

    Samples whose request failed are listed in ``errors`` and left out (a rerun asks for them again).
    """
    js = JudgeSet(judge_set)
    with confined(js.root):
        localiser = OpenAILocaliser(**dict(options))
        path = boxes_path(js.root, name)
        done: Dict[str, Any] = {}
        try:
            done = read_boxes(js, name)["boxes"]
        except (FileNotFoundError, JudgeSetError):
            done = {}
        boxes, errors = dict(done), []
        for sid in js.by_id:
            if sid in boxes:
                continue
            try:
                boxes[sid] = localiser.localise(js.sample(sid, "end"))
            except PolicyServerError as exc:
                if getattr(exc, "fatal", False):
                    raise
                errors.append(f"{sid}: {exc}")
        out = {"localiser": localiser.identity(), "prompt_sha256": localiser.prompt_sha256,
               "export_hash": js.export_hash, "boxes": boxes}
        atomic_write_text(path, json.dumps(out, indent=1, sort_keys=True) + "\n", js.root)
        return {**out, "path": str(path), "errors": errors}


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
