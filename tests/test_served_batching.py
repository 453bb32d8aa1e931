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


class OpenpiBatchPolicy:
    """openpi's policy interface with ``infer_batch``: noise from torch's global generator (the shim installs
    the connection's), drawn alike alone or in a batch."""

    metadata = {"name": "batch-standin"}

    def __init__(self):
        self.batch_sizes = []

    @staticmethod
    def _noise():
        import torch

        return torch.randn(4, 3, dtype=torch.float64).numpy()

    def infer(self, obs):
        self.batch_sizes.append(1)
        return {"actions": np.asarray(obs["state"])[None] * 0.1 + 0.01 * self._noise()}

    def infer_batch(self, observations, rngs):
        noises = [rng.run(self._noise) for rng in rngs]
        self.batch_sizes.append(len(observations))
        return [{"actions": np.asarray(o["state"])[None] * 0.1 + 0.01 * n} for o, n in zip(observations, noises)]


def test_the_openpi_shim_batches_connections_and_each_keeps_its_own_actions():
    pytest.importorskip("openpi_client")
    import threading

    from robocasa_shift.policies.openpi.client import make_client
    from robocasa_shift.policies.openpi.server import OpenpiShim

    def actions(max_batch, seeds):
        shim = OpenpiShim(OpenpiBatchPolicy(), "127.0.0.1", 0, max_batch=max_batch, max_wait_ms=200.0)
        shim.start()
        out = {}

        def worker(name, seed):
            client = make_client("127.0.0.1", shim.port, timeout_s=10.0)
            client.reset_seed(seed)
            out[name] = [np.asarray(client.infer({"state": np.full(3, step, np.float64)})["actions"])
                         for step in range(3)]
            client.close()

        threads = [threading.Thread(target=worker, args=item) for item in seeds.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        shim.stop()
        return out, shim.policy.batch_sizes

    alone, _ = actions(1, {"a": 7, "b": 8})
    together, sizes = actions(2, {"a": 7, "b": 8})
    assert 2 in sizes  # the two connections were answered by one call
    for name in ("a", "b"):
        assert all(np.array_equal(x, y) for x, y in zip(alone[name], together[name]))
    assert not np.array_equal(together["a"][0], together["b"][0])
