"""``Gr00tLauncher``: a GR00T-protocol server that seeds a generator per client session; its command line.

Pairing. N1.5 takes no seed: its flow-matching head draws the initial noise
with ``torch.randn`` from the server process's GLOBAL generator, so a plain
server's actions depend on every request it served before. The launcher
wraps the model behind the same protocol and adds a ``reset`` endpoint that
seeds a generator kept per client session; before each ``get_action`` of a
session it installs that session's state as the global torch state (CPU and,
when present, every CUDA device) and stores it back afterwards, so the noise
is a function of the session's seed and its own call count only. The client
sends a session id (and a sequence number, so a retried ``get_action`` is
answered from a cache instead of drawing noise twice) with every request;
plain servers ignore both. Paired runs therefore need either one launcher
per worker or session-keyed requests through one launcher (what
``Gr00tClient`` does); a plain N1.5 server cannot be seeded and is recorded as
``"unseeded-server"``.

Security (see SECURITY.md). The launcher binds 127.0.0.1 unless told
otherwise, and refuses a non-loopback bind without an API token. It never
unpickles: a request is decoded as msgpack (numpy arrays through
``np.load(allow_pickle=False)``), bounded in size on the socket
(``ZMQ_MAXMSGSIZE``) and again before decoding, and its token is compared
(``hmac.compare_digest``) before any endpoint runs. ``kill`` is off unless
the launcher is started with ``allow_kill`` and a token. Sessions are capped:
a full table drops only sessions idle for ``session_idle_s``, never an active
one, and refuses new sessions with a clear error instead. CURVE encryption
is optional (``curve_secret_key``; clients pass the public key).

Branching and sampling (``session_state``): ``get_state`` returns the session's
generator state sealed for this launcher, its model and the session's owner
(HMAC-SHA256 under the launcher's state key; ``--state-key-file`` keeps the key,
and so the launcher's id, across restarts); ``set_state`` applies such a blob to
the requesting session after checking its size, its seal, the model and the owner,
and only then decodes it; ``sample`` draws n chunks for one observation from a
generator seeded by the request (or a copy of the session's), leaving the
session's generator as it was. ``ping`` advertises them in ``capabilities``. The
blob travels as opaque bytes inside the request: it is decoded only after the
token check. A model keeps no state between calls (N1.5's policy is a function
of the observation and the noise), so the generator is all a session holds.

Run a seeding server: ``python -m robocasa_shift.policies.gr00t serve
--model-path ... --embodiment-tag ... --data-config ... --port 5555`` (needs
NVIDIA's ``gr00t`` package), or serve any object with GR00T's model interface
(``get_action``, ``get_modality_config``) with ``--model-factory MODULE:FUNCTION``
(``--factory-option KEY=VALUE``); ``--port 0`` binds a free port and the start
line names it. Check one: ``python -m robocasa_shift.policies.gr00t ping --host ... --port ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from robocasa_shift.errors import PolicyServerError
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.wire import (
    DEFAULT_PORT,
    MAX_MESSAGE_BYTES,
    SERIALIZERS,
    decode_arrays,
    packb,
    unpackb,
)
from robocasa_shift.policies.model_io import (
    NumpySessionRNG,
    TorchSessionRNG,
    cuda_devices,
)
from robocasa_shift.policies.served.connection import (
    Secret,
    as_secret,
    canonical,
    content_hash,
)
from robocasa_shift.policies.served.serving import (
    DEFAULT_HOST,
    check_bind,
    factory_options,
    is_loopback,
    load_factory,
    same_credential,
)
from robocasa_shift.policies.served.state import (
    MAX_SAMPLES,
    MAX_STATE_BYTES,
    SAMPLE,
    SESSION_STATE,
    StateSealer,
    copy_rng,
    load_state_key,
    sample_request,
)

log = logging.getLogger(__name__)
# the first line of the module this command line came from, kept as its --help text
DESCRIPTION = "The ``gr00t`` policy: a client of a GR00T N1.5 inference server, and a seeding launcher for it."
UNAUTHORIZED = "Unauthorized: Invalid API token"
# The longest session id a launcher keeps (clients send <64-char prefix>-<32 hex digits>): without a cap the
# table could hold max_sessions x the message size.
MAX_SESSION_ID_CHARS = 128
NO_PICKLE = ("the launcher never unpickles requests (a pickled request runs its sender's code before any token "
             "check); it serves msgpack, GR00T's format since August 2025: update the client")


@dataclass
class _Pending:
    """A ``get_action`` of a seeded session, waiting for the model (alone, or in a batch)."""

    session: "_Session"
    obs: Any
    key: Tuple[Any, str]  # (seq, sha256 of the request): what the retry cache will answer


@dataclass
class _Session:
    """One client session: its generator, when it was last used, and the last request it answered (for retries)."""

    rng: Any
    last_used_s: float
    last_request: Optional[Tuple[Any, str]] = None  # (seq, sha256 of the request) answered last
    last_reply: Any = None
    owner: str = ""  # the owner binding of the tag sent with reset: a state blob goes back only to its owner


class Gr00tLauncher:
    """A ZeroMQ REP server for any model with ``get_action(obs)`` and ``get_modality_config()``.

    It speaks GR00T's protocol (``ping``, ``kill``, ``get_action``,
    ``get_modality_config``) and adds ``reset``: ``{"seed": int}`` with the
    request's ``session`` id seeds that session's generator and returns
    ``{"rng_fingerprint": sha256 of its state}``. A ``get_action`` with a
    session id runs with that session's generator as the global RNG (see the
    module docstring); one without a session id uses the global RNG as a
    plain server does. One model call runs at a time; with ``max_batch`` > 1
    one call answers the ``get_action`` requests of several sessions.

    Args:
        model: the policy (e.g. ``gr00t.model.policy.Gr00tPolicy``).
        host, port: where to bind (port 0: a free port, read ``.port`` after ``start``). A host
            other than loopback needs ``api_token``.
        serializer: "msgpack" only; "torch" (pickle) is refused with the reason.
        api_token: when set, every request must carry it (compared in constant time).
        model_info: added as ``"model"`` to ``get_modality_config`` replies, so clients record it.
        session_seeding: False serves without ``reset``, as a plain N1.5 server.
        max_sessions: sessions kept at most.
        session_idle_s: a session unused this long may be dropped to make room for a new one;
            while none is that idle, new sessions are refused (active ones are never dropped).
        allow_kill: answer ``kill`` (needs ``api_token``); off by default.
        max_message_bytes: longer requests are dropped by the socket (ZMQ_MAXMSGSIZE) and refused.
        curve_secret_key: a CURVE secret key (Z85, 40 characters) to encrypt every connection;
            clients then need the matching public key (``curve_public_key``).
        state_key: the key that seals session states (``get_state``) and gives the launcher's id;
            random per process when None, so a restarted launcher refuses older states.
        max_batch: ``get_action`` requests of seeded sessions answered by one model call at most (1: none
            gathered); the model's ``get_action_batch(observations, rngs)`` takes them, each observation's
            noise drawn inside ``rngs[i].run(...)``, so a session's actions do not depend on the batch.
        max_wait_ms: how long the first request of a batch waits for more.
        auth_frame_only: accept only requests whose token comes in its own frame, compared before anything of
            the message is read (this harness's client with ``auth_frame=True``; GR00T's own clients carry the
            token inside the message and are then refused).

    Raises:
        ValueError: the torch serializer, a non-loopback host without a token, ``allow_kill``
            without a token, or a malformed CURVE key.
    """

    def __init__(
        self,
        model: Any,
        host: str = DEFAULT_HOST,
        port: int = DEFAULT_PORT,
        serializer: str = "msgpack",
        api_token: Optional[Union[str, Secret]] = None,
        model_info: Optional[Mapping[str, Any]] = None,
        session_seeding: bool = True,
        max_sessions: int = 4096,
        session_idle_s: float = 600.0,
        allow_kill: bool = False,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        curve_secret_key: Optional[Union[str, Secret]] = None,
        state_key: Optional[bytes] = None,
        max_batch: int = 1,
        max_wait_ms: float = 0.0,
        auth_frame_only: bool = False,
    ):
        if serializer != "msgpack":
            raise ValueError(f"serializer {serializer!r}: {NO_PICKLE}")
        self._api_token = as_secret(api_token)
        check_bind(host, self._api_token, f"an API token (--api-token, or the {TOKEN_ENV} environment variable)")
        if int(max_sessions) < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
        if allow_kill and self._api_token is None:
            raise ValueError("allow_kill needs an API token: without one anyone who reaches the port could stop it")
        self._curve_secret = as_secret(curve_secret_key)
        self.curve_public_key: Optional[str] = None
        if self._curve_secret is not None:
            self.curve_public_key = curve_public_key(self._curve_secret.reveal())
        self.model = model
        self.host, self.port = str(host), int(port)
        self.model_info = dict(model_info) if model_info is not None else None
        self.max_sessions = int(max_sessions)
        self.session_idle_s = float(session_idle_s)
        self.allow_kill = bool(allow_kill)
        self.max_message_bytes = int(max_message_bytes)
        if int(max_batch) < 1 or float(max_wait_ms) < 0:
            raise ValueError(f"max_batch must be at least 1 and max_wait_ms at least 0, got {max_batch}, {max_wait_ms}")
        self.max_batch, self.max_wait_ms = int(max_batch), float(max_wait_ms)
        if auth_frame_only and self._api_token is None:
            raise ValueError("auth_frame_only needs an API token")
        self.auth_frame_only = bool(auth_frame_only)
        self.sessions: "OrderedDict[str, _Session]" = OrderedDict()
        self.running = False
        self._bound = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._bind_error: Optional[BaseException] = None
        try:
            import torch

            self._torch = torch
        except ImportError:
            self._torch = None
        self.endpoints: Dict[str, Callable[[Dict[str, Any]], Any]] = {
            "ping": self._ping,
            "kill": self._kill,
            "get_action": self._get_action,
            "get_modality_config": self._get_modality_config,
        }
        self.sealer = StateSealer(state_key)
        self._model_sha256: Optional[str] = None
        if session_seeding:
            self.endpoints["reset"] = self._reset
            self.endpoints["get_state"] = self._get_state
            self.endpoints["set_state"] = self._set_state
            self.endpoints["sample"] = self._sample

    # ------------------------------------------------------------------ endpoints

    def _ping(self, request, message):
        seeding = "reset" in self.endpoints
        return {"status": "ok", "message": "Server is running", "session_seeding": seeding,
                "capabilities": {"session_seeding": seeding, SESSION_STATE: seeding, SAMPLE: seeding,
                                 "max_state_bytes": MAX_STATE_BYTES, "max_samples": MAX_SAMPLES}}

    def model_sha256(self) -> str:
        """The hash of this launcher's modality config with its model info: what clients record as
        ``modality_config_sha256``, and what every state blob is sealed for."""
        if self._model_sha256 is None:
            self._model_sha256 = content_hash(unpackb(packb(self._get_modality_config({}, b""))))
        return self._model_sha256

    def _kill(self, request, message):
        if not self.allow_kill:
            raise PermissionError("kill is disabled on this launcher (start it with --allow-kill and an --api-token)")
        self.running = False
        return {"status": "ok", "message": "Server is stopping"}

    def _get_modality_config(self, request, message):
        config = self.model.get_modality_config()
        if self.model_info is not None:
            config = {**config, "model": self.model_info}
        return config

    def _new_rng(self, seed: int):
        if self._torch is not None:
            return TorchSessionRNG(self._torch, seed, cuda_devices(self._torch))
        return NumpySessionRNG(seed)

    def _make_room(self, now: float) -> None:
        """Drop sessions idle for ``session_idle_s`` (oldest first) until one more fits, or refuse."""
        while len(self.sessions) >= self.max_sessions:
            oldest_id, oldest = next(iter(self.sessions.items()))
            if now - oldest.last_used_s < self.session_idle_s:
                raise RuntimeError(
                    f"the launcher holds {len(self.sessions)} sessions, its maximum, all used within the last "
                    f"{self.session_idle_s:g} s; no session is dropped while in use. Retry later, or restart the "
                    "launcher with a larger --max-sessions")
            del self.sessions[oldest_id]

    def _reset(self, request, message):
        session = request.get("session")
        data = request.get("data") or {}
        if not session or not isinstance(session, str):
            raise ValueError("reset needs a session id in the request ('session')")
        if len(session) > MAX_SESSION_ID_CHARS:  # the table holds ids, not payloads: at most sessions x this
            raise ValueError(f"session id of {len(session)} characters; at most {MAX_SESSION_ID_CHARS}")
        if not isinstance(data, dict) or "seed" not in data:
            raise ValueError("reset needs {'seed': int} as data")
        now = time.monotonic()
        if self.sessions.pop(session, None) is None:
            self._make_room(now)
        owner = self.sealer.bind(data, "reset")
        self.sessions[session] = _Session(self._new_rng(int(data["seed"])), now, owner=owner)
        return {"rng_fingerprint": self.sessions[session].rng.fingerprint(), "session": session,
                "server_id": self.sealer.server_id, "model_sha256": self.model_sha256()}

    def _session(self, request: Mapping[str, Any]) -> _Session:
        """The requesting session (it must have been reset on this launcher)."""
        session_id = request.get("session")
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None:
            raise ValueError(f"session {str(session_id)[:MAX_SESSION_ID_CHARS]!r} was never reset on this server (or "
                             "was dropped, or the server restarted); call reset(seed) first")
        self.sessions.move_to_end(session_id)
        session.last_used_s = time.monotonic()
        return session

    def _get_state(self, request, message):
        """The session's generator state, sealed for this launcher, its model and the session's owner."""
        session = self._session(request)
        return self.sealer.sealed(session.rng, self.model_sha256(), session.owner)

    def _set_state(self, request, message):
        """Apply a sealed state to the requesting session: size, seal, model and owner are checked before it is
        decoded (``StateSealer.open``); the retry cache is dropped, so the next request draws afresh."""
        session = self._session(request)
        data = request.get("data")
        blob = data.get("blob") if isinstance(data, dict) else None
        rng = self.sealer.restored(session.rng, blob, self.model_sha256(), session.owner)
        session.rng, session.last_request, session.last_reply = rng, None, None
        return {"rng_fingerprint": rng.fingerprint(), "server_id": self.sealer.server_id}

    def _sample(self, request, message):
        """``n`` chunks for one observation, from a generator seeded by ``seed`` (or a copy of the session's);
        the session's generator and retry cache are left as they were."""
        session = self._session(request)
        obs, n, seed = sample_request(request.get("data"), "sample")
        rng = copy_rng(session.rng) if seed is None else self._new_rng(seed)
        return {"samples": [rng.run(lambda: self.model.get_action(obs)) for _ in range(n)]}

    def _get_action(self, request, message):
        obs = request.get("data", {})
        session_id = request.get("session")
        if session_id is None or "reset" not in self.endpoints:
            return self.model.get_action(obs)
        session = self._session(request)
        seq = request.get("seq")
        # A retry resends the very same bytes: the cache answers it only when the whole request matches,
        # so another client that reuses the session id and sequence number never gets this one's action.
        key = (seq, hashlib.sha256(message).hexdigest())
        if seq is not None and session.last_request is not None and seq == session.last_request[0]:
            if key == session.last_request:
                return session.last_reply
            raise ValueError(f"session {session_id!r} got two different requests numbered {seq}: two clients share "
                             "this session id; give each policy instance its own session")
        return _Pending(session, obs, key)

    def _answer(self, pending: List["_Pending"]) -> List[bytes]:
        """The replies to pending ``get_action`` requests: one model call for all of them when the model takes
        batches (``get_action_batch(observations, rngs)``), else one call each. Every session's noise comes from
        its own generator either way, so a session's actions are the same batched or not."""
        try:
            if len(pending) > 1 and callable(getattr(self.model, "get_action_batch", None)):
                replies = list(self.model.get_action_batch([p.obs for p in pending], [p.session.rng for p in pending]))
                if len(replies) != len(pending):
                    raise ValueError(f"get_action_batch answered {len(replies)} of {len(pending)} observations")
            else:
                replies = [p.session.rng.run(lambda p=p: self.model.get_action(p.obs)) for p in pending]
            answers = [packb(reply) for reply in replies]
        except Exception as exc:
            log.exception("get_action failed")
            return [packb({"error": f"{type(exc).__name__}: {exc}"})] * len(pending)
        for p, reply in zip(pending, replies):
            p.session.last_request, p.session.last_reply = p.key, reply
        return answers

    @property
    def offers_session_state(self) -> bool:
        """Whether sessions can be seeded, snapshotted, restored and sampled (``session_seeding``)."""
        return "reset" in self.endpoints

    @property
    def requires_token(self) -> bool:
        """Whether requests must carry an API token (the token itself is never exposed)."""
        return self._api_token is not None

    def fingerprint(self, session: str) -> str:
        """The current generator hash of a session (for checks)."""
        return self.sessions[session].rng.fingerprint()

    # ------------------------------------------------------------------ serving

    def _authorized(self, request: Mapping[str, Any]) -> bool:
        """Whether ``request`` carries this launcher's token (always, when it has none)."""
        if self._api_token is None:
            return True
        return same_credential(request.get("api_token"), self._api_token)

    def handle(self, message: bytes) -> bytes:
        """One request's reply bytes; failures become ``{"error": str}`` (see ``_admit``)."""
        outcome = self._admit(message)
        return self._answer([outcome])[0] if isinstance(outcome, _Pending) else outcome

    def _admit(self, message: bytes, token: Optional[bytes] = None) -> Union[bytes, "_Pending"]:
        """One request's reply bytes, or a ``get_action`` of a seeded session waiting for the model.

        Order matters. A token sent in its own frame (``token``) is compared first, before a byte of the message
        is read; with ``auth_frame_only`` nothing else is accepted. Otherwise (GR00T's own clients carry the
        token inside the message): the size is checked, the msgpack pre-scanned (values, depth) and decoded as
        plain values (arrays stay bytes), then the token is checked. Only then are the arrays decoded
        (``np.load(allow_pickle=False)`` after their headers are checked: no code runs) and an endpoint run. A
        state blob (``set_state``) stays bytes until the endpoint has checked its seal.
        """
        if self._api_token is not None and token is not None:
            if not same_credential(bytes(token), self._api_token):
                log.warning("refused a request with a wrong token frame")
                return packb({"error": UNAUTHORIZED})
        elif self._api_token is not None and self.auth_frame_only:
            return packb({"error": f"{UNAUTHORIZED}: this launcher takes the token in its own frame only "
                                   "(auth_frame=true on the client)"})
        try:
            request = unpackb(message, max_bytes=self.max_message_bytes, arrays=False)
        except Exception as exc:
            log.warning("refused an undecodable request of %d bytes (%s)", len(message), type(exc).__name__)
            return packb({"error": f"could not decode the request as GR00T msgpack ({type(exc).__name__}: {exc}); "
                                   f"{NO_PICKLE}"})
        if not isinstance(request, dict):
            return packb({"error": f"a request must be a dict, got {type(request).__name__}"})
        if token is None and not self._authorized(request):
            log.warning("refused a request without a valid API token")
            return packb({"error": UNAUTHORIZED})
        try:
            request = decode_arrays(request)
            endpoint = request.get("endpoint", "get_action")
            if endpoint not in self.endpoints:
                raise ValueError(f"Unknown endpoint: {endpoint}")
            reply = self.endpoints[endpoint](request, message)
            return reply if isinstance(reply, _Pending) else packb(reply)
        except Exception as exc:
            log.exception("request failed")
            return packb({"error": f"{type(exc).__name__}: {exc}"})

    def serve_forever(self, poll_ms: int = 100) -> None:
        """Bind and answer requests until ``kill`` or ``stop``."""
        import zmq

        context = zmq.Context()
        # ROUTER, not REP: REQ clients (GR00T's and this harness's) see no difference, and the receive queue is
        # bounded: one request per peer waits here, the rest wait in TCP instead of this process's memory
        sock = context.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1)
        # libzmq drops a peer whose message exceeds this before it is buffered whole
        sock.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        try:
            if self._curve_secret is not None:
                sock.curve_secretkey = self._curve_secret.reveal().encode("ascii")
                sock.curve_publickey = self.curve_public_key.encode("ascii")
                sock.curve_server = True
            if self.port == 0:
                self.port = sock.bind_to_random_port(f"tcp://{self.host}")
            else:
                sock.bind(f"tcp://{self.host}:{self.port}")
        except Exception as exc:
            self._bind_error = exc
            self._bound.set()
            sock.close()
            context.term()
            raise
        self.running = True
        self._bound.set()
        log.info("GR00T launcher listening on tcp://%s:%d%s", self.host, self.port,
                 " (CURVE)" if self._curve_secret is not None else "")
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while self.running:
                if poller.poll(poll_ms):
                    self._serve_ready(sock, poller)
        finally:
            self.running = False
            sock.close(linger=0)
            context.term()

    def _serve_ready(self, sock: Any, poller: Any) -> None:
        """Answer what arrived; ``get_action`` requests of seeded sessions are gathered for up to ``max_wait_ms``
        after the first, or until ``max_batch`` wait, and answered together."""
        batch: List[Tuple[List[bytes], _Pending]] = []
        deadline = time.monotonic() + self.max_wait_ms / 1000.0
        while True:
            frames = sock.recv_multipart(copy=False)
            # [peer, empty delimiter, (token,) request]; the request is read in place, never copied whole
            delimiter = next((i for i in range(1, len(frames)) if not frames[i].bytes), None)
            if delimiter is not None and len(frames) - delimiter - 1 in (1, 2):
                envelope = [f.bytes for f in frames[:delimiter + 1]]
                token = frames[delimiter + 1].bytes if len(frames) - delimiter - 1 == 2 else None
                outcome = self._admit(frames[-1].buffer, token)
                if isinstance(outcome, _Pending):
                    batch.append((envelope, outcome))
                else:
                    sock.send_multipart([*envelope, outcome])
            left_ms = (deadline - time.monotonic()) * 1000.0
            if not batch or len(batch) >= self.max_batch or left_ms <= 0 or not poller.poll(max(1, int(left_ms))):
                break
        for (envelope, _), reply in zip(batch, self._answer([p for _, p in batch])):
            sock.send_multipart([*envelope, reply])

    def start(self, timeout_s: float = 10.0) -> int:
        """Serve in a daemon thread; return the bound port."""
        self._bound.clear()
        self._thread = threading.Thread(target=self.serve_forever, name=f"gr00t-launcher-{self.port}", daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout_s):
            raise RuntimeError(f"the launcher did not bind tcp://{self.host}:{self.port} within {timeout_s:g} s")
        if self._bind_error is not None:
            raise RuntimeError(f"the launcher could not bind tcp://{self.host}:{self.port}: {self._bind_error}")
        return self.port

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and wait up to ``timeout_s`` for the serving thread."""
        self.running = False
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


def curve_public_key(secret_key: str) -> str:
    """The Z85 CURVE public key of a Z85 secret key.

    Raises:
        ValueError: not a 40-character Z85 key, or a libzmq without CURVE.
    """
    import zmq

    if not zmq.has("curve"):
        raise ValueError("this pyzmq's libzmq was built without CURVE support")
    if not isinstance(secret_key, str) or len(secret_key.strip()) != 40:
        raise ValueError("a CURVE secret key is 40 Z85 characters (make one with `... gr00t curve-keygen`)")
    return zmq.curve_public(secret_key.strip().encode("ascii")).decode("ascii")


# =========================================================================== command line


def checkpoint_digest(path: Union[str, Path], small_bytes: int = 1 << 20) -> Optional[str]:
    """sha256 over a local checkpoint's file names and sizes and the content of its small files."""
    root = Path(path)
    if not root.is_dir():
        return None
    h = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        size = file.stat().st_size
        h.update(f"{file.relative_to(root).as_posix()}\0{size}\0".encode())
        if size <= small_bytes:
            h.update(file.read_bytes())
    return h.hexdigest()


def build_gr00t_model(model_path: str, embodiment_tag: str, data_config: str, denoising_steps: int, device: Optional[str]):
    """NVIDIA's ``gr00t.model.policy.Gr00tPolicy``; exits with a clear message without ``gr00t``."""
    try:
        from gr00t.model.policy import Gr00tPolicy as Gr00tModelPolicy
    except ImportError as exc:
        sys.exit(
            f"serving a GR00T checkpoint needs NVIDIA's `gr00t` package, which is not importable here ({exc}). "
            "Install Isaac-GR00T (https://github.com/NVIDIA/Isaac-GR00T, `pip install -e .` in a checkout) "
            "in this environment, or wrap your model in robocasa_shift.policies.gr00t.Gr00tLauncher yourself."
        )
    try:
        from gr00t.experiment.data_config import DATA_CONFIG_MAP

        config = DATA_CONFIG_MAP[data_config]
    except ImportError:
        from gr00t.experiment.data_config import load_data_config

        config = load_data_config(data_config)
    options: Dict[str, Any] = {}
    if device:
        options["device"] = device
    return Gr00tModelPolicy(
        model_path=model_path,
        modality_config=config.modality_config(),
        modality_transform=config.transform(),
        embodiment_tag=embodiment_tag,
        denoising_steps=denoising_steps,
        **options,
    )


def _package_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


TOKEN_ENV = "GR00T_API_TOKEN"  # read when --api-token is not given: a token on a command line shows in `ps`


def _build_launcher(args: argparse.Namespace, model: Any, model_info: Mapping[str, Any]) -> Gr00tLauncher:
    """The launcher ``serve`` runs, from its parsed arguments (refusals become exit status 2 in ``main``)."""
    curve_secret = None
    if args.curve_secret_key_file:
        curve_secret = Path(args.curve_secret_key_file).read_text().strip()
    return Gr00tLauncher(model, args.host, args.port, args.serializer, args.api_token or os.environ.get(TOKEN_ENV),
                         model_info, max_sessions=args.max_sessions, session_idle_s=args.session_idle_s,
                         allow_kill=args.allow_kill, max_message_bytes=args.max_message_bytes,
                         curve_secret_key=curve_secret, state_key=load_state_key(args.state_key_file),
                         max_batch=getattr(args, "max_batch", 1), max_wait_ms=getattr(args, "max_wait_ms", 0.0),
                         auth_frame_only=getattr(args, "auth_frame_only", False))


def _check_serve_args(args: argparse.Namespace) -> Optional[str]:
    """Why ``serve`` must not start with these arguments (None: it may), before any model is loaded."""
    token = args.api_token or os.environ.get(TOKEN_ENV)
    if args.serializer != "msgpack":
        return f"--serializer {args.serializer}: {NO_PICKLE}"
    if not is_loopback(args.host) and not token:
        return (f"--host {args.host} lets other machines reach the launcher: set an API token ({TOKEN_ENV} or "
                f"--api-token), or bind {DEFAULT_HOST} and reach it through an SSH tunnel")
    if args.allow_kill and not token:
        return "--allow-kill needs an API token (set GR00T_API_TOKEN or --api-token)"
    if getattr(args, "model_path", None) and not getattr(args, "data_config", None):
        return "--model-path needs --data-config (a GR00T data config name)"
    if getattr(args, "factory_option", None) and not getattr(args, "model_factory", None):
        return "--factory-option is for --model-factory"
    if getattr(args, "state_key_file", None):
        try:
            load_state_key(args.state_key_file)
        except (OSError, ValueError) as exc:
            return f"--state-key-file: {exc}"
    return None


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m robocasa_shift.policies.gr00t``."""
    parser = argparse.ArgumentParser(prog="python -m robocasa_shift.policies.gr00t", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a GR00T checkpoint with per-session seeding")
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-path", help="checkpoint directory or Hugging Face id")
    source.add_argument("--model-factory", metavar="MODULE:FUNCTION",
                        help="serve what FUNCTION(**factory options) returns instead: any object with GR00T's model "
                             "interface, get_action(obs) and get_modality_config() (another GR00T version, a stand-in)")
    serve.add_argument("--factory-option", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for --model-factory (YAML value; repeatable)")
    serve.add_argument("--embodiment-tag", default="new_embodiment")
    serve.add_argument("--data-config", help="a GR00T data config name (needed with --model-path)")
    serve.add_argument("--denoising-steps", type=int, default=4)
    serve.add_argument("--device", default=None)
    serve.add_argument("--host", default=DEFAULT_HOST,
                       help=f"interface to bind (default {DEFAULT_HOST}); any other needs an API token")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--serializer", default="msgpack",
                       help="msgpack only: the launcher never unpickles (the old torch format is refused)")
    serve.add_argument("--api-token", default=None,
                       help=f"token every request must carry (prefer the {TOKEN_ENV} environment variable)")
    serve.add_argument("--allow-kill", action="store_true", help="answer 'kill' requests (needs an API token)")
    serve.add_argument("--max-sessions", type=int, default=4096, help="client sessions kept at most")
    serve.add_argument("--session-idle-s", type=float, default=600.0,
                       help="a session idle this long may be dropped when the table is full")
    serve.add_argument("--max-message-bytes", type=int, default=MAX_MESSAGE_BYTES,
                       help="longest request accepted (ZMQ_MAXMSGSIZE)")
    serve.add_argument("--curve-secret-key-file", default=None,
                       help="encrypt with CURVE: a file holding the launcher's Z85 secret key (see curve-keygen)")
    serve.add_argument("--state-key-file", default=None,
                       help="a file of at least 32 secret bytes that seals session states (branching); without it "
                            "the key is random per start, and a restarted launcher refuses older states")
    serve.add_argument("--auth-frame-only", action="store_true",
                       help="accept only requests carrying the token in its own frame, checked before the message is "
                            "read (clients: --policy-option auth_frame=true; GR00T's own clients are refused)")
    serve.add_argument("--max-batch", type=int, default=1,
                       help="answer up to this many get_action requests of different sessions with one model call "
                            "(the model's get_action_batch); 1: one at a time")
    serve.add_argument("--max-wait-ms", type=float, default=5.0,
                       help="with --max-batch > 1: how long the first request waits for others")
    serve.add_argument("--deterministic", action="store_true",
                       help="deterministic torch kernels (needed for bitwise-identical actions on GPU)")
    ping = sub.add_parser("ping", help="check that a server answers")
    ping.add_argument("--host", default="localhost")
    ping.add_argument("--port", type=int, default=DEFAULT_PORT)
    ping.add_argument("--timeout-s", type=float, default=5.0)
    ping.add_argument("--serializer", default="msgpack", choices=sorted(SERIALIZERS))
    ping.add_argument("--allow-pickle", action="store_true",
                      help="needed with --serializer torch: the reply is unpickled (trusted servers only)")
    ping.add_argument("--api-token", default=None, help=f"default: the {TOKEN_ENV} environment variable")
    ping.add_argument("--curve-server-key", default=None, help="the launcher's CURVE public key (Z85)")
    keygen = sub.add_parser("curve-keygen", help="write a CURVE secret key file for serve; print its public key")
    keygen.add_argument("--out", required=True, help="file for the secret key (created with mode 0600)")
    return parser


def main(argv: Optional[Iterable[str]] = None) -> int:
    """``serve`` a checkpoint through a ``Gr00tLauncher``, ``ping`` a server or make a CURVE key pair.

    Returns the exit status (2: refused arguments or an unreachable server).
    """
    args = _parser().parse_args(list(argv) if argv is not None else None)

    if args.command == "curve-keygen":
        import zmq

        public, secret = zmq.curve_keypair()
        fd = os.open(args.out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secret.decode("ascii") + "\n")
        print(public.decode("ascii"))
        return 0

    if args.command == "ping":
        try:
            client = Gr00tClient(args.host, args.port, args.timeout_s, retries=0, serializer=args.serializer,
                                 api_token=args.api_token or os.environ.get(TOKEN_ENV),
                                 allow_pickle=args.allow_pickle, curve_server_key=args.curve_server_key)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        try:
            print(json.dumps(canonical(client.call("ping", requires_input=False))))
            config = client.get_modality_config()
            print(json.dumps({"modality_config_sha256": content_hash(config), "model": canonical(config.get("model"))}))
        except PolicyServerError as exc:
            print(exc, file=sys.stderr)
            return 2
        finally:
            client.close()
        return 0

    problem = _check_serve_args(args)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    if args.model_factory:
        try:
            factory = load_factory(args.model_factory, "--model-factory")
            options = factory_options(args.factory_option)
        except (ImportError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        model = factory(**options)
        model_info: Dict[str, Any] = {"model_factory": args.model_factory, "factory_options": canonical(options)}
    else:
        model = build_gr00t_model(args.model_path, args.embodiment_tag, args.data_config, args.denoising_steps,
                                  args.device)
    if args.deterministic:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    if not args.model_factory:
        model_info = {
            "model_path": args.model_path,
            "checkpoint_sha256": checkpoint_digest(args.model_path),
            "embodiment_tag": args.embodiment_tag,
            "data_config": args.data_config,
            "denoising_steps": args.denoising_steps,
            "gr00t_version": _package_version("gr00t"),
            "deterministic": bool(args.deterministic),
        }
    try:
        launcher = _build_launcher(args, model, model_info)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        port = launcher.start()  # --port 0 binds a free port: the line below names it
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"GR00T launcher serving {args.model_path or args.model_factory} on tcp://{args.host}:{port} (msgpack"
          f"{', CURVE' if launcher.curve_public_key else ''}{', token required' if launcher.requires_token else ''}"
          f"{', session state and samples' if launcher.offers_session_state else ''})", flush=True)
    try:
        while launcher.running:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    launcher.stop()
    return 0
