"""The ``vla-eval`` client: vla-eval's wire format, its observation conventions, the server's observation_params,
seeding, errors, and paired studies against a real vla-eval model server.

Three kinds of server:

- none: messages are checked byte for byte against frames recorded with vla-eval 0.8.0 itself
  (``tests/data/vlaeval/frames.msgpack``, written by ``tests/data/vlaeval/record_frames.py``): the
  observations its LIBERO and RoboCasa365 benchmarks build from a raw simulator observation, its
  ``episode_start``, and what a real vla-eval server answered.
- a loopback websocket server that replays those recorded server frames (no vla-eval needed), for the
  client's behaviour: hello, observation_params, the seeded-session extension, errors, timeouts, limits.
- a real vla-eval model server (vla-eval's ``serve_async`` and ``PredictModelServer`` around a stand-in
  model, ``tests/vlaeval_server.py``) running in ``.venv-vlaeval`` (``make setup-vlaeval``; ``make test``
  builds it), for paired robosuite studies through the CLI, audited.
"""

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import pytest

pytest.importorskip("websockets", reason="the vla-eval client needs websockets: pip install -e '.[vlaeval]'")
import websockets  # noqa: E402
import websockets.asyncio.server  # noqa: E402

from robocasa_shift.core.policy import Observation  # noqa: E402
from robocasa_shift.embodiments import panda_omron  # noqa: E402
from robocasa_shift.embodiments.panda import LAYOUT as PANDA  # noqa: E402
from robocasa_shift.errors import (  # noqa: E402
    ActionFormatError,
    PolicyOptionError,
    PolicyServerError,
    PolicyServerTimeout,
)
from robocasa_shift.policies import make_policy  # noqa: E402
from robocasa_shift.policies.served.policy import UNSEEDED  # noqa: E402
from robocasa_shift.policies.vla_eval.client import (  # noqa: E402
    ReplyFormatError,
    VlaEvalPolicy,
    action_from_reply,
    libero_task_info,
    observation_payload,
    pack_message,
    unpack_message,
)

# the warning a plain server earns (tested once, below) is expected everywhere else
pytestmark = pytest.mark.filterwarnings("ignore:the vla-eval server at .* takes no seed:RuntimeWarning")
ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
FRAMES = msgpack.unpackb((ROOT / "tests/data/vlaeval/frames.msgpack").read_bytes(), raw=False)
STAMP = FRAMES["meta"]["timestamp"]
VLAEVAL_PY = Path(os.environ.get("VLAEVAL_PYTHON", ROOT / ".venv-vlaeval" / "bin" / "python"))
needs_vlaeval = pytest.mark.skipif(not VLAEVAL_PY.exists(), reason="vla-eval's model server runs in .venv-vlaeval: "
                                   "make setup-vlaeval (make test builds it first)")


def array(stored):
    return np.frombuffer(stored["data"], stored["dtype"]).reshape(stored["shape"]).copy()


def recorded_payload(preset, name):
    return msgpack.unpackb(FRAMES[preset][name], raw=False)["payload"]


def libero_obs(instruction=None, task="spatial-0"):
    rec = FRAMES["libero"]
    images = {"agentview": array(rec["upright"]["agentview"]), "robot0_eye_in_hand": array(rec["upright"]["wrist"])}
    proprio = {k: array(v) for k, v in rec["proprio"].items()}
    return Observation(images, {"agentview": "third_person", "robot0_eye_in_hand": "wrist"}, proprio,
                       instruction or rec["task"]["name"], 0, task=task, action_layout=PANDA)


def robocasa_obs(cameras="robocasa"):
    rec = FRAMES["robocasa365"]
    views = {k: array(v) for k, v in rec["upright"].items()}
    state = {k: array(v) for k, v in rec["state"].items()}
    proprio = {"robot0_base_to_eef_pos": state["state.end_effector_position_relative"],
               "robot0_base_to_eef_quat": state["state.end_effector_rotation_relative"],
               "robot0_gripper_qpos": state["state.gripper_qpos"], "robot0_base_pos": state["state.base_position"],
               "robot0_base_quat": state["state.base_rotation"], "robot0_eef_pos": np.zeros(3)}
    if cameras == "robocasa":
        images = {c: views[f"video.{c}"] for c in ("robot0_agentview_left", "robot0_agentview_right",
                                                   "robot0_eye_in_hand")}
    else:  # the embedded backend: one third-person camera for both agentviews
        images = {"robot0_robotview": views["video.robot0_agentview_left"],
                  "robot0_eye_in_hand": views["video.robot0_eye_in_hand"]}
    roles = {c: ("wrist" if c == "robot0_eye_in_hand" else "third_person") for c in images}
    return Observation(images, roles, proprio, "open the drawer", 0, task="OpenDrawer")


def decoded(data):
    """A message decoded permissively (vla-eval's own decoding): images as pixels, arrays as numpy."""
    def hook(obj):
        if "__image__" in obj:
            from PIL import Image
            import io
            return ("image", obj["format"], tuple(obj["shape"]), np.array(Image.open(io.BytesIO(obj["data"]))))
        if "__ndarray__" in obj:
            return ("array", obj["dtype"], tuple(obj["shape"]), obj["data"])
        return obj
    return msgpack.unpackb(data, raw=False, object_hook=hook)


def same(a, b):
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple) and a and a[0] == "image":
        return isinstance(b, tuple) and a[:3] == b[:3] and np.array_equal(a[3], b[3])
    return a == b


# --------------------------------------------------------------------------- wire format, recorded frames


@pytest.mark.parametrize("variant", ["default", "no_antipodal"])
def test_the_libero_observation_is_vla_eval_s_byte_for_byte_but_controller_states(variant):
    payload = observation_payload(libero_obs(), "libero", send_wrist_image=True, send_state=True,
                                  quat_no_antipodal=variant == "no_antipodal")
    theirs = msgpack.unpackb(FRAMES["libero"][f"observation_raw_{variant}"], raw=False)
    # vla-eval's LIBERO adds the controller's pose (X-VLA's input; X-VLA also needs absolute actions): not sent
    assert list(theirs["payload"]) == ["images", "task_description", "states", "controller_states"]
    del theirs["payload"]["controller_states"]
    assert pack_message("observation", payload, 3, STAMP, image_format="raw") == msgpack.packb(theirs, use_bin_type=True)
    # PNG (vla-eval's default): the same message, the images decoding to the same pixels
    theirs_png = decoded(FRAMES["libero"][f"observation_png_{variant}"])
    del theirs_png["payload"]["controller_states"]
    assert same(decoded(pack_message("observation", payload, 3, STAMP)), theirs_png)
    assert theirs_png["payload"]["images"]["agentview"][1] == "png"


def test_the_libero_state_s_axis_angle_is_vla_eval_s_sign_normalised_one_by_default():
    default = observation_payload(libero_obs(), "libero", send_state=True)["states"]
    robosuite = observation_payload(libero_obs(), "libero", send_state=True, quat_no_antipodal=True)["states"]
    assert default.dtype == np.float64 and default.shape == (8,)
    assert not np.allclose(default[3:6], robosuite[3:6])  # the recorded quaternion has w < 0
    # and the libero backend's own robot0_eef_axis_angle (openpi's) is the no-antipodal one, not sent by default
    assert np.array_equal(default[:3], libero_obs().proprio["robot0_eef_pos"])


def test_the_libero_images_are_the_upright_frames_mirrored_and_the_wrist_only_when_asked():
    obs = libero_obs()
    payload = observation_payload(obs, "libero")
    assert list(payload) == ["images", "task_description"] and list(payload["images"]) == ["agentview"]
    assert np.array_equal(payload["images"]["agentview"], obs.images["agentview"][:, ::-1])
    both = observation_payload(obs, "libero", send_wrist_image=True)["images"]
    assert list(both) == ["agentview", "wrist"]  # vla-eval's servers read the first image as the main view


@pytest.mark.parametrize("cameras", ["robocasa", "embedded"])
def test_the_robocasa365_observation_is_vla_eval_s_byte_for_byte(cameras):
    payload = observation_payload(robocasa_obs(cameras), "robocasa365")
    if cameras == "robocasa":
        assert pack_message("observation", payload, 3, STAMP, image_format="raw") == \
            FRAMES["robocasa365"]["observation_raw"]
        assert same(decoded(pack_message("observation", payload, 3, STAMP)),
                    decoded(FRAMES["robocasa365"]["observation_png"]))
    else:  # robot0_robotview feeds both agentviews
        images = payload["images"]
        assert list(images) == ["video.robot0_agentview_left", "video.robot0_agentview_right",
                                "video.robot0_eye_in_hand"]
        assert np.array_equal(images["video.robot0_agentview_left"], images["video.robot0_agentview_right"])
    assert all(v.dtype == np.float32 for v in payload["state"].values())


def test_episode_start_carries_the_task_as_vla_eval_s_runner_sends_it():
    task = FRAMES["libero"]["task"]
    assert libero_task_info("spatial-0", task["name"]) == task
    assert pack_message("episode_start", {"task": libero_task_info("spatial-0", task["name"])}, 2, STAMP) == \
        FRAMES["libero"]["episode_start"]
    assert pack_message("episode_start", {"task": {"name": "OpenDrawer"}}, 2, STAMP) == \
        FRAMES["robocasa365"]["episode_start"]
    assert libero_task_info("long-3", "x") == {"name": "x", "suite": "libero_10", "task_id": 3}
    assert libero_task_info("spatial_swap-2", "x") == {"name": "x", "suite": "libero_spatial_swap", "task_id": 2}


def test_a_real_server_s_frames_decode_and_its_action_is_what_vla_eval_s_benchmarks_apply():
    kind, hello, seq, _ = unpack_message(FRAMES["libero"]["server_hello"])
    assert (kind, seq, hello["protocol_version"], hello["model_server"]) == ("hello", 1, 1, "StandInServer")
    assert hello["observation_params"] == {"send_wrist_image": True, "send_state": True}
    kind, reply, seq, _ = unpack_message(FRAMES["libero"]["server_action"])
    assert kind == "action" and seq == 3 and reply["actions"].dtype == np.float32 and reply["actions"].shape == (7,)
    # LIBEROBenchmark.step: the gripper by sign
    assert np.array_equal(action_from_reply(reply, "libero")[0], array(FRAMES["libero"]["env_action"]))
    assert reply["actions"][6] != action_from_reply(reply, "libero")[0, 6]  # the raw output was not +-1
    # RoboCasa365: convert_action's order, then RoboCasa's gym wrapper (gripper, mode: < 0.5 -> -1, else +1)
    _, reply, _, _ = unpack_message(FRAMES["robocasa365"]["server_action"])
    named = {k: array(v) for k, v in FRAMES["robocasa365"]["named_action"].items()}
    action = action_from_reply(reply, "robocasa365")[0]
    assert np.array_equal(action[panda_omron.ARM_POS], named["action.end_effector_position"])
    assert np.array_equal(action[panda_omron.ARM_ROT], named["action.end_effector_rotation"])
    assert action[panda_omron.GRIPPER] == (-1.0 if named["action.gripper_close"][0] < 0.5 else 1.0)
    assert np.array_equal(action[list(panda_omron.BASE_MOTION)], named["action.base_motion"])
    assert action[panda_omron.MODE] == (-1.0 if named["action.control_mode"][0] < 0.5 else 1.0)
    kind, error, seq, _ = unpack_message(FRAMES["libero"]["server_error"])
    assert kind == "error" and seq == 3 and "before any episode_start" in error["error"]


def test_actions_of_another_shape_are_refused_and_a_chunk_is_named_as_one():
    with pytest.raises(ActionFormatError, match=r"a chunk: vla-eval's benchmarks take one action per observation"):
        action_from_reply({"actions": np.zeros((8, 7), np.float32)}, "libero")
    with pytest.raises(ActionFormatError, match=r"shape \(12,\), expected \(7,\)"):
        action_from_reply({"actions": np.zeros(12)}, "libero")
    with pytest.raises(ActionFormatError, match="no 'actions'; it has: result"):
        action_from_reply({"result": 1}, "libero")
    with pytest.raises(ActionFormatError, match="non-finite"):
        action_from_reply({"actions": np.full(7, np.nan)}, "libero")
    assert action_from_reply({"action": [0.1] * 6 + [0.0]}, "libero")[0, 6] == 1.0  # 0 closes, as LIBERO reads it
    assert action_from_reply({"actions": np.zeros((1, 12))}, "robocasa365").shape == (1, 12)


def frame(kind, payload, seq=1, **extra):
    return msgpack.packb({"type": kind, "payload": payload, "seq": seq, "timestamp": 0.0, **extra}, use_bin_type=True)


@pytest.mark.parametrize("data, match", [
    (frame("action", {"actions": {"__ndarray__": True, "data": b"\0" * 8, "dtype": "|O", "shape": [1]}}),
     "dtype '|O' refused"),
    (frame("action", {"actions": {"__ndarray__": True, "data": b"\0" * 7, "dtype": "<f4", "shape": [2]}}),
     "needs 8 bytes, the message has 7"),
    (frame("action", {"actions": {"__ndarray__": True, "data": b"", "dtype": "V8", "shape": [0]}}), "refused"),
    (frame("action", {"actions": {"__ndarray__": True, "data": b"", "dtype": "<f4", "shape": [-1]}}), "sizes >= 0"),
    (frame("action", {"img": {"__image__": True, "format": "png", "data": b"x", "shape": [1, 1, 3]}}),
     "holds an encoded image"),
    (frame("reset", {}), "unknown message type 'reset'"),
    (frame("action", [1, 2]), "payload must be a map"),
    (frame("action", {}, seq=True), "seq must be an integer"),
    (msgpack.packb({"type": "action", "payload": {}}), "without seq, timestamp"),
    (b"\xc1", "not a msgpack message"),
    ("Traceback ...", "a text frame"),
    (frame("action", {"pad": b"x" * 200}), "exceeds the limit of 100"),
])
def test_server_messages_are_decoded_strictly(data, match):
    with pytest.raises(ReplyFormatError, match=match):
        unpack_message(data, max_bytes=100 if match.startswith("exceeds") else 2**20)


# --------------------------------------------------------------------------- a loopback server of recorded frames


def _fingerprint(seed):
    return hashlib.sha256(f"seed={seed}".encode()).hexdigest()


class ReplayServer:
    """vla-eval's protocol on loopback, answering with the frames a real vla-eval server sent (recorded).

    Args:
        preset: whose recorded frames to answer with.
        observation_params: replaces the recorded hello's (None keeps it).
        seeded: offer the seeded-session extension (``capabilities.seeded_reset``).
        mode: ``serve``; ``error`` (an error message for every observation); ``silent`` (never answers an
            observation); ``wrong_seq``; ``chunk`` (answers a (4, D) chunk); ``big`` (a 2 MB message);
            ``mute`` (never answers the hello).
        token: the bearer token a connection must present.
    """

    def __init__(self, preset="libero", observation_params=None, seeded=False, mode="serve", token=None, port=0,
                 model="StandInServer"):
        self.hello = recorded_payload(preset, "server_hello")
        if observation_params is not None:
            self.hello["observation_params"] = observation_params
        if seeded:
            self.hello["capabilities"] = {"seeded_reset": True}
        self.hello["model_server"] = model
        self.action = recorded_payload(preset, "server_action")
        self.mode, self.token, self.port = mode, token, port
        self.received, self.connections, self.headers = [], 0, []
        self._ready = threading.Event()

    def _process_request(self, connection, request):
        self.headers.append(request.headers.get("Authorization"))
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return connection.respond(401, "unauthorized\n")
        return None

    async def _handler(self, ws):
        self.connections += 1
        try:
            async for data in ws:
                msg = msgpack.unpackb(data, raw=False)
                self.received.append(msg)
                kind, payload, seq = msg["type"], msg["payload"], msg["seq"]
                if kind == "hello":
                    if self.mode == "mute":
                        continue
                    await ws.send(frame("hello", self.hello, seq))
                elif kind == "episode_start" and "seed" in payload and self.hello["capabilities"].get("seeded_reset"):
                    await ws.send(frame("episode_start", {"rng_fingerprint": _fingerprint(payload["seed"])}, seq))
                elif kind == "observation":
                    if self.mode == "silent":
                        continue
                    if self.mode == "error":
                        await ws.send(frame("error", {"error": "observation_failed: RuntimeError: stand-in failure"},
                                            seq))
                    elif self.mode == "wrong_seq":
                        await ws.send(frame("action", self.action, seq + 5))
                    elif self.mode == "chunk":
                        await ws.send(frame("action", {"actions": {"__ndarray__": True, "dtype": "<f4",
                                                                   "shape": [4, 7], "data": b"\0" * 112}}, seq))
                    elif self.mode == "big":
                        await ws.send(frame("action", {**self.action, "pad": b"x" * 2**21}, seq))
                    else:
                        await ws.send(frame("action", self.action, seq))
        except websockets.ConnectionClosed:
            pass

    async def _main(self):
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with websockets.asyncio.server.serve(self._handler, HOST, self.port, compression=None, max_size=None,
                                                   process_request=self._process_request) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()

    def start(self):
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "the replay server did not start"
        return self

    def stop(self):
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kinds(self, at_least: int = 0, timeout_s: float = 10.0):
        """The message types received so far; with ``at_least``, first wait (bounded) until that many have arrived:
        the server's thread records a message after the client has sent it, so a test can read before it lands."""
        deadline = time.monotonic() + timeout_s
        while len(self.received) < at_least and time.monotonic() < deadline:
            time.sleep(0.01)
        return [m["type"] for m in self.received]


@contextmanager
def replay_server(**kwargs):
    server = ReplayServer(**kwargs).start()
    try:
        yield server
    finally:
        server.stop()


def client(server, **options):
    return VlaEvalPolicy(host=HOST, port=server.port, timeout_s=5.0, **options)


def test_a_stock_server_is_recorded_unseeded_and_episode_start_goes_with_the_first_observation():
    with replay_server() as server:
        policy = client(server)
        identity = policy.identity()
        assert identity["model_server"] == "StandInServer" and identity["seeded_reset"] is False
        assert identity["honoured"] == {"send_wrist_image": True, "send_state": True} and identity["waived"] == {}
        assert policy.camera_roles == ("third_person", "wrist") and policy.image_size == 256
        with pytest.warns(RuntimeWarning, match="takes no seed"):
            policy.reset(7)
        assert policy.rng_fingerprint() == UNSEEDED
        first = policy.act(libero_obs())
        assert first.shape == (1, 7) and first[0, 6] in (-1.0, 1.0)
        policy.act(libero_obs())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # one warning per instance
            policy.reset(8)
        policy.act(libero_obs())
        policy.close()
        assert server.kinds(at_least=8) == ["hello", "episode_start", "observation", "observation", "episode_end",
                                            "episode_start", "observation", "episode_end"]
        hello, start = server.received[0]["payload"], server.received[1]["payload"]
        assert hello["protocol_version"] == 1 and hello["benchmark"].endswith("LIBEROBenchmark")
        assert start == {"task": FRAMES["libero"]["task"]} and "seed" not in json.dumps(start)  # no seed reaches it
        assert server.received[4]["payload"] == {"steps": 2}
        seqs = [m["seq"] for m in server.received]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_server_offering_seeded_sessions_gets_the_seed_at_reset_and_its_fingerprint_is_recorded():
    with replay_server(seeded=True) as server:
        policy = client(server)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            policy.reset(7)
        assert policy.rng_fingerprint() == _fingerprint(7) and policy.identity()["seeded_reset"] is True
        policy.act(libero_obs())
        policy.reset(8)
        assert policy.rng_fingerprint() == _fingerprint(8)
        policy.close()
        starts = [m["payload"] for m in server.received if m["type"] == "episode_start"]
        assert starts == [{"task": {}, "seed": 7}, {"task": {}, "seed": 8}]
        assert server.kinds()[:3] == ["hello", "episode_start", "observation"]


@pytest.mark.parametrize("params, options, refused", [
    ({"absolute_action": True}, {}, "absolute_action=true: vla-eval's libero benchmark takes it; the libero backend "
                                    "runs LIBERO's delta OSC_POSE controller"),
    ({"seed": 0}, {}, "seed=0: vla-eval's libero benchmark takes it; the study's seeds decide every episode"),
    ({"num_steps_wait": 5}, {}, "num_steps_wait=5: .* settles every episode with 10 no-op steps"),
    ({"success_mode": "truncation"}, {}, "success_mode=\"truncation\": vla-eval's libero benchmark does not take "
                                         "\\(vla-eval would drop it with a warning\\)"),
    ({"send_state": "yes"}, {}, "expected true or false"),
    ({"send_state": True}, {"waive": "seed"}, "waive names seed, which the server's observation_params do not hold"),
])
def test_observation_params_a_client_cannot_honour_are_refused_by_name_before_anything_runs(params, options, refused):
    with replay_server(observation_params=params) as server:
        with pytest.raises(PolicyOptionError, match=refused) as info:
            client(server, **options)
        assert "waive=KEY" in str(info.value) and info.value.exit_code == 2
        assert server.kinds() == ["hello"]  # nothing else was sent


def test_observation_params_are_honoured_or_waived_as_the_server_asks():
    params = {"send_wrist_image": False, "send_state": True, "quat_no_antipodal": True, "absolute_action": False,
              "num_steps_wait": 10, "seed": 0}
    with replay_server(observation_params=params) as server:
        # the recorded hello's observation_spec still declares the wrist image: vla-eval's spec check says so
        mismatch = "observation [wrist]: server expects it but benchmark doesn't provide it"
        with pytest.warns(RuntimeWarning, match=mismatch.replace("[", r"\[").replace("]", r"\]")):
            policy = client(server, waive="seed")
        identity = policy.identity()
        assert identity["spec_warnings"] == [mismatch]
        assert identity["waived"] == {"seed": 0} and "seed" not in identity["honoured"]
        assert policy.camera_roles == ("third_person",)  # no wrist camera rendered
        policy.reset(1)
        policy.act(libero_obs())
        sent = server.received[-1]["payload"]
        assert list(sent) == ["images", "task_description", "states"] and list(sent["images"]) == ["agentview"]
        assert sent["states"]["data"] == observation_payload(libero_obs(), "libero", send_state=True,
                                                             quat_no_antipodal=True)["states"].tobytes()
        policy.close()
    with replay_server(preset="robocasa365", observation_params={"camera_size": 64, "send_state": True}) as server:
        policy = client(server, preset="robocasa365")
        assert policy.image_size == 64 and policy.camera_roles == ("third_person", "wrist")
        policy.close()
        with pytest.raises(PolicyOptionError, match="camera_size=64: .* image_size=128 was given as an option"):
            client(server, preset="robocasa365", image_size=128)


def test_a_study_whose_server_asks_for_what_cannot_be_honoured_stops_before_its_run_directory_exists(tmp_path):
    with replay_server(preset="robocasa365", observation_params={"split": "target"}) as server:
        proc = run_cli("run", "--backend", "robosuite", "--task", "Lift", "--episodes", "0", "--policy", "vla-eval",
                       "--policy-option", "preset=robocasa365", "--policy-option", f"host={HOST}",
                       "--policy-option", f"port={server.port}", "--run-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr
    assert 'split="target": vla-eval\'s robocasa365 benchmark takes it; --task and the backend choose the scenes' in \
        proc.stderr
    assert not (tmp_path / "run").exists() and server.kinds() == ["hello"]


def test_a_layout_that_does_not_fit_the_environment_is_refused_before_anything_is_sent():
    with replay_server() as server:
        policy = client(server)
        policy.reset(1)
        with pytest.raises(ActionFormatError, match="makes 7-D actions; this environment takes 12-D"):
            policy.act(robocasa_obs())
        assert "observation" not in server.kinds()
        policy.close()


def test_server_errors_carry_its_text_and_the_session_goes_on():
    with replay_server(mode="error") as server:
        policy = client(server)
        policy.reset(1)
        with pytest.raises(PolicyServerError, match="failed observation: observation_failed: RuntimeError: "
                                                    "stand-in failure") as info:
            policy.act(libero_obs())
        assert info.value.error_kind == "policy_server" and "stand-in failure" in info.value.server_message
        assert not policy.client.closed  # vla-eval keeps the session open after an error
        policy.close()


@pytest.mark.parametrize("mode, error, match", [
    ("silent", PolicyServerTimeout, "did not answer observation within 0.3 s"),
    ("wrong_seq", PolicyServerError, r"answered observation \(seq 3\) with a action message of seq 8"),
    ("big", PolicyServerError, "exceeded max_message_bytes=1,048,576"),
])
def test_a_broken_exchange_closes_the_connection_and_the_next_reset_reconnects(mode, error, match):
    with replay_server(mode=mode) as server:
        policy = VlaEvalPolicy(host=HOST, port=server.port, timeout_s=0.3, max_message_bytes=2**20)
        policy.reset(1)
        t0 = time.perf_counter()
        with pytest.raises(error, match=match):
            policy.act(libero_obs())
        assert time.perf_counter() - t0 < 3.0 and policy.client.closed
        with pytest.raises(PolicyServerError, match="was closed after an earlier error"):
            policy.act(libero_obs())
        policy.reset(2)  # a new connection, same hello
        assert server.connections == 2 and not policy.client.closed
        policy.close()


def test_a_chunk_reply_is_refused_naming_chunk_size():
    with replay_server(mode="chunk") as server:
        policy = client(server)
        policy.reset(1)
        with pytest.raises(ActionFormatError, match="the server's chunk_size does the chunking"):
            policy.act(libero_obs())
        policy.close()


def test_a_reconnect_to_a_server_with_another_hello_is_refused():
    first = ReplayServer().start()
    policy = client(first)
    policy.reset(1)
    port = first.port
    first.stop()
    second = ReplayServer(port=port, model="AnotherModel").start()
    try:
        with pytest.raises(PolicyServerError):
            policy.act(libero_obs())
        with pytest.raises(PolicyServerError, match="answers the hello differently"):
            policy.reset(1)
    finally:
        second.stop()


def test_connection_refused_and_a_mute_server_name_the_server_and_what_to_check():
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    with pytest.raises(PolicyServerError, match=f"cannot connect to the vla-eval server at ws://{HOST}:{port}.*"
                                                "curl http://HOST:PORT/health"):
        VlaEvalPolicy(host=HOST, port=port, connect_timeout_s=2.0)
    with replay_server(mode="mute") as server:
        t0 = time.perf_counter()
        with pytest.raises(PolicyServerTimeout, match="answered no hello within 0.3 s"):
            VlaEvalPolicy(host=HOST, port=server.port, connect_timeout_s=0.3)
        assert time.perf_counter() - t0 < 3.0
    with pytest.raises(PolicyServerTimeout, match="did not report ready on /health within 0.5 s"):
        VlaEvalPolicy(host=HOST, port=port, ready_timeout_s=0.5)


def test_the_api_key_goes_in_a_header_and_nowhere_else(monkeypatch):
    secret = "s3cret-token-4711"
    with replay_server(token=secret) as server:
        with pytest.raises(PolicyServerError) as info:
            VlaEvalPolicy(host=HOST, port=server.port, api_key="wrong")
        assert "wrong" not in str(info.value) and "401" in str(info.value)
        monkeypatch.setenv("VLAEVAL_TEST_TOKEN", secret)
        policy = make_policy("vla-eval", host=HOST, port=server.port, api_key="env:VLAEVAL_TEST_TOKEN")
        assert server.headers[-1] == f"Bearer {secret}"
        assert secret not in json.dumps(policy.identity()) and secret not in repr(vars(policy.client))
        policy.close()


def test_a_lockstep_batch_sends_every_observation_before_reading_any_action():
    with replay_server() as server:
        policies = [client(server) for _ in range(3)]
        for p in policies:
            p.reset(1)
        actions = VlaEvalPolicy.act_batch(policies, [libero_obs()] * 3)
        assert [a.shape for a in actions] == [(1, 7)] * 3
        for p in policies:
            p.close()
    with replay_server(mode="silent") as server:
        policies = [VlaEvalPolicy(host=HOST, port=server.port, timeout_s=0.3) for _ in range(2)]
        for p in policies:
            p.reset(1)
        with pytest.raises(PolicyServerTimeout):
            VlaEvalPolicy.act_batch(policies, [libero_obs()] * 2)
        assert all(p.client.closed for p in policies)  # no request left unanswered on an open connection


def test_unknown_presets_and_image_formats_list_the_known_ones():
    with pytest.raises(KeyError, match="vla-eval preset 'robocasa'.*did you mean 'robocasa365'"):
        VlaEvalPolicy(preset="robocasa")
    with pytest.raises(KeyError, match="image format 'webp'"):
        VlaEvalPolicy(image_format="webp")


@pytest.mark.slow
def test_formal_dry_run_says_one_action_per_step_means_a_render_every_step(tmp_path):
    from helpers import cli

    out = cli("formal", "--backend", "robosuite", "--task", "Lift", "--condition", "clean,camera:L2", "--episodes",
              "0-2", "--policy", "vla-eval", "--policy-option", "preset=robocasa365", "--run-dir", str(tmp_path / "run"),
              "--dry-run").stdout
    assert "6 rollouts planned" in out
    assert "vla-eval answers one action per observation, so every control step renders the cameras it reads" in out
    assert "up to 2,400 renders per camera" in out  # 6 rollouts x Lift's 400 steps
    other = cli("formal", "--backend", "robosuite", "--task", "Lift", "--episodes", "0", "--policy", "expert",
                "--run-dir", str(tmp_path / "run2"), "--dry-run").stdout
    assert "one action per observation" not in other


# --------------------------------------------------------------------------- a real vla-eval model server


@contextmanager
def vlaeval_server(tmp_path, *args):
    """``tests/vlaeval_server.py`` in .venv-vlaeval (vla-eval's own server code): its port and its log file."""
    log = tmp_path / f"server-{time.monotonic_ns()}.jsonl"
    err = open(tmp_path / "server.err", "a")
    proc = subprocess.Popen([str(VLAEVAL_PY), str(ROOT / "tests" / "vlaeval_server.py"), "--log", str(log), *args],
                            stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("PORT "), f"the vla-eval server did not start: {(tmp_path / 'server.err').read_text()[-2000:]}"
        yield int(line.split()[1]), log
    finally:
        proc.terminate()
        proc.wait(20)
        err.close()


def read_log(log):
    return [json.loads(line) for line in Path(log).read_text().splitlines()]


def run_cli(*args, env=None, timeout=900):
    return subprocess.run([sys.executable, "-m", "robocasa_shift", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


@needs_vlaeval
@pytest.mark.sim
@pytest.mark.slow
def test_a_paired_robosuite_study_against_a_real_vla_eval_server_audits_clean(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.steplog import StepLog, log_path
    from robocasa_shift.rundir.store import RunStore

    secret = "tok-9f2c1e"
    run = tmp_path / "run"
    with vlaeval_server(tmp_path, "--preset", "robocasa365", "--size", "64", "--params", '{"camera_size": 64}') as (
            port, log):
        t0 = time.perf_counter()
        proc = run_cli("run", "--backend", "robosuite", "--task", "Lift", "--condition", "clean,camera:L2",
                       "--episodes", "0", "--policy", "vla-eval", "--policy-option", "preset=robocasa365",
                       "--policy-option", f"host={HOST}", "--policy-option", f"port={port}",
                       "--policy-option", "image_format=raw", "--policy-option", "api_key=env:VLAEVAL_TEST_TOKEN",
                       "--policy-option", "ready_timeout_s=30",  # GET /health of vla-eval's server first
                       "--workers", "2", "--log-steps", "--run-dir", str(run), env={"VLAEVAL_TEST_TOKEN": secret})
        wall = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = read_log(log)
    audit = run_cli("audit", str(run))
    assert audit.returncode == 0 and "audit: PASSED" in audit.stdout, audit.stdout + audit.stderr
    store = RunStore(run)
    manifest = store.manifest()
    policy = manifest["policy"]
    assert policy["model_server"] == "StandInServer" and policy["honoured"] == {"camera_size": 64}
    assert policy["image_size"] == 64 and policy["seeded_reset"] is False and policy["image_format"] == "raw"
    assert manifest["policy_options"]["api_key"] == "env:VLAEVAL_TEST_TOKEN"
    for path in run.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path
    records = {r["condition"]: r for r in store.records()}
    for rec in records.values():
        assert rec["valid"] and rec["steps"] == rec["horizon"] == 400
        assert rec["policy_calls"] == 400 and rec["frames_rendered"] == 800  # one observation per step, 2 cameras
        assert rec["policy_rng_fingerprint"] == UNSEEDED
    assert records["clean"]["env_fingerprint"] == records["camera:L2"]["env_fingerprint"]
    actions = {c: StepLog.read(log_path(store.record_path(RolloutKey.from_record(r))).read_bytes()).action
               for c, r in records.items()}
    assert set(np.unique(actions["clean"][:, panda_omron.GRIPPER])) <= {-1.0, 1.0}
    assert set(np.unique(actions["clean"][:, panda_omron.MODE])) == {-1.0}
    assert not np.array_equal(actions["clean"], actions["camera:L2"])  # the moved camera reached the model
    starts = [e for e in events if e["event"] == "episode_start"]
    observations = [e for e in events if e["event"] == "observation"]
    assert [s["payload"] for s in starts] == [{"task": {"name": "Lift"}}] * 2
    assert len(observations) == 800 and {tuple(o["images"]) for o in observations} == {
        ("video.robot0_agentview_left", "video.robot0_agentview_right", "video.robot0_eye_in_hand")}
    assert {o["task_description"] for o in observations} == {get_backend("robosuite").task("Lift").instruction}
    dry = run_cli("formal", "--backend", "robosuite", "--task", "Lift", "--condition", "clean,camera:L2", "--episodes",
                  "0-1", "--policy", "vla-eval", "--policy-option", "preset=robocasa365", "--run-dir", str(run),
                  "--dry-run").stdout
    assert "2 to run" in dry and "s per rollout (measured)" in dry and "one action per observation" in dry
    print(f"paired robosuite study through a real vla-eval server: 2 rollouts of 400 steps in {wall:.1f} s")


@needs_vlaeval
@pytest.mark.sim
def test_the_circuit_breaker_stops_a_study_whose_vla_eval_server_fails_every_rollout(tmp_path):
    from robocasa_shift.rundir.store import RunStore

    run = tmp_path / "run"
    with vlaeval_server(tmp_path, "--preset", "robocasa365", "--size", "64", "--params", '{"camera_size": 64}',
                        "--fail") as (port, _):
        proc = run_cli("run", "--backend", "robosuite", "--task", "Lift", "--episodes", "0-7", "--policy", "vla-eval",
                       "--policy-option", "preset=robocasa365", "--policy-option", f"host={HOST}",
                       "--policy-option", f"port={port}", "--workers", "1", "--run-dir", str(run))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "the policy server failed 5 rollouts in a row; stopped the study after 5 of 8 rollouts" in proc.stderr
    records = RunStore(run).records()
    assert len(records) == 5 and {r["error_kind"] for r in records} == {"policy_server"}
    assert all("stand-in model failure" in r["error"] for r in records)
