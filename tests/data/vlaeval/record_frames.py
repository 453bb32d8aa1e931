"""Record the vla-eval frames ``tests/test_vlaeval.py`` checks the ``vla-eval`` client against, without vla-eval.

Run in ``.venv-vlaeval`` (vla-eval 0.8.0), from the repository root::

    .venv-vlaeval/bin/python tests/data/vlaeval/record_frames.py

It writes ``tests/data/vlaeval/frames.msgpack``: for vla-eval's LIBERO and RoboCasa365 benchmarks, the
raw simulator observation given to the benchmark's own ``make_obs`` and the observation message vla-eval's
``pack_message`` makes of it (PNG and raw images), the ``episode_start`` its runner sends, the frames a real
vla-eval model server (``tests/vlaeval_server.py``'s stand-in, served by vla-eval's ``serve_async``) sent back
for a hello, an observation and a request it failed, and the action the benchmark's own ``step`` applies to
the simulator for that reply. Arrays are stored as ``{"dtype", "shape", "data"}``.
"""

from __future__ import annotations

import sys
import threading
from functools import partial
from pathlib import Path

import anyio
import msgpack
import numpy as np
import PIL
from vla_eval import __version__ as VLA_EVAL_VERSION
from vla_eval.benchmarks.libero.benchmark import LIBEROBenchmark
from vla_eval.benchmarks.robocasa365.benchmark import RoboCasa365Benchmark, decode_action
from vla_eval.model_servers.serve import serve_async
from vla_eval.protocol import numpy_codec
from vla_eval.protocol.messages import Message, MessageType, make_hello_payload, pack_message
from vla_eval.recording import NullEpisodeRecorder
from websockets.sync.client import connect

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from vlaeval_server import StandInServer  # noqa: E402

SIZE = 32
TIMESTAMP = 1767225600.0  # fixed, so that a client's message can be compared byte for byte
RNG = np.random.default_rng(33)


def array(value: np.ndarray) -> dict:
    value = np.ascontiguousarray(value)
    return {"dtype": value.dtype.str, "shape": list(value.shape), "data": value.tobytes()}


def packed(kind: MessageType, payload: dict, seq: int, image_format: str) -> bytes:
    numpy_codec.set_image_format(image_format)
    try:
        return pack_message(Message(type=kind, payload=payload, seq=seq, timestamp=TIMESTAMP))
    finally:
        numpy_codec.set_image_format("png")


class _Controller:
    ee_pos = np.array([0.11, -0.02, 1.05])
    ee_ori_mat = np.array([[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]])


class _LiberoEnv:
    """What LIBEROBenchmark.make_obs and step touch of LIBERO's env: the controller's pose, step()."""

    robots = [type("Robot", (), {"controller": _Controller()})()]

    def __init__(self, raw_obs):
        self.raw_obs, self.applied = raw_obs, []

    def step(self, action):
        self.applied.append(list(action))
        return self.raw_obs, 0.0, False, {}


class _GymEnv:
    def __init__(self, raw_obs):
        self.raw_obs, self.applied = raw_obs, []

    def step(self, action):
        self.applied.append({k: np.asarray(v) for k, v in action.items()})
        return self.raw_obs, 0.0, False, False, {"success": False}


def serve(preset: str, params: dict, fail: bool = False):
    """vla-eval's serve_async around the stand-in, in a thread; its port."""
    server = StandInServer(preset, chunk_size=2, params=params, log=None, size=SIZE, fail=fail)
    found = threading.Event()
    port = []

    async def main():
        async with anyio.create_task_group() as tg:
            port.append(await tg.start(partial(serve_async, server, "127.0.0.1", 0)))
            found.set()

    threading.Thread(target=lambda: anyio.run(main), daemon=True).start()
    assert found.wait(10)
    return port[0]


def exchange(port: int, benchmark: str, episode_start: bytes, observation: bytes) -> dict:
    """The server's frames for: hello, an observation before any episode_start (an error), episode_start + an
    observation (an action)."""
    out = {}
    with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
        hello = Message(type=MessageType.HELLO, payload=make_hello_payload(benchmark=benchmark), seq=1,
                        timestamp=TIMESTAMP)
        ws.send(pack_message(hello))
        out["server_hello"] = ws.recv(timeout=10)
        ws.send(observation)  # seq 3, before any episode_start: the stand-in refuses it
        out["server_error"] = ws.recv(timeout=10)
        ws.send(episode_start)  # seq 2
        ws.send(observation)  # seq 3
        out["server_action"] = ws.recv(timeout=10)
    return out


def libero() -> dict:
    upright = {cam: RNG.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for cam in ("agentview", "wrist")}
    raw_obs = {
        # robosuite renders bottom-up: the raw frame is the upright one flipped vertically
        "agentview_image": np.ascontiguousarray(upright["agentview"][::-1]),
        "robot0_eye_in_hand_image": np.ascontiguousarray(upright["wrist"][::-1]),
        "robot0_eef_pos": np.array([-0.21, 0.03, 1.17]),
        "robot0_eef_quat": np.array([0.99, 0.05, 0.1, -0.08]),  # w < 0: vla-eval's default flips its sign
        "robot0_gripper_qpos": np.array([0.0389, -0.0391]),
    }
    task = {"name": "pick up the black bowl between the plate and the ramekin and place it on the plate",
            "suite": "libero_spatial", "task_id": 0}
    out = {"upright": {k: array(v) for k, v in upright.items()},
           "proprio": {k: array(v) for k, v in raw_obs.items() if k.startswith("robot0_eef") or "gripper" in k},
           "task": task}
    for name, no_antipodal in (("default", False), ("no_antipodal", True)):
        bench = LIBEROBenchmark(send_wrist_image=True, send_state=True, quat_no_antipodal=no_antipodal)
        bench._env = _LiberoEnv(raw_obs)
        obs = bench.make_obs(raw_obs, task)
        out[f"observation_png_{name}"] = packed(MessageType.OBSERVATION, obs, 3, "png")
        out[f"observation_raw_{name}"] = packed(MessageType.OBSERVATION, obs, 3, "raw")
    out["episode_start"] = packed(MessageType.EPISODE_START, {"task": task}, 2, "png")
    out.update(exchange(serve("libero", {"send_wrist_image": True, "send_state": True}), bench_name("libero"),
                        out["episode_start"], out["observation_png_default"]))
    # what LIBEROBenchmark.step applies for that reply
    bench = LIBEROBenchmark()
    bench._env, bench._recorder = _LiberoEnv(raw_obs), NullEpisodeRecorder()
    reply = msgpack.unpackb(out["server_action"], raw=False)["payload"]
    actions = np.frombuffer(reply["actions"]["data"], reply["actions"]["dtype"]).reshape(reply["actions"]["shape"])
    bench.step({"actions": actions})
    out["env_action"] = array(np.asarray(bench._env.applied[0], dtype=np.float64))
    return out


def robocasa365() -> dict:
    views = {k: RNG.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8) for k in
             ("video.robot0_agentview_left", "video.robot0_agentview_right", "video.robot0_eye_in_hand")}
    state = {"state.end_effector_position_relative": np.array([0.52, -0.07, 0.81]),
             "state.end_effector_rotation_relative": np.array([0.71, 0.02, -0.7, 0.05]),
             "state.gripper_qpos": np.array([0.021, -0.019]),
             "state.base_position": np.array([-0.6, 0.1, 0.0]),
             "state.base_rotation": np.array([0.0, 0.0, 0.38, 0.92])}
    # RoboCasa's gym wrapper: images flipped upright, every other value cast to float32
    raw_obs = {**views, **{k: v.astype(np.float32) for k, v in state.items()},
               "annotation.human.task_description": "open the drawer"}
    out = {"upright": {k: array(v) for k, v in views.items()}, "state": {k: array(v) for k, v in state.items()},
           "task": {"name": "OpenDrawer"}}
    obs = RoboCasa365Benchmark(camera_size=SIZE).make_obs(raw_obs, {"name": "OpenDrawer", "suite": "atomic_seen"})
    out["observation_png"] = packed(MessageType.OBSERVATION, obs, 3, "png")
    out["observation_raw"] = packed(MessageType.OBSERVATION, obs, 3, "raw")
    out["episode_start"] = packed(MessageType.EPISODE_START, {"task": out["task"]}, 2, "png")
    out.update(exchange(serve("robocasa365", {"camera_size": SIZE}), bench_name("robocasa365"),
                        out["episode_start"], out["observation_png"]))
    reply = msgpack.unpackb(out["server_action"], raw=False)["payload"]
    actions = np.frombuffer(reply["actions"]["data"], reply["actions"]["dtype"]).reshape(reply["actions"]["shape"])
    out["named_action"] = {k: array(np.asarray(v, dtype=np.float64)) for k, v in
                           decode_action({"actions": actions}).items()}
    return out


def bench_name(preset: str) -> str:
    return {"libero": "vla_eval.benchmarks.libero.benchmark:LIBEROBenchmark",
            "robocasa365": "vla_eval.benchmarks.robocasa365.benchmark:RoboCasa365Benchmark"}[preset]


def main() -> None:
    frames = {"meta": {"vla_eval": VLA_EVAL_VERSION, "pillow": PIL.__version__, "numpy": np.__version__,
                       "timestamp": TIMESTAMP, "size": SIZE},
              "libero": libero(), "robocasa365": robocasa365()}
    path = HERE / "frames.msgpack"
    path.write_bytes(msgpack.packb(frames, use_bin_type=True))
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
