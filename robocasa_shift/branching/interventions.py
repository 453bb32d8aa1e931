"""The intervention repertoire: what a branch does at its checkpoint before the policy resumes.

An intervention turns a checkpoint's context (the action layout and the trunk's
last action) into a *script*: actions executed open loop, with the policy idle
and without execution noise, after which the policy resumes. ``continue`` has
an empty script; ``recover`` is RESCUE's manoeuvre, its magnitudes frozen in
``interventions/recover.yaml``. Users add their own through the entry-point
group ``robocasa_shift.interventions`` (a class with ``name``, ``spec_hash``
and ``script``), without editing this package::

    [options.entry_points]
    robocasa_shift.interventions =
        nudge = my_pkg.interventions:Nudge
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from robocasa_shift.core import specs
from robocasa_shift.embodiments import ActionLayout
from robocasa_shift.registry import Registry

INTERVENTIONS: Registry[type] = Registry("intervention", "robocasa_shift.interventions")


@dataclass(frozen=True)
class Context:
    """What an intervention may read at a checkpoint.

    Attributes:
        layout: the embodiment's action layout.
        step: control steps taken before the checkpoint.
        previous_action: the trunk's action at step ``step - 1`` (None at step 0).
    """

    layout: ActionLayout
    step: int
    previous_action: Optional[np.ndarray]


class Intervention:
    """Base class: ``script(context)`` returns the (n, action_dim) actions to run before the policy resumes."""

    name = "intervention"
    spec_hash: Optional[str] = None  # the frozen spec's content hash, when the intervention has one

    def script(self, context: Context) -> np.ndarray:
        raise NotImplementedError


@INTERVENTIONS.register("continue")
class Continue(Intervention):
    """Resume the policy directly."""

    name = "continue"

    def script(self, context: Context) -> np.ndarray:
        return np.zeros((0, context.layout.dim))


@INTERVENTIONS.register("recover")
class Recover(Intervention):
    """RESCUE's scripted manoeuvre (freeze; if the gripper was closing, lower and release; retract; settle)."""

    name = "recover"

    def __init__(self, spec: Optional[specs.InterventionSpec] = None):
        self.spec = spec or specs.load_intervention_spec("recover")
        self.spec_hash = self.spec.content_hash

    def script(self, context: Context) -> np.ndarray:
        layout = context.layout
        previous = context.previous_action
        closing = previous is not None and layout.closing(previous)
        held = float(previous[layout.gripper]) if previous is not None else layout.open
        grip = {"hold": held, "open": layout.open, "close": layout.close}
        actions = [layout.arm_action(phase.arm_velocity, grip[phase.gripper])
                   for phase in self.spec.phases if phase.when == "always" or closing
                   for _ in range(phase.steps)]
        return np.array(actions).reshape(-1, layout.dim)


def make_intervention(name: str) -> Intervention:
    """The intervention registered as ``name``; unknown names list the registered ones."""
    return INTERVENTIONS.get(name)()


__all__ = ["Context", "INTERVENTIONS", "Intervention", "make_intervention"]
