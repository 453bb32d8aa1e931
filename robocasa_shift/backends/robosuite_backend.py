"""The embedded default backend: robosuite 1.5.2 + MuJoCo from PyPI, rendered headless.

Robot ``PandaOmron`` (RoboCasa's mobile manipulator) with the third-person
camera ``robot0_robotview`` mounted on the mobile base, as RoboCasa's
agentview cameras are, and the wrist camera ``robot0_eye_in_hand``.

Design choices that make rollouts exact and cheap:

- ``hard_reset=False``: resets never rebuild the model or the GL context.
  Every perturbation edit is undone by ``restore_nominal`` before the next
  reset, and the nominal values are part of the fingerprint, so a leak shows.
- robosuite has no ``reset(seed)``: ``reset`` replaces ``env.rng`` and every
  placement sampler's ``rng`` before resetting.
- No camera observables: the harness renders only the cameras a policy reads,
  at the size it reads, when it reads them, through its own offscreen context
  (the ``fast`` render profile turns off shadows, reflections and multisampling).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional

import numpy as np

from robocasa_shift.backends.base import TaskInfo, TaskTable
from robocasa_shift.engine.stages import predicate
from robocasa_shift.errors import BackendUnavailable

ROBOT = "PandaOmron"
CONTROL_FREQ_HZ = 20
HORIZON = 400  # robomimic's evaluation horizon for these tasks (PROTOCOL.md section 6)
# Seed of the one-time model construction (cube sizes are drawn when the model
# is built); frozen so every process builds the same model.
MAKE_SEED = 0
THIRD_PERSON_CAMERAS = ("robot0_robotview",)
WRIST_CAMERAS = ("robot0_eye_in_hand",)
BASE_JOINTS = ("mobilebase0_joint_mobile_forward", "mobilebase0_joint_mobile_side", "mobilebase0_joint_mobile_yaw")
# Controller attributes that carry state from one control step to the next.
CONTROLLER_STATE_ATTRS = ("goal_pos", "goal_ori", "goal_qpos", "goal_qvel", "init_pos", "init_ori")
RENDER_PROFILES = {
    "fast": {"shadows": False, "reflections": False, "offsamples": 0},
    "default": {"shadows": True, "reflections": True, "offsamples": None},  # None: the model's own (4)
}
# robosuite macros (global settings, overridable by a private file) that change rollouts.
MACROS_THAT_CHANGE_ROLLOUTS = ("SIMULATION_TIMESTEP", "ENABLE_NUMBA", "USING_INSTANCE_RANDOMIZATION", "IMAGE_CONVENTION")
# A base offset is invalid if it creates a robot contact that penetrates deeper than this.
PENETRATION_TOL_M = 1e-4


@dataclass(frozen=True)
class RobosuiteTask:
    name: str
    env_name: str
    instruction: str
    description: str
    # name -> ("body" | "site", model name) of the points predicates and the expert use
    points: Mapping[str, tuple] = field(default_factory=dict)
    # name -> robosuite attribute holding the MujocoObject (for contacts and grasps)
    objects: Mapping[str, str] = field(default_factory=dict)
    horizon: int = HORIZON

    def info(self) -> TaskInfo:
        return TaskInfo(self.name, self.horizon, self.instruction, self.description)


TASKS: Dict[str, RobosuiteTask] = {
    t.name: t
    for t in [
        RobosuiteTask(
            "Lift",
            "Lift",
            "lift the red cube",
            "Grasp the cube on the table and lift it 4 cm above the table top.",
            points={"cube": ("body", "cube_main")},
            objects={"cube": "cube"},
        ),
        RobosuiteTask(
            "Stack",
            "Stack",
            "stack the red cube on the green cube",
            "Pick up cubeA (red) and release it resting on cubeB (green).",
            points={"cubeA": ("body", "cubeA_main"), "cubeB": ("body", "cubeB_main")},
            objects={"cubeA": "cubeA", "cubeB": "cubeB"},
        ),
        RobosuiteTask(
            "PickPlaceCan",
            "PickPlaceCan",
            "pick the can and place it in its bin",
            "Move the can from the left bin into its quadrant of the right bin and let go of it.",
            points={"can": ("body", "Can_main")},
            objects={"can": "objects[object_id]"},
        ),
        RobosuiteTask(
            "NutAssemblySquare",
            "NutAssemblySquare",
            "put the square nut on the square peg",
            "Grasp the square nut by its handle and fit it over the square peg.",
            points={
                "nut": ("body", "SquareNut_main"),
                "nut_handle": ("site", "SquareNut_handle_site"),
                "peg": ("body", "peg1"),
            },
            objects={"nut": "nuts[nut_id]"},
        ),
    ]
}


def _import_robosuite():
    try:
        import mujoco  # noqa: F401
        import robosuite  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise BackendUnavailable(
            f"the robosuite backend needs robosuite==1.5.2 and mujoco>=3.3,<3.10 ({exc}); run `make setup`"
        ) from None
    import logging

    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)
    return robosuite


def _hash_arrays(items: Mapping[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(items):
        value = np.ascontiguousarray(np.asarray(items[name], dtype=np.float64))
        h.update(name.encode())
        h.update(str(value.shape).encode())
        h.update(value.tobytes())
    return h.hexdigest()


class RobosuiteEnv:
    """A live robosuite environment of one task, reused across rollouts."""

    third_person_cameras = THIRD_PERSON_CAMERAS
    wrist_cameras = WRIST_CAMERAS

    def __init__(self, task: RobosuiteTask, render_profile: str = "fast"):
        if render_profile not in RENDER_PROFILES:
            from robocasa_shift.errors import UnknownNameError

            raise UnknownNameError("render profile", render_profile, list(RENDER_PROFILES))
        suite = _import_robosuite()
        import mujoco

        self._mujoco = mujoco
        self.spec = task
        self.task = task.info()
        self.render_profile = render_profile
        self.raw = suite.make(
            task.env_name,
            robots=ROBOT,
            has_renderer=False,
            has_offscreen_renderer=False,  # the harness owns its render context (see _render_context)
            use_camera_obs=False,
            use_object_obs=True,
            reward_shaping=False,
            hard_reset=False,
            ignore_done=True,  # the harness ends rollouts at success or at the horizon
            horizon=task.horizon,
            control_freq=CONTROL_FREQ_HZ,
            seed=MAKE_SEED,
        )
        self.sim = self.raw.sim
        self.model = self.sim.model._model
        self.data = self.sim.data._data
        self.robot = self.raw.robots[0]
        self.gripper = self.robot.gripper["right"]
        self.action_dim = int(self.raw.action_spec[0].shape[0])
        self._context = None
        self._obs: Dict[str, np.ndarray] = {}
        self._base_qpos_adr = [self.model.jnt_qposadr[self.sim.model.joint_name2id(j)] for j in BASE_JOINTS]
        self._cam_ids = {c: self.sim.model.camera_name2id(c) for c in THIRD_PERSON_CAMERAS + WRIST_CAMERAS}
        self._nominal = self._model_values()
        self._robot_root = self.sim.model.body_name2id(self.robot.robot_model.root_body)
        self.steps = 0

    # ------------------------------------------------------------------ reset, step, success

    def reset(self, seed: int) -> None:
        """Reset to the initial state of ``seed``: the same seed gives a bit-identical state in any process."""
        self.restore_nominal()
        rng = np.random.default_rng(seed)
        self.raw.rng = rng
        sampler = self.raw.placement_initializer
        sampler.rng = rng
        for sub in getattr(sampler, "samplers", {}).values():
            sub.rng = rng
        self._obs = self.raw.reset()
        self.steps = 0

    def step(self, action: np.ndarray) -> None:
        self._obs, _, _, _ = self.raw.step(np.asarray(action, dtype=np.float64))
        self.steps += 1

    def is_success(self) -> bool:
        """The environment's own success check (the official outcome)."""
        return bool(self.raw._check_success())

    # ------------------------------------------------------------------ observations

    def _render_context(self):
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
        ctx = self._render_context()
        ctx.render(width=size, height=size, camera_id=self._cam_ids.get(camera, self.sim.model.camera_name2id(camera)))
        # OpenGL reads bottom row first
        return np.ascontiguousarray(ctx.read_pixels(size, size)[::-1])

    def proprio(self) -> Dict[str, np.ndarray]:
        """The robot's own sensing, in robosuite's names (quaternions x, y, z, w)."""
        return {k: np.array(v) for k, v in self._obs.items() if k.startswith("robot0_")}

    def privileged_state(self) -> Dict[str, np.ndarray]:
        """Object poses read from the simulator; only privileged policies (``expert``) see it."""
        out: Dict[str, np.ndarray] = {}
        for name in self.spec.points:
            out[f"{name}_pos"] = self.point(name).copy()
            kind, model_name = self.spec.points[name]
            if kind == "body":
                out[f"{name}_quat"] = self.data.xquat[self.sim.model.body_name2id(model_name)].copy()  # w, x, y, z
        for name in self.spec.objects:
            obj = self.object(name)
            if hasattr(obj, "size") and obj.size is not None:
                out[f"{name}_size"] = np.asarray(obj.size, dtype=float)
        out["table_z"] = np.array([self.surface_z()])
        if self.spec.name == "PickPlaceCan":
            out["bin_pos"] = np.asarray(self.raw.target_bin_placements[self.raw.object_id], dtype=float)
            # centre of the source bin at the can's height: where a searching policy looks first
            out["source_bin_pos"] = np.array([self.raw.bin1_pos[0], self.raw.bin1_pos[1], out["can_pos"][2]])
        return out

    # ------------------------------------------------------------------ task geometry (predicates, expert)

    def point(self, name: str) -> np.ndarray:
        kind, model_name = self.spec.points[name]
        if kind == "body":
            return self.data.xpos[self.sim.model.body_name2id(model_name)]
        return self.data.site_xpos[self.sim.model.site_name2id(model_name)]

    def object(self, name: str):
        path = self.spec.objects[name]
        attr, _, index = path.partition("[")
        obj = getattr(self.raw, attr)
        if index:
            obj = obj[getattr(self.raw, index.rstrip("]"))]
        return obj

    def eef_pos(self) -> np.ndarray:
        return self.data.site_xpos[self.robot.eef_site_id["right"]]

    def surface_z(self) -> float:
        if self.spec.name == "PickPlaceCan":
            return float(self.raw.bin1_pos[2])
        return float(self.raw.table_offset[2])

    # ------------------------------------------------------------------ state: snapshot, restore, fingerprint

    def _controllers(self):
        return self.robot.composite_controller.part_controllers.items()

    def _controller_state(self, full: bool) -> Dict[str, np.ndarray]:
        """Controller state: ``full`` copies every numeric attribute (snapshots); otherwise the
        ones that carry over from one control step to the next (fingerprints)."""
        out = {"gripper.current_action": np.array(self.gripper.current_action, dtype=float)}
        for part, ctrl in self._controllers():
            for attr, value in vars(ctrl).items():
                if full and isinstance(value, (np.ndarray, np.generic, float, int, bool)):
                    out[f"{part}.{attr}"] = np.array(value)
                elif attr in CONTROLLER_STATE_ATTRS and value is not None:
                    out[f"{part}.{attr}"] = np.array(value, dtype=float)
        return out

    def get_state(self, full: bool = True) -> Dict[str, Any]:
        """A bit-exact snapshot: MuJoCo integration state, controller state and the env's clocks."""
        mj = self._mujoco
        size = mj.mj_stateSize(self.model, mj.mjtState.mjSTATE_INTEGRATION)
        integration = np.empty(size, dtype=np.float64)
        mj.mj_getState(self.model, self.data, integration, mj.mjtState.mjSTATE_INTEGRATION)
        clocks = {"env.timestep": np.array(self.raw.timestep), "env.cur_time": np.array(self.raw.cur_time)}
        return {"integration": integration, **self._controller_state(full), **clocks, "steps": np.array(self.steps)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        mj = self._mujoco
        mj.mj_setState(self.model, self.data, np.asarray(state["integration"]), mj.mjtState.mjSTATE_INTEGRATION)
        mj.mj_forward(self.model, self.data)
        self.gripper.current_action = np.array(state["gripper.current_action"], dtype=float)
        for part, ctrl in self._controllers():
            for attr, value in vars(ctrl).items():
                key = f"{part}.{attr}"
                if key not in state:
                    continue
                saved = np.asarray(state[key])
                if isinstance(value, np.ndarray) and value.shape == saved.shape:
                    value[...] = saved  # in place: keeps arrays robosuite shares between attributes shared
                else:
                    setattr(ctrl, attr, saved.item() if saved.ndim == 0 and not isinstance(value, np.ndarray) else saved.copy())
        self.raw.timestep = int(state["env.timestep"])
        self.raw.cur_time = float(state["env.cur_time"])
        self.steps = int(state["steps"])
        self._obs = self.raw._get_observations(force_update=True)

    def set_physics_state(self, integration: np.ndarray) -> None:
        """Restore only the physics (for replaying recorded states through predicates)."""
        mj = self._mujoco
        mj.mj_setState(self.model, self.data, np.asarray(integration), mj.mjtState.mjSTATE_INTEGRATION)
        mj.mj_forward(self.model, self.data)

    def _model_values(self) -> Dict[str, np.ndarray]:
        """Every model parameter a perturbation may edit."""
        m = self.model
        return {
            "light_diffuse": m.light_diffuse.copy(),
            "light_ambient": m.light_ambient.copy(),
            "light_specular": m.light_specular.copy(),
            "headlight_diffuse": m.vis.headlight.diffuse.copy(),
            "headlight_ambient": m.vis.headlight.ambient.copy(),
            "headlight_specular": m.vis.headlight.specular.copy(),
            "cam_quat": m.cam_quat.copy(),
            "cam_pos": m.cam_pos.copy(),
            "cam_fovy": m.cam_fovy.copy(),
        }

    def fingerprint(self) -> str:
        """Hash of the integration state, controller state and every perturbable model value."""
        state = self.get_state(full=False)
        return _hash_arrays({**{f"state.{k}": v for k, v in state.items()}, **{f"model.{k}": v for k, v in self._model_values().items()}})

    def restore_nominal(self) -> None:
        """Undo every perturbation edit of the model (exactly: the values are copied back)."""
        m = self.model
        m.light_diffuse[:] = self._nominal["light_diffuse"]
        m.light_ambient[:] = self._nominal["light_ambient"]
        m.light_specular[:] = self._nominal["light_specular"]
        m.vis.headlight.diffuse[:] = self._nominal["headlight_diffuse"]
        m.vis.headlight.ambient[:] = self._nominal["headlight_ambient"]
        m.vis.headlight.specular[:] = self._nominal["headlight_specular"]
        m.cam_quat[:] = self._nominal["cam_quat"]
        m.cam_pos[:] = self._nominal["cam_pos"]
        m.cam_fovy[:] = self._nominal["cam_fovy"]

    # ------------------------------------------------------------------ perturbation hooks

    _LIGHT_KEYS = {
        "light_diffuse": ("light_diffuse", None),
        "light_ambient": ("light_ambient", None),
        "light_specular": ("light_specular", None),
        "headlight_diffuse": ("vis.headlight", "diffuse"),
        "headlight_ambient": ("vis.headlight", "ambient"),
        "headlight_specular": ("vis.headlight", "specular"),
    }

    def nominal_lights(self) -> Dict[str, np.ndarray]:
        return {k: self._nominal[k].copy() for k in self._LIGHT_KEYS}

    def lights(self) -> Dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._model_values().items() if k in self._LIGHT_KEYS}

    def set_lights(self, values: Mapping[str, Any]) -> None:
        m = self.model
        for key, value in values.items():
            if key.startswith("headlight_"):
                getattr(m.vis.headlight, key.split("_", 1)[1])[:] = value
            else:
                getattr(m, key)[:] = value

    def nominal_camera_quat(self, camera: str) -> np.ndarray:
        return self._nominal["cam_quat"][self._cam_ids[camera]].copy()

    def camera_quat(self, camera: str) -> np.ndarray:
        return self.model.cam_quat[self._cam_ids[camera]].copy()

    def camera_vertical(self, camera: str) -> np.ndarray:
        """The world vertical in the frame of the camera's parent body."""
        body = self.model.cam_bodyid[self._cam_ids[camera]]
        return self.data.xmat[body].reshape(3, 3).T @ np.array([0.0, 0.0, 1.0])

    def set_camera_quat(self, camera: str, quat: np.ndarray) -> None:
        self.model.cam_quat[self._cam_ids[camera]] = quat
        self._mujoco.mj_forward(self.model, self.data)  # camera poses update only in forward

    def base_offset(self) -> Dict[str, float]:
        """(forward, side, yaw) of the mobile base joints, read from the state (nominal is 0)."""
        q = self.data.qpos[self._base_qpos_adr]
        return {"forward_m": float(q[0]), "side_m": float(q[1]), "yaw_deg": float(np.rad2deg(q[2]))}

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        self.data.qpos[self._base_qpos_adr] = [offset["forward_m"], offset["side_m"], np.deg2rad(offset["yaw_deg"])]
        self._mujoco.mj_forward(self.model, self.data)
        self._obs = self.raw._get_observations(force_update=True)

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

    def base_offset_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        """Why ``offset`` gives an invalid initial state (robot in collision), or None; leaves the state as it was."""
        saved = self.get_state()
        before = self._robot_contacts()
        try:
            self.set_base_offset(offset)
            after = self._robot_contacts()
        finally:
            self.set_state(saved)
        for key, dist in after.items():
            if dist < -PENETRATION_TOL_M and dist < before.get(key, 0.0) - PENETRATION_TOL_M:
                g1, g2 = (self.sim.model.geom_id2name(g) or f"geom{g}" for g in key)
                return f"robot in collision: {g1} / {g2} penetrate {-dist * 1000:.1f} mm"
        return None

    # ------------------------------------------------------------------ bookkeeping

    def renderer_info(self) -> Dict[str, Any]:
        info: Dict[str, Any] = {
            "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl"),
            "LP_NUM_THREADS": os.environ.get("LP_NUM_THREADS"),
            "render_profile": self.render_profile,
            **RENDER_PROFILES[self.render_profile],
        }
        try:
            self._render_context().gl_ctx.make_current()
            from OpenGL import GL

            info["gl_renderer"] = GL.glGetString(GL.GL_RENDERER).decode()
            info["gl_version"] = GL.glGetString(GL.GL_VERSION).decode()
        except Exception as exc:  # the renderer string is informative only
            info["gl_renderer"] = f"unknown ({type(exc).__name__}: {exc})"
        return info

    def close(self) -> None:
        self._context = None
        self.raw.close()


class RobosuiteBackend(TaskTable):
    """Tasks Lift, Stack, PickPlaceCan and NutAssemblySquare on PandaOmron."""

    name = "robosuite"

    tasks = TASKS

    def make(self, task: str, render_profile: str = "fast") -> RobosuiteEnv:
        self.task(task)
        return RobosuiteEnv(TASKS[task], render_profile)

    def config(self) -> Dict[str, Any]:
        """The frozen environment configuration recorded in manifests."""
        import robosuite.macros as macros

        return {
            "macros": {name: getattr(macros, name) for name in MACROS_THAT_CHANGE_ROLLOUTS},
            "robot": ROBOT,
            "control_freq_hz": CONTROL_FREQ_HZ,
            "hard_reset": False,
            "make_seed": MAKE_SEED,
            "third_person_cameras": list(THIRD_PERSON_CAMERAS),
            "wrist_cameras": list(WRIST_CAMERAS),
            "horizons": {t.name: t.horizon for t in TASKS.values()},
        }

    def versions(self) -> Dict[str, str]:
        from importlib import metadata

        out = {}
        for pkg in ("robosuite", "mujoco", "numpy", "opencv-python"):
            try:
                out[pkg] = metadata.version(pkg)
            except metadata.PackageNotFoundError:
                out[pkg] = "not installed"
        return out


# ---------------------------------------------------------------------- stage predicates
# Side-effect free: they read simulator state and never call _check_success or
# update_state (PickPlace's _check_success writes objects_in_bins).


@predicate("robosuite", "gripper_near")
def gripper_near(env: RobosuiteEnv, object: str, distance_m: float) -> bool:
    """The gripper's grasp site is within ``distance_m`` of the object's centre."""
    return bool(np.linalg.norm(env.eef_pos() - env.point(object)) < distance_m)


@predicate("robosuite", "grasped")
def grasped(env: RobosuiteEnv, object: str) -> bool:
    """Both finger pads touch the object (robosuite's own grasp check)."""
    return bool(env.raw._check_grasp(gripper=env.gripper, object_geoms=env.object(object)))


@predicate("robosuite", "lifted")
def lifted(env: RobosuiteEnv, object: str, height_m: float) -> bool:
    """The object's centre is more than ``height_m`` above the surface it started on."""
    return bool(env.point(object)[2] > env.surface_z() + height_m)


@predicate("robosuite", "above")
def above(env: RobosuiteEnv, object: str, target: str, xy_tol_m: float, min_dz_m: float) -> bool:
    """The object is within ``xy_tol_m`` of the target horizontally and at least ``min_dz_m`` higher."""
    p, t = env.point(object), env.point(target)
    return bool(np.linalg.norm(p[:2] - t[:2]) < xy_tol_m and p[2] - t[2] > min_dz_m)


@predicate("robosuite", "resting_on")
def resting_on(env: RobosuiteEnv, object: str, support: str) -> bool:
    """The object touches the support and the gripper no longer holds it."""
    touching = env.raw.check_contact(env.object(object), env.object(support))
    return bool(touching and not grasped(env, object))


@predicate("robosuite", "over_target_bin")
def over_target_bin(env: RobosuiteEnv, object: str) -> bool:
    """The object is horizontally inside its target bin quadrant (any height)."""
    p = np.array(env.point(object), dtype=float)
    p[2] = env.raw.bin2_pos[2] + 0.05
    return not bool(env.raw.not_in_bin(p, env.raw.object_id))


@predicate("robosuite", "in_target_bin")
def in_target_bin(env: RobosuiteEnv, object: str) -> bool:
    """The object is inside its target bin quadrant, below the bin's rim (robosuite's not_in_bin)."""
    return not bool(env.raw.not_in_bin(np.array(env.point(object)), env.raw.object_id))


@predicate("robosuite", "released_in_target_bin")
def released_in_target_bin(env: RobosuiteEnv, object: str, distance_m: float) -> bool:
    """The object is in its target bin and the gripper's grasp site is more than ``distance_m`` from it."""
    far = np.linalg.norm(env.eef_pos() - env.point(object)) > distance_m
    return bool(far and in_target_bin(env, object))


@predicate("robosuite", "on_peg")
def on_peg(env: RobosuiteEnv, object: str) -> bool:
    """The nut sits around its peg, low on it (robosuite's on_peg)."""
    return bool(env.raw.on_peg(np.array(env.point(object)), env.raw.nut_id))

