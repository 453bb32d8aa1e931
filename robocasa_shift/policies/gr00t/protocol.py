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
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Callable, Dict, Union

import numpy as np

from robocasa_shift.errors import UnknownNameError

DEFAULT_PORT = 5555
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
        return np.load(io.BytesIO(obj["as_npy"]), allow_pickle=False)
    if MODALITY_CONFIG_TAG in obj:
        # a plain dict: the client need not import gr00t to read a modality config
        return json.loads(obj["as_json"]) if "as_json" in obj else dict(obj["as_dict"])
    return obj


def packb(obj: Any) -> bytes:
    """GR00T's msgpack encoding: numpy arrays as ``np.save`` bytes, ModalityConfig as JSON."""
    import msgpack

    return msgpack.packb(obj, default=_encode)


def unpackb(data: bytes) -> Any:
    """Inverse of ``packb``; ModalityConfig objects come back as plain dicts."""
    import msgpack

    return msgpack.unpackb(data, object_hook=_decode)


def torch_packb(obj: Any) -> bytes:
    """The pre-August-2025 GR00T encoding: ``torch.save`` of the whole object."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def torch_unpackb(data: bytes) -> Any:
    """Inverse of ``torch_packb``. It unpickles: use it only with a server you trust."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")


@dataclass(frozen=True)
class Serializer:
    """One wire format: ``dumps`` and ``loads`` of a request or reply."""

    name: str
    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]

    @staticmethod
    def named(name: Union[str, "Serializer"]) -> "Serializer":
        """The serializer called ``name`` ("msgpack" or "torch"); a ``Serializer`` passes through.

        Raises:
            UnknownNameError: another name.
        """
        if isinstance(name, Serializer):
            return name
        if name not in SERIALIZERS:
            raise UnknownNameError("GR00T serializer", name, sorted(SERIALIZERS))
        return SERIALIZERS[name]


SERIALIZERS: Dict[str, Serializer] = {
    "msgpack": Serializer("msgpack", packb, unpackb),
    "torch": Serializer("torch", torch_packb, torch_unpackb),
}
