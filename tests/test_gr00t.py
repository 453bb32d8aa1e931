"""The ``gr00t`` client and launcher: wire format, per-session seeding, errors, timeouts, a paired rollout.

A real ZeroMQ server runs on loopback around a deterministic stand-in for
GR00T N1.5 that, like the real flow-matching head, draws its noise with
``torch.randn`` from the global RNG.
"""

import io
import json
import threading
import time
import warnings

import msgpack
import numpy as np
import pytest
import torch
import zmq
from helpers import paired_lift_rollouts

from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import (
    ActionFormatError,
    PolicyOptionError,
    PolicyServerError,
    PolicyServerTimeout,
)
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.mapping import (
    LANGUAGE_KEY,
    gr00t_to_actions,
    observation_to_gr00t,
)
from robocasa_shift.policies.gr00t.policy import Gr00tPolicy
from robocasa_shift.policies.gr00t.wire import (
    PickleSerializerWarning,
    packb,
    torch_packb,
    torch_unpackb,
    unpackb,
)
from robocasa_shift.policies.served.connection import content_hash
from robocasa_shift.policies.served.policy import UNSEEDED
from robocasa_shift.seeding import rng_state_hash

HOST = "127.0.0.1"
CHUNK = 16
MODEL_INFO = {"name": "standin-n15", "version": 1}


class ModalityConfig:
    """Mimics gr00t.data.dataset.ModalityConfig (a pydantic model) for the encoder."""

    def __init__(self, delta_indices, modality_keys):
        self.delta_indices, self.modality_keys = delta_indices, modality_keys

    def model_dump_json(self):
        return json.dumps({"delta_indices": self.delta_indices, "modality_keys": self.modality_keys})


class StandInModel:
    """Deterministic given the global torch RNG: a move 5 cm up from the state, plus N(0, 1) noise."""

    def get_modality_config(self):
        return {
            "video": ModalityConfig([0], ["video.robot0_agentview_left", "video.robot0_agentview_right",
                                          "video.robot0_eye_in_hand"]),
            "action": ModalityConfig(list(range(CHUNK)), ["action.end_effector_position", "action.gripper_close"]),
        }

    def get_action(self, obs):
        instruction = obs[LANGUAGE_KEY][0]
        if instruction == "explode":
            raise RuntimeError("stand-in model failure")
        assert obs["state.end_effector_position_relative"].shape == (1, 3)  # the state reaches the model
        brightness = obs["video.robot0_agentview_left"].mean() / 255.0
        noise = torch.randn(CHUNK, 7).numpy()  # the global RNG, as N1.5's flow-matching head
        pos = np.clip(5.0 * np.array([0.0, 0.0, 0.05]) + [0.2 * brightness, 0.0, 0.0], -1, 1) + 0.1 * noise[:, :3]
        action = {
            "action.end_effector_position": pos.astype(np.float32),
            "action.end_effector_rotation": (0.05 * noise[:, 3:6]).astype(np.float32),
            "action.gripper_close": (noise[:, 6] > 0).astype(np.float32),  # squeezed (T,)
            "action.base_motion": np.zeros((CHUNK, 4), np.float32),
            "action.control_mode": np.zeros((CHUNK, 1), np.float32),
        }
        if instruction == "bad shape":
            action["action.end_effector_position"] = pos[:, :2]
        return action


def start_launcher(port=0, **options):
    launcher = Gr00tLauncher(StandInModel(), HOST, port, model_info=MODEL_INFO, **options)
    launcher.start()
    return launcher


@pytest.fixture(scope="module")
def server():
    launcher = start_launcher()
    yield launcher
    launcher.stop()


def policy_for(launcher, **options):
    return Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0, **options)


def make_obs(instruction="lift the red cube", step=0):
    rng = np.random.default_rng(3)
    images = {"robot0_robotview": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
              "robot0_eye_in_hand": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)}
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


def torch_fingerprint(seed):
    return rng_state_hash(torch.Generator().manual_seed(seed).get_state().numpy())


# --------------------------------------------------------------------------- serializer


def test_packb_encodes_arrays_and_modality_configs_in_the_documented_format():
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    raw = msgpack.unpackb(packb({"a": array, "m": ModalityConfig([0, 1], ["video.x"])}))
    assert set(raw["a"]) == {"__ndarray_class__", "as_npy"}
    assert raw["a"]["__ndarray_class__"] is True
    expected = io.BytesIO()
    np.save(expected, array, allow_pickle=False)
    assert raw["a"]["as_npy"] == expected.getvalue()
    loaded = np.load(io.BytesIO(raw["a"]["as_npy"]), allow_pickle=False)
    assert loaded.dtype == np.float32 and np.array_equal(loaded, array)
    assert raw["m"]["__ModalityConfig_class__"] is True
    assert json.loads(raw["m"]["as_json"]) == {"delta_indices": [0, 1], "modality_keys": ["video.x"]}
    # and the other way: bytes built by hand in the documented format decode to plain values
    by_hand = msgpack.packb({"x": {"__ndarray_class__": True, "as_npy": expected.getvalue()},
                             "m": {"__ModalityConfig_class__": True, "as_dict": {"delta_indices": [2]}}})
    decoded = unpackb(by_hand)
    assert np.array_equal(decoded["x"], array) and decoded["m"] == {"delta_indices": [2]}


def test_msgpack_round_trip_keeps_dtypes_shapes_and_values():
    rng = np.random.default_rng(0)
    payload = {
        "video.cam": rng.integers(0, 256, (1, 4, 5, 3), dtype=np.uint8),
        "state.x": rng.normal(size=(1, 3)),
        "nested": {"f32": rng.normal(size=16).astype(np.float32), "i64": np.array(7, dtype=np.int64),
                   "mask": np.array([True, False]), "empty": np.zeros((0, 3))},
        LANGUAGE_KEY: ["lift the red cube"],
        "n": 3,
        "blob": b"\x00\x01",
    }
    back = unpackb(packb(payload))
    assert back[LANGUAGE_KEY] == ["lift the red cube"] and back["n"] == 3 and back["blob"] == b"\x00\x01"
    for got, want in [(back["video.cam"], payload["video.cam"]), (back["state.x"], payload["state.x"])] + [
        (back["nested"][k], v) for k, v in payload["nested"].items()
    ]:
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


class LegacyTorchServer:
    """A pre-August-2025 GR00T server on loopback: whole messages through torch.save / torch.load, no ``reset``.

    The harness's launcher no longer speaks this format (it would unpickle requests), so the
    client's opt-in torch serializer is tested against this stand-in.
    """

    def __init__(self):
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.REP)
        self.port = self.sock.bind_to_random_port(f"tcp://{HOST}")
        self.model = StandInModel()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            message = self.sock.recv()
            try:
                request = torch_unpackb(message)  # trusted: the test's own client sent it
                endpoint = request.get("endpoint", "get_action")
                if endpoint == "ping":
                    reply = {"status": "ok"}
                elif endpoint == "get_modality_config":
                    reply = {"action": {"delta_indices": list(range(CHUNK))}, "model": MODEL_INFO}
                elif endpoint == "get_action":
                    reply = self.model.get_action(request["data"])
                else:
                    reply = {"error": f"Unknown endpoint: {endpoint}"}
            except Exception as exc:
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            self.sock.send(torch_packb(reply))

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.context.term()


def test_the_torch_serializer_needs_an_explicit_opt_in_warns_and_talks_to_an_old_server():
    payload = {"state.x": np.arange(4.0)[None], LANGUAGE_KEY: ["go"], "nested": {"t": np.uint8(3)}}
    back = torch_unpackb(torch_packb(payload))
    assert np.array_equal(back["state.x"], payload["state.x"]) and back[LANGUAGE_KEY] == ["go"]
    old = LegacyTorchServer()
    try:
        with pytest.raises(PolicyOptionError, match="allow_pickle=true"):
            Gr00tPolicy(host=HOST, port=old.port, serializer="torch")
        with pytest.warns(PickleSerializerWarning, match="unpickled"):
            policy = Gr00tPolicy(host=HOST, port=old.port, timeout_s=5.0, serializer="torch", allow_pickle=True)
        with pytest.warns(RuntimeWarning, match="no 'reset' endpoint"):
            policy.reset(4)
        assert policy.rng_fingerprint() == UNSEEDED
        assert policy.act(make_obs()).shape == (8, 12)
        assert policy.identity()["serializer"] == "torch" and policy.identity()["model"] == MODEL_INFO
        mismatched = Gr00tClient(HOST, old.port, timeout_s=2.0, retries=0, serializer="msgpack")
        with pytest.raises(PolicyServerError, match="serializer"):
            mismatched.get_modality_config()
        policy.close()
        mismatched.close()
    finally:
        old.stop()


# --------------------------------------------------------------------------- mapping


def test_observation_mapping_feeds_gr00t_keys():
    obs = make_obs()
    payload = observation_to_gr00t(obs)
    third = obs.images["robot0_robotview"]
    for key in ("video.robot0_agentview_left", "video.robot0_agentview_right"):
        assert payload[key].shape == (1, 8, 8, 3) and payload[key].dtype == np.uint8
        assert np.array_equal(payload[key][0], third)
    assert np.array_equal(payload["video.robot0_eye_in_hand"][0], obs.images["robot0_eye_in_hand"])
    assert payload["state.end_effector_position_relative"].tolist() == [[0.45, -0.02, 0.31]]
    assert payload["state.base_rotation"].shape == (1, 4) and payload["state.base_rotation"][0, 3] == 1.0
    assert payload["state.gripper_qpos"].tolist() == [[0.02, -0.02]]
    assert payload[LANGUAGE_KEY] == ["lift the red cube"]
    assert len([k for k in payload if k.startswith("video.")]) == 3
    # RoboCasa's cameras map to themselves; the instruction can be overridden
    robocasa = Observation({"robot0_agentview_right": third}, {"robot0_agentview_right": "third_person"},
                           obs.proprio, "x", 0, task="OpenDrawer")
    payload = observation_to_gr00t(robocasa, instruction="open the drawer")
    assert [k for k in payload if k.startswith("video.")] == ["video.robot0_agentview_right"]
    assert payload[LANGUAGE_KEY] == ["open the drawer"]
    del obs.proprio["robot0_base_quat"]
    with pytest.raises(KeyError, match="robot0_base_quat"):
        observation_to_gr00t(obs)


def test_action_mapping_places_every_key_and_names_a_bad_one():
    t = np.arange(CHUNK, dtype=float)[:, None]
    reply = {
        "action.end_effector_position": np.hstack([t, t + 100, t + 200]),
        "action.end_effector_rotation": np.hstack([t + 300, t + 400, t + 500]),
        "action.base_motion": np.hstack([t + 700, t + 800, t + 900, t + 600]),
        "action.gripper_close": np.where(t[:, 0] % 2 == 0, 0.2, 0.7),  # squeezed (T,)
        "action.control_mode": np.full((CHUNK, 1), 0.49),
    }
    actions = gr00t_to_actions(reply)
    assert actions.shape == (8, 12)
    assert actions[3, :10].tolist() == [3, 103, 203, 303, 403, 503, 603, 703, 803, 903]
    assert actions[:4, 10].tolist() == [-1.0, 1.0, -1.0, 1.0]
    assert np.all(actions[:, 11] == -1.0)
    assert gr00t_to_actions(reply, n_action_steps=None).shape == (16, 12)
    bad = {**reply, "action.base_motion": np.zeros((CHUNK, 3))}
    with pytest.raises(ActionFormatError, match=r"'action.base_motion' has shape \(16, 3\), expected \(16, 4\)"):
        gr00t_to_actions(bad)
    with pytest.raises(ActionFormatError, match="'action.control_mode'"):
        gr00t_to_actions({k: v for k, v in reply.items() if k != "action.control_mode"})
    with pytest.raises(ActionFormatError, match="'action.end_effector_position' has 10 steps"):
        gr00t_to_actions({**reply, "action.end_effector_position": np.zeros((10, 3))})


def test_action_map_and_action_layout_are_read_by_one_parser_with_one_rule():
    """GR00T's ``action_map`` is model_io's layout parser in its {key, dim, targets, binary} form: the same slot
    type, the same messages, and the same rule (every index of an embodiment's action exactly once), so a map
    that no embodiment takes is refused when the policy is built, not at its first action."""
    from robocasa_shift.errors import PolicyOptionError
    from robocasa_shift.policies.gr00t.mapping import as_action_map
    from robocasa_shift.policies.model_io import ActionSlot, resolve_layout

    planar = as_action_map('[{"key": "action.planar", "dim": 2, "targets": [0, 1]}, '
                           '{"key": "action.grip", "dim": 1, "targets": [2], "binary": true}]')
    assert planar == (ActionSlot("action.planar", (0, 1), (0, 1)), ActionSlot("action.grip", (0,), (2,), True))
    assert planar == resolve_layout([{"name": "action.planar", "columns": [0, 1], "targets": [0, 1]},
                                     {"name": "action.grip", "columns": [0], "targets": [2], "binary": True}])
    for option, slot in (("action_map", {"key": "a", "dim": 5, "targets": [0, 1, 2, 3, 4]}),
                         ("action_layout", {"name": "a", "columns": [0, 1, 2, 3, 4], "targets": [0, 1, 2, 3, 4]})):
        with pytest.raises(ValueError, match=f"an {option} must map one column to each index .* exactly once"):
            resolve_layout([slot], option)
    with pytest.raises(ValueError, match="exactly once"):
        as_action_map([{"key": "a", "dim": 5, "targets": [0, 1, 2, 3, 4]}])
    with pytest.raises(PolicyOptionError, match=r"action_map: slot 1, .* is not \{key, dim, targets, binary\}"):
        as_action_map([{"name": "a", "columns": [0, 1, 2], "targets": [0, 1, 2]}])
    with pytest.raises(PolicyOptionError, match="action_map is not JSON"):
        as_action_map("robocasa-lerobot")  # layouts by name are action_layout's


# --------------------------------------------------------------------------- server


def test_ping_and_identity_record_the_server_model(server):
    client = Gr00tClient(HOST, server.port, timeout_s=5.0)
    assert client.ping()
    config = client.get_modality_config()
    assert config["video"]["delta_indices"] == [0]  # a ModalityConfig arrives as a plain dict
    assert config["model"] == MODEL_INFO
    identity = policy_for(server).identity()
    assert identity["name"] == "gr00t" and identity["endpoint"] == f"tcp://{HOST}:{server.port}"
    assert identity["serializer"] == "msgpack" and identity["model"] == MODEL_INFO
    assert identity["modality_config_sha256"] == content_hash(config)
    assert identity["modality_config_sha256"] != content_hash({**config, "model": {"name": "other"}})
    client.close()


def test_sessions_with_one_seed_get_one_action_sequence(server):
    a, b = policy_for(server), policy_for(server)
    assert a.client.session != b.client.session
    a.reset(7)
    b.reset(7)
    assert a.rng_fingerprint() == b.rng_fingerprint() == torch_fingerprint(7)
    obs = make_obs()
    first = [a.act(obs) for _ in range(3)]
    with torch.random.fork_rng():
        torch.manual_seed(12345)  # the caller's global RNG changes nothing
        global_state = torch.get_rng_state()
        second = [b.act(obs) for _ in range(3)]
        assert torch.equal(torch.get_rng_state(), global_state)  # the launcher restored the global RNG
    for x, y in zip(first, second):
        assert np.array_equal(x, y)
    assert not np.array_equal(first[0], first[1])  # the noise advances within a session
    a.reset(8)
    assert a.rng_fingerprint() == torch_fingerprint(8) != torch_fingerprint(7)
    assert not np.array_equal(a.act(obs), first[0])
    a.reset(7)
    assert np.array_equal(a.act(obs), first[0])


def test_interleaved_sessions_keep_their_own_sequences(server):
    obs = make_obs()
    solo = policy_for(server)
    solo.reset(11)
    expected = [solo.act(obs) for _ in range(3)]
    b, c = policy_for(server), policy_for(server)
    b.reset(11)
    c.reset(99)
    got, other = [], []
    for _ in range(3):
        got.append(b.act(obs))
        other.append(c.act(obs))
        other.append(c.act(obs))
    for x, y in zip(got, expected):
        assert np.array_equal(x, y)
    c.reset(99)
    assert np.array_equal(c.act(obs), other[0])


def test_a_retried_get_action_is_answered_from_the_cache(server):
    payload = observation_to_gr00t(make_obs())
    client = Gr00tClient(HOST, server.port, timeout_s=5.0)
    client.reset(5)
    one = client.call("get_action", payload, seq=1)
    again = client.call("get_action", payload, seq=1)  # what a retry after a lost reply sends
    two = client.call("get_action", payload, seq=2)
    fresh = Gr00tClient(HOST, server.port, timeout_s=5.0)
    fresh.reset(5)
    assert np.array_equal(again["action.end_effector_position"], one["action.end_effector_position"])
    assert np.array_equal(fresh.get_action(payload)["action.end_effector_position"], one["action.end_effector_position"])
    assert np.array_equal(fresh.get_action(payload)["action.end_effector_position"], two["action.end_effector_position"])
    client.close()
    fresh.close()


def test_server_errors_raise_policy_server_error(server):
    policy = policy_for(server, instruction="explode")
    policy.reset(1)
    with pytest.raises(PolicyServerError, match="stand-in model failure") as info:
        policy.act(make_obs())
    assert info.value.error_kind == "policy_server"
    with pytest.raises(PolicyServerError, match="Unknown endpoint: nope") as info:
        policy.client.call("nope")
    assert info.value.unknown_endpoint
    fresh = policy_for(server)
    with pytest.raises(PolicyServerError, match="never reset"):
        fresh.act(make_obs())
    bad = policy_for(server, instruction="bad shape")
    bad.reset(1)
    with pytest.raises(ActionFormatError, match="'action.end_effector_position' has shape") as info:
        bad.act(make_obs())
    assert info.value.error_kind == "policy_server"
    assert policy.client.ping()  # the socket is still usable after error replies


def test_a_plain_server_is_recorded_as_unseeded_with_one_warning():
    launcher = start_launcher(session_seeding=False)
    try:
        policy = policy_for(launcher)
        with pytest.warns(RuntimeWarning, match="no 'reset' endpoint"):
            policy.reset(3)
        assert policy.rng_fingerprint() == UNSEEDED
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            policy.reset(4)
        assert not caught and policy.rng_fingerprint() == UNSEEDED
        assert policy.act(make_obs()).shape == (8, 12)
    finally:
        launcher.stop()


def test_a_silent_server_times_out_and_the_client_recovers_when_it_returns():
    context = zmq.Context()
    silent = context.socket(zmq.REP)  # receives requests, never answers
    port = silent.bind_to_random_port(f"tcp://{HOST}")
    client = Gr00tClient(HOST, port, timeout_s=0.3, retries=1)
    t0 = time.perf_counter()
    with pytest.raises(PolicyServerTimeout, match=f"tcp://{HOST}:{port}.*within 0.3 s \\(2 tries\\)") as info:
        client.get_modality_config()
    elapsed = time.perf_counter() - t0
    assert 0.55 <= elapsed < 1.5, elapsed
    assert info.value.error_kind == "policy_server"
    assert client.sockets_created == 3  # the first one, and a new one after each timeout
    silent.close(linger=0)
    context.term()
    launcher = start_launcher(port=port)
    try:
        assert client.get_modality_config()["model"] == MODEL_INFO
        assert client.sockets_created == 3
    finally:
        client.close()
        launcher.stop()


# --------------------------------------------------------------------------- paired rollout


@pytest.mark.sim
def test_paired_rollouts_through_the_gr00t_client(server, lift_env, protocol):
    policy = policy_for(server)
    runs = paired_lift_rollouts(lift_env, policy, protocol, horizon=24)
    clean = runs["clean"][0]
    assert clean.steps == 24 and clean.policy_calls == 3  # 8 of each 16-step chunk run
    assert clean.policy_rng_fingerprint == torch_fingerprint(clean.policy_seed % 2**63)
    policy.close()