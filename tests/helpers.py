"""Helpers shared by the tests: fresh interpreters and the CLI in a subprocess."""

import subprocess
import sys
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
