"""The ``openpi`` client: wire format, mapping, seeded and plain servers, errors, timeouts, a paired rollout.

A real websocket server runs on loopback, written as openpi's
``WebsocketPolicyServer`` is (``websockets.asyncio.server``, openpi-client's
``msgpack_numpy``, metadata on connect, a traceback text frame then a close on
failure), around a deterministic stand-in model that draws its noise from a
generator: a server-wide one for a plain server (as a JAX openpi server's
single key), one per connection after a seeded reset.
"""

import asyncio
import socket
import threading
import time
import traceback
import warnings

import msgpack
import numpy as np
import pytest
from helpers import paired_lift_rollouts

pytest.importorskip("openpi_client", reason="openpi-client is not installed: pip install -e '.[openpi]'")
import websockets  # noqa: E402
import websockets.asyncio.server  # noqa: E402
from openpi_client import msgpack_numpy  # noqa: E402

from robocasa_shift.core.policy import Observation  # noqa: E402
from robocasa_shift.errors import (  # noqa: E402
    ActionFormatError,
    PolicyServerError,
    PolicyServerTimeout,
)
from robocasa_shift.policies.openpi.client import (  # noqa: E402
    PRESETS,
    RESET_MESSAGE_KEY,
    SEEDED_RESET_KEY,
    OpenpiPolicy,
    observation_to_openpi,
)
from robocasa_shift.policies.model_io import (
    # noqa: E402,
    ACTION_LAYOUTS,
    flat_to_actions,
    resolve_layout,
)
from robocasa_shift.policies.served.policy import UNSEEDED
from robocasa_shift.seeding import rng_state_hash  # noqa: E402

HOST = "127.0.0.1"
CHUNK = 10
METADATA = {"name": "standin-pi0", "action_horizon": CHUNK, "reset_pose": np.zeros(3)}


def generator_fingerprint(rng):
    return rng_state_hash(rng.bit_generator.state)


def seed_fingerprint(seed):
    return generator_fingerprint(np.random.default_rng(seed))


def standin_infer(obs, rng):
    """A (CHUNK, 12) chunk in the robocasa-lerobot layout: up 5 cm, right by brightness, plus N(0, 1) noise."""
    if obs["prompt"] == "explode":
        raise RuntimeError("stand-in model failure")
    if obs["prompt"] == "bad shape":
        return {"actions": np.zeros((CHUNK, 7), np.float32)}
    if obs["observation/state"].shape == (8,):  # openpi's LIBERO example: 7-D actions, gripper -1/+1
        brightness = obs["observation/image"].mean() / 255.0
        actions = np.zeros((CHUNK, 7), np.float32)
        actions[:, :3] = np.clip([0.2 * brightness, 0.0, 0.25], -1, 1) + 0.1 * rng.standard_normal((CHUNK, 3))
        actions[:, 6] = np.where(rng.standard_normal(CHUNK) > 0, 1.0, -1.0)
        return {"actions": actions}
    assert obs["observation/state"].dtype == np.float32 and obs["observation/state"].shape == (16,)
    brightness = obs["observation/image"].mean() / 255.0
    noise = rng.standard_normal((CHUNK, 7))
    actions = np.zeros((CHUNK, 12), np.float32)
    actions[:, 5:8] = np.clip([0.2 * brightness, 0.0, 0.25], -1, 1) + 0.1 * noise[:, :3]
    actions[:, 8:11] = 0.05 * noise[:, 3:6]
    actions[:, 11] = noise[:, 6] > 0
    return {"actions": actions}


class StandInServer:
    """openpi's websocket protocol on loopback, in a thread with its own event loop.

    Args:
        seeded: advertise ``seeded_reset`` and answer ``__reset__`` messages.
        mode: "serve"; "silent" (metadata, then never answers); "mute" (never sends metadata).
    """

    def __init__(self, metadata=METADATA, seeded=True, mode="serve", port=0):
        self.metadata = {**metadata, SEEDED_RESET_KEY: True} if seeded else dict(metadata)
        self.seeded, self.mode, self.port = seeded, mode, port
        self.global_rng = np.random.default_rng(0)
        self.connections = 0
        self._ready = threading.Event()

    async def _handler(self, ws):
        self.connections += 1
        packer = msgpack_numpy.Packer()
        if self.mode == "mute":
            await self._stop.wait()
            return
        await ws.send(packer.pack(self.metadata))
        rng = None  # this connection's generator, after a seeded reset
        while True:
            try:
                obs = msgpack_numpy.unpackb(await ws.recv())
                if self.mode == "silent":
                    await self._stop.wait()
                    return
                if self.seeded and RESET_MESSAGE_KEY in obs:
                    rng = np.random.default_rng(int(obs[RESET_MESSAGE_KEY]["seed"]))
                    reply = {"rng_fingerprint": generator_fingerprint(rng)}
                else:
                    reply = standin_infer(obs, rng if rng is not None else self.global_rng)
                    reply["server_timing"] = {"infer_ms": 0.1}
                await ws.send(packer.pack(reply))
            except websockets.ConnectionClosed:
                break
            except Exception:
                await ws.send(traceback.format_exc())
                await ws.close(code=websockets.frames.CloseCode.INTERNAL_ERROR,
                               reason="Internal server error. Traceback included in previous frame.")
                return

    async def _main(self):
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with websockets.asyncio.server.serve(self._handler, HOST, self.port, compression=None,
                                                   max_size=None) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def start(self):
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the stand-in server did not start"
        return self

    def stop(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def server():
    s = StandInServer().start()
    yield s
    s.stop()


def policy_for(server, **options):
    return OpenpiPolicy(host=HOST, port=server.port, timeout_s=5.0, **options)


def make_obs(instruction="lift the red cube", step=0, size=8):
    rng = np.random.default_rng(3)
    images = {"robot0_robotview": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
              "robot0_eye_in_hand": rng.integers(0, 256, (size, size, 3), dtype=np.uint8)}
    proprio = {
        "robot0_base_to_eef_pos": np.array([0.45, -0.02, 0.31]),
        "robot0_base_to_eef_quat": np.array([1.0, 0.0, 0.0, 0.0]),
        "robot0_base_pos": np.array([-0.6, 0.0, 0.0]),
        "robot0_base_quat": np.array([0.0, 0.0, 0.0, 1.0]),
        "robot0_gripper_qpos": np.array([0.02, -0.02]),
        "robot0_eef_pos": np.zeros(3),
    }
    roles = {"robot0_robotview": "third_person", "robot0_eye_in_hand": "wrist"}
    return Observation(images, roles, proprio, instruction, step, task="Lift")


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- wire format


def test_msgpack_numpy_encodes_arrays_as_openpi_does_byte_for_byte():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    packed = msgpack_numpy.packb({"a": array})
    by_hand = msgpack.packb({"a": {b"__ndarray__": True, b"data": array.tobytes(), b"dtype": "<f4", b"shape": [2, 3]}})
    assert packed == by_hand
    raw = msgpack.unpackb(packed)["a"]
    assert raw[b"dtype"] == "<f4" and raw[b"shape"] == [2, 3] and raw[b"data"] == array.tobytes()
    back = msgpack_numpy.unpackb(packed)["a"]
    assert back.dtype == np.float32 and back.shape == (2, 3) and np.array_equal(back, array)
    # scalars (as in openpi's metadata) and the client's observation payload round-trip too
    assert msgpack_numpy.unpackb(msgpack_numpy.packb(np.float64(1.5))) == 1.5
    payload = observation_to_openpi(make_obs())
    decoded = msgpack_numpy.unpackb(msgpack_numpy.packb(payload))
    for key in ("observation/image", "observation/wrist_image", "observation/state"):
        assert decoded[key].dtype == payload[key].dtype and np.array_equal(decoded[key], payload[key])
    assert decoded["prompt"] == "lift the red cube"
    with pytest.raises(ValueError, match="Unsupported dtype"):
        msgpack_numpy.packb(np.array([object()]))


def test_the_client_sends_what_openpi_client_sends_byte_for_byte():
    """The client's requests go through the served base's Connection with openpi-client's pack_array: the bytes
    of an observation, a reset and a sample are openpi-client's own Packer's."""
    from robocasa_shift.policies.openpi.client import OpenpiClient

    client = OpenpiClient(HOST, free_port())  # not connected: encoding needs no server
    payload = observation_to_openpi(make_obs())
    for message in (payload, {RESET_MESSAGE_KEY: {"seed": 3, "owner": "a" * 64}},
                    {"__sample__": {"obs": payload, "n": 2, "seed": None}}, {"x": np.float64(1.5)}):
        assert client.encode(message) == msgpack_numpy.Packer().pack(message)


# --------------------------------------------------------------------------- mapping


def test_observation_mapping_uses_libero_style_keys_and_robocasa_state_order():
    obs = make_obs()
    payload = observation_to_openpi(obs)
    assert set(payload) == {"observation/image", "observation/wrist_image", "observation/state", "prompt"}
    assert np.array_equal(payload["observation/image"], obs.images["robot0_robotview"])
    assert np.array_equal(payload["observation/wrist_image"], obs.images["robot0_eye_in_hand"])
    state = payload["observation/state"]
    assert state.dtype == np.float32
    expected = [-0.6, 0, 0, 0, 0, 0, 1, 0.45, -0.02, 0.31, 1, 0, 0, 0, 0.02, -0.02]
    assert np.allclose(state, expected)
    # RoboCasa's cameras: the left agentview is the base image, others fall back to observation/<camera>
    third = obs.images["robot0_robotview"]
    robocasa = Observation({"robot0_agentview_left": third, "robot0_agentview_right": third},
                           {"robot0_agentview_left": "third_person", "robot0_agentview_right": "third_person"},
                           obs.proprio, "x", 0, task="OpenDrawer")
    assert sorted(k for k in observation_to_openpi(robocasa) if k.endswith("image") or "agentview" in k) == [
        "observation/image", "observation/robot0_agentview_right"]
    custom = observation_to_openpi(obs, {"robot0_robotview": ("base_0_rgb",), "robot0_eye_in_hand": ("wrist",)},
                                   state_key="state", state_layout=[("robot0_gripper_qpos", 2)],
                                   prompt_key="task", instruction="open the drawer")
    assert set(custom) == {"base_0_rgb", "wrist", "state", "task"} and custom["task"] == "open the drawer"
    with pytest.raises(ValueError, match="two cameras map to 'observation/image'"):
        observation_to_openpi(obs, {"robot0_robotview": ("observation/image",),
                                    "robot0_eye_in_hand": ("observation/image",)})
    del obs.proprio["robot0_base_quat"]
    with pytest.raises(KeyError, match="robot0_base_quat"):
        observation_to_openpi(obs)


def test_action_layouts_place_every_column():
    t = np.arange(CHUNK, dtype=float)[:, None]
    # robocasa-lerobot: base(4) mode(1) eef_pos(3) eef_rot(3) gripper(1)
    chunk = np.hstack([t + 700, t + 800, t + 900, t + 600, np.full_like(t, 0.49),
                       t, t + 100, t + 200, t + 300, t + 400, t + 500, np.where(t % 2 == 0, 0.2, 0.7)])
    actions = flat_to_actions(chunk, resolve_layout("robocasa-lerobot"), n_action_steps=5)
    assert actions.shape == (5, 12)
    assert actions[3, :10].tolist() == [3, 103, 203, 303, 403, 503, 603, 703, 803, 903]
    assert actions[:4, 10].tolist() == [-1.0, 1.0, -1.0, 1.0] and np.all(actions[:, 11] == -1.0)
    # robocasa-hdf5 (robocasa's convert_action order): eef_pos, eef_rot, gripper, base(4), mode
    hdf5 = chunk[:, [5, 6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4]]
    assert np.array_equal(flat_to_actions(hdf5, ACTION_LAYOUTS["robocasa-hdf5"]), flat_to_actions(chunk, ACTION_LAYOUTS["robocasa-lerobot"]))
    assert np.array_equal(flat_to_actions(chunk, ACTION_LAYOUTS["panda-omron"]), chunk)
    custom = resolve_layout('[{"name": "all", "columns": [11,10,9,8,7,6,5,4,3,2,1,0], '
                            '"targets": [0,1,2,3,4,5,6,7,8,9,10,11]}]')
    assert np.array_equal(flat_to_actions(chunk, custom), chunk[:, ::-1])
    with pytest.raises(ValueError, match="exactly once"):
        resolve_layout([{"name": "arm", "columns": [0, 1, 2, 3], "targets": [0, 1, 2, 3]}])  # no embodiment is 4-D
    with pytest.raises(KeyError, match="did you mean 'robocasa-hdf5'"):
        resolve_layout("robocasa-hdf")
    with pytest.raises(ActionFormatError, match=r"shape \(10, 7\), expected \(T, 12\)"):
        flat_to_actions(np.zeros((CHUNK, 7)), ACTION_LAYOUTS["robocasa-lerobot"])
    with pytest.raises(ActionFormatError, match="n_action_steps=11 exceeds the chunk of 10 steps"):
        flat_to_actions(chunk, ACTION_LAYOUTS["robocasa-lerobot"], 11)
    with pytest.raises(ActionFormatError, match="non-finite"):
        flat_to_actions(np.full((2, 12), np.nan), ACTION_LAYOUTS["robocasa-lerobot"])


def libero_obs(size=8):
    from robocasa_shift.embodiments.panda import LAYOUT

    rng = np.random.default_rng(5)
    images = {"agentview": rng.integers(0, 256, (size, size, 3), dtype=np.uint8),
              "robot0_eye_in_hand": rng.integers(0, 256, (size, size, 3), dtype=np.uint8)}
    proprio = {"robot0_eef_pos": np.array([-0.2, 0.0, 1.1]), "robot0_eef_axis_angle": np.array([3.1, 0.0, 0.1]),
               "robot0_gripper_qpos": np.array([0.039, -0.039]), "robot0_eef_quat": np.array([1.0, 0, 0, 0])}
    roles = {"agentview": "third_person", "robot0_eye_in_hand": "wrist"}
    return Observation(images, roles, proprio, "put the bowl on the plate", 0, task="spatial-0", action_layout=LAYOUT)


def test_the_libero_preset_sends_openpi_s_libero_observation_and_takes_7d_actions(server):
    from openpi_client import image_tools

    obs = libero_obs(size=256)  # the preset renders at LIBERO_ENV_RESOLUTION, as openpi's example does
    sent = {k: v for k, v in PRESETS["libero"].items() if k not in ("action_layout", "image_size")}
    payload = observation_to_openpi(obs, **sent)
    assert set(payload) == {"observation/image", "observation/wrist_image", "observation/state", "prompt"}
    # robosuite's frames rotated by 180 degrees, as openpi's example feeds them (the upright frame mirrored),
    # then resized with padding to 224
    for key, camera in (("observation/image", "agentview"), ("observation/wrist_image", "robot0_eye_in_hand")):
        want = image_tools.convert_to_uint8(image_tools.resize_with_pad(obs.images[camera][:, ::-1], 224, 224))
        assert payload[key].shape == (224, 224, 3) and np.array_equal(payload[key], want)
    assert not np.array_equal(payload["observation/image"],
                              image_tools.resize_with_pad(obs.images["agentview"], 224, 224))  # mirrored
    assert payload["observation/state"].dtype == np.float32
    assert payload["observation/state"].tolist() == pytest.approx([-0.2, 0.0, 1.1, 3.1, 0.0, 0.1, 0.039, -0.039])
    policy = policy_for(server, preset="libero")
    policy.reset(4)
    chunk = policy.act(obs)
    assert chunk.shape == (5, 7) and set(chunk[:, 6]) <= {-1.0, 1.0}
    assert policy.identity()["preset"] == "libero" and policy.identity()["action_layout"] == "libero"
    assert policy.image_size == 256 and policy.identity()["model_image_size"] == 224
    with pytest.raises(ActionFormatError, match="makes 12-D actions; this environment takes 7-D ones: use "
                                                "action_layout=libero"):
        policy_for(server, preset="libero", action_layout="robocasa-lerobot").act(obs)
    with pytest.raises(KeyError, match="openpi preset"):
        policy_for(server, preset="droid")
    policy.close()


# --------------------------------------------------------------------------- server


def test_identity_records_the_metadata_the_server_sent_on_connect(server):
    policy = policy_for(server)
    identity = policy.identity()
    assert identity["name"] == "openpi" and identity["endpoint"] == f"ws://{HOST}:{server.port}"
    assert identity["server_metadata"]["name"] == "standin-pi0"
    assert identity["server_metadata"]["reset_pose"]["data"] == [0.0, 0.0, 0.0]
    assert identity["seeded_reset"] is True and identity["openpi_client_version"] == "0.1.2"
    assert identity["action_layout"] == "robocasa-lerobot" and identity["n_action_steps"] == 5
    other = StandInServer(metadata={**METADATA, "name": "other"}).start()
    try:
        assert policy_for(other).identity()["server_metadata_sha256"] != identity["server_metadata_sha256"]
    finally:
        other.stop()
    policy.close()


def test_connections_with_one_seed_get_one_action_sequence(server):
    a, b = policy_for(server), policy_for(server)
    a.reset(7)
    b.reset(7)
    assert a.rng_fingerprint() == b.rng_fingerprint() == seed_fingerprint(7)
    obs = make_obs()
    first = [a.act(obs) for _ in range(3)]
    second = []
    for _ in range(3):  # interleaved with another connection's requests
        second.append(b.act(obs))
        a.act(obs)
    for x, y in zip(first, second):
        assert x.shape == (5, 12) and np.array_equal(x, y)
    assert not np.array_equal(first[0], first[1])  # the noise advances within a connection
    a.reset(8)
    assert a.rng_fingerprint() == seed_fingerprint(8) != seed_fingerprint(7)
    assert not np.array_equal(a.act(obs), first[0])
    a.reset(7)
    assert np.array_equal(a.act(obs), first[0])
    a.close()
    b.close()


def test_a_plain_server_is_recorded_as_unseeded_with_one_warning():
    plain = StandInServer(seeded=False).start()
    try:
        policy = policy_for(plain)
        with pytest.warns(RuntimeWarning, match="takes no seed"):
            policy.reset(3)
        assert policy.rng_fingerprint() == UNSEEDED and policy.identity()["seeded_reset"] is False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            policy.reset(4)
        assert not caught and policy.rng_fingerprint() == UNSEEDED
        one = policy.act(make_obs())
        policy.reset(3)
        assert not np.array_equal(policy.act(make_obs()), one)  # the server's one generator moved on
        with pytest.raises(PolicyServerError, match="does not advertise 'seeded_reset'"):
            policy.client.reset_seed(3)
        policy.close()
    finally:
        plain.stop()


def test_server_errors_carry_its_traceback_and_the_next_reset_reconnects(server):
    policy = policy_for(server, instruction="explode")
    policy.reset(1)
    with pytest.raises(PolicyServerError, match="stand-in model failure") as info:
        policy.act(make_obs())
    assert info.value.error_kind == "policy_server" and "Traceback" in info.value.server_message
    assert policy.client.closed
    with pytest.raises(PolicyServerError, match="was closed after an earlier error"):
        policy.act(make_obs())
    connections = server.connections
    policy.instruction = None
    policy.reset(1)
    assert server.connections == connections + 1 and policy.rng_fingerprint() == seed_fingerprint(1)
    assert policy.act(make_obs()).shape == (5, 12)
    bad = policy_for(server, instruction="bad shape")
    bad.reset(1)
    with pytest.raises(ActionFormatError, match=r"'actions' has shape \(10, 7\)") as info:
        bad.act(make_obs())
    assert info.value.error_kind == "policy_server"
    policy.close()
    bad.close()


def test_a_reconnect_to_a_server_with_other_metadata_is_refused():
    first = StandInServer().start()
    port = first.port
    policy = policy_for(first)
    policy.reset(1)
    first.stop()
    second = StandInServer(metadata={**METADATA, "name": "another-checkpoint"}, port=port).start()
    try:
        with pytest.raises(PolicyServerError):  # the old connection is gone
            policy.act(make_obs())
        with pytest.raises(PolicyServerError, match="different metadata"):
            policy.reset(1)
    finally:
        second.stop()


def test_connection_refused_names_the_server_and_what_to_check():
    port = free_port()
    with pytest.raises(PolicyServerError) as info:
        OpenpiPolicy(host=HOST, port=port, connect_timeout_s=2.0)
    message = str(info.value)
    assert f"cannot connect to the openpi server at ws://{HOST}:{port}" in message
    assert "ConnectionRefusedError" in message and "serve_policy.py" in message and "reachable" in message
    assert info.value.error_kind == "policy_server"


def test_a_silent_server_times_out_and_a_mute_one_is_not_taken_for_openpi():
    silent = StandInServer(mode="silent").start()
    mute = StandInServer(mode="mute").start()
    try:
        policy = OpenpiPolicy(host=HOST, port=silent.port, timeout_s=0.3)
        t0 = time.perf_counter()
        with pytest.raises(PolicyServerTimeout, match=f"ws://{HOST}:{silent.port} did not answer reset within 0.3 s"):
            policy.reset(1)
        assert 0.25 <= time.perf_counter() - t0 < 2.0
        assert policy.client.closed
        t0 = time.perf_counter()
        with pytest.raises(PolicyServerTimeout, match="sent no metadata within 0.3 s"):
            OpenpiPolicy(host=HOST, port=mute.port, connect_timeout_s=0.3)
        assert time.perf_counter() - t0 < 2.0
    finally:
        silent.stop()
        mute.stop()


# --------------------------------------------------------------------------- paired rollout


@pytest.mark.sim
def test_paired_rollouts_through_the_openpi_client(server, lift_env, protocol):
    policy = policy_for(server)
    runs = paired_lift_rollouts(lift_env, policy, protocol, horizon=20)
    clean = runs["clean"][0]
    assert clean.steps == 20 and clean.policy_calls == 4  # 5 of each 10-step chunk run
    assert clean.policy_rng_fingerprint == seed_fingerprint(clean.policy_seed)
    policy.close()