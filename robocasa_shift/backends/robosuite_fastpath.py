"""robosuite 1.5.2's control step with the work nobody reads removed, and its Python overhead written out once.

A control step of robosuite is 25 physics substeps of: ``mj_step1``, the robot's controllers,
``mj_step2``, then every observable's clock. MuJoCo itself is about a tenth of that time; the
rest is Python that re-derives the same constants every substep. Four shortcuts, none of
which changes a floating-point operation:

- ``robot.action_dim`` is a property that rebuilds the action limits (array concatenations over
  every part controller) and is read three times per substep, though it never changes once the
  robot is built. Here it is read once and the robot instance gets a subclass that returns it.
- The object observables (``cube_pos``, ``gripper_to_cube_pos``, the ``object-state``
  concatenation, ...) are sampled every control step, but the harness delivers only the robot's
  own sensing (``robot0_*``) and reads object poses from the simulator. They are disabled.
- :class:`FusedStep` replaces ``env.step`` for the controller stack the embedded backend uses
  (a wheeled robot under ``HybridMobileBase``: OSC arm, joint-position torso, joint-velocity
  base, simple gripper). Its 24 substeps after the first are robosuite's own code written out
  flat: the same numpy and MuJoCo calls on arrays made the same way, in the same order, with
  the same numba kernels (``opspace_matrices``, ``nullspace_torques``, ``orientation_error``).
  What it drops is only what cannot change a value: name-to-id lookups, f-strings, list-to-index
  conversions, property chains, copies of fresh arrays, new output arrays for MuJoCo calls that
  overwrite every entry, a site Jacobian robosuite computes twice from the same state, and
  constants (control ranges, the gripper's and base's bias and weight, the OSC's fixed gains'
  halves) re-derived from constants. The first substep of every step (where goals are set and the
  robot's history buffers are pushed) and ``_post_action`` / ``_get_observations`` run stock.
- ``env.check_contact`` (robosuite's ``sim_utils.check_contact``) looks every contact's two geom ids up by
  name, four times, and tests each name against a list: RoboCasa's fixtures ask it several times after every
  control step (is the gripper on a microwave's or a coffee machine's button), over hundreds of contacts.
  :class:`ContactCheck` answers the same question from the contact list's geom-id arrays and, per model and geom
  group, a table of which ids the group's names name (built with robosuite's own lookup): the same boolean.
  The fixtures also look their joints' ``qpos`` addresses up by name after every step
  (``MjModel.get_joint_qpos_addr``, a few array reads through the binding each): a model constant, so
  :class:`JointAddresses` keeps each answer robosuite gave for the model's lifetime.
- The substeps between the first and the last compute only what they leave behind, the actuator
  controls, in compiled code (:mod:`robosuite_kernels`) that calls numpy's own BLAS
  (:mod:`numpy_blas`); robosuite recomputes every controller attribute from the simulator at
  every substep, so the last substep, in Python, leaves them as stock robosuite does. Where
  numpy's BLAS cannot be called (another numpy build), these substeps run in Python too.

The identity test (tests/test_fastpath.py) steps the same actions with and without these
shortcuts on several tasks and conditions and compares the full MuJoCo integration state, the
controllers' state and the delivered observations after every control step, byte for byte.
The shortcuts apply only to the robosuite version they were verified on, and the fused step
only to the exact classes and settings it mirrors (:func:`fused_step_problem` says why not,
and the environment then steps stock); another robosuite version gets stock robosuite, and the
identity test, which pins the version, fails.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

VERIFIED_ROBOSUITE = "1.5.2"
# the ufunc np.clip calls after its argument checks (numpy < 2, which robosuite 1.5.2 pins)
_clip = np.core.umath.clip
# observable modalities nothing in the harness reads (robot0_* proprioception is delivered to policies)
UNREAD_MODALITIES = ("object",)
# the part controllers FusedStep mirrors, in the order robosuite_kernels.substep_controls takes their actuators
KERNEL_PARTS = ("right", "torso", "base", "right_gripper")


def applicable() -> bool:
    """Whether the installed robosuite is the one the shortcuts were verified on."""
    import robosuite

    return robosuite.__version__ == VERIFIED_ROBOSUITE


def enable(raw) -> Dict[str, Any]:
    """Apply the shortcuts to a built robosuite environment; what was done (for the manifest)."""
    if not applicable():
        import robosuite

        return {"enabled": False, "reason": f"verified on robosuite {VERIFIED_ROBOSUITE}, not {robosuite.__version__}"}
    for robot in raw.robots:
        if not getattr(type(robot), "_fastpath", False):
            dim = robot.action_dim
            cls = type(robot)
            robot.__class__ = type(cls.__name__, (cls,), {"action_dim": property(lambda self, d=dim: d),
                                                          "_fastpath": True, "_stock_class": cls,
                                                          "__module__": cls.__module__})
    disabled = disable_unread_observables(raw)
    contacts = contact_check_problem(raw)
    if contacts is None and not isinstance(vars(raw).get("check_contact"), ContactCheck):
        raw.check_contact = ContactCheck(raw)  # an instance attribute: the class's own method is untouched
    if not isinstance(vars(raw.sim.model).get("get_joint_qpos_addr"), JointAddresses):
        raw.sim.model.get_joint_qpos_addr = JointAddresses(raw.sim.model)
    problem = fused_step_problem(raw)
    compiled = loop = None
    if problem is None:
        # enabled again after a reset that rebuilt robots and observables (RoboCasa's kitchens): the step stays
        fused = getattr(vars(raw).get("step"), "__self__", None)
        if not isinstance(fused, FusedStep):
            fused = FusedStep(raw)
        raw.step = fused.step  # an instance attribute: the class's own step is untouched
        compiled, loop = fused.compiled_problem, fused.loop_problem
    return {"enabled": True, "robosuite": VERIFIED_ROBOSUITE, "action_dim_cached": True,
            "observables_disabled": disabled, "contacts_indexed": contacts is None,
            **({"contacts_indexed_reason": contacts} if contacts else {}), "joint_addresses_kept": True,
            "fused_step": problem is None,
            **({"fused_step_reason": problem} if problem else
               {"compiled_substeps": compiled is None, **({"compiled_substeps_reason": compiled} if compiled else {}),
                "compiled_loop": loop is None, **({"compiled_loop_reason": loop} if loop else {})})}


def disable(raw) -> None:
    """Stock robosuite again (the identity test's reference)."""
    vars(raw).pop("step", None)
    vars(raw).pop("check_contact", None)
    vars(raw.sim.model).pop("get_joint_qpos_addr", None)
    for robot in raw.robots:
        if getattr(type(robot), "_fastpath", False):
            robot.__class__ = type(robot)._stock_class
    enable_unread_observables(raw)


def disable_unread_observables(raw) -> List[str]:
    """Disable the observables of a modality nothing in the harness reads (robosuite 1.4's and 1.5's); their names."""
    disabled = sorted(name for name, obs in raw._observables.items() if obs.modality in UNREAD_MODALITIES)
    for name in disabled:
        raw._observables[name].set_enabled(False)
    return disabled


def enable_unread_observables(raw) -> None:
    """Stock robosuite's observables again (``set_enabled`` resets each one's clock, as a reset does)."""
    for obs in raw._observables.values():
        if obs.modality in UNREAD_MODALITIES:
            obs.set_enabled(True)


def fused_step_problem(raw) -> Optional[str]:
    """Why :class:`FusedStep` does not mirror this environment's step exactly, or None when it does."""
    from robosuite.controllers.composite.composite_controller import (
        CompositeController,
        HybridMobileBase,
    )
    from robosuite.controllers.parts.arm.osc import OperationalSpaceController
    from robosuite.controllers.parts.controller import Controller
    from robosuite.controllers.parts.generic.joint_pos import JointPositionController
    from robosuite.controllers.parts.gripper.gripper_controller import GripperController
    from robosuite.controllers.parts.gripper.simple_grip import SimpleGripController
    from robosuite.controllers.parts.mobile_base.joint_vel import (
        MobileBaseJointVelocityController,
    )
    from robosuite.controllers.parts.mobile_base.mobile_base_controller import (
        MobileBaseController,
    )
    from robosuite.environments.base import MujocoEnv
    from robosuite.environments.robot_env import RobotEnv
    from robosuite.robots.wheeled_robot import WheeledRobot

    # the methods FusedStep writes out, each the class's own and not an override
    mirrored = {
        "env.step": (type(raw).step, MujocoEnv.step),
        "env._pre_action": (type(raw)._pre_action, RobotEnv._pre_action),
        "env._update_observables": (type(raw)._update_observables, MujocoEnv._update_observables),
    }
    if len(raw.robots) != 1:
        return f"{len(raw.robots)} robots (the fused step mirrors one)"
    robot = raw.robots[0]
    mirrored["robot.control"] = (type(robot).control, WheeledRobot.control)
    composite = robot.composite_controller
    if type(composite) is not HybridMobileBase:
        return f"composite controller {type(composite).__name__}, not HybridMobileBase"
    mirrored["composite.run_controller"] = (type(composite).run_controller, CompositeController.run_controller)
    mirrored["composite.update_state"] = (type(composite).update_state, CompositeController.update_state)
    expected = {"right": OperationalSpaceController, "torso": JointPositionController,
                "base": MobileBaseJointVelocityController, "right_gripper": SimpleGripController}
    parts = composite.part_controllers
    # in any order (RoboCasa's robot lists the gripper second): the parts write disjoint actuators. The base may be a
    # subclass that overrides only what the first substep runs stock (RoboCasa's legacy base controller re-reads the
    # forward axis in set_goal): the methods written out below must be the mirrored class's own.
    exact = lambda part: type(parts[part]) is expected[part] or (  # noqa: E731
        part == "base" and isinstance(parts[part], expected[part]))
    if set(parts) != set(expected) or not all(exact(p) for p in expected):
        return f"part controllers {[(p, type(c).__name__) for p, c in parts.items()]}, not {list(expected)}"
    for part, base in (("right", Controller), ("torso", Controller), ("base", MobileBaseController),
                       ("right_gripper", GripperController)):
        mirrored[f"{part}.update"] = (type(parts[part]).update, base.update)
        mirrored[f"{part}.run_controller"] = (type(parts[part]).run_controller, expected[part].run_controller)
    if not all(robot._enabled_parts.get(p, False) for p in parts):
        return "a part controller is disabled"
    osc, torso, base, gripper = (parts[p] for p in expected)
    settings = {
        "lite_physics": raw.lite_physics is True and osc.lite_physics is True and torso.lite_physics is True,
        "no viewer": raw.viewer is None and not raw.has_renderer,
        "osc: fixed impedance, delta input in the base frame, decoupled, no interpolators": (
            osc.impedance_mode == "fixed" and osc.input_type == "delta" and osc.input_ref_frame == "base"
            and osc.uncoupling is True and osc.interpolator_pos is None and osc.interpolator_ori is None
            and osc.num_ref_sites == 1 and osc.ref_name is not None),
        "torso: torque-compensated, no interpolator": (torso.interpolator is None and torso.use_torque_compensation
                                                       and torso.ref_name is None),
        "base and gripper: no interpolator, action scaling on the gripper": (
            base.interpolator is None and gripper.interpolator is None and gripper.use_action_scaling is True),
    }
    for name, (have, stock) in mirrored.items():
        if have is not stock:
            return f"{name} is overridden ({have.__qualname__})"
    for name, ok in settings.items():
        if not ok:
            return f"settings differ from the mirrored ones: {name}"
    return None


class FusedStep:
    """``env.step`` of robosuite 1.5.2 (``MujocoEnv.step``) for the controller stack :func:`fused_step_problem`
    accepts, its non-policy substeps written out (each block names the robosuite method it mirrors)."""

    def __init__(self, raw):
        import mujoco
        from robosuite.utils.control_utils import (
            nullspace_torques,
            opspace_matrices,
            orientation_error,
        )
        from robosuite.utils.transform_utils import mat2quat

        self.raw = raw
        self._mj = mujoco
        self._mat2quat = mat2quat
        self._kernels = (opspace_matrices, nullspace_torques, orientation_error)
        self.substeps = int(raw.control_timestep / raw.model_timestep)
        self.composite = self.model = None
        self.problem: Optional[str] = None
        # the substeps between the first and the last, compiled (robosuite_kernels), where numpy's BLAS can be called;
        # a numba or llvmlite that fails to import or compile leaves them in Python, with the reason recorded
        self._substep_controls = None
        # and, where MuJoCo's C functions can be called from numba, all of them in one compiled call
        self._middle_substeps = None
        try:
            from robocasa_shift.backends import mujoco_calls, numpy_blas, robosuite_kernels

            self.compiled_problem = numpy_blas.problem()
            self._substep_controls = robosuite_kernels.substep_controls
            self.loop_problem = mujoco_calls.problem(full_m="dst, M")
            if self.compiled_problem is None and self.loop_problem is None:
                self._middle_substeps = robosuite_kernels.middle_substeps
        except Exception as exc:
            self.compiled_problem = f"compiled substeps unavailable ({type(exc).__name__}: {exc})"
        if self.compiled_problem is not None:
            self.loop_problem = self.compiled_problem

    def _bind(self) -> None:
        """Handles and constants of the current controllers and model: robosuite builds new controllers on every
        reset (and a new model on a hard one), so this runs whenever they changed, and checks them again."""
        raw = self.raw
        self.problem = fused_step_problem(raw)
        self.sim = raw.sim
        self.robot = raw.robots[0]
        self.composite = self.robot.composite_controller
        self.model = self.sim.model._model
        self.data = self.sim.data._data
        if self.problem is not None:
            return
        parts = self.composite.part_controllers
        self.osc, self.torso, self.base, self.gripper = (parts[p] for p in ("right", "torso", "base", "right_gripper"))
        model, name2id = self.model, self.sim.model.site_name2id
        self.nv = model.nv
        osc = self.osc
        # CompositeController.get_controller_base_pose's and OSC.run_controller's site, and the OSC's reference site
        self.arm_center = name2id(f"{osc.naming_prefix}{osc.part_name}_center")
        self.grip_site = name2id(osc.ref_name)
        # fancy indices as arrays: numpy turns the lists robosuite holds into these on every use
        index = lambda idx: np.asarray(idx, dtype=np.intp)  # noqa: E731
        self.osc_qpos, self.osc_qvel = index(osc.qpos_index), index(osc.qvel_index)
        self.torso_qpos, self.torso_qvel = index(self.torso.qpos_index), index(self.torso.qvel_index)
        self.base_qpos, self.base_qvel = index(self.base.qpos_index), index(self.base.qvel_index)
        self.grip_qpos, self.grip_qvel = index(self.gripper.qpos_index), index(self.gripper.qvel_index)
        # WheeledRobot.control: each part's actuators and their control range (model constants)
        self.part_order = list(parts)
        self.actuation = []
        for part in parts:
            idx = index(self.robot._ref_actuators_indexes_dict[part])
            self.actuation.append((part, idx, model.actuator_ctrlrange[idx, 0], model.actuator_ctrlrange[idx, 1]))
        # the velocity controllers' affine map from [-1, 1] to the actuator range (constants of constants)
        self.base_bias, self.base_weight = self._affine(self.base)
        self.grip_bias, self.grip_weight = self._affine(self.gripper)
        # scratch the MuJoCo calls below fill completely (mj_fullM and mj_jacSite zero their outputs first)
        self.full = np.empty((self.nv, self.nv))
        self.jacobians = {site: (np.empty((3, self.nv)), np.empty((3, self.nv)))
                          for site in (self.arm_center, self.grip_site)}
        # fixed impedance: the gains never change, and their halves are views
        self.kp_pos, self.kp_ori, self.kd_pos, self.kd_ori = osc.kp[0:3], osc.kp[3:6], osc.kd[0:3], osc.kd[3:6]
        # the compiled substeps: MuJoCo's arrays (views that live as long as this MjData) and the actuators
        d = self.data
        self.qM = d.qM
        self.data_arrays = (d.site_xpos, d.site_xmat, d.qpos, d.qvel, d.qfrc_bias, d.ctrl)
        # the kernel's fixed order (arm, torso, base, gripper), whatever the robot's
        ranges = {part: (idx, low, high) for part, idx, low, high in self.actuation}
        self.actuator_ranges = tuple(ranges[part] for part in KERNEL_PARTS)

    @staticmethod
    def _affine(ctrl):
        ctrl_range = np.stack([ctrl.actuator_min, ctrl.actuator_max], axis=-1)
        return 0.5 * (ctrl_range[:, 1] + ctrl_range[:, 0]), 0.5 * (ctrl_range[:, 1] - ctrl_range[:, 0])

    # ------------------------------------------------------------------ MujocoEnv.step

    def step(self, action):
        """One control step, as ``MujocoEnv.step`` takes it (lite physics, no viewer)."""
        raw = self.raw
        if (raw.robots[0].composite_controller is not self.composite or raw.sim.model._model is not self.model
                or raw.sim.data._data is not self.data):
            self._bind()
        if self.problem is not None:  # not the stack this mirrors (any more): robosuite's own step
            return type(raw).step(raw, action)
        if raw.done:
            raise ValueError("executing action in terminated episode")
        # RobotEnv._pre_action's and WheeledRobot.control's checks, once: the action is the same every substep
        assert len(action) == raw.action_dim, "environment got invalid action dimension -- expected {}, got {}".format(
            raw.action_dim, len(action))
        raw.timestep += 1
        sim, timestep, cache = self.sim, raw.model_timestep, raw._obs_cache
        clock = SharedClock.of(raw._observables.values())
        last = self.substeps - 1
        looped = False
        for i in range(self.substeps):
            if looped and i < last:  # run by the compiled loop, right after the first substep
                continue
            sim.step1()
            if i == 0:  # the policy step: new goals, then the torques, then the robot's history buffers
                self.composite.set_goal(action)
                self._control()
                self._push_history(action)
                compiled = self._compiled_arguments()
            elif compiled is None or i == last:
                self._control()  # the goals are set: the action is not read again
            else:  # the controllers' attributes are the last substep's business: only the controls are computed
                self._compiled_control(compiled)
            sim.step2()
            if clock is not None:
                clock.update(timestep, cache)
            else:
                for observable in raw._observables.values():  # MujocoEnv._update_observables
                    observable.update(timestep=timestep, obs_cache=cache, force=False)
            if i == 0 and compiled is not None:
                looped = self._compiled_loop(compiled, last - 1, clock, timestep, cache)
        if clock is not None:
            clock.write_back()
        raw.cur_time += raw.control_timestep
        reward, done, info = raw._post_action(action)
        return raw._get_observations(), reward, done, info

    # ------------------------------------------------------------------ WheeledRobot.control(policy_step=False)

    def _control(self) -> None:
        d = self.data
        # CompositeController.run_controller: update_state (the arm's origin), then each part in order
        osc = self.osc
        osc.origin_pos = np.array(d.site_xpos[self.arm_center])
        osc.origin_ori = np.array(d.site_xmat[self.arm_center].reshape([3, 3]))
        applied = self.composite._applied_action_dict
        applied.clear()
        # Controller.update's mass matrix: the arm's and the torso's come from the same qM (nothing moves between)
        full = self.full
        self._mj.mj_fullM(self.model, full, d.qM)
        for part in self.part_order:  # CompositeController.run_controller's order, which the dict keeps
            if part == "right":
                applied[part] = self._osc(full)
            elif part == "torso":
                applied[part] = self._torso(full)
            elif part == "base":
                applied[part] = self._velocity(self.base, self.base_qpos, self.base_qvel, self.base_bias,
                                               self.base_weight)
            else:
                applied[part] = self._velocity(self.gripper, self.grip_qpos, self.grip_qvel, self.grip_bias,
                                               self.grip_weight)
        ctrl = d.ctrl
        for part, idx, low, high in self.actuation:
            ctrl[idx] = _clip(applied[part], low, high)

    def _compiled_arguments(self) -> Optional[tuple]:
        """The arguments of ``robosuite_kernels.substep_controls`` over this control step (the goals just set, the
        base's and gripper's velocities the first substep computed), or None when compiled substeps are unavailable."""
        if self.compiled_problem is not None:
            return None
        osc, torso = self.osc, self.torso
        return (self.full, *self.jacobians[self.grip_site], *self.jacobians[self.arm_center],
                (self.grip_site, self.arm_center, self.osc_qpos, self.osc_qvel, osc.goal_pos, osc.goal_ori,
                 osc.initial_joint, osc.kp, osc.kd),
                (self.torso_qpos, self.torso_qvel, torso.goal_qpos, torso.kp, torso.kd),
                self.base.vels, self.gripper.vels, self.actuator_ranges)

    def _compiled_control(self, arguments: tuple) -> None:
        """A substep between the first and the last: MuJoCo's mass matrix and site Jacobians as :meth:`_control`
        gets them, then the controls from ``robosuite_kernels.substep_controls``."""
        mj, model, data = self._mj, self.model, self.data
        mj.mj_fullM(model, self.full, self.qM)
        for site, (jacp, jacr) in self.jacobians.items():
            mj.mj_jacSite(model, data, jacp, jacr, site)
        self._substep_controls(*self.data_arrays, *arguments)

    def _compiled_loop(self, compiled: tuple, count: int, clock: Optional["SharedClock"], timestep: float,
                       cache: Dict[str, Any]) -> bool:
        """Substeps 1 to ``count`` in compiled calls (``robosuite_kernels.middle_substeps``), each call running up to a
        substep after which the observables sample, which they then do from that substep's state as they would have.
        Between the substeps nothing else may run: ``sim.step2`` must be robosuite's own or the harness's watch, which
        only counts them; anything else wrapped around the simulator's calls (a profiler, a recorder of controls)
        gets them one by one from Python. Whether it ran them."""
        if self._middle_substeps is None or clock is None or count <= 0:
            return False
        owned = vars(self.sim)
        watch = owned.get("step2")
        hook = getattr(watch, "before_integration", None)
        if "step1" in owned or (watch is not None and hook is None):
            return False
        arguments = (self.model._address, self.data._address, self.qM, self.arm_center,
                     self.grip_site, *self.data_arrays, *compiled)
        done = 0
        while done < count:
            run = clock.until_sample(timestep, count - done)
            self._middle_substeps(run, *arguments)
            for _ in range(run):  # what the Python substeps did besides MuJoCo and the controls: count and tick
                if hook is not None:
                    hook()
                clock.update(timestep, cache)  # the run's last update may sample: from this state, as it would
            done += run
        return True

    def _push_history(self, action) -> None:
        """The end of ``WheeledRobot.control`` on a policy step, verbatim: the robot's history buffers."""
        robot = self.robot
        robot.recent_qpos.push(robot._joint_positions)
        robot.recent_actions.push(action)
        robot.recent_torques.push(robot.torques)
        for arm in robot.arms:
            controller = robot.part_controllers.get(arm, None)
            if controller is None:
                continue
            robot.recent_ee_forcetorques[arm].push(np.concatenate((robot.ee_force[arm], robot.ee_torque[arm])))
            robot.recent_ee_pose[arm].push(np.concatenate((controller.ref_pos, self._mat2quat(controller.ref_ori_mat))))
            robot.recent_ee_vel[arm].push(np.concatenate((controller.ref_pos_vel, controller.ref_ori_vel)))
            robot.recent_ee_vel_buffer[arm].push(np.concatenate((controller.ref_pos_vel, controller.ref_ori_vel)))
            diffs = np.vstack(
                [robot.recent_ee_acc[arm].current, robot.control_freq * np.diff(robot.recent_ee_vel_buffer[arm].buf, axis=0)]
            )
            ee_acc = np.array([np.convolve(col, np.ones(10) / 10.0, mode="valid")[0] for col in diffs.transpose()])
            robot.recent_ee_acc[arm].push(ee_acc)

    def _site_jacobians(self, site: int):
        """``MjData.get_site_jacp`` and ``get_site_jacr`` in one ``mj_jacSite`` call (MuJoCo computes the two
        independently, from the same state, whether one or both are asked for)."""
        jacp, jacr = self.jacobians[site]
        self._mj.mj_jacSite(self.model, self.data, jacp, jacr, site)
        return jacp, jacr

    def _osc(self, full_mass_matrix: np.ndarray) -> np.ndarray:
        """``OperationalSpaceController.run_controller`` (fixed impedance, base frame, decoupled, no interpolators)."""
        c, d = self.osc, self.data
        opspace_matrices, nullspace_torques, orientation_error = self._kernels
        qvel = d.qvel
        if c.new_update:  # Controller.update (lite physics: no forward) and _update_single_reference
            site = self.grip_site
            c.ref_pos[:] = d.site_xpos[site]
            c.ref_ori_mat[:, :] = d.site_xmat[site].reshape([3, 3])
            # robosuite evaluates the site's Jacobians twice (for the velocities, then for J): same state, same values
            jacp, jacr = self._site_jacobians(site)
            c.ref_pos_vel[:] = np.dot(jacp, qvel)
            c.ref_ori_vel[:] = np.dot(jacr, qvel)
            c.J_pos[:, :] = jacp.reshape((3, -1))[:, self.osc_qvel]
            c.J_ori[:, :] = jacr.reshape((3, -1))[:, self.osc_qvel]
            c.J_full[:3] = c.J_pos  # np.vstack([J_pos, J_ori]) written into J_full: the same copy
            c.J_full[3:] = c.J_ori
            c.joint_pos = d.qpos[self.osc_qpos]
            c.joint_vel = qvel[self.osc_qvel]
            # two fancy indexings, as robosuite's: the result is Fortran-ordered, and numba compiles per layout
            c.mass_matrix = full_mass_matrix[self.osc_qvel, :][:, self.osc_qvel]
            c.new_update = False
        desired_world_pos = c.origin_pos + np.dot(c.origin_ori, c.goal_pos)
        desired_world_ori = np.dot(c.origin_ori, c.goal_ori)
        ori_error = orientation_error(desired_world_ori, c.ref_ori_mat)
        position_error = desired_world_pos - c.ref_pos
        center_jacp, center_jacr = self._site_jacobians(self.arm_center)
        base_pos_vel = np.dot(center_jacp, qvel)
        vel_pos_error = -(c.ref_pos_vel - base_pos_vel)
        desired_force = np.multiply(position_error, self.kp_pos) + np.multiply(vel_pos_error, self.kd_pos)
        base_ori_vel = np.dot(center_jacr, qvel)
        vel_ori_error = -(c.ref_ori_vel - base_ori_vel)
        desired_torque = np.multiply(ori_error, self.kp_ori) + np.multiply(vel_ori_error, self.kd_ori)
        lambda_full, lambda_pos, lambda_ori, nullspace_matrix = opspace_matrices(c.mass_matrix, c.J_full, c.J_pos, c.J_ori)
        decoupled_wrench = np.concatenate([np.dot(lambda_pos, desired_force), np.dot(lambda_ori, desired_torque)])
        c.torques = np.dot(c.J_full.T, decoupled_wrench) + d.qfrc_bias[self.osc_qvel]
        c.torques += nullspace_torques(c.mass_matrix, nullspace_matrix, c.initial_joint, c.joint_pos, c.joint_vel)
        c.new_update = True
        return c.torques

    def _torso(self, full_mass_matrix: np.ndarray) -> np.ndarray:
        """``JointPositionController.run_controller`` (fixed impedance, torque compensation, no interpolator)."""
        c, d = self.torso, self.data
        if c.goal_qpos is None:
            c.set_goal(np.zeros(c.control_dim))
        if c.new_update:  # Controller.update without a reference site
            c.joint_pos = d.qpos[self.torso_qpos]
            c.joint_vel = d.qvel[self.torso_qvel]
            c.mass_matrix = full_mass_matrix[self.torso_qvel, :][:, self.torso_qvel]
            c.new_update = False
        position_error = c.goal_qpos - c.joint_pos
        desired_torque = np.multiply(position_error, c.kp) + np.multiply(-c.joint_vel, c.kd)
        c.torques = np.dot(c.mass_matrix, desired_torque) + d.qfrc_bias[self.torso_qvel]
        c.new_update = True
        return c.torques

    def _velocity(self, c, qpos_index, qvel_index, bias, weight) -> np.ndarray:
        """``MobileBaseJointVelocityController`` / ``SimpleGripController.run_controller`` (no interpolator): the goal
        velocity mapped from [-1, 1] onto the actuator range."""
        if c.goal_qvel is None:
            c.set_goal(np.zeros(c.control_dim))
        d = self.data
        if c.new_update:  # MobileBaseController.update / GripperController.update
            c.joint_pos = d.qpos[qpos_index]
            c.joint_vel = d.qvel[qvel_index]
            c.new_update = False
        c.vels = bias + weight * np.array(c.goal_qvel)
        c.new_update = True
        return c.vels


def contact_check_problem(raw) -> Optional[str]:
    """Why :class:`ContactCheck` does not answer this environment's ``check_contact``, or None when it does."""
    from robosuite.environments.base import MujocoEnv

    if type(raw).check_contact is not MujocoEnv.check_contact:
        return f"check_contact is overridden ({type(raw).check_contact.__qualname__})"
    return None


class ContactCheck:
    """``MujocoEnv.check_contact`` of robosuite 1.5.2 (``sim_utils.check_contact``) and 1.4.0 (the same loop, in the
    method itself; LIBERO's fast path uses this too), from geom ids.

    robosuite tests, for each of the first ``ncon`` contacts, whether the name of each of its two geoms is in each
    group (``name in group``; unnamed geoms are named None, which no group of names holds) and returns True at the
    first contact joining the groups. A geom's membership is a function of its id and the group, so it is tabulated
    once per model and group with robosuite's own ``geom_id2name`` and the same ``in`` test, and the contacts are
    tested together: the same answer. Groups that are not strings, models or collections of strings are passed to
    robosuite's own method.
    """

    def __init__(self, raw):
        from robosuite.models.base import MujocoModel

        self.raw = raw
        self.model = None
        self.tables: Dict[frozenset, np.ndarray] = {}
        self._model_type = MujocoModel

    def __call__(self, geoms_1, geoms_2=None) -> bool:
        raw = self.raw
        sim = raw.sim
        group_1, group_2 = self._names(geoms_1), (None if geoms_2 is None else self._names(geoms_2))
        if group_1 is None or (geoms_2 is not None and group_2 is None):
            return type(raw).check_contact(raw, geoms_1, geoms_2)
        if sim.model is not self.model:  # RoboCasa's kitchens build a new model at every reset
            self.model, self.tables = sim.model, {}
        ncon = sim.data.ncon
        if ncon == 0:
            return False
        contacts = sim.data._data.contact
        first, second = contacts.geom1[:ncon], contacts.geom2[:ncon]
        in_1 = self._table(group_1)
        if group_2 is None:  # any contact with the first group
            return bool(in_1[first].any() or in_1[second].any())
        in_2 = self._table(group_2)
        return bool((in_1[first] & in_2[second]).any() or (in_2[first] & in_1[second]).any())

    def _names(self, geoms) -> Optional[frozenset]:
        """The group's names as robosuite reads them, or None for a group it is not certain to read the same way."""
        if type(geoms) is frozenset:  # the harness's own groups (the grasp predicates')
            return geoms
        if type(geoms) is str:
            return frozenset((geoms,))
        if isinstance(geoms, self._model_type):
            geoms = geoms.contact_geoms
        if type(geoms) in (list, tuple, set, frozenset) and all(type(name) is str for name in geoms):
            return frozenset(geoms)
        return None

    def _table(self, names: frozenset) -> np.ndarray:
        """Whether each geom id's name is in ``names``, for the current model."""
        table = self.tables.get(names)
        if table is None:
            id2name = self.model.geom_id2name
            table = np.array([id2name(i) in names for i in range(self.model._model.ngeom)], dtype=bool)
            self.tables[names] = table
        return table


class JointAddresses:
    """``MjModel.get_joint_qpos_addr`` with each name's answer kept: a joint's type and address are constants of the
    compiled model, and RoboCasa builds a new model (and gets a new instance of this) at every reset."""

    def __init__(self, model):
        self.lookup = type(model).get_joint_qpos_addr.__get__(model)
        self.addresses: Dict[str, Any] = {}

    def __call__(self, name):
        if type(name) is not str:  # not a key robosuite's name table could hold: its own lookup (and error)
            return self.lookup(name)
        address = self.addresses.get(name)
        if address is None:  # an int or a (start, end) tuple: immutable, so the kept one is as good as a new one
            address = self.addresses[name] = self.lookup(name)
        return address


class SharedClock:
    """``Observable.update`` for observables that keep one clock, kept once.

    Each enabled observable of robosuite adds the substep to its own time since its last sample,
    every substep, and samples when that time says so. Observables with the same sampling period,
    the same time, the same sampled flag and no delay (robosuite's default) do the very same float
    operations in lockstep, so their clock is kept once here: the members sample at the substeps
    and in the order they would have, each with robosuite's own sampling code, and the clock is
    written back into every member at the end of the control step (nothing reads it in between).
    """

    def __init__(self, members, period: float, time: float, sampled: bool, delay: float, delayer):
        self.members, self.period, self.time, self.sampled, self.delay = members, period, time, sampled, delay
        self.delayer = delayer

    @classmethod
    def of(cls, observables) -> Optional["SharedClock"]:
        """The clock of the enabled ``observables``, or None when they do not keep one (robosuite's own update then)."""
        from robosuite.utils.observables import NO_DELAY

        members = [o for o in observables if o._enabled]
        if not members:
            return None
        first = members[0]
        state = (first._sampling_timestep, first._time_since_last_sample, first._sampled, first._current_delay)
        for o in members:
            if (o._sampling_timestep, o._time_since_last_sample, o._sampled, o._current_delay) != state or o._delayer is not NO_DELAY:
                return None
        return cls(members, *state, NO_DELAY)

    def until_sample(self, timestep: float, limit: int) -> int:
        """How many of the next ``limit`` updates run up to the first in which the members sample (or warn), that
        one included; ``limit`` when none does. A prediction: the clock is not changed."""
        time, sampled = self.time, self.sampled
        for count in range(1, limit + 1):  # update's arithmetic and branches, on copies
            time += timestep
            if not sampled and self.period - self.delay >= time:
                return count
            if time >= self.period:
                if not sampled:
                    return count
                time %= self.period
                sampled = False
        return limit

    def update(self, timestep: float, cache: Dict[str, Any]) -> None:
        """One substep of every member's ``Observable.update(timestep, cache, force=False)``."""
        self.time += timestep
        if not self.sampled and self.period - self.delay >= self.time:
            for o in self.members:
                self._sample(o, cache)
            self.sampled = True
            self.delay = self.delayer()
        if self.time >= self.period:
            if not self.sampled:
                for o in self.members:
                    print(f"Warning: sampling rate for observable {o.name} is either too low or delay is too high. "
                          f"Please adjust one (or both)")
                    self._sample(o, cache)
                self.delay = self.delayer()
            self.time %= self.period
            self.sampled = False

    @staticmethod
    def _sample(o, cache: Dict[str, Any]) -> None:
        """The sampling lines of ``Observable.update``, verbatim."""
        obs = np.array(o._filter(o._corrupter(o._sensor(cache))))
        o._current_observed_value = obs[0] if len(obs.shape) == 1 and obs.shape[0] == 1 else obs
        cache[o.name] = np.array(o._current_observed_value)

    def write_back(self) -> None:
        """Every member's clock as its own updates would have left it."""
        for o in self.members:
            o._time_since_last_sample, o._sampled, o._current_delay = self.time, self.sampled, self.delay
