"""The substeps of :class:`~robocasa_shift.backends.libero_fastpath.FlatArm`, compiled with numba: the actuator
controls and the gripper's running action (and, kept for the caller, the controller values a substep leaves), and
the policy step's acceleration estimate.

The same construction as :mod:`robosuite_kernels` (robosuite 1.5's), for robosuite 1.4's arm under LIBERO: numba's
elementwise arithmetic rounds every operation as numpy's does, robosuite's own numba kernels (``opspace_matrices``,
``nullspace_torques``, ``orientation_error``) get the array types robosuite passes them (here the Jacobians are
Fortran-ordered, as robosuite 1.4's fancy indexing leaves them), and every ``np.dot`` is numpy's own BLAS call
(:mod:`numpy_blas`). robosuite sets every controller attribute again at every substep, from values these substeps
compute anyway: the loop keeps the last substep's, and ``FlatArm`` sets the attributes from them as stock robosuite
leaves them; the gripper's running action, which carries from substep to substep, is returned. tests/test_libero.py
compares these controls with the Python ones on many states, byte for byte.
"""

import numba
import numpy as np
from robosuite.utils.control_utils import (
    nullspace_torques,
    opspace_matrices,
    orientation_error,
)

from robocasa_shift.backends.mujoco_calls import mj_fullM, mj_getState, mj_jacSite, mj_step1, mj_step2
from robocasa_shift.backends.numpy_blas import dot_mv
from robocasa_shift.backends.robosuite_kernels import _actuate, _mass_matrix


@numba.njit(cache=True)
def _jacobians(jacp, jacr, qvel_index):
    """``J_pos``, ``J_ori`` and ``J_full`` as robosuite 1.4 makes them (``np.array(jac[:, qvel_index])``, then
    ``np.array(np.vstack(...))``): Fortran-ordered, which decides the compiled variant of its kernels that runs."""
    n = qvel_index.shape[0]
    J_pos, J_ori, J_full = np.empty((n, 3)).T, np.empty((n, 3)).T, np.empty((n, 6)).T
    for k in range(n):
        for r in range(3):
            J_pos[r, k] = J_full[r, k] = jacp[r, qvel_index[k]]
            J_ori[r, k] = J_full[3 + r, k] = jacr[r, qvel_index[k]]
    return J_pos, J_ori, J_full


@numba.njit(cache=True)
def substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, jacp, jacr, eef_site, qpos_index,
                     qvel_index, goal_pos, goal_ori, initial_joint, kp, kd, uncoupling, arm_actuators, torque_low,
                     torque_high, current_action, gripper_step, grip_actuators, grip_bias, grip_weight):
    """One substep of ``FlatArm.control``: the OSC's torques clipped into the arm's actuators, and the gripper's
    action advanced by ``gripper_step`` (``[-1, 1] * speed * sign(action)``, the same every substep of a control
    step) and mapped onto its actuators; returns the gripper's new running action and the values the substep leaves
    in the controller's attributes (``FlatArm.LEFT``'s order)."""
    ee_pos = site_xpos[eef_site].copy()
    ee_ori_mat = site_xmat[eef_site].reshape((3, 3)).copy()
    ee_pos_vel = dot_mv(jacp, qvel)
    ee_ori_vel = dot_mv(jacr, qvel)
    joint_pos, joint_vel = qpos[qpos_index], qvel[qvel_index]
    J_pos, J_ori, J_full = _jacobians(jacp, jacr, qvel_index)
    mass_matrix = _mass_matrix(full, qvel_index)
    ori_error = orientation_error(goal_ori.copy(), ee_ori_mat)
    position_error = goal_pos.copy() - ee_pos
    desired_force = position_error * kp[0:3] + (-ee_pos_vel) * kd[0:3]
    desired_torque = ori_error * kp[3:6] + (-ee_ori_vel) * kd[3:6]
    lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(mass_matrix, J_full, J_pos, J_ori)
    if uncoupling:
        decoupled_wrench = np.concatenate((dot_mv(lambda_pos, desired_force), dot_mv(lambda_ori, desired_torque)))
    else:
        decoupled_wrench = dot_mv(lambda_full, np.concatenate((desired_force, desired_torque)))
    torques = dot_mv(J_full.T, decoupled_wrench) + qfrc_bias[qvel_index]
    torques += nullspace_torques(mass_matrix, nullspace_matrix, initial_joint, joint_pos, joint_vel)
    # PandaGripper.format_action: np.clip(current + step, -1.0, 1.0), NaN kept as numpy 1.26's clip keeps it
    action = current_action + gripper_step
    for k in range(action.shape[0]):
        x = action[k]
        x = x if (np.isnan(x) or x > -1.0) else -1.0
        action[k] = x if (np.isnan(x) or x < 1.0) else 1.0
    applied = grip_bias + grip_weight * action
    for k in range(grip_actuators.shape[0]):
        ctrl[grip_actuators[k]] = applied[k]
    _actuate(ctrl, torques, arm_actuators, torque_low, torque_high)
    return action, (ee_pos, ee_ori_mat, ee_pos_vel, ee_ori_vel, joint_pos, joint_vel, J_pos, J_ori, J_full,
                    mass_matrix, torques)


@numba.njit(cache=True)
def kept_substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, jacp, jacr, eef_site, qpos_index,
                          qvel_index, goal_pos, goal_ori, initial_joint, kp, kd, uncoupling, arm_actuators, torque_low,
                          torque_high, current_action, gripper_step, grip_actuators, grip_bias, grip_weight, left):
    """:func:`substep_controls` with its controller values copied into ``left`` (cheaper than returning eleven arrays
    to Python); returns the gripper's running action."""
    action, values = substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, jacp, jacr, eef_site,
                                      qpos_index, qvel_index, goal_pos, goal_ori, initial_joint, kp, kd, uncoupling,
                                      arm_actuators, torque_low, torque_high, current_action, gripper_step,
                                      grip_actuators, grip_bias, grip_weight)
    _keep(left, values)
    return action


@numba.njit(cache=True)
def _keep(into, values):
    """Each of a substep's controller values into the caller's array of the same shape and layout."""
    into[0][:] = values[0]
    into[1][:, :] = values[1]
    into[2][:] = values[2]
    into[3][:] = values[3]
    into[4][:] = values[4]
    into[5][:] = values[5]
    into[6][:, :] = values[6]
    into[7][:, :] = values[7]
    into[8][:, :] = values[8]
    into[9][:, :] = values[9]
    into[10][:] = values[10]


@numba.njit(cache=True)
def ee_acceleration(current, buffer, control_freq):
    """``SingleArm.control``'s estimate of the end effector's acceleration on a policy step: every column of
    ``np.vstack([current, control_freq * np.diff(buffer, axis=0)])`` convolved with ``np.ones(10) / 10.0`` ("valid",
    one value for ten rows). numpy sums a kernel of at most 11 taps itself (``small_correlate``): from zero, one
    product of a value and a tap at a time, in order, as here."""
    rows, cols = buffer.shape
    tap = 1.0 / 10.0
    out = np.empty(cols)
    for j in range(cols):
        total = 0.0
        total += current[j] * tap
        for r in range(1, rows):
            total += (control_freq * (buffer[r, j] - buffer[r - 1, j])) * tap
        out[j] = total
    return out


@numba.njit(cache=True)
def _within(values, limit):
    """``(np.abs(values) <= limit).all()``: NaN fails the comparison, as there."""
    for x in values:
        if not abs(x) <= limit:
            return False
    return True


@numba.njit(cache=True)
def middle_substeps(count, model, data, limit, site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, jacp, jacr,
                    eef_site, qpos_index, qvel_index, goal_pos, goal_ori, initial_joint, kp, kd, uncoupling,
                    arm_actuators, torque_low, torque_high, current_action, gripper_step, grip_actuators, grip_bias,
                    grip_weight, left, before_last, integration):
    """Up to ``count`` substeps as ``ElidedForwardStep`` runs them one by one in Python: MuJoCo's validity check
    (``ElidedForwardStep._valid``), ``mj_step1``, the mass matrix and the site Jacobians (``FlatArm.compiled_control``),
    :func:`substep_controls`, ``mj_step2``, with MuJoCo's own C functions (:mod:`mujoco_calls`; ``model`` and
    ``data`` are their addresses). Stops before a substep whose state MuJoCo would reset (that one runs stock, from
    Python). The last substep run leaves its controller values in ``left`` and the state it integrated from
    (``mj_getState`` of the ``integration`` components) in ``before_last``. Returns (substeps run, the gripper's
    running action)."""
    for k in range(count):
        if not (_within(qpos, limit) and _within(qvel, limit)):
            return k, current_action
        mj_step1(model, data)
        mj_fullM(model, data, full.ctypes.data)  # MuJoCo 3.17's form: (m, d, dst)
        mj_jacSite(model, data, jacp.ctypes.data, jacr.ctypes.data, eef_site)
        current_action, values = substep_controls(site_xpos, site_xmat, qpos, qvel, qfrc_bias, ctrl, full, jacp, jacr,
                                                  eef_site, qpos_index, qvel_index, goal_pos, goal_ori, initial_joint,
                                                  kp, kd, uncoupling, arm_actuators, torque_low, torque_high,
                                                  current_action, gripper_step, grip_actuators, grip_bias, grip_weight)
        if k == count - 1:
            _keep(left, values)
            mj_getState(model, data, before_last.ctypes.data, integration)
        mj_step2(model, data)
    return count, current_action
