"""RESCUE's label-leak control, the SAFE-style sequence head and the pooled-AUC report's feature-set analyses
(incremental value, time-resolved fusion with a shuffled control, CKA), each on data the test makes, with an
answer worked out by hand or by exact enumeration."""

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.analysis import monitor_decision as decision
from robocasa_shift.analysis import monitor_detection as detection
from robocasa_shift.monitoring import monitors


def boundary_table(outcomes, task="A", condition="clean", boundaries=(0, 10, 20), horizon=40):
    """One row per boundary: rollouts ``task/e`` with ``outcomes[e]`` (True: success); failures run to the
    horizon, successes end at the last boundary + 5."""
    rows = []
    for episode, success in enumerate(outcomes):
        steps = boundaries[-1] + 5 if success else horizon
        for step in boundaries:
            rows.append({"rollout_id": f"formal/{task}/{episode}/{condition}", "task": task, "episode": episode,
                         "condition": condition, "success": bool(success), "steps": steps, "horizon": horizon,
                         "step": step, "score": 0.0})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- the label leak


def test_the_label_leak_scores_every_failure_boundary_infinite_and_every_success_boundary_zero():
    table = boundary_table([True, False, True])
    leak = monitors.label_leak_scores(table)
    assert list(leak.columns) == list(table.columns) and leak.drop(columns="score").equals(table.drop(columns="score"))
    assert (leak.loc[~leak["success"], "score"] == np.inf).all() and (leak.loc[leak["success"], "score"] == 0).all()


def test_the_label_leak_is_the_ideal_detector_worked_out_by_hand_and_minus_the_leak_is_rejected():
    # validation: 20 successes and 4 failures; test: 30 successes (25 steps) and 6 failures (40-step timeouts)
    validation = monitors.label_leak_scores(boundary_table([True] * 20 + [False] * 4))
    test = monitors.label_leak_scores(boundary_table([True] * 30 + [False] * 6, task="A").assign(
        rollout_id=lambda d: d["rollout_id"].str.replace("formal/A/", "formal/A/t")))
    window = {"A": None}
    ep_val = detection.episode_scores(validation, window)
    # every success ties at 0: no observed score meets 5%, so +inf, which only the failures reach
    threshold = detection.select_threshold(ep_val[ep_val["success"]], 0.05)
    assert threshold == np.inf
    ep_test = detection.episode_scores(test, window)
    fail = ~ep_test["success"].to_numpy()
    assert detection.roc_auc(ep_test["score"][fail], ep_test["score"][~fail]) == 1.0
    alarms = detection.alarm_steps(test, threshold, window).set_index("rollout_id").loc[ep_test["rollout_id"]]
    assert (alarms["alarm_step"][fail] == 0).all() and alarms["alarm_step"][~fail].isna().all()
    episodes = pd.DataFrame({"success": ep_test["success"].to_numpy(), "steps": ep_test["steps"].to_numpy(),
                             "alarm_step": alarms["alarm_step"].to_numpy()})
    sheet = decision.worksheet(episodes, decision.CostModel(kappa=0.1))
    assert (sheet["d"], sheet["t_d"], sheet["f"]) == (1.0, 0.0, 0.0)
    # by hand: c = 0.1 / 25 per step. Never intervening, a success costs 25c = 0.1 and a failure 40c + 1
    # (a reset, then a fresh attempt): C_never = (30 * 0.1 + 6 * 1.16) / 30 = 0.332 per completed task.
    # Stopping each failure at step 0 costs the reset alone: (30 * 0.1 + 6 * 1) / 30 = 0.3, so the
    # excess is -0.032, in direct accounting and in the closed form
    assert sheet["C_never"] == pytest.approx(0.332)
    assert sheet["excess_direct"] == pytest.approx(-0.032) and sheet["excess_closed"] == pytest.approx(-0.032)
    # the other side: minus the leak ranks every failure last and never alarms on one
    flipped = test.assign(score=-test["score"])
    ep_flip = detection.episode_scores(flipped, window)
    assert detection.roc_auc(ep_flip["score"][fail], ep_flip["score"][~fail]) == 0.0


# --------------------------------------------------------------------------- the sequence head


def _sequences(n, rng, signal=1.0, length=8, width=3):
    """n rollouts alternating failure / success; a failure's first feature drifts up after half its boundaries."""
    features, failed = [], []
    for i in range(n):
        bad = i % 2 == 0
        x = 0.3 * rng.standard_normal((length + i % 3, width))
        if bad:
            x[length // 2:, 0] += signal
        features.append(x)
        failed.append(bad)
    return features, failed


def test_the_sequence_head_learns_a_late_failure_signal_and_is_deterministic_from_its_seed():
    pytest.importorskip("torch")
    from robocasa_shift.errors import AnalysisError
    from robocasa_shift.monitoring import sequence

    rng = np.random.default_rng(0)
    features, failed = _sequences(20, rng)
    head = sequence.fit(features, failed, seed=3)
    new_features, new_failed = _sequences(20, np.random.default_rng(1))
    last = np.array([head.boundary_scores(f)[-1] for f in new_features])
    bad = np.asarray(new_failed)
    assert detection.roc_auc(last[bad], last[~bad]) > 0.9  # it learned the drift, on rollouts it never saw
    # causal: a boundary's score reads only the boundaries up to it
    f = new_features[0]
    assert np.allclose(head.boundary_scores(f[:5]), head.boundary_scores(f)[:5], atol=1e-6)
    # a seed gives the same head bit for bit, whatever else drew from torch's global generator; another seed another
    import torch

    torch.manual_seed(123)
    again = sequence.fit(features, failed, seed=3)
    assert all(np.array_equal(head.state[k], again.state[k]) for k in head.state)
    assert torch.initial_seed() == 123  # the global generator is left as it was
    other = sequence.fit(features, failed, seed=4)
    assert not np.array_equal(head.state["out.weight"], other.state["out.weight"])
    with pytest.raises(AnalysisError, match="failures and successes"):
        sequence.fit(features[1::2], failed[1::2], seed=3)


# --------------------------------------------------------------------------- feature sets


def test_linear_cka_is_one_under_an_orthogonal_rotation_and_rescaling_and_the_squared_correlation_by_hand():
    from robocasa_shift.analysis.monitor_features import linear_cka

    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 5))
    q, _ = np.linalg.qr(rng.standard_normal((5, 5)))
    assert linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, 3.0 * x + 2.0) == pytest.approx(1.0, abs=1e-12)
    # by hand: x = (1, 2, 3), y = (1, 3, 2) centre to (-1, 0, 1) and (-1, 1, 0): x.y = 1, |x|^2 = |y|^2 = 2,
    # CKA = 1^2 / (2 * 2) = 0.25, their squared correlation (0.5^2)
    assert linear_cka(np.array([[1.0], [2.0], [3.0]]), np.array([[1.0], [3.0], [2.0]])) == pytest.approx(0.25)
    # unrelated sets score low, and a constant set has none
    assert linear_cka(x, rng.standard_normal((30, 5))) < 0.5
    assert np.isnan(linear_cka(x, np.ones((30, 2))))


def test_the_sign_flip_p_enumerates_every_sign_assignment_and_the_task_summary_is_worked_out_by_hand():
    from robocasa_shift.analysis.monitor_features import signflip_p, task_summary

    # (0.1, 0.2, 0.3): of the 8 assignments only all-plus and all-minus reach |mean| 0.2, so p = 2/8
    assert signflip_p([0.1, 0.2, 0.3]) == pytest.approx(0.25)
    # (0.1, -0.1): the means are 0.1, 0, 0, -0.1; all four reach |0| -> p = 1
    assert signflip_p([0.1, -0.1]) == 1.0
    assert signflip_p([]) is None
    summary = task_summary({"A": 0.1, "B": 0.2, "C": 0.3})
    # mean 0.2, SD 0.1, t(0.975, 2) = 4.302653: half-width 4.302653 * 0.1 / sqrt(3) = 0.248414
    assert summary["mean"] == pytest.approx(0.2) and summary["positive"] == "3/3"
    assert summary["ci95"] == pytest.approx([0.2 - 0.248414, 0.2 + 0.248414], abs=1e-6)
    assert task_summary({"A": 0.1, "B": -0.2})["ci95"] == [None, None]  # below 3 tasks, no interval
    # flipping every sign flips the mean and the interval and keeps p
    flipped = task_summary({"A": -0.1, "B": -0.2, "C": -0.3})
    assert flipped["mean"] == pytest.approx(-0.2) and flipped["positive"] == "0/3"
    assert flipped["ci95"] == pytest.approx([-0.2 - 0.248414, -0.2 + 0.248414], abs=1e-6)
    assert flipped["signflip_p"] == summary["signflip_p"]


def test_the_first_pls_direction_is_the_normalised_covariance_with_the_target():
    from robocasa_shift.analysis.monitor_features import pls_directions

    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 4))
    x -= x.mean(axis=0)
    target = x[:, 1] - 0.5 * x[:, 3] + 0.1 * rng.standard_normal(40)
    rotation = pls_directions(x, target, 1)
    w = x.T @ (target - target.mean())
    assert rotation[:, 0] == pytest.approx(w / np.linalg.norm(w) / (x.T @ (x @ w / np.linalg.norm(w)) /
                                           ((x @ w / np.linalg.norm(w)) @ (x @ w / np.linalg.norm(w)))
                                           @ (w / np.linalg.norm(w))))
    # k directions: scores x @ R reproduce the NIPALS scores, and are uncorrelated
    scores = x @ pls_directions(x, target, 3)
    gram = scores.T @ scores
    assert np.allclose(gram - np.diag(np.diag(gram)), 0, atol=1e-9)


def _feature_logs(n_per_task=18, tasks=("A", "B", "C"), seed=0, informative="middle"):
    """Feature logs with three sets: ``noise`` (2), ``middle`` (2) and ``base`` (2). Failures show in the set named by
    ``informative`` (its first column rises); the others are noise."""
    from robocasa_shift.monitoring.probe import FeatureLogs

    rng = np.random.default_rng(seed)
    rows, steps, features = [], {}, {}
    for task in tasks:
        for episode in range(n_per_task):
            success = episode % 3 != 0
            rid = f"formal/{task}/{episode}/clean"
            rows.append({"rollout_id": rid, "task": task, "episode": episode, "condition": "clean",
                         "success": success, "steps": 40 if success else 60, "horizon": 60})
            n = 5 if success else 7
            x = rng.standard_normal((n, 6))
            column = {"noise": 0, "middle": 2, "base": 4}[informative]
            x[:, column] += 0.0 if success else 3.0
            steps[rid] = np.arange(n) * 10
            features[rid] = x
    splits = {t: {"validation": list(range(0, n_per_task, 2)), "test": list(range(1, n_per_task, 2))} for t in tasks}
    return FeatureLogs(pd.DataFrame(rows), steps, features, [("noise", 2), ("middle", 2), ("base", 2)]), splits


def test_an_added_set_that_holds_the_failure_signal_has_held_out_value_and_one_of_noise_has_none():
    from robocasa_shift.monitoring import feature_sets

    logs, splits = _feature_logs()
    pooled = feature_sets.pooled_features(logs, {"A": None, "B": None, "C": None})
    table = feature_sets.incremental_table(logs, splits, pooled)
    assert set(table["added"]) == {"noise", "middle"} and set(table["method"]) == {"pca", "pls"}
    assert set(table["task"]) == {"A", "B", "C"} and (table["base"] == "base").all()
    middle = table[table["added"] == "middle"]
    noise = table[table["added"] == "noise"]
    # the middle set separates failures on every held-out task; the noise set adds nothing worth having
    assert (middle["combined_auc"] == 1.0).all() and (middle["delta"] > 0).all()
    assert noise["delta"].mean() < middle["delta"].mean()
    # the early window pools only the boundaries up to it: up to step 0, the first boundary alone
    first = feature_sets.pooled_features(logs, {"A": 0, "B": 0, "C": 0})
    rid = "formal/A/0/clean"
    assert np.array_equal(first[rid], logs.features[rid][0])


def test_fusion_beats_its_shuffled_control_only_when_the_added_set_is_aligned_with_its_own_rollout():
    pytest.importorskip("torch")
    from robocasa_shift.monitoring import feature_sets

    logs, splits = _feature_logs()
    donors = feature_sets._shuffled_donors(logs, splits, seed=0)
    split_of = {f"formal/{t}/{e}/clean": side for t, parts in splits.items() for side, eps in parts.items()
                for e in eps}
    # a derangement within (task, partition): nobody is their own donor, donors share task and partition
    assert all(d != r and d.split("/")[1] == r.split("/")[1] and split_of[d] == split_of[r] for r, d in donors.items())
    table = feature_sets.fusion_table(logs, splits, {"A": None, "B": None, "C": None}, "middle", seed=0)
    assert list(table["task"]) == ["A", "B", "C"]
    # the aligned added set separates every held-out task; the shuffled one, like the base, is noise there
    assert (table["fusion_auc"] == 1.0).all()
    assert (table["fusion_minus_shuffled"] > 0).all() and (table["fusion_minus_base"] > 0).all()


def test_without_umap_learn_the_geometry_figure_is_a_pca_projection_and_says_why(tmp_path, monkeypatch):
    import sys

    from robocasa_shift.monitoring import feature_sets
    from robocasa_shift.report.monitors import geometry_figure

    logs, _ = _feature_logs(n_per_task=6)
    pooled = feature_sets.pooled_features(logs, {"A": None, "B": None, "C": None})
    monkeypatch.setitem(sys.modules, "umap", None)  # what an environment without the geometry extra sees
    geometry = feature_sets.geometry(logs, pooled, seed=0)
    method = geometry.method
    assert method.startswith("PCA") and "umap-learn is not installed" in method and "[geometry]" in method
    assert set(geometry.embeddings) == {n for n, _ in logs.blocks}
    assert all(xy.shape == (len(pooled), 2) for xy in geometry.embeddings.values())
    entry = geometry_figure(tmp_path, geometry)
    assert entry["file"] == feature_sets.GEOMETRY_FIGURE and (tmp_path / entry["file"]).is_file()
    assert "PCA" in entry["kind"]


def test_when_the_base_set_already_separates_every_task_fusion_and_its_shuffled_control_add_exactly_nothing():
    pytest.importorskip("torch")
    from robocasa_shift.analysis.monitor_features import task_summary
    from robocasa_shift.monitoring import feature_sets

    # the other side of the fusion test: the failure signal in the base set, the added set noise
    logs, splits = _feature_logs(n_per_task=9, informative="base")
    table = feature_sets.fusion_table(logs, splits, {"A": None, "B": None, "C": None}, "middle", seed=0)
    assert (table[["base_auc", "fusion_auc", "shuffled_auc"]] == 1.0).all().all()
    assert (table["fusion_minus_base"] == 0).all() and (table["fusion_minus_shuffled"] == 0).all()
    summary = task_summary(dict(zip(table["task"], table["fusion_minus_shuffled"])))
    assert summary["mean"] == 0 and summary["positive"] == "0/3" and summary["signflip_p"] == 1.0
