"""Branch studies beyond horizons, on hand-made studies with answers worked out by hand: non-monotone
recoverability, the fixed-K agreement, horizons relative to task events, expected cost per (state,
intervention); and the fake backend's end-to-end path (--k-fixed, events recorded with the trunk, audit)."""

import json
import math
from pathlib import Path

import pytest
from helpers import cli

from robocasa_shift.analysis import branching as ab
from robocasa_shift.analysis.recoverability import jeffreys_lower
from robocasa_shift.backends import get_backend
from robocasa_shift.branching.checkpoints import BranchSettings, record_trunk
from robocasa_shift.branching.events import trunk_events
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import BadInput
from robocasa_shift.policies import make_policy

MANIFEST = {"settings": {"interventions": {"continue": None, "recover": "sha-r"}, "k_initial": 4, "k_expanded": 16,
                         "q": 0.25, "tau": 0.5, "taus": [0.3, 0.5, 0.7], "sigma": 0.05, "budget": "inherited",
                         "fresh_budget": None, "stride": 1, "k_fixed": 32}}


def key(task="PickPlace", episode=0, condition="base:L3"):
    return {"phase": "formal", "task": task, "episode": episode, "condition": condition, "replicate": 0}


def trunk(k, events=None):
    return {**k, "selection": "shift_failure", "clean_success": True, "reproduced": True, "mismatch": None,
            "success": False, "steps": 60, "horizon": 60, "stage_names": ["grasp", "carry", "release"],
            "stage_steps": [10, None, None], "first_incomplete": 2, "valid": True, "error": None, "error_kind": None,
            "events": events}


def entry(k, n=4, fixed=None, steps=None, step=0):
    """k of n branches succeed (a success ends at ``steps[0]``, a failure at ``steps[1]``)."""
    done, failed = steps or (step + 10, 60)
    out = {"k": k, "n": n, "expanded": n > 4, "estimate": jeffreys_lower(k, n), "script_steps": 0,
           "branches": [{"index": i, "seed": i, "success": i < k, "steps": done if i < k else failed, "valid": True}
                        for i in range(n)]}
    if fixed is not None:
        out["fixed"] = {"k": fixed, "n": 32, "estimate": jeffreys_lower(fixed, 32), "branches": []}
    return out


def checkpoint(k, step, interventions):
    return {**k, "step": step, "snapshot_sha256": "0" * 64, "valid": True, "error": None, "error_kind": None,
            "fidelity": {"ok": True, "max_qpos_dev": 0.0, "max_state_dev": 0.0, "same_stages": True,
                         "same_outcome": True}, "branched": True, "interventions": interventions, "wall_s": 1.0}


def write_study(root: Path, trunks, checkpoints) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(MANIFEST))
    for i, t in enumerate(trunks):
        path = root / "trunks" / f"t{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(t))
    for i, c in enumerate(checkpoints):
        path = root / "checkpoints" / f"c{i:03d}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(c))
    return root


# --------------------------------------------------------------------------- item 9: non-monotone


def test_the_monotone_fit_pools_a_rise_and_the_likelihood_ratio_is_worked_out_by_hand():
    assert ab.antitonic_fit([0, 16], [16, 16]).tolist() == [0.5, 0.5]
    assert ab.antitonic_fit([16, 8, 0], [16, 16, 16]).tolist() == [1.0, 0.5, 0.0]
    assert ab.antitonic_fit([4, 0, 4, 0], [4, 4, 4, 4]).tolist() == [1.0, 0.5, 0.5, 0.0]
    # 0/16 then 16/16 against the pooled 1/2: G = 2 (0 - 32 ln 1/2) = 64 ln 2
    assert ab.monotone_statistic([0, 16], [16, 16]) == pytest.approx(64 * math.log(2))
    test = ab.nonmonotone_test([0, 16], [16, 16], n_perm=500, seed=0)
    # exact given the 16 successes: of the C(32, 16) allocations only 0/16 then 16/16 is as far from non-increasing
    assert test["exact"] and test["p"] == pytest.approx(1 / math.comb(32, 16))
    assert ab.nonmonotone_test([16, 8, 0], [16, 16, 16]) == {"statistic": 0.0, "p": 1.0, "fitted": [1.0, 0.5, 0.0],
                                                             "exact": True}
    assert ab.has_pattern([True, False, True]) and ab.has_pattern([False, True, False, False, True])
    assert not ab.has_pattern([True, True, False]) and not ab.has_pattern([False, False, True])


def test_non_monotone_trunks_are_counted_per_intervention(tmp_path):
    a, b = key(episode=0), key(episode=1)
    checkpoints = [
        # trunk a, continue: 4/4, 0/4, 4/4 (fixed K: 32/32, 0/32, 32/32): recoverable, not, again, significant
        checkpoint(a, 0, {"continue": entry(4, fixed=32), "recover": entry(0, fixed=0)}),
        checkpoint(a, 8, {"continue": entry(0, fixed=0), "recover": entry(0, fixed=0)}),
        checkpoint(a, 16, {"continue": entry(4, fixed=32), "recover": entry(0, fixed=0)}),
        # trunk b: monotone, falling
        checkpoint(b, 0, {"continue": entry(4, fixed=30), "recover": entry(4, fixed=32)}),
        checkpoint(b, 8, {"continue": entry(3, fixed=20), "recover": entry(0, fixed=0)}),
        checkpoint(b, 16, {"continue": entry(0, fixed=1), "recover": entry(0, fixed=0)}),
    ]
    study = ab.load_branch_study(write_study(tmp_path / "s", [trunk(a), trunk(b)], checkpoints))
    frame = ab.nonmonotone_frame(study, n_perm=200)
    cont = frame[frame["intervention"] == "continue"].set_index("trunk")
    label_a, label_b = ab.trunk_label(a), ab.trunk_label(b)
    assert cont.loc[label_a, "pattern"] and cont.loc[label_a, "significant"] and cont.loc[label_a, "counts_from"] == "fixed K"
    assert not cont.loc[label_b, "pattern"] and cont.loc[label_b, "p"] == 1.0
    summary = {s["intervention"]: s for s in ab.nonmonotone_summary(frame)}
    assert (summary["continue"]["trunks"], summary["continue"]["pattern"], summary["continue"]["significant"]) == (2, 1, 1)
    assert summary["recover"]["significant"] == 0

    # item 10 on the same study: the adaptive rule vs fixed K = 32, checkpoint by checkpoint
    fixed = ab.fixed_k_frame(study)
    # trunk b, continue at step 8: 3/4 (estimate .576, recoverable) but 20/32 (lower quartile .568: recoverable too);
    # at step 0 recover 4/4 and 32/32 agree; nothing disagrees except where the two sides straddle tau
    assert len(fixed) == 12 and fixed["agree"].all()
    summary = {s["intervention"]: s for s in ab.fixed_k_summary(fixed)}
    assert summary["continue"]["disagree"] == 0 and summary["continue"]["horizon_moved"] == 0


def test_the_fixed_k_reference_disagrees_where_four_lucky_branches_pass_tau(tmp_path):
    a = key()
    # 3/4 passes tau 0.5 (.576) while 12/32 (lower quartile about .32) does not: one disagreement, the horizon moves
    checkpoints = [checkpoint(a, 0, {"continue": entry(4, fixed=32)}), checkpoint(a, 8, {"continue": entry(3, fixed=12)})]
    study = ab.load_branch_study(write_study(tmp_path / "s", [trunk(a)], checkpoints))
    fixed = ab.fixed_k_frame(study)
    row = fixed[fixed["step"] == 8].iloc[0]
    assert row["recoverable"] and not row["recoverable_fixed"] and not row["agree"]
    assert jeffreys_lower(12, 32) < 0.5 < jeffreys_lower(3, 4)
    summary = ab.fixed_k_summary(fixed)[0]
    assert (summary["checkpoints"], summary["disagree"], summary["any_recoverable_changed"], summary["horizon_moved"]) \
        == (2, 1, 0, 1)


# --------------------------------------------------------------------------- items 11 and 12


def test_horizons_are_placed_relative_to_task_events_and_every_checkpoint_is_priced(tmp_path):
    a, b = key(episode=0), key(episode=1)
    trunks = [trunk(a, {"grasp_attempt": 12, "drop": 30, "target_contact": None}),
              trunk(b, {"grasp_attempt": 4, "drop": None, "target_contact": None})]
    checkpoints = [checkpoint(a, 16, {"continue": entry(4, steps=(40, 60), step=16)}),
                   checkpoint(a, 24, {"continue": entry(0, step=24)}),
                   checkpoint(b, 8, {"continue": entry(4, steps=(50, 60), step=8)})]
    study = ab.load_branch_study(write_study(tmp_path / "s", trunks, checkpoints))
    frame = ab.trunk_frame(study)
    assert frame["horizon_minus_grasp_attempt"].tolist() == [4, 4]  # 16 - 12 and 8 - 4
    assert frame["horizon_minus_drop"].tolist()[0] == -14  # 16 - 30: the horizon closes 14 steps before the drop
    events = {(e["event"]): e for e in ab.event_summary(frame)}
    assert events["grasp_attempt"]["median"] == 4 and events["grasp_attempt"]["n"] == 2
    assert "14 steps before the first drop" in events["drop"]["text"]
    assert events["target_contact"]["n"] == 0

    # prices: PickPlace clean successes of 100 steps -> c = 0.1 / 100; the base:L3 cell: 1 success (100 steps),
    # 1 failure (60): A = (0.001 x 160 + 1) / 1 = 1.16
    records = [{"valid": True, "phase": "formal", "task": "PickPlace", "condition": "clean", "success": True,
                "steps": 100}, {"valid": True, "phase": "formal", "task": "PickPlace", "condition": "base:L3",
                                "success": True, "steps": 100},
               {"valid": True, "phase": "formal", "task": "PickPlace", "condition": "base:L3", "success": False,
                "steps": 60}]
    workload = ab.workload_costs(records)
    assert workload[("PickPlace", "base:L3")]["c"] == pytest.approx(0.001)
    assert workload[("PickPlace", "base:L3")]["A"] == pytest.approx(1.16)
    costs = ab.cost_frame(study, workload).set_index(["trunk", "step"])
    first = costs.loc[(ab.trunk_label(a), 16)]
    # every branch succeeds at step 40: c x (40 - 16) = 0.024; stopping costs R + A = 2.16
    assert first["Q_continue"] == pytest.approx(0.024) and first["Q_stop"] == pytest.approx(2.16)
    assert first["best"] == "continue"
    second = costs.loc[(ab.trunk_label(a), 24)]
    # every branch fails at 60: c x 36 + R + A = 0.036 + 2.16 > stopping now
    assert second["Q_continue"] == pytest.approx(2.196) and second["best"] == "stop"
    summary = {(s["task"], s["condition"]): s for s in ab.cost_summary(ab.cost_frame(study, workload))}
    assert summary[("PickPlace", "base:L3")]["best"] == {"continue": 2, "stop": 1}
    assert ab.cost_frame(study, {})["Q_stop"].isna().all()  # no run records: nothing priced

    out = ab.write_outputs(tmp_path / "s", workload=workload)
    assert out["expected_cost"]["summary"] and out["events"]["summary"] and "nonmonotone" in out
    text = (tmp_path / "s" / "summary.md").read_text()
    for heading in ("## Non-monotone recoverability", "## Adaptive K against a fixed-K reference",
                    "## Horizons relative to task events", "## Expected cost per (checkpoint, intervention)"):
        assert heading in text


def test_task_events_replay_the_trunks_states_through_the_simulator_predicates():
    protocol, backend = specs.load_protocol(), get_backend("fake")
    env = backend.make("PickPlace")
    spec = specs.load_stage_spec("fake", "PickPlace")
    found = None
    for episode in range(6):  # the first fake-expert trunk that grasps: attempt before the grasp latch
        record, tape = record_trunk(env, make_policy("fake-expert"), RolloutKey("formal", "PickPlace", episode, "clean"),
                                    protocol, spec, "fake")
        events = trunk_events(env, tape, spec, "fake")
        if record.stage_steps[0] is not None:
            found = (record, tape, events)
            break
    assert found is not None
    record, tape, events = found
    closing = [i for i, a in enumerate(tape.actions) if env.action_layout.closing(a)]
    assert events["grasp_attempt"] == closing[0] and events["grasp_attempt"] < record.stage_steps[0]
    assert events["defined"] == {"grasp_attempt": True, "drop": True, "target_contact": True}
    assert events["drop"] is None  # the expert never lets go while still closing
    assert events["target_contact"] is not None and events["target_contact"] <= record.steps


def test_task_events_read_the_target_contact_through_the_env_contract_and_leave_it_undefined_without_it():
    from robocasa_shift.backends.fake import FakeEnv

    class WithoutTaskEvents(FakeEnv):
        target_contact = None  # the capability not offered

    protocol, backend = specs.load_protocol(), get_backend("fake")
    spec = specs.load_stage_spec("fake", "PickPlace")
    env = backend.make("PickPlace")
    for episode in range(6):
        record, tape = record_trunk(env, make_policy("fake-expert"), RolloutKey("formal", "PickPlace", episode, "clean"),
                                    protocol, spec, "fake")
        if record.success:
            break
    assert record.success
    events = trunk_events(env, tape, spec, "fake")
    assert events["defined"]["target_contact"] and events["target_contact"] is not None
    blind = WithoutTaskEvents(backend.tasks["PickPlace"])
    events = trunk_events(blind, tape, spec, "fake")
    assert events["defined"]["target_contact"] is False and events["target_contact"] is None
    assert events["grasp_attempt"] is not None  # the other events do not need the capability
    reach = backend.make("Reach")  # a task without a target: the capability says None, the event is undefined
    assert reach.target_contact() is None
    assert trunk_events(reach, tape, specs.load_stage_spec("fake", "Reach"), "fake")["defined"]["target_contact"] is False


def test_k_fixed_must_cover_the_adaptive_rule():
    with pytest.raises(BadInput, match="k_fixed"):
        BranchSettings(k_fixed=8)
    assert BranchSettings(k_fixed=32).record()["k_fixed"] == 32


@pytest.mark.slow
def test_a_fake_branch_study_with_a_fixed_k_reference_records_events_and_passes_the_audit(tmp_path):
    run_dir = tmp_path / "run"
    cli("run", "--backend", "fake", "--policy", "fake", "--no-progress", "--task", "PickPlace", "--condition",
        "clean,base:L3", "--episodes", "0-3", "--workers", "1", "--run-dir", str(run_dir))
    cli("branch", str(run_dir), "--max-trunks", "1", "--stride", "8", "--k", "2", "--k-expanded", "4",
        "--k-fixed", "6", "--workers", "1", "--no-progress")
    summary = json.loads((run_dir / "branching" / "default" / "summary.json").read_text())
    assert summary["fixed_k"]["summary"] and all(s["checkpoints"] > 0 for s in summary["fixed_k"]["summary"])
    assert summary["events"]["trunks_with_events"] == 1
    assert summary["expected_cost"]["checkpoints"] and summary["expected_cost"]["workload"]
    proc = cli("audit", str(run_dir), check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
