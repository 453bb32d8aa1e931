"""The HTML report on a small run of the fake backend, opened in headless Chromium."""

import json
import shutil
import subprocess

import pytest

from robocasa_shift.backends.fake import HORIZON, FakeExpertPolicy
from robocasa_shift.policies import POLICIES


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
    from robocasa_shift.analysis.report import build_report
    from robocasa_shift.config import ExecutionConfig, StudyConfig
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
    assert "Success rate per task and condition" in dom and "Integrity audit" in dom
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
