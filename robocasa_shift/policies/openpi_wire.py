"""openpi's wire format, read safely: shared by the ``openpi`` client and the serving shim (``openpi_server``).

Frames are msgpack with numpy arrays as openpi-client's ``msgpack_numpy`` encodes them,
``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": shape}``. openpi-client's own
``unpackb`` builds an array straight from what it is sent: an object dtype turns 8 bytes into a raw
pointer (reading it crashes the process), a short buffer or a structured dtype fail in numpy. ``unpackb``
here decodes plain numeric and bool dtypes only, checks the byte count against the shape and copies the
array out of the message; anything else is refused. Nothing is ever unpickled.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional

import numpy as np

from robocasa_shift.errors import PolicyServerError

SEEDED_RESET_KEY = "seeded_reset"  # in the server's metadata
RESET_MESSAGE_KEY = "__reset__"  # the client's reset message: {"__reset__": {"seed": int}}
# Bound on one message from the server: an action chunk is a few kB and metadata rarely more, so this
# only stops a server from making the client allocate without limit.
MAX_MESSAGE_BYTES = 16 * 2**20
# dtype kinds a reply's arrays may have: bool, signed and unsigned integers, floats. Object ("O"),
# void/structured ("V"), strings, dates and complex numbers are refused.
ARRAY_KINDS = frozenset("biuf")


class ReplyFormatError(PolicyServerError, ValueError):
    """A server's message that is not the msgpack-numpy its protocol speaks (openpi's, vla-eval's), or holds an
    array this client refuses."""


def _checked_dtype(value: Any) -> np.dtype:
    """The numpy dtype a dtype string names, if it is a plain bool, integer or float dtype; else ReplyFormatError."""
    if not isinstance(value, str):
        raise ReplyFormatError(f"an array's dtype must be a dtype string, got {type(value).__name__}")
    try:
        dtype = np.dtype(value)
    except TypeError as exc:
        raise ReplyFormatError(f"unknown dtype {value[:40]!r} ({exc})") from None
    if dtype.kind not in ARRAY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise ReplyFormatError(f"dtype {value[:40]!r} refused: only bool, integer and float arrays are accepted "
                               "(object and structured dtypes would read the server's bytes as pointers)")
    return dtype


def checked_array(dtype_name: Any, shape: Any, data: Any, holder: str) -> np.ndarray:
    """A copy of the array a msgpack-numpy message describes, after checking it: a numeric dtype, at most 32
    sizes >= 0, and exactly ``prod(shape) * itemsize`` bytes of data (``holder`` names the message in errors).

    Raises:
        ReplyFormatError: any of these does not hold.
    """
    dtype = _checked_dtype(dtype_name)
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


def decode_array(obj: Dict[Any, Any]) -> Any:
    """openpi's msgpack-numpy hook, checked: numeric dtypes only, exact byte count, a copy.

    Raises:
        ReplyFormatError: another dtype, a malformed shape, or data whose length is not
            ``prod(shape) * itemsize``.
    """
    if b"__ndarray__" in obj:
        return checked_array(obj.get(b"dtype"), obj.get(b"shape"), obj.get(b"data"), "the reply")
    if b"__npgeneric__" in obj:
        dtype = _checked_dtype(obj.get(b"dtype"))
        value = obj.get(b"data")
        if not isinstance(value, (bool, int, float)):
            raise ReplyFormatError(f"a numpy scalar's data must be a number, got {type(value).__name__}")
        return dtype.type(value)
    return obj


def unpackb(data: bytes, max_bytes: Optional[int] = MAX_MESSAGE_BYTES) -> Any:
    """Decode one msgpack-numpy message from a server with ``decode_array``; nothing in it runs or is trusted.

    Raises:
        ReplyFormatError: longer than ``max_bytes``, not msgpack, or an array ``decode_array`` refuses.
    """
    import msgpack

    if max_bytes is not None and len(data) > max_bytes:
        raise ReplyFormatError(f"a message of {len(data):,} bytes exceeds the limit of {max_bytes:,}")
    try:
        return msgpack.unpackb(data, object_hook=decode_array)
    except ReplyFormatError:
        raise
    except Exception as exc:  # msgpack's own errors: truncated, extra data, bad types, too deep
        raise ReplyFormatError(f"not a msgpack message ({type(exc).__name__}: {exc})") from None
