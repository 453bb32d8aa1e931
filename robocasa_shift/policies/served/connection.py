"""What every served policy's connection shares: credentials and the identity of what a server sent.

- ``Secret``: a token or key that never shows in a repr, an error or an identity, and
  ``redact_uri`` (an endpoint fit for a record or a message).
- ``content_hash`` / ``canonical``: server replies and metadata as manifests record them.
- ``Connection``: a msgpack-over-websocket session (connect and exchange under deadlines, bounded decoding,
  reconnect after a failure, a ``Breaker`` for a server that went away).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Optional

import numpy as np

from robocasa_shift.config import SECRET_PLACEHOLDER, redact_url
from robocasa_shift.errors import PolicyServerError, PolicyServerTimeout


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


# =========================================================================== a msgpack session over a websocket


class Breaker:
    """A circuit breaker: after ``failures`` failed calls in a row, calls are refused at once for ``open_s``
    seconds (a server that went away costs one timeout, not one per rollout), then one try is let through."""

    def __init__(self, failures: int = 3, open_s: float = 30.0):
        self.failures, self.open_s = int(failures), float(open_s)
        self._count, self._opened_at, self._last = 0, None, ""

    def check(self, what: str) -> None:
        """Raise when open.

        Raises:
            PolicyServerError: naming the last failure and when the next try goes through.
        """
        import time

        if self._opened_at is None:
            return
        left = self._opened_at + self.open_s - time.monotonic()
        if left > 0:
            raise PolicyServerError(f"{what} failed {self._count} times in a row (last: {self._last}); not trying "
                                    f"again for {left:.0f} s", "circuit")
        self._opened_at = None  # half open: the next call decides

    def record(self, error: Optional[BaseException]) -> None:
        """Count a call's outcome (None: it succeeded)."""
        import time

        if error is None:
            self._count, self._opened_at = 0, None
            return
        self._count, self._last = self._count + 1, str(error)[:300]
        if self._count >= self.failures:
            self._opened_at = time.monotonic()


class Connection:
    """One msgpack-over-websocket session with a served policy: the shape every websocket protocol shares.

    On connect the server may send a first message (its metadata, ``greeting=True``); then each request is
    answered by one reply. Every connect runs under ``connect_timeout_s`` in all and every exchange under
    ``timeout_s``; every message from the server goes through ``codec.unpackb`` (bounded values, depth and
    bytes; ``object_hook`` builds the protocol's arrays); after any failure the connection is dropped (a late
    reply must not answer the next request) and the next call reconnects; ``Breaker`` stops retrying a dead
    server. Messages name the endpoint with its credentials redacted.

    Args:
        uri: ``ws://host:port`` (or ``wss://``); what: the server as messages name it ("the toy server");
        hint: what to check, appended to connection errors; headers: sent with the handshake (credentials);
        encode: msgpack ``default`` hook for the requests (numpy arrays and the like).
    """

    def __init__(self, uri: str, what: str, hint: str = "check that the server runs there", headers: Any = None,
                 timeout_s: float = 30.0, connect_timeout_s: float = 10.0, max_message_bytes: int = 16 * 2**20,
                 greeting: bool = True, encode: Any = None, object_hook: Any = None, breaker: Optional[Breaker] = None):
        self._uri, self.uri, self.what, self.hint = uri, redact_uri(uri), what, hint
        self._headers = headers
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.max_message_bytes, self.greeting = int(max_message_bytes), bool(greeting)
        self._encode, self._object_hook = encode, object_hook
        self.breaker = breaker or Breaker()
        self._ws = None
        self.metadata: Any = None

    def _decode(self, data: Any) -> Any:
        from robocasa_shift.policies.served import codec

        if isinstance(data, str):
            raise PolicyServerError(f"{self.what} at {self.uri} sent text: {data[:500]}", "reply", data)
        return codec.unpackb(data, self.max_message_bytes, object_hook=self._object_hook)

    def connect(self) -> None:
        """Open the websocket (and read the greeting); a reconnect must meet the same metadata."""
        from robocasa_shift.policies.served.transport import open_websocket

        ws = open_websocket(self._uri, self.uri, self.what, self.hint, self.connect_timeout_s, self.max_message_bytes,
                            self._headers)
        try:
            metadata = self._decode(ws.recv(timeout=self.connect_timeout_s)) if self.greeting else {}
        except Exception as exc:
            ws.close()
            raise PolicyServerError(f"{self.what} at {self.uri} sent no valid first message within "
                                    f"{self.connect_timeout_s:g} s ({type(exc).__name__}: {exc}); {self.hint}",
                                    "connect") from None
        if self.metadata is not None and content_hash(metadata) != content_hash(self.metadata):
            ws.close()
            raise PolicyServerError(f"{self.what} at {self.uri} now sends other metadata than at the first "
                                    "connection (another model?); the run's manifest would be wrong", "connect")
        self._ws, self.metadata = ws, metadata

    def exchange(self, message: Any, what: str) -> Any:
        """Send one request, return the decoded reply (reconnecting first when the last call failed).

        Raises:
            PolicyServerError: refused, timed out (``PolicyServerTimeout``), closed, or an undecodable reply.
        """
        import msgpack

        self.breaker.check(f"{self.what} at {self.uri}")
        try:
            if self._ws is None:
                self.connect()
            self._ws.send(msgpack.packb(message, default=self._encode, use_bin_type=True))
            try:
                data = self._ws.recv(timeout=self.timeout_s)
            except TimeoutError:
                raise PolicyServerTimeout(f"{self.what} at {self.uri} did not answer {what} within "
                                          f"{self.timeout_s:g} s", what) from None
            reply = self._decode(data)
        except Exception as exc:
            self.close()
            if not isinstance(exc, PolicyServerError):
                exc = PolicyServerError(f"{self.what} at {self.uri} failed {what} ({type(exc).__name__}: "
                                        f"{str(exc).replace(self._uri, self.uri)}); {self.hint}", what)
            self.breaker.record(exc)
            raise exc from None
        self.breaker.record(None)
        return reply

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
            self._ws = None
