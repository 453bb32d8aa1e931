"""Issue 12: the statistics are publishable. Each test builds its own table or run directory.

Defects 1, 2, 6, 7 and 8 (analysis side) and items 9-11: row-order invariance, fingerprint
mismatches as invalid pairs, macros over all tasks or none, the exact stratified sign-flip test
that matches the macro, refusal of mixed tables, invalid counts, the calibrated interval and its
coverage simulation, power and verdicts, and the severity trend test.
"""

import itertools
import json
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import cli

from robocasa_shift.analysis.measures import AnalysisError, analyze

# --------------------------------------------------------------------------- tables made here


def row(task, episode, condition, success, done=None, k=3, **extra):
    """One records-table row; a success latched every subgoal, a failure stopped after ``done``."""
    done = (k if success else 1) if done is None else done
    return {"task": task, "episode": episode, "condition": condition, "success": bool(success), "n_stages": k,
            "stages_completed": done, "first_incomplete": "" if done == k else done + 1, **extra}


def pairs_table(spec, condition="camera:L2", k=3):
    """Rows from {task: [(clean, perturbed), ...]}: one base episode per entry, in order."""
    rows = []
    for task, outcomes in spec.items():
        for episode, (clean, perturbed) in enumerate(outcomes):
            rows.append(row(task, episode, "clean", clean, k=k))
            rows.append(row(task, episode, condition, perturbed, done=k if perturbed else episode % k, k=k))
    return pd.DataFrame(rows)


def counts_spec(**tasks):
    """{task: (ss, sf, fs, ff)} as pairs: S->S first, then S->F, F->S, F->F."""
    return {t: [(True, True)] * ss + [(True, False)] * sf + [(False, True)] * fs + [(False, False)] * ff
            for t, (ss, sf, fs, ff) in tasks.items()}


def three_task_table(seed=5):
    """Alpha 20, Beta 17, Gamma 13 pairs with varied outcomes and S->F depths."""
    rng = np.random.default_rng(seed)
    rows = []
    for task, n in (("Alpha", 20), ("Beta", 17), ("Gamma", 13)):
        for episode in range(n):
            clean, perturbed = rng.random() < 0.85, rng.random() < 0.5
            rows.append(row(task, episode, "clean", clean, done=3 if clean else int(rng.integers(0, 3))))
            rows.append(row(task, episode, "camera:L2", perturbed, done=3 if perturbed else int(rng.integers(0, 3))))
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- defect 1: row order


def test_bootstrap_intervals_do_not_depend_on_the_row_order():
    table = three_task_table()
    seen = set()
    for permutation in range(8):
        shuffled = table.sample(frac=1.0, random_state=permutation).reset_index(drop=True)
        camera = analyze(shuffled, n_boot=2000, bootstrap_seed=3)["conditions"]["camera:L2"]
        assert camera["sf"]["n"] >= 10  # enough S->F pairs for the progress interval to move
        seen.add((tuple(camera["dsr_ci95"]), tuple(camera["per_task_dsr_ci95"]["Beta"]),
                  tuple(camera["sf"]["mean_progress_ci95"]), tuple(camera["sf"]["first_stage_fraction_ci95"])))
    assert len(seen) == 1, seen


# --------------------------------------------------------------------------- defect 2: fingerprints


def fingerprinted_table():
    """Alpha, 4 episodes: clean all S; camera:L1 S, F, F, F; every rollout carries its twin's fingerprints."""
    rows = []
    for episode, perturbed in enumerate([True, False, False, False]):
        prints = {"env_fingerprint": f"env{episode}", "policy_rng_fingerprint": f"rng{episode}"}
        rows.append(row("Alpha", episode, "clean", True, **prints))
        rows.append(row("Alpha", episode, "camera:L1", perturbed, **prints))
    return pd.DataFrame(rows)


def test_a_fingerprint_mismatch_makes_the_pair_invalid():
    table = fingerprinted_table()
    assert analyze(table, n_boot=200)["conditions"]["camera:L1"]["n_pairs"] == 4
    perturbed = table["condition"] == "camera:L1"
    table.loc[perturbed & (table.episode == 1), "env_fingerprint"] = "leaked-state"
    table.loc[perturbed & (table.episode == 2), "policy_rng_fingerprint"] = "other-rng"
    camera = analyze(table, n_boot=200)["conditions"]["camera:L1"]
    # both twins leave the paired measures: pairs e0 (S->S) and e3 (S->F) remain
    assert camera["n_pairs"] == 2
    assert camera["per_task_dsr"]["Alpha"] == pytest.approx(0.5)
    assert camera["transitions"] == {"SS": 1, "SF": 1, "FS": 0, "FF": 0, "changed": 1}
    assert camera["invalid_pairs"] == {"missing_twin": 0, "fingerprint_mismatch": 2, "perturbed_invalid": 0,
                                       "clean_invalid": 0}
    assert camera["per_task_invalid_pairs"]["Alpha"]["fingerprint_mismatch"] == 2
    # the mismatched perturbed rollouts are invalid rollouts (docs/protocol.md section 6): out of SR too
    assert camera["per_task_n_valid"]["Alpha"] == 2 and camera["per_task_n_invalid"]["Alpha"] == 2
    clean = analyze(table, n_boot=200)["conditions"]["clean"]
    assert clean["per_task_n_valid"]["Alpha"] == 4  # the clean twins stay the reference


def test_a_table_without_fingerprints_pairs_as_before():
    table = fingerprinted_table().drop(columns=["env_fingerprint", "policy_rng_fingerprint"])
    assert analyze(table, n_boot=200)["conditions"]["camera:L1"]["invalid_pairs"]["fingerprint_mismatch"] == 0


# --------------------------------------------------------------------------- run directories (fake backend)


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    """Two fake-backend runs (expert, random): Reach and PickPlace, 3 conditions, episodes 0-2."""
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.study.runner import run

    root = tmp_path_factory.mktemp("statistics")
    for policy in ("expert", "random"):
        run(root / policy, ["Reach", "PickPlace"], ["clean", "camera:L2", "blur:L3"], [0, 1, 2],
            StudyConfig(backend="fake", policy=f"fake-{policy}"), ExecutionConfig(workers=1, progress=False))
    return root


def copy_run(fake_runs, tmp_path, name="expert"):
    dest = tmp_path / name
    shutil.copytree(fake_runs / name, dest)
    return dest


def edit_record(run_dir, task, episode, condition, **changes):
    path = run_dir / "records" / "formal" / task / f"{episode:04d}__{condition.replace(':', '-')}__r0.json"
    record = json.loads(path.read_text())
    record.update(changes)
    path.write_text(json.dumps(record))
    return path


def test_fingerprint_mismatch_in_a_run_directory_reaches_analyze_compare_and_report(fake_runs, tmp_path):
    from robocasa_shift.analysis.compare import compare_runs
    from robocasa_shift.analysis.export import records_frame
    from robocasa_shift.report.page import build_report

    run_dir = copy_run(fake_runs, tmp_path)
    edit_record(run_dir, "Reach", 1, "camera:L2", env_fingerprint="f" * 64)
    camera = analyze(records_frame(run_dir), n_boot=200)["conditions"]["camera:L2"]
    assert camera["invalid_pairs"]["fingerprint_mismatch"] == 1
    assert camera["per_task_n_pairs"] == {"PickPlace": 3, "Reach": 2}

    compared = compare_runs(run_dir, fake_runs / "random", n_boot=200)["conditions"]["camera:L2"]
    assert compared["invalid_pairs"]["fingerprint_mismatch"] == 1
    assert compared["per_task"]["Reach"]["n_pairs"] == 2

    page = build_report(run_dir, videos_per_kind=0, n_boot=200).read_text()
    assert "fingerprint mismatch 1" in page


# --------------------------------------------------------------------------- defect 6: missing tasks


def test_a_macro_over_fewer_tasks_is_null_and_names_the_missing_task():
    table = pairs_table(counts_spec(Alpha=(2, 2, 0, 0), Beta=(1, 1, 1, 1)))
    beta_perturbed = (table.task == "Beta") & (table.condition == "camera:L2")
    table.loc[beta_perturbed, "valid"] = False
    table["valid"] = table["valid"].fillna(True)
    summary = analyze(table, n_boot=200)
    camera = summary["conditions"]["camera:L2"]
    assert camera["missing_tasks"] == ["Beta"]
    assert camera["macro_dsr"] is None and camera["dsr_ci95"] is None and camera["dsr_ci95_calibrated"] is None
    assert camera["per_task_dsr"]["Alpha"] == pytest.approx(0.5)  # per-task values stay
    assert camera["per_task_dsr"]["Beta"] is None
    assert camera["macro_sr"] is None and camera["missing_tasks_sr"] == ["Beta"]
    assert camera["per_task_sr"]["Alpha"] == pytest.approx(0.5)
    assert camera["verdict"] is None and camera["per_task_verdict"]["Alpha"] is not None
    assert summary["conditions"]["clean"]["macro_sr"] == pytest.approx(0.75)
    assert camera["invalid_pairs"]["perturbed_invalid"] == 4


def test_the_report_says_when_a_macro_is_missing(fake_runs, tmp_path):
    from robocasa_shift.report.page import build_report

    run_dir = copy_run(fake_runs, tmp_path)
    for episode in range(3):
        edit_record(run_dir, "PickPlace", episode, "blur:L3", valid=False, error="renderer died", error_kind="renderer")
    page = build_report(run_dir, videos_per_kind=0, n_boot=200).read_text()
    assert "blur:L3: no valid pair for PickPlace" in page
    assert "macro not computed" in page


# --------------------------------------------------------------------------- defect 7: the test of the macro


def brute_force_signflip(n_pairs, sf, fs):
    """Two-sided and upper p-values by enumerating every sign of every discordant pair (tests only)."""
    weights = [1 / (len(n_pairs) * n) for n, b, c in zip(n_pairs, sf, fs) for _ in range(b + c)]
    observed = sum((b - c) / n for n, b, c in zip(n_pairs, sf, fs)) / len(n_pairs)
    m = len(weights)
    signs = 1 - 2 * ((np.arange(2 ** m)[:, None] >> np.arange(m)) & 1)
    statistic = signs @ np.array(weights)
    return float(np.mean(np.abs(statistic) >= abs(observed) - 1e-12)), float(np.mean(statistic >= observed - 1e-12))


def test_signflip_test_equals_enumeration_and_matches_the_macro_where_mcnemar_does_not():
    from robocasa_shift.analysis.statistics import signflip_test

    # Alpha: 10 pairs, 8 S->F (dSR +0.8). Beta: 100 pairs, 2 S->F, 10 F->S (dSR -0.08). Macro +0.36, but
    # pooled over pairs the discordant counts are 10 and 10: McNemar's p is 1.
    table = pairs_table(counts_spec(Alpha=(2, 8, 0, 0), Beta=(80, 2, 10, 8)))
    camera = analyze(table, n_boot=500)["conditions"]["camera:L2"]
    assert camera["macro_dsr"] == pytest.approx(0.36)
    assert (camera["mcnemar"]["b"], camera["mcnemar"]["c"], camera["mcnemar"]["p"]) == (10, 10, 1.0)
    two_sided, upper = brute_force_signflip([10, 100], [8, 2], [0, 10])
    assert camera["signflip"]["p"] == pytest.approx(two_sided, abs=1e-12)
    assert camera["signflip"]["p_greater"] == pytest.approx(upper, abs=1e-12)
    assert camera["signflip"]["p"] < 0.05 and camera["signflip"]["exact"]
    # unequal pair counts, a few tasks: still the enumeration, to the last digit
    for n, b, c in [([5, 4, 3], [2, 0, 2], [0, 1, 0]), ([20, 17, 13], [3, 1, 4], [1, 2, 0]), ([7], [4], [1])]:
        result = signflip_test(n, b, c)
        assert (result.p, result.p_greater) == pytest.approx(brute_force_signflip(n, b, c), abs=1e-12)


def test_signflip_is_a_convolution_not_an_enumeration():
    import time

    from robocasa_shift.analysis.statistics import signflip_test

    started = time.perf_counter()
    equal = signflip_test([50] * 8, [30] * 8, [20] * 8)  # 400 discordant pairs: 2^400 sign patterns
    coprime = signflip_test([50, 49, 47, 43, 41, 37, 31, 29], [25] * 8, [20] * 8)
    assert time.perf_counter() - started < 5
    assert equal.exact and 0 < equal.p < 0.05
    assert not coprime.exact and 0 < coprime.p <= 1  # lcm too large: a rounded lattice, flagged
    assert equal.p_greater + equal.p_less >= 1.0


def test_holm_families_are_stated_and_applied():
    spec = counts_spec(Alpha=(5, 10, 0, 5), Beta=(5, 10, 0, 5))
    table = pd.concat([pairs_table(spec, "camera:L1"), pairs_table(spec, "camera:L3")])
    table = table.drop_duplicates(["task", "episode", "condition"])
    summary = analyze(table, n_boot=200)
    assert set(summary["holm_families"]) == {"signflip", "mcnemar_pooled", "mcnemar_per_task", "equivalence",
                                             "equivalence_per_task", "reversal", "trend"}
    for condition in ("camera:L1", "camera:L3"):
        signflip = summary["conditions"][condition]["signflip"]
        assert signflip["p_holm"] == pytest.approx(min(1.0, 2 * signflip["p"]))  # two equal p-values, m = 2


# --------------------------------------------------------------------------- defect 8 (analysis side)


@pytest.mark.parametrize("column, values", [("policy", ["reference", "reference-blind"]),
                                            ("backend", ["robosuite", "fake"]),
                                            ("stage_spec_hash", ["aaa111", "bbb222"])])
def test_analyze_refuses_a_table_mixing_policies_backends_or_stage_specs(column, values):
    table = pairs_table(counts_spec(Alpha=(3, 1, 0, 0)))
    table[column] = values[0]
    table.loc[table.index[-1], column] = values[1]
    with pytest.raises(AnalysisError) as error:
        analyze(table, n_boot=50)
    message = str(error.value)
    assert f"'{column}'" in message and values[0] in message and values[1] in message


def test_stage_spec_hashes_may_differ_between_tasks():
    table = pairs_table(counts_spec(Alpha=(3, 1, 0, 0), Beta=(2, 2, 0, 0)))
    table["stage_spec_hash"] = np.where(table.task == "Alpha", "aaa111", "bbb222")
    assert analyze(table, n_boot=50)["conditions"]["camera:L2"]["n_pairs"] == 8


def test_export_carries_the_stage_spec_hash_and_analyze_refuses_a_mixed_run(fake_runs, tmp_path):
    from robocasa_shift.analysis.export import records_frame

    frame = records_frame(fake_runs / "expert")
    assert "stage_spec_hash" in frame.columns and frame["stage_spec_hash"].notna().all()
    assert frame.groupby("task")["stage_spec_hash"].nunique().eq(1).all()
    run_dir = copy_run(fake_runs, tmp_path)
    edit_record(run_dir, "Reach", 2, "blur:L3", stage_spec_hash="0" * 64)
    with pytest.raises(AnalysisError, match="stage_spec_hash.*Reach"):
        analyze(records_frame(run_dir), n_boot=50)


def test_summary_counts_invalid_rollouts_per_condition_and_task():
    table = pairs_table(counts_spec(Alpha=(3, 1, 0, 0), Beta=(2, 1, 1, 0)))
    table["valid"] = True
    table.loc[(table.task == "Beta") & (table.condition == "camera:L2") & (table.episode == 0), "valid"] = False
    table.loc[(table.task == "Alpha") & (table.condition == "clean") & (table.episode == 3), "valid"] = False
    table = table[~((table.task == "Beta") & (table.condition == "camera:L2") & (table.episode == 3))]
    summary = analyze(table, n_boot=50)
    camera, clean = summary["conditions"]["camera:L2"], summary["conditions"]["clean"]
    assert camera["per_task_n_invalid"] == {"Alpha": 0, "Beta": 1} and camera["n_invalid"] == 1
    assert clean["per_task_n_invalid"] == {"Alpha": 1, "Beta": 0}
    assert camera["per_task_invalid_pairs"]["Alpha"] == {"missing_twin": 0, "fingerprint_mismatch": 0,
                                                         "perturbed_invalid": 0, "clean_invalid": 1}
    assert camera["per_task_invalid_pairs"]["Beta"] == {"missing_twin": 1, "fingerprint_mismatch": 0,
                                                        "perturbed_invalid": 1, "clean_invalid": 0}
    # SR counts 4 + 3 perturbed rollouts, dSR 3 + 2 pairs: the counts say why they differ
    assert sum(camera["per_task_n_valid"].values()) == 6 and camera["n_pairs"] == 5


def test_compare_refuses_runs_with_different_stage_specs(fake_runs, tmp_path):
    from robocasa_shift.analysis.compare import compare_runs

    run_dir = copy_run(fake_runs, tmp_path, "random")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["stage_spec_hashes"]["Reach"] = "0" * 64
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(AnalysisError, match="stage_spec_hashes.*Reach"):
        compare_runs(fake_runs / "expert", run_dir, n_boot=50)


def test_compare_leaves_stage_tracker_errors_out_of_the_depth_difference(fake_runs, tmp_path):
    from robocasa_shift.analysis.compare import compare_runs
    from robocasa_shift.analysis.export import records_frame

    before = compare_runs(fake_runs / "expert", fake_runs / "random", n_boot=50)["conditions"]["blur:L3"]
    run_dir = copy_run(fake_runs, tmp_path)
    # a tracker that raised half-way: its depth (0 of K) is not a measured depth
    edit_record(run_dir, "PickPlace", 0, "blur:L3", stage_error="predicate raised", stages_completed=0,
                first_incomplete=1)
    after = compare_runs(run_dir, fake_runs / "random", n_boot=50)["conditions"]["blur:L3"]
    assert after["n_pairs"] == before["n_pairs"] == 6  # success is still compared
    assert after["n_stage_error_dropped"] == 1 and before["n_stage_error_dropped"] == 0
    assert after["per_task"]["PickPlace"]["n_depth_pairs"] == 2
    a, b = (records_frame(d).set_index(["task", "episode", "condition"]) for d in (run_dir, fake_runs / "random"))
    depth = [a.loc[("PickPlace", e, "blur:L3"), "stages_completed"] - b.loc[("PickPlace", e, "blur:L3"), "stages_completed"]
             for e in (1, 2)]
    assert after["per_task"]["PickPlace"]["depth_diff"] == pytest.approx(np.mean(depth) / 3)  # PickPlace: K = 3


# --------------------------------------------------------------------------- item 9: the calibrated interval


def test_the_calibrated_interval_does_not_collapse_where_the_percentile_one_does():
    # Every pair of each task moved the same way: every bootstrap resample is the same table.
    table = pairs_table(counts_spec(Alpha=(0, 9, 0, 0), Beta=(9, 0, 0, 0), Gamma=(0, 9, 0, 0)))
    camera = analyze(table, n_boot=500)["conditions"]["camera:L2"]
    assert camera["macro_dsr"] == pytest.approx(2 / 3)
    assert camera["dsr_ci95"] == [pytest.approx(2 / 3)] * 2 and camera["dsr_ci95_zero_width"] is True
    lo, hi = camera["dsr_ci95_calibrated"]
    assert lo < 2 / 3 < hi and hi - lo > 0.1
    assert all(v is True for v in camera["per_task_dsr_ci95_zero_width"].values())
    assert camera["per_task_dsr_ci95_calibrated"]["Beta"][0] < 0 < camera["per_task_dsr_ci95_calibrated"]["Beta"][1]


def test_macro_interval_formula_by_hand():
    from robocasa_shift.analysis.statistics import calibrated_interval, task_interval

    # one task, SS 10, SF 6, FS 2, FF 2 (n = 20): the task's own interval (Tango's score interval, corrected)
    lower, upper = task_interval(6, 2, 20)
    assert calibrated_interval([[10, 6, 2, 2]]) == pytest.approx([float(lower), float(upper)])
    # two equal tasks: square-and-add of the same distances, divided by 2 tasks: the half-widths shrink by sqrt(2)
    two = calibrated_interval([[10, 6, 2, 2], [10, 6, 2, 2]])
    assert two == pytest.approx([0.2 - (0.2 - float(lower)) / 2 ** 0.5, 0.2 + (float(upper) - 0.2) / 2 ** 0.5])


def test_coverage_simulation_on_a_tiny_grid():
    from robocasa_shift.analysis.statistics import (
        cell_probabilities,
        coverage_failures,
        coverage_grid,
    )

    assert cell_probabilities(0.8, 0.2, 1.0) == pytest.approx([0.6, 0.2, 0.0, 0.2])
    assert cell_probabilities(0.8, 0.2, 0.0) == pytest.approx([0.48, 0.32, 0.12, 0.08])
    kwargs = dict(clean_success=[0.8], true_dsr=[0.0, 0.2], n_tasks=[4], n_pairs=[20], studies=400, n_boot=200, seed=1)
    cells = coverage_grid(**kwargs)
    assert [(c.dsr, c.n_tasks, c.n_pairs) for c in cells] == [(0.0, 4, 20), (0.2, 4, 20)]
    for cell in cells:
        assert 0.85 < cell.percentile <= 1 and 0.9 < cell.calibrated <= 1 and cell.in_range
        assert cell.calibrated_width > 0 and cell.percentile_width > 0
    assert coverage_grid(**kwargs) == cells  # a fixed seed: the same numbers
    assert coverage_grid(**kwargs, workers=2) == cells  # each cell has its own stream
    assert coverage_failures(cells, threshold=1.01) == cells and coverage_failures(cells, threshold=0.0) == []
    # at a success rate of 1 the percentile interval collapses on every study, and covers the truth 0 only there
    edge = coverage_grid(clean_success=[1.0], true_dsr=[0.0], n_tasks=[3], n_pairs=[10], studies=50, n_boot=50)[0]
    assert edge.percentile_zero_width == 1.0 and not edge.in_range


def test_check_coverage_command_prints_both_intervals(tmp_path):
    out = tmp_path / "coverage.json"
    proc = cli("check-coverage", "--clean-success", "0.8", "--dsr", "0.2", "--tasks", "4", "--pairs", "20",
               "--concordance", "0.5", "--no-ceiling", "--no-exact", "--no-studies-intervals", "--studies", "300", "--n-boot", "100",
               "--out", str(out))
    assert "percentile" in proc.stdout and "calibrated" in proc.stdout and "4 x 20, clean 0.8, dSR 0.2" in proc.stdout
    written = json.loads(out.read_text())
    assert written["cells"][0]["n_tasks"] == 4 and 0 < written["cells"][0]["calibrated"] <= 1
    bad = cli("check-coverage", "--clean-success", "0.5", "--dsr", "0.7", check=False)
    assert bad.returncode == 2 and "outside [0, 1]" in bad.stderr


# --------------------------------------------------------------------------- item 10: power and verdicts


def test_verdict_rules():
    from robocasa_shift.analysis.statistics import verdict

    assert verdict(0.3, 0.01, [0.1, 0.5]) == "DEGRADED"
    assert verdict(-0.3, 0.01, [-0.5, -0.1]) == "IMPROVED"
    assert verdict(0.02, 0.6, [-0.05, 0.08]) == "NO CHANGE DETECTED"
    assert verdict(0.02, 0.6, [-0.05, 0.15]) == "UNDERPOWERED"
    assert verdict(0.02, 0.6, [-0.05, 0.15], min_effect=0.2) == "NO CHANGE DETECTED"
    assert verdict(None, None, None) is None


@pytest.mark.slow
def test_verdicts_per_condition_and_task_in_the_summary():
    big_same = counts_spec(Alpha=(40, 0, 0, 10), Beta=(45, 0, 0, 5), Gamma=(30, 0, 0, 20), Delta=(48, 0, 0, 2))
    # clean: episodes 0-9 succeed, 10-19 fail, in both tasks
    perturbed = {"blur:L3": [False] * 20,  # 10 S->F: dSR +0.5
                 "illumination:L1": [True] * 20,  # 10 F->S: dSR -0.5
                 "camera:L1": [True] * 9 + [False] + [True] + [False] * 9}  # one pair each way: dSR 0
    rows = [row(task, e, "clean", e < 10) for task in ("Alpha", "Beta") for e in range(20)]
    rows += [row(task, e, c, ok) for task in ("Alpha", "Beta") for c, outcomes in perturbed.items()
             for e, ok in enumerate(outcomes)]
    summary = analyze(pd.DataFrame(rows), n_boot=200)
    assert summary["conditions"]["blur:L3"]["verdict"] == "DEGRADED"
    assert summary["conditions"]["illumination:L1"]["verdict"] == "IMPROVED"
    assert summary["conditions"]["camera:L1"]["verdict"] == "UNDERPOWERED"
    assert summary["conditions"]["blur:L3"]["per_task_verdict"] == {"Alpha": "DEGRADED", "Beta": "DEGRADED"}
    assert summary["verdict_rule"]["min_effect"] == 0.1 and "UNDERPOWERED" in summary["verdict_rule"]["vocabulary"]
    unchanged = analyze(pairs_table(big_same, "base:L1"), n_boot=200)["conditions"]["base:L1"]
    assert unchanged["verdict"] == "NO CHANGE DETECTED"
    assert analyze(pairs_table(big_same, "base:L1"), n_boot=200, min_effect=0.01)["conditions"]["base:L1"][
        "verdict"] == "UNDERPOWERED"


def test_minimum_detectable_dsr_has_the_promised_power_of_the_verdict():
    from robocasa_shift.analysis.statistics import (
        calibrated_interval,
        decision,
        minimum_detectable_dsr,
        pair_probabilities,
        signflip_test,
        verdict_power,
    )

    n_pairs, rates = [8, 8], [0.3, 0.2]
    mde = minimum_detectable_dsr(n_pairs, rates)
    assert 0.1 < mde.first < 0.7 and mde.method == "exact"
    exact = verdict_power(n_pairs, rates, mde.first).power
    assert exact >= 0.8 and exact == pytest.approx(mde.power_at_first)
    # the exact power against a simulation of the verdict itself (the test and the interval) over random outcomes
    rng = np.random.default_rng(0)
    degraded = 0
    for _ in range(400):
        drawn = [rng.multinomial(n, [*pair_probabilities(r, mde.first), 0]) for n, r in zip(n_pairs, rates)]
        counts = [[n - d[0] - d[1], d[0], d[1], 0] for d, n in zip(drawn, n_pairs)]
        p = signflip_test(n_pairs, [c[1] for c in counts], [c[2] for c in counts]).p
        degraded += decision(calibrated_interval(counts), p)["verdict"] == "DEGRADED"
    assert degraded / 400 == pytest.approx(exact, abs=0.06)
    assert minimum_detectable_dsr([200] * 4, [0.3, 0.2, 0.4, 0.3]).first < mde.first  # more pairs, smaller shift


def test_the_summary_reports_the_minimum_detectable_dsr_and_its_assumption():
    table = pairs_table(counts_spec(Alpha=(10, 5, 1, 4), Beta=(12, 3, 1, 4)))
    summary = analyze(table, n_boot=100)
    power = summary["conditions"]["camera:L2"]["power"]
    assert power["per_task_discordance"] == {"Alpha": 0.3, "Beta": 0.2}
    assert 0 < power["mde_dsr"] <= power["mde_dsr_stable"] < 1
    assert "observed share of discordant pairs" in summary["power"]["assumption"]


def test_plan_power_command(tmp_path):
    from robocasa_shift.analysis.statistics import minimum_detectable_dsr, plan_pairs

    needed = plan_pairs(4, 0.2, 0.3)
    assert minimum_detectable_dsr([needed.first] * 4, [0.3] * 4).first <= 0.2 + 1e-9
    proc = cli("plan-power", "--dsr", "0.2", "--tasks", "4", "--discordance", "0.3")
    assert f"{needed.first} base episodes per task detect a macro dSR of 0.200 (DEGRADED)" in proc.stdout
    assert "assumption" in proc.stdout
    out = tmp_path / "analysis"
    from robocasa_shift.analysis.measures import write_analysis

    write_analysis(pairs_table(counts_spec(Alpha=(10, 5, 1, 4), Beta=(12, 3, 1, 4))), out, n_boot=50)
    proc = cli("plan-power", "--dsr", "0.3", "--from-summary", str(out / "summary.json"), "--condition", "camera:L2")
    assert "observed in" in proc.stdout and "base episodes per task" in proc.stdout


# --------------------------------------------------------------------------- item 11: severity trend


def severity_table(levels, factor="camera", n=20):
    """Three tasks; under factor:Lk the first ``levels[k]`` episodes of each task fail (clean all succeed)."""
    rows = []
    for task in ("Alpha", "Beta", "Gamma"):
        for episode in range(n):
            rows.append(row(task, episode, "clean", True))
            for level, failing in enumerate(levels, start=1):
                rows.append(row(task, episode, f"{factor}:L{level}", episode >= failing, done=0))
    return pd.DataFrame(rows)


def test_severity_trend_flags_a_factor_whose_highest_level_hurts_least():
    table = pd.concat([severity_table([18, 10, 2], "camera"), severity_table([2, 8, 16], "blur")])
    table = table.drop_duplicates(["task", "episode", "condition"])
    trend = analyze(table, n_boot=100)["trend"]
    assert trend["camera"]["flag"] is True and trend["camera"]["p_holm"] < 0.05
    assert trend["camera"]["reversals"] == ["camera:L2 dSR +0.500 < camera:L1 dSR +0.900",
                                            "camera:L3 dSR +0.100 < camera:L1 dSR +0.900",
                                            "camera:L3 dSR +0.100 < camera:L2 dSR +0.500"]
    assert trend["blur"]["flag"] is False and trend["blur"]["reversals"] == []
    assert [c["p_reversal"] for c in trend["camera"]["comparisons"]] == pytest.approx([0.0, 0.0, 0.0], abs=1e-6)


def test_a_small_reversal_is_a_note_not_a_flag():
    trend = analyze(severity_table([3, 6, 5]), n_boot=100)["trend"]["camera"]
    assert trend["flag"] is False and trend["p"] > 0.05
    assert trend["reversals"] == ["camera:L3 dSR +0.250 < camera:L2 dSR +0.300"]


def test_the_trend_test_equals_enumeration_on_small_counts():
    # camera:L1 vs camera:L2 on Alpha: L2 succeeds where L1 fails in 2 episodes, the reverse in 1
    rows = [row("Alpha", e, "clean", True) for e in range(4)]
    rows += [row("Alpha", e, "camera:L1", s) for e, s in enumerate([False, False, True, True])]
    rows += [row("Alpha", e, "camera:L2", s) for e, s in enumerate([True, True, False, True])]
    comparison = analyze(pd.DataFrame(rows), n_boot=50)["trend"]["camera"]["comparisons"][0]
    assert (comparison["higher_level_only_success"], comparison["lower_level_only_success"]) == (2, 1)
    assert comparison["p_reversal"] == pytest.approx(brute_force_signflip([4], [2], [1])[1])
    assert comparison["p_reversal"] == pytest.approx(0.5)  # 4 of the 8 sign patterns reach +1
    assert list(itertools.chain([comparison["low"]], [comparison["high"]])) == ["camera:L1", "camera:L2"]
