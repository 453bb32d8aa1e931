"""Stage specs of LIBERO tasks, generated from their BDDL goals (``robocasa-shift libero-stage-specs``).

A BDDL goal is a conjunction, e.g. ``(And (In alphabet_soup_1 basket_1_contain_region)
(In tomato_sauce_1 basket_1_contain_region))``. Each conjunct becomes one group of the
spec (groups are unordered: BDDL gives conjuncts no order), holding two subgoals:

- for a binary conjunct (``On``, ``In``): ``grasp_<object>`` (the object it moves, held
  by both finger pads), then the conjunct itself by LIBERO's own predicate;
- for a unary one (``Open``, ``Close``, ``TurnOn``, ``TurnOff``): ``touch_<object>``
  (the gripper touches the fixture), then the conjunct.

Within a group the conjunct latching latches its grasp too (an object pushed onto its
target was moved all the same). The canonical order, in which the first incomplete
subgoal is read, is the BDDL file's. The generated file records the BDDL file's
SHA-256; an existing spec with other content is never overwritten (a frozen spec
changes only by a new version, written by hand).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Dict, List, Sequence

import yaml

from robocasa_shift.errors import FrozenSpecError, SpecError

VERSION = 1
BINARY = ("on", "in")
UNARY = ("open", "close", "turnon", "turnoff", "up")


def _slug(*names: str) -> str:
    return "_".join(names)


def stage_spec_content(task: str, goal: Sequence[Sequence[str]], source: Dict[str, str]) -> Dict[str, Any]:
    """The stage spec of ``task`` from its parsed BDDL goal (lists like ``["on", "bowl_1", "plate_1"]``).

    Raises:
        SpecError: a predicate this generator does not know (the message lists those it does).
    """
    subgoals: List[Dict[str, Any]] = []
    readable = []
    for conjunct in goal:
        name, *objects = [str(part) for part in conjunct]
        name = name.lower()
        group = _slug(name, *objects)
        readable.append(f"({name} {' '.join(objects)})")
        if name in BINARY and len(objects) == 2:
            first = {"id": _slug("grasp", objects[0]), "group": group, "predicate": "grasped",
                     "description": f"both finger pads touch {objects[0]} (latched with its placement at the latest)",
                     "args": {"object": objects[0]}}
        elif name in UNARY and len(objects) == 1:
            first = {"id": _slug("touch", objects[0]), "group": group, "predicate": "touched",
                     "description": f"the gripper touches {objects[0]} (latched with the conjunct at the latest)",
                     "args": {"object": objects[0]}}
        else:
            raise SpecError(Path(source.get("bddl", task)), "goal",
                            f"conjunct {conjunct} of task {task}: known predicates are {', '.join(BINARY + UNARY)} "
                            f"with two and one arguments")
        taken = {g["id"] for g in subgoals}
        if first["id"] in taken:  # the same object in two conjuncts
            first["id"] = _slug(first["id"], "for", group)
        subgoals.append(first)
        subgoals.append({"id": group, "group": group, "predicate": "bddl",
                         "description": f"({name} {' '.join(objects)}) holds by LIBERO's predicate",
                         "args": {"predicate": name, "objects": list(objects)}})
    return {"task": task, "backend": "libero", "version": VERSION,
            "description": f"Generated from the BDDL goal {' and '.join(readable)}; its conjuncts are unordered groups.",
            "source": dict(source), "subgoals": subgoals}


def write_stage_spec(content: Dict[str, Any], directory: Path | str) -> str:
    """Write ``content`` as ``<directory>/<task>.yaml``; ``"written"``, or ``"unchanged"`` when the file holds it.

    Raises:
        FrozenSpecError: the file exists with other content (both hashes in the message); it is left as it is.
    """
    from robocasa_shift.core.specs import canonical_hash

    path = Path(directory) / f"{content['task']}.yaml"
    text = yaml.safe_dump(content, sort_keys=False, width=120)
    if path.exists():
        existing = yaml.safe_load(path.read_text())
        if existing == content:
            return "unchanged"
        raise FrozenSpecError(f"{path}: a frozen stage spec (sha256 {canonical_hash(existing)}) differs from the one "
                              f"generated now (sha256 {canonical_hash(content)}); it is not overwritten. Write a new "
                              f"version by hand if the change is meant")
    from robocasa_shift.rundir.files import atomic_write_text

    atomic_write_text(path, text)
    return "written"


def generate(tasks: Sequence[str], directory: Path | str) -> Dict[str, str]:
    """Generate (or confirm) the stage specs of LIBERO ``tasks`` from their BDDL files; what happened to each."""
    from robocasa_shift.backends.libero_backend import _import_libero, _libero_task
    from robocasa_shift.backends.libero_tasks import parse_task

    _import_libero()  # without LIBERO: BackendUnavailable naming its virtual environment (exit 3)
    from libero.libero.envs import bddl_utils

    out = {}
    for name in tasks:
        task = parse_task(name)
        _, record, path = _libero_task(task)
        goal = bddl_utils.robosuite_parse_problem(path)["goal_state"]
        source = {"bddl": f"{record.problem_folder}/{record.bddl_file}",
                  "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
        out[name] = write_stage_spec(stage_spec_content(name, goal, source), directory)
    return out


__all__ = ["generate", "stage_spec_content", "write_stage_spec"]
