"""compare D1 D2: pair by key, paired differences, refusal across frozen suites (fake backend)."""

import json

import pytest
from helpers import cli


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    for policy in ("expert", "random"):
        cli("run", "--backend", "fake", "--task", "PickPlace", "--condition", "clean,blur:L3", "--episodes", "0-1",
            "--policy", f"fake-{policy}", "--workers", "2", "--no-progress", "--run-dir", str(root / policy))
    return root


def test_compare_pairs_by_key(two_runs, tmp_path):
    out = tmp_path / "cmp"
    proc = cli("compare", str(two_runs / "expert"), str(two_runs / "random"), "--out", str(out))
    result = json.loads((out / "compare.json").read_text())
    for cond in ("clean", "blur:L3"):
        v = result["conditions"][cond]
        assert v["n_pairs"] == 2 and v["macro_success_diff"] == 1.0
        assert v["a_only_success"] == 2 and v["b_only_success"] == 0
        assert v["mcnemar_p"] == 0.5  # 2 discordant pairs, all one way: 2 * 0.5**2
        assert v["macro_depth_diff"] > 0 and v["success_diff_ci95"] == [1.0, 1.0]
    assert result["conditions"]["clean"]["mcnemar_p_holm"] == 1.0  # 0.5 * 2 conditions, capped
    assert "| clean | 2 | +1.000 |" in (out / "compare.md").read_text()
    assert "success +1.000" in proc.stdout


def test_compare_refuses_runs_of_different_suites(two_runs, tmp_path):
    import shutil

    other = tmp_path / "other"
    shutil.copytree(two_runs / "random", other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["study_seed"] += 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    proc = cli("compare", str(two_runs / "expert"), str(other), check=False)
    assert proc.returncode == 2 and "runs differ in study_seed" in proc.stderr
