"""``replay``: plays back recorded demonstrations, open loop.

The demonstration is chosen by the policy seed of the rollout (a function of
study seed, task, phase, episode and replicate), so replaying from a run
reproduces each recorded episode exactly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional

import numpy as np

from robocasa_shift.core.demos import load_demo
from robocasa_shift.core.policy import Policy


class ReplayPolicy(Policy):
    name = "replay"

    def __init__(self, demo_dir: str = "demos"):
        self.demo_dir = Path(demo_dir)
        self._demos: Dict[int, np.ndarray] = {}
        for path in sorted(self.demo_dir.rglob("*.npz")):
            demo = load_demo(path)
            self._demos[int(demo["meta"]["policy_seed"])] = demo["actions"]
        self._actions: Optional[np.ndarray] = None
        self._next = 0

    def reset(self, seed: int) -> None:
        if seed not in self._demos:
            raise KeyError(f"no demonstration in {self.demo_dir} for policy seed {seed} ({len(self._demos)} demos loaded)")
        self._actions, self._next = self._demos[seed], 0

    def get_state(self) -> Dict[str, np.ndarray]:
        """Where in the demonstration it is; ``reset(seed)`` picks the demonstration."""
        return {"next": np.asarray(self._next, dtype=np.int64)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        self._next = int(state["next"])

    def act(self, obs) -> np.ndarray:
        if self._next >= len(self._actions):
            raise IndexError("the demonstration has no more actions")
        self._next += 1
        return self._actions[self._next - 1][None]

    def identity(self):
        return {"name": self.name, "demo_dir": str(self.demo_dir), "demos": len(self._demos)}
