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
