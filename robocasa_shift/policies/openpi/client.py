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

Transport. The connection is ``served.connection.Connection`` (deadlines, bounded decoding, reconnect at the
next reset, circuit breaker, redaction): openpi-client's ``msgpack_numpy.unpackb`` would build an array
straight from the dtype, shape and bytes the server sent (an object dtype turns 8 bytes into a raw pointer),
so replies and metadata are decoded with ``openpi.wire.decode_array`` instead (plain numeric and bool dtypes
only, the byte count checked, the array copied); requests are packed with openpi-client's ``pack_array``,
byte for byte as ``openpi_client`` sends them. The API key goes in an ``Authorization: Api-Key`` header.
"""

from __future__ import annotations

from dataclasses import asdict
from importlib.metadata import version
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import ActionFormatError, UnknownNameError
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
from robocasa_shift.policies.openpi.wire import (
    MAX_MESSAGE_BYTES,
    RESET_MESSAGE_KEY,
    SEEDED_RESET_KEY,
    decode_array,
)
from robocasa_shift.policies.served.connection import Connection, canonical, content_hash
from robocasa_shift.policies.served.policy import ServedPolicy

DEFAULT_PORT = 8000

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


_CHECK = ("check that an openpi server is running there (openpi: `uv run scripts/serve_policy.py --port PORT "
          "policy:checkpoint --policy.config=... --policy.dir=...`), that host and port are right and reachable "
          "from this machine (firewall, SSH tunnel), and that the URI is ws:// (wss:// behind TLS)")


class OpenpiClient(Connection):
    """A connection to an openpi server: openpi-client's address rule, ``Api-Key`` header and msgpack-numpy."""

    def __init__(self, host: str = "localhost", port: Optional[int] = DEFAULT_PORT, api_key: Any = None,
                 timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 max_message_bytes: int = MAX_MESSAGE_BYTES):
        # openpi-client's address rule: a ws:// or wss:// host is a URI, else ws://host; then :port if given
        uri = str(host) if str(host).startswith("ws") else f"ws://{host}"
        super().__init__(uri + (f":{int(port)}" if port is not None else ""), "the openpi server", _CHECK,
                         api_key=api_key, auth_scheme="Api-Key", timeout_s=timeout_s,
                         connect_timeout_s=connect_timeout_s, max_message_bytes=max_message_bytes,
                         encode=require("openpi_client.msgpack_numpy", "openpi", "the openpi client").pack_array,
                         object_hook=decode_array,
                         slow_hint=" (the first inference of a JAX server compiles the model: raise timeout_s)")

    def infer(self, obs: Dict[str, Any]) -> Dict[str, Any]:
        """openpi's one call: an observation dict in, the server's reply dict out."""
        return self.exchange(obs, "infer")


def make_client(host: str = "localhost", port: Optional[int] = DEFAULT_PORT, api_key: Optional[str] = None,
                timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                max_message_bytes: int = MAX_MESSAGE_BYTES) -> OpenpiClient:
    """An ``OpenpiClient`` connected to an openpi server (its metadata read)."""
    client = OpenpiClient(host, port, api_key, timeout_s, connect_timeout_s, max_message_bytes)
    client.connect()
    return client


# =========================================================================== policy


class OpenpiPolicy(ServedPolicy):
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
        self.open(OpenpiClient(host, port, api_key, timeout_s, connect_timeout_s, max_message_bytes), mode,
                  state_secret, api_key)

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
        return super().act(obs)

    def action_dim(self) -> int:
        return layout_dim(self.layout)

    def identity(self) -> Dict[str, Any]:
        server_metadata = self.client.metadata
        return {
            "name": self.name,
            "endpoint": self.client.uri,
            "preset": self.preset,
            "mirror_images": self.mirror_images,
            "model_image_size": self.model_image_size,
            "server_metadata": canonical(server_metadata),
            "server_metadata_sha256": content_hash(server_metadata),
            "seeded_reset": self.client.capabilities()[SEEDED_RESET_KEY],
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


__all__ = ["DEFAULT_CAMERA_MAP", "DEFAULT_PORT", "PRESETS", "RESET_MESSAGE_KEY", "SEEDED_RESET_KEY", "OpenpiClient",
           "OpenpiPolicy", "make_client", "observation_to_openpi"]
