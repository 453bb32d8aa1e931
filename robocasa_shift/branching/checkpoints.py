"""Recording a trunk, restoring a checkpoint, replay fidelity, and branches.

- :func:`record_trunk` re-runs a key from the start (the same seeds, so the same
  rollout) and snapshots every action-chunk boundary into a :class:`TrunkTape`.
- :func:`restore` makes a rollout continue from a snapshot: reset to the base
  episode, re-inject the perturbation (checked against the snapshot's model
  values and the trunk's fingerprint), then restore the simulator, controllers,
  clocks, StageTracker latches and the policy's generators and internal state.
- :func:`replay_fidelity` continues the trunk from a checkpoint with no
  intervention and no noise and compares every step with the trunk: a
  checkpoint is branched only if the continuation is bit-identical.
- :func:`zero_noise_check` is RESCUE's known answer for the branch code path:
  one ``continue`` branch at sigma 0 (through :func:`run_branch`) must equal
  the trunk's continuation bit for bit.
- :func:`run_checkpoint` is one unit of work: fidelity, the zero-noise check,
  then K branches per intervention, expanded where the verdict is unclear (see
  ``analysis/recoverability.py``).

Execution noise: Gaussian, ``sigma`` on the arm's continuous commands of each
action the policy returns (clipped to [-1, 1], the action space), never on the
gripper or on a scripted manoeuvre. Branch ``i`` of a checkpoint draws from
the stream ``derive_seed(study_seed, stream="branch", task, phase, episode,
condition, replicate, step, index=i)``, the same for every intervention:
``continue`` and ``recover`` branches are paired by their noise (common
random numbers).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Optional, Tuple

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.analysis import recoverability
from robocasa_shift.branching.interventions import (
    Context,
    Intervention,
    make_intervention,
)
from robocasa_shift.branching.snapshot import TrunkTape
from robocasa_shift.core.dynamics import ExecutionNoise
from robocasa_shift.core.policy import Policy, state_support
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.specs import Protocol, StageSpec
from robocasa_shift.engine.rollout import Observer, Rollout, drive
from robocasa_shift.errors import BadInput, RolloutError, StateUnsupported

BUDGETS = ("inherited", "fresh")


class SnapshotMismatch(RolloutError):
    """A restore that does not give the state the snapshot was taken from (fingerprint, model values)."""

    error_kind = "snapshot_mismatch"


@dataclass(frozen=True)
class BranchSettings:
    """How checkpoints are branched (recorded in the branch manifest; one value per study).

    Attributes:
        interventions: the repertoire, by registered name.
        k_initial, k_expanded: branches per (checkpoint, intervention) first, and in all after expansion.
        q: the Jeffreys posterior quantile used as the estimate.
        tau: the primary recovery criterion (expansion straddles it); taus: the criteria reported.
        sigma: execution noise on the arm's continuous commands.
        budget: ``inherited`` (B(t) = horizon - t) or ``fresh`` (``fresh_budget`` steps after the checkpoint).
        stride: branch every ``stride``-th chunk boundary (1: every one).
        k_fixed: with a value, every (checkpoint, intervention) is also run to this many branches in all, a
            fixed-K reference for the adaptive rule (RESCUE Sec. IV-E: K = 32); its first branches are the
            adaptive set's own (the same seeds), the rest are recorded apart (``fixed``). None: no reference.
    """

    interventions: Tuple[str, ...] = ("continue", "recover")
    k_initial: int = recoverability.K_INITIAL
    k_expanded: int = recoverability.K_EXPANDED
    q: float = recoverability.Q
    tau: float = recoverability.TAU
    taus: Tuple[float, ...] = recoverability.TAUS_REPORTED
    sigma: float = 0.05
    budget: str = "inherited"
    fresh_budget: Optional[int] = None
    stride: int = 1
    k_fixed: Optional[int] = None

    def __post_init__(self):
        problems = []
        if not self.interventions:
            problems.append("interventions: name at least one")
        if not 1 <= self.k_initial <= self.k_expanded:
            problems.append(f"k: need 1 <= k_initial <= k_expanded, got {self.k_initial} and {self.k_expanded}")
        if not (0 < self.q < 1 and 0 < self.tau < 1 and all(0 < t < 1 for t in self.taus)):
            problems.append("q, tau and taus must lie strictly between 0 and 1")
        if self.sigma < 0:
            problems.append(f"sigma must be >= 0, got {self.sigma}")
        if self.budget not in BUDGETS:
            problems.append(f"budget must be one of {list(BUDGETS)}, got {self.budget!r}")
        if (self.budget == "fresh") != (self.fresh_budget is not None and self.fresh_budget > 0):
            problems.append("a fresh budget needs fresh_budget > 0 steps, and only a fresh budget takes one")
        if self.stride < 1:
            problems.append(f"stride must be >= 1, got {self.stride}")
        if self.k_fixed is not None and self.k_fixed < self.k_expanded:
            problems.append(f"k_fixed must be at least k_expanded ({self.k_expanded}), got {self.k_fixed}")
        if problems:
            raise BadInput("branch settings: " + "; ".join(problems))

    def record(self) -> Dict[str, Any]:
        """JSON-ready settings, with each intervention's spec hash."""
        out = asdict(self)
        out["interventions"] = {name: make_intervention(name).spec_hash for name in self.interventions}
        out["taus"] = list(self.taus)
        return out

    def horizon(self, step: int, task_horizon: int) -> int:
        """The step a branch from ``step`` must succeed by."""
        return task_horizon if self.budget == "inherited" else step + int(self.fresh_budget)


def branch_seed(study_seed: int, key: RolloutKey, step: int, index: int) -> int:
    """The execution-noise seed of branch ``index`` at the checkpoint ``step`` of trunk ``key``."""
    return seeding.derive_seed(study_seed, stream="branch", task=key.task, phase=key.phase, episode=key.episode,
                               condition=key.condition, replicate=key.replicate, step=step, index=index)


def check_branchable(policy: Policy) -> None:
    """Refuse a policy whose state cannot be snapshotted, with the reason."""
    reason = state_support(policy)
    if reason:
        raise StateUnsupported(reason)


class _Tape(Observer):
    """Writes a trunk's snapshots and trajectory into a tape while it runs."""

    def __init__(self, tape: TrunkTape):
        self.tape = tape

    def on_start(self, env) -> None:
        self.tape.model = {k: np.array(v) for k, v in env.model_values().items()}
        self._trajectory(env)

    def on_boundary(self, rollout: Rollout) -> None:
        self.tape.checkpoints[rollout.step_index] = {
            "env": {k: np.array(v) for k, v in rollout.env.get_state(observations=True).items()},
            "policy": rollout.policy.get_state(),
            "tracker": rollout.tracker.get_state(),
        }

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        self.tape.actions.append(np.array(action, dtype=np.float64))
        self._trajectory(env)

    def _trajectory(self, env) -> None:
        self.tape.joint_positions.append(env.joint_positions())
        self.tape.states.append(np.array(env.get_state()["integration"], dtype=np.float64))


def record_trunk(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec,
                 backend: str) -> Tuple[Record, TrunkTape]:
    """Re-run ``key`` from its start with a snapshot at every chunk boundary; its record and tape."""
    check_branchable(policy)
    tape = TrunkTape(meta={"key": key.to_json()})
    rollout = Rollout(env, policy, key, protocol, stage_spec, backend, observer=_Tape(tape))
    rollout.begin()
    record = drive(rollout)
    tape.stage_steps = [-1 if s is None else int(s) for s in record.stage_steps]
    tape.meta.update(env_fingerprint=record.env_fingerprint, policy_rng_fingerprint=record.policy_rng_fingerprint,
                     horizon=record.horizon, success=record.success, steps=record.steps,
                     stage_steps=record.stage_steps)
    return record, tape


def restore(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
            tape: TrunkTape, step: int, horizon: int, observer: Optional[Observer] = None) -> Rollout:
    """A rollout continuing the trunk from its checkpoint at ``step`` (not yet stepped).

    Raises:
        SnapshotMismatch: the base episode or the re-injected perturbation differs from the trunk's.
    """
    checkpoint = tape.checkpoint(step)
    rollout = Rollout(env, policy, key, protocol, stage_spec, backend, observer=observer, horizon=horizon)
    rollout.begin()
    if not rollout.record.valid:
        raise SnapshotMismatch(f"restoring step {step}: {rollout.record.error}")
    if rollout.record.env_fingerprint != tape.meta["env_fingerprint"]:
        raise SnapshotMismatch(f"restoring step {step}: the base episode's fingerprint "
                               f"{rollout.record.env_fingerprint} differs from the trunk's {tape.meta['env_fingerprint']}")
    model = env.model_values()
    changed = sorted(k for k in tape.model if k not in model or not np.array_equal(model[k], tape.model[k]))
    if changed:
        raise SnapshotMismatch(f"restoring step {step}: the re-injected perturbation left model values that "
                               f"differ from the snapshot's: {changed}")
    env.set_state(checkpoint["env"])
    policy.set_state(checkpoint["policy"])
    rollout.tracker.set_state(checkpoint["tracker"])
    rollout.step_index = rollout.record.steps = step
    return rollout


class _Trajectory(Observer):
    """Joint positions and physics states after every step (what fidelity compares)."""

    def __init__(self):
        self.joint_positions, self.states = [], []

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        self.joint_positions.append(env.joint_positions())
        self.states.append(np.array(env.get_state()["integration"], dtype=np.float64))


def _max_deviation(a, b) -> Optional[float]:
    """Largest absolute difference over aligned steps (None when the lengths differ)."""
    if len(a) != len(b):
        return None
    if not a:
        return 0.0
    return float(max(np.max(np.abs(np.asarray(x) - np.asarray(y))) for x, y in zip(a, b)))


def replay_fidelity(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
                    tape: TrunkTape, step: int) -> Dict[str, Any]:
    """Continue the trunk from ``step`` with no intervention and no noise; compare it step by step.

    ``ok`` only when every joint position and physics state is bit-identical to the trunk's, the
    same subgoals latch at the same steps and the outcome and length agree.
    """
    watch = _Trajectory()
    rollout = restore(env, policy, key, protocol, stage_spec, backend, tape, step, int(tape.meta["horizon"]), watch)
    record = drive(rollout)
    return _against_trunk(tape, step, watch, record.valid, record.success, record.steps, record.stage_steps,
                          record.error)


def _against_trunk(tape: TrunkTape, step: int, watch: _Trajectory, valid: bool, success, steps, stage_steps,
                   error) -> Dict[str, Any]:
    """A continuation from ``step`` compared with the trunk: ``ok`` only when bit-identical in every respect."""
    trunk_q, trunk_s = tape.joint_positions[step + 1:], tape.states[step + 1:]
    same_path = len(watch.states) == len(trunk_s) and all(
        np.array_equal(a, b) for a, b in zip(watch.states, trunk_s)) and all(
        np.array_equal(a, b) for a, b in zip(watch.joint_positions, trunk_q))
    same_stages = stage_steps == tape.meta["stage_steps"]
    same_outcome = success == tape.meta["success"] and steps == tape.meta["steps"]
    return {
        "ok": bool(valid and same_path and same_stages and same_outcome),
        "max_qpos_dev": _max_deviation(watch.joint_positions, trunk_q),
        "max_state_dev": _max_deviation(watch.states, trunk_s),
        "same_stages": same_stages, "same_outcome": same_outcome,
        "success": success, "steps": steps, "stage_steps": stage_steps,
        "error": error,
    }


def run_branch(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
               tape: TrunkTape, step: int, intervention: Intervention, index: int,
               settings: BranchSettings, observer: Optional[Observer] = None) -> Dict[str, Any]:
    """One counterfactual continuation from ``step``: the intervention's script, then the policy, under noise."""
    seed = branch_seed(protocol.study_seed, key, step, index)
    horizon = settings.horizon(step, int(tape.meta["horizon"]))
    rollout = restore(env, policy, key, protocol, stage_spec, backend, tape, step, horizon, observer)
    layout = env.action_layout
    script = intervention.script(Context(layout, step, tape.previous_action(step)))
    if len(script):
        rollout.cursor.load(script)  # the policy is idle until the script is done
    noise = ExecutionNoise(seed, settings.sigma, layout.arm_continuous) if settings.sigma > 0 else None
    record = drive(rollout, noise)
    return {"index": index, "seed": seed, "success": record.success, "steps": record.steps,
            "stage_steps": record.stage_steps, "first_incomplete": record.first_incomplete,
            "valid": record.valid, "error": record.error}


def zero_noise_check(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
                     tape: TrunkTape, step: int, settings: BranchSettings) -> Dict[str, Any]:
    """RESCUE's zero-noise known answer: a ``continue`` branch at sigma 0 reproduces the trunk.

    Unlike :func:`replay_fidelity` (a bare restore), this runs the branch code path itself
    (:func:`run_branch`: the branch seed, the intervention's script, the noise switch) with the study's
    settings but sigma 0 and the trunk's own budget, so the trunk is the answer; the comparison is
    :func:`replay_fidelity`'s (outcome, steps, subgoal latches, every joint position and physics state).
    """
    known = replace(settings, sigma=0.0, budget="inherited", fresh_budget=None)
    watch = _Trajectory()
    branch = run_branch(env, policy, key, protocol, stage_spec, backend, tape, step, make_intervention("continue"), 0,
                        known, watch)
    return _against_trunk(tape, step, watch, branch["valid"], branch["success"], branch["steps"],
                          branch["stage_steps"], branch["error"])


def run_checkpoint(env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
                   tape: TrunkTape, step: int, settings: BranchSettings) -> Dict[str, Any]:
    """One unit of work: replay fidelity at ``step``; where it passed, the zero-noise check and the branches
    of every intervention.

    Returns the checkpoint's result (schema in ``robocasa_shift.branching``); a failure anywhere
    makes it invalid with its error, so ``--retry-errors`` runs it again.
    """
    start = time.perf_counter()
    result: Dict[str, Any] = {**key.to_json(), "step": step, "valid": True, "error": None, "error_kind": None,
                              "fidelity": None, "zero_noise": None, "branched": False, "interventions": {}}
    try:
        result["snapshot_sha256"] = tape.checkpoint_hash(step)
        result["fidelity"] = replay_fidelity(env, policy, key, protocol, stage_spec, backend, tape, step)
        if result["fidelity"]["ok"]:
            result["zero_noise"] = zero_noise_check(env, policy, key, protocol, stage_spec, backend, tape, step,
                                                    settings)
            result["branched"] = True
            for name in settings.interventions:
                result["interventions"][name] = _branch_set(env, policy, key, protocol, stage_spec, backend, tape, step,
                                                            make_intervention(name), settings)
    except Exception as exc:
        result.update(valid=False, error=f"{type(exc).__name__}: {exc}",
                      error_kind=getattr(exc, "error_kind", "runtime"))
    result["wall_s"] = round(time.perf_counter() - start, 3)
    return result


def _branch_set(env, policy, key, protocol, stage_spec, backend, tape, step, intervention: Intervention,
                settings: BranchSettings) -> Dict[str, Any]:
    """K branches, expanded to ``k_expanded`` when the central 50% posterior interval straddles tau."""
    def run(indices):
        return [run_branch(env, policy, key, protocol, stage_spec, backend, tape, step, intervention, i, settings)
                for i in indices]

    branches = run(range(settings.k_initial))
    k = sum(bool(b["success"]) for b in branches)
    expanded = settings.k_expanded > settings.k_initial and recoverability.needs_expansion(k, settings.k_initial, settings.tau)
    if expanded:
        branches += run(range(settings.k_initial, settings.k_expanded))
    invalid = [b for b in branches if not b["valid"]]
    if invalid:
        raise RolloutError(f"branch {invalid[0]['index']} of {intervention.name} failed: {invalid[0]['error']}")
    k, n = sum(bool(b["success"]) for b in branches), len(branches)
    layout = env.action_layout
    entry = {"k": k, "n": n, "expanded": expanded, "estimate": recoverability.jeffreys_lower(k, n, settings.q),
             "script_steps": len(intervention.script(Context(layout, step, tape.previous_action(step)))),
             "branches": branches}
    if settings.k_fixed is not None:  # the fixed-K reference: the adaptive branches, then more of the same streams
        extra = run(range(n, settings.k_fixed))
        invalid = [b for b in extra if not b["valid"]]
        if invalid:
            raise RolloutError(f"branch {invalid[0]['index']} of {intervention.name} failed: {invalid[0]['error']}")
        k_all = k + sum(bool(b["success"]) for b in extra)
        entry["fixed"] = {"k": k_all, "n": settings.k_fixed,
                          "estimate": recoverability.jeffreys_lower(k_all, settings.k_fixed, settings.q),
                          "branches": extra}
    return entry


__all__ = ["BUDGETS", "BranchSettings", "ExecutionNoise", "SnapshotMismatch", "branch_seed", "check_branchable",
           "record_trunk", "replay_fidelity", "restore", "run_branch", "run_checkpoint", "zero_noise_check"]
