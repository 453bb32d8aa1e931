"""The ``lerobot`` policy: a small randomly initialised LeRobot checkpoint, saved and loaded through the adapter.

LeRobot needs its own venv (torch<2.11): ``make setup-lerobot test-lerobot``.
The checkpoints are real ``save_pretrained`` directories (config, weights,
pre/post-processors with normalisation statistics) of a tiny diffusion policy
(stochastic: DDPM noise from torch's global RNG, so it exercises the seeding)
and a tiny ACT policy, with the RoboCasa feature names at 128 x 128.
"""

import json

import numpy as np
import pytest
from helpers import paired_lift_rollouts

pytest.importorskip("lerobot", reason="lerobot is not installed in this venv; run `make setup-lerobot test-lerobot`")
import torch  # noqa: E402

from robocasa_shift.core.policy import Observation  # noqa: E402
from robocasa_shift.policies.lerobot import LeRobotPolicy, directory_digest  # noqa: E402
from robocasa_shift.seeding import rng_state_hash  # noqa: E402

SIZE = 128
CAMERAS = ("robot0_agentview_left", "robot0_eye_in_hand")


def make_checkpoint(root, policy_type):
    """Save a tiny random LeRobot policy with its processors under ``root``; return the directory."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    inputs = {f"observation.images.{c}": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)) for c in CAMERAS}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (16,))
    outputs = {"action": PolicyFeature(FeatureType.ACTION, (12,))}
    common = dict(input_features=inputs, output_features=outputs, device="cpu", pretrained_backbone_weights=None)
    if policy_type == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        config = DiffusionConfig(**common, n_obs_steps=2, horizon=8, n_action_steps=4, down_dims=(32, 64),
                                 kernel_size=3, n_groups=4, diffusion_step_embed_dim=16,
                                 spatial_softmax_num_keypoints=8, num_inference_steps=3)
    else:
        from lerobot.policies.act.configuration_act import ACTConfig

        config = ACTConfig(**common, chunk_size=10, n_action_steps=5, dim_model=32, n_heads=2,
                           dim_feedforward=64, n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    stats = {
        "observation.state": {"mean": torch.zeros(16), "std": torch.full((16,), 0.5),
                              "min": -torch.ones(16), "max": torch.ones(16)},
        "action": {"mean": torch.zeros(12), "std": torch.full((12,), 0.3),
                   "min": -torch.ones(12), "max": torch.ones(12)},
    }
    for camera in CAMERAS:
        stats[f"observation.images.{camera}"] = {"mean": torch.full((3, 1, 1), 0.45), "std": torch.full((3, 1, 1), 0.25),
                                                 "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # fixed weights; the global RNG is restored afterwards
        policy = get_policy_class(policy_type)(config)
    directory = root / policy_type
    policy.save_pretrained(directory)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    preprocessor.save_pretrained(directory)
    postprocessor.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot")
    return {t: make_checkpoint(root, t) for t in ("diffusion", "act")}


def make_obs(seed=3, instruction="lift the red cube"):
    rng = np.random.default_rng(seed)
    images = {"robot0_robotview": rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8),
              "robot0_eye_in_hand": rng.integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)}
    proprio = {
        "robot0_base_pos": np.array([-0.6, 0.0, 0.0]),
        "robot0_base_quat": np.array([0.0, 0.0, 0.0, 1.0]),
        "robot0_base_to_eef_pos": np.array([0.45, -0.02, 0.31]),
        "robot0_base_to_eef_quat": np.array([1.0, 0.0, 0.0, 0.0]),
        "robot0_gripper_qpos": np.array([0.02, -0.02]),
    }
    roles = {"robot0_robotview": "third_person", "robot0_eye_in_hand": "wrist"}
    return Observation(images, roles, proprio, instruction, 0, task="Lift")


def torch_fingerprint(seed):
    return rng_state_hash(torch.Generator().manual_seed(seed % 2**63).get_state().numpy())


def test_a_saved_checkpoint_loads_with_its_processors(checkpoints):
    directory = checkpoints["diffusion"]
    assert {"config.json", "model.safetensors", "policy_preprocessor.json", "policy_postprocessor.json"} <= {
        p.name for p in directory.iterdir()}
    assert json.loads((directory / "config.json").read_text())["type"] == "diffusion"
    policy = LeRobotPolicy(directory)
    assert policy.image_size == SIZE and policy.uses_state and policy.mode == "step"
    identity = policy.identity()
    assert identity["policy_type"] == "diffusion" and identity["checkpoint_sha256"] == directory_digest(directory)
    assert identity["image_keys"] == [f"observation.images.{c}" for c in CAMERAS]
    assert identity["action_layout"] == "robocasa-lerobot" and identity["lerobot_version"] == "0.4.4"
    batch = policy.batch(make_obs())
    assert batch["observation.images.robot0_agentview_left"].shape == (1, 3, SIZE, SIZE)
    assert batch["observation.images.robot0_agentview_left"].dtype == torch.float32
    assert float(batch["observation.images.robot0_agentview_left"].max()) <= 1.0
    assert torch.allclose(batch["observation.state"][0, :7], torch.tensor([-0.6, 0, 0, 0, 0, 0, 1.0]))
    assert batch["task"] == ["lift the red cube"]


def test_one_seed_gives_one_action_sequence_and_the_global_rng_is_untouched(checkpoints):
    a, b = LeRobotPolicy(checkpoints["diffusion"]), LeRobotPolicy(checkpoints["diffusion"])
    assert a.rng_fingerprint() == "not-reset"
    with pytest.raises(RuntimeError, match="never reset"):
        a.act(make_obs())
    a.reset(7)
    b.reset(7)
    assert a.rng_fingerprint() == b.rng_fingerprint() == torch_fingerprint(7)
    obs = [make_obs(seed) for seed in range(6)]
    global_state = torch.get_rng_state()
    first = np.vstack([a.act(o) for o in obs])
    assert torch.equal(torch.get_rng_state(), global_state)  # nothing leaked into the caller's RNG
    assert first.shape == (6, 12) and np.all(np.isin(first[:, [10, 11]], [-1.0, 1.0]))
    torch.manual_seed(12345)  # the caller's global RNG changes nothing
    second = np.vstack([b.act(o) for o in obs])
    assert np.array_equal(first, second)
    assert a.rng_fingerprint() == b.rng_fingerprint() != torch_fingerprint(7)  # the noise was drawn from it
    assert not np.array_equal(first[0], first[4])  # a new chunk after n_action_steps=4 with new noise
    a.reset(8)
    assert not np.array_equal(np.vstack([a.act(o) for o in obs]), first)
    a.reset(7)
    assert np.array_equal(np.vstack([a.act(o) for o in obs]), first)  # reset also clears the queues


def test_chunk_mode_returns_what_select_action_would_play(checkpoints):
    step = LeRobotPolicy(checkpoints["act"], mode="step")
    chunk = LeRobotPolicy(checkpoints["act"], mode="chunk")
    assert chunk.n_action_steps == 5
    step.reset(1)
    chunk.reset(1)
    obs = make_obs()
    played = np.vstack([step.act(obs) for _ in range(5)])
    got = chunk.act(obs)
    assert got.shape == (5, 12) and np.allclose(got, played, atol=1e-6)
    assert LeRobotPolicy(checkpoints["act"], mode="chunk", n_action_steps=3).n_action_steps == 3
    with pytest.raises(ValueError, match="observation history"):
        LeRobotPolicy(checkpoints["diffusion"], mode="chunk")


def test_clear_errors_for_checkpoints_and_observations_that_do_not_fit(checkpoints, tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        LeRobotPolicy(tmp_path)
    old = tmp_path / "old"
    old.mkdir()
    for name in ("config.json", "model.safetensors"):
        (old / name).write_bytes((checkpoints["act"] / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="migrate_policy_normalization"):
        LeRobotPolicy(old)
    with pytest.raises(ValueError, match=r"observation.state has shape \(16,\), state_layout gives \(2,\)"):
        LeRobotPolicy(checkpoints["act"], state_layout=[["robot0_gripper_qpos", 2]])
    policy = LeRobotPolicy(checkpoints["act"], camera_map={"robot0_robotview": "robot0_agentview_right"})
    policy.reset(0)
    with pytest.raises(KeyError, match=r"reads cameras \['robot0_agentview_left'\]"):
        policy.act(make_obs())


@pytest.mark.sim
def test_paired_rollouts_through_the_lerobot_policy(checkpoints, lift_env, protocol):
    policy = LeRobotPolicy(checkpoints["diffusion"])
    runs = paired_lift_rollouts(lift_env, policy, protocol, horizon=12)
    clean = runs["clean"][0]
    assert clean.steps == 12 and clean.policy_calls == 12  # select_action at every step
    assert clean.policy_rng_fingerprint == torch_fingerprint(clean.policy_seed)