"""The libero backend's task table and base episodes, without LIBERO installed.

A task is one task of a LIBERO suite, named ``<suite>-<index>`` (``spatial-0`` is
LIBERO-Spatial's first task). A base episode is one of the task's 50 fixed initial
states: a seeded permutation of them (its own stream, the same on every machine)
is cut into one share per phase, so screening, formal and validation episodes
never overlap, and an episode beyond its phase's share is refused.

Horizons are those openpi's and LeRobot's LIBERO evaluations use; they count
control steps after ``SETTLE_STEPS`` no-op steps that let objects come to rest
(they come before the fingerprint and the perturbation, and do not count).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from robocasa_shift.errors import BadInput
from robocasa_shift.seeding import derive_seed

# suite short name -> (LIBERO benchmark name, horizon in control steps, tasks in the suite)
SUITES: Dict[str, Tuple[str, int, int]] = {
    "spatial": ("libero_spatial", 220, 10),
    "object": ("libero_object", 280, 10),
    "goal": ("libero_goal", 300, 10),
    "long": ("libero_10", 520, 10),
    "90": ("libero_90", 400, 90),
}
DEFAULT_SUITES = ("spatial", "object", "goal", "long")  # 90 only on request (--task 90-...)
# LIBERO-PRO's variants that change the scene: new objects (`object`), swapped positions (`swap`),
# a changed task (`task`). Each has its own BDDL files and initial states, so its rollouts cannot be
# paired by state with the original task's: `<suite>_<variant>-<i>` is a task of its own (on request),
# and it is compared with `<suite>-<i>` only unpaired (``variant_of``). The factors still pair within it.
VARIANTS = {"object": "objects replaced", "swap": "object positions swapped", "task": "task changed"}
for _suite in DEFAULT_SUITES:
    _benchmark, _horizon, _n = SUITES[_suite]
    for _variant in VARIANTS:
        SUITES[f"{_suite}_{_variant}"] = (f"{_benchmark}_{_variant}", _horizon, _n)
INITIAL_STATES = 50
# Each phase's share of a task's initial states, in permutation order.
PHASE_SHARES = {"validation": 5, "screening": 20, "formal": 25}
SETTLE_STEPS = 10
PERMUTATION_SEED = 20260101  # frozen: which initial states each phase gets


@dataclass(frozen=True)
class LiberoTask:
    """One LIBERO task: its suite, index in the suite, and the suite's horizon."""

    name: str
    suite: str
    benchmark: str
    index: int
    horizon: int
    variant: Optional[str] = None  # a LIBERO-PRO scene variant (``VARIANTS``), or None for LIBERO's own task

    @property
    def variant_of(self) -> Optional[str]:
        """The LIBERO task a scene variant changes (compare unpaired), or None."""
        return None if self.variant is None else f"{self.suite.rsplit('_', 1)[0]}-{self.index}"


def task_names(suites=DEFAULT_SUITES) -> Tuple[str, ...]:
    """Task names of ``suites``, in suite order then index order."""
    return tuple(f"{s}-{i}" for s in suites for i in range(SUITES[s][2]))


def parse_task(name: str) -> LiberoTask:
    """The task named ``name`` (``<suite>-<index>``).

    Raises:
        BadInput: not of that form, an unknown suite or an index outside the suite (the message lists them).
    """
    suite, _, index = name.rpartition("-")
    if suite not in SUITES or not index.isdigit() or not 0 <= int(index) < SUITES[suite][2]:
        raise BadInput(f"unknown libero task {name!r}: tasks are <suite>-<index> with suites "
                       + ", ".join(f"{s} (0-{SUITES[s][2] - 1})" for s in SUITES))
    benchmark, horizon, _ = SUITES[suite]
    variant = suite.rsplit("_", 1)[1] if "_" in suite and suite.rsplit("_", 1)[1] in VARIANTS else None
    return LiberoTask(name, suite, benchmark, int(index), horizon, variant)


def initial_state_index(task: str, phase: str, episode: int) -> int:
    """Which of the task's 50 initial states base episode ``episode`` of ``phase`` starts from.

    Raises:
        BadInput: the phase has no share of LIBERO's initial states, or ``episode`` is beyond its share.
    """
    if phase not in PHASE_SHARES:
        raise BadInput(f"phase {phase!r} has no share of LIBERO's {INITIAL_STATES} initial states "
                       f"(shares: {PHASE_SHARES})")
    share = PHASE_SHARES[phase]
    if not 0 <= episode < share:
        raise BadInput(f"libero task {task}: phase {phase} has {share} base episodes (0-{share - 1}), "
                       f"not episode {episode}: LIBERO fixes {INITIAL_STATES} initial states per task")
    order = np.random.default_rng(derive_seed(PERMUTATION_SEED, stream="libero-initial-states", task=task)).permutation(
        INITIAL_STATES)
    offset = sum(PHASE_SHARES[p] for p in list(PHASE_SHARES)[: list(PHASE_SHARES).index(phase)])
    return int(order[offset + episode])


__all__ = ["DEFAULT_SUITES", "INITIAL_STATES", "LiberoTask", "PHASE_SHARES", "SETTLE_STEPS", "SUITES",
           "VARIANTS", "initial_state_index", "parse_task", "task_names"]
