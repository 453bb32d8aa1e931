"""Behaviour metrics from step logs: hand-made trajectories give the known values, and pairs differ by stage."""

import numpy as np
import pytest

from robocasa_shift.analysis.behaviour import latch_steps, paired_differences, rollout_metrics
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.steplog import StepLog
from robocasa_shift.sweep.spec import grid_severities
from robocasa_shift.sweep.study import run_sweep


def hand_made(moves, latched, arm, stages=("reach", "grasp", "lift")):
    """A step log whose end effector moves by ``moves`` (x only), with the given latch counts and arm commands."""
    eef = np.zeros((len(moves) + 1, 3))
    eef[1:, 0] = np.cumsum(moves)
    action = np.zeros((len(moves), 4))
    action[:, 0] = arm
    meta = {"stage_names": list(stages), "arm_dims": [0, 1, 2], "gripper_dim": 3}
    return StepLog(meta=meta, eef_pos=eef, action=action, latched=np.array(latched), boundary=np.array([0]))


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
