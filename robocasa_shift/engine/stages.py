"""StageTracker: ordered, latched subgoals evaluated on the post-step simulator state.

After every ``env.step`` the tracker evaluates the predicate of the current
subgoal; when it holds, the subgoal latches with that step as its completion
step and the next subgoal is evaluated on the same state (several may latch
in one step). Latched subgoals are never re-evaluated, so the result is the
deepest milestone reached. Predicates are side-effect-free functions of the
simulator state, registered by name per backend and referenced from stage
spec files. An exception in a predicate stops the tracker and is recorded as
a StageTracker error; it is never read as False.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from robocasa_shift.registry import Registry
from robocasa_shift.specs import StageSpec

# Keys are "<backend>.<predicate>"; values are functions (env, **args) -> bool.
PREDICATES: Registry[Callable[..., bool]] = Registry("predicate", "robocasa_shift.predicates")


def predicate(backend: str, name: str):
    """Register a predicate for stage specs of ``backend`` under ``name``."""
    return PREDICATES.register(f"{backend}.{name}")


@dataclass
class StageResult:
    names: List[str]
    stage_steps: List[Optional[int]]
    error: Optional[str] = None

    @property
    def n_stages(self) -> int:
        return len(self.names)

    @property
    def completed(self) -> int:
        return sum(s is not None for s in self.stage_steps)

    @property
    def first_incomplete(self) -> Optional[int]:
        """1-based index of the first incomplete subgoal; None when all latched."""
        return None if self.completed == self.n_stages else self.completed + 1

    @property
    def progress(self) -> float:
        return self.completed / self.n_stages


@dataclass
class StageTracker:
    spec: StageSpec
    functions: List[Callable[[Any], bool]] = field(init=False)

    def __post_init__(self):
        bound = []
        for goal in self.spec.subgoals:
            fn = PREDICATES.get(f"{self.spec.backend}.{goal.predicate}")
            args = dict(goal.args)
            bound.append(lambda env, fn=fn, args=args: fn(env, **args))
        self.functions = bound
        self.reset()

    def reset(self) -> None:
        self.stage_steps: List[Optional[int]] = [None] * len(self.functions)
        self.error: Optional[str] = None
        self._next = 0

    def update(self, env, step: int) -> List[str]:
        """Evaluate on the post-step state of control step ``step``; return the subgoals that latched."""
        latched = []
        while self.error is None and self._next < len(self.functions):
            goal = self.spec.subgoals[self._next]
            try:
                holds = self.functions[self._next](env)
            except Exception as exc:  # recorded on the rollout, never read as False
                self.error = f"subgoal '{goal.id}' (predicate {goal.predicate}) at step {step}: {type(exc).__name__}: {exc}"
                break
            if not isinstance(holds, (bool, int)) and type(holds).__name__ != "bool_":
                self.error = f"subgoal '{goal.id}' (predicate {goal.predicate}) returned {holds!r}, not a bool"
                break
            if not holds:
                break
            self.stage_steps[self._next] = step
            latched.append(goal.id)
            self._next += 1
        return latched

    def holding(self, env) -> Dict[str, bool]:
        """Evaluate every predicate on the current state, independently of latching (for audits)."""
        return {g.id: bool(fn(env)) for g, fn in zip(self.spec.subgoals, self.functions)}

    def result(self) -> StageResult:
        return StageResult(names=self.spec.names, stage_steps=list(self.stage_steps), error=self.error)
