"""The backend contract: what the harness needs from a simulator backend and from its environments.

A backend offers tasks and makes live environments (:class:`Env`). Beyond the
core every rollout uses, an environment offers *hooks* for the factor kinds
that edit the simulator: :class:`Lights`, :class:`Cameras`,
:class:`MobileBase`, :class:`CameraPoses`, :class:`RobotJoints` and :class:`Dynamics` (and
:class:`Instructions`, which supplies paraphrases). A factor kind declares the hooks it ``requires``; an
environment that lacks one is refused when it is made
(:func:`check_hooks`), never half-way through a study.

Every value a perturbation may edit is listed once, in the environment's
table of perturbable attributes (:class:`PerturbableTable`); restoring the
nominal model and the scope of the fingerprint both derive from that table,
so a new field cannot be perturbed without being restored and fingerprinted.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    runtime_checkable,
)

import numpy as np

from robocasa_shift.embodiments import ActionLayout
from robocasa_shift.errors import BackendUnavailable, UnknownNameError

# Camera roles a policy may ask for; each backend maps a role to camera names.
CAMERA_ROLES = ("third_person", "wrist")


@dataclass(frozen=True)
class TaskInfo:
    """What the harness and policies know about a task.

    Attributes:
        name: the task's name in its backend's task table.
        horizon: official horizon in control steps; a rollout ends at the first success or here.
        instruction: the language instruction given to policies.
        description: one line on what success means.
        randomization: one line on what differs between base episodes.
        variant_of: for a scene variant with its own scene and initial states (LIBERO-PRO's), the task it
            changes; its rollouts have no twin there and are compared with it unpaired. None otherwise.
    """

    name: str
    horizon: int
    instruction: str
    description: str
    randomization: str = ""
    variant_of: Optional[str] = None


@dataclass(frozen=True)
class BaseEpisode:
    """Which base episode a reset starts: its seed stream (phase) and index.

    A backend that draws initial states from the seed ignores it; one with a fixed list of
    initial states per task (LIBERO) picks one from it.
    """

    phase: str
    index: int


@runtime_checkable
class Env(Protocol):
    """One live environment of a backend, kept across rollouts of one task.

    Invariants: ``reset(seed)`` gives a bit-identical state for one seed in any
    process and in any order of earlier rollouts; ``restore_nominal`` (called by
    ``reset``) undoes every perturbation edit exactly; success and subgoal checks
    read simulator state, never images.
    """

    task: TaskInfo
    third_person_cameras: Sequence[str]
    wrist_cameras: Sequence[str]
    action_dim: int
    action_layout: ActionLayout  # where the arm, gripper and fixed entries of an action are

    def reset(self, seed: int, episode: Optional[BaseEpisode] = None) -> None:
        """Restore the nominal model, then reset to the initial state of ``seed`` (and ``episode``, where the
        backend's initial states are a fixed list)."""

    def step(self, action: np.ndarray) -> None:
        """One control step with an ``(action_dim,)`` action in the embodiment's layout."""

    def is_success(self) -> bool:
        """The environment's own success check on the current state: the official outcome."""

    def render(self, camera: str, size: int) -> np.ndarray:
        """One RGB frame of ``camera``: uint8, ``(size, size, 3)``, top row first."""

    def proprio(self) -> Dict[str, np.ndarray]:
        """The robot's own sensing (joint, end-effector and gripper readings)."""

    def privileged_state(self) -> Dict[str, np.ndarray]:
        """Object poses read from the simulator; only privileged (scripted) policies receive it."""

    def fingerprint(self) -> str:
        """SHA-256 over the physics state, the controllers' carried state and every perturbable value."""

    def get_state(self, observations: bool = False) -> Dict[str, Any]:
        """A bit-exact snapshot of the physics, the controllers and the clocks (arrays and scalars only).

        With ``observations``, also the observation pipeline's own state (sensor sampling clocks,
        the last observation), so that a continuation restored from it observes exactly what the
        original did (branching's snapshots).
        """

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore a snapshot taken by :meth:`get_state` on the same task."""

    def set_physics_state(self, integration: np.ndarray) -> None:
        """Restore only the physics (replaying recorded states through predicates)."""

    def joint_positions(self) -> np.ndarray:
        """Every joint position (MuJoCo's ``qpos``), a copy: replay fidelity compares it step by step."""

    def eef_pos(self) -> np.ndarray:
        """The end effector's position in the world frame, (3,) metres (step logs and monitors read it)."""

    def restore_nominal(self) -> None:
        """Undo every perturbation edit exactly (values copied back from the nominal table)."""

    def renderer_info(self) -> Dict[str, Any]:
        """The renderer in use (GL backend, renderer string, render profile), for manifests."""

    def close(self) -> None:
        """Release the simulator and its rendering context."""


@runtime_checkable
class Lights(Protocol):
    """Hook for illumination: every scene light's colours and the headlight's, by name."""

    def nominal_lights(self) -> Dict[str, np.ndarray]:
        """The unperturbed light colours (name -> array of RGB rows)."""

    def lights(self) -> Dict[str, np.ndarray]:
        """The light colours the simulator holds now, read back from the model."""

    def set_lights(self, values: Mapping[str, Any]) -> None:
        """Write light colours (the names of :meth:`nominal_lights`)."""


@runtime_checkable
class Cameras(Protocol):
    """Hook for camera orientation: third-person cameras rotated in place."""

    third_person_cameras: Sequence[str]

    def nominal_camera_quat(self, camera: str) -> np.ndarray:
        """The camera's unperturbed orientation in its parent body's frame (w, x, y, z)."""

    def camera_quat(self, camera: str) -> np.ndarray:
        """The orientation the model holds now (w, x, y, z)."""

    def camera_vertical(self, camera: str) -> np.ndarray:
        """The world vertical expressed in the camera's parent body frame (unit 3-vector)."""

    def set_camera_quat(self, camera: str, quat: np.ndarray) -> None:
        """Write the camera's orientation and update derived poses."""


@runtime_checkable
class MobileBase(Protocol):
    """Hook for robot base initialization: a planar offset (forward, side, yaw) of the base."""

    def base_offset(self) -> Dict[str, float]:
        """``{"forward_m", "side_m", "yaw_deg"}`` relative to the episode's nominal placement, read back."""

    def set_base_offset(self, offset: Mapping[str, float]) -> None:
        """Place the base at ``offset`` from its nominal placement."""

    def base_offset_problem(self, offset: Mapping[str, float]) -> Optional[str]:
        """Why ``offset`` gives an invalid initial state (e.g. robot in collision), or None; state unchanged."""


@runtime_checkable
class Instructions(Protocol):
    """Hook for instruction paraphrases: other wordings of the task's instruction, scene untouched."""

    def instruction_paraphrases(self) -> List[str]:
        """The task's paraphrases, in their source's order ([] when it has none)."""


@runtime_checkable
class CameraPoses(Protocol):
    """Hook for camera placement (``camera_pose``): third-person cameras moved on an orbit about a pivot, their
    distance and field of view changed. Poses are in the camera's parent-body frame, as the model holds them."""

    third_person_cameras: Sequence[str]

    def nominal_camera_placement(self, camera: str) -> Dict[str, Any]:
        """The unperturbed ``{"pos": (3,), "quat": (4,) w x y z, "fovy_deg": float}`` in the parent body's frame."""

    def camera_placement(self, camera: str) -> Dict[str, Any]:
        """The pose and field of view the model holds now, read back (same shape as :meth:`nominal_camera_placement`)."""

    def camera_parent_frame(self, camera: str) -> Tuple[np.ndarray, np.ndarray]:
        """The parent body's world position (3,) and rotation (3, 3) now."""

    def camera_orbit_pivot(self, camera: str) -> np.ndarray:
        """The world point the camera orbits about and moves away from (LIBERO-Plus's: the table's centre)."""

    def set_camera_placement(self, camera: str, pose: Mapping[str, Any]) -> None:
        """Write a camera's pose and field of view (the keys of :meth:`nominal_camera_placement`); derived poses update."""


@runtime_checkable
class RobotJoints(Protocol):
    """Hook for the arm's starting joints (``arm_init``): an offset from the episode's own arm joint positions,
    applied before the backend's settle steps, so the rollout starts from the settled offset pose."""

    def arm_joint_names(self) -> List[str]:
        """The arm's joints the offset is given for, in order."""

    def arm_joint_offset(self) -> np.ndarray:
        """The arm joint positions now minus the episode's own (after its settle steps), read back from the state."""

    def set_arm_joint_offset(self, offset: Sequence[float]) -> None:
        """Start the episode's arm at its own joint positions plus ``offset`` (the backend's settle steps then run
        as at reset; the controller holds the new pose)."""

    def arm_joint_offset_problem(self, offset: Sequence[float]) -> Optional[str]:
        """Why ``offset`` gives an invalid start (a joint limit, the robot in collision), or None; state unchanged."""


@runtime_checkable
class Dynamics(Protocol):
    """Hook for the ``dynamics`` family: physical quantities of the model (``core.dynamics.QUANTITIES``), each a set of
    named elements (an arm joint, an actuator, a body, a geom) with their values as the model holds them.

    The environment lists the quantities it can scale in the class attribute ``DYNAMICS_QUANTITIES`` (a factor of a
    quantity it does not list is refused by name, ``dynamics:<quantity>``), keeps every value it edits in its
    dynamics table (restored at every reset, fingerprinted whenever it is off nominal) and takes the manipulated
    objects from the task's stage spec."""

    def nominal_dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        """Element name -> its unperturbed values of ``quantity``."""

    def dynamics(self, quantity: str) -> Dict[str, np.ndarray]:
        """Element name -> the values the model holds now, read back."""

    def set_dynamics(self, quantity: str, values: Mapping[str, Any]) -> None:
        """Write ``quantity``'s values (the elements of :meth:`nominal_dynamics`)."""


@runtime_checkable
class ObjectPoints(Protocol):
    """Capability: where the task's outcome-relevant objects are and how each third-person camera sees them, read
    from the simulator (the judge export's localise-and-crop boxes). Reading changes nothing."""

    def outcome_points(self, names: Sequence[str]) -> List[np.ndarray]:
        """World positions (3,) now of the named task points the environment knows (a stage spec's ``object``,
        ``target`` and ``support`` arguments), in order; names it does not know are left out. An environment
        whose points have no names may return its own (the fake backend: its object, and target)."""

    def camera_frame(self, camera: str) -> Tuple[np.ndarray, np.ndarray, float]:
        """``(position (3,), rotation (3, 3) with columns camera x, y, z, vertical field of view in degrees)`` of
        ``camera`` in the world now, as the renderer draws it (the camera looks along -z, y up)."""


@runtime_checkable
class TaskEvents(Protocol):
    """Capability: task-level events a branching trunk records (``branching/events.py``), read from the state."""

    def target_contact(self) -> Optional[bool]:
        """Whether the task's object touches its target now (Stack: cubeA on cubeB); None for a task without a
        target. Side-effect free, like a predicate."""


@runtime_checkable
class Contacts(Protocol):
    """Capability: what the robot touches, read from the simulator's contacts after each step (step logs' ``contacts``
    and the behaviour metrics from them)."""

    def contact_state(self) -> np.ndarray:
        """(5,) ints in ``core.steplog.CONTACT_COLUMNS`` order: the robot's contact pairs with the scene and with the
        task's objects it should not hit, whether it holds the object it manipulates (0/1), whether that object
        touches anything but the robot (0/1), its centre's height above its starting surface (mm). Side-effect free."""


# Capability name -> protocol: optional parts of the contract that ``check-backend`` reports as offered or not.
CAPABILITIES: Dict[str, type] = {"object_points": ObjectPoints, "task_events": TaskEvents, "contacts": Contacts}

# Hook name (as factor kinds declare it in ``requires``) -> protocol.
HOOKS: Dict[str, type] = {"lights": Lights, "cameras": Cameras, "base": MobileBase, "instructions": Instructions,
                          "camera_poses": CameraPoses, "robot_joints": RobotJoints, "dynamics": Dynamics}
# A hook a kind requires may name a part (``dynamics:object_mass``): the class attribute listing the parts offered.
HOOK_PARTS: Dict[str, str] = {"dynamics": "DYNAMICS_QUANTITIES"}


def hook_methods(hook: str) -> List[str]:
    """The methods of a hook (``dynamics:object_mass``: those of ``dynamics``)."""
    return [m for m, v in vars(HOOKS[hook.partition(":")[0]]).items() if not m.startswith("_") and callable(v)]


def offers_hook(env: Any, hook: str) -> bool:
    """Whether ``env`` (an environment or its class) has every method of ``hook`` and, for ``hook:part``, lists
    the part."""
    name, _, part = hook.partition(":")
    if name not in HOOKS or (part and name not in HOOK_PARTS):
        raise UnknownNameError("backend hook", hook, list(HOOKS))
    if not all(callable(getattr(env, m, None)) for m in hook_methods(name)):
        return False
    return not part or part in tuple(getattr(env, HOOK_PARTS[name], ()) or ())


def missing_hooks(env: Any, requires: Iterable[str]) -> List[str]:
    """The hooks of ``requires`` that ``env`` does not offer (all their methods, and the part named), in order."""
    return [h for h in requires if not offers_hook(env, h)]


def offered_capabilities(env: Any) -> List[str]:
    """The :data:`CAPABILITIES` ``env`` offers (all their methods), in order."""
    return [name for name, protocol in CAPABILITIES.items() if isinstance(env, protocol)]


def check_hooks(env: Any, needs: Mapping[str, Sequence[str]], backend: str) -> None:
    """Refuse an environment that lacks a hook a factor needs.

    Args:
        env: a live environment.
        needs: factor name -> hooks its kind requires (see ``core.factors.required_hooks``).
        backend: the backend's name, for the message.

    Raises:
        BackendUnavailable: naming the factor, the hook and its methods.
    """
    for factor, requires in needs.items():
        for hook in missing_hooks(env, requires):
            methods = hook_methods(hook)
            raise BackendUnavailable(
                f"backend '{backend}' cannot run factor '{factor}': its environment lacks the '{hook}' hook "
                f"({', '.join(methods)})"
            )


class Backend(Protocol):
    """A simulator backend: a task table and environments made from it.

    Attributes:
        name: the name it is registered under.
        demo_policy: the registered policy that makes its demonstrations for ``validate-stages`` (a scripted,
            privileged expert), or None when it has none (demonstrations must then already be in the run
            directory, e.g. converted from a dataset).
        negative_control_policy: the registered policy whose rollouts must never reach a task's last subgoal.
    """

    name: str
    demo_policy: Optional[str]
    negative_control_policy: str

    def task_names(self) -> List[str]:
        """Every task the backend offers, in a stable order."""

    def task(self, name: str) -> TaskInfo:
        """The task's metadata; an unknown name lists the valid ones (``UnknownNameError``)."""

    def make(self, task: str, render_profile: str = "fast", stock_simulator: bool = False) -> Env:
        """A live environment of ``task``, reused across rollouts (costly: build once per worker).

        ``stock_simulator``: run the simulator's own code only, without the backend's bit-identical shortcuts
        (a fused control step, culled frames); records must be identical either way. An environment may
        offer ``simulator_info()`` (a dict for the manifest: what ran of its shortcuts, and why not)."""

    def config(self) -> Dict[str, Any]:
        """The frozen environment configuration recorded in manifests (robot, control rate, cameras, ...)."""

    def versions(self) -> Dict[str, str]:
        """Versions of the packages whose behaviour the records depend on."""

    def check_available(self) -> None:
        """Raise ``BackendUnavailable`` (saying how to install what is missing) before any rollout runs."""


class TaskTable:
    """``task_names`` and ``task`` for a backend whose tasks are a class-level ``tasks`` mapping
    (name -> an object with ``info() -> TaskInfo``); unknown names list the valid ones."""

    tasks: Mapping[str, Any] = {}
    demo_policy: Optional[str] = None
    negative_control_policy: str = "random"

    def task_names(self) -> List[str]:
        """Every task, in the table's order."""
        return list(self.tasks)

    def task(self, name: str) -> TaskInfo:
        """The task's metadata; an unknown name lists the valid ones."""
        if name not in self.tasks:
            raise UnknownNameError("task", name, list(self.tasks))
        return self.tasks[name].info()

    def check_available(self) -> None:
        """Nothing to check by default (the backend's imports already succeeded)."""


# --------------------------------------------------------------------------- perturbable attributes


@dataclass(frozen=True)
class PerturbableTable:
    """Every model attribute a perturbation may edit, by name, as a dotted path on the model object.

    The environment snapshots the nominal values from the table, restores them
    from it and hashes them into its fingerprint under these names, so the three
    can never disagree.
    """

    fields: Tuple[Tuple[str, str], ...]  # (name, dotted attribute path on the model), in a fixed order

    @property
    def names(self) -> List[str]:
        """The field names, in the table's order."""
        return [name for name, _ in self.fields]

    def array(self, model: Any, name: str) -> np.ndarray:
        """The live array behind ``name`` (writes through to the model)."""
        obj = model
        for part in dict(self.fields)[name].split("."):
            obj = getattr(obj, part)
        return obj

    def read(self, model: Any) -> Dict[str, np.ndarray]:
        """A copy of every field's current value."""
        return {name: np.array(self.array(model, name), copy=True) for name in self.names}

    def restore(self, model: Any, nominal: Mapping[str, np.ndarray]) -> None:
        """Copy the nominal values back into the model, exactly."""
        for name in self.names:
            self.array(model, name)[...] = nominal[name]


class PerturbableModel:
    """What an environment derives from its ``PERTURBABLE`` table: nominal values, their exact
    restore, the model half of the fingerprint and the light hook.

    A subclass sets the class attributes ``PERTURBABLE`` and ``LIGHT_FIELDS`` (the table's
    light entries) and holds ``self.model`` (the object the table's paths start from) and
    ``self._nominal`` (``model_values()`` of the unperturbed model).
    """

    PERTURBABLE: PerturbableTable
    LIGHT_FIELDS: Tuple[str, ...] = ()
    # The model values the dynamics factors edit (the ``dynamics`` hook), with their nominal values in
    # ``self._dynamics_nominal``: restored like the others, but hashed into the fingerprint only where they are off
    # nominal, so that adding the table left every other condition's fingerprint as it was.
    DYNAMICS_TABLE: PerturbableTable = PerturbableTable(())

    def model_values(self) -> Dict[str, np.ndarray]:
        """A copy of every perturbable model value."""
        return self.PERTURBABLE.read(self.model)

    def off_nominal_dynamics(self) -> Dict[str, np.ndarray]:
        """The dynamics table's values that differ from nominal now (copies)."""
        if not self.DYNAMICS_TABLE.fields:
            return {}
        return {k: v for k, v in self.DYNAMICS_TABLE.read(self.model).items()
                if not np.array_equal(v, self._dynamics_nominal[k])}

    def fingerprint_of(self, state: Mapping[str, Any]) -> str:
        """SHA-256 of ``state`` (named arrays), every perturbable model value and every off-nominal dynamics value."""
        return hash_arrays({**{f"state.{k}": v for k, v in state.items()},
                            **{f"model.{k}": v for k, v in self.model_values().items()},
                            **{f"dynamics.{k}": v for k, v in self.off_nominal_dynamics().items()}})

    def restore_nominal(self) -> None:
        """Undo every perturbation edit of the model (exactly: the values are copied back)."""
        self.PERTURBABLE.restore(self.model, self._nominal)
        if self.DYNAMICS_TABLE.fields:
            self.DYNAMICS_TABLE.restore(self.model, self._dynamics_nominal)

    def nominal_lights(self) -> Dict[str, np.ndarray]:
        """The unperturbed colours of every light and of the headlight."""
        return {k: self._nominal[k].copy() for k in self.LIGHT_FIELDS}

    def lights(self) -> Dict[str, np.ndarray]:
        """The light colours the model holds now."""
        return {k: self.PERTURBABLE.array(self.model, k).copy() for k in self.LIGHT_FIELDS}

    def set_lights(self, values: Mapping[str, Any]) -> None:
        """Write light colours by field name; an unknown name lists the valid ones."""
        for key in values:
            if key not in self.LIGHT_FIELDS:
                raise UnknownNameError("light field", key, list(self.LIGHT_FIELDS))
        for key, value in values.items():
            self.PERTURBABLE.array(self.model, key)[...] = value


def installed_versions(packages: Sequence[str]) -> Dict[str, str]:
    """Each package's installed version ("not installed" when it is not), for ``Backend.versions``."""
    from importlib import metadata

    out = {}
    for package in packages:
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def hash_arrays(items: Mapping[str, Any]) -> str:
    """SHA-256 over named arrays (as float64, with their shapes), in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(items):
        value = np.ascontiguousarray(np.asarray(items[name], dtype=np.float64))
        h.update(name.encode())
        h.update(str(value.shape).encode())
        h.update(value.tobytes())
    return h.hexdigest()


def cameras_for_roles(env: Env, roles: Sequence[str]) -> List[str]:
    """Camera names for the roles a policy reads, third-person first."""
    unknown = [r for r in roles if r not in CAMERA_ROLES]
    if unknown:
        raise UnknownNameError("camera role", unknown[0], list(CAMERA_ROLES))
    names: List[str] = []
    for role in roles:
        names += list(env.third_person_cameras if role == "third_person" else env.wrist_cameras)
    return names


def state_equal(a: Optional[Mapping[str, Any]], b: Optional[Mapping[str, Any]]) -> bool:
    """Two snapshots hold the same keys with bit-identical values."""
    if a is None or b is None or set(a) != set(b):
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
