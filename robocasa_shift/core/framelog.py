"""Frame logs: the third-person frames of a formal rollout, kept so the report films pairs without re-running them.

The file format. A ``FrameLogger`` (``robocasa_shift.engine.frame_logger``, an observer of the rollout) renders
the environment's third-person cameras at the policy's image size after the perturbation is injected and after
every control step, through the condition's observation-side factors (the frames the pair videos show when
they re-run the rollout). :meth:`FrameLog.to_bytes` makes the ``.npz`` file written beside the rollout's record
(``<record stem>.frames.npz``; the record's ``frame_log`` holds its SHA-256, size and counts, which the audit
checks). Entries (plain arrays, read with ``allow_pickle=False``):

- ``meta``: UTF-8 JSON: format, version, the rollout key, ``cameras`` (their names).
- ``delta`` (steps + 1, cameras, size, size, 3) uint8: the first frame, then each frame minus the one
  before it, modulo 256. Most of a scene stays still between control steps, so the differences are mostly
  zeros and deflate to a few per cent of the frames; :attr:`FrameLog.frames` adds them back up.

Logging is opt-in (``--log-frames``) and capped: a rollout whose file would exceed :data:`DEFAULT_MAX_BYTES`,
or whose frames would exceed :data:`MAX_FRAME_BYTES` once decoded, keeps no frames, and the report re-runs
its pairs as before. Frames never change a rollout: the logger only renders (tested: records with and without
frames are identical).
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

FORMAT = "robocasa-shift frame log"
VERSION = 1
SUFFIX = ".frames.npz"
DEFAULT_MAX_BYTES = 16 * 2**20  # one file, compressed: a demo rollout's is well under (docs/records.md)
MAX_FILE_BYTES = 256 * 2**20  # the most a frame-log file may hold on disk, whatever the study said
MAX_FRAME_BYTES = 256 * 2**20  # the most its frames may declare once decompressed (and a logger may hold)
MAX_CAMERAS = 8
MAX_SIZE = 1024  # pixels on a side


class FrameLogError(RunDirError):
    """A frame-log file that is not one, or does not belong to its record."""


@dataclass
class FrameLog:
    """One rollout's logged frames (layout in the module docstring)."""

    meta: Dict[str, Any]
    delta: np.ndarray

    @classmethod
    def from_frames(cls, meta: Dict[str, Any], frames: List[List[np.ndarray]]) -> "FrameLog":
        """The log of ``frames`` (one list of camera frames per recorded instant)."""
        stacked = np.asarray(frames, dtype=np.uint8)
        delta = stacked.copy()
        np.subtract(stacked[1:], stacked[:-1], out=delta[1:])  # uint8 arithmetic wraps: modulo 256
        return cls(meta=meta, delta=delta)

    @property
    def frames(self) -> np.ndarray:
        """The frames, ``(steps + 1, cameras, size, size, 3)`` uint8."""
        return np.add.accumulate(self.delta, axis=0, dtype=np.uint8)

    @property
    def steps(self) -> int:
        return len(self.delta) - 1

    def to_bytes(self) -> bytes:
        return npz_bytes({"meta": text_array(json.dumps({**self.meta, "format": FORMAT, "version": VERSION},
                                                        sort_keys=True)),
                          "delta": np.asarray(self.delta, dtype=np.uint8)})

    def summary(self, data: bytes) -> Dict[str, Any]:
        """What the record keeps of its log (``data``: this log's bytes): enough to bound the file before reading."""
        return {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "steps": self.steps,
                "cameras": len(self.meta["cameras"]), "size": int(self.delta.shape[2])}

    @classmethod
    def read(cls, source: Union[Path, str, bytes], where: str = "frame log",
             max_bytes: Optional[int] = None) -> "FrameLog":
        """Read a frame-log file (a path or its bytes), never unpickling anything.

        ``max_bytes`` caps what the arrays may declare once decompressed (see :func:`max_frame_bytes`);
        it is checked from the headers before anything is inflated.

        Raises:
            FrameLogError: not a frame log of this format, or arrays and metadata that do not fit.
        """
        name = str(source) if not isinstance(source, bytes) else where
        try:
            entries = read_npz(source, MAX_FRAME_BYTES if max_bytes is None else min(max_bytes, MAX_FRAME_BYTES))
            meta = json.loads(array_text(entries.pop("meta")))
            if not isinstance(meta, dict):
                raise ValueError("its metadata is not a JSON object")
            log = cls(meta=meta, delta=entries.pop("delta"))
        except Exception as exc:
            raise FrameLogError(f"{name}: not a readable frame log ({type(exc).__name__}: {str(exc)[:300]})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise FrameLogError(f"{name}: format {str(meta.get('format'))[:80]!r} version "
                                f"{str(meta.get('version'))[:20]!r}; expected {FORMAT!r} version {VERSION}")
        problems = [f"unexpected entries {sorted(entries)[:10]}"] if entries else []
        d, cameras = log.delta, meta.get("cameras")
        if d.dtype != np.uint8 or d.ndim != 5 or d.shape[4] != 3 or d.shape[2] != d.shape[3] or len(d) < 1 \
                or not 0 < d.shape[2] <= MAX_SIZE:
            problems.append(f"entry 'delta' is {d.ndim}-D {d.dtype.str} of shape {d.shape}, expected "
                            f"(frames >= 1, cameras, size, size, 3) uint8, size at most {MAX_SIZE}")
        elif not (isinstance(cameras, list) and all(isinstance(c, str) for c in cameras)
                  and len(cameras) == d.shape[1] and 0 < len(cameras) <= MAX_CAMERAS):
            problems.append(f"meta 'cameras' must name the {d.shape[1]} cameras (at most {MAX_CAMERAS}), got "
                            f"{json.dumps(cameras)[:80]}")
        if problems:
            raise FrameLogError(f"{name}: " + "; ".join(problems))
        return log


def _count(summary: Any, name: str, limit: int) -> Optional[int]:
    value = summary.get(name) if isinstance(summary, dict) else None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit
    return value if ok else None


def max_frame_bytes(summary: Any) -> int:
    """What a frame log may declare once decompressed, from its record's ``frame_log`` summary (steps, cameras,
    size): exactly its frames plus the metadata, never more than :data:`MAX_FRAME_BYTES`."""
    steps, cameras, size = (_count(summary, "steps", 10**6), _count(summary, "cameras", MAX_CAMERAS),
                            _count(summary, "size", MAX_SIZE))
    if steps is None or cameras is None or size is None:
        return MAX_FRAME_BYTES
    return min(MAX_FRAME_BYTES, 2**16 + (steps + 1) * cameras * size * size * 3)


def max_file_bytes(summary: Any) -> int:
    """What a frame-log file may hold on disk: the size its record states (checked again by the hash)."""
    size = _count(summary, "bytes", MAX_FILE_BYTES)
    return MAX_FILE_BYTES if size is None else size


def frame_log_path(record_path: Path) -> Path:
    """Where the frame log of the record at ``record_path`` lives (beside it)."""
    return record_path.with_name(record_path.name[: -len(".json")] + SUFFIX)


__all__ = ["DEFAULT_MAX_BYTES", "FORMAT", "FrameLog", "FrameLogError", "MAX_FILE_BYTES", "MAX_FRAME_BYTES", "SUFFIX",
           "VERSION", "frame_log_path", "max_file_bytes", "max_frame_bytes"]
