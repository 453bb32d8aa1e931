"""A GR00T-interface model whose every call costs ``c0 + c1 x batch`` seconds: the stand-in that measures the
launcher's batching (``make bench``) without a GPU.

A real policy server's GPU spends a fixed cost per forward pass (kernel launches, weights read once) plus a
small cost per item; batching the requests of several workers pays the fixed cost once. Its actions are the
observed state plus noise drawn from the session's generator (torch's when the launcher has torch, else
numpy's), drawn the same way alone or in a batch: a session's actions do not depend on the batch.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Mapping, Sequence

import numpy as np

STATE_KEY = "state.position"
ACTION_KEY = "action.delta"


class CostModel:
    """``get_action`` / ``get_action_batch`` costing ``c0_s + c1_s * batch`` (slept, so other threads run)."""

    def __init__(self, c0_s: float = 0.040, c1_s: float = 0.005, chunk: int = 8, dim: int = 3):
        self.c0_s, self.c1_s, self.chunk, self.dim = float(c0_s), float(c1_s), int(chunk), int(dim)
        self.batch_sizes: List[int] = []  # every model call's batch size, for checks

    def get_modality_config(self) -> Dict[str, Any]:
        return {"cost_model": {"c0_s": self.c0_s, "c1_s": self.c1_s, "chunk": self.chunk, "dim": self.dim}}

    def _noise(self) -> np.ndarray:
        try:
            import torch
        except ImportError:
            return np.random.standard_normal((self.chunk, self.dim))
        return torch.randn(self.chunk, self.dim, dtype=torch.float64).numpy()

    def _reply(self, obs: Mapping[str, Any], noise: np.ndarray) -> Dict[str, np.ndarray]:
        state = np.asarray(obs[STATE_KEY], dtype=np.float64).reshape(-1)[: self.dim]
        return {ACTION_KEY: state[None] * 0.1 + 0.01 * noise}

    def get_action(self, obs: Mapping[str, Any]) -> Dict[str, np.ndarray]:
        """One observation; the noise from the global generator (the launcher installs the session's)."""
        noise = self._noise()
        self.batch_sizes.append(1)
        time.sleep(self.c0_s + self.c1_s)
        return self._reply(obs, noise)

    def get_action_batch(self, observations: Sequence[Mapping[str, Any]], rngs: Sequence[Any]) -> List[Dict]:
        """Several sessions' observations in one call; each noise drawn inside its session's ``rng.run``."""
        noises = [rng.run(self._noise) for rng in rngs]
        self.batch_sizes.append(len(observations))
        time.sleep(self.c0_s + self.c1_s * len(observations))
        return [self._reply(obs, noise) for obs, noise in zip(observations, noises)]


def make_cost_model(c0_s: float = 0.040, c1_s: float = 0.005) -> CostModel:
    """The launcher's factory: ``serve --model-factory robocasa_shift.policies.gr00t.standin:make_cost_model``."""
    return CostModel(c0_s, c1_s)


__all__ = ["ACTION_KEY", "STATE_KEY", "CostModel", "make_cost_model"]
