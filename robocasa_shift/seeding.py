"""Every seed of a study is one function of the frozen study seed and named inputs.

Seeds never depend on the order in which tasks, episodes or workers run:
``derive_seed(study_seed, stream="env", task="Lift", phase="formal", episode=3)``
is the same in any process. Streams:

- ``env``: the simulator reset (object placement, robot joint noise) of a base episode;
- ``policy``: the policy's generators for one replicate of a base episode;
- ``camera`` / ``base``: the factor's random draw for a base episode, shared by its levels.
"""

from __future__ import annotations

import hashlib
from typing import Union

import numpy as np

# Seed streams of base episodes. ``judge-training``: the episodes the built-in success judge learns from,
# never screened, calibrated or evaluated. ``confirmation``: the held-out base episodes a severity sweep's curve
# is checked on, disjoint from the formal episodes it was drawn from.
PHASES = ("screening", "formal", "validation", "judge-training", "confirmation")


def _word(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def derive_seed(study_seed: int, **names: Union[str, int]) -> int:
    """A 63-bit seed from the study seed and named inputs (order of keywords matters not)."""
    key = tuple(_word(f"{k}={names[k]}") for k in sorted(names))
    state = np.random.SeedSequence(entropy=int(study_seed), spawn_key=key).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def env_seed(study_seed: int, task: str, phase: str, episode: int) -> int:
    return derive_seed(study_seed, stream="env", task=task, phase=phase, episode=episode)


def policy_seed(study_seed: int, task: str, phase: str, episode: int, replicate: int = 0) -> int:
    return derive_seed(study_seed, stream="policy", task=task, phase=phase, episode=episode, replicate=replicate)


def samples_seed(study_seed: int, task: str, phase: str, episode: int, replicate: int = 0) -> int:
    """The seed of a rollout's monitor samples (step logs): its own stream, so sampling never
    touches the policy's generators; shared by the conditions of a pair, like the policy seed."""
    return derive_seed(study_seed, stream="samples", task=task, phase=phase, episode=episode, replicate=replicate)


def draw_rng(study_seed: int, factor: str, task: str, phase: str, episode: int) -> np.random.Generator:
    """The generator of a factor's draws for one base episode: one stream, reused by every level."""
    return np.random.default_rng(derive_seed(study_seed, stream=factor, task=task, phase=phase, episode=episode))


def rng_state_hash(*states: object) -> str:
    """Hash of generator states read back from the generators themselves."""
    h = hashlib.sha256()
    for state in states:
        if isinstance(state, np.ndarray):
            h.update(state.tobytes())
        else:
            h.update(repr(state).encode())
    return h.hexdigest()
