"""A score bundle: monitors computed elsewhere, replayed onto a run and judged by the monitor study's analyses."""

from __future__ import annotations

import pandas as pd
import pytest

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import AnalysisError
from robocasa_shift.monitoring import monitors
from robocasa_shift.monitoring.study import evaluate
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.runner import run


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("bundle") / "run"
    run(run_dir, ["Reach", "PickPlace"], ["clean", "blur:L3"], range(12),
        StudyConfig(backend="fake", policy="fake", log_steps=True), ExecutionConfig(workers=1, progress=False))
    return run_dir


def _bundle(run_dir, name, fn):
    """Rows (rollout_id, step, monitor, score) of ``fn(log)`` over every logged formal rollout."""
    store = RunStore(run_dir)
    rows = []
    for record in store.records():
        log = store.step_log(record)
        if log is None or not record["valid"]:
            continue
        key = RolloutKey.from_record(record).id
        for step, value in zip(log.boundary.tolist(), fn(log, record).tolist()):
            rows.append({"rollout_id": key, "step": step, "monitor": name, "score": value})
    return pd.DataFrame(rows)


def test_a_replayed_monitor_gets_exactly_the_registered_ones_numbers(logged, tmp_path):
    bundle = _bundle(logged, "replayed_jerk", lambda log, r: monitors.action_jerk(log))
    bundle.to_csv(tmp_path / "scores.csv", index=False)
    summary = evaluate(logged, ["action_jerk"], n_resamples=50, bundle=tmp_path / "scores.csv")
    assert summary["monitors"] == ["action_jerk", "replayed_jerk"] and "replayed_jerk" in summary["real_monitors"]
    assert summary["score_bundle"]["monitors"]["replayed_jerk"] == {"scored": summary["rollouts"], "left_out": 0}
    detection = pd.read_csv(logged / "monitors" / "detection.csv")
    a = detection[detection.monitor == "action_jerk"].drop(columns="monitor").reset_index(drop=True)
    b = detection[detection.monitor == "replayed_jerk"].drop(columns="monitor").reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b)


def test_an_oracle_bundle_separates_failures_perfectly(logged, tmp_path):
    bundle = _bundle(logged, "oracle", lambda log, r: pd.Series([0.0 if r["success"] else 1.0] * len(log.boundary)))
    bundle.to_csv(tmp_path / "oracle.csv", index=False)
    summary = evaluate(logged, ["length_only"], n_resamples=50, bundle=tmp_path / "oracle.csv")
    pooled = [row for row in summary["pooled_detection"] if row["monitor"] == "oracle" and row["window"] == "end"]
    assert [row["pooled_auc"] for row in pooled] == [1.0]  # every condition pooled: failures all score above


@pytest.mark.parametrize("edit, message", [
    (lambda b: b.assign(rollout_id=b.rollout_id.where(b.index != 3, "formal/Reach/0999/clean/r0")), r"line 5: rollout .* is not a valid"),
    (lambda b: b.assign(step=b.step.where(b.index != 0, 10**6)), r"line 2: step 1000000 is past the end"),
    (lambda b: b.assign(step=b.step.astype(float).where(b.index != 1, 2.5)), r"line 3: field 'step' must be a whole step"),
    (lambda b: b.assign(score=b.score.where(b.index != 2, float("inf"))), r"line 4: field 'score' must be a finite number"),
    (lambda b: b.assign(monitor="action_jerk"), "has the name of a registered monitor"),
    (lambda b: b.assign(monitor=b.monitor.where(b.index != 0, "../x")), r"line 2: field 'monitor' '../x' is not a name"),
    (lambda b: pd.concat([b, b.iloc[:1]]), "has two scores of"),
    (lambda b: b.drop(columns="score"), "no column 'score'"),
])
def test_a_bad_bundle_is_refused_naming_the_line_and_field(logged, tmp_path, edit, message):
    bundle = _bundle(logged, "mine", lambda log, r: monitors.length_only(log))
    edit(bundle).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(AnalysisError, match=message):
        evaluate(logged, ["length_only"], n_resamples=20, bundle=tmp_path / "bad.csv")
