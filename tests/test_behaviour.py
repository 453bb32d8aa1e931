"""Behaviour metrics from step logs: hand-made trajectories give the known values, and pairs differ by stage."""

import json

import numpy as np
import pytest

from robocasa_shift.analysis.behaviour import contact_events, latch_steps, paired_differences, rollout_metrics
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.steplog import StepLog
from robocasa_shift.sweep.spec import grid_severities
from robocasa_shift.sweep.study import run_sweep


def hand_made(moves, latched, arm, stages=("reach", "grasp", "lift"), contacts=None):
    """A step log whose end effector moves by ``moves`` (x only), with the given latch counts, arm commands and
    contact rows (``CONTACT_COLUMNS``)."""
    eef = np.zeros((len(moves) + 1, 3))
    eef[1:, 0] = np.cumsum(moves)
    action = np.zeros((len(moves), 4))
    action[:, 0] = arm
    meta = {"stage_names": list(stages), "arm_dims": [0, 1, 2], "gripper_dim": 3}
    return StepLog(meta=meta, eef_pos=eef, action=action, latched=np.array(latched), boundary=np.array([0]),
                   contacts=None if contacts is None else np.array(contacts))


def test_hand_made_trajectory_gives_the_known_values():
    log = hand_made(moves=[0.1, 0.0, 0.2, 0.0005, 0.3], latched=[0, 1, 1, 2, 2], arm=[0, 0, 0, 1, 0])
    m = rollout_metrics(log, success=False)
    assert m["path_length_m"] == pytest.approx(0.6005)
    assert m["idle_steps"] == 2  # the 0 and the 0.5 mm steps
    assert m["latch_steps"] == {"reach": 2, "grasp": 4, "lift": None}
    assert m["stage_steps"] == {"reach": 2, "grasp": 2, "lift": None}
    # third differences of 0,0,0,1,0: 1 and -3 -> mean of squares 5
    assert m["jerk"] == pytest.approx(5.0)
    assert m["steps_to_success"] is None
    assert rollout_metrics(log, success=True)["steps_to_success"] == 5
    assert latch_steps(np.array([2, 2]), 3) == [1, 1, None]  # two subgoals latched on the first step


def test_paired_differences_show_a_shift_in_one_stage_only_and_flip_with_the_pair():
    clean = rollout_metrics(hand_made([0.1] * 6, [0, 1, 1, 2, 2, 3], [0] * 6), success=True)
    slow = rollout_metrics(hand_made([0.1] * 9, [0, 0, 0, 0, 1, 1, 2, 2, 3], [0] * 9), success=True)
    pairs = [{"condition": "camera:L2", "clean": clean, "perturbed": slow}] * 3
    d = paired_differences(pairs)["camera:L2"]
    assert d["stage_steps"]["reach"]["mean"] == 3 and d["stage_steps"]["grasp"]["mean"] == 0
    assert d["stage_steps"]["lift"]["mean"] == 0
    assert d["metrics"]["steps_to_success"]["mean"] == 3
    assert d["metrics"]["path_length_m"]["mean"] == pytest.approx(0.3)
    swapped = paired_differences([{"condition": "camera:L2", "clean": slow, "perturbed": clean}] * 3)["camera:L2"]
    assert swapped["stage_steps"]["reach"]["mean"] == -3


def test_a_sweep_with_step_logs_reports_behaviour_per_level(tmp_path):
    grid = grid_severities(specs.load_protocol(), "camera", 2)
    summary = run_sweep(tmp_path, "Reach", "camera", range(4), grid, StudyConfig(backend="fake", policy="fake",
                                                                                 log_steps=True), mode="grid")
    behaviour = summary["behaviour"]
    assert set(behaviour) == {"camera:L1", "camera:L2"}
    assert all(b["pairs"] == 4 for b in behaviour.values())
    assert behaviour["camera:L1"]["metrics"]["path_length_m"]["n"] == 4


# columns: robot-scene pairs, robot-other-object pairs, holding, object supported, object height (mm)
ON_TABLE, TOUCH_TABLE, HIT_OTHER = [0, 0, 0, 1, 20], [2, 0, 0, 1, 20], [0, 1, 0, 1, 20]
HELD_UP, LET_GO_HIGH, FALLING, LANDED = [0, 0, 1, 0, 80], [0, 0, 0, 0, 80], [0, 0, 0, 0, 50], [0, 0, 0, 1, 20]
LET_GO_LOW = [0, 0, 0, 0, 52]  # released 5 mm above its support, lands 2 mm lower: a placement


def test_contacts_collisions_and_drops_from_hand_made_rows_give_the_known_counts_per_stage():
    rows = [ON_TABLE, TOUCH_TABLE, HIT_OTHER, HELD_UP, LET_GO_HIGH, FALLING, LANDED, TOUCH_TABLE]
    log = hand_made([0.01] * 8, [0, 1, 1, 2, 2, 2, 2, 2], [0] * 8, contacts=rows)
    m = rollout_metrics(log, success=False)
    assert (m["scene_contact_steps"], m["object_collision_steps"], m["drops"]) == (2, 1, 1)
    # reach: step 2 (a table touch); grasp: steps 3-4 (the other object); lift, never reached: steps 5-8 (the drop at 5)
    assert m["stage_contact_steps"] == {"reach": 1, "grasp": 1, "lift": 1}
    assert m["stage_drops"] == {"reach": 0, "grasp": 0, "lift": 1}
    assert list(np.flatnonzero(contact_events(np.array(rows))["drop"])) == [4]
    placed = contact_events(np.array([HELD_UP, LET_GO_LOW, [0, 0, 0, 1, 50]]))
    assert not placed["drop"].any()  # let go in the air but caught 2 mm lower
    regrasped = contact_events(np.array([HELD_UP, LET_GO_HIGH, HELD_UP]))
    assert not regrasped["drop"].any()  # let go and held again before it fell
    unlogged = rollout_metrics(hand_made([0.01] * 3, [0, 1, 1], [0] * 3), success=False)
    assert unlogged["drops"] is None and unlogged["stage_contact_steps"] == {"reach": None, "grasp": None, "lift": None}


def test_contact_differences_are_paired_per_stage_and_flip_with_the_pair():
    clean = rollout_metrics(hand_made([0.01] * 4, [1, 1, 2, 3], [0] * 4, contacts=[ON_TABLE] * 4), success=True)
    bumpy = rollout_metrics(hand_made([0.01] * 4, [0, 1, 2, 3], [0] * 4,
                                      contacts=[TOUCH_TABLE, TOUCH_TABLE, ON_TABLE, ON_TABLE]), success=True)
    d = paired_differences([{"condition": "blur:L3", "clean": clean, "perturbed": bumpy}] * 2)["blur:L3"]
    assert d["metrics"]["scene_contact_steps"]["mean"] == 2 and d["metrics"]["drops"]["mean"] == 0
    assert d["stage_contact_steps"]["reach"]["mean"] == 2 and d["stage_contact_steps"]["grasp"]["mean"] == 0
    flipped = paired_differences([{"condition": "blur:L3", "clean": bumpy, "perturbed": clean}] * 2)["blur:L3"]
    assert flipped["stage_contact_steps"]["reach"]["mean"] == -2


def test_fake_rollouts_log_what_the_plane_allows(tmp_path):
    from robocasa_shift.core.steplog import StepLog
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.study.worker import StudyCache

    cache = StudyCache(StudyConfig(backend="fake", policy="fake-expert", log_steps=True))
    try:
        (record, data, _), = cache.run_keys_logged([RolloutKey("formal", "PickPlace", 0, "clean")])
    finally:
        cache.close()
    log = StepLog.read(data)
    assert record.success and log.contacts.shape == (log.steps, 5)
    held = log.contacts[:, 2] == 1
    assert held.any() and (log.contacts[:, 3] == 1 - log.contacts[:, 2]).all()  # on the table unless held
    assert not log.contacts[:, [1, 4]].any()  # one object, no height


def _tamper(path, change):
    import json

    summary = json.loads(path.read_text())
    change(summary["behaviour"])
    path.write_text(json.dumps(summary))


def test_the_audit_recomputes_a_sweeps_behaviour_from_the_step_logs_and_fails_a_tampered_summary(tmp_path):
    from robocasa_shift.checks.audit import audit_run

    grid = grid_severities(specs.load_protocol(), "camera", 2)
    run_sweep(tmp_path, "Reach", "camera", range(4), grid, StudyConfig(backend="fake", policy="fake", log_steps=True),
              mode="grid")
    result = audit_run(tmp_path)
    assert result.passed and result["behaviour_checked"] == ["sweep/summary.json"]

    def shorter_path(b):
        b["camera:L2"]["metrics"]["path_length_m"]["mean"] += 0.01

    _tamper(tmp_path / "sweep/summary.json", shorter_path)
    result = audit_run(tmp_path)
    assert not result.passed
    assert any("camera:L2.metrics.path_length_m.mean" in p for p in result["run_problems"]), result["run_problems"]

    def stage_dropped(b):
        del b["camera:L1"]["stage_contact_steps"]["approach_object"]

    run_sweep(tmp_path, "Reach", "camera", range(4), grid, StudyConfig(backend="fake", policy="fake", log_steps=True),
              mode="grid")  # resumed: nothing re-run, the summary written again from the logs
    assert audit_run(tmp_path).passed
    _tamper(tmp_path / "sweep/summary.json", stage_dropped)
    assert not audit_run(tmp_path).passed


def test_a_formal_reports_behaviour_table_sits_beside_the_verdicts_and_the_audit_checks_its_summary(tmp_path):
    from robocasa_shift.checks.audit import audit_run
    from robocasa_shift.config import ExecutionConfig
    from robocasa_shift.report.page import build_report
    from robocasa_shift.study.runner import run

    run(tmp_path, ["Reach", "PickPlace"], ["clean", "camera:L3", "blur:L3"], range(4),
        StudyConfig(backend="fake", policy="fake", log_steps=True), ExecutionConfig(progress=False))
    page = build_report(tmp_path, videos_per_kind=0, n_boot=100).read_text()
    summary = json.loads((tmp_path / "analysis/summary.json").read_text())
    assert set(summary["behaviour"]) == {"Reach", "PickPlace"}
    assert summary["behaviour"]["PickPlace"]["blur:L3"]["pairs"] == 4
    assert page.index("Paired degradation") < page.index("Behaviour (paired, from the step logs)") < \
        page.index("Success rate per condition")
    result = audit_run(tmp_path)
    assert result.passed and result["behaviour_checked"] == ["analysis/summary.json"]

    def more_contacts(b):
        b["Reach"]["camera:L3"]["metrics"]["scene_contact_steps"]["n"] += 1

    _tamper(tmp_path / "analysis/summary.json", more_contacts)
    assert not audit_run(tmp_path).passed
