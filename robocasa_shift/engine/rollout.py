"""The pairing engine and the rollout loop.

For a key (phase, task, episode, condition, replicate):

    reset(env seed) -> fingerprint -> inject perturbation -> policy.reset(policy seed)
    loop: observe -> observation perturbation -> policy chunk -> env.step -> StageTracker -> success?

A loop-side factor (action or observation latency, a lower control rate) is a wrapper at the boundary between
the policy and the environment (``core/loop_wrappers.py``): the loop passes each observation, chunk and action
through the condition's wrappers and knows nothing of what they do.

The env seed, the policy seed and the factor draws depend only on the study
seed and the key's (task, phase, episode[, replicate]), never on the
condition, so all 13 rollouts of a base episode start from the same state
with the same policy RNG state; the fingerprints recorded before the
perturbation prove it.
"""

from __future__ import annotations

import functools
import time
import traceback
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.core.backend import BaseEpisode, cameras_for_roles
from robocasa_shift.core.factors import (
    applied_perturbation,
    combined_perturbation,
    delivered_instruction,
    factor_kind,
    perturbation_entries,
)
from robocasa_shift.core.policy import ChunkCursor, Observation, Policy, act_batch
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.loop_wrappers import Frame, LoopWrapper
from robocasa_shift.core.specs import Protocol, StageSpec
from robocasa_shift.core.stages import StageTracker
from robocasa_shift.errors import PerturbationError, RendererError, RolloutError


class Observer:
    """Watches a rollout (demonstration recording, video frames); the default does nothing.

    ``on_start`` runs after the perturbation is injected, ``on_boundary`` at every
    action-chunk boundary before the policy observes (branching snapshots there),
    ``on_observation`` with the images the policy receives, ``before_act`` with the
    observation just before the policy is asked (step logs draw monitor samples there),
    ``on_step`` after every control step with the action taken and the subgoals that
    latched on its post-step state. An observer only reads: it never changes a rollout.
    """

    def on_start(self, env) -> None:
        pass

    def on_boundary(self, rollout: "Rollout") -> None:
        pass

    def on_observation(self, step: int, images: Dict[str, np.ndarray]) -> None:
        pass

    def before_act(self, rollout: "Rollout", obs: Observation) -> None:
        pass

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        pass


class Observers(Observer):
    """Several observers of one rollout (a step log and a frame log), each hook passed to each in order."""

    def __init__(self, observers: Sequence[Observer]):
        self.observers = list(observers)

    def on_start(self, env) -> None:
        for o in self.observers:
            o.on_start(env)

    def on_boundary(self, rollout: "Rollout") -> None:
        for o in self.observers:
            o.on_boundary(rollout)

    def on_observation(self, step: int, images: Dict[str, np.ndarray]) -> None:
        for o in self.observers:
            o.on_observation(step, images)

    def before_act(self, rollout: "Rollout", obs: Observation) -> None:
        for o in self.observers:
            o.before_act(rollout, obs)

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        for o in self.observers:
            o.on_step(step, action, env, latched)


def observing(*observers: Optional[Observer]) -> Optional[Observer]:
    """The one observer a rollout takes for ``observers`` (None left out): None, the only one, or a group."""
    present = [o for o in observers if o is not None]
    return None if not present else present[0] if len(present) == 1 else Observers(present)


def prepare_episode(env, protocol: Protocol, key: RolloutKey) -> str:
    """Reset to the key's base episode; return the pre-perturbation fingerprint."""
    env.reset(seeding.env_seed(protocol.study_seed, key.task, key.phase, key.episode), BaseEpisode(key.phase, key.episode))
    return env.fingerprint()


def inject(env, protocol: Protocol, key: RolloutKey) -> Optional[dict]:
    """Apply the key's condition to the environment; return its runtime record (None when clean).

    A combined condition (``camera_pose:L2+fog:L1``) draws every factor first, each from its own seed stream on the
    unperturbed episode, exactly as its single-factor condition does, then applies them in the condition's
    order; its record holds one entry per factor (``combined_perturbation``).
    """
    condition = protocol.condition(key.condition)
    if condition.is_clean:
        return None
    draws = []
    for shift in condition.shifts:
        spec = protocol.factor(shift.factor)
        rng = seeding.draw_rng(protocol.study_seed, shift.factor, key.task, key.phase, key.episode)
        draws.append((spec, shift.level, factor_kind(spec).draw(spec, rng, env)))
    entries = [applied_perturbation(spec, level, env, draw) for spec, level, draw in draws]
    return entries[0] if len(entries) == 1 else combined_perturbation(str(condition), entries)


class Rollout:
    """One rollout as a small state machine, so that one driver can run it alone and another can
    run several in lockstep with one batched policy call per decision point.

    ``begin`` resets, fingerprints, injects and seeds; then, until ``done``: ``observe`` when
    ``wants_observation`` (returns None if the rollout failed), ``load`` the policy's chunk,
    ``step``; ``finish`` returns the record. Every failure becomes an invalid record.
    """

    def __init__(self, env, policy: Policy, key: RolloutKey, protocol: Protocol, stage_spec: StageSpec, backend: str,
                 observer: Optional[Observer] = None, horizon: Optional[int] = None):
        self.start = time.perf_counter()
        self.env, self.policy, self.key, self.protocol = env, policy, key, protocol
        self.horizon = int(horizon or env.task.horizon)
        self.record = Record(
            phase=key.phase,
            task=key.task,
            episode=key.episode,
            condition=key.condition,
            replicate=key.replicate,
            backend=backend,
            policy=policy.name,
            spec_hash=protocol.spec_hash,
            stage_spec_hash=stage_spec.content_hash,
            study_seed=protocol.study_seed,
            env_seed=seeding.env_seed(protocol.study_seed, key.task, key.phase, key.episode),
            policy_seed=seeding.policy_seed(protocol.study_seed, key.task, key.phase, key.episode, key.replicate),
            horizon=self.horizon,
            n_stages=len(stage_spec.subgoals),
            stage_names=stage_spec.names,
            stage_steps=[None] * len(stage_spec.subgoals),
            # the generated asset kit the environment loads (robocasa's stand-in kitchens), None on real assets
            asset_kit=(getattr(env, "asset_kit", None) or {}).get("kind"),
            asset_kit_sha256=(getattr(env, "asset_kit", None) or {}).get("sha256"),
        )
        self.observer = observer or Observer()
        self.timing = {"reset_s": 0.0, "physics_s": 0.0, "render_s": 0.0, "policy_s": 0.0, "tracker_s": 0.0}
        self.tracker = StageTracker(stage_spec)
        self.cursor = ChunkCursor()
        self.step_index = 0
        self.done = False
        self._phase = "reset"
        self.obs_transforms: List[tuple] = []
        self.wrappers: List[LoopWrapper] = []  # the loop-side factors' wrappers (begin sets them from the condition)

    def fail(self, exc: Exception) -> None:
        """End the rollout as an invalid record that carries the error (drivers call it too)."""
        if isinstance(exc, RolloutError):
            self.record.fail(exc.error_kind, str(exc))
        else:
            kind = getattr(exc, "error_kind", "runtime")
            self.record.fail(kind, f"during {self._phase}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
        self.done = True

    def begin(self) -> None:
        record = self.record
        try:
            t0 = time.perf_counter()
            record.env_fingerprint = prepare_episode(self.env, self.protocol, self.key)
            self._phase = "perturbation"
            record.perturbation = inject(self.env, self.protocol, self.key)
            self.timing["reset_s"] = time.perf_counter() - t0
            if record.perturbation is not None and not record.perturbation["ok"]:
                raise PerturbationError(
                    f"applied parameters differ from the spec by {record.perturbation['max_abs_error']:.3g}"
                )
            self.instruction = delivered_instruction(self.env.task.instruction, record.perturbation)
            self._setup_shifts(record.perturbation)
            self._phase = "policy reset"
            self.policy.reset(record.policy_seed)
            record.policy_rng_fingerprint = self.policy.rng_fingerprint()
            self.cameras = cameras_for_roles(self.env, self.policy.camera_roles)
            self.roles = {c: ("wrist" if c in self.env.wrist_cameras else "third_person") for c in self.cameras}
            for wrapper in self.wrappers:
                wrapper.start(self, self._capture)
            self.observer.on_start(self.env)
            self._phase = "rollout"
            if self.horizon <= 0:
                self.record.success, self.done = False, True
        except Exception as exc:
            self.fail(exc)

    def _setup_shifts(self, perturbation: Optional[dict]) -> None:
        """The observation-side transforms and the loop-side wrappers of the rollout's factors, each entry's
        ``measured`` record started.

        An observation-side read-back equals its expectation by construction; what is measured (a transform's
        kernel, each camera's first delivered image in ``observe``) is what the audit checks against the frozen
        spec. A loop-side factor's entry records what its wrapper did (``LoopWrapper.measured``)."""
        self.obs_transforms: List[tuple] = []  # (kind, params, draw, entry), applied in the condition's order
        self.wrappers = []
        for entry in perturbation_entries(perturbation):
            spec = self.protocol.factor(entry["factor"])
            kind, params = factor_kind(spec), spec.level(entry["level"])
            if kind.side == "obs":
                self.obs_transforms.append((kind, params, entry.get("draw"), entry))
                entry["measured"] = {**kind.measure_transform(params), "cameras": {}}
            elif kind.side == "loop":
                wrapper = kind.loop_wrapper(params, entry.get("draw"))
                self.wrappers.append(wrapper)
                entry["measured"] = wrapper.measured

    def wants_observation(self) -> bool:
        return not self.done and self.cursor.empty()

    def _capture(self) -> Frame:
        """What the policy reads now: its cameras at its size after any observation-side factors (frame = this
        control step), the robot's own sensing and, for a privileged policy, the simulator state."""
        images = {}
        for cam in self.cameras:
            try:
                image = self.env.render(cam, self.policy.image_size)
            except Exception as exc:
                raise RendererError(f"rendering {cam}: {type(exc).__name__}: {exc}") from exc
            raw = image
            for kind, params, draw, entry in self.obs_transforms:
                image = kind.transform_frame(image, params, draw, self.step_index, cam, self.roles[cam])
            for kind, params, draw, entry in self.obs_transforms:
                measured = entry["measured"]["cameras"]
                if cam not in measured:  # the first observation of each camera: no extra render
                    delivered = image if len(self.obs_transforms) == 1 else \
                        kind.transform_frame(raw, params, draw, self.step_index, cam, self.roles[cam])
                    measured[cam] = {"role": self.roles[cam],
                                     **kind.measure_frame(delivered, raw, params, draw, cam, self.roles[cam])}
            images[cam] = image
        self.record.frames_rendered += len(self.cameras)
        return {"step": self.step_index, "images": images, "proprio": self.env.proprio(),
                "privileged": self.env.privileged_state() if self.policy.privileged else None}

    def observe(self) -> Optional[Observation]:
        """Render what the policy reads (only its cameras, at its size), after any observation-side factor, and pass
        it through the loop-side wrappers (an observation latency hands back an older one)."""
        try:
            t0 = time.perf_counter()
            capture = self._capture
            for wrapper in self.wrappers:
                capture = functools.partial(wrapper.observation, self, capture)
            frame = capture()
            self.observer.on_observation(self.step_index, frame["images"])
            obs = Observation(
                images=frame["images"],
                camera_roles=self.roles,
                proprio=frame["proprio"],
                instruction=self.instruction,
                step=self.step_index,
                privileged=frame["privileged"],
                task=self.key.task,
                action_layout=self.env.action_layout,
            )
            self.timing["render_s"] += time.perf_counter() - t0
            return obs
        except Exception as exc:
            self.fail(exc)
            return None

    def load(self, chunk: np.ndarray, policy_s: float) -> None:
        try:
            for wrapper in self.wrappers:
                chunk = wrapper.chunk(self, chunk)
            self.cursor.load(chunk)
            self.record.policy_calls += 1
            self.timing["policy_s"] += policy_s
        except Exception as exc:
            self.fail(exc)

    def _next_action(self) -> np.ndarray:
        """The action executed this step: the cursor's, through the loop-side wrappers."""
        action = self.cursor.next()
        for wrapper in self.wrappers:
            action = wrapper.action(self, action)
        return action

    def step(self) -> None:
        """One control step, then the StageTracker and the official success check on the post-step state."""
        if self.done:
            return
        try:
            t0 = time.perf_counter()
            action = self._next_action()
            self.env.step(action)
            t1 = time.perf_counter()
            self.step_index += 1
            latched = self.tracker.update(self.env, self.step_index)
            success = self.env.is_success()
            self.timing["tracker_s"] += time.perf_counter() - t1
            self.timing["physics_s"] += t1 - t0
            self.record.steps = self.step_index
            self.observer.on_step(self.step_index, action, self.env, latched)
            if success:
                self.record.success = True
                self.done = True
            elif self.step_index >= self.horizon:
                self.record.success = False
                self.done = True
            if not self.done:
                for wrapper in self.wrappers:
                    wrapper.after_step(self, self._capture)
        except Exception as exc:
            self.fail(exc)

    def finish(self) -> Record:
        record = self.record
        for wrapper in self.wrappers:
            wrapper.finish(self)
        result = self.tracker.result()
        record.stage_steps = result.stage_steps
        record.stages_completed = result.completed
        record.first_incomplete = result.first_incomplete
        record.stage_error = result.error
        record.truncated = bool(record.valid and not record.success and record.steps < self.horizon)
        record.timing = {k: round(v, 6) for k, v in self.timing.items()}
        record.wall_s = round(time.perf_counter() - self.start, 6)
        return record


def run_rollout(
    env,
    policy: Policy,
    key: RolloutKey,
    protocol: Protocol,
    stage_spec: StageSpec,
    backend: str,
    observer: Optional[Observer] = None,
    horizon: Optional[int] = None,
) -> Record:
    """Run one rollout to its first success or its horizon; failures become invalid records.

    ``horizon`` overrides the task's official horizon (short smoke tests); the
    record keeps the horizon it ran with, so the audit sees the difference.
    """
    rollout = Rollout(env, policy, key, protocol, stage_spec, backend, observer, horizon)
    rollout.begin()
    return drive(rollout)


def _before_act(rollout: Rollout, obs: Observation) -> bool:
    """The observer's ``before_act``; False (and the rollout failed) when it raises."""
    try:
        rollout.observer.before_act(rollout, obs)
        return True
    except Exception as exc:
        rollout.fail(exc)
        return False


def drive(rollout: Rollout, edit_chunk: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Record:
    """Run a begun (or restored) rollout to its end, one policy call per chunk boundary; its record.

    ``edit_chunk`` changes each chunk the policy returns before it is executed (branching's
    execution noise); actions already in the cursor (a scripted manoeuvre) are not edited.
    """
    policy = rollout.policy
    while not rollout.done:
        if rollout.wants_observation():
            rollout.observer.on_boundary(rollout)
            obs = rollout.observe()
            if obs is None:
                break
            if not _before_act(rollout, obs):
                break
            t0 = time.perf_counter()
            try:
                chunk = policy.act(obs)
                if edit_chunk is not None:
                    chunk = edit_chunk(chunk)
            except Exception as exc:
                rollout.fail(exc)
                break
            rollout.load(chunk, time.perf_counter() - t0)
        rollout.step()
    return rollout.finish()


def run_lockstep(envs: Sequence, policies: Sequence[Policy], keys: Sequence[RolloutKey], protocol: Protocol,
                 stage_spec: StageSpec, backend: str, horizon: Optional[int] = None,
                 observers: Optional[Sequence[Optional[Observer]]] = None) -> List[Record]:
    """Run several rollouts of one task side by side, one environment and one policy instance each,
    querying the policies with one batched call (``act_batch``) per decision point.

    Each rollout keeps its own seeded generators, so for a policy whose outputs do not depend on
    the batch's composition (the reference policy) the records equal those of ``run_rollout``.
    The call's time is shared equally among the rollouts it served.
    """
    observers = observers or [None] * len(keys)
    rollouts = [Rollout(e, p, k, protocol, stage_spec, backend, observer=o, horizon=horizon)
                for e, p, k, o in zip(envs, policies, keys, observers)]
    for r in rollouts:
        r.begin()
    while True:
        asking = [r for r in rollouts if r.wants_observation()]
        for r in asking:
            r.observer.on_boundary(r)
        observed = [(r, obs) for r in asking for obs in [r.observe()] if obs is not None and _before_act(r, obs)]
        if observed:
            t0 = time.perf_counter()
            try:
                chunks = act_batch([r.policy for r, _ in observed], [obs for _, obs in observed])
            except Exception as exc:
                for r, _ in observed:
                    r.fail(exc)
            else:
                share = (time.perf_counter() - t0) / len(observed)
                for (r, _), chunk in zip(observed, chunks):
                    r.load(chunk, share)
        active = [r for r in rollouts if not r.done]
        if not active:
            return [r.finish() for r in rollouts]
        for r in active:
            r.step()
