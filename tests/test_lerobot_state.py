"""Branching and sampling LeRobot checkpoints: state snapshots, samples, a branch study and logged samples.

Needs LeRobot (its own venv: ``make setup-lerobot test-lerobot``; it is kept out of CI for its size). The
checkpoints are tiny, randomly initialised ACT and diffusion policies the tests save themselves with
``save_pretrained`` and their processors: with RoboCasa's features (``test_lerobot.make_checkpoint``) for the
state round trips, and with the fake world's (a 32 x 32 ``agentview`` image, a 3-D state, 3-D planar
actions) for the study on the fake backend.
"""

import json

import numpy as np
import pytest
from helpers import cli
from test_policy_state import SEED, assert_portable, assert_states_equal, through_npz

pytest.importorskip("lerobot", reason="lerobot is not installed in this venv; run `make setup-lerobot test-lerobot`")
import torch  # noqa: E402
from test_lerobot import CAMERAS, SIZE, make_checkpoint, make_obs  # noqa: E402

from robocasa_shift.core.policy import state_support  # noqa: E402
from robocasa_shift.errors import StateUnsupported  # noqa: E402
from robocasa_shift.policies.lerobot import LeRobotPolicy  # noqa: E402

FAKE_OPTIONS = {"camera_map": {"agentview": ["agentview"]}, "state_layout": [["eef_pos", 2], ["grasping", 1]],
                "action_layout": "fake-planar"}


def make_ensembling_checkpoint(root):
    """A tiny ACT with temporal ensembling (a chunk every step, averaged with the previous ones)."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    inputs = {f"observation.images.{c}": PolicyFeature(FeatureType.VISUAL, (3, SIZE, SIZE)) for c in CAMERAS}
    inputs["observation.state"] = PolicyFeature(FeatureType.STATE, (16,))
    config = ACTConfig(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (12,))},
                       device="cpu", pretrained_backbone_weights=None, chunk_size=6, n_action_steps=1,
                       temporal_ensemble_coeff=0.01, dim_model=32, n_heads=2, dim_feedforward=64,
                       n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    stats = {"observation.state": {"mean": torch.zeros(16), "std": torch.full((16,), 0.5)},
             "action": {"mean": torch.zeros(12), "std": torch.full((12,), 0.3)}}
    for camera in CAMERAS:
        stats[f"observation.images.{camera}"] = {"mean": torch.full((3, 1, 1), 0.45), "std": torch.full((3, 1, 1), 0.25)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = get_policy_class("act")(config)
    directory = root / "act-ensemble"
    policy.save_pretrained(directory)
    for processor in make_pre_post_processors(config, dataset_stats=stats):
        processor.save_pretrained(directory)
    return directory


def make_fake_world_checkpoint(root, policy_type, size=32):
    """A tiny policy with the fake backend's features: ``agentview`` image, (eef x, y, grasping), planar actions."""
    from lerobot.configs.types import FeatureType, PolicyFeature
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    inputs = {"observation.images.agentview": PolicyFeature(FeatureType.VISUAL, (3, size, size)),
              "observation.state": PolicyFeature(FeatureType.STATE, (3,))}
    common = dict(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (3,))},
                  device="cpu", pretrained_backbone_weights=None)
    if policy_type == "diffusion":
        from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig

        config = DiffusionConfig(**common, n_obs_steps=2, horizon=8, n_action_steps=4, down_dims=(16, 32),
                                 kernel_size=3, n_groups=4, diffusion_step_embed_dim=8, crop_shape=None,
                                 spatial_softmax_num_keypoints=4, num_inference_steps=2)
    else:
        from lerobot.policies.act.configuration_act import ACTConfig

        config = ACTConfig(**common, chunk_size=8, n_action_steps=4, dim_model=16, n_heads=2, dim_feedforward=32,
                           n_encoder_layers=1, n_decoder_layers=1, use_vae=False)
    stats = {"observation.state": {"mean": torch.zeros(3), "std": torch.full((3,), 0.5), "min": -torch.ones(3),
                                   "max": torch.ones(3)},
             "action": {"mean": torch.zeros(3), "std": torch.ones(3), "min": -torch.ones(3), "max": torch.ones(3)},
             "observation.images.agentview": {"mean": torch.full((3, 1, 1), 0.45), "std": torch.full((3, 1, 1), 0.25),
                                              "min": torch.zeros(3, 1, 1), "max": torch.ones(3, 1, 1)}}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        policy = get_policy_class(policy_type)(config)
    directory = root / f"fake-{policy_type}"
    policy.save_pretrained(directory)
    for processor in make_pre_post_processors(config, dataset_stats=stats):
        processor.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("lerobot-state")
    made = {t: make_checkpoint(root, t) for t in ("diffusion", "act")}
    made["act-ensemble"] = make_ensembling_checkpoint(root)
    return made


def observations(n):
    return [make_obs(seed) for seed in range(n)]


# --------------------------------------------------------------------------- state


@pytest.mark.parametrize("kind, at", [("diffusion", 5), ("act", 3), ("act-ensemble", 4)])
def test_a_restored_policy_reproduces_the_trunks_actions_bit_for_bit_mid_queue(checkpoints, kind, at):
    obs = observations(12)
    original = LeRobotPolicy(checkpoints[kind])
    assert state_support(original) is None
    original.reset(SEED)
    for o in obs[:at]:
        original.act(o)
    state = original.get_state()
    assert_portable(state)
    loaded = through_npz(state)
    expected = [original.act(o) for o in obs[at:]]
    restored = LeRobotPolicy(checkpoints[kind])
    restored.reset(SEED)
    restored.set_state(loaded)
    assert_states_equal(restored.get_state(), state)
    got = [restored.act(o) for o in obs[at:]]
    assert all(np.array_equal(e, g) for e, g in zip(expected, got))
    plain = LeRobotPolicy(checkpoints[kind])  # a reset alone does not continue: the queues and generator matter
    plain.reset(SEED)
    assert not all(np.array_equal(e, plain.act(o)) for e, o in zip(expected, obs[at:]))
    if kind == "diffusion":  # mid-chunk: a planned action queued, two observations of history
        assert int(state["queues._queues[action].len"]) == 3 and int(state["queues._queues[observation.state].len"]) == 2
    if kind == "act":
        assert int(state["queue._action_queue.len"]) == 2 and "rng.cpu" in state
    if kind == "act-ensemble":
        assert state["ensembler.ensembled_actions"].shape == (1, 5, 12)
        assert state["ensembler.ensembled_actions_count"].dtype == np.int64


def test_sampling_leaves_the_state_byte_for_byte_and_draws_from_the_callers_rng(checkpoints):
    obs = observations(4)
    for kind in ("diffusion", "act"):
        policy, twin = LeRobotPolicy(checkpoints[kind]), LeRobotPolicy(checkpoints[kind])
        for p in (policy, twin):
            p.reset(SEED)
            p.act(obs[0])
        before = policy.get_state()
        global_rng = torch.get_rng_state()
        draws = policy.sample_actions(obs[1], 6, np.random.default_rng(3))
        assert torch.equal(torch.get_rng_state(), global_rng)
        assert_states_equal(policy.get_state(), before)
        assert draws.shape == (6, 12)
        assert np.array_equal(draws, policy.sample_actions(obs[1], 6, np.random.default_rng(3)))
        other = policy.sample_actions(obs[1], 6, np.random.default_rng(4))
        spread = draws[:, :10].std(axis=0).max()
        if kind == "diffusion":  # DDPM noise from the given generator: the draws disagree
            assert spread > 0 and not np.array_equal(draws, other)
        else:  # ACT without its VAE at inference: deterministic, the draws agree
            assert spread == 0 and np.array_equal(draws, other)
        assert np.array_equal(policy.act(obs[1]), twin.act(obs[1]))  # the rollout goes on as if nothing was drawn


def test_a_policy_class_with_episode_state_the_adapter_cannot_read_is_refused_naming_it(checkpoints, monkeypatch):
    from lerobot.policies.act.modeling_act import ACTPolicy

    original_reset = ACTPolicy.reset

    def reset(self):
        original_reset(self)
        self._mystery_memory = []

    monkeypatch.setattr(ACTPolicy, "reset", reset)
    policy = LeRobotPolicy(checkpoints["act"])
    why = state_support(policy)
    assert "'_mystery_memory'" in why and "cannot be branched" in why
    policy.reset(0)
    with pytest.raises(StateUnsupported, match="_mystery_memory"):
        policy.get_state()
    assert policy.sample_actions(make_obs(), 2, np.random.default_rng(0)) is None


# --------------------------------------------------------------------------- a branch study, logged samples


def option_args(options):
    return [a for k, v in options.items() for a in ("--policy-option", f"{k}={json.dumps(v)}")]


@pytest.mark.parametrize("kind, stride", [("act", 1), ("diffusion", 10)])
def test_a_branch_study_of_a_lerobot_checkpoint_reproduces_its_trunk_and_audits(tmp_path, kind, stride):
    checkpoint = make_fake_world_checkpoint(tmp_path, kind)
    run_dir = tmp_path / "run"
    options = {**FAKE_OPTIONS, "checkpoint": str(checkpoint), **({"mode": "chunk"} if kind == "act" else {})}
    cli("run", "--backend", "fake", "--policy", "lerobot", *option_args(options), "--task", "Reach", "--condition",
        "clean,blur:L3", "--episodes", "0", "--workers", "1", "--threads", "1", "--no-progress", "--run-dir", str(run_dir))
    out = cli("branch", str(run_dir), "--max-trunks", "1", "--stride", str(stride), "--intervention", "continue",
              "--k", "1", "--k-expanded", "1", "--workers", "1", "--threads", "1", "--no-progress",
              "--policy-option", f"checkpoint={checkpoint}")
    assert "1 trunks (1 reproduced)" in out.stdout
    bdir = run_dir / "branching" / "default"
    summary = json.loads((bdir / "summary.json").read_text())
    checkpoints = list((bdir / "checkpoints").rglob("s*.json"))
    assert summary["fidelity"]["ok"] == summary["fidelity"]["checked"] == len(checkpoints) >= 4
    assert cli("audit", str(run_dir)).returncode == 0
    assert json.loads((run_dir / "audit.json").read_text())["branching"]["default"]["passed"]


def test_logged_samples_of_a_diffusion_checkpoint_give_the_sampling_disagreement_monitor_its_scores(tmp_path):
    from robocasa_shift.monitoring.monitors import score
    from robocasa_shift.rundir.store import RunStore

    checkpoint = make_fake_world_checkpoint(tmp_path, "diffusion")
    run_dir = tmp_path / "run"
    cli("run", "--backend", "fake", "--policy", "lerobot", *option_args({**FAKE_OPTIONS, "checkpoint": str(checkpoint)}),
        "--task", "Reach", "--condition", "clean", "--episodes", "0", "--workers", "1", "--threads", "1", "--log-steps", "--no-progress",
        "--run-dir", str(run_dir))
    store = RunStore(run_dir)
    (record,) = store.records()
    log = store.step_log(record)
    assert log.samples is not None and log.samples.shape == (len(log.boundary), 8, 2)  # 8 draws of the planar arm
    disagreement = score("sampling_disagreement", log)
    assert len(disagreement) == len(log.boundary) == record["steps"]  # step mode: every step is a decision
    assert np.all(np.isfinite(disagreement)) and np.all(disagreement > 0)


# --------------------------------------------------------------------------- a checkpoint trained here


def test_train_lerobot_makes_a_checkpoint_from_expert_demos_that_the_lerobot_policy_runs(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.policy import Observation
    from robocasa_shift.training.lerobot import DEMO_STREAM, LeRobotTrainConfig, render_demos

    out = tmp_path / "trained"
    small = ["--model-option", "down_dims=[16, 32]", "--model-option", "num_inference_steps=2"]
    cli("train-lerobot", "--out", str(out), "--episodes", "3", "--epochs", "8", "--batch-size", "8", *small,
        "--no-progress")
    manifest = json.loads((out / "train_manifest.json").read_text())
    data = manifest["data"]
    assert data["episodes_kept"] == [0, 1, 2] and data["seed_stream"] == DEMO_STREAM
    assert data["demo_policy"] == "fake-expert" and data["preset"] == "fake"
    assert data["frames"] > 10 and data["cameras"] == {"agentview": ["agentview"]}
    losses = manifest["loss"]["per_epoch"]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert manifest["versions"]["lerobot"] and manifest["policy_config"]["type"] == "diffusion"

    # what the trainer fed the model is what the adapter sends for the same scene
    demos, _ = render_demos(LeRobotTrainConfig(episodes=1))
    env = get_backend("fake").make("Reach")
    env.reset(demos.episodes[0]["seed"])
    policy = LeRobotPolicy(out, preset="fake")
    obs = Observation({c: env.render(c, policy.image_size) for c in ("agentview", "eye_in_hand")},
                      {"agentview": "third_person", "eye_in_hand": "wrist"}, env.proprio(), env.task.instruction, 0,
                      task="Reach", action_layout=env.action_layout)
    sent = policy.batch(obs)
    assert torch.equal(sent["observation.images.agentview"][0],
                       torch.from_numpy(demos.pixels["agentview"][0]).permute(2, 0, 1).float() / 255)
    assert torch.equal(sent["observation.state"][0], torch.from_numpy(demos.state[0]))

    run_dir = tmp_path / "run"
    cli("run", "--backend", "fake", "--policy", "lerobot", "--policy-option", f"checkpoint={out}", "--policy-option",
        "preset=fake", "--task", "Reach", "--condition", "clean", "--episodes", "0", "--workers", "1", "--threads", "1",
        "--no-progress", "--run-dir", str(run_dir))
    (record,) = [json.loads(p.read_text()) for p in (run_dir / "records").rglob("*.json")]
    assert record["valid"] and record["steps"] > 0 and record["policy"] == "lerobot"
