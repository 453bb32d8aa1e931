"""The robosuite shortcuts change no bit: full MuJoCo states and observations, step by step, against stock robosuite."""

import numpy as np
import pytest
from helpers import trajectory

pytest.importorskip("robosuite")
pytestmark = pytest.mark.sim

from robocasa_shift.backends import get_backend, robosuite_fastpath  # noqa: E402
from robocasa_shift.core.records import RolloutKey  # noqa: E402
from robocasa_shift.engine.rollout import prepare_episode  # noqa: E402


def test_the_shortcuts_are_pinned_to_the_robosuite_they_were_verified_on():
    import robosuite

    # an upgrade fails here: verify the shortcuts against it (the test below) before moving the pin
    assert robosuite.__version__ == robosuite_fastpath.VERIFIED_ROBOSUITE and robosuite_fastpath.applicable()


@pytest.mark.parametrize("task,condition", [("Lift", "clean"), ("Stack", "base:L2"), ("PickPlaceCan", "illumination:L3"),
                                            ("NutAssemblySquare", "camera:L3")])
def test_states_controllers_and_observations_equal_stock_robosuite_byte_for_byte(task, condition, protocol):
    env = get_backend("robosuite").make(task)
    try:
        assert env.fastpath["enabled"] and env.fastpath["observables_disabled"] and env.fastpath["fused_step"]
        assert env.fastpath["compiled_substeps"] and env.fastpath["compiled_loop"]
        rng = np.random.default_rng(7)
        actions = np.clip(rng.normal(0.0, 0.6, (30, env.action_dim)), -1, 1)
        actions[10:20, 11] = 1.0  # base mode for a while: the arm's goal then follows the desired pose
        key = RolloutKey("formal", task, 1, condition)
        fused = env.raw.step.__self__
        looped = []
        fused._compiled_loop = lambda *args, run=fused._compiled_loop: looped.append(run(*args)) or looped[-1]
        fast = trajectory(env, protocol, key, actions)
        del fused._compiled_loop
        assert fused.problem is None  # the fused step ran, not the stock one
        assert looped == [True] * 30  # and its middle substeps ran in one compiled call each step
        assert robosuite_fastpath.SharedClock.of(env.raw._observables.values()) is not None  # one shared clock
        robosuite_fastpath.disable(env.raw)
        assert "action_dim" not in vars(type(env.raw.robots[0])) and "step" not in vars(env.raw)
        stock = trajectory(env, protocol, key, actions)
    finally:
        env.close()
    assert len(fast) == 30 and len(fast[0]) > 50  # physics, four controllers' attributes, observables, proprio
    for i, (f, s) in enumerate(zip(fast, stock)):
        assert f.keys() == s.keys(), i
        assert [k for k in s if f[k] != s[k]] == [], f"control step {i}"
    assert len({f["integration"] for f in fast}) == 30  # the robot moved: the comparison is not of a still scene


@pytest.mark.parametrize("task,condition", [("Stack", "clean"), ("PickPlaceCan", "base:L3")])
def test_compiled_substeps_set_the_controls_the_python_substeps_set(task, condition, protocol):
    """At every state of a rollout (arm, torso, base and gripper commanded), the compiled substep's controls equal the
    Python substep's byte for byte: a difference that the end of a control step would hide shows here."""
    env = get_backend("robosuite").make(task)
    try:
        prepare_episode(env, protocol, RolloutKey("formal", task, 3, condition))
        fused = env.raw.step.__self__
        fused._middle_substeps = None  # the substeps one by one, each through _compiled_control
        compiled = []
        fused._compiled_control = lambda arguments, run=fused._compiled_control: (compiled.append(1), run(arguments))
        actions = np.clip(np.random.default_rng(5).normal(0.0, 0.6, (25, env.action_dim)), -1, 1)
        actions[15:, 11] = 1.0  # base mode
        ctrl = env.raw.sim.data.ctrl
        for action in actions:
            env.step(action)
            fused._control()
            python = ctrl.tobytes()
            ctrl[:] = np.nan
            fused._compiled_control(fused._compiled_arguments())
            assert ctrl.tobytes() == python
        assert len(compiled) == 25 * (fused.substeps - 2) + 25  # the steps' middle substeps, and the checks
        assert len(set(actions[:, 11] > 0)) == 2
    finally:
        env.close()


def test_the_compiled_loop_of_substeps_gives_the_states_of_substeps_one_by_one(protocol):
    """The middle substeps in one compiled call (MuJoCo's C functions from numba) against the same substeps one by
    one from Python, which a recorder wrapped around ``sim.step2`` forces (as the bench's and a profiler's do): the
    same integration state and controls after every substep the recorder sees, and after every control step."""
    env = get_backend("robosuite").make("Stack")
    try:
        actions = np.clip(np.random.default_rng(11).normal(0.0, 0.6, (20, env.action_dim)), -1, 1)
        key = RolloutKey("formal", "Stack", 2, "base:L2")
        fused = env.raw.step.__self__
        looped = []
        fused._compiled_loop = lambda *args, run=fused._compiled_loop: looped.append(run(*args)) or looped[-1]
        compiled = trajectory(env, protocol, key, actions)
        assert looped == [True] * 20
        recorded = []
        watch = env.sim.step2
        env.sim.step2 = lambda: (recorded.append(env.data.ctrl.tobytes()), watch())[1]  # a foreign wrapper
        looped.clear()
        one_by_one = trajectory(env, protocol, key, actions)
        assert looped == [False] * 20 and len(recorded) == 20 * fused.substeps
        assert len(set(recorded)) > 20 * (fused.substeps - 2)  # the controls change from substep to substep
    finally:
        env.close()
    assert [k for c, o in zip(compiled, one_by_one) for k in c if c[k] != o[k]] == []
    assert len({c["integration"] for c in compiled}) == 20


def test_the_clock_predicts_the_substep_in_which_the_observables_sample():
    """``SharedClock.until_sample`` follows update's branches: the compiled runs of substeps end where a sample falls."""
    from types import SimpleNamespace

    from robosuite.utils.observables import NO_DELAY

    def clock(time, sampled, samples=None):
        member = SimpleNamespace(name="counted", _filter=lambda x: x, _corrupter=lambda x: x,
                                 _sensor=lambda cache: samples.append(1) or np.zeros(1))
        return robosuite_fastpath.SharedClock([member], period=0.05, time=time, sampled=sampled, delay=0.0,
                                              delayer=NO_DELAY)

    in_phase = clock(0.002, True)  # robosuite's 20 Hz sampling at 500 Hz physics, sampled at the first substep
    assert in_phase.until_sample(0.002, 23) == 23
    assert in_phase.until_sample(0.002, 30) == 25  # the period wraps at the 24th update, the 25th samples
    shifted = clock(0.018, True)  # a reset that stepped the physics leaves the clock out of phase with the steps
    assert 1 < shifted.until_sample(0.002, 23) < 23
    assert clock(0.0, False).until_sample(0.002, 23) == 1
    assert (shifted.time, shifted.sampled) == (0.018, True)  # a prediction only
    for start, sampled in ((0.002, True), (0.018, True), (0.036, True), (0.0, False), (0.01, False)):
        n = clock(start, sampled).until_sample(0.002, 40)
        samples = []
        real = clock(start, sampled, samples)
        for k in range(n):
            real.update(0.002, {})
            assert len(samples) == (1 if k == n - 1 else 0), (start, k, n)  # no sample before the predicted one


def test_the_indexed_contact_check_answers_what_robosuites_answers_on_every_group_and_state(protocol):
    """``check_contact`` from geom ids against robosuite's own function, on a Stack rollout whose gripper closes on the
    cubes: every pair of groups (models, single names, lists with and without unnamed geoms, any-contact), every step."""
    from robosuite.utils import sim_utils

    env = get_backend("robosuite").make("Stack")
    try:
        assert env.fastpath["contacts_indexed"]
        check = env.raw.check_contact
        assert isinstance(check, robosuite_fastpath.ContactCheck)
        prepare_episode(env, protocol, RolloutKey("formal", "Stack", 0, "clean"))
        raw = env.raw
        names = [raw.sim.model.geom_id2name(i) for i in range(raw.sim.model.ngeom)]
        named = [n for n in names if n is not None]
        models = [raw.cubeA, raw.cubeB, raw.robots[0].gripper["right"], raw.robots[0].robot_model]
        groups = models + [named[0], named[-1], named[::3], tuple(named[1::5]), set(named[::7]), [None, named[2]],
                           [n for n in named if "table" in n]]
        answers = {True: 0, False: 0}
        rng = np.random.default_rng(3)
        for step in range(40):
            action = np.clip(rng.normal(0.0, 0.5, env.action_dim), -1, 1)
            action[6] = 1.0 if step > 20 else -1.0  # the gripper closes: contacts between it and whatever is there
            action[2] = -1.0  # down, onto the cubes
            env.step(action)
            for first in groups:
                for second in groups + [None]:
                    stock = sim_utils.check_contact(raw.sim, first, second)
                    assert check(first, second) is stock, (step, first, second)
                    answers[stock] += 1
        assert raw.sim.data.ncon > 0 and answers[True] > 100 and answers[False] > 100  # both answers were tested
        model = raw.sim.model  # the joints' qpos addresses, kept: what robosuite's lookup answers, of its type
        assert isinstance(vars(model)["get_joint_qpos_addr"], robosuite_fastpath.JointAddresses)
        for name in model.joint_names * 2:
            kept, stock = model.get_joint_qpos_addr(name), type(model).get_joint_qpos_addr(model, name)
            assert kept == stock and type(kept) is type(stock), name
        assert {type(model.get_joint_qpos_addr(n)) for n in model.joint_names} == {tuple, np.int32}  # free and hinge
        with pytest.raises(ValueError, match="no_such_joint"):
            model.get_joint_qpos_addr("no_such_joint")
        robosuite_fastpath.disable(raw)
        assert "check_contact" not in vars(raw) and "get_joint_qpos_addr" not in vars(model)
    finally:
        env.close()


def test_compiled_clipping_is_numpys_clip_on_edge_values():
    from robocasa_shift.backends.robosuite_kernels import _actuate

    values = np.array([np.nan, -0.0, 0.0, -1.0, 1.0, -2.5, 2.5, 0.3, np.inf, -np.inf])
    low, high = np.full(10, -1.0), np.full(10, 1.0)
    low[1:3], high[1:3] = 0.0, 0.0  # signed zeros against zero bounds
    ctrl = np.full(12, 7.0)
    index = np.arange(2, 12)
    _actuate(ctrl, values, index, low, high)
    assert ctrl[2:].tobytes() == np.clip(values, low, high).tobytes() and ctrl[:2].tolist() == [7.0, 7.0]


def test_without_numpys_blas_every_substep_runs_in_python(monkeypatch, protocol):
    from robocasa_shift.backends import numpy_blas

    monkeypatch.setattr(numpy_blas, "_PROBLEM", "verified with numpy 1.26.4, not 2.0.0")
    env = get_backend("robosuite").make("Lift")
    try:
        assert env.fastpath["fused_step"] and not env.fastpath["compiled_substeps"]
        assert "2.0.0" in env.fastpath["compiled_substeps_reason"]
        fused = env.raw.step.__self__
        fused._compiled_control = None  # called, it would fail
        prepare_episode(env, protocol, RolloutKey("formal", "Lift", 0, "clean"))
        env.step(np.zeros(env.action_dim))
    finally:
        env.close()


def test_a_stack_the_fused_step_does_not_mirror_is_stepped_by_stock_robosuite(protocol):
    """The fused step checks the classes and settings it writes out at every reset; anything else steps stock."""
    env = get_backend("robosuite").make("Lift")
    try:
        key = RolloutKey("formal", "Lift", 0, "clean")
        prepare_episode(env, protocol, key)
        osc = env.raw.robots[0].composite_controller.part_controllers["right"]
        assert robosuite_fastpath.fused_step_problem(env.raw) is None
        osc.uncoupling = False  # what robosuite's OSC does then is not what the fused step computes
        assert "decoupled" in robosuite_fastpath.fused_step_problem(env.raw)
        fused = env.raw.step.__self__
        fused.composite = None  # as after a reset: the next step binds again and finds the change
        rng = np.random.default_rng(1)
        stepped = []
        for action in np.clip(rng.normal(0.0, 0.6, (3, env.action_dim)), -1, 1):
            env.step(action)
            stepped.append(env._integration().tobytes())
        assert "decoupled" in fused.problem
        prepare_episode(env, protocol, key)
        robosuite_fastpath.disable(env.raw)
        env.raw.robots[0].composite_controller.part_controllers["right"].uncoupling = False
        stock = []
        for action in np.clip(np.random.default_rng(1).normal(0.0, 0.6, (3, env.action_dim)), -1, 1):
            env.step(action)
            stock.append(env._integration().tobytes())
        assert stepped == stock
    finally:
        env.close()


def test_a_step_leaves_the_callers_action_as_it_was_and_driving_the_base_is_reproducible(protocol):
    """robosuite's mobile-base controller rotates the base command of the array it gets, in place: the policy's
    own action (and the step log's copy of it) changed under it, and repeating a rollout's actions drifted."""
    env = get_backend("robosuite").make("Lift")
    try:
        rng = np.random.default_rng(7)
        actions = np.clip(rng.normal(0.0, 0.6, (12, env.action_dim)), -1, 1)  # base and torso commands too
        given = actions.copy()
        key = RolloutKey("formal", "Lift", 1, "clean")
        first = trajectory(env, protocol, key, actions)
        assert np.array_equal(actions, given)
        assert trajectory(env, protocol, key, actions) == first
    finally:
        env.close()


TRAJECTORY_HASH = """
import os
for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.pop(name, None)  # numpy's own default pool (one thread per core), whatever the test runner set
import hashlib, numpy as np
{threads}
from threadpoolctl import threadpool_info
print(max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"))
from robocasa_shift.core import specs
from robocasa_shift.backends import get_backend
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import prepare_episode
env = get_backend("robosuite").make("Stack")
prepare_episode(env, specs.load_protocol(), RolloutKey("formal", "Stack", 2, "clean"))
h = hashlib.sha256()
for action in np.clip(np.random.default_rng(3).normal(0.0, 0.6, (20, env.action_dim)), -1, 1):
    env.step(action)
    h.update(env._integration().tobytes())
    h.update(b"".join(v.tobytes() for _, v in sorted(env.proprio().items())))
print(h.hexdigest())
"""


def test_one_blas_thread_gives_the_states_of_numpys_default_pool():
    """Workers cap numpy's BLAS pool at their thread count (apply_threads); robosuite's results must not notice."""
    import os

    from helpers import run_python

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: numpy's default BLAS pool is one thread already")
    default = run_python(TRAJECTORY_HASH.format(threads="")).split()
    capped = run_python(TRAJECTORY_HASH.format(threads="from robocasa_shift.study.worker import apply_threads; "
                                                        "apply_threads(1)")).split()
    assert int(default[0]) >= 2 and int(capped[0]) == 1  # the pools really differed
    assert len(default[1]) == 64 and default[1] == capped[1]


def test_a_numba_that_cannot_be_imported_leaves_the_substeps_in_python_with_the_reason(monkeypatch, protocol):
    """A broken numba or llvmlite must not stop an environment from being built: the fused step runs its substeps in
    Python and the reason is what the manifest records."""
    import sys

    import robocasa_shift.backends as backends

    monkeypatch.delattr(backends, "robosuite_kernels", raising=False)
    monkeypatch.setitem(sys.modules, "robocasa_shift.backends.robosuite_kernels", None)  # importing it now fails
    env = get_backend("robosuite").make("Lift")
    try:
        info = env.simulator_info()["fastpath"]
        assert info["fused_step"] and info["compiled_substeps"] is False
        assert "unavailable" in info["compiled_substeps_reason"] and "robosuite_kernels" in info["compiled_substeps_reason"]
        prepare_episode(env, protocol, RolloutKey("formal", "Lift", 0, "clean"))
        env.step(np.zeros(env.action_dim))
    finally:
        env.close()


def test_the_stock_simulator_switch_turns_every_shortcut_off_and_says_so():
    env = get_backend("robosuite").make("Lift", stock_simulator=True)
    try:
        info = env.simulator_info()
        assert info["stock_simulator"] and not info["culling"]
        assert info["fastpath"] == {"enabled": False, "reason": "stock simulator requested"}
        assert "step" not in vars(env.raw)  # robosuite's own step method
        assert not getattr(type(env.raw.robots[0]), "_fastpath", False)
    finally:
        env.close()


@pytest.mark.slow
def test_a_run_on_the_stock_simulator_gives_the_same_records_and_its_manifest_says_what_ran(tmp_path):
    """The switch reaches the workers through the study config; the manifest records what ran on each side."""
    import json

    from robocasa_shift import run_study
    from robocasa_shift.checks.reproduction import diff_runs
    from robocasa_shift.config import ExecutionConfig, StudyConfig

    execution = ExecutionConfig(workers=1, progress=False)
    for name, stock in (("fast", False), ("stock", True)):
        run_study(tmp_path / name, ["Lift"], ["clean", "camera:L2", "blur:L1"], [0],
                  study=StudyConfig(policy="reference", stock_simulator=stock), execution=execution)
    assert diff_runs(tmp_path / "fast", tmp_path / "stock")["passed"]
    fast, stock = (json.loads((tmp_path / n / "manifest.json").read_text())["simulator"] for n in ("fast", "stock"))
    from robocasa_shift.backends import numpy_blas

    assert fast["culling"] and fast["fastpath"]["fused_step"]
    assert fast["fastpath"]["compiled_substeps"] is (numpy_blas.problem() is None)
    assert fast["numba"] and fast["llvmlite"]
    assert stock["stock_simulator"] and not stock["culling"] and not stock["fastpath"]["enabled"]
