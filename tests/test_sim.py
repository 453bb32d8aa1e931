"""The robosuite backend on the real simulator: seeding, fingerprints, factors, stages, rollouts."""

import json

import cv2
import numpy as np
import pytest
from helpers import run_python

from robocasa_shift import seeding
from robocasa_shift.core.factors import BaseOffset, CameraRotation, LightScale
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.specs import load_stage_spec
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.engine.rollout import inject, prepare_episode, run_rollout
from robocasa_shift.policies import POLICIES, make_policy

pytestmark = pytest.mark.sim
TASKS = ("Lift", "Stack", "PickPlaceCan", "NutAssemblySquare")


def key(condition="clean", episode=0, task="Lift"):
    return RolloutKey("formal", task, episode, condition)


def images(env, size=128):
    return {cam: env.render(cam, size) for cam in env.third_person_cameras + env.wrist_cameras}


def test_seeding_is_exact_across_processes_and_orders(protocol):
    code = """
import json, sys
from robocasa_shift.backends import get_backend
from robocasa_shift.seeding import env_seed
env = get_backend('robosuite').make('Stack')
out = {}
for ep in %s:
    env.reset(env_seed(%d, 'Stack', 'formal', ep))
    out[ep] = env.fingerprint()
print(json.dumps(out))
"""
    forward = json.loads(run_python(code % ("[0, 1, 2]", protocol.study_seed)).strip().splitlines()[-1])
    backward = json.loads(run_python(code % ("[2, 0]", protocol.study_seed)).strip().splitlines()[-1])
    assert forward["0"] == backward["0"] and forward["2"] == backward["2"]
    assert len({forward["0"], forward["1"], forward["2"]}) == 3


def test_repeated_resets_give_identical_fingerprints_and_observations(lift_env, protocol):
    fp = prepare_episode(lift_env, protocol, key(episode=3))
    first = images(lift_env)
    prepare_episode(lift_env, protocol, key(episode=5))
    assert prepare_episode(lift_env, protocol, key(episode=3)) == fp
    for cam, img in images(lift_env).items():
        np.testing.assert_array_equal(img, first[cam])


def test_a_leaked_model_edit_changes_the_fingerprint(lift_env, protocol):
    fp = prepare_episode(lift_env, protocol, key())
    lift_env.model.light_diffuse[0] *= 0.5  # an edit that escaped restore
    assert lift_env.fingerprint() != fp
    lift_env.model.light_diffuse[0] *= 2.0
    assert lift_env.fingerprint() == fp
    cam = lift_env._cam_ids["robot0_robotview"]
    lift_env.model.cam_quat[cam, 0] += 1e-6
    assert lift_env.fingerprint() != fp
    assert prepare_episode(lift_env, protocol, key()) == fp  # reset restores the nominal model
    lift_env.gripper.current_action = lift_env.gripper.current_action + 0.1  # controller state counts too
    assert lift_env.fingerprint() != fp


def test_snapshot_restore_is_bit_exact(lift_env, protocol):
    prepare_episode(lift_env, protocol, key())
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (30, lift_env.action_dim))
    actions[:, 6:10], actions[:, 11] = 0.0, -1.0
    for a in actions[:10]:
        lift_env.step(a)
    snap = lift_env.get_state()
    for a in actions[10:]:
        lift_env.step(a)
    end = lift_env.get_state()
    lift_env.set_state(snap)
    for a in actions[10:]:
        lift_env.step(a)
    for k, v in lift_env.get_state().items():
        np.testing.assert_array_equal(v, end[k], err_msg=k)


def test_illumination_darkens_monotonically(lift_env, protocol):
    means = []
    for cond in ["clean", "illumination:L1", "illumination:L2", "illumination:L3"]:
        prepare_episode(lift_env, protocol, key(cond))
        record = inject(lift_env, protocol, key(cond))
        assert record is None or record["ok"]
        means.append(float(lift_env.render("robot0_robotview", 128).mean()))
    assert means == sorted(means, reverse=True) and means[0] - means[3] > 30, means


def test_blur_lowers_sharpness_monotonically(lift_env, protocol):
    from robocasa_shift.core.factors import GaussianBlur

    prepare_episode(lift_env, protocol, key())
    img = lift_env.render("robot0_robotview", 128)

    def sharpness(im):
        return cv2.Laplacian(cv2.cvtColor(im, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var()

    values = [sharpness(img)] + [
        sharpness(GaussianBlur().transform(img, protocol.factor("blur").level(lv))) for lv in ("L1", "L2", "L3")
    ]
    assert values == sorted(values, reverse=True) and values[3] < values[0] / 10, values


def test_camera_moves_third_person_image_only_and_scales_with_level(lift_env, protocol):
    prepare_episode(lift_env, protocol, key())
    clean = images(lift_env)
    offsets = {}
    for lv in ("L1", "L2", "L3"):
        prepare_episode(lift_env, protocol, key(f"camera:{lv}"))
        record = inject(lift_env, protocol, key(f"camera:{lv}"))
        assert record["ok"] and record["max_abs_error"] < 1e-12
        cam = record["applied"]["robot0_robotview"]
        offsets[lv] = np.array([cam["yaw_deg"], cam["pitch_deg"]])
        perturbed = images(lift_env)
        assert np.abs(perturbed["robot0_robotview"].astype(int) - clean["robot0_robotview"]).mean() > 1.0
        np.testing.assert_array_equal(perturbed["robot0_eye_in_hand"], clean["robot0_eye_in_hand"])
        # rotated in place: the position is untouched
        camid = lift_env._cam_ids["robot0_robotview"]
        np.testing.assert_array_equal(lift_env.model.cam_pos[camid], lift_env._nominal["cam_pos"][camid])
    np.testing.assert_allclose(offsets["L3"], 5 * offsets["L1"], rtol=1e-9)
    np.testing.assert_allclose(offsets["L2"], 3 * offsets["L1"], rtol=1e-9)
    assert 0 < np.linalg.norm(offsets["L3"]) <= 10.0


def test_base_offset_read_back_equals_scaled_draw(lift_env, protocol):
    readback = {}
    for lv in ("L1", "L2", "L3"):
        prepare_episode(lift_env, protocol, key(f"base:{lv}", episode=2))
        record = inject(lift_env, protocol, key(f"base:{lv}", episode=2))
        assert record["ok"]
        z = record["draw"]
        params = protocol.factor("base").level(lv)
        expected = [params["sigma_xy_m"] * z[0], params["sigma_xy_m"] * z[1], params["sigma_psi_deg"] * z[2]]
        got = record["applied"]
        np.testing.assert_allclose([got["forward_m"], got["side_m"], got["yaw_deg"]], expected, rtol=1e-12, atol=1e-15)
        readback[lv] = np.array([got["forward_m"], got["side_m"], got["yaw_deg"]])
        # the simulator holds it: the mobile base body moved by the offset
        assert np.abs(lift_env.data.qpos[lift_env._base_qpos_adr]).max() > 0
    np.testing.assert_allclose(readback["L3"], 5 * readback["L1"], rtol=1e-9)


def test_invalid_base_draw_is_replaced_for_all_levels(lift_env, protocol):
    """A draw that collides at L3 is rejected even though L1 alone would be fine."""
    spec = protocol.factor("base")
    prepare_episode(lift_env, protocol, key("base:L1"))
    problems = [lift_env.base_offset_problem({"forward_m": f, "side_m": 0.0, "yaw_deg": 0.0}) for f in (0.0, 0.6)]
    assert problems[0] is None and "collision" in problems[1]

    class Scripted:  # the first draw drives the base 0.6 m into the table at L3, the second is harmless
        def __init__(self):
            self.draws = [np.array([6.0, 0.0, 0.0]), np.array([0.1, 0.2, 0.3])]

        def standard_normal(self, n):
            return self.draws.pop(0)

    draw = BaseOffset().draw(spec, Scripted(), lift_env)
    assert draw["draw"] == [0.1, 0.2, 0.3] and draw["draws_rejected"] == 1
    assert "collision" in draw["rejection_reasons"][0]
    # the validity check leaves the state untouched
    assert prepare_episode(lift_env, protocol, key("base:L1")) == lift_env.fingerprint()


def test_runtime_records_read_the_simulator(lift_env, protocol):
    """Tampering after application shows in the read-back values: they are not copies of the spec."""
    cases = [
        ("illumination:L2", LightScale(), lambda e: e.model.light_diffuse.__setitem__(0, [0.1, 0.1, 0.1])),
        ("camera:L2", CameraRotation(), lambda e: e.set_camera_quat("robot0_robotview", e.nominal_camera_quat("robot0_robotview"))),
        ("base:L2", BaseOffset(), lambda e: e.set_base_offset({"forward_m": 0.0, "side_m": 0.0, "yaw_deg": 0.0})),
    ]
    for cond, kind, tamper in cases:
        prepare_episode(lift_env, protocol, key(cond, episode=1))
        record = inject(lift_env, protocol, key(cond, episode=1))
        assert kind.readback(lift_env) == record["applied"]
        tamper(lift_env)
        assert kind.readback(lift_env) != record["applied"], cond


def test_no_milestone_holds_on_initial_states(protocol):
    from robocasa_shift.backends import get_backend

    backend = get_backend("robosuite")
    for task in TASKS:
        env = backend.make(task)
        tracker = StageTracker(load_stage_spec("robosuite", task))
        for ep in range(3):
            prepare_episode(env, protocol, key(task=task, episode=ep))
            assert not any(tracker.holding(env).values()), (task, ep, tracker.holding(env))
            assert not env.is_success()
        env.close()


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
def test_expert_reaches_every_milestone_in_order(task, protocol):
    from robocasa_shift.backends import get_backend

    env = get_backend("robosuite").make(task)
    spec = load_stage_spec("robosuite", task)
    expert = make_policy("expert")
    for ep in range(2):
        rec = run_rollout(env, expert, key(task=task, episode=ep), protocol, spec, "robosuite")
        assert rec.valid and rec.success, rec.error
        assert rec.stages_completed == rec.n_stages and rec.first_incomplete is None
        assert rec.stage_steps == sorted(rec.stage_steps) and rec.stage_steps[-1] <= rec.steps
        assert rec.stage_error is None and not rec.truncated
    env.close()


def test_thirteen_conditions_share_fingerprints(lift_env, protocol):
    spec = load_stage_spec("robosuite", "Lift")
    policy = make_policy("random")
    records = [
        run_rollout(lift_env, policy, key(c, episode=4), protocol, spec, "robosuite", horizon=15)
        for c in protocol.conditions
    ]
    assert all(r.valid for r in records), [r.error for r in records if not r.valid]
    assert len({r.env_fingerprint for r in records}) == 1
    assert len({r.policy_rng_fingerprint for r in records}) == 1
    assert records[0].policy_rng_fingerprint == seeding.rng_state_hash(
        np.random.default_rng(records[0].policy_seed).bit_generator.state
    )
    assert all(r.steps == 15 and r.horizon == 15 for r in records)
    # a different base episode starts elsewhere
    other = run_rollout(lift_env, policy, key(episode=5), protocol, spec, "robosuite", horizon=2)
    assert other.env_fingerprint != records[0].env_fingerprint
    assert other.policy_rng_fingerprint != records[0].policy_rng_fingerprint


def test_clean_after_perturbed_equals_clean_in_fresh_process(lift_env, protocol):
    spec = load_stage_spec("robosuite", "Lift")
    policy = make_policy("random")
    for cond in ("camera:L3", "illumination:L3", "base:L3"):
        run_rollout(lift_env, policy, key(cond, episode=6), protocol, spec, "robosuite", horizon=20)
    rec = run_rollout(lift_env, policy, key(episode=6), protocol, spec, "robosuite", horizon=20)
    after_perturbed = lift_env.get_state()
    code = """
import numpy as np, json
from robocasa_shift.backends import get_backend
from robocasa_shift.core import specs
from robocasa_shift.policies import make_policy
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import run_rollout
env = get_backend('robosuite').make('Lift')
rec = run_rollout(env, make_policy('random'), RolloutKey('formal', 'Lift', 6, 'clean'), specs.load_protocol(),
                  specs.load_stage_spec('robosuite', 'Lift'), 'robosuite', horizon=20)
print(json.dumps([rec.env_fingerprint, env.get_state()['integration'].tolist()]))
"""
    fresh_fp, fresh_state = json.loads(run_python(code).strip().splitlines()[-1])
    assert rec.env_fingerprint == fresh_fp
    np.testing.assert_array_equal(after_perturbed["integration"], np.array(fresh_state))


class CrashPolicy:
    name = "crash-at-5"
    camera_roles = ("third_person",)
    image_size = 64
    privileged = False

    def __init__(self):
        self.calls = 0

    def reset(self, seed):
        self.calls = 0

    def act(self, obs):
        self.calls += 1
        if self.calls == 5:
            raise RuntimeError("boom at call 5")
        return np.zeros((1, 12))

    def rng_fingerprint(self):
        return "deterministic"

    def identity(self):
        return {"name": self.name}

    def close(self):
        pass


def test_a_crashing_rollout_becomes_an_invalid_record_and_the_run_goes_on(tmp_path):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.rundir.store import RunStore
    from robocasa_shift.study.runner import run

    if "crash-at-5" not in POLICIES:
        POLICIES.register("crash-at-5", CrashPolicy)
    summary = run(tmp_path / "run", ["Lift"], ["clean", "blur:L1"], [0], StudyConfig(policy="crash-at-5"),
                  ExecutionConfig(workers=1, progress=False))
    assert summary == {"planned": 2, "ran": 2, "skipped": 0, "failures": 0, "invalid": 2}
    records = RunStore(tmp_path / "run").records()
    assert len(records) == 2
    for rec in records:
        assert rec["valid"] is False and rec["error_kind"] == "runtime"
        assert "RuntimeError: boom at call 5" in rec["error"] and rec["steps"] == 4


def test_resume_skips_recorded_keys_and_keeps_them(tmp_path):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.rundir.store import RunStore
    from robocasa_shift.study.runner import run

    run_dir = tmp_path / "run"
    serial = ExecutionConfig(workers=1, progress=False)
    first = run(run_dir, ["Lift"], ["clean"], [0, 1], StudyConfig(policy="expert"), serial)
    assert first["ran"] == 2
    store = RunStore(run_dir)
    before = {p: p.read_bytes() for p in store.record_files()}
    second = run(run_dir, ["Lift"], ["clean"], [0, 1, 2], StudyConfig(policy="expert"), serial)
    assert second == {"planned": 3, "ran": 1, "skipped": 2, "failures": 0, "invalid": 0}
    after = {p: p.read_bytes() for p in store.record_files()}
    assert len(after) == 3 and all(after[p] == b for p, b in before.items())
    manifest = store.manifest()
    assert manifest["render_profile"] == "fast" and manifest["renderer"]["shadows"] is False
    assert len((run_dir / "commands.jsonl").read_text().splitlines()) == 2


def test_contacts_a_drop_and_a_table_touch_are_read_from_the_simulator(lift_env, protocol):
    """A scripted grasp that lets the cube go 15 cm up, then presses the open gripper into the table: the contact rows
    read from MuJoCo hold the grasp, the drop and the robot-scene contacts, and nothing before them."""
    from robocasa_shift.analysis.behaviour import contact_events

    env, layout = lift_env, lift_env.action_layout
    prepare_episode(env, protocol, key())
    rows = [env.contact_state()]
    start_height = rows[0][4]

    def move(target, grip, steps):
        for _ in range(steps):
            env.step(layout.arm_action(np.clip(10 * (np.asarray(target) - env.eef_pos()), -1, 1), grip))
            rows.append(env.contact_state())

    cube = env.point("cube").copy()
    move(cube + [0, 0, 0.08], layout.open, 30)
    move(cube, layout.open, 30)
    move(cube, layout.close, 15)
    lifted = len(rows)
    move(cube + [0, 0, 0.15], layout.close, 40)
    released = len(rows)
    move(env.eef_pos().copy(), layout.open, 20)
    move(cube + [0.15, 0.0, -0.08], layout.open, 60)
    c = np.array(rows)
    # placed a few mm above the table, the cube lands on the first step; then it rests with its centre ~2 cm up
    assert c[1, 3] == 1 and c[1, 2] == 0 and 15 <= c[1, 4] <= 25 and start_height >= c[1, 4]
    assert c[lifted:released, 2].all() and c[released - 1, 4] > 100  # held the whole lift, 10+ cm above the table
    events = contact_events(c[1:])
    drops = np.flatnonzero(events["drop"]) + 1
    assert len(drops) == 1 and released <= drops[0] < released + 20
    assert not events["scene"][:released].any()  # nothing touched the table before the press
    assert events["scene"][released + 20:].any() and not c[:, 1].any()  # Lift has no other object to hit
