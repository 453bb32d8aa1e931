"""The testing backend's robot: a point gripper on a planar arm, carried by a mobile base with two cameras.

What both sides of the fake world share, defined once: the backend moves by these actions and mounts
these cameras; the fake policies build these actions and the image-driven one back-projects through
the nominal camera mount (as a policy trained with a calibrated camera would assume it).

Action (3,): planar gripper velocity in the base frame (each in [-1, 1], 1 = ``MAX_STEP_M`` per step)
and a gripper command (> 0 closes).
"""

from __future__ import annotations

from typing import Dict

import numpy as np

from robocasa_shift.embodiments import ActionLayout
from robocasa_shift.geometry import axis_angle_quat, quat_mul

ACTION_DIM = 3
OPEN, CLOSE = -1.0, 1.0
# The planar arm: velocity x, y (execution noise goes there), gripper at 2; a manoeuvre's z is dropped.
LAYOUT = ActionLayout(name="fake-planar", dim=ACTION_DIM, arm_continuous=(0, 1), arm_translation=(0, 1), gripper=2,
                      open=OPEN, close=CLOSE)
MAX_STEP_M = 0.04  # gripper travel per control step at action 1.0

THIRD_PERSON_CAMERAS = ("agentview",)
WRIST_CAMERAS = ("eye_in_hand",)
CAMERAS = THIRD_PERSON_CAMERAS + WRIST_CAMERAS


def rot_z(theta: float) -> np.ndarray:
    """The rotation by ``theta`` (rad) about the vertical."""
    c, s = np.cos(theta), np.sin(theta)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _camera_quat(pitch_deg: float) -> np.ndarray:
    """A camera whose image up is the base's +x, looking down and pitched forward (MuJoCo: looks along -z)."""
    q = axis_angle_quat([0.0, 0.0, 1.0], -np.pi / 2)  # x -> -y (image right), y -> +x (image up)
    return quat_mul(q, axis_angle_quat([1.0, 0.0, 0.0], np.deg2rad(pitch_deg)))


def camera_mounts() -> Dict[str, np.ndarray]:
    """The nominal camera poses on the base (cameras in ``CAMERAS`` order): orientation, position, field of view."""
    # agentview on the base behind the gripper; eye_in_hand on the gripper, looking down
    return {
        "cam_quat": np.array([_camera_quat(30.0), _camera_quat(0.0)]),
        "cam_pos": np.array([[0.0, 0.0, 0.9], [0.0, 0.0, 0.2]]),
        "cam_fovy": np.array([45.0, 60.0]),
    }
