"""Runtime monitors (monitoring/monitors.py, monitoring/study.py): scores from step logs, the study, the CLI, the report.

Monitor definitions are checked on hand-made logs with hand-computed scores; the study runs on a
fake-backend run with step logs.
"""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from helpers import cli

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.steplog import StepLog
from robocasa_shift.errors import AnalysisError, UnknownNameError
from robocasa_shift.monitoring import monitors
from robocasa_shift.study.runner import run


def _log(eef, boundary, actions=None, samples=None):
    eef = np.asarray(eef, dtype=float)
    steps = len(eef) - 1
    actions = np.zeros((steps, 3)) if actions is None else np.asarray(actions, dtype=float)
    return StepLog(meta={"arm_dims": [0, 1], "gripper_dim": 2, "samples": 0 if samples is None else 8},
                   eef_pos=eef, action=actions, latched=np.zeros(steps, dtype=int), boundary=np.asarray(boundary),
                   samples=samples)


def test_steps_since_progress_counts_boundaries_since_the_arm_last_moved_more_than_a_centimetre():
    # boundaries at steps 0, 2, 4, 6, 8; the arm moves 5 cm, then 0.5 cm, 0.2 cm, then 3 cm
    x = [0.0, 0.0, 0.05, 0.05, 0.055, 0.055, 0.057, 0.057, 0.087]
    log = _log([[v, 0.0, 0.0] for v in x], [0, 2, 4, 6, 8])
    assert monitors.steps_since_progress(log).tolist() == [0.0, 0.0, 1.0, 2.0, 0.0]
    assert monitors.inverted_progress(log).tolist() == [0.0, 0.0, -1.0, -2.0, 0.0]
    assert monitors.length_only(log).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert monitors.clock(log).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_action_jerk_is_the_mean_absolute_first_difference_of_the_arm_commands_over_16_steps():
    steps = 20
    actions = np.zeros((steps, 3))
    actions[:, 0] = np.arange(steps) % 2  # 0, 1, 0, 1, ...: |diff| = 1 on dimension 0
    actions[:, 2] = np.arange(steps)  # the gripper is not an arm command: never counted
    log = _log(np.zeros((steps + 1, 3)), [0, 1, 4, 20], actions)
    jerk = monitors.action_jerk(log)
    assert np.isnan(jerk[0]) and np.isnan(jerk[1])  # fewer than two actions taken
    assert jerk[2] == pytest.approx(0.5)  # steps 0-3: diffs (1, 1, 1) on dim 0, 0 on dim 1 -> mean 0.5
    assert jerk[3] == pytest.approx(0.5)  # the trailing 16 steps only


def test_sampling_disagreement_is_the_mean_standard_deviation_across_samples_and_undefined_without_them():
    samples = np.zeros((2, 8, 2), dtype=np.float32)
    samples[1, :, 0] = [0, 2] * 4  # std 1 on dimension 0, 0 on dimension 1
    log = _log(np.zeros((5, 3)), [0, 2], samples=samples)
    assert monitors.sampling_disagreement(log).tolist() == [0.0, 0.5]
    assert np.isnan(monitors.sampling_disagreement(_log(np.zeros((5, 3)), [0, 2]))).all()


def test_an_unknown_monitor_lists_the_registered_ones_and_a_wrong_length_is_refused(monkeypatch):
    log = _log(np.zeros((5, 3)), [0, 2])
    with pytest.raises(UnknownNameError, match="steps_since_progress"):
        monitors.score("steps-since-progress", log)
    monkeypatch.setitem(monitors.MONITORS._entries, "broken_for_test", lambda log: np.zeros(1))  # undone after the test
    with pytest.raises(AnalysisError, match="returned 1 scores for 2 boundaries"):
        monitors.score("broken_for_test", log)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("monitors") / "run"
    study = StudyConfig(backend="fake", policy="fake", log_steps=True)
    # 24 base episodes: 12 clean validation successes per task, enough for a finite threshold at 5%
    run(run_dir, ["Reach", "PickPlace"], ["clean", "camera:L3", "blur:L3", "base:L3", "illumination:L3"], range(24),
        study, ExecutionConfig(workers=2, progress=False))
    return run_dir


def _copy_without_results(corpus, dest):
    """The corpus's records and step logs, without any study's results (``monitors/``)."""
    import shutil

    shutil.copytree(corpus, dest, ignore=lambda folder, names: ["monitors"] if Path(folder) == corpus else [])
    return dest


@pytest.fixture(scope="module")
def evaluated(corpus, tmp_path_factory):
    """The full study (every monitor, both trained heads, the figures) on a copy of the corpus, run once: its run
    directory and summary."""
    from robocasa_shift.report.monitors import evaluate_monitors

    run_dir = _copy_without_results(corpus, tmp_path_factory.mktemp("evaluated") / "run")
    return run_dir, evaluate_monitors(run_dir, n_resamples=50)


@pytest.mark.slow
def test_the_monitor_study_writes_every_table_with_thresholds_frozen_from_clean_validation(evaluated):
    corpus, summary = evaluated
    out = corpus / "monitors"
    for name in ("summary.json", "summary.md", "detection.csv", "decision.csv", "loto.csv", "verdicts.csv"):
        assert (out / name).is_file(), name
    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(summary, default=str))
    assert summary["rollouts"] == 2 * 5 * 24 and summary["excluded"]["without_step_log"] == 0
    # splits by base episode: a base episode's five conditions are on one side
    for task, parts in summary["splits"].items():
        assert not set(parts["validation"]) & set(parts["test"]) and len(parts["validation"]) == 12
    table = pd.read_csv(out / "detection.csv")
    # every registered monitor, the label leak, and the probe and the sequence head (the fake policy exposes features)
    trained = {"hidden_state_probe", "sequence_head"}
    assert set(table["window"]) == {"end", "early", "cap"} and set(table["monitor"]) == set(monitors.monitor_names()) | {
        "label_leak"} | trained
    # one threshold per (monitor, window), whatever the condition
    assert (table.groupby(["monitor", "window"])["threshold"].nunique(dropna=False) == 1).all()
    # the pooled AUC is its within/between decomposition
    both = table.dropna(subset=["within_auc", "between_auc"])
    assert np.allclose(both["pooled_auc"], both["weight_within"] * both["within_auc"]
                       + both["weight_between"] * both["between_auc"])
    decision = pd.read_csv(out / "decision.csv")
    assert len(decision) == (len(monitors.monitor_names()) + 3) * (5 + 1)  # five conditions and all of them pooled
    # enough clean validation successes: a finite threshold where the scores separate them, and alarms
    jerk = decision[decision["monitor"] == "action_jerk"]
    assert np.isfinite(jerk["threshold"]).all() and (jerk["alarm_rate"] > 0).any()
    assert "Warning" not in (out / "summary.md").read_text()
    alarms = pd.read_csv(out / "alarms.csv")
    episodes = alarms["rollout_id"].map(lambda r: (r.split("/")[1], int(r.split("/")[2])))
    assert len(alarms) and all(e in summary["splits"][t]["test"] for t, e in episodes)
    # direct accounting and the closed form agree on every row that has both
    rows = decision.dropna(subset=["excess_direct", "excess_closed"])
    assert len(rows) and np.allclose(rows["excess_direct"], rows["excess_closed"])
    # the cap window is a quarter of the horizon; the early window ends at the shortest clean validation success
    from robocasa_shift.rundir.store import RunStore

    records = RunStore(corpus).records()
    for task in ("Reach", "PickPlace"):
        horizon = next(r["horizon"] for r in records if r["task"] == task)
        assert summary["windows"]["cap"][task] == horizon // 4
        shortest = min(r["steps"] for r in records if r["task"] == task and r["condition"] == "clean" and r["success"]
                       and r["episode"] in summary["splits"][task]["validation"])
        assert summary["windows"]["early"][task] == shortest
    verdicts = {v["monitor"]: v for v in summary["verdicts"]}
    assert set(verdicts) == set(monitors.monitor_names()) | {"label_leak"} | trained
    # both trained monitors refitted without each held-out task for leave one task out
    loto = pd.read_csv(out / "loto_macro.csv")
    assert set(loto.loc[loto["kind"] == "refitted without the held-out task", "monitor"]) == trained
    assert summary["sequence_head"]["n_training_rollouts"] == summary["hidden_state_probe"]["n_training_rollouts"]
    # the feature sets the fake policy names: incremental value of each added set by both combiners, fusion with its
    # shuffled control on the best of them, CKA between every pair, and the geometry figure
    sets = summary["feature_sets"]
    assert sets["blocks"] == [["image", 1], ["target", 3], ["object", 3]] and sets["base"] == "object"
    assert {(r["added"], r["method"]) for r in sets["incremental"]} == {(a, m) for a in ("image", "target")
                                                                       for m in ("pca", "pls")}
    assert all(r["n_tasks"] == 2 and r["ci95"] == [None, None] for r in sets["incremental"])  # two tasks: no interval
    assert sets["fusion_added"] in ("image", "target") and len(sets["fusion_per_task"]) == 2
    assert {r["contrast"] for r in sets["fusion"]} == {"fusion_minus_base", "fusion_minus_shuffled"}
    assert len(sets["cka"]) == 3 and all(0 <= r["linear_cka"] <= 1 for r in sets["cka"])
    assert sets["geometry"] == "UMAP" and (out / "figures" / "latent__by_task.png").is_file()
    for name in ("incremental.csv", "fusion.csv", "cka.csv"):
        assert (out / name).is_file(), name
    # RESCUE's label-leak control: an ideal detector, so every criterion admits it, decision value included
    leak = verdicts["label_leak"]
    assert leak["end_auc"] == leak["early_auc"] == leak["cap_auc"] == 1.0
    assert leak["end_auc_admits"] and leak["early_auc_admits"] and leak["decision_admits"]
    leak_rows = decision[decision["monitor"] == "label_leak"]
    assert (leak_rows["f"].dropna() == 0).all() and (leak_rows["d"].dropna() == 1).all() and (leak_rows["t_d"].dropna() == 0).all()
    assert "label_leak" in summary["controls"] and "label_leak" not in summary["real_monitors"]
    assert all(isinstance(v["decision_admits"], bool) for v in verdicts.values())
    # the base-task robustness check beside the episode interval: its verdict, and whether it changed
    for v in verdicts.values():
        lo, hi = v["excess_ci95_tasks"]
        assert lo is not None and lo <= hi  # two tasks: defined
        assert v["decision_admits_tasks"] == (hi < 0)
        assert v["task_resampling_changes_verdict"] == (v["decision_admits"] != v["decision_admits_tasks"])
    assert summary["task_resampling"]["text"].startswith("Base-task resampling: the zero-exclusion verdict")
    assert summary["task_resampling"]["text"] in (out / "summary.md").read_text()
    # the success-length figure and its table: every rollout, per task, successes beside failures
    assert (out / "figures" / "lengths__by_task.png").is_file()
    assert "figures/lengths__by_task.png" in [f["file"] for f in summary["figures"]]
    lengths = {row["task"]: row for row in summary["lengths_by_task"]}
    for task in ("Reach", "PickPlace"):
        mine = [r for r in records if r["task"] == task and r["replicate"] == 0]
        assert lengths[task]["n_successes"] == sum(bool(r["success"]) for r in mine)
        assert lengths[task]["n_failures"] == sum(not r["success"] for r in mine)
    # the length-only control recovers timeouts: on the end window it ranks at least as well as chance
    assert verdicts["length_only"]["end_auc"] >= 0.5


@pytest.mark.slow
def test_the_monitor_study_is_deterministic_and_the_report_shows_it(corpus, evaluated, tmp_path):
    from robocasa_shift.monitoring.study import evaluate

    first, _ = evaluated
    copy = _copy_without_results(corpus, tmp_path / "copy")
    # a second study of the same logs, in another directory (without its figures: the tables do not depend on them)
    evaluate(copy, n_resamples=50)
    for name in ("detection.csv", "decision.csv", "verdicts.csv", "loto.csv", "incremental.csv", "fusion.csv", "cka.csv"):
        assert (copy / "monitors" / name).read_text() == (first / "monitors" / name).read_text(), name
    cli("report", str(first), "--videos", "0")
    page = (first / "report" / "index.html").read_text()
    assert "Runtime monitors as intervention rules" in page and "figures/roc__steps_since_progress.png" in page
    assert "figures/latent__by_task.png" in page and "Feature sets" in page and "sequence_head" in page
    assert (first / "monitors" / "figures" / "roc__steps_since_progress.png").is_file()


def test_the_monitors_command_refuses_a_run_without_step_logs_and_unknown_monitors(tmp_path, corpus):
    run(tmp_path / "plain", ["Reach"], ["clean"], range(2), StudyConfig(backend="fake", policy="fake"),
        ExecutionConfig(workers=1, progress=False))
    proc = cli("monitors", str(tmp_path / "plain"), check=False)
    assert proc.returncode == 2 and "--log-steps" in proc.stderr
    proc = cli("monitors", str(corpus), "--monitor", "jerk", check=False)
    assert proc.returncode == 2 and "action_jerk" in proc.stderr


def test_a_user_monitor_registered_by_name_is_evaluated_beside_the_built_in_ones(corpus, monkeypatch):
    from robocasa_shift.monitoring.study import evaluate

    monkeypatch.setitem(monitors.MONITORS._entries, "gripper_closed_for_test", lambda log: np.array(
        [float(np.sum(log.gripper[:s] > 0)) for s in log.boundary]))
    summary = evaluate(corpus, ["gripper_closed_for_test", "length_only"], n_resamples=20)
    assert [v["monitor"] for v in summary["verdicts"]] == ["gripper_closed_for_test", "length_only"]


@pytest.mark.slow
def test_alarms_routed_to_recover_are_priced_from_branches_at_the_alarm_checkpoints(corpus, tmp_path):
    import shutil

    from robocasa_shift.branching.checkpoints import BranchSettings
    from robocasa_shift.branching.study import Selection, branch
    from robocasa_shift.monitoring.study import evaluate

    run_dir = tmp_path / "run"
    shutil.copytree(corpus, run_dir)
    evaluate(run_dir, ["action_jerk"], n_resamples=20)
    alarms = pd.read_csv(run_dir / "monitors" / "alarms.csv").sort_values("rollout_id").head(3)
    assert len(alarms) == 3
    settings = BranchSettings(interventions=("recover",), k_initial=2, k_expanded=2)
    for row in alarms.itertuples():
        branch(run_dir, Selection(keys=(row.rollout_id,), steps=(int(row.alarm_step),)), settings,
               ExecutionConfig(workers=1, progress=False), name="alarms")
    summary = evaluate(run_dir, ["action_jerk"], n_resamples=20)
    assert summary["recover_checkpoints"] == 3
    decision = pd.read_csv(run_dir / "monitors" / "decision.csv")
    pooled = decision[decision["condition"] == "all"].iloc[0]
    assert pooled["recover_priced"] == 3 and pooled["recover_missing"] == pooled["n_alarmed_failures"] \
        + pooled["n_false_alarms"] - 3
    assert np.isfinite(pooled["recover_excess"])


def test_too_few_clean_validation_successes_for_the_target_are_reported_not_hidden(tmp_path):
    from robocasa_shift.monitoring.study import evaluate

    study = StudyConfig(backend="fake", policy="fake", log_steps=True)
    run(tmp_path / "small", ["Reach"], ["clean", "base:L3"], range(6), study, ExecutionConfig(workers=1, progress=False))
    evaluate(tmp_path / "small", ["steps_since_progress"], n_resamples=10)
    text = (tmp_path / "small" / "monitors" / "summary.md").read_text()
    assert "**Warning**: 3 clean validation successes" in text
    assert pd.read_csv(tmp_path / "small" / "monitors" / "decision.csv")["threshold"].eq(np.inf).all()
