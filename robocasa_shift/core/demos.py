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
from typing import Any, Dict, Mapping

import numpy as np

from robocasa_shift.core.records import RolloutKey

FORMAT = 1


def demo_path(directory: Path | str, key: RolloutKey) -> Path:
    """Where the demonstration of ``key`` lives under ``directory``."""
    return Path(directory) / key.task / f"{key.phase}-{key.episode:04d}.npz"


def save_demo(path: Path, actions: np.ndarray, states: np.ndarray, meta: Mapping[str, Any]) -> None:
    """Write one demonstration file atomically (a temporary file renamed over ``path``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez_compressed(tmp, format=np.array(FORMAT), actions=actions, states=states, meta=np.array(json.dumps(dict(meta))))
    tmp.replace(path)


def load_demo(path: Path | str) -> Dict[str, Any]:
    """A demonstration file's ``actions``, ``states`` and ``meta`` (never unpickled)."""
    with np.load(path) as data:
        if int(data["format"]) != FORMAT:
            raise ValueError(f"{path}: demonstration format {int(data['format'])}, this version reads {FORMAT}")
        return {"actions": data["actions"], "states": data["states"], "meta": json.loads(str(data["meta"]))}
