"""A SAFE-style sequence head: a small recurrent network over the policy's per-boundary features, beside the
linear probe (``monitoring/probe.py``).

SAFE, and RESCUE's "SAFE-style LSTM", read a policy's hidden features step by step with a recurrent head.
Here:

- **input**: the feature vector of each boundary (``Policy.features``, logged by ``--log-steps``),
  standardised with the training rollouts' mean and SD;
- **model**: one GRU layer of :data:`HIDDEN` units and a linear read-out; the score at boundary ``i`` is
  the failure logit after boundaries 0..i (causal: it reads only the log up to the boundary, so an alarm
  could have been raised online);
- **training**: the probe's rows, rollouts and weights (:func:`probe.training_rollouts`: the clean
  validation rollouts, or every condition's when those lack an outcome; every boundary labelled with its
  rollout's outcome, each rollout and each outcome weighing the same), full-batch Adam for
  :data:`EPOCHS` steps with weight decay;
- **determinism**: the initial weights come from ``seed`` (the study seed's ``sequence_head`` stream),
  and training runs on one thread, so a seed gives the same scores bit for bit; the global torch
  generator is left as it was.

CPU only, seconds on a study's features; torch comes with the ``policy`` extra.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift import seeding
from robocasa_shift.errors import AnalysisError
from robocasa_shift.extras import require
from robocasa_shift.monitoring import probe as probes

SEQUENCE_HEAD = "sequence_head"
HIDDEN = 16
EPOCHS = 100
LEARNING_RATE = 0.01
WEIGHT_DECAY = 0.1  # strong: a study trains on tens of rollouts, which a GRU memorises otherwise


def _torch():
    return require("torch", "policy", "the sequence head of the monitors study")


@contextlib.contextmanager
def _one_thread(torch) -> Iterator[None]:
    """One intra-op thread (a thread count can change the last bits of a sum), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _model(torch, width: int, hidden: int):
    return torch.nn.ModuleDict({"gru": torch.nn.GRU(width, hidden, batch_first=True),
                                "out": torch.nn.Linear(hidden, 1)})


@dataclass
class SequenceHead:
    """A fitted head: the standardisation, the network's weights and what it learned from."""

    mean: np.ndarray
    scale: np.ndarray
    state: Dict[str, np.ndarray]
    hidden: int
    n_rollouts: int
    n_failures: int

    def boundary_scores(self, features: np.ndarray) -> np.ndarray:
        """The failure logit after each boundary of one rollout, (boundaries, F) -> (boundaries,)."""
        torch = _torch()
        model = _model(torch, len(self.mean), self.hidden)
        model.load_state_dict({k: torch.from_numpy(v) for k, v in self.state.items()})
        x = ((np.asarray(features, dtype=np.float64) - self.mean) / self.scale).astype(np.float32)
        with _one_thread(torch), torch.no_grad():
            out, _ = model["gru"](torch.from_numpy(x)[None])
            return model["out"](out)[0, :, 0].numpy().astype(np.float64)


def fit(features: Sequence[np.ndarray], failed: Sequence[bool], seed: int, hidden: int = HIDDEN,
        epochs: int = EPOCHS) -> SequenceHead:
    """Fit the head on rollouts: ``features[i]`` is rollout i's (boundaries, F) array, ``failed[i]`` its label.

    Raises:
        AnalysisError: as :func:`probe.fit` (no rollout of one outcome, arrays of different widths, a rollout
            without boundaries).
    """
    torch = _torch()
    features = [np.asarray(f, dtype=np.float64) for f in features]
    failed = np.asarray(failed, dtype=bool)
    probes.check_training_set(features, failed)
    x = np.concatenate(features)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    longest, width = max(len(f) for f in features), x.shape[1]
    padded = np.zeros((len(features), longest, width), dtype=np.float32)
    weights = np.zeros((len(features), longest))
    for i, f in enumerate(features):
        padded[i, : len(f)] = (f - mean) / scale
        weights[i, : len(f)] = 1.0 / len(f)  # each rollout weighs the same; padding (after its end) nothing
    for label in (False, True):  # each outcome weighs one half
        weights[failed == label] *= 0.5 / weights[failed == label].sum()
    labels = np.repeat(failed[:, None].astype(np.float32), longest, axis=1)
    with _one_thread(torch), torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed) % (2**63))
        model = _model(torch, width, hidden)
        optimiser = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
        x_t, y_t, w_t = torch.from_numpy(padded), torch.from_numpy(labels), torch.from_numpy(weights.astype(np.float32))
        for _ in range(int(epochs)):
            optimiser.zero_grad()
            out, _ = model["gru"](x_t)
            loss = (w_t * torch.nn.functional.binary_cross_entropy_with_logits(
                model["out"](out)[..., 0], y_t, reduction="none")).sum()
            loss.backward()
            optimiser.step()
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    return SequenceHead(mean=mean, scale=scale, state=state, hidden=int(hidden), n_rollouts=len(features),
                        n_failures=int(failed.sum()))


def _fit_on(logs: probes.FeatureLogs, ids: Sequence[str], seed: int, columns: Optional[np.ndarray] = None
            ) -> SequenceHead:
    labels = ~logs.rollouts.set_index("rollout_id").loc[list(ids), "success"].to_numpy(dtype=bool)
    return fit([logs.features[r] if columns is None else logs.features[r][:, columns] for r in ids], labels, seed)


def head_seed(study_seed: int, **names: Any) -> int:
    """The head's initial-weights seed: the study seed's ``sequence_head`` stream (and ``names``)."""
    return seeding.derive_seed(study_seed, stream=SEQUENCE_HEAD, **names)


def head_scores(logs: probes.FeatureLogs, splits, study_seed: int) -> Tuple[pd.DataFrame, Dict[str, Any]]:
    """The head's boundary scores on every rollout (fitted once on :func:`probe.training_rollouts`), and what it
    learned from."""
    ids, kind = probes.training_rollouts(logs, splits)
    head = _fit_on(logs, ids, head_seed(study_seed))
    info = {"name": SEQUENCE_HEAD, "trained_on": kind, "n_training_rollouts": head.n_rollouts,
            "n_training_failures": head.n_failures, "feature_width": int(len(head.mean)), "hidden": head.hidden,
            "epochs": EPOCHS, "seed_stream": SEQUENCE_HEAD,
            "score": "the GRU's failure logit after the boundaries so far"}
    return probes.score_table(logs, head), info


def loto_scores(logs: probes.FeatureLogs, splits, study_seed: int) -> Dict[str, pd.DataFrame]:
    """Leave one task out, as for the probe: per task, the head fitted without that task's rollouts and scored on
    that task's rollouts; a task whose other tasks cannot train a head (one outcome only) is left out."""
    out = {}
    for task in sorted(logs.rollouts["task"].unique().tolist()):
        ids, _ = probes.training_rollouts(logs, splits, exclude_task=task)
        try:
            head = _fit_on(logs, ids, head_seed(study_seed, held_out=task))
        except AnalysisError:
            continue
        mine = logs.rollouts.loc[logs.rollouts["task"] == task, "rollout_id"].tolist()
        out[task] = probes.score_table(logs, head, mine)
    return out


__all__ = ["EPOCHS", "HIDDEN", "SEQUENCE_HEAD", "SequenceHead", "fit", "head_scores", "head_seed", "loto_scores"]
