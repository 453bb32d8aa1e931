"""The measures of docs/protocol.md section 7 on small tables whose answers are computed by hand."""

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.analysis.measures import (
    AnalysisError,
    analyze,
    load_records,
    normalize,
    tables,
    write_analysis,
)
from robocasa_shift.analysis.statistics import (
    holm_adjust,
    mcnemar_exact_p,
    wilson_interval,
)

Z95 = 1.959963984540054
# The spellings a records CSV may use for booleans, cycled through so every table mixes them.
TRUE_SPELLINGS = itertools.cycle([True, "true", "True", 1])
FALSE_SPELLINGS = itertools.cycle([False, "false", "False", 0])


def rollout(task, episode, condition, success, done, k, **extra):
    """One records-table row; first_incomplete follows from the latched count (empty = complete)."""
    spelled = next(TRUE_SPELLINGS) if success else next(FALSE_SPELLINGS)
    return {
        "task": task,
        "episode": episode,
        "condition": condition,
        "success": spelled if success is not None else "",
        "n_stages": k,
        "stages_completed": done,
        "first_incomplete": "" if done == k else done + 1,
        **extra,
    }


def outcomes(task, condition, spec, k, **extra):
    """Rows from a compact spec: one (success, stages_completed) per episode, in episode order."""
    return [rollout(task, e, condition, s, d, k, **extra) for e, (s, d) in enumerate(spec)]


S3, F3 = (True, 3), (False, 1)  # Alpha (K = 3): clean success latched all, failure stopped after g_1
S2, F2 = (True, 2), (False, 1)  # Beta (K = 2)


@pytest.fixture()
def table():
    """Two tasks (Alpha: 4 episodes, K = 3; Beta: 2 episodes, K = 2) and five conditions.

    clean          Alpha S S S F          Beta S F
    camera:L2      Alpha F(0/3) F(3/3) S F  Beta F(1/2) S     -> Alpha SF SF SS FF, Beta SF FS
    base:L1        Alpha S* S F(1/3) F    Beta F(stage error) F, with * an invalid rollout
    illumination:L1  identical to clean (no discordant pair)
    blur:L1        every rollout invalid
    """
    rows = []
    rows += outcomes("Alpha", "clean", [S3, S3, S3, F3], 3)
    rows += outcomes("Beta", "clean", [S2, F2], 2)
    # Alpha e1 is a tracker-complete official failure: all K latched, success check false.
    rows += outcomes("Alpha", "camera:L2", [(False, 0), (False, 3), S3, F3], 3)
    rows += outcomes("Beta", "camera:L2", [(False, 1), S2], 2)
    rows += outcomes("Alpha", "base:L1", [S3, S3, (False, 1), F3], 3)
    rows[-4]["valid"] = "false"  # Alpha e0 under base:L1: a runtime error, success ignored
    rows += outcomes("Beta", "base:L1", [(False, 0), F2], 2)
    rows[-2]["stage_error"] = "true"  # its first_incomplete (1) must not reach the stage measures
    rows += outcomes("Alpha", "illumination:L1", [S3, S3, S3, F3], 3)
    rows += outcomes("Beta", "illumination:L1", [S2, F2], 2)
    for task, k, n in (("Alpha", 3, 4), ("Beta", 2, 2)):
        for e in range(n):
            rows.append(rollout(task, e, "blur:L1", None, 0, k, valid=0))
    # Rows that do not set valid / stage_error leave the cell empty: the defaults apply.
    frame = pd.DataFrame(rows)
    frame["spec_hash"] = "abc123"
    frame["backend"] = "robosuite"  # an extra column: ignored
    frame["wall_s"] = 1.5
    return frame


@pytest.fixture()
def summary(table):
    return analyze(table, n_boot=2000, bootstrap_seed=7)


def test_condition_order_and_every_key_present(summary):
    assert summary["tasks"] == ["Alpha", "Beta"]
    assert list(summary["conditions"]) == ["clean", "illumination:L1", "camera:L2", "base:L1", "blur:L1"]
    assert set(summary["conditions"]["clean"]) >= {"macro_sr", "per_task_sr"}
    design_keys = {"macro_sr", "per_task_sr", "macro_dsr", "dsr_ci95", "per_task_dsr", "transitions", "sf"}
    for name in ["illumination:L1", "camera:L2", "base:L1", "blur:L1"]:
        assert design_keys <= set(summary["conditions"][name]), name
        assert set(summary["conditions"][name]["sf"]) >= {"n", "mean_progress", "first_stage_fraction", "first_incomplete_by_task"}
    assert summary["spec_hash"] == "abc123"
    assert summary["n_stages"] == {"Alpha": 3, "Beta": 2}
    assert summary["bootstrap"]["seed"] == 7 and summary["bootstrap"]["n_boot"] == 2000


def test_success_rates_and_macro_is_equal_weight(summary):
    clean = summary["conditions"]["clean"]
    assert clean["per_task_sr"] == {"Alpha": 0.75, "Beta": 0.5}
    assert clean["macro_sr"] == pytest.approx(0.625)
    camera = summary["conditions"]["camera:L2"]
    assert camera["per_task_sr"] == {"Alpha": 0.25, "Beta": 0.5}
    assert camera["macro_sr"] == pytest.approx(0.375)
    # Macro dSR = mean(0.5, 0.0) = 0.25; pooled over the 6 pairs it would be 4/6 - 2/6 = 1/3.
    assert camera["per_task_dsr"] == {"Alpha": 0.5, "Beta": 0.0}
    assert camera["macro_dsr"] == pytest.approx(0.25)
    assert camera["macro_dsr"] != pytest.approx(1 / 3)
    assert camera["n_pairs"] == 6


def test_invalid_member_leaves_the_pair_but_counts_for_sr(summary):
    base = summary["conditions"]["base:L1"]
    # Alpha: valid base rollouts e1 S, e2 F, e3 F -> SR 1/3 (the invalid e0 "success" is not counted).
    assert base["per_task_n_valid"]["Alpha"] == 3
    assert base["per_task_sr"]["Alpha"] == pytest.approx(1 / 3)
    # Pairs e1..e3 only: clean S S F vs base S F F -> dSR 2/3 - 1/3 = 1/3
    # (the unpaired SR difference would be 3/4 - 1/3 = 5/12).
    assert base["per_task_n_pairs"] == {"Alpha": 3, "Beta": 2}
    assert base["per_task_dsr"]["Alpha"] == pytest.approx(1 / 3)
    assert base["per_task_dsr"]["Beta"] == pytest.approx(0.5)
    assert base["macro_dsr"] == pytest.approx((1 / 3 + 0.5) / 2)
    assert base["transitions"] == {"SS": 1, "SF": 2, "FS": 0, "FF": 2, "changed": 2}


def test_invalid_clean_twin_keeps_perturbed_rollout_in_sr():
    rows = [
        rollout("T", 0, "clean", True, 1, 1, valid=False),
        rollout("T", 1, "clean", True, 1, 1),
        rollout("T", 2, "clean", False, 0, 1),
        rollout("T", 0, "camera:L1", True, 1, 1),
        rollout("T", 1, "camera:L1", False, 0, 1),
        rollout("T", 2, "camera:L1", False, 0, 1),
    ]
    result = analyze(pd.DataFrame(rows), n_boot=200)
    assert result["conditions"]["clean"]["per_task_sr"] == {"T": 0.5}
    camera = result["conditions"]["camera:L1"]
    assert camera["per_task_sr"] == {"T": pytest.approx(1 / 3)}
    assert camera["n_pairs"] == 2
    assert camera["macro_dsr"] == pytest.approx(0.5)  # pairs e1 (S->F), e2 (F->F); SR difference is 1/6
    assert camera["transitions"] == {"SS": 0, "SF": 1, "FS": 0, "FF": 1, "changed": 1}


def test_empty_condition_has_nulls_not_missing_keys(summary):
    blur = summary["conditions"]["blur:L1"]
    assert blur["macro_sr"] is None
    assert blur["per_task_sr"] == {"Alpha": None, "Beta": None}
    assert blur["per_task_sr_ci95"] == {"Alpha": None, "Beta": None}
    assert blur["macro_dsr"] is None and blur["dsr_ci95"] is None
    assert blur["per_task_dsr"] == {"Alpha": None, "Beta": None}
    assert blur["transitions"] == {"SS": 0, "SF": 0, "FS": 0, "FF": 0, "changed": 0}
    assert blur["mcnemar"]["p"] is None and blur["mcnemar"]["p_holm"] is None
    assert blur["sf"]["n"] == 0
    assert blur["sf"]["mean_progress"] is None and blur["sf"]["first_stage_fraction"] is None
    assert blur["sf"]["mean_progress_ci95"] is None
    assert blur["sf"]["first_incomplete_by_task"] == {
        "Alpha": {"1": 0, "2": 0, "3": 0, "complete": 0},
        "Beta": {"1": 0, "2": 0, "complete": 0},
    }


def test_transitions_and_mcnemar_by_hand(summary):
    camera = summary["conditions"]["camera:L2"]
    assert camera["transitions"] == {"SS": 1, "SF": 3, "FS": 1, "FF": 1, "changed": 4}
    assert camera["per_task_transitions"]["Alpha"] == {"SS": 1, "SF": 2, "FS": 0, "FF": 1, "changed": 2}
    assert camera["per_task_transitions"]["Beta"] == {"SS": 0, "SF": 1, "FS": 1, "FF": 0, "changed": 2}
    # b=3, c=1: 2 * (C(4,0) + C(4,1)) / 2^4 = 10/16.
    assert camera["mcnemar"]["p"] == pytest.approx(10 / 16)
    # Alpha b=2, c=0: 2 * 1/4; Beta b=1, c=1: 2 * 3/4 capped at 1.
    assert camera["mcnemar"]["per_task"]["Alpha"]["p"] == pytest.approx(0.5)
    assert camera["mcnemar"]["per_task"]["Beta"]["p"] == 1.0
    # Zero discordance: p = 1, and every pair agrees so the dSR interval is a point.
    illumination = summary["conditions"]["illumination:L1"]
    assert illumination["transitions"]["changed"] == 0
    assert illumination["mcnemar"]["p"] == 1.0
    assert illumination["macro_dsr"] == 0.0 and illumination["dsr_ci95"] == [0.0, 0.0]


def test_mcnemar_exact_values():
    assert mcnemar_exact_p(5, 0) == pytest.approx(2 / 32)
    assert mcnemar_exact_p(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact_p(0, 0) == 1.0
    # b=7, c=2: 2 * (1 + 9 + 36) / 512
    assert mcnemar_exact_p(7, 2) == pytest.approx(92 / 512)
    # Large counts stay finite and exact-ish: symmetric case is 1.
    assert mcnemar_exact_p(300, 300) == 1.0
    assert 0.0 < mcnemar_exact_p(400, 300) < 1e-3


def test_holm_by_hand():
    adjusted = holm_adjust({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    # Sorted 0.01, 0.03, 0.04 with m = 3: 0.03, 0.06, max(0.06, 0.04) = 0.06.
    assert adjusted["a"] == pytest.approx(0.03)
    assert adjusted["c"] == pytest.approx(0.06)
    assert adjusted["b"] == pytest.approx(0.06)
    assert adjusted["d"] is None
    assert holm_adjust({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}


def test_holm_across_conditions_in_summary():
    """One task, 8 episodes: camera:L1 has b=5, c=0 (p=1/16); camera:L3 has b=3, c=1 (p=10/16)."""
    clean = [S2] * 7 + [F2]
    rows = outcomes("Solo", "clean", clean, 2)
    rows += outcomes("Solo", "camera:L1", [F2] * 5 + [S2, S2, F2], 2)
    rows += outcomes("Solo", "camera:L3", [F2] * 3 + [S2] * 5, 2)
    result = analyze(pd.DataFrame(rows), n_boot=500)
    l1, l3 = result["conditions"]["camera:L1"]["mcnemar"], result["conditions"]["camera:L3"]["mcnemar"]
    assert (l1["b"], l1["c"], l3["b"], l3["c"]) == (5, 0, 3, 1)
    assert l1["p"] == pytest.approx(0.0625) and l3["p"] == pytest.approx(0.625)
    # Holm, m = 2: 2 * 0.0625 = 0.125; then max(0.125, 1 * 0.625) = 0.625.
    assert l1["p_holm"] == pytest.approx(0.125) and l3["p_holm"] == pytest.approx(0.625)
    assert l1["per_task"]["Solo"]["p_holm"] == pytest.approx(0.125)
    assert l3["per_task"]["Solo"]["p_holm"] == pytest.approx(0.625)
    assert list(result["conditions"]) == ["clean", "camera:L1", "camera:L3"]


def test_wilson_interval_matches_the_formula():
    n, x = 10, 8
    # The algebraically equivalent form (x + z^2/2 -+ z sqrt(x(n-x)/n + z^2/4)) / (n + z^2).
    root = Z95 * math.sqrt(x * (n - x) / n + Z95**2 / 4)
    expected = [(x + Z95**2 / 2 - root) / (n + Z95**2), (x + Z95**2 / 2 + root) / (n + Z95**2)]
    assert wilson_interval(8, 10) == pytest.approx(expected, abs=1e-12)
    assert wilson_interval(8, 10) == pytest.approx([0.4901624, 0.9433178], abs=1e-6)
    assert wilson_interval(0, 0) is None


def test_wilson_intervals_in_summary(summary):
    x, n = 3, 4
    root = Z95 * math.sqrt(x * (n - x) / n + Z95**2 / 4)
    expected = [(x + Z95**2 / 2 - root) / (n + Z95**2), (x + Z95**2 / 2 + root) / (n + Z95**2)]
    assert summary["conditions"]["clean"]["per_task_sr_ci95"]["Alpha"] == pytest.approx(expected, abs=1e-12)


def test_stage_measures_over_sf_pairs(summary):
    sf = summary["conditions"]["camera:L2"]["sf"]
    # S->F pairs: Alpha e0 (0/3, first g1), Alpha e1 (3/3, complete), Beta e0 (1/2, first g2).
    assert sf["n"] == 3
    assert sf["mean_progress"] == pytest.approx((0 + 1 + 0.5) / 3)
    assert sf["first_stage_fraction"] == pytest.approx(1 / 3)
    assert sf["first_incomplete_by_task"] == {
        "Alpha": {"1": 1, "2": 0, "3": 0, "complete": 1},
        "Beta": {"1": 0, "2": 1, "complete": 0},
    }
    lo, hi = sf["mean_progress_ci95"]
    assert 0.0 <= lo <= sf["mean_progress"] <= hi <= 1.0
    lo, hi = sf["first_stage_fraction_ci95"]
    assert 0.0 <= lo <= sf["first_stage_fraction"] <= hi <= 1.0


def test_stage_error_drops_pair_from_stage_measures_only(summary):
    base = summary["conditions"]["base:L1"]
    # Beta e0 is S->F with a StageTracker error: it counts as SF and in dSR ...
    assert base["per_task_transitions"]["Beta"]["SF"] == 1
    assert base["per_task_dsr"]["Beta"] == pytest.approx(0.5)
    # ... but only Alpha e2 (1/3, first g2) enters the stage measures.
    sf = base["sf"]
    assert sf["n"] == 1
    assert sf["n_stage_error_dropped"] == 1
    assert sf["mean_progress"] == pytest.approx(1 / 3)
    assert sf["first_stage_fraction"] == 0.0
    assert sf["first_incomplete_by_task"]["Beta"] == {"1": 0, "2": 0, "complete": 0}
    assert sf["first_incomplete_by_task"]["Alpha"] == {"1": 0, "2": 1, "3": 0, "complete": 0}


def test_small_bootstrap_intervals_by_hand(summary):
    camera = summary["conditions"]["camera:L2"]
    # Alpha differences (1, 1, 0, 0): a resample mean of 0 or of 1 has probability 1/16 > 2.5% each.
    assert camera["per_task_dsr_ci95"]["Alpha"] == [0.0, 1.0]
    # Beta differences (1, -1): resample means -1, 0, 1 with probabilities 1/4, 1/2, 1/4.
    assert camera["per_task_dsr_ci95"]["Beta"] == [-1.0, 1.0]
    lo, hi = camera["dsr_ci95"]
    assert -0.5 <= lo < 0.25 < hi <= 1.0


def paired_table(n_sf, n_fs, n_ss, n_ff, task="Big"):
    clean_first = [(True, False)] * n_sf + [(False, True)] * n_fs + [(True, True)] * n_ss + [(False, False)] * n_ff
    rows = []
    for episode, (clean, perturbed) in enumerate(clean_first):
        rows.append(rollout(task, episode, "clean", clean, 1 if clean else 0, 1))
        rows.append(rollout(task, episode, "blur:L2", perturbed, 1 if perturbed else 0, 1))
    return pd.DataFrame(rows)


def test_bootstrap_matches_analytic_standard_error():
    frame = paired_table(n_sf=60, n_fs=20, n_ss=70, n_ff=50)
    differences = np.array([1.0] * 60 + [-1.0] * 20 + [0.0] * 120)
    analytic_half_width = 1.96 * differences.std() / math.sqrt(differences.size)  # 0.0832
    result = analyze(frame, n_boot=10000, bootstrap_seed=3)
    blur = result["conditions"]["blur:L2"]
    assert blur["macro_dsr"] == pytest.approx(0.2)
    lo, hi = blur["dsr_ci95"]
    assert (hi - lo) / 2 == pytest.approx(analytic_half_width, rel=0.10)
    assert lo < 0.2 < hi
    # One task: the per-task interval is the macro interval.
    assert blur["per_task_dsr_ci95"]["Big"] == [lo, hi]


def test_bootstrap_is_reproducible_by_seed():
    # Two tasks of 37 and 23 pairs: macro resample means fall on a fine lattice, so two
    # seeds cannot give the same interpolated quantiles by coincidence.
    frame = pd.concat(
        [paired_table(12, 5, 12, 8, task="P"), paired_table(7, 4, 6, 6, task="Q")], ignore_index=True
    )
    first = analyze(frame, n_boot=3000, bootstrap_seed=11)["conditions"]["blur:L2"]["dsr_ci95"]
    again = analyze(frame, n_boot=3000, bootstrap_seed=11)["conditions"]["blur:L2"]["dsr_ci95"]
    other = analyze(frame, n_boot=3000, bootstrap_seed=12)["conditions"]["blur:L2"]["dsr_ci95"]
    assert first == again
    assert first != other


def test_interval_does_not_depend_on_other_conditions_or_tasks():
    frame = paired_table(n_sf=12, n_fs=5, n_ss=20, n_ff=13)
    alone = analyze(frame, n_boot=2000)["conditions"]["blur:L2"]["dsr_ci95"]
    extra = paired_table(n_sf=3, n_fs=3, n_ss=3, n_ff=3, task="Other")
    extra["condition"] = extra["condition"].replace({"blur:L2": "camera:L1"})
    combined = analyze(pd.concat([frame, extra], ignore_index=True), n_boot=2000)
    assert combined["conditions"]["blur:L2"]["per_task_dsr_ci95"]["Big"] == alone


def test_noise_floor_from_clean_replicates(table):
    assert analyze(table, n_boot=100)["noise_floor"] is None
    replicates = outcomes("Alpha", "clean", [S3, F3, S3, F3], 3, replicate=1)  # flips at e1 only
    replicates += outcomes("Beta", "clean", [F2], 2, replicate=1)  # flips at e0
    frame = pd.concat([table, pd.DataFrame(replicates)], ignore_index=True)
    result = analyze(frame, n_boot=100)
    floor = result["noise_floor"]
    assert floor["per_task_flip_rate"] == {"Alpha": 0.25, "Beta": 1.0}
    assert floor["per_task_n_episodes"] == {"Alpha": 4, "Beta": 1}
    assert floor["macro_flip_rate"] == pytest.approx(0.625)
    # Replicate-1 rollouts stay out of SR: the clean rates are unchanged.
    assert result["conditions"]["clean"]["per_task_sr"] == {"Alpha": 0.75, "Beta": 0.5}


def test_other_phases_are_ignored(table, summary):
    screening = table.copy()
    screening["phase"] = "screening"
    screening["success"] = False
    mixed = pd.concat([table, screening], ignore_index=True)
    result = analyze(mixed, n_boot=2000, bootstrap_seed=7)
    assert result["conditions"] == summary["conditions"]
    assert analyze(mixed, phase="screening", n_boot=10)["conditions"]["clean"]["macro_sr"] == 0.0
    with pytest.raises(AnalysisError, match="no rows of phase 'pilot'"):
        analyze(table, phase="pilot")


def test_missing_required_columns_are_named(table):
    with pytest.raises(AnalysisError) as err:
        normalize(table.drop(columns=["n_stages", "first_incomplete"]))
    assert "n_stages" in str(err.value) and "first_incomplete" in str(err.value)


def test_mixed_spec_hashes_are_refused(table):
    table.loc[3, "spec_hash"] = "def456"
    with pytest.raises(AnalysisError) as err:
        analyze(table)
    assert "abc123" in str(err.value) and "def456" in str(err.value)


def test_one_hash_and_missing_hashes_mix_fine(table):
    table.loc[3, "spec_hash"] = None
    assert analyze(table, n_boot=10)["spec_hash"] == "abc123"


def test_duplicate_keys_are_refused(table):
    doubled = pd.concat([table, table.iloc[[2]]], ignore_index=True)
    with pytest.raises(AnalysisError, match=r"duplicate rollout key.*'Alpha', 2, 'clean', 0"):
        normalize(doubled)


def test_optional_columns_get_defaults_and_extras_are_dropped(table):
    # Without a valid column every rollout is valid, so the outcome-less blur rows must go too.
    bare = table[table.condition != "blur:L1"].drop(columns=["valid", "stage_error", "spec_hash"])
    frame = normalize(bare)
    assert list(frame.columns) == [
        "phase", "task", "episode", "condition", "replicate", "valid", "success",
        "n_stages", "stages_completed", "first_incomplete", "spec_hash", "stage_error",
        # identity columns are carried for the validity checks, None where the table lacks them
        "env_fingerprint", "policy_rng_fingerprint", "stage_spec_hash", "policy", "backend",
    ]
    assert frame["backend"].eq("robosuite").all() and frame["policy"].isna().all()
    assert frame["phase"].eq("formal").all() and frame["replicate"].eq(0).all()
    assert frame["valid"].all() and not frame["stage_error"].any()
    assert frame["spec_hash"].isna().all()
    assert frame["success"].dtype == bool
    # `complete` parses as <NA>: Alpha clean e0 latched all 3 subgoals.
    assert pd.isna(frame.loc[0, "first_incomplete"])


def test_unparseable_values_are_refused(table):
    bad_bool = table.copy()
    bad_bool.loc[0, "success"] = "maybe"
    with pytest.raises(AnalysisError, match="'success'.*'maybe'"):
        normalize(bad_bool)
    bad_condition = table.copy()
    bad_condition.loc[0, "condition"] = "camera-L2"
    with pytest.raises(AnalysisError, match="camera-L2"):
        normalize(bad_condition)
    inconsistent = table.copy()
    inconsistent.loc[0, "first_incomplete"] = 2  # stages_completed is 3 = K, so it must be complete
    with pytest.raises(AnalysisError, match="first_incomplete"):
        normalize(inconsistent)
    no_outcome = table.copy()
    no_outcome.loc[0, "success"] = None
    with pytest.raises(AnalysisError, match="without a 'success'"):
        normalize(no_outcome)


def test_conditions_are_ordered_by_the_protocols_factor_order_unknown_factors_and_combinations_after():
    from robocasa_shift.core.conditions import order_conditions

    names = ["zoom:L1", "blur:L10", "clean", "camera:L2+blur:L1", "blur:L2", "fog:L1", "illumination:L3", "camera:L1"]
    assert order_conditions(names, ("illumination", "camera", "base", "blur")) == [
        "clean", "illumination:L3", "camera:L1", "blur:L2", "blur:L10", "fog:L1", "zoom:L1", "camera:L2+blur:L1",
    ]


def assert_plain_json(value, path="summary"):
    """Only builtin JSON types (numpy scalars subclass float, so check the exact type)."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert type(key) is str, path
            assert_plain_json(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            assert_plain_json(item, f"{path}[{i}]")
    else:
        assert type(value) in (str, int, float, bool, type(None)), f"{path}: {type(value)}"
        if type(value) is float:
            assert math.isfinite(value), path


def test_summary_is_plain_json(summary):
    assert_plain_json(summary)
    assert json.loads(json.dumps(summary, allow_nan=False)) == summary


def test_load_records_reads_csv_with_text_booleans(tmp_path, table, summary):
    path = tmp_path / "records.csv"
    table.to_csv(path, index=False)
    frame = load_records(path)
    assert frame["success"].dtype == bool
    assert analyze(frame, n_boot=2000, bootstrap_seed=7)["conditions"] == summary["conditions"]
    saved = tmp_path / "saved-by-a-spreadsheet.csv"
    saved.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # a byte-order mark before the first column's name
    assert load_records(saved).equals(frame)


def test_write_analysis_writes_summary_and_tables(tmp_path, table):
    out = tmp_path / "analysis"
    returned = write_analysis(table, out, n_boot=500, bootstrap_seed=1)

    def refuse_constant(name):
        raise AssertionError(f"summary.json holds {name}")

    written = json.loads((out / "summary.json").read_text(), parse_constant=refuse_constant)
    assert written == returned
    for name in ("sr", "dsr", "transitions", "stages", "first_incomplete", "trend"):
        assert (out / f"{name}.csv").is_file(), name

    sr = pd.read_csv(out / "sr.csv")
    assert list(sr.columns) == ["task", "condition", "n_valid", "successes", "sr", "wilson_lo", "wilson_hi"]
    assert len(sr) == 5 * 2
    alpha_base = sr[(sr.task == "Alpha") & (sr.condition == "base:L1")].iloc[0]
    assert (alpha_base.n_valid, alpha_base.successes) == (3, 1)
    assert sr[sr.condition == "blur:L1"]["sr"].isna().all()

    dsr = pd.read_csv(out / "dsr.csv")
    macro = dsr[(dsr.task == "macro") & (dsr.condition == "camera:L2")].iloc[0]
    assert (macro.n_pairs, macro.dsr) == (6, 0.25)

    transitions = pd.read_csv(out / "transitions.csv")
    pooled = transitions[(transitions.task == "pooled") & (transitions.condition == "camera:L2")].iloc[0]
    assert [pooled.SS, pooled.SF, pooled.FS, pooled.FF, pooled.changed] == [1, 3, 1, 1, 4]
    assert pooled.mcnemar_p == pytest.approx(0.625)
    assert len(transitions) == 4 * 3

    stages = pd.read_csv(out / "stages.csv")
    assert list(stages.condition) == ["illumination:L1", "camera:L2", "base:L1", "blur:L1"]
    assert list(stages.n_sf) == [0, 3, 1, 0]

    first = pd.read_csv(out / "first_incomplete.csv", dtype={"subgoal": str})
    assert len(first) == 4 * (4 + 3)  # per condition: Alpha 1..3 + complete, Beta 1..2 + complete
    alpha_camera = first[(first.condition == "camera:L2") & (first.task == "Alpha")]
    assert dict(zip(alpha_camera.subgoal, alpha_camera["count"])) == {"1": 1, "2": 0, "3": 0, "complete": 1}
    assert set(tables(returned)) == {"sr", "dsr", "transitions", "stages", "first_incomplete", "trend", "interactions"}
    # the original columns of dsr.csv come first and unchanged; the new ones follow
    assert list(dsr.columns[:6]) == ["task", "condition", "n_pairs", "dsr", "ci_lo", "ci_hi"]


def test_unordered_stage_specs_may_leave_an_earlier_subgoal_open_but_never_point_past_the_latched():
    from robocasa_shift.analysis.measures import normalize

    rows = [rollout("Alpha", 0, "clean", False, 2, 4), rollout("Alpha", 1, "clean", True, 4, 4)]
    rows[0]["first_incomplete"] = 1  # a second conjunct done, the first still open: allowed
    assert normalize(pd.DataFrame(rows))["first_incomplete"].tolist()[0] == 1
    rows[0]["first_incomplete"] = 4  # beyond stages_completed + 1: impossible under either kind of spec
    with pytest.raises(AnalysisError, match="first_incomplete outside"):
        normalize(pd.DataFrame(rows))
