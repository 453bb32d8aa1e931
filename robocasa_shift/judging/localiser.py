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
from typing import Any, Dict, List, Mapping, Optional

from robocasa_shift.errors import BadInput, PolicyServerError
from robocasa_shift.judging.boxes import boxes_path, read_boxes
from robocasa_shift.judging.judgeset import JudgeSample, JudgeSet, JudgeSetError
from robocasa_shift.judging.openai_judge import OpenAIJudge
from robocasa_shift.rundir.files import atomic_write_text, confined

LOCALISER_PROMPT = ("You are given a robot task instruction and one camera image of the attempt's final state. Find "
                    "the region that decides whether the task succeeded (the objects involved and where they should "
                    "be). Answer with JSON only: {\"box\": [x0, y0, x1, y1]} in pixels of this image, x to the right "
                    "and y down from the top-left corner, or {\"box\": null} if the region is not visible.")
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
