"""The reference policy: weights integrity, seeded randomness, blind ablation, reproducible training."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from robocasa_shift.policies import make_policy  # noqa: E402
from robocasa_shift.policies.reference.nets import state_hash  # noqa: E402
from robocasa_shift.policies.reference.weights import MANIFEST, WEIGHTS_DIR  # noqa: E402
from robocasa_shift.seeding import rng_state_hash  # noqa: E402


def test_weights_match_their_content_hashes_and_stay_small():
    manifest = json.loads((WEIGHTS_DIR / MANIFEST).read_text())
    total = 0
    for key, net in manifest["nets"].items():
        path = WEIGHTS_DIR / net["file"]
        total += path.stat().st_size
        assert state_hash(torch.load(path)) == net["sha256"], key
    assert total <= 5 * 2**20
    policy = make_policy("reference")
    assert policy.identity()["weights_sha256"] == manifest["weights_sha256"]
    assert not policy.privileged


def test_rng_fingerprint_is_read_back_from_the_seeded_generator():
    policy = make_policy("reference")
    policy.reset(123)
    expected = rng_state_hash(torch.Generator().manual_seed(123).get_state().numpy())
    assert policy.rng_fingerprint() == expected
    policy.reset(124)
    assert policy.rng_fingerprint() != expected


def test_the_task_comes_from_the_observation_and_an_unknown_one_names_the_trained_tasks():
    from robocasa_shift.core.policy import Observation

    policy = make_policy("reference")
    # the instruction of Lift does not make it Lift: only obs.task names the task
    obs = Observation({}, {}, {}, "lift the red cube", 0, task="OpenDrawer")
    with pytest.raises(ValueError, match="no networks for task 'OpenDrawer'; it has networks for: "
                                         "Lift, NutAssemblySquare, PickPlaceCan, Stack"):
        policy.act(obs)


@pytest.fixture(scope="module")
def lift_obs():
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.policy import Observation

    env = get_backend("robosuite").make("Lift")
    env.reset(5)
    images = {c: env.render(c, 128) for c in ("robot0_robotview", "robot0_eye_in_hand")}
    obs = Observation(images, {"robot0_robotview": "third_person", "robot0_eye_in_hand": "wrist"}, env.proprio(),
                      env.task.instruction, 0, task="Lift")
    env.close()
    return obs


@pytest.mark.sim
def test_actions_depend_on_the_reset_seed_only_never_on_global_rngs(lift_obs):
    policy = make_policy("reference")
    chunks = []
    for global_seed in (0, 99):
        torch.manual_seed(global_seed)
        np.random.seed(global_seed)
        policy.reset(7)
        chunks.append(np.concatenate([policy.act(lift_obs) for _ in range(3)]))
    np.testing.assert_array_equal(chunks[0], chunks[1])
    policy.reset(8)
    assert not np.array_equal(np.concatenate([policy.act(lift_obs) for _ in range(3)]), chunks[0])
    assert chunks[0].shape == (3 * policy.chunk, 12)


@pytest.mark.sim
def test_blind_ablation_sees_blank_images(lift_obs):
    sighted, blind = make_policy("reference"), make_policy("reference", blind=True)
    sighted.reset(1)
    blind.reset(1)
    sighted.act(lift_obs)
    blind.act(lift_obs)
    assert blind.identity()["blind"] is True
    assert not np.allclose(sighted._estimates["third.cube"], blind._estimates["third.cube"])


@pytest.mark.sim
def test_training_is_bit_reproducible(tmp_path):
    from robocasa_shift.training.reference import TrainConfig, array_hash, train_net
    from robocasa_shift.training.reference_data import generate

    a = np.load(generate("Lift", tmp_path / "a.npz", frames=80, progress=False))
    b = np.load(generate("Lift", tmp_path / "b.npz", frames=80, progress=False))
    assert array_hash(a["wrist"], a["wrist_y"]) == array_hash(b["wrist"], b["wrist_y"])
    config = TrainConfig(epochs=1, batch=8)
    first = train_net(a["wrist"], a["wrist_y"], a["episode"], config)
    second = train_net(b["wrist"], b["wrist_y"], b["episode"], config)
    assert state_hash(first["state"]) == state_hash(second["state"])
    assert first["val_mean_error_mm"] == second["val_mean_error_mm"]


@pytest.mark.sim
def test_on_policy_round_renders_what_the_policy_sees_reproducibly(tmp_path):
    from robocasa_shift.policies.reference.weights import WEIGHTS_DIR
    from robocasa_shift.training.reference import load_training_set
    from robocasa_shift.training.reference_data import generate_on_policy

    a = np.load(generate_on_policy("Lift", tmp_path / "a.npz", WEIGHTS_DIR, frames=30, progress=False))
    b = np.load(generate_on_policy("Lift", tmp_path / "b.npz", WEIGHTS_DIR, frames=30, progress=False))
    for key in ("third", "wrist", "third_y", "wrist_y", "episode"):
        np.testing.assert_array_equal(a[key], b[key])
    assert a["wrist"].shape == (30, 96, 96, 3) and a["wrist_y"].shape == (30, 3)
    # the policy closes in on the cube: its wrist labels (cube relative to the gripper) shrink
    first = np.flatnonzero(a["episode"] == 0)
    assert np.linalg.norm(a["wrist_y"][first[-1]]) < np.linalg.norm(a["wrist_y"][first[0]])
    # expert and on-policy files concatenate with their episodes kept apart
    images, targets, episodes = load_training_set([str(tmp_path / "a.npz"), str(tmp_path / "b.npz")], "wrist")
    assert len(images) == 60 and len(np.unique(episodes)) == 2 * len(np.unique(a["episode"]))


@pytest.mark.sim
def test_reference_lifts_the_cube_from_images(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.specs import load_protocol, load_stage_spec
    from robocasa_shift.engine.rollout import run_rollout

    env = get_backend("robosuite").make("Lift")
    rec = run_rollout(env, make_policy("reference"), RolloutKey("formal", "Lift", 0, "clean"), load_protocol(),
                      load_stage_spec("robosuite", "Lift"), "robosuite")
    env.close()
    assert rec.valid and rec.success and rec.frames_rendered == 2 * rec.policy_calls
    assert rec.policy_calls == -(-rec.steps // 4)  # one observation per chunk of 4 steps
