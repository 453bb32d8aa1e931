"""The testing backend (backends/fake.py) keeps the promises a simulator backend makes to the harness.

The bookkeeping tests (store, resume, shards, merge, retry, audit, report,
compare, executors) run on it, so it must be exact: same seed, same state in
any process; every perturbation read back within tolerance and undone by the
next reset; images that depend on what the perturbations change.
"""

import json

import numpy as np
import pytest
from helpers import cli, run_python

from robocasa_shift.backends import get_backend
from robocasa_shift.backends.fake import HORIZON
from robocasa_shift.core import specs
from robocasa_shift.core.factors import READBACK_ATOL, factor_kind
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import inject, prepare_episode, run_rollout
from robocasa_shift.policies import make_policy
from robocasa_shift.policies.scripted.fake import FakePolicy


@pytest.fixture(scope="module")
def reach():
    env = get_backend("fake").make("Reach")
    yield env
    env.close()


def rollout(env, policy, protocol, episode, condition, task="Reach"):
    record = run_rollout(env, policy, RolloutKey("formal", task, episode, condition), protocol,
                         specs.load_stage_spec("fake", task), "fake")
    assert record.valid, record.error
    return record


def test_same_seed_gives_the_same_state_and_fingerprint_in_any_process_and_order(reach):
    code = (
        "from robocasa_shift.backends import get_backend\n"
        "env = get_backend('fake').make('Reach')\n"
        "for seed in (7, 3, 7):\n"
        "    env.reset(seed); print(env.fingerprint(), env.get_state()['integration'].tobytes().hex())\n"
    )
    lines = run_python(code).split("\n")
    assert lines[0] == lines[2] != lines[1]
    reach.reset(3)
    reach.step(np.array([1.0, -1.0, 1.0]))  # another episode and a step in between change nothing
    reach.reset(7)
    fingerprint, state = lines[0].split()
    assert reach.fingerprint() == fingerprint and reach.get_state()["integration"].tobytes().hex() == state


def test_every_condition_reads_back_within_tolerance_and_the_next_reset_undoes_it(reach, protocol):
    clean = prepare_episode(reach, protocol, RolloutKey("formal", "Reach", 0, "clean"))
    for condition in protocol.conditions[1:]:
        key = RolloutKey("formal", "Reach", 0, condition)
        assert prepare_episode(reach, protocol, key) == clean, condition
        applied = inject(reach, protocol, key)
        assert applied["ok"] and applied["max_abs_error"] <= READBACK_ATOL, (condition, applied["max_abs_error"])
        if factor_kind(protocol.factor(applied["factor"])).side == "env":
            assert reach.fingerprint() != clean, f"{condition} is not in the fingerprint"
    assert prepare_episode(reach, protocol, RolloutKey("formal", "Reach", 0, "clean")) == clean


def test_illumination_camera_and_base_change_the_images_and_blur_transforms_them(reach, protocol):
    def images(condition):
        key = RolloutKey("formal", "Reach", 2, condition)
        prepare_episode(reach, protocol, key)
        inject(reach, protocol, key)
        return {c: reach.render(c, 64).astype(float) for c in ("agentview", "eye_in_hand")}

    clean = images("clean")
    assert all(im.shape == (64, 64, 3) and im.std() > 10 for im in clean.values())
    brightness = [images(f"illumination:L{i}")["agentview"].mean() for i in (1, 2, 3)]
    assert clean["agentview"].mean() > brightness[0] > brightness[1] > brightness[2]
    for level in ("camera:L1", "camera:L3"):
        moved = images(level)
        assert np.abs(moved["agentview"] - clean["agentview"]).mean() > 0.5
        assert np.array_equal(moved["eye_in_hand"], clean["eye_in_hand"])  # the wrist camera is untouched
    assert np.abs(images("base:L3")["agentview"] - clean["agentview"]).mean() > 0.5  # the camera rides on the base
    assert np.array_equal(images("blur:L3")["agentview"], clean["agentview"])  # blur acts on observations only
    blur = protocol.factor("blur")
    sharp = clean["agentview"].astype(np.uint8)
    blurred = factor_kind(blur).transform(sharp, blur.level("L3"))
    assert np.abs(np.diff(blurred.astype(float), axis=1)).mean() < np.abs(np.diff(clean["agentview"], axis=1)).mean()


def test_a_snapshot_restores_the_state_bit_exactly(reach):
    reach.reset(11)
    for a in ([1.0, 0.5, -1.0], [0.3, -0.2, 1.0]):
        reach.step(np.array(a))
    snapshot, fingerprint = reach.get_state(), reach.fingerprint()
    actions = [np.array([0.7, -0.1, 1.0]), np.array([-0.4, 0.9, -1.0])]
    for a in actions:
        reach.step(a)
    after = reach.get_state()
    reach.reset(12)
    reach.set_state(snapshot)
    assert reach.fingerprint() == fingerprint and reach.steps == 2
    for a in actions:
        reach.step(a)
    assert all(np.array_equal(after[k], v) for k, v in reach.get_state().items())


def test_an_offset_that_starts_the_gripper_on_the_object_is_refused_and_the_state_is_kept(reach):
    reach.reset(5)
    before = reach.fingerprint()
    gripper, obj = reach.eef_world(), reach.privileged_state()["object_pos"]
    forward, side = obj - gripper  # the base yaw is 0 after reset, so base and world axes agree
    problem = reach.base_offset_problem({"forward_m": forward, "side_m": side, "yaw_deg": 0.0})
    assert problem is not None and problem.startswith("gripper would start 0.0 cm from the object")
    assert reach.base_offset_problem({"forward_m": 0.0, "side_m": 0.0, "yaw_deg": 1.0}) is None
    assert reach.fingerprint() == before
    reach.set_base_offset({"forward_m": 0.01, "side_m": -0.02, "yaw_deg": 3.0})
    assert reach.base_offset() == pytest.approx({"forward_m": 0.01, "side_m": -0.02, "yaw_deg": 3.0}, abs=1e-12)


def test_the_image_policy_is_seeded_by_reset_and_perturbations_change_its_outcomes(reach, protocol):
    policy = make_policy("fake")
    assert isinstance(policy, FakePolicy) and not policy.deterministic
    first, again = (rollout(reach, policy, protocol, 0, "clean") for _ in range(2))
    assert first.policy_rng_fingerprint == again.policy_rng_fingerprint != "deterministic"
    assert (first.success, first.steps, first.stage_steps) == (again.success, again.steps, again.stage_steps)
    # the policy finds the object in the image: heavy blur hides it, so clean successes become failures
    clean = [rollout(reach, policy, protocol, ep, "clean") for ep in range(4)]
    blurred = [rollout(reach, policy, protocol, ep, "blur:L3") for ep in range(4)]
    assert all(r.success and r.stages_completed == 2 for r in clean)
    assert not any(r.success for r in blurred) and all(r.steps == HORIZON for r in blurred)


@pytest.mark.parametrize("task, n_stages", [("Reach", 2), ("PickPlace", 3)])
def test_the_expert_latches_every_subgoal_in_order_and_the_random_policy_never_succeeds(protocol, task, n_stages):
    env = get_backend("fake").make(task)
    spec = specs.load_stage_spec("fake", task)
    assert spec.backend == "fake" and len(spec.subgoals) == n_stages
    expert, random_policy = make_policy("fake-expert"), make_policy("fake-random")
    for ep in range(3):
        record = rollout(env, expert, protocol, ep, "clean", task)
        assert record.success and record.stages_completed == n_stages and record.steps < HORIZON
        assert record.stage_steps == sorted(record.stage_steps) and record.stage_steps[0] > 1
        assert not rollout(env, random_policy, protocol, ep, "clean", task).success
    env.close()


def test_the_fake_backend_lists_its_tasks_and_subgoals_and_has_a_candidate_pool():
    out = json.loads(cli("tasks", "--backend", "fake", "--json").stdout)
    tasks = {t["task"]: t for t in out["tasks"]}
    assert list(tasks) == ["Reach", "PickPlace"] and all(t["horizon"] == HORIZON for t in tasks.values())
    assert [g["id"] for g in tasks["PickPlace"]["subgoals"]] == ["grasp_object", "carry_to_target", "release_on_target"]
    from robocasa_shift.checks.screening import load_pool

    pool = load_pool("fake")
    assert pool.backend == "fake" and pool.candidates == ("Reach", "PickPlace")


def test_a_fake_study_runs_audits_and_reports_without_mujoco_robosuite_or_torch(tmp_path):
    code = f"""
import json, runpy, sys

def cli(*args):
    sys.argv = ["robocasa-shift", *args]
    try:
        runpy.run_module("robocasa_shift", run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (0, None), (args, exc.code)

run = {str(tmp_path / "run")!r}
cli("run", "--backend", "fake", "--policy", "fake", "--task", "all", "--condition", "all", "--episodes", "0",
    "--workers", "1", "--no-progress", "--run-dir", run)
cli("audit", run)
cli("report", run, "--videos", "1")
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("mujoco", "robosuite", "torch"))))
"""
    out = run_python(code)
    assert json.loads(out.strip().splitlines()[-1]) == []
    assert "26 rollouts run, 0 already recorded" in out and "audit: PASSED" in out
    videos = json.loads((tmp_path / "run" / "report" / "videos.json").read_text())
    assert videos and all(v["reproduced"] for v in videos), videos  # the pair videos re-run fake rollouts exactly
    assert (tmp_path / "run" / "report" / "index.html").exists()
