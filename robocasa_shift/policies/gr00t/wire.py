"""GR00T N1.5's wire format: ZeroMQ REQ/REP messages, msgpack (or, before August 2025, torch) encoded.

A request is ``{"endpoint": name, "data": payload}`` (plus ``"api_token"``
when the server wants one); the endpoints are ``ping``, ``kill``,
``get_action`` and ``get_modality_config``; a failed request comes back as
``{"error": str}``. This harness's launcher adds ``reset`` and reads a
``session`` id and a ``seq`` number from every request (plain servers ignore
both). Payloads are msgpack with numpy arrays as ``{"__ndarray_class__": True,
"as_npy": <np.save bytes>}`` and ModalityConfig objects as
``{"__ModalityConfig_class__": True, "as_json": ...}``; servers before August
2025 send ``torch.save`` of the whole dict (``serializer="torch"``).

Safety. Decoding msgpack runs no code: arrays are read with
``np.load(allow_pickle=False)`` (an object array is refused) and every
message is bounded by ``MAX_MESSAGE_BYTES``. The torch format is pickle:
decoding it runs whatever the sender put in it, so ``Serializer.named``
gives it out only with ``allow_pickle=True``, it warns each time it is
chosen, and this harness's launcher never decodes it at all.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Union

import numpy as np

from robocasa_shift.errors import PolicyOptionError, UnknownNameError
from robocasa_shift.policies.served import codec
from robocasa_shift.policies.served.codec import ReplyFormatError, check_depth

DEFAULT_PORT = 5555
# Bound on one request or reply, on the socket (ZMQ_MAXMSGSIZE) and before decoding: a GR00T
# request with three 256 x 256 images is about 0.6 MB, so this leaves room for large models'
# inputs while a peer cannot make the other side allocate without limit.
MAX_MESSAGE_BYTES = 64 * 2**20
NDARRAY_TAG = "__ndarray_class__"
MODALITY_CONFIG_TAG = "__ModalityConfig_class__"


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        buf = io.BytesIO()
        np.save(buf, obj, allow_pickle=False)
        return {NDARRAY_TAG: True, "as_npy": buf.getvalue()}
    if isinstance(obj, np.generic):
        return obj.item()
    if type(obj).__name__ == "ModalityConfig" and hasattr(obj, "model_dump_json"):
        return {MODALITY_CONFIG_TAG: True, "as_json": obj.model_dump_json()}
    if hasattr(obj, "detach") and hasattr(obj, "numpy"):  # a torch tensor
        return _encode(obj.detach().cpu().numpy())
    raise TypeError(f"cannot serialize {type(obj).__name__} for a GR00T server")


def _decode(obj: Dict[Any, Any]) -> Any:
    if NDARRAY_TAG in obj:
        return _load_npy(obj.get("as_npy"))
    if MODALITY_CONFIG_TAG in obj:
        # a plain dict: the client need not import gr00t to read a modality config
        if "as_json" not in obj:
            return dict(obj["as_dict"])
        if not isinstance(obj["as_json"], (str, bytes)):
            raise ReplyFormatError("a modality config's 'as_json' must be text")
        try:
            config = json.loads(obj["as_json"])
        except (ValueError, RecursionError) as exc:
            raise ReplyFormatError(f"a modality config that is not JSON ({type(exc).__name__})") from None
        return check_depth(config, what="a modality config")
    return obj


def _load_npy(data: Any) -> np.ndarray:
    """An ``np.save`` array from a peer: its header read first, the data's length checked against the shape it
    declares (numpy would allocate the declared size before reading), never unpickled (an object array raises)."""
    if not isinstance(data, bytes):
        raise ReplyFormatError("an encoded array needs its np.save bytes in 'as_npy'")
    buf = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(buf)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
            raise ValueError(f".npy format version {version}")
        shape, _, dtype = read_header(buf)
    except (ValueError, SyntaxError, TypeError) as exc:
        raise ReplyFormatError(f"an encoded array without a valid .npy header ({exc})") from None
    if dtype.hasobject:
        raise ReplyFormatError("an object array refused: its .npy payload is a pickle")
    if math.prod(shape) * dtype.itemsize != len(data) - buf.tell():
        raise ReplyFormatError(f"an encoded array of shape {shape} and dtype {dtype.str} whose data has "
                               f"{len(data) - buf.tell():,} bytes")
    buf.seek(0)
    return np.load(buf, allow_pickle=False)


def packb(obj: Any) -> bytes:
    """GR00T's msgpack encoding: numpy arrays as ``np.save`` bytes, ModalityConfig as JSON."""
    import msgpack

    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes, max_bytes: Optional[int] = MAX_MESSAGE_BYTES, arrays: bool = True) -> Any:
    """Inverse of ``packb``; ModalityConfig objects come back as plain dicts. Runs no code from ``data``.

    Args:
        max_bytes: longer messages are refused before decoding (None: no bound).
        arrays: False leaves encoded arrays and modality configs as their tagged dicts (msgpack only;
            ``decode_arrays`` finishes the job): a server reads the API token before it decodes any array.

    Raises:
        ReplyFormatError: ``data`` is longer than ``max_bytes``, over ``codec``'s value or depth bounds, not
            msgpack, or holds an array that is not a plain numeric ``.npy`` of the size its header declares.
    """
    return codec.unpackb(data, max_bytes, object_hook=_decode if arrays else None)


def decode_arrays(obj: Any) -> Any:
    """What ``unpackb(..., arrays=False)`` left, with its arrays and modality configs decoded (bottom-up, as
    msgpack's object hook would have done them)."""
    if isinstance(obj, dict):
        return _decode({k: decode_arrays(v) for k, v in obj.items()})
    if isinstance(obj, list):
        return [decode_arrays(v) for v in obj]
    return obj


def torch_packb(obj: Any) -> bytes:
    """The pre-August-2025 GR00T encoding: ``torch.save`` of the whole object."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def torch_unpackb(data: bytes) -> Any:
    """Inverse of ``torch_packb``. It UNPICKLES: whoever wrote ``data`` runs code here. Trusted servers only."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


class PickleSerializerWarning(RuntimeWarning):
    """The torch serializer was chosen: replies are unpickled, so the server can run code in this process."""


@dataclass(frozen=True)
class Serializer:
    """One wire format: ``dumps`` and ``loads`` of a request or reply; ``unpickles`` when ``loads`` runs pickle."""

    name: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]
    unpickles: bool = False

    @staticmethod
    def named(name: Union[str, "Serializer"], allow_pickle: bool = False) -> "Serializer":
        """The serializer called ``name`` ("msgpack" or "torch"); a ``Serializer`` passes through.

        Args:
            allow_pickle: must be True for "torch", whose replies are unpickled; choosing it warns
                (``PickleSerializerWarning``) every time.

        Raises:
            UnknownNameError: another name.
            PolicyOptionError: "torch" without ``allow_pickle=True``.
        """
        serializer = name if isinstance(name, Serializer) else SERIALIZERS.get(name)
        if serializer is None:
            raise UnknownNameError("GR00T serializer", name, sorted(SERIALIZERS))
        if serializer.unpickles:
            if allow_pickle is not True:
                raise PolicyOptionError(
                    f"the '{serializer.name}' serializer unpickles every reply, so the server (or anyone who can "
                    "answer in its place) can run code in this process. Use 'msgpack' (GR00T's format since "
                    "August 2025); for an older server you trust, also pass allow_pickle=true "
                    "(--policy-option allow_pickle=true)")
            warnings.warn(f"GR00T serializer '{serializer.name}': replies are unpickled; only use it with a server "
                          "you trust, over a network you trust", PickleSerializerWarning, stacklevel=3)
        return serializer


SERIALIZERS: Dict[str, Serializer] = {
    "msgpack": Serializer("msgpack", packb, unpackb),
    "torch": Serializer("torch", torch_packb, torch_unpackb, unpickles=True),
}
