"""validate-stages and calibrate on the real simulator; demonstration replay and validate-pairing on the fake one."""

import json

import pandas as pd
import pytest
from helpers import cli

from robocasa_shift.core.demos import load_demo
from robocasa_shift.policies import make_policy


@pytest.mark.sim
def test_validate_stages_replays_demos_and_runs_negative_controls(tmp_path):
    from robocasa_shift.checks.validation import validate_stages

    report = validate_stages(tmp_path, ["Lift"], n_demos=2, n_random=1)
    task = report["tasks"]["Lift"]
    assert report["passed"] and task["passed"], task["checks"]
    assert len(task["demos"]) == 2 and all(d["replay_exact"] for d in task["demos"])
    demo = load_demo(tmp_path / task["demos"][0]["demo"])
    assert demo["meta"]["success"] and demo["states"].shape[0] == demo["actions"].shape[0] + 1
    assert demo["meta"]["stage_steps"] == task["demos"][0]["stage_steps"]
    assert (tmp_path / "validation" / "stages.md").read_text().count("| Lift |") == 1


@pytest.mark.sim
def test_validate_stages_fails_a_predicate_that_always_holds(tmp_path, monkeypatch):
    """The negative controls catch a subgoal that is true from the start."""
    import shutil

    from robocasa_shift.checks.validation import validate_stages
    from robocasa_shift.core import specs

    stage_dir = tmp_path / "stage_specs"
    shutil.copytree(specs.STAGE_SPECS_DIR, stage_dir)
    path = stage_dir / "robosuite" / "Lift.yaml"
    path.write_text(path.read_text().replace("args: {object: cube, distance_m: 0.02}", "args: {object: cube, distance_m: 5.0}"))
    monkeypatch.setattr(specs, "STAGE_SPECS_DIR", stage_dir)
    report = validate_stages(tmp_path / "run", ["Lift"], n_demos=1, n_random=1)
    checks = report["tasks"]["Lift"]["checks"]
    assert not report["passed"] and not checks["none_on_initial_states"]


def test_replay_policy_reproduces_a_demonstration(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.specs import load_protocol, load_stage_spec
    from robocasa_shift.engine.demo_recorder import record_demo
    from robocasa_shift.engine.rollout import run_rollout

    protocol, spec = load_protocol(), load_stage_spec("fake", "PickPlace")
    env = get_backend("fake").make("PickPlace")
    key = RolloutKey("validation", "PickPlace", 3, "clean")
    # the stochastic image-driven policy: the replay must not depend on its generator
    original, _ = record_demo(env, make_policy("fake"), key, protocol, spec, "fake", tmp_path)
    replayed = run_rollout(env, make_policy("replay", demo_dir=str(tmp_path)), key, protocol, spec, "fake")
    env.close()
    assert original.success and original.stages_completed == 3
    assert replayed.success and replayed.steps == original.steps and replayed.stage_steps == original.stage_steps


def test_validate_pairing_with_a_stochastic_and_a_deterministic_policy(tmp_path):
    from robocasa_shift.checks.validation import validate_pairing

    report = validate_pairing(tmp_path, ["PickPlace"], policy="fake", backend="fake", episodes=(0,), steps=25)
    task = report["tasks"]["PickPlace"]
    assert report["passed"], task["checks"]
    assert task["uncontrolled"]["max_abs_diff"] > 0.1 and task["seeded"]["max_abs_diff"] == 0.0
    det = validate_pairing(tmp_path, ["PickPlace"], policy="fake-expert", backend="fake", episodes=(0,), steps=25)
    assert det["passed"] and det["tasks"]["PickPlace"]["uncontrolled"] is None
    assert "N/A (deterministic)" in (tmp_path / "validation" / "pairing.md").read_text()


@pytest.mark.sim
def test_calibrate_cli_writes_table_and_contact_sheet(tmp_path):
    proc = cli("calibrate", "--task", "Lift", "--episodes", "0", "--run-dir", str(tmp_path))
    assert "calibration: PASSED" in proc.stdout
    table = pd.read_csv(tmp_path / "calibration" / "records.csv")
    assert len(table) == 13 and table.passed.all()
    for role in ("third_person", "wrist"):  # every camera the policy reads is measured
        illum = table[table.condition.str.startswith("illumination")][f"brightness_{role}"].tolist()
        assert illum == sorted(illum, reverse=True)
        blur = table[table.condition.str.startswith("blur")][f"sharpness_ratio_{role}"].tolist()
        assert blur == sorted(blur, reverse=True) and blur[0] < 0.2
    cam = table[table.condition.str.startswith("camera")]
    assert cam.wrist_identical.all() and (cam.third_change > 0.5).all()
    import cv2

    sheet = cv2.imread(str(tmp_path / "calibration" / "contact_sheet_Lift.png"))
    assert sheet.shape[0] == 24 + 13 * 128 and sheet.shape[1] == 150 + 2 * 128
    report = json.loads((tmp_path / "calibration" / "calibration.json").read_text())
    assert report["passed"] and report["n_records"] == 13 and report["image_size"] == 128
