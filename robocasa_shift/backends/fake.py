"""The testing backend: a point gripper and a point object on a table plane, in pure numpy.

Registered as ``fake`` like any backend; its policies ``fake`` (image-driven,
stochastic), ``fake-expert`` (privileged, scripted, deterministic) and
``fake-random`` (a negative control) live in ``policies/scripted/fake.py``. It exists so that the harness's bookkeeping
(runs, resume, shards, merge, retry, audit, report, compare, executors) can be
tested in milliseconds per rollout, the way Gymnasium's tests use
``GenericTestEnv``: it models no physics worth studying, and results on it say
nothing about robots. It never imports MuJoCo, robosuite or torch.

It offers what a simulator backend offers:

- State: the mobile base's planar pose, the gripper's position in the base
  frame, the object and the target on the table (world frame), whether the
  gripper is closed and whether it holds the object: 11 floats, restored bit
  for bit (``get_state`` / ``set_state``). ``reset(seed)`` draws the episode
  from one numpy Generator seeded by ``seed`` only.
- Model: light colours and camera poses, the values perturbations edit, in one
  table (:data:`PERTURBABLE`); ``restore_nominal`` copies them back and the
  fingerprint hashes them with the state, both derived from that table. Beside
  them a few dynamics (:data:`FAKE_DYNAMICS`: the arm's gain, the gripper's
  force, the object's mass), in their own table.
- Rendering: a pinhole camera ray-cast onto the table plane (checkerboard
  table, green target disc, red object disc, blue gripper ring), shaded by the
  scene lights and the headlight (ambient, diffuse, Blinn-Phong specular), so
  illumination, camera rotation, base offsets and blur change what a policy sees.
- Stage predicates registered under ``fake.*`` and stage specs in
  ``stage_specs/fake/``.

Action: see ``embodiments/fake_planar.py`` (planar gripper velocity and a gripper command).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from robocasa_shift.core.backend import (
    PerturbableModel,
    PerturbableTable,
    TaskInfo,
    TaskTable,
)
from robocasa_shift.core.stages import predicate
from robocasa_shift.embodiments.fake_planar import (
    ACTION_DIM,
    CAMERAS,
    LAYOUT,
    MAX_STEP_M,
    THIRD_PERSON_CAMERAS,
    WRIST_CAMERAS,
    camera_mounts,
    rot_z,
)
from robocasa_shift.errors import UnknownNameError
from robocasa_shift.geometry import quat_to_mat

HORIZON = 40
GRASP_RADIUS_M = 0.025  # closing the gripper this close to the object grasps it
TOUCH_M = 0.025  # Reach succeeds with the gripper this close to the object
PLACE_TOL_M = 0.03  # PickPlace succeeds with the object released this close to the target
# The gripper's reach in the base frame (x forward, y left).
ARM_X_M, ARM_Y_M = (0.1, 0.85), (-0.45, 0.45)
HOME_M = (0.25, 0.0)
OBJECT_REGION_M = ((0.40, 0.70), (-0.20, 0.20))
MIN_TARGET_DISTANCE_M = 0.15
COLLISION_M = 0.04  # a base offset that puts the gripper this close to the object is invalid
# The camera_pose factor orbits the third-person camera about this world point (the object region's centre).
ORBIT_PIVOT_M = (0.55, 0.0, 0.0)
# The arm_init factor's joints: the gripper's planar position in the base frame, one unit = 10 cm (so the frozen
# levels' 0.1-0.5 "rad" move the gripper 1-5 cm, as a Panda's 0.1-0.5 rad moves its hand by centimetres).
ARM_JOINTS = ("eef_x", "eef_y")
ARM_JOINT_UNIT_M = 0.1

RENDER_PROFILES = ("fast", "default")  # the same picture: the caster has no expensive features

# State layout of the integration vector (``get_state()["integration"]``).
STATE_LAYOUT = ("base_forward_m", "base_side_m", "base_yaw_rad", "eef_x_m", "eef_y_m",
                "object_x_m", "object_y_m", "target_x_m", "target_y_m", "gripper_closed", "holding")
BASE, EEF, OBJECT, TARGET, CLOSED, HOLDING = slice(0, 3), slice(3, 5), slice(5, 7), slice(7, 9), 9, 10

# Scene: albedos (RGB), disc radii (m), light positions (world, m), table extent.
TABLE_X_M, TABLE_Y_M = (0.0, 1.0), (-0.5, 0.5)
CHECKER_M = 0.05
ALBEDO = {"table_a": (0.58, 0.55, 0.50), "table_b": (0.46, 0.44, 0.40), "floor": (0.22, 0.22, 0.25),
          "target": (0.10, 0.75, 0.20), "object": (0.90, 0.08, 0.08), "gripper": (0.10, 0.20, 0.90)}
SURFACES = tuple(ALBEDO)  # table_a, table_b (adjacent: the checker adds 0 or 1), floor, target, object, gripper
PALETTE = np.array([ALBEDO[k] for k in SURFACES])
TARGET_RADIUS_M, OBJECT_RADIUS_M = 0.045, 0.03
GRIPPER_RING_M = {False: (0.012, 0.02), True: (0.005, 0.02)}  # (inner, outer) open / closed
LIGHT_POS_M = np.array([[0.3, 0.6, 1.5], [0.8, -0.5, 1.2]])
SHININESS = 24


def nominal_model() -> Dict[str, np.ndarray]:
    """The unperturbed model values: every light colour and every camera pose (cameras in CAMERAS order)."""
    grey = lambda *v: np.array([[x, x, x] for x in v], dtype=float)  # noqa: E731
    return {
        "light_diffuse": grey(0.55, 0.30),
        "light_ambient": grey(0.08, 0.05),
        "light_specular": grey(0.30, 0.10),
        "headlight_diffuse": np.array([0.35, 0.35, 0.35]),
        "headlight_ambient": np.array([0.10, 0.10, 0.10]),
        "headlight_specular": np.array([0.15, 0.15, 0.15]),
        **camera_mounts(),
    }


class FakeModel(SimpleNamespace):
    """The fake's model: one attribute per array of :func:`nominal_model`, edited in place by perturbations."""


# Every value a perturbation may edit: restore_nominal and the fingerprint derive from this table.
PERTURBABLE = PerturbableTable(tuple((name, name) for name in nominal_model()))
LIGHT_FIELDS = tuple(k for k in PERTURBABLE.names if "light" in k)

# The dynamics the fake models (the ``dynamics`` hook): the arm's gain (a unit action moves the gripper gain x
# MAX_STEP_M), the gripper's squeeze and the object's mass. A grasp holds while the squeeze's friction carries the
# object's weight: 2 x GRIP_MU x force >= mass x g. Quantity -> (model attribute, element name, nominal value).
GRIP_MU, GRAVITY = 0.5, 9.81
FAKE_DYNAMICS = {"actuator_gain": ("arm_gain", "arm", 1.0), "gripper_force": ("grip_force_n", "gripper", 10.0),
                 "object_mass": ("object_mass_kg", "object", 0.1)}
DYNAMICS_TABLE = PerturbableTable(tuple((attr, attr) for attr, _, _ in FAKE_DYNAMICS.values()))


def nominal_dynamics_model() -> Dict[str, np.ndarray]:
    return {attr: np.array([value]) for attr, _, value in FAKE_DYNAMICS.values()}


def pixel_rays(size: int, fovy_deg: float) -> np.ndarray:
    """Ray directions in the camera frame, (size, size, 3), top row first (x right, y up, looking along -z)."""
    t = np.tan(np.deg2rad(fovy_deg) / 2)
    c = (np.arange(size) + 0.5) / size * 2 - 1
    u, v = np.meshgrid(c * t, -c * t)  # columns right, rows down
    return np.stack([u, v, -np.ones_like(u)], axis=-1)


# --------------------------------------------------------------------------- tasks


@dataclass(frozen=True)
class FakeTask:
    """One fake task: its instruction, what success means and what each base episode draws."""

    name: str
    instruction: str
    description: str
    randomization: str
    horizon: int = HORIZON
    paraphrases: Tuple[str, ...] = ()  # the language factor's levels, in order

    def info(self) -> TaskInfo:
        return TaskInfo(self.name, self.horizon, self.instruction, self.description, self.randomization)


TASKS: Dict[str, FakeTask] = {
    t.name: t
    for t in [
        # paraphrases at every band of word edit distance the language factor's levels select from
        FakeTask("Reach", "touch the red object", "Success: the gripper within 2.5 cm of the object.",
                 "object position on the table; gripper start (+-1 cm)",
                 paraphrases=("reach out and touch the red thing", "touch the red object now",
                              "touch that red object", "move your gripper onto the crimson item")),
        FakeTask("PickPlace", "put the red object on the green target",
                 "Success: the object released within 3 cm of the target's centre.",
                 "object and target positions (at least 15 cm apart); gripper start (+-1 cm)",
                 paraphrases=("please place the red item onto the green goal", "put the red object on top of the green target",
                              "put the red object onto the green target", "grab the crimson disc and drop it onto "
                              "the emerald circle")),
    ]
}


# --------------------------------------------------------------------------- environment


class FakeEnv(PerturbableModel):
    """A live environment of one fake task, reused across rollouts."""

    PERTURBABLE = PERTURBABLE
    LIGHT_FIELDS = LIGHT_FIELDS
    DYNAMICS_TABLE = DYNAMICS_TABLE
    DYNAMICS_QUANTITIES = tuple(FAKE_DYNAMICS)
    third_person_cameras = THIRD_PERSON_CAMERAS
    wrist_cameras = WRIST_CAMERAS
    action_dim = ACTION_DIM
    action_layout = LAYOUT

    def __init__(self, task: FakeTask, render_profile: str = "fast"):
        if render_profile not in RENDER_PROFILES:
            raise UnknownNameError("render profile", render_profile, list(RENDER_PROFILES))
        self.spec = task
        self.task = task.info()
        self.render_profile = render_profile
        self._nominal = nominal_model()
        self._dynamics_nominal = nominal_dynamics_model()
        self.model = FakeModel(**{k: v.copy() for k, v in {**self._nominal, **self._dynamics_nominal}.items()})
        self.x = np.zeros(len(STATE_LAYOUT))
        self.steps = 0
        self._rays: Dict[Tuple[int, float], np.ndarray] = {}

    # ------------------------------------------------------------------ reset, step, success

    def reset(self, seed: int, episode=None) -> None:
        """Restore the nominal model, then draw the episode of ``seed`` (bit-identical in any process)."""
        self.restore_nominal()
        rng = np.random.default_rng(seed)
        (x0, x1), (y0, y1) = OBJECT_REGION_M
        obj = rng.uniform([x0, y0], [x1, y1])
        target = rng.uniform([x0, y0], [x1, y1])
        while np.linalg.norm(target - obj) < MIN_TARGET_DISTANCE_M:
            target = rng.uniform([x0, y0], [x1, y1])
        eef = np.array(HOME_M) + rng.uniform(-0.01, 0.01, 2)
        self.x = np.concatenate([[0.0, 0.0, 0.0], eef, obj, target, [0.0, 0.0]])
        self._eef0 = eef.copy()  # the episode's own arm "joints" (arm_init offsets them)
        self.steps = 0

    def step(self, action: np.ndarray) -> None:
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (ACTION_DIM,) or not np.isfinite(a).all():
            raise ValueError(f"the fake backend takes a finite action of shape ({ACTION_DIM},), got {a.shape}")
        x = self.x
        lo, hi = [ARM_X_M[0], ARM_Y_M[0]], [ARM_X_M[1], ARM_Y_M[1]]
        x[EEF] = np.clip(x[EEF] + MAX_STEP_M * self.model.arm_gain[0] * np.clip(a[:2], -1.0, 1.0), lo, hi)
        close = a[2] > 0
        if close and not x[CLOSED] and np.linalg.norm(self.eef_world() - x[OBJECT]) < GRASP_RADIUS_M:
            x[HOLDING] = float(2 * GRIP_MU * self.model.grip_force_n[0] >= self.model.object_mass_kg[0] * GRAVITY)
        if not close:
            x[HOLDING] = 0.0
        x[CLOSED] = float(close)
        if x[HOLDING]:
            x[OBJECT] = self.eef_world()
        self.steps += 1

    def is_success(self) -> bool:
        if self.spec.name == "Reach":
            return bool(self.eef_object_distance() < TOUCH_M)
        return bool(not self.x[HOLDING] and self.object_target_distance() < PLACE_TOL_M)

    # ------------------------------------------------------------------ geometry

    def base_rotation(self) -> np.ndarray:
        return rot_z(self.x[2])

    def eef_world(self) -> np.ndarray:
        return self.x[BASE][:2] + self.base_rotation()[:2, :2] @ self.x[EEF]

    def eef_pos(self) -> np.ndarray:
        """The gripper in the world frame, (3,), on the table plane (z = 0)."""
        return np.array([*self.eef_world(), 0.0])

    def eef_object_distance(self) -> float:
        return float(np.linalg.norm(self.eef_world() - self.x[OBJECT]))

    def object_target_distance(self) -> float:
        return float(np.linalg.norm(self.x[OBJECT] - self.x[TARGET]))

    def camera_pose(self, camera: str) -> Tuple[np.ndarray, np.ndarray]:
        """World position and rotation (columns: camera x, y, z) of ``camera``."""
        i = CAMERAS.index(camera)
        rot = self.base_rotation()
        parent = np.array([*self.x[BASE][:2], 0.0])
        if camera in WRIST_CAMERAS:
            parent = np.array([*self.eef_world(), 0.0])
        return parent + rot @ self.model.cam_pos[i], rot @ quat_to_mat(self.model.cam_quat[i])

    # ------------------------------------------------------------------ capabilities: object points, task events

    def outcome_points(self, names=()) -> List[np.ndarray]:
        """Its object and (PickPlace) target on the table plane; the fake's points have no names."""
        points = [np.array([*self.x[OBJECT], 0.0]), np.array([*self.x[TARGET], 0.0])]
        return points[:1] if self.spec.name == "Reach" else points

    def contact_state(self) -> np.ndarray:
        """The contacts its plane allows, in ``CONTACT_COLUMNS`` order (``core/steplog.py``): the gripper against the
        edge of its reach (1 when a coordinate sits on a bound, the plane's only obstacle), no other object to hit (0:
        each task has one object), whether it holds the object, and whether the object rests on the table (always
        unless held: a planar object cannot fall, so the fake logs no drop) at height 0."""
        eef = self.x[EEF]
        at_edge = bool(np.isclose(eef, [ARM_X_M[0], ARM_Y_M[0]]).any() or np.isclose(eef, [ARM_X_M[1], ARM_Y_M[1]]).any())
        held = bool(self.x[HOLDING])
        return np.array([int(at_edge), 0, int(held), int(not held), 0], dtype=np.int64)

    def camera_frame(self, camera: str) -> Tuple[np.ndarray, np.ndarray, float]:
        """The camera's world pose (:meth:`camera_pose`) and vertical field of view."""
        pos, rot = self.camera_pose(camera)
        return np.asarray(pos, float), np.asarray(rot, float), float(self.model.cam_fovy[CAMERAS.index(camera)])

    def target_contact(self) -> Optional[bool]:
        """PickPlace: the object is over the target disc; Reach has no target (None)."""
        if self.spec.name == "Reach":
            return None
        return bool(self.object_target_distance() < TARGET_RADIUS_M)

    # ------------------------------------------------------------------ observations

    def render(self, camera: str, size: int) -> np.ndarray:
        """One RGB frame (uint8, size x size x 3, top row first) ray-cast onto the table plane."""
        if camera not in CAMERAS:
            raise UnknownNameError("camera", camera, list(CAMERAS))
        fovy = float(self.model.cam_fovy[CAMERAS.index(camera)])
        rays = self._rays.get((size, fovy))
        if rays is None:
            rays = self._rays.setdefault((size, fovy), pixel_rays(size, fovy))
        pos, rot = self.camera_pose(camera)
        dx, dy, dz = (rays @ rot.T).transpose(2, 0, 1)  # world ray directions, one (size, size) array each
        down = dz < -1e-9
        s = -pos[2] / np.where(down, dz, -1.0)
        x, y = pos[0] + s * dx, pos[1] + s * dy  # hit points on the table plane (z = 0, normal +z)
        albedo = PALETTE[self._surface(x, y, down)]
        # shading: the scene's point lights and the headlight (a light at the camera): ambient + diffuse +
        # Blinn-Phong specular; per pixel, l and v are the unit vectors to the light and to the camera
        m = self.model
        vx, vy, vz = pos[0] - x, pos[1] - y, np.full_like(x, pos[2])
        vn = np.sqrt(vx * vx + vy * vy + vz * vz)
        positions = [*LIGHT_POS_M, pos]
        diffuse = np.vstack([m.light_diffuse, m.headlight_diffuse])  # (lights, RGB)
        specular = np.vstack([m.light_specular, m.headlight_specular])
        cos_l, highlight = [], []
        for lpos in positions:
            lx, ly, lz = lpos[0] - x, lpos[1] - y, lpos[2]
            ln = np.sqrt(lx * lx + ly * ly + lz * lz)
            cos_lv = (lx * vx + ly * vy + lz * vz) / (ln * vn)
            cos_h = (lz / ln + vz / vn) / np.sqrt(np.maximum(2.0 + 2.0 * cos_lv, 1e-12))  # normal . half vector
            cos_l.append(lz / ln)
            highlight.append(np.clip(cos_h, 0.0, 1.0) ** SHININESS)
        ambient = m.headlight_ambient + m.light_ambient.sum(axis=0)
        image = albedo * (ambient + np.tensordot(np.array(cos_l), diffuse, axes=(0, 0))) + np.tensordot(
            np.array(highlight), specular, axes=(0, 0))
        image[~down] = 0.0  # above the horizon: black
        return np.clip(image * 255.0 + 0.5, 0, 255).astype(np.uint8)

    def _surface(self, x: np.ndarray, y: np.ndarray, on_plane: np.ndarray) -> np.ndarray:
        """Index into PALETTE of what each pixel's ray hits."""
        table = (x >= TABLE_X_M[0]) & (x <= TABLE_X_M[1]) & (y >= TABLE_Y_M[0]) & (y <= TABLE_Y_M[1]) & on_plane
        checker = ((np.floor(x / CHECKER_M) + np.floor(y / CHECKER_M)) % 2).astype(np.intp)
        out = np.where(table, SURFACES.index("table_a") + checker, SURFACES.index("floor"))

        def dist(c):
            return np.hypot(x - c[0], y - c[1])

        if self.spec.name == "PickPlace":
            out[dist(self.x[TARGET]) < TARGET_RADIUS_M] = SURFACES.index("target")
        out[dist(self.x[OBJECT]) < OBJECT_RADIUS_M] = SURFACES.index("object")
        inner, outer = GRIPPER_RING_M[bool(self.x[CLOSED])]
        r = dist(self.eef_world())
        out[(r >= inner) & (r < outer)] = SURFACES.index("gripper")
        return out

    def instruction_paraphrases(self) -> List[str]:
        return list(self.spec.paraphrases)

    def proprio(self) -> Dict[str, np.ndarray]:
        """The gripper's position in the base frame, whether it is closed and whether it holds something."""
        return {"eef_pos": self.x[EEF].copy(), "gripper_closed": np.array([self.x[CLOSED]]),
                "grasping": np.array([self.x[HOLDING]])}

    def privileged_state(self) -> Dict[str, np.ndarray]:
        """World positions of the gripper, object and target, and the base pose (fake-expert reads it)."""
        return {"eef_pos": self.eef_world(), "object_pos": self.x[OBJECT].copy(), "target_pos": self.x[TARGET].copy(),
                "base_pose": self.x[BASE].copy(), "holding": np.array([self.x[HOLDING]])}

    # ------------------------------------------------------------------ state: snapshot, restore, fingerprint

    def get_state(self, observations: bool = False) -> Dict[str, Any]:
        """A bit-exact snapshot: the state vector (layout STATE_LAYOUT) and the step counter (observations
        are computed from it when asked, so there is no observation state to add)."""
        return {"integration": self.x.copy(), "steps": np.array(self.steps)}

    def set_state(self, state: Mapping[str, Any]) -> None:
        self.set_physics_state(state["integration"])
        self.steps = int(state["steps"])

    def set_physics_state(self, integration: np.ndarray) -> None:
        integration = np.asarray(integration, dtype=np.float64)
        if integration.shape != self.x.shape:
            raise ValueError(f"the fake backend's state has shape {self.x.shape}, got {integration.shape}")
        self.x = integration.copy()

    def joint_positions(self) -> np.ndarray:
        """The base pose and the gripper position (the fake robot's joints), a copy."""
        return np.concatenate([self.x[BASE], self.x[EEF]])

    def fingerprint(self) -> str:
        """Hash of the state and of every perturbable model value (the PERTURBABLE table)."""
        return self.fingerprint_of(self.get_state())

    # ------------------------------------------------------------------ perturbation hooks (lights: PerturbableModel)

    def nominal_camera_quat(self, camera: str) -> np.ndarray:
        return self._nominal["cam_quat"][CAMERAS.index(camera)].copy()

    def camera_quat(self, camera: str) -> np.ndarray:
        return self.model.cam_quat[CAMERAS.index(camera)].copy()

    def camera_vertical(self, camera: str) -> np.ndarray:
        """The world vertical in the frame of the camera's parent (the base or the gripper: both yaw only)."""
        CAMERAS.index(camera)
        return np.array([0.0, 0.0, 1.0])

    def set_camera_quat(self, camera: str, quat: np.ndarray) -> None:
        self.model.cam_quat[CAMERAS.index(camera)] = quat

    def base_offset(self) -> Dict[str, float]:
        """(forward, side, yaw) of the base, read from the state (nominal is 0)."""
        b = self.x[BASE]
        return {"forward_m": float(b[0]), "side_m": float(b[1]), "yaw_deg": float(np.rad2deg(b[2]))}

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        """Move the base; the gripper moves with it (its position is kept in the base frame)."""
        self.x[BASE] = [offset["forward_m"], offset["side_m"], np.deg2rad(offset["yaw_deg"])]

    # camera_poses: the cameras' mounts in their parent's frame (the base for agentview, the gripper for the wrist)

    def nominal_camera_placement(self, camera: str) -> Dict[str, Any]:
        i = CAMERAS.index(camera)
        return {"pos": self._nominal["cam_pos"][i].copy(), "quat": self._nominal["cam_quat"][i].copy(),
                "fovy_deg": float(self._nominal["cam_fovy"][i])}

    def camera_placement(self, camera: str) -> Dict[str, Any]:
        i = CAMERAS.index(camera)
        return {"pos": self.model.cam_pos[i].copy(), "quat": self.model.cam_quat[i].copy(),
                "fovy_deg": float(self.model.cam_fovy[i])}

    def camera_parent_frame(self, camera: str):
        """The base (third person) or the gripper (wrist) on the table plane, turned by the base's yaw."""
        CAMERAS.index(camera)
        parent = self.eef_world() if camera in WRIST_CAMERAS else self.x[BASE][:2]
        return np.array([*parent, 0.0]), self.base_rotation()

    def camera_orbit_pivot(self, camera: str) -> np.ndarray:
        return np.array(ORBIT_PIVOT_M, dtype=float)

    def set_camera_placement(self, camera: str, pose: Mapping[str, Any]) -> None:
        i = CAMERAS.index(camera)
        self.model.cam_pos[i] = pose["pos"]
        self.model.cam_quat[i] = pose["quat"]
        self.model.cam_fovy[i] = pose["fovy_deg"]

    # robot_joints: the gripper's planar position, in units of ARM_JOINT_UNIT_M

    def arm_joint_names(self) -> List[str]:
        return list(ARM_JOINTS)

    def arm_joint_offset(self) -> np.ndarray:
        return (self.x[EEF] - self._eef0) / ARM_JOINT_UNIT_M

    def set_arm_joint_offset(self, offset) -> None:
        self.x[EEF] = self._eef0 + ARM_JOINT_UNIT_M * np.asarray(offset, dtype=float)

    def arm_joint_offset_problem(self, offset) -> Optional[str]:
        """Why the offset start is invalid (out of the arm's reach, or the gripper on the object), or None."""
        eef = self._eef0 + ARM_JOINT_UNIT_M * np.asarray(offset, dtype=float)
        if not (ARM_X_M[0] <= eef[0] <= ARM_X_M[1] and ARM_Y_M[0] <= eef[1] <= ARM_Y_M[1]):
            return f"gripper start {eef.round(3).tolist()} m is out of the arm's reach"
        world = self.x[BASE][:2] + self.base_rotation()[:2, :2] @ eef
        if np.linalg.norm(world - self.x[OBJECT]) < COLLISION_M:
            return f"gripper would start within {COLLISION_M * 100:.0f} cm of the object"
        return None

    def base_offset_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        """Why ``offset`` is invalid (the gripper would start on the object), or None; the state is unchanged."""
        base = np.array([offset["forward_m"], offset["side_m"]])
        eef = base + rot_z(np.deg2rad(offset["yaw_deg"]))[:2, :2] @ self.x[EEF]
        gap = float(np.linalg.norm(eef - self.x[OBJECT]))
        if gap < COLLISION_M:
            return (f"gripper would start {gap * 100:.1f} cm from the object "
                    f"(collision below {COLLISION_M * 100:.0f} cm)")
        return None

    # dynamics: the arm's gain, the gripper's force, the object's mass (FAKE_DYNAMICS)

    def nominal_dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        attr, element, _ = self._dynamics_entry(quantity)
        return {element: self._dynamics_nominal[attr].copy()}

    def dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        attr, element, _ = self._dynamics_entry(quantity)
        return {element: getattr(self.model, attr).copy()}

    def set_dynamics(self, quantity: str, values: Mapping[str, Any]) -> None:
        attr, element, _ = self._dynamics_entry(quantity)
        for key, value in values.items():
            if key != element:
                raise UnknownNameError(f"element of {quantity}", key, [element])
            getattr(self.model, attr)[...] = value

    @staticmethod
    def _dynamics_entry(quantity: str):
        if quantity not in FAKE_DYNAMICS:
            raise UnknownNameError("dynamics quantity", quantity, list(FAKE_DYNAMICS))
        return FAKE_DYNAMICS[quantity]

    # ------------------------------------------------------------------ bookkeeping

    def renderer_info(self) -> Dict[str, Any]:
        return {"MUJOCO_GL": None, "gl_renderer": "numpy ray caster (fake backend)",
                "render_profile": self.render_profile}

    def close(self) -> None:
        self._rays.clear()


class FakeBackend(TaskTable):
    """The testing backend: tasks Reach and PickPlace of a point gripper in the plane (no simulator)."""

    name = "fake"
    demo_policy = "fake-expert"
    negative_control_policy = "fake-random"
    tasks = TASKS

    def make(self, task: str, render_profile: str = "fast", stock_simulator: bool = False) -> FakeEnv:
        """A live fake environment (``stock_simulator`` changes nothing: the fake has no shortcuts)."""
        self.task(task)
        return FakeEnv(TASKS[task], render_profile)

    def config(self) -> Dict[str, Any]:
        """The frozen configuration recorded in manifests."""
        return {
            "testing_backend": True,
            "action": "planar eef velocity (base frame) x2, gripper (>0 closes)",
            "max_step_m": MAX_STEP_M,
            "third_person_cameras": list(THIRD_PERSON_CAMERAS),
            "wrist_cameras": list(WRIST_CAMERAS),
            "state_layout": list(STATE_LAYOUT),
            "horizons": {t.name: t.horizon for t in TASKS.values()},
        }

    def versions(self) -> Dict[str, str]:
        return {"numpy": np.__version__}

    def check_available(self) -> None:
        """Always available: numpy is all it needs."""
        return None


# --------------------------------------------------------------------------- stage predicates


@predicate("fake", "gripper_near")
def gripper_near(env: FakeEnv, distance_m: float) -> bool:
    """The gripper is within ``distance_m`` of the object."""
    return bool(env.eef_object_distance() < distance_m)


@predicate("fake", "holding")
def holding(env: FakeEnv) -> bool:
    """The closed gripper holds the object."""
    return bool(env.x[HOLDING])


@predicate("fake", "object_near_target")
def object_near_target(env: FakeEnv, distance_m: float) -> bool:
    """The object is within ``distance_m`` of the target (held or not)."""
    return bool(env.object_target_distance() < distance_m)


@predicate("fake", "released_on_target")
def released_on_target(env: FakeEnv, distance_m: float) -> bool:
    """The object is within ``distance_m`` of the target and the gripper no longer holds it."""
    return bool(not env.x[HOLDING] and env.object_target_distance() < distance_m)


# --------------------------------------------------------------------------- policies

__all__ = ["FakeBackend", "FakeEnv", "TASKS"]
