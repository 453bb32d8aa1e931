"""Arrays on disk without pickle: deterministic ``.npz`` files and text carried as bytes.

Snapshots (``branching/snapshot.py``) and per-step logs (``engine/step_logger.py``)
are written with :func:`npz_bytes` and read with :func:`read_npz`: numpy's
``.npz`` layout (a zip of ``.npy`` arrays), deflated, with fixed timestamps so
the same arrays always give the same bytes and the same SHA-256, and read with
``allow_pickle=False`` so a file from a shared run directory cannot run code.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Dict, Mapping, Tuple, Union

import numpy as np

from robocasa_shift.errors import NpzLimitError


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


# Documented maximum of what one ``.npz`` file may declare (the arrays' bytes once read); callers that know
# the record pass a tighter cap derived from it (a step log: steps x dims).
MAX_NPZ_BYTES = 256 * 2**20
MAX_NPZ_ENTRIES = 100_000


# numpy's public readers of an .npy header (numpy 1 and 2 alike), by format version
_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


def _declared(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Tuple[Tuple[int, ...], np.dtype]:
    """An entry's shape and dtype, from its ``.npy`` header only (nothing else is decompressed)."""
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in _HEADER_READERS:  # 3.0 (UTF-8 field names) only holds structured dtypes, refused anyway
            raise NpzLimitError(f"{info.filename}: .npy format version {version[0]}.{version[1]} is not read here")
        shape, _, dtype = _HEADER_READERS[version](f)
    return shape, dtype


def read_npz(source: Union[Path, str, bytes], max_bytes: int = MAX_NPZ_BYTES) -> Dict[str, np.ndarray]:
    """Every array of an ``.npz`` file (a path or its bytes), never unpickling anything.

    Every entry's header is read first: an object or void dtype, a negative dimension, or arrays that
    declare more than ``max_bytes`` in all are refused before any array is decompressed, so a small
    forged file cannot make the reader allocate without limit.

    Raises:
        NpzLimitError: too many entries, a declared size over ``max_bytes``, an entry that is not a plain array.
        ValueError, zipfile.BadZipFile, OSError: not an ``.npz`` file.
    """
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    with zipfile.ZipFile(handle) as archive:
        infos = archive.infolist()
        if len(infos) > MAX_NPZ_ENTRIES:
            raise NpzLimitError(f"{len(infos)} entries, more than {MAX_NPZ_ENTRIES}")
        total, names = 0, []
        for info in infos:
            if not info.filename.endswith(".npy") or info.is_dir():
                raise NpzLimitError(f"entry {info.filename[:80]!r} is not an .npy array")
            shape, dtype = _declared(archive, info)
            if dtype.hasobject or dtype.kind == "V":
                raise NpzLimitError(f"entry {info.filename[:80]!r} has dtype {dtype.str}, not a plain array")
            if any(not isinstance(n, int) or n < 0 for n in shape):
                raise NpzLimitError(f"entry {info.filename[:80]!r} declares shape {shape}")
            size = dtype.itemsize
            for n in shape:
                size *= n
            total += size
            if total > max_bytes:
                raise NpzLimitError(f"the arrays declare more than {max_bytes} bytes (entry {info.filename[:80]!r} "
                                    f"alone: shape {shape}, dtype {dtype.str}); refused before reading")
            names.append(info)
        out = {}
        for info in names:
            with archive.open(info) as f:
                out[info.filename[: -len(".npy")]] = np.lib.format.read_array(f, allow_pickle=False)
        return out


__all__ = ["MAX_NPZ_BYTES", "NpzLimitError", "array_text", "npz_bytes", "read_npz", "text_array"]
