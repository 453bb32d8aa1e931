"""The integrity audit passes a clean run and names the check and the rollout of each tampering (fake backend)."""

import json
import shutil

import pytest
from helpers import cli

from robocasa_shift.checks.audit import audit_run

CONDITIONS = ["clean", "camera:L1", "camera:L3", "base:L2", "blur:L1"]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("audit") / "run"
    cli("run", "--backend", "fake", "--task", "Reach", "--condition", ",".join(CONDITIONS), "--episodes", "0-1",
        "--policy", "fake", "--workers", "1", "--no-progress", "--run-dir", str(run_dir))
    return run_dir


@pytest.fixture()
def run_copy(pristine, tmp_path):
    dest = tmp_path / "run"
    shutil.copytree(pristine, dest)
    return dest


def record_file(run_dir, episode, condition):
    return run_dir / "records" / "formal" / "Reach" / f"{episode:04d}__{condition.replace(':', '-')}__r0.json"


def edit(path, **changes):
    rec = json.loads(path.read_text())
    for key, value in changes.items():
        if callable(value):
            value(rec)
        else:
            rec[key] = value
    path.write_text(json.dumps(rec))


def failing(report):
    return {name: c["rollouts"] for name, c in report["tasks"]["Reach"]["checks"].items() if c["count"]}


def test_a_clean_run_passes(run_copy):
    report = audit_run(run_copy)
    reach = report["tasks"]["Reach"]
    assert report["passed"] and reach["expected_rollouts"] == 10 and reach["valid_rollouts"] == 10
    assert reach["distinct_base_episodes"] == 2 and failing(report) == {}
    assert (run_copy / "audit.md").exists() and json.loads((run_copy / "audit.json").read_text())["passed"]


def test_an_edited_fingerprint_is_named(run_copy):
    edit(record_file(run_copy, 1, "camera:L3"), env_fingerprint="0" * 64)
    report = audit_run(run_copy)
    assert not report["passed"]
    assert failing(report) == {"fingerprint_mismatches": ["formal/Reach/0001/camera:L3/r0"]}


def test_a_deleted_record_is_named(run_copy):
    record_file(run_copy, 0, "base:L2").unlink()
    report = audit_run(run_copy)
    assert failing(report) == {"missing_records": ["formal/Reach/0000/base:L2/r0"]}
    assert report["tasks"]["Reach"]["valid_rollouts"] == 9 and not report["passed"]


def test_a_duplicated_record_is_named(run_copy):
    src = record_file(run_copy, 0, "clean")
    shutil.copy(src, src.with_name("0000__clean__r0 (copy).json"))
    report = audit_run(run_copy)
    assert list(failing(report)) == ["duplicate_records"]
    assert failing(report)["duplicate_records"][0].startswith("formal/Reach/0000/clean/r0 (")


def test_tampered_perturbation_and_seed_and_truncation_are_named(run_copy):
    def weaken(rec):
        rec["perturbation"]["params"]["theta_max_deg"] = 5.0

    edit(record_file(run_copy, 0, "camera:L3"), perturbation=weaken)
    edit(record_file(run_copy, 1, "blur:L1"), policy_seed=12345)
    edit(record_file(run_copy, 1, "clean"), success=False, steps=30)
    found = failing(audit_run(run_copy))
    assert found["invalid_perturbation_records"][0].startswith("formal/Reach/0000/camera:L3/r0: params")
    assert found["policy_seed_mismatches"] == ["formal/Reach/0001/blur:L1/r0"]
    assert found["unexpected_truncations"][0].startswith("formal/Reach/0001/clean/r0: 30 of 40 steps")


def test_audit_cli_exit_status(run_copy):
    assert cli("audit", str(run_copy)).returncode == 0
    record_file(run_copy, 1, "blur:L1").unlink()
    proc = cli("audit", str(run_copy), check=False)
    assert proc.returncode == 1 and "missing" in proc.stdout and "FAILED" in proc.stdout
