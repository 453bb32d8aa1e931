"""The step logger: an observer that fills a step log (:mod:`robocasa_shift.core.steplog`) while a rollout runs.

Logs never change a rollout: the logger only reads, and sampling restores the
policy's state (tested: records with and without logs are identical).
"""

from __future__ import annotations

from typing import List

import numpy as np

from robocasa_shift import seeding
from robocasa_shift.core.backend import Contacts
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.steplog import CONTACT_COLUMNS, DEFAULT_SAMPLES, StepLog
from robocasa_shift.engine.rollout import Observer


class StepLogger(Observer):
    """Observer that fills a :class:`StepLog` while a rollout runs.

    Args:
        key: the rollout's key (its samples stream is derived from it).
        study_seed: the study seed.
        samples: draws per boundary for policies that offer ``sample_actions`` (0: none).
    """

    def __init__(self, key: RolloutKey, study_seed: int, samples: int = DEFAULT_SAMPLES):
        self.key, self.n_samples = key, int(samples)
        self.rng = np.random.default_rng(seeding.samples_seed(study_seed, key.task, key.phase, key.episode,
                                                              key.replicate))
        self.eef: List[np.ndarray] = []
        self.actions: List[np.ndarray] = []
        self.latched: List[int] = []
        self.boundaries: List[int] = []
        self.samples: List[np.ndarray] = []
        self.features: List[np.ndarray] = []
        self.contacts: List[np.ndarray] = []
        self._count = 0
        self._layout = None
        self._blocks = None  # the policy's named feature sets, read with its first features

    @property
    def started(self) -> bool:
        """The rollout got as far as its first observation's set-up (an invalid one may not have)."""
        return self._layout is not None

    def on_start(self, env) -> None:
        self._layout = env.action_layout
        self.eef.append(np.array(env.eef_pos(), dtype=np.float64))

    def before_act(self, rollout, obs) -> None:
        self.boundaries.append(rollout.step_index)
        draws = rollout.policy.sample_actions(obs, self.n_samples, self.rng) if self.n_samples > 0 else None
        if draws is not None:
            draws = np.asarray(draws, dtype=np.float64)
            self.samples.append(draws[:, list(self._layout.arm_continuous)].astype(np.float32))
        hook = getattr(rollout.policy, "features", None)  # optional: a policy object may predate the contract
        features = hook(obs) if callable(hook) else None
        if features is not None:
            self.features.append(np.asarray(features, dtype=np.float32).reshape(-1))
            if self._blocks is None:
                blocks = getattr(rollout.policy, "feature_blocks", None)
                self._blocks = [[str(n), int(w)] for n, w in (blocks() if callable(blocks) else None) or []]

    def on_step(self, step: int, action: np.ndarray, env, latched: list) -> None:
        self._count += len(latched)
        self.actions.append(np.array(action, dtype=np.float64))
        self.latched.append(self._count)
        self.eef.append(np.array(env.eef_pos(), dtype=np.float64))
        if isinstance(env, Contacts):  # an optional capability: backends that read contacts
            self.contacts.append(np.asarray(env.contact_state(), dtype=np.int64).reshape(len(CONTACT_COLUMNS)))

    def log(self, stage_names: List[str]) -> StepLog:
        """The log of what was observed so far."""
        layout = self._layout
        dim = len(self.actions[0]) if self.actions else (layout.dim if layout else 0)
        sampled = bool(self.samples) and len(self.samples) == len(self.boundaries)
        featured = bool(self.features) and len(self.features) == len(self.boundaries) \
            and len({len(f) for f in self.features}) == 1
        meta = {"key": self.key.to_json(), "stage_names": list(stage_names),
                "arm_dims": list(layout.arm_continuous) if layout else [], "gripper_dim": layout.gripper if layout else 0,
                "samples": self.n_samples if sampled else 0,
                "features": len(self.features[0]) if featured else 0}
        if featured and self._blocks and sum(w for _, w in self._blocks) == len(self.features[0]):
            meta["feature_blocks"] = self._blocks
        return StepLog(meta=meta, eef_pos=np.array(self.eef, dtype=np.float64).reshape(-1, 3),
                       action=np.array(self.actions, dtype=np.float64).reshape(-1, dim),
                       latched=np.array(self.latched, dtype=np.int64), boundary=np.array(self.boundaries, dtype=np.int64),
                       samples=np.stack(self.samples) if sampled else None,
                       features=np.stack(self.features) if featured else None,
                       contacts=np.stack(self.contacts) if self.contacts and len(self.contacts) == len(self.actions)
                       else None)


__all__ = ["StepLogger"]
