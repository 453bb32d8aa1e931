"""Trunk snapshots on disk: one compressed ``.npz`` per trunk, read with ``allow_pickle=False``.

The file is numpy's ``.npz`` (a zip of ``.npy`` arrays) written with fixed
timestamps (:mod:`robocasa_shift.arrays`), so the same trunk gives the same bytes
and the same SHA-256.

A :class:`TrunkTape` is what recording a trunk leaves: the state at every
action-chunk boundary, and the trunk's trajectory that replay fidelity is
checked against. Every entry is a plain numpy array (numbers or bytes with their
dtype); nothing is pickled, so a snapshot from a shared run directory can be
read safely on any machine. Entries:

- ``meta``: UTF-8 JSON (as uint8): ``format``, ``version``, the trunk ``key``,
  ``chunk_steps`` (the boundaries snapshotted), ``env_fingerprint`` and
  ``policy_rng_fingerprint`` of the trunk, ``horizon``.
- ``trunk/joint_positions`` (T + 1, nq), ``trunk/states`` (T + 1, S): joint
  positions and the physics state (``Env.get_state()["integration"]``) after the
  perturbation and after every step; ``trunk/actions`` (T, action_dim): the
  actions taken; ``trunk/stage_steps``: latch step per subgoal, -1 when never.
- ``model/<name>``: every perturbable model value after the perturbation was
  injected (a restore re-injects it and checks these).
- ``c<step>/env``, ``c<step>/policy``, ``c<step>/tracker`` (uint8) with their
  ``.index`` (UTF-8 JSON rows ``[name, dtype, shape, offset, nbytes]``): the checkpoint at
  ``step`` (control steps taken), from ``Env.get_state(observations=True)``,
  ``Policy.get_state()`` and ``StageTracker.get_state()``, each part's arrays packed into
  one blob (a zip entry per array would cost more in headers than the state itself);
  ``step`` has four digits or more.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import numpy as np

from robocasa_shift.arrays import MAX_NPZ_BYTES, array_text, npz_bytes, read_npz, text_array
from robocasa_shift.errors import RunDirError

FORMAT = "robocasa-shift trunk snapshots"
VERSION = 2
PARTS = ("env", "policy", "tracker")


class SnapshotError(RunDirError):
    """A snapshot file that is not one (truncated, another format, a checkpoint it lacks)."""


def arrays_hash(arrays: Mapping[str, np.ndarray]) -> str:
    """SHA-256 over named arrays with their dtype and shape, in sorted name order."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        value = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{value.dtype.str}|{value.shape}|".encode())
        h.update(value.tobytes())
    return h.hexdigest()


def pack(arrays: Mapping[str, np.ndarray]) -> tuple:
    """Named arrays as ``(index, blob)``: a JSON index (uint8) and their bytes back to back (uint8)."""
    index, chunks, offset = [], [], 0
    for name in sorted(arrays):
        value = np.asarray(arrays[name])  # not ascontiguousarray: it turns a 0-d array into shape (1,)
        data = value.tobytes()
        index.append([name, value.dtype.str, list(value.shape), offset, len(data)])
        chunks.append(data)
        offset += len(data)
    return text_array(json.dumps(index)), np.frombuffer(b"".join(chunks), dtype=np.uint8).copy()


def unpack(index: np.ndarray, blob: np.ndarray, where: str) -> Dict[str, np.ndarray]:
    """The inverse of :func:`pack`; ``where`` names the entry in errors.

    Raises:
        SnapshotError: a malformed index (an object or void dtype, a negative or non-integer dimension,
            a range outside the blob, a size that does not match the shape).
    """
    out: Dict[str, np.ndarray] = {}
    data = np.asarray(blob, dtype=np.uint8).tobytes()
    try:
        rows = json.loads(array_text(index))
        if not isinstance(rows, list):
            raise ValueError("the index is not a list")
        for row in rows:
            if not (isinstance(row, list) and len(row) == 5):
                raise ValueError(f"index row {str(row)[:80]} is not [name, dtype, shape, offset, nbytes]")
            name, dtype_str, shape, offset, nbytes = row
            if not (isinstance(name, str) and isinstance(dtype_str, str) and isinstance(shape, list)
                    and all(_count(n) for n in shape) and _count(offset) and _count(nbytes)):
                raise ValueError(f"index row {str(row)[:80]}: a name, a dtype, a shape of counts, an offset and a size")
            dtype = np.dtype(dtype_str)
            count = 1
            for n in shape:
                count *= n
            if dtype.hasobject or dtype.kind == "V" or offset + nbytes > len(data) or nbytes != dtype.itemsize * count:
                raise ValueError(f"entry {name[:80]!r}: dtype {dtype_str[:20]}, shape {shape}, bytes {offset}+{nbytes} "
                                 f"of {len(data)}")
            out[name] = np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(tuple(shape)).copy()
    except (TypeError, ValueError, RecursionError) as exc:
        raise SnapshotError(f"{where}: malformed packed state ({str(exc)[:300]})") from None
    return out


def _count(value: Any) -> bool:
    """A non-negative integer (a bool or a float is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _plain(name: str, value: Any) -> np.ndarray:
    array = np.array(value, copy=True)
    if array.dtype == object:
        raise TypeError(f"snapshot entry {name!r} is not a plain array (dtype object); states hold numbers and bytes")
    return array


@dataclass
class TrunkTape:
    """A recorded trunk: its snapshots by step and its trajectory (see the module docstring)."""

    meta: Dict[str, Any]
    joint_positions: List[np.ndarray] = field(default_factory=list)
    states: List[np.ndarray] = field(default_factory=list)
    actions: List[np.ndarray] = field(default_factory=list)
    stage_steps: List[int] = field(default_factory=list)
    model: Dict[str, np.ndarray] = field(default_factory=dict)
    checkpoints: Dict[int, Dict[str, Dict[str, np.ndarray]]] = field(default_factory=dict)

    @property
    def chunk_steps(self) -> List[int]:
        """Every snapshotted boundary, in order."""
        return sorted(self.checkpoints)

    def checkpoint(self, step: int) -> Dict[str, Dict[str, np.ndarray]]:
        """The snapshot at ``step``: ``{"env": ..., "policy": ..., "tracker": ...}``.

        Raises:
            SnapshotError: no boundary was snapshotted at ``step`` (the message lists those that were).
        """
        if step not in self.checkpoints:
            raise SnapshotError(f"no checkpoint at step {step}; this trunk has checkpoints at {self.chunk_steps}")
        return self.checkpoints[step]

    def checkpoint_hash(self, step: int) -> str:
        """SHA-256 of one checkpoint's arrays (recorded with every branch result, checked by the audit)."""
        cp = self.checkpoint(step)
        return arrays_hash({f"{part}/{name}": v for part in PARTS for name, v in cp[part].items()})

    def previous_action(self, step: int):
        """The trunk's action at ``step - 1`` (None at step 0)."""
        return None if step == 0 else np.asarray(self.actions[step - 1])

    def to_bytes(self) -> bytes:
        """The ``.npz`` file's content (compressed)."""
        entries: Dict[str, np.ndarray] = {
            "meta": text_array(json.dumps({**self.meta, "format": FORMAT, "version": VERSION,
                                           "chunk_steps": self.chunk_steps}, sort_keys=True)),
            "trunk/joint_positions": np.array(self.joint_positions, dtype=np.float64),
            "trunk/states": np.array(self.states, dtype=np.float64),
            "trunk/actions": np.array(self.actions, dtype=np.float64) if self.actions else np.zeros((0, 0)),
            "trunk/stage_steps": np.array(self.stage_steps, dtype=np.int64),
        }
        entries.update({f"model/{k}": _plain(k, v) for k, v in self.model.items()})
        for step, cp in self.checkpoints.items():
            for part in PARTS:
                name = f"c{step:04d}/{part}"
                entries[f"{name}.index"], entries[name] = pack({k: _plain(k, v) for k, v in cp[part].items()})
        return npz_bytes(entries)

    @classmethod
    def read(cls, source: Path | str | bytes, where: Optional[str] = None,
             max_bytes: int = MAX_NPZ_BYTES) -> "TrunkTape":
        """Read a snapshot file (a path or its bytes; never unpickling anything).

        ``max_bytes`` caps what its arrays may declare: a forged file that would decompress to more is
        refused before anything is decompressed.

        Raises:
            SnapshotError: the file is not a snapshot file of this format (the message names it).
        """
        path = where or (str(source) if not isinstance(source, bytes) else "snapshot file")
        try:
            entries = read_npz(source, max_bytes)
            meta = json.loads(array_text(entries.pop("meta")))
            if not isinstance(meta, dict):
                raise ValueError("its metadata is not a JSON object")
        except Exception as exc:
            raise SnapshotError(f"{path}: not a readable snapshot file ({type(exc).__name__}: {str(exc)[:300]})") from None
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise SnapshotError(f"{path}: format {str(meta.get('format'))[:80]!r} version {str(meta.get('version'))[:20]!r}; "
                                f"expected {FORMAT!r} version {VERSION}")
        try:
            tape = cls(meta=meta,
                       joint_positions=list(entries.pop("trunk/joint_positions")),
                       states=list(entries.pop("trunk/states")),
                       actions=list(entries.pop("trunk/actions")),
                       stage_steps=[int(s) for s in entries.pop("trunk/stage_steps")])
        except (KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{path}: not a snapshot file of this format ({type(exc).__name__}: "
                                f"{str(exc)[:200]})") from None
        for name, value in entries.items():
            head, _, rest = name.partition("/")
            if head == "model":
                tape.model[rest] = value
            elif head.startswith("c") and head[1:].isdigit() and rest in PARTS and f"{name}.index" in entries:
                tape.checkpoints.setdefault(int(head[1:]), {p: {} for p in PARTS})[rest] = \
                    unpack(entries[f"{name}.index"], value, f"{path}: {name}")
            elif not (name.endswith(".index") and name[:-len(".index")] in entries):
                raise SnapshotError(f"{path}: unexpected entry {name!r}")
        if tape.chunk_steps != meta.get("chunk_steps"):
            raise SnapshotError(f"{path}: checkpoints {tape.chunk_steps} differ from those listed {meta.get('chunk_steps')}")
        return tape


__all__ = ["SnapshotError", "TrunkTape", "array_text", "arrays_hash", "text_array"]
