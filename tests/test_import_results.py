"""import-results: other harnesses' result files read into run directories, judged by this harness's statistics.

Every fixture is built here from the formats' documented schemas: a LIBERO-Plus evaluation of 10 base
tasks x 7 dimensions x 4 difficulty levels by two synthetic policies with known outcomes, lerobot-eval's
eval_info.json (multi-task and single-env) and vla-eval's result JSON.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from robocasa_shift.analysis.agreement import agreement
from robocasa_shift.analysis.compare import compare_runs
from robocasa_shift.analysis.imported import clustered_difference, clustered_rate, unpaired_verdict
from robocasa_shift.cli import main
from robocasa_shift.errors import AnalysisError, ImportFormatError, RunDirError
from robocasa_shift.importing.sources import instruction_leaks, read_liberoplus
from robocasa_shift.importing.writer import import_results

CATEGORIES = {  # LIBERO-Plus's dimensions and how its variant names end
    "Objects Layout": "_add_{k}",
    "Camera Viewpoints": "_view_{k}_0_100_0_0_initstate_{i}",
    "Robot Initial States": "_view_0_0_100_0_0_initstate_{k}7",
    "Language Instructions": "_language_{k}_view_0_0_100_0_0_initstate_{i}",
    "Light Conditions": "_light_{k}",
    "Background Textures": "_table_{k}",
    "Sensor Noise": "_view_0_0_100_0_0_initstate_{i}_noise_{k}",
}
TASKS = [f"pick_up_object_{t}_and_place_it_on_the_plate" for t in range(10)]


def _liberoplus_fixture(folder: Path, outcome, leak_task: int = -1):
    """task_classification.json and a per-episode CSV; ``outcome(task, category, level)`` gives each success.

    Clean trials 0-3 of every task; each variant run once (trial 0); variant init states 0-3 by level.
    """
    classes, rows, next_id = {"libero_spatial": []}, [], 1
    for t, task in enumerate(TASKS):
        for trial in range(4):
            rows.append({"suite": "libero_spatial", "name": task, "episode": trial,
                         "success": int(outcome(t, None, trial))})
        for category, suffix in CATEGORIES.items():
            for level in range(1, 5):
                name = task + suffix.format(k=level, i=level - 1)
                classes["libero_spatial"].append({"id": next_id, "name": name, "category": category,
                                                  "difficulty_level": level})
                said = task.replace("_", " ") + (f" table {level}" if t == leak_task and "table" in suffix else "")
                rows.append({"suite": "libero_spatial", "id": next_id, "success": int(outcome(t, category, level)),
                             "instruction": said})
                next_id += 1
    (folder / "task_classification.json").write_text(json.dumps(classes))
    with open(folder / "log.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["suite", "id", "name", "episode", "success", "instruction"])
        writer.writeheader()
        writer.writerows(rows)
    return folder / "log.csv", folder / "task_classification.json"


def policy_a(t, category, level):
    """Succeeds everywhere except the camera at L4 on tasks 0-7, and clean trial 3 of task 9."""
    if category is None:
        return not (t == 9 and level == 3)
    return not (category == "Camera Viewpoints" and level == 4 and t < 8)


def policy_b(t, category, level):
    """Policy A, but also fails the camera at L3 on every task."""
    if category == "Camera Viewpoints" and level == 3:
        return False
    return policy_a(t, category, level)


@pytest.fixture(scope="module")
def two_policies(tmp_path_factory):
    root = tmp_path_factory.mktemp("liberoplus")
    (root / "a").mkdir(), (root / "b").mkdir()
    log_a, cls = _liberoplus_fixture(root / "a", policy_a, leak_task=2)
    log_b, _ = _liberoplus_fixture(root / "b", policy_b)
    summary_a = import_results("liberoplus", log_a, root / "run-a", classification=cls, policy="A")
    summary_b = import_results("liberoplus", log_b, root / "run-b", classification=cls, policy="B")
    return root, summary_a, summary_b


@pytest.mark.slow
def test_liberoplus_per_category_table_equals_a_hand_count(two_policies):
    root, summary, _ = two_policies
    conditions = summary["conditions"]
    assert len(conditions) == 1 + 7 * 4
    assert conditions["clean"]["rate"]["n"] == 40 and conditions["clean"]["rate"]["sr"] == pytest.approx(39 / 40)
    assert conditions["camera_viewpoints:L4"]["rate"]["sr"] == pytest.approx(2 / 10)
    assert conditions["camera_viewpoints:L3"]["rate"]["sr"] == 1.0
    assert conditions["background_textures:L2"]["rate"] == {**conditions["background_textures:L2"]["rate"], "n": 10,
                                                            "tasks": 10, "sr": 1.0}
    grid = {row["dimension"]: row for row in summary["grid"]}
    assert sorted(grid) == sorted(["objects_layout", "camera_viewpoints", "robot_initial_states",
                                   "language_instructions", "light_conditions", "background_textures", "sensor_noise"])
    assert all(sorted(k for k in row if k != "dimension") == ["L1", "L2", "L3", "L4"] for row in grid.values())


def test_pairing_is_claimed_only_where_the_source_proves_it(two_policies):
    _, summary, _ = two_policies
    c = summary["conditions"]
    # camera / noise / language variants name the clean task's init state: paired, with the main study's verdicts
    assert c["camera_viewpoints:L4"]["paired"]["pairs"] == 10
    # twins are clean trial 3: S->F on tasks 0-7, S->S on task 8, F->S on task 9 (its clean trial 3 failed)
    assert c["camera_viewpoints:L4"]["paired"]["dsr"] == pytest.approx(0.7)
    # one variant per task: each task holds one pair, too few for any decisive verdict (the main study's rule)
    assert c["camera_viewpoints:L4"]["paired"]["verdict"] == "UNDERPOWERED"
    assert c["camera_viewpoints:L2"]["paired"]["verdict"] == "UNDERPOWERED"
    # layout, light, background and robot init variants do not: unpaired, labelled, with the reason
    for cond, reason in (("light_conditions:L1", "anew"), ("robot_initial_states:L2", "robot's initial state")):
        assert "paired" not in c[cond]
        assert c[cond]["unpaired"]["pairing"] == "UNPAIRED"
        assert any(reason in r for r in c[cond]["unpaired_reasons"])
    assert {row["L1"]["pairing"] for row in summary["grid"] if row["dimension"] == "light_conditions"} == {"UNPAIRED"}


def test_two_policies_compare_variant_by_variant_with_exact_p_and_sklearn_kappa(two_policies):
    root, _, _ = two_policies
    result = compare_runs(root / "run-a", root / "run-b", n_boot=200)
    cond = result["conditions"]["camera_viewpoints:L3"]
    # A succeeds on all 10 tasks where B fails (one pair each): the exact two-sided sign-flip p is 2 / 2^10
    assert cond["a_only_success"] == 10 and cond["b_only_success"] == 0
    assert cond["signflip"]["p"] == pytest.approx(2 / 2 ** 10)
    assert cond["macro_success_diff"] == 1.0
    # one pair per task: the calibrated interval cannot exclude 0 although the exact test rejects
    assert cond["verdict"] == "UNDERPOWERED"
    swapped = compare_runs(root / "run-b", root / "run-a", n_boot=200)["conditions"]["camera_viewpoints:L3"]
    assert swapped["macro_success_diff"] == -1.0 and swapped["signflip"]["p"] == cond["signflip"]["p"]
    assert swapped["success_diff_ci95_calibrated"] == pytest.approx([-x for x in cond["success_diff_ci95_calibrated"][::-1]])
    from sklearn.metrics import cohen_kappa_score

    a = pd.read_csv(root / "a" / "log.csv")["success"].to_numpy(bool)
    b = pd.read_csv(root / "b" / "log.csv")["success"].to_numpy(bool)
    assert result["agreement"]["n"] == len(a) == 320
    assert result["agreement"]["kappa"] == pytest.approx(cohen_kappa_score(a, b))
    assert result["agreement"]["discordance"] == pytest.approx(10 / 320)


def test_an_instruction_that_carries_the_variant_id_is_flagged(two_policies):
    root, summary, summary_b = two_policies
    leaks = summary["instruction_leaks"]
    assert [leak["condition"] for leak in leaks] == [f"background_textures:L{k}" for k in range(1, 5)]
    assert all("pick_up_object_2" in leak["variant"] for leak in leaks)
    assert summary_b["instruction_leaks"] == []


def test_the_report_says_first_where_the_results_came_from(two_policies):
    root, _, _ = two_policies
    result = CliRunner().invoke(main, ["report", str(root / "run-a")])
    assert result.exit_code == 0, result.output
    page = (root / "run-a" / "report" / "index.html").read_text()
    body = page.split("<body>", 1)[1]
    assert body.startswith("<p class='note'><b>Imported from liberoplus results in log.csv")
    assert "the harness did not run these rollouts" in body.split("</p>", 1)[0]
    assert "instruction(s) carry their variant's id" in page


def test_clustered_rate_and_difference_equal_a_hand_computation():
    frame = pd.DataFrame({"task": [f"t{i}" for i in range(5) for _ in range(2)],
                          "success": [1, 1, 1, 0, 0, 0, 1, 1, 1, 1]})
    rate = clustered_rate(frame)
    y, n = np.array([2, 1, 0, 2, 2]), np.full(5, 2)
    p = y.sum() / n.sum()
    se = math.sqrt(5 / 4 * np.sum((y - p * n) ** 2)) / n.sum()
    from scipy.stats import t

    assert rate["sr"] == p and rate["ci95"] == pytest.approx([p - t.ppf(0.975, 4) * se, min(1, p + t.ppf(0.975, 4) * se)])
    assert clustered_rate(frame[frame.task < "t4"])["ci95"] is None  # 4 base tasks: no interval claimed
    worse = frame.assign(success=0)
    diff = clustered_difference(worse, frame)
    assert diff["dsr"] == pytest.approx(p) and diff["pairing"] == "UNPAIRED"
    assert unpaired_verdict(diff["ci95"], 0.1) == "DEGRADED"
    # the verdict words read both ways: flipping the sign of the interval flips the verdict
    assert unpaired_verdict([-0.5, -0.2], 0.1) == "IMPROVED" and unpaired_verdict([0.2, 0.5], 0.1) == "DEGRADED"
    assert unpaired_verdict([-0.05, 0.05], 0.1) == "NO CHANGE DETECTED"
    assert unpaired_verdict([-0.2, 0.05], 0.1) == "UNDERPOWERED"


def test_agreement_of_identical_constant_runs_is_undefined_not_perfect():
    assert agreement([True] * 5, [True] * 5)["kappa"] is None
    assert agreement([True, False, True, False], [True, False, True, False])["kappa"] == 1.0


def _lerobot_multitask(path: Path, successes):
    info = {"per_task": [{"task_group": "libero_spatial", "task_id": t, "metrics": {
        "sum_rewards": [0.0] * len(s), "max_rewards": [0.0] * len(s), "successes": s, "video_paths": []}}
        for t, s in enumerate(successes)],
        "per_group": {}, "overall": {"pc_success": float("nan"), "n_episodes": 0}}
    path.write_text(json.dumps(info))  # NaN as lerobot writes it
    return path


def test_unpairable_lerobot_eval_gives_labelled_unpaired_intervals_and_no_paired_compare(tmp_path):
    successes = [[True, True, False, True], [True, False, False, True], [True, True, True, True],
                 [False, False, True, True], [True, True, True, False]]
    _lerobot_multitask(tmp_path / "a.json", successes)
    _lerobot_multitask(tmp_path / "b.json", [[not x for x in s] for s in successes])
    summary = import_results("lerobot-eval", tmp_path / "a.json", tmp_path / "a")
    import_results("lerobot-eval", tmp_path / "b.json", tmp_path / "b")
    assert "records neither the seed nor the init state" in summary["imported"]["cross_run_pairing"]
    rate = summary["conditions"]["clean"]["rate"]
    assert rate["sr"] == pytest.approx(14 / 20) and rate["tasks"] == 5 and rate["ci95"] is not None
    with pytest.raises(AnalysisError, match="cannot be paired .* never a paired verdict"):
        compare_runs(tmp_path / "a", tmp_path / "b")


def test_single_env_lerobot_eval_pairs_across_runs_by_seed(tmp_path):
    for name, flip in (("a", False), ("b", True)):
        info = {"per_episode": [{"episode_ix": i, "sum_reward": 1.0, "max_reward": 1.0, "success": (i % 3 == 0) ^ flip,
                                 "seed": 1000 + i} for i in range(6)], "aggregated": {}}
        (tmp_path / f"{name}.json").write_text(json.dumps(info))
        summary = import_results("lerobot-eval", tmp_path / f"{name}.json", tmp_path / name)
    assert summary["imported"]["cross_run_pairable"] is True
    result = compare_runs(tmp_path / "a", tmp_path / "b", n_boot=100)
    assert result["agreement"]["n"] == 6 and result["agreement"]["discordance"] == 1.0


def _vla_eval(path: Path, outcomes, seed=7):
    result = {"benchmark": "libero_spatial", "mode": "sync", "harness_version": "0.8.0", "created_at": "2026-01-01",
              "seed": seed, "config": {"model": "pi0", "benchmark": {"suite": "libero_spatial"}},
              "tasks": [{"task": f"pick up bowl {t}", "num_episodes": len(o), "avg_steps": 100.0,
                         "episodes": [{"episode_id": e, "metrics": {"success": s}, "steps": 100, "elapsed_sec": 1.0,
                                       "failure_reason": None} for e, s in enumerate(o)]}
                        for t, o in enumerate(outcomes)]}
    path.write_text(json.dumps(result))
    return path


def test_vla_eval_result_imports_and_two_runs_of_one_policy_agree(tmp_path):
    outcomes = [[True, False, True], [True, True, False], [False, False, True], [True, True, True], [True, False, False]]
    retest = [list(o) for o in outcomes]
    retest[0][1] = True
    _vla_eval(tmp_path / "a.json", outcomes)
    _vla_eval(tmp_path / "b.json", retest)
    summary = import_results("vla-eval", tmp_path / "a.json", tmp_path / "a")
    import_results("vla-eval", tmp_path / "b.json", tmp_path / "b")
    assert summary["conditions"]["clean"]["rate"]["sr"] == pytest.approx(9 / 15)
    result = compare_runs(tmp_path / "a", tmp_path / "b", n_boot=100)
    from sklearn.metrics import cohen_kappa_score

    flat_a, flat_b = sum(outcomes, []), sum(retest, [])
    assert result["agreement"]["kappa"] == pytest.approx(cohen_kappa_score(flat_a, flat_b))
    assert result["agreement"]["discordance"] == pytest.approx(1 / 15)
    record = json.loads(next((tmp_path / "a" / "records").rglob("*.json")).read_text())
    assert record["source"]["format"] == "vla-eval" and len(record["source"]["sha256"]) == 64
    assert record["backend"] == "imported:vla-eval"


@pytest.mark.parametrize("fmt, content, message", [
    ("vla-eval", '{"benchmark": "x", "tasks": [{"task": "t", "episodes": [{"episode_id": 0, "metrics": {}}]}]}',
     r"tasks\[0\].episodes\[0\].metrics: field 'success': expected true/false"),
    ("vla-eval", '{"benchmark": "x", "tasks": [{"task": "t", "episodes": [{"episode_id": 1e308, "metrics": '
                 '{"success": true}}]}]}', r"field 'episode_id': expected a non-negative integer below 2\^31"),
    ("vla-eval", "[" * 100000 + "]" * 100000, "not valid JSON"),
    ("vla-eval", '{"benchmark": "x", "tasks": [{"task": "a/../b", "episodes": [{"episode_id": 0, "metrics": '
                 '{"success": true}}]}]}', "cannot name a task"),
    ("lerobot-eval", '{"per_task": [{"task_group": "g", "task_id": 0, "metrics": {"successes": [true, "maybe"]}}]}',
     r"per_task\[0\].metrics.successes\[1\]: field 'successes'"),
    ("lerobot-eval", '{"nothing": 1}', "neither 'per_task' nor 'per_episode'"),
    ("lerobot-eval", "\xff\xfe garbage", "not valid JSON"),
])
def test_garbage_is_refused_naming_file_and_field_and_nothing_is_written(tmp_path, fmt, content, message):
    path = tmp_path / "in.json"
    path.write_bytes(content.encode("utf-8", errors="surrogateescape") if isinstance(content, str) else content)
    with pytest.raises(Exception, match=message) as info:
        import_results(fmt, path, tmp_path / "run")
    assert getattr(info.value, "exit_code", None) == 2
    assert not os.path.lexists(tmp_path / "run")
    assert [p.name for p in tmp_path.iterdir()] == ["in.json"]  # no staging folder left behind


def test_liberoplus_rows_are_checked_line_by_line(tmp_path):
    _, cls = _liberoplus_fixture(tmp_path, policy_a)
    bad = tmp_path / "bad.csv"
    bad.write_text("suite,id,success\nlibero_spatial,1,1\nlibero_spatial,99999,1\n")
    with pytest.raises(ImportFormatError, match=r"bad.csv:3: field 'id': '99999' is not an id"):
        read_liberoplus(bad, cls)
    bad.write_text("suite,name,success\nlibero_spatial,pick_up_object_0_and_place_it_on_the_plate_table_77,1\n")
    with pytest.raises(ImportFormatError, match="is a variant name but not in task_classification.json"):
        read_liberoplus(bad, cls)
    bad.write_text("suite,name,success\nlibero_spatial,x,1,extra\n")
    with pytest.raises(ImportFormatError, match=r"bad.csv:2: 4 fields, the header has 3"):
        read_liberoplus(bad, cls)
    bad.write_text(",".join(f"c{i}" for i in range(1000)) + "\n")
    with pytest.raises(ImportFormatError, match="1000 columns"):
        read_liberoplus(bad, cls)


def test_the_command_refuses_a_used_run_directory_and_exits_2_on_bad_input(tmp_path):
    log, cls = _liberoplus_fixture(tmp_path, policy_a)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("keep")
    runner = CliRunner()
    result = runner.invoke(main, ["import-results", "liberoplus", str(log), "--run-dir", str(tmp_path / "used"),
                                  "--classification", str(cls)])
    assert result.exit_code == 4 and "not an empty folder" in result.output
    assert (tmp_path / "used" / "mine.txt").read_text() == "keep"
    result = runner.invoke(main, ["import-results", "liberoplus", str(log), "--run-dir", str(tmp_path / "new")])
    assert result.exit_code == 2 and "needs --classification" in result.output
    result = runner.invoke(main, ["import-results", "nonesuch", str(log), "--run-dir", str(tmp_path / "new")])
    assert result.exit_code == 2 and "liberoplus" in result.output


def test_instruction_leak_check_on_hand_made_episodes():
    from robocasa_shift.importing.sources import Episode

    eps = [Episode("t", "light_conditions:L1", 1, True, "put_bowl_light_3", 1, instruction="put bowl light 3"),
           Episode("t", "light_conditions:L1", 2, True, "put_bowl_light_4", 2, instruction="put the bowl"),
           Episode("t", "clean", 0, True, "put_bowl", 3, instruction="put bowl light 3")]
    assert [leak["line"] for leak in instruction_leaks(eps)] == [1]
