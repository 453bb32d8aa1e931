"""``Gr00tClient``: a REQ client of a GR00T N1.5 server (or of this harness's ``Gr00tLauncher``).

Every request carries the client's session id and every ``get_action`` a
sequence number, so a launcher can keep one generator per session and answer
a retried request from its cache; plain servers ignore both. The session id
is random per client (a user-given ``session`` is only its prefix): two
clients sharing one id would re-seed and answer each other.

The API token is held as a ``served.connection.Secret`` and sent inside the request, as
GR00T's wire format wants it; it never appears in an error, a log line or
the policy's identity.

ZeroMQ, not a websocket: this client shares the served base's limits where they apply and keeps its own
where the transport differs. Shared: ``served.connection.Breaker`` (a server that went away costs one
timeout, not one per rollout), ``Secret``, and ``served.codec``'s bounded decoding (``gr00t.wire``). Its own:
ZeroMQ delivers a message whole or not at all, so each try's ``RCVTIMEO`` is already a total deadline that a
dripping server cannot stretch, with ``MAXMSGSIZE`` bounding the reply before it is read; and a REQ socket that
missed a reply is replaced and the request retried with the same sequence number (the launcher answers a
retry from its cache), where a websocket ``Connection`` refuses requests until the next reset.
"""

from __future__ import annotations

import logging
import re
import socket
import uuid
from typing import Any, Dict, Mapping, Optional, Union

from robocasa_shift.errors import (
    PolicyOptionError,
    PolicyServerError,
    PolicyServerTimeout,
)
from robocasa_shift.extras import require
from robocasa_shift.policies.gr00t.wire import (
    DEFAULT_PORT,
    MAX_MESSAGE_BYTES,
    Serializer,
)
from robocasa_shift.policies.served.connection import Breaker, as_secret

log = logging.getLogger(__name__)
_SESSION_PREFIX = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def new_session_id(prefix: Optional[str] = None) -> str:
    """A fresh random session id, ``<prefix>-<32 hex digits>`` when a prefix is given.

    Raises:
        PolicyOptionError: a prefix that is not 1-64 letters, digits, ``_``, ``.`` or ``-``.
    """
    # an identifier, not a source of randomness: it never reaches the model
    suffix = uuid.uuid4().hex
    if prefix is None or prefix == "":
        return suffix
    if not isinstance(prefix, str) or not _SESSION_PREFIX.fullmatch(prefix):
        raise PolicyOptionError(f"session prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'")
    return f"{prefix}-{suffix}"


class Gr00tClient:
    """A REQ client of a GR00T server with timeouts, socket recovery and bounded retries.

    A REQ socket that missed a reply can neither send nor receive again, so
    after a timeout the socket is closed (LINGER 0) and a new one connected
    before the next try. A retried ``get_action`` carries the same sequence
    number, which ``Gr00tLauncher`` answers from its cache.

    Args:
        host, port: where the server listens.
        timeout_s: per try, for sending and for the reply.
        retries: extra tries after a timeout (0: one try only).
        serializer: "msgpack" (current GR00T) or "torch" (before August 2025; it unpickles
            replies, so it needs ``allow_pickle=True`` and warns every time).
        api_token: sent with every request when the server requires one (kept as a ``Secret``).
        session: a prefix for this client's session id; the id itself is always unique to this client.
        allow_pickle: the explicit opt-in the torch serializer needs.
        max_message_bytes: replies longer than this are dropped by the socket (ZMQ_MAXMSGSIZE).
        curve_server_key: the launcher's CURVE public key (Z85, 40 characters); encrypts the
            connection with a fresh client key pair (the launcher must serve CURVE).
        auth_frame: send the token in a frame of its own before the message, which this harness's launcher
            checks before it reads the message (GR00T's own servers read one frame: keep False for them).
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = DEFAULT_PORT,
        timeout_s: float = 15.0,
        retries: int = 2,
        serializer: Union[str, Serializer] = "msgpack",
        api_token: Optional[str] = None,
        session: Optional[str] = None,
        allow_pickle: bool = False,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        curve_server_key: Optional[str] = None,
        auth_frame: bool = False,
    ):
        require("msgpack", "gr00t", "the GR00T client")
        zmq = self._zmq = require("zmq", "gr00t", "the GR00T client")
        self.host, self.port = str(host), int(port)
        self.timeout_s, self.retries = float(timeout_s), max(0, int(retries))
        self.serializer = Serializer.named(serializer, allow_pickle=allow_pickle)
        self._api_token = as_secret(api_token)
        self.session = new_session_id(session)
        self.max_message_bytes = int(max_message_bytes)
        self.auth_frame = bool(auth_frame)
        self._curve = None
        if curve_server_key:
            if not zmq.has("curve"):
                raise PolicyOptionError("curve_server_key: this pyzmq's libzmq was built without CURVE support")
            if not isinstance(curve_server_key, str) or len(curve_server_key) != 40:
                raise PolicyOptionError("curve_server_key must be the launcher's Z85 public key (40 characters)")
            public, secret = zmq.curve_keypair()
            self._curve = (curve_server_key.encode("ascii"), public, secret)
        self.breaker = Breaker()
        self.sockets_created = 0
        self._seq = 0
        self._probe = True  # ask TCP whether anything listens before the next wait (first call, after a timeout)
        # the process-wide context: a private one would block in term() if it were garbage-collected
        # while a socket of it is still open
        self._context = zmq.Context.instance()
        self._socket = None
        self._connect()

    @property
    def endpoint(self) -> str:
        """The server's ZeroMQ address, ``tcp://host:port``."""
        return f"tcp://{self.host}:{self.port}"

    def _connect(self) -> None:
        zmq = self._zmq
        if self._socket is not None:
            self._socket.close(linger=0)
        sock = self._context.socket(zmq.REQ)
        timeout_ms = max(1, int(round(self.timeout_s * 1000)))
        sock.setsockopt(zmq.RCVTIMEO, timeout_ms)
        sock.setsockopt(zmq.SNDTIMEO, timeout_ms)
        sock.setsockopt(zmq.LINGER, 0)
        # a reply over the bound drops the connection (then a timeout) instead of filling memory
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        if self._curve is not None:
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self._curve
        sock.connect(self.endpoint)
        self._socket = sock
        self.sockets_created += 1

    def call(self, endpoint: str, data: Any = None, requires_input: bool = True, **extra: Any) -> Any:
        """Send one request and return the decoded reply.

        Raises:
            PolicyServerTimeout: no reply after ``retries + 1`` tries.
            PolicyServerError: the server answered ``{"error": ...}`` or something undecodable, or failed
                the last ``breaker.failures`` calls in a row (then refused at once for ``breaker.open_s``).
        """
        self.breaker.check(f"the GR00T policy server at {self.endpoint}")
        try:
            response = self._roundtrip(endpoint, data, requires_input, extra)
        except PolicyServerError as exc:
            self.breaker.record(exc)
            raise
        self.breaker.record(None)  # an error reply below comes from a server that answers
        if isinstance(response, dict) and "error" in response:
            raise PolicyServerError(
                f"the GR00T policy server at {self.endpoint} failed '{endpoint}': {response['error']}",
                endpoint=endpoint,
                server_message=str(response["error"]),
            )
        return response

    def _roundtrip(self, endpoint: str, data: Any, requires_input: bool, extra: Dict[str, Any]) -> Any:
        """The decoded reply to one request, after up to ``retries`` retries on new sockets."""
        request: Dict[str, Any] = {"endpoint": endpoint, "session": self.session, **extra}
        if requires_input:
            request["data"] = data
        frames = []
        if self._api_token and self.auth_frame:
            frames.append(self._api_token.reveal().encode("utf-8"))  # checked before the message is read
        elif self._api_token:
            request["api_token"] = self._api_token.reveal()
        frames.append(self.serializer.dumps(request))
        if self._probe:
            self._refuse_if_nothing_listens(endpoint)
        tries = self.retries + 1
        for attempt in range(tries):
            try:
                self._socket.send_multipart(frames)
                reply = self._socket.recv()
                break
            except self._zmq.Again:
                self._connect()
                self._refuse_if_nothing_listens(endpoint)
                if attempt + 1 < tries:
                    log.warning("no reply from %s to %r within %.3g s; retrying on a new socket", self.endpoint, endpoint, self.timeout_s)
        else:
            raise PolicyServerTimeout(
                f"no reply from the GR00T policy server at {self.endpoint} to '{endpoint}' within "
                f"{self.timeout_s:g} s ({tries} {'try' if tries == 1 else 'tries'}). Check that a server is running there "
                f"(`python -m robocasa_shift.policies.gr00t serve --port {self.port} ...` or GR00T's "
                f"scripts/inference_service.py --server), that host and port are reachable from this machine "
                f"(firewall, SSH tunnel), that both sides use the '{self.serializer.name}' serializer, and that "
                f"timeout_s covers the model's slowest call (the first one warms up).",
                endpoint=endpoint,
            )
        self._probe = False
        try:
            return self.serializer.loads(reply)
        except Exception as exc:
            raise PolicyServerError(
                f"could not decode the reply of {self.endpoint} to '{endpoint}' with the '{self.serializer.name}' "
                f"serializer ({type(exc).__name__}: {exc}); does the server use another serializer?",
                endpoint=endpoint,
            ) from exc

    def _refuse_if_nothing_listens(self, endpoint: str) -> None:
        """A TCP connect to the server's port (at most 2 s): a refused or unreachable port is said at once, instead
        of after ``timeout_s`` x tries of ZeroMQ waiting for a peer that is not there (it reconnects silently).

        Raises:
            PolicyServerTimeout: nothing accepts connections there.
        """
        self._probe = True
        try:
            socket.create_connection((self.host, self.port), timeout=min(2.0, self.timeout_s)).close()
        except socket.timeout:
            return  # filtered or slow: ZeroMQ's own timeout decides
        except OSError as exc:
            raise PolicyServerTimeout(
                f"nothing listens at {self.endpoint} ({exc.strerror or type(exc).__name__}): start the server "
                f"(`python -m robocasa_shift.policies.gr00t serve --port {self.port} ...` or GR00T's "
                "scripts/inference_service.py --server), or check host and port (firewall, SSH tunnel)",
                endpoint=endpoint) from None

    def ping(self) -> bool:
        """True when the server answers ``ping``; False on a timeout (or while the breaker refuses calls)."""
        try:
            self.call("ping", requires_input=False)
            return True
        except PolicyServerTimeout:
            return False
        except PolicyServerError as exc:
            if exc.endpoint != "circuit":
                raise
            return False

    def get_modality_config(self) -> Dict[str, Any]:
        """The server's modality config (ModalityConfig objects as plain dicts)."""
        return self.call("get_modality_config", requires_input=False)

    def get_action(self, observation: Mapping[str, Any]) -> Dict[str, Any]:
        """One action chunk per action key for a GR00T payload (see ``mapping.observation_to_gr00t``)."""
        self._seq += 1
        return self.call("get_action", dict(observation), seq=self._seq)

    def reset(self, seed: int, owner: Optional[str] = None) -> Dict[str, Any]:
        """Seed this session's generator on a ``Gr00tLauncher``; returns ``{"rng_fingerprint": ...}``.

        ``owner``: the session's owner tag (``served.state.owner_tag``), which state blobs are bound to.
        """
        data: Dict[str, Any] = {"seed": int(seed)}
        if owner is not None:
            data["owner"] = owner
        return self.call("reset", data)

    def capabilities(self) -> Dict[str, Any]:
        """What the server offers beyond GR00T's protocol (``ping``'s ``capabilities``; {} for a plain server)."""
        reply = self.call("ping", requires_input=False)
        caps = reply.get("capabilities") if isinstance(reply, dict) else None
        return dict(caps) if isinstance(caps, dict) else {}

    def get_state(self) -> Dict[str, Any]:
        """This session's sealed state on a ``Gr00tLauncher``: ``{"blob": bytes, "rng_fingerprint", ...}``."""
        return self.call("get_state", {})

    def set_state(self, blob: bytes) -> Dict[str, Any]:
        """Apply a sealed state (from ``get_state``) to this session; returns its new ``rng_fingerprint``."""
        return self.call("set_state", {"blob": bytes(blob)})

    def sample(self, observation: Mapping[str, Any], n: int, seed: Optional[int]) -> Dict[str, Any]:
        """``n`` action chunks for one payload, from a generator seeded by ``seed`` (None: a copy of the
        session's); the session's generator does not advance. Returns ``{"samples": [reply, ...]}``."""
        return self.call("sample", {"obs": dict(observation), "n": int(n), "seed": None if seed is None else int(seed)})

    def kill_server(self) -> None:
        """Ask the server to stop (a ``Gr00tLauncher`` answers only when started with ``allow_kill`` and a token)."""
        self.call("kill", requires_input=False)

    def close(self) -> None:
        """Close the socket (without waiting for unsent messages)."""
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

