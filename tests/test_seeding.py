import numpy as np

from robocasa_shift import seeding


def test_derive_seed_is_a_pure_function_of_named_inputs():
    a = seeding.derive_seed(7, stream="env", task="Lift", phase="formal", episode=3)
    b = seeding.derive_seed(7, episode=3, phase="formal", task="Lift", stream="env")
    assert a == b
    # pinned: changing the derivation silently would change every study
    assert seeding.derive_seed(20260117, stream="env", task="Lift", phase="formal", episode=0) == 6120914621734136111


def test_streams_tasks_phases_and_episodes_differ():
    base = dict(stream="env", task="Lift", phase="formal", episode=0)
    seeds = {seeding.derive_seed(1, **base)}
    for k, v in [("stream", "policy"), ("task", "Stack"), ("phase", "screening"), ("episode", 1)]:
        seeds.add(seeding.derive_seed(1, **{**base, k: v}))
    seeds.add(seeding.derive_seed(2, **base))
    assert len(seeds) == 6
    assert all(0 <= s < 2**63 for s in seeds)


def test_policy_seed_depends_on_replicate_not_condition():
    s0 = seeding.policy_seed(1, "Lift", "formal", 4, replicate=0)
    s1 = seeding.policy_seed(1, "Lift", "formal", 4, replicate=1)
    assert s0 != s1 and s0 == seeding.policy_seed(1, "Lift", "formal", 4)


def test_draw_stream_is_reproducible():
    a = seeding.draw_rng(1, "camera", "Lift", "formal", 2).standard_normal(3)
    b = seeding.draw_rng(1, "camera", "Lift", "formal", 2).standard_normal(3)
    np.testing.assert_array_equal(a, b)
