"""Per-step logs: what a rollout did at every control step, for runtime monitors and judges.

The file format. A ``StepLogger`` (``robocasa_shift.engine.step_logger``, an observer of the rollout)
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
- ``features`` (boundaries, F) float32, only for policies that offer them
  (``Policy.features``): the policy's internal representation of each boundary's
  observation, what hidden-state monitors probe (meta ``features``: F, 0 when none;
  meta ``feature_blocks``, when the policy names them (``Policy.feature_blocks``):
  ``[[name, width], ...]``, consecutive column sets whose widths sum to F).
- ``contacts`` (steps, 5) int64, only from backends that read contacts
  (``contact_state``): per post-step state, in :data:`CONTACT_COLUMNS` order, the
  robot's contact pairs with the scene, its contact pairs with task objects other
  than the one it manipulates, whether it holds that object (1/0), whether that
  object touches anything but the robot (1/0), and its centre's height above the
  surface it started on (mm, rounded).

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

from robocasa_shift.arrays import array_text, npz_bytes, read_npz, text_array
from robocasa_shift.errors import RunDirError

FORMAT = "robocasa-shift step log"
VERSION = 1
SUFFIX = ".steps.npz"
DEFAULT_SAMPLES = 8  # per boundary, for sampling-disagreement monitors (RESCUE uses 8)
MAX_ACTION_DIMS = 64  # a step log with wider actions is refused (see max_log_bytes)
MAX_FEATURES = 4096  # a step log with wider feature vectors is refused (see max_log_bytes)
MAX_LOG_BYTES = 256 * 2**20  # the documented maximum of one step log's arrays
CONTACT_COLUMNS = ("robot_scene", "robot_other_object", "holding", "object_supported", "object_height_mm")


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
    features: Optional[np.ndarray] = None
    contacts: Optional[np.ndarray] = None

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
        if self.features is not None:
            entries["features"] = np.asarray(self.features, dtype=np.float32)
        if self.contacts is not None:
            entries["contacts"] = np.asarray(self.contacts, dtype=np.int64).reshape(-1, len(CONTACT_COLUMNS))
        return npz_bytes(entries)

    def summary(self, data: bytes) -> Dict[str, Any]:
        """What the record keeps of its log (``data``: this log's bytes)."""
        return {"sha256": hashlib.sha256(data).hexdigest(), "steps": self.steps, "boundaries": len(self.boundary),
                "samples": int(self.meta.get("samples", 0))}

    @classmethod
    def read(cls, source: Union[Path, str, bytes], where: str = "step log", max_bytes: Optional[int] = None) -> "StepLog":
        """Read a step-log file (a path or its bytes), never unpickling anything.

        ``max_bytes`` caps what the arrays may declare (see :func:`max_log_bytes`); every entry is
        checked (dtypes, shapes, ``arm_dims`` and ``gripper_dim`` within the action, boundaries
        within the steps) before a monitor can index with it.

        Raises:
            StepLogError: not a step log of this format, arrays of inconsistent lengths, or metadata
                that does not fit the arrays.
        """
        name = str(source) if not isinstance(source, bytes) else where
        try:
            entries = read_npz(source, MAX_LOG_BYTES if max_bytes is None else max_bytes)
            meta = json.loads(array_text(entries.pop("meta")))
            if not isinstance(meta, dict):
                raise ValueError("its metadata is not a JSON object")
            log = cls(meta=meta, eef_pos=entries.pop("eef_pos"), action=entries.pop("action"),
                      latched=entries.pop("latched"), boundary=entries.pop("boundary"), samples=entries.pop("samples", None),
                      features=entries.pop("features", None), contacts=entries.pop("contacts", None))
        except StepLogError:
            raise
        except Exception as exc:
            raise StepLogError(f"{name}: not a readable step log ({type(exc).__name__}: {str(exc)[:300]})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise StepLogError(f"{name}: format {str(meta.get('format'))[:80]!r} version {str(meta.get('version'))[:20]!r}; "
                               f"expected {FORMAT!r} version {VERSION}")
        problems = []
        if entries:
            problems.append(f"unexpected entries {sorted(entries)[:10]}")
        problems += log._shape_problems()
        if not problems:
            if len(log.eef_pos) != log.steps + 1 or len(log.latched) != log.steps:
                problems.append(f"{log.steps} actions but {len(log.eef_pos)} positions and {len(log.latched)} latch counts")
            if log.samples is not None and len(log.samples) != len(log.boundary):
                problems.append(f"{len(log.boundary)} boundaries but {len(log.samples)} sample sets")
            if log.features is not None and len(log.features) != len(log.boundary):
                problems.append(f"{len(log.boundary)} boundaries but {len(log.features)} feature vectors")
            if log.contacts is not None and len(log.contacts) != log.steps:
                problems.append(f"{log.steps} actions but {len(log.contacts)} contact rows")
            problems += log._meta_problems()
        if problems:
            raise StepLogError(f"{name}: " + "; ".join(problems))
        return log

    def _shape_problems(self) -> List[str]:
        problems = []
        wanted = {"eef_pos": (2, "fiub"), "action": (2, "fiub"), "latched": (1, "iub"), "boundary": (1, "iu")}
        if self.samples is not None:
            wanted["samples"] = (3, "fiub")
        if self.features is not None:
            wanted["features"] = (2, "fiub")
        if self.contacts is not None:
            wanted["contacts"] = (2, "iu")
        for entry, (ndim, kinds) in wanted.items():
            value = getattr(self, entry)
            if value.ndim != ndim or value.dtype.kind not in kinds:
                problems.append(f"entry {entry!r} is {value.ndim}-D {value.dtype.str}, expected {ndim}-D numbers")
        if not problems and self.eef_pos.shape[1] != 3:
            problems.append(f"entry 'eef_pos' has {self.eef_pos.shape[1]} columns, expected 3")
        if not problems and self.features is not None and self.features.shape[1] > MAX_FEATURES:
            problems.append(f"entry 'features' has {self.features.shape[1]} dimensions, more than {MAX_FEATURES}")
        if not problems and self.contacts is not None:
            sound = self.contacts.shape[1] == len(CONTACT_COLUMNS)
            if not sound or self.contacts[:, :4].min(initial=0) < 0 or self.contacts[:, 2:4].max(initial=0) > 1:
                problems.append(f"entry 'contacts' must be {len(CONTACT_COLUMNS)} columns {list(CONTACT_COLUMNS)}: two counts "
                                "of at least 0, two flags of 0 or 1, a height")
        if not problems and self.action.shape[1] > MAX_ACTION_DIMS:
            problems.append(f"entry 'action' has {self.action.shape[1]} dimensions, more than {MAX_ACTION_DIMS}")
        return problems

    def _meta_problems(self) -> List[str]:
        """Metadata a monitor indexes with: within the arrays, or named as the problem."""
        problems = []
        dims = self.action.shape[1]
        arm, gripper, samples = self.meta.get("arm_dims"), self.meta.get("gripper_dim"), self.meta.get("samples", 0)
        if not (isinstance(arm, list) and all(_index(d, dims) for d in arm) and len(set(arm)) == len(arm)):
            problems.append(f"meta 'arm_dims' must be distinct action dimensions (0 to {dims - 1}), got "
                            f"{json.dumps(arm)[:60]}")
        if not (_index(gripper, dims) or (self.steps == 0 and _index(gripper, max(dims, 1)))):
            problems.append(f"meta 'gripper_dim' must be an action dimension (0 to {dims - 1}), got "
                            f"{json.dumps(gripper)[:60]}")
        if not (isinstance(samples, int) and not isinstance(samples, bool) and samples >= 0):
            problems.append(f"meta 'samples' must be a count, got {json.dumps(samples)[:60]}")
        if len(self.boundary) and (self.boundary.min() < 0 or self.boundary.max() > self.steps
                                   or (np.diff(self.boundary) < 0).any()):
            problems.append(f"boundaries must be non-decreasing steps within 0-{self.steps}")
        if self.samples is not None and isinstance(arm, list) and self.samples.shape[2] != len(arm):
            problems.append(f"samples hold {self.samples.shape[2]} arm dimensions, arm_dims names {len(arm)}")
        blocks = feature_blocks_problem(self.meta["feature_blocks"], self.features) \
            if "feature_blocks" in self.meta else None
        if blocks:
            problems.append(blocks)
        return problems


MAX_BLOCK_NAME = 64  # characters of a feature set's name


def feature_blocks_problem(blocks: Any, features: Optional[np.ndarray]) -> Optional[str]:
    """What is wrong with a log's meta ``feature_blocks`` (None when nothing): a list of ``[name, width]`` with
    distinct names of at most 64 printable characters and positive widths summing to the features' width."""
    width = None if features is None else int(features.shape[1])
    ok = (isinstance(blocks, list) and 0 < len(blocks) <= MAX_FEATURES and width is not None
          and all(isinstance(b, list) and len(b) == 2 and isinstance(b[0], str) and 0 < len(b[0]) <= MAX_BLOCK_NAME
                  and b[0].isprintable() and _index(b[1], MAX_FEATURES + 1) and b[1] > 0 for b in blocks))
    if ok and len({b[0] for b in blocks}) == len(blocks) and sum(b[1] for b in blocks) == width:
        return None
    return (f"meta 'feature_blocks' must be [name, width] pairs with distinct names and widths summing to the "
            f"{width if width is not None else 'absent'} features, got {json.dumps(blocks)[:80]}")


def _index(value: Any, size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < size


def max_log_bytes(summary: Any) -> int:
    """What a step log may declare, from its record's ``step_log`` summary (steps, boundaries, samples).

    Generous for any real log (``MAX_ACTION_DIMS`` action and arm dimensions), never more than
    :data:`MAX_LOG_BYTES`; a summary without counts gets that documented maximum.
    """
    def count(name: str) -> int:
        value = summary.get(name) if isinstance(summary, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else MAX_LOG_BYTES

    steps, boundaries, samples = count("steps"), count("boundaries"), count("samples")
    derived = 2**20 + (steps + 1) * 8 * (3 + MAX_ACTION_DIMS + 1 + len(CONTACT_COLUMNS)) + boundaries * (8 + max(samples, 1) * MAX_ACTION_DIMS * 4
                                                                     + MAX_FEATURES * 4)
    return min(MAX_LOG_BYTES, derived)


def log_path(record_path: Path) -> Path:
    """Where the step log of the record at ``record_path`` lives (beside it)."""
    return record_path.with_name(record_path.name[: -len(".json")] + SUFFIX)


__all__ = ["CONTACT_COLUMNS", "DEFAULT_SAMPLES", "FORMAT", "MAX_BLOCK_NAME", "feature_blocks_problem", "MAX_ACTION_DIMS", "MAX_FEATURES", "MAX_LOG_BYTES", "SUFFIX", "StepLog", "StepLogError", "VERSION",
           "log_path", "max_log_bytes"]
