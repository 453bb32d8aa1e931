"""The pieces scripted experts are built from: a plan is a list of :class:`Phase` (where the gripper goes, the
gripper command, when the phase is done), acted on by a proportional arm controller (:func:`arm_action`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.embodiments.panda_omron import ARM_ROT, CLOSE, LAYOUT
from robocasa_shift.geometry import quat_xyzw_to_mat

POS_GAIN = 10.0  # action 1.0 asks 5 cm per step; this saturates at 10 cm of error
YAW_GAIN = 3.0
LEVEL_GAIN = 2.0  # roll and pitch rate per radian of tilt (kitchen plans keep the hand pointing down)


def closing_axis_yaw(eef_quat_xyzw: np.ndarray, frame: Optional[np.ndarray] = None) -> float:
    """Heading of the fingers' closing axis (the hand's y axis), in the world or in ``frame``."""
    axis = quat_xyzw_to_mat(eef_quat_xyzw)[:, 1]
    if frame is not None:
        axis = frame.T @ axis
    return float(np.arctan2(axis[1], axis[0]))


def yaw_of_wxyz(q: np.ndarray) -> float:
    w, x, y, z = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def arm_action(proprio: Dict[str, np.ndarray], target_world: np.ndarray, grip: float, yaw_rate: float = 0.0,
               layout=LAYOUT, level: bool = False) -> np.ndarray:
    """An arm action moving the gripper toward a world-frame target, in ``layout``: PandaOmron's controller
    reads its base frame; a fixed Panda's (LIBERO) reads the world frame. ``grip``: +1 close, -1 open.
    ``level``: also turn the hand (roll, pitch) until its fingers point straight down."""
    rotation = quat_xyzw_to_mat(proprio["robot0_base_quat"]) if "robot0_base_quat" in proprio else np.eye(3)
    delta = rotation.T @ (np.asarray(target_world) - proprio["robot0_eef_pos"])
    action = layout.arm_action(np.clip(POS_GAIN * delta, -1.0, 1.0), layout.close if grip == CLOSE else layout.open)
    if level:
        # the rotation taking the hand's approach axis (its z) onto the world's down, as an axis-angle in the base frame
        approach = quat_xyzw_to_mat(proprio["robot0_eef_quat"])[:, 2]
        axis = np.cross(approach, [0.0, 0.0, -1.0])
        angle = float(np.arctan2(np.linalg.norm(axis), approach @ [0.0, 0.0, -1.0]))
        omega = rotation.T @ (axis / max(np.linalg.norm(axis), 1e-9) * angle)
        action[ARM_ROT.start:ARM_ROT.stop - 1] = np.clip(LEVEL_GAIN * omega[:2], -1.0, 1.0)
    action[ARM_ROT.stop - 1] = np.clip(yaw_rate, -1.0, 1.0)  # the hand's yaw: index 5 in both layouts
    return action


@dataclass
class Phase:
    """One step of a scripted plan: where to go, the gripper command, when it is done."""

    name: str
    target: Callable[[Observation, dict], np.ndarray]
    grip: float
    done: Callable[[Observation, dict, int], bool]
    yaw: Optional[Callable[[Observation, dict], float]] = None  # desired yaw rate
    drive_base: bool = False  # the target is where the mobile base goes (world x, y), the arm rides along
    level: bool = False  # keep the fingers pointing straight down (roll and pitch corrected)


BASE_GAIN = 6.0  # base velocity action per metre of error (saturates at 1 beyond 17 cm)


def base_action(proprio: Dict[str, np.ndarray], target_world: np.ndarray, grip: float) -> np.ndarray:
    """A PandaOmron action in base mode driving the mobile base towards a world (x, y); the arm's goal rides along."""
    from robocasa_shift.embodiments.panda_omron import ACTION_DIM, BASE, BASE_MODE, GRIPPER, MODE

    rotation = quat_xyzw_to_mat(proprio["robot0_base_quat"])
    delta = rotation.T @ (np.asarray(target_world, dtype=float) - proprio["robot0_base_pos"])
    action = np.zeros(ACTION_DIM)
    action[BASE] = np.clip(BASE_GAIN * np.array([delta[0], delta[1], 0.0]), -1.0, 1.0)
    action[GRIPPER] = grip
    action[MODE] = BASE_MODE
    return action


def base_reached(tol_m: float, max_steps: int = 200):
    """Done when the base is within ``tol_m`` (x, y) of the phase's target, or after ``max_steps``."""

    def done(obs: Observation, memo: dict, steps: int) -> bool:
        err = memo["target"] - obs.proprio["robot0_base_pos"]
        return bool(np.linalg.norm(err[:2]) < tol_m) or steps >= max_steps

    return done


def reached(tol_xy: float, tol_z: float, max_steps: int = 80):
    def done(obs: Observation, memo: dict, steps: int) -> bool:
        err = memo["target"] - obs.proprio["robot0_eef_pos"]
        return bool(np.linalg.norm(err[:2]) < tol_xy and abs(err[2]) < tol_z) or steps >= max_steps

    return done


def after(n_steps: int):
    return lambda obs, memo, steps: steps >= n_steps
