"""The frame logger: an observer that keeps a formal rollout's third-person frames (:mod:`robocasa_shift.core.framelog`).

It renders exactly what a pair video's re-run would capture of the third-person cameras (the policy's image
size, the condition's observation-side factors), so the report can film a pair from the run itself. It only
renders: the rollout is unchanged (tested).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from robocasa_shift.core.framelog import MAX_FRAME_BYTES, FrameLog
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.specs import Protocol
from robocasa_shift.engine.replay import FrameCapture, observation_transform


class FrameLogger(FrameCapture):
    """Observer that keeps every third-person frame of a rollout and encodes them as a :class:`FrameLog`.

    Args:
        key: the rollout's key (recorded in the log, and its draw drives any sensor noise).
        protocol: the protocol its condition means.
        size: the policy's image size (pixels on a side).
        max_bytes: the most the encoded file may hold; a longer log is not kept (nor one whose frames would exceed
            :data:`~robocasa_shift.core.framelog.MAX_FRAME_BYTES`: the logger stops holding them there).
    """

    def __init__(self, key: RolloutKey, protocol: Protocol, size: int, max_bytes: int):
        super().__init__([], size, observation_transform(protocol, key.condition, key))
        self.key, self.max_bytes = key, int(max_bytes)
        self.started = self.too_long = False

    def on_start(self, env) -> None:
        self.cameras = list(env.third_person_cameras)
        super().on_start(env)
        self.started = True

    def on_step(self, step, action, env, latched) -> None:
        if self.too_long:
            return
        super().on_step(step, action, env, latched)
        if len(self.frames) * sum(f.nbytes for f in self.frames[0]) > MAX_FRAME_BYTES:
            self.too_long, self.frames = True, []

    def encoded(self) -> Tuple[Optional[bytes], Optional[Dict[str, Any]]]:
        """The log's bytes and the record's ``frame_log`` summary; ``(None, None)`` when the rollout never
        started or the file would exceed ``max_bytes``."""
        if not self.started or self.too_long or not self.frames:
            return None, None
        log = FrameLog.from_frames({"key": self.key.to_json(), "cameras": self.cameras}, self.frames)
        self.frames = []  # the encoded file is what is kept
        data = log.to_bytes()
        if len(data) > self.max_bytes:
            return None, None
        return data, log.summary(data)


__all__ = ["FrameLogger"]
