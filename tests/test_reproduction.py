"""``diff-runs``: two runs of the same keys hold the same records; the golden reference run is reproduced."""

import json
import shutil

import pytest
from golden import GOLDEN_DIR, NOT_COMPARED, golden_digest
from helpers import cli

from robocasa_shift.checks.reproduction import diff_runs, run_digest



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


def test_an_ignored_field_is_left_out_and_named(fake_run, tmp_path):
    relabelled = tmp_path / "relabelled"
    shutil.copytree(fake_run, relabelled)
    for path in (relabelled / "records").rglob("*.json"):
        rec = json.loads(path.read_text())
        rec["spec_hash"] = "0" * 64  # as if a protocol file no condition of the run uses had been added
        path.write_text(json.dumps(rec))
    assert not diff_runs(fake_run, relabelled)["passed"]
    assert diff_runs(fake_run, relabelled, ignore=["spec_hash"])["passed"]
    proc = cli("diff-runs", "--ignore", "spec_hash", str(fake_run), str(relabelled))
    assert "6/6 shared records identical" in proc.stdout and "not compared: spec_hash" in proc.stdout


def test_a_saved_digest_stands_for_its_run(fake_run, tmp_path):
    cli("diff-runs", str(fake_run), str(fake_run), "--save", str(tmp_path / "digest.json"))
    assert diff_runs(tmp_path / "digest.json", fake_run)["passed"]
    assert all("timing" not in r and "wall_s" not in r for r in run_digest(tmp_path / "digest.json").values())


@pytest.mark.slow
@pytest.mark.sim
def test_the_golden_reference_run_is_reproduced(tmp_path):
    """Three rollouts of the golden run (recorded with the code from before the fast path), full horizon, field for
    field, against the digest recorded on this renderer: llvmpipe's pixels depend on the Mesa build and the CPU, and
    with them the reference policy's actions, so a renderer with no golden run on record is named, not compared."""
    pytest.importorskip("robosuite")
    digest, why = golden_digest()
    if digest is None:
        pytest.skip(why)
    golden = run_digest(digest)
    assert len(golden) == 52  # Lift and Stack, 13 conditions, episodes 0-1, reference policy
    cli("run", "--task", "Lift", "--condition", "clean,base:L2,blur:L1", "--episodes", "1", "--policy", "reference",
        "--workers", "1", "--no-progress", "--run-dir", str(tmp_path / "run"))
    fresh = run_digest(tmp_path / "run")
    assert len(fresh) == 3
    for key, rec in fresh.items():
        # fields the record gained after the golden run was recorded (they name the asset kit: none here)
        added = {k: rec.pop(k) for k in set(rec) - set(golden[key])}
        assert added == {"asset_kit": None, "asset_kit_sha256": None}, key
        assert set(rec) == set(golden[key]), key
        assert {k: v for k, v in rec.items() if k not in NOT_COMPARED} == \
            {k: v for k, v in golden[key].items() if k not in NOT_COMPARED}, key


def test_every_golden_digest_on_record_is_a_complete_golden_run():
    """Each renderer's digest holds the same 52 keys, and the renderers listed are the digests present."""
    references = json.loads((GOLDEN_DIR / "renderers.json").read_text())["references"]
    assert sorted(r["digest"] for r in references) == sorted(p.name for p in GOLDEN_DIR.glob("*.json") if p.name != "renderers.json")
    keys = [sorted(run_digest(GOLDEN_DIR / r["digest"])) for r in references]
    assert len(keys[0]) == 52 and all(k == keys[0] for k in keys)
    assert len({(r["frame_sha256"], r["simd"]) for r in references}) == len(references)
