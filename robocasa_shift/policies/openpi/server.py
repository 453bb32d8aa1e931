"""A serving shim for openpi-style policies: openpi's websocket protocol, plus seeded sessions, state and samples.

``python -m robocasa_shift.policies.openpi serve --policy-factory MODULE:FUNCTION``
imports ``MODULE``, calls ``FUNCTION(**factory options)`` and serves what it
returns: an object with openpi's policy interface, ``infer(obs: dict) -> dict``
(``openpi_client.base_policy.BasePolicy``; openpi's ``policies.policy.Policy``),
and optionally ``metadata`` (sent on connect, as openpi's server does). For
openpi itself the factory is e.g. ``policy_config.create_trained_policy(
config.get_config("pi05_libero"), checkpoint_dir)``.

Stock openpi clients (``openpi_client.WebsocketClientPolicy``) see openpi's
protocol: metadata on connect, then one reply per observation, a traceback text
frame and a close on failure, ``GET /healthz`` answered. A connection that sends
``{"__reset__": {"seed": S, "owner": TAG}}`` gets a generator of its own, and then:

- ``{"__get_state__": {}}`` -> ``{"blob": bytes, ...}``: the connection's generator
  state, sealed for this server, its model (the metadata's hash) and the owner tag
  (``session_state``);
- ``{"__set_state__": {"blob": bytes}}``: apply such a blob (size, seal, model and
  owner checked before it is decoded);
- ``{"__sample__": {"obs": obs, "n": n, "seed": s}}`` -> ``{"samples": [reply, ...]}``:
  n inferences from a generator seeded by ``s`` (None: a copy of the connection's),
  the connection's generator untouched.

The metadata advertises ``seeded_reset``, ``session_state`` and ``sample``.

Generators (``--rng``): ``key`` holds the policy's PRNG key per connection, for
openpi's JAX ``Policy``, which keeps a key in ``_rng`` and splits it at every
``infer`` (a typed JAX key, or a raw uint32 key array): the shim puts the
connection's key there for the call and keeps what the call left. ``torch``
installs the connection's torch generator states as the global ones for the call
(openpi's PyTorch models draw their noise from torch's global generator).
``numpy``: numpy's global legacy generator. ``auto``: ``key`` when the policy has
``_rng``, else ``torch`` when torch imports, else ``numpy``. A connection that never
sent ``__reset__`` draws from the policy's own generator, as under openpi's server.

Security: binds 127.0.0.1 unless told otherwise; any other address needs an API
key (``--api-key`` or ``OPENPI_API_KEY``), checked in the HTTP handshake
(``Authorization: Api-Key ...``, constant time) before any frame is read. Frames
are decoded with ``wire.unpackb`` (numeric arrays only, sizes checked; never
pickle) and bounded by ``--max-message-bytes``. One request is served at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import http
import logging
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union

import numpy as np

from robocasa_shift.policies.model_io import (
    NumpySessionRNG,
    TorchSessionRNG,
    cuda_devices,
)
from robocasa_shift.policies.served.connection import (
    Secret,
    as_secret,
    content_hash,
)
from robocasa_shift.policies.served.state import (
    SAMPLE,
    SESSION_MESSAGES,
    SESSION_STATE,
    StateSealer,
    copy_rng,
    load_state_key,
    sample_request,
)
from robocasa_shift.policies.served.serving import (
    DEFAULT_HOST,
    check_bind,
    factory_options,
    is_loopback,
    load_factory,
)
from robocasa_shift.seeding import rng_state_hash

log = logging.getLogger(__name__)
DEFAULT_PORT = 8000
KEY_ENV = "OPENPI_API_KEY"
MAX_REQUEST_BYTES = 16 * 2**20  # two 224 x 224 images are 0.3 MB
RESET, GET_STATE, SET_STATE, SAMPLE_KEY = (SESSION_MESSAGES[k] for k in ("reset", "get_state", "set_state", "sample"))
CONTROL = (RESET, GET_STATE, SET_STATE, SAMPLE_KEY)
RNG_KINDS = ("auto", "key", "torch", "numpy")


# =========================================================================== generators


class KeySessionRNG:
    """A PRNG key held for one connection, put into ``policy._rng`` around each call (openpi's JAX ``Policy``).

    The key travels as its data (uint32). A typed JAX key (``jax.random.key``) is rebuilt with
    ``jax.random.wrap_key_data`` and the policy's key implementation; a raw key array (``PRNGKey``)
    is put back as the array type the policy held (a JAX array when jax is importable).
    """

    def __init__(self, policy: Any, seed: int):
        self.policy = policy
        self.key = self.seed_data(int(seed))

    def _jax(self):
        try:
            import jax
        except ImportError:
            return None
        return jax

    def _typed(self) -> bool:
        jax = self._jax()
        held = getattr(self.policy, "_rng")
        return jax is not None and hasattr(held, "dtype") and jax.dtypes.issubdtype(held.dtype, jax.dtypes.prng_key)

    def seed_data(self, seed: int) -> np.ndarray:
        """The key data of ``seed``: [high, low] 32-bit words (threefry's, as ``PRNGKey(seed)`` with 64-bit seeds)."""
        held = getattr(self.policy, "_rng")
        jax = self._jax()
        words = np.array([(seed >> 32) & 0xFFFFFFFF, seed & 0xFFFFFFFF], dtype=np.uint32)
        if self._typed():
            shape = tuple(jax.random.key_data(held).shape)
            if shape != (2,):
                return np.asarray(jax.random.key_data(jax.random.key(seed % 2**32, impl=jax.random.key_impl(held))),
                                  dtype=np.uint32).copy()
            return words
        if np.asarray(held).dtype != np.uint32:
            raise TypeError(f"the policy's _rng is a {type(held).__name__} of dtype {np.asarray(held).dtype}, not a "
                            "PRNG key (use --rng torch or numpy)")
        return words

    def _to_key(self, data: np.ndarray) -> Any:
        held = getattr(self.policy, "_rng")
        jax = self._jax()
        if self._typed():
            return jax.random.wrap_key_data(jax.numpy.asarray(data), impl=jax.random.key_impl(held))
        if jax is not None and isinstance(held, jax.Array):
            return jax.numpy.asarray(data)
        return np.array(data, dtype=np.uint32)

    def _from_key(self, key: Any) -> np.ndarray:
        jax = self._jax()
        if jax is not None and hasattr(key, "dtype") and jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        return np.array(key, dtype=np.uint32)

    def run(self, fn: Callable[[], Any]) -> Any:
        saved = self.policy._rng
        self.policy._rng = self._to_key(self.key)
        try:
            return fn()
        finally:
            self.key = self._from_key(self.policy._rng)
            self.policy._rng = saved

    def fingerprint(self) -> str:
        return rng_state_hash(self.key)

    def state_arrays(self) -> Dict[str, np.ndarray]:
        return {"key": self.key.copy()}

    def load_state_arrays(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.key = np.array(arrays["key"], dtype=np.uint32)


def make_rng_factory(policy: Any, kind: str) -> Callable[[int], Any]:
    """seed -> a session generator of ``kind`` (see the module docstring)."""
    if kind not in RNG_KINDS:
        raise ValueError(f"--rng must be one of {list(RNG_KINDS)}, got {kind!r}")
    if kind == "auto":
        if hasattr(policy, "_rng"):
            kind = "key"
        else:
            try:
                import torch  # noqa: F401

                kind = "torch"
            except ImportError:
                kind = "numpy"
    if kind == "key":
        if not hasattr(policy, "_rng"):
            raise ValueError("--rng key: the policy holds no PRNG key in '_rng' (openpi's JAX Policy does)")
        return lambda seed: KeySessionRNG(policy, seed)
    if kind == "torch":
        import torch

        devices = cuda_devices(torch)
        return lambda seed: TorchSessionRNG(torch, seed, devices)
    return lambda seed: NumpySessionRNG(seed)


# =========================================================================== the server


class _Connection:
    """One client connection: its generator (after a seeded reset) and owner tag."""

    def __init__(self):
        self.rng: Any = None
        self.owner = ""  # the owner binding, set by a seeded reset


class OpenpiShim:
    """openpi's websocket policy server around ``policy``, with seeded sessions, state and samples.

    Args:
        policy: an object with ``infer(obs) -> dict`` (and optionally ``metadata``).
        host, port: where to bind (port 0: a free port; read ``.port`` after ``start``). A host
            other than loopback needs ``api_key``.
        api_key: when set, the handshake must carry ``Authorization: Api-Key <key>``.
        metadata: sent on connect (default: the policy's ``metadata``, else {}); the shim adds its
            capabilities.
        rng: ``auto``, ``key``, ``torch`` or ``numpy`` (see the module docstring).
        state_key: seals session states; random per process when None.
        max_message_bytes: longer frames close the connection (1009).
        max_batch: observations of seeded connections answered by one call of the policy's
            ``infer_batch(observations, rngs)`` at most (each observation's noise drawn inside
            ``rngs[i].run(...)``, so a connection's actions do not depend on the batch); 1: one at a time.
        max_wait_ms: how long the first observation of a batch waits for more.

    Raises:
        ValueError: a non-loopback host without a key, an unknown rng kind.
    """

    def __init__(self, policy: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 api_key: Optional[Union[str, Secret]] = None, metadata: Optional[Mapping[str, Any]] = None,
                 rng: str = "auto", state_key: Optional[bytes] = None, max_message_bytes: int = MAX_REQUEST_BYTES,
                 max_batch: int = 1, max_wait_ms: float = 0.0):
        from openpi_client import msgpack_numpy

        from robocasa_shift.policies.openpi.wire import SEEDED_RESET_KEY, unpackb

        self._api_key = as_secret(api_key)
        check_bind(host, self._api_key, f"an API key (--api-key, or the {KEY_ENV} environment variable)")
        if not callable(getattr(policy, "infer", None)):
            raise ValueError(f"{type(policy).__name__} has no infer(obs) method: the factory must return an "
                             "openpi-style policy")
        self.policy, self.host, self.port = policy, str(host), int(port)
        self.max_message_bytes = int(max_message_bytes)
        if int(max_batch) < 1 or float(max_wait_ms) < 0:
            raise ValueError(f"max_batch must be at least 1 and max_wait_ms at least 0, got {max_batch}, {max_wait_ms}")
        self.max_batch, self.max_wait_ms = int(max_batch), float(max_wait_ms)
        self._queue: Optional[asyncio.Queue] = None
        self._new_rng = make_rng_factory(policy, rng)
        self._packer = msgpack_numpy.Packer()
        self._unpackb = unpackb
        base = metadata if metadata is not None else getattr(policy, "metadata", None) or {}
        self.metadata = {**dict(base), SEEDED_RESET_KEY: True, SESSION_STATE: True, SAMPLE: True}
        # what a client records as server_metadata_sha256: the hash of the metadata as it decodes it
        self.model_sha256 = content_hash(unpackb(self._packer.pack(self.metadata)))
        self.sealer = StateSealer(state_key)
        self.connections = 0
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._loop = None
        self._stop_event = None
        self._error: Optional[BaseException] = None

    # ------------------------------------------------------------------ requests

    def handle(self, conn: _Connection, message: Any) -> Dict[str, Any]:
        """One decoded request's reply (raises on failure: the handler sends the traceback and closes)."""
        if not isinstance(message, dict):
            raise ValueError(f"a request must be a dict, got {type(message).__name__}")
        control = [k for k in CONTROL if k in message]
        if not control:
            start = time.monotonic()
            reply = conn.rng.run(lambda: self.policy.infer(message)) if conn.rng is not None else self.policy.infer(message)
            reply = dict(reply)
            reply["server_timing"] = {"infer_ms": (time.monotonic() - start) * 1000}
            return reply
        if len(message) != 1:
            raise ValueError(f"a control message holds only its key, got {sorted(map(str, message))[:8]}")
        key = control[0]
        data = message[key]
        if not isinstance(data, dict):
            raise ValueError(f"{key} needs a dict")
        if key == RESET:
            seed = data.get("seed")
            if not (isinstance(seed, int) and not isinstance(seed, bool)):
                raise ValueError("__reset__ needs {'seed': int}")
            conn.rng, conn.owner = self._new_rng(seed), self.sealer.bind(data, RESET)
            return {"rng_fingerprint": conn.rng.fingerprint(), "server_id": self.sealer.server_id,
                    "model_sha256": self.model_sha256}
        if conn.rng is None:
            raise ValueError(f"{key}: this connection was never reset; send {{'{RESET}': {{'seed': S}}}} first")
        if key == GET_STATE:
            return self.sealer.sealed(conn.rng, self.model_sha256, conn.owner)
        if key == SET_STATE:
            conn.rng = self.sealer.restored(conn.rng, data.get("blob"), self.model_sha256, conn.owner)
            return {"rng_fingerprint": conn.rng.fingerprint(), "server_id": self.sealer.server_id}
        obs, n, seed = sample_request(data, SAMPLE_KEY)
        rng = copy_rng(conn.rng) if seed is None else self._new_rng(seed)
        return {"samples": [dict(rng.run(lambda: self.policy.infer(obs))) for _ in range(n)]}

    # ------------------------------------------------------------------ websocket

    def _authorized(self, request) -> bool:
        if self._api_key is None:
            return True
        given = request.headers.get("Authorization", "")
        expected = f"Api-Key {self._api_key.reveal()}"
        return hmac.compare_digest(hashlib.sha256(given.encode()).digest(), hashlib.sha256(expected.encode()).digest())

    def _process_request(self, connection, request):
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if not self._authorized(request):
            log.warning("refused a connection without a valid API key")
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "Unauthorized: invalid API key\n")
        return None

    async def _handler(self, websocket) -> None:
        import websockets

        self.connections += 1
        conn = _Connection()
        await websocket.send(self._packer.pack(self.metadata))
        while True:
            try:
                raw = await websocket.recv()
                if not isinstance(raw, bytes):
                    raise ValueError("requests are binary msgpack frames")
                request = self._unpackb(raw, self.max_message_bytes)
                if self._queue is not None and conn.rng is not None and isinstance(request, dict) and not any(
                        k in request for k in CONTROL):
                    reply = await self._in_batch(conn, request)
                else:
                    reply = self.handle(conn, request)
                await websocket.send(self._packer.pack(reply))
            except websockets.ConnectionClosed:
                break
            except Exception:
                log.warning("request failed", exc_info=True)
                await websocket.send(traceback.format_exc())
                await websocket.close(code=websockets.frames.CloseCode.INTERNAL_ERROR,
                                      reason="Internal server error. Traceback included in previous frame.")
                return

    async def _in_batch(self, conn: _Connection, request: Dict[str, Any]) -> Dict[str, Any]:
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((conn, request, future))
        return await future

    async def _batcher(self) -> None:
        """Gather observations for up to ``max_wait_ms`` after the first, or until ``max_batch``; answer them."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.max_wait_ms / 1000.0
            while len(batch) < self.max_batch and deadline > loop.time():
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), deadline - loop.time()))
                except asyncio.TimeoutError:
                    break
            self._infer_batch(batch)

    def _infer_batch(self, batch: list) -> None:
        """One policy call for the batch when the policy takes batches, else one each; replies to the futures."""
        start = time.monotonic()
        try:
            if len(batch) > 1 and callable(getattr(self.policy, "infer_batch", None)):
                replies = list(self.policy.infer_batch([r for _, r, _ in batch], [c.rng for c, _, _ in batch]))
                if len(replies) != len(batch):
                    raise ValueError(f"infer_batch answered {len(replies)} of {len(batch)} observations")
            else:
                replies = [c.rng.run(lambda r=r: self.policy.infer(r)) for c, r, _ in batch]
        except Exception as exc:
            for _, _, future in batch:
                future.set_exception(exc)
            return
        for (_, _, future), reply in zip(batch, replies):
            future.set_result({**dict(reply), "server_timing": {"infer_ms": (time.monotonic() - start) * 1000,
                                                                "batch": len(batch)}})

    async def _main(self) -> None:
        import websockets.asyncio.server

        self._loop, self._stop_event = asyncio.get_running_loop(), asyncio.Event()
        if self.max_batch > 1:
            self._queue = asyncio.Queue()
            batcher = asyncio.create_task(self._batcher())
        async with websockets.asyncio.server.serve(self._handler, self.host, self.port, compression=None,
                                                   max_size=self.max_message_bytes,
                                                   process_request=self._process_request) as server:
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            log.info("openpi shim listening on ws://%s:%d", self.host, self.port)
            await self._stop_event.wait()
        if self.max_batch > 1:
            batcher.cancel()

    def serve_forever(self) -> None:
        """Serve until ``stop``."""
        try:
            asyncio.run(self._main())
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise

    def start(self, timeout_s: float = 10.0) -> int:
        """Serve in a daemon thread; return the bound port."""
        self._thread = threading.Thread(target=self.serve_forever, name="openpi-shim", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) or self._error is not None:
            raise RuntimeError(f"the shim could not serve ws://{self.host}:{self.port}: {self._error}")
        return self.port

    def wait(self) -> None:
        """Block until the serving thread ends."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving (connections are closed) and wait for the thread."""
        if self._loop is not None and self._stop_event is not None:
            self._loop.call_soon_threadsafe(self._stop_event.set)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None


# =========================================================================== command line


def main(argv: Optional[Iterable[str]] = None) -> int:
    """``serve``: serve a factory's policy through an ``OpenpiShim`` (exit status 2: refused arguments)."""
    parser = argparse.ArgumentParser(prog="python -m robocasa_shift.policies.openpi",
                                     description="Serve an openpi-style policy with seeded sessions, state and samples.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the policy a factory returns over openpi's websocket protocol")
    serve.add_argument("--policy-factory", required=True, metavar="MODULE:FUNCTION",
                       help="a function returning an object with infer(obs) -> dict (and optionally metadata)")
    serve.add_argument("--factory-option", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for the factory (YAML value; repeatable)")
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"interface to bind (default {DEFAULT_HOST}); any other "
                                                            "needs an API key")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--api-key", default=None, help=f"key every connection must present (prefer {KEY_ENV})")
    serve.add_argument("--rng", choices=RNG_KINDS, default="auto", help="where the policy draws its noise from")
    serve.add_argument("--state-key-file", default=None,
                       help="a file of at least 32 secret bytes sealing session states; without it the key is random "
                            "per start, and a restarted shim refuses older states")
    serve.add_argument("--max-message-bytes", type=int, default=MAX_REQUEST_BYTES)
    serve.add_argument("--max-batch", type=int, default=1,
                       help="answer up to this many seeded connections' observations with one call of the policy's "
                            "infer_batch; 1: one at a time")
    serve.add_argument("--max-wait-ms", type=float, default=5.0,
                       help="with --max-batch > 1: how long the first observation waits for others")
    args = parser.parse_args(list(argv) if argv is not None else None)
    api_key = args.api_key or os.environ.get(KEY_ENV)
    if not is_loopback(args.host) and not api_key:
        print(f"error: --host {args.host} lets other machines reach the shim: set {KEY_ENV} or --api-key, or bind "
              f"{DEFAULT_HOST}", file=sys.stderr)
        return 2
    try:
        factory = load_factory(args.policy_factory)
        options = factory_options(args.factory_option)
        state_key = load_state_key(args.state_key_file)
    except (ImportError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO)
    policy = factory(**options)
    try:
        shim = OpenpiShim(policy, args.host, args.port, api_key, rng=args.rng, state_key=state_key,
                          max_message_bytes=args.max_message_bytes, max_batch=args.max_batch,
                          max_wait_ms=args.max_wait_ms)
    except (ImportError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        port = shim.start()
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"openpi shim serving {args.policy_factory} on ws://{args.host}:{port} (seeded sessions, state, "
          f"samples{', API key required' if api_key else ''})", flush=True)
    try:
        shim.wait()
    except KeyboardInterrupt:
        shim.stop()
    return 0


__all__ = ["KeySessionRNG", "OpenpiShim", "factory_options", "load_factory", "main", "make_rng_factory"]
