"""Harness observations to GR00T payloads and GR00T replies to PandaOmron actions (RoboCasa's GR00T naming).

- ``video.*``: (1, H, W, 3) uint8, top row first. The embedded backend's
  third-person ``robot0_robotview`` feeds both ``video.robot0_agentview_left``
  and ``video.robot0_agentview_right``; RoboCasa's cameras map to themselves.
- ``state.*``: (1, D) float64 from proprioception (``STATE_MAP``).
- ``annotation.human.task_description``: ``[instruction]``.
- actions (T, D) per key -> the 12-D PandaOmron action (``ACTION_LAYOUT``).
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.embodiments.panda_omron import (
    ARM_POS,
    ARM_ROT,
    BASE_MOTION,
    GRIPPER,
    MODE,
    indices,
)
from robocasa_shift.errors import ActionFormatError
from robocasa_shift.policies.model_io import (
    ROBOCASA_CAMERAS,
    ActionSlot,
    checked_chunk,
    binarize,
    checked_image,
    chunk_length,
    layout_dim,
    proprio_part,
    resolve_layout,
)

LANGUAGE_KEY = "annotation.human.task_description"
# Harness camera name -> GR00T video keys. Cameras not listed map to "video.<name>".
DEFAULT_CAMERA_MAP: Dict[str, Tuple[str, ...]] = {
    camera: tuple(f"video.{name}" for name in names) for camera, names in ROBOCASA_CAMERAS.items()
}
# GR00T state key -> (proprio key, dimension). Quaternions stay in robosuite's x, y, z, w order,
# as RoboCasa's gym wrapper serves them.
STATE_MAP: Dict[str, Tuple[str, int]] = {
    "state.end_effector_position_relative": ("robot0_base_to_eef_pos", 3),
    "state.end_effector_rotation_relative": ("robot0_base_to_eef_quat", 4),
    "state.base_position": ("robot0_base_pos", 3),
    "state.base_rotation": ("robot0_base_quat", 4),
    "state.gripper_qpos": ("robot0_gripper_qpos", 2),
}


ACTION_LAYOUT: Tuple[ActionSlot, ...] = (
    ActionSlot("action.end_effector_position", (0, 1, 2), indices(ARM_POS)),
    ActionSlot("action.end_effector_rotation", (0, 1, 2), indices(ARM_ROT)),
    ActionSlot("action.base_motion", (0, 1, 2, 3), BASE_MOTION),
    ActionSlot("action.gripper_close", (0,), (GRIPPER,), binary=True),
    ActionSlot("action.control_mode", (0,), (MODE,), binary=True),
)


def as_state_map(state_map: Any) -> Dict[str, Tuple[str, int]]:
    """GR00T state key -> (proprio key, dimension), from a dict, its JSON (a command line) or None (``STATE_MAP``)."""
    if state_map is None:
        return dict(STATE_MAP)
    if isinstance(state_map, str):
        state_map = json.loads(state_map)
    if not isinstance(state_map, Mapping):
        raise ValueError(f"state_map must map GR00T state keys to [proprio key, dimension], got {state_map!r:.80}")
    return {str(k): (str(v[0]), int(v[1])) for k, v in state_map.items()}


def as_action_map(action_map: Any) -> Tuple[ActionSlot, ...]:
    """Action slots from a list of {key, dim, targets, binary} (or its JSON; ``model_io.resolve_layout``'s
    ``action_map`` form), or None (``ACTION_LAYOUT``)."""
    return ACTION_LAYOUT if action_map is None else resolve_layout(action_map, "action_map")


def observation_to_gr00t(
    obs: Observation,
    camera_map: Mapping[str, Tuple[str, ...]] = DEFAULT_CAMERA_MAP,
    state_map: Mapping[str, Tuple[str, int]] = STATE_MAP,
    instruction: Optional[str] = None,
    language_key: str = LANGUAGE_KEY,
) -> Dict[str, Any]:
    """The GR00T request payload of one observation (batch of one, one frame)."""
    payload: Dict[str, Any] = {}
    for camera, image in obs.images.items():
        image = checked_image(camera, image)
        for key in camera_map.get(camera, (f"video.{camera}",)):
            payload[key] = np.ascontiguousarray(image[None])
    for key, (proprio_key, dim) in state_map.items():
        payload[key] = proprio_part(obs, proprio_key, dim, needed_by=key)[None]
    payload[language_key] = [instruction if instruction is not None else obs.instruction]
    return payload


def gr00t_to_actions(
    reply: Mapping[str, Any],
    chunk_size: Optional[int] = 16,
    n_action_steps: Optional[int] = 8,
    layout: Sequence[ActionSlot] = ACTION_LAYOUT,
) -> np.ndarray:
    """The (n_action_steps, 12) PandaOmron action chunk of a GR00T reply.

    Args:
        reply: action key -> (T, D) array; a (T, 1) key may arrive as (T,).
        chunk_size: the T every key must have (None: any T, the same for all keys).
        n_action_steps: how many of the T steps to execute (None: all).

    Raises:
        ActionFormatError: a key is missing, has the wrong shape or non-finite values.
    """
    if not isinstance(reply, Mapping):
        raise ActionFormatError(f"expected a dict of action arrays from get_action, got {type(reply).__name__}")
    arrays: Dict[str, np.ndarray] = {}
    for slot in layout:
        if slot.name not in reply:
            raise ActionFormatError(f"the server's reply has no '{slot.name}'; it has: {', '.join(sorted(map(str, reply)))}")
        dim = len(slot.columns)
        value = reply[slot.name]
        if np.ndim(value) == 1 and dim == 1:
            value = np.asarray(value)[:, None]  # a (T, 1) key may arrive as (T,)
        value = checked_chunk(value, dim, slot.name, chunk_size)
        arrays[slot.name] = value
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ActionFormatError(f"action keys disagree on the chunk length: {lengths}")
    steps = chunk_length(next(iter(lengths.values())), n_action_steps, " the server sent")
    actions = np.zeros((steps, layout_dim(layout)))
    for slot in layout:
        value = arrays[slot.name][:steps, list(slot.columns)]
        actions[:, list(slot.targets)] = binarize(value) if slot.binary else value
    return actions
