"""The ``gr00t`` policy: a client of a GR00T N1.5 inference server, and a seeding launcher for it.

GR00T N1.5 is served over ZeroMQ REQ/REP (default port 5555). A request is
``{"endpoint": name, "data": payload}`` (plus ``"api_token"`` when the server
wants one); the endpoints are ``ping``, ``kill``, ``get_action`` and
``get_modality_config``; a failed request comes back as ``{"error": str}``.
Payloads are msgpack with numpy arrays as ``{"__ndarray_class__": True,
"as_npy": <np.save bytes>}`` (servers before August 2025: ``torch.save`` of
the whole dict, choose ``serializer="torch"``).

Pairing. N1.5 takes no seed: its flow-matching head draws the initial noise
with ``torch.randn`` from the server process's GLOBAL generator, so a plain
server's actions depend on every request it served before. ``Gr00tLauncher``
wraps the model behind the same protocol and adds a ``reset`` endpoint that
seeds a generator kept per client session; before each ``get_action`` of a
session it installs that session's state as the global torch state (CPU and,
when present, every CUDA device) and stores it back afterwards, so the noise
is a function of the session's seed and its own call count only. The client
sends a session id (and a sequence number, so a retried ``get_action`` is
answered from a cache instead of drawing noise twice) with every request;
plain servers ignore both. Paired runs therefore need either one launcher
per worker or session-keyed requests through one launcher (what this client
does); a plain N1.5 server cannot be seeded and is recorded as
``"unseeded-server"``.

Observation and action mapping (RoboCasa's GR00T naming, PandaOmron):

- ``video.*``: (1, H, W, 3) uint8, top row first. The embedded backend's
  third-person ``robot0_robotview`` feeds both ``video.robot0_agentview_left``
  and ``video.robot0_agentview_right``; RoboCasa's cameras map to themselves.
- ``state.*``: (1, D) float64 from proprioception (``STATE_MAP``).
- ``annotation.human.task_description``: ``[instruction]``.
- actions (T, D) per key -> the 12-D PandaOmron action (``ACTION_LAYOUT``).

Run a seeding server: ``python -m robocasa_shift.policies.gr00t serve
--model-path ... --embodiment-tag ... --data-config ... --port 5555`` (needs
NVIDIA's ``gr00t`` package), check one: ``python -m
robocasa_shift.policies.gr00t ping --host ... --port ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import logging
import sys
import threading
import uuid
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from robocasa_shift.errors import ActionFormatError, PolicyServerError, PolicyServerTimeout
from robocasa_shift.policies.base import Observation, Policy
from robocasa_shift.seeding import rng_state_hash

log = logging.getLogger(__name__)

DEFAULT_PORT = 5555
UNSEEDED = "unseeded-server"
NOT_RESET = "not-reset"
LANGUAGE_KEY = "annotation.human.task_description"
ACTION_DIM = 12
# Harness camera name -> GR00T video keys. Cameras not listed map to "video.<name>".
DEFAULT_CAMERA_MAP: Dict[str, Tuple[str, ...]] = {
    # embedded backend: one third-person camera stands in for both agentview cameras
    "robot0_robotview": ("video.robot0_agentview_left", "video.robot0_agentview_right"),
    "robot0_eye_in_hand": ("video.robot0_eye_in_hand",),
    # RoboCasa: identity
    "robot0_agentview_left": ("video.robot0_agentview_left",),
    "robot0_agentview_right": ("video.robot0_agentview_right",),
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


@dataclass(frozen=True)


class ActionSlot:
    """Where the columns of one GR00T action key go in the 12-D PandaOmron action."""

    key: str
    dim: int
    targets: Tuple[int, ...]  # action index of each column
    binary: bool = False  # < 0.5 -> -1, else +1


# PandaOmron: arm position 0:3, arm axis-angle 3:6, torso 6, base velocity 7:10, gripper 10, mode 11.
ACTION_LAYOUT: Tuple[ActionSlot, ...] = (
    ActionSlot("action.end_effector_position", 3, (0, 1, 2)),
    ActionSlot("action.end_effector_rotation", 3, (3, 4, 5)),
    ActionSlot("action.base_motion", 4, (7, 8, 9, 6)),  # base x, y, yaw, then torso
    ActionSlot("action.gripper_close", 1, (10,), binary=True),
    ActionSlot("action.control_mode", 1, (11,), binary=True),  # -1 = arm mode
)


# =========================================================================== errors

# =========================================================================== serializers


NDARRAY_TAG = "__ndarray_class__"
MODALITY_CONFIG_TAG = "__ModalityConfig_class__"


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, obj, allow_pickle=False)
        return {NDARRAY_TAG: True, "as_npy": buf.getvalue()}
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj).__name__ == "ModalityConfig" and hasattr(obj, "model_dump_json"):
        return {MODALITY_CONFIG_TAG: True, "as_json": obj.model_dump_json()}
    if hasattr(obj, "detach") and hasattr(obj, "numpy"):  # a torch tensor
        return _encode(obj.detach().cpu().numpy())
    raise TypeError(f"cannot serialize {type(obj).__name__} for a GR00T server")


def _decode(obj: Dict[Any, Any]) -> Any:
    if NDARRAY_TAG in obj:
        return np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
    if MODALITY_CONFIG_TAG in obj:
        # a plain dict: the client need not import gr00t to read a modality config
        return json.loads(obj["as_json"]) if "as_json" in obj else dict(obj["as_dict"])
    return obj


def packb(obj: Any) -> bytes:
    """GR00T's msgpack encoding: numpy arrays as ``np.save`` bytes, ModalityConfig as JSON."""
    import msgpack

    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes) -> Any:
    """Inverse of ``packb``; ModalityConfig objects come back as plain dicts."""
    import msgpack

    return msgpack.unpackb(data, object_hook=_decode)


def torch_packb(obj: Any) -> bytes:
    """The pre-August-2025 GR00T encoding: ``torch.save`` of the whole object."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def torch_unpackb(data: bytes) -> Any:
    """Inverse of ``torch_packb``. It unpickles: use it only with a server you trust."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


@dataclass(frozen=True)


class Serializer:
    """One wire format: ``dumps`` and ``loads`` of a request or reply."""

    name: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]

    @staticmethod
    def named(name: Union[str, "Serializer"]) -> "Serializer":
        if isinstance(name, Serializer):
            return name
        if name not in SERIALIZERS:
            from robocasa_shift.errors import UnknownNameError

            raise UnknownNameError("GR00T serializer", name, sorted(SERIALIZERS))
        return SERIALIZERS[name]


SERIALIZERS: Dict[str, Serializer] = {
    "msgpack": Serializer("msgpack", packb, unpackb),
    "torch": Serializer("torch", torch_packb, torch_unpackb),
}


def _canonical(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return {"dtype": str(obj.dtype), "shape": list(obj.shape), "data": obj.tolist()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return {str(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_canonical(v) for v in obj]
    if isinstance(obj, bytes):
        return hashlib.sha256(obj).hexdigest()
    return obj


def content_hash(obj: Any) -> str:
    """sha256 of a canonical JSON form (sorted keys; arrays with dtype and shape)."""
    return hashlib.sha256(json.dumps(_canonical(obj), sort_keys=True).encode()).hexdigest()


# =========================================================================== client


class Gr00tClient:
    """A REQ client of a GR00T server with timeouts, socket recovery and bounded retries.

    A REQ socket that missed a reply can neither send nor receive again, so
    after a timeout the socket is closed (LINGER 0) and a new one connected
    before the next try. A retried ``get_action`` carries the same sequence
    number, which ``Gr00tLauncher`` answers from its cache.

    Args:
        host, port: where the server listens.
        timeout_s: per try, for sending and for the reply.
        retries: extra tries after a timeout (0: one try only).
        serializer: "msgpack" (current GR00T) or "torch" (before August 2025).
        api_token: sent with every request when the server requires one.
        session: the session id sent with every request (a random id by default).
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = DEFAULT_PORT,
        timeout_s: float = 15.0,
        retries: int = 2,
        serializer: Union[str, Serializer] = "msgpack",
        api_token: Optional[str] = None,
        session: Optional[str] = None,
    ):
        try:
            import msgpack  # noqa: F401
            import zmq
        except ImportError as exc:
            raise ImportError(f"the GR00T client needs pyzmq and msgpack ({exc}): pip install pyzmq msgpack") from None
        self._zmq = zmq
        self.host, self.port = str(host), int(port)
        self.timeout_s, self.retries = float(timeout_s), max(0, int(retries))
        self.serializer = Serializer.named(serializer)
        self.api_token = api_token
        # an identifier, not a source of randomness: it never reaches the model
        self.session = session or uuid.uuid4().hex
        self.sockets_created = 0
        self._seq = 0
        # the process-wide context: a private one would block in term() if it were garbage-collected
        # while a socket of it is still open
        self._context = zmq.Context.instance()
        self._socket = None
        self._connect()

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def _connect(self) -> None:
        zmq = self._zmq
        if self._socket is not None:
            self._socket.close(linger=0)
        sock = self._context.socket(zmq.REQ)
        timeout_ms = max(1, int(round(self.timeout_s * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.endpoint)
        self._socket = sock
        self.sockets_created += 1

    def call(self, endpoint: str, data: Any = None, requires_input: bool = True, **extra: Any) -> Any:
        """Send one request and return the decoded reply.

        Raises:
            PolicyServerTimeout: no reply after ``retries + 1`` tries.
            PolicyServerError: the server answered ``{"error": ...}`` or something undecodable.
        """
        request: Dict[str, Any] = {"endpoint": endpoint, "session": self.session, **extra}
        if requires_input:
            request["data"] = data
        if self.api_token:
            request["api_token"] = self.api_token
        message = self.serializer.dumps(request)
        tries = self.retries + 1
        for attempt in range(tries):
            try:
                self._socket.send(message)
                reply = self._socket.recv()
                break
            except self._zmq.Again:
                self._connect()
                if attempt + 1 < tries:
                    log.warning("no reply from %s to %r within %.3g s; retrying on a new socket", self.endpoint, endpoint, self.timeout_s)
        else:
            raise PolicyServerTimeout(
                f"no reply from the GR00T policy server at {self.endpoint} to '{endpoint}' within "
                f"{self.timeout_s:g} s ({tries} {'try' if tries == 1 else 'tries'}). Check that a server is running there "
                f"(`python -m robocasa_shift.policies.gr00t serve --port {self.port} ...` or GR00T's "
                f"scripts/inference_service.py --server), that host and port are reachable from this machine "
                f"(firewall, SSH tunnel), that both sides use the '{self.serializer.name}' serializer, and that "
                f"timeout_s covers the model's slowest call (the first one warms up).",
                endpoint=endpoint,
            )
        try:
            response = self.serializer.loads(reply)
        except Exception as exc:
            raise PolicyServerError(
                f"could not decode the reply of {self.endpoint} to '{endpoint}' with the '{self.serializer.name}' "
                f"serializer ({type(exc).__name__}: {exc}); does the server use another serializer?",
                endpoint=endpoint,
            ) from exc
        if isinstance(response, dict) and "error" in response:
            raise PolicyServerError(
                f"the GR00T policy server at {self.endpoint} failed '{endpoint}': {response['error']}",
                endpoint=endpoint,
                server_message=str(response["error"]),
            )
        return response

    def ping(self) -> bool:
        """True when the server answers ``ping``; False on a timeout."""
        try:
            self.call("ping", requires_input=False)
            return True
        except PolicyServerTimeout:
            return False

    def get_modality_config(self) -> Dict[str, Any]:
        return self.call("get_modality_config", requires_input=False)

    def get_action(self, observation: Mapping[str, Any]) -> Dict[str, Any]:
        self._seq += 1
        return self.call("get_action", dict(observation), seq=self._seq)

    def reset(self, seed: int) -> Dict[str, Any]:
        """Seed this session's generator on a ``Gr00tLauncher``; returns ``{"rng_fingerprint": ...}``."""
        return self.call("reset", {"seed": int(seed)})

    def kill_server(self) -> None:
        self.call("kill", requires_input=False)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None


# =========================================================================== mapping


def _as_camera_map(camera_map: Union[None, str, Mapping[str, Union[str, Sequence[str]]]]) -> Dict[str, Tuple[str, ...]]:
    if camera_map is None:
        return dict(DEFAULT_CAMERA_MAP)
    if isinstance(camera_map, str):  # JSON from a command line
        camera_map = json.loads(camera_map)
    return {str(k): ((v,) if isinstance(v, str) else tuple(v)) for k, v in camera_map.items()}


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
        image = np.asarray(image)
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"camera {camera!r}: expected a uint8 (H, W, 3) image, got {image.dtype} {image.shape}")
        for key in camera_map.get(camera, (f"video.{camera}",)):
            payload[key] = np.ascontiguousarray(image[None])
    for key, (proprio_key, dim) in state_map.items():
        if proprio_key not in obs.proprio:
            raise KeyError(f"{key} needs proprio '{proprio_key}', which the backend does not provide; "
                           f"it provides: {', '.join(sorted(obs.proprio))}")
        value = np.asarray(obs.proprio[proprio_key], dtype=np.float64).reshape(-1)
        if value.shape != (dim,):
            raise ValueError(f"{key}: proprio '{proprio_key}' has {value.size} values, expected {dim}")
        payload[key] = value[None]
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
        if slot.key not in reply:
            raise ActionFormatError(f"the server's reply has no '{slot.key}'; it has: {', '.join(sorted(map(str, reply)))}")
        value = np.asarray(reply[slot.key], dtype=np.float64)
        if value.ndim == 1 and slot.dim == 1:
            value = value[:, None]
        expected = f"({chunk_size if chunk_size is not None else 'T'}, {slot.dim})"
        if value.ndim != 2 or value.shape[1] != slot.dim or len(value) == 0:
            raise ActionFormatError(f"'{slot.key}' has shape {tuple(np.shape(reply[slot.key]))}, expected {expected}")
        if chunk_size is not None and len(value) != chunk_size:
            raise ActionFormatError(f"'{slot.key}' has {len(value)} steps, expected {expected}")
        if not np.all(np.isfinite(value)):
            raise ActionFormatError(f"'{slot.key}' has non-finite values")
        arrays[slot.key] = value
    lengths = {k: len(v) for k, v in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ActionFormatError(f"action keys disagree on the chunk length: {lengths}")
    steps = next(iter(lengths.values()))
    if n_action_steps is not None:
        if n_action_steps > steps:
            raise ActionFormatError(f"n_action_steps={n_action_steps} exceeds the server's chunk of {steps} steps")
        steps = n_action_steps
    actions = np.zeros((steps, ACTION_DIM))
    for slot in layout:
        value = arrays[slot.key][:steps]
        if slot.binary:
            value = np.where(value < 0.5, -1.0, 1.0)
        actions[:, list(slot.targets)] = value
    return actions


# =========================================================================== policy


class Gr00tPolicy(Policy):
    """GR00T N1.5 behind a ZeroMQ server; one observation per ``n_action_steps`` control steps.

    Args:
        host, port, timeout_s, retries, serializer, api_token: see ``Gr00tClient``.
        camera_map: harness camera -> GR00T video key(s); a dict (or its JSON). Default
            ``DEFAULT_CAMERA_MAP``; unlisted cameras map to ``video.<camera>``.
        chunk_size: the chunk length the server must return (None: any).
        n_action_steps: how many steps of each chunk run before the next observation.
        instruction: replaces the task's instruction.
        language_key: the payload key of the instruction.
        image_size: square render size (RoboCasa's gym wrapper serves 256).
        session: the session id (random by default; one per policy instance).
    """

    name = "gr00t"
    camera_roles = ("third_person", "wrist")
    image_size = 256
    deterministic = False

    _warned_unseeded = False

    def __init__(
        self,
        host: str = "localhost",
        port: int = DEFAULT_PORT,
        timeout_s: float = 15.0,
        retries: int = 2,
        serializer: str = "msgpack",
        api_token: Optional[str] = None,
        camera_map: Union[None, str, Mapping[str, Union[str, Sequence[str]]]] = None,
        chunk_size: Optional[int] = 16,
        n_action_steps: Optional[int] = 8,
        instruction: Optional[str] = None,
        language_key: str = LANGUAGE_KEY,
        image_size: int = 256,
        session: Optional[str] = None,
    ):
        self.client = Gr00tClient(host, port, timeout_s, retries, serializer, api_token, session)
        self.camera_map = _as_camera_map(camera_map)
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.n_action_steps = None if n_action_steps is None else int(n_action_steps)
        if self.chunk_size is not None and self.n_action_steps is not None and self.n_action_steps > self.chunk_size:
            raise ValueError(f"n_action_steps={self.n_action_steps} exceeds chunk_size={self.chunk_size}")
        self.instruction = instruction
        self.language_key = language_key
        self.image_size = int(image_size)
        self._fingerprint = NOT_RESET
        self._server_info: Optional[Dict[str, Any]] = None

    def reset(self, seed: int) -> None:
        try:
            reply = self.client.reset(seed)
        except PolicyServerError as exc:
            if not exc.unknown_endpoint:
                raise
            if not self._warned_unseeded:
                warnings.warn(
                    f"the GR00T server at {self.client.endpoint} has no 'reset' endpoint (a plain N1.5 server): "
                    "its noise comes from the server's global RNG, so paired rollouts cannot be guaranteed; "
                    "serve the model with `python -m robocasa_shift.policies.gr00t serve` to seed it per session",
                    RuntimeWarning,
                    stacklevel=2,
                )
                self._warned_unseeded = True
            self._fingerprint = UNSEEDED
            return
        fingerprint = reply.get("rng_fingerprint") if isinstance(reply, dict) else None
        if not isinstance(fingerprint, str):
            raise PolicyServerError(f"'reset' of {self.client.endpoint} returned no rng_fingerprint: {reply!r}", "reset")
        self._fingerprint = fingerprint

    def rng_fingerprint(self) -> str:
        return self._fingerprint

    def act(self, obs: Observation) -> np.ndarray:
        payload = observation_to_gr00t(obs, self.camera_map, STATE_MAP, self.instruction, self.language_key)
        return gr00t_to_actions(self.client.get_action(payload), self.chunk_size, self.n_action_steps)

    def server_info(self) -> Dict[str, Any]:
        """The server's modality config hash and its ``model`` field (asked once)."""
        if self._server_info is None:
            config = self.client.get_modality_config()
            model = config.get("model") if isinstance(config, dict) else None
            self._server_info = {"modality_config_sha256": content_hash(config), "model": _canonical(model)}
        return self._server_info

    def identity(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "endpoint": self.client.endpoint,
            "serializer": self.client.serializer.name,
            **self.server_info(),
            "camera_map": {k: list(v) for k, v in sorted(self.camera_map.items())},
            "chunk_size": self.chunk_size,
            "n_action_steps": self.n_action_steps,
            "instruction": self.instruction,
            "language_key": self.language_key,
            "image_size": self.image_size,
        }

    def close(self) -> None:
        self.client.close()


# =========================================================================== launcher (server side)


class _TorchSessionRNG:
    """A session's torch generator states (CPU, and every CUDA device when present)."""

    def __init__(self, torch, seed: int):
        self.torch = torch
        self.cpu = torch.Generator().manual_seed(int(seed) % 2**63)
        self.cuda: List[Any] = []
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                self.cuda.append(torch.Generator(device=f"cuda:{i}").manual_seed(int(seed) % 2**63).get_state())

    def fingerprint(self) -> str:
        return rng_state_hash(self.cpu.get_state().numpy(), *(s.numpy() for s in self.cuda))

    def run(self, fn: Callable[[], Any]) -> Any:
        """Call ``fn`` with this session's state as the global torch state; keep what it consumed."""
        torch = self.torch
        saved_cpu = torch.get_rng_state()
        saved_cuda = [torch.cuda.get_rng_state(i) for i in range(len(self.cuda))]
        torch.set_rng_state(self.cpu.get_state())
        for i, state in enumerate(self.cuda):
            torch.cuda.set_rng_state(state, i)
        try:
            return fn()
        finally:
            self.cpu.set_state(torch.get_rng_state())
            self.cuda = [torch.cuda.get_rng_state(i) for i in range(len(self.cuda))]
            torch.set_rng_state(saved_cpu)
            for i, state in enumerate(saved_cuda):
                torch.cuda.set_rng_state(state, i)


class _NumpySessionRNG:
    """Without torch: the session's state is swapped into numpy's global (legacy) generator."""

    def __init__(self, seed: int):
        self.state = np.random.RandomState(int(seed) % 2**32).get_state()

    def fingerprint(self) -> str:
        return rng_state_hash(self.state[1], repr(self.state[2:]))

    def run(self, fn: Callable[[], Any]) -> Any:
        saved = np.random.get_state()
        np.random.set_state(self.state)
        try:
            return fn()
        finally:
            self.state = np.random.get_state()
            np.random.set_state(saved)


@dataclass


class _Session:
    rng: Any
    last_seq: Optional[int] = None
    last_reply: Any = None


class Gr00tLauncher:
    """A ZeroMQ REP server for any model with ``get_action(obs)`` and ``get_modality_config()``.

    It speaks GR00T's protocol (``ping``, ``kill``, ``get_action``,
    ``get_modality_config``) and adds ``reset``: ``{"seed": int}`` with the
    request's ``session`` id seeds that session's generator and returns
    ``{"rng_fingerprint": sha256 of its state}``. A ``get_action`` with a
    session id runs with that session's generator as the global RNG (see the
    module docstring); one without a session id uses the global RNG as a
    plain server does. The server handles one request at a time.

    Args:
        model: the policy (e.g. ``gr00t.model.policy.Gr00tPolicy``).
        host, port: where to bind (port 0: a free port, read ``.port`` after ``start``).
        serializer: "msgpack" or "torch".
        api_token: when set, requests must carry it.
        model_info: added as ``"model"`` to ``get_modality_config`` replies, so clients record it.
        session_seeding: False serves without ``reset``, as a plain N1.5 server.
        max_sessions: sessions kept (least recently used are dropped).
    """

    def __init__(
        self,
        model: Any,
        host: str = "*",
        port: int = DEFAULT_PORT,
        serializer: Union[str, Serializer] = "msgpack",
        api_token: Optional[str] = None,
        model_info: Optional[Mapping[str, Any]] = None,
        session_seeding: bool = True,
        max_sessions: int = 4096,
    ):
        self.model = model
        self.host, self.port = host, int(port)
        self.serializer = Serializer.named(serializer)
        self.api_token = api_token
        self.model_info = dict(model_info) if model_info is not None else None
        self.max_sessions = int(max_sessions)
        self.sessions: "OrderedDict[str, _Session]" = OrderedDict()
        self.running = False
        self._bound = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._bind_error: Optional[BaseException] = None
        try:
            import torch

            self._torch = torch
        except ImportError:
            self._torch = None
        self.endpoints: Dict[str, Callable[[Dict[str, Any]], Any]] = {
            "ping": self._ping,
            "kill": self._kill,
            "get_action": self._get_action,
            "get_modality_config": self._get_modality_config,
        }
        if session_seeding:
            self.endpoints["reset"] = self._reset

    # ------------------------------------------------------------------ endpoints

    def _ping(self, request):
        return {"status": "ok", "message": "Server is running", "session_seeding": "reset" in self.endpoints}

    def _kill(self, request):
        self.running = False
        return {"status": "ok", "message": "Server is stopping"}

    def _get_modality_config(self, request):
        config = self.model.get_modality_config()
        if self.model_info is not None:
            config = {**config, "model": self.model_info}
        return config

    def _new_rng(self, seed: int):
        return _TorchSessionRNG(self._torch, seed) if self._torch is not None else _NumpySessionRNG(seed)

    def _reset(self, request):
        session = request.get("session")
        data = request.get("data") or {}
        if not session:
            raise ValueError("reset needs a session id in the request ('session')")
        if "seed" not in data:
            raise ValueError("reset needs {'seed': int} as data")
        self.sessions.pop(session, None)
        self.sessions[session] = _Session(self._new_rng(int(data["seed"])))
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        return {"rng_fingerprint": self.sessions[session].rng.fingerprint(), "session": session}

    def _get_action(self, request):
        obs = request.get("data", {})
        session_id = request.get("session")
        if session_id is None or "reset" not in self.endpoints:
            return self.model.get_action(obs)
        session = self.sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id!r} was never reset on this server (or was dropped, "
                             "or the server restarted); call reset(seed) first")
        self.sessions.move_to_end(session_id)
        seq = request.get("seq")
        if seq is not None and seq == session.last_seq:  # a retry of a request already served
            return session.last_reply
        reply = session.rng.run(lambda: self.model.get_action(obs))
        session.last_seq, session.last_reply = seq, reply
        return reply

    def fingerprint(self, session: str) -> str:
        """The current generator hash of a session (for checks)."""
        return self.sessions[session].rng.fingerprint()

    # ------------------------------------------------------------------ serving

    def handle(self, message: bytes) -> bytes:
        """One request's reply bytes; failures become ``{"error": str}``."""
        try:
            request = self.serializer.loads(message)
            if not isinstance(request, dict):
                raise ValueError(f"a request must be a dict, got {type(request).__name__}")
            if self.api_token is not None and request.get("api_token") != self.api_token:
                return self.serializer.dumps({"error": "Unauthorized: Invalid API token"})
            endpoint = request.get("endpoint", "get_action")
            if endpoint not in self.endpoints:
                raise ValueError(f"Unknown endpoint: {endpoint}")
            return self.serializer.dumps(self.endpoints[endpoint](request))
        except Exception as exc:
            log.exception("request failed")
            return self.serializer.dumps({"error": f"{type(exc).__name__}: {exc}"})

    def serve_forever(self, poll_ms: int = 100) -> None:
        """Bind and answer requests until ``kill`` or ``stop``."""
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            if self.port == 0:
                self.port = sock.bind_to_random_port(f"tcp://{self.host}")
            else:
                sock.bind(f"tcp://{self.host}:{self.port}")
        except Exception as exc:
            self._bind_error = exc
            self._bound.set()
            sock.close()
            context.term()
            raise
        self.running = True
        self._bound.set()
        log.info("GR00T launcher listening on tcp://%s:%d", self.host, self.port)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while self.running:
                if poller.poll(poll_ms):
                    sock.send(self.handle(sock.recv()))
        finally:
            self.running = False
            sock.close(linger=0)
            context.term()

    def start(self, timeout_s: float = 10.0) -> int:
        """Serve in a daemon thread; return the bound port."""
        self._bound.clear()
        self._thread = threading.Thread(target=self.serve_forever, name=f"gr00t-launcher-{self.port}", daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout_s):
            raise RuntimeError(f"the launcher did not bind tcp://{self.host}:{self.port} within {timeout_s:g} s")
        if self._bind_error is not None:
            raise RuntimeError(f"the launcher could not bind tcp://{self.host}:{self.port}: {self._bind_error}")
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        self.running = False
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


# =========================================================================== command line


def checkpoint_digest(path: Union[str, Path], small_bytes: int = 1 << 20) -> Optional[str]:
    """sha256 over a local checkpoint's file names and sizes and the content of its small files."""
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        size = file.stat().st_size
        h.update(f"{file.relative_to(root).as_posix()}\0{size}\0".encode())
        if size <= small_bytes:
            h.update(file.read_bytes())
    return h.hexdigest()


def build_gr00t_model(model_path: str, embodiment_tag: str, data_config: str, denoising_steps: int, device: Optional[str]):
    """NVIDIA's ``gr00t.model.policy.Gr00tPolicy``; exits with a clear message without ``gr00t``."""
    try:
        from gr00t.model.policy import Gr00tPolicy as Gr00tModelPolicy
    except ImportError as exc:
        sys.exit(
            f"serving a GR00T checkpoint needs NVIDIA's `gr00t` package, which is not importable here ({exc}). "
            "Install Isaac-GR00T (https://github.com/NVIDIA/Isaac-GR00T, `pip install -e .` in a checkout) "
            "in this environment, or wrap your model in robocasa_shift.policies.gr00t.Gr00tLauncher yourself."
        )
    try:
        from gr00t.experiment.data_config import DATA_CONFIG_MAP

        config = DATA_CONFIG_MAP[data_config]
    except ImportError:
        from gr00t.experiment.data_config import load_data_config

        config = load_data_config(data_config)
    options: Dict[str, Any] = {}
    if device:
        options["device"] = device
    return Gr00tModelPolicy(
        model_path=model_path,
        modality_config=config.modality_config(),
        modality_transform=config.transform(),
        embodiment_tag=embodiment_tag,
        denoising_steps=denoising_steps,
        **options,
    )


def _package_version(name: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: Optional[Iterable[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m robocasa_shift.policies.gr00t", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a GR00T checkpoint with per-session seeding")
    serve.add_argument("--model-path", required=True, help="checkpoint directory or Hugging Face id")
    serve.add_argument("--embodiment-tag", default="new_embodiment")
    serve.add_argument("--data-config", required=True, help="a GR00T data config name")
    serve.add_argument("--denoising-steps", type=int, default=4)
    serve.add_argument("--device", default=None)
    serve.add_argument("--host", default="*")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--serializer", default="msgpack", choices=sorted(SERIALIZERS))
    serve.add_argument("--api-token", default=None)
    serve.add_argument("--deterministic", action="store_true",
                       help="deterministic torch kernels (needed for bitwise-identical actions on GPU)")
    ping = sub.add_parser("ping", help="check that a server answers")
    ping.add_argument("--host", default="localhost")
    ping.add_argument("--port", type=int, default=DEFAULT_PORT)
    ping.add_argument("--timeout-s", type=float, default=5.0)
    ping.add_argument("--serializer", default="msgpack", choices=sorted(SERIALIZERS))
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.command == "ping":
        client = Gr00tClient(args.host, args.port, args.timeout_s, retries=0, serializer=args.serializer)
        try:
            print(json.dumps(_canonical(client.call("ping", requires_input=False))))
            config = client.get_modality_config()
            print(json.dumps({"modality_config_sha256": content_hash(config), "model": _canonical(config.get("model"))}))
        except PolicyServerError as exc:
            print(exc, file=sys.stderr)
            return 2
        finally:
            client.close()
        return 0

    logging.basicConfig(level=logging.INFO)
    model = build_gr00t_model(args.model_path, args.embodiment_tag, args.data_config, args.denoising_steps, args.device)
    if args.deterministic:
        import os

        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    model_info = {
        "model_path": args.model_path,
        "checkpoint_sha256": checkpoint_digest(args.model_path),
        "embodiment_tag": args.embodiment_tag,
        "data_config": args.data_config,
        "denoising_steps": args.denoising_steps,
        "gr00t_version": _package_version("gr00t"),
        "deterministic": bool(args.deterministic),
    }
    launcher = Gr00tLauncher(model, args.host, args.port, args.serializer, args.api_token, model_info)
    print(f"GR00T launcher serving {args.model_path} on tcp://{args.host}:{args.port} (serializer {args.serializer})",
          flush=True)
    launcher.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
