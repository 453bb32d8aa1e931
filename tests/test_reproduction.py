"""``diff-runs``: two runs of the same keys hold the same records; the golden reference run is reproduced."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from helpers import cli

from robocasa_shift.checks.reproduction import diff_runs, run_digest

GOLDEN = Path(__file__).parent / "data" / "golden-reference.json"
GOLDEN_RENDERER = Path(__file__).parent / "data" / "golden-renderer.json"  # the renderer build it was recorded on


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("repro") / "run"
    cli("run", "--backend", "fake", "--task", "Reach", "--condition", "clean,camera:L2,blur:L1", "--episodes", "0-1",
        "--policy", "fake", "--workers", "1", "--no-progress", "--run-dir", str(run_dir))
    return run_dir


def test_a_rerun_is_identical_and_an_edited_field_is_named(fake_run, tmp_path):
    again = tmp_path / "again"
    cli("run", "--backend", "fake", "--task", "Reach", "--condition", "clean,camera:L2,blur:L1", "--episodes", "0-1",
        "--policy", "fake", "--workers", "2", "--no-progress", "--run-dir", str(again))
    result = diff_runs(fake_run, again)
    assert result["passed"] and result["identical"] == result["shared"] == 6  # timings differ, results do not
    edited = tmp_path / "edited"
    shutil.copytree(fake_run, edited)
    path = edited / "records" / "formal" / "Reach" / "0001__camera-L2__r0.json"
    rec = json.loads(path.read_text())
    rec["stage_steps"] = [s + 1 if s is not None else 1 for s in rec["stage_steps"]]
    path.write_text(json.dumps(rec))
    (edited / "records" / "formal" / "Reach" / "0000__blur-L1__r0.json").unlink()
    result = diff_runs(fake_run, edited)
    assert not result["passed"] and result["only_a"] == ["formal/Reach/0000/blur:L1/r0"]
    assert [d["field"] for d in result["differing"]["formal/Reach/0001/camera:L2/r0"]] == ["stage_steps"]
    proc = cli("diff-runs", str(fake_run), str(edited), check=False)
    assert proc.returncode == 1 and "formal/Reach/0001/camera:L2/r0: stage_steps" in proc.stdout


def test_a_saved_digest_stands_for_its_run(fake_run, tmp_path):
    cli("diff-runs", str(fake_run), str(fake_run), "--save", str(tmp_path / "digest.json"))
    assert diff_runs(tmp_path / "digest.json", fake_run)["passed"]
    assert all("timing" not in r and "wall_s" not in r for r in run_digest(tmp_path / "digest.json").values())


def reference_frame_sha256() -> str:
    """The full scene of Lift's first formal episode, third-person camera, 128 px, fast profile without culling, as
    this machine's renderer draws it: the reference policy reads such frames, so other pixels change records."""
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.specs import load_protocol
    from robocasa_shift.engine.rollout import prepare_episode

    env = get_backend("robosuite").make("Lift", stock_simulator=True)  # every geom drawn, as before culling
    try:
        prepare_episode(env, load_protocol(), RolloutKey("formal", "Lift", 0, "clean"))
        return hashlib.sha256(env.render(env.third_person_cameras[0], 128).tobytes()).hexdigest()
    finally:
        env.close()


@pytest.mark.sim
def test_the_golden_reference_run_is_reproduced(tmp_path):
    """Three rollouts of the golden run (recorded with the code from before the fast path), full horizon, field for
    field. Recorded on one build of the renderer (llvmpipe): a Debian update of Mesa changed its pixels, and with
    them the reference policy's actions, so another build cannot reproduce the run and is named, not compared."""
    pytest.importorskip("robosuite")
    recorded = json.loads(GOLDEN_RENDERER.read_text())
    drawn = reference_frame_sha256()
    if drawn != recorded["frame_sha256"]:
        pytest.skip(f"this renderer draws the reference frame as {drawn[:16]}, the golden run's drew it as "
                    f"{recorded['frame_sha256'][:16]} ({recorded['renderer']}): re-record the golden run (docs/performance.md)")
    golden = run_digest(GOLDEN)
    assert len(golden) == 52  # Lift and Stack, 13 conditions, episodes 0-1, reference policy
    cli("run", "--task", "Lift", "--condition", "clean,base:L2,blur:L1", "--episodes", "1", "--policy", "reference",
        "--workers", "1", "--no-progress", "--run-dir", str(tmp_path / "run"))
    fresh = run_digest(tmp_path / "run")
    assert len(fresh) == 3
    for key, rec in fresh.items():
        # fields the record gained after the golden run was recorded (they name the asset kit: none here)
        added = {k: rec.pop(k) for k in set(rec) - set(golden[key])}
        assert added == {"asset_kit": None, "asset_kit_sha256": None}, key
        assert rec == golden[key], key
