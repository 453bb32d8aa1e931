"""What every served policy's connection shares: credentials and the identity of what a server sent.

- ``Secret``: a token or key that never shows in a repr, an error or an identity, and
  ``redact_uri`` (an endpoint fit for a record or a message).
- ``content_hash`` / ``canonical``: server replies and metadata as manifests record them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

import numpy as np

from robocasa_shift.config import SECRET_PLACEHOLDER, redact_url


class Secret:
    """A credential (API token or key) held in memory only.

    Its ``repr`` and ``str`` are a placeholder, so a client that logs itself,
    a traceback that shows locals or an f-string in an error message cannot
    leak it; :meth:`reveal` is called only where the value goes on the wire.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = str(value)

    def reveal(self) -> str:
        """The credential itself, for the one place that sends it."""
        return self._value

    def __repr__(self) -> str:
        return f"Secret({SECRET_PLACEHOLDER!r})"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def as_secret(value: Any) -> Optional[Secret]:
    """``value`` as a ``Secret``; None or an empty string means no credential.

    A number is taken as its text: ``--policy-option api_token=12345`` arrives
    as an int after the option's YAML parsing.
    """
    if value is None or isinstance(value, Secret):
        return value or None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"a credential must be a string, got {type(value).__name__}")
    return Secret(str(value)) if str(value) else None


def redact_uri(uri: str) -> str:
    """``uri`` with any password in its user part and the values of secret-named query parameters replaced.

    ``ws://user:pass@host:8000/?token=t`` becomes
    ``ws://user:<redacted>@host:8000/?token=<redacted>``: what error messages
    and a run's identity may show of an endpoint. The same rule as every URL-valued option
    written into a run directory (:func:`robocasa_shift.config.redact_url`).
    """
    return redact_url(uri)


def canonical(obj: Any) -> Any:
    """A JSON-ready form of ``obj``: arrays with dtype and shape, bytes as their sha256."""
    if isinstance(obj, np.ndarray):
        return {"dtype": str(obj.dtype), "shape": list(obj.shape), "data": obj.tolist()}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, bytes):
        return hashlib.sha256(obj).hexdigest()
    return obj


def content_hash(obj: Any) -> str:
    """sha256 of a canonical JSON form (sorted keys; arrays with dtype and shape)."""
    return hashlib.sha256(json.dumps(canonical(obj), sort_keys=True).encode()).hexdigest()
