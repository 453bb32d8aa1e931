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


@pytest.fixture(scope="module")
def decisive_runs(tmp_path_factory):
    """The fake expert and the fake random policy on 8 base episodes: every pair is decisive one way."""
    root = tmp_path_factory.mktemp("decisive")
    for policy in ("expert", "random"):
        cli("run", "--backend", "fake", "--task", "PickPlace", "--condition", "clean,blur:L3", "--episodes", "0-7",
            "--policy", f"fake-{policy}", "--workers", "2", "--no-progress", "--run-dir", str(root / policy))
    return root


def test_compare_names_verdicts_from_the_side_of_run_a_against_baseline_b(decisive_runs, tmp_path):
    worse = tmp_path / "worse"
    proc = cli("compare", str(decisive_runs / "random"), str(decisive_runs / "expert"), "--out", str(worse))
    result = json.loads((worse / "compare.json").read_text())
    assert result["baseline"] == "b" and result["verdict_rule"]["vocabulary"][:2] == ["IMPROVED", "REGRESSED"]
    for cond in ("clean", "blur:L3"):
        v = result["conditions"][cond]
        # A (random) never succeeds where B (expert) fails: A is worse than its baseline
        assert v["macro_success_diff"] == -1.0 and v["a_only_success"] == 0 and v["b_only_success"] == 8
        assert v["success_diff_ci95_calibrated"][1] < 0 and v["verdict"] == "REGRESSED"
    assert "REGRESSED" in proc.stdout and "IMPROVED" not in proc.stdout.split("than B\n", 1)[1]
    assert "the baseline" in (worse / "compare.md").read_text()


def test_swapping_a_and_b_flips_every_compare_verdict_and_interval(decisive_runs, tmp_path):
    ab, ba = tmp_path / "ab", tmp_path / "ba"
    cli("compare", str(decisive_runs / "expert"), str(decisive_runs / "random"), "--out", str(ab))
    cli("compare", str(decisive_runs / "random"), str(decisive_runs / "expert"), "--out", str(ba))
    first = json.loads((ab / "compare.json").read_text())["conditions"]
    second = json.loads((ba / "compare.json").read_text())["conditions"]
    flipped = {"IMPROVED": "REGRESSED", "REGRESSED": "IMPROVED", "NO CHANGE DETECTED": "NO CHANGE DETECTED",
               "UNDERPOWERED": "UNDERPOWERED"}
    assert set(first) == set(second) == {"clean", "blur:L3"}
    for cond, v in first.items():
        w = second[cond]
        assert v["verdict"] == "IMPROVED" and flipped[v["verdict"]] == w["verdict"]
        assert v["macro_success_diff"] == -w["macro_success_diff"]
        for key in ("success_diff_ci95_calibrated", "success_diff_ci95"):
            assert v[key] == pytest.approx([-w[key][1], -w[key][0]], abs=1e-12)
        assert v["macro_depth_diff"] == pytest.approx(-w["macro_depth_diff"])
        assert (v["a_only_success"], v["b_only_success"]) == (w["b_only_success"], w["a_only_success"])
        assert v["signflip"]["p_holm"] == pytest.approx(w["signflip"]["p_holm"])
