"""Per-step logs: what a rollout did at every control step, for runtime monitors and judges.

A :class:`StepLogger` (an :class:`~robocasa_shift.engine.rollout.Observer`)
records, while a rollout runs, one row per control step and one per action-chunk
boundary; :meth:`StepLog.to_bytes` makes the ``.npz`` file written beside the
rollout's record (``<record stem>.steps.npz``; the record's ``step_log`` holds
its SHA-256 and counts, which the audit checks). Entries (plain arrays, read
with ``allow_pickle=False``):

- ``meta``: UTF-8 JSON: format, version, the rollout key, ``stage_names``,
  ``arm_dims`` (the continuous arm commands), ``gripper_dim``, ``samples`` (per
  boundary, 0 when the policy offers none).
- ``eef_pos`` (steps + 1, 3) float64: the end effector in the world frame after
  the perturbation was injected, then after every step.
- ``action`` (steps, action_dim) float64: the action commanded at each step
  (after execution noise, before the simulator), so replaying it reproduces the
  rollout.
- ``latched`` (steps,) int64: subgoals latched once each step's post-step state
  was checked.
- ``boundary`` (boundaries,) int64: control steps taken before each policy call.
- ``samples`` (boundaries, n, len(arm_dims)) float32, only with samples: the arm
  commands of ``n`` extra draws of the policy's decision at each boundary
  (``Policy.sample_actions``, from the rollout's own ``samples`` seed stream, so
  the rollout itself is unchanged).

Logs never change a rollout: the logger only reads, and sampling restores the
policy's state (tested: records with and without logs are identical).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.arrays import array_text, npz_bytes, read_npz, text_array
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.engine.rollout import Observer
from robocasa_shift.errors import RunDirError

FORMAT = "robocasa-shift step log"
VERSION = 1
SUFFIX = ".steps.npz"
DEFAULT_SAMPLES = 8  # per boundary, for sampling-disagreement monitors (RESCUE uses 8)


class StepLogError(RunDirError):
    """A step-log file that is not one, or does not belong to its record."""


@dataclass
class StepLog:
    """One rollout's per-step log (layout in the module docstring)."""

    meta: Dict[str, Any]
    eef_pos: np.ndarray
    action: np.ndarray
    latched: np.ndarray
    boundary: np.ndarray
    samples: Optional[np.ndarray] = None

    @property
    def steps(self) -> int:
        return len(self.action)

    @property
    def gripper(self) -> np.ndarray:
        """The gripper command of each step."""
        return self.action[:, self.meta["gripper_dim"]] if self.steps else np.zeros(0)

    @property
    def arm(self) -> np.ndarray:
        """The continuous arm commands of each step, (steps, len(arm_dims))."""
        return self.action[:, self.meta["arm_dims"]] if self.steps else np.zeros((0, len(self.meta["arm_dims"])))

    def to_bytes(self) -> bytes:
        entries = {"meta": text_array(json.dumps({**self.meta, "format": FORMAT, "version": VERSION}, sort_keys=True)),
                   "eef_pos": np.asarray(self.eef_pos, dtype=np.float64).reshape(-1, 3),
                   "action": np.asarray(self.action, dtype=np.float64),
                   "latched": np.asarray(self.latched, dtype=np.int64),
                   "boundary": np.asarray(self.boundary, dtype=np.int64)}
        if self.samples is not None:
            entries["samples"] = np.asarray(self.samples, dtype=np.float32)
        return npz_bytes(entries)

    def summary(self, data: bytes) -> Dict[str, Any]:
        """What the record keeps of its log (``data``: this log's bytes)."""
        return {"sha256": hashlib.sha256(data).hexdigest(), "steps": self.steps, "boundaries": len(self.boundary),
                "samples": int(self.meta.get("samples", 0))}

    @classmethod
    def read(cls, source: Union[Path, str, bytes], where: str = "step log") -> "StepLog":
        """Read a step-log file (a path or its bytes), never unpickling anything.

        Raises:
            StepLogError: not a step log of this format, or arrays of inconsistent lengths.
        """
        name = str(source) if not isinstance(source, bytes) else where
        try:
            entries = read_npz(source)
            meta = json.loads(array_text(entries.pop("meta")))
            log = cls(meta=meta, eef_pos=entries.pop("eef_pos"), action=entries.pop("action"),
                      latched=entries.pop("latched"), boundary=entries.pop("boundary"), samples=entries.pop("samples", None))
        except StepLogError:
            raise
        except Exception as exc:
            raise StepLogError(f"{name}: not a readable step log ({type(exc).__name__}: {exc})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise StepLogError(f"{name}: format {meta.get('format')!r} version {meta.get('version')!r}; "
                               f"expected {FORMAT!r} version {VERSION}")
        problems = []
        if entries:
            problems.append(f"unexpected entries {sorted(entries)}")
        if len(log.eef_pos) != log.steps + 1 or len(log.latched) != log.steps:
            problems.append(f"{log.steps} actions but {len(log.eef_pos)} positions and {len(log.latched)} latch counts")
        if log.samples is not None and len(log.samples) != len(log.boundary):
            problems.append(f"{len(log.boundary)} boundaries but {len(log.samples)} sample sets")
        if problems:
            raise StepLogError(f"{name}: " + "; ".join(problems))
        return log


def log_path(record_path: Path) -> Path:
    """Where the step log of the record at ``record_path`` lives (beside it)."""
    return record_path.with_name(record_path.name[: -len(".json")] + SUFFIX)


class StepLogger(Observer):
    """Observer that fills a :class:`StepLog` while a rollout runs.

    Args:
        key: the rollout's key (its samples stream is derived from it).
        study_seed: the study seed.
        samples: draws per boundary for policies that offer ``sample_actions`` (0: none).
    """

    def __init__(self, key: RolloutKey, study_seed: int, samples: int = DEFAULT_SAMPLES):
        self.key, self.n_samples = key, int(samples)
        self.rng = np.random.default_rng(seeding.samples_seed(study_seed, key.task, key.phase, key.episode,
                                                              key.replicate))
        self.eef: List[np.ndarray] = []
        self.actions: List[np.ndarray] = []
        self.latched: List[int] = []
        self.boundaries: List[int] = []
        self.samples: List[np.ndarray] = []
        self._count = 0
        self._layout = None

    @property
    def started(self) -> bool:
        """The rollout got as far as its first observation's set-up (an invalid one may not have)."""
        return self._layout is not None

    def on_start(self, env) -> None:
        self._layout = env.action_layout
        self.eef.append(np.array(env.eef_pos(), dtype=np.float64))

    def before_act(self, rollout, obs) -> None:
        self.boundaries.append(rollout.step_index)
        draws = rollout.policy.sample_actions(obs, self.n_samples, self.rng) if self.n_samples > 0 else None
        if draws is not None:
            draws = np.asarray(draws, dtype=np.float64)
            self.samples.append(draws[:, list(self._layout.arm_continuous)].astype(np.float32))

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        self._count += len(latched)
        self.actions.append(np.array(action, dtype=np.float64))
        self.latched.append(self._count)
        self.eef.append(np.array(env.eef_pos(), dtype=np.float64))

    def log(self, stage_names: List[str]) -> StepLog:
        """The log of what was observed so far."""
        layout = self._layout
        dim = len(self.actions[0]) if self.actions else (layout.dim if layout else 0)
        sampled = bool(self.samples) and len(self.samples) == len(self.boundaries)
        meta = {"key": self.key.to_json(), "stage_names": list(stage_names),
                "arm_dims": list(layout.arm_continuous) if layout else [], "gripper_dim": layout.gripper if layout else 0,
                "samples": self.n_samples if sampled else 0}
        return StepLog(meta=meta, eef_pos=np.array(self.eef, dtype=np.float64).reshape(-1, 3),
                       action=np.array(self.actions, dtype=np.float64).reshape(-1, dim),
                       latched=np.array(self.latched, dtype=np.int64), boundary=np.array(self.boundaries, dtype=np.int64),
                       samples=np.stack(self.samples) if sampled else None)


__all__ = ["DEFAULT_SAMPLES", "FORMAT", "SUFFIX", "StepLog", "StepLogError", "StepLogger", "VERSION", "log_path"]
