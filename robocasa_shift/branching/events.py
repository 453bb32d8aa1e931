"""Task events along a trunk: when the gripper first tried to grasp, first dropped what it held, first
touched the target (RESCUE Sec. IV-B: where the recoverability horizon sits relative to task-level events).

Computed when a trunk is recorded, from its tape (the actions taken and the physics state after every
step) and simulator predicates, replayed state by state (``Env.set_physics_state``), never from images:

- ``grasp_attempt``: the first step whose commanded action closes the gripper
  (``ActionLayout.closing``), as the number of control steps taken before it (the checkpoint at that step
  is the last one before the attempt);
- ``drop``: the first step after which the task's grasp predicate (its stage spec's first ``grasped`` or
  ``holding`` subgoal, with that subgoal's arguments) stops holding although it held one step before and
  the gripper was still commanded closed: the object slipped or fell, it was not released;
- ``target_contact``: the first step after which the object touches its target, by the environment's
  ``TaskEvents.target_contact`` (the backend contract, ``core/backend.py``: cubeA touching cubeB for
  robosuite's Stack, the can inside its target bin for PickPlaceCan, the object over the target disc for
  the fake PickPlace, ...); undefined for a task without a target (Lift) or a backend without the
  capability.

An event that never happens is None. Steps count like checkpoints and subgoal latches (a state reached
after ``s`` steps is step ``s``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import numpy as np

from robocasa_shift.core.backend import TaskEvents

EVENTS = ("grasp_attempt", "drop", "target_contact")
GRASP_PREDICATES = ("grasped", "holding")


DEFINITIONS = {
    "grasp_attempt": "first step whose commanded action closes the gripper (steps taken before it)",
    "drop": "first step after which the grasp predicate stops holding while the gripper is still commanded closed",
    "target_contact": "first step after which the object touches its target, as the backend defines it (robosuite "
                      "Stack: cubeA on cubeB; PickPlaceCan: the can inside its target bin; fake PickPlace: over the "
                      "target disc)",
}


def _grasp_predicate(stage_spec, backend: str) -> Optional[Callable[[Any], bool]]:
    from robocasa_shift.core.stages import PREDICATES

    for goal in stage_spec.subgoals:
        if goal.predicate in GRASP_PREDICATES:
            fn = PREDICATES.get(f"{backend}.{goal.predicate}")
            args = dict(goal.args)
            return lambda env, fn=fn, args=args: bool(fn(env, **args))
    return None


def _target_contact(env) -> Optional[Callable[[Any], bool]]:
    """The environment's target-contact check, or None when it has no such capability or the task no target."""
    if not isinstance(env, TaskEvents) or env.target_contact() is None:
        return None
    return lambda env: bool(env.target_contact())


def first_closing(actions, layout) -> Optional[int]:
    """The number of steps taken before the first action that closes the gripper (None: never)."""
    return next((i for i, action in enumerate(actions) if layout.closing(action)), None)


def trunk_events(env, tape, stage_spec, backend: str) -> Dict[str, Any]:
    """The events of a recorded trunk (:data:`EVENTS`, each a step or None), replaying its physics states.

    Leaves ``env`` at the trunk's last state (every later rollout resets it).
    """
    layout = env.action_layout
    actions = [np.asarray(a) for a in tape.actions]
    out: Dict[str, Any] = {name: None for name in EVENTS}
    out["grasp_attempt"] = first_closing(actions, layout)
    grasp = _grasp_predicate(stage_spec, backend)
    contact = _target_contact(env)
    held_before = False
    for s in range(1, len(tape.states)):
        if grasp is None and contact is None:
            break
        env.set_physics_state(np.asarray(tape.states[s]))
        if grasp is not None:
            held = grasp(env)
            if out["drop"] is None and held_before and not held and layout.closing(actions[s - 1]):
                out["drop"] = s
            held_before = held
        if contact is not None and out["target_contact"] is None and contact(env):
            out["target_contact"] = s
        if out["drop"] is not None and (contact is None or out["target_contact"] is not None):
            break
    out["defined"] = {"grasp_attempt": True, "drop": grasp is not None, "target_contact": contact is not None}
    return out


__all__ = ["DEFINITIONS", "EVENTS", "GRASP_PREDICATES", "first_closing", "trunk_events"]
