"""StageTracker semantics on a tiny fake state (the real-simulator checks are in test_sim.py)."""

import pytest

from robocasa_shift.core.specs import StageSpec, Subgoal
from robocasa_shift.core.stages import PREDICATES, StageTracker, predicate


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


def grouped(*goals):
    """A spec of unordered groups: goals are (id, flag name, group)."""
    return StageSpec(task="T", backend="fake", version=1, description="",
                     subgoals=tuple(Subgoal(g[0], "", "flag", {"name": g[1]}, group=g[2]) for g in goals),
                     path="-", content_hash="0" * 64)


# two conjuncts of one goal, each a grasp then its placement
TWO_CONJUNCTS = grouped(("grasp_soup", "gs", "soup"), ("soup_in_basket", "ps", "soup"),
                        ("grasp_sauce", "gt", "sauce"), ("sauce_in_basket", "pt", "sauce"))


def test_unordered_groups_latch_on_their_own_and_read_the_first_incomplete_in_spec_order():
    env = FakeState()
    tracker = StageTracker(TWO_CONJUNCTS)
    env.flags = {"gt": True}  # the second conjunct's grasp first: it latches although the first group has none
    assert tracker.update(env, 3) == ["grasp_sauce"]
    env.flags = {"pt": True}  # the sauce is placed
    assert tracker.update(env, 5) == ["sauce_in_basket"]
    result = tracker.result()
    assert result.stage_steps == [None, None, 3, 5]
    assert result.completed == 2 and result.first_incomplete == 1  # depth 2, yet the soup is still open
    env.flags = {"ps": True}  # the soup lands in the basket without a grasp seen: the placement implies it
    assert tracker.update(env, 9) == ["grasp_soup", "soup_in_basket"]
    assert tracker.result().stage_steps == [9, 9, 3, 5] and tracker.result().first_incomplete is None
    env.flags = {}
    assert tracker.update(env, 10) == [] and tracker.result().completed == 4  # latched stays latched


def test_unordered_groups_snapshot_and_restore_exactly():
    env = FakeState()
    tracker = StageTracker(TWO_CONJUNCTS)
    env.flags = {"pt": True}
    tracker.update(env, 4)
    other = StageTracker(TWO_CONJUNCTS)
    other.set_state(tracker.get_state())
    env.flags = {"gs": True}
    assert other.update(env, 6) == tracker.update(env, 6) == ["grasp_soup"]
    assert other.result().stage_steps == tracker.result().stage_steps == [6, None, 4, 4]


def test_a_stage_spec_mixing_grouped_and_ungrouped_subgoals_or_splitting_a_group_is_refused(tmp_path):
    from robocasa_shift.core.specs import load_stage_spec
    from robocasa_shift.errors import SpecError

    folder = tmp_path / "fake"
    folder.mkdir()
    base = "task: T\nbackend: fake\nversion: 1\ndescription: d\nsubgoals:\n"
    goal = "  - {{id: {0}, description: d, predicate: flag, args: {{name: {0}}}{1}}}\n"
    (folder / "T.yaml").write_text(base + goal.format("a", ", group: g") + goal.format("b", ""))
    with pytest.raises(SpecError, match=r"subgoals\[1\].group.*every subgoal names a group"):
        load_stage_spec("fake", "T", tmp_path)
    (folder / "T.yaml").write_text(base + goal.format("a", ", group: g") + goal.format("b", ", group: h")
                                   + goal.format("c", ", group: g"))
    with pytest.raises(SpecError, match="consecutive"):
        load_stage_spec("fake", "T", tmp_path)
    (folder / "T.yaml").write_text(base + goal.format("a", ", group: g") + goal.format("b", ", group: h"))
    spec = load_stage_spec("fake", "T", tmp_path)
    assert spec.unordered and spec.chains() == [[0], [1]]
