"""A hidden-state monitor (SAFE-style): a small probe on the policy's own features, trained on validation
rollouts, scored on test rollouts.

For policies that expose their internal representation (``Policy.features``, recorded by ``--log-steps``
at every action-chunk boundary as the step log's ``features``; ``reference`` gives its networks' keypoint
features), the probe is an L2-regularised logistic regression on the standardised feature vector of a
boundary, predicting whether the rollout fails:

- **training rows**: every boundary of every training rollout, weighted so that each rollout weighs the
  same and the two outcomes weigh the same (a long failure does not outvote a short success);
- **training rollouts**: the clean validation rollouts (the ones thresholds are chosen on); when they
  hold fewer than :data:`MIN_PER_CLASS` failures or successes, the validation rollouts of every
  condition (the summary says which, and why);
- **fit**: Newton's method (iteratively reweighted least squares) on the weighted log-loss plus
  ``l2 / 2 |w|^2`` (the intercept unpenalised): deterministic, no seed;
- **score at boundary i**: the running mean of the probe's logits over boundaries 0..i of the rollout
  (SAFE's cumulative score: it reads only the log up to the boundary, so an alarm could have been raised
  online).

Pure numpy over the logs' arrays; no policy, no simulator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.errors import AnalysisError
from robocasa_shift.analysis import monitor_detection as detection

PROBE = "hidden_state_probe"
L2 = 1.0
MIN_PER_CLASS = 2
NEWTON_STEPS = 50


@dataclass
class Probe:
    """A fitted probe: the standardisation and the logistic weights (``bias``, ``weights``)."""

    mean: np.ndarray
    scale: np.ndarray
    weights: np.ndarray
    bias: float
    n_rollouts: int
    n_failures: int

    def logits(self, features: np.ndarray) -> np.ndarray:
        """The probe's logit (log-odds of failure) of each row of ``features``."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.scale
        return x @ self.weights + self.bias

    def boundary_scores(self, features: np.ndarray) -> np.ndarray:
        """The monitor's score at each boundary of one rollout: the running mean of its logits so far."""
        logits = self.logits(features)
        return np.cumsum(logits) / np.arange(1, len(logits) + 1)


def check_training_set(features: Sequence[np.ndarray], failed: np.ndarray) -> None:
    """Refuse what no head can learn from: no rollout, labels that do not match, one outcome only, feature arrays
    of different widths or without boundaries (AnalysisError)."""
    if len(features) != len(failed) or not len(features):
        raise AnalysisError("the probe needs one label per rollout and at least one rollout")
    if failed.all() or not failed.any():
        raise AnalysisError(f"the probe needs failures and successes to learn from; got {int(failed.sum())} "
                            f"failure(s) of {len(failed)} rollouts")
    widths = {f.shape[1] if f.ndim == 2 else -1 for f in features}
    if len(widths) != 1 or -1 in widths or any(len(f) == 0 for f in features):
        raise AnalysisError(f"feature arrays must be (boundaries, F) of one width, with boundaries; widths {widths}")


def fit(features: Sequence[np.ndarray], failed: Sequence[bool], l2: float = L2) -> Probe:
    """Fit the probe on rollouts: ``features[i]`` is rollout i's (boundaries, F) array, ``failed[i]`` its label.

    Raises:
        AnalysisError: no rollout of one outcome, feature vectors of different lengths, or a rollout
            without boundaries.
    """
    features = [np.asarray(f, dtype=np.float64) for f in features]
    failed = np.asarray(failed, dtype=bool)
    check_training_set(features, failed)
    x = np.concatenate(features)
    y = np.concatenate([np.full(len(f), float(bad)) for f, bad in zip(features, failed)])
    # each rollout weighs 1 / its boundaries; each outcome weighs one half of the total
    w = np.concatenate([np.full(len(f), 1.0 / len(f)) for f in features])
    for label in (0.0, 1.0):
        w[y == label] *= 0.5 / w[y == label].sum()
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    theta = np.zeros(z.shape[1])
    penalty = np.full(z.shape[1], float(l2) / len(features))
    penalty[-1] = 0.0
    for _ in range(NEWTON_STEPS):
        p = 1.0 / (1.0 + np.exp(-(z @ theta)))
        gradient = z.T @ (w * (p - y)) + penalty * theta
        hessian = (z * (w * p * (1 - p))[:, None]).T @ z + np.diag(penalty + 1e-12)
        step = np.linalg.solve(hessian, gradient)
        theta -= step
        if np.abs(step).max() < 1e-10:
            break
    return Probe(mean=mean, scale=scale, weights=theta[:-1], bias=float(theta[-1]), n_rollouts=len(features),
                 n_failures=int(failed.sum()))


@dataclass
class FeatureLogs:
    """Per rollout: its per-rollout columns (``detection.ROLLOUT_COLUMNS``), boundary steps and features; and the
    feature sets the policy named (``Policy.feature_blocks``: ``[(name, width), ...]``; None when the logs name
    none, or name different ones)."""

    rollouts: pd.DataFrame
    steps: Dict[str, np.ndarray]
    features: Dict[str, np.ndarray]
    blocks: Optional[List[Tuple[str, int]]] = None


def training_rollouts(logs: FeatureLogs, splits, exclude_task: Optional[str] = None) -> Tuple[List[str], str]:
    """The rollout ids the probe learns from, and which set they are (``clean validation`` or, with too few of
    one outcome there, ``validation, every condition``); ``exclude_task`` leaves a task out (leave one task out)."""
    table = detection.add_split_column(logs.rollouts, splits)
    table = table[table[detection.SPLIT_COLUMN] == detection.VALIDATION]
    if exclude_task is not None:
        table = table[table["task"] != exclude_task]
    clean = table[table["condition"] == detection.CLEAN]
    failures, successes = int((~clean["success"]).sum()), int(clean["success"].sum())
    if min(failures, successes) >= MIN_PER_CLASS:
        return clean["rollout_id"].tolist(), "clean validation rollouts"
    return table["rollout_id"].tolist(), (f"validation rollouts of every condition (the clean validation rollouts "
                                          f"hold {failures} failure(s) and {successes} success(es); the probe needs "
                                          f"{MIN_PER_CLASS} of each)")


def _fit_on(logs: FeatureLogs, ids: Sequence[str]) -> Probe:
    labels = ~logs.rollouts.set_index("rollout_id").loc[list(ids), "success"].to_numpy(dtype=bool)
    return fit([logs.features[r] for r in ids], labels)


def score_table(logs: FeatureLogs, probe: Probe, ids: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """Boundary scores (``detection.BOUNDARY_COLUMNS``) of the probe on the rollouts ``ids`` (default: all)."""
    info = logs.rollouts.set_index("rollout_id")
    parts = []
    for rid in (ids if ids is not None else info.index.tolist()):
        row = info.loc[rid]
        parts.append(pd.DataFrame({"rollout_id": rid, **{c: row[c] for c in detection.ROLLOUT_COLUMNS[1:]},
                                   "step": logs.steps[rid].astype(int),
                                   "score": probe.boundary_scores(logs.features[rid])}))
    return pd.concat(parts, ignore_index=True)


def probe_scores(logs: FeatureLogs, splits) -> Tuple[pd.DataFrame, Dict[str, Any]]:
    """The probe's boundary scores on every rollout (fitted once on :func:`training_rollouts`), and what it
    learned from."""
    ids, kind = training_rollouts(logs, splits)
    probe = _fit_on(logs, ids)
    info = {"trained_on": kind, "n_training_rollouts": probe.n_rollouts, "n_training_failures": probe.n_failures,
            "feature_width": int(len(probe.weights)), "l2": L2, "score": "running mean of the logits so far"}
    return score_table(logs, probe), info


def loto_scores(logs: FeatureLogs, splits) -> Dict[str, pd.DataFrame]:
    """Leave one task out, as SAFE evaluates transfer: for each task, the probe fitted without that task's
    rollouts and scored on that task's rollouts (task -> its boundary scores). A task whose other tasks
    cannot train a probe (one outcome only) is left out."""
    out = {}
    for task in sorted(logs.rollouts["task"].unique().tolist()):
        ids, _ = training_rollouts(logs, splits, exclude_task=task)
        try:
            probe = _fit_on(logs, ids)
        except AnalysisError:
            continue
        mine = logs.rollouts.loc[logs.rollouts["task"] == task, "rollout_id"].tolist()
        out[task] = score_table(logs, probe, mine)
    return out


def read_feature_logs(run_dir, phase: str = "formal") -> Optional[FeatureLogs]:
    """The features of every valid, replicate-0 rollout of ``phase`` whose step log has them (None when no log has).

    The rollouts are those the monitors study reads (``study.boundary_scores``); a run whose policy offers no
    features has none to read.
    """
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.rundir.store import RunStore

    store = RunStore(run_dir)
    rows, steps, features, blocks = [], {}, {}, set()
    for record in store.records():
        if record.get("phase") != phase or record.get("replicate", 0) != 0 or not record.get("valid"):
            continue
        log = store.step_log(record)
        if log is None or log.features is None or not len(log.boundary):
            continue
        key = RolloutKey.from_record(record)
        rows.append({"rollout_id": key.id, "task": key.task, "episode": key.episode, "condition": key.condition,
                     "success": bool(record["success"]), "steps": int(record["steps"]),
                     "horizon": int(record["horizon"])})
        steps[key.id] = log.boundary.astype(int)
        features[key.id] = np.asarray(log.features, dtype=np.float64)
        blocks.add(tuple((str(n), int(w)) for n, w in log.meta.get("feature_blocks") or []))  # checked when read
    if not rows:
        return None
    named = list(next(iter(blocks))) if len(blocks) == 1 and () not in blocks else None
    return FeatureLogs(pd.DataFrame(rows), steps, features, named)


__all__ = ["FeatureLogs", "L2", "check_training_set", "MIN_PER_CLASS", "PROBE", "Probe", "fit", "loto_scores", "probe_scores",
           "read_feature_logs", "score_table", "training_rollouts"]
