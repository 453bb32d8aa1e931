"""The policy protocol: ``reset(seed)``, ``act(observation) -> action chunk``, an RNG fingerprint,
and ``get_state`` / ``set_state`` for branching."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from robocasa_shift.embodiments import ActionLayout
from robocasa_shift.errors import StateUnsupported
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
        action_layout: the embodiment's action layout (PandaOmron's 12-D when None):
            what a generic policy (``random``) builds its actions in.
    """

    images: Dict[str, np.ndarray]
    camera_roles: Dict[str, str]
    proprio: Dict[str, np.ndarray]
    instruction: str
    step: int
    privileged: Optional[Dict[str, np.ndarray]] = None
    task: str = field(kw_only=True)
    action_layout: Optional[ActionLayout] = field(default=None, kw_only=True)


class Policy:
    """Base class for policies; subclasses override ``act`` and, if stochastic, ``reset``.

    Class attributes declare what the harness must render: ``camera_roles``
    (subset of "third_person", "wrist"), ``image_size`` (square, pixels) and
    whether the policy reads privileged simulator state. ``state_refusal``, when
    set, says why the class cannot snapshot its state (see :func:`state_support`).
    ``requires`` names the optional modules it imports, each with the extra that
    installs it (``("torch", "policy")``): a command checks them before it starts.
    """

    name = "policy"
    camera_roles: Sequence[str] = ()
    image_size: int = 128
    privileged = False
    deterministic = True
    state_refusal: Optional[str] = None
    requires: Sequence[Tuple[str, str]] = ()

    @classmethod
    def fixed_action_dim(cls, options: Mapping[str, Any]) -> Optional[int]:
        """The length of the actions the policy built with ``options`` makes, when it is fixed before any
        observation (a served policy's action layout); None when it follows the environment's embodiment.
        A study refuses a policy whose actions do not fit its backend's before anything runs."""
        return None

    def reset(self, seed: int) -> None:
        """Seed every generator of the policy; called at the start of each rollout."""

    def get_state(self) -> Dict[str, np.ndarray]:
        """Everything a continuation depends on beyond what ``reset(seed)`` sets up, for branching.

        That is every generator's state and all internal state carried between ``act`` calls
        (phase counters, memo dicts, estimates, action queues, observation history). The snapshot
        is written to an ``.npz`` file and read back in another process without pickle, so:
        keys are plain strings (dotted names: ``"rng"``, ``"memo.grasp_at"``, ``"estimates.third.cube"``,
        one key per entry of a dict, see :func:`pack_arrays`); values are numpy arrays of a numeric
        or uint8 dtype, never object; an int counter is a 0-d int64 array; a numpy Generator's state
        is :func:`numpy_rng_state`; a torch Generator's is ``generator.get_state().numpy().copy()``.

        Raises:
            StateUnsupported: the policy does not implement it (the base class); it cannot be branched.
        """
        raise StateUnsupported(_refusal(self))

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a :meth:`get_state` snapshot; called after ``reset(seed)`` with the snapshotted rollout's seed.

        Afterwards every ``act`` returns, bit for bit, what the snapshotted instance returned from
        that point on. Arrays are copied (no reference into ``state`` is kept), and dict-like state
        is rebuilt exactly: an entry absent from ``state`` is absent after the restore.

        Raises:
            StateUnsupported: the policy does not implement it (the base class); it cannot be branched.
        """
        raise StateUnsupported(_refusal(self))

    def act(self, obs: Observation) -> np.ndarray:
        """Return an action chunk of shape (k, action_dim), executed open loop before the next observation."""
        raise NotImplementedError

    def rng_fingerprint(self) -> str:
        """Hash of the policy's generator states, read back from the generators."""
        return DETERMINISTIC

    def instance_state_refusal(self) -> Optional[str]:
        """Why this instance cannot snapshot its state (None: it can, when its class implements both calls).

        The class's ``state_refusal`` by default. A policy whose support depends on what it is connected
        to (a policy server that may or may not offer state calls) overrides it and answers for its server.
        """
        return type(self).state_refusal

    def sample_actions(self, obs: Observation, n: int, rng: np.random.Generator) -> Optional[np.ndarray]:
        """``n`` extra draws of the decision the policy is about to take on ``obs``, (n, action_dim) actions.

        What sampling-disagreement monitors read (step logs, at every boundary, before ``act``).
        The draws' randomness comes from ``rng`` only, and the policy's state (generators
        included) is left exactly as it was, so logging never changes a rollout. The default
        offers none (None).
        """
        return None

    def features(self, obs: Observation) -> Optional[np.ndarray]:
        """The policy's internal representation of ``obs`` (optional), a 1-D float array of fixed length.

        What hidden-state monitors read (SAFE-style probes; ``monitoring/probe.py``): step logs
        record it at every boundary, before ``act``, as ``features``. The vector has the same
        length for every observation of every task a policy instance serves (a probe is trained
        across tasks), and computing it draws no randomness and changes no state, so logging it
        never changes a rollout. The default offers none (None); ``reference`` returns its
        networks' layers (:meth:`feature_blocks` names them).
        """
        return None

    def feature_blocks(self) -> Optional[List[Tuple[str, int]]]:
        """The named feature sets that :meth:`features` concatenates, in order: ``[(name, width), ...]``.

        The widths sum to the length of ``features()``; step logs record them (meta ``feature_blocks``),
        and the feature-set analyses of the monitors study (incremental value, fusion, CKA, UMAP) compare
        the sets. List them from the input side to the output side: the last is the base that the
        others are added to (the layer a SAFE-style head reads). The default: None, one unnamed set.
        """
        return None

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

    def get_state(self) -> Dict[str, np.ndarray]:
        return {"rng": numpy_rng_state(self.rng)}

    def set_state(self, state: Mapping[str, np.ndarray]) -> None:
        set_numpy_rng_state(self.rng, state["rng"])


def _declared_refusal(policy: Union[Policy, type]) -> Optional[str]:
    """The class's ``state_refusal`` for a class; the instance's own answer for an instance.

    A duck-typed policy (a plain class with ``act``/``reset``, not a :class:`Policy`) declares nothing.
    """
    if isinstance(policy, type):
        return getattr(policy, "state_refusal", None)
    ask = getattr(policy, "instance_state_refusal", None)
    return ask() if ask is not None else getattr(type(policy), "state_refusal", None)


def _refusal(policy: Union[Policy, type], why: Optional[str] = None) -> str:
    why = why or _declared_refusal(policy) or "it does not implement get_state/set_state, so it cannot be branched"
    return f"policy '{policy.name}': {why}"


def state_support(policy: Union[Policy, type]) -> Optional[str]:
    """None when ``policy`` (an instance or a class) can be snapshotted for branching, else why not.

    It can when its class overrides both ``get_state`` and ``set_state`` and no refusal is declared:
    for a class its ``state_refusal`` (a class attribute that names a precise reason, e.g. the
    generators live on a policy server; it wins over any override), for an instance
    :meth:`Policy.instance_state_refusal` (a remote policy answers for the server it is connected
    to: a server that offers state calls can be branched). The reason is the text
    :class:`StateUnsupported` carries, so branching can refuse before a rollout starts.
    """
    cls = policy if isinstance(policy, type) else type(policy)
    why = _declared_refusal(policy)
    get_state, set_state = getattr(cls, "get_state", None), getattr(cls, "set_state", None)
    if why is None and get_state not in (None, Policy.get_state) and set_state not in (None, Policy.set_state):
        return None
    return _refusal(policy, why)


def numpy_rng_state(gen: np.random.Generator) -> np.ndarray:
    """A numpy Generator's state as UTF-8 JSON in a uint8 array: fits an ``.npz`` and loads without pickle."""
    return np.frombuffer(json.dumps(gen.bit_generator.state).encode("utf-8"), dtype=np.uint8).copy()


def set_numpy_rng_state(gen: np.random.Generator, array: np.ndarray) -> None:
    """Restore a state written by :func:`numpy_rng_state` into ``gen`` (same bit generator kind)."""
    gen.bit_generator.state = json.loads(np.asarray(array, dtype=np.uint8).tobytes().decode("utf-8"))


def pack_arrays(prefix: str, arrays: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """A dict of arrays as snapshot entries ``"<prefix>.<key>"`` (copies, dtypes kept)."""
    return {f"{prefix}.{k}": np.array(v) for k, v in arrays.items()}


def unpack_arrays(prefix: str, state: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The dict :func:`pack_arrays` wrote under ``prefix``, rebuilt with copies (only the keys present)."""
    head = prefix + "."
    return {k[len(head):]: np.array(v) for k, v in state.items() if k.startswith(head)}


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
