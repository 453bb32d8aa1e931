"""The policy protocol: ``reset(seed)``, ``act(observation) -> action chunk``, an RNG fingerprint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift.seeding import rng_state_hash

DETERMINISTIC = "deterministic"


@dataclass
class Observation:
    """What a policy receives at one decision point.

    Attributes:
        images: camera name -> uint8 (H, W, 3), top row first, after any
            observation-side perturbation.
        camera_roles: camera name -> "third_person" | "wrist".
        proprio: the robot's own sensing (robosuite names; quaternions x, y, z, w).
        instruction: the task's language instruction (what a language-conditioned
            model is given; an instruction never identifies the task).
        step: control steps taken so far in the rollout.
        privileged: object poses from the simulator, only for policies that
            declare ``privileged = True`` (the scripted ``expert``).
        task: the backend's name of the task being run (e.g. ``"Lift"``); policies
            that act per task (``expert``, ``reference``) read it instead of guessing
            the task from the instruction or the scene. Keyword-only, so a
            positional construction written before it existed fails loudly.
    """

    images: Dict[str, np.ndarray]
    camera_roles: Dict[str, str]
    proprio: Dict[str, np.ndarray]
    instruction: str
    step: int
    privileged: Optional[Dict[str, np.ndarray]] = None
    task: str = field(kw_only=True)


class Policy:
    """Base class for policies; subclasses override ``act`` and, if stochastic, ``reset``.

    Class attributes declare what the harness must render: ``camera_roles``
    (subset of "third_person", "wrist"), ``image_size`` (square, pixels) and
    whether the policy reads privileged simulator state.
    """

    name = "policy"
    camera_roles: Sequence[str] = ()
    image_size: int = 128
    privileged = False
    deterministic = True

    def reset(self, seed: int) -> None:
        """Seed every generator of the policy; called at the start of each rollout."""

    def act(self, obs: Observation) -> np.ndarray:
        """Return an action chunk of shape (k, action_dim), executed open loop before the next observation."""
        raise NotImplementedError

    def rng_fingerprint(self) -> str:
        """Hash of the policy's generator states, read back from the generators."""
        return DETERMINISTIC

    @classmethod
    def act_batch(cls, policies: Sequence["Policy"], observations: Sequence[Observation]) -> List[np.ndarray]:
        """One decision for several rollouts, each policy instance with its own generators.

        The default asks each instance in turn. A policy with a real per-call cost (a network, a
        server round trip) overrides it to serve the whole batch in one call; its outputs should
        not depend on the batch's composition, or records will depend on ``--batch``.
        """
        return [p.act(o) for p, o in zip(policies, observations)]

    def identity(self) -> Dict[str, Any]:
        """What identifies this policy in a manifest (name, version, weights hash, ...)."""
        return {"name": self.name}

    def close(self) -> None:
        """Release what the policy holds (a server connection, a process); the default holds nothing."""


class NumpySeededPolicy(Policy):
    """A policy whose randomness is one numpy Generator seeded only by ``reset``."""

    deterministic = False

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def reset(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def rng_fingerprint(self) -> str:
        return rng_state_hash(self.rng.bit_generator.state)


def act_batch(policies: Sequence[Policy], observations: Sequence[Observation]) -> List[np.ndarray]:
    """Dispatch a batch to its policy class's ``act_batch`` (one class per batch)."""
    kinds = {type(p) for p in policies}
    if len(kinds) != 1:
        raise ValueError(f"a batch holds one policy class, got {sorted(k.__name__ for k in kinds)}")
    return kinds.pop().act_batch(policies, observations)


@dataclass
class ChunkCursor:
    """Steps through an action chunk; empty means the policy must be queried."""

    chunk: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    index: int = 0

    def empty(self) -> bool:
        """True when every action of the chunk has been taken."""
        return self.index >= len(self.chunk)

    def load(self, chunk: np.ndarray) -> None:
        """Start on a new chunk of shape (k, action_dim) (one action may come as (action_dim,)).

        Raises:
            ValueError: an empty chunk or one of another shape.
        """
        chunk = np.asarray(chunk, dtype=np.float64)
        if chunk.ndim == 1:
            chunk = chunk[None]
        if chunk.ndim != 2 or len(chunk) == 0:
            raise ValueError(f"a policy must return an action chunk of shape (k, action_dim), got {chunk.shape}")
        self.chunk, self.index = chunk, 0

    def next(self) -> np.ndarray:
        """The chunk's next action."""
        action = self.chunk[self.index]
        self.index += 1
        return action
