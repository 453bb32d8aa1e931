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

VERIFIED_ROBOSUITE = "1.4.0"
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


def enable(raw, before_integration: Callable[[], None]) -> Dict[str, Any]:
    """Step ``raw`` with :class:`ElidedForwardStep` where :func:`problem` allows; what was done (for the manifest).
    ``before_integration`` is called before each substep's integration, as the harness's watch on ``sim.step`` is."""
    why = problem(raw)
    if why is not None:
        return {"enabled": False, "reason": why}
    raw.step = ElidedForwardStep(raw, before_integration).step  # an instance attribute: the class is untouched
    return {"enabled": True, "robosuite": VERIFIED_ROBOSUITE, "elided_forward": True}


def disable(raw) -> None:
    """Stock robosuite again."""
    vars(raw).pop("step", None)


class ElidedForwardStep:
    """``BDDLBaseDomain.step`` around robosuite 1.4's ``MujocoEnv.step``, one evaluation of the dynamics per substep."""

    def __init__(self, raw, before_integration: Callable[[], None]):
        import mujoco

        self.raw, self._mj, self.before_integration = raw, mujoco, before_integration
        self.substeps = int(raw.control_timestep / raw.model_timestep)

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
        policy_step = True
        for _ in range(self.substeps):
            if not self._valid(data):  # MuJoCo's own checks would reset it: exactly stock
                sim.forward()
                raw._pre_action(action, policy_step)
                sim.step()
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
            raw._update_observables()
            policy_step = False
        raw.cur_time += raw.control_timestep
        reward, done, info = raw._post_action(action)
        observations = raw.viewer._get_observations() if raw.viewer_get_obs else raw._get_observations()
        return observations, reward, done, info

    @staticmethod
    def _valid(data) -> bool:
        """What ``mj_checkPos`` and ``mj_checkVel`` accept (NaN fails both comparisons)."""
        return bool(np.all(np.abs(data.qpos) <= MJMAXVAL) and np.all(np.abs(data.qvel) <= MJMAXVAL))

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
