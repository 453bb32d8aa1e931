"""Policy snapshots for branching: get_state at a chunk boundary, through an .npz file, set_state in a
fresh instance after reset(seed), and the continuation is bit-identical; policies that cannot are refused."""

import io

import numpy as np
import pytest

from robocasa_shift.backends import get_backend
from robocasa_shift.core.backend import cameras_for_roles
from robocasa_shift.core.policy import (
    Observation,
    Policy,
    numpy_rng_state,
    set_numpy_rng_state,
    state_support,
)
from robocasa_shift.core.specs import load_stage_spec
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.errors import BadInput, StateUnsupported
from robocasa_shift.policies import POLICIES, make_policy
from robocasa_shift.policies.served.policy import RemotePolicy

SEED = 11
REMOTE_REASON = ("the policy server holds its generators and the protocol has no call to read or restore them, "
                 "so remote policies cannot be branched")


def observe(env, policy, task, step):
    """What ``Rollout.observe`` gives the policy (its cameras at its size), without perturbation."""
    cameras = cameras_for_roles(env, policy.camera_roles)
    return Observation({c: env.render(c, policy.image_size) for c in cameras},
                       {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in cameras},
                       env.proprio(), env.task.instruction, step,
                       privileged=env.privileged_state() if policy.privileged else None, task=task)


def boundary_observations(env, make, task, n):
    """The observations at ``n`` successive chunk boundaries of a closed-loop rollout of a fresh policy."""
    policy, steps, out = make(), 0, []
    env.reset(SEED)
    policy.reset(SEED)
    for _ in range(n):
        out.append(observe(env, policy, task, steps))
        for action in np.atleast_2d(policy.act(out[-1])):
            env.step(action)
            steps += 1
    return out


def through_npz(state):
    """``state`` written with savez_compressed and read back without pickle, as branching stores it."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **state)
    buffer.seek(0)
    with np.load(buffer, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def assert_portable(state):
    assert all(isinstance(k, str) for k in state)
    for key, value in state.items():
        assert isinstance(value, np.ndarray) and value.dtype != object, key
        assert value.dtype.kind in "biuf", (key, value.dtype)


def assert_states_equal(a, b):
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def check_continuation(make, observations, at, stochastic):
    """Snapshot after ``at`` decisions; a fresh, reset and restored instance continues bit for bit."""
    original = make()
    original.reset(SEED)
    for obs in observations[:at]:
        original.act(obs)
    state = original.get_state()
    assert_portable(state)
    loaded = through_npz(state)
    assert_states_equal(state, loaded)
    expected = [original.act(obs) for obs in observations[at:]]

    restored = make()
    restored.reset(SEED)
    restored.set_state(loaded)
    assert_states_equal(restored.get_state(), state)
    got = [restored.act(obs) for obs in observations[at:]]
    assert all(np.array_equal(e, g) for e, g in zip(expected, got))
    assert_states_equal(restored.get_state(), original.get_state())

    if stochastic:  # the snapshot is what makes it identical: a plain reset does not
        plain = make()
        plain.reset(SEED)
        assert not all(np.array_equal(e, plain.act(obs)) for e, obs in zip(expected, observations[at:]))
    return state


@pytest.fixture(scope="module")
def fake_env():
    env = get_backend("fake").make("PickPlace")
    yield env
    env.close()


@pytest.mark.parametrize("name, stochastic", [("fake", True), ("fake-expert", False), ("fake-random", True)])
def test_fake_policies_continue_bit_for_bit_from_a_snapshot(fake_env, name, stochastic):
    observations = boundary_observations(fake_env, lambda: make_policy(name), "PickPlace", 10)
    state = check_continuation(lambda: make_policy(name), observations, 4, stochastic)
    if name == "fake":
        assert "rng" in state and any(k.startswith("memory.") for k in state)
    if name == "fake-expert":
        assert state == {}


def test_the_fake_policys_memory_is_rebuilt_exactly_with_no_extra_keys():
    policy = make_policy("fake")
    policy.reset(SEED)
    policy._memory = {"object": np.array([0.5, 0.1]), "target": np.array([0.6, -0.1])}
    state = policy.get_state()
    other = make_policy("fake")
    other.reset(SEED)
    other._memory = {"stale": np.zeros(2)}
    other.set_state(through_npz({k: v for k, v in state.items() if k != "memory.target"}))
    assert set(other._memory) == {"object"} and np.array_equal(other._memory["object"], [0.5, 0.1])


def test_replay_continues_from_its_snapshot(tmp_path, fake_env):
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.specs import load_protocol
    from robocasa_shift.engine.demo_recorder import record_demo

    key = RolloutKey("validation", "PickPlace", 3, "clean")
    record, _ = record_demo(fake_env, make_policy("fake"), key, load_protocol(), load_stage_spec("fake", "PickPlace"),
                            "fake", tmp_path)

    def make():
        policy = make_policy("replay", demo_dir=str(tmp_path))
        policy.reset = lambda seed, reset=policy.reset: reset(record.policy_seed)  # SEED stands for the demo's
        return policy

    state = check_continuation(make, [None] * 8, 3, stochastic=True)
    assert int(state["next"]) == 3 and state["next"].dtype == np.int64 and state["next"].shape == ()


def test_set_state_keeps_no_reference_into_the_given_arrays(fake_env):
    observations = boundary_observations(fake_env, lambda: make_policy("fake"), "PickPlace", 6)
    original = make_policy("fake")
    original.reset(SEED)
    for obs in observations[:3]:
        original.act(obs)
    state = original.get_state()
    expected = original.act(observations[3])

    given = {k: v.copy() for k, v in state.items()}
    restored = make_policy("fake")
    restored.reset(SEED)
    restored.set_state(given)
    for value in given.values():  # scribble over what was handed in
        value[...] = 0
    assert np.array_equal(restored.act(observations[3]), expected)
    assert all(not np.shares_memory(v, w) for v in restored._memory.values() for w in state.values())


def test_numpy_rng_state_is_json_in_uint8_and_restores_the_stream():
    gen = np.random.default_rng(5)
    gen.normal(size=3)
    saved = numpy_rng_state(gen)
    assert saved.dtype == np.uint8 and saved.ndim == 1
    expected = gen.normal(size=4)
    other = np.random.default_rng(0)
    set_numpy_rng_state(other, through_npz({"rng": saved})["rng"])
    assert np.array_equal(other.normal(size=4), expected)


# ------------------------------------------------------------------ refusals


class Plain(Policy):
    """A policy that never says how to snapshot itself."""

    name = "plain"

    def act(self, obs):
        return np.zeros((1, 3))


class Served(RemotePolicy):
    name = "served"


@pytest.mark.parametrize("policy, reason", [
    (Plain(), "policy 'plain': it does not implement get_state/set_state, so it cannot be branched"),
    (Served(), f"policy 'served': {REMOTE_REASON}"),
])
def test_a_policy_without_state_support_is_refused_with_its_reason(policy, reason):
    assert state_support(policy) == reason and state_support(type(policy)) == reason
    for call in (policy.get_state, lambda: policy.set_state({})):
        with pytest.raises(StateUnsupported) as info:
            call()
        assert str(info.value) == reason
    assert issubclass(StateUnsupported, BadInput) and StateUnsupported.exit_code == 2


def test_every_registered_policy_says_whether_it_can_be_branched():
    support = {name: state_support(POLICIES.get(name)) for name in POLICIES.names()}
    for name in ("expert", "random", "replay", "reference", "reference-blind", "fake", "fake-expert", "fake-random"):
        assert support[name] is None, name
    for name in ("gr00t", "openpi"):  # as classes: a server that offers no state calls; instances ask theirs
        assert support[name] == f"policy '{name}': {REMOTE_REASON}"
    assert support["lerobot"] is None  # its instances refuse a policy class whose episode state they cannot read


class DuckTyped:
    """A user's plain class with the policy methods, registered without subclassing Policy."""

    name = "duck"
    camera_roles = ("third_person",)

    def reset(self, seed):
        pass

    def act(self, obs):
        return np.zeros((1, 3))


class DuckTypedWithState(DuckTyped):
    name = "duck-state"

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


def test_a_duck_typed_policy_gets_an_answer_not_an_attribute_error():
    reason = "policy 'duck': it does not implement get_state/set_state, so it cannot be branched"
    assert state_support(DuckTyped) == reason and state_support(DuckTyped()) == reason
    assert state_support(DuckTypedWithState) is None and state_support(DuckTypedWithState()) is None


def test_overriding_only_one_of_the_two_is_not_support():
    class Half(Plain):
        name = "half"

        def get_state(self):
            return {}

    assert "policy 'half'" in state_support(Half())


# ------------------------------------------------------------------ stage tracker


def test_stage_tracker_round_trips_its_latches_through_npz(fake_env):
    spec = load_stage_spec("fake", "PickPlace")
    tracker, policy = StageTracker(spec), make_policy("fake-expert")
    fake_env.reset(SEED)
    step = 0
    while tracker.result().completed < 2:
        fake_env.step(policy.act(observe(fake_env, policy, "PickPlace", step))[0])
        step += 1
        tracker.update(fake_env, step)
        assert step < 40
    state = tracker.get_state()
    assert_portable(state)
    assert state["stage_steps"].dtype == np.int64 and state["stage_steps"][-1] == -1 and state["error"].size == 0

    restored = StageTracker(spec)
    restored.set_state(through_npz(state))
    assert restored.result() == tracker.result() and restored._next == tracker._next
    for tr in (tracker, restored):  # both latch the rest on the same steps
        fake_env_state = fake_env.get_state()
        s = step
        while tr.result().completed < len(spec.subgoals) and s < step + 40:
            fake_env.step(policy.act(observe(fake_env, policy, "PickPlace", s))[0])
            s += 1
            tr.update(fake_env, s)
        fake_env.set_state(fake_env_state)
    assert restored.result() == tracker.result() and tracker.result().completed == len(spec.subgoals)

    tracker.error = "subgoal 'x': ValueError: é"
    again = StageTracker(spec)
    again.set_state(through_npz(tracker.get_state()))
    assert again.error == tracker.error
    with pytest.raises(ValueError, match="subgoals"):
        again.set_state({**state, "stage_steps": np.array([-1], dtype=np.int64)})


# ------------------------------------------------------------------ the real simulator


@pytest.mark.sim
@pytest.mark.parametrize("name, decisions, at, stochastic", [
    ("expert", 14, 8, False), ("random", 6, 3, True), ("reference", 6, 3, True),
])
def test_simulator_policies_continue_bit_for_bit_from_a_snapshot(lift_env, name, decisions, at, stochastic):
    if name == "reference":
        pytest.importorskip("torch")
    observations = boundary_observations(lift_env, lambda: make_policy(name), "Lift", decisions)
    state = check_continuation(lambda: make_policy(name), observations, at, stochastic)
    if name == "reference":
        assert state["generator"].dtype == np.uint8 and any(k.startswith("estimates.third.") for k in state)
    if name == "expert":
        assert "memo.target" in state and state["phase"].shape == ()
