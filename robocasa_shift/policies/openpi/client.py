"""The ``openpi`` policy: a client of an openpi websocket policy server (pi0, pi0-FAST, pi0.5).

Protocol (``openpi/serving/websocket_policy_server.py``; client: ``openpi-client``
0.1.2 on PyPI). One websocket connection per client; frames are binary msgpack
with numpy arrays encoded by ``openpi_client.msgpack_numpy`` as
``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": shape}``.
On connect the server sends its metadata (a dict, e.g. the checkpoint's
``policy_metadata``); then each observation dict sent is answered with a dict
holding ``"actions"`` of shape (T, D) (plus ``server_timing``). A failure is
answered with a text frame (the server's traceback), after which the server
closes the connection. There is no reset, seed or health message over the
socket (``GET /healthz`` over HTTP only).

Observation mapping (LIBERO-style keys, as openpi's examples; all configurable):

- ``observation/image``: the third-person camera, uint8 (H, W, 3), top row
  first (the embedded backend's ``robot0_robotview``; RoboCasa's
  ``robot0_agentview_left``). ``observation/wrist_image``: ``robot0_eye_in_hand``.
  Cameras not in ``camera_map`` are sent as ``observation/<camera>``.
- ``observation/state``: float32, proprio concatenated in the order of
  RoboCasa's LeRobot datasets (``observation.state``, 16-D): base position (3),
  base quaternion (4), end effector position (3) and quaternion (4) relative
  to the base, gripper joints (2); quaternions x, y, z, w.
- ``prompt``: the task instruction.

Actions: ``"actions"`` (T, D) -> the 12-D PandaOmron action through a flat
layout (``model_io.ACTION_LAYOUTS``, shared with ``lerobot``). The default,
``robocasa-lerobot``, is the order of RoboCasa's LeRobot datasets and
LeRobot's RoboCasa env: base motion (4: x, y, yaw, torso), control mode (1),
end effector position (3), rotation (3), gripper (1); gripper and mode are
binarised at 0.5 as RoboCasa's gym wrapper does. The first ``n_action_steps`` of each chunk run before the next
observation (openpi's LIBERO example replans every 5 steps).

Pairing. openpi's server takes no seed: a JAX policy splits one key kept by
the server process (so actions depend on every request it served, from any
client), a PyTorch policy draws from torch's global RNG. Such a server is
recorded as ``"unseeded-server"`` with one warning. Optional convention for
servers that can do better (robocasa-shift's, not openpi's): metadata
``{"seeded_reset": true}`` advertises it; the client then sends
``{"__reset__": {"seed": int}}`` at the start of each rollout, the server seeds
a generator owned by that connection and answers ``{"rng_fingerprint": str}``
(a hash of the generator's state), which is recorded. A plain server is never
sent this message.

Branching and sampling. A server whose metadata also says ``"session_state":
true`` and ``"sample": true`` (this harness's serving shim, ``python -m
robocasa_shift.policies.openpi serve --policy-factory MODULE:FUNCTION``, module
``openpi.server``) answers ``{"__get_state__": {}}``, ``{"__set_state__":
{"blob": bytes}}`` and ``{"__sample__": {"obs": ..., "n": n, "seed": s}}``; the
policy then implements ``get_state`` / ``set_state`` / ``sample_actions``
(``served.policy``). Against a stock openpi server it refuses to be branched,
with the reason, and offers no samples.

Decoding replies. openpi-client's ``msgpack_numpy.unpackb`` builds an array
straight from the dtype, shape and bytes the server sent: an object dtype
turns 8 bytes into a raw pointer (reading it crashes the process), a short
buffer or a structured dtype fail in numpy. Replies and metadata are decoded
here instead (``unpackb``, in ``openpi.wire``, shared with the serving shim): plain numeric and bool dtypes only, the byte
count checked against the shape, the array copied out of the message; a
websocket message longer than ``max_message_bytes`` closes the connection.
The API key goes in a header and never into an error, a log or the identity;
an endpoint is recorded without any password or secret query parameter.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib.metadata import version
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import (
    ActionFormatError,
    PolicyServerError,
    PolicyServerTimeout,
    UnknownNameError,
)
from robocasa_shift.extras import require
from robocasa_shift.policies.model_io import (
    LIBERO_STATE,
    ROBOCASA_STATE,
    CameraMapLike,
    LayoutLike,
    StateLayoutLike,
    as_camera_map,
    as_state_layout,
    check_layout_fits,
    checked_image,
    flat_to_actions,
    layout_dim,
    layout_name,
    proprio_vector,
    resolve_layout,
)
from robocasa_shift.policies.served.connection import (
    as_secret,
    canonical,
    content_hash,
    redact_uri,
)
from robocasa_shift.policies.openpi.wire import (
    MAX_MESSAGE_BYTES,
    RESET_MESSAGE_KEY,
    SEEDED_RESET_KEY,
    ReplyFormatError,
    unpackb,
)
from robocasa_shift.policies.served.policy import StatefulRemotePolicy
from robocasa_shift.policies.served.transport import open_websocket
from robocasa_shift.policies.served.state import SAMPLE, SESSION_STATE

DEFAULT_PORT = 8000
# the shim's state and sample messages: {"__get_state__": {}}, {"__set_state__": {"blob": bytes}},
# {"__sample__": {"obs": dict, "n": int, "seed": int}}
STATE_MESSAGE_KEYS = {"get_state": "__get_state__", "set_state": "__set_state__", "sample": "__sample__"}

# Harness camera -> openpi observation key(s). Unlisted cameras map to "observation/<camera>".
DEFAULT_CAMERA_MAP: Dict[str, Tuple[str, ...]] = {
    "robot0_robotview": ("observation/image",),  # embedded backend
    "robot0_agentview_left": ("observation/image",),  # RoboCasa
    "robot0_eye_in_hand": ("observation/wrist_image",),
}
# What a checkpoint's training data looked like, by benchmark (``preset``); explicit options override a preset.
# ``libero`` follows openpi's examples/libero: agentview and wrist images rendered at 256 (its
# LIBERO_ENV_RESOLUTION), each rotated by 180 degrees from robosuite's bottom-up frame (which is the upright
# frame this harness renders, mirrored left-right) and resized with padding to 224 (openpi_client's
# image_tools); the 8-D state (end effector position, axis-angle, finger joints); 7-D actions, 5 of each chunk run.
PRESETS: Dict[str, Dict[str, Any]] = {
    "robocasa": {"camera_map": DEFAULT_CAMERA_MAP, "state_layout": ROBOCASA_STATE, "action_layout": "robocasa-lerobot",
                 "mirror_images": False, "image_size": 224, "model_image_size": None},
    "libero": {"camera_map": {"agentview": ("observation/image",), "robot0_eye_in_hand": ("observation/wrist_image",)},
               "state_layout": LIBERO_STATE, "action_layout": "libero", "mirror_images": True, "image_size": 256,
               "model_image_size": 224},
}


def observation_to_openpi(
    obs: Observation,
    camera_map: Mapping[str, Tuple[str, ...]] = DEFAULT_CAMERA_MAP,
    state_key: str = "observation/state",
    state_layout: Sequence[Tuple[str, int]] = ROBOCASA_STATE,
    prompt_key: str = "prompt",
    instruction: Optional[str] = None,
    mirror_images: bool = False,
    model_image_size: Optional[int] = None,
) -> Dict[str, Any]:
    """The observation dict sent to an openpi server (one frame, no batch dimension)."""
    payload: Dict[str, Any] = {}
    for camera, image in obs.images.items():
        for key in camera_map.get(camera, (f"observation/{camera}",)):
            if key in payload:
                raise ValueError(f"two cameras map to '{key}'; give camera_map one key per camera")
            image = checked_image(camera, image)
            if mirror_images:
                image = np.ascontiguousarray(image[:, ::-1])
            if model_image_size is not None:
                from openpi_client import image_tools

                image = image_tools.convert_to_uint8(image_tools.resize_with_pad(image, model_image_size,
                                                                                 model_image_size))
            payload[key] = image
    if state_key:
        payload[state_key] = proprio_vector(obs, state_layout)
    payload[prompt_key] = str(instruction if instruction is not None else obs.instruction)
    return payload


# =========================================================================== client


def _msgpack_numpy():
    return require("openpi_client.msgpack_numpy", "openpi", "the openpi client")


_CHECK = ("check that an openpi server is running there (openpi: `uv run scripts/serve_policy.py --port PORT "
          "policy:checkpoint --policy.config=... --policy.dir=...`), that host and port are right and reachable "
          "from this machine (firewall, SSH tunnel), and that the URI is ws:// (wss:// behind TLS)")


class OpenpiClient:
    """openpi's client, with timeouts on connect and on every reply, clear errors and reconnects.

    openpi-client 0.1.2 waits forever for a reply and turns every failure
    into a bare exception; a study needs a bounded wait and a message
    naming the server. After a timeout or a server error the connection
    is closed (a late reply would otherwise answer the next request);
    ``reconnect`` opens a new one and refuses a server whose metadata changed.
    Every message is decoded by ``wire.unpackb``, never by
    openpi-client's, and bounded by ``max_message_bytes``.
    """

    def __init__(self, host: str = "localhost", port: Optional[int] = DEFAULT_PORT, api_key: Any = None,
                 timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.max_message_bytes = int(max_message_bytes)
        # the key stays in a Secret, read only by _wait_for_server when it builds the header
        self._secret = as_secret(api_key)
        # openpi-client's address rule: a ws:// or wss:// host is a URI, else ws://host; then :port if given
        self._uri = str(host) if str(host).startswith("ws") else f"ws://{host}"
        if port is not None:
            self._uri += f":{int(port)}"
        self._packer = _msgpack_numpy().Packer()
        self._metadata_sha256: Optional[str] = None
        self._ws, self._server_metadata = self._wait_for_server()
        self._metadata_sha256 = content_hash(self._server_metadata)

    def get_server_metadata(self) -> Dict[str, Any]:
        """The metadata the server sent on connect."""
        return self._server_metadata

    @property
    def uri(self) -> str:
        """The server's address as errors and the identity show it (no password or secret parameter)."""
        return redact_uri(self._uri)

    @property
    def closed(self) -> bool:
        return self._ws is None

    @property
    def seeded(self) -> bool:
        return bool(isinstance(self._server_metadata, dict) and self._server_metadata.get(SEEDED_RESET_KEY))

    def _wait_for_server(self):
        from websockets.exceptions import ConnectionClosed

        headers = {"Authorization": f"Api-Key {self._secret.reveal()}"} if self._secret else None
        conn = open_websocket(self._uri, self.uri, "the openpi server", _CHECK, self.connect_timeout_s,
                              self.max_message_bytes, headers)
        try:
            first = conn.recv(timeout=self.connect_timeout_s)
        except (TimeoutError, ConnectionClosed) as exc:
            conn.close()
            raise PolicyServerTimeout(
                f"{self.uri} accepted a websocket connection but sent no metadata within "
                f"{self.connect_timeout_s:g} s ({type(exc).__name__}); an openpi policy server sends its "
                f"metadata first: {_CHECK}", "connect") from None
        try:
            metadata = unpackb(first, self.max_message_bytes) if isinstance(first, bytes) else first
        except ReplyFormatError as exc:
            conn.close()
            raise ReplyFormatError(f"{self.uri} sent metadata this client refuses: {exc}", "connect") from None
        if not isinstance(metadata, dict):
            conn.close()
            raise PolicyServerError(f"{self.uri} sent {type(metadata).__name__} instead of openpi's metadata "
                                    f"dict on connect: {str(metadata)[:200]!r}", "connect")
        return conn, metadata

    def reconnect(self) -> None:
        self._drop()
        self._ws, metadata = self._wait_for_server()
        if self._metadata_sha256 is not None and content_hash(metadata) != self._metadata_sha256:
            self._drop()
            raise PolicyServerError(f"the openpi server at {self.uri} now sends different metadata than at the "
                                    "first connection (another checkpoint?); the run's manifest would be wrong",
                                    "connect")
        self._server_metadata = metadata

    def _drop(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            finally:
                self._ws = None

    def _exchange(self, message: Dict[str, Any], what: str) -> Dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        if self._ws is None:
            raise PolicyServerError(f"the connection to the openpi server at {self.uri} was closed after an "
                                    "earlier error or timeout; the next reset reconnects", what)
        try:
            self._ws.send(self._packer.pack(message))
            reply = self._ws.recv(timeout=self.timeout_s)
        except TimeoutError:
            self._drop()
            raise PolicyServerTimeout(f"the openpi server at {self.uri} did not answer {what} within "
                                      f"{self.timeout_s:g} s (the first inference of a JAX server compiles "
                                      "the model: raise timeout_s); the connection was closed", what) from None
        except ConnectionClosed as exc:
            self._drop()
            too_big = getattr(getattr(exc, "rcvd", None), "code", None) == 1009 or \
                getattr(getattr(exc, "sent", None), "code", None) == 1009
            hint = (f"its reply exceeded max_message_bytes={self.max_message_bytes:,}" if too_big else _CHECK)
            raise PolicyServerError(f"the openpi server at {self.uri} closed the connection during {what} "
                                    f"({exc}); {hint}", what) from None
        if isinstance(reply, str):  # openpi sends the traceback as text, then closes
            self._drop()
            raise PolicyServerError(f"the openpi server at {self.uri} failed {what}:\n{reply}", what, reply)
        try:
            result = unpackb(reply, self.max_message_bytes)
        except ReplyFormatError as exc:
            self._drop()  # the stream can no longer be trusted to pair replies with requests
            raise ReplyFormatError(f"the openpi server at {self.uri} sent a reply to {what} this client "
                                   f"refuses: {exc}", what) from None
        if not isinstance(result, dict):
            raise PolicyServerError(f"{what}: expected a dict from {self.uri}, got {type(result).__name__}", what)
        return result

    def infer(self, obs: Dict) -> Dict:
        return self._exchange(obs, "infer")

    def reset_seed(self, seed: int, owner: Optional[str] = None) -> Dict[str, Any]:
        """Seed this connection's generator on a server that advertises ``seeded_reset``.

        ``owner``: the session's owner tag (``served.state.owner_tag``), which state blobs are bound to.
        """
        if not self.seeded:
            raise PolicyServerError(f"the openpi server at {self.uri} does not advertise '{SEEDED_RESET_KEY}' "
                                    "in its metadata; a plain openpi server cannot be seeded", "reset")
        data: Dict[str, Any] = {"seed": int(seed)}
        if owner is not None:
            data["owner"] = owner
        return self._exchange({RESET_MESSAGE_KEY: data}, "reset")

    def capabilities(self) -> Dict[str, Any]:
        """What the server's metadata advertises beyond openpi's protocol ({} for a stock server)."""
        metadata = self._server_metadata if isinstance(self._server_metadata, dict) else {}
        return {k: metadata.get(k) is True for k in (SEEDED_RESET_KEY, SESSION_STATE, SAMPLE)}

    def state_call(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        """A state or sample message (``get_state``, ``set_state``, ``sample``) of the serving shim."""
        if op not in STATE_MESSAGE_KEYS:
            raise ValueError(f"unknown state request {op!r}")
        return self._exchange({STATE_MESSAGE_KEYS[op]: data}, op)

    def close(self) -> None:
        self._drop()


def make_client(host: str = "localhost", port: Optional[int] = DEFAULT_PORT, api_key: Optional[str] = None,
                timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                max_message_bytes: int = MAX_MESSAGE_BYTES) -> OpenpiClient:
    """An ``OpenpiClient`` connected to an openpi server (see its docstring)."""
    return OpenpiClient(host, port, api_key, timeout_s, connect_timeout_s, max_message_bytes)


# =========================================================================== policy


class OpenpiPolicy(StatefulRemotePolicy):
    """An openpi policy server behind a websocket; one observation per ``n_action_steps`` control steps.

    Args:
        host, port: the server (``host`` may be a full ``ws://`` or ``wss://`` URI, then ``port=None``).
        preset: ``robocasa`` (RoboCasa's LeRobot layouts) or ``libero`` (openpi's LIBERO example: keys,
            mirrored images, 8-D state, 7-D actions); the options below override it.
        api_key: sent as ``Authorization: Api-Key ...`` when the server wants one (kept as a ``Secret``).
        timeout_s: for each reply; connect_timeout_s: for the handshake and the metadata.
        camera_map: harness camera -> openpi observation key(s); a dict or its JSON.
        state_key: where the proprio vector goes ("" sends none); state_layout: its
            (proprio key, dimension) list, a list or its JSON.
        prompt_key: where the instruction goes; instruction: replaces the task's.
        action_layout: a name in ``model_io.ACTION_LAYOUTS`` or a list of slots (see ``model_io.resolve_layout``).
        mirror_images: mirror every image left-right before sending it (see ``PRESETS``).
        model_image_size: resize each image with padding to this size before sending it (openpi's
            ``image_tools.resize_with_pad``); None sends the rendered size.
        actions_key: the reply key holding the (T, D) chunk.
        n_action_steps: steps of each chunk executed before the next observation (None: all).
        image_size: square render size (the preset's: 224, or LIBERO's 256 before resizing).
        max_message_bytes: longest message accepted from the server (the connection closes beyond it).
        mode: "chunk" (the first ``n_action_steps`` of each chunk at once) or "step" (one action per call
            from a client-side buffer of them, as openpi's ActionChunkBroker).
        state_secret: binds this client's session states (branching) to it on the serving shim (default:
            the API key, else none).
    """

    name = "openpi"
    camera_roles = ("third_person", "wrist")
    image_size = 224
    deterministic = False
    requires = (("openpi_client", "openpi"), ("websockets", "openpi"))
    state_hint = ("serve the policy with `python -m robocasa_shift.policies.openpi serve --policy-factory "
                  "MODULE:FUNCTION` to branch it")

    def __init__(
        self,
        host: str = "localhost",
        port: Optional[int] = DEFAULT_PORT,
        api_key: Optional[str] = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        camera_map: CameraMapLike = None,
        state_key: str = "observation/state",
        state_layout: StateLayoutLike = None,
        prompt_key: str = "prompt",
        instruction: Optional[str] = None,
        action_layout: Optional[LayoutLike] = None,
        actions_key: str = "actions",
        n_action_steps: Optional[int] = 5,
        image_size: Optional[int] = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        preset: str = "robocasa",
        mirror_images: Optional[bool] = None,
        model_image_size: Optional[int] = None,
        mode: str = "chunk",
        state_secret: Optional[str] = None,
    ):
        self.init_session_state(mode, state_secret, api_key)
        if preset not in PRESETS:
            raise UnknownNameError("openpi preset", preset, sorted(PRESETS))
        chosen = PRESETS[preset]
        self.preset = preset
        self.camera_map = as_camera_map(camera_map, chosen["camera_map"])
        self.state_key = state_key
        self.state_layout = as_state_layout(state_layout) if state_layout is not None else chosen["state_layout"]
        self.prompt_key, self.instruction = prompt_key, instruction
        self.layout = resolve_layout(action_layout if action_layout is not None else chosen["action_layout"])
        self.mirror_images = bool(chosen["mirror_images"] if mirror_images is None else mirror_images)
        self.model_image_size = chosen["model_image_size"] if model_image_size is None else int(model_image_size)
        self.actions_key = actions_key
        self.n_action_steps = None if n_action_steps is None else int(n_action_steps)
        self.image_size = int(chosen["image_size"] if image_size is None else image_size)
        self.client = make_client(host, port, api_key, timeout_s, connect_timeout_s, max_message_bytes)

    def reset(self, seed: int) -> None:
        """Seed this connection's generator on the server, or warn once that the server takes no seed."""
        self.clear_buffer()
        self.forget_server()
        if self.client.closed:
            self.client.reconnect()
        if not self.client.seeded:
            self.unseeded(
                f"the openpi server at {self.client.uri} takes no seed (no '{SEEDED_RESET_KEY}' in its metadata): "
                "its sampling noise depends on every request it served, so paired rollouts cannot be "
                "guaranteed on the policy side"
            )
            return
        self.seeded(self.client.reset_seed(seed, self._owner), self.client.uri)

    def payload(self, obs: Observation) -> Dict[str, Any]:
        return observation_to_openpi(obs, self.camera_map, self.state_key, self.state_layout, self.prompt_key,
                                     self.instruction, self.mirror_images, self.model_image_size)

    def actions_of(self, reply: Mapping[str, Any]) -> np.ndarray:
        if not isinstance(reply, Mapping) or self.actions_key not in reply:
            raise ActionFormatError(f"the server's reply has no '{self.actions_key}'; it has: "
                                    f"{', '.join(sorted(map(str, reply))) if isinstance(reply, Mapping) else reply!r:.80}")
        return flat_to_actions(reply[self.actions_key], self.layout, self.n_action_steps, self.actions_key)

    def act(self, obs: Observation) -> np.ndarray:
        check_layout_fits(self.layout, obs)
        return self.chunked(lambda: self.actions_of(self.client.infer(self.payload(obs))))

    # ------------------------------------------------------------------ session state (served.policy)

    def fetch_capabilities(self) -> Mapping[str, Any]:
        if self.client.closed:
            self.client.reconnect()
        return self.client.capabilities()

    def state_request(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        return self.client.state_call(op, data)

    def action_dim(self) -> int:
        return layout_dim(self.layout)

    def endpoint_name(self) -> str:
        return f"the openpi server at {self.client.uri}"

    def identity(self) -> Dict[str, Any]:
        server_metadata = self.client.get_server_metadata()
        return {
            "name": self.name,
            "endpoint": self.client.uri,
            "preset": self.preset,
            "mirror_images": self.mirror_images,
            "model_image_size": self.model_image_size,
            "server_metadata": canonical(server_metadata),
            "server_metadata_sha256": content_hash(server_metadata),
            "seeded_reset": self.client.seeded,
            "openpi_client_version": version("openpi-client"),
            "camera_map": {k: list(v) for k, v in sorted(self.camera_map.items())},
            "state_key": self.state_key,
            "state_layout": [list(s) for s in self.state_layout],
            "prompt_key": self.prompt_key,
            "instruction": self.instruction,
            "action_layout": layout_name(self.layout) or [asdict(s) for s in self.layout],
            "actions_key": self.actions_key,
            "n_action_steps": self.n_action_steps,
            "image_size": self.image_size,
            **({"mode": self.mode} if self.mode != "chunk" else {}),
        }

    def close(self) -> None:
        self.client.close()

