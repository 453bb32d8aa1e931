"""Numbers, round 4: power of the verdict, verdicts a design cannot reach, and the studies' intervals.

Each test has a known answer (exact enumeration, a closed form or a hand-made table) and fails on the code
before the fix; the defect it pins is named in its docstring.
"""

import itertools
import math

import numpy as np
import pytest
from helpers import cli

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.analysis.measures import analyze
from test_statistics_round3 import counts_table

# --------------------------------------------------------------------------- the minimum detectable dSR of the verdict


def brute_force_verdict_power(n_pairs, p_sf, p_fs, verdict="DEGRADED"):
    """Every (S->F, F->S) of every task with its trinomial probability, each table decided as analyze decides it."""
    per_task = []
    for n, a, b in zip(n_pairs, p_sf, p_fs):
        per_task.append([(sf, fs, math.comb(n, sf) * math.comb(n - sf, fs) * a ** sf * b ** fs
                          * (1 - a - b) ** (n - sf - fs)) for sf in range(n + 1) for fs in range(n + 1 - sf)])
    total = 0.0
    for combo in itertools.product(*per_task):
        counts = [[n - sf - fs, sf, fs, 0] for n, (sf, fs, _) in zip(n_pairs, combo)]
        p = stats.signflip_test(n_pairs, [c[1] for c in counts], [c[2] for c in counts]).p
        if stats.decision(stats.calibrated_interval(counts), p)["verdict"] == verdict:
            total += math.prod(o[2] for o in combo)
    return total


def test_the_verdicts_power_equals_enumeration_of_every_outcome():
    exact = stats.verdict_power([3, 4], [0.6, 0.4], 0.2)
    assert exact.method == "exact"
    assert exact.power == pytest.approx(brute_force_verdict_power([3, 4], [0.4, 0.3], [0.2, 0.1]), abs=1e-12)
    nothing = stats.verdict_power([5], [0.2], 0.0, verdict=stats.NO_CHANGE)
    assert nothing.power == pytest.approx(brute_force_verdict_power([5], [0.1], [0.1], "NO CHANGE DETECTED"), abs=1e-12)


def test_degraded_power_at_the_tests_minimum_detectable_dsr_is_far_below_80_percent():
    """Before, the MDE was the test's: 3 tasks x 10/20/30 pairs at discordance 0.1 printed 0.135, where DEGRADED (the
    interval above 0 too) has power 0.28; 4 x 16 at dSR 0.2 has test power 0.827 but DEGRADED power 0.754."""
    test = stats.random_outcome_power([10, 20, 30], [0.1] * 3, 0.135)
    degraded = stats.verdict_power([10, 20, 30], [0.1] * 3, 0.135)
    assert test.power >= 0.8 and degraded.method == "monte carlo"
    assert degraded.power == pytest.approx(0.279, abs=4 * degraded.standard_error)
    assert stats.random_outcome_power([16] * 4, [0.3] * 4, 0.2).power == pytest.approx(0.8269, abs=5e-4)
    four = stats.verdict_power([16] * 4, [0.3] * 4, 0.2)
    assert four.power == pytest.approx(0.754, abs=4 * four.standard_error) and four.power < 0.8
    mde = stats.minimum_detectable_dsr([10, 20, 30], [0.1] * 3)
    assert mde.first == pytest.approx(0.21) and mde.power_at_first >= 0.8 and mde.standard_error > 0
    assert stats.minimum_detectable_dsr([10, 10], [0.3, 0.3]).first == pytest.approx(0.42)  # the fake tour, exactly


def test_plan_power_plans_for_the_verdict():
    """4 tasks at discordance 0.3 and dSR 0.2: the test alone reached 0.8 at 16 base episodes, DEGRADED needs 18."""
    plan = stats.plan_pairs(4, 0.2, 0.3)
    assert plan.first in (17, 18) and plan.power[plan.first].power >= 0.8
    assert plan.power[16].power < 0.8 and all(plan.power[n].power == 0 for n in range(1, 2))
    proc = cli("plan-power", "--tasks", "4", "--verdict", "no-change", "--discordance", "0")
    assert "no outcome reads NO CHANGE DETECTED below 21 base episodes per task" in proc.stdout
    assert "21 base episodes per task read NO CHANGE DETECTED when nothing changed" in proc.stdout


# --------------------------------------------------------------------------- verdicts no outcome of a design can give


def test_no_change_and_degraded_are_first_reachable_at_the_enumerated_sizes():
    """The narrowest macro half-width at 3 x 3 is +-0.398 and at 2 x 10 +-0.244, both wider than the +-0.10 margin."""
    assert [stats.smallest_reachable(k, stats.NO_CHANGE) for k in (1, 2, 3, 4)] == [45, 30, 24, 21]
    assert [stats.smallest_reachable(k, stats.DEGRADED) for k in (1, 2, 3, 4)] == [6, 3, 2, 2]
    assert stats.calibrated_interval([[3, 0, 0, 0]] * 3)[1] == pytest.approx(0.398, abs=5e-4)
    assert stats.calibrated_interval([[10, 0, 0, 0]] * 2)[1] == pytest.approx(0.244, abs=5e-4)
    # the extreme outcomes decide reachability: checked against every outcome of the designs at the edges
    for n_pairs, kind, code in (([44], "no_change", 2), ([45], "no_change", 2), ([5], "degraded", 0),
                                ([6], "degraded", 0), ([2, 2], "degraded", 0), ([3, 3], "degraded", 0)):
        _, _, codes = stats._enumerated_verdicts(tuple(n_pairs), stats.ALPHA, stats.MIN_EFFECT)
        assert bool(np.any(codes == code)) == getattr(stats.reachable_verdicts(n_pairs), kind)


def test_the_report_says_why_no_verdict_of_a_small_design_could_be_decisive():
    """Before, the demo's 3 x 3 printed 36 per-task UNDERPOWERED verdicts that no outcome could have changed."""
    from robocasa_shift.report.page import unreachable_sentence

    spec = {c: {t: (1, 1, 0, 1) for t in ("Alpha", "Beta", "Gamma")} for c in ("camera:L1", "blur:L2")}
    summary = analyze(counts_table(spec), n_boot=50)
    assert summary["conditions"]["blur:L2"]["power"]["reachable"] == {"degraded": True, "no_change": False}
    sentence = unreachable_sentence(summary)
    assert sentence.startswith("No outcome of this design could have given NO CHANGE DETECTED for any condition "
                               "(with 3 tasks it needs at least 24 base episodes per task)")
    assert "any per-task verdict but UNDERPOWERED (a task needs 6 pairs for DEGRADED and 45 for NO CHANGE" in sentence
    assert "plan-power" in sentence
    large = analyze(counts_table({"camera:L1": {"Alpha": (40, 3, 1, 6)}}), n_boot=50)
    assert unreachable_sentence(large) is None  # 50 pairs: every verdict was possible


# --------------------------------------------------------------------------- the interaction interval, dependent failures


def test_the_interaction_interval_accounts_for_a_and_b_failing_on_the_same_episodes():
    """Before, the two paired differences were taken as uncorrelated: clean 0.9, dSR 0.3 each, interaction 0.1, fully
    dependent (A and B fail on the same episodes), 200 pairs: coverage 0.940, not improving with the pair count."""
    from robocasa_shift.analysis import interactions

    p = interactions.quadruple_probabilities(0.9, 0.3, 0.3, 0.1, 1.0)
    rng = np.random.default_rng(0)
    draws = rng.multinomial(200, p, size=(4000, 1))
    assert float(np.median(interactions.component_correlation(draws))) < -0.5  # the dependence the old interval left out
    coverage = interactions.joint_coverage(p, 0.1, 1, 200, 4000, rng)
    assert coverage >= 0.955  # standard error 0.0035 at 0.95
    # the four outcomes of an episode enter jointly: shuffling b against the others changes the interval
    c = np.array([1] * 10 + [0] * 2, bool)
    a = np.array([1] * 6 + [0] * 6, bool)
    b, ab = a.copy(), np.array([1] * 3 + [0] * 9, bool)
    together = interactions.interaction_interval(np.array([[interactions.quadruple_counts(c, a, b, ab)]]))
    apart = interactions.interaction_interval(np.array([[interactions.quadruple_counts(c, a, b[::-1], ab)]]))
    assert together[0] == apart[0] and together[2] - together[1] != pytest.approx(apart[2] - apart[1])


# --------------------------------------------------------------------------- the monitors study's intervals over tasks


def test_the_intervals_over_tasks_keep_their_level_with_three_tasks():
    """Before, the LOTO macro AUC's task bootstrap was the range of three values and covered the task-population mean
    0.74 of the time with 3 tasks; the gap's task-clustered bootstrap 0.71."""
    from robocasa_shift.analysis import monitor_detection as detection

    rng = np.random.default_rng(0)
    cell = detection.task_interval_coverage(3, 20, 1.0, 1.0, 300, rng)
    assert cell["macro"] >= 0.88 and cell["gap"] >= 0.9  # standard error about 0.015
    assert cell["truth_gap"] < -0.01  # offsets make between-task pairs count: the gap is not 0


# --------------------------------------------------------------------------- success judges: a macro of one subset


def test_a_macro_balanced_accuracy_over_one_two_class_subset_is_not_estimable():
    """Before, score-judge printed macro BA 1.000 [1.00, 1.00] for a judge with 20% label flips (micro 0.95): only one
    (task, condition) subset held both classes, and the 'macro' was that subset's BA."""
    import pandas as pd

    from robocasa_shift.judging import scoring

    rng = np.random.default_rng(0)
    rows = []
    for task, condition, successes, failures in (("A", "clean", 10, 10), ("A", "blur:L3", 20, 0),
                                                 ("B", "clean", 20, 0), ("B", "blur:L3", 0, 20)):
        truth = np.array([True] * successes + [False] * failures)
        flipped = truth ^ (rng.random(truth.size) < 0.2)
        if condition == "clean" and task == "A":
            flipped = truth.copy()  # the one two-class subset is judged perfectly
        rows += [{"task": task, "condition": condition, "success": s, "predicted": p} for s, p in zip(truth, flipped)]
    frame = pd.DataFrame(rows)
    result = scoring.accuracy(frame, np.random.default_rng(1), n_boot=200)
    macro = result["macro"]
    assert macro["ba"] is None and (macro["subsets"], macro["of_subsets"]) == (1, 4)
    assert "1 of 4 subsets hold both classes; a macro needs 2" == macro["not_estimable"]
    assert result["micro"]["ba"] < 0.95  # the label flips show in the pooled figure
    assert scoring._macro_text(macro) == "not estimable (1/4 subsets with both classes)"
    two = frame.copy()
    two.loc[(two.task == "B") & (two.condition == "clean"), "success"] = [True] * 10 + [False] * 10
    macro = scoring.accuracy(two, np.random.default_rng(1), n_boot=200)["macro"]
    assert macro["ba"] is not None and scoring._macro_text(macro).endswith("(2/4 subsets)")


# --------------------------------------------------------------------------- non-monotone recoverability: its size


def test_the_non_monotone_test_keeps_its_level_at_a_flat_recoverability():
    """Before, the parametric bootstrap from the fitted probabilities rejected 0.0765 of flat trunks (p 0.5, 5
    checkpoints, K 16) at nominal 0.05. Now exact: every outcome of each design enumerated, every flat p on a
    0.05 grid; and by simulation on the issue's design, which is too large to enumerate."""
    from robocasa_shift.analysis import branching

    grid = [round(0.05 * i, 2) for i in range(1, 20)]
    for n in ([4] * 3, [16] * 3, [4] * 4, [4] * 5, [8] * 4):
        sizes = branching.nonmonotone_exact_size(n, grid)
        assert max(sizes.values()) <= 0.05, (n, max(sizes.items(), key=lambda item: item[1]))
    simulated = branching.nonmonotone_size([0.5] * 5, [16] * 5, trunks=1000, n_perm=200, seed=1)
    assert simulated["rejection_rate"] <= 0.05 + 2 * simulated["standard_error"]  # the bootstrap: 0.0765
    test = branching.nonmonotone_test([6, 0, 6, 0, 6], [16] * 5, n_perm=400)
    assert not test["exact"] and test["p"] < 0.01  # a rise from 0/16 to 6/16, twice: detected


# --------------------------------------------------------------------------- adaptive K: its operating characteristic


def test_the_adaptive_rules_operating_characteristic_is_exact_and_agreement_is_counted_where_it_can_fail():
    """Before, 'adaptive K agrees with K = 32 on 12/12 cells' was read as a check: every cell had zero successes,
    where disagreement is impossible. At p = 0.3 the adaptive rule calls a checkpoint recoverable with probability
    0.086 (3 of 4 successes, no expansion) against 0.002 for K = 32; they disagree 0.19-0.30 for p in 0.4-0.6."""
    import pandas as pd

    from robocasa_shift.analysis import branching
    from robocasa_shift.analysis.recoverability import jeffreys_lower, needs_expansion, operating_characteristic

    at = {p: operating_characteristic(p) for p in (0.3, 0.4, 0.5, 0.6)}
    assert at[0.3]["adaptive"] == pytest.approx(0.0862, abs=5e-4) and at[0.3]["fixed"] == pytest.approx(0.0018, abs=5e-4)
    assert all(0.19 <= at[p]["disagree"] <= 0.31 for p in (0.4, 0.5, 0.6))
    # against a simulation of the rule itself, branches shared with the reference as `branch --k-fixed` runs them
    rng = np.random.default_rng(0)
    outcomes = rng.random((4000, 32)) < 0.5
    adaptive = disagree = 0
    for row in outcomes:
        n = 16 if needs_expansion(int(row[:4].sum()), 4) else 4
        verdict = jeffreys_lower(int(row[:n].sum()), n) >= 0.5
        adaptive += verdict
        disagree += verdict != (jeffreys_lower(int(row.sum()), 32) >= 0.5)
    assert adaptive / 4000 == pytest.approx(at[0.5]["adaptive"], abs=0.03)
    assert disagree / 4000 == pytest.approx(at[0.5]["disagree"], abs=0.03)
    # the summary counts the checkpoints where the reference saw both outcomes apart
    frame = pd.DataFrame({"intervention": ["Recover"] * 3, "trunk": ["t"] * 3, "step": [10, 20, 30], "k_fixed": [0, 0, 20],
                          "n_fixed": [32] * 3, "recoverable": [False, False, False], "recoverable_fixed": [False, False, True],
                          "agree": [True, True, False]})
    summary = branching.fixed_k_summary(frame)[0]
    assert (summary["informative"], summary["informative_disagree"]) == (1, 1)
    assert "1/1 of those where the reference saw both outcomes" in summary["text"]
