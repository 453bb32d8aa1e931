"""``Gr00tClient``: a REQ client of a GR00T N1.5 server (or of this harness's ``Gr00tLauncher``).

Every request carries the client's session id and every ``get_action`` a
sequence number, so a launcher can keep one generator per session and answer
a retried request from its cache; plain servers ignore both.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any, Dict, Mapping, Optional, Union

from robocasa_shift.errors import PolicyServerError, PolicyServerTimeout
from robocasa_shift.policies.gr00t.protocol import DEFAULT_PORT, Serializer

log = logging.getLogger(__name__)


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
        serializer: "msgpack" (current GR00T) or "torch" (before August 2025).
        api_token: sent with every request when the server requires one.
        session: the session id sent with every request (a random id by default).
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
    ):
        try:
            import msgpack  # noqa: F401
            import zmq
        except ImportError as exc:
            raise ImportError(f"the GR00T client needs pyzmq and msgpack ({exc}): pip install pyzmq msgpack") from None
        self._zmq = zmq
        self.host, self.port = str(host), int(port)
        self.timeout_s, self.retries = float(timeout_s), max(0, int(retries))
        self.serializer = Serializer.named(serializer)
        self.api_token = api_token
        # an identifier, not a source of randomness: it never reaches the model
        self.session = session or uuid.uuid4().hex
        self.sockets_created = 0
        self._seq = 0
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
        sock.connect(self.endpoint)
        self._socket = sock
        self.sockets_created += 1

    def call(self, endpoint: str, data: Any = None, requires_input: bool = True, **extra: Any) -> Any:
        """Send one request and return the decoded reply.

        Raises:
            PolicyServerTimeout: no reply after ``retries + 1`` tries.
            PolicyServerError: the server answered ``{"error": ...}`` or something undecodable.
        """
        request: Dict[str, Any] = {"endpoint": endpoint, "session": self.session, **extra}
        if requires_input:
            request["data"] = data
        if self.api_token:
            request["api_token"] = self.api_token
        message = self.serializer.dumps(request)
        tries = self.retries + 1
        for attempt in range(tries):
            try:
                self._socket.send(message)
                reply = self._socket.recv()
                break
            except self._zmq.Again:
                self._connect()
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
        try:
            response = self.serializer.loads(reply)
        except Exception as exc:
            raise PolicyServerError(
                f"could not decode the reply of {self.endpoint} to '{endpoint}' with the '{self.serializer.name}' "
                f"serializer ({type(exc).__name__}: {exc}); does the server use another serializer?",
                endpoint=endpoint,
            ) from exc
        if isinstance(response, dict) and "error" in response:
            raise PolicyServerError(
                f"the GR00T policy server at {self.endpoint} failed '{endpoint}': {response['error']}",
                endpoint=endpoint,
                server_message=str(response["error"]),
            )
        return response

    def ping(self) -> bool:
        """True when the server answers ``ping``; False on a timeout."""
        try:
            self.call("ping", requires_input=False)
            return True
        except PolicyServerTimeout:
            return False

    def get_modality_config(self) -> Dict[str, Any]:
        """The server's modality config (ModalityConfig objects as plain dicts)."""
        return self.call("get_modality_config", requires_input=False)

    def get_action(self, observation: Mapping[str, Any]) -> Dict[str, Any]:
        """One action chunk per action key for a GR00T payload (see ``mapping.observation_to_gr00t``)."""
        self._seq += 1
        return self.call("get_action", dict(observation), seq=self._seq)

    def reset(self, seed: int) -> Dict[str, Any]:
        """Seed this session's generator on a ``Gr00tLauncher``; returns ``{"rng_fingerprint": ...}``."""
        return self.call("reset", {"seed": int(seed)})

    def kill_server(self) -> None:
        """Ask the server to stop."""
        self.call("kill", requires_input=False)

    def close(self) -> None:
        """Close the socket (without waiting for unsent messages)."""
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

