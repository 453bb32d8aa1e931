"""A real vla-eval model server around a stand-in model, for the tests of the ``vla-eval`` policy.

Runs in ``.venv-vlaeval`` (``make setup-vlaeval``: vla-eval 0.8.0 from PyPI, no torch), never in the
harness's environments::

    .venv-vlaeval/bin/python tests/vlaeval_server.py --preset libero --port 0 --log server.jsonl

It prints ``PORT <n>`` once vla-eval's ``serve_async`` listens on 127.0.0.1. The server is vla-eval's own
(``PredictModelServer`` with server-side chunking, ``serve_async``: hello, observation_params, specs,
``/health``); only ``predict`` is a stand-in: a deterministic function of the observation (the first image's
brightness, the state, the session's step), so a perturbation that changes the image changes the actions.

Before answering, ``predict`` checks what arrived against vla-eval's own benchmark conventions (keys and
their order, shapes, dtypes, an ``episode_start`` before the first observation of each episode) and fails
the request otherwise, which the client records as a ``policy_server`` error. Every episode start and every
observation is logged as a JSON line to ``--log``.
"""

from __future__ import annotations

import argparse
import json
import threading
from functools import partial

import anyio
import numpy as np
from vla_eval.model_servers.predict import PredictModelServer
from vla_eval.model_servers.serve import serve_async
from vla_eval.specs import (
    BASE_MOTION,
    CONTROL_MODE_01,
    GRIPPER_CLOSE_01,
    GRIPPER_CLOSE_POS,
    IMAGE_RGB,
    LANGUAGE,
    POSITION_DELTA,
    RAW,
    ROTATION_AA,
    STATE_EEF_POS_AA_GRIP,
)

VIDEO_KEYS = ("video.robot0_agentview_left", "video.robot0_agentview_right", "video.robot0_eye_in_hand")
STATE_DIMS = {"state.end_effector_position_relative": 3, "state.end_effector_rotation_relative": 4,
              "state.gripper_qpos": 2, "state.base_position": 3, "state.base_rotation": 4}
DEFAULT_PARAMS = {"libero": {"send_wrist_image": True, "send_state": True}, "robocasa365": {}}


class StandInServer(PredictModelServer):
    """vla-eval's PredictModelServer with a deterministic stand-in ``predict``."""

    def __init__(self, preset: str, chunk_size: int, params: dict, log: str | None, size: int, fail: bool):
        super().__init__(chunk_size=chunk_size)
        self.preset, self.params, self.size, self.fail = preset, params, size, fail
        self._log = open(log, "a") if log else None
        self._lock = threading.Lock()

    def log(self, **event) -> None:
        if self._log is not None:
            with self._lock:
                self._log.write(json.dumps(event) + "\n")
                self._log.flush()

    def get_observation_params(self):
        return dict(self.params)

    def get_action_spec(self):
        if self.preset == "libero":
            return {"position": POSITION_DELTA, "rotation": ROTATION_AA, "gripper": GRIPPER_CLOSE_POS}
        return {"position": POSITION_DELTA, "rotation": ROTATION_AA, "gripper": GRIPPER_CLOSE_01,
                "base_motion": BASE_MOTION, "control_mode": CONTROL_MODE_01}

    def get_observation_spec(self):
        if self.preset == "libero":
            spec = {"agentview": IMAGE_RGB, "language": LANGUAGE}
            if self.params.get("send_wrist_image"):
                spec["wrist"] = IMAGE_RGB
            if self.params.get("send_state"):
                spec["state"] = STATE_EEF_POS_AA_GRIP
            return spec
        return {"image": IMAGE_RGB, "state": RAW, "language": LANGUAGE}

    async def on_episode_start(self, config, ctx):
        self.log(event="episode_start", session=ctx.session_id, episode=ctx.episode_id, payload=config)
        await super().on_episode_start(config, ctx)

    def check(self, obs, ctx) -> None:
        """vla-eval's conventions for the preset's benchmark (``make_obs``)."""
        assert ctx.episode_id, "an observation before any episode_start"
        assert isinstance(obs.get("task_description"), str) and obs["task_description"], "no task_description"
        images = obs["images"]
        if self.preset == "libero":
            want = ["agentview"] + (["wrist"] if self.params.get("send_wrist_image") else [])
            keys = ["images", "task_description"] + (["states"] if self.params.get("send_state") else [])
            # vla-eval's LIBERO adds controller_states (the controller's pose, X-VLA's input) beside states
            sent = [k for k in obs if k != "controller_states"]
            assert sent == keys, f"observation keys {list(obs)}, vla-eval's LIBERO sends {keys}"
            if self.params.get("send_state"):
                state = obs["states"]
                assert state.dtype == np.float64 and state.shape == (8,), f"states {state.dtype} {state.shape}"
        else:
            want = list(VIDEO_KEYS)
            assert list(obs) == ["images", "state", "task_description"], f"observation keys {list(obs)}"
            assert list(obs["state"]) == list(STATE_DIMS), f"state keys {list(obs['state'])}"
            for key, dims in STATE_DIMS.items():
                value = obs["state"][key]
                assert value.dtype == np.float32 and value.shape == (dims,), f"{key}: {value.dtype} {value.shape}"
        assert list(images) == want, f"image keys {list(images)}, expected {want}"
        for key, image in images.items():
            assert image.dtype == np.uint8 and image.shape == (self.size, self.size, 3), f"{key}: {image.shape}"

    async def on_observation(self, obs, ctx):
        """Every observation is checked and logged, also those the server answers from its chunk buffer."""
        self.check(obs, ctx)
        if self.fail:
            raise RuntimeError("stand-in model failure")
        self.log(event="observation", session=ctx.session_id, episode=ctx.episode_id, step=ctx.step,
                 images=list(obs["images"]), task_description=obs["task_description"])
        await super().on_observation(obs, ctx)

    def predict(self, obs, ctx):
        first = np.asarray(next(iter(obs["images"].values())), dtype=np.float64)
        brightness = float(first.mean() / 255.0)
        chunk = []
        for i in range(self.chunk_size):
            t = ctx.step + i
            if self.preset == "libero":
                # gripper raw output +-0.4: LIBERO's benchmark closes on >= 0, opens below
                grip = 0.4 if (t // 30) % 2 else -0.4
                chunk.append([0.6 * (brightness - 0.35), 0.2 * np.sin(0.1 * t), -0.25, 0.0, 0.0, 0.05, grip])
            else:
                # RoboCasa365 order: eef pos 3, eef rot 3, gripper_close 1 (0/1), base_motion 4, control_mode 1
                grip = 0.7 if (t // 40) % 2 else 0.2
                chunk.append([0.6 * (brightness - 0.35), 0.1 * np.sin(0.1 * t), -0.2, 0.0, 0.0, 0.05, grip,
                              0.0, 0.0, 0.0, 0.0, 0.2])
        return {"actions": np.asarray(chunk, dtype=np.float32)}


async def _main(args) -> None:
    params = json.loads(args.params) if args.params else DEFAULT_PARAMS[args.preset]
    server = StandInServer(args.preset, args.chunk_size, params, args.log, args.size, args.fail)
    async with anyio.create_task_group() as tg:
        port = await tg.start(partial(serve_async, server, args.host, args.port))
        print(f"PORT {port}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(DEFAULT_PARAMS), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--chunk-size", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="the image size the benchmark sends")
    parser.add_argument("--params", default=None, help="observation_params as JSON [default: the preset's]")
    parser.add_argument("--log", default=None, help="append a JSON line per episode start and observation")
    parser.add_argument("--fail", action="store_true", help="fail every observation (after checking it)")
    anyio.run(_main, parser.parse_args())


if __name__ == "__main__":
    main()
