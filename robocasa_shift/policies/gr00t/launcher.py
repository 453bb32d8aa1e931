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

Run a seeding server: ``python -m robocasa_shift.policies.gr00t serve
--model-path ... --embodiment-tag ... --data-config ... --port 5555`` (needs
NVIDIA's ``gr00t`` package), check one: ``python -m
robocasa_shift.policies.gr00t ping --host ... --port ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Union

from robocasa_shift.errors import PolicyServerError
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.protocol import DEFAULT_PORT, SERIALIZERS, Serializer
from robocasa_shift.policies.remote import NumpySessionRNG, TorchSessionRNG, canonical, content_hash, cuda_devices

log = logging.getLogger(__name__)
# the first line of the module this command line came from, kept as its --help text
DESCRIPTION = "The ``gr00t`` policy: a client of a GR00T N1.5 inference server, and a seeding launcher for it."


@dataclass
class _Session:
    rng: Any
    last_seq: Optional[int] = None
    last_reply: Any = None


class Gr00tLauncher:
    """A ZeroMQ REP server for any model with ``get_action(obs)`` and ``get_modality_config()``.

    It speaks GR00T's protocol (``ping``, ``kill``, ``get_action``,
    ``get_modality_config``) and adds ``reset``: ``{"seed": int}`` with the
    request's ``session`` id seeds that session's generator and returns
    ``{"rng_fingerprint": sha256 of its state}``. A ``get_action`` with a
    session id runs with that session's generator as the global RNG (see the
    module docstring); one without a session id uses the global RNG as a
    plain server does. The server handles one request at a time.

    Args:
        model: the policy (e.g. ``gr00t.model.policy.Gr00tPolicy``).
        host, port: where to bind (port 0: a free port, read ``.port`` after ``start``).
        serializer: "msgpack" or "torch".
        api_token: when set, requests must carry it.
        model_info: added as ``"model"`` to ``get_modality_config`` replies, so clients record it.
        session_seeding: False serves without ``reset``, as a plain N1.5 server.
        max_sessions: sessions kept (least recently used are dropped).
    """

    def __init__(
        self,
        model: Any,
        host: str = "*",
        port: int = DEFAULT_PORT,
        serializer: Union[str, Serializer] = "msgpack",
        api_token: Optional[str] = None,
        model_info: Optional[Mapping[str, Any]] = None,
        session_seeding: bool = True,
        max_sessions: int = 4096,
    ):
        self.model = model
        self.host, self.port = host, int(port)
        self.serializer = Serializer.named(serializer)
        self.api_token = api_token
        self.model_info = dict(model_info) if model_info is not None else None
        self.max_sessions = int(max_sessions)
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
        if session_seeding:
            self.endpoints["reset"] = self._reset

    # ------------------------------------------------------------------ endpoints

    def _ping(self, request):
        return {"status": "ok", "message": "Server is running", "session_seeding": "reset" in self.endpoints}

    def _kill(self, request):
        self.running = False
        return {"status": "ok", "message": "Server is stopping"}

    def _get_modality_config(self, request):
        config = self.model.get_modality_config()
        if self.model_info is not None:
            config = {**config, "model": self.model_info}
        return config

    def _new_rng(self, seed: int):
        if self._torch is not None:
            return TorchSessionRNG(self._torch, seed, cuda_devices(self._torch))
        return NumpySessionRNG(seed)

    def _reset(self, request):
        session = request.get("session")
        data = request.get("data") or {}
        if not session:
            raise ValueError("reset needs a session id in the request ('session')")
        if "seed" not in data:
            raise ValueError("reset needs {'seed': int} as data")
        self.sessions.pop(session, None)
        self.sessions[session] = _Session(self._new_rng(int(data["seed"])))
        while len(self.sessions) > self.max_sessions:
            self.sessions.popitem(last=False)
        return {"rng_fingerprint": self.sessions[session].rng.fingerprint(), "session": session}

    def _get_action(self, request):
        obs = request.get("data", {})
        session_id = request.get("session")
        if session_id is None or "reset" not in self.endpoints:
            return self.model.get_action(obs)
        session = self.sessions.get(session_id)
        if session is None:
            raise ValueError(f"session {session_id!r} was never reset on this server (or was dropped, "
                             "or the server restarted); call reset(seed) first")
        self.sessions.move_to_end(session_id)
        seq = request.get("seq")
        if seq is not None and seq == session.last_seq:  # a retry of a request already served
            return session.last_reply
        reply = session.rng.run(lambda: self.model.get_action(obs))
        session.last_seq, session.last_reply = seq, reply
        return reply

    def fingerprint(self, session: str) -> str:
        """The current generator hash of a session (for checks)."""
        return self.sessions[session].rng.fingerprint()

    # ------------------------------------------------------------------ serving

    def handle(self, message: bytes) -> bytes:
        """One request's reply bytes; failures become ``{"error": str}``."""
        try:
            request = self.serializer.loads(message)
            if not isinstance(request, dict):
                raise ValueError(f"a request must be a dict, got {type(request).__name__}")
            if self.api_token is not None and request.get("api_token") != self.api_token:
                return self.serializer.dumps({"error": "Unauthorized: Invalid API token"})
            endpoint = request.get("endpoint", "get_action")
            if endpoint not in self.endpoints:
                raise ValueError(f"Unknown endpoint: {endpoint}")
            return self.serializer.dumps(self.endpoints[endpoint](request))
        except Exception as exc:
            log.exception("request failed")
            return self.serializer.dumps({"error": f"{type(exc).__name__}: {exc}"})

    def serve_forever(self, poll_ms: int = 100) -> None:
        """Bind and answer requests until ``kill`` or ``stop``."""
        import zmq

        context = zmq.Context()
        sock = context.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
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
        log.info("GR00T launcher listening on tcp://%s:%d", self.host, self.port)
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while self.running:
                if poller.poll(poll_ms):
                    sock.send(self.handle(sock.recv()))
        finally:
            self.running = False
            sock.close(linger=0)
            context.term()

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


def main(argv: Optional[Iterable[str]] = None) -> int:
    """``serve`` a checkpoint through a ``Gr00tLauncher``, or ``ping`` a server; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m robocasa_shift.policies.gr00t", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a GR00T checkpoint with per-session seeding")
    serve.add_argument("--model-path", required=True, help="checkpoint directory or Hugging Face id")
    serve.add_argument("--embodiment-tag", default="new_embodiment")
    serve.add_argument("--data-config", required=True, help="a GR00T data config name")
    serve.add_argument("--denoising-steps", type=int, default=4)
    serve.add_argument("--device", default=None)
    serve.add_argument("--host", default="*")
    serve.add_argument("--port", type=int, default=DEFAULT_PORT)
    serve.add_argument("--serializer", default="msgpack", choices=sorted(SERIALIZERS))
    serve.add_argument("--api-token", default=None)
    serve.add_argument("--deterministic", action="store_true",
                       help="deterministic torch kernels (needed for bitwise-identical actions on GPU)")
    ping = sub.add_parser("ping", help="check that a server answers")
    ping.add_argument("--host", default="localhost")
    ping.add_argument("--port", type=int, default=DEFAULT_PORT)
    ping.add_argument("--timeout-s", type=float, default=5.0)
    ping.add_argument("--serializer", default="msgpack", choices=sorted(SERIALIZERS))
    args = parser.parse_args(list(argv) if argv is not None else None)

    if args.command == "ping":
        client = Gr00tClient(args.host, args.port, args.timeout_s, retries=0, serializer=args.serializer)
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

    logging.basicConfig(level=logging.INFO)
    model = build_gr00t_model(args.model_path, args.embodiment_tag, args.data_config, args.denoising_steps, args.device)
    if args.deterministic:
        import torch

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    model_info = {
        "model_path": args.model_path,
        "checkpoint_sha256": checkpoint_digest(args.model_path),
        "embodiment_tag": args.embodiment_tag,
        "data_config": args.data_config,
        "denoising_steps": args.denoising_steps,
        "gr00t_version": _package_version("gr00t"),
        "deterministic": bool(args.deterministic),
    }
    launcher = Gr00tLauncher(model, args.host, args.port, args.serializer, args.api_token, model_info)
    print(f"GR00T launcher serving {args.model_path} on tcp://{args.host}:{args.port} (serializer {args.serializer})",
          flush=True)
    launcher.serve_forever()
    return 0

