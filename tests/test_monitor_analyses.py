"""The monitors study's further analyses, each on a hand-made table with an answer worked out by hand:
baselines (task identity, elapsed time), leave-one-task-out macro summaries, the pooled-minus-macro gap,
functional conformal bands, fixed horizons, AUC-PDT and Timely, cost-optimal thresholds, the paired
random-alarm interval, and the hidden-state probe."""


import numpy as np
import pandas as pd
import pytest

from robocasa_shift.errors import AnalysisError
from robocasa_shift.analysis import monitor_conformal as conformal, monitor_decision as decision, monitor_detection as detection
from robocasa_shift.monitoring import probe


def rollout(rid, task, episode, success, steps, scores, condition="clean", horizon=100, chunk=10, split=None):
    rows = [{"rollout_id": rid, "task": task, "episode": episode, "condition": condition, "success": success,
             "steps": steps, "horizon": horizon, "step": i * chunk, "score": float(s)} for i, s in enumerate(scores)]
    if split is not None:
        for row in rows:
            row["split"] = split
    return rows


def frame(*rollouts):
    return pd.DataFrame([row for rows in rollouts for row in rows])


# --------------------------------------------------------------------------- item 1: baselines


def test_the_task_identity_baseline_scores_a_task_by_its_validation_failure_rate_and_ranks_only_between_tasks():
    # task A: validation 1 failure of 2 (rate 0.5); task B: validation 0 of 2 (rate 0.0)
    scores = frame(
        rollout("a1", "A", 0, False, 100, [0, 0], split="validation"),
        rollout("a2", "A", 1, True, 30, [0, 0], split="validation"),
        rollout("b1", "B", 2, True, 40, [0, 0], split="validation"),
        rollout("b2", "B", 3, True, 50, [0, 0], split="validation"),
        rollout("a3", "A", 4, False, 100, [0, 0], split="test"),
        rollout("a4", "A", 5, True, 20, [0, 0], split="test"),
        rollout("b3", "B", 6, True, 60, [0, 0], split="test"),
    )
    rates = detection.task_base_rates(scores)
    assert rates == {"A": 0.5, "B": 0.0}
    ep = detection.episode_scores(detection.task_identity_scores(scores, rates), {"A": None, "B": None})
    test = ep[ep["rollout_id"].isin(["a3", "a4", "b3"])]
    d = detection.auc_decomposition(test)
    # failure a3 (0.5) vs successes a4 (0.5, tie: 1/2) and b3 (0.0, win: 1) -> pooled 0.75;
    # within task A: a tie, 0.5; between: a3 vs b3, 1.0; macro over A only: 0.5
    assert d.pooled_auc == 0.75 and d.within_auc == 0.5 and d.between_auc == 1.0 and d.macro_auc == 0.5
    # the elapsed-time baseline scores each boundary by its step
    assert detection.elapsed_time_scores(scores)["score"].tolist()[:2] == [0.0, 10.0]


def test_every_auc_table_holds_the_three_baselines_beside_the_monitor():
    scores = frame(*[rollout(f"{t}{e}", t, e, e % 2 == 0, 40 if e % 2 == 0 else 100, [e % 2] * 3,
                             condition=c) for t in ("A", "B") for e in range(4) for c in ("clean", "base:L1")])
    scores["rollout_id"] = scores["rollout_id"] + "/" + scores["condition"]
    splits = {"A": {"validation": [0, 1], "test": [2, 3]}, "B": {"validation": [0, 1], "test": [2, 3]}}
    table = detection.detection_table(scores, splits, {"end": {"A": None, "B": None}}, 0.5, ["all"])
    for prefix in ("length", "elapsed", "task_identity"):
        assert f"{prefix}_pooled_auc" in table and f"{prefix}_macro_auc" in table
    # every task fails half its validation rollouts: task identity carries nothing, AUC 0.5 everywhere
    assert table["task_identity_pooled_auc"].iloc[0] == 0.5 and table["task_identity_macro_auc"].iloc[0] == 0.5
    loto = detection.leave_one_task_out(detection.add_split_column(scores, splits), {"A": None, "B": None}, 0.5)
    assert set(loto["task_identity_auc"]) == {0.5} and "elapsed_time_auc" in loto


# --------------------------------------------------------------------------- item 2: leave one task out


def test_the_macro_over_held_out_tasks_has_a_t_interval_over_tasks_sd_and_range():
    summary = detection.task_macro({"A": 0.6, "B": 0.8, "C": 1.0, "D": None})
    assert summary["macro"] == pytest.approx(0.8)
    assert summary["sd"] == pytest.approx(0.2)  # sample SD of 0.6, 0.8, 1.0
    assert (summary["min"], summary["max"], summary["n_tasks"]) == (0.6, 1.0, 3)
    assert summary["tasks_without_value"] == ["D"]
    # 0.8 -+ t(2, 0.975) 0.2 / sqrt(3), t = 4.3027, clipped to [0, 1]: wider than the range of the three values
    assert summary["ci95"] == pytest.approx([0.8 - 4.302653 * 0.2 / 3 ** 0.5, 1.0], abs=1e-5)
    assert "measured coverage" in summary["interval"]
    one = detection.task_macro({"A": 0.7, "B": 0.9})
    assert one["ci95"] == [None, None] and one["interval"].startswith("not estimable: 2 task(s)")


# --------------------------------------------------------------------------- item 3: the gap


def test_the_pooled_minus_macro_gap_splits_exactly_into_its_two_terms():
    # task A: failure 3 vs successes 2, 1 (within: 1, 1); task B: failure 1 vs success 0 (within 1), and
    # B's failure (1) vs A's successes (2, 1): 0 and 1/2; A's failure (3) vs B's success (0): 1
    ep = pd.DataFrame({"task": ["A", "A", "A", "B", "B"], "success": [False, True, True, False, True],
                       "score": [3.0, 2.0, 1.0, 1.0, 0.0]})
    terms = detection.gap_terms(ep)
    assert terms["within_auc"] == 1.0 and terms["macro_auc"] == 1.0
    assert terms["between_auc"] == pytest.approx(1.5 / 3)  # pairs (1,2) 0, (1,1) 1/2, (3,0) 1
    assert terms["weight_between"] == pytest.approx(3 / 6)
    assert terms["pooled_auc"] == pytest.approx(4.5 / 6)
    assert terms["gap"] == pytest.approx(terms["term_between"] + terms["term_weights"])
    assert terms["term_between"] == pytest.approx(0.5 * (0.5 - 1.0)) and terms["term_weights"] == 0.0


def test_the_gap_interval_leaves_out_one_task_at_a_time_and_is_zero_when_every_task_is_the_same():
    one = [("A", False, 2.0), ("A", True, 1.0)]
    ep = pd.DataFrame([(t, s, v) for t in ("A", "B", "C") for _, s, v in one], columns=["task", "success", "score"])
    result = detection.gap_interval(ep)
    assert result["gap"] == 0.0 and result["ci95"] == [0.0, 0.0] and result["n_tasks"] == 3
    # tasks whose scores sit at different levels: between-task pairs can be easier
    ep3 = pd.DataFrame({"task": list("AAAABBBBCCCC"), "success": [False, True, True, False] * 3,
                        "score": [5, 4, 6, 1, 15, 14, 16, 11, 8, 9, 7, 2]})
    result = detection.gap_interval(ep3)
    assert result["ci95"][0] < result["gap"] < result["ci95"][1] and "measured coverage" in result["interval"]
    two = detection.gap_interval(ep3[ep3.task != "C"])  # two tasks: a jackknife of two is 0, no interval
    assert two["ci95"] == [None, None] and two["interval"].startswith("not estimable: 2 task(s)")


# --------------------------------------------------------------------------- item 4: functional CP


def test_a_functional_conformal_band_is_the_mean_plus_the_calibrated_quantile_times_the_modulation():
    fit = np.array([[0.0, 0.0, 0.0], [2.0, 2.0, 2.0]])  # mean 1; |deviation| 1 everywhere -> modulation 1
    calibration = np.array([[1.0, 1.0, 1.0], [1.0, 3.0, 1.0], [0.0, 0.0, 0.0]])  # R = 0, 2, -1
    # alpha 0.25: rank ceil(4 * 0.75) = 3 of 3 -> q = 2 -> band 3
    assert conformal.fit_band(fit, calibration, 0.25).tolist() == [3.0, 3.0, 3.0]
    # alpha 0.5: rank ceil(4 * 0.5) = 2 -> q = 0 -> band 1
    assert conformal.fit_band(fit, calibration, 0.5).tolist() == [1.0, 1.0, 1.0]
    # alpha 0.1: rank ceil(4 * 0.9) = 4 > 3 calibration curves: the band is infinite (never alarms)
    assert np.isinf(conformal.fit_band(fit, calibration, 0.1)).all()
    assert conformal.align([[1.0, 2.0], [5.0]]).tolist() == [[1.0, 2.0], [5.0, 5.0]]
    assert conformal.first_crossing(np.array([0.0, np.nan, 4.0, 5.0]), np.array([1.0, 1.0, 4.0])) == 3
    assert conformal.first_crossing(np.array([0.0]), np.array([1.0])) is None


def test_the_functional_conformal_sweep_reports_rates_per_alpha_with_their_spread_over_splits():
    rows = []
    for task in ("A",):
        for e in range(8):  # validation 0-3: clean successes (calibration); test 4-7: two successes, two failures
            fail = e >= 6
            curve = [0.0, 1.0, 5.0 if fail else 0.5]
            rows.append(rollout(f"{task}{e}", task, e, not fail, 100 if fail else 30, curve))
    scores = frame(*rows)
    splits = {"A": {"validation": [0, 1, 2, 3], "test": [4, 5, 6, 7]}}
    table = conformal.sweep(scores, splits, {"A": None}, alphas=(0.2, 0.25, 0.4), n_splits=3, seed=0,
                            evaluations={"all": ["clean"]})
    assert list(table["alpha"]) == [0.2, 0.25, 0.4] and (table["n_calibration"] == 4).all()
    # 4 calibration curves: 1 fits (30%), 3 calibrate; at alpha 0.2 the rank ceil(4 x 0.8) = 4 exceeds 3: no band
    first = table.iloc[0]
    assert first["finite_bands"] == 0 and first["catch_rate_mean"] == 0.0 and first["false_alarm_rate_mean"] == 0.0
    finite = table.iloc[1:]
    # identical calibration curves: the band is their curve, the failures (5.0 > 0.5) cross it, successes never
    assert (finite["catch_rate_mean"] == 1.0).all() and (finite["false_alarm_rate_mean"] == 0.0).all()
    # the first crossing is at the third boundary (step 20) of a 100-step window
    assert finite["effective_alarm_position_mean"].tolist() == pytest.approx([0.2, 0.2])
    assert (table["catch_rate_sd"] == 0.0).all() and (finite["finite_bands"] == 3).all()
    with pytest.raises(AnalysisError, match="at least two"):
        conformal.sweep(scores[scores["episode"] == 0], {"A": {"validation": [0], "test": []}}, {"A": None})


# --------------------------------------------------------------------------- items 5 and 6


def test_the_predeclared_fixed_horizons_are_fractions_of_each_tasks_horizon_and_below_100_ends_at_99():
    scores = frame(rollout("x", "A", 0, True, 40, [0, 1], horizon=400), rollout("y", "B", 0, True, 40, [0], horizon=60))
    windows = detection.fixed_horizon_windows(scores)
    assert windows == {"fixed_0.125": {"A": 50, "B": 7}, "fixed_0.25": {"A": 100, "B": 15},
                       "fixed_0.5": {"A": 200, "B": 30}}
    assert detection.below_step_window(scores) == {"A": 99, "B": 99}


def test_auc_pdt_averages_the_auc_over_the_share_of_each_attempt_observed_and_timely_counts_alarms_before_horizons():
    # one failure whose score rises at step 50 of 100; one success (steps 100) flat at 1
    scores = frame(rollout("f", "A", 0, False, 100, [0, 0, 0, 0, 0, 9, 9, 9, 9, 9, 9]),
                   rollout("s", "A", 1, True, 100, [1] * 11))
    fractions = detection.fraction_scores(scores)
    f = fractions[fractions["rollout_id"] == "f"][[f"f{x:g}" for x in detection.PDT_FRACTIONS]].to_numpy()
    s = fractions[fractions["rollout_id"] == "s"][[f"f{x:g}" for x in detection.PDT_FRACTIONS]].to_numpy()
    # fractions 0.1-0.4 observe steps <= 40: failure 0 < success 1 (AUC 0); from 0.5 on, 9 > 1 (AUC 1): mean 0.6
    assert detection.auc_pdt(f, s) == pytest.approx(0.6)
    assert detection.timely_rate(np.array([10, 50, np.nan, 30]), np.array([20, 40, 10, np.nan])) == (1, 2, 0.5)


# --------------------------------------------------------------------------- item 7


def test_the_cost_optimal_threshold_minimises_the_validation_excess_and_ties_go_to_fewer_alarms():
    # c = 0.01 per step, R = 1. Two failures of 100 steps, two successes of 50.
    validation = pd.DataFrame({"success": [False, False, True, True], "steps": [100, 100, 50, 50]})
    candidates = np.array([1.0, 2.0, np.inf])
    # threshold 1: alarms on every rollout at step 10; threshold 2: on the failures only, at step 10; inf: none
    alarms = np.array([[10.0, 10.0, np.nan], [10.0, 10.0, np.nan], [10.0, np.nan, np.nan], [10.0, np.nan, np.nan]])
    excess = decision.excess_by_candidate(validation["success"], validation["steps"], alarms, 0.01)
    # never: (0.01 * 300 + 2) / 2 = 2.5. Threshold 2: (2 * 1.1 + 2 * 0.5) / 2 = 1.6 -> -0.9; threshold 1: no completion
    assert excess[0] == np.inf and excess[1] == pytest.approx(-0.9) and excess[2] == pytest.approx(0.0)
    for k in range(3):
        sheet = decision.worksheet(validation.assign(alarm_step=alarms[:, k]), c=0.01)
        assert sheet["excess_direct"] is None if k == 0 else excess[k] == pytest.approx(sheet["excess_direct"])
    select = decision.cost_optimal_selector(validation, candidates, alarms, 0.01)
    assert select(np.arange(4)) == 2.0
    # on the successes alone nothing beats never intervening: the tie goes to +inf (no alarm at all)
    assert select(np.array([2, 3])) == np.inf


def test_beating_the_random_alarm_is_an_interval_of_the_paired_difference():
    rows = pd.DataFrame({"rollout_id": list("abcdef"), "task": "A", "episode": range(6),
                         "success": [True, True, True, False, False, False], "steps": [50, 50, 50, 100, 100, 100],
                         "score": [0.0, 0.0, 0.0, 1.0, 1.0, 1.0]})
    alarms = np.array([np.nan, np.nan, np.nan, 10.0, 10.0, 10.0])

    def alarms_for(positions, threshold):
        return alarms[positions]

    same = decision.bootstrap_excess(rows, rows, lambda s: 1.0, alarms_for, n_resamples=50, seed=0, strata=("task",),
                                     c=0.01, reference_alarms=alarms)
    assert same.diff_point == 0.0 and same.diff_lo == 0.0 and same.diff_hi == 0.0
    never = decision.bootstrap_excess(rows, rows, lambda s: 1.0, alarms_for, n_resamples=50, seed=0, strata=("task",),
                                      c=0.01, reference_alarms=np.full(6, np.nan))
    # stopping every failure at step 10 always saves 0.9 steps-worth per failure: the difference is below 0
    assert never.diff_point == pytest.approx(never.point) and never.diff_hi < 0


# --------------------------------------------------------------------------- item 8: the probe


def test_the_probe_learns_which_features_mark_failure_and_scores_the_running_mean_of_its_logits():
    rng = np.random.default_rng(0)
    features = [np.column_stack([np.full(4, 1.0 if bad else -1.0) + 0.1 * rng.standard_normal(4),
                                 rng.standard_normal(4)]) for bad in (True, False) * 5]
    failed = [True, False] * 5
    fitted = probe.fit(features, failed)
    assert fitted.weights[0] > 0 and abs(fitted.weights[0]) > abs(fitted.weights[1])
    logits = fitted.logits(np.array([[1.0, 0.0], [-1.0, 0.0]]))
    assert logits[0] > 0 > logits[1]
    scores = fitted.boundary_scores(np.array([[1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]]))
    assert scores == pytest.approx(np.cumsum(fitted.logits(np.array([[1.0, 0], [-1, 0], [-1, 0]]))) / [1, 2, 3])
    with pytest.raises(AnalysisError, match="failures and successes"):
        probe.fit(features[:1], failed[:1])


def test_the_probe_trains_on_clean_validation_rollouts_unless_they_lack_an_outcome():
    rows = [{"rollout_id": f"r{e}{c}", "task": "A", "episode": e, "condition": c, "success": not (c != "clean" or e == 0),
             "steps": 10, "horizon": 20} for e in range(4) for c in ("clean", "base:L1")]
    logs = probe.FeatureLogs(pd.DataFrame(rows), {}, {})
    splits = {"A": {"validation": [0, 1], "test": [2, 3]}}
    ids, kind = probe.training_rollouts(logs, splits)
    # the clean validation rollouts hold one failure (episode 0): every condition's validation rollouts are used
    assert sorted(ids) == ["r0base:L1", "r0clean", "r1base:L1", "r1clean"] and kind.startswith("validation rollouts of")
    # with two clean validation failures and two successes (episodes 0-3 validation), only the clean ones
    rows[2]["success"] = False  # episode 1, clean: now 2 clean validation failures
    splits = {"A": {"validation": [0, 1, 2, 3], "test": []}}
    logs.rollouts = pd.DataFrame(rows)
    assert probe.training_rollouts(logs, splits) == (["r0clean", "r1clean", "r2clean", "r3clean"],
                                                     "clean validation rollouts")
    # leaving task A out leaves nothing to train on
    assert probe.training_rollouts(logs, splits, exclude_task="A")[0] == []


def test_the_reference_policy_exposes_every_layer_of_its_networks_without_changing_its_state():
    # synthetic camera images suffice: the hook's contract (layout, zero block, no state change, blind) does not
    # depend on the scene, and the monitors demo probes the features of real rollouts
    torch = pytest.importorskip("torch")
    from robocasa_shift.core.policy import Observation
    from robocasa_shift.policies import make_policy
    from robocasa_shift.policies.reference.perception import resize

    rng = np.random.default_rng(0)
    images = {c: rng.integers(0, 256, (128, 128, 3), dtype=np.uint8) for c in ("robot0_robotview", "robot0_eye_in_hand")}
    roles = {"robot0_robotview": "third_person", "robot0_eye_in_hand": "wrist"}
    policy = make_policy("reference")
    policy.reset(3)
    # the layers, input side first, each with both networks' values: 16, 32 and 32 channels, 32 keypoints x
    # (x, y, peak), the head's 128 hidden units
    blocks = policy.feature_blocks()
    assert blocks == [("conv1", 32), ("conv2", 64), ("conv3", 64), ("keypoints", 192), ("hidden", 256)]
    starts = dict(zip([n for n, _ in blocks], np.cumsum([0] + [w for _, w in blocks])[:-1]))
    for task in ("Lift", "PickPlaceCan"):
        obs = Observation(images, roles, {}, "", 0, task=task)
        before = policy.rng_fingerprint()
        features = policy.features(obs)
        assert features.shape == (608,) and features.dtype == np.float32 and np.isfinite(features).all()
        # PickPlaceCan has no third-person network: zeros in the first half of every layer
        third = np.concatenate([features[starts[n]: starts[n] + w // 2] for n, w in blocks])
        assert (task == "PickPlaceCan") == bool((third == 0).all())
        # the wrist half of the keypoints is the wrist network's spatial-softmax features of the image it acts on,
        # and its hidden half is the head's first layer after its ReLU on them
        net = policy._net(f"{task}_wrist")
        image = torch.from_numpy(resize(images["robot0_eye_in_hand"])[None])
        wrist = net.keypoint_features(image)
        assert np.array_equal(features[starts["keypoints"] + 96: starts["keypoints"] + 192],
                              wrist.numpy()[0].astype(np.float32))
        hidden = torch.relu(wrist @ net.head[0].weight.T + net.head[0].bias).detach().numpy()[0]
        assert np.allclose(features[starts["hidden"] + 128: starts["hidden"] + 256], hidden, atol=1e-5)
        assert policy.rng_fingerprint() == before and np.array_equal(policy.features(obs), features)
        # a blind policy's features are those of black images, not of what the camera shows
        dark = Observation({c: np.zeros_like(v) for c, v in images.items()}, roles, {}, "", 0, task=task)
        policy.blind = True  # the ablation's switch, read at every call
        try:
            blind = policy.features(obs)
        finally:
            policy.blind = False
        assert np.array_equal(blind, policy.features(dark)) and not np.array_equal(blind, features)
