"""Small rotation helpers shared by the perturbations and the scripted controllers.

MuJoCo stores quaternions as (w, x, y, z); robosuite's observations use (x, y, z, w).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ]
    )


def axis_angle_quat(axis: Sequence[float], angle_rad: float) -> np.ndarray:
    axis = np.asarray(axis, dtype=float)
    axis = axis / np.linalg.norm(axis)
    return np.concatenate([[np.cos(angle_rad / 2)], np.sin(angle_rad / 2) * axis])


def quat_to_mat(q: np.ndarray) -> np.ndarray:
    w, x, y, z = np.asarray(q, dtype=float) / np.linalg.norm(q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def quat_xyzw_to_mat(q: Sequence[float]) -> np.ndarray:
    """Rotation matrix of a robosuite (x, y, z, w) quaternion."""
    x, y, z, w = q
    return quat_to_mat(np.array([w, x, y, z], dtype=float))


def wrap(angle: float, period: float = 2 * np.pi) -> float:
    """Angle wrapped into [-period/2, period/2)."""
    return float((angle + period / 2) % period - period / 2)
