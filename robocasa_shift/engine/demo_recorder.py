"""Recording demonstrations: a rollout observed step by step and saved in the demonstration format
(:mod:`robocasa_shift.core.demos`)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.core.demos import demo_bytes, demo_path
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.engine.rollout import Observer, run_rollout
from robocasa_shift.rundir.files import atomic_write_bytes


class DemoRecorder(Observer):
    def on_start(self, env) -> None:
        self.actions: List[np.ndarray] = []
        self.states: List[np.ndarray] = [env.get_state()["integration"].copy()]

    def on_step(self, step, action, env, latched) -> None:
        self.actions.append(np.array(action, dtype=np.float64))
        self.states.append(env.get_state()["integration"].copy())


def record_demo(env, policy, key: RolloutKey, protocol, stage_spec, backend: str, directory: Path | str,
                root: Optional[Path | str] = None) -> Tuple[Record, Path]:
    """Run ``policy`` on ``key`` (clean) and save the demonstration, successful or not, through the run
    directory's writer (``root``: the run directory, or a ``confined`` one: no link below it is followed)."""
    recorder = DemoRecorder()
    record = run_rollout(env, policy, key, protocol, stage_spec, backend, observer=recorder)
    path = demo_path(directory, key)

    meta = {
        "backend": backend,
        "task": key.task,
        "phase": key.phase,
        "episode": key.episode,
        "env_seed": record.env_seed,
        "policy_seed": record.policy_seed,
        "policy": policy.name,
        "success": record.success,
        "steps": record.steps,
        "stage_names": record.stage_names,
        "stage_steps": record.stage_steps,
        "spec_hash": record.spec_hash,
        "stage_spec_hash": record.stage_spec_hash,
        "valid": record.valid,
        "error": record.error,
        "versions": get_backend(backend).versions(),
        "asset_kit": getattr(env, "asset_kit", None),
        "state_layout": f"{backend} Env.get_state()['integration'] (physics state, set_physics_state restores it)",
    }
    actions = np.array(recorder.actions).reshape(len(recorder.actions), -1)
    atomic_write_bytes(path, demo_bytes(actions, np.array(recorder.states), meta), root)
    return record, path
