"""Branching and sampling for served policies whose server offers it: the client side of ``session_state``.

``StatefulRemotePolicy`` is the ``RemotePolicy`` of a server that may offer
session state (this harness's GR00T launcher, its openpi serving shim). It asks
the server what it offers (``capabilities``) and then:

- ``get_state()``: the session's state, fetched from the server as a sealed blob
  (opaque bytes: the server's generator state, bound to that server, its model
  and this client's owner tag), the server's id and model identity it was taken
  from, and the client-side chunk buffer (``mode="step"``: the actions of the
  last chunk not yet handed out). Plain arrays only: the blob is a uint8 array,
  the identity UTF-8 JSON in a uint8 array, the buffer float64 with an int64 index.
- ``set_state(state)``: refuses a state taken from another server (its id, which
  changes when a launcher restarts without ``--state-key-file``) or another
  model (the modality config's or the metadata's hash) before anything is sent;
  the server then checks the blob's size, seal, model and owner before it decodes
  it; the buffer comes back as it was.
- ``sample_actions(obs, n, rng)``: n chunks drawn by the server for this
  observation from a generator seeded by ``rng`` (the session's generator does not
  advance); their first actions, what the policy would do if it planned now.

A server that offers none of this (a stock GR00T N1.5 or openpi server, vla-eval)
keeps the refusal of ``RemotePolicy`` with its reason, and offers no samples.

Modes: ``mode="chunk"`` (default) returns each chunk's first ``n_action_steps``
at once; ``mode="step"`` returns one action per call from a client-side buffer
refilled every ``n_action_steps`` calls, as openpi's ``ActionChunkBroker`` and its
LIBERO example's action plan do: every step is then a decision point (an
observation, a branchable boundary, a monitor's boundary), and the buffer is part
of the state.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Callable, Dict, Mapping, Optional

import numpy as np

from robocasa_shift.core.policy import ChunkCursor, Observation, Policy
from robocasa_shift.errors import ActionFormatError, PolicyServerError, StateUnsupported
from robocasa_shift.policies.model_io import NOT_RESET, checked_chunk
from robocasa_shift.policies.served.connection import as_secret
from robocasa_shift.policies.served.state import (
    MAX_SAMPLES,
    MAX_STATE_BYTES,
    SAMPLE,
    SEEDED_RESET,
    SESSION_STATE,
    owner_tag,
)

UNSEEDED = "unseeded-server"
MODES = ("chunk", "step")
STATE_KEYS = frozenset({"remote.blob", "remote.server", "buffer.actions", "buffer.index"})


class RemotePolicy(Policy):
    """A policy whose model runs in another process: its RNG lives there, seeded per session when it can be.

    Subclasses call :meth:`seeded` with the server's reply to a seeded reset, or
    :meth:`unseeded` when the server cannot be seeded (paired rollouts are then not
    guaranteed on the policy side, and the fingerprint says so).
    """

    deterministic = False
    # get_state / set_state refuse with this reason (see policies.base.state_support)
    state_refusal = ("the policy server holds its generators and the protocol has no call to read or restore them, "
                     "so remote policies cannot be branched")
    _fingerprint = NOT_RESET
    _warned_unseeded = False

    def seeded(self, reply: Any, endpoint: str) -> None:
        """Take the policy RNG fingerprint from the server's reply to a seeded reset."""
        fingerprint = reply.get("rng_fingerprint") if isinstance(reply, dict) else None
        if not isinstance(fingerprint, str):
            raise PolicyServerError(f"'reset' of {endpoint} returned no rng_fingerprint: {reply!r}", "reset")
        self._fingerprint = fingerprint

    def unseeded(self, why: str) -> None:
        """Mark this rollout's policy RNG as unseeded; warn once per instance with ``why``."""
        if not self._warned_unseeded:
            warnings.warn(why, RuntimeWarning, stacklevel=3)
            self._warned_unseeded = True
        self._fingerprint = UNSEEDED

    def rng_fingerprint(self) -> str:
        """The server's fingerprint of the session RNG after the last reset (or NOT_RESET / UNSEEDED)."""
        return self._fingerprint


class PolicyStateRefused(PolicyServerError):
    """A policy state that will not be restored here: taken from another server or model, or malformed."""

    error_kind = "policy_state"


def _text(value: str) -> np.ndarray:
    return np.frombuffer(value.encode("utf-8"), dtype=np.uint8).copy()


class StatefulRemotePolicy(RemotePolicy):
    """A remote policy whose server may offer ``session_state`` and ``sample`` (see the module docstring).

    Subclasses call :meth:`init_session_state` in their constructor, :meth:`clear_buffer` in ``reset``,
    :meth:`chunked` in ``act``, and implement the hooks :meth:`fetch_capabilities`, :meth:`state_request`,
    :meth:`payload` and :meth:`actions_of`; ``state_hint`` says how to serve the model so it can be branched.
    """

    state_hint = "serve the model with this harness's server to branch it"
    mode = "chunk"
    n_action_steps: Optional[int] = None

    def init_session_state(self, mode: str = "chunk", state_secret: Any = None, api_token: Any = None) -> None:
        """Set the mode and the owner tag (from ``state_secret``, else the API token, else none)."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        self.mode = mode
        secret = as_secret(state_secret) or as_secret(api_token)
        self._owner = owner_tag(secret.reveal() if secret else None)
        self._buffer = ChunkCursor()
        self._caps: Optional[Dict[str, Any]] = None
        self._server: Dict[str, Any] = {}

    # ------------------------------------------------------------------ hooks

    def fetch_capabilities(self) -> Mapping[str, Any]:
        """What the server offers (``{}`` for a plain server)."""
        return {}

    def state_request(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        """Send ``op`` (``get_state``, ``set_state`` or ``sample``) with ``data`` for this session; the reply."""
        raise NotImplementedError

    def payload(self, obs: Observation) -> Dict[str, Any]:
        """The observation as this policy sends it to its server."""
        raise NotImplementedError

    def actions_of(self, reply: Mapping[str, Any]) -> np.ndarray:
        """The (k, action_dim) chunk a server reply gives, as ``act`` would execute it."""
        raise NotImplementedError

    def endpoint_name(self) -> str:
        """The server, as messages name it."""
        return "the policy server"

    # ------------------------------------------------------------------ capabilities

    def capabilities(self) -> Dict[str, Any]:
        """The server's capabilities, asked once per reset (a reconnect may reach another server)."""
        if self._caps is None:
            self._caps = dict(self.fetch_capabilities() or {})
        return self._caps

    def instance_state_refusal(self) -> Optional[str]:
        if self.capabilities().get(SESSION_STATE) is True:
            return None
        return f"{type(self).state_refusal} ({self.endpoint_name()} offers no session state; {self.state_hint})"

    def seeded(self, reply: Any, endpoint: str) -> None:
        """Take the fingerprint, and the server's id and model identity the session was seeded on."""
        super().seeded(reply, endpoint)
        self._server = {"server_id": reply.get("server_id"), "model_sha256": reply.get("model_sha256")}

    def forget_server(self) -> None:
        """Called at every reset before the server answers: capabilities and identity are asked again."""
        self._caps, self._server = None, {}

    # ------------------------------------------------------------------ acting

    def clear_buffer(self) -> None:
        """Empty the client-side chunk buffer (a new rollout)."""
        self._buffer = ChunkCursor()

    def chunked(self, fetch: Callable[[], np.ndarray]) -> np.ndarray:
        """``mode="chunk"``: the chunk ``fetch`` gets; ``mode="step"``: the buffer's next action, refilled from it."""
        if self.mode == "chunk":
            return fetch()
        if self._buffer.empty():
            self._buffer.load(fetch())
        return self._buffer.next()[None].copy()

    # ------------------------------------------------------------------ state

    def _refuse_unless_supported(self) -> None:
        why = self.instance_state_refusal()
        if why is not None:
            raise StateUnsupported(f"policy '{self.name}': {why}")
        if not self._server.get("server_id") or not self._server.get("model_sha256"):
            raise PolicyStateRefused(f"{self.endpoint_name()}: the session was not seeded with its state support "
                                     "(call reset(seed) on a server offering session_state first)", "get_state")

    def get_state(self) -> Dict[str, np.ndarray]:
        """The server's sealed session state, the server's identity and the client-side chunk buffer."""
        self._refuse_unless_supported()
        reply = self.state_request("get_state", {})
        blob = reply.get("blob") if isinstance(reply, dict) else None
        if not isinstance(blob, bytes) or not 0 < len(blob) <= MAX_STATE_BYTES:
            raise PolicyStateRefused(f"{self.endpoint_name()} answered get_state without a state blob of at most "
                                     f"{MAX_STATE_BYTES:,} bytes", "get_state")
        server = {"server_id": reply.get("server_id"), "model_sha256": reply.get("model_sha256")}
        if server != self._server:
            raise PolicyStateRefused(f"{self.endpoint_name()} changed since this rollout's reset (server "
                                     f"{self._server} then, {server} now)", "get_state")
        chunk = self._buffer.chunk if len(self._buffer.chunk) else np.zeros((0, 0))
        return {"remote.blob": np.frombuffer(blob, dtype=np.uint8).copy(),
                "remote.server": _text(json.dumps(server, sort_keys=True)),
                "buffer.actions": np.array(chunk, dtype=np.float64),
                "buffer.index": np.array(self._buffer.index, dtype=np.int64)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a :meth:`get_state` state into this (reset) session; another server or model is refused."""
        self._refuse_unless_supported()
        if set(state) != STATE_KEYS:
            raise PolicyStateRefused(f"not a state of a served policy: keys {sorted(state)[:8]}, expected "
                                     f"{sorted(STATE_KEYS)}", "set_state")
        blob_array = np.asarray(state["remote.blob"])
        if blob_array.dtype != np.uint8 or blob_array.ndim != 1 or not 0 < blob_array.size <= MAX_STATE_BYTES:
            raise PolicyStateRefused(f"the state blob must be 1 to {MAX_STATE_BYTES:,} bytes (uint8)", "set_state")
        try:
            recorded = json.loads(np.asarray(state["remote.server"], dtype=np.uint8).tobytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise PolicyStateRefused("the state's server identity is not JSON", "set_state") from None
        if not isinstance(recorded, dict):
            raise PolicyStateRefused("the state's server identity is not a JSON object", "set_state")
        if recorded.get("model_sha256") != self._server["model_sha256"]:
            raise PolicyStateRefused(
                f"the model identity of {self.endpoint_name()} changed between trunk and branch: the state was "
                f"taken with model {recorded.get('model_sha256')}, the server now serves "
                f"{self._server['model_sha256']}; a branch must run the trunk's model", "set_state")
        if recorded.get("server_id") != self._server["server_id"]:
            raise PolicyStateRefused(
                f"the fingerprint of {self.endpoint_name()} changed between trunk and branch: the state was taken "
                f"on server {recorded.get('server_id')}, this one is {self._server['server_id']} (another server, or "
                "one restarted without --state-key-file); its generator states cannot be vouched for", "set_state")
        actions = self._checked_buffer(state["buffer.actions"], state["buffer.index"])
        index = np.asarray(state["buffer.index"])
        reply = self.state_request("set_state", {"blob": blob_array.tobytes()})
        fingerprint = reply.get("rng_fingerprint") if isinstance(reply, dict) else None
        if not isinstance(fingerprint, str):
            raise PolicyStateRefused(f"{self.endpoint_name()} answered set_state without a fingerprint", "set_state")
        self._fingerprint = fingerprint
        self._buffer = ChunkCursor()
        if len(actions):
            self._buffer.load(actions.copy())
            self._buffer.index = int(index)

    def _checked_buffer(self, actions: Any, index: Any) -> np.ndarray:
        """The restored client-side chunk buffer, checked exactly as a server's chunk is (``checked_chunk``):
        the buffer is outside the seal, so a forged one must not reach the simulator either."""
        actions, index = np.asarray(actions), np.asarray(index)
        if actions.dtype != np.float64 or actions.ndim != 2 or index.dtype != np.int64 or index.shape != ():
            raise PolicyStateRefused("the state's chunk buffer is malformed (float64 (T, A) actions and an int64 "
                                     "index expected)", "set_state")
        if actions.size == 0 and int(index) == 0:
            return np.zeros((0, 0))
        try:
            actions = checked_chunk(actions, self.action_dim(), "buffer.actions")
        except ActionFormatError as exc:
            raise PolicyStateRefused(f"the state's chunk buffer is refused: {exc}", "set_state") from None
        if not 0 <= int(index) <= len(actions):
            raise PolicyStateRefused(f"the state's buffer index {int(index)} is outside its {len(actions)} actions",
                                     "set_state")
        return actions

    def action_dim(self) -> int:
        """The length of the actions ``act`` returns (the buffer's width)."""
        raise NotImplementedError

    def sample_actions(self, obs: Observation, n: int, rng: np.random.Generator) -> Optional[np.ndarray]:
        """``n`` draws of the first action of a chunk planned now, by the server from seeds drawn from ``rng``;
        None when the server offers no ``sample``."""
        if self.capabilities().get(SAMPLE) is not True:
            return None
        payload = self.payload(obs)
        draws = []
        while len(draws) < n:
            count = min(MAX_SAMPLES, n - len(draws))
            reply = self.state_request("sample", {"obs": payload, "n": count, "seed": int(rng.integers(0, 2**63))})
            samples = reply.get("samples") if isinstance(reply, dict) else None
            if not isinstance(samples, list) or len(samples) != count:
                raise PolicyServerError(f"{self.endpoint_name()} answered sample without {count} samples", "sample")
            draws += [self.actions_of(s)[0] for s in samples]
        return np.array(draws, dtype=np.float64)




class ServedPolicy(StatefulRemotePolicy):
    """A policy behind a ``served.connection.Connection``: a protocol writes its payload and its reply parsing.

    Subclasses call :meth:`open` in their constructor with their connection, and write :meth:`payload`
    (observation -> request), :meth:`actions_of` (reply -> (k, action_dim) chunk, through
    ``model_io.checked_chunk``) and :meth:`action_dim`. The rest is here: seeding when the server's metadata
    advertises ``seeded_reset`` (``{"__reset__": {"seed", "owner"}}`` answered with a fingerprint), else one
    warning and an ``unseeded-server`` fingerprint; session state and samples when it advertises
    ``session_state`` and ``sample``; the client-side chunk buffer (``mode``); deadlines, bounded decoding,
    reconnects at reset and the circuit breaker of the connection (``client``); an identity with the
    metadata's hash.
    """

    client: Any = None

    def open(self, client: Any, mode: str = "chunk", state_secret: Any = None, api_token: Any = None) -> None:
        """Connect (the server's metadata is read now) and set the mode and the state owner."""
        self.init_session_state(mode, state_secret, api_token)
        self.client = client
        client.connect()

    def reset(self, seed: int) -> None:
        """Reconnect after a failure, then seed this session on the server, or warn once that it takes no seed."""
        self.clear_buffer()
        self.forget_server()
        if self.client.closed:
            self.client.reconnect()
        if self.capabilities().get(SEEDED_RESET) is not True:
            self.unseeded(f"{self.endpoint_name()} takes no seed (no '{SEEDED_RESET}' in its metadata): paired "
                          "rollouts cannot be guaranteed on the policy side")
            return
        self.seeded(self.client.reset_seed(seed, self._owner), self.client.uri)

    def act(self, obs: Observation) -> np.ndarray:
        return self.chunked(lambda: self.actions_of(self.client.exchange(self.payload(obs), "act")))

    def fetch_capabilities(self) -> Mapping[str, Any]:
        return self.client.capabilities()

    def state_request(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        return self.client.state_call(op, data)

    def endpoint_name(self) -> str:
        return f"{self.client.what} at {self.client.uri}"

    def identity(self) -> Dict[str, Any]:
        from robocasa_shift.policies.served.connection import content_hash

        return {"name": self.name, "endpoint": self.client.uri,
                "server_metadata_sha256": content_hash(self.client.metadata),
                **({"mode": self.mode} if self.mode != "chunk" else {})}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


__all__ = ["MODES", "PolicyStateRefused", "RemotePolicy", "ServedPolicy", "StatefulRemotePolicy", "UNSEEDED"]
