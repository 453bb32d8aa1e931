"""StageTracker semantics on a tiny fake state (the real-simulator checks are in test_sim.py)."""

import pytest

from robocasa_shift.engine.stages import PREDICATES, StageTracker, predicate
from robocasa_shift.specs import StageSpec, Subgoal


class FakeState:
    def __init__(self):
        self.flags = {}
        self.calls = []


@predicate("fake", "flag")
def flag(env, name):
    env.calls.append(name)
    return env.flags.get(name, False)


@predicate("fake", "explode")
def explode(env):
    raise ZeroDivisionError("boom")


def spec(*goals):
    return StageSpec(
        task="T",
        backend="fake",
        version=1,
        description="",
        subgoals=tuple(Subgoal(g[0], "", g[1], g[2] if len(g) > 2 else {}) for g in goals),
        path="-",
        content_hash="0" * 64,
    )


ABC = spec(("a", "flag", {"name": "a"}), ("b", "flag", {"name": "b"}), ("c", "flag", {"name": "c"}))


def test_latches_in_order_and_cascades_on_one_state():
    env = FakeState()
    tracker = StageTracker(ABC)
    env.flags = {"b": True, "c": True}  # later goals hold first: nothing latches out of order
    assert tracker.update(env, 1) == []
    env.flags["a"] = True
    assert tracker.update(env, 2) == ["a", "b", "c"]  # several latch in one step
    result = tracker.result()
    assert result.stage_steps == [2, 2, 2]
    assert result.first_incomplete is None and result.completed == 3 and result.progress == 1.0


def test_latched_goals_are_never_reevaluated():
    env = FakeState()
    tracker = StageTracker(ABC)
    env.flags = {"a": True}
    tracker.update(env, 1)
    env.flags = {}  # a no longer holds: it stays latched
    env.calls.clear()
    tracker.update(env, 2)
    assert env.calls == ["b"]  # only the current subgoal is evaluated
    result = tracker.result()
    assert result.stage_steps == [1, None, None]
    assert result.completed == 1 and result.first_incomplete == 2


def test_a_raising_predicate_is_an_error_not_false():
    env = FakeState()
    tracker = StageTracker(spec(("a", "flag", {"name": "a"}), ("b", "explode"), ("c", "flag", {"name": "c"})))
    env.flags = {"a": True, "c": True}
    assert tracker.update(env, 5) == ["a"]
    result = tracker.result()
    assert "subgoal 'b'" in result.error and "ZeroDivisionError: boom" in result.error and "step 5" in result.error
    env.calls.clear()
    tracker.update(env, 6)  # a stopped tracker evaluates nothing more
    assert env.calls == [] and result.first_incomplete == 2


def test_non_boolean_result_is_an_error():
    @predicate("fake", "number")
    def number(env):
        return 0.7

    tracker = StageTracker(spec(("a", "number")))
    tracker.update(FakeState(), 1)
    assert "not a bool" in tracker.result().error


def test_unknown_predicate_lists_known():
    with pytest.raises(KeyError, match="unknown predicate 'fake.nope'"):
        StageTracker(spec(("a", "nope")))
    assert "fake.flag" in PREDICATES.names()
