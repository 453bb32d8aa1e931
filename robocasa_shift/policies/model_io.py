"""What every adapter of a model run elsewhere shares: served ones (``gr00t``, ``openpi``, ``vla-eval``) and
``lerobot``, which loads a checkpoint in process.

- ``NOT_RESET``: the fingerprint of a policy that was never reset.
- Session RNGs: a generator state private to one session, installed as the
  process's global one only around a call into the model, because GR00T,
  openpi's PyTorch models and LeRobot's samplers all draw from the global
  generator and a global seed would leak into everything else.
- Observation helpers: camera maps, image checks, proprio vectors.
- One action-layout type, ``ActionSlot``: where columns of a model's action go in the
  embodiment's action, for a flat (T, D) array (openpi, LeRobot, vla-eval) and for GR00T's
  replies of one array per action key alike; ``checked_chunk`` is the one check of a chunk
  (shape, dtype, finite values, magnitude, size), for server replies and restored buffers.

Errors live in ``robocasa_shift.errors``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union
import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.embodiments.fake_planar import LAYOUT as FAKE_PLANAR
from robocasa_shift.embodiments.panda import LAYOUT as PANDA
from robocasa_shift.embodiments.panda_omron import (
    ACTION_DIM,
    ARM_POS,
    ARM_ROT,
    BASE_MOTION,
    GRIPPER,
    MODE,
    indices,
)
from robocasa_shift.embodiments.panda_omron import LAYOUT as PANDA_OMRON
from robocasa_shift.errors import ActionFormatError, PolicyOptionError, UnknownNameError
from robocasa_shift.seeding import rng_state_hash

NOT_RESET = "not-reset"

CameraMapLike = Union[None, str, Mapping[str, Union[str, Sequence[str]]]]
StateLayoutLike = Union[None, str, Sequence[Tuple[str, int]]]

# Harness camera -> RoboCasa's camera names, as models trained on RoboCasa data know them. The
# embedded backend's one third-person camera stands in for both agentview cameras; RoboCasa's
# own cameras map to themselves. Clients prefix them with their wire format's key.
ROBOCASA_CAMERAS: Dict[str, Tuple[str, ...]] = {
    "robot0_robotview": ("robot0_agentview_left", "robot0_agentview_right"),
    "robot0_eye_in_hand": ("robot0_eye_in_hand",),
    "robot0_agentview_left": ("robot0_agentview_left",),
    "robot0_agentview_right": ("robot0_agentview_right",),
}

# LIBERO's 8-D state as openpi's and LeRobot's LIBERO evaluations build it: end effector position, its
# orientation as an axis-angle vector (the libero backend's derived proprio key), the two finger joints.
LIBERO_STATE: Tuple[Tuple[str, int], ...] = (
    ("robot0_eef_pos", 3),
    ("robot0_eef_axis_angle", 3),
    ("robot0_gripper_qpos", 2),
)

# (proprio key, dimension) in the order of RoboCasa's LeRobot ``observation.state`` (16-D).
ROBOCASA_STATE: Tuple[Tuple[str, int], ...] = (
    ("robot0_base_pos", 3),
    ("robot0_base_quat", 4),
    ("robot0_base_to_eef_pos", 3),
    ("robot0_base_to_eef_quat", 4),
    ("robot0_gripper_qpos", 2),
)


def chunk_length(steps: int, n_action_steps: Optional[int], source: str) -> int:
    """How many steps of a ``steps``-long chunk to execute: all, or the first ``n_action_steps``."""
    if n_action_steps is None:
        return steps
    if n_action_steps > steps:
        raise ActionFormatError(f"n_action_steps={n_action_steps} exceeds the chunk of {steps} steps{source}")
    return n_action_steps


# =========================================================================== session RNGs


def cuda_devices(torch) -> Tuple[int, ...]:
    """Every CUDA device index of this process (none without CUDA)."""
    return tuple(range(torch.cuda.device_count())) if torch.cuda.is_available() else ()


class TorchSessionRNG:
    """A session's torch generator states (CPU and ``devices``), global only while the model runs.

    Args:
        torch: the torch module (imported by the caller, so this module needs no torch).
        seed: the session's seed.
        devices: CUDA device indices whose generators belong to the session.
    """

    def __init__(self, torch, seed: int, devices: Sequence[int] = ()):
        self.torch = torch
        self.devices = tuple(int(i) for i in devices)
        self.cpu_state = torch.Generator().manual_seed(int(seed) % 2**63).get_state()
        self.cuda_states = [torch.Generator(device=f"cuda:{i}").manual_seed(int(seed) % 2**63).get_state()
                            for i in self.devices]

    def fingerprint(self) -> str:
        """sha256 of the current states, read back from them."""
        return rng_state_hash(self.cpu_state.numpy(), *(s.numpy() for s in self.cuda_states))

    def run(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` with this session's state as the global torch state; keep what it consumed.

        The caller's global state is restored afterwards, also when ``fn`` raises.
        """
        torch = self.torch
        saved_cpu = torch.get_rng_state()
        saved_cuda = [torch.cuda.get_rng_state(i) for i in self.devices]
        torch.set_rng_state(self.cpu_state)
        for i, state in zip(self.devices, self.cuda_states):
            torch.cuda.set_rng_state(state, i)
        try:
            return fn()
        finally:
            self.cpu_state = torch.get_rng_state()
            self.cuda_states = [torch.cuda.get_rng_state(i) for i in self.devices]
            torch.set_rng_state(saved_cpu)
            for i, state in zip(self.devices, saved_cuda):
                torch.cuda.set_rng_state(state, i)


class NumpySessionRNG:
    """Without torch: the session's state is swapped into numpy's global (legacy) generator."""

    def __init__(self, seed: int):
        self.state = np.random.RandomState(int(seed) % 2**32).get_state()

    def fingerprint(self) -> str:
        """sha256 of the current state."""
        return rng_state_hash(self.state[1], repr(self.state[2:]))

    def run(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` with this session's state as numpy's global state; keep what it consumed."""
        saved = np.random.get_state()
        np.random.set_state(self.state)
        try:
            return fn()
        finally:
            self.state = np.random.get_state()
            np.random.set_state(saved)


# =========================================================================== observations


def as_camera_map(camera_map: CameraMapLike, default: Mapping[str, Tuple[str, ...]]) -> Dict[str, Tuple[str, ...]]:
    """Harness camera -> model camera key(s), from a dict, its JSON (a command line) or None (``default``)."""
    if camera_map is None:
        return {k: tuple(v) for k, v in default.items()}
    if isinstance(camera_map, str):
        camera_map = json.loads(camera_map)
    return {str(k): ((v,) if isinstance(v, str) else tuple(v)) for k, v in camera_map.items()}


def as_state_layout(state_layout: StateLayoutLike) -> Tuple[Tuple[str, int], ...]:
    """(proprio key, dimension) pairs from a list, its JSON or None (``ROBOCASA_STATE``)."""
    if state_layout is None:
        return ROBOCASA_STATE
    if isinstance(state_layout, str):
        state_layout = json.loads(state_layout)
    return tuple((str(k), int(d)) for k, d in state_layout)


def checked_image(camera: str, image: Any) -> np.ndarray:
    """``image`` as a contiguous uint8 (H, W, 3) array; anything else raises naming the camera."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"camera {camera!r}: expected a uint8 (H, W, 3) image, got {image.dtype} {image.shape}")
    return np.ascontiguousarray(image)


def proprio_part(obs: Observation, key: str, dim: int, needed_by: Optional[str] = None) -> np.ndarray:
    """Proprio ``key`` as a float64 vector of ``dim`` values.

    Args:
        needed_by: the model input that reads it, named in the errors (default: the state vector).

    Raises:
        KeyError: the backend does not provide ``key`` (the message lists what it provides).
        ValueError: ``key`` has another size.
    """
    if key not in obs.proprio:
        raise KeyError(f"{needed_by or 'the state'} needs proprio '{key}', which the backend does not provide; "
                       f"it provides: {', '.join(sorted(obs.proprio))}")
    value = np.asarray(obs.proprio[key], dtype=np.float64).reshape(-1)
    if value.shape != (dim,):
        prefix = f"{needed_by}: " if needed_by else ""
        raise ValueError(f"{prefix}proprio '{key}' has {value.size} values, expected {dim}")
    return value


def proprio_vector(obs: Observation, layout: Sequence[Tuple[str, int]], dtype=np.float32) -> np.ndarray:
    """The proprio keys of ``layout`` concatenated; a missing key or a wrong size raises naming it."""
    return np.concatenate([proprio_part(obs, key, dim) for key, dim in layout]).astype(dtype)


# =========================================================================== actions


def binarize(values: np.ndarray) -> np.ndarray:
    """RoboCasa's gym wrapper's reading of gripper and mode outputs: < 0.5 -> -1, else +1."""
    return np.where(values < 0.5, -1.0, 1.0)


@dataclass(frozen=True)
class ActionSlot:
    """Where some columns of a model's action go in the embodiment's action (12-D PandaOmron, 7-D Panda, 3-D planar).

    A flat (T, D) model action (openpi, LeRobot, vla-eval) has one slot per part, ``columns`` indexing D; a
    reply of one (T, d) array per action key (GR00T) has one slot per key, ``name`` the key and ``columns``
    ``0..d-1``.
    """

    name: str
    columns: Tuple[int, ...]  # model action columns
    targets: Tuple[int, ...]  # the embodiment's action index of each column
    binary: bool = False  # read through ``binarize``


# Bounds on one action chunk, from a server reply or a restored client-side buffer alike: real chunks are
# tens of steps of actions of order 1, so these only keep a hostile peer's values out of the simulator and
# out of memory.
MAX_CHUNK_STEPS = 4096
MAX_ACTION_ABS = 1e6


def checked_chunk(value: Any, width: int, source: str, steps: Optional[int] = None) -> np.ndarray:
    """``value`` as a float64 (T, ``width``) chunk after the one check every chunk passes.

    A (width,) value is one step. Checked: a real numeric dtype (no object, string or complex array),
    T == ``steps`` when given, else 1 <= T <= ``MAX_CHUNK_STEPS``, finite values, every
    |value| <= ``MAX_ACTION_ABS``.

    Raises:
        ActionFormatError: naming ``source`` and what failed.
    """
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise ActionFormatError(f"'{source}' has dtype {array.dtype}; an action chunk holds real numbers")
    array = array.astype(np.float64)
    if array.ndim == 1 and width >= 1 and array.shape[0] == width:
        array = array[None]
    if array.ndim != 2 or array.shape[1] != width or not 1 <= len(array) <= MAX_CHUNK_STEPS:
        raise ActionFormatError(f"'{source}' has shape {tuple(np.shape(value))}, expected "
                                f"({steps or 'T'}, {width}) with 1 <= T <= {MAX_CHUNK_STEPS}")
    if steps is not None and len(array) != steps:
        raise ActionFormatError(f"'{source}' has {len(array)} steps, expected ({steps}, {width})")
    if not np.all(np.isfinite(array)):
        raise ActionFormatError(f"'{source}' has non-finite values")
    if np.max(np.abs(array)) > MAX_ACTION_ABS:
        raise ActionFormatError(f"'{source}' has values of magnitude {np.max(np.abs(array)):.3g}, over "
                                f"{MAX_ACTION_ABS:g}: not an action")
    return array


ACTION_LAYOUTS: Dict[str, Tuple[ActionSlot, ...]] = {
    # RoboCasa's LeRobot datasets (PandaOmron_modality.json) and LeRobot's RoboCasa env
    "robocasa-lerobot": (
        ActionSlot("base_motion", (0, 1, 2, 3), BASE_MOTION),
        ActionSlot("control_mode", (4,), (MODE,), binary=True),
        ActionSlot("end_effector_position", (5, 6, 7), indices(ARM_POS)),
        ActionSlot("end_effector_rotation", (8, 9, 10), indices(ARM_ROT)),
        ActionSlot("gripper_close", (11,), (GRIPPER,), binary=True),
    ),
    # RoboCasa's HDF5 datasets and robocasa.utils.env_utils.convert_action
    "robocasa-hdf5": (
        ActionSlot("end_effector_position", (0, 1, 2), indices(ARM_POS)),
        ActionSlot("end_effector_rotation", (3, 4, 5), indices(ARM_ROT)),
        ActionSlot("gripper_close", (6,), (GRIPPER,), binary=True),
        ActionSlot("base_motion", (7, 8, 9, 10), BASE_MOTION),
        ActionSlot("control_mode", (11,), (MODE,), binary=True),
    ),
    # the environment's own action, unchanged
    "panda-omron": (ActionSlot("action", tuple(range(ACTION_DIM)), tuple(range(ACTION_DIM))),),
    # LIBERO's fixed Panda (OSC_POSE delta, axis-angle, gripper -1 open / +1 close), as LIBERO checkpoints emit it
    "libero": (ActionSlot("action", tuple(range(7)), tuple(range(7))),),
    # the testing backend's planar gripper (velocity x, y; gripper command), for served stand-ins in tests
    "fake-planar": (ActionSlot("action", (0, 1, 2), (0, 1, 2)),),
}

LayoutLike = Union[str, Sequence[Union[ActionSlot, Mapping[str, Any]]]]
# The embodiments a layout may fill, by their action's length.
EMBODIMENT_DIMS = {PANDA_OMRON.name: PANDA_OMRON.dim, PANDA.name: PANDA.dim, FAKE_PLANAR.name: FAKE_PLANAR.dim}


def parse_slots(items: Any, option: str, form: str,
                build: Callable[[Mapping[str, Any]], ActionSlot]) -> Tuple[ActionSlot, ...]:
    """``items`` (action slots, or dicts ``build`` turns into slots, or their JSON) as action slots.

    Raises:
        PolicyOptionError: not a list, not JSON, or an item ``build`` cannot read; the message names ``option``,
            the slot and its ``form`` (e.g. ``{key, dim, targets, binary}``).
    """
    if isinstance(items, str):
        try:
            items = json.loads(items)
        except json.JSONDecodeError as exc:
            raise PolicyOptionError(f"{option} is not JSON ({exc}); expected a list of {form}") from None
    if not isinstance(items, (list, tuple)):
        raise PolicyOptionError(f"{option} must be a list of {form}, got {json.dumps(items, default=str)[:80]}")
    slots = []
    for n, item in enumerate(items, start=1):
        try:
            slots.append(item if isinstance(item, ActionSlot) else build(item))
        except (KeyError, TypeError, ValueError) as exc:
            problem = f"it has no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
            raise PolicyOptionError(f"{option}: slot {n}, {json.dumps(item, default=str)[:80]}, is not {form}: "
                                    f"{problem}") from None
    return tuple(slots)


# How a slot is spelled in each option that takes slots: a part of a flat (T, D) model action (``action_layout``),
# or one reply key's (T, dim) array (GR00T's ``action_map``): the form errors name, and the slot it builds.
SLOT_FORMS: Dict[str, Tuple[str, Callable[[Mapping[str, Any]], ActionSlot]]] = {
    "action_layout": ("{name, columns, targets, binary}",
                      lambda s: ActionSlot(str(s["name"]), tuple(int(c) for c in s["columns"]),
                                           tuple(int(t) for t in s["targets"]), bool(s.get("binary", False)))),
    "action_map": ("{key, dim, targets, binary}",
                   lambda s: ActionSlot(str(s["key"]), tuple(range(int(s["dim"]))),
                                        tuple(int(t) for t in s["targets"]), bool(s.get("binary", False)))),
}


def resolve_layout(layout: LayoutLike, option: str = "action_layout") -> Tuple[ActionSlot, ...]:
    """A layout by name (``action_layout`` only), or from slots (dicts in ``option``'s form, ``SLOT_FORMS``; or
    their JSON): the one parser of every option that places a model's actions.

    Raises:
        UnknownNameError: an unknown layout name.
        PolicyOptionError: a slot that is not in ``option``'s form.
        ValueError: the slots do not fill each index of an embodiment's action exactly once.
    """
    if option == "action_layout" and isinstance(layout, str) and not layout.lstrip().startswith("["):
        if layout not in ACTION_LAYOUTS:
            raise UnknownNameError("action layout", layout, sorted(ACTION_LAYOUTS))
        return ACTION_LAYOUTS[layout]
    form, build = SLOT_FORMS[option]
    slots = parse_slots(layout, option, form, build)
    targets = sorted(t for s in slots for t in s.targets)
    if (len(targets) not in EMBODIMENT_DIMS.values() or targets != list(range(len(targets)))
            or any(len(s.columns) != len(s.targets) for s in slots)):
        raise ValueError(f"an {option} must map one column to each index of the embodiment's action (0-11 "
                         f"for PandaOmron, 0-6 for LIBERO's Panda, 0-2 for the testing backend) exactly once; got "
                         f"targets {targets}")
    return slots


def layout_dim(slots: Sequence[ActionSlot]) -> int:
    """The length of the action a layout fills."""
    return sum(len(s.targets) for s in slots)


def check_layout_fits(slots: Sequence[ActionSlot], obs: Observation, option: str = "action_layout") -> None:
    """Refuse a layout whose actions the environment cannot take (a 12-D layout on LIBERO's 7-D Panda).

    Raises:
        ActionFormatError: naming both lengths and the layouts that fit (``option``: the option that gave it).
    """
    wanted = obs.action_layout.dim if obs.action_layout is not None else ACTION_DIM
    if layout_dim(slots) != wanted and option != "action_layout":
        raise ActionFormatError(f"the {option} makes {layout_dim(slots)}-D actions; this environment takes "
                                f"{wanted}-D ones: give {option} for its embodiment")
    if layout_dim(slots) != wanted:
        fits = sorted(n for n, known in ACTION_LAYOUTS.items() if layout_dim(known) == wanted)
        raise ActionFormatError(f"action layout {layout_name(slots) or 'custom'} makes {layout_dim(slots)}-D actions; "
                                f"this environment takes {wanted}-D ones: use action_layout={' or '.join(fits)}")


def layout_name(slots: Sequence[ActionSlot]) -> Optional[str]:
    """The name of a known layout with exactly these slots (None for a custom one)."""
    return next((name for name, known in ACTION_LAYOUTS.items() if tuple(slots) == known), None)


def actions_to_flat(actions: Any, layout: Sequence[ActionSlot]) -> np.ndarray:
    """The flat (T, D) model action of an embodiment's (T, A) actions: the inverse of :func:`flat_to_actions`
    (a binary slot is written 1 for a positive value, else 0, which ``binarize`` reads back). What a model
    trained on the harness's own demonstrations (``train-lerobot``) learns to emit."""
    value = np.asarray(actions, dtype=np.float64)
    value = value[None] if value.ndim == 1 else value
    if value.ndim != 2 or value.shape[1] != layout_dim(layout):
        raise ActionFormatError(f"actions of shape {value.shape} do not fit a layout of {layout_dim(layout)}-D actions")
    flat = np.zeros((len(value), 1 + max(c for s in layout for c in s.columns)))
    for slot in layout:
        part = value[:, list(slot.targets)]
        flat[:, list(slot.columns)] = (part > 0).astype(np.float64) if slot.binary else part
    return flat


def flat_to_actions(chunk: Any, layout: Sequence[ActionSlot], n_action_steps: Optional[int] = None,
                    source: str = "actions") -> np.ndarray:
    """The (steps, A) chunk in the embodiment's action (A = 12 PandaOmron, 7 Panda) of a flat (T, D) model chunk.

    Args:
        chunk: (T, D) or one (D,) step.
        n_action_steps: how many of the T steps to keep (None: all).
        source: the reply key or model output, named in the errors.

    Raises:
        ActionFormatError: wrong shape, too few steps or non-finite values.
    """
    width = 1 + max(c for s in layout for c in s.columns)
    try:
        value = checked_chunk(chunk, width, source)
    except ActionFormatError as exc:
        raise ActionFormatError(f"{exc}; check the server's output transform (openpi's *Outputs slice the "
                                "model's padded actions to the dataset's action dimension) or choose another "
                                "action_layout") from None
    steps = chunk_length(len(value), n_action_steps, f" in '{source}'")
    actions = np.zeros((steps, layout_dim(layout)))
    for slot in layout:
        part = value[:steps, list(slot.columns)]
        actions[:, list(slot.targets)] = binarize(part) if slot.binary else part
    return actions
