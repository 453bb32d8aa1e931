"""The dynamics family (friction, damping, gains, grip, mass, object friction, execution noise): frozen, paired,
read back and audited. Bookkeeping on the fake backend (three of the six model quantities, and the noise); the
MuJoCo hook on robosuite's Lift (``sim``)."""

import json
import shutil

import numpy as np
import pytest
import yaml

from robocasa_shift import errors
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.audit import audit_run
from robocasa_shift.core import dynamics, specs
from robocasa_shift.core.backend import missing_hooks
from robocasa_shift.core.factors import FACTOR_KINDS, factor_kind
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import inject, prepare_episode, run_rollout
from robocasa_shift.policies import make_policy

MODEL_FACTORS = ("joint_friction", "joint_damping", "actuator_gain", "gripper_force", "object_mass", "object_friction")
FACTORS = MODEL_FACTORS + ("execution_noise",)
ON_FAKE = ("actuator_gain", "gripper_force", "object_mass", "execution_noise")


def _conditions(protocol, factors):
    return [c for f in factors for c in protocol.factor_conditions(f)]


def _run(run_dir, tasks, conditions, episodes, backend="fake", policy="fake-expert"):
    from robocasa_shift import run_study
    from robocasa_shift.config import ExecutionConfig, StudyConfig

    run_study(run_dir, tasks, ["clean", *conditions], episodes, study=StudyConfig(backend=backend, policy=policy),
              execution=ExecutionConfig(workers=1, progress=False))
    return run_dir


def _record(run_dir, task, episode, condition):
    path = run_dir / "records" / "formal" / task / f"{episode:04d}__{condition.replace(':', '-')}__r0.json"
    return path, json.loads(path.read_text())


# --------------------------------------------------------------------------- the protocol


def test_the_family_is_frozen_optional_and_names_its_hooks(protocol):
    assert all(f in protocol.optional_factors and f not in protocol.conditions for f in FACTORS)
    assert len(protocol.conditions) == 13  # the paper's matrix is untouched
    for name in FACTORS:
        spec = protocol.factor(name)
        kind = FACTOR_KINDS.get(spec.kind)
        assert kind.family == "dynamics" and list(spec.levels) == ["L1", "L2", "L3"]
        assert spec.content_hash == specs.read_lock(protocol.directory)[f"{name}.yaml"][str(spec.version)]
    for name in MODEL_FACTORS:
        assert FACTOR_KINDS.get(name).requires == (f"dynamics:{name}",)
    # scaled down where weaker is the fault, up where heavier or stiffer is
    for name, down in (("actuator_gain", True), ("gripper_force", True), ("object_friction", True),
                       ("object_mass", False), ("joint_friction", False), ("joint_damping", False)):
        scales = [protocol.factor(name).level(lv)["scale"] for lv in ("L1", "L2", "L3")]
        assert scales == sorted(scales, reverse=down) and len(set(scales)) == 3
        assert all(s < 1 for s in scales) if down else all(s > 1 for s in scales)


def test_tampering_with_a_level_is_refused_with_both_hashes(spec_copy):
    path = spec_copy / "object_mass.yaml"
    content = yaml.safe_load(path.read_text())
    frozen = specs.read_lock(spec_copy)["object_mass.yaml"][str(content["version"])]
    content["levels"]["L2"]["scale"] = content["levels"]["L2"]["scale"] + 1
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(errors.FrozenSpecError) as info:
        specs.load_protocol(spec_copy)
    message = str(info.value)
    assert frozen in message and specs.canonical_hash(content) in message and "object_mass.yaml" in message


def test_manipulated_objects_come_from_the_stage_spec():
    assert dynamics.stage_objects(specs.load_stage_spec("robosuite", "Stack")) == ["cubeA"]
    assert dynamics.stage_objects(specs.load_stage_spec("robosuite", "Lift")) == ["cube"]
    assert dynamics.stage_objects(specs.load_stage_spec("fake", "PickPlace")) == []


# --------------------------------------------------------------------------- the fake backend


@pytest.fixture(scope="module")
def dynamics_run(tmp_path_factory):
    protocol = specs.load_protocol()
    return _run(tmp_path_factory.mktemp("dynamics") / "run", ["Reach", "PickPlace"], _conditions(protocol, ON_FAKE),
                [0, 1, 2])


def test_a_paired_run_of_the_family_audits_clean_with_every_application_read_back(dynamics_run, protocol):
    result = audit_run(dynamics_run)
    assert result.passed, json.dumps({t: {k: c for k, c in v["checks"].items() if c["count"]}
                                      for t, v in result["tasks"].items()})[:3000]
    for factor in ("actuator_gain", "gripper_force", "object_mass"):
        scale = protocol.factor(factor).level("L3")["scale"]
        _, rec = _record(dynamics_run, "PickPlace", 0, f"{factor}:L3")
        p = rec["perturbation"]
        assert p["ok"] and p["applied"] == p["expected"]
        assert [v[0] * scale for v in p["measured"]["nominal"].values()] == [v[0] for v in p["applied"].values()]
        _, clean = _record(dynamics_run, "PickPlace", 0, "clean")
        assert rec["env_fingerprint"] == clean["env_fingerprint"]  # the same start, fingerprinted before injection


def test_a_heavier_object_breaks_the_grasp_not_the_reach(dynamics_run):
    """The fake's grasp holds while the squeeze carries the weight: the expert's lost successes stop at the grasp."""
    lost = []
    for episode in (0, 1, 2):
        _, clean = _record(dynamics_run, "PickPlace", episode, "clean")
        _, heavy = _record(dynamics_run, "PickPlace", episode, "object_mass:L3")
        assert clean["success"]
        if not heavy["success"]:
            lost.append(heavy["stage_names"][heavy["first_incomplete"] - 1])  # 1-based
    assert lost == ["grasp_object"] * 3


@pytest.mark.parametrize("condition, edit, message", [
    ("object_mass:L2", lambda p: p["expected"].update(object=[p["expected"]["object"][0] * 1.01]), "x the nominal"),
    ("object_mass:L2", lambda p: p["measured"]["nominal"].update(object=[1.0]), "x the nominal"),
    ("actuator_gain:L1", lambda p: p["measured"].update(nominal={}), "no nominal actuator_gain"),
    ("gripper_force:L3", lambda p: p["expected"].update(other=[1.0]), "scaled elements"),
    ("execution_noise:L2", lambda p: p["measured"].update(actions=p["measured"]["actions"] - 1), "seed stream's draws"),
    ("execution_noise:L1", lambda p: p["measured"].update(sigma=0.5), "not the frozen"),
    ("execution_noise:L3", lambda p: p.update(draw=[p["draw"][0] + 1]), "draw"),
])
def test_the_audit_names_a_tampered_dynamics_record(dynamics_run, tmp_path, condition, edit, message):
    run_dir = tmp_path / "run"
    shutil.copytree(dynamics_run, run_dir)
    path, rec = _record(run_dir, "Reach", 1, condition)
    edit(rec["perturbation"])
    path.write_text(json.dumps(rec))
    result = audit_run(run_dir)
    assert not result.passed
    named = result["tasks"]["Reach"]["checks"]["invalid_perturbation_records"]["rollouts"]
    assert any(r.startswith(f"formal/Reach/0001/{condition}/r0") and message in r for r in named), named


def test_reset_restores_the_nominal_dynamics_and_the_clean_fingerprint_leaves_them_out(protocol):
    env = get_backend("fake").make("PickPlace")
    key = RolloutKey("formal", "PickPlace", 0, "clean")
    clean = prepare_episode(env, protocol, key)
    # nominal dynamics are not hashed: the fingerprint is the one of the model without the table
    from robocasa_shift.core.backend import hash_arrays

    assert clean == hash_arrays({**{f"state.{k}": v for k, v in env.get_state().items()},
                                 **{f"model.{k}": v for k, v in env.model_values().items()}})
    for condition in _conditions(protocol, ON_FAKE[:3]):
        perturbed_key = RolloutKey("formal", "PickPlace", 0, condition)
        assert prepare_episode(env, protocol, perturbed_key) == clean
        inject(env, protocol, perturbed_key)
        assert env.fingerprint() != clean  # an off-nominal value is in the fingerprint
        assert prepare_episode(env, protocol, key) == clean
        for quantity in env.DYNAMICS_QUANTITIES:
            assert env.dynamics(quantity) == env.nominal_dynamics(quantity)


def test_a_backend_that_cannot_apply_a_factor_refuses_it_by_name_before_the_study(tmp_path, protocol):
    env = get_backend("fake").make("Reach")
    assert missing_hooks(env, factor_kind(protocol.factor("joint_friction")).requires) == ["dynamics:joint_friction"]
    assert missing_hooks(env, factor_kind(protocol.factor("object_mass")).requires) == []
    with pytest.raises(errors.BackendUnavailable, match="cannot run factor 'object_friction'.*dynamics:object_friction"):
        _run(tmp_path / "run", ["Reach"], ["object_friction:L1"], [0])
    assert not list((tmp_path / "run").glob("records/**/*.json"))


def test_check_backend_checks_every_dynamics_hook_the_fake_offers(protocol):
    from robocasa_shift.checks.backend_check import check_backend

    result = check_backend("fake", tasks=["PickPlace"], episodes=(0,))
    assert result.passed, result.markdown
    lacking = _conditions(protocol, ("joint_friction", "joint_damping", "object_friction"))
    # every condition but clean and the three quantities the fake lacks: applied, read back, restored at reset
    assert result["tasks"]["PickPlace"]["conditions"] == len(protocol.known_conditions) - 1 - len(lacking)


# --------------------------------------------------------------------------- execution noise


def test_execution_noise_does_not_depend_on_how_the_policy_chunks_its_actions():
    actions = np.zeros((5, 4))
    one = dynamics.ExecutionNoise(7, 0.1, [0, 1, 2])(actions)
    noise = dynamics.ExecutionNoise(7, 0.1, [0, 1, 2])
    chunked = np.concatenate([noise(actions[:3]), noise(actions[3:])])
    assert np.array_equal(one, chunked) and np.all(one[:, 3] == 0)  # the gripper untouched
    assert noise.measured()["noise_sha256"] == dynamics.ExecutionNoise.noise_hash(7, 0.1, 3, 5)
    clipped = dynamics.ExecutionNoise(7, 10.0, [0])(np.zeros((50, 1)))
    assert np.abs(clipped).max() == 1.0  # clipped to the action space


def test_the_branch_studies_use_the_same_execution_noise():
    from robocasa_shift.branching import checkpoints

    assert checkpoints.ExecutionNoise is dynamics.ExecutionNoise


def test_the_levels_of_execution_noise_scale_one_draw_of_the_factor_s_stream(dynamics_run, protocol):
    draws = {lv: _record(dynamics_run, "Reach", 2, f"execution_noise:{lv}")[1]["perturbation"]["draw"]
             for lv in ("L1", "L2", "L3")}
    assert draws["L1"] == draws["L2"] == draws["L3"]
    rng = __import__("robocasa_shift.seeding", fromlist=["draw_rng"]).draw_rng(
        protocol.study_seed, "execution_noise", "Reach", "formal", 2)
    assert draws["L1"] == factor_kind(protocol.factor("execution_noise")).draw(protocol.factor("execution_noise"), rng)["draw"]


def test_execution_noise_moves_the_executed_arm_commands_and_only_those(protocol):
    env = get_backend("fake").make("Reach")
    spec = specs.load_stage_spec("fake", "Reach")
    seen = {}

    class Actions:
        def __init__(self, name):
            self.name, self.actions = name, []

        def on_start(self, env): pass
        def on_boundary(self, rollout): pass
        def on_observation(self, step, images): pass
        def before_act(self, rollout, obs): pass

        def on_step(self, step, action, env, latched):
            self.actions.append(np.array(action))

    for condition in ("clean", "execution_noise:L3"):
        observer = Actions(condition)
        run_rollout(env, make_policy("fake-random"), RolloutKey("formal", "Reach", 0, condition), protocol, spec, "fake",
                    observer=observer)
        seen[condition] = np.array(observer.actions)
    n = min(len(seen["clean"]), len(seen["execution_noise:L3"]))
    diff = seen["execution_noise:L3"][:n] - seen["clean"][:n]
    assert np.abs(diff[:, :2]).max() > 0 and np.all(diff[:, 2] == 0)


# --------------------------------------------------------------------------- the MuJoCo hook (robosuite)


@pytest.mark.sim
def test_robosuite_scales_every_quantity_reads_it_back_and_restores_it(lift_env, protocol):
    env = lift_env
    clean_key = RolloutKey("formal", "Lift", 0, "clean")
    clean = prepare_episode(env, protocol, clean_key)
    assert sorted(env.nominal_dynamics("object_mass")) == ["cube_main.inertia", "cube_main.mass"]
    assert env.nominal_dynamics("gripper_force") and all(len(v) == 2 for v in env.nominal_dynamics("gripper_force").values())
    for factor in MODEL_FACTORS:
        key = RolloutKey("formal", "Lift", 0, f"{factor}:L3")
        assert prepare_episode(env, protocol, key) == clean
        p = inject(env, protocol, key)
        assert p["ok"] and p["max_abs_error"] == 0.0 and env.fingerprint() != clean
        assert factor_kind(protocol.factor(factor)).audit(protocol.factor(factor), "L3", None, p, None) == []
        if factor == "object_mass":  # the read-out is the body's mass (kg), its inertia left out
            scale = protocol.factor(factor).level("L3")["scale"]
            mass = env.nominal_dynamics("object_mass")["cube_main.mass"][0] * scale
            assert dynamics.dynamics_readout(env, "object_mass")["mean"] == pytest.approx(mass)
    assert prepare_episode(env, protocol, clean_key) == clean
    # object friction takes contact priority, and gives it back at reset
    assert env.model.geom_priority.max() == env._dynamics_nominal["geom_priority"].max()


# --------------------------------------------------------------------------- calibration


def test_calibration_reads_out_every_level_physically_and_with_the_expert(tmp_path, protocol):
    from robocasa_shift.checks.calibration import calibrate
    from robocasa_shift.core.factors import family_conditions

    conditions = family_conditions(protocol)["dynamics"]
    assert conditions == _conditions(protocol, FACTORS)
    result = calibrate(tmp_path, ["PickPlace"], "fake", episodes=(0, 1), image_size=32, conditions=conditions)
    assert result.passed, result["failed"]
    assert result["skipped"] == {"PickPlace": _conditions(protocol, ("joint_friction", "joint_damping", "object_friction"))}
    rows = __import__("pandas").read_csv(tmp_path / "calibration" / "records.csv").set_index(["condition", "episode"])
    assert rows.loc[("clean", 0), "expert_success"] and rows.loc[("clean", 0), "expert_steps"] > 0
    scale = protocol.factor("object_mass").level("L3")["scale"]
    assert rows.loc[("object_mass:L3", 0), "readout"] == pytest.approx(0.1 * scale)  # the fake's 0.1 kg object
    assert not rows.loc[("object_mass:L3", 0), "expert_success"]
    assert rows.loc[("object_mass:L3", 0), "expert_stopped_at"] == "grasp_object"
    slow, fast = rows.loc[("actuator_gain:L3", 0), "eef_speed_m_per_step"], rows.loc[("clean", 0), "eef_speed_m_per_step"]
    assert slow < fast  # a weaker arm moves the gripper more slowly
    markdown = (tmp_path / "calibration" / "calibration.md").read_text()
    assert "Dynamics: physical read-outs and the scripted expert" in markdown and "object_mass:L3" in markdown


def test_the_report_shows_the_dynamics_family_in_its_verdict_grid_and_figure(dynamics_run):
    from robocasa_shift.report.page import build_report

    page = build_report(dynamics_run, videos_per_kind=0, n_boot=200).read_text()
    grid = page[page.index("class='verdicts'"):]
    grid = grid[:grid.index("</table>")]
    assert all(f"<td>dynamics</td><td>{f}</td>" in grid for f in ON_FAKE), grid[:2000]
    assert (dynamics_run / "report" / "macro_dsr.png").stat().st_size > 0
