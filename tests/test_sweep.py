"""Severity sweeps: the derived spec, bisection against the brute-force grid, the curve and its confirmation."""

import json
import math

import pytest
from click.testing import CliRunner

from robocasa_shift.cli import main
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.errors import BadInput, SpecError
from robocasa_shift.sweep import curve as curves
from robocasa_shift.sweep.search import BROKE, FAILED_CLEAN, NEVER_BROKE, EpisodeBreak, find_break
from robocasa_shift.sweep.spec import derived_content, grid_severities, severity_params, write_derived_spec
from robocasa_shift.sweep.study import run_sweep

FAKE = StudyConfig(backend="fake", policy="fake")


def test_severity_interpolates_the_frozen_levels_and_refuses_what_is_off_the_dial():
    protocol = specs.load_protocol()
    camera, blur = protocol.factor("camera"), protocol.factor("blur")
    for k, level in enumerate(["L1", "L2", "L3"], start=1):
        assert severity_params(camera, k) == camera.level(level)
    assert severity_params(camera, 1.5)["theta_max_deg"] == pytest.approx(4.0)  # between 2 and 6 degrees
    assert severity_params(blur, 0.5)["sigma_px"] == pytest.approx(0.5)  # between nominal 0 and L1's 1 px
    content = derived_content(protocol, "blur", [0.5, 1.0, 2.5])
    ranges = content["blur.yaml"]["options"]["sharpness_ratio_range"]
    frozen = blur.options["sharpness_ratio_range"]
    assert ranges["L2"] == frozen["L1"]  # severity 1 is L1 itself
    assert ranges["L3"] == [min(frozen["L2"][0], frozen["L3"][0]), max(frozen["L2"][1], frozen["L3"][1])]
    assert ranges["L1"] == [frozen["L1"][0], 1.0]  # up to an unblurred image
    for bad in ([0.0], [3.5], [1.0, 1.0], [float("nan")]):
        with pytest.raises(BadInput):
            derived_content(protocol, "camera", bad)
    with pytest.raises(BadInput, match="language"):
        derived_content(protocol, "language", [1.0])


def test_derived_spec_is_written_frozen_and_refused_when_another_sweep_owns_the_directory(tmp_path):
    protocol = specs.load_protocol()
    derived = write_derived_spec(tmp_path, protocol, "camera", [1.0, 2.0, 3.0])
    assert [derived.factor("camera").level(f"L{k}") for k in (1, 2, 3)] == \
        [protocol.factor("camera").level(f"L{k}") for k in (1, 2, 3)]
    assert derived.study_seed == protocol.study_seed  # the same draws per base episode
    origin = json.loads((tmp_path / "sweep/spec/derived.json").read_text())
    assert origin["frozen_spec_hash"] == protocol.spec_hash and origin["derived_spec_hash"] == derived.spec_hash
    assert write_derived_spec(tmp_path, protocol, "camera", [3.0, 1.0, 2.0]).spec_hash == derived.spec_hash
    with pytest.raises(SpecError, match="new --run-dir"):
        write_derived_spec(tmp_path, protocol, "camera", [1.0, 3.0])


def test_find_break_on_a_hand_made_table_sees_non_monotone_episodes_only_on_the_grid():
    table = {  # episode -> success at clean (-1) and at levels 0..5
        0: [True, True, True, False, False, False, False],   # monotone, breaks at level 2
        1: [True, True, True, True, True, True, True],       # never broke
        2: [False, True, True, True, True, True, True],      # failed clean
        3: [True, True, False, True, False, False, False],   # breaks at 1, success returns at 2
    }
    for ep, row in table.items():
        asked = []

        def outcome(i, row=row):
            asked.append(i)
            return row[i + 1]
        grid = find_break(ep, 6, outcome, "grid")
        bisect = find_break(ep, 6, lambda i, row=row: row[i + 1], "bisect")
        assert asked.count(-1) == 1  # the clean twin runs once
        assert grid.verdict == bisect.verdict
        if ep != 3:
            assert (grid.critical, grid.non_monotone) == (bisect.critical, False)
    assert find_break(0, 6, lambda i: table[0][i + 1], "grid").critical == 2
    assert find_break(2, 6, lambda i: table[2][i + 1]).verdict == FAILED_CLEAN
    assert find_break(1, 6, lambda i: table[1][i + 1]).verdict == NEVER_BROKE
    assert find_break(1, 6, lambda i: table[1][i + 1]).rollouts == 2  # clean and the top level
    non_monotone = find_break(3, 6, lambda i: table[3][i + 1], "grid")
    assert (non_monotone.critical, non_monotone.non_monotone) == (1, True)


def test_bisection_equals_the_brute_force_grid_on_fake(tmp_path):
    grid = grid_severities(specs.load_protocol(), "camera", 8)
    episodes = range(10)
    dense = run_sweep(tmp_path / "grid", "Reach", "camera", episodes, grid, FAKE, mode="grid")
    halved = run_sweep(tmp_path / "bisect", "Reach", "camera", episodes, grid, FAKE, mode="bisect")
    by_episode = {e["episode"]: e for e in halved["episodes"]}
    verdicts = set()
    for e in dense["episodes"]:
        if not e["non_monotone"]:
            assert (by_episode[e["episode"]]["verdict"], by_episode[e["episode"]]["critical"]) == \
                (e["verdict"], e["critical"]), e["episode"]
        verdicts.add(e["verdict"])
    assert {BROKE, NEVER_BROKE} <= verdicts  # the comparison covers both kinds of episode
    assert dense["curve"]["non_monotone"] == [e["episode"] for e in dense["episodes"] if e["non_monotone"]]
    assert dense["cost"]["rollouts"] == dense["cost"]["dense_grid_rollouts"] == 10 * 9
    assert halved["cost"]["rollouts"] < dense["cost"]["rollouts"] / 2
    assert halved["curve"]["points"] == dense["curve"]["points"]
    broke = [e for e in halved["episodes"] if e["verdict"] == BROKE]
    assert all(e["broke_at_stage"] for e in broke)


def test_survival_curve_bands_and_median_from_known_breaking_points():
    severities = [1.0, 2.0, 3.0]
    breaks = [EpisodeBreak(i, BROKE, critical=i % 3, outcomes={-1: True}) for i in range(9)]
    breaks += [EpisodeBreak(9, NEVER_BROKE, outcomes={-1: True}), EpisodeBreak(10, FAILED_CLEAN)]
    c = curves.survival_curve(breaks, severities)
    assert c["n"] == 10 and c["failed_clean"] == 1 and c["never_broke"] == 1
    assert [p["surviving"] for p in c["points"]] == [7, 4, 1]
    for p in c["points"]:
        lo, hi = p["pointwise"]
        slo, shi = p["simultaneous"]
        assert lo <= p["rate"] <= hi and slo <= lo and shi >= hi  # the simultaneous band is the wider one
    med = c["median_breaking_point"]
    assert med["median"] == 2.0 and med["interval"][0] <= 2.0 <= med["interval"][1] and med["coverage"] >= 0.95


def test_confirmation_passes_on_the_same_rates_and_fails_on_opposite_ones():
    severities = [1.0, 2.0]
    breaks = [EpisodeBreak(i, BROKE if i < 20 else NEVER_BROKE, critical=1 if i < 20 else None) for i in range(40)]
    c = curves.survival_curve(breaks, severities)  # survival 1.0 at 1, 0.5 at 2
    same = curves.confirm(c, {1.0: [True] * 40, 2.0: [True, False] * 20})
    assert same["passed"]
    flipped = curves.confirm(c, {1.0: [False] * 40, 2.0: [True, False] * 20})
    assert not flipped["passed"] and [p["confirmed"] for p in flipped["points"]] == [False, True]


def test_held_out_confirmation_on_fake_runs_the_confirmation_stream(tmp_path):
    grid = grid_severities(specs.load_protocol(), "camera", 4)
    summary = run_sweep(tmp_path, "Reach", "camera", range(12), grid, FAKE, confirm_episodes=range(12),
                        confirm_severities=[grid[1], grid[3]])
    conf = summary["confirmation"]
    assert conf["passed"], conf
    assert json.loads((tmp_path / "sweep/confirmation.json").read_text())["severities"] == [grid[1], grid[3]]
    assert any(p.name.startswith("0000") for p in (tmp_path / "records/confirmation/Reach").iterdir())
    with pytest.raises(BadInput, match="declared once"):
        run_sweep(tmp_path, "Reach", "camera", range(12), grid, FAKE, confirm_episodes=range(12),
                  confirm_severities=[grid[3]])


def test_sweep_command_refuses_bad_input_with_exit_2(tmp_path):
    runner = CliRunner()
    base = ["sweep", "--backend", "fake", "--policy", "fake", "--task", "Reach", "--run-dir", str(tmp_path / "r")]
    both = runner.invoke(main, base + ["--factor", "camera", "--grid", "4", "--resolution", "0.5"])
    assert both.exit_code == 2 and "exactly one" in both.output
    off = runner.invoke(main, base + ["--factor", "camera", "--severities", "1,4"])
    assert off.exit_code == 2 and "outside" in off.output
    assert not (tmp_path / "r").exists()
    ok = runner.invoke(main, base + ["--factor", "blur", "--episodes", "0-2", "--grid", "3"])
    assert ok.exit_code == 0, ok.output
    summary = json.loads((tmp_path / "r/sweep/summary.json").read_text())
    assert summary["factor"] == "blur" and math.isclose(summary["severities"][-1], 3.0)


def test_report_sections_show_the_breaking_points_and_refuse_a_broken_summary(tmp_path):
    from robocasa_shift.report.studies import sweep_sections

    grid = grid_severities(specs.load_protocol(), "camera", 2)
    run_sweep(tmp_path, "Reach", "camera", range(3), grid, StudyConfig(backend="fake", policy="fake", log_steps=True),
              confirm_episodes=range(3), confirm_severities=[grid[1]])
    html = "".join(sweep_sections(tmp_path))
    assert "<h2>Breaking points</h2>" in html and "<h2>Behaviour</h2>" in html and "camera:L2" in html
    (tmp_path / "sweep/summary.json").write_text("{not json")
    assert "cannot be read" in "".join(sweep_sections(tmp_path))
    assert sweep_sections(tmp_path / "nowhere") == []


def test_audit_rederives_the_sweep_spec_and_fails_a_tampered_copy(tmp_path):
    from robocasa_shift.checks.audit import audit_run

    grid = grid_severities(specs.load_protocol(), "camera", 2)
    run_sweep(tmp_path, "Reach", "camera", range(3), grid, FAKE)
    assert audit_run(tmp_path).passed
    spec_dir = tmp_path / "sweep/spec"
    text = (spec_dir / "camera.yaml").read_text()
    doubled = text.replace("theta_max_deg: 10.0", "theta_max_deg: 20.0")
    assert doubled != text
    (spec_dir / "camera.yaml").write_text(doubled)
    (spec_dir / "spec.lock").unlink()
    specs.freeze(spec_dir)  # a copy consistent with its own lock, but not what the frozen spec gives
    result = audit_run(tmp_path)
    assert not result.passed
    assert "not the one its frozen spec" in (tmp_path / "audit.md").read_text()
    (spec_dir / "derived.json").write_bytes(b"\xff" * 10)
    assert not audit_run(tmp_path).passed  # a forged record of the derivation: named, never a traceback
    (spec_dir / "derived.json").unlink()
    (spec_dir / "derived.json").symlink_to("/dev/zero")
    assert not audit_run(tmp_path).passed


def test_a_success_whose_stage_spec_asks_more_is_named_apart_never_read_as_a_stage(tmp_path, monkeypatch):
    """A stage spec stricter than the success check (as Lift's reach: the grasp site within 2 cm of the cube's centre,
    while a grasp at the cube's edge lifts it) leaves successes with no subgoal latched: the sweep and the audit name
    them with their first unlatched subgoal, and they stay successes."""
    import shutil

    from robocasa_shift.checks.audit import audit_run

    stage_dir = tmp_path / "stage_specs"
    shutil.copytree(specs.STAGE_SPECS_DIR, stage_dir)
    path = stage_dir / "fake" / "Reach.yaml"
    strict = path.read_text().replace("args: {distance_m: 0.08}", "args: {distance_m: 0.0001}")
    assert strict != path.read_text()
    path.write_text(strict)
    monkeypatch.setattr(specs, "STAGE_SPECS_DIR", stage_dir)
    grid = grid_severities(specs.load_protocol(), "camera", 2)
    summary = run_sweep(tmp_path / "run", "Reach", "camera", range(4), grid, FAKE, mode="grid")
    successes = [(e["episode"], int(level)) for e in summary["episodes"] for level, ok in e["outcomes"].items() if ok]
    unlatched = summary["unlatched_successes"]
    assert successes and len(unlatched) == len(successes)
    assert {u["first_unlatched"] for u in unlatched} == {"approach_object"}
    assert {(u["episode"], u["severity"]) for u in unlatched} == \
        {(ep, grid[level] if level >= 0 else 0.0) for ep, level in successes}
    result = audit_run(tmp_path / "run")
    assert result.passed  # a note, not a failure: the protocol lets the tracker and the success check differ
    assert len(result.details["tasks"]["Reach"]["unlatched_successes"]) == len(successes)
    assert "did not latch" in (tmp_path / "run/audit.md").read_text()
    from robocasa_shift.report.studies import sweep_sections

    assert f"counted as successes): {len(successes)}." in "".join(sweep_sections(tmp_path / "run"))
    monkeypatch.undo()
    plain = run_sweep(tmp_path / "plain", "Reach", "camera", range(4), grid, FAKE, mode="grid")
    assert plain["unlatched_successes"] == []
