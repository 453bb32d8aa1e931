"""Loop-side shifts as wrappers at the boundary between the policy and the environment.

A deployment shift changes neither the simulator nor the images: it changes *when* things cross the boundary
(an action executed k steps late, an observation k steps old, each action held k steps). As a gymnasium wrapper
wraps an environment, a :class:`LoopWrapper` wraps the rollout loop's three crossings:

- :meth:`~LoopWrapper.observation`: which observation the policy receives at a chunk boundary (``capture``
  renders one now; a wrapper may hand back an older one);
- :meth:`~LoopWrapper.chunk`: the action chunk the policy returned, before the loop executes it;
- :meth:`~LoopWrapper.action`: the action executed at this control step.

A rollout composes the wrappers of its condition's loop-side factors in the condition's order
(``engine/rollout.py`` only applies them). Each wrapper writes what it did into ``measured`` (the perturbation
entry's record), which the factor kind's audit checks against the frozen level. A new loop-side factor is a
wrapper class here and a factor kind whose ``wrapper`` names it (``core/shifts.py``).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Dict, List

import numpy as np

Frame = Dict[str, Any]  # what the policy reads at a step: {"step", "images", "proprio", "privileged"}


class LoopWrapper:
    """One loop-side shift of ``steps`` control steps; the default passes everything through unchanged.

    Attributes:
        steps: the level's whole number of steps (delay or hold).
        measured: what the wrapper did, starting ``{param: steps}``; recorded with the perturbation entry.
    """

    def __init__(self, param: str, steps: int):
        self.steps = int(steps)
        self.measured: Dict[str, Any] = {param: self.steps}

    def start(self, rollout, capture: Callable[[], Frame]) -> None:
        """The rollout begins (its policy reset, before the first observation)."""

    def observation(self, rollout, capture: Callable[[], Frame]) -> Frame:
        """The frame the policy receives now (``capture()``: the current one, through the wrappers before it)."""
        return capture()

    def chunk(self, rollout, chunk: np.ndarray) -> np.ndarray:
        """The chunk the loop executes, given the one the policy returned."""
        return chunk

    def action(self, rollout, action: np.ndarray) -> np.ndarray:
        """The action executed at ``rollout.step_index``, given the one the chunk holds there."""
        return action

    def after_step(self, rollout, capture: Callable[[], Frame]) -> None:
        """A control step ran and the rollout goes on."""

    def finish(self, rollout) -> None:
        """The rollout ended: complete ``measured``."""


class ActionDelay(LoopWrapper):
    """Each action executed ``steps`` control steps after it was produced; the first ``steps`` steps execute the
    embodiment's idle action (arm still, gripper open). Measured: steps, idle steps, the lag of the others."""

    def start(self, rollout, capture):
        layout = rollout.env.action_layout
        idle = layout.arm_action(np.zeros(len(layout.arm_translation)), layout.open)
        self._line = deque([(idle, None)] * self.steps)
        self.measured.update(steps=0, idle_steps=0, lag_min=None, lag_max=None)

    def action(self, rollout, action):
        self._line.append((action, rollout.step_index))
        action, produced = self._line.popleft()
        measured = self.measured
        measured["steps"] += 1
        if produced is None:
            measured["idle_steps"] += 1
        else:
            lag = rollout.step_index - produced
            measured["lag_min"] = lag if measured["lag_min"] is None else min(measured["lag_min"], lag)
            measured["lag_max"] = lag if measured["lag_max"] is None else max(measured["lag_max"], lag)
        return action


class ObservationDelay(LoopWrapper):
    """The policy receives what was rendered ``steps`` control steps before (the first observation before then).
    Measured: boundaries, how many got the full delay, how many the first observation (clamped), the oldest age."""

    def start(self, rollout, capture):
        self.measured.update(boundaries=0, full_delay=0, clamped=0, age_max=None)
        self._frames = deque([capture()], maxlen=self.steps + 1)

    def observation(self, rollout, capture):
        frame = self._frames[0]
        age, measured = rollout.step_index - frame["step"], self.measured
        measured["boundaries"] += 1
        if age == self.steps:
            measured["full_delay"] += 1
        elif age == rollout.step_index:  # before step k: the first observation
            measured["clamped"] += 1
        measured["age_max"] = age if measured["age_max"] is None else max(measured["age_max"], age)
        return frame

    def after_step(self, rollout, capture):
        self._frames.append(capture())


class ActionRepeat(LoopWrapper):
    """A lower control rate: each policy action held ``steps`` control steps (a chunk of n actions lasts
    n * steps). Measured: how many actions ran to their end and how long they were held."""

    def start(self, rollout, capture):
        self._held: List[int] = []  # the policy action (a running index) each executed step came from
        self._loaded = self._chunk_first = 0
        self.measured.update(held_actions=0, hold_min=None, hold_max=None)

    def chunk(self, rollout, chunk):
        chunk = np.asarray(chunk, dtype=np.float64)
        chunk = np.repeat(chunk[None] if chunk.ndim == 1 else chunk, self.steps, axis=0)
        self._chunk_first = self._loaded
        self._loaded += len(chunk) // self.steps
        return chunk

    def action(self, rollout, action):
        self._held.append(self._chunk_first + (rollout.cursor.index - 1) // self.steps)  # the cursor moved past it
        return action

    def finish(self, rollout):
        if not self._held:
            return
        # how long each policy action ran: the last one may have been cut short by the rollout's end
        runs = np.diff(np.flatnonzero(np.diff(np.r_[-1, self._held, -2]) != 0))
        complete = runs[:-1] if len(runs) and runs[-1] < self.steps else runs
        self.measured.update(held_actions=int(len(complete)), hold_min=int(complete.min()) if len(complete) else None,
                             hold_max=int(complete.max()) if len(complete) else None)


__all__ = ["ActionDelay", "ActionRepeat", "Frame", "LoopWrapper", "ObservationDelay"]
