"""The ``vla-eval`` policy: a client of a vla-eval model server (OpenVLA, OFT, pi0, GR00T, LeRobot's, ...).

vla-eval (``vla-eval`` 0.8.0 on PyPI, Apache-2.0) serves each of its models
behind one small protocol. This client is written from that protocol, read in
vla-eval 0.8.0's code (``vla_eval/protocol/``, ``connection.py``,
``model_servers/serve.py``, ``model_servers/predict.py``); it needs neither the
vla-eval package nor anything of it at run time.

Protocol (``PROTOCOL_VERSION = 1``). One websocket connection per client
(``ws://host:port``; ``GET /health`` on the same port answers 200 once the
model is loaded). Every frame is one binary msgpack message
``{"type", "payload", "seq", "timestamp"}``; ``type`` is ``hello``,
``observation``, ``action``, ``episode_start``, ``episode_end`` or ``error``.
numpy arrays travel as ``{"__ndarray__": True, "data", "dtype", "shape"}``
(bool, int, uint and float dtypes only) and HWC uint8 images (1, 3 or 4
channels) as ``{"__image__": True, "format": "png"|"jpeg", "data", "shape"}``
(vla-eval's default is PNG; with ``image_format="raw"`` they go as arrays).

- The client sends ``hello`` (``harness_version``, ``protocol_version``,
  ``benchmark``); the server answers ``hello`` with ``protocol_version``,
  ``model_server``, ``capabilities`` and, when it declares them,
  ``observation_params`` (what the benchmark must send, e.g.
  ``send_wrist_image``, ``send_state``, ``absolute_action``),
  ``action_spec`` and ``observation_spec``.
- Each rollout: ``episode_start`` (``{"task": {...}}``; no reply), then one
  ``observation`` per control step, each answered by one ``action`` with the
  same ``seq`` (``{"actions": (D,)}``); ``episode_end`` closes it. Chunking,
  ensembling and cross-session batching happen on the server, which answers
  every observation with one action: the harness renders the policy's cameras
  at every control step. A failure is answered by an ``error`` message
  (``{"error": "..."}``) and the connection stays open.
- No seed reaches a vla-eval server. A server is recorded as
  ``unseeded-server`` (one warning) unless its hello offers robocasa-shift's
  seeded-session extension, ``capabilities: {"seeded_reset": true}`` (the
  convention of the ``openpi`` client): the client then sends
  ``episode_start`` at ``reset`` with ``{"task": {}, "seed": S}``, the server
  seeds a generator owned by that session and answers with an
  ``episode_start`` message of the same ``seq`` carrying
  ``{"rng_fingerprint": str}``, which the record keeps. vla-eval's own
  servers never offer it.

Presets reproduce vla-eval's own benchmark code, what its model servers were
evaluated with:

- ``libero`` (``LIBEROBenchmark``): ``images.agentview`` and, with
  ``send_wrist_image``, ``images.wrist``: robosuite's frames flipped on both
  axes (this harness's upright frame mirrored left-right), rendered at 256
  px (``LIBERO_ENV_RESOLUTION``), not resized; ``task_description``; with
  ``send_state``, ``states``: float64 end effector position, its axis-angle
  (vla-eval's ``quat_to_axisangle``, float32, sign-normalised; robosuite's
  own with ``quat_no_antipodal``) and the two finger joints. Actions are 7-D
  (delta position, axis-angle, gripper), the gripper by sign (< 0 opens, else
  closes), as ``LIBEROBenchmark.step`` does. vla-eval also sends
  ``controller_states`` (the controller's pose, read by X-VLA only, which
  needs ``absolute_action`` as well): not sent here.
- ``robocasa365`` (``RoboCasa365Benchmark`` on RoboCasa's Panda-Omron gym
  wrapper): ``images`` with ``video.robot0_agentview_left``,
  ``video.robot0_agentview_right``, ``video.robot0_eye_in_hand`` (upright, 256
  px; the embedded backend's ``robot0_robotview`` feeds both agentviews);
  ``state`` with ``state.end_effector_position_relative``,
  ``state.end_effector_rotation_relative``, ``state.gripper_qpos``,
  ``state.base_position``, ``state.base_rotation`` (float32, quaternions x, y,
  z, w); ``task_description``. Actions are 12-D in the order of RoboCasa's
  ``env_utils.convert_action`` (end effector position 3, rotation 3, gripper
  1, base motion 4, control mode 1: layout ``robocasa-hdf5``, not the
  ``robocasa-lerobot`` order), gripper and mode binarised at 0.5 as the gym
  wrapper does.

``observation_params``: every key the server's hello declares is honoured
(its value is what this client does) or refused by name when the policy is
built, before anything runs (:data:`HONOURED`). A key the preset's vla-eval
benchmark would not take at all is dropped by vla-eval with a warning; here it
is refused unless the ``waive`` option names it, and a waived key is recorded
in the run's manifest.

Safety, as the other remote clients: every server message is decoded here
(plain numeric arrays only, their byte count checked against the shape,
copied out; no image, object or structured dtype), a message longer than
``max_message_bytes`` closes the connection, a reply must answer the request
just sent (its ``seq``), the API key travels in a header and never into an
error, a log or the identity, and the endpoint is recorded without passwords.
A failed request raises :class:`PolicyServerError` (records of kind
``policy_server``; five rollouts in a row stop a study, see ``study.runner``).
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import (
    ActionFormatError,
    PolicyOptionError,
    PolicyServerError,
    PolicyServerTimeout,
    UnknownNameError,
)
from robocasa_shift.policies.served.transport import health_url, http_ready
from robocasa_shift.policies.vla_eval.wire import (
    IMAGE_FORMATS,
    MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION,
    ReplyFormatError,
    pack_message,
    unpack_message,
)
from robocasa_shift.policies.model_io import (
    ROBOCASA_CAMERAS,
    CameraMapLike,
    as_camera_map,
    LayoutLike,
    check_layout_fits,
    checked_image,
    flat_to_actions,
    layout_dim,
    layout_name,
    proprio_part,
    resolve_layout,
)
from robocasa_shift.policies.served.connection import Connection, canonical, content_hash, redact_uri
from robocasa_shift.policies.served.policy import ServedPolicy
from robocasa_shift.policies.served.state import SAMPLE, SEEDED_RESET, SESSION_STATE

DEFAULT_PORT = 8000
# The libero backend settles every episode with 10 no-op steps before the first observation, as vla-eval's
# LIBEROBenchmark does with ``num_steps_wait=10`` (both: open gripper, no motion).
LIBERO_SETTLE_STEPS = 10
# Task name prefix of the libero backend -> vla-eval's LIBERO suite (``task["suite"]`` in episode_start).
LIBERO_SUITES = {"spatial": "libero_spatial", "object": "libero_object", "goal": "libero_goal", "long": "libero_10",
                 "90": "libero_90"}

# vla-eval's DimSpec constants the presets' benchmarks declare (vla_eval/specs.py), as the wire carries them.
_POSITION_DELTA = {"name": "position", "dims": 3, "format": "delta_xyz", "range": [-1, 1]}
_ROTATION_AA = {"name": "rotation", "dims": 3, "format": "axis_angle", "range": [-3.15, 3.15]}
_IMAGE = {"name": "image", "dims": 0, "format": "rgb_hwc_uint8"}
_LANGUAGE = {"name": "language", "dims": 0, "format": "language"}

RC365_VIDEO = ("video.robot0_agentview_left", "video.robot0_agentview_right", "video.robot0_eye_in_hand")
# (wire key, proprio key) in RoboCasa365Benchmark's STATE_KEYS order; the gym wrapper casts them to float32
RC365_STATE = (
    ("state.end_effector_position_relative", "robot0_base_to_eef_pos", 3),
    ("state.end_effector_rotation_relative", "robot0_base_to_eef_quat", 4),
    ("state.gripper_qpos", "robot0_gripper_qpos", 2),
    ("state.base_position", "robot0_base_pos", 3),
    ("state.base_rotation", "robot0_base_quat", 4),
)

# What each preset reproduces. ``params``: the constructor parameters of the vla-eval benchmark class (what
# vla-eval's orchestrator would forward from observation_params; anything else it drops with a warning).
PRESETS: Dict[str, Dict[str, Any]] = {
    "libero": {
        "benchmark": "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark",
        "camera_map": {"agentview": ("agentview",), "robot0_eye_in_hand": ("wrist",)},
        "action_layout": "libero",
        "gripper_by_sign": True,
        "image_size": 256,
        "params": ("suite", "seed", "num_steps_wait", "send_wrist_image", "send_state", "absolute_action",
                   "max_steps", "env_seed", "quat_no_antipodal"),
        "action_spec": {"position": _POSITION_DELTA, "rotation": _ROTATION_AA,
                        "gripper": {"name": "gripper", "dims": 1, "format": "binary_close_positive",
                                    "range": [-1, 1]}},
    },
    "robocasa365": {
        "benchmark": "vla_eval.benchmarks.robocasa365.benchmark:RoboCasa365Benchmark",
        "camera_map": {**{cam: tuple("video." + k for k in keys) for cam, keys in ROBOCASA_CAMERAS.items()}},
        "action_layout": "robocasa-hdf5",
        "gripper_by_sign": False,
        "image_size": 256,
        "params": ("tasks", "camera_size", "max_steps", "split", "seed", "success_check_interval"),
        "action_spec": {"position": _POSITION_DELTA, "rotation": _ROTATION_AA,
                        "gripper": {"name": "gripper", "dims": 1, "format": "binary_close_01", "range": [0, 1]},
                        "base_motion": {"name": "base_motion", "dims": 4, "format": "base_velocity3_torso1",
                                        "range": [-1, 1]},
                        "control_mode": {"name": "control_mode", "dims": 1, "format": "base_mode_01",
                                         "range": [0, 1]}},
    },
}

# How each observation_params key is honoured, per preset (the rest are refused, naming the key).
HONOURED = {
    "libero": {
        "send_wrist_image": "the wrist camera is sent as images.wrist (or not)",
        "send_state": "the 8-D state is sent as states (or not)",
        "quat_no_antipodal": "the state's axis-angle without (true) or with (false) vla-eval's sign normalisation",
        "absolute_action": "false only: the libero backend runs LIBERO's delta OSC_POSE controller",
        "num_steps_wait": f"{LIBERO_SETTLE_STEPS} only: the libero backend settles every episode with "
                          f"{LIBERO_SETTLE_STEPS} no-op steps",
    },
    "robocasa365": {
        "camera_size": "the render size of every camera",
        "send_wrist_image": "true only: RoboCasa365 always sends the wrist camera",
        "send_state": "true only: RoboCasa365 always sends the state",
    },
}



# =========================================================================== observation conventions


def quat_to_axisangle(quat: np.ndarray) -> np.ndarray:
    """vla-eval's ``rotation.quat_to_axisangle``: (x, y, z, w) -> axis-angle, sign-normalised (w >= 0), float32."""
    q = -quat if quat[3] < 0 else quat.copy()
    w = float(np.clip(q[3], -1.0, 1.0))
    sin_half = np.sqrt(1.0 - w * w)
    if sin_half < 1e-8:
        return np.zeros(3, dtype=np.float32)
    angle = 2.0 * np.arccos(w)
    return (q[:3] / sin_half * angle).astype(np.float32)


def quat_to_axisangle_robosuite(quat: np.ndarray) -> np.ndarray:
    """vla-eval's ``_quat_to_axisangle_robosuite`` (``quat_no_antipodal``): no sign normalisation, float32."""
    q = quat.copy()
    q[3] = min(max(q[3], -1.0), 1.0)
    den = np.sqrt(1.0 - q[3] * q[3])
    if math.isclose(den, 0.0):
        return np.zeros(3, dtype=np.float32)
    return (q[:3] * 2.0 * math.acos(q[3]) / den).astype(np.float32)


def libero_state(obs: Observation, no_antipodal: bool = False) -> np.ndarray:
    """``LIBEROBenchmark._proprio_state``: end effector position, its axis-angle, finger joints (float64, 8)."""
    to_aa = quat_to_axisangle_robosuite if no_antipodal else quat_to_axisangle
    quat = proprio_part(obs, "robot0_eef_quat", 4, "states")
    return np.concatenate([proprio_part(obs, "robot0_eef_pos", 3, "states"), to_aa(quat),
                           proprio_part(obs, "robot0_gripper_qpos", 2, "states")])


def libero_task_info(task: str, instruction: str) -> Dict[str, Any]:
    """What vla-eval's LIBERO runner sends in ``episode_start``: ``{"name": language, "suite", "task_id"}``."""
    suite, _, index = task.rpartition("-")
    base, _, variant = suite.partition("_")
    info: Dict[str, Any] = {"name": instruction}
    if base in LIBERO_SUITES and index.isdigit():
        info["suite"] = LIBERO_SUITES[base] + (f"_{variant}" if variant else "")
        info["task_id"] = int(index)
    return info


def _dims_compatible(producer: Mapping[str, Any], consumer: Mapping[str, Any]) -> Optional[str]:
    """vla-eval's ``DimSpec.is_compatible`` on the wire form: None, or why ``producer`` does not fit ``consumer``."""
    accepts = consumer.get("accepts")
    if accepts is not None:
        return None if producer.get("format") in accepts else f"{producer.get('format')} not in accepts {accepts}"
    if producer.get("format") != consumer.get("format"):
        return f"{producer.get('format')} vs {consumer.get('format')}"
    a, b = producer.get("dims"), consumer.get("dims")
    if isinstance(a, int) and isinstance(b, int) and a != b and a > 0 and b > 0:
        return f"{a}D vs {b}D"
    return None


def spec_warnings(server_action: Mapping[str, Any], bench_action: Mapping[str, Any],
                  server_obs: Mapping[str, Any], bench_obs: Mapping[str, Any]) -> List[str]:
    """vla-eval's ``check_specs``: the mismatches its orchestrator logs between a server and a benchmark."""
    out = []
    if server_action and bench_action and not (set(server_action) & set(bench_action)):
        out.append("action: no overlapping keys between server and benchmark specs")
    for key in bench_action:
        if key not in server_action and server_action:
            out.append(f"action [{key}]: benchmark expects it but server doesn't declare it")
    for key in sorted(set(server_action) & set(bench_action)):
        why = _dims_compatible(server_action[key], bench_action[key])
        if why:
            out.append(f"action [{key}]: {why}")
    for key in server_obs:
        if key not in bench_obs:
            out.append(f"observation [{key}]: server expects it but benchmark doesn't provide it")
    for key in sorted(set(server_obs) & set(bench_obs)):
        why = _dims_compatible(bench_obs[key], server_obs[key])
        if why:
            out.append(f"observation [{key}]: {why}")
    return out


def observation_payload(obs: Observation, preset: str, camera_map: Optional[Mapping[str, Tuple[str, ...]]] = None,
                        send_wrist_image: Optional[bool] = None, send_state: Optional[bool] = None,
                        quat_no_antipodal: bool = False, instruction: Optional[str] = None) -> Dict[str, Any]:
    """The observation message's payload, key for key as the preset's vla-eval benchmark's ``make_obs`` builds it.

    Args:
        obs: what the harness delivers (upright images, after any observation-side factor).
        preset: ``libero`` or ``robocasa365``.
        camera_map: harness camera -> wire image key(s) (the preset's by default).
        send_wrist_image, send_state: LIBERO's observation_params (vla-eval's defaults: false; RoboCasa365
            always sends both).
        quat_no_antipodal: LIBERO's state axis-angle without sign normalisation.
        instruction: replaces ``obs.instruction``.
    """
    if preset not in PRESETS:
        raise UnknownNameError("vla-eval preset", preset, sorted(PRESETS))
    camera_map = as_camera_map(camera_map, PRESETS[preset]["camera_map"])
    libero = preset == "libero"
    wrist = bool(send_wrist_image) if libero else True
    by_key: Dict[str, np.ndarray] = {}
    for camera, image in obs.images.items():
        for key in camera_map.get(camera, ()):
            if key in by_key:
                raise ValueError(f"two cameras map to '{key}'; give camera_map one camera per key")
            image = checked_image(camera, image)
            # LIBERO: robosuite's frame flipped on both axes = the harness's upright frame mirrored left-right
            by_key[key] = np.ascontiguousarray(image[:, ::-1]) if libero else image
    order = (["agentview"] + (["wrist"] if wrist else [])) if libero else list(RC365_VIDEO)
    missing = [k for k in order if k not in by_key]
    if missing:
        raise KeyError(f"vla-eval's {preset} observation needs images {', '.join(missing)}; camera_map "
                       f"{ {c: list(k) for c, k in camera_map.items()} } maps none of the cameras rendered "
                       f"({', '.join(obs.images)}) to them")
    images = {k: by_key[k] for k in order}  # the order matters: vla-eval's servers read the first as the main view
    text = str(instruction if instruction is not None else obs.instruction)
    if libero:
        payload: Dict[str, Any] = {"images": images, "task_description": text}
        if send_state:
            payload["states"] = libero_state(obs, quat_no_antipodal)
        return payload
    state = {key: proprio_part(obs, proprio, dim, key).astype(np.float32) for key, proprio, dim in RC365_STATE}
    return {"images": images, "state": state, "task_description": text}


def action_from_reply(reply: Mapping[str, Any], preset: str, layout: Optional[LayoutLike] = None) -> np.ndarray:
    """The (1, A) harness action of one ``action`` payload, read as the preset's vla-eval benchmark reads it.

    ``actions`` (else ``action``) must hold one action; LIBERO: 7-D, the gripper by sign
    (``LIBEROBenchmark.step``); RoboCasa365: 12-D in ``convert_action`` order, gripper and mode
    binarised at 0.5 (RoboCasa's gym wrapper).

    Raises:
        ActionFormatError: no actions, another shape (a chunk is named as one), non-finite values.
    """
    slots = resolve_layout(layout if layout is not None else PRESETS[preset]["action_layout"])
    raw = reply.get("actions", reply.get("action"))
    if raw is None:
        raise ActionFormatError(f"the server's action has no 'actions'; it has: {', '.join(map(str, reply)) or 'nothing'}")
    try:
        value = None if isinstance(raw, (str, bytes, dict)) else np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError):
        value = None
    width = 1 + max(c for s in slots for c in s.columns)
    if value is None or value.shape not in ((width,), (1, width)):
        chunk = value is not None and value.ndim == 2 and value.shape[1] == width
        hint = (" (a chunk: vla-eval's benchmarks take one action per observation; the server's chunk_size "
                "does the chunking)" if chunk else "")
        shape = value.shape if value is not None else type(raw).__name__
        raise ActionFormatError(f"the server's 'actions' has shape {shape}, expected ({width},) for vla-eval's "
                                f"{preset} benchmark{hint}")
    action = flat_to_actions(value.reshape(1, width), slots, None, "actions")
    if PRESETS[preset]["gripper_by_sign"]:  # LIBEROBenchmark.step: raw[-1] < 0 -> -1 (open), else +1 (close)
        action[:, -1] = np.where(value.reshape(-1)[-1] < 0, -1.0, 1.0)
    return action


# =========================================================================== client


_CHECK = ("check that a vla-eval model server is running there (vla-eval: `vla-eval serve --config "
          "configs/model_servers/...`, or the server script's `--address HOST:PORT`), that host and port are right "
          "and reachable from this machine (firewall, SSH tunnel; `curl http://HOST:PORT/health` answers 200 once "
          "the model is loaded), and that the URI is ws:// (wss:// behind TLS)")


def _as_uri(host: str, port: Optional[int]) -> str:
    if "://" in host:
        if port is not None:
            raise PolicyOptionError(f"host {redact_uri(host)!r} is a full URI: give it without port=")
        return host
    return f"ws://{host}:{int(port if port is not None else DEFAULT_PORT)}"


class VlaEvalClient(Connection):
    """A connection to a vla-eval model server: the client's hello first, then each request answered by the
    message of its ``seq`` (deadlines, bounded decoding, reconnects, breaker and redaction: ``Connection``).

    Args:
        uri: ``ws://host:port`` (or ``wss://``).
        hello: the client's hello payload.
        api_key: sent as ``Authorization: Bearer ...`` (a proxy in front of the server may want one).
        timeout_s: for each reply; connect_timeout_s: for the handshake and the hello.
        max_message_bytes: longest server message accepted (the connection closes beyond it).
        ready_timeout_s: poll ``GET /health`` this long before the first connection (0: do not).
    """

    greeting_changed = "now answers the hello differently"

    def __init__(self, uri: str, hello: Dict[str, Any], api_key: Any = None, timeout_s: float = 30.0,
                 connect_timeout_s: float = 10.0, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 ready_timeout_s: float = 0.0, image_format: str = "png"):
        # no keepalive pings, as vla-eval's own client: a server warming up a model may hold its GIL for long
        super().__init__(uri, "the vla-eval server", _CHECK, api_key=api_key, auth_scheme="Bearer",
                         timeout_s=timeout_s, connect_timeout_s=connect_timeout_s,
                         max_message_bytes=max_message_bytes, ping_interval=None,
                         slow_hint=" (a first inference may compile or load the model: raise timeout_s)")
        self.hello, self.image_format, self._seq = dict(hello), image_format, 0
        if ready_timeout_s > 0:
            self.wait_ready(ready_timeout_s)

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``GET /health`` until it answers 200 (the model is loaded); ``timeout_s`` in all.

        Raises:
            PolicyServerTimeout: no 200 in time, however slowly the server answers.
        """
        http_ready(health_url(self._uri.reveal(), "/health"), self.uri, timeout_s, self.what, self.hint)

    def capabilities(self) -> Dict[str, bool]:
        """``seeded_reset`` when the hello's ``capabilities`` offer it; vla-eval has no session state or samples."""
        offered = self.metadata.get("capabilities") if isinstance(self.metadata, dict) else None
        seeded = isinstance(offered, dict) and offered.get(SEEDED_RESET) is True
        return {SEEDED_RESET: seeded, SESSION_STATE: False, SAMPLE: False}

    def encode(self, message: Tuple[str, Dict[str, Any]]) -> bytes:
        kind, payload = message
        return pack_message(kind, payload, self._seq, image_format=self.image_format)

    def decode(self, data: bytes) -> Tuple[str, Dict[str, Any], int, float]:
        return unpack_message(data, self.max_message_bytes)

    def handshake(self) -> Dict[str, Any]:
        """The hellos: the client's, then the server's (``protocol_version`` checked), within ``connect_timeout_s``."""
        self._seq = 0
        seq = self.post("hello", self.hello)
        try:
            payload = self.answer(seq, "hello", "the hello", self.connect_timeout_s)
        except PolicyServerTimeout:
            raise PolicyServerTimeout(f"{self.uri} accepted a websocket connection but answered no hello within "
                                      f"{self.connect_timeout_s:g} s; a vla-eval model server answers the client's "
                                      f"hello: {self.hint}", "connect") from None
        version = payload.get("protocol_version")
        if version != PROTOCOL_VERSION:
            self.failed(PolicyServerError(f"{self.what} at {self.uri} speaks protocol version {version!r}; this client "
                                          f"speaks version {PROTOCOL_VERSION} (vla-eval 0.8.0)", "connect"))
        return payload

    def post(self, kind: str, payload: Dict[str, Any]) -> int:
        """Send one message; its ``seq``."""
        self._seq += 1
        self.send((kind, payload), kind)
        return self._seq

    def answer(self, seq: int, want: str, what: str, timeout_s: Optional[float] = None) -> Dict[str, Any]:
        """The payload of the ``want`` message answering request ``seq``.

        Raises:
            PolicyServerError: an ``error`` message (the server's text kept; the session goes on), or a message
                that answers another request (the connection is closed: the stream no longer pairs replies);
                and as :meth:`Connection.receive`.
        """
        kind, payload, reply_seq, _ = self.receive(what, timeout_s)
        if kind == "error":
            text = str(payload.get("error", payload))
            raise PolicyServerError(f"{self.what} at {self.uri} failed {what}: {text[:2000]}", what, text)
        if kind != want or reply_seq != seq:
            self.failed(PolicyServerError(f"{self.what} at {self.uri} answered {what} (seq {seq}) with a {kind} "
                                          f"message of seq {reply_seq}; replies no longer pair with requests, so the "
                                          "connection was closed (a server in continuous-inference mode is not "
                                          "supported)", what))
        return payload


# =========================================================================== policy


def _as_names(value: Union[None, str, Sequence[str]]) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = json.loads(value) if value.lstrip().startswith("[") else value.split(",")
    return tuple(sorted({str(v).strip() for v in value if str(v).strip()}))


class VlaEvalPolicy(ServedPolicy):
    """A vla-eval model server behind a websocket; one observation and one action per control step.

    Args:
        host, port: the server (``host`` may be a full ``ws://`` or ``wss://`` URI, then ``port=None``).
        preset: ``libero`` (vla-eval's LIBEROBenchmark) or ``robocasa365`` (its RoboCasa365Benchmark).
        waive: observation_params keys to drop as vla-eval would (a list or comma list); others are refused.
        api_key: sent as ``Authorization: Bearer ...`` (kept as a ``Secret``).
        timeout_s: for each reply; connect_timeout_s: for the handshake and the hello.
        ready_timeout_s: wait this long for ``GET /health`` to answer 200 before connecting (0: do not).
        camera_map: harness camera -> wire image key(s) (a dict or its JSON); the preset's by default.
        action_layout: a name in ``model_io.ACTION_LAYOUTS`` or slots; the preset's by default.
        instruction: replaces the task's instruction in ``task_description``.
        image_format: how images travel: ``png`` (vla-eval's default), ``jpeg`` (quality 95) or ``raw``.
        image_size: square render size (the preset's 256; a server's ``camera_size`` overrides it on robocasa365).
        max_message_bytes: longest message accepted from the server.
    """

    name = "vla-eval"
    camera_roles = ("third_person", "wrist")
    image_size = 256
    requires = (("websockets", "vlaeval"), ("msgpack", "vlaeval"))
    # One action per observation: the harness renders the policy's cameras at every control step (formal --dry-run
    # says so beside its ETA).
    actions_per_observation = 1

    @classmethod
    def fixed_action_dim(cls, options: Mapping[str, Any]) -> Optional[int]:
        """The length of the actions of the layout ``options`` choose (``action_layout``, else the preset's)."""
        preset = options.get("preset", "libero")
        if preset not in PRESETS:
            raise UnknownNameError("vla-eval preset", preset, sorted(PRESETS))
        layout = options.get("action_layout")
        return layout_dim(resolve_layout(layout if layout is not None else PRESETS[preset]["action_layout"]))

    def __init__(
        self,
        host: str = "localhost",
        port: Optional[int] = DEFAULT_PORT,
        preset: str = "libero",
        waive: Union[None, str, Sequence[str]] = None,
        api_key: Optional[str] = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 10.0,
        ready_timeout_s: float = 0.0,
        camera_map: CameraMapLike = None,
        action_layout: Optional[LayoutLike] = None,
        instruction: Optional[str] = None,
        image_format: str = "png",
        image_size: Optional[int] = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ):
        if preset not in PRESETS:
            raise UnknownNameError("vla-eval preset", preset, sorted(PRESETS))
        if image_format not in IMAGE_FORMATS:
            raise UnknownNameError("vla-eval image format", image_format, list(IMAGE_FORMATS))
        chosen = PRESETS[preset]
        self.preset, self.benchmark = preset, chosen["benchmark"]
        self.camera_map = as_camera_map(camera_map, chosen["camera_map"])
        self.layout = resolve_layout(action_layout if action_layout is not None else chosen["action_layout"])
        self.instruction, self.image_format = instruction, image_format
        self.image_size = int(chosen["image_size"] if image_size is None else image_size)
        self.waive = _as_names(waive)
        # what the preset sends before the server's observation_params say otherwise (vla-eval's defaults)
        self.send_wrist_image = preset == "robocasa365"
        self.send_state = preset == "robocasa365"
        self.quat_no_antipodal = False
        hello = {"harness_version": f"robocasa-shift {_own_version()}", "protocol_version": PROTOCOL_VERSION,
                 "benchmark": self.benchmark}
        self.open(VlaEvalClient(_as_uri(host, port), hello, api_key, timeout_s, connect_timeout_s, max_message_bytes,
                                ready_timeout_s, image_format), api_token=api_key)
        try:
            self.honoured, self.waived = self._apply_observation_params(image_size)
        except BaseException:
            self.client.close()
            raise
        self.camera_roles = ("third_person", "wrist") if self.send_wrist_image else ("third_person",)
        info = self.client.metadata
        self.spec_warnings = spec_warnings(_spec_dict(info.get("action_spec")), chosen["action_spec"],
                                           _spec_dict(info.get("observation_spec")), self._observation_spec())
        if self.spec_warnings:
            warnings.warn(f"the vla-eval server at {self.client.uri} and vla-eval's {preset} benchmark declare "
                          f"different conventions (vla-eval's orchestrator logs the same): "
                          f"{'; '.join(self.spec_warnings)}", RuntimeWarning, stacklevel=2)
        self._episode_open = False
        self._pending_start = False
        self._steps = 0

    # ------------------------------------------------------------------ observation_params

    def _apply_observation_params(self, image_size: Optional[int]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """Honour or refuse every key of the server's ``observation_params``; ``(honoured, waived)``.

        Raises:
            PolicyOptionError: a key this client cannot honour and ``waive`` does not name (all such keys listed).
        """
        params = self.client.metadata.get("observation_params") or {}
        if not isinstance(params, dict):
            raise PolicyServerError(f"the vla-eval server at {self.client.uri} sent observation_params that are not a "
                                    f"map: {str(params)[:200]}", "connect")
        honoured: Dict[str, Any] = {}
        waived: Dict[str, Any] = {}
        refused: List[str] = []
        known = PRESETS[self.preset]["params"]
        for key, value in params.items():
            why = self._honour(key, value, image_size)
            if why is None:
                honoured[key] = value
            elif key in self.waive:
                waived[key] = value
            else:
                taken = "takes" if key in known else "does not take (vla-eval would drop it with a warning)"
                refused.append(f"{key}={json.dumps(canonical(value))}: vla-eval's {self.preset} benchmark {taken} "
                               f"it; {why}")
        unused = sorted(set(self.waive) - set(params))
        if unused:
            refused.append(f"waive names {', '.join(unused)}, which the server's observation_params do not hold "
                           f"(it holds: {', '.join(sorted(params)) or 'none'})")
        if refused:
            raise PolicyOptionError(
                f"the vla-eval server at {self.client.uri} asks for observation_params this client cannot honour "
                f"with preset={self.preset}:\n  " + "\n  ".join(refused) +
                "\nRun a server configured for this benchmark, or, to drop a key as vla-eval's orchestrator drops "
                "what its benchmark does not take, name it in --policy-option waive=KEY[,KEY] (recorded in the "
                "manifest).")
        return honoured, waived

    def _honour(self, key: str, value: Any, image_size: Optional[int]) -> Optional[str]:
        """Apply ``key=value`` and return None, or say why it cannot be honoured."""
        flag = value if isinstance(value, bool) else None
        if self.preset == "libero":
            if key in ("send_wrist_image", "send_state", "quat_no_antipodal"):
                if flag is None:
                    return f"expected true or false, got {value!r}"
                setattr(self, key, flag)
                return None
            if key == "absolute_action":
                return None if flag is False else ("the libero backend runs LIBERO's delta OSC_POSE controller; "
                                                   "absolute (world-frame) actions are not supported")
            if key == "num_steps_wait":
                return None if value == LIBERO_SETTLE_STEPS and not isinstance(value, bool) else (
                    f"the libero backend settles every episode with {LIBERO_SETTLE_STEPS} no-op steps")
        else:
            if key == "camera_size":
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    return f"expected a positive integer, got {value!r}"
                if image_size is not None and int(image_size) != value:
                    return f"image_size={image_size} was given as an option"
                self.image_size = value
                return None
            if key in ("send_wrist_image", "send_state"):
                return None if flag is True else "RoboCasa365 always sends the wrist camera and the state"
        reasons = {
            "seed": "the study's seeds decide every episode (its base episodes and the policy seed), not a "
                    "benchmark seed",
            "env_seed": "the study's seeds decide every episode, not a benchmark seed",
            "max_steps": "every rollout runs to the task's official horizon",
            "suite": "--task chooses the tasks",
            "tasks": "--task chooses the tasks",
            "split": "--task and the backend choose the scenes",
            "success_check_interval": "the harness checks success after every control step",
        }
        return reasons.get(key, "this client does not implement it")

    def _observation_spec(self) -> Dict[str, Any]:
        """What vla-eval's benchmark declares it sends, for the spec comparison."""
        if self.preset == "libero":
            spec = {"agentview": _IMAGE, "language": _LANGUAGE}
            if self.send_wrist_image:
                spec["wrist"] = _IMAGE
            if self.send_state:
                spec["state"] = {"name": "state", "dims": 8, "format": "eef_pos3_axisangle3_gripper2"}
            return spec
        return {"image": _IMAGE, "state": {"name": "raw", "dims": 0, "format": "raw"}, "language": _LANGUAGE}

    # ------------------------------------------------------------------ episodes

    def reset(self, seed: int) -> None:
        """End the previous episode, then start a seeded one (seeded-session servers) or warn once that no seed
        reaches the server; a plain server's ``episode_start`` goes with the first observation, carrying the task."""
        self.forget_server()
        if self.client.closed:
            self.client.reconnect()
            self._episode_open = False
        self._end_episode()
        self._steps = 0
        if self.capabilities()[SEEDED_RESET]:
            seq = self.client.post("episode_start", {"task": {}, "seed": int(seed)})
            reply = self.client.answer(seq, "episode_start", "reset")
            self._episode_open, self._pending_start = True, False
            self.seeded(reply, self.client.uri)
            return
        self._pending_start = True
        self.unseeded(f"the vla-eval server at {self.client.uri} takes no seed (its hello offers no "
                      f"'{SEEDED_RESET}' capability): its sampling, if any, depends on every request it served, so "
                      "paired rollouts cannot be guaranteed on the policy side")

    def _end_episode(self) -> None:
        if self._episode_open and not self.client.closed:
            self.client.post("episode_end", {"steps": self._steps})
        self._episode_open = False

    def task_info(self, obs: Observation) -> Dict[str, Any]:
        """``episode_start``'s task, as vla-eval's runner sends it for the preset's benchmark."""
        if self.preset == "libero":
            return libero_task_info(obs.task, str(self.instruction if self.instruction is not None else obs.instruction))
        return {"name": obs.task}

    def payload(self, obs: Observation) -> Dict[str, Any]:
        """The observation message's payload (:func:`observation_payload` with this server's observation_params)."""
        return observation_payload(obs, self.preset, self.camera_map, self.send_wrist_image, self.send_state,
                                   self.quat_no_antipodal, self.instruction)

    def actions_of(self, reply: Mapping[str, Any]) -> np.ndarray:
        """The (1, A) action of one ``action`` payload (:func:`action_from_reply`)."""
        return action_from_reply(reply, self.preset, self.layout)

    def _send_observation(self, obs: Observation) -> int:
        check_layout_fits(self.layout, obs)
        payload = self.payload(obs)
        if self._pending_start:
            self.client.post("episode_start", {"task": self.task_info(obs)})
            self._pending_start, self._episode_open = False, True
        return self.client.post("observation", payload)

    def _receive_action(self, seq: int) -> np.ndarray:
        action = self.actions_of(self.client.answer(seq, "action", "observation"))
        self._steps += 1
        return action

    def act(self, obs: Observation) -> np.ndarray:
        return self._receive_action(self._send_observation(obs))

    @classmethod
    def act_batch(cls, policies: Sequence["VlaEvalPolicy"], observations: Sequence[Observation]) -> List[np.ndarray]:
        """Every observation sent first, then every action read: a server batching across sessions
        (``max_batch_size > 1``) serves the lockstep batch in one inference."""
        sent: List[Tuple["VlaEvalPolicy", int]] = []
        try:
            for policy, obs in zip(policies, observations):
                sent.append((policy, policy._send_observation(obs)))
            return [policy._receive_action(seq) for policy, seq in sent]
        except BaseException:
            for policy, _ in sent:  # unanswered requests would answer the next ones: drop their connections
                policy.client.close()
            raise

    def identity(self) -> Dict[str, Any]:
        info = self.client.metadata
        return {
            "name": self.name,
            "endpoint": self.client.uri,
            "protocol_version": PROTOCOL_VERSION,
            "preset": self.preset,
            "benchmark": self.benchmark,
            "model_server": info.get("model_server"),
            "server_harness_version": info.get("harness_version"),
            "server_hello": canonical(info),
            "server_hello_sha256": content_hash(info),
            "seeded_reset": self.capabilities()[SEEDED_RESET],
            "observation_params": canonical(info.get("observation_params") or {}),
            "honoured": canonical(self.honoured),
            "waived": canonical(self.waived),
            "spec_warnings": list(self.spec_warnings),
            "send_wrist_image": self.send_wrist_image,
            "send_state": self.send_state,
            "quat_no_antipodal": self.quat_no_antipodal,
            "camera_map": {k: list(v) for k, v in sorted(self.camera_map.items())},
            "action_layout": layout_name(self.layout) or [list(s.columns) for s in self.layout],
            "gripper_by_sign": bool(PRESETS[self.preset]["gripper_by_sign"]),
            "instruction": self.instruction,
            "image_format": self.image_format,
            "image_size": self.image_size,
            "actions_per_observation": self.actions_per_observation,
        }

    def action_dim(self) -> int:
        return layout_dim(self.layout)

    def close(self) -> None:
        try:
            self._end_episode()
        except Exception:  # a server already gone: nothing to end
            pass
        self.client.close()


def _spec_dict(value: Any) -> Dict[str, Any]:
    return {str(k): v for k, v in value.items() if isinstance(v, dict)} if isinstance(value, dict) else {}


def _own_version() -> str:
    from robocasa_shift import __version__

    return __version__


__all__ = ["HONOURED", "MESSAGE_TYPES", "PRESETS", "PROTOCOL_VERSION", "SEEDED_RESET", "ReplyFormatError",
           "VlaEvalClient", "VlaEvalPolicy", "action_from_reply", "encode_image", "libero_state", "libero_task_info",
           "observation_payload", "pack_message", "quat_to_axisangle", "spec_warnings", "unpack_message"]
