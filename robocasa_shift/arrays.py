"""Arrays on disk without pickle: deterministic ``.npz`` files and text carried as bytes.

Snapshots (``branching/snapshot.py``) and per-step logs (``engine/steplog.py``)
are written with :func:`npz_bytes` and read with :func:`read_npz`: numpy's
``.npz`` layout (a zip of ``.npy`` arrays), deflated, with fixed timestamps so
the same arrays always give the same bytes and the same SHA-256, and read with
``allow_pickle=False`` so a file from a shared run directory cannot run code.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Dict, Mapping, Union

import numpy as np


def text_array(text: str) -> np.ndarray:
    """``text`` as a uint8 array of its UTF-8 bytes (how strings travel in these files)."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).copy()


def array_text(array: np.ndarray) -> str:
    """The inverse of :func:`text_array`."""
    return np.asarray(array, dtype=np.uint8).tobytes().decode("utf-8")


def npz_bytes(entries: Mapping[str, np.ndarray]) -> bytes:
    """``np.savez_compressed``'s layout with a fixed timestamp: the same entries give the same bytes.

    Raises:
        ValueError: an entry of dtype object (it would need pickle).
    """
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(entries):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(entries[name]), allow_pickle=False)
    return buffer.getvalue()


def read_npz(source: Union[Path, str, bytes]) -> Dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (a path or its bytes), never unpickling anything."""
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    with np.load(handle, allow_pickle=False) as npz:
        return {name: npz[name] for name in npz.files}


__all__ = ["array_text", "npz_bytes", "read_npz", "text_array"]
