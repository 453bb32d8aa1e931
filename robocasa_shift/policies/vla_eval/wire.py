"""vla-eval's wire format (``PROTOCOL_VERSION`` 1, vla-eval 0.8.0): what the ``vla-eval`` client sends and reads.

Every frame is one binary msgpack message ``{"type", "payload", "seq", "timestamp"}``; numpy arrays travel
as ``{"__ndarray__": True, "data", "dtype", "shape"}`` and HWC uint8 images as ``{"__image__": True,
"format": "png"|"jpeg", "data", "shape"}``. A server's message is decoded after ``codec``'s bounds, its
arrays plain numeric only (checked and copied), and an image in it refused: nothing in it runs.
"""

from __future__ import annotations

import io
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from robocasa_shift.policies.served import codec
from robocasa_shift.policies.served.codec import ReplyFormatError, checked_array

PROTOCOL_VERSION = 1
MESSAGE_TYPES = ("hello", "observation", "action", "episode_start", "episode_end", "error")
# One server message: an action is a few hundred bytes, a hello a few kB; this only stops a server from making
# the client allocate without limit.
MAX_MESSAGE_BYTES = 16 * 2**20
IMAGE_FORMATS = ("png", "jpeg", "raw")


def _encode(obj: Any, image_format: str) -> Any:
    """vla-eval's msgpack ``default`` hook (``numpy_codec.encode_ndarray``), for ``image_format``."""
    if isinstance(obj, np.ndarray):
        if image_format != "raw" and obj.ndim == 3 and obj.dtype == np.uint8 and obj.shape[2] in (1, 3, 4):
            return encode_image(obj, image_format)
        return {"__ndarray__": True, "data": obj.tobytes(), "dtype": obj.dtype.str, "shape": list(obj.shape)}
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def encode_image(image: np.ndarray, image_format: str) -> Dict[str, Any]:
    """An HWC uint8 image as vla-eval's ``image_codec.encode_image`` writes it (PNG, or JPEG at quality 95)."""
    from PIL import Image

    buf = io.BytesIO()
    picture = Image.fromarray(np.ascontiguousarray(image))
    if image_format == "jpeg":
        if picture.mode != "RGB":
            raise ValueError(f"JPEG needs RGB images, got mode {picture.mode!r}: use image_format=png or raw")
        picture.save(buf, format="JPEG", quality=95)
    elif image_format == "png":
        picture.save(buf, format="PNG")
    else:
        raise ValueError(f"unknown image format {image_format!r}; known: {', '.join(IMAGE_FORMATS)}")
    return {"__image__": True, "format": image_format, "data": buf.getvalue(), "shape": list(image.shape)}


def pack_message(msg_type: str, payload: Dict[str, Any], seq: int, timestamp: Optional[float] = None,
                 image_format: str = "png") -> bytes:
    """One message as vla-eval's ``pack_message`` writes it (byte for byte, for the same timestamp)."""
    import msgpack

    if msg_type not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {msg_type!r}")
    raw = {"type": msg_type, "payload": payload, "seq": int(seq),
           "timestamp": time.time() if timestamp is None else float(timestamp)}
    return msgpack.packb(raw, default=lambda o: _encode(o, image_format), use_bin_type=True)


def _decode(obj: Dict[str, Any]) -> Any:
    """msgpack ``object_hook``: vla-eval's arrays, checked and copied; an image in a server message is refused."""
    if "__image__" in obj:
        raise ReplyFormatError("a server message holds an encoded image; vla-eval servers send none, and this "
                               "client decodes no compressed data from a server")
    if "__ndarray__" not in obj:
        return obj
    return checked_array(obj.get("dtype"), obj.get("shape"), obj.get("data"), "the message")


def unpack_message(data: Any, max_bytes: Optional[int] = MAX_MESSAGE_BYTES) -> Tuple[str, Dict[str, Any], int, float]:
    """``(type, payload, seq, timestamp)`` of one server message, decoded strictly (nothing in it runs).

    Raises:
        ReplyFormatError: not bytes, longer than ``max_bytes``, not msgpack, not a message of the
            protocol (fields, types), or an array or image :func:`_decode` refuses.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise ReplyFormatError(f"a text frame ({str(data)[:200]!r}); vla-eval messages are binary msgpack")
    raw = codec.unpackb(data, max_bytes, object_hook=_decode, raw=False, strict_map_key=True)
    if not isinstance(raw, dict):
        raise ReplyFormatError(f"expected a message (a map), got {type(raw).__name__}")
    missing = [k for k in ("type", "payload", "seq", "timestamp") if k not in raw]
    if missing:
        raise ReplyFormatError(f"a message without {', '.join(missing)} (it has: {', '.join(map(str, raw))})")
    kind, payload, seq, stamp = raw["type"], raw["payload"], raw["seq"], raw["timestamp"]
    if kind not in MESSAGE_TYPES:
        raise ReplyFormatError(f"unknown message type {str(kind)[:40]!r}; the protocol's: {', '.join(MESSAGE_TYPES)}")
    if not isinstance(payload, dict):
        raise ReplyFormatError(f"a {kind} message's payload must be a map, got {type(payload).__name__}")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise ReplyFormatError(f"a message's seq must be an integer, got {type(seq).__name__}")
    if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
        raise ReplyFormatError(f"a message's timestamp must be a number, got {type(stamp).__name__}")
    return kind, payload, seq, float(stamp)
