"""The robocasa backend: task table, stage specs, pool, predicates, action mapping, seeding, CLI.

Three tiers, by what the Python running them has:

- anywhere (the main .venv too): the task table, stage specs, the pool, the
  action reordering, the seeding of the global ``np.random`` and the CLI's
  exit with a message when the backend cannot run;
- RoboCasa's code on the newer robosuite (``make test-robocasa``): the
  predicates and the base placement against RoboCasa's real helpers and
  signatures, RoboCasa's own step bookkeeping, the kitchen controller's
  action layout;
- kitchen assets present as well: real kitchens (reset, step, snapshots,
  perturbation hooks). Skipped, with the reason, where the assets are missing.
"""

import importlib.util
import inspect
import json
from types import SimpleNamespace

import numpy as np
import pytest
from helpers import cli

from robocasa_shift import specs
from robocasa_shift.backends import get_backend
from robocasa_shift.backends import robocasa_backend as rb
from robocasa_shift.checks.screening import load_pool
from robocasa_shift.engine.stages import PREDICATES
from robocasa_shift.errors import BackendUnavailable

FORMAL = ["PreSoakPan", "RinseSinkBasin", "WashLettuce", "StackBowlsCabinet"]


def _robocasa_importable() -> bool:
    if importlib.util.find_spec("robocasa") is None:
        return False
    from robosuite.environments.base import MujocoEnv

    return "load_model_on_init" in inspect.signature(MujocoEnv.__init__).parameters


needs_robocasa = pytest.mark.skipif(
    not _robocasa_importable(),
    reason="RoboCasa's code on a robosuite with load_model_on_init is not installed in this Python "
           "(run `make test-robocasa`, which builds .venv-robocasa)",
)


def _unavailable_reason():
    try:
        rb.check_available()
    except BackendUnavailable as exc:
        return str(exc)
    return None


# ---------------------------------------------------------------------- anywhere


def test_task_table_is_the_composite_seen_pool_in_order():
    backend = get_backend("robocasa")
    pool = load_pool("robocasa")
    assert backend.task_names() == list(pool.candidates)
    assert len(pool.candidates) == 16 and (pool.initial, pool.reserve, pool.minimum_suite) == (12, 4, 4)
    assert (pool.first_batch, pool.exclude_at_most, pool.extended, pool.retain_at_least) == (10, 3, 20, 12)
    # what the paper says of its 12+4 schedule: three formal tasks among the first 12, WashLettuce in reserve
    assert [t for t in pool.candidates[:12] if t in FORMAL] == ["PreSoakPan", "RinseSinkBasin", "StackBowlsCabinet"]
    assert [t for t in pool.candidates[12:] if t in FORMAL] == ["WashLettuce"]
    horizons = {t: backend.task(t).horizon for t in FORMAL}
    assert horizons == {"PreSoakPan": 2400, "RinseSinkBasin": 1350, "WashLettuce": 1650, "StackBowlsCabinet": 2100}


def test_tasks_command_lists_them_without_robocasa_installed():
    out = json.loads(cli("tasks", "--backend", "robocasa", "--json").stdout)
    rows = {t["task"]: t for t in out["tasks"]}
    assert list(rows) == get_backend("robocasa").task_names()
    assert [g["id"] for g in rows["PreSoakPan"]["subgoals"]] == ["pan_in_sink", "sponge_in_sink", "water_on"]
    assert [g["id"] for g in rows["WashLettuce"]["subgoals"]] == ["water_on", "lettuce_under_water", "lettuce_washed"]
    assert rows["RinseSinkBasin"]["horizon"] == 1350


@pytest.mark.parametrize("task", list(rb.TASKS))
def test_stage_specs_load_and_bind_to_registered_predicates(task):
    spec = specs.load_stage_spec("robocasa", task)
    assert 3 <= len(spec.subgoals) <= 4 if task in FORMAL else len(spec.subgoals) == 1
    for goal in spec.subgoals:
        fn = PREDICATES.get(f"robocasa.{goal.predicate}")
        inspect.signature(fn).bind(None, **goal.args)  # raises on a wrong or missing argument


def test_counter_predicates_read_without_side_effects():
    raw = SimpleNamespace(washed_time=25, washed_loc=[True, False, True])
    env = SimpleNamespace(raw=raw, is_success=lambda: True)
    assert rb.washed(env, at_least=25) and not rb.washed(env, at_least=26)
    assert rb.rinsed(env, at_least=2) and not rb.rinsed(env, at_least=3)
    assert rb.official_success(env)
    assert raw.washed_time == 25 and raw.washed_loc == [True, False, True]


# RoboCasa's kitchens order the composite controller's parts right, right_gripper, base, torso
# (Kitchen.__init__ sets body_part_ordering); robosuite's default is right, torso, base, right_gripper.
KITCHEN_SPLIT = {"right": (0, 6), "right_gripper": (6, 7), "base": (7, 10), "torso": (10, 11)}


def test_harness_actions_are_reordered_into_the_kitchen_controller_layout():
    ix = rb.harness_to_env_action_index(KITCHEN_SPLIT, 12)
    harness = np.arange(12.0)  # value = harness index
    env_action = harness[ix]
    assert env_action[0:6].tolist() == [0, 1, 2, 3, 4, 5]  # arm
    assert env_action[6] == 10  # gripper
    assert env_action[7:10].tolist() == [7, 8, 9]  # base
    assert env_action[10] == 6  # torso
    assert env_action[11] == 11  # base mode
    # the embedded backend's own layout maps to itself
    default = {"right": (0, 6), "torso": (6, 7), "base": (7, 10), "right_gripper": (10, 11)}
    assert rb.harness_to_env_action_index(default, 12).tolist() == list(range(12))
    with pytest.raises(ValueError, match="left"):
        rb.harness_to_env_action_index({**KITCHEN_SPLIT, "left": (11, 12)}, 13)


class _StubKitchen:
    """Draws from env.rng and from the global np.random during reset, as RoboCasa's kitchens do."""

    def reset(self):
        return {"rng": self.rng.uniform(size=3), "global": np.random.normal(size=3)}


def test_reset_seeds_env_rng_and_global_random_and_restores_the_callers_stream():
    np.random.seed(1234)
    expected_next = np.random.RandomState(1234).uniform()
    stub = _StubKitchen()
    a = rb.reset_seeded(stub, 7)
    b = rb.reset_seeded(stub, 7)
    c = rb.reset_seeded(stub, 8)
    assert np.array_equal(a["rng"], b["rng"]) and np.array_equal(a["global"], b["global"])
    assert not np.array_equal(a["global"], c["global"]) and not np.array_equal(a["rng"], c["rng"])
    assert np.random.uniform() == expected_next  # the caller's global stream did not move


def test_python_state_keeps_plain_data_only():
    assert rb._plain([np.float64(1.5), True, None], arrays=False) == [1.5, True, None]
    assert rb._plain([np.zeros(2)], arrays=True) == [[0.0, 0.0]]
    assert rb._plain([np.zeros(2)], arrays=False) is rb._SKIP
    assert rb._plain({"a": object()}, arrays=True) is rb._SKIP


def test_run_exits_3_with_what_is_missing_before_any_rollout(tmp_path):
    reason = _unavailable_reason()
    if reason is None:
        pytest.skip("the robocasa backend is available here (assets present): nothing to refuse")
    run_dir = tmp_path / "x"
    proc = cli("run", "--backend", "robocasa", "--task", "PreSoakPan", "--condition", "clean", "--episodes", "0-1",
               "--run-dir", str(run_dir), check=False)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().startswith("error: ")
    if _robocasa_importable():
        for text in ("kitchen assets are missing", "download_kitchen_assets", "ROBOCASA_ASSETS_PATH"):
            assert text in proc.stderr
    else:
        for text in ("load_model_on_init", "praxis-robosuite==1.5.2.post1", "rpent-robocasa365==1.0.1",
                     "make setup-robocasa"):
            assert text in proc.stderr
    assert not run_dir.exists()


# ---------------------------------------------------------------------- RoboCasa's code installed


@needs_robocasa
def test_table_matches_robocasas_registry():
    from robocasa.utils.dataset_registry import COMPOSITE_TASK_DATASETS, TARGET_TASKS

    assert list(rb.TASKS) == list(TARGET_TASKS["composite_seen"])
    assert {t: rb.TASKS[t].horizon for t in rb.TASKS} == {t: COMPOSITE_TASK_DATASETS[t]["horizon"] for t in rb.TASKS}


@needs_robocasa
def test_task_counters_are_attributes_the_tasks_write():
    import robosuite

    for task in rb.TASKS.values():
        source = inspect.getsource(robosuite.environments.base.REGISTERED_ENVS[task.name])
        for name in task.counters:
            assert f"self.{name}" in source, (task.name, name)


@needs_robocasa
def test_helpers_take_the_arguments_the_predicates_and_placement_pass():
    import robocasa.utils.env_utils as EnvUtils
    from robocasa.models.fixtures.sink import Sink
    from robocasa.utils import object_utils as OU

    sig = inspect.signature
    sig(OU.obj_inside_of).bind("env", "obj", "fixture", partial_check=False)
    sig(OU.check_obj_in_receptacle).bind("env", "obj", "recep")
    sig(OU.check_obj_grasped).bind("env", "obj")
    sig(OU.gripper_obj_far).bind("env", "obj", th=0.25)
    assert sig(OU.gripper_obj_far).parameters["th"].default == 0.25  # the spec's gripper_far_m
    sig(Sink.get_handle_state).bind("sink", env="env")
    sig(Sink.check_obj_under_water).bind("sink", "env", "obj")
    sig(EnvUtils.set_robot_base).bind(env="env", anchor_pos=0, anchor_ori=0, rot_dev=0, pos_dev_x=0, pos_dev_y=0)
    sig(EnvUtils.detect_robot_collision).bind("env")
    assert list(sig(EnvUtils.compute_robot_base_placement_pose).parameters) == ["env", "ref_fixture", "ref_object", "offset"]
    sig(EnvUtils.create_env).bind("PreSoakPan", robots=rb.ROBOT, camera_names=[], seed=0, render_onscreen=False,
                                  split=rb.SPLIT, randomize_cameras=False, control_freq=20, horizon=1)


@needs_robocasa
def test_kitchens_place_the_base_and_count_success_where_the_backend_hooks_in():
    """The source lines the backend relies on: placement, success via reward, bookkeeping in _post_action."""
    from robocasa.environments.kitchen.kitchen import Kitchen
    from robosuite.environments.base import MujocoEnv

    assert "EnvUtils.init_robot_base_pose(self)" in inspect.getsource(Kitchen._load_model)
    assert "EnvUtils.set_robot_base(" in inspect.getsource(Kitchen._reset_internal)
    assert "self._check_success()" in inspect.getsource(Kitchen.reward)
    assert inspect.getsource(MujocoEnv.step).count("self._post_action(action)") == 1
    assert inspect.getsource(MujocoEnv._post_action).count("self.reward(action)") == 1
    import robosuite

    for name in rb.TASKS:  # step() reads the success from Kitchen's reward
        assert robosuite.environments.base.REGISTERED_ENVS[name].reward is Kitchen.reward, name


def _bare(cls, **attrs):
    """An instance of a RoboCasa task class without building a kitchen (no assets needed)."""
    env = object.__new__(cls)
    env.__dict__.update(timestep=1, horizon=10, ignore_done=True, fixtures={}, **attrs)
    return env


def _count(env, name):
    calls = []
    method = getattr(env, name)
    setattr(env, name, lambda *a, **k: calls.append(1) or method(*a, **k))
    return calls


@needs_robocasa
def test_robocasas_step_bookkeeping_checks_success_then_updates_counters_once():
    from robocasa.environments.kitchen.composite.making_salads.wash_lettuce import WashLettuce

    sink = SimpleNamespace(check_obj_under_water=lambda env, name: True)
    env = _bare(WashLettuce, sink=sink, washed_time=24)
    checks, updates = _count(env, "_check_success"), _count(env, "update_state")
    reward, _, _ = env._post_action(np.zeros(12))
    assert (len(checks), len(updates)) == (1, 1)
    # success is checked before this step's counter update: the step that brings washed_time to 25
    # still reports failure, the next one success
    assert reward == 0.0 and env.washed_time == 25
    reward, _, _ = env._post_action(np.zeros(12))
    assert reward == 1.0 and env.washed_time == 26 and (len(checks), len(updates)) == (2, 2)


@needs_robocasa
def test_rinse_latch_and_sink_predicates_through_robocasas_code():
    from robocasa.environments.kitchen.composite.cleaning_sink.rinse_sink_basin import RinseSinkBasin

    handle = {"water_on": True, "spout_ori": "left"}
    sink = SimpleNamespace(get_handle_state=lambda env: dict(handle))
    raw = _bare(RinseSinkBasin, sink=sink, washed_loc=[False, False, False])
    env = SimpleNamespace(raw=raw, fixture=lambda name: {"sink": sink}[name])
    raw._post_action(np.zeros(12))
    assert raw.washed_loc == [True, False, False]
    assert rb.water_on(env) and rb.spout_at(env, "left") and not rb.spout_at(env, "right")
    before = list(raw.washed_loc)
    handle["spout_ori"] = "right"
    assert rb.rinsed(env, at_least=1) and not rb.rinsed(env, at_least=2)
    assert raw.washed_loc == before  # predicates never latch


def _replay_env(raw, sink, restore):
    """A RobocasaEnv around a bare RoboCasa task (no kitchen, no assets): ``restore(state)`` stands in
    for restoring the recorded physics, and the sink stub for the fixture the predicates read."""
    env = object.__new__(rb.RobocasaEnv)
    env.raw = raw
    env.fixture = lambda name: {"sink": sink}[name]
    env.set_physics_state = restore
    return env


@needs_robocasa
def test_stage_replay_latches_wash_lettuces_counter_through_replay_step():
    """validate-stages replays demonstrations through RobocasaEnv.replay_step, which does RoboCasa's
    step bookkeeping (success check, then update_state), so washed_time counts on replay."""
    from robocasa.environments.kitchen.composite.making_salads.wash_lettuce import WashLettuce

    from robocasa_shift.checks.validation import replay_states

    sink = SimpleNamespace(check_obj_under_water=lambda env, name: True,
                           get_handle_state=lambda env: {"water_on": True, "spout_ori": "center"})
    restored = []
    env = _replay_env(_bare(WashLettuce, sink=sink, washed_time=0), sink, restored.append)
    out = replay_states(env, specs.load_stage_spec("robocasa", "WashLettuce"), np.zeros((31, 2)))
    # water on and lettuce under water from the first replayed step; washed at RoboCasa's 25 steps
    assert out["stage_steps"] == [1, 1, 25] and out["all_reached"]
    assert out["error"] is None and not out["holding_errors"]
    assert len(restored) == 30 and env.raw.washed_time == 30  # one counter update per replayed state


@needs_robocasa
def test_stage_replay_latches_rinse_sink_basins_locations_through_replay_step():
    """RinseSinkBasin latches washed_loc inside its success check: replay_step calls it once per state."""
    from robocasa.environments.kitchen.composite.cleaning_sink.rinse_sink_basin import RinseSinkBasin

    from robocasa_shift.checks.validation import replay_states

    handle = {"water_on": True, "spout_ori": "left"}
    sink = SimpleNamespace(get_handle_state=lambda env: dict(handle))

    def restore(state):  # the recorded state sets where the spout points
        handle["spout_ori"] = ("left", "center", "right")[int(state[0])]

    env = _replay_env(_bare(RinseSinkBasin, sink=sink, washed_loc=[False, False, False]), sink, restore)
    states = np.array([[0.0], [0.0], [0.0], [1.0], [1.0], [2.0]])
    out = replay_states(env, specs.load_stage_spec("robocasa", "RinseSinkBasin"), states)
    assert out["stage_steps"] == [1, 3, 5] and out["all_reached"]
    assert out["error"] is None and not out["holding_errors"]
    assert env.raw.washed_loc == [True, True, True]


@needs_robocasa
def test_global_random_draws_of_robocasas_camera_jitter_are_seeded():
    import robocasa.utils.camera_utils as CamUtils

    def jitter(seed):
        env = SimpleNamespace(_cam_configs=CamUtils.get_robot_cam_configs(rb.ROBOT), use_cotraining_cameras=False,
                              rng=np.random.default_rng(0))
        with rb.seeded_global_random(seed):
            CamUtils.randomize_cameras(env)  # the eye-in-hand jitter draws from global np.random
        return env._cam_configs["robot0_eye_in_hand"]["pos"]

    assert jitter(3) == jitter(3) and jitter(3) != jitter(4)


@pytest.fixture(scope="module")
def kitchen_controller_lift():
    """robosuite's Lift with PandaOmron and the controller configuration a RoboCasa kitchen builds.

    The kitchen's own config is read from a kitchen constructed by create_env (the
    constructor needs no assets); Lift stands in for the scene, which does.
    """
    if not _robocasa_importable():
        pytest.skip("RoboCasa's code is not installed here (run `make test-robocasa`)")
    import robosuite
    from robocasa.utils.env_utils import create_env

    kitchen = create_env("PreSoakPan", split=rb.SPLIT, seed=0)
    config = kitchen.robot_configs[0]["composite_controller_config"]
    env = robosuite.make("Lift", robots=rb.ROBOT, controller_configs=config, has_renderer=False,
                         has_offscreen_renderer=False, use_camera_obs=False, seed=0)
    env.reset()
    yield env
    env.close()


@needs_robocasa
def test_kitchen_controller_takes_reordered_harness_actions(kitchen_controller_lift):
    env = kitchen_controller_lift
    cc = env.robots[0].composite_controller
    assert dict(cc._action_split_indexes) == KITCHEN_SPLIT
    ix = rb.harness_to_env_action_index(cc._action_split_indexes, env.action_spec[0].shape[0])
    finger = env.sim.model.get_joint_qpos_addr("gripper0_right_finger_joint1")
    base = [env.sim.model.get_joint_qpos_addr(j) for j in rb.BASE_JOINTS]
    open_width, base_before = env.sim.data.qpos[finger], env.sim.data.qpos[base].copy()
    harness = np.zeros(12)
    harness[10], harness[11] = 1.0, -1.0  # close the gripper, arm mode
    for _ in range(10):
        env.step(harness[ix])
    assert env.sim.data.qpos[finger] < open_width - 0.01  # the gripper closed
    assert np.allclose(env.sim.data.qpos[base], base_before, atol=1e-4)  # and nothing drove the base


@needs_robocasa
def test_predicates_call_robocasas_object_helpers(kitchen_controller_lift):
    env = kitchen_controller_lift
    env.objects = {"cube": env.cube}
    env.obj_body_id = {"cube": env.cube_body_id}
    wrapped = SimpleNamespace(raw=env)
    eef = env.sim.data.site_xpos[env.robots[0].eef_site_id["right"]]
    distance = np.linalg.norm(eef - env.sim.data.body_xpos[env.cube_body_id])
    assert rb.gripper_far(wrapped, "cube", th_m=distance - 0.01)
    assert not rb.gripper_far(wrapped, "cube", th_m=distance + 0.01)
    assert not rb.grasped(wrapped, ["cube"])


@needs_robocasa
def test_base_offset_goes_through_robocasas_set_robot_base(kitchen_controller_lift):
    import robocasa.utils.env_utils as EnvUtils

    env = kitchen_controller_lift
    anchor_ori = np.array([0.0, 0.0, 0.3])
    # an anchor 1 m behind where Lift puts the robot: free floor, so RoboCasa's collision search keeps it
    anchor_pos = np.array([10.0, 10.0, 0.0]) + rb.base_frame_shift(anchor_ori, -1.0, 0.0)
    env.init_robot_base_ori_anchor, env.robot_geom_ids = anchor_ori, None
    adr = [env.sim.model.get_joint_qpos_addr(j) for j in rb.BASE_JOINTS]
    start = env.sim.get_state()
    offset = {"forward_m": 0.07, "side_m": -0.04, "yaw_deg": 6.0}

    def place(offset):
        env.sim.set_state(start)
        env.rng = np.random.default_rng(5)
        with rb.base_offset_at_placement(offset):
            # looked up on the module at call time, as Kitchen._reset_internal does
            EnvUtils.set_robot_base(env=env, anchor_pos=anchor_pos, anchor_ori=anchor_ori, rot_dev=0.0,
                                    pos_dev_x=0.15, pos_dev_y=0.05)
        assert not EnvUtils.detect_robot_collision(env)
        return env.sim.data.qpos[adr].copy()

    original = EnvUtils.set_robot_base
    nominal, shifted = place(None), place(offset)
    assert EnvUtils.set_robot_base is original
    delta = shifted - nominal
    assert np.allclose(delta, [0.07, -0.04, np.deg2rad(6.0)], rtol=0, atol=rb.BASE_READBACK_ATOL)


# ---------------------------------------------------------------------- kitchen assets present


@pytest.fixture(scope="module")
def kitchen():
    reason = _unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a working robocasa backend (kitchen assets included): {reason}")
    env = get_backend("robocasa").make("PreSoakPan")
    yield env
    env.close()


SEED = 123


def test_kitchen_reset_is_reproducible_and_leaves_global_random_alone(kitchen):
    np.random.seed(99)
    expected_next = np.random.RandomState(99).uniform()
    kitchen.reset(SEED)
    first, state = kitchen.fingerprint(), kitchen.get_state()["integration"]
    for _ in range(3):
        kitchen.step(np.zeros(kitchen.action_dim))
    kitchen.reset(SEED)
    assert kitchen.fingerprint() == first
    assert np.array_equal(kitchen.get_state()["integration"], state)
    kitchen.reset(SEED + 1)
    assert kitchen.fingerprint() != first
    assert np.random.uniform() == expected_next
    assert kitchen.task.instruction == rb.TASKS["PreSoakPan"].instruction


def test_kitchen_step_checks_success_and_updates_state_once(kitchen):
    kitchen.reset(SEED)
    checks, updates = _count(kitchen.raw, "_check_success"), _count(kitchen.raw, "update_state")
    try:
        for step in range(1, 4):
            kitchen.step(np.zeros(kitchen.action_dim))
            assert kitchen.is_success() is False
            assert (len(checks), len(updates)) == (step, step)
    finally:
        del kitchen.raw._check_success, kitchen.raw.update_state


def test_kitchen_snapshot_round_trip_is_bit_exact(kitchen):
    from robocasa_shift.backends.base import state_equal

    kitchen.reset(SEED)
    rng = np.random.default_rng(0)
    for _ in range(3):
        kitchen.step(rng.uniform(-0.3, 0.3, kitchen.action_dim))
    snap, fp = kitchen.get_state(), kitchen.fingerprint()
    for _ in range(3):
        kitchen.step(rng.uniform(-0.3, 0.3, kitchen.action_dim))
    kitchen.set_state(snap)
    assert state_equal(kitchen.get_state(), snap) and kitchen.fingerprint() == fp


def test_kitchen_perturbation_hooks(kitchen, protocol):
    from robocasa_shift.engine.perturbations import applied_perturbation, factor_kind
    from robocasa_shift.seeding import draw_rng

    kitchen.reset(SEED)
    clean = kitchen.fingerprint()
    wrist = kitchen.render("robot0_eye_in_hand", 64)
    left = kitchen.render("robot0_agentview_left", 64)
    camera = protocol.factor("camera")
    record = applied_perturbation(camera, "L3", kitchen, factor_kind(camera).draw(camera, draw_rng(0, "camera", "t", "formal", 0)))
    assert record["ok"] and set(record["applied"]) == set(rb.THIRD_PERSON_CAMERAS)
    assert np.array_equal(kitchen.render("robot0_eye_in_hand", 64), wrist)
    assert not np.array_equal(kitchen.render("robot0_agentview_left", 64), left)
    kitchen.restore_nominal()
    assert kitchen.fingerprint() == clean
    light = protocol.factor("illumination")
    assert applied_perturbation(light, "L3", kitchen, None)["ok"]
    kitchen.reset(SEED)
    assert kitchen.fingerprint() == clean


def test_kitchen_base_offset_through_placement(kitchen):
    kitchen.reset(SEED)
    clean = kitchen.fingerprint()
    offset = {"forward_m": 0.02, "side_m": -0.01, "yaw_deg": 2.0}
    assert kitchen.base_offset_problem(offset) is None
    assert kitchen.fingerprint() == clean  # the check put the clean initial state back
    kitchen.set_base_offset(offset)
    measured = kitchen.base_offset()
    assert max(abs(measured[k] - offset[k]) for k in offset) <= rb.BASE_READBACK_ATOL
