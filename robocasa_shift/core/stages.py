"""StageTracker: latched subgoals evaluated on the post-step simulator state.

After every ``env.step`` the tracker evaluates the predicate of the current
subgoal; when it holds, the subgoal latches with that step as its completion
step and the next subgoal is evaluated on the same state (several may latch
in one step). Latched subgoals are never re-evaluated, so the result is the
deepest milestone reached.

A spec of unordered groups (``StageSpec.unordered``: a BDDL goal's conjuncts)
tracks each group's chain on its own: every step, the deepest unlatched member
of each chain that holds latches, with its chain's unlatched predecessors (a
placement implies its grasp). Depth is the number of subgoals latched; the
first incomplete subgoal is the first unlatched one in the spec's order. Predicates are side-effect-free functions of the
simulator state, registered by name per backend and referenced from stage
spec files. An exception in a predicate stops the tracker and is recorded as
a StageTracker error; it is never read as False.

A predicate returns ``bool`` or ``numpy.bool_`` (what a numpy comparison such as
``np.linalg.norm(d) < r`` gives) and nothing else: any other result, an int
included, is a StageTracker error naming the subgoal and the predicate. Ints are
refused on purpose, 0 and 1 too: a predicate that returns a count or a distance
would otherwise read as "holds" whenever it is non-zero, and a yes/no question
deserves a yes/no answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from robocasa_shift.core.specs import StageSpec
from robocasa_shift.registry import Registry

# Keys are "<backend>.<predicate>"; values are functions (env, **args) -> bool.
PREDICATES: Registry[Callable[..., bool]] = Registry("predicate", "robocasa_shift.predicates")
# The result types a predicate may return (see the module docstring for why ints are refused).
BOOL_TYPES = (bool, np.bool_)


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
        """1-based index of the first incomplete subgoal (in the spec's order); None when all latched."""
        return next((i + 1 for i, s in enumerate(self.stage_steps) if s is None), None)

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

    def get_state(self) -> Dict[str, np.ndarray]:
        """The latches as numpy arrays, for a branching snapshot saved to ``.npz`` without pickle.

        ``stage_steps``: int64 per subgoal, -1 where not latched; ``next``: 0-d int64, the subgoal
        evaluated next; ``error``: the error's UTF-8 bytes as uint8 (empty when there is none).
        """
        return {"stage_steps": np.array([-1 if s is None else s for s in self.stage_steps], dtype=np.int64),
                "next": np.asarray(self._next, dtype=np.int64),
                "error": np.frombuffer((self.error or "").encode("utf-8"), dtype=np.uint8).copy()}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a :meth:`get_state` snapshot exactly (for the same stage spec).

        Raises:
            ValueError: the snapshot has another number of subgoals than this spec.
        """
        steps = [int(s) for s in np.asarray(state["stage_steps"]).reshape(-1)]
        if len(steps) != len(self.functions):
            raise ValueError(f"a stage snapshot of {len(steps)} subgoals for a spec of {len(self.functions)}")
        self.stage_steps = [None if s < 0 else s for s in steps]
        self._next = int(state["next"])
        error = np.asarray(state["error"], dtype=np.uint8).tobytes().decode("utf-8")
        self.error = error or None

    def _evaluate(self, index: int, env, step: Optional[int]) -> Tuple[Optional[bool], Optional[str]]:
        """``(holds, None)``, or ``(None, error)`` when the predicate raised or returned something not a bool."""
        try:
            holds = self.functions[index](env)
        except Exception as exc:  # recorded on the rollout, never read as False
            return None, f"{self._where(index, step)}: {type(exc).__name__}: {exc}"
        if not isinstance(holds, BOOL_TYPES):
            return None, (f"{self._where(index, step)} returned {holds!r} of type {type(holds).__name__}, not a bool "
                          "(bool or numpy.bool_)")
        return bool(holds), None

    def _where(self, index: int, step: Optional[int]) -> str:
        goal = self.spec.subgoals[index]
        return f"subgoal '{goal.id}' (predicate {goal.predicate})" + ("" if step is None else f" at step {step}")

    def update(self, env, step: int) -> List[str]:
        """Evaluate on the post-step state of control step ``step``; return the subgoals that latched."""
        if self.spec.unordered:
            return self._update_groups(env, step)
        latched = []
        while self.error is None and self._next < len(self.functions):
            holds, self.error = self._evaluate(self._next, env, step)
            if not holds:
                break
            self.stage_steps[self._next] = step
            latched.append(self.spec.subgoals[self._next].id)
            self._next += 1
        return latched

    def _update_groups(self, env, step: int) -> List[str]:
        latched: List[int] = []
        for chain in self.spec.chains():
            for index in reversed([i for i in chain if self.stage_steps[i] is None]):
                if self.error is not None:
                    return [self.spec.subgoals[i].id for i in sorted(latched)]
                holds, self.error = self._evaluate(index, env, step)
                if holds:
                    for earlier in chain[: chain.index(index) + 1]:
                        if self.stage_steps[earlier] is None:
                            self.stage_steps[earlier] = step
                            latched.append(earlier)
                    break
        self._next = sum(s is not None for s in self.stage_steps)
        return [self.spec.subgoals[i].id for i in sorted(latched)]

    def evaluate_all(self, env, step: Optional[int] = None) -> Tuple[Dict[str, Optional[bool]], List[str]]:
        """Evaluate every predicate on the current state, independently of latching, with the errors.

        Never raises, and touches no latch: a predicate that raises or returns a non-bool reads as
        None (never False) and its error is returned.

        Returns:
            ``(holds, errors)``: subgoal id -> True, False or None; the errors, naming subgoal and predicate.
        """
        holds: Dict[str, Optional[bool]] = {}
        errors: List[str] = []
        for index, goal in enumerate(self.spec.subgoals):
            holds[goal.id], error = self._evaluate(index, env, step)
            if error:
                errors.append(error)
        return holds, errors

    def holding(self, env) -> Dict[str, Optional[bool]]:
        """Every predicate on the current state (for audits): True, False, or None where it could not be
        evaluated (it raised or returned a non-bool; :meth:`evaluate_all` says why). Never raises."""
        return self.evaluate_all(env)[0]

    def result(self) -> StageResult:
        return StageResult(names=self.spec.names, stage_steps=list(self.stage_steps), error=self.error)
