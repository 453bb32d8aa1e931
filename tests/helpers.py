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
