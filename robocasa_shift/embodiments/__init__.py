"""Robot embodiments: one module per robot, holding the layout of its action vector.

Policies build actions and backends read them through these names, so an
index is defined once. ``panda_omron`` is RoboCasa's mobile manipulator (the
12-D action every backend takes today).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class ActionLayout:
    """What generic action edits need to know of an embodiment's action vector.

    Counterfactual branches add execution noise to the continuous arm dimensions
    only and build scripted manoeuvres (``recover``) from a base-frame arm velocity
    and a gripper command; this says where those live.

    Attributes:
        name: the embodiment.
        dim: the action's length.
        arm_continuous: indices of the continuous arm commands (execution noise goes here).
        arm_translation: indices of the arm's translation command, x, y[, z] in the robot base
            frame (a planar arm has two; a manoeuvre's z is then dropped).
        gripper: index of the gripper command.
        open, close: the gripper's open and close commands.
        fixed: indices with a constant value in every arm action (a control-mode switch).
    """

    name: str
    dim: int
    arm_continuous: Tuple[int, ...]
    arm_translation: Tuple[int, ...]
    gripper: int
    open: float
    close: float
    fixed: Mapping[int, float] = field(default_factory=dict)

    def closing(self, action: np.ndarray) -> bool:
        """The action commands the gripper closed (nearer ``close`` than ``open``)."""
        value = float(np.asarray(action)[self.gripper])
        return abs(value - self.close) < abs(value - self.open)

    def arm_action(self, velocity: Sequence[float], gripper: float) -> np.ndarray:
        """An action moving the arm at ``velocity`` (base frame, action units) with ``gripper`` commanded."""
        action = np.zeros(self.dim)
        action[list(self.arm_translation)] = np.asarray(velocity, dtype=float)[: len(self.arm_translation)]
        action[self.gripper] = gripper
        for index, value in self.fixed.items():
            action[index] = value
        return action
