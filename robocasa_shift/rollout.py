"""The pairing engine and the rollout loop.

For a key (phase, task, episode, condition, replicate):

    reset(env seed) -> fingerprint -> inject perturbation -> policy.reset(policy seed)
    loop: observe -> observation perturbation -> policy chunk -> env.step -> StageTracker -> success?

The env seed, the policy seed and the factor draws depend only on the study
seed and the key's (task, phase, episode[, replicate]), never on the
condition, so all 13 rollouts of a base episode start from the same state
with the same policy RNG state; the fingerprints recorded before the
perturbation prove it.
"""

from __future__ import annotations

import time
import traceback
from typing import Dict, Optional

import numpy as np

from . import seeding
from .backends.base import cameras_for_roles
from .perturbations import PerturbationError, applied_perturbation, factor_kind
from .policies.base import ChunkCursor, Observation, Policy
from .records import Record, RolloutKey
from .specs import Protocol, StageSpec, parse_condition
from .stages import StageTracker


class RendererError(RuntimeError):
    pass


class Observer:
    """Watches a rollout (demonstration recording, video frames); the default does nothing.

    ``on_start`` runs after the perturbation is injected, ``on_observation``
    with the images the policy receives, ``on_step`` after every control step
    with the action taken and the subgoals that latched on its post-step state.
    """

    def on_start(self, env) -> None:
        pass

    def on_observation(self, step: int, images: Dict[str, np.ndarray]) -> None:
        pass

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        pass


def prepare_episode(env, protocol: Protocol, key: RolloutKey) -> str:
    """Reset to the key's base episode; return the pre-perturbation fingerprint."""
    env.reset(seeding.env_seed(protocol.study_seed, key.task, key.phase, key.episode))
    return env.fingerprint()


def inject(env, protocol: Protocol, key: RolloutKey) -> Optional[dict]:
    """Apply the key's condition to the environment; return its runtime record (None when clean)."""
    factor, level = parse_condition(key.condition, protocol)
    if factor is None:
        return None
    spec = protocol.factor(factor)
    kind = factor_kind(spec)
    rng = seeding.draw_rng(protocol.study_seed, factor, key.task, key.phase, key.episode)
    draw = kind.draw(spec, rng, env)
    return applied_perturbation(spec, level, env, draw)


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
    start = time.perf_counter()
    horizon = int(horizon or env.task.horizon)
    record = Record(
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
        horizon=horizon,
        n_stages=len(stage_spec.subgoals),
        stage_names=stage_spec.names,
        stage_steps=[None] * len(stage_spec.subgoals),
    )
    observer = observer or Observer()
    timing = {"reset_s": 0.0, "physics_s": 0.0, "render_s": 0.0, "policy_s": 0.0, "tracker_s": 0.0}
    tracker = StageTracker(stage_spec)
    phase = "reset"
    try:
        t0 = time.perf_counter()
        record.env_fingerprint = prepare_episode(env, protocol, key)
        phase = "perturbation"
        record.perturbation = inject(env, protocol, key)
        timing["reset_s"] = time.perf_counter() - t0
        if record.perturbation is not None and not record.perturbation["ok"]:
            raise PerturbationError(
                f"applied parameters differ from the spec by {record.perturbation['max_abs_error']:.3g}"
            )
        obs_transform = None
        if record.perturbation is not None:
            spec = protocol.factor(record.perturbation["factor"])
            kind = factor_kind(spec)
            if kind.side == "obs":
                obs_transform = (kind, spec.level(record.perturbation["level"]))

        phase = "policy reset"
        policy.reset(record.policy_seed)
        record.policy_rng_fingerprint = policy.rng_fingerprint()

        cameras = cameras_for_roles(env, policy.camera_roles)
        roles = {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in cameras}
        cursor = ChunkCursor()
        observer.on_start(env)
        phase = "rollout"
        for step in range(horizon):
            if cursor.empty():
                t0 = time.perf_counter()
                images = {}
                for cam in cameras:
                    try:
                        image = env.render(cam, policy.image_size)
                    except Exception as exc:
                        raise RendererError(f"rendering {cam}: {type(exc).__name__}: {exc}") from exc
                    if obs_transform is not None:
                        image = obs_transform[0].transform(image, obs_transform[1])
                    images[cam] = image
                record.frames_rendered += len(cameras)
                observer.on_observation(step, images)
                obs = Observation(
                    images=images,
                    camera_roles=roles,
                    proprio=env.proprio(),
                    instruction=env.task.instruction,
                    step=step,
                    privileged=env.privileged_state() if policy.privileged else None,
                )
                t1 = time.perf_counter()
                cursor.load(policy.act(obs))
                record.policy_calls += 1
                timing["render_s"] += t1 - t0
                timing["policy_s"] += time.perf_counter() - t1
            t0 = time.perf_counter()
            action = cursor.next()
            env.step(action)
            t1 = time.perf_counter()
            latched = tracker.update(env, step + 1)
            success = env.is_success()
            timing["tracker_s"] += time.perf_counter() - t1
            timing["physics_s"] += t1 - t0
            record.steps = step + 1
            observer.on_step(step + 1, action, env, latched)
            if success:
                record.success = True
                break
        else:
            record.success = False
    except RendererError as exc:
        record.fail("renderer", str(exc))
    except PerturbationError as exc:
        record.fail("perturbation", str(exc))
    except Exception as exc:
        kind = getattr(exc, "error_kind", "runtime")
        record.fail(kind, f"during {phase}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
    result = tracker.result()
    record.stage_steps = result.stage_steps
    record.stages_completed = result.completed
    record.first_incomplete = result.first_incomplete
    record.stage_error = result.error
    record.truncated = bool(record.valid and not record.success and record.steps < horizon)
    record.timing = {k: round(v, 6) for k, v in timing.items()}
    record.wall_s = round(time.perf_counter() - start, 6)
    return record
