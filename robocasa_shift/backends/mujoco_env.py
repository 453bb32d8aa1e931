"""What the MuJoCo-based backends (robosuite, RoboCasa) share: state, fingerprint, lights, cameras, rendering.

A subclass builds its robosuite environment into ``self.raw``, sets
``render_profile``, the camera tuples and ``BASE_JOINTS``, and calls
:meth:`MujocoEnv.bind` whenever the MuJoCo model is (re)built. It implements
``reset``, ``step``, ``is_success``, ``proprio``, ``privileged_state`` and the
base-offset hooks, which differ between the embedded scenes and kitchens.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Sequence

import numpy as np

from robocasa_shift.backends.base import PerturbableModel, PerturbableTable
from robocasa_shift.errors import UnknownNameError

# Controller attributes that carry state from one control step to the next.
CONTROLLER_STATE_ATTRS = ("goal_pos", "goal_ori", "goal_qpos", "goal_qvel", "init_pos", "init_ori")
RENDER_PROFILES = {
    "fast": {"shadows": False, "reflections": False, "offsamples": 0},
    "default": {"shadows": True, "reflections": True, "offsamples": None},  # None: the model's own (4)
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

    def bind(self) -> None:
        """Read the handles of the current MuJoCo model (after construction, or after a model rebuild)."""
        import mujoco

        self._mujoco = mujoco
        self.sim = self.raw.sim
        self.model = self.sim.model._model
        self.data = self.sim.data._data
        self.robot = self.raw.robots[0]
        self.gripper = self.robot.gripper["right"]
        self._cam_ids = {c: self.sim.model.camera_name2id(c) for c in tuple(self.third_person_cameras) + tuple(self.wrist_cameras)}
        self._base_qpos_adr = [self.model.jnt_qposadr[self.sim.model.joint_name2id(j)] for j in BASE_JOINTS]

    # ------------------------------------------------------------------ rendering

    def _render_context(self):
        """The offscreen context frames are rendered with."""
        raise NotImplementedError

    def render(self, camera: str, size: int) -> np.ndarray:
        """One RGB frame (uint8, size x size x 3, top row first) of the current state."""
        ctx = self._render_context()
        ctx.render(width=size, height=size, camera_id=self._cam_ids.get(camera, self.sim.model.camera_name2id(camera)))
        # OpenGL reads bottom row first
        return np.ascontiguousarray(ctx.read_pixels(size, size)[::-1])

    def renderer_info(self) -> Dict[str, Any]:
        """GL backend, renderer string and render profile, for manifests."""
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
        """Drop the render context and close robosuite's environment (and with it the model)."""
        self._context = None
        self.raw.close()

    def eef_pos(self) -> np.ndarray:
        """The gripper's grasp site in the world frame (a live view)."""
        return self.data.site_xpos[self.robot.eef_site_id["right"]]

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
        """Restore a snapshot of :meth:`get_state` (physics, controllers, clocks)."""
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
