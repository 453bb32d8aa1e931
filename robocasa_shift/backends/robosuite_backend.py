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

import logging
from typing import Any, Dict, Mapping, Optional

import numpy as np

from robocasa_shift.backends import robosuite_fastpath
from robocasa_shift.backends.mujoco_env import (
    ArmJointHooks,
    CameraPoseHooks,
    DynamicsHooks,
    MujocoEnv,
    check_render_profile,
)
from robocasa_shift.backends.robosuite_tasks import TASKS, RobosuiteTask
from robocasa_shift.core.backend import TaskTable, installed_versions
from robocasa_shift.core.stages import predicate
from robocasa_shift.extras import require

ROBOT = "PandaOmron"
CONTROL_FREQ_HZ = 20
# Seed of the one-time model construction (cube sizes are drawn when the model
# is built); frozen so every process builds the same model.
MAKE_SEED = 0
THIRD_PERSON_CAMERAS = ("robot0_robotview",)
# Geom classes of contact_state, ordered so that a pair's (min, max) names its kind.
_SCENE, _ROBOT, _HELD, _OTHER = 0, 1, 2, 3
WRIST_CAMERAS = ("robot0_eye_in_hand",)
# robosuite macros (global settings, overridable by a private file) that change rollouts.
MACROS_THAT_CHANGE_ROLLOUTS = ("SIMULATION_TIMESTEP", "ENABLE_NUMBA", "USING_INSTANCE_RANDOMIZATION", "IMAGE_CONVENTION")


def _import_robosuite():
    """robosuite, or :class:`DependencyMissing` with the ``sim`` extra's pip line."""
    require("mujoco", "sim", "the robosuite backend")
    robosuite = require("robosuite", "sim", "the robosuite backend")
    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)
    return robosuite


class RobosuiteEnv(DynamicsHooks, CameraPoseHooks, ArmJointHooks, MujocoEnv):
    """A live robosuite environment of one task, reused across rollouts.

    Beyond the matrix's hooks: ``camera_poses`` (the robot view about the centre of the table's top, or of the
    bins) and ``robot_joints`` (the arm offset right after reset: the embedded scenes have no settle steps)."""

    third_person_cameras = THIRD_PERSON_CAMERAS
    wrist_cameras = WRIST_CAMERAS
    STAGE_SPEC_BACKEND = "robosuite"

    def __init__(self, task: RobosuiteTask, render_profile: str = "fast", stock_simulator: bool = False):
        check_render_profile(render_profile)
        suite = _import_robosuite()
        self.spec = task
        self.task = task.info()
        self.render_profile = render_profile
        self.stock_simulator = bool(stock_simulator)
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
        self.bind()
        self.set_stock_simulator(self.stock_simulator)  # bit-identical shortcuts (see robosuite_fastpath) unless stock
        self.action_dim = int(self.raw.action_spec[0].shape[0])
        self._context = None
        self._obs: Dict[str, np.ndarray] = {}
        self._nominal = self.model_values()
        self.steps = 0

    def _enable_fastpath(self) -> Dict[str, Any]:
        return robosuite_fastpath.enable(self.raw)

    def _disable_fastpath(self) -> None:
        robosuite_fastpath.disable(self.raw)

    # ------------------------------------------------------------------ reset (step and success: MujocoEnv)

    def reset(self, seed: int, episode=None) -> None:
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
        self._record_arm_nominal()

    def camera_orbit_pivot(self, camera: str) -> np.ndarray:
        """The centre of the surface the task's objects start on: the table top (``table_offset``), or midway between
        PickPlace's two bins."""
        table = getattr(self.raw, "table_offset", None)
        if table is not None:
            return np.asarray(table, dtype=float).copy()
        return (np.asarray(self.raw.bin1_pos, dtype=float) + np.asarray(self.raw.bin2_pos, dtype=float)) / 2

    # ------------------------------------------------------------------ observations

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
        if self.spec.bins:
            out["bin_pos"] = np.asarray(self.raw.target_bin_placements[self.raw.object_id], dtype=float)
            # centre of the source bin at the can's height: where a searching policy looks first
            out["source_bin_pos"] = np.array([self.raw.bin1_pos[0], self.raw.bin1_pos[1], out["can_pos"][2]])
        return out

    # ------------------------------------------------------------------ task geometry (predicates, expert)

    def point(self, name: str) -> np.ndarray:
        """World position of a task point (a body or a site the task table names), a live view."""
        kind, model_name = self.spec.points[name]
        if kind == "body":
            return self.data.xpos[self.sim.model.body_name2id(model_name)]
        return self.data.site_xpos[self.sim.model.site_name2id(model_name)]

    def object(self, name: str):
        """The robosuite ``MujocoObject`` the task table names (for contact and grasp checks)."""
        path = self.spec.objects[name]
        attr, _, index = path.partition("[")
        obj = getattr(self.raw, attr)
        if index:
            obj = obj[getattr(self.raw, index.rstrip("]"))]
        return obj

    def target_contact(self) -> Optional[bool]:
        """Whether the task's object touches its target (:data:`TARGET_CONTACT`); None for a task without one."""
        check = TARGET_CONTACT.get(self.spec.name)
        return None if check is None else bool(check(self))

    def _object_root_bodies(self) -> Dict[str, int]:
        """The stage spec's manipulated objects (the task table's names) -> their root bodies (``dynamics``)."""
        return {name: int(self.sim.model.body_name2id(self.object(name).root_body)) for name in self._stage_objects()}

    # ------------------------------------------------------------------ capability: contacts (step logs)

    def contact_state(self) -> np.ndarray:
        """The post-step contacts, in ``CONTACT_COLUMNS`` order (``core/steplog.py``): the robot's contact pairs with
        the scene (table, bins, pegs, floor), its pairs with the task's other objects (Stack's cubeB), whether it holds
        the object it manipulates (the task table's first object; robosuite's grasp check), whether that object
        touches anything but the robot and its centre's height above its starting surface (mm). Read from MuJoCo's
        contact list and body poses; nothing is changed."""
        classes = self._geom_classes()
        pairs = classes[np.asarray(self.data.contact.geom, dtype=np.int64).reshape(-1, 2)] if self.data.ncon else \
            np.zeros((0, 2), dtype=np.int64)
        low, high = pairs.min(axis=1), pairs.max(axis=1)
        robot_scene = int(np.count_nonzero((low == _SCENE) & (high == _ROBOT)))
        robot_other = int(np.count_nonzero((low == _ROBOT) & (high == _OTHER)))
        supported = bool(np.any((pairs == _HELD).any(axis=1) & ~(pairs == _ROBOT).any(axis=1)
                                & ~((low == _HELD) & (high == _HELD))))
        name = next(iter(self.spec.objects))
        height = int(round((float(self.point(name)[2]) - self.surface_z()) * 1000))
        return np.array([robot_scene, robot_other, int(grasped(self, name)), int(supported), height], dtype=np.int64)

    def _geom_classes(self) -> np.ndarray:
        """Per geom of the bound model: scene, robot, the manipulated object or another task object (by root body)."""
        if getattr(self, "_classes_of", None) is not self.model:
            m = self.model
            root = m.body_rootid[m.geom_bodyid]
            classes = np.full(m.ngeom, _SCENE, dtype=np.int64)
            classes[root == self._robot_root] = _ROBOT
            for i, name in enumerate(self.spec.objects):
                body = int(self.sim.model.body_name2id(self.object(name).root_body))
                classes[root == m.body_rootid[body]] = _HELD if i == 0 else _OTHER
            self._classes, self._classes_of = classes, self.model
        return self._classes

    def surface_z(self) -> float:
        """Height of the surface the task's objects start on (table top, or the source bin's floor)."""
        if self.spec.surface == "source_bin":
            return float(self.raw.bin1_pos[2])
        return float(self.raw.table_offset[2])

    # ------------------------------------------------------------------ hook: mobile base

    def base_offset(self) -> Dict[str, float]:
        """(forward, side, yaw) of the mobile base joints, read from the state (nominal is 0)."""
        q = self.data.qpos[self._base_qpos_adr]
        return {"forward_m": float(q[0]), "side_m": float(q[1]), "yaw_deg": float(np.rad2deg(q[2]))}

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        """Write the base joints (forward, side, yaw) and refresh the observations."""
        self.data.qpos[self._base_qpos_adr] = [offset["forward_m"], offset["side_m"], np.deg2rad(offset["yaw_deg"])]
        self._mujoco.mj_forward(self.model, self.data)
        self._obs = self.raw._get_observations(force_update=True)

class RobosuiteBackend(TaskTable):
    """Tasks Lift, Stack, PickPlaceCan and NutAssemblySquare on PandaOmron."""

    name = "robosuite"
    demo_policy = "expert"

    tasks = TASKS

    def make(self, task: str, render_profile: str = "fast", stock_simulator: bool = False) -> RobosuiteEnv:
        """A live environment of ``task`` (builds the MuJoCo model once)."""
        self.task(task)
        return RobosuiteEnv(TASKS[task], render_profile, stock_simulator)

    def check_available(self) -> None:
        """Raise :class:`DependencyMissing` (the ``sim`` extra's pip line) when robosuite or MuJoCo is missing."""
        _import_robosuite()

    def config(self) -> Dict[str, Any]:
        """The frozen environment configuration recorded in manifests."""
        _import_robosuite()
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
        """Versions of the simulator packages the records depend on."""

        return installed_versions(("robosuite", "mujoco", "numpy", "opencv-python"))


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



# TaskEvents.target_contact, per task: the object touching its target (Lift has none; NutAssemblySquare's nut on its
# peg is its last subgoal, not a contact event).
TARGET_CONTACT = {
    "Stack": lambda env: bool(env.raw.check_contact(env.object("cubeA"), env.object("cubeB"))),
    "PickPlaceCan": lambda env: in_target_bin(env, "can"),
}
