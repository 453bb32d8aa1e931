"""Score validity of success judges (FailBench App. B): known answers from hand-made tables and published numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from robocasa_shift.judging import validity
from robocasa_shift.judging.scoring import markdown, score


def _table(n_tasks=3, per=6, stages=3):
    """Per task: ``per`` samples, half successes (all stages), half failures at depth 0, 1, 2 in turn."""
    rows = []
    for t in range(n_tasks):
        for i in range(per):
            success = i % 2 == 0
            depth = stages if success else (i // 2) % stages
            rows.append({"sample_id": f"t{t}-{i}", "task": f"task{t}", "condition": "clean" if i < per // 2 else "blur:L2",
                         "episode": i, "pair_id": f"t{t}-{i % (per // 2)}", "success": success,
                         "stratum": "success" if success else ("no_subgoal" if depth == 0 else "mid_task"),
                         "steps": 50, "horizon": 100, "n_stages": stages, "stages_completed": depth})
    frame = pd.DataFrame(rows)
    for c in ("factor", "level", "replicate", "episode_key", "first_incomplete"):
        frame[c] = None
    return frame


def _judge(table, wrong_ids=(), reasoning=None, stages=None):
    wrong = set(wrong_ids)
    out = pd.DataFrame({"sample_id": table["sample_id"],
                        "predicted_success": [int(s != (sid in wrong)) for sid, s in zip(table["sample_id"], table["success"])],
                        "confidence": np.nan})
    if reasoning is not None:
        out["reasoning"] = [reasoning(sid) for sid in table["sample_id"]]
    if stages is not None:
        out["predicted_stage"] = [stages(sid, d) for sid, d in zip(table["sample_id"], table["stages_completed"])]
    return out


def test_accuracy_at_a_published_prior_reproduces_failbenchs_robofac_check():
    # RoboFAC-7B on a balanced set: all 30 failures caught, 2 of 30 successes cleared; published split 960 : 244
    assert validity.prior_accuracy(2 / 30, 1.0, 960, 244) == pytest.approx(0.811, abs=5e-4)
    table = pd.DataFrame({"sample_id": [f"s{i}" for i in range(60)], "success": [i < 30 for i in range(60)]})
    frame = table.assign(predicted=[i < 2 for i in range(60)])
    check = validity.prior_check({"robofac": frame}, (960, 244))
    assert check["all_failure_accuracy"] == pytest.approx(960 / 1204) == pytest.approx(0.797, abs=5e-4)
    assert check["judges"][0]["accuracy_at_prior"] == pytest.approx(0.811, abs=5e-4)
    assert validity.prior_accuracy(None, 1.0, 10, 10) is None


def test_spearman_equals_scipy_with_ties_and_is_undefined_on_a_constant():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(3)
    for _ in range(20):
        x, y = rng.integers(0, 4, 9).astype(float), rng.normal(size=9)
        if x.std() == 0:
            continue
        assert validity.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert validity.spearman([1, 1, 1], [1, 2, 3]) is None


def test_rank_agreement_finds_the_slice_where_the_ranking_turns_over():
    table = _table()
    # judge a: perfect; b: wrong on three samples of task0; c: wrong on one success of task0 and of task1
    judges = {"a": _judge(table), "b": _judge(table, ["t0-0", "t0-1", "t0-3"]), "c": _judge(table, ["t0-2", "t1-2"])}
    result = score(table, judges, n_boot=100)
    ranks = result["validity"]["rank_agreement"]
    assert ranks["judges"] == ["a", "b", "c"]
    by_task = {row["slice"]: row for row in ranks["slices"]["task"]["rows"]}
    # overall BA: a 1 > c 0.889 > b 0.833. task0: a 1, b 0.5, c 0.833 (the same order: rho 1); task1: a and b
    # tie above c (ranks 2.5, 2.5, 1 against 3, 1, 2: rho 0); task2: all perfect (no ranking: undefined)
    assert by_task["task0"]["spearman"] == pytest.approx(1.0)
    assert by_task["task1"]["spearman"] == pytest.approx(0.0)
    assert by_task["task2"]["spearman"] is None
    assert ranks["slices"]["task"]["defined"] == 2 and ranks["slices"]["task"]["mean"] == pytest.approx(0.5)
    assert ranks["slices"]["task"]["min"] == pytest.approx(0.0)
    assert "Do the judges rank the same way" in markdown({**result, "export_hash": "0" * 12})
    two = score(table, {"a": judges["a"], "b": judges["b"]}, n_boot=100)["validity"]["rank_agreement"]
    assert "fewer than three judges" in two["note"]


def test_all_failure_baseline_and_reasoning_lengths_of_wrong_and_right_verdicts():
    table = _table()
    wrong = ["t0-0", "t1-1"]
    judge = _judge(table, wrong, reasoning=lambda sid: "x" * (300 if sid in wrong else 100))
    result = score(table, {"j": judge}, n_boot=100)
    baseline = result["judges"]["all-failure"]
    assert baseline["baseline"] and baseline["accuracy"]["micro"]["ba"] == 0.5
    assert baseline["success_bias"]["false_success"]["rate"] == 0.0
    lengths = result["validity"]["reasoning"]["j"]
    assert lengths["wrong"] == {"n": 2, "mean_chars": 300.0, "median_chars": 300.0}
    assert lengths["right"]["n"] == len(table) - 2 and lengths["right"]["mean_chars"] == 100.0
    assert "all-failure" not in result["validity"]["reasoning"]


def test_progress_estimation_is_scored_against_the_stagetrackers_depth():
    table = _table(n_tasks=1, per=6)
    # depths: 3, 0, 3, 1, 3, 2 -> the judge says 3, 0, 2, 1, 3, 0: exact 4/6, within one 5/6, MAE (0+0+1+0+0+2)/6
    said = dict(zip(table["sample_id"], [3, 0, 2, 1, 3, 0]))
    result = score(table, {"j": _judge(table, stages=lambda sid, d: said[sid])}, n_boot=100)
    progress = result["validity"]["progress"]["j"]
    assert progress["n"] == 6 and progress["exact"] == pytest.approx(4 / 6)
    assert progress["within_one"] == pytest.approx(5 / 6) and progress["mean_abs_error"] == pytest.approx(0.5)
    assert {row["stages_completed"]: row["exact"] for row in progress["by_depth"]} == {0: 1.0, 1: 1.0, 2: 0.0, 3: pytest.approx(2 / 3)}


def test_a_predicted_stage_that_is_not_a_count_is_refused_naming_row_and_field(tmp_path):
    from robocasa_shift.judging.judges import PredictionsError, read_predictions

    path = tmp_path / "p.csv"
    path.write_text("sample_id,predicted_success,predicted_stage\na,1,2\nb,0,1.5\n")
    with pytest.raises(PredictionsError, match=r"row 3: field 'predicted_stage' must be a whole number"):
        read_predictions(path)
    path.write_text("sample_id,predicted_success\na,1\n")
    assert read_predictions(path)["predicted_stage"].isna().all()


def _record(task, episode, success, depth, n_stages=3, condition="clean"):
    return {"phase": "formal", "task": task, "episode": episode, "condition": condition, "replicate": 0,
            "valid": True, "success": success, "stages_completed": depth, "n_stages": n_stages}


def test_balanced_sampling_keeps_at_most_n_failures_of_each_type_per_task_and_every_success():
    from robocasa_shift.judging.export import ExportSettings, select

    records = [_record("A", i, True, 3) for i in range(4)]
    records += [_record("A", 10 + i, False, 0) for i in range(5)]   # no_subgoal x5
    records += [_record("A", 20 + i, False, 1) for i in range(3)]   # mid_task x3
    records += [_record("A", 30, False, 3)]                         # near_success x1
    records += [_record("B", 40 + i, False, 2) for i in range(4)]   # mid_task x4 of another task
    chosen = select(records, ExportSettings(per_failure_type=2, seed=1))
    by = {}
    for r in chosen:
        by.setdefault((r["task"], r["success"], r["stages_completed"]), []).append(r["episode"])
    assert len(by[("A", True, 3)]) == 4  # successes all kept
    assert len(by[("A", False, 0)]) == 2 and len(by[("A", False, 1)]) == 2 and by[("A", False, 3)] == [30]
    assert len(by[("B", False, 2)]) == 2
    assert select(records, ExportSettings(per_failure_type=2, seed=1)) == chosen  # seeded: the same sample
    assert select(records, ExportSettings(per_failure_type=2, seed=2)) != chosen
    with pytest.raises(Exception, match="per_failure_type must be at least 1"):
        ExportSettings(per_failure_type=0)


def test_false_success_by_failure_origin_and_a_forged_origin_is_refused():
    from robocasa_shift.judging.judgeset import row_problem

    table = _table()
    table["failure_origin"] = [None if s else ("organic" if i % 4 == 1 else "synthetic") for i, s in enumerate(table["success"])]
    fooled = [sid for sid, s, o in zip(table["sample_id"], table["success"], table["failure_origin"]) if o == "synthetic"]
    origins = score(table, {"j": _judge(table, fooled)}, n_boot=100)["judges"]["j"]["success_bias"]["origins"]
    assert origins["synthetic"]["rate"] == 1.0 and origins["organic"]["rate"] == 0.0
    assert "failure_origin" in row_problem({"sample_id": "a", "failure_origin": "made-up", **{
        k: v for k, v in {"instruction": "i", "task": "t", "condition": "clean", "factor": "clean", "level": None,
                          "episode": 0, "replicate": 0, "pair_id": "p", "episode_key": "k", "success": False,
                          "stratum": "no_subgoal", "n_stages": 1, "stages_completed": 0, "first_incomplete": 1,
                          "steps": 1, "horizon": 2, "cameras": {"c": "third_person"}, "clip": {"c": ["x"]},
                          "start": {"c": "x"}, "end": {"c": "x"}, "media_sha256": {}}.items()}})
