"""Demonstrations: recorded actions and bit-exact simulator states, one ``.npz`` file per episode.

File format (version 1), ``<dir>/<task>/<phase>-<episode:04d>.npz``:

- ``format``: 1
- ``actions``: float64 (T, action_dim), the actions executed at control steps 1..T
- ``states``: float64 (T + 1, S), the backend's physics state (``Env.get_state()["integration"]``;
  MuJoCo's ``mjSTATE_INTEGRATION`` on the MuJoCo backends) before the first step and after
  every step; ``Env.set_physics_state`` restores one
- ``meta``: a JSON string: backend, task, phase, episode, env_seed, policy_seed,
  policy, success, steps, stage_names, stage_steps, spec_hash, stage_spec_hash,
  versions, state_layout

Replaying ``actions`` from the reset of ``env_seed`` reproduces ``states`` bit
for bit; replaying ``states`` through a StageTracker validates stage specs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Tuple

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.engine.rollout import Observer, run_rollout

FORMAT = 1


class DemoRecorder(Observer):
    def on_start(self, env) -> None:
        self.actions: List[np.ndarray] = []
        self.states: List[np.ndarray] = [env.get_state()["integration"].copy()]

    def on_step(self, step, action, env, latched) -> None:
        self.actions.append(np.array(action, dtype=np.float64))
        self.states.append(env.get_state()["integration"].copy())


def demo_path(directory: Path | str, key: RolloutKey) -> Path:
    return Path(directory) / key.task / f"{key.phase}-{key.episode:04d}.npz"


def record_demo(env, policy, key: RolloutKey, protocol, stage_spec, backend: str, directory: Path | str) -> Tuple[Record, Path]:
    """Run ``policy`` on ``key`` (clean) and save the demonstration, successful or not."""
    recorder = DemoRecorder()
    record = run_rollout(env, policy, key, protocol, stage_spec, backend, observer=recorder)
    path = demo_path(directory, key)
    path.parent.mkdir(parents=True, exist_ok=True)

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
        "state_layout": f"{backend} Env.get_state()['integration'] (physics state, set_physics_state restores it)",
    }
    actions = np.array(recorder.actions).reshape(len(recorder.actions), -1)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez_compressed(tmp, format=np.array(FORMAT), actions=actions, states=np.array(recorder.states), meta=np.array(json.dumps(meta)))
    tmp.replace(path)
    return record, path


def load_demo(path: Path | str) -> Dict[str, Any]:
    with np.load(path) as data:
        if int(data["format"]) != FORMAT:
            raise ValueError(f"{path}: demonstration format {int(data['format'])}, this version reads {FORMAT}")
        return {"actions": data["actions"], "states": data["states"], "meta": json.loads(str(data["meta"]))}
