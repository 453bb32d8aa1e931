"""Decision value of monitor alarms: RESCUE's stop-and-reset worksheet, its bootstrap, and recover routing.

Known answers are RESCUE Table I (Sec. IV-C); every other value is worked out by hand in the test.
"""

import math

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.errors import AnalysisError
from robocasa_shift.analysis.monitor_decision import (
    CostModel,
    _excess_direct,
    _strata_positions,
    bootstrap_excess,
    closed_form_break_even,
    excess_cost,
    ideal_ceiling,
    recover_routing_cost,
    worksheet,
)

NAN = float("nan")

# RESCUE Table I, steps-since-progress at its validation-selected nominal 5% operating point.
OFT_LP = dict(p=0.1372, T_f=220.0, T_s_fa=116.00, median_T_s=97, kappa=0.1, C_never=0.2972, d=0.879,
              t_d=133.0, t_fa=61.9, f_star_pct=1.01, f=0.0725, excess=0.0835)
PI05_LP = dict(p=0.1143, T_f=220.0, T_s_fa=128.87, median_T_s=112, kappa=0.1, C_never=0.2551, d=0.519,
               t_d=129.3, t_fa=62.7, f_star_pct=0.45)


def table_c(column):
    return CostModel(kappa=column["kappa"]).per_step_cost([column["median_T_s"] - 5, column["median_T_s"],
                                                          column["median_T_s"] + 9])


def table_f_star(column):
    return closed_form_break_even(column["p"], column["d"], table_c(column), column["T_f"], column["t_d"],
                                  column["t_fa"], column["T_s_fa"], column["C_never"])


def hand_frame():
    """Four successes (median 100, so c = 0.001) and two 200-step failures; S2 and F1 alarm.

    Never: 0.08 + 0.1 + 0.12 + 0.1 + 1.2 + 1.2 = 2.8 over 4 completions = 0.7.
    Stop: 0.08 + (0.04 + 1) + 0.12 + 0.1 + (0.05 + 1) + 1.2 = 3.59 over 3 completions.
    """
    return pd.DataFrame({
        "rollout_id": ["S1", "S2", "S3", "S4", "F1", "F2"],
        "success": [True, True, True, True, False, False],
        "steps": [80, 100, 120, 100, 200, 200],
        "alarm_step": [NAN, 40.0, NAN, NAN, 50.0, NAN],
    })


def random_episodes(seed, n, false_alarms=True):
    rng = np.random.default_rng(seed)
    success = rng.random(n) < 0.75
    steps = np.where(success, rng.integers(40, 200, n), np.where(rng.random(n) < 0.7, 220, rng.integers(60, 220, n)))
    alarmed = rng.random(n) < np.where(success, 0.2 if false_alarms else 0.0, 0.6)
    alarm = np.where(alarmed, np.floor(rng.random(n) * (steps + 1)), NAN)
    return pd.DataFrame({"success": success, "steps": steps, "alarm_step": alarm})


# --------------------------------------------------------------------------- Table I known answers


def test_the_closed_form_reproduces_the_openvla_oft_libero_plus_break_even_rate_of_table_one():
    assert table_c(OFT_LP) == pytest.approx(0.1 / 97, abs=1e-15)
    assert round(100 * table_f_star(OFT_LP), 2) == OFT_LP["f_star_pct"]


def test_the_closed_form_reproduces_the_pi05_libero_plus_break_even_rate_of_table_one():
    assert round(100 * table_f_star(PI05_LP), 2) == PI05_LP["f_star_pct"]


def test_the_closed_form_excess_cost_at_the_realised_openvla_oft_false_alarm_rate_is_the_papers():
    column = OFT_LP
    value = excess_cost(column["f"], table_f_star(column), column["C_never"], table_c(column), column["t_fa"],
                        column["T_s_fa"])
    assert round(value, 4) == column["excess"]


def test_the_ideal_detector_low_end_reproduces_the_papers_ceilings_for_both_cells():
    # Sec. IV-C: 2.78-3.32% (OFT) and 2.02-2.39% (pi0.5); the low end (t_fa = T_s) needs no T_s.
    for column, low_pct in ((OFT_LP, 2.78), (PI05_LP, 2.02)):
        lo, hi = ideal_ceiling(column["p"], table_c(column), column["T_f"], column["C_never"], column["T_s_fa"])
        assert round(100 * lo, 2) == low_pct
        assert hi > lo


# --------------------------------------------------------------------------- worksheet by hand


def test_the_worksheet_of_a_hand_made_frame_has_every_quantity_worked_out_by_hand():
    ws = worksheet(hand_frame())
    assert (ws["n_episodes"], ws["n_failures"], ws["n_successes"]) == (6, 2, 4)
    assert (ws["n_alarmed_failures"], ws["n_false_alarms"], ws["n_completions_rule"]) == (1, 1, 3)
    assert ws["c"] == pytest.approx(0.001, abs=1e-15)
    assert ws["c_source"] == "median of these successes"
    assert ws["kappa_effective"] == pytest.approx(0.1, abs=1e-15)
    assert ws["p"] == pytest.approx(1 / 3, abs=1e-15)
    assert (ws["d"], ws["t_d"], ws["T_f"], ws["T_f_all"]) == (0.5, 50.0, 200.0, 200.0)
    assert (ws["f"], ws["t_fa"], ws["T_s_fa"], ws["T_s_median"], ws["T_s_mean"]) == (0.25, 40.0, 100.0, 100.0, 100.0)
    assert ws["C_never"] == pytest.approx(0.7, abs=1e-12)
    assert ws["C_rule_direct"] == pytest.approx(3.59 / 3, abs=1e-12)
    assert ws["excess_direct"] == pytest.approx(3.59 / 3 - 0.7, abs=1e-12)
    # f* = (1/3)(0.5)(0.001)(150) / ((2/3)(1 + 0.7 - 0.06)) = 0.075 / 3.28
    assert ws["f_star"] == pytest.approx(0.075 / 3.28, abs=1e-12)
    assert ws["excess_closed"] == pytest.approx(1.64 * (0.25 - 0.075 / 3.28) / 0.75, abs=1e-12)
    assert ws["C_rule_closed"] == pytest.approx(ws["C_rule_direct"], abs=1e-12)


def test_the_ideal_ceiling_range_ends_are_f_star_at_a_false_alarm_at_the_natural_end_and_at_step_zero():
    ws = worksheet(hand_frame())
    # d = 1, t_d = 0, T_f = 200 (all failures): numerator (1/3)(0.001)(200) = 1/15.
    # t_fa = T_s_fa = 100: 1/15 / ((2/3) 1.7) = 1/17; t_fa = 0: 1/15 / ((2/3)(1.7 - 0.1)) = 1/16.
    lo, hi = ws["f_star_ideal"]
    assert lo == pytest.approx(1 / 17, abs=1e-12)
    assert hi == pytest.approx(1 / 16, abs=1e-12)
    # over any success: the longest (120 steps) at step 0 gives 1/15 / ((2/3)(1.58)) = 0.1 / 1.58
    lo_any, hi_any = ws["f_star_ideal_any_success"]
    assert lo_any == pytest.approx(1 / 17, abs=1e-12)
    assert hi_any == pytest.approx(0.1 / 1.58, abs=1e-12)
    assert closed_form_break_even(ws["p"], 1.0, ws["c"], 200.0, 0.0, 0.0, 100.0, ws["C_never"]) == pytest.approx(hi)


def test_a_given_per_step_cost_replaces_the_tables_own_median():
    ws = worksheet(hand_frame(), c=0.002)
    assert (ws["c"], ws["c_source"], ws["kappa"]) == (0.002, "given", 0.1)
    assert ws["kappa_effective"] == pytest.approx(0.2, abs=1e-15)
    # never: 0.002 * 800 + 2 = 3.6 over 4 completions
    assert ws["C_never"] == pytest.approx(0.9, abs=1e-12)


def test_without_false_alarms_f_is_zero_and_f_star_takes_the_timing_term_as_zero():
    frame = hand_frame().assign(alarm_step=[NAN, NAN, NAN, NAN, 50.0, NAN])
    ws = worksheet(frame)
    assert (ws["f"], ws["t_fa"], ws["T_s_fa"], ws["f_star_ideal"]) == (0.0, None, None, None)
    # f* = (1/3)(0.5)(0.001)(150) / ((2/3)(1.7)) = 0.025 / (3.4 / 3)
    assert ws["f_star"] == pytest.approx(0.075 / 3.4, abs=1e-12)
    # stop saves 0.15 over 4 completions: (2.8 - 0.15) / 4 - 0.7
    assert ws["excess_direct"] == pytest.approx(-0.0375, abs=1e-12)
    assert ws["excess_closed"] == pytest.approx(-0.0375, abs=1e-12)


def test_without_alarmed_failures_or_without_failures_the_break_even_rate_is_zero():
    no_detection = worksheet(hand_frame().assign(alarm_step=[NAN, 40.0, NAN, NAN, NAN, NAN]))
    assert (no_detection["d"], no_detection["t_d"], no_detection["T_f"]) == (0.0, None, None)
    assert no_detection["f_star"] == 0.0
    no_failures = worksheet(hand_frame().iloc[:4])
    assert (no_failures["p"], no_failures["d"], no_failures["f_star"]) == (0.0, None, 0.0)
    assert no_failures["f_star_ideal"] == (0.0, 0.0)
    for ws in (no_detection, no_failures):
        assert ws["excess_closed"] == pytest.approx(ws["excess_direct"], abs=1e-12)


# --------------------------------------------------------------------------- closed form == direct accounting


@pytest.mark.parametrize("false_alarms", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
def test_the_closed_form_equals_direct_episode_accounting_on_random_episode_sets(seed, false_alarms):
    episodes = random_episodes(seed, n=40 + 23 * seed, false_alarms=false_alarms)
    for cost_model, c in ((CostModel(), None), (CostModel(kappa=0.3, reset_cost=2.0), None), (CostModel(), 0.004)):
        ws = worksheet(episodes, cost_model, c=c)
        assert (ws["n_false_alarms"] > 0) is false_alarms
        assert ws["f_star"] is not None
        assert ws["excess_closed"] == pytest.approx(ws["excess_direct"], rel=1e-12, abs=1e-12)
        assert ws["C_rule_closed"] == pytest.approx(ws["C_rule_direct"], rel=1e-12, abs=1e-12)
        # the break-even rate is the break-even: a rule at f = f* costs what never intervening costs
        at_break_even = excess_cost(ws["f_star"], ws["f_star"], ws["C_never"], ws["c"], ws["t_fa"], ws["T_s_fa"],
                                    reset_cost=cost_model.reset_cost)
        assert at_break_even == 0.0


def test_a_row_present_twice_counts_as_two_attempts():
    frame = hand_frame()
    doubled = pd.concat([frame, frame.iloc[[4]]], ignore_index=True)  # F1 (alarmed failure) twice
    ws = worksheet(doubled)
    assert (ws["n_failures"], ws["n_alarmed_failures"]) == (3, 2)
    assert ws["C_rule_direct"] == pytest.approx((3.59 + 1.05) / 3, abs=1e-12)


# --------------------------------------------------------------------------- zero completions and bad input


def test_a_set_without_successes_raises_unless_the_per_step_cost_is_given_and_then_reports_none():
    failures = hand_frame().iloc[4:]
    with pytest.raises(AnalysisError, match="no successful rollouts"):
        worksheet(failures)
    ws = worksheet(failures, c=0.001)
    assert ws["p"] == 1.0
    assert (ws["d"], ws["t_d"]) == (0.5, 50.0)
    for key in ("f", "C_never", "f_star", "C_rule_direct", "C_rule_closed", "excess_direct", "excess_closed",
                "f_star_ideal", "f_star_ideal_any_success", "T_s_median"):
        assert ws[key] is None, key


def test_a_rule_that_false_alarms_every_success_completes_nothing_and_its_costs_are_none():
    frame = hand_frame().assign(alarm_step=[10.0, 40.0, 30.0, 20.0, 50.0, NAN])
    ws = worksheet(frame)
    assert (ws["f"], ws["n_completions_rule"]) == (1.0, 0)
    assert ws["f_star"] is not None
    assert (ws["C_rule_direct"], ws["C_rule_closed"], ws["excess_direct"], ws["excess_closed"]) == (None,) * 4
    with pytest.raises(AnalysisError, match="f = 1"):
        excess_cost(1.0, ws["f_star"], ws["C_never"], ws["c"], ws["t_fa"], ws["T_s_fa"])


def test_an_alarm_after_the_natural_end_a_missing_column_or_a_non_boolean_success_is_refused():
    with pytest.raises(AnalysisError, match="alarm_step"):
        worksheet(hand_frame().assign(alarm_step=[NAN, 101.0, NAN, NAN, NAN, NAN]))
    with pytest.raises(AnalysisError, match="lacks column"):
        worksheet(hand_frame().drop(columns="alarm_step"))
    with pytest.raises(AnalysisError, match="boolean"):
        worksheet(hand_frame().assign(success=["yes", True, True, True, False, False]))
    with pytest.raises(AnalysisError, match="empty"):
        worksheet(hand_frame().iloc[:0])
    with pytest.raises(AnalysisError, match="t_fa and T_s_fa"):
        closed_form_break_even(0.1, 0.5, 0.001, 200.0, 50.0, 40.0, None, 0.5)
    with pytest.raises(AnalysisError, match="kappa"):
        CostModel(kappa=0.0)


def test_a_false_alarm_cheaper_than_finishing_its_success_has_no_break_even_rate():
    with pytest.raises(AnalysisError, match="no break-even"):
        closed_form_break_even(0.1, 0.5, 0.01, 200.0, 50.0, 0.0, 150.0, 0.2)


# --------------------------------------------------------------------------- bootstrap


def scored(seed, prefix):
    """Two tasks x (12 successes, 4 failures) with a max monitor score and the step it is first reached."""
    rng = np.random.default_rng(seed)
    rows = []
    for task in ("A", "B"):
        for i in range(16):
            ok = i < 12
            steps = int(rng.integers(60, 160)) if ok else 220
            rows.append({"rollout_id": f"{prefix}-{task}{i}", "task": task, "success": ok, "steps": steps,
                         "score": float(rng.random() * (1.0 if ok else 1.6)),
                         "score_step": float(rng.integers(0, steps + 1))})
    return pd.DataFrame(rows)


def select_at_80th_success_score(scores):
    return float(np.quantile(scores, 0.8))


def alarm_column(frame, threshold):
    """The alarm steps of a table's rows at a threshold: the score's step where it exceeds it, else NaN."""
    return np.where(frame["score"] > threshold, frame["score_step"], NAN)


def alarms_above(test):
    """``alarms_for`` of a test table: :func:`alarm_column` of the rows at the given positions."""
    scores, steps = test["score"].to_numpy(), test["score_step"].to_numpy()
    return lambda positions, threshold: np.where(scores[positions] > threshold, steps[positions], NAN)


def test_the_bootstrap_is_reproducible_for_a_seed_and_changes_with_it():
    validation, test = scored(11, "v"), scored(12, "t")
    first = bootstrap_excess(validation, test, select_at_80th_success_score, alarms_above(test), n_resamples=30,
                             seed=3)
    again = bootstrap_excess(validation, test, select_at_80th_success_score, alarms_above(test), n_resamples=30,
                             seed=3)
    other = bootstrap_excess(validation, test, select_at_80th_success_score, alarms_above(test), n_resamples=30,
                             seed=4)
    assert first == again
    assert (first.lo, first.hi) != (other.lo, other.hi)
    assert (first.n_resamples, first.seed, first.confidence) == (30, 3, 0.95)
    assert first.lo <= first.hi


def test_the_bootstrap_reselects_the_threshold_in_every_resample():
    validation, test = scored(11, "v"), scored(12, "t")
    calls = []

    def counting_select(scores):
        calls.append(len(scores))
        return select_at_80th_success_score(scores)

    result = bootstrap_excess(validation, test, counting_select, alarms_above(test), n_resamples=25, seed=0)
    assert len(calls) == 25 + 1
    assert result.threshold == select_at_80th_success_score(validation.loc[validation["success"], "score"])
    point = worksheet(test.assign(alarm_step=alarm_column(test, result.threshold)))["excess_direct"]
    assert result.point == point
    # the same draws with the threshold frozen at the point estimate's give another interval
    fixed = bootstrap_excess(validation, test, lambda scores: result.threshold, alarms_above(test), n_resamples=25,
                             seed=0)
    assert fixed.point == result.point
    assert (fixed.lo, fixed.hi) != (result.lo, result.hi)


def test_the_bootstrap_resamples_rows_within_task_and_outcome_and_keeps_their_multiplicity():
    validation, test = scored(11, "v"), scored(12, "t")
    seen = []

    def recording_alarms(positions, threshold):
        seen.append((test.iloc[positions].reset_index(drop=True), threshold))
        return alarms_above(test)(positions, threshold)

    result = bootstrap_excess(validation, test, select_at_80th_success_score, recording_alarms, n_resamples=20,
                              seed=5)
    original = test.set_index("rollout_id")
    strata_sizes = test.groupby(["task", "success"]).size()
    assert any(frame["rollout_id"].duplicated().any() for frame, _ in seen[1:])
    for frame, _ in seen[1:]:
        pd.testing.assert_series_equal(frame.groupby(["task", "success"]).size(), strata_sizes)
        pd.testing.assert_frame_equal(frame.set_index("rollout_id"), original.loc[frame["rollout_id"]])
    # the interval is the percentile interval of the resamples' own direct accounting, duplicates included
    values = [worksheet(frame.assign(alarm_step=alarm_column(frame, thr)), c=result.c)["excess_direct"]
              for frame, thr in seen[1:]]
    assert np.quantile(values, [0.025, 0.975]).tolist() == [result.lo, result.hi]


def small_table(**kw):
    # one task, two successes: s0 always alarms, s1 never; a resample drawing s0 twice completes nothing
    return pd.DataFrame({"rollout_id": ["s0", "s1", "f0", "f1"], "task": "A", "success": [True, True, False, False],
                         "steps": [100, 120, 220, 220], "score": [0.9, 0.1, 0.9, 0.2],
                         "score_step": [30.0, 0.0, 60.0, 0.0]}, **kw)


def test_resamples_whose_rule_completes_nothing_are_counted_as_undefined_and_left_out():
    test = small_table()
    seen = []

    def recording_alarms(positions, threshold):
        seen.append(test.iloc[positions].reset_index(drop=True))
        return alarms_above(test)(positions, threshold)

    result = bootstrap_excess(test, test, lambda scores: 0.5, recording_alarms, n_resamples=40, seed=1)
    excesses = [worksheet(frame.assign(alarm_step=alarm_column(frame, 0.5)), c=result.c)["excess_direct"]
                for frame in seen[1:]]
    undefined = sum(value is None for value in excesses)
    assert 0 < undefined < 40
    assert result.n_undefined == undefined
    assert result.point is not None
    assert np.quantile([v for v in excesses if v is not None], [0.025, 0.975]).tolist() == [result.lo, result.hi]


def test_the_bootstrap_refuses_misaligned_alarms_missing_columns_and_callables_that_are_not():
    validation, test = scored(11, "v"), scored(12, "t")
    alarms_for = alarms_above(test)
    with pytest.raises(AnalysisError, match="alarms_for returned 31 alarm steps for 32 positions"):
        bootstrap_excess(validation, test, select_at_80th_success_score,
                         lambda positions, thr: alarms_for(positions, thr)[:-1], n_resamples=2)
    resamples = []

    def short_in_a_resample(positions, threshold):
        resamples.append(threshold)
        alarms = alarms_for(positions, threshold)
        return alarms if len(resamples) == 1 else alarms[:-1]

    with pytest.raises(AnalysisError, match="alarms_for returned 31 alarm steps for 32 positions"):
        bootstrap_excess(validation, test, select_at_80th_success_score, short_in_a_resample, n_resamples=2)
    assert len(resamples) == 2  # refused in the first resample, after a clean point estimate
    with pytest.raises(AnalysisError, match="lacks column"):
        bootstrap_excess(validation.drop(columns="task"), test, select_at_80th_success_score, alarms_for,
                         n_resamples=2)
    with pytest.raises(AnalysisError, match="lacks column 'score'"):
        bootstrap_excess(validation.drop(columns="score"), test, select_at_80th_success_score, alarms_for,
                         n_resamples=2)
    with pytest.raises(AnalysisError, match="alarms_for must be callable"):
        bootstrap_excess(validation, test, select_at_80th_success_score, None, n_resamples=2)
    with pytest.raises(AnalysisError, match="select_threshold must be callable"):
        bootstrap_excess(validation, test, 0.5, alarms_for, n_resamples=2)


def test_the_bootstraps_direct_accounting_is_the_worksheets_bit_for_bit_including_undefined_sets():
    cases = []
    for seed in range(40):
        rng = np.random.default_rng(1000 + seed)
        n = int(rng.choice([1, 2, 5, 7, 8, 9, 16, 33, 129, 300]))  # across numpy's pairwise-summation blocks
        episodes = random_episodes(seed, n, false_alarms=seed % 3 != 0)
        cases.append((episodes, float(rng.uniform(1e-4, 0.05)), CostModel(reset_cost=[1.0, 2, 0.37][seed % 3])))
    base = random_episodes(7, 30)
    every_false_alarm = base.assign(alarm_step=np.where(base["success"], np.floor(base["steps"] / 2),
                                                        base["alarm_step"]))
    cases += [(base.assign(success=False), 0.01, CostModel()),  # no successes: C_never undefined
              (every_false_alarm, 0.01, CostModel()),  # the rule completes nothing
              (base.assign(alarm_step=NAN), 0.003, CostModel(reset_cost=3)),  # never alarms
              (base.assign(alarm_step=0.0), 0.003, CostModel()),  # alarms on everything at step 0
              (hand_frame(), 0.001, CostModel())]
    undefined = 0
    for episodes, c, cost_model in cases:
        expected = worksheet(episodes, cost_model, c=c)["excess_direct"]
        got = _excess_direct(episodes["success"].to_numpy(dtype=bool), episodes["steps"].to_numpy(dtype=float),
                             episodes["alarm_step"].to_numpy(dtype=float), c, cost_model.reset_cost)
        if expected is None:
            undefined += 1
            assert got is None
        else:
            assert type(got) is float and got == expected
    assert undefined >= 2


def reference_bootstrap(validation, test, select, n_resamples, seed, strata=("task", "success"), c=None,
                        confidence=0.95, cost_model=CostModel()):
    """The bootstrap worked out with tables: groupby strata, iloc resamples and the worksheet's pricing."""
    validation, test = validation.reset_index(drop=True), test.reset_index(drop=True)
    val_strata, test_strata = reference_strata(validation, strata), reference_strata(test, strata)
    c = cost_model.per_step_cost(test.loc[test["success"], "steps"]) if c is None else c
    threshold = select(validation.loc[validation["success"], "score"].to_numpy())

    def excess(val_frame, test_frame):
        threshold = select(val_frame.loc[val_frame["success"], "score"].to_numpy())
        return worksheet(test_frame.assign(alarm_step=alarm_column(test_frame, threshold)), cost_model,
                         c=c)["excess_direct"]

    rng = np.random.default_rng(seed)
    values = []
    for _ in range(n_resamples):
        val_drawn = np.concatenate([pos[rng.integers(0, pos.size, size=pos.size)] for pos in val_strata])
        test_drawn = np.concatenate([pos[rng.integers(0, pos.size, size=pos.size)] for pos in test_strata])
        values.append(excess(validation.iloc[val_drawn].reset_index(drop=True),
                             test.iloc[test_drawn].reset_index(drop=True)))
    defined = [v for v in values if v is not None]
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(defined, [tail, 1.0 - tail]).tolist() if defined else (None, None)
    return dict(lo=lo, hi=hi, point=excess(validation, test), threshold=threshold, c=c,
                n_resamples=n_resamples, n_undefined=len(values) - len(defined), seed=seed, confidence=confidence)


def without_reference(result):
    """The result's fields, less those of a reference rule (none was given: they are None and 0)."""
    fields = dict(vars(result))
    assert [fields.pop(k) for k in ("diff_lo", "diff_hi", "diff_point", "n_diff_undefined")] == [None, None, None, 0]
    return fields


def test_the_bootstrap_is_the_table_bootstrap_worked_out_by_hand_bit_for_bit():
    validation, test = scored(11, "v"), scored(12, "t")
    settings = [dict(n_resamples=60, seed=3), dict(n_resamples=40, seed=9, c=0.002),
                dict(n_resamples=50, seed=0, strata=("task",), confidence=0.8,
                     cost_model=CostModel(kappa=0.3, reset_cost=2))]
    for kw in settings:
        got = bootstrap_excess(validation, test, select_at_80th_success_score, alarms_above(test), **kw)
        assert without_reference(got) == reference_bootstrap(validation, test, select_at_80th_success_score, **kw)
    # with resamples whose rule completes nothing, and a table with an index of its own
    small = small_table(index=[7, 3, 5, 1])
    got = bootstrap_excess(small, small, lambda scores: 0.5, alarms_above(small.reset_index(drop=True)),
                           n_resamples=40, seed=1)
    assert without_reference(got) == reference_bootstrap(small, small, lambda scores: 0.5, 40, 1)
    assert 0 < got.n_undefined < 40


def test_the_callables_get_successful_validation_scores_and_test_positions():
    validation, test = scored(11, "v"), scored(12, "t")
    seen_scores, seen_positions = [], []

    def select_threshold(scores):
        seen_scores.append(scores)
        return select_at_80th_success_score(scores)

    def alarms_for(positions, threshold):
        seen_positions.append(positions)
        return alarms_above(test)(positions, threshold)

    bootstrap_excess(validation, test, select_threshold, alarms_for, n_resamples=10, seed=2)
    assert len(seen_scores) == len(seen_positions) == 11
    np.testing.assert_array_equal(seen_scores[0], validation.loc[validation["success"], "score"].to_numpy())
    np.testing.assert_array_equal(seen_positions[0], np.arange(len(test)))
    success_scores = set(validation.loc[validation["success"], "score"])
    strata_sizes = test.groupby(["task", "success"]).size()
    for scores, positions in zip(seen_scores[1:], seen_positions[1:]):
        assert isinstance(scores, np.ndarray) and scores.size == validation["success"].sum()
        assert set(scores) <= success_scores
        assert isinstance(positions, np.ndarray) and positions.dtype.kind == "i"
        pd.testing.assert_series_equal(test.iloc[positions].groupby(["task", "success"]).size(), strata_sizes)


def test_an_alarm_after_the_rollouts_end_in_a_resample_is_refused():
    validation, test = scored(11, "v"), scored(12, "t")
    calls = []

    def late_after_the_point(positions, threshold):
        calls.append(threshold)
        alarms = np.full(len(positions), NAN)
        if len(calls) > 1:
            alarms[0] = test["steps"].to_numpy()[positions[0]] + 1
        return alarms

    with pytest.raises(AnalysisError, match="alarm_step.*rows \\[0\\]"):
        bootstrap_excess(validation, test, lambda scores: 0.5, late_after_the_point, n_resamples=3)
    assert len(calls) == 2  # refused in the first resample, after a clean point estimate


def reference_strata(frame, strata):
    """The strata as a pandas groupby finds them, in the bootstrap's (str-sorted) order."""
    groups = frame.groupby(list(strata), sort=True).indices
    return [np.asarray(groups[key]) for key in sorted(groups, key=lambda k: tuple(map(str, np.atleast_1d(k))))]


def test_the_strata_are_groupbys_whatever_the_column_types():
    rng = np.random.default_rng(4)
    n = 50
    frame = pd.DataFrame({
        "rollout_id": [f"r{i}" for i in range(n)], "steps": 100, "success": rng.random(n) < 0.6,
        "task": pd.array(rng.choice(["PickPlace", "OpenDrawer", "b", "B", "Close"], n), dtype="string"),
        "task_object": rng.choice(["x10", "x9", "x2"], n).astype(object),
        "level": rng.choice([2, 10, 1, 33], n),  # str order differs from numeric order
        "level_float": rng.choice([0.5, 2.0, 10.0], n),
        "level_category": pd.Categorical(rng.choice(["lo", "hi"], n)),
        "mixed": pd.Series(rng.choice([1, 2], n)).astype(object),  # object column of ints
    })
    for strata in [("task", "success"), ("task_object", "success"), ("level", "success"), ("success",),
                   ("level_float", "task"), ("level_category", "success"), ("mixed", "task", "success"),
                   ("task", "level", "task_object")]:
        got, expected = _strata_positions(frame, strata, "test"), reference_strata(frame, strata)
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            np.testing.assert_array_equal(g, e)
            assert g.dtype == e.dtype
    with pytest.raises(AnalysisError, match="missing values"):
        _strata_positions(frame.assign(task=frame["task"].where(frame.index != 3)), ("task", "success"), "test")
    with pytest.raises(AnalysisError, match="missing values"):
        _strata_positions(frame.assign(task_object=frame["task_object"].where(frame.index != 3)),
                          ("task_object",), "test")


# --------------------------------------------------------------------------- recover routing


def test_routing_alarms_to_recover_prices_each_alarmed_rollout_by_its_branches():
    branches = {"S2": [(True, 130), (True, 150)], "F1": [(True, 150), (False, 200)], "S1": [(True, 90)]}
    out = recover_routing_cost(hand_frame(), branches)
    # S2: mean(0.13, 0.15) = 0.14, completes 1; F1: mean(0.15, 1.2) = 0.675, completes 0.5
    assert out["expected_total_cost"] == pytest.approx(0.08 + 0.14 + 0.12 + 0.1 + 0.675 + 1.2, abs=1e-12)
    assert out["expected_completions"] == 4.5
    assert out["C_recover"] == pytest.approx(2.315 / 4.5, abs=1e-12)
    assert out["excess_recover"] == pytest.approx(2.315 / 4.5 - 0.7, abs=1e-12)
    assert out["C_stop"] == pytest.approx(3.59 / 3, abs=1e-12)
    assert (out["n_alarmed"], out["n_routed"], out["n_missing"], out["n_branches"]) == (2, 2, 0, 4)
    assert out["n_unused_branch_sets"] == 1  # S1 never alarmed


def test_recover_routing_reduces_to_stop_and_reset_when_every_branch_fails_at_the_alarm_step():
    for seed in range(4):
        episodes = random_episodes(seed, n=60).assign(rollout_id=lambda f: [f"r{i}" for i in range(len(f))])
        alarmed = episodes.dropna(subset=["alarm_step"])
        branches = {rid: [(False, int(t))] * 3 for rid, t in zip(alarmed["rollout_id"], alarmed["alarm_step"])}
        out = recover_routing_cost(episodes, branches)
        ws = worksheet(episodes)
        assert out["C_recover"] == pytest.approx(ws["C_rule_direct"], rel=1e-12)
        assert out["excess_recover"] == pytest.approx(ws["excess_direct"], rel=1e-12, abs=1e-12)
        assert out["expected_completions"] == ws["n_completions_rule"]


def test_an_alarmed_rollout_without_branches_raises_unless_missing_stop_prices_it_as_stop_and_reset():
    branches = {"S2": [(True, 130), (True, 150)]}
    with pytest.raises(AnalysisError, match="'F1'.*missing='stop'"):
        recover_routing_cost(hand_frame(), branches)
    with pytest.raises(AnalysisError, match="'F1'"):
        recover_routing_cost(hand_frame(), {**branches, "F1": []})
    out = recover_routing_cost(hand_frame(), branches, missing="stop")
    assert (out["n_missing"], out["missing_ids"], out["n_routed"]) == (1, ["F1"], 1)
    # F1 stops: 0.05 + 1, no completion
    assert out["C_recover"] == pytest.approx((0.08 + 0.14 + 0.12 + 0.1 + 1.05 + 1.2) / 4, abs=1e-12)
    with pytest.raises(AnalysisError, match="unknown missing policy"):
        recover_routing_cost(hand_frame(), branches, missing="skip")


def test_recover_routing_that_completes_nothing_reports_no_cost_per_completion():
    frame = hand_frame().assign(alarm_step=[10.0, 40.0, 30.0, 20.0, 50.0, NAN])
    branches = {rid: [(False, 220)] for rid in ("S1", "S2", "S3", "S4", "F1")}
    out = recover_routing_cost(frame, branches)
    assert out["expected_completions"] == 0.0
    assert (out["C_recover"], out["excess_recover"], out["C_stop"]) == (None, None, None)
    assert out["C_never"] == pytest.approx(0.7, abs=1e-12)


def test_a_branch_that_ends_before_its_alarm_step_is_refused():
    with pytest.raises(AnalysisError, match="before its alarm step"):
        recover_routing_cost(hand_frame(), {"S2": [(True, 30)], "F1": [(False, 200)]})
    assert not math.isnan(recover_routing_cost(hand_frame(), {"S2": [(True, 40)], "F1": [(False, 50)]})["C_recover"])


def test_a_resample_that_draws_no_validation_success_never_alarms_instead_of_failing_the_study():
    """One success among 16 validation rows: most of 200 resamples draw it, some do not (p = (15/16)^16)."""
    validation, test = scored(11, "v"), scored(12, "t")
    validation["success"] = np.arange(len(validation)) == 0
    seen = []

    def strict_select(scores):
        if not len(scores):
            raise AssertionError("select_threshold was called without a success")
        seen.append(len(scores))
        return select_at_80th_success_score(scores)

    result = bootstrap_excess(validation, test, strict_select, alarms_above(test), n_resamples=200, seed=0,
                              strata=("task",), clusters=("rollout_id",))
    assert 0 < len(seen) - 1 < 200  # the resamples without a success were priced without the callable
    assert result.lo <= result.point <= result.hi
    with_none = bootstrap_excess(validation, test, strict_select, alarms_above(test), n_resamples=200, seed=0,
                                 strata=("task",), clusters=("rollout_id",))
    assert with_none == result
    validation["success"] = False  # the point estimate itself still needs a success: its error stands
    with pytest.raises(AssertionError, match="without a success"):
        bootstrap_excess(validation, test, strict_select, alarms_above(test), n_resamples=5, seed=0, strata=("task",))


def test_resampling_whole_base_tasks_spans_exactly_the_excess_of_each_task_alone_and_of_both():
    """Two tasks, a fixed threshold and a given c: a base-task resample is AA, AB, BA or BB, and doubling a task's
    rows leaves its cost per completion unchanged, so every resample's excess is one of three values worked out on
    the unresampled rows: the interval's ends are the smallest and largest of them (400 resamples: each of AA and
    BB has probability 1/4, far above the 2.5% tails)."""
    validation, test = scored(11, "v"), scored(12, "t")
    threshold, c = 0.9, 0.01
    alarms = alarm_column(test, threshold)

    def excess(rows):
        return worksheet(test[rows].assign(alarm_step=alarms[rows.to_numpy()]), c=c)["excess_direct"]

    by_task = [excess(test["task"] == "A"), excess(test["task"] == "B"), excess(test["task"].isin(["A", "B"]))]
    tasks = bootstrap_excess(validation, test, lambda scores: threshold, alarms_above(test), n_resamples=400, seed=5,
                             c=c, strata=(), clusters=("task",))
    assert (tasks.lo, tasks.hi) == (min(by_task), max(by_task)) and tasks.point == by_task[2]
    assert by_task[0] != by_task[1]  # the two tasks differ: the interval is not a point
    # base episodes within task (the study's main interval) keep both tasks in every resample: another interval
    episodes = bootstrap_excess(validation, test, lambda scores: threshold, alarms_above(test), n_resamples=400,
                                seed=5, c=c, strata=("task",), clusters=("rollout_id",))
    assert episodes.point == tasks.point and (episodes.lo, episodes.hi) != (tasks.lo, tasks.hi)


def test_the_task_resampling_line_counts_unchanged_and_changed_zero_exclusion_verdicts_from_both_sides():
    from robocasa_shift.monitoring.study import task_resampling_line

    verdicts = pd.DataFrame({"monitor": ["a", "b", "c"], "task_resampling_changes_verdict": [False, True, None]})
    assert task_resampling_line(verdicts) == ("Base-task resampling: the zero-exclusion verdict on the excess cost is "
                                              "unchanged for 1/2 monitors when whole base tasks are resampled; it "
                                              "changes for b.")
    flipped = verdicts.assign(task_resampling_changes_verdict=[True, False, None])
    assert task_resampling_line(flipped).endswith("unchanged for 1/2 monitors when whole base tasks are resampled; "
                                                  "it changes for a.")
    same = verdicts.assign(task_resampling_changes_verdict=[False, False, None])
    assert task_resampling_line(same).endswith("unchanged for 2/2 monitors when whole base tasks are resampled.")
    assert task_resampling_line(verdicts.assign(task_resampling_changes_verdict=None)).startswith(
        "Base-task resampling: not defined")


def test_the_length_table_lists_each_tasks_success_and_failure_lengths_worked_out_by_hand(tmp_path):
    from robocasa_shift.monitoring.study import LENGTH_FIGURE, length_table
    from robocasa_shift.report.monitors import length_figure

    ep = pd.DataFrame({"task": ["B", "A", "A", "A", "B", "A"], "success": [True, True, False, True, True, True],
                       "steps": [40, 90, 220, 70, 50, 110]})
    table = length_table(ep)
    assert math.isnan(table.loc[1, "median_failures"])  # no failure in B: no median
    assert table.drop(columns="median_failures").to_dict("records") == [
        {"task": "A", "n_successes": 3, "median_successes": 90.0, "successes": [70, 90, 110], "n_failures": 1,
         "failures": [220]},
        {"task": "B", "n_successes": 2, "median_successes": 45.0, "successes": [40, 50], "n_failures": 0,
         "failures": []}]
    assert table.loc[0, "median_failures"] == 220.0
    figure = length_figure(tmp_path, table)
    assert figure["file"] == LENGTH_FIGURE and (tmp_path / LENGTH_FIGURE).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_monitor_study_takes_a_figure_writer_and_refuses_the_old_flag_before_reading_anything(tmp_path):
    from robocasa_shift.monitoring.study import evaluate

    for flag in (True, False):  # the figures are the report's (report/monitors.py): a flag would draw nothing
        with pytest.raises(TypeError, match="report.monitors"):
            evaluate(tmp_path / "no-run", ["clock"], figures=flag)
    assert not (tmp_path / "no-run").exists()
