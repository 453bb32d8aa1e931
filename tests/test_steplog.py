"""Per-step logs (engine/step_logger.py): complete, beside their records, audited, and never changing a rollout.

Bookkeeping runs on the fake backend; one simulator test checks the reference policy's monitor
samples leave its rollouts unchanged.
"""

import json

import numpy as np
import pytest
from helpers import cli

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey, comparable
from robocasa_shift.core.steplog import StepLog, StepLogError, log_path
from robocasa_shift.engine.step_logger import StepLogger
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.runner import run

TASKS, CONDITIONS = ["Reach", "PickPlace"], ["clean", "base:L2", "blur:L3", "camera:L3"]


def _run(run_dir, log_steps, workers=1, batch=1, episodes=range(3)):
    study = StudyConfig(backend="fake", policy="fake", log_steps=log_steps)
    return run(run_dir, TASKS, CONDITIONS, episodes, study, ExecutionConfig(workers=workers, batch=batch, progress=False))


def _by_key(run_dir):
    return {RolloutKey.from_record(r).id: r for r in RunStore(run_dir).records()}


def _without_log(record):
    return comparable({k: v for k, v in record.items() if k != "step_log"})


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("logged") / "run"
    _run(run_dir, log_steps=True, workers=2)
    return run_dir


def test_logging_steps_changes_no_record_and_every_log_matches_its_record(logged, tmp_path):
    _run(tmp_path / "plain", log_steps=False)
    plain, with_logs = _by_key(tmp_path / "plain"), _by_key(logged)
    assert plain.keys() == with_logs.keys() and len(plain) == len(TASKS) * len(CONDITIONS) * 3
    assert {k: _without_log(r) for k, r in plain.items()} == {k: _without_log(r) for k, r in with_logs.items()}
    assert all(r["step_log"] is None for r in plain.values())
    assert not list((tmp_path / "plain").rglob("*.steps.npz"))
    store = RunStore(logged)
    for record in with_logs.values():
        log = store.step_log(record)
        assert log.steps == record["steps"] == record["step_log"]["steps"]
        assert len(log.boundary) == record["policy_calls"] and log.boundary[0] == 0
        assert np.all(np.diff(log.boundary) > 0) and log.boundary[-1] < log.steps
        assert log.latched[-1] == record["stages_completed"] and np.all(np.diff(log.latched) >= 0)
        # the subgoals latch in the log at the steps the record holds
        for i, step in enumerate(record["stage_steps"]):
            if step is not None:
                assert log.latched[step - 1] >= i + 1 and (step == 1 or log.latched[step - 2] <= i)
        assert log.eef_pos.shape == (log.steps + 1, 3) and np.isfinite(log.eef_pos).all()
        # the fake policy offers monitor samples: 8 per boundary, of its two continuous arm commands
        assert log.samples.shape == (len(log.boundary), 8, 2) and record["step_log"]["samples"] == 8
        assert log.meta["key"] == RolloutKey.from_record(record).to_json()


def test_a_logged_rollout_replays_from_its_logged_actions_to_the_same_outcome(logged, protocol):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.engine.rollout import inject, prepare_episode

    store = RunStore(logged)
    env = get_backend("fake").make("PickPlace")
    checked = 0
    for record in store.records():
        if record["task"] != "PickPlace":
            continue
        key = RolloutKey.from_record(record)
        log = store.step_log(record)
        prepare_episode(env, protocol, key)
        inject(env, protocol, key)
        for i, action in enumerate(log.action):
            env.step(action)
            assert np.array_equal(env.eef_pos(), log.eef_pos[i + 1])
        assert env.is_success() == record["success"]
        checked += 1
    assert checked == len(CONDITIONS) * 3


def test_lockstep_batches_write_the_same_logs_as_single_rollouts(logged, tmp_path):
    _run(tmp_path / "batched", log_steps=True, batch=4)
    for key, record in _by_key(logged).items():
        other = _by_key(tmp_path / "batched")[key]
        assert record["step_log"] == other["step_log"], key  # same bytes: same hash


def test_the_samples_stream_is_its_own_and_shared_by_the_conditions_of_a_pair(protocol):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.engine.rollout import run_rollout
    from robocasa_shift.policies import make_policy

    env, policy = get_backend("fake").make("Reach"), make_policy("fake")
    spec = specs.load_stage_spec("fake", "Reach")
    first = {}
    for condition in ("clean", "blur:L1"):
        key = RolloutKey("formal", "Reach", 4, condition)
        logger = StepLogger(key, protocol.study_seed)
        plain = run_rollout(env, policy, key, protocol, spec, "fake")
        logged = run_rollout(env, policy, key, protocol, spec, "fake", logger)
        assert comparable(plain.to_json()) == comparable(logged.to_json())
        first[condition] = logger.log(spec.names).samples[0]
    # the first boundary's image is the same under blur:L1's mild blur for the fake policy's colour finder,
    # so the same stream gives the same first samples
    assert np.array_equal(first["clean"], first["blur:L1"])


def test_a_tampered_or_missing_step_log_is_refused_and_fails_the_audit(logged, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(logged, run_dir)
    store = RunStore(run_dir)
    records = sorted(store.records(), key=lambda r: (r["task"], r["episode"], r["condition"]))
    tampered, missing = records[0], records[1]
    path = log_path(store.record_path(RolloutKey.from_record(tampered)))
    log = StepLog.read(path)
    log.action[0, 0] += 0.5
    path.write_bytes(log.to_bytes())
    log_path(store.record_path(RolloutKey.from_record(missing))).unlink()
    with pytest.raises(StepLogError, match="changed since it was written"):
        store.step_log(tampered)
    with pytest.raises(StepLogError, match="cannot be read"):
        store.step_log(missing)
    proc = cli("audit", str(run_dir), check=False)
    assert proc.returncode == 1
    report = json.loads((run_dir / "audit.json").read_text())
    problems = [p for t in report["tasks"].values() for p in t["checks"]["step_log_problems"]["rollouts"]]
    assert len(problems) == 2 and any("changed since" in p for p in problems) and any("cannot be read" in p for p in problems)
    assert cli("audit", str(logged)).returncode == 0


def test_a_step_log_that_disagrees_with_its_record_fails_the_audit(logged, tmp_path):
    import hashlib
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(logged, run_dir)
    store = RunStore(run_dir)
    record = sorted(store.records(), key=lambda r: (r["task"], r["episode"], r["condition"]))[0]
    record_path = store.record_path(RolloutKey.from_record(record))
    log = StepLog.read(log_path(record_path))
    short = StepLog(meta=log.meta, eef_pos=log.eef_pos[:-1], action=log.action[:-1], latched=log.latched[:-1],
                    boundary=log.boundary, samples=log.samples, features=log.features)
    data = short.to_bytes()
    log_path(record_path).write_bytes(data)
    record["step_log"] = {**record["step_log"], "sha256": hashlib.sha256(data).hexdigest()}
    record_path.write_text(json.dumps(record))  # a consistent hash, but one step short
    assert cli("audit", str(run_dir), check=False).returncode == 1
    report = json.loads((run_dir / "audit.json").read_text())
    problems = [p for t in report["tasks"].values() for p in t["checks"]["step_log_problems"]["rollouts"]]
    assert len(problems) == 1
    assert problems[0].startswith(f"{RolloutKey.from_record(record).id}: {log.steps - 1} logged steps, the record has {log.steps}")


def test_a_file_that_is_not_a_step_log_is_refused_without_unpickling(tmp_path):
    np.save(tmp_path / "evil.npy", np.array([object()], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "evil.npz", meta=np.array([object()], dtype=object))
    with pytest.raises(StepLogError, match="not a readable step log"):
        StepLog.read(tmp_path / "evil.npz")
    np.savez(tmp_path / "other.npz", meta=np.frombuffer(b'{"format": "something else"}', dtype=np.uint8))
    with pytest.raises(StepLogError, match="not a readable step log|format"):
        StepLog.read(tmp_path / "other.npz")


def test_retried_rollouts_keep_their_old_logs_in_the_history_and_merge_copies_logs(tmp_path):
    from robocasa_shift.study.pipeline import merge

    shards = []
    for i in range(2):
        shard = tmp_path / f"shard{i}"
        study = StudyConfig(backend="fake", policy="fake", log_steps=True)
        run(shard, ["Reach"], ["clean", "base:L3"], range(4), study, ExecutionConfig(workers=1, progress=False),
            shard=(i, 2))
        shards.append(shard)
    merge(tmp_path / "merged", shards)
    merged = RunStore(tmp_path / "merged")
    assert len(merged.records()) == 8 and all(merged.step_log(r) is not None for r in merged.records())
    assert cli("audit", str(tmp_path / "merged")).returncode == 0
    # a retried rollout: its old record and its old log go to history/ together
    record = merged.records()[0]
    key = RolloutKey.from_record(record)
    path = merged.record_path(key)
    path.write_text(json.dumps({**record, "valid": False, "error": "injected", "error_kind": "runtime"}))
    study = StudyConfig(backend="fake", policy="fake", log_steps=True)
    run(tmp_path / "merged", ["Reach"], ["clean", "base:L3"], range(4), study, ExecutionConfig(workers=1, progress=False),
        retry_errors=True)
    history = list((tmp_path / "merged" / "history").rglob("*.json"))
    assert len(history) == 1 and log_path(history[0]).exists()
    assert merged.step_log(merged.records()[0]) is not None


@pytest.mark.sim
def test_the_reference_policy_draws_monitor_samples_without_changing_its_rollout(lift_env, protocol):
    from robocasa_shift.engine.rollout import run_rollout
    from robocasa_shift.policies import make_policy

    policy = make_policy("reference")
    spec = specs.load_stage_spec("robosuite", "Lift")
    key = RolloutKey("formal", "Lift", 0, "camera:L2")
    plain = run_rollout(lift_env, policy, key, protocol, spec, "robosuite", horizon=60)
    logger = StepLogger(key, protocol.study_seed)
    logged = run_rollout(lift_env, policy, key, protocol, spec, "robosuite", logger, horizon=60)
    assert comparable(plain.to_json()) == comparable(logged.to_json()) and plain.valid
    log = logger.log(spec.names)
    assert log.samples.shape == (plain.policy_calls, 8, 6)
    spread = log.samples.std(axis=1).mean(axis=1)  # the sampling-disagreement score at each boundary
    assert np.isfinite(spread).all() and spread.max() > 0.0


def test_the_step_logs_export_as_one_tidy_table_a_row_per_control_step(logged, tmp_path):
    import pandas as pd

    cli("export", str(logged), "--out", str(tmp_path / "records.csv"), "--steps", str(tmp_path / "steps.csv"))
    steps = pd.read_csv(tmp_path / "steps.csv")
    records = RunStore(logged).records()
    assert len(steps) == sum(r["steps"] for r in records)
    per_rollout = steps.groupby(["task", "episode", "condition"])
    assert per_rollout["boundary"].sum().sort_index().tolist() == \
        [r["policy_calls"] for r in sorted(records, key=lambda r: (r["task"], r["episode"], r["condition"]))]
    assert per_rollout["latched"].max().sort_index().tolist() == \
        [r["stages_completed"] for r in sorted(records, key=lambda r: (r["task"], r["episode"], r["condition"]))]
    assert steps["sample_std"].notna().sum() == steps["boundary"].sum()
