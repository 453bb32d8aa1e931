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
import zipfile
from pathlib import Path
from typing import Any, Dict, Mapping

import numpy as np

from robocasa_shift.arrays import array_text, npz_bytes, read_npz, text_array
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import BadInput, NpzLimitError

FORMAT = 1


def demo_path(directory: Path | str, key: RolloutKey) -> Path:
    """Where the demonstration of ``key`` lives under ``directory``."""
    return Path(directory) / key.task / f"{key.phase}-{key.episode:04d}.npz"


def demo_bytes(actions: np.ndarray, states: np.ndarray, meta: Mapping[str, Any]) -> bytes:
    """One demonstration file's bytes (the run directory's writer puts them in place: ``engine/demo_recorder.py``)."""
    return npz_bytes({"format": np.array(FORMAT), "actions": np.asarray(actions, dtype=np.float64),
                      "states": np.asarray(states, dtype=np.float64), "meta": text_array(json.dumps(dict(meta)))})


def load_demo(path: Path | str) -> Dict[str, Any]:
    """A demonstration file's ``actions``, ``states`` and ``meta`` (never unpickled; sizes capped before reading).

    Raises:
        BadInput: not an ``.npz`` file, another format version, or a file that declares more than it may hold (over
            ``MAX_NPZ_BYTES``, an object array): the message names the file.
    """
    try:
        data = read_npz(path)
    except (NpzLimitError, zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise BadInput(f"{path}: not a demonstration file this version reads ({exc})") from None
    for name in ("format", "actions", "states", "meta"):
        if name not in data:
            raise BadInput(f"{path}: not a demonstration file (no '{name}' array)")
    if int(data["format"]) != FORMAT:
        raise BadInput(f"{path}: demonstration format {int(data['format'])}, this version reads {FORMAT}")
    meta = data["meta"]
    meta = array_text(meta) if meta.dtype == np.uint8 else str(meta)  # files of earlier versions hold a str array
    return {"actions": data["actions"], "states": data["states"], "meta": json.loads(meta)}
