"""Stand-in models for the served policies, acting in the fake backend's world (for loopback branch studies).

Each one wraps the ``fake`` policy's image-driven decision (it finds the red object, and the green
target, in the third-person image and moves the gripper there with Gaussian action noise), made
stateless: a fresh decision per call, so all a session holds is its generator, and the noise comes
from the generator the server manages, as the real models' does:

- ``Gr00tFakeModel``: GR00T's model interface (``get_action``, ``get_modality_config``); its noise
  seed is drawn with ``torch.randint`` from torch's GLOBAL generator, as N1.5's flow-matching head
  draws its noise (the launcher installs the session's generator around each call);
  ``make_gr00t_model`` is the launcher's ``--model-factory``.
- ``OpenpiFakePolicy``: openpi's ``Policy`` interface (``infer``, ``metadata``) with a PRNG key in
  ``_rng`` split at every ``infer`` as openpi's JAX ``Policy`` does (raw uint32 key data here, split by
  hashing: jax is not installed in the test venvs); ``make_openpi_policy`` is the shim's factory.

``GR00T_OPTIONS`` / ``OPENPI_OPTIONS``: the client options that fit the fake world (cameras, 4-D
state, 3-D planar actions).
"""

import hashlib
import json

import numpy as np

from robocasa_shift.core.policy import Observation
from robocasa_shift.policies.scripted.fake import FakePolicy

CHUNK = 4
INSTRUCTION_TASKS = {"put the red object on the green target": "PickPlace"}


def decide(image, eef, grasping, instruction, rng, chunk=CHUNK):
    """The fake policy's decision on one observation, with noise from ``rng``: a (chunk, 3) planar chunk."""
    policy = FakePolicy()
    policy.chunk = chunk
    obs = Observation({"agentview": np.asarray(image, dtype=np.uint8)}, {"agentview": "third_person"},
                      {"eef_pos": np.asarray(eef, dtype=np.float64), "grasping": np.array([float(grasping)])},
                      str(instruction), 0, task=INSTRUCTION_TASKS.get(str(instruction), "Reach"))
    return policy._decide(obs, rng)


# --------------------------------------------------------------------------- GR00T


class ModalityConfig:
    """Mimics gr00t.data.dataset.ModalityConfig (a pydantic model) for the encoder."""

    def __init__(self, delta_indices, modality_keys):
        self.delta_indices, self.modality_keys = delta_indices, modality_keys

    def model_dump_json(self):
        return json.dumps({"delta_indices": self.delta_indices, "modality_keys": self.modality_keys})


class Gr00tFakeModel:
    """GR00T's model interface in the fake world; noise from torch's global generator."""

    def __init__(self, name="gr00t-fake"):
        self.name = name

    def get_modality_config(self):
        return {"video": ModalityConfig([0], ["video.agentview"]),
                "action": ModalityConfig(list(range(CHUNK)), ["action.planar", "action.gripper"]),
                "name": self.name}

    def get_action(self, obs):
        import torch

        seed = int(torch.randint(0, 2**62, (1,)).item())  # the global RNG, as N1.5's flow-matching head
        chunk = decide(obs["video.agentview"][0], obs["state.eef"][0], obs["state.grasping"][0, 0],
                       obs["annotation.human.task_description"][0], np.random.default_rng(seed))
        return {"action.planar": chunk[:, :2].astype(np.float32), "action.gripper": chunk[:, 2].astype(np.float32)}


def make_gr00t_model(name="gr00t-fake"):
    """The launcher's factory: ``serve --model-factory served_standins:make_gr00t_model``."""
    return Gr00tFakeModel(name)


GR00T_OPTIONS = {
    "camera_map": {"agentview": ["video.agentview"]},
    "state_map": {"state.eef": ["eef_pos", 2], "state.grasping": ["grasping", 1]},
    "action_map": [{"key": "action.planar", "dim": 2, "targets": [0, 1]},
                   {"key": "action.gripper", "dim": 1, "targets": [2]}],
    "chunk_size": CHUNK, "n_action_steps": CHUNK, "image_size": 64,
}


# --------------------------------------------------------------------------- openpi


def split_key(key):
    """A stand-in for ``jax.random.split(key)``: two new uint32[2] keys from a hash of ``key``."""
    words = np.frombuffer(hashlib.sha256(np.asarray(key, dtype=np.uint32).tobytes()).digest()[:16], dtype=np.uint32)
    return words[:2].copy(), words[2:].copy()


class OpenpiFakePolicy:
    """openpi's Policy interface in the fake world: ``_rng`` is split at every ``infer``, as in openpi's JAX Policy."""

    def __init__(self, name="openpi-fake"):
        self._rng = np.array([0, 0], dtype=np.uint32)
        self.metadata = {"name": name, "action_horizon": CHUNK}

    def infer(self, obs):
        self._rng, sample_key = split_key(self._rng)
        rng = np.random.default_rng(int.from_bytes(sample_key.tobytes(), "little"))
        state = np.asarray(obs["observation/state"], dtype=np.float64)
        chunk = decide(obs["observation/image"], state[:2], state[2], obs["prompt"], rng)
        return {"actions": chunk.astype(np.float32), "state": state}


def make_openpi_policy(name="openpi-fake"):
    """The shim's factory: ``--policy-factory served_standins:make_openpi_policy``."""
    return OpenpiFakePolicy(name)


OPENPI_OPTIONS = {
    "camera_map": {"agentview": ["observation/image"]},
    "state_layout": [["eef_pos", 2], ["grasping", 1]],
    "action_layout": "fake-planar",
    "n_action_steps": CHUNK, "image_size": 64,
}
