"""The robosuite shortcuts change no bit: full MuJoCo states and observations, step by step, against stock robosuite."""

import numpy as np
import pytest

pytest.importorskip("robosuite")
pytestmark = pytest.mark.sim

from robocasa_shift import specs  # noqa: E402
from robocasa_shift.backends import get_backend, robosuite_fastpath  # noqa: E402
from robocasa_shift.engine.records import RolloutKey  # noqa: E402
from robocasa_shift.engine.rollout import inject, prepare_episode  # noqa: E402


def trajectory(env, protocol, key, actions):
    """(integration state bytes, delivered proprioception) after every control step of ``actions`` from ``key``."""
    prepare_episode(env, protocol, key)
    inject(env, protocol, key)
    states, proprio = [], []
    for action in actions:
        env.step(action)
        states.append(env._integration().tobytes())
        proprio.append({k: v.tobytes() for k, v in env.proprio().items()})
    return states, proprio


def test_the_shortcuts_are_pinned_to_the_robosuite_they_were_verified_on():
    import robosuite

    # an upgrade fails here: verify the shortcuts against it (the test below) before moving the pin
    assert robosuite.__version__ == robosuite_fastpath.VERIFIED_ROBOSUITE and robosuite_fastpath.applicable()


@pytest.mark.parametrize("task,condition", [("Lift", "clean"), ("Stack", "base:L2"), ("PickPlaceCan", "illumination:L3")])
def test_states_and_observations_equal_stock_robosuite_byte_for_byte(task, condition, protocol):
    env = get_backend("robosuite").make(task)
    try:
        assert env.fastpath["enabled"] and env.fastpath["observables_disabled"]
        rng = np.random.default_rng(7)
        actions = np.clip(rng.normal(0.0, 0.6, (30, env.action_dim)), -1, 1)
        key = RolloutKey("formal", task, 1, condition)
        fast = trajectory(env, protocol, key, actions)
        robosuite_fastpath.disable(env.raw)
        assert "action_dim" not in vars(type(env.raw.robots[0]))  # the robot's own class again
        stock = trajectory(env, protocol, key, actions)
    finally:
        env.close()
    assert len(fast[0]) == 30 and fast[0] == stock[0]  # every substep's integrated state, all 30 control steps
    assert fast[1] == stock[1]  # what policies are given
    assert len({s for s in fast[0]}) == 30  # the robot moved: the comparison is not of a still scene


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
