"""The substeps of :class:`~robocasa_shift.backends.robosuite_fastpath.FusedStep` between a control step's first and
last, compiled with numba: the actuator controls of ``FusedStep._control``, and nothing else.

Bit for bit the same controls, by construction: numba's elementwise arithmetic rounds every operation as numpy's
does (it emits no fused multiply-adds and no reassociation without ``fastmath``), robosuite's own numba kernels
(``opspace_matrices``, ``nullspace_torques``, ``orientation_error``) are called with the array types robosuite
passes them, so the same compiled code runs, and every ``np.dot`` is numpy's own BLAS call (:mod:`numpy_blas`).
Those substeps leave no controller attribute behind: robosuite sets them again at every substep from the
simulator's state and the goals, so the last substep, run in Python, leaves them as stock robosuite does.
tests/test_fastpath.py compares these controls with the Python ones on many states, byte for byte.
"""

import numba
import numpy as np
from robosuite.utils.control_utils import (
    nullspace_torques,
    opspace_matrices,
    orientation_error,
)

from robocasa_shift.backends.mujoco_calls import mj_fullM, mj_jacSite, mj_step1, mj_step2
from robocasa_shift.backends.numpy_blas import dot_mm, dot_mv


@numba.njit(cache=True)
def _mass_matrix(full, qvel_index):
    """``full[qvel_index, :][:, qvel_index]`` in the Fortran order robosuite's two fancy indexings leave it in (the
    layout decides which compiled variant of robosuite's kernels runs and which BLAS order numpy picks)."""
    n = qvel_index.shape[0]
    mass_matrix = np.empty((n, n)).T
    for i in range(n):
        for j in range(n):
            mass_matrix[i, j] = full[qvel_index[i], qvel_index[j]]
    return mass_matrix


@numba.njit(cache=True)
def _osc_torques(site_xpos, site_xmat, qpos, qvel, qfrc_bias, full, grip_jacp, grip_jacr, center_jacp, center_jacr,
                 grip_site, arm_center, qpos_index, qvel_index, goal_pos, goal_ori, initial_joint, kp, kd):
    """``FusedStep._osc`` (OperationalSpaceController.run_controller), from the same MuJoCo outputs."""
    origin_pos = site_xpos[arm_center].copy()
    origin_ori = site_xmat[arm_center].reshape((3, 3)).copy()
    ref_pos = site_xpos[grip_site].copy()
    ref_ori_mat = site_xmat[grip_site].reshape((3, 3)).copy()
    ref_pos_vel = dot_mv(grip_jacp, qvel)
    ref_ori_vel = dot_mv(grip_jacr, qvel)
    n = qvel_index.shape[0]
    J_pos, J_ori, J_full = np.empty((3, n)), np.empty((3, n)), np.empty((6, n))
    for k in range(n):
        for r in range(3):
            J_pos[r, k] = J_full[r, k] = grip_jacp[r, qvel_index[k]]
            J_ori[r, k] = J_full[3 + r, k] = grip_jacr[r, qvel_index[k]]
    joint_pos, joint_vel = qpos[qpos_index], qvel[qvel_index]
    mass_matrix = _mass_matrix(full, qvel_index)
    desired_world_pos = origin_pos + dot_mv(origin_ori, goal_pos)
    desired_world_ori = dot_mm(origin_ori, goal_ori)
    ori_error = orientation_error(desired_world_ori, ref_ori_mat)
    position_error = desired_world_pos - ref_pos
    vel_pos_error = -(ref_pos_vel - dot_mv(center_jacp, qvel))
    desired_force = position_error * kp[0:3] + vel_pos_error * kd[0:3]
    vel_ori_error = -(ref_ori_vel - dot_mv(center_jacr, qvel))
    desired_torque = ori_error * kp[3:6] + vel_ori_error * kd[3:6]
    lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(mass_matrix, J_full, J_pos, J_ori)
    decoupled_wrench = np.concatenate((dot_mv(lambda_pos, desired_force), dot_mv(lambda_ori, desired_torque)))
    torques = dot_mv(J_full.T, decoupled_wrench) + qfrc_bias[qvel_index]
    torques += nullspace_torques(mass_matrix, nullspace_matrix, initial_joint, joint_pos, joint_vel)
    return torques


@numba.njit(cache=True)
def _torso_torques(qpos, qvel, qfrc_bias, full, qpos_index, qvel_index, goal_qpos, kp, kd):
    """``FusedStep._torso`` (JointPositionController.run_controller)."""
    joint_pos, joint_vel = qpos[qpos_index], qvel[qvel_index]
    mass_matrix = _mass_matrix(full, qvel_index)
    desired_torque = (goal_qpos - joint_pos) * kp + (-joint_vel) * kd
    return dot_mv(mass_matrix, desired_torque) + qfrc_bias[qvel_index]


@numba.njit(cache=True)
def _actuate(ctrl, values, index, low, high):
    """``ctrl[index] = np.clip(values, low, high)`` with numpy 1.26's float clip: min(max(x, low), high), NaN kept."""
    for k in range(index.shape[0]):
        x = values[k]
        x = x if (np.isnan(x) or x > low[k]) else low[k]
        ctrl[index[k]] = x if (np.isnan(x) or x < high[k]) else high[k]


@numba.njit(cache=True)
def substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, grip_jacp, grip_jacr, center_jacp,
                     center_jacr, osc, torso, base_vels, grip_vels, actuation):
    """One substep's actuator controls: the OSC's and the torso's torques and the base's and gripper's velocities
    (constant over a control step), clipped into ``ctrl`` in robosuite's part order."""
    osc_torques = _osc_torques(site_xpos, site_xmat, qpos, qvel, qfrc_bias, full, grip_jacp, grip_jacr, center_jacp,
                               center_jacr, *osc)
    torso_torques = _torso_torques(qpos, qvel, qfrc_bias, full, *torso)
    parts = (osc_torques, torso_torques, base_vels, grip_vels)
    for k in range(len(parts)):
        index, low, high = actuation[k]
        _actuate(ctrl, parts[k], index, low, high)


@numba.njit(cache=True)
def middle_substeps(count, model, data, qM, arm_center, grip_site, site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl,
                    full, grip_jacp, grip_jacr, center_jacp, center_jacr, osc, torso, base_vels, grip_vels, actuation):
    """``count`` substeps as ``FusedStep`` runs them one by one in Python: ``mj_step1``, the mass matrix and the two
    site Jacobians (in ``FusedStep._compiled_control``'s order), :func:`substep_controls`, ``mj_step2``. The MuJoCo
    calls are MuJoCo's own C functions (:mod:`mujoco_calls`) on the same model and data (``model`` and ``data`` are
    their addresses), so the same code runs on the same numbers; only the Python between them is gone."""
    for _ in range(count):
        mj_step1(model, data)
        mj_fullM(model, full.ctypes.data, qM.ctypes.data)
        mj_jacSite(model, data, center_jacp.ctypes.data, center_jacr.ctypes.data, arm_center)
        mj_jacSite(model, data, grip_jacp.ctypes.data, grip_jacr.ctypes.data, grip_site)
        substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, grip_jacp, grip_jacr, center_jacp,
                         center_jacr, osc, torso, base_vels, grip_vels, actuation)
        mj_step2(model, data)
