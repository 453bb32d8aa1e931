"""Runs on a generated asset kit (robocasa's stand-in kitchens): labelled on every page, never mixed.

Fake-backend runs are relabelled as stand-in runs (manifest and records), as the robocasa backend
writes them; the audit, the report and compare must then say "STAND-IN KIT - not RoboCasa results"
and refuse a run or a comparison that mixes kits.
"""

import json
import shutil

import pytest
from helpers import cli

from robocasa_shift.core import kits

KIT = {"kind": "standin", "version": 1, "robocasa_version": "1.0.1", "sha256": "a" * 64}
OTHER_KIT = {**KIT, "sha256": "b" * 64}


def relabel(run_dir, kit, mixed_kit=None):
    """Make ``run_dir`` a run on ``kit``, as the robocasa backend writes one; ``mixed_kit``: its first record ran on
    that kit instead."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["asset_kit"] = kit
    manifest["env_config"]["asset_kit"] = kit
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    for i, path in enumerate(sorted((run_dir / "records").rglob("*.json"))):
        rec = json.loads(path.read_text())
        label = mixed_kit if (mixed_kit and i == 0) else kit
        rec["asset_kit"], rec["asset_kit_sha256"] = label["kind"], label["sha256"]
        path.write_text(json.dumps(rec))


@pytest.fixture(scope="module")
def fake_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("kits")
    for policy in ("expert", "random"):
        cli("run", "--backend", "fake", "--task", "PickPlace", "--condition", "clean,blur:L3", "--episodes", "0-1",
            "--policy", f"fake-{policy}", "--workers", "1", "--no-progress", "--run-dir", str(root / policy))
    return root


def copy_run(fake_runs, tmp_path, name, kit, mixed_kit=None):
    run = tmp_path / name
    shutil.copytree(fake_runs / name, run)
    relabel(run, kit, mixed_kit)
    return run


def test_records_name_their_kit_and_the_table_keeps_it():
    from robocasa_shift.core.records import Record, to_row

    record = Record("formal", "T", 0, "clean", 0, "robocasa", "expert", "s", "h", 0, 1, 2, 10, 1, ["a"],
                    asset_kit="standin", asset_kit_sha256="a" * 64)
    row = to_row(record.to_json())
    assert (row["asset_kit"], row["asset_kit_sha256"]) == ("standin", "a" * 64)
    assert kits.kit_problems({"asset_kit": KIT}, [record.to_json()]) == []
    assert kits.kit_problems({}, [record.to_json()]) == [
        "1 record(s) ran on asset kit standin (sha256 aaaaaaaaaaaa), the manifest names the backend's own assets: "
        "a run mixes asset kits"]
    assert kits.banner(KIT).startswith("STAND-IN KIT - not RoboCasa results")
    assert kits.banner(None) is None


def test_the_audit_of_a_standin_run_says_so_on_its_page(fake_runs, tmp_path):
    run = copy_run(fake_runs, tmp_path, "expert", KIT)
    proc = cli("audit", str(run))
    assert proc.stdout.startswith(kits.STANDIN_BANNER)
    assert (run / "audit.md").read_text().startswith(f"**{kits.STANDIN_BANNER}")
    audit = json.loads((run / "audit.json").read_text())
    assert audit["passed"] and audit["asset_kit"] == KIT


def test_the_audit_fails_a_run_that_mixes_kits(fake_runs, tmp_path):
    run = copy_run(fake_runs, tmp_path, "expert", KIT, mixed_kit=OTHER_KIT)
    proc = cli("audit", str(run), check=False)
    assert proc.returncode == 1 and "mixes asset kits" in proc.stdout


def test_the_report_of_a_standin_run_carries_the_banner_and_refuses_mixed_kits(fake_runs, tmp_path):
    run = copy_run(fake_runs, tmp_path, "expert", KIT)
    cli("audit", str(run))
    proc = cli("report", str(run), "--videos", "0")
    page = (run / "report" / "index.html").read_text()
    assert page.count(kits.STANDIN_BANNER) >= 3  # title, top and bottom of the page
    assert kits.STANDIN_BANNER in proc.stdout
    mixed = copy_run(fake_runs, tmp_path, "random", KIT, mixed_kit=OTHER_KIT)
    proc = cli("report", str(mixed), "--videos", "0", check=False)
    assert proc.returncode != 0 and "mixes asset kits" in proc.stderr


def test_compare_labels_standin_runs_and_refuses_two_kits(fake_runs, tmp_path):
    a = copy_run(fake_runs, tmp_path, "expert", KIT)
    b = copy_run(fake_runs, tmp_path, "random", KIT)
    out = tmp_path / "cmp"
    proc = cli("compare", str(a), str(b), "--out", str(out))
    assert proc.stdout.startswith(kits.STANDIN_BANNER)
    assert (out / "compare.md").read_text().startswith(f"**{kits.STANDIN_BANNER}")
    assert json.loads((out / "compare.json").read_text())["asset_kit"] == KIT
    other = tmp_path / "other"
    shutil.copytree(b, other)
    relabel(other, OTHER_KIT)
    proc = cli("compare", str(a), str(other), check=False)
    assert proc.returncode == 2 and "not comparable" in proc.stderr
    proc = cli("compare", str(a), str(fake_runs / "random"), check=False)  # a stand-in run beside real assets
    assert proc.returncode == 2 and "the backend's own assets" in proc.stderr
