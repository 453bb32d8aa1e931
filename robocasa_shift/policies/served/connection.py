"""What every served policy's connection shares: credentials and the identity of what a server sent.

- ``Secret``: a token or key that never shows in a repr, an error or an identity, and
  ``redact_uri`` (an endpoint fit for a record or a message).
- ``content_hash`` / ``canonical``: server replies and metadata as manifests record them.
- ``Connection``: a msgpack-over-websocket session (connect and exchange under deadlines, bounded decoding,
  reconnect after a failure, a ``Breaker`` for a server that went away, the session messages of this
  harness's servers): where the security limits of every websocket client live.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Dict, Mapping, Optional

import numpy as np

from robocasa_shift.config import SECRET_PLACEHOLDER, redact_url
from robocasa_shift.errors import PolicyServerError, PolicyServerTimeout
from robocasa_shift.policies.served.codec import ReplyFormatError


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
    """One msgpack-over-websocket session with a served policy: the transport every websocket protocol shares.

    On connect, :meth:`handshake` reads the server's first message (its metadata; a protocol whose client
    speaks first overrides it); then each request is answered by one reply. Every connect runs under
    ``connect_timeout_s`` in all and every reply under ``timeout_s``; every message from the server goes through
    :meth:`decode` (``codec.unpackb``: bounded values, depth and bytes; ``object_hook`` builds the protocol's
    arrays) and requests through :meth:`encode` (msgpack, ``encode`` its ``default`` hook). After any failure
    the connection is closed, since a late reply must not answer the next request, and refuses requests until
    :meth:`reconnect` (a policy's next reset), which must meet the same metadata; ``Breaker`` stops retrying a
    server that went away. The API key travels in an ``Authorization: <auth_scheme> <key>`` header; it and any
    password in ``uri`` stay in ``Secret`` objects, and messages name the endpoint redacted.

    Args:
        uri: ``ws://host:port`` (or ``wss://``); what: the server as messages name it ("the toy server");
        hint: what to check, appended to connection errors; slow_hint: appended to a timeout's message;
        ws_options: more options of ``websockets``' ``connect`` (``ping_interval=None``).
    """

    # how a reconnect that met other metadata is reported (a protocol names its first message its own way)
    greeting_changed = "now sends different metadata"

    def __init__(self, uri: str, what: str, hint: str = "check that the server runs there", api_key: Any = None,
                 auth_scheme: str = "Bearer", timeout_s: float = 30.0, connect_timeout_s: float = 10.0,
                 max_message_bytes: int = 16 * 2**20, encode: Any = None, object_hook: Any = None,
                 breaker: Optional[Breaker] = None, slow_hint: str = "", **ws_options: Any):
        self._uri, self.uri = Secret(uri), redact_uri(uri)  # the URI may hold a password
        self.what, self.hint, self.slow_hint = what, hint, slow_hint
        key = as_secret(api_key)
        self._authorization = Secret(f"{auth_scheme} {key.reveal()}") if key else None
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.max_message_bytes = int(max_message_bytes)
        self._encode, self._object_hook, self._ws_options = encode, object_hook, ws_options
        self.breaker = breaker or Breaker()
        self._ws = None
        self.metadata: Any = None

    @property
    def closed(self) -> bool:
        return self._ws is None

    # ------------------------------------------------------------------ what a protocol may override

    def encode(self, message: Any) -> bytes:
        """One request as it goes on the wire."""
        import msgpack

        return msgpack.packb(message, default=self._encode, use_bin_type=True)

    def decode(self, data: bytes) -> Any:
        """One message from the server, decoded within the bounds.

        Raises:
            ReplyFormatError: over a bound, not msgpack, or refused by ``object_hook``.
        """
        from robocasa_shift.policies.served import codec

        return codec.unpackb(data, self.max_message_bytes, object_hook=self._object_hook)

    def handshake(self) -> Any:
        """The server's metadata, read when the connection opens: here its first message, a dict.

        Raises:
            PolicyServerError: none in time (``PolicyServerTimeout``), refused by :meth:`decode`, not a dict.
        """
        try:
            data = self.frame("connect", self.connect_timeout_s)
        except PolicyServerTimeout:
            raise PolicyServerTimeout(f"{self.uri} accepted a websocket connection but sent no metadata within "
                                      f"{self.connect_timeout_s:g} s; {self.what} sends its metadata first: "
                                      f"{self.hint}", "connect") from None
        try:
            metadata = self.decode(data)
        except ReplyFormatError as exc:
            self.failed(ReplyFormatError(f"{self.uri} sent metadata this client refuses: {exc}", "connect"))
        if not isinstance(metadata, dict):
            self.failed(PolicyServerError(f"{self.uri} sent {type(metadata).__name__} instead of a metadata dict on "
                                          f"connect: {str(metadata)[:200]!r}", "connect"))
        return metadata

    # ------------------------------------------------------------------ the session

    def connect(self) -> None:
        """Open the websocket and run :meth:`handshake`; a reconnect must meet the same metadata."""
        from robocasa_shift.policies.served.transport import open_websocket

        self.breaker.check(f"{self.what} at {self.uri}")
        self.close()
        headers = {"Authorization": self._authorization.reveal()} if self._authorization else None
        try:
            self._ws = open_websocket(self._uri.reveal(), self.uri, self.what, self.hint, self.connect_timeout_s,
                                      self.max_message_bytes, headers, **self._ws_options)
        except PolicyServerError as exc:
            self.breaker.record(exc)
            raise
        try:
            metadata = self.handshake()
            if self.metadata is not None and content_hash(metadata) != content_hash(self.metadata):
                self.failed(PolicyServerError(f"{self.what} at {self.uri} {self.greeting_changed} than at the first "
                                              "connection (another model, checkpoint or configuration?); the run's "
                                              "manifest would be wrong", "connect"))
        except BaseException:
            self.close()
            raise
        self.metadata = metadata

    def reconnect(self) -> None:
        """A new connection after a failure (a policy's reset calls it when :attr:`closed`)."""
        self.connect()

    def send(self, message: Any, what: str) -> None:
        """Send one request without waiting for a reply.

        Raises:
            PolicyServerError: the connection was closed by an earlier failure, or the server closed it.
        """
        from websockets.exceptions import ConnectionClosed

        self._refuse_if_closed(what)
        try:
            self._ws.send(self.encode(message))
        except ConnectionClosed as exc:
            self.failed(PolicyServerError(f"{self.what} at {self.uri} closed the connection before {what} ({exc}); "
                                          f"{self.hint}", what))

    def frame(self, what: str, timeout_s: Optional[float] = None) -> Any:
        """The next frame from the server as it came (bytes, or text), within ``timeout_s`` (default: ``timeout_s``).

        Raises:
            PolicyServerTimeout: none in time. PolicyServerError: the server closed the connection (or the frame
                was over ``max_message_bytes``). Each closes the connection.
        """
        from websockets.exceptions import ConnectionClosed

        self._refuse_if_closed(what)
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        try:
            return self._ws.recv(timeout=timeout_s)
        except TimeoutError:
            self.failed(PolicyServerTimeout(f"{self.what} at {self.uri} did not answer {what} within {timeout_s:g} s"
                                            f"{self.slow_hint}; the connection was closed", what))
        except ConnectionClosed as exc:
            codes = {getattr(getattr(exc, side, None), "code", None) for side in ("rcvd", "sent")}
            hint = (f"its reply exceeded max_message_bytes={self.max_message_bytes:,}" if 1009 in codes
                    else self.hint)
            self.failed(PolicyServerError(f"{self.what} at {self.uri} closed the connection during {what} ({exc}); "
                                          f"{hint}", what))

    def receive(self, what: str, timeout_s: Optional[float] = None) -> Any:
        """The next message from the server, decoded (:meth:`frame`, then :meth:`decode`).

        Raises:
            PolicyServerError: as :meth:`frame`; text (the server's traceback, its message kept), or a message
                :meth:`decode` refuses (``ReplyFormatError``). Each closes the connection.
        """
        data = self.frame(what, timeout_s)
        if isinstance(data, str):  # a server's failure as text (openpi's traceback), before it closes
            self.failed(PolicyServerError(f"{self.what} at {self.uri} failed {what}:\n{data[:20000]}", what, data))
        try:
            reply = self.decode(data)
        except ReplyFormatError as exc:  # the stream can no longer be trusted to pair replies with requests
            self.failed(ReplyFormatError(f"{self.what} at {self.uri} sent a reply to {what} this client refuses: "
                                         f"{exc}", what))
        self.breaker.record(None)
        return reply

    def exchange(self, message: Any, what: str) -> Dict[str, Any]:
        """Send one request and return the server's reply, a dict.

        Raises:
            PolicyServerError: the breaker is open, the connection was closed by an earlier failure, or
                :meth:`send` or :meth:`receive` failed; a reply that is not a dict.
        """
        self.breaker.check(f"{self.what} at {self.uri}")
        self.send(message, what)
        reply = self.receive(what)
        if not isinstance(reply, dict):
            self.failed(PolicyServerError(f"{what}: expected a dict from {self.what} at {self.uri}, got "
                                          f"{type(reply).__name__}", what))
        return reply

    def failed(self, error: PolicyServerError) -> None:
        """Close the connection (a late reply must not answer the next request), count the failure, raise ``error``."""
        self.close()
        self.breaker.record(error)
        raise error from None

    def _refuse_if_closed(self, what: str) -> None:
        if self._ws is None:
            raise PolicyServerError(f"the connection to {self.what} at {self.uri} was closed after an earlier error "
                                    "or timeout; the next reset reconnects", what)

    # ------------------------------------------------------------------ this harness's session messages

    def capabilities(self) -> Dict[str, bool]:
        """What the metadata advertises beyond the protocol (``seeded_reset``, ``session_state``, ``sample``)."""
        from robocasa_shift.policies.served.state import SAMPLE, SEEDED_RESET, SESSION_STATE

        metadata = self.metadata if isinstance(self.metadata, dict) else {}
        return {k: metadata.get(k) is True for k in (SEEDED_RESET, SESSION_STATE, SAMPLE)}

    def reset_seed(self, seed: int, owner: Optional[str] = None) -> Dict[str, Any]:
        """Seed this connection's generator on a server that advertises ``seeded_reset``; its reply.

        ``owner``: the session's owner tag (``served.state.owner_tag``), which state blobs are bound to.

        Raises:
            PolicyServerError: the server does not advertise it, or the exchange failed.
        """
        from robocasa_shift.policies.served.state import SEEDED_RESET, SESSION_MESSAGES

        if not self.capabilities()[SEEDED_RESET]:
            raise PolicyServerError(f"{self.what} at {self.uri} does not advertise '{SEEDED_RESET}' in its metadata; "
                                    "a plain server cannot be seeded", "reset")
        data: Dict[str, Any] = {"seed": int(seed)}
        if owner is not None:
            data["owner"] = owner
        return self.exchange({SESSION_MESSAGES["reset"]: data}, "reset")

    def state_call(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        """A state or sample message (``get_state``, ``set_state``, ``sample``) of this harness's servers."""
        from robocasa_shift.policies.served.state import SESSION_MESSAGES

        if op not in ("get_state", "set_state", "sample"):
            raise ValueError(f"unknown state request {op!r}")
        return self.exchange({SESSION_MESSAGES[op]: data}, op)

    def close(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:  # a connection already gone: nothing to close
                pass
            self._ws = None
