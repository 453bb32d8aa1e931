"""The branch-study analysis on a hand-made study whose horizons, tests and tallies are known."""

import json
from pathlib import Path

import pandas as pd
import pytest

from robocasa_shift.analysis.branching import (
    checkpoint_frame,
    condition_frame,
    fidelity_tally,
    load_branch_study,
    sensitivity_frame,
    sign_test,
    trunk_frame,
    write_outputs,
)
from robocasa_shift.analysis.recoverability import jeffreys_lower
from robocasa_shift.errors import AnalysisError
from robocasa_shift.report.branching import plot_condition, write_branch_outputs

PICK = ["reach_cube", "grasp_cube", "lift_cube"]
MANIFEST = {"settings": {"interventions": {"continue": None, "recover": "sha-r"}, "k_initial": 4, "k_expanded": 16,
                         "q": 0.25, "tau": 0.5, "taus": [0.3, 0.5, 0.7], "sigma": 0.05, "budget": "inherited",
                         "fresh_budget": None, "stride": 1},
            "selection": {"kinds": ["shift_failure"]}, "run_spec_hash": "abc"}


def key(task, episode, condition="blur:L3", replicate=0):
    return {"phase": "formal", "task": task, "episode": episode, "condition": condition, "replicate": replicate}


def trunk(k, stage_names, stage_steps, *, valid=True, reproduced=True, steps=60, selection="shift_failure"):
    done = sum(s is not None for s in stage_steps)
    return {**k, "selection": selection, "clean_success": True, "reproduced": reproduced,
            "mismatch": None if reproduced else "stage steps differ", "success": False, "steps": steps,
            "horizon": 60, "stage_names": stage_names, "stage_steps": stage_steps,
            "first_incomplete": None if done == len(stage_names) else done + 1,
            "valid": valid, "error": None, "error_kind": None, "wall_s": 1.0}


def entry(k, n=4, expanded=False):
    return {"k": k, "n": n, "expanded": expanded, "estimate": round(jeffreys_lower(k, n), 3), "script_steps": 0,
            "branches": [{"index": i, "seed": i, "success": i < k, "steps": 10, "stage_steps": [], "first_incomplete": 1,
                          "valid": True, "error": None} for i in range(n)]}


def checkpoint(k, step, by_name, *, ok=True, valid=True, branched=None):
    fidelity = None if not valid else {"ok": ok, "max_qpos_dev": 0.0 if ok else 0.02, "max_state_dev": 0.0 if ok else 0.05,
                                       "same_stages": ok, "same_outcome": True, "success": False, "steps": 60,
                                       "stage_steps": []}
    return {**k, "step": step, "snapshot_sha256": "0" * 64, "valid": valid, "error": None if valid else "boom",
            "error_kind": None if valid else "RuntimeError", "fidelity": fidelity,
            "branched": (ok and valid) if branched is None else branched,
            "interventions": {name: entry(ks) for name, ks in by_name.items()} if valid else {}, "wall_s": 2.0}


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def file_stem(k):
    return f"{k['phase']}/{k['task']}/{k['episode']:04d}__{k['condition'].replace(':', '-')}__r{k['replicate']}"


def make_study(root: Path) -> Path:
    """Five trunks of PickPlace under blur:L3 and one of Reach under clean; horizons known by hand.

    A (ep 0): continue k = 3, 1, 3, 0 of 4 at steps 0, 8, 16, 24 (estimates .576 .15 .576 .012): horizon 16,
      not 0 (the latest recoverable, not the first non-recoverable); recover k = 4, 4, 2, 0 (.856 .856
      .345 .012): horizon 8; combined 16. Step 32 has 4/4 under both but its replay failed: excluded.
      grasp_cube latched at 12, so the combined horizon closes 4 steps after it.
    B (ep 1): nothing reaches 0.5 (best .345 at tau 0.3); one invalid checkpoint.
    C (ep 2): continue horizon 8, recover 24 (shift +16); lift_cube never latched, grasp_cube at 20.
    D (ep 3): its re-run did not reproduce the record: no row.
    E (ep 4): invalid trunk: no row.
    R (Reach ep 0, clean): every subgoal latched (at 10); continue 4/4 at step 0 only: horizon 0,
      before any subgoal, so closes_after_steps is missing.
    """
    d = root / "branching" / "main"
    write(d / "manifest.json", MANIFEST)
    a, b, c, dd, e = (key("PickPlace", i) for i in range(5))
    r = key("Reach", 0, "clean")
    trunks = [trunk(a, PICK, [5, 12, None]), trunk(b, PICK, [4, None, None]), trunk(c, PICK, [6, 20, None]),
              trunk(dd, PICK, [5, None, None], reproduced=False), trunk(e, PICK, [None] * 3, valid=False),
              trunk(r, ["reach_goal"], [10])]
    for t in trunks:
        write(d / "trunks" / f"{file_stem(t)}.json", t)
    cps = [checkpoint(a, s, {"continue": kc, "recover": kr}) for s, kc, kr in
           ((0, 3, 4), (8, 1, 4), (16, 3, 2), (24, 0, 0))]
    cps.append(checkpoint(a, 32, {"continue": 4, "recover": 4}, ok=False, branched=True))  # must not count
    cps += [checkpoint(b, 0, {"continue": 0, "recover": 2}), checkpoint(b, 8, {"continue": 1, "recover": 0}),
            checkpoint(b, 16, {}, valid=False)]
    cps += [checkpoint(c, s, {"continue": kc, "recover": kr}) for s, kc, kr in
            ((0, 4, 4), (8, 3, 1), (16, 1, 1), (24, 0, 3), (32, 0, 0))]
    cps += [checkpoint(dd, 0, {"continue": 4, "recover": 4})]
    cps += [checkpoint(r, 0, {"continue": 4, "recover": 0}), checkpoint(r, 8, {"continue": 1, "recover": 1})]
    for cp in cps:
        write(d / "checkpoints" / file_stem(cp) / f"s{cp['step']:04d}.json", cp)
    return d


@pytest.fixture
def study_dir(tmp_path):
    return make_study(tmp_path / "run")


def row_of(frame, task, episode):
    return frame[(frame.task == task) & (frame.episode == episode)].iloc[0]


def test_the_horizon_is_the_latest_recoverable_checkpoint_per_intervention_and_for_the_repertoire(study_dir):
    frame = trunk_frame(load_branch_study(study_dir))
    a = row_of(frame, "PickPlace", 0)
    assert (a.continue_horizon, a.recover_horizon, a.combined_horizon) == (16, 8, 16)
    assert a.continue_recoverable and a.recover_recoverable and a.combined_recoverable
    assert a.failed_subgoal == "lift_cube" and a.first_incomplete == 3
    assert (a.last_subgoal, a.last_subgoal_step, a.closes_after_steps) == ("grasp_cube", 12, 4)
    assert (a.fidelity_ok, a.fidelity_checked, a.n_branched) == (4, 5, 4)  # step 32 failed its replay: left out
    c = row_of(frame, "PickPlace", 2)
    assert (c.continue_horizon, c.recover_horizon, c.combined_horizon) == (8, 24, 24)
    assert (c.last_subgoal, c.closes_after_steps) == ("grasp_cube", 4)


def test_a_trunk_with_nothing_recoverable_has_no_horizon_and_no_closing_step(study_dir):
    b = row_of(trunk_frame(load_branch_study(study_dir)), "PickPlace", 1)
    assert pd.isna(b.continue_horizon) and pd.isna(b.recover_horizon) and pd.isna(b.combined_horizon)
    assert not b.continue_recoverable and not b.recover_recoverable and not b.combined_recoverable
    assert pd.isna(b.last_subgoal) and pd.isna(b.closes_after_steps)
    assert b.failed_subgoal == "grasp_cube"
    assert (b.fidelity_ok, b.fidelity_checked) == (2, 2)  # the invalid checkpoint was never checked


def test_only_valid_reproduced_trunks_get_a_row_and_a_horizon_before_any_subgoal_has_no_closing_step(study_dir):
    frame = trunk_frame(load_branch_study(study_dir))
    assert sorted(zip(frame.task, frame.episode)) == [("PickPlace", 0), ("PickPlace", 1), ("PickPlace", 2), ("Reach", 0)]
    r = row_of(frame, "Reach", 0)
    assert pd.isna(r.failed_subgoal) and pd.isna(r.first_incomplete)
    assert r.combined_horizon == 0 and pd.isna(r.last_subgoal) and pd.isna(r.closes_after_steps)


def test_checkpoint_frame_has_one_row_per_usable_checkpoint_and_intervention(study_dir):
    frame = checkpoint_frame(load_branch_study(study_dir))
    a = frame[(frame.task == "PickPlace") & (frame.episode == 0)]
    assert sorted(set(a.step)) == [0, 8, 16, 24]  # 32: fidelity failed
    cont = a[a.intervention == "continue"].sort_values("step")
    assert list(cont.k) == [3, 1, 3, 0] and set(cont.n) == {4}
    assert list(cont.estimate) == [0.576, 0.15, 0.576, 0.012]
    # 4 + 2 (B, invalid one dropped) + 5 + 1 (D: its checkpoints are usable; the trunk is not) + 2, two interventions
    assert len(frame) == 2 * (4 + 2 + 5 + 1 + 2)


def test_condition_frame_counts_medians_and_the_sign_test(study_dir):
    study = load_branch_study(study_dir)
    frame = condition_frame(trunk_frame(study), study.interventions)
    pick = frame[(frame.task == "PickPlace") & (frame.condition == "blur:L3")].iloc[0]
    assert pick.n_trunks == 3
    assert (pick.continue_recoverable, pick.recover_recoverable, pick.combined_recoverable) == (2, 2, 2)
    assert pick.continue_median_horizon == 12.0 and pick.recover_median_horizon == 16.0
    assert (pick.continue_horizon_q1, pick.continue_horizon_q3) == (10.0, 14.0)
    # shifts recover - continue: A 8 - 16 = -8, C 24 - 8 = +16
    assert (pick.shift_n_both, pick.shift_n_pos, pick.shift_n_neg, pick.shift_median, pick.shift_p) == (2, 1, 1, 4.0, 1.0)
    assert set(frame[frame.task == "all"].condition) == {"clean", "blur:L3"}


def test_the_sign_test_is_exact_two_sided_and_drops_zeros():
    # the paper's 11 positive and 2 negative shifts: p = 2 * (1 + 13 + 78) / 2**13
    result = sign_test([40] * 11 + [-8, -16] + [0, 0])
    assert (result["n"], result["n_pos"], result["n_neg"], result["n_zero"]) == (15, 11, 2, 2)
    assert result["p"] == pytest.approx(184 / 8192)
    assert result["median"] == 40.0
    assert sign_test([0, 0])["p"] is None


def test_condition_frame_runs_the_sign_test_on_trunks_defined_under_both():
    rows = []
    for i, (c, r) in enumerate([(8, 24), (16, 40), (0, 8), (8, 16), (24, 32), (16, 24), (8, None), (None, 16), (8, 8)]):
        rows.append({"task": "T", "condition": "blur:L1", "episode": i, "continue_horizon": c, "recover_horizon": r,
                     "combined_horizon": max(v for v in (c, r) if v is not None)})
    frame = pd.DataFrame(rows)
    for name in ("continue", "recover", "combined"):
        frame[f"{name}_horizon"] = frame[f"{name}_horizon"].astype("Int64")
        frame[f"{name}_recoverable"] = frame[f"{name}_horizon"].notna()
    row = condition_frame(frame, ["continue", "recover"]).iloc[0]
    assert (row.shift_n_both, row.shift_n_pos, row.shift_n_neg, row.shift_n_zero) == (7, 6, 0, 1)
    assert row.shift_p == pytest.approx(2 / 64)
    assert row.shift_median == 8.0
    assert (row.continue_recoverable, row.recover_recoverable, row.combined_recoverable) == (8, 8, 9)
    no_shift = condition_frame(frame, ["continue"])
    assert "shift_p" not in no_shift.columns


def test_tau_sensitivity_counts_a_0345_estimate_at_03_only(study_dir):
    study = load_branch_study(study_dir)
    a = {tau: row_of(trunk_frame(study, tau), "PickPlace", 0) for tau in (0.3, 0.5, 0.7)}
    assert a[0.3].recover_horizon == 16 and a[0.5].recover_horizon == 8 and a[0.7].recover_horizon == 8
    assert pd.isna(a[0.7].continue_horizon)
    b = row_of(trunk_frame(study, 0.3), "PickPlace", 1)
    assert b.recover_horizon == 0 and b.combined_recoverable
    frame = sensitivity_frame(study)
    pick = frame[(frame.task == "PickPlace")].set_index("tau")
    assert list(pick.index) == [0.3, 0.5, 0.7]
    assert list(pick.recover_recoverable) == [3, 2, 2]
    assert list(pick.continue_recoverable) == [2, 2, 1]  # A at .576 only below 0.7; B never


def test_fidelity_tally_counts_checked_checkpoints_and_the_largest_deviation(study_dir):
    tally = fidelity_tally(load_branch_study(study_dir))
    assert (tally["ok"], tally["checked"], tally["invalid"], tally["checkpoints"]) == (14, 15, 1, 16)
    assert tally["max_qpos_dev"] == 0.02 and tally["max_state_dev"] == 0.05
    assert tally["failed"] == [{"trunk": "formal/PickPlace/0000__blur-L3__r0", "step": 32, "same_stages": False,
                                "same_outcome": True}]
    assert (tally["trunks"], tally["trunks_valid"], tally["trunks_reproduced"]) == (6, 5, 4)


def test_write_outputs_writes_a_parsable_summary_markdown_and_one_png_per_task_and_condition(study_dir):
    assert write_outputs(study_dir)["figures"] == [] and not (study_dir / "figures").exists()  # analysis draws none
    summary = write_branch_outputs(study_dir)
    parsed = json.loads((study_dir / "summary.json").read_text())
    assert parsed == json.loads(json.dumps(summary))
    assert parsed["fidelity"]["ok"] == 14 and parsed["tau"] == 0.5 and parsed["interventions"] == ["continue", "recover"]
    a = next(t for t in parsed["trunks"] if t["trunk"] == "formal/PickPlace/0000__blur-L3__r0")
    assert (a["continue_horizon"], a["recover_horizon"], a["combined_horizon"], a["closes_after_steps"]) == (16, 8, 16, 4)
    b = next(t for t in parsed["trunks"] if t["episode"] == 1)
    assert b["combined_horizon"] is None and b["closes_after_steps"] is None  # NaN/NA as null
    assert {e["reason"] for e in parsed["excluded_trunks"]} == {"not reproduced", "invalid"}
    assert sorted(f["file"] for f in parsed["figures"]) == ["figures/PickPlace__blur-L3.png", "figures/Reach__clean.png"]
    for f in parsed["figures"]:
        assert (study_dir / f["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (study_dir / "summary.md").read_text()
    assert "14/15 restored checkpoints reproduced their trunk" in md
    assert "PickPlace, blur:L3: recovery closes 4 steps after grasp_cube latched (median over 2 trunks)" in md
    assert "PickPlace, blur:L3: 1 of 3 trunks have no recoverable checkpoint" in md
    assert "Reach, clean: on 1 trunk the horizon comes before any subgoal latched" in md
    assert "| task | condition | n_trunks |" in md


def test_plot_condition_writes_a_png(study_dir, tmp_path):
    study = load_branch_study(study_dir)
    path = plot_condition(study, "PickPlace", "blur:L3", tmp_path / "fig" / "x.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = plot_condition(study, "PickPlace", "blur:L1", tmp_path / "fig" / "none.png")  # no trunk: still a figure
    assert empty.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("breakage, match", [
    (lambda p: p.write_text("{\"step\": 0,"), "not JSON"),
    (lambda p: p.write_text("[1, 2]"), "expected a JSON object"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "step": "eight"})), "field 'step'"),
    (lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "task"})), "task"),
])
def test_a_malformed_checkpoint_file_is_refused_naming_the_file(study_dir, breakage, match):
    path = study_dir / "checkpoints" / "formal" / "PickPlace" / "0001__blur-L3__r0" / "s0008.json"
    breakage(path)
    with pytest.raises(AnalysisError, match=match) as info:
        load_branch_study(study_dir)
    assert str(path) in str(info.value)


def test_an_estimate_that_is_not_the_jeffreys_quantile_of_its_counts_is_refused(study_dir):
    path = study_dir / "checkpoints" / "formal" / "PickPlace" / "0000__blur-L3__r0" / "s0016.json"
    data = json.loads(path.read_text())
    data["interventions"]["continue"]["estimate"] = 0.9  # k = 3 of 4 gives 0.576
    path.write_text(json.dumps(data))
    with pytest.raises(AnalysisError, match=r"s0016.json: intervention 'continue': estimate 0.9"):
        load_branch_study(study_dir)


def test_a_malformed_trunk_or_a_missing_manifest_is_refused(study_dir, tmp_path):
    path = study_dir / "trunks" / "formal" / "Reach" / "0000__clean__r0.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "stage_steps": [1, 2]}))
    with pytest.raises(AnalysisError, match="0000__clean__r0.json: 'stage_names' and 'stage_steps'"):
        load_branch_study(study_dir)
    with pytest.raises(AnalysisError, match="no manifest.json"):
        load_branch_study(tmp_path / "nothing")


def test_the_report_shows_a_branching_section_when_a_summary_exists(study_dir):
    from robocasa_shift.report.page import build_report
    from robocasa_shift.report.studies import branching_sections

    run_dir = study_dir.parent.parent
    assert branching_sections(run_dir) == []  # no summary yet: no section
    write_branch_outputs(study_dir)
    from robocasa_shift.rundir.store import RunStore

    RunStore(run_dir).ensure_manifest({"backend": "fake", "policy": {"name": "fake"}})  # report needs a run directory
    page = build_report(run_dir, videos_per_kind=0, n_boot=100).read_text()
    assert "<h2>Counterfactual branching</h2>" in page
    assert "Replay fidelity: 14/15 restored checkpoints reproduced their trunk" in page
    assert "<td>PickPlace</td><td>blur:L3</td><td>3</td><td>2/3</td><td>12 (10-14)</td>" in page
    assert "src='../branching/main/figures/PickPlace__blur-L3.png'" in page
    assert (run_dir / "report" / "../branching/main/figures/PickPlace__blur-L3.png").resolve().is_file()
    assert "recovery closes 4 steps after grasp_cube latched" in page


def test_the_report_says_so_when_a_branch_summary_cannot_be_read(tmp_path):
    from robocasa_shift.report.studies import branching_sections

    (tmp_path / "branching" / "broken").mkdir(parents=True)
    (tmp_path / "branching" / "broken" / "summary.json").write_text("{")
    html = "".join(branching_sections(tmp_path))
    assert "summary.json cannot be read" in html
