"""``Gr00tPolicy``: GR00T N1.5 behind a ZeroMQ server, as a harness policy.

Each ``reset(seed)`` seeds this policy's session on a ``Gr00tLauncher``; a
plain N1.5 server has no ``reset`` and is recorded as ``"unseeded-server"``
with one warning (see ``launcher`` for why it cannot be paired). On a launcher,
whose ``ping`` advertises ``session_state`` and ``sample``, the policy can be
branched and sampled (``served.policy``); on a plain server it cannot, and says why.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Dict, Mapping, Optional

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.errors import PolicyServerError
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.mapping import (
    ACTION_LAYOUT,
    DEFAULT_CAMERA_MAP,
    LANGUAGE_KEY,
    STATE_MAP,
    as_action_map,
    as_state_map,
    gr00t_to_actions,
    observation_to_gr00t,
)
from robocasa_shift.policies.gr00t.wire import DEFAULT_PORT
from robocasa_shift.policies.model_io import CameraMapLike, as_camera_map, check_layout_fits, layout_dim
from robocasa_shift.policies.served.connection import canonical, content_hash
from robocasa_shift.policies.served.policy import StatefulRemotePolicy


class Gr00tPolicy(StatefulRemotePolicy):
    """GR00T N1.5 behind a ZeroMQ server; one observation per ``n_action_steps`` control steps.

    Args:
        host, port, timeout_s, retries, serializer, api_token, allow_pickle, curve_server_key: see
            ``Gr00tClient`` ("torch" needs ``allow_pickle=True`` and warns: it unpickles replies).
        camera_map: harness camera -> GR00T video key(s); a dict (or its JSON). Default
            ``DEFAULT_CAMERA_MAP``; unlisted cameras map to ``video.<camera>``.
        chunk_size: the chunk length the server must return (None: any).
        n_action_steps: how many steps of each chunk run before the next observation.
        instruction: replaces the task's instruction.
        language_key: the payload key of the instruction.
        image_size: square render size (RoboCasa's gym wrapper serves 256).
        session: a prefix for the session id; the id is always unique to this policy instance, so
            workers and lockstep slots never share a session (and its seed and retry cache).
        mode: "chunk" (the first ``n_action_steps`` of each chunk at once) or "step" (one action per call
            from a client-side buffer of them; every step is a decision point).
        state_secret: binds this client's session states (branching) to it: a state taken by a client
            with another secret is refused by the launcher (default: the API token, else none).
        state_map: GR00T state key -> [proprio key, dimension] (a dict or its JSON); default ``STATE_MAP``.
        action_map: the reply's action keys -> the embodiment's action: a list of {key, dim, targets,
            binary} (or its JSON); default ``ACTION_LAYOUT`` (PandaOmron's 12-D).
        auth_frame: send the API token in a frame of its own, checked by this harness's launcher before it reads
            the request (needed by a launcher started with ``--auth-frame-only``; GR00T's own servers read
            one frame).
    """

    name = "gr00t"
    camera_roles = ("third_person", "wrist")
    image_size = 256
    deterministic = False
    requires = (("zmq", "gr00t"), ("msgpack", "gr00t"))
    state_hint = "serve the model with `python -m robocasa_shift.policies.gr00t serve` to branch it"

    def __init__(
        self,
        host: str = "localhost",
        port: int = DEFAULT_PORT,
        timeout_s: float = 15.0,
        retries: int = 2,
        serializer: str = "msgpack",
        api_token: Optional[str] = None,
        camera_map: CameraMapLike = None,
        chunk_size: Optional[int] = 16,
        n_action_steps: Optional[int] = 8,
        instruction: Optional[str] = None,
        language_key: str = LANGUAGE_KEY,
        image_size: int = 256,
        session: Optional[str] = None,
        allow_pickle: bool = False,
        curve_server_key: Optional[str] = None,
        mode: str = "chunk",
        state_secret: Optional[str] = None,
        state_map: Any = None,
        action_map: Any = None,
        auth_frame: bool = False,
    ):
        self.init_session_state(mode, state_secret, api_token)
        self.state_map = as_state_map(state_map)
        self.action_map = as_action_map(action_map)
        self.client = Gr00tClient(host, port, timeout_s, retries, serializer, api_token, session,
                                  allow_pickle=allow_pickle, curve_server_key=curve_server_key, auth_frame=auth_frame)
        self.camera_map = as_camera_map(camera_map, DEFAULT_CAMERA_MAP)
        self.chunk_size = None if chunk_size is None else int(chunk_size)
        self.n_action_steps = None if n_action_steps is None else int(n_action_steps)
        if self.chunk_size is not None and self.n_action_steps is not None and self.n_action_steps > self.chunk_size:
            raise ValueError(f"n_action_steps={self.n_action_steps} exceeds chunk_size={self.chunk_size}")
        self.instruction = instruction
        self.language_key = language_key
        self.image_size = int(image_size)
        self._server_info: Optional[Dict[str, Any]] = None

    def reset(self, seed: int) -> None:
        """Seed this client's session on the server (per-session RNG), or warn once that it cannot be seeded."""
        self.clear_buffer()
        self.forget_server()
        try:
            reply = self.client.reset(seed, self._owner)
        except PolicyServerError as exc:
            if not exc.unknown_endpoint:
                raise
            self.unseeded(
                f"the GR00T server at {self.client.endpoint} has no 'reset' endpoint (a plain N1.5 server): "
                "its noise comes from the server's global RNG, so paired rollouts cannot be guaranteed; "
                "serve the model with `python -m robocasa_shift.policies.gr00t serve` to seed it per session"
            )
            return
        self.seeded(reply, self.client.endpoint)

    def payload(self, obs: Observation) -> Dict[str, Any]:
        return observation_to_gr00t(obs, self.camera_map, self.state_map, self.instruction, self.language_key)

    def actions_of(self, reply: Mapping[str, Any]) -> np.ndarray:
        return gr00t_to_actions(reply, self.chunk_size, self.n_action_steps, self.action_map)

    def act(self, obs: Observation) -> np.ndarray:
        check_layout_fits(self.action_map, obs, "action_map")
        return self.chunked(lambda: self.actions_of(self.client.get_action(self.payload(obs))))

    # ------------------------------------------------------------------ session state (served.policy)

    def fetch_capabilities(self) -> Mapping[str, Any]:
        return self.client.capabilities()

    def state_request(self, op: str, data: Dict[str, Any]) -> Dict[str, Any]:
        if op == "get_state":
            return self.client.get_state()
        if op == "set_state":
            return self.client.set_state(data["blob"])
        if op == "sample":
            return self.client.sample(data["obs"], data["n"], data["seed"])
        raise ValueError(f"unknown state request {op!r}")

    def action_dim(self) -> int:
        return layout_dim(self.action_map)

    def endpoint_name(self) -> str:
        return f"the GR00T server at {self.client.endpoint}"

    def server_info(self) -> Dict[str, Any]:
        """The server's modality config hash and its ``model`` field (asked once)."""
        if self._server_info is None:
            config = self.client.get_modality_config()
            model = config.get("model") if isinstance(config, dict) else None
            self._server_info = {"modality_config_sha256": content_hash(config), "model": canonical(model)}
        return self._server_info

    def identity(self) -> Dict[str, Any]:
        return {
            "name": self.name,
            "endpoint": self.client.endpoint,
            "serializer": self.client.serializer.name,
            **self.server_info(),
            "camera_map": {k: list(v) for k, v in sorted(self.camera_map.items())},
            "chunk_size": self.chunk_size,
            "n_action_steps": self.n_action_steps,
            "instruction": self.instruction,
            "language_key": self.language_key,
            "image_size": self.image_size,
            **({"mode": self.mode} if self.mode != "chunk" else {}),
            **({"state_map": {k: list(v) for k, v in self.state_map.items()}} if self.state_map != STATE_MAP else {}),
            **({"action_map": [asdict(s) for s in self.action_map]} if self.action_map != ACTION_LAYOUT else {}),
        }

    def close(self) -> None:
        self.client.close()
