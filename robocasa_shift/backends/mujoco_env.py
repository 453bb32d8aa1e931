"""What the MuJoCo-based backends (robosuite, RoboCasa, LIBERO) share: state, fingerprint, lights, cameras, rendering.

A subclass builds its robosuite environment into ``self.raw``, sets
``render_profile``, the camera tuples and ``BASE_JOINTS``, and calls
:meth:`MujocoEnv.bind` whenever the MuJoCo model is (re)built. It implements
``reset``, ``step``, ``is_success``, ``proprio``, ``privileged_state`` and the
base-offset hooks, which differ between the embedded scenes and kitchens.
robosuite 1.5 (robosuite, RoboCasa) and 1.4 (LIBERO) differ in how a robot holds
its gripper, grasp site and controllers; :meth:`bind` reads either.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift.backends.mujoco_render import CulledRenderer, free, make_current
from robocasa_shift.core.backend import PerturbableModel, PerturbableTable
from robocasa_shift.embodiments.panda_omron import LAYOUT
from robocasa_shift.errors import UnknownNameError

# Key prefix of a snapshot entry naming the attribute another one shares its array with.
ALIAS = "alias:"
# Controller attributes that carry state from one control step to the next.
CONTROLLER_STATE_ATTRS = ("goal_pos", "goal_ori", "goal_qpos", "goal_qvel", "init_pos", "init_ori")
# cull: leave out the geoms that cannot show (mujoco_render; exact only where nothing unseen casts a shadow or a
# reflection, so only a profile without them allows it, and never with the stock simulator)
RENDER_PROFILES = {
    "fast": {"shadows": False, "reflections": False, "offsamples": 0, "cull": True},
    "default": {"shadows": True, "reflections": True, "offsamples": None, "cull": False},  # None: the model's own (4)
}
BASE_JOINTS = ("mobilebase0_joint_mobile_forward", "mobilebase0_joint_mobile_side", "mobilebase0_joint_mobile_yaw")
# Every MuJoCo model value a perturbation may edit (names are part of every env_fingerprint: keep them).
PERTURBABLE = PerturbableTable(
    (
        ("light_diffuse", "light_diffuse"),
        ("light_ambient", "light_ambient"),
        ("light_specular", "light_specular"),
        ("headlight_diffuse", "vis.headlight.diffuse"),
        ("headlight_ambient", "vis.headlight.ambient"),
        ("headlight_specular", "vis.headlight.specular"),
        ("cam_quat", "cam_quat"),
        ("cam_pos", "cam_pos"),
        ("cam_fovy", "cam_fovy"),
    )
)
LIGHT_FIELDS = tuple(name for name in PERTURBABLE.names if "light_" in name)
# A base offset is invalid if it creates a robot contact that penetrates deeper than this.
PENETRATION_TOL_M = 1e-4


def check_render_profile(render_profile: str) -> None:
    """Refuse an unknown render profile, listing the known ones."""
    if render_profile not in RENDER_PROFILES:
        raise UnknownNameError("render profile", render_profile, list(RENDER_PROFILES))


class MujocoEnv(PerturbableModel):
    """Shared half of a live MuJoCo environment (see the module docstring for the subclass's half)."""

    PERTURBABLE = PERTURBABLE
    LIGHT_FIELDS = LIGHT_FIELDS
    third_person_cameras: Sequence[str] = ()
    wrist_cameras: Sequence[str] = ()
    render_profile = "fast"
    # True: the simulator's own code only (no frame culling here; no fused step where a subclass has one). Records are
    # identical either way; a switch to rule the shortcuts out. Read at every render, so it may be flipped between them.
    stock_simulator = False
    # what the subclass's fast path did (its module's enable()), or why none ran
    fastpath: Dict[str, Any] = {"enabled": False, "reason": "no fast path for this backend"}
    action_layout = LAYOUT  # PandaOmron's 12-D action (robosuite, RoboCasa); LIBERO's fixed Panda has its own
    BASE_JOINTS: Sequence[str] = BASE_JOINTS  # the mobile base's joints (none on a fixed base)

    def bind(self) -> None:
        """Read the handles of the current MuJoCo model (after construction, or after a model rebuild)."""
        import mujoco

        self._mujoco = mujoco
        self.sim = self.raw.sim
        self.model = self.sim.model._model
        self.data = self.sim.data._data
        self.robot = self.raw.robots[0]
        gripper, site = self.robot.gripper, self.robot.eef_site_id
        # robosuite 1.5 keys them by arm ("right"); 1.4 holds the one arm's directly
        self.gripper = gripper["right"] if isinstance(gripper, dict) else gripper
        self._eef_site = site["right"] if isinstance(site, dict) else site
        self._cam_ids = {c: self.sim.model.camera_name2id(c) for c in tuple(self.third_person_cameras) + tuple(self.wrist_cameras)}
        self._base_qpos_adr = [self.model.jnt_qposadr[self.sim.model.joint_name2id(j)] for j in self.BASE_JOINTS]
        self._robot_root = self.sim.model.body_name2id(self.robot.robot_model.root_body)
        self._watch_last_substep()

    # ------------------------------------------------------------------ stepping

    def _watch_last_substep(self) -> None:
        """Keep the physics state from just before the last substep of each control step.

        robosuite ends a control step with MuJoCo's integration, so the derived quantities the
        step leaves (body poses that renders read, contacts that predicates read) belong to the
        state before it. Restoring a snapshot with ``mj_forward`` would recompute them on the
        final state instead; re-running that last integration from this state gives them back
        bit for bit. robosuite 1.5's loop (``step1``/``forward``, controller, ``step2``/``step``
        per substep, ``lite_physics``) is what this relies on; fidelity checks fail loudly if it changes.
        """
        self._substep: Optional[int] = None
        self._before_last: Optional[tuple] = None  # (control step, integration state)
        self._substeps = int(self.raw.control_timestep / self.raw.model_timestep)  # robosuite's own count
        for name in [n for n in ("step", "step2") if hasattr(type(self.sim), n)]:  # 1.4 has no step2
            original = getattr(type(self.sim), name).__get__(self.sim)

            def integrate(*args, _original=original, **kwargs):
                self._before_integration()
                return _original(*args, **kwargs)

            # a compiled loop of substeps (robosuite_fastpath) calls the watch itself when it is this one
            integrate.before_integration = self._before_integration
            setattr(self.sim, name, integrate)

    def _before_integration(self, integration: Optional[np.ndarray] = None) -> None:
        """Called just before each substep's integration (a fast path that integrates by itself calls it too; its
        compiled loops of substeps call it after the loop, once per substep run, handing over the ``integration``
        state they kept from before the last substep's integration when they ran that one)."""
        if self._substep is not None:
            self._substep += 1
            if self._substep == self._substeps:
                self._before_last = (self.steps + 1, self._integration() if integration is None else integration.copy())

    def step(self, action: np.ndarray) -> None:
        """One control step of robosuite's ``env.step`` (the embodiment's action: 12-D PandaOmron, 7-D Panda)."""
        self._obs, _, _, _ = self._raw_step(self.raw_action(action))
        self.steps += 1

    def raw_action(self, action: np.ndarray) -> np.ndarray:
        """The array ``self.raw.step`` takes for the harness's ``action``: a copy, since robosuite 1.5's mobile-base
        controller rotates the base command of the array it is given in place (and keeps it as its goal), which
        would change the caller's action, and the step log's."""
        return np.array(action, dtype=np.float64)

    def is_success(self) -> bool:
        """The environment's own success check: the official outcome (LIBERO's: every conjunct of the BDDL goal)."""
        return bool(self.raw._check_success())

    def _raw_step(self, action: np.ndarray):
        """robosuite's ``env.step``, watching its substeps (see :meth:`_watch_last_substep`)."""
        self._substep = 0
        try:
            return self.raw.step(action)
        finally:
            self._substep = None

    def _integration(self) -> np.ndarray:
        mj = self._mujoco
        integration = np.empty(mj.mj_stateSize(self.model, mj.mjtState.mjSTATE_INTEGRATION), dtype=np.float64)
        mj.mj_getState(self.model, self.data, integration, mj.mjtState.mjSTATE_INTEGRATION)
        return integration

    # ------------------------------------------------------------------ rendering

    def _render_context(self):
        """The harness's own offscreen context (robosuite's binding), built on first use with the render profile's flags."""
        if self._context is None:
            from robosuite.utils.binding_utils import MjRenderContextOffscreen

            profile = RENDER_PROFILES[self.render_profile]
            if profile["offsamples"] is not None:
                # read when the offscreen framebuffer is created, so set it first
                self.model.vis.quality.offsamples = profile["offsamples"]
            self._context = MjRenderContextOffscreen(self.sim, device_id=-1)
            flags = self._context.scn.flags
            flags[self._mujoco.mjtRndFlag.mjRND_SHADOW] = int(profile["shadows"])
            flags[self._mujoco.mjtRndFlag.mjRND_REFLECTION] = int(profile["reflections"])
        return self._context

    def render(self, camera: str, size: int) -> np.ndarray:
        """One RGB frame (uint8, size x size x 3, top row first) of the current state."""
        camera_id = self._cam_ids.get(camera, self.sim.model.camera_name2id(camera))
        return self._renderer().render(camera_id, size, cull=self.culling)

    @property
    def culling(self) -> bool:
        """Whether frames leave out the geoms that cannot show (the profile allows it and the simulator is not stock)."""
        return bool(RENDER_PROFILES[self.render_profile]["cull"]) and not self.stock_simulator

    def set_stock_simulator(self, stock: bool) -> None:
        """Turn the backend's shortcuts off (``stock``) or on, between rollouts: records are identical either way."""
        self.stock_simulator = bool(stock)
        if stock:
            self._disable_fastpath()
            self.fastpath = {"enabled": False, "reason": "stock simulator requested"}
        else:
            self.fastpath = self._enable_fastpath()

    def _enable_fastpath(self) -> Dict[str, Any]:
        """The subclass's fast path applied to ``self.raw``: what it did (for the manifest)."""
        return {"enabled": False, "reason": "no fast path for this backend"}

    def _disable_fastpath(self) -> None:
        """The subclass's fast path taken off ``self.raw``."""

    def simulator_info(self) -> Dict[str, Any]:
        """What ran of the harness's bit-identical shortcuts, for manifests (none when ``stock_simulator``): culling,
        the fast path (fused step, compiled substeps, or why not) and numba's version."""
        from importlib import metadata

        versions = {}
        for package in ("numba", "llvmlite"):
            try:
                versions[package] = metadata.version(package)
            except metadata.PackageNotFoundError:
                versions[package] = None
        return {"stock_simulator": self.stock_simulator, "culling": self.culling, "fastpath": self.fastpath, **versions}

    def _renderer(self) -> CulledRenderer:
        """The renderer of the current render context (mujoco_render: out-of-view and hidden geoms left out)."""
        ctx = self._render_context()
        renderer = getattr(self, "_culled_renderer", None)
        if renderer is None or renderer.ctx is not ctx or renderer.model is not self.model:
            self._culled_renderer = CulledRenderer(ctx, self.model, self.data)
        return self._culled_renderer

    def renderer_info(self) -> Dict[str, Any]:
        """GL backend, renderer string and render profile, for manifests."""
        info: Dict[str, Any] = {
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
            "LP_NUM_THREADS": os.environ.get("LP_NUM_THREADS"),
            "render_profile": self.render_profile,
            **RENDER_PROFILES[self.render_profile],
        }
        try:
            make_current(self._render_context())
            from OpenGL import GL

            info["gl_renderer"] = GL.glGetString(GL.GL_RENDERER).decode()
            info["gl_version"] = GL.glGetString(GL.GL_VERSION).decode()
        except Exception as exc:  # the renderer string is informative only
            info["gl_renderer"] = f"unknown ({type(exc).__name__}: {exc})"
        return info

    def close(self) -> None:
        """Free the render context and close robosuite's environment (and with it the model)."""
        self._free_render_context()
        self.raw.close()

    def _free_render_context(self) -> None:
        """Free the render context in its own GL context (see ``mujoco_render.free``)."""
        if self._context is not None:
            free(self._context)
            self._context = None
            self._culled_renderer = None

    def eef_pos(self) -> np.ndarray:
        """The gripper's grasp site in the world frame (a live view)."""
        return self.data.site_xpos[self._eef_site]

    # ------------------------------------------------------------------ capability: object points (judge crops)

    def outcome_points(self, names: Sequence[str]) -> List[np.ndarray]:
        """World positions of the named task points the subclass's ``point(name)`` knows, in order (others left out)."""
        out = []
        for name in names:
            try:
                out.append(np.array(self.point(name), dtype=float).reshape(3))
            except (KeyError, ValueError):
                continue
        return out

    def camera_frame(self, camera: str):
        """(world position, rotation with columns camera x, y, z, vertical field of view in degrees) of ``camera``."""
        cid = self.sim.model.camera_name2id(camera)
        return (np.array(self.data.cam_xpos[cid], dtype=float), np.array(self.data.cam_xmat[cid], dtype=float).reshape(3, 3),
                float(self.model.cam_fovy[cid]))

    # ------------------------------------------------------------------ state: snapshot, restore, fingerprint

    def _controllers(self):
        composite = getattr(self.robot, "composite_controller", None)  # robosuite 1.5; 1.4 has one arm controller
        return composite.part_controllers.items() if composite is not None else [("arm", self.robot.controller)]

    def _controller_state(self, full: bool) -> Dict[str, np.ndarray]:
        """Controller state: ``full`` copies every numeric attribute (snapshots); otherwise the
        ones that carry over from one control step to the next (fingerprints)."""
        out = {"gripper.current_action": np.array(self.gripper.current_action, dtype=float)}
        for part, ctrl in self._controllers():
            owners: Dict[int, str] = {}
            for attr, value in vars(ctrl).items():
                if full and isinstance(value, (np.ndarray, np.generic, float, int, bool)):
                    out[f"{part}.{attr}"] = np.array(value)
                    # robosuite aliases some attributes (goal_qvel = joint_vel) until one is rebound:
                    # which attribute shares its array with which is state too
                    first = owners.setdefault(id(value), attr) if isinstance(value, np.ndarray) else attr
                    if first != attr:
                        out[f"{ALIAS}{part}.{attr}"] = np.array(first)
                elif attr in CONTROLLER_STATE_ATTRS and value is not None:
                    out[f"{part}.{attr}"] = np.array(value, dtype=float)
        return out

    def get_state(self, full: bool = True, observations: bool = False) -> Dict[str, Any]:
        """A bit-exact snapshot: MuJoCo integration state, controller state and the env's clocks; with
        ``observations``, also the observation pipeline's state (see :meth:`_observation_state`)."""
        clocks = {"env.timestep": np.array(self.raw.timestep), "env.cur_time": np.array(self.raw.cur_time)}
        state = {"integration": self._integration(), **self._controller_state(full), **clocks,
                 "steps": np.array(self.steps)}
        if not observations:
            return state
        if self._before_last is not None and self._before_last[0] == self.steps:
            state["before_last_substep"] = self._before_last[1].copy()
        return {**state, **self._observation_state()}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a snapshot of :meth:`get_state` (physics, controllers, clocks).

        A snapshot with the observation pipeline's state gets it back as it was; one without it
        re-samples every observable on the restored state (what the records of perturbation
        checks were made with; keep it).
        """
        mj = self._mujoco
        # Building a render context runs mj_forward (robosuite's MjRenderContext does), which would
        # overwrite the derived quantities restored below: build it first (a process's first restore).
        self._render_context()
        if "before_last_substep" in state:  # the last integration again: derived quantities as the step left them
            mj.mj_setState(self.model, self.data, np.asarray(state["before_last_substep"]), mj.mjtState.mjSTATE_INTEGRATION)
            mj.mj_step(self.model, self.data)
            if not np.array_equal(self._integration(), np.asarray(state["integration"])):
                raise RuntimeError("re-running the last substep did not give the snapshot's physics state")
        else:
            mj.mj_setState(self.model, self.data, np.asarray(state["integration"]), mj.mjtState.mjSTATE_INTEGRATION)
            mj.mj_forward(self.model, self.data)
        self.gripper.current_action = np.array(state["gripper.current_action"], dtype=float)
        for part, ctrl in self._controllers():
            aliases = {k[len(ALIAS) + len(part) + 1:]: str(v) for k, v in state.items() if k.startswith(f"{ALIAS}{part}.")}
            # unshare live arrays the snapshot holds apart, so writing one does not write the other
            owners: Dict[int, str] = {}
            for attr, value in list(vars(ctrl).items()):
                if isinstance(value, np.ndarray):
                    first = owners.setdefault(id(value), attr)
                    if first != attr and aliases.get(attr) != first:
                        setattr(ctrl, attr, value.copy())
            # every attribute of the snapshot, also those a controller creates on its first step
            for attr in [k[len(part) + 1:] for k in state if k.startswith(f"{part}.")]:
                value = getattr(ctrl, attr, None)
                saved = np.asarray(state[f"{part}.{attr}"])
                if isinstance(value, np.ndarray) and value.shape == saved.shape:
                    value[...] = saved  # in place: arrays shared beyond the controller stay shared
                else:
                    setattr(ctrl, attr, saved.item() if saved.ndim == 0 and not isinstance(value, np.ndarray) else saved.copy())
            for attr, first in aliases.items():
                setattr(ctrl, attr, getattr(ctrl, first))
        self.raw.timestep = int(state["env.timestep"])
        self.raw.cur_time = float(state["env.cur_time"])
        self.steps = int(state["steps"])
        if any(k.startswith("observation.") for k in state):
            self._set_observation_state(state)
        else:
            self._obs = self.raw._get_observations(force_update=True)

    def _observation_state(self) -> Dict[str, np.ndarray]:
        """robosuite's observation pipeline: each observable's sampling clock, sampled flag, delay and last
        value (the observation the environment holds is rebuilt from these values).

        robosuite samples an observable when its own clock says so (seconds accumulated per
        substep, modulo the sampling period), and its sensors refresh controller attributes as
        they sample; a continuation from a snapshot needs this state, not a fresh sample.
        """
        out: Dict[str, np.ndarray] = {}
        for name, observable in self.raw._observables.items():
            out[f"observation.{name}.time_since_last_sample"] = np.array(observable._time_since_last_sample, dtype=np.float64)
            out[f"observation.{name}.sampled"] = np.array(observable._sampled)
            out[f"observation.{name}.current_delay"] = np.array(observable._current_delay, dtype=np.float64)
            out[f"observation.{name}.value"] = np.array(observable._current_observed_value)
        return out

    def _set_observation_state(self, state: Mapping[str, Any]) -> None:
        for name, observable in self.raw._observables.items():
            observable._time_since_last_sample = float(state[f"observation.{name}.time_since_last_sample"])
            observable._sampled = bool(state[f"observation.{name}.sampled"])
            observable._current_delay = float(state[f"observation.{name}.current_delay"])
            value = np.array(state[f"observation.{name}.value"])
            observable._current_observed_value = value[()] if value.ndim == 0 else value
        self._obs = self.raw._get_observations()  # collects the restored values, samples nothing

    def set_physics_state(self, integration: np.ndarray) -> None:
        """Restore only the physics (for replaying recorded states through predicates)."""
        mj = self._mujoco
        mj.mj_setState(self.model, self.data, np.asarray(integration), mj.mjtState.mjSTATE_INTEGRATION)
        mj.mj_forward(self.model, self.data)

    def joint_positions(self) -> np.ndarray:
        """Every joint position of the model (``qpos``), a copy: what replay fidelity compares."""
        return self.data.qpos.copy()

    def physics_fingerprint(self) -> str:
        """Hash of the integration state, controller state and every perturbable model value."""
        return self.fingerprint_of(MujocoEnv.get_state(self, full=False))

    def fingerprint(self) -> str:
        """Hash of the integration state, controller state and every perturbable model value."""
        return self.physics_fingerprint()

    # ------------------------------------------------------------------ hook: cameras (lights: PerturbableModel)

    def nominal_camera_quat(self, camera: str) -> np.ndarray:
        """The camera's unperturbed orientation in its parent body frame (w, x, y, z)."""
        return self._nominal["cam_quat"][self._cam_ids[camera]].copy()

    def camera_quat(self, camera: str) -> np.ndarray:
        """The camera's orientation the model holds now (w, x, y, z)."""
        return self.model.cam_quat[self._cam_ids[camera]].copy()

    def camera_vertical(self, camera: str) -> np.ndarray:
        """The world vertical in the frame of the camera's parent body."""
        body = self.model.cam_bodyid[self._cam_ids[camera]]
        return self.data.xmat[body].reshape(3, 3).T @ np.array([0.0, 0.0, 1.0])

    def set_camera_quat(self, camera: str, quat: np.ndarray) -> None:
        """Write the camera's orientation; camera poses update only in ``mj_forward``."""
        self.model.cam_quat[self._cam_ids[camera]] = quat
        self._mujoco.mj_forward(self.model, self.data)

    # ------------------------------------------------------------------ hook: base (a collision check both use)

    def _robot_contacts(self) -> Dict[tuple, float]:
        m, d = self.model, self.data
        out: Dict[tuple, float] = {}
        for i in range(d.ncon):
            c = d.contact[i]
            roots = (m.body_rootid[m.geom_bodyid[c.geom1]], m.body_rootid[m.geom_bodyid[c.geom2]])
            if (roots[0] == self._robot_root) != (roots[1] == self._robot_root):
                key = (min(c.geom1, c.geom2), max(c.geom1, c.geom2))
                out[key] = min(out.get(key, 0.0), float(c.dist))
        return out

    def _new_collision(self, before: Dict[tuple, float], after: Dict[tuple, float]) -> Optional[str]:
        """A robot contact that penetrates deeper than the tolerance and than it did before the change, named."""
        for key, dist in after.items():
            if dist < -PENETRATION_TOL_M and dist < before.get(key, 0.0) - PENETRATION_TOL_M:
                g1, g2 = (self.sim.model.geom_id2name(g) or f"geom{g}" for g in key)
                return f"robot in collision: {g1} / {g2} penetrate {-dist * 1000:.1f} mm"
        return None

    def base_offset_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        """Why ``offset`` gives an invalid initial state (robot in collision), or None; leaves the state (and the
        model, where the offset moves a body) as it was."""
        saved, model = self.get_state(), self.model_values()
        before = self._robot_contacts()
        try:
            self.set_base_offset(offset)
            after = self._robot_contacts()
        finally:
            self.PERTURBABLE.restore(self.model, model)
            self.set_state(saved)
        return self._new_collision(before, after)


# Arm joints of the robosuite Pandas (LIBERO's fixed-base Panda, robosuite's PandaOmron): what ``arm_init`` offsets.
ARM_JOINTS = tuple(f"robot0_joint{i}" for i in range(1, 8))


class CameraPoseHooks:
    """The ``camera_poses`` hook for a :class:`MujocoEnv`: a camera's pose and field of view in its parent body's
    frame (``cam_pos``, ``cam_quat``, ``cam_fovy``, all in the ``PERTURBABLE`` table, so restored at every reset and
    fingerprinted). A subclass names the pivot (``camera_orbit_pivot``)."""

    def nominal_camera_placement(self, camera: str) -> Dict[str, Any]:
        """The unperturbed pose (parent frame) and vertical field of view (degrees)."""
        i = self._cam_ids[camera]
        return {"pos": self._nominal["cam_pos"][i].copy(), "quat": self._nominal["cam_quat"][i].copy(),
                "fovy_deg": float(self._nominal["cam_fovy"][i])}

    def camera_placement(self, camera: str) -> Dict[str, Any]:
        """The pose and field of view the model holds now."""
        i = self._cam_ids[camera]
        return {"pos": self.model.cam_pos[i].copy(), "quat": self.model.cam_quat[i].copy(),
                "fovy_deg": float(self.model.cam_fovy[i])}

    def camera_parent_frame(self, camera: str):
        """The camera's parent body's world position and rotation (the state's, after ``mj_forward``)."""
        body = self.model.cam_bodyid[self._cam_ids[camera]]
        return self.data.xpos[body].copy(), self.data.xmat[body].reshape(3, 3).copy()

    def set_camera_placement(self, camera: str, pose: Mapping[str, Any]) -> None:
        """Write the camera's pose and field of view; camera poses update in ``mj_forward``."""
        i = self._cam_ids[camera]
        self.model.cam_pos[i] = pose["pos"]
        self.model.cam_quat[i] = pose["quat"]
        self.model.cam_fovy[i] = pose["fovy_deg"]
        self._mujoco.mj_forward(self.model, self.data)


class ArmJointHooks:
    """The ``robot_joints`` hook for a :class:`MujocoEnv` whose robot is a robosuite Panda: the arm joints
    (:data:`ARM_JOINTS`) offset from the episode's own positions, which a subclass records at the end of its reset
    (after any settle steps: :meth:`_record_arm_nominal`), so the offset is applied, and read back, after them."""

    def arm_joint_names(self) -> List[str]:
        return list(ARM_JOINTS)

    def _arm_qpos_adr(self) -> List[int]:
        return [int(self.model.jnt_qposadr[self.sim.model.joint_name2id(j)]) for j in ARM_JOINTS]

    def _arm_dof_adr(self) -> List[int]:
        return [int(self.model.jnt_dofadr[self.sim.model.joint_name2id(j)]) for j in ARM_JOINTS]

    def _record_arm_nominal(self) -> None:
        self._arm_nominal = self.data.qpos[self._arm_qpos_adr()].copy()

    def arm_joint_offset(self) -> np.ndarray:
        """The arm joint positions now minus the episode's own, read from the state."""
        return self.data.qpos[self._arm_qpos_adr()] - self._arm_nominal

    def _write_arm(self, q: np.ndarray, offset: np.ndarray) -> None:
        """The arm's joints at ``q`` and still, and the arm controller's null-space reference moved by ``offset``:
        LIBERO-Plus's arm poses change the robot's initial joints, which robosuite's controllers pull the arm's
        redundant motion towards, so the offset arm is pulled towards the offset reference as the clean arm is
        towards its own. The controllers read the new pose now (they cache the end effector's pose until their next
        update, and OSC takes each delta from that pose)."""
        self.data.qpos[self._arm_qpos_adr()] = q
        self.data.qvel[self._arm_dof_adr()] = 0.0
        self._mujoco.mj_forward(self.model, self.data)
        for _, ctrl in self._controllers():
            if not callable(getattr(ctrl, "update", None)):
                continue
            ctrl.update(force=True)
            reference = getattr(ctrl, "initial_joint", None)
            if reference is not None and np.shape(reference) == np.shape(offset):
                ctrl.update_initial_joints(np.asarray(reference, dtype=float) + offset)

    def set_arm_joint_offset(self, offset) -> None:
        """Start the arm at the episode's own joint positions (after the reset's settle steps) plus ``offset``
        (radians), still."""
        offset = np.asarray(offset, dtype=float)
        if offset.shape != (len(ARM_JOINTS),):
            raise ValueError(f"an arm offset has {len(ARM_JOINTS)} joints, got shape {offset.shape}")
        self._write_arm(self._arm_nominal + offset, offset)
        self._obs = self.raw._get_observations(force_update=True)

    def arm_joint_offset_problem(self, offset) -> Optional[str]:
        """Why ``offset`` is an invalid start (a joint beyond its limit, the robot in collision), or None; the state
        is left as it was."""
        q = self._arm_nominal + np.asarray(offset, dtype=float)
        for name, value in zip(ARM_JOINTS, q):
            j = self.sim.model.joint_name2id(name)
            low, high = self.model.jnt_range[j]
            if self.model.jnt_limited[j] and not low <= value <= high:
                return f"{name} at {value:.3f} rad is beyond its limit [{low:.3f}, {high:.3f}]"
        saved = self.get_state()
        before = self._robot_contacts()
        try:
            self._write_arm(q, np.asarray(offset, dtype=float))
            after = self._robot_contacts()
        finally:
            self.set_state(saved)
        return self._new_collision(before, after)


# Every MuJoCo model value a dynamics factor may edit (``PerturbableModel.DYNAMICS_TABLE``): restored at every reset,
# hashed into the fingerprint only where it is off nominal.
DYNAMICS = PerturbableTable(
    (
        ("dof_frictionloss", "dof_frictionloss"),
        ("dof_damping", "dof_damping"),
        ("actuator_gainprm", "actuator_gainprm"),
        ("actuator_biasprm", "actuator_biasprm"),
        ("actuator_forcerange", "actuator_forcerange"),
        ("body_mass", "body_mass"),
        ("body_inertia", "body_inertia"),
        ("geom_friction", "geom_friction"),
        ("geom_priority", "geom_priority"),
    )
)
# MuJoCo's affine bias type: a position actuator's force is gain * ctrl + bias[0] + bias[1] * q + bias[2] * qdot
_MJ_BIAS_AFFINE = 1


class DynamicsHooks:
    """The ``dynamics`` hook for a :class:`MujocoEnv` whose robot is a robosuite Panda: the arm joints
    (:data:`ARM_JOINTS`), the actuators driving them and the gripper's, and the task's manipulated objects, which a
    subclass resolves from its stage spec (:meth:`_object_root_bodies`). Every value edited is in :data:`DYNAMICS`."""

    DYNAMICS_QUANTITIES = ("joint_friction", "joint_damping", "actuator_gain", "gripper_force", "object_mass",
                           "object_friction")
    STAGE_SPEC_BACKEND = ""  # the backend whose stage specs name the task's objects

    DYNAMICS_TABLE = DYNAMICS

    def bind(self) -> None:
        super().bind()
        self._dynamics_nominal = DYNAMICS.read(self.model)  # a model is bound unperturbed
        self._dynamics_elements: Dict[str, Dict[str, tuple]] = {}

    # ------------------------------------------------------------------ which elements each quantity scales

    def _object_root_bodies(self) -> Dict[str, int]:
        """Manipulated object (a stage spec's name) -> its root body id."""
        raise NotImplementedError

    def _stage_objects(self) -> List[str]:
        from robocasa_shift.core.dynamics import stage_objects
        from robocasa_shift.core.specs import load_stage_spec

        return stage_objects(load_stage_spec(self.STAGE_SPEC_BACKEND, self.task.name))

    def _subtree(self, root: int) -> List[int]:
        m = self.model
        out, frontier = [], [root]
        while frontier:
            body = frontier.pop(0)
            out.append(body)
            frontier += [int(b) for b in np.flatnonzero(m.body_parentid == body) if b != body]
        return out

    def _elements(self, quantity: str) -> Dict[str, tuple]:
        """Element name -> (table field, index, columns) of each value ``quantity`` scales."""
        if quantity in self._dynamics_elements:
            return self._dynamics_elements[quantity]
        if quantity not in self.DYNAMICS_QUANTITIES:
            raise UnknownNameError("dynamics quantity", quantity, list(self.DYNAMICS_QUANTITIES))
        m, names = self.model, self.sim.model
        arm = {int(names.joint_name2id(j)): j for j in ARM_JOINTS}
        out: Dict[str, tuple] = {}
        if quantity in ("joint_friction", "joint_damping"):
            field = "dof_frictionloss" if quantity == "joint_friction" else "dof_damping"
            out = {name: (field, int(m.jnt_dofadr[j]), ()) for j, name in arm.items()}
        elif quantity == "actuator_gain":
            for a in range(m.nu):
                if int(m.actuator_trnid[a, 0]) in arm:
                    name = names.actuator_id2name(a)
                    out[f"{name}.gain"] = ("actuator_gainprm", a, (0,))
                    if int(m.actuator_biastype[a]) == _MJ_BIAS_AFFINE:
                        out[f"{name}.bias"] = ("actuator_biasprm", a, (1, 2))
        elif quantity == "gripper_force":
            fingers = {int(names.joint_name2id(j)) for j in self.gripper.joints}
            out = {names.actuator_id2name(a): ("actuator_forcerange", a, (0, 1)) for a in range(m.nu)
                   if int(m.actuator_trnid[a, 0]) in fingers and m.actuator_forcelimited[a]}
        else:
            for obj, root in self._object_root_bodies().items():
                for body in self._subtree(root):
                    body_name = names.body_id2name(body) or f"{obj}.body{body}"
                    if quantity == "object_mass" and m.body_mass[body] > 0:
                        out[f"{body_name}.mass"] = ("body_mass", body, ())
                        out[f"{body_name}.inertia"] = ("body_inertia", body, (0, 1, 2))
                    if quantity == "object_friction":
                        for g in np.flatnonzero((m.geom_bodyid == body) & ((m.geom_contype != 0) | (m.geom_conaffinity != 0))):
                            out[names.geom_id2name(int(g)) or f"{body_name}.geom{int(g)}"] = ("geom_friction", int(g), (0,))
        self._dynamics_elements[quantity] = out
        return out

    def _values(self, source: Mapping[str, np.ndarray], quantity: str) -> Dict[str, np.ndarray]:
        out = {}
        for name, (field, index, columns) in self._elements(quantity).items():
            row = np.asarray(source[field][index], dtype=float).reshape(-1)
            out[name] = row[list(columns)].copy() if columns else row.copy()
        return out

    def nominal_dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        return self._values(self._dynamics_nominal, quantity)

    def dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        return self._values({field: DYNAMICS.array(self.model, field) for field in DYNAMICS.names}, quantity)

    def set_dynamics(self, quantity: str, values: Mapping[str, Any]) -> None:
        """Write the elements' values; scaled object friction also gives those geoms contact priority (MuJoCo would
        otherwise use the larger friction of the two geoms in contact: the fingers' pads')."""
        elements = self._elements(quantity)
        unknown = [k for k in values if k not in elements]
        if unknown:
            raise UnknownNameError(f"element of {quantity}", unknown[0], list(elements))
        for name, value in values.items():
            field, index, columns = elements[name]
            array = DYNAMICS.array(self.model, field)
            if columns:
                array[index, list(columns)] = np.asarray(value, dtype=float)
            else:
                array[index] = float(np.asarray(value, dtype=float).reshape(-1)[0])
            if field == "geom_friction":
                self.model.geom_priority[index] = int(self._dynamics_nominal["geom_priority"].max()) + 1
        self._mujoco.mj_forward(self.model, self.data)
