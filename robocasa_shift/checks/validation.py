"""Validation audits run before a formal study: stage specs (replayed demonstrations) and pairing.

Both write JSON and Markdown into ``<run dir>/validation/`` and report
``passed``; the CLI exits non-zero when a check fails.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.core import specs
from robocasa_shift.core.demos import demo_path, load_demo
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.engine.demo_recorder import record_demo
from robocasa_shift.engine.rollout import Observer, prepare_episode, run_rollout
from robocasa_shift.errors import BadInput
from robocasa_shift.policies import make_policy

PHASE = "validation"


def _finish(run_dir: Path | str, check: str, name: str, report: Dict[str, Any], markdown) -> CheckResult:
    """The check passes when every task passes; write it and return it."""
    report["passed"] = all(t["passed"] for t in report["tasks"].values())
    result = CheckResult(check, report["passed"], report, markdown(report), f"validation/{name}")
    write_result(result, run_dir)
    return result


# --------------------------------------------------------------------------- stages


def _stepper(env, states: np.ndarray, actions: np.ndarray):
    """``replay_step`` for an environment whose predicates read what only its step leaves behind: step the
    recorded action from the previous state and check that the recorded state comes out, bit for bit."""
    t = [0]

    def step(state: np.ndarray) -> None:
        env.step(actions[t[0]])
        t[0] += 1
        if not np.array_equal(env.get_state()["integration"], state):
            raise RuntimeError(f"stepping the demonstration's action {t[0]} did not reproduce its recorded state")

    return step


def replay_states(env, spec: specs.StageSpec, states: np.ndarray, actions: Optional[np.ndarray] = None) -> Dict[str, Any]:
    """Replay recorded states through a StageTracker; also note when each predicate first holds on its own.

    An environment with ``replay_step(state)`` (RoboCasa's) gets each state through it: it restores
    the state and then does the bookkeeping its own step does after the physics (success check, task
    counters such as WashLettuce's ``washed_time``), so counter predicates can latch on replay as
    they do in a rollout. One with ``replay_by_stepping`` (LIBERO's, whose contact predicates read the
    contacts MuJoCo found at the start of the last substep, which a restored state alone does not give)
    steps the recorded ``actions`` from the initial state instead, each step checked to reproduce its
    recorded state. Others get ``set_physics_state``. A predicate that raises or returns a
    non-bool is reported (``error``, ``holding_errors``), never raised and never read as False.
    """
    tracker = StageTracker(spec)
    first_hold: List[Optional[int]] = [None] * len(spec.subgoals)
    holding_errors: Dict[str, str] = {}  # the first error of each subgoal evaluated outside the tracker
    replay_step = getattr(env, "replay_step", None)
    if getattr(env, "replay_by_stepping", False):
        if actions is None:
            raise ValueError("this environment replays a demonstration by stepping its actions: pass them")
        replay_step = _stepper(env, states, actions)
    for t in range(1, len(states)):
        if replay_step is not None:
            replay_step(states[t])
        else:
            env.set_physics_state(states[t])
        tracker.update(env, t)
        holds, errors = tracker.evaluate_all(env, t)
        for i, (goal_id, value) in enumerate(holds.items()):
            if value and first_hold[i] is None:
                first_hold[i] = t
            if value is None and goal_id not in holding_errors:
                holding_errors[goal_id] = next(e for e in errors if f"subgoal '{goal_id}'" in e)
    result = tracker.result()
    latched = result.stage_steps
    # A later subgoal that holds on its own before its predecessor latched is out of order.
    out_of_order = [
        spec.subgoals[i].id
        for i in range(1, len(latched))
        if first_hold[i] is not None and latched[i - 1] is not None and first_hold[i] < latched[i - 1]
    ]
    return {
        "stage_steps": latched,
        "first_hold_steps": first_hold,
        "all_reached": result.completed == result.n_stages,
        "out_of_order": out_of_order,
        "error": result.error,
        "holding_errors": list(holding_errors.values()),
    }


def validate_stages(
    run_dir: Path | str,
    tasks: Sequence[str],
    backend: str = "robosuite",
    n_demos: int = 5,
    max_attempts: int = 10,
    n_random: int = 5,
    demo_policy: Optional[str] = None,
    asset_kit: Optional[str] = None,
) -> CheckResult:
    """Replay ``n_demos`` successful demonstrations per task through the StageTracker, plus negative controls.

    Args:
        demo_policy: the policy that records missing demonstrations; by default the backend's own
            (``Backend.demo_policy``). The negative control is the backend's ``negative_control_policy``.
        asset_kit: a generated asset kit to run on (``standin``: robocasa's stand-in kitchens), or None.

    Raises:
        BadInput: a demonstration is missing and neither the backend nor the caller names a policy to record it.
    """
    protocol = specs.load_protocol()
    b = get_backend(backend, asset_kit=asset_kit)
    demo_policy = demo_policy or b.demo_policy
    expert = make_policy(demo_policy) if demo_policy else None
    random_policy = make_policy(b.negative_control_policy)
    demo_dir = Path(run_dir) / "demos"
    report: Dict[str, Any] = {"backend": backend, "spec_hash": protocol.spec_hash, "tasks": {}}
    for task in tasks:
        env = b.make(task)
        spec = specs.load_stage_spec(backend, task)
        demos, attempts = [], 0
        for episode in range(max_attempts):
            key = RolloutKey(PHASE, task, episode, "clean")
            path = demo_path(demo_dir, key)
            if not path.exists():
                if expert is None:
                    raise BadInput(f"no demonstration {path} and backend '{backend}' names no policy to record one: "
                                   f"put its demonstrations under {demo_dir} or pass --demo-policy")
                record_demo(env, expert, key, protocol, spec, backend, demo_dir, root=run_dir)
            attempts += 1
            demo = load_demo(path)
            if demo["meta"]["success"]:
                demos.append((key, path, demo))
            if len(demos) == n_demos:
                break
        rows, initial_holds = [], []
        for key, path, demo in demos:
            prepare_episode(env, protocol, key)  # the demo's key: the same initial state it was recorded from
            initial_ok = np.array_equal(env.get_state()["integration"], demo["states"][0])
            env.set_physics_state(demo["states"][0])
            holds, initial_errors = StageTracker(spec).evaluate_all(env, 0)
            initial_holds += [f"episode {key.episode}: {g}" for g, v in holds.items() if v]
            replay = replay_states(env, spec, demo["states"], demo["actions"])
            replay["holding_errors"] = initial_errors + replay["holding_errors"]
            # the actions reproduce the states bit for bit from the seeded reset
            prepare_episode(env, protocol, key)
            exact = initial_ok
            for t, action in enumerate(demo["actions"], start=1):
                env.step(action)
                if exact and not np.array_equal(env.get_state()["integration"], demo["states"][t]):
                    exact = False
            rows.append({"episode": key.episode, "demo": str(path.relative_to(run_dir)), "steps": len(demo["actions"]),
                         "replay_exact": bool(exact), **replay})
        randoms = []
        for i in range(n_random):  # from the validation episodes' own states (a backend may have no others)
            rec = run_rollout(env, random_policy, RolloutKey(PHASE, task, i, "clean"), protocol, spec, backend)
            randoms.append({"episode": i, "stages_completed": rec.stages_completed, "valid": rec.valid,
                            "reached_last": rec.stages_completed == rec.n_stages, "error": rec.error})
        env.close()
        checks = {
            "enough_demos": len(demos) == n_demos,
            "every_milestone_reached": all(r["all_reached"] for r in rows),
            "in_order": all(not r["out_of_order"] for r in rows),
            "no_predicate_error": all(r["error"] is None and not r["holding_errors"] for r in rows),
            "replay_exact": all(r["replay_exact"] for r in rows),
            "none_on_initial_states": not initial_holds,
            "random_never_reaches_last": all(r["valid"] and not r["reached_last"] for r in randoms),
        }
        report["tasks"][task] = {
            "subgoals": spec.names,
            "stage_spec_sha256": spec.content_hash,
            "demo_attempts": attempts,
            "demos": rows,
            "initial_state_holds": initial_holds,
            "random_rollouts": randoms,
            "checks": checks,
            "passed": all(checks.values()),
        }
    return _finish(run_dir, "stage validation", "stages", report, stages_markdown)


def stages_markdown(report: Dict[str, Any]) -> str:
    lines = [
        "# Stage validation",
        "",
        "Successful expert demonstrations replayed from their recorded simulator states through the StageTracker, "
        "with the negative controls (no milestone on initial states; `random` never reaches the last milestone).",
        "",
        "| task | demos | every milestone | in order | no predicate error | replay exact | none on initial states | random below last | passed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mark = {True: "yes", False: "**NO**"}
    for task, t in report["tasks"].items():
        c = t["checks"]
        lines.append(
            f"| {task} | {len(t['demos'])} | {mark[c['every_milestone_reached']]} | {mark[c['in_order']]} | "
            f"{mark[c['no_predicate_error']]} | {mark[c['replay_exact']]} | {mark[c['none_on_initial_states']]} | "
            f"{mark[c['random_never_reaches_last']]} | {mark[t['passed']]} |"
        )
    lines += ["", "Completion steps per demonstration:", ""]
    for task, t in report["tasks"].items():
        for row in t["demos"]:
            lines.append(f"- {task} episode {row['episode']}: " + ", ".join(
                f"{g}@{s}" for g, s in zip(t["subgoals"], row["stage_steps"])))
    errors = [(task, row["episode"], e) for task, t in report["tasks"].items() for row in t["demos"]
              for e in ([row["error"]] if row["error"] else []) + row.get("holding_errors", [])]
    if errors:
        lines += ["", "Predicate errors:", ""] + [f"- {task} episode {ep}: {e}" for task, ep, e in errors]
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- pairing


class ActionRecorder(Observer):
    def on_start(self, env) -> None:
        self.actions: List[np.ndarray] = []

    def on_step(self, step, action, env, latched) -> None:
        self.actions.append(np.array(action, dtype=np.float64))


def _compare(a: List[np.ndarray], b: List[np.ndarray]) -> Dict[str, Any]:
    """Max absolute difference over the common steps, and whether the lengths agree."""
    n = min(len(a), len(b))
    diff = float(np.max(np.abs(np.array(a[:n]) - np.array(b[:n])))) if n else 0.0
    return {"max_abs_diff": diff, "same_length": len(a) == len(b), "steps": [len(a), len(b)]}


def validate_pairing(
    run_dir: Path | str,
    tasks: Sequence[str],
    policy: str = "reference",
    backend: str = "robosuite",
    episodes: Sequence[int] = (0, 1),
    phase: str = "formal",
    steps: int = 120,
    asset_kit: Optional[str] = None,
) -> CheckResult:
    """Paper Table II: environment-side and policy-side pairing of clean rollouts.

    (a) repeated resets of an episode (with other episodes and a perturbed rollout
    in between) give identical fingerprints; (b) two rollouts with uncontrolled
    policy randomness give different actions (N/A for a deterministic policy);
    (c) two rollouts with the shared policy seed give identical actions.
    Rollouts are cut at ``steps`` control steps: enough to compare actions.
    """
    protocol = specs.load_protocol()
    b = get_backend(backend, asset_kit=asset_kit)
    pol = make_policy(policy)
    report: Dict[str, Any] = {"backend": backend, "policy": pol.identity(), "steps": steps, "tasks": {}}
    for task in tasks:
        env = b.make(task)
        spec = specs.load_stage_spec(backend, task)
        fingerprints: Dict[int, List[str]] = {}
        for i, ep in enumerate(episodes):
            key = RolloutKey(phase, task, ep, "clean")
            first = prepare_episode(env, protocol, key)
            # disturb: another episode of the phase (a fixed list of initial states may hold no other one
            # far away), and a perturbed rollout that edits the model
            other = episodes[(i + 1) % len(episodes)] if len(episodes) > 1 else ep + 1
            prepare_episode(env, protocol, RolloutKey(phase, task, other, "clean"))
            run_rollout(env, pol, RolloutKey(phase, task, ep, "camera:L3"), protocol, spec, backend, horizon=5)
            run_rollout(env, pol, RolloutKey(phase, task, ep, "illumination:L3"), protocol, spec, backend, horizon=5)
            fingerprints[ep] = [first, prepare_episode(env, protocol, key), prepare_episode(env, protocol, key)]
        env_ok = all(len(set(v)) == 1 for v in fingerprints.values())

        ep = episodes[0]
        key = RolloutKey(phase, task, ep, "clean")

        def actions(seed: Optional[int]) -> List[np.ndarray]:
            rec = ActionRecorder()

            class Uncontrolled:  # reseeds the policy from OS entropy after the harness's reset
                def __init__(self, inner, s):
                    self.inner, self.s = inner, s

                def __getattr__(self, name):
                    return getattr(self.inner, name)

                def reset(self, _seed):
                    self.inner.reset(self.s)

            runner = pol if seed is None else Uncontrolled(pol, seed)
            run_rollout(env, runner, key, protocol, spec, backend, observer=rec, horizon=steps)
            return rec.actions

        seeded = _compare(actions(None), actions(None))
        uncontrolled = None if pol.deterministic else _compare(actions(secrets.randbits(63)), actions(secrets.randbits(63)))
        env.close()
        checks = {
            "env_fingerprints_identical": env_ok,
            "uncontrolled_actions_differ": uncontrolled is None
            or uncontrolled["max_abs_diff"] > 0
            or not uncontrolled["same_length"],
            "seeded_actions_identical": seeded["max_abs_diff"] == 0.0 and seeded["same_length"],
        }
        report["tasks"][task] = {
            "episodes": list(episodes),
            "resets_per_episode": 3,
            "fingerprints": {str(k): v[0] for k, v in fingerprints.items()},
            "uncontrolled": uncontrolled,
            "seeded": seeded,
            "checks": checks,
            "passed": all(checks.values()),
        }
    return _finish(run_dir, "pairing validation", "pairing", report, pairing_markdown)


def pairing_markdown(report: Dict[str, Any]) -> str:
    lines = [
        "# Pairing validation (paper Table II)",
        "",
        f"Policy `{report['policy']['name']}`; action sequences compared over the first {report['steps']} control steps.",
        "",
        "| task | env fingerprints identical across resets | uncontrolled policy RNG: max abs action diff | shared seed: max abs action diff | passed |",
        "|---|---|---|---|---|",
    ]
    for task, t in report["tasks"].items():
        unc = "N/A (deterministic)" if t["uncontrolled"] is None else f"{t['uncontrolled']['max_abs_diff']:.4g}"
        lines.append(
            f"| {task} | {'yes' if t['checks']['env_fingerprints_identical'] else '**NO**'} | {unc} | "
            f"{t['seeded']['max_abs_diff']:.4g} | {'yes' if t['passed'] else '**NO**'} |"
        )
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)
