"""Validity defects of the checks (issue 12: defects 2-5 and 8), each on run directories the test makes.

Every run directory comes from the ``fake`` backend (pure numpy, milliseconds per rollout); the
tests tamper with the records it wrote the way a bug or a careless edit would, and assert that
the run side, screening or the audit notices.
"""

import json
import shutil

import numpy as np
import pytest
from helpers import cli

from robocasa_shift import seeding
from robocasa_shift.checks.audit import audit_run
from robocasa_shift.checks.screening import load_pool, screening_decisions
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.specs import StageSpec, Subgoal
from robocasa_shift.core.stages import StageTracker, predicate
from robocasa_shift.rundir.store import RunStore

RUN = ["--backend", "fake", "--policy", "fake", "--workers", "1", "--no-progress"]
CONDITIONS = ["clean", "camera:L1", "camera:L3", "base:L1", "base:L3", "blur:L1", "blur:L3"]


def record_file(run_dir, episode, condition, task="Reach", phase="formal"):
    return run_dir / "records" / phase / task / f"{episode:04d}__{condition.replace(':', '-')}__r0.json"


def read(path):
    return json.loads(path.read_text())


def edit(path, fn):
    rec = read(path)
    fn(rec)
    path.write_text(json.dumps(rec))


def failing(report, task="Reach"):
    return {name: c["rollouts"] for name, c in report["tasks"][task]["checks"].items() if c["count"]}


def run_fake(run_dir, *extra, conditions=CONDITIONS, episodes="0-1", check=True):
    return cli("run", *RUN, "--task", "Reach", "--condition", ",".join(conditions), "--episodes", episodes,
               "--run-dir", str(run_dir), *extra, check=check)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("validity") / "run"
    run_fake(run_dir)
    return run_dir


@pytest.fixture()
def run_copy(pristine, tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(pristine, dest)
    return dest


def test_the_pristine_run_passes_the_audit(run_copy):
    report = audit_run(run_copy)
    assert report["passed"], failing(report)
    assert report["tasks"]["Reach"]["expected_rollouts"] == 14 == report["tasks"]["Reach"]["valid_rollouts"]


# --------------------------------------------------------------------------- defect 2: pairing at run time


def test_a_perturbed_rollout_whose_fingerprint_differs_from_its_twins_is_invalid_and_retry_errors_reruns_it(
        run_copy, pristine):
    path = record_file(run_copy, 1, "camera:L3")
    edit(path, lambda r: r.update(env_fingerprint="0" * 64))
    # any command on the run directory marks the record invalid: the pair is broken
    run_fake(run_copy)
    rec = read(path)
    assert rec["valid"] is False and rec["error_kind"] == "fingerprint_mismatch"
    assert "env_fingerprint" in rec["error"] and "--retry-errors" in rec["error"]
    assert failing(audit_run(run_copy))["fingerprint_mismatches"] == ["formal/Reach/0001/camera:L3/r0"]
    # --retry-errors re-runs the perturbed twin: it matches its clean twin again, as in the pristine run
    proc = run_fake(run_copy, "--retry-errors")
    assert "1 rollouts run" in proc.stdout and "0 invalid" in proc.stdout
    fresh, original = read(path), read(record_file(pristine, 1, "camera:L3"))
    assert fresh["valid"] is True and fresh["env_fingerprint"] == original["env_fingerprint"]
    history = list((run_copy / "history" / "formal" / "Reach").glob("0001__camera-L3__r0.*.json"))
    assert [read(h)["error_kind"] for h in history] == ["fingerprint_mismatch"]
    assert audit_run(run_copy)["passed"]


def test_a_mismatch_that_survives_its_retry_is_a_determinism_failure_and_is_not_retried_again(run_copy):
    # the clean twin's policy RNG fingerprint no longer matches what the policy really starts from:
    # every perturbed twin of episode 0 re-runs once and still mismatches
    edit(record_file(run_copy, 0, "clean"), lambda r: r.update(policy_rng_fingerprint="f" * 64))
    twins = [c for c in CONDITIONS if c != "clean"]
    proc = run_fake(run_copy, "--retry-errors")
    assert f"{len(twins)} rollouts run" in proc.stdout and f"{len(twins)} invalid" in proc.stdout
    for condition in twins:
        rec = read(record_file(run_copy, 0, condition))
        assert rec["valid"] is False and rec["error_kind"] == "determinism", condition
        assert "survived a retry" in rec["error"] and "policy_rng_fingerprint" in rec["error"]
    before = {c: read(record_file(run_copy, 0, c)) for c in twins}
    again = run_fake(run_copy, "--retry-errors")
    assert "0 rollouts run" in again.stdout  # reported, never retried again
    assert {c: read(record_file(run_copy, 0, c)) for c in twins} == before
    report = audit_run(run_copy)
    mismatches = failing(report)["policy_seed_mismatches"]
    assert len(mismatches) == len(twins) and all("determinism failure" in m for m in mismatches)
    assert not report["passed"]


# --------------------------------------------------------------------------- defect 3: screening


POOL = ("backend: fake\nversion: 1\ncandidates: [Reach, PickPlace]\nschedule: {initial: 2, reserve: 0}\n"
        "minimum_suite: 1\nscreening: {first_batch: 3, exclude_at_most: 0, extended: 4, retain_at_least: 3}\n")


def test_the_screening_rule_reads_a_crashed_rollout_as_unknown_not_as_a_failure(tmp_path):
    (tmp_path / "pool.yaml").write_text(POOL.replace("first_batch: 3", "first_batch: 10")
                                        .replace("extended: 4", "extended: 20").replace("retain_at_least: 3",
                                                                                        "retain_at_least: 12"))
    pool = load_pool("fake", tmp_path / "pool.yaml")
    # 12 successes, 2 renderer crashes, 6 failures: not 8 failures, and not a decision
    outcomes = [True] * 12 + [None] * 2 + [False] * 6
    decision = screening_decisions(pool, {"T": outcomes})["T"]
    assert decision["decision"] == "undecided (2 invalid rollouts)"
    assert (decision["successes"], decision["invalid"], decision["rollouts"]) == (12, 2, 20)
    assert screening_decisions(pool, {"T": [True] * 12 + [False] * 8})["T"]["decision"] == "retained"


def test_screen_refuses_to_decide_on_invalid_rollouts_until_retry_errors_reruns_them(tmp_path):
    (tmp_path / "pool.yaml").write_text(POOL)
    run_dir = tmp_path / "run"
    args = ["screen", "--backend", "fake", "--policy", "fake-expert", "--run-dir", str(run_dir),
            "--pool", str(tmp_path / "pool.yaml"), "--workers", "1", "--no-progress"]
    cli(*args)
    assert read(run_dir / "suite.json")["tasks"] == ["Reach", "PickPlace"]
    for episode in (1, 2):  # two renderer crashes among Reach's rollouts
        edit(record_file(run_dir, episode, "clean", phase="screening"),
             lambda r: r.update(valid=False, success=None, error_kind="renderer", error="EGL context lost"))
    proc = cli(*args, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "undecided (2 invalid rollouts)" in proc.stdout and "--retry-errors" in proc.stderr
    result = read(run_dir / "screening" / "screening.json")
    assert result["undecided"] == ["Reach"] and not result["passed"]
    assert result["screening"]["Reach"]["invalid"] == 2 and not (run_dir / "suite.json").exists()
    retried = cli(*args, "--retry-errors")
    assert "formal suite: Reach, PickPlace" in retried.stdout
    assert read(run_dir / "screening" / "screening.json")["screening"]["Reach"]["decision"] == "retained"
    assert len(list((run_dir / "history").rglob("*.json"))) == 2


# --------------------------------------------------------------------------- defect 4: the audit recomputes


def test_the_audit_recomputes_camera_draws_from_the_seed_stream(run_copy):
    def nothing_moved(rec):  # a draw of [0, 0] at every level: consistent, shared, and nothing perturbed
        pert = rec["perturbation"]
        pert["draw"] = [0.0, 0.0]
        for values in list(pert["expected"].values()) + list(pert["applied"].values()):
            values.update(yaw_deg=0.0, pitch_deg=0.0)

    for condition in ("camera:L1", "camera:L3"):
        edit(record_file(run_copy, 0, condition), nothing_moved)
    report = audit_run(run_copy)
    bad = failing(report)["invalid_perturbation_records"]
    assert [b.split("/r0: ")[0] for b in bad] == ["formal/Reach/0000/camera:L1", "formal/Reach/0000/camera:L3"]
    assert all("is not the one its seed stream gives" in b for b in bad) and not report["passed"]


def test_the_audit_fails_a_base_record_without_its_draw(run_copy):
    edit(record_file(run_copy, 1, "base:L3"), lambda r: r["perturbation"].update(draw=None))
    bad = failing(audit_run(run_copy))
    assert list(bad) == ["invalid_perturbation_records"]
    assert bad["invalid_perturbation_records"][0].startswith("formal/Reach/0001/base:L3/r0: draw None")


def test_the_audit_replays_rejected_base_draws(run_copy):
    # the seed stream's second triple is not the first: a record claiming a rejected draw must carry the second
    edit(record_file(run_copy, 0, "base:L1"), lambda r: r["perturbation"].update(draws_rejected=1))
    bad = failing(audit_run(run_copy))["invalid_perturbation_records"]
    assert any(b.startswith("formal/Reach/0000/base:L1/r0: draw") for b in bad)
    # and the accepted draw of a record is the (draws_rejected + 1)-th triple of its stream
    protocol = specs.load_protocol()
    rng = seeding.draw_rng(protocol.study_seed, "base", "Reach", "formal", 0)
    first = rng.standard_normal(3).tolist()
    assert read(record_file(run_copy, 0, "base:L3"))["perturbation"]["draw"] == first


def test_the_audit_fails_records_without_fingerprints(run_copy):
    for path in RunStore(run_copy).record_files():
        edit(path, lambda r: r.update(env_fingerprint=None, policy_rng_fingerprint=None))
    report = audit_run(run_copy)
    bad = failing(report)
    assert len(bad["fingerprint_mismatches"]) == 14 and len(bad["policy_seed_mismatches"]) == 14
    assert "formal/Reach/0000/clean/r0: no env fingerprint" in bad["fingerprint_mismatches"]
    assert not report["passed"]


def test_blur_rollouts_record_the_measured_kernel_and_sharpness_within_the_frozen_range(pristine):
    spec = specs.load_protocol().factor("blur")
    for condition in ("blur:L1", "blur:L3"):
        level = condition.split(":")[1]
        measured = read(record_file(pristine, 0, condition))["perturbation"]["measured"]
        sigma = spec.level(level)["sigma_px"]
        assert measured["kernel"]["sigma_px"] == pytest.approx(sigma, rel=spec.options["kernel_sigma_rtol"])
        low, high = spec.options["sharpness_ratio_range"][level]
        (camera, m), = measured["cameras"].items()  # the fake policy reads the third-person camera only
        assert m["role"] == "third_person" and m["shape"] == [64, 64, 3]
        assert low <= m["sharpness_ratio"] <= high and m["laplacian_var_raw"] > 0
    # the other conditions' records carry no measurement: what they record is unchanged
    for condition in ("clean", "camera:L1", "base:L1"):
        assert "measured" not in (read(record_file(pristine, 0, condition))["perturbation"] or {})


def test_the_audit_fails_a_blur_that_never_reached_the_policy(tmp_path, monkeypatch):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.core.factors import GaussianBlur
    from robocasa_shift.study.runner import run

    # the read-back of blur equals its expectation whatever the transform does: only a measurement can fail
    monkeypatch.setattr(GaussianBlur, "transform", lambda self, image, params: image)
    run(tmp_path / "run", ["Reach"], ["clean", "blur:L2"], [0], StudyConfig(backend="fake", policy="fake"),
        ExecutionConfig(workers=1, progress=False))
    rec = read(record_file(tmp_path / "run", 0, "blur:L2"))
    assert rec["valid"] and rec["perturbation"]["ok"]  # nothing at run time notices
    bad = failing(audit_run(tmp_path / "run"))["invalid_perturbation_records"]
    assert len(bad) == 1 and "measured kernel sigma" in bad[0] and "sharpness ratio 1.0 outside" in bad[0]


def test_the_audit_fails_a_tampered_blur_measurement(run_copy):
    def sharp(rec):
        for m in rec["perturbation"]["measured"]["cameras"].values():
            m["sharpness_ratio"] = 0.9

    edit(record_file(run_copy, 1, "blur:L1"), sharp)
    edit(record_file(run_copy, 1, "blur:L3"), lambda r: r["perturbation"].pop("measured"))
    bad = failing(audit_run(run_copy))["invalid_perturbation_records"]
    assert len(bad) == 2
    assert "agentview: sharpness ratio 0.9 outside the frozen range" in bad[0]
    assert bad[1].endswith("no measurement of the delivered images")


def test_a_blur_rollout_of_a_policy_that_reads_no_camera_passes_but_one_that_rendered_must_be_measured(tmp_path):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.study.runner import run

    run(tmp_path / "run", ["Reach"], ["clean", "blur:L2"], [0], StudyConfig(backend="fake", policy="fake-random"),
        ExecutionConfig(workers=1, progress=False))
    path = record_file(tmp_path / "run", 0, "blur:L2")
    rec = read(path)
    assert rec["frames_rendered"] == 0 and rec["perturbation"]["measured"]["cameras"] == {}
    assert audit_run(tmp_path / "run").passed  # nothing was delivered, so nothing was left unmeasured
    edit(path, lambda r: r.update(frames_rendered=4))  # images went to the policy, yet none was measured
    bad = failing(audit_run(tmp_path / "run"))["invalid_perturbation_records"]
    assert len(bad) == 1 and "no camera's delivered image was measured" in bad[0]


# --------------------------------------------------------------------------- defect 5: one phase per audit


def test_the_audit_covers_one_phase(tmp_path):
    run_dir = tmp_path / "run"
    # screening of two tasks (episodes 0-3), then a formal matrix of the one retained (episodes 0-1)
    cli("run", *RUN, "--task", "Reach,PickPlace", "--condition", "clean", "--episodes", "0-3",
        "--phase", "screening", "--run-dir", str(run_dir))
    run_fake(run_dir, conditions=["clean", "camera:L2", "blur:L2"])
    report = audit_run(run_dir)
    assert report["passed"], report["run_problems"]
    assert list(report["tasks"]) == ["Reach"] and report["phase"] == "formal"
    reach = report["tasks"]["Reach"]
    assert reach["expected_rollouts"] == 6 == reach["valid_rollouts"] and reach["distinct_base_episodes"] == 2
    assert report["other_phases"] == {"screening": 8}
    proc = cli("audit", str(run_dir), "--phase", "screening")
    screening = read(run_dir / "audit-screening.json")
    assert screening["passed"] and sorted(screening["tasks"]) == ["PickPlace", "Reach"]
    assert screening["tasks"]["PickPlace"]["expected_rollouts"] == 4 and "audit-screening: PASSED" in proc.stdout
    assert read(run_dir / "audit.json")["phase"] == "formal"  # the formal audit the report reads stays
    none = cli("audit", str(run_dir), "--phase", "validation", check=False)
    assert none.returncode == 1 and "no validation rollouts" in none.stdout


# --------------------------------------------------------------------------- defect 8: stages, replay, calibration


class Flags:
    def __init__(self, **values):
        self.values = values
        self.counter = 0


@predicate("fake", "validity_value")
def validity_value(env, name):
    return env.values[name]


@predicate("fake", "validity_counter_at_least")
def validity_counter_at_least(env, n):
    return env.counter >= n


@predicate("fake", "validity_explode")
def validity_explode(env):
    raise RuntimeError("lost the object handle")


def stage_spec(*goals):
    return StageSpec(task="T", backend="fake", version=1, description="", path="-", content_hash="0" * 64,
                     subgoals=tuple(Subgoal(g, "", p, a) for g, p, a in goals))


@pytest.mark.parametrize("value, latches", [(True, True), (np.True_, True), (np.bool_(False), False), (False, False)])
def test_stage_tracker_takes_python_and_numpy_bools(value, latches):
    tracker = StageTracker(stage_spec(("a", "validity_value", {"name": "a"})))
    assert tracker.update(Flags(a=value), 3) == (["a"] if latches else [])
    assert tracker.result().error is None


@pytest.mark.parametrize("value", [1, 0, np.int64(1), 1.0, "yes", None])
def test_stage_tracker_refuses_every_other_result_naming_the_predicate(value):
    tracker = StageTracker(stage_spec(("a", "validity_value", {"name": "a"})))
    assert tracker.update(Flags(a=value), 3) == []
    error = tracker.result().error
    assert "subgoal 'a' (predicate validity_value) at step 3 returned" in error and "not a bool" in error


def test_holding_never_raises_and_reports_a_raising_predicate():
    tracker = StageTracker(stage_spec(("a", "validity_value", {"name": "a"}), ("b", "validity_explode", {})))
    assert tracker.holding(Flags(a=np.True_)) == {"a": True, "b": None}  # None: not evaluated, never False
    holds, errors = tracker.evaluate_all(Flags(a=np.True_), 7)
    assert holds == {"a": True, "b": None}
    assert errors == ["subgoal 'b' (predicate validity_explode) at step 7: RuntimeError: lost the object handle"]


def test_stage_replay_survives_a_raising_predicate_and_reports_it():
    from robocasa_shift.checks.validation import replay_states

    class Env(Flags):
        def set_physics_state(self, state):
            self.values["a"] = bool(state[0])

    spec = stage_spec(("a", "validity_value", {"name": "a"}), ("b", "validity_explode", {}))
    out = replay_states(Env(a=False), spec, np.array([[0.0], [0.0], [1.0]]))
    assert out["stage_steps"] == [2, None] and not out["all_reached"]
    assert out["error"].startswith("subgoal 'b' (predicate validity_explode) at step 2")
    assert out["holding_errors"] == ["subgoal 'b' (predicate validity_explode) at step 1: RuntimeError: "
                                     "lost the object handle"]


def test_stage_replay_goes_through_an_envs_replay_step_so_counters_latch():
    from robocasa_shift.checks.validation import replay_states

    class CountingEnv(Flags):
        """Like RoboCasa's kitchens: a counter the environment's own step advances, read by a predicate."""

        def set_physics_state(self, state):
            pass

        def replay_step(self, state):
            self.set_physics_state(state)
            self.counter += 1  # the bookkeeping env.step does after the physics

    spec = stage_spec(("counted", "validity_counter_at_least", {"n": 3}))
    out = replay_states(CountingEnv(), spec, np.zeros((5, 1)))
    assert out["stage_steps"] == [3] and out["all_reached"]


def test_calibrate_measures_every_camera_role_at_the_policys_image_size(tmp_path):
    import pandas as pd

    run_dir = tmp_path / "run"
    # a run directory made with the fake policy (64 px) names the size calibration renders at
    cli("run", *RUN, "--task", "Reach", "--condition", "clean", "--episodes", "0", "--run-dir", str(run_dir))
    proc = cli("calibrate", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--run-dir", str(run_dir))
    assert "calibration: PASSED" in proc.stdout
    report = read(run_dir / "calibration" / "calibration.json")
    assert report["image_size"] == 64 and report["image_size_from"] == "the run directory's policy"
    table = pd.read_csv(run_dir / "calibration" / "records.csv")
    blur = table[table.condition.str.startswith("blur")]
    for role in ("third_person", "wrist"):  # blur and illumination act on every image the policy reads
        assert (blur[f"sharpness_ratio_{role}"] < 0.2).all()
        illum = table[table.condition.str.startswith("illumination")][f"brightness_{role}"].tolist()
        assert illum == sorted(illum, reverse=True)
    assert table.passed.all()
    cli("calibrate", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--run-dir", str(run_dir),
        "--image-size", "48")
    assert read(run_dir / "calibration" / "calibration.json")["image_size"] == 48
    import cv2

    sheet = cv2.imread(str(run_dir / "calibration" / "contact_sheet_Reach.png"))
    assert sheet.shape[0] == 24 + 13 * 48 and sheet.shape[1] == 150 + 2 * 48


def test_the_keys_of_the_run_directory_helpers_are_those_of_the_store(pristine):
    # the helpers above name record files the way the store does
    key = RolloutKey("formal", "Reach", 1, "camera:L3")
    assert RunStore(pristine).record_path(key) == record_file(pristine, 1, "camera:L3")
