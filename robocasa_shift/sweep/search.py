"""Which grid levels a base episode runs, and where it broke.

Pure functions of an ``outcome(level)`` callable (success of the base episode at grid level ``level``, run on
first ask and remembered), so the same search runs on the fake backend, a simulator, or a table in a test.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

MODES = ("bisect", "grid")
# an episode's verdict
BROKE, NEVER_BROKE, FAILED_CLEAN = "broke", "never broke up to the maximum", "already failed clean"


@dataclass
class EpisodeBreak:
    """Where one base episode broke on the grid.

    Attributes:
        episode: the base episode.
        verdict: :data:`BROKE`, :data:`NEVER_BROKE` or :data:`FAILED_CLEAN`.
        critical: the grid index of the smallest severity that failed (None unless it broke).
        outcomes: grid index -> success, for every level run (-1 is the clean twin).
        non_monotone: a success was seen above a failure (only a full grid can see every one).
    """

    episode: int
    verdict: str
    critical: Optional[int] = None
    outcomes: Dict[int, bool] = field(default_factory=dict)
    non_monotone: bool = False

    @property
    def rollouts(self) -> int:
        """Rollouts this episode spent, its clean twin included."""
        return len(self.outcomes)

    def to_json(self) -> dict:
        out = asdict(self)
        out["outcomes"] = {str(k): v for k, v in sorted(self.outcomes.items())}
        return out


def find_break(episode: int, levels: int, outcome: Callable[[int], bool], mode: str = "bisect") -> EpisodeBreak:
    """The breaking point of one base episode on a grid of ``levels`` severities (index 0 the smallest).

    ``outcome(-1)`` is the clean twin, run once. ``bisect`` asks the top level, then halves the interval between
    the last success and the first failure (about log2(levels) + 2 rollouts): on an episode whose success is
    monotone in severity it finds the same level as the ``grid``, which asks every level and so also sees every
    episode where success returns above the breaking point.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    seen: Dict[int, bool] = {}

    def ask(i: int) -> bool:
        if i not in seen:
            seen[i] = bool(outcome(i))
        return seen[i]

    if not ask(-1):
        return EpisodeBreak(episode, FAILED_CLEAN, outcomes=seen)
    if mode == "grid":
        results = [ask(i) for i in range(levels)]
        failures = [i for i, ok in enumerate(results) if not ok]
        if not failures:
            return EpisodeBreak(episode, NEVER_BROKE, outcomes=seen)
        first = failures[0]
        return EpisodeBreak(episode, BROKE, first, seen, non_monotone=any(results[first + 1:]))
    if ask(levels - 1):
        return EpisodeBreak(episode, NEVER_BROKE, outcomes=seen)
    lo, hi = -1, levels - 1  # success at lo, failure at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ask(mid):
            lo = mid
        else:
            hi = mid
    non_monotone = any(ok and i > hi for i, ok in seen.items())
    return EpisodeBreak(episode, BROKE, hi, seen, non_monotone)


def dense_cost(episodes: int, levels: int) -> int:
    """Rollouts a dense grid spends: each episode's clean twin and every level."""
    return episodes * (levels + 1)


def cost(breaks: Sequence[EpisodeBreak], levels: int) -> Dict[str, float]:
    """Rollouts spent against the dense grid's and the frozen three levels'."""
    spent = sum(b.rollouts for b in breaks)
    dense = dense_cost(len(breaks), levels)
    return {"rollouts": spent, "dense_grid_rollouts": dense, "frozen_levels_rollouts": dense_cost(len(breaks), 3),
            "per_episode": spent / len(breaks) if breaks else 0.0,
            "fraction_of_dense": spent / dense if dense else 0.0}


__all__ = ["BROKE", "EpisodeBreak", "FAILED_CLEAN", "MODES", "NEVER_BROKE", "cost", "dense_cost", "find_break"]
