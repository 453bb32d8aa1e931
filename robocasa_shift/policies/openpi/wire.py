"""openpi's wire format, read safely: shared by the ``openpi`` client and the serving shim (``openpi.server``).

Frames are msgpack with numpy arrays as openpi-client's ``msgpack_numpy`` encodes them,
``{b"__ndarray__": True, b"data": raw bytes, b"dtype": dtype.str, b"shape": shape}``. openpi-client's own
``unpackb`` builds an array straight from what it is sent: an object dtype turns 8 bytes into a raw
pointer (reading it crashes the process), a short buffer or a structured dtype fail in numpy. ``unpackb``
here decodes plain numeric and bool dtypes only, checks the byte count against the shape and copies the
array out of the message; anything else is refused. Nothing is ever unpickled.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from robocasa_shift.policies.served import codec
from robocasa_shift.policies.served.codec import ReplyFormatError, checked_array, checked_dtype
from robocasa_shift.policies.served.state import SEEDED_RESET, SESSION_MESSAGES

SEEDED_RESET_KEY = SEEDED_RESET  # in the server's metadata
RESET_MESSAGE_KEY = SESSION_MESSAGES["reset"]  # the client's reset message: {"__reset__": {"seed": int}}
# Bound on one message from the server: an action chunk is a few kB and metadata rarely more, so this
# only stops a server from making the client allocate without limit.
MAX_MESSAGE_BYTES = 16 * 2**20


def decode_array(obj: Dict[Any, Any]) -> Any:
    """openpi's msgpack-numpy hook, checked: numeric dtypes only, exact byte count, a copy.

    Raises:
        ReplyFormatError: another dtype, a malformed shape, or data whose length is not
            ``prod(shape) * itemsize``.
    """
    if b"__ndarray__" in obj:
        return checked_array(obj.get(b"dtype"), obj.get(b"shape"), obj.get(b"data"), "the reply")
    if b"__npgeneric__" in obj:
        dtype = checked_dtype(obj.get(b"dtype"))
        value = obj.get(b"data")
        if not isinstance(value, (bool, int, float)):
            raise ReplyFormatError(f"a numpy scalar's data must be a number, got {type(value).__name__}")
        return dtype.type(value)
    return obj


def unpackb(data: bytes, max_bytes: Optional[int] = MAX_MESSAGE_BYTES) -> Any:
    """Decode one msgpack-numpy message from a peer with ``decode_array``, after ``codec``'s bounds.

    Raises:
        ReplyFormatError: longer than ``max_bytes``, over the value or depth bounds, not msgpack, or an
            array ``decode_array`` refuses.
    """
    return codec.unpackb(data, max_bytes, object_hook=decode_array)
