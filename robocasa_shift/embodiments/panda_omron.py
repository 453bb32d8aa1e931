"""PandaOmron's 12-D action, as the harness's policies emit it and its backends take it.

Index meaning (robosuite's default part order for PandaOmron, base mode last):

- 0:3 ``ARM_POS``: arm OSC position delta, in the robot base frame.
- 3:6 ``ARM_ROT``: arm OSC axis-angle delta (5, ``ARM_YAW``, turns the hand about z).
- 6 ``TORSO``: torso lift.
- 7:10 ``BASE``: base velocity x, y, yaw.
- 10 ``GRIPPER``: +1 closes (``CLOSE``), -1 opens (``OPEN``).
- 11 ``MODE``: control mode, -1 drives the arm (``ARM_MODE``), +1 the base.

RoboCasa's kitchen controller orders its parts differently (gripper 6, base
7:10, torso 10); the robocasa backend reorders through ``PART_RANGES``.
"""

from __future__ import annotations

from typing import Dict, Tuple, Union

from robocasa_shift.embodiments import ActionLayout

ACTION_DIM = 12
ARM_POS = slice(0, 3)
ARM_ROT = slice(3, 6)
ARM_YAW = 5
TORSO = 6
BASE = slice(7, 10)
GRIPPER = 10
MODE = 11

OPEN, CLOSE = -1.0, 1.0
ARM_MODE, BASE_MODE = -1.0, 1.0

# robosuite composite-controller part -> [start, end) in this action; the mode index is not a part
# (HybridMobileBase reads it from the last entry of the controller's own action).
PART_RANGES: Dict[str, Tuple[int, int]] = {
    "right": (ARM_POS.start, ARM_ROT.stop),
    "torso": (TORSO, TORSO + 1),
    "base": (BASE.start, BASE.stop),
    "right_gripper": (GRIPPER, GRIPPER + 1),
}


def indices(*parts: Union[slice, int]) -> Tuple[int, ...]:
    """The action indices of ``parts``, in the order given: ``indices(BASE, TORSO) == (7, 8, 9, 6)``."""
    out = []
    for part in parts:
        out.extend(range(ACTION_DIM)[part] if isinstance(part, slice) else [part])
    return tuple(out)


# RoboCasa's datasets and its GR00T/LeRobot action keys carry the base and the torso together as one
# 4-D "base_motion": base x, y, yaw, then torso.
BASE_MOTION = indices(BASE, TORSO)

# What branching's execution noise and scripted manoeuvres need (see ``ActionLayout``).
LAYOUT = ActionLayout(name="PandaOmron", dim=ACTION_DIM, arm_continuous=indices(ARM_POS, ARM_ROT),
                      arm_translation=indices(ARM_POS), gripper=GRIPPER, open=OPEN, close=CLOSE, fixed={MODE: ARM_MODE})
