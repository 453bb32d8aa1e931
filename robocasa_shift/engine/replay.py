"""Re-running recorded rollouts with frame capture (pair videos), checked against their records.

Rollouts are deterministic given their key, so a pair is re-run from its keys
instead of recording frames for every rollout; a re-run that does not
reproduce its record's outcome and subgoal steps is reported, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.engine.perturbations import factor_kind
from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.engine.rollout import Observer, run_rollout
from robocasa_shift.policies import make_policy
from robocasa_shift.specs import load_protocol, load_stage_spec, parse_condition

# Record fields a re-run must reproduce exactly.
REPRODUCED_FIELDS = ("success", "steps", "stage_steps")


class FrameCapture(Observer):
    """Captures what the given cameras see at every control step, and when subgoals latch.

    ``transform`` applies the condition's observation-side factor, so the frames
    are what the policy saw.
    """

    def __init__(self, cameras: List[str], size: int, transform: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        self.cameras, self.size, self.transform = cameras, size, transform
        self.frames: List[List[np.ndarray]] = []
        self.latched: List[Tuple[int, str]] = []

    def _grab(self, env) -> List[np.ndarray]:
        frames = [env.render(c, self.size) for c in self.cameras]
        return [self.transform(f) for f in frames] if self.transform else frames

    def on_start(self, env) -> None:
        self.frames = [self._grab(env)]
        self.latched = []

    def on_step(self, step, action, env, latched) -> None:
        self.frames.append(self._grab(env))
        self.latched += [(step, g) for g in latched]


@dataclass
class Replay:
    """One re-run rollout: its frames, its new record and how it differs from the stored one."""

    key: RolloutKey
    capture: FrameCapture
    record: Record
    problems: List[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        """The re-run matched the stored record on every field of ``REPRODUCED_FIELDS``."""
        return not self.problems


class Replayer:
    """Re-runs keys of one run directory as its manifest describes them (backend, policy, render profile).

    Environments are built once per task and closed by :meth:`close` (or on leaving a ``with`` block).
    """

    def __init__(self, manifest: Mapping[str, Any]):
        self.manifest = manifest
        self.backend_name = manifest["backend"]
        self.protocol = load_protocol()
        self.backend = get_backend(self.backend_name)
        self.policy = make_policy(manifest["policy"]["name"], **manifest.get("policy_options", {}))
        self._envs: Dict[str, Any] = {}

    def env(self, task: str):
        """The live environment of ``task``."""
        if task not in self._envs:
            self._envs[task] = self.backend.make(task, self.manifest.get("render_profile", "fast"))
        return self._envs[task]

    def _transform(self, condition: str):
        factor, level = parse_condition(condition, self.protocol)
        if factor is None:
            return None
        spec = self.protocol.factor(factor)
        kind = factor_kind(spec)
        if kind.side != "obs":
            return None
        params = spec.level(level)
        return lambda image: kind.transform(image, params)

    def replay(self, key: RolloutKey, stored: Mapping[str, Any]) -> Replay:
        """Re-run ``key`` capturing every camera at the policy's image size; compare with ``stored``."""
        env = self.env(key.task)
        cameras = list(env.third_person_cameras) + list(env.wrist_cameras)
        capture = FrameCapture(cameras, self.policy.image_size, self._transform(key.condition))
        spec = load_stage_spec(self.backend_name, key.task)
        record = run_rollout(env, self.policy, key, self.protocol, spec, self.backend_name, observer=capture)
        problems = [f"{key.condition}: {name} recorded {stored[name]}, re-run {getattr(record, name)}"
                    for name in REPRODUCED_FIELDS if getattr(record, name) != stored[name]]
        return Replay(key, capture, record, problems)

    def replay_all(self, keys: Sequence[RolloutKey], stored: Mapping[RolloutKey, Mapping[str, Any]]) -> List[Replay]:
        """:meth:`replay` for each key, in order."""
        return [self.replay(key, stored[key]) for key in keys]

    def close(self) -> None:
        """Close every environment and the policy."""
        for env in self._envs.values():
            env.close()
        self._envs.clear()
        self.policy.close()

    def __enter__(self) -> "Replayer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
