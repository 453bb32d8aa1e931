"""The HTML report on a small run of the fake backend, opened in headless Chromium."""

import json
import re
import shutil
import subprocess

import pandas as pd
import pytest

from robocasa_shift.backends.fake import HORIZON
from robocasa_shift.policies import POLICIES
from robocasa_shift.policies.scripted.fake import FakeExpertPolicy


class FinickyPolicy(FakeExpertPolicy):
    """The fake expert, but it stops when its camera images look wrong to it.

    Two image-driven blind spots: a blurry wrist image (blur:L3) makes it freeze,
    so Reach goes S->F; in PickPlace a bright third-person image makes it refuse
    to grasp, so clean PickPlace fails and the darker illumination:L2 scene
    succeeds (F->S).
    """

    name = "finicky"
    camera_roles = ("third_person", "wrist")

    def act(self, obs):
        import cv2

        third, wrist = (obs.images[c] for c in obs.camera_roles)
        sharp = cv2.Laplacian(cv2.cvtColor(wrist, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var()
        if obs.step == 0:  # its first look at the scene decides whether it trusts it
            self.dazzled = obs.task == "PickPlace" and third.mean() > 160
        action = super().act(obs)
        if sharp < 3:
            action[:, :2] = 0.0  # frozen
        if self.dazzled:
            action[:, 2] = -1.0  # never grasps
        return action


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.report.page import build_report
    from robocasa_shift.study.runner import run

    if "finicky" not in POLICIES:
        POLICIES.register("finicky", FinickyPolicy)
    run_dir = tmp_path_factory.mktemp("report") / "run"
    run(run_dir, ["Reach", "PickPlace"], ["clean", "illumination:L2", "blur:L3"], [0],
        StudyConfig(backend="fake", policy="finicky"), ExecutionConfig(workers=1, progress=False))
    page = build_report(run_dir, videos_per_kind=1, n_boot=500)
    return run_dir, page


def test_report_files_and_reproduced_videos(report_dir):
    run_dir, page = report_dir
    videos = json.loads((run_dir / "report" / "videos.json").read_text())
    assert sorted(v["kind"] for v in videos) == ["F->S", "S->F"]
    assert {v["condition"] for v in videos} == {"blur:L3", "illumination:L2"}
    assert all(v["reproduced"] for v in videos), videos
    import imageio.v2 as imageio

    for v in videos:
        reader = imageio.get_reader(run_dir / "report" / v["file"])
        frame = reader.get_data(0)
        # the failing rollout of each pair runs to the horizon: its frames from reset to the last step
        assert reader.count_frames() == HORIZON + 1 and frame.shape[1] > 2 * 256 and frame.std() > 10
        reader.close()
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    assert summary["conditions"]["blur:L3"]["per_task_transitions"]["Reach"]["SF"] == 1
    assert summary["conditions"]["illumination:L2"]["per_task_transitions"]["PickPlace"]["FS"] == 1


def test_report_opens_in_headless_chromium(report_dir, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (make setup-report installs it)")
    run_dir, page = report_dir
    flags = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--allow-file-access-from-files", "--virtual-time-budget=4000"]
    dom = subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "Success rate per condition and task" in dom and "Integrity audit" in dom
    assert dom.count("<table") >= 4
    for img in ("macro_dsr.png", "task_dsr.png", "transitions.png", "stage_depth.png"):
        assert f'src="{img}"' in dom
        assert (run_dir / "report" / img).stat().st_size > 5000
    assert dom.count("<video") == 2
    shot = tmp_path / "page.png"
    subprocess.run(flags + [f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri()], capture_output=True, timeout=120)
    import cv2

    image = cv2.imread(str(shot))
    assert image is not None and image.shape[:2] == (2400, 1200)
    assert image.std() > 20  # tables and figures, not a blank page


# --------------------------------------------------------------------------- issue 12, item 12: what the page says


def test_report_shows_calibrated_intervals_verdicts_and_holm_families(report_dir):
    run_dir, page = report_dir
    text = page.read_text()
    for words in ("calibrated 95% CI", "percentile bootstrap (the paper", "sign-flip p (Holm)",
                  "min. dSR read DEGRADED", "Holm families", "Severity: does a higher level ever hurt less?",
                  "Invalid rollouts and pairs", "Verdicts: paired macro dSR"):
        assert words in text, words
    assert any(v in text for v in ("DEGRADED", "IMPROVED", "NO CHANGE DETECTED", "UNDERPOWERED"))
    # one pair per task and condition: every percentile interval is a point, and the page says so
    assert "zero width" in text and "That is not certainty" in text


def test_report_shows_the_policy_identity_as_a_table_not_json(report_dir):
    run_dir, page = report_dir
    text = page.read_text()
    assert "<th>name</th><td>finicky</td>" in text
    assert "{&quot;name&quot;" not in text and '{"name"' not in text


def hand_summary():
    """A summary with a 2-subgoal and a 5-subgoal task and stacked transitions reaching the top."""
    from robocasa_shift.analysis.measures import analyze

    rows = []
    for task, k in (("Alpha", 2), ("Beta", 5)):
        for episode in range(10):
            rows.append({"task": task, "episode": episode, "condition": "clean", "success": True, "n_stages": k,
                         "stages_completed": k, "first_incomplete": ""})
            for condition, fails in (("camera:L3", 9), ("blur:L1", 1), ("base:L2", 4)):
                done = episode % k if episode < fails else k
                rows.append({"task": task, "episode": episode, "condition": condition, "success": episode >= fails,
                             "n_stages": k, "stages_completed": done, "first_incomplete": "" if done == k else done + 1})
    return analyze(pd.DataFrame(rows), n_boot=100)


def test_stage_depth_table_prints_integer_counts_in_subgoal_order():
    from robocasa_shift.report.page import _first_incomplete_table

    summary = hand_summary()
    table = _first_incomplete_table(summary, {"Alpha": ["a1", "a2"], "Beta": ["b1", "b2", "b3", "b4", "b5"]})
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header == ["condition", "task", "g1", "g2", "g3", "g4", "g5", "complete"]
    assert "0.000" not in table and ".0<" not in table
    # camera:L3, Alpha (K = 2): 9 S->F pairs stopped at g1 (5) and g2 (4); g3..g5 do not exist for Alpha
    assert "<td>camera:L3</td><td>Alpha</td><td>5</td><td>4</td><td>-</td><td>-</td><td>-</td><td>0</td>" in table


def capture_figure(monkeypatch, draw):
    """Run a figure function and return its matplotlib figure instead of closing it."""
    from robocasa_shift.report import figures

    captured = {}
    monkeypatch.setattr(figures, "_save", lambda fig, path: captured.setdefault("fig", fig))
    draw()
    fig = captured["fig"]
    fig.tight_layout()  # as _save: laid out at the figure's dpi, then drawn at the dpi it is saved with
    fig.set_dpi(110)
    fig.canvas.draw()
    return fig


def test_transitions_legend_does_not_cover_the_bars(monkeypatch, tmp_path):
    from robocasa_shift.report.figures import fig_transitions

    fig = capture_figure(monkeypatch, lambda: fig_transitions(hand_summary(), tmp_path / "t.png"))
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent()
    bars = [patch.get_window_extent() for patch in ax.patches if patch.get_height() > 0]
    assert bars and not any(legend.overlaps(bar) for bar in bars)
    assert not legend.overlaps(ax.get_window_extent())  # beside the axes, not on them


def test_heatmap_labels_are_white_on_dark_cells(monkeypatch, tmp_path):
    from robocasa_shift.report.figures import fig_task_dsr

    fig = capture_figure(monkeypatch, lambda: fig_task_dsr(hand_summary(), tmp_path / "h.png"))
    labels = {(text.get_text(), text.get_color()) for text in fig.axes[0].texts}
    assert ("0.90", "white") in labels  # camera:L3: dark red
    assert ("0.10", "black") in labels  # blur:L1: pale


INJECTION = "\"'><script>alert(1)"


def test_report_escapes_run_directory_strings_and_checks_conditions(tmp_path):
    """A record condition and a contact-sheet name carrying markup reach the page only as text."""
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.report.page import build_report
    from robocasa_shift.study.runner import run

    run_dir = tmp_path / "run"
    run(run_dir, ["Reach"], ["clean", "blur:L3"], [0, 1], StudyConfig(backend="fake", policy="fake-expert"),
        ExecutionConfig(workers=1, progress=False))
    source = run_dir / "records" / "formal" / "Reach" / "0000__blur-L3__r0.json"
    record = json.loads(source.read_text())
    record["condition"] = f"blur:L3{INJECTION}"
    (source.parent / "0000__evil__r0.json").write_text(json.dumps(record))
    (run_dir / "calibration").mkdir()
    (run_dir / "calibration" / "calibration.md").write_text("# Calibration\n\n| factor | ok |\n|---|---|\n| blur | yes |\n")
    (run_dir / "calibration" / f"contact_sheet_blur{INJECTION}.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    text = build_report(run_dir, videos_per_kind=0, n_boot=100).read_text()
    assert "<script" not in text.lower() and "\"'>" not in text
    assert "Left out: records whose condition is not in the frozen spec" in text
    assert "&lt;script&gt;" in text  # shown, as text
    assert "contact_sheet_blur%22%27%3E%3Cscript%3Ealert%281%29.png" in text  # the src, percent-encoded
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    assert list(summary["conditions"]) == ["clean", "blur:L3"]  # the unknown condition never reached the analysis


def pair_count_block(summary, out):
    """The toy section's report block."""
    return f"<h2>Pairs counted by a plug-in</h2><p>{summary['pair_count']['total']} pairs</p>"


def test_an_analysis_registered_once_appears_in_summary_json_the_tables_and_the_report(tmp_path, monkeypatch):
    import pandas as pd

    from robocasa_shift.analysis.sections import SECTIONS, Section, register_section
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.report.page import build_report
    from robocasa_shift.study.runner import run

    def count(data):
        return {"pair_count": {"total": int(sum(c.get("n_pairs") or 0 for c in data.summary_conditions.values()))}}

    SECTIONS.names()  # the built-in sections first, then the toy one
    monkeypatch.setattr(SECTIONS, "_entries", dict(SECTIONS._entries))  # registered for this test only
    register_section(Section("pair_count", count,
                             tables=lambda s: {"pair_count": pd.DataFrame([s["pair_count"]]).astype(object)},
                             report=f"{__name__}:pair_count_block"))
    run_dir = tmp_path / "run"
    run(run_dir, ["Reach"], ["clean", "blur:L3"], [0, 1], StudyConfig(backend="fake", policy="fake-expert"),
        ExecutionConfig(workers=1, progress=False))
    text = build_report(run_dir, videos_per_kind=0, n_boot=100).read_text()
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    assert summary["pair_count"] == {"total": 2}
    assert (run_dir / "analysis" / "pair_count.csv").read_text().splitlines() == ["total", "2"]
    assert "<h2>Pairs counted by a plug-in</h2><p>2 pairs</p>" in text
    assert "<h2>Severity: does a higher level ever hurt less?</h2>" in text  # the built-in sections still there
    assert {"trend", "interactions", "noise_floor", "unpaired_variants"} <= set(summary)
