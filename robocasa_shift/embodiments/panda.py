"""The fixed-base Panda's 7-D action (LIBERO's robosuite 1.4 OSC_POSE controller).

- 0:3 ``ARM_POS``: end-effector position delta (world frame, scaled to [-1, 1]).
- 3:6 ``ARM_ROT``: axis-angle orientation delta.
- 6 ``GRIPPER``: -1 opens (``OPEN``), +1 closes (``CLOSE``).
"""

from __future__ import annotations

from robocasa_shift.embodiments import ActionLayout

ACTION_DIM = 7
ARM_POS = slice(0, 3)
ARM_ROT = slice(3, 6)
GRIPPER = 6
OPEN, CLOSE = -1.0, 1.0
# What LIBERO's evaluations send while objects settle (openpi's examples/libero, LeRobot's LIBERO env).
NO_OP = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, OPEN)

LAYOUT = ActionLayout(name="Panda", dim=ACTION_DIM, arm_continuous=tuple(range(6)), arm_translation=(0, 1, 2),
                      gripper=GRIPPER, open=OPEN, close=CLOSE)
