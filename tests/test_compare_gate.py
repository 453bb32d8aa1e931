"""compare as a CI gate (--fail-on, JUnit XML read by junitparser), its output folder, and N runs (fake backend)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import ROOT, cli

junitparser = pytest.importorskip("junitparser", reason="the test extra's JUnit consumer")

CONDITIONS = ("clean", "camera:L3", "blur:L3")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The image-driven fake policy, the privileged fake expert and the random one, on the same 8 base episodes."""
    root = tmp_path_factory.mktemp("gate")
    for policy in ("fake", "fake-expert", "fake-random"):
        cli("run", "--backend", "fake", "--task", "PickPlace", "--condition", ",".join(CONDITIONS), "--episodes", "0-7",
            "--policy", policy, "--workers", "2", "--no-progress", "--run-dir", str(root / policy))
    return root


def _listing(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, files in os.walk(folder) for f in files)


def _cases(xml_path):
    """{condition: (outcome, message)} as a JUnit consumer reads the file: 'failure', 'skipped' or 'passed'."""
    suite = next(iter(junitparser.JUnitXml.fromfile(str(xml_path))))
    out = {}
    for case in suite:
        outcome = "passed" if not case.result else type(case.result[0]).__name__.lower()
        out[case.name] = (outcome, case.result[0].message if case.result else "")
    return suite, out


def test_the_gate_fails_when_the_candidate_regresses_and_junit_says_where(runs, tmp_path):
    out = tmp_path / "gate"
    proc = cli("compare", str(runs / "fake"), str(runs / "fake-expert"), "--fail-on", "regressed", "--out", str(out),
               check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result = json.loads((out / "compare.json").read_text())
    regressed = [c for c, v in result["conditions"].items() if v["verdict"] == "REGRESSED"]
    assert regressed and "gate failed (--fail-on regressed)" in proc.stderr
    assert all(c in proc.stderr for c in regressed)
    assert result["gate"] == {"fail_on": ["regressed"], "failing": {c: "REGRESSED" for c in regressed}, "passed": False}
    suite, cases = _cases(out / "junit.xml")
    assert sorted(cases) == sorted(CONDITIONS)  # one test case per condition
    assert suite.failures == len(regressed) and suite.tests == len(CONDITIONS)
    for cond, (outcome, message) in cases.items():
        verdict = result["conditions"][cond]["verdict"]
        assert outcome == ("failure" if verdict == "REGRESSED" else "skipped" if verdict == "UNDERPOWERED" else "passed")
        if outcome != "passed":
            assert message.startswith(verdict)
    for v in (result["conditions"][c] for c in regressed):  # the claim, checked from the numbers
        assert v["success_diff_ci95_calibrated"][1] < 0 and v["signflip"]["p_holm"] < 0.05


def test_the_same_runs_swapped_pass_the_gate(runs, tmp_path):
    out = tmp_path / "swapped"
    proc = cli("compare", str(runs / "fake-expert"), str(runs / "fake"), "--fail-on", "regressed", "--out", str(out))
    assert "gate passed (--fail-on regressed)" in proc.stdout
    result = json.loads((out / "compare.json").read_text())
    assert "IMPROVED" in {v["verdict"] for v in result["conditions"].values()}
    suite, cases = _cases(out / "junit.xml")
    assert suite.failures == 0 and not any(o == "failure" for o, _ in cases.values())


def test_an_underpowered_gate_fails_only_when_asked(runs, tmp_path):
    # a policy against itself: nothing differs, and 8 pairs are too few to show NO CHANGE within +-0.10
    same = [str(runs / "fake"), str(runs / "fake")]
    quiet = cli("compare", *same, "--fail-on", "regressed", "--out", str(tmp_path / "a"))
    assert "gate passed" in quiet.stdout
    suite, cases = _cases(tmp_path / "a" / "junit.xml")
    assert {o for o, _ in cases.values()} == {"skipped"} and suite.skipped == len(CONDITIONS)
    strict = cli("compare", *same, "--fail-on", "regressed", "--fail-on", "underpowered", "--out", str(tmp_path / "b"),
                 check=False)
    assert strict.returncode == 1 and "UNDERPOWERED" in strict.stderr
    suite, cases = _cases(tmp_path / "b" / "junit.xml")
    assert {o for o, _ in cases.values()} == {"failure"}


def test_results_go_outside_the_compared_runs(runs, tmp_path):
    before = {p: _listing(runs / p) for p in ("fake", "fake-expert")}
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run([sys.executable, "-m", "robocasa_shift", "compare", str(runs / "fake-expert"), str(runs / "fake")],
                          capture_output=True, text=True, timeout=600, cwd=work,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(work / "compare-fake-expert-vs-fake")) == [
        "compare.json", "compare.md", "compare_per_task.csv", "junit.xml"]
    assert {p: _listing(runs / p) for p in before} == before  # nothing written into either run
    inside = cli("compare", str(runs / "fake"), str(runs / "fake-expert"), "--out", str(runs / "fake" / "cmp"),
                 check=False)
    assert inside.returncode == 2 and "inside the compared run" in inside.stderr
    assert not (runs / "fake" / "cmp").exists()


def test_three_runs_give_a_robustness_table_holm_across_every_pair(runs, tmp_path):
    out = tmp_path / "many"
    names = ("fake", "fake-expert", "fake-random")
    proc = cli("compare", *(str(runs / n) for n in names), "--out", str(out))
    result = json.loads((out / "compare.json").read_text())
    assert [r["label"] for r in result["runs"]] == list(names)
    assert [(p["a"]["label"], p["b"]["label"]) for p in result["pairs"]] == [
        ("fake", "fake-expert"), ("fake", "fake-random"), ("fake-expert", "fake-random")]
    assert result["n_family"] == 3 * len(CONDITIONS)
    # the expert always succeeds, the random policy never: their robustness rows say so
    expert, random_ = result["robustness"]["fake-expert"], result["robustness"]["fake-random"]
    assert expert["clean"]["macro_sr"] == 1.0 and random_["clean"]["macro_sr"] == 0.0
    assert expert["blur:L3"]["macro_dsr"] == 0.0 and expert["blur:L3"]["n_pairs"] == 8
    # Holm across the whole family: recompute it from the raw p-values
    raw = {(i, c): v["signflip"]["p"] for i, p in enumerate(result["pairs"]) for c, v in p["conditions"].items()}
    order = sorted(raw, key=lambda k: raw[k])
    running, expected = 0.0, {}
    for rank, key in enumerate(order):
        running = max(running, min(1.0, (len(raw) - rank) * raw[key]))
        expected[key] = running
    for (i, c), p_holm in expected.items():
        assert result["pairs"][i]["conditions"][c]["signflip"]["p_holm"] == pytest.approx(p_holm)
    # a pair's verdict in the family never claims more than the same pair alone
    cli("compare", str(runs / "fake-expert"), str(runs / "fake-random"), "--out", str(tmp_path / "alone"))
    alone = json.loads((tmp_path / "alone" / "compare.json").read_text())
    for c, v in result["pairs"][2]["conditions"].items():
        assert v["signflip"]["p_holm"] >= alone["conditions"][c]["signflip"]["p_holm"] - 1e-12
        assert v["verdict"] in (alone["conditions"][c]["verdict"], "UNDERPOWERED")
    assert (out / "robustness.png").stat().st_size > 5000
    text = (out / "compare.md").read_text()
    assert "| fake-expert | fake-random |" in text and "Holm across the family of 9" in text
    assert "fake-expert" in proc.stdout


def test_the_gate_takes_two_runs_only(runs):
    proc = cli("compare", *(str(runs / n) for n in ("fake", "fake-expert", "fake-random")), "--fail-on", "regressed",
               check=False)
    assert proc.returncode == 2 and "give two runs" in proc.stderr
    proc = cli("compare", str(runs / "fake"), check=False)
    assert proc.returncode == 2 and "two runs or more" in proc.stderr
