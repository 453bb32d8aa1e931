"""Monitor detection and timing (robocasa_shift.analysis.monitor_detection): every test builds its own small tables.

Boundaries sit every 10 control steps (0, 10, 20, ... below the rollout's length) unless a test
says otherwise; expected values are worked out by hand in the comments.
"""

import math

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.errors import AnalysisError
from robocasa_shift.analysis.monitor_detection import (
    add_split_column,
    alarm_steps,
    auc_decomposition,
    check_boundary_scores,
    detection_table,
    episode_scores,
    leave_one_task_out,
    length_only_scores,
    operating_point,
    rate_matched_random_alarm,
    roc_auc,
    select_threshold,
    split_episodes,
    summarize_alarms,
    window_limits,
)

# --------------------------------------------------------------------------- tables made here


def rollout(rid, task, episode, success, steps, scores, condition="clean", horizon=100, chunk=10, **extra):
    """Rows of one rollout: boundary i at step i * chunk with score scores[i]."""
    return [{"rollout_id": rid, "task": task, "episode": episode, "condition": condition, "success": success,
             "steps": steps, "horizon": horizon, "step": i * chunk, "score": float(s), **extra}
            for i, s in enumerate(scores)]


def frame(*rollouts):
    return pd.DataFrame([row for rows in rollouts for row in rows])


def episodes(*rows):
    """An episode-scores frame from (task, success, score) triples."""
    return pd.DataFrame(rows, columns=["task", "success", "score"])


def pair_accuracy(pairs):
    """Mean over (failure score, success score) pairs of 1 (failure higher), 1/2 (tie) or 0."""
    pairs = list(pairs)
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


# --------------------------------------------------------------------------- AUC


def test_roc_auc_counts_a_tied_failure_success_pair_as_one_half_and_is_none_without_a_class():
    # pairs (3,2) 1, (3,1) 1, (2,2) 1/2, (2,1) 1 -> 3.5 / 4
    assert roc_auc([3, 2], [2, 1]) == 0.875
    assert roc_auc([1, 1], [1]) == 0.5
    assert roc_auc([np.nan], [-np.inf]) == 0.5  # NaN is "no alarm", i.e. -inf
    assert roc_auc([0.0], [np.nan]) == 1.0
    assert roc_auc([], [1.0]) is None and roc_auc([1.0], []) is None


def test_pooled_auc_is_exactly_the_pair_weighted_mean_of_within_and_between_task_auc():
    rng = np.random.default_rng(3)
    ep = episodes(*[(str(rng.choice(["A", "B", "C"])), bool(rng.random() < 0.6), float(rng.integers(0, 5)))
                    for _ in range(40)])
    d = auc_decomposition(ep)
    fail, succ = ep[~ep.success], ep[ep.success]
    assert d.n_failures == len(fail) and d.n_successes == len(succ)
    assert d.n_pairs == d.n_pairs_within + d.n_pairs_between == len(fail) * len(succ)
    pairs = [(f, s) for f in fail.itertuples() for s in succ.itertuples()]
    assert d.pooled_auc == pair_accuracy((f.score, s.score) for f, s in pairs)
    assert d.within_auc == pair_accuracy((f.score, s.score) for f, s in pairs if f.task == s.task)
    assert d.between_auc == pair_accuracy((f.score, s.score) for f, s in pairs if f.task != s.task)
    assert d.weight_within + d.weight_between == pytest.approx(1.0, abs=1e-15)
    assert d.pooled_auc == pytest.approx(d.weight_within * d.within_auc + d.weight_between * d.between_auc,
                                         rel=1e-12, abs=0)


def test_pooled_auc_is_high_only_because_tasks_differ_when_within_task_ranking_is_chance():
    # Lift ranks at chance (0.2 and 0.6 against two 0.4s: 2 of 4 pairs); Stack only fails with high
    # scores, Door only succeeds with low ones, so all 12 cross-task pairs are ranked right.
    ep = episodes(("Lift", False, 0.2), ("Lift", False, 0.6), ("Lift", True, 0.4), ("Lift", True, 0.4),
                  ("Stack", False, 0.9), ("Stack", False, 0.9), ("Door", True, 0.1), ("Door", True, 0.1))
    d = auc_decomposition(ep)
    assert (d.within_auc, d.between_auc) == (0.5, 1.0)
    assert (d.n_pairs_within, d.n_pairs_between, d.n_pairs) == (4, 12, 16)
    assert (d.weight_within, d.weight_between) == (0.25, 0.75)
    assert d.pooled_auc == 0.875 == d.weight_within * d.within_auc + d.weight_between * d.between_auc
    assert d.macro_auc == 0.5  # the only task with both classes
    assert d.skipped_tasks == ("Door", "Stack")


def test_macro_auc_is_the_unweighted_task_mean_and_skips_a_task_with_one_class():
    # A: 3 beats 1 and 2 -> 1.0; B: 1 loses to both 2s, 4 beats both -> 0.5; C has no failure.
    ep = episodes(("A", False, 3), ("A", True, 1), ("A", True, 2),
                  ("B", False, 1), ("B", False, 4), ("B", True, 2), ("B", True, 2), ("C", True, 9))
    d = auc_decomposition(ep)
    assert d.macro_auc == 0.75
    assert d.skipped_tasks == ("C",)
    table = d.per_task_frame().set_index("task")
    assert table.loc["A", "auc"] == 1.0 and table.loc["B", "auc"] == 0.5 and pd.isna(table.loc["C", "auc"])
    assert table.loc["C", ["n_failures", "n_successes"]].tolist() == [0, 1]
    assert d.per_task[2].auc is None and d.summary()["skipped_tasks"] == "C"


# --------------------------------------------------------------------------- thresholds and operating points


def test_the_threshold_is_the_smallest_observed_score_meeting_the_false_alarm_target_on_validation():
    validation = list(range(1, 21))
    assert select_threshold(validation, 0.05) == 20.0  # 1 of 20 alarms (= 0.05); 19 would alarm 2 of 20
    assert np.mean(np.array(validation) >= 20.0) <= 0.05 < np.mean(np.array(validation) >= 19.0)
    assert select_threshold([1, 1, 1, 2], 0.25) == 2.0
    assert select_threshold([1, 1, 1, 2], 0.2) == math.inf  # no observed score alarms on <= 20%
    assert select_threshold([np.nan, 1.0], 0.5) == 1.0  # NaN never alarms
    with pytest.raises(AnalysisError, match="holds failures"):
        select_threshold(pd.DataFrame({"score": [1.0], "success": [False]}))


def test_the_threshold_chosen_on_validation_successes_is_measured_on_test_rollouts_at_its_realised_rate():
    val = frame(*[rollout(f"v{i}", "Lift", i, True, 50, [0, i]) for i in range(1, 21)])
    threshold = select_threshold(episode_scores(val, window_limits(val, "end")), 0.05)
    assert threshold == 20.0
    # test successes peak at 25, 19, 20, 3 -> two of four alarm; failures peak at 30, 10 -> one of two
    test = frame(*[rollout(f"s{i}", "Lift", 30 + i, True, 50, [0, peak]) for i, peak in enumerate((25, 19, 20, 3))],
                 *[rollout(f"f{i}", "Lift", 40 + i, False, 100, [0, peak]) for i, peak in enumerate((30, 10))])
    point = operating_point(test, threshold, window_limits(test, "end"))
    assert (point.n_false_alarms, point.n_successes, point.false_alarm_rate) == (2, 4, 0.5)
    assert (point.n_caught, point.n_failures, point.catch_rate) == (1, 2, 0.5)
    assert point.threshold == 20.0


def test_a_missed_failure_is_counted_at_the_window_end_not_at_its_last_boundary():
    scores = frame(
        rollout("F1", "Lift", 0, False, 100, [0, 0, 5, 0, 0, 0, 0, 0, 0, 0]),  # fires at step 20
        rollout("F2", "Lift", 1, False, 100, [0, 0, 0, 9, 9, 9, 9, 9, 9, 9]),  # fires at 30, after the window
        rollout("F3", "Lift", 2, False, 15, [0, 0]),  # a short failure, never fires: its end is 15
        rollout("S1", "Lift", 3, True, 60, [0, 7, 0, 0, 0, 0]),  # false alarm at step 10
        rollout("S2", "Lift", 4, True, 40, [0, 0, 0, 0]),
    )
    limits = window_limits(scores, "cap")
    assert limits == {"Lift": 25}  # a quarter of the horizon of 100
    alarms = alarm_steps(scores, 5.0, limits).set_index("rollout_id")
    assert alarms.loc["F1", "alarm_step"] == 20 and alarms.loc["S1", "alarm_step"] == 10
    assert math.isnan(alarms.loc["F2", "alarm_step"]) and not alarms.loc["F2", "alarmed"]
    assert alarms.loc["F2", "window_end"] == 25  # its last in-window boundary is at 20, the window ends at 25
    assert alarms.loc["F3", "window_end"] == 15
    point = operating_point(scores, 5.0, limits)
    assert (point.n_caught, point.catch_rate) == (1, 1 / 3)
    assert point.mean_alarm_step_caught == 20.0
    assert point.mean_alarm_position_steps == (20 + 25 + 15) / 3
    assert point.mean_alarm_position_fraction == pytest.approx((20 / 25 + 1.0 + 1.0) / 3, rel=1e-15)
    assert (point.false_alarm_rate, point.mean_false_alarm_step, point.mean_length_false_alarmed) == (0.5, 10.0, 60.0)


def test_a_nan_score_never_alarms_and_a_window_of_only_nan_scores_has_episode_score_minus_infinity():
    scores = frame(rollout("a", "Lift", 0, False, 100, [np.nan, np.nan, np.nan, 4.0]),
                   rollout("b", "Lift", 1, True, 100, [np.nan, 2.0]))
    ep = episode_scores(scores, {"Lift": 25}).set_index("rollout_id")
    assert ep.loc["a", "score"] == -math.inf and ep.loc["b", "score"] == 2.0
    assert episode_scores(scores, {"Lift": None}).set_index("rollout_id").loc["a", "score"] == 4.0
    assert alarm_steps(scores, -math.inf, {"Lift": None}).set_index("rollout_id").loc["a", "alarm_step"] == 0


# --------------------------------------------------------------------------- windows


def test_the_early_window_is_the_shortest_clean_success_among_the_validation_episodes():
    scores = frame(
        rollout("a0", "A", 0, True, 80, [0] * 8),
        rollout("a1", "A", 1, True, 60, [0] * 6),
        rollout("a1p", "A", 1, True, 30, [0] * 3, condition="base:L2"),  # perturbed: not a reference
        rollout("a2", "A", 2, True, 40, [0] * 4),  # a test episode: not seen
        rollout("a0p", "A", 0, False, 100, [0, 0, 0, 0, 0, 0, 1, 9, 9, 9], condition="base:L2"),
    )
    assert window_limits(scores, "early", {"A": [0, 1]}) == {"A": 60}
    assert window_limits(scores, "early", {"A": {"validation": [0, 1], "test": [2]}}) == {"A": 60}
    ep = episode_scores(scores, {"A": 60}).set_index("rollout_id")
    assert ep.loc["a0p", "score"] == 1.0 and ep.loc["a0p", "window_end"] == 60  # the boundary at 60 is in, 70 out
    with_b = pd.concat([scores, frame(rollout("b0", "B", 0, False, 100, [0]), rollout("b1", "B", 1, True, 50, [0]))])
    with pytest.raises(AnalysisError, match="task 'B' has no clean success among its validation episodes"):
        window_limits(with_b, "early", {"A": [0, 1], "B": [0]})
    with pytest.raises(AnalysisError, match="unknown window kind 'erly'"):
        window_limits(scores, "erly")


def test_the_cap_window_is_a_quarter_of_each_tasks_horizon():
    scores = frame(rollout("a", "A", 0, True, 50, [0], horizon=220), rollout("b", "B", 0, True, 50, [0], horizon=100))
    assert window_limits(scores, "cap") == {"A": 55, "B": 25}
    assert window_limits(scores, "end") == {"A": None, "B": None}


# --------------------------------------------------------------------------- length-only baseline


def test_the_length_only_baseline_reaches_auc_one_when_every_failure_is_a_horizon_timeout():
    # failures run to the horizon of 100 (10 boundaries); successes end at 40, 75, 90 (4, 8, 9 boundaries)
    rows = []
    for task in ("T1", "T2"):
        rows += [rollout(f"{task}f{i}", task, i, False, 100, [0] * 10) for i in range(2)]
        rows += [rollout(f"{task}s{n}", task, 2 + i, True, n, [0] * math.ceil(n / 10))
                 for i, n in enumerate((40, 75, 90))]
    scores = frame(*rows)
    length = length_only_scores(scores)
    assert length[length.rollout_id == "T1s40"].score.tolist() == [1.0, 2.0, 3.0, 4.0]
    end = {"T1": None, "T2": None}
    assert auc_decomposition(episode_scores(scores, end)).pooled_auc == 0.5  # the monitor itself is flat
    d = auc_decomposition(episode_scores(length, end))
    assert (d.pooled_auc, d.macro_auc, d.within_auc, d.between_auc) == (1.0, 1.0, 1.0, 1.0)
    capped = auc_decomposition(episode_scores(length, {"T1": 25, "T2": 25}))
    assert capped.pooled_auc == 0.5  # three boundaries each inside the cap: the length cue is gone


# --------------------------------------------------------------------------- splits


def paired_table(tasks):
    """Clean and base:L2 rollouts of every base episode of {task: n_episodes}."""
    rows = []
    for task, n in tasks.items():
        for e in range(n):
            for condition in ("clean", "base:L2"):
                rows.append(rollout(f"{task}-{e}-{condition}", task, e, e % 2 == 0, 50, [0, e], condition=condition))
    return frame(*rows)


def test_splits_keep_a_base_episodes_conditions_together_and_are_deterministic_for_a_seed():
    scores = paired_table({"Lift": 6, "Door": 5, "Solo": 1})
    splits = split_episodes(scores, seed=11)
    assert splits == split_episodes(scores.sample(frac=1.0, random_state=2), seed=11)  # row order is irrelevant
    assert splits["Lift"] == split_episodes(scores[scores.task == "Lift"], seed=11)["Lift"]  # so are other tasks
    assert [len(splits[t]["validation"]) for t in ("Lift", "Door", "Solo")] == [3, 2, 1]  # rounded down, at least 1
    assert splits["Solo"] == {"validation": [0], "test": []}
    for task, n in (("Lift", 6), ("Door", 5)):
        assert sorted(splits[task]["validation"] + splits[task]["test"]) == list(range(n))
    labelled = add_split_column(scores, splits)
    assert (labelled.groupby(["task", "episode"])["split"].nunique() == 1).all()
    assert set(labelled.loc[labelled.task == "Lift"].groupby("episode")["split"].first().items()) == {
        (e, "validation" if e in splits["Lift"]["validation"] else "test") for e in range(6)}
    with pytest.raises(AnalysisError, match="task 'Lift': base episode 5 is in no split"):
        add_split_column(scores, {**splits, "Lift": {"validation": [0, 1, 2], "test": [3, 4]}})


# --------------------------------------------------------------------------- leave one task out


def test_leave_one_task_out_chooses_each_threshold_without_the_held_out_task():
    # validation clean successes: A 5, 6; B 1, 2; C 3, 4. At a 25% target the others of A give 4 (1 of 4);
    # with A included the threshold would be 6 (1 of 6), and A's test rollouts (4.5, 4.5) would not alarm.
    rows = []
    for task, peaks in (("A", (5, 6)), ("B", (1, 2)), ("C", (3, 4))):
        rows += [rollout(f"{task}v{i}", task, i, True, 50, [0, p], split="validation") for i, p in enumerate(peaks)]
    for task, (s, f) in (("A", (4.5, 4.5)), ("B", (1.5, 7)), ("C", (3.5, 5.5))):
        rows += [rollout(f"{task}ts", task, 2, True, 50, [0, s], split="test"),
                 rollout(f"{task}tf", task, 3, False, 100, [0, f], split="test")]
    scores = frame(*rows)
    end = window_limits(scores, "end")
    ep = episode_scores(scores, end)
    assert select_threshold(ep[(ep.split == "validation")], 0.25) == 6.0  # what including A would give
    loto = leave_one_task_out(scores, end, target_fa=0.25).set_index("task")
    assert loto["threshold"].to_dict() == {"A": 4.0, "B": 6.0, "C": 6.0}
    assert loto["n_calibration_successes"].tolist() == [4, 4, 4]
    assert loto.loc["A", ["false_alarm_rate", "catch_rate", "auc"]].tolist() == [1.0, 1.0, 0.5]
    assert loto.loc["B", ["false_alarm_rate", "catch_rate", "auc"]].tolist() == [0.0, 1.0, 1.0]
    assert loto.loc["C", ["false_alarm_rate", "catch_rate", "auc"]].tolist() == [0.0, 0.0, 1.0]
    assert loto["length_only_auc"].tolist() == [0.5, 0.5, 0.5]  # every rollout has two boundaries
    with pytest.raises(AnalysisError, match="lack column 'split'"):
        leave_one_task_out(scores.drop(columns="split"), end)


# --------------------------------------------------------------------------- random alarm control


def test_the_rate_matched_random_alarm_is_reproducible_with_a_seed_and_fires_inside_the_window():
    scores = frame(*[rollout(f"r{i}", "Lift", i, i % 3 == 0, 30 + 10 * i, [0] * (3 + i)) for i in range(8)])
    limits = {"Lift": 25}
    first = rate_matched_random_alarm(scores, 0.5, np.random.default_rng(7), limits)
    again = rate_matched_random_alarm(scores.sample(frac=1.0, random_state=1), 0.5, np.random.default_rng(7), limits)
    pd.testing.assert_frame_equal(first, again)
    always = rate_matched_random_alarm(scores, 1.0, np.random.default_rng(7), limits)
    assert always.alarmed.all() and set(always.alarm_step) <= {0.0, 10.0, 20.0}
    assert not rate_matched_random_alarm(scores, 0.0, np.random.default_rng(7), limits).alarmed.any()
    point = summarize_alarms(always)
    assert point.threshold is None and point.catch_rate == 1.0 and point.false_alarm_rate == 1.0
    with pytest.raises(AnalysisError, match="numpy.random.Generator"):
        rate_matched_random_alarm(scores, 0.5, 7)


# --------------------------------------------------------------------------- the table


def test_the_detection_table_freezes_one_clean_validation_threshold_for_every_condition_beside_the_length_baseline():
    # validation clean successes peak at 2 and 4 -> 4 at a 50% target; the perturbed validation success
    # peaking at 50 is not a reference. Test: clean success 1, failure 5; base:L2 failure 3, success 4.
    scores = frame(
        rollout("v0", "Lift", 0, True, 50, [2, 0, 0, 0, 0]), rollout("v1", "Lift", 1, True, 50, [4, 0, 0, 0, 0]),
        rollout("v0p", "Lift", 0, True, 50, [50, 0, 0, 0, 0], condition="base:L2"),
        rollout("t2", "Lift", 2, True, 50, [1, 0, 0, 0, 0]), rollout("t3", "Lift", 3, False, 100, [5] + [0] * 9),
        rollout("t2p", "Lift", 2, False, 100, [3] + [0] * 9, condition="base:L2"),
        rollout("t3p", "Lift", 3, True, 50, [4, 0, 0, 0, 0], condition="base:L2"),
    )
    splits = {"Lift": {"validation": [0, 1], "test": [2, 3]}}
    table = detection_table(scores, splits, {"end": {"Lift": None}, "cap": {"Lift": 25}}, target_fa=0.5)
    assert table[["window", "condition"]].values.tolist() == [["end", "clean"], ["end", "base:L2"],
                                                              ["cap", "clean"], ["cap", "base:L2"]]
    assert table["window_max_steps"].tolist() == ["Lift=none", "Lift=none", "Lift=25", "Lift=25"]
    assert table["threshold"].tolist() == [4.0] * 4 and table["n_calibration_successes"].tolist() == [2] * 4
    end = table[table.window == "end"].set_index("condition")
    assert end.loc["clean", ["pooled_auc", "false_alarm_rate", "catch_rate"]].tolist() == [1.0, 0.0, 1.0]
    assert end.loc["base:L2", ["pooled_auc", "false_alarm_rate", "catch_rate"]].tolist() == [0.0, 1.0, 0.0]
    assert end["length_pooled_auc"].tolist() == [1.0, 1.0]  # failures run 10 boundaries, successes 5
    assert end.loc["base:L2", "mean_alarm_position_steps"] == 100.0  # the miss, at its window end
    cap = table[table.window == "cap"].set_index("condition")
    assert cap["length_pooled_auc"].tolist() == [0.5, 0.5] and cap["length_macro_auc"].tolist() == [0.5, 0.5]
    assert cap.loc["base:L2", "mean_alarm_position_steps"] == 25.0
    assert table["n_rollouts"].tolist() == [2] * 4 and table["skipped_tasks"].tolist() == [""] * 4


# --------------------------------------------------------------------------- malformed input


def test_a_missing_column_or_a_per_rollout_column_that_varies_is_refused_naming_it():
    scores = frame(rollout("a", "Lift", 0, True, 50, [0, 1]))
    with pytest.raises(AnalysisError, match="lack column\\(s\\) 'score'"):
        check_boundary_scores(scores.drop(columns="score"))
    varying = scores.copy()
    varying.loc[1, "steps"] = 60
    with pytest.raises(AnalysisError, match="column 'steps' varies across the boundaries of rollout 'a'"):
        check_boundary_scores(varying)
    with pytest.raises(AnalysisError, match="task 'Lift' has no window limit"):
        episode_scores(scores, {"Door": None})
