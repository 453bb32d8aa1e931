"""What the report page tells its reader, and where it refuses (fake backend, real Chromium).

The verdict grid fits a 1280-pixel window with every level visible; a fake-backend run says so on every
page; a run still in progress is marked incomplete and exits 1; a folder without a manifest gets no
report and no audit; the pair videos report progress, keep their overlay text inside the frame and name
unreached subgoals in words; the grid and the dSR figure order the factors the same way.
"""

import json
import os
import shutil

import numpy as np
import pytest
from helpers import cli

from robocasa_shift.core import kits
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.rundir.store import RunStore


@pytest.fixture(scope="module")
def matrix_run(tmp_path_factory):
    """Reach under every condition of the matrix, two base episodes, audited and reported (one video pair)."""
    run_dir = tmp_path_factory.mktemp("reader") / "run"
    cli("run", "--backend", "fake", "--policy", "fake", "--task", "Reach", "--condition", "all", "--episodes", "0-1",
        "--no-progress", "--run-dir", str(run_dir))
    audit = cli("audit", str(run_dir))
    report = cli("report", str(run_dir), "--videos", "1")
    return run_dir, audit, report


@pytest.mark.slow
def test_every_level_of_the_verdict_grid_is_visible_in_a_1280_pixel_window(matrix_run):
    if shutil.which("chromium") is None:
        pytest.skip("Debian's chromium is not installed (make setup installs it)")
    from robocasa_shift.report.browser import measure, screenshot

    run_dir, _, _ = matrix_run
    page = run_dir / "report" / "index.html"
    for width in (1280, 1920):
        layout = measure(page, width)
        assert layout["viewport"] == width
        assert not layout["box_scrolls"] and not layout["page_scrolls"], layout
        assert layout["grid_right"] <= width
        levels = [c for c in layout["cells"] if c["text"].startswith("L")]
        assert len(levels) == 12  # 4 factors x 3 levels, each cell whole: level, dSR, interval, verdict
        for cell in levels:
            assert cell["right"] <= width and cell["text"].split()[-1] in (
                "DEGRADED", "IMPROVED", "DETECTED", "UNDERPOWERED"), cell
    shot = screenshot(page, run_dir / "top.png", 1280, 900)
    import cv2

    image = cv2.imread(str(shot))
    assert image.shape[:2] == (900, 1280) and image.std() > 20


def test_a_fake_backend_run_says_so_on_the_page_the_audit_and_the_console(matrix_run):
    run_dir, audit, report = matrix_run
    assert kits.TESTING_BANNER in (run_dir / "report" / "index.html").read_text()
    assert (run_dir / "report" / "index.html").read_text().count("standin-banner") == 2  # top and bottom
    assert kits.TESTING_BANNER in (run_dir / "audit.md").read_text()
    assert kits.TESTING_BANNER in audit.stdout and kits.TESTING_BANNER in report.stdout
    # and only there: a robosuite manifest gets no such line
    assert kits.run_banner({"backend": "robosuite"}) is None
    assert kits.run_banner({"backend": "fake"}).startswith(kits.TESTING_BANNER)


def test_a_run_in_progress_is_reported_as_incomplete_and_exits_1(matrix_run, tmp_path):
    run_dir = tmp_path / "partial"
    shutil.copytree(matrix_run[0], run_dir)
    shutil.rmtree(run_dir / "report")
    store = RunStore(run_dir)
    # a run interrupted after two of its planned base episodes: eight more were planned
    store.add_to_plan([RolloutKey("formal", "Reach", ep, c) for ep in range(2, 10) for c in ("clean", "blur:L1")])
    proc = cli("report", str(run_dir), "--videos", "0", check=False)
    assert proc.returncode == 1, proc.stderr
    assert "INCOMPLETE RUN: 26 of 42 planned formal rollouts are recorded" in proc.stderr
    text = (run_dir / "report" / "index.html").read_text()
    assert "INCOMPLETE RUN" in text and "2 of 10 planned base episode(s) recorded" in text
    # the finished run: no notice, exit 0
    page = (matrix_run[0] / "report" / "index.html").read_text()
    assert "INCOMPLETE" not in page and "2 base episode(s) each" in page


def test_a_run_planned_but_with_no_records_yet_gets_an_incomplete_page_not_a_traceback(matrix_run, tmp_path):
    run_dir = tmp_path / "planned"
    shutil.copytree(matrix_run[0], run_dir)
    shutil.rmtree(run_dir / "report")
    shutil.rmtree(run_dir / "records")  # interrupted before its first record (pair videos asked for, none to film)
    proc = cli("report", str(run_dir), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "INCOMPLETE RUN: 0 of 26 planned formal rollouts are recorded" in proc.stderr
    assert "No formal-phase records yet" in (run_dir / "report" / "index.html").read_text()


@pytest.mark.parametrize("command", ["report", "audit"])
def test_a_folder_without_a_manifest_gets_no_report_and_no_audit(command, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "readme.txt").write_text("not a run")
    for folder in (empty, notes):
        before = sorted(os.listdir(folder))
        proc = cli(command, str(folder), check=False)
        assert proc.returncode == 4, proc.stderr
        assert "not a run directory (no manifest.json" in proc.stderr and f"{command} wrote nothing" in proc.stderr
        assert sorted(os.listdir(folder)) == before


def test_an_audit_of_a_run_with_no_records_says_so_in_words(tmp_path):
    run_dir = tmp_path / "run"
    cli("run", "--backend", "fake", "--policy", "fake", "--task", "Reach", "--condition", "clean", "--episodes", "0",
        "--phase", "screening", "--no-progress", "--run-dir", str(run_dir))
    proc = cli("audit", str(run_dir), check=False)
    assert proc.returncode == 1
    assert "no formal rollouts planned or recorded; records of other phases: screening 1" in proc.stdout
    assert "{" not in proc.stdout.split("run: ")[1]


def test_pair_videos_report_progress_and_name_unreached_subgoals_in_words(matrix_run):
    run_dir, _, report = matrix_run
    assert "pair videos (2 rollouts re-run each)" in report.stderr and "pair/s" in report.stderr
    text = (run_dir / "report" / "index.html").read_text()
    videos = json.loads((run_dir / "report" / "videos.json").read_text())
    assert videos and "None" not in text.split("Matched pairs")[1]
    failed = next(v for v in videos if None in v["perturbed_stage_steps"] or None in v["clean_stage_steps"])
    assert "not reached" in text and failed["subgoals"][0] in text


def test_overlay_text_stays_inside_a_small_frame():
    from robocasa_shift.report.videos import MARGIN, _panel, panel_scale

    frames = [np.zeros((64, 64, 3), np.uint8), np.zeros((64, 64, 3), np.uint8)]
    goals = ["grasp_object_with_a_long_name", "carry_to_target", "release_on_target"]
    panel = _panel(frames, "camera_pose:L3+motion_blur:L2", goals, {goals[0]: 123, goals[1]: 4567}, 400, False,
                   "FAILURE")
    assert panel.shape[1] == 64 * panel_scale(64) >= 320
    body_end = 28 + 2 * panel.shape[1]
    head, foot = panel[:28], panel[body_end:]
    for strip in (head, foot):
        assert (strip[:, -MARGIN:] == 255).all()  # nothing drawn in the right margin: no line is cut
        assert (strip < 200).any()  # and there is text


def test_the_grid_and_the_figure_order_factors_alike(matrix_run, tmp_path):
    from robocasa_shift.core.specs import load_protocol
    from robocasa_shift.report.figures import factor_groups, fig_macro_dsr

    run_dir, _, _ = matrix_run
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    order = [factor for _, factor, _ in factor_groups(summary["conditions"], load_protocol().factor_order)]
    assert order == ["illumination", "camera", "blur", "base"]  # scene, sensing, embodiment
    assert fig_macro_dsr(summary, tmp_path / "macro_dsr.png", load_protocol().factor_order) == order
    text = (run_dir / "report" / "index.html").read_text()
    grid = text[text.index("<table class='verdicts'>"):]
    grid = grid[:grid.index("</table>")]
    assert [f for f in order if f"<td>{f}</td>" in grid] == order
    assert sorted(order, key=lambda f: grid.index(f"<td>{f}</td>")) == order


def test_the_first_screen_says_what_the_design_could_and_could_not_show(matrix_run):
    from robocasa_shift.report.page import _design_reach

    run_dir, _, _ = matrix_run
    text = (run_dir / "report" / "index.html").read_text()
    lead = text[text.index("<section class='lead'>"):text.index("</section>")]
    # 1 task x 2 base episodes: neither decisive verdict is reachable, whatever the outcomes
    assert "What this study could show</b> (1 task(s) x 2 base episode(s))" in lead
    # every pair lost: two-sided p = 2 * 0.5**n, times 12 conditions (Holm's first step) below 0.05 from n = 9
    assert "could have given DEGRADED (it needs at least 9 base episodes per task)" in lead
    assert "could have given NO CHANGE DETECTED (it needs at least 45 base episodes per task)" in lead
    # the demo's design, 3 tasks x 10 base episodes under 12 conditions: DEGRADED is within reach, NO CHANGE is not
    summary = {"tasks": ["Lift", "Stack", "PickPlaceCan"], "verdict_rule": {"min_effect": 0.1},
               "conditions": {f"c{i}": {"per_task_n_pairs": {"Lift": 10, "Stack": 10, "PickPlaceCan": 10},
                                        "power": {"mde_dsr": 0.3}} for i in range(12)}}
    line = _design_reach(summary)
    assert "DEGRADED" not in line and "NO CHANGE DETECTED (it needs at least 24 base episodes per task)" in line
    summary["conditions"] = {c: {**v, "per_task_n_pairs": {t: 24 for t in summary["tasks"]}}
                             for c, v in summary["conditions"].items()}
    assert "every verdict was within its reach" in _design_reach(summary)


@pytest.mark.slow
def test_a_report_made_again_keeps_its_videos_and_a_forged_list_costs_a_re_run(matrix_run, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(matrix_run[0], copy)  # a copy of a reported run, as a reader receives it
    videos = copy / "report" / "videos.json"
    first = json.loads(videos.read_text())
    assert first and all(not v["kept"] and len(v["records_sha256"]) == 64 for v in first)
    films = {v["file"]: (copy / "report" / v["file"]).read_bytes() for v in first}
    again = cli("report", str(copy), "--videos", "1")
    assert "pair videos" not in again.stderr  # nothing re-run
    kept = json.loads(videos.read_text())
    assert [v["file"] for v in kept] == [v["file"] for v in first] and all(v["kept"] for v in kept)
    assert all(v["reproduced"] == w["reproduced"] for v, w in zip(kept, first))
    assert {f: (copy / "report" / f).read_bytes() for f in films} == films
    assert "kept from the previous report of these same two records" in (copy / "report" / "index.html").read_text()
    # forged lists: a wrong records hash, wrong types, not JSON, a link instead of a file -> filmed again
    forged = [[{**v, "records_sha256": "0" * 64} for v in first],
              [{**v, "episode": str(v["episode"]), "reproduced": "yes"} for v in first], "not json {"]
    for text in forged:
        videos.write_text(text if isinstance(text, str) else json.dumps(text))
        proc = cli("report", str(copy), "--videos", "1")
        assert "pair videos (2 rollouts re-run each)" in proc.stderr
        entries = json.loads(videos.read_text())
        assert not any(v["kept"] for v in entries) and all(v["reproduced"] for v in entries)
    videos.unlink()
    videos.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text(json.dumps(first))
    proc = cli("report", str(copy), "--videos", "1", check=False)
    assert proc.returncode in (0, 4) and "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "elsewhere.json").read_text()) == first  # never written through the link
