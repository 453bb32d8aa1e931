"""Server-side batching on the GR00T launcher: several sessions' get_action in one model call, each session's
actions bit-identical to an unbatched launcher's (its noise from its own generator)."""

import numpy as np
import pytest

from robocasa_shift.bench import served_batching
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.standin import ACTION_KEY, STATE_KEY, CostModel

pytest.importorskip("zmq")


def test_batched_sessions_get_the_actions_they_get_alone_and_batches_form():
    # the measurement refuses to report when any session's actions differ; small costs keep it quick
    figures = served_batching(workers=4, requests=8, c0_s=0.02, c1_s=0.002, max_wait_ms=20.0)
    assert figures["served_mean_batch"] > 1.5, figures  # requests of different sessions were answered together
    assert figures["served_batching_speedup"] > 1.0, figures


def test_the_batch_path_is_the_one_that_draws_each_sessions_noise_from_its_own_generator():
    """Both sides of the claim: with batches forming, two sessions seeded alike get equal actions, and seeded
    differently get different ones (a batch that shared one generator would give neither)."""
    launcher = Gr00tLauncher(CostModel(0.0, 0.0), "127.0.0.1", 0, max_batch=2, max_wait_ms=200.0)
    launcher.start()
    try:
        import threading

        replies = {}

        def ask(name, seed):
            client = Gr00tClient("127.0.0.1", launcher.port, timeout_s=10.0, retries=0)
            client.reset(seed)
            replies[name] = [np.asarray(client.get_action({STATE_KEY: np.zeros((1, 3))})[ACTION_KEY]) for _ in range(3)]
            client.close()

        for pair in ((("a", 7), ("b", 7)), (("c", 7), ("d", 8))):
            threads = [threading.Thread(target=ask, args=args) for args in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert 2 in launcher.model.batch_sizes
        assert all(np.array_equal(x, y) for x, y in zip(replies["a"], replies["b"]))
        assert all(np.array_equal(x, y) for x, y in zip(replies["a"], replies["c"]))
        assert not np.array_equal(replies["c"][0], replies["d"][0])
    finally:
        launcher.stop()


def test_the_launcher_refuses_a_batch_below_one():
    with pytest.raises(ValueError, match="max_batch"):
        Gr00tLauncher(CostModel(), "127.0.0.1", 0, max_batch=0)
