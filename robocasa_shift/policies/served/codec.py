"""Decoding msgpack from a peer, bounded before anything is built: every client and server that reads msgpack.

msgpack builds a Python object per value, and a value can cost one byte on the wire: a 64 MiB message of
empty lists became 4.9 GB of lists. ``prescan`` walks the bytes first without building anything and
refuses a message with more than ``max_values`` values, deeper than ``max_depth``, with a string or bin
longer than the message allows, truncated or followed by extra bytes; only then does ``unpackb`` decode
it. After the scan a message costs at most a few hundred bytes per value.

Arrays travel as msgpack-numpy maps (openpi's and vla-eval's ``{"__ndarray__", "data", "dtype",
"shape"}``): ``checked_array`` builds them from plain numeric dtypes only, with the byte count checked
against the shape, copied out of the message. Nothing is ever unpickled.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Callable, Optional

import numpy as np

from robocasa_shift.errors import PolicyServerError

# Defaults of every decode: a served message holds tens of keys and a few arrays, so these only stop a
# peer from making the reader allocate without limit (100k values cost at most some tens of MB).
MAX_VALUES = 100_000
MAX_DEPTH = 32
# dtype kinds an array from a peer may have: bool, signed and unsigned integers, floats. Object ("O"),
# void/structured ("V"), strings, dates and complex numbers are refused.
ARRAY_KINDS = frozenset("biuf")


class ReplyFormatError(PolicyServerError, ValueError):
    """A peer's message that is not the msgpack its protocol speaks, is over a limit, or holds an array this
    side refuses."""


# Fixed-size msgpack types: first byte -> bytes that follow (nil, bool, numbers, fixext).
_FIXED = {0xC0: 0, 0xC2: 0, 0xC3: 0, 0xCA: 4, 0xCB: 8, 0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8, 0xD0: 1, 0xD1: 2,
          0xD2: 4, 0xD3: 8, 0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17}
# Sized types: first byte -> (bytes of the length, extra bytes before the data: an ext's type byte).
_SIZED = {0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0), 0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1),
          0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0)}
# Containers: first byte -> (bytes of the count, values per entry: 1 for an array, 2 for a map).
_CONTAINERS = {0xDC: (2, 1), 0xDD: (4, 1), 0xDE: (2, 2), 0xDF: (4, 2)}
_LENGTH = {1: struct.Struct(">B"), 2: struct.Struct(">H"), 4: struct.Struct(">I")}


def prescan(data: bytes, max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH) -> int:
    """The number of values in one msgpack object, counted without building any.

    Raises:
        ReplyFormatError: more than ``max_values`` values, nesting deeper than ``max_depth``, a length
            past the end (truncated), an unused type byte, or bytes after the object.
    """
    view = memoryview(data)
    end, pos, values = len(view), 0, 0
    pending = [1]  # values still to read at each open level; the outermost level holds one object
    while pending:
        if pending[-1] == 0:
            pending.pop()
            continue
        pending[-1] -= 1
        values += 1
        if values > max_values:
            raise ReplyFormatError(f"a message of more than {max_values:,} values refused (a decoding bomb?)")
        if pos >= end:
            raise ReplyFormatError("not a msgpack message (truncated)")
        first = view[pos]
        pos += 1
        count = 0
        if first <= 0x7F or first >= 0xE0:
            continue
        if first <= 0x8F:
            count = 2 * (first & 0x0F)
        elif first <= 0x9F:
            count = first & 0x0F
        elif first <= 0xBF:
            pos += first & 0x1F
        elif first in _FIXED:
            pos += _FIXED[first]
        elif first in _SIZED:
            width, extra = _SIZED[first]
            if pos + width > end:
                raise ReplyFormatError("not a msgpack message (truncated)")
            pos += width + extra + _LENGTH[width].unpack_from(view, pos)[0]
        elif first in _CONTAINERS:
            width, per_entry = _CONTAINERS[first]
            if pos + width > end:
                raise ReplyFormatError("not a msgpack message (truncated)")
            count = per_entry * _LENGTH[width].unpack_from(view, pos)[0]
            pos += width
        else:
            raise ReplyFormatError(f"not a msgpack message (byte 0x{first:02x} at offset {pos - 1})")
        if pos > end:
            raise ReplyFormatError("not a msgpack message (truncated)")
        if count:
            if count > max_values:
                raise ReplyFormatError(f"a container of {count:,} values refused (at most {max_values:,} values)")
            if len(pending) > max_depth:
                raise ReplyFormatError(f"a message nested deeper than {max_depth} levels refused")
            pending.append(count)
    if pos != end:
        raise ReplyFormatError(f"not a msgpack message ({end - pos:,} extra bytes after it)")
    return values


def unpackb(data: Any, max_bytes: Optional[int], object_hook: Optional[Callable[[dict], Any]] = None,
            max_values: int = MAX_VALUES, max_depth: int = MAX_DEPTH, **options: Any) -> Any:
    """One msgpack object from a peer: the size, then ``prescan``, then msgpack's decoder (``options`` go to
    ``msgpack.unpackb``; ``object_hook`` builds arrays and the like and may raise ``ReplyFormatError``).

    Raises:
        ReplyFormatError: not bytes, longer than ``max_bytes``, refused by ``prescan``, not msgpack, or
            refused by ``object_hook``.
    """
    import msgpack

    if not isinstance(data, (bytes, bytearray, memoryview)):  # a memoryview is read in place, never copied
        raise ReplyFormatError(f"a text frame ({str(data)[:200]!r}) where binary msgpack was expected")
    if max_bytes is not None and len(data) > max_bytes:
        raise ReplyFormatError(f"a message of {len(data):,} bytes exceeds the limit of {max_bytes:,}")
    prescan(data, max_values, max_depth)
    try:
        return msgpack.unpackb(data, object_hook=object_hook, **options)
    except ReplyFormatError:
        raise
    except Exception as exc:  # msgpack's own errors: bad UTF-8, unhashable keys, ...
        raise ReplyFormatError(f"not a msgpack message ({type(exc).__name__}: {exc})") from None


def check_depth(obj: Any, max_depth: int = MAX_DEPTH, what: str = "a message") -> Any:
    """``obj`` when its dicts and lists nest at most ``max_depth`` deep (walked without recursion): for values
    decoded by another parser (JSON inside a message) before anything recursive reads them.

    Raises:
        ReplyFormatError: nested deeper.
    """
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, (list, tuple)):
            children = list(value)
        else:
            continue
        if depth > max_depth:
            raise ReplyFormatError(f"{what} nested deeper than {max_depth} levels refused")
        stack.extend((child, depth + 1) for child in children)
    return obj


def checked_dtype(value: Any) -> np.dtype:
    """The numpy dtype a dtype string names, if it is a plain bool, integer or float dtype.

    Raises:
        ReplyFormatError: anything else.
    """
    if not isinstance(value, str):
        raise ReplyFormatError(f"an array's dtype must be a dtype string, got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise ReplyFormatError(f"unknown dtype {value[:40]!r} ({exc})") from None
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ReplyFormatError(f"dtype {value[:40]!r} refused: only bool, integer and float arrays are accepted "
                               "(object and structured dtypes would read the peer's bytes as pointers)")
    return dtype


def checked_array(dtype_name: Any, shape: Any, data: Any, holder: str) -> np.ndarray:
    """A copy of the array a msgpack-numpy map describes, after checking it: a numeric dtype, at most 32
    sizes >= 0, and exactly ``prod(shape) * itemsize`` bytes of data (``holder`` names the message in errors).

    Raises:
        ReplyFormatError: any of these does not hold.
    """
    dtype = checked_dtype(dtype_name)
    if not isinstance(shape, (list, tuple)) or len(shape) > 32 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ReplyFormatError(f"an array's shape must be a list of at most 32 sizes >= 0, got {shape!r:.80}")
    if not isinstance(data, bytes):
        raise ReplyFormatError(f"an array's data must be bytes, got {type(data).__name__}")
    expected = math.prod(shape) * dtype.itemsize  # Python ints: no overflow on a hostile shape
    if len(data) != expected:
        raise ReplyFormatError(f"an array of shape {tuple(shape)} and dtype {dtype.str} needs {expected:,} bytes, "
                               f"{holder} has {len(data):,}")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


__all__ = ["ARRAY_KINDS", "MAX_DEPTH", "MAX_VALUES", "ReplyFormatError", "check_depth", "checked_array", "checked_dtype",
           "prescan", "unpackb"]
