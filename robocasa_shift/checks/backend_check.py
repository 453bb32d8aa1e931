"""``check-backend NAME``: the backend contract run against a backend, in the spirit of Gymnasium's env checker.

A new backend (a plug-in's, or a new simulator) must give the harness what pairing rests on. For every task
asked for, on a few base episodes, this checks:

- ``contract``: the backend's and the environment's methods and attributes exist (``core/backend.py``).
- ``reset_determinism``: a seed's reset gives the same fingerprint and physics state twice, and in a second
  environment of the task; two base episodes differ (a fingerprint that ignores the state pairs nothing).
- ``fingerprint_stability``: reading the fingerprint, the state or rendering changes no fingerprint; a step does.
- ``restore_nominal``: after every condition the environment can apply, the next reset of the episode gives the
  clean fingerprint again (nothing a perturbation edited leaks into the next rollout).
- ``readback``: every condition's application reads back what it asked for (the factor kinds' tolerance).
- ``render_determinism``: every camera, rendered twice from one state, gives the same RGB uint8 frame of the
  asked size, and it is not blank.
- ``side_effect_free``: the success check and every stage predicate leave the fingerprint and the state as they
  were, and return a bool.
- ``state_roundtrip``: ``set_state(get_state())`` after a few steps returns to the saved fingerprint (branching).
- ``capabilities``: each optional capability of the contract (``CAPABILITIES``: ``object_points`` for the judge
  crops, ``task_events`` for branching's task events) is reported offered or "not offered"; an offered one must
  work: finite (3,) points, a camera frame with a rotation and a field of view, a contact that is a bool or None,
  all of them read without changing the state.

The result is a :class:`~robocasa_shift.checks.results.CheckResult`; the command prints it and exits 1 on a failure.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.checks.results import CheckResult, Findings
from robocasa_shift.core import specs
from robocasa_shift.core.backend import CAPABILITIES, missing_hooks, offered_capabilities
from robocasa_shift.core.factors import FACTOR_KINDS
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.engine.rollout import inject, prepare_episode

CHECKS = ("contract", "reset_determinism", "fingerprint_stability", "restore_nominal", "readback",
          "render_determinism", "side_effect_free", "state_roundtrip", "capabilities")
BACKEND_METHODS = ("task_names", "task", "make", "config", "versions", "check_available")
ENV_METHODS = ("reset", "step", "is_success", "render", "proprio", "privileged_state", "fingerprint", "get_state",
               "set_state", "set_physics_state", "restore_nominal", "renderer_info", "close", "eef_pos",
               "joint_positions")
ENV_ATTRIBUTES = ("task", "action_dim", "action_layout", "third_person_cameras", "wrist_cameras")
PHASE = "validation"
MIN_FRAME_STD = 2.0  # a frame with less spread than this (0-255) is blank


def _state_equal(a: Dict[str, Any], b: Dict[str, Any]) -> bool:
    return np.array_equal(np.asarray(a.get("integration")), np.asarray(b.get("integration")))


def _probe_action(env, rng: np.random.Generator) -> np.ndarray:
    """A small random action, with the layout's fixed entries (a control-mode switch) set."""
    action = rng.uniform(-0.5, 0.5, env.action_dim)
    for index, value in env.action_layout.fixed.items():
        action[index] = value
    return action


def _check_task(backend_name: str, backend, task: str, episodes: Sequence[int], image_size: int,
                protocol: specs.Protocol, found: Findings) -> Dict[str, Any]:
    env = backend.make(task)
    try:
        missing = [m for m in ENV_METHODS if not callable(getattr(env, m, None))]
        missing += [a for a in ENV_ATTRIBUTES if not hasattr(env, a)]
        for name in missing:
            found.add("contract", f"{task}: environment lacks {name}")
        if missing:
            return {"conditions": 0}
        keys = [RolloutKey(PHASE, task, e, "clean") for e in episodes]
        clean: Dict[int, str] = {}
        for key in keys:
            first = prepare_episode(env, protocol, key)
            state = env.get_state()
            again = prepare_episode(env, protocol, key)
            if first != again or not _state_equal(state, env.get_state()):
                found.add("reset_determinism", f"{task} episode {key.episode}: two resets differ")
            clean[key.episode] = first
        if len(set(clean.values())) < len(clean):
            found.add("reset_determinism", f"{task}: base episodes {sorted(clean)} share a fingerprint")
        twin = backend.make(task)
        try:
            for key in keys:
                if prepare_episode(twin, protocol, key) != clean[key.episode]:
                    found.add("reset_determinism", f"{task} episode {key.episode}: a second environment resets "
                                                   f"to another fingerprint")
        finally:
            twin.close()

        key = keys[0]
        prepare_episode(env, protocol, key)
        fingerprint = env.fingerprint()
        env.get_state()
        cameras = list(env.third_person_cameras) + list(env.wrist_cameras)
        frames = {c: found.guard("render_determinism", f"{task}: render({c!r})", lambda c=c: env.render(c, image_size))
                  for c in cameras}
        if env.fingerprint() != fingerprint:
            found.add("fingerprint_stability", f"{task}: reading the state or rendering changed the fingerprint")
        for camera, frame in frames.items():
            if frame is None:
                continue
            frame = np.asarray(frame)
            if frame.shape != (image_size, image_size, 3) or frame.dtype != np.uint8:
                found.add("render_determinism", f"{task} {camera}: frame {frame.shape} {frame.dtype}, expected "
                                                f"({image_size}, {image_size}, 3) uint8")
            elif frame.std() < MIN_FRAME_STD:
                found.add("render_determinism", f"{task} {camera}: blank frame (std {frame.std():.2f})")
            elif not np.array_equal(frame, env.render(camera, image_size)):
                found.add("render_determinism", f"{task} {camera}: two renders of one state differ")
        if not cameras:
            found.add("contract", f"{task}: no camera (third_person_cameras and wrist_cameras are empty)")

        # the success check and every predicate read the state, never change it
        spec = found.guard("side_effect_free", f"{task}: load_stage_spec", lambda: specs.load_stage_spec(backend_name, task))
        before_state = env.get_state()
        success = found.guard("side_effect_free", f"{task}: is_success()", env.is_success)
        if success is not None and not isinstance(success, (bool, np.bool_)):
            found.add("side_effect_free", f"{task}: is_success() returned {type(success).__name__}, not a bool")
        if spec is not None:
            _, errors = StageTracker(spec).evaluate_all(env, 0)
            for error in errors:
                found.add("side_effect_free", f"{task}: {error}")
        if env.fingerprint() != fingerprint or not _state_equal(before_state, env.get_state()):
            found.add("side_effect_free", f"{task}: the success check or a predicate changed the state")

        capabilities = _check_capabilities(env, task, spec, found)

        # a step changes the fingerprint; a saved state restores it
        saved, saved_fingerprint = env.get_state(), env.fingerprint()
        rng = np.random.default_rng(0)
        stepped = found.guard("fingerprint_stability", f"{task}: step()",
                              lambda: [env.step(_probe_action(env, rng)) for _ in range(3)])
        if stepped is not None:
            if env.fingerprint() == saved_fingerprint and not _state_equal(saved, env.get_state()):
                found.add("fingerprint_stability", f"{task}: 3 steps changed the state but not the fingerprint")
            found.guard("state_roundtrip", f"{task}: set_state()", lambda: env.set_state(saved))
            if env.fingerprint() != saved_fingerprint:
                found.add("state_roundtrip", f"{task}: set_state(get_state()) after 3 steps gives another fingerprint")

        # every condition the environment can apply: read-back, then nothing leaks into the next reset
        applicable = [c for c in protocol.known_conditions[1:]
                      if not any(missing_hooks(env, FACTOR_KINDS.get(protocol.factor(f).kind).requires)
                                 for f in protocol.condition(c).factors)]
        for condition in applicable:
            for episode in episodes:
                key = RolloutKey(PHASE, task, episode, condition)
                prepare_episode(env, protocol, key)
                record = found.guard("readback", f"{task} {condition} episode {episode}: inject",
                                     lambda key=key: inject(env, protocol, key))
                if record is not None and not record["ok"]:
                    found.add("readback", f"{task} {condition} episode {episode}: read back differs by "
                                          f"{record['max_abs_error']:.3g}")
                if prepare_episode(env, protocol, RolloutKey(PHASE, task, episode, "clean")) != clean[episode]:
                    found.add("restore_nominal", f"{task} {condition} episode {episode}: the next reset is not the "
                                                 f"clean one (something the condition edited stayed)")
        return {"conditions": len(applicable), "cameras": cameras, "capabilities": capabilities}
    finally:
        env.close()


def _check_capabilities(env, task: str, spec, found: Findings) -> Dict[str, str]:
    """Each capability: "offered" or "not offered"; an offered one is called and its answers checked."""
    offered = offered_capabilities(env)
    fingerprint, state = env.fingerprint(), env.get_state()
    if "object_points" in offered:
        names = spec.point_names() if spec is not None else []
        points = found.guard("capabilities", f"{task}: outcome_points({names})", lambda: env.outcome_points(names))
        for point in points or []:
            if np.asarray(point).shape != (3,) or not np.isfinite(np.asarray(point, dtype=float)).all():
                found.add("capabilities", f"{task}: outcome_points gave {np.asarray(point)!r}, not a finite (3,) point")
        for camera in env.third_person_cameras:
            frame = found.guard("capabilities", f"{task}: camera_frame({camera!r})", lambda c=camera: env.camera_frame(c))
            if frame is None:
                continue
            pos, rot, fovy = (np.asarray(frame[0], float), np.asarray(frame[1], float), float(frame[2]))
            if pos.shape != (3,) or rot.shape != (3, 3) or not np.allclose(rot.T @ rot, np.eye(3), atol=1e-6):
                found.add("capabilities", f"{task} {camera}: camera_frame is not a position (3,) and a rotation (3, 3)")
            if not 0.0 < fovy < 180.0:
                found.add("capabilities", f"{task} {camera}: camera_frame's field of view {fovy} is not in (0, 180)")
    if "task_events" in offered:
        contact = found.guard("capabilities", f"{task}: target_contact()", env.target_contact)
        if contact is not None and not isinstance(contact, (bool, np.bool_)):
            found.add("capabilities", f"{task}: target_contact() returned {type(contact).__name__}, not a bool or None")
    if "contacts" in offered:
        row = found.guard("capabilities", f"{task}: contact_state()", env.contact_state)
        if row is not None:
            row = np.asarray(row)
            if row.shape != (5,) or row.dtype.kind not in "iu" or row[:4].min() < 0 or row[2:4].max() > 1:
                found.add("capabilities", f"{task}: contact_state() gave {row!r}, not 5 integers (two counts, two 0/1 "
                                          "flags, a height in mm)")
    if env.fingerprint() != fingerprint or not _state_equal(state, env.get_state()):
        found.add("capabilities", f"{task}: reading a capability changed the state")
    return {name: "offered" if name in offered else "not offered" for name in CAPABILITIES}


def check_backend(name: str, tasks: Optional[Sequence[str]] = None, episodes: Sequence[int] = (0, 1),
                  image_size: int = 64, asset_kit: Optional[str] = None) -> CheckResult:
    """Run the backend contract on ``name``'s ``tasks`` (default: all of them) and ``episodes``
    (``asset_kit``: a generated asset kit to run on, e.g. robocasa's ``standin`` kitchens).

    Raises:
        UnknownNameError: an unknown backend or task (the message lists the valid ones).
        BackendUnavailable: the backend's simulator or assets are missing.
    """
    backend = get_backend(name, asset_kit=asset_kit)
    found = Findings(CHECKS)
    for method in BACKEND_METHODS:
        if not callable(getattr(backend, method, None)):
            found.add("contract", f"backend lacks {method}()")
    backend.check_available()
    protocol = specs.load_protocol()
    tasks = list(tasks or backend.task_names())
    for task in tasks:
        backend.task(task)  # an unknown name lists the valid ones
    per_task = {task: _check_task(name, backend, task, episodes, image_size, protocol, found) for task in tasks}
    checks = found.checks()
    passed = all(c["passed"] for c in checks.values())
    details = {"backend": name, "tasks": per_task, "episodes": list(episodes), "image_size": image_size,
               "checks": checks}
    return CheckResult("check-backend", passed, details, _markdown(details, found, passed))


def _markdown(details: Dict[str, Any], found: Findings, passed: bool) -> str:
    lines = [f"# Backend contract: {details['backend']}", "",
             f"Tasks {', '.join(details['tasks'])}; base episodes {details['episodes']}; frames at "
             f"{details['image_size']} px.", "", *found.table()]
    for task, per_task in details["tasks"].items():
        offered = per_task.get("capabilities") or {}
        if offered:
            lines += ["", f"Capabilities of {task}: " + ", ".join(f"{k} {v}" for k, v in offered.items()) + "."]
    lines += ["", f"**{'PASSED' if passed else 'FAILED'}**", ""]
    return "\n".join(lines)


__all__ = ["CHECKS", "check_backend"]
