"""The pooled-AUC report's feature-set analyses (Sec. 4) on the sets a policy names (``Policy.feature_blocks``).

A policy lists its feature sets from the input side to the output side; the last is the **base** (the
report's layer 32: the set a SAFE-style head reads). The analyses, each leaving one task out (fitted on the
validation rollouts of the other tasks, :func:`probe.training_rollouts`; evaluated on the held-out task's test
rollouts, every condition), so they need two tasks or more:

- **incremental held-out value** (report Sec. 4.1): does an added set improve unseen-task AUC once the
  base set's score is known? A logistic probe on the base set's rollout-pooled features gives a logit; a
  logistic combiner is fitted on that logit and either the added set's first :data:`PCA_COMPONENTS`
  principal components or :data:`PLS_COMPONENTS` PLS directions that target the base probe's residual
  (outcome minus its probability); per held-out task, combined AUC minus base AUC;
- **time-resolved fusion with a shuffled control** (Sec. 4.2): the sequence head (``monitoring/sequence.py``)
  over time on three inputs of one width, so the three are exactly capacity matched: the base set beside
  zeros, the base set beside the added set, and the base set beside the added set of *another* rollout of
  the same task and partition (a seeded derangement; its boundaries aligned by index, the donor's last one
  repeated past its end): task and progress structure kept, episode alignment broken. The added set is the
  one with the largest mean PCA increment. Per held-out task: fusion minus base, fusion minus shuffled;
- **latent geometry** (Sec. 4.3): linear CKA between every pair of sets, and a 2-D embedding of each set
  coloured by task (UMAP from umap-learn, the ``geometry`` extra; a PCA projection where it is not installed,
  and the summary says so). Descriptive only: geometry is not a detector's performance.

Features are pooled per rollout as the report pools them: the mean over the boundaries of the early window
(per task, up to the shortest clean validation success; at least the first boundary). Each contrast is
summarised over held-out tasks: the mean, a t-interval over tasks (none below 3 tasks), the tasks where it
is positive and the exact two-sided sign-flip p over tasks (every sign assignment enumerated).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift import seeding
from robocasa_shift.analysis import monitor_detection as detection
from robocasa_shift.analysis.monitor_features import linear_cka, pls_directions, task_summary
from robocasa_shift.errors import DependencyMissing
from robocasa_shift.monitoring import probe as probes

PCA_COMPONENTS = 10
PLS_COMPONENTS = 5
GEOMETRY_FIGURE = "figures/latent__by_task.png"


# --------------------------------------------------------------------------- pooled features


def block_columns(blocks: Sequence[Tuple[str, int]]) -> Dict[str, np.ndarray]:
    """Each set's column indices in the feature vector."""
    out, start = {}, 0
    for name, width in blocks:
        out[name] = np.arange(start, start + int(width))
        start += int(width)
    return out


def pooled_features(logs: probes.FeatureLogs, early: Mapping[str, Optional[int]]) -> Dict[str, np.ndarray]:
    """Per rollout, the mean feature vector over the boundaries of the early window (at least the first)."""
    out = {}
    steps_of = logs.rollouts.set_index("rollout_id")["task"]
    for rid, features in logs.features.items():
        limit = early.get(steps_of[rid])
        inside = logs.steps[rid] <= limit if limit is not None else np.ones(len(features), dtype=bool)
        inside[0] = True
        out[rid] = features[inside].mean(axis=0)
    return out


def _auc(scores: np.ndarray, failed: np.ndarray) -> Optional[float]:
    return detection.roc_auc(scores[failed], scores[~failed])


def _standardise(train: np.ndarray, test: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    mean, scale = train.mean(axis=0), train.std(axis=0)
    scale = np.where(scale > 1e-12, scale, 1.0)
    return (train - mean) / scale, (test - mean) / scale


def _logit_fit(train: np.ndarray, y: np.ndarray, test: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    model = probes.fit([row[None] for row in train], y)
    return model.logits(train), model.logits(test)


def _folds(logs: probes.FeatureLogs, splits) -> List[Tuple[str, List[str], List[str]]]:
    """(held-out task, training ids, its test ids) for every task whose other tasks hold both outcomes."""
    table = detection.add_split_column(logs.rollouts, splits)
    label = table.set_index("rollout_id")["success"]
    folds = []
    for task in sorted(table["task"].unique().tolist()):
        train, _ = probes.training_rollouts(logs, splits, exclude_task=task)
        test = table.loc[(table["task"] == task) & (table[detection.SPLIT_COLUMN] == detection.TEST),
                         "rollout_id"].tolist()
        if train and label.loc[train].nunique() == 2 and test:
            folds.append((task, train, test))
    return folds


def incremental_table(logs: probes.FeatureLogs, splits, pooled: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Per added set, combiner (``pca``, ``pls``) and held-out task: the base AUC, the combined AUC and their
    difference on the task's test rollouts."""
    blocks = logs.blocks or []
    columns = block_columns(blocks)
    base = blocks[-1][0]
    failed_of = ~logs.rollouts.set_index("rollout_id")["success"].astype(bool)
    rows = []
    for task, train, test in _folds(logs, splits):
        y_train, y_test = failed_of.loc[train].to_numpy(), failed_of.loc[test].to_numpy()
        x_train = np.stack([pooled[r] for r in train])
        x_test = np.stack([pooled[r] for r in test])
        base_train, base_test = _standardise(x_train[:, columns[base]], x_test[:, columns[base]])
        logit_train, logit_test = _logit_fit(base_train, y_train, base_test)
        base_auc = _auc(logit_test, y_test)
        residual = y_train - 1.0 / (1.0 + np.exp(-logit_train))
        for name, _ in blocks[:-1]:
            add_train, add_test = _standardise(x_train[:, columns[name]], x_test[:, columns[name]])
            for method in ("pca", "pls"):
                limit = min(PCA_COMPONENTS if method == "pca" else PLS_COMPONENTS, len(train) - 2, add_train.shape[1])
                if method == "pca":
                    _, _, vt = np.linalg.svd(add_train, full_matrices=False)
                    rotation = vt[:max(limit, 0)].T
                else:
                    rotation = pls_directions(add_train, residual, max(limit, 0))
                combined_train = np.column_stack([logit_train, add_train @ rotation])
                combined_test = np.column_stack([logit_test, add_test @ rotation])
                _, scores = _logit_fit(combined_train, y_train, combined_test)
                auc = _auc(scores, y_test)
                rows.append({"added": name, "base": base, "method": method, "task": task,
                             "components": int(rotation.shape[1]), "base_auc": base_auc, "combined_auc": auc,
                             "delta": None if auc is None or base_auc is None else auc - base_auc,
                             "n_train": len(train), "n_test": len(test)})
    return pd.DataFrame(rows)


def _summaries(frame: pd.DataFrame, keys: Sequence[str], columns: Sequence[str]) -> pd.DataFrame:
    rows = []
    if frame.empty:
        return pd.DataFrame(rows)
    for key, part in frame.groupby(list(keys), sort=False):
        key = key if isinstance(key, tuple) else (key,)
        for column in columns:
            per_task = dict(zip(part["task"], part[column]))
            rows.append({**dict(zip(keys, key)), "contrast": column, **task_summary(per_task)})
    return pd.DataFrame(rows)


def _shuffled_donors(logs: probes.FeatureLogs, splits, seed: int) -> Dict[str, str]:
    """Each rollout's donor: another rollout of its task and partition (split), by a seeded derangement (a cyclic
    shift of a random order); a group of one keeps its own (and the summary counts it)."""
    table = detection.add_split_column(logs.rollouts, splits).sort_values("rollout_id")
    rng = np.random.default_rng(seeding.derive_seed(seed, stream="fusion_shuffle"))
    donors = {}
    for _, part in table.groupby(["task", detection.SPLIT_COLUMN], sort=True):
        ids = part["rollout_id"].tolist()
        order = [ids[i] for i in rng.permutation(len(ids))]
        donors.update({r: order[(i + 1) % len(order)] for i, r in enumerate(order)})
    return donors


def _aligned(donor: np.ndarray, length: int) -> np.ndarray:
    index = np.minimum(np.arange(length), len(donor) - 1)
    return donor[index]


def fusion_table(logs: probes.FeatureLogs, splits, early: Mapping[str, Optional[int]], added: str, seed: int
                 ) -> pd.DataFrame:
    """Per held-out task: the sequence head's early-window AUC on the base set beside zeros, beside the added set
    and beside a shuffled added set (the three capacity matched), and the two differences."""
    from robocasa_shift.monitoring import sequence

    blocks = logs.blocks or []
    columns = block_columns(blocks)
    base = blocks[-1][0]
    donors = _shuffled_donors(logs, splits, seed)
    variants = {
        "base": lambda r: np.column_stack([logs.features[r][:, columns[base]],
                                           np.zeros((len(logs.features[r]), len(columns[added])))]),
        "fusion": lambda r: logs.features[r][:, np.concatenate([columns[base], columns[added]])],
        "shuffled": lambda r: np.column_stack([logs.features[r][:, columns[base]],
                                               _aligned(logs.features[donors[r]][:, columns[added]],
                                                        len(logs.features[r]))]),
    }
    failed_of = ~logs.rollouts.set_index("rollout_id")["success"].astype(bool)
    task_of = logs.rollouts.set_index("rollout_id")["task"]
    rows = []
    for task, train, test in _folds(logs, splits):
        y_test = failed_of.loc[test].to_numpy()
        row: Dict[str, Any] = {"task": task, "added": added, "base": base}
        for variant, make in variants.items():
            head = sequence.fit([make(r) for r in train], failed_of.loc[train].to_numpy(),
                                sequence.head_seed(seed, held_out=task, variant="fusion"))
            scores = []
            for r in test:
                values = head.boundary_scores(make(r))
                limit = early.get(task_of[r])
                inside = logs.steps[r] <= limit if limit is not None else np.ones(len(values), dtype=bool)
                inside[0] = True
                scores.append(values[inside].max())
            row[f"{variant}_auc"] = _auc(np.asarray(scores), y_test)
        row["fusion_minus_base"] = None if row["fusion_auc"] is None else row["fusion_auc"] - row["base_auc"]
        row["fusion_minus_shuffled"] = None if row["fusion_auc"] is None else row["fusion_auc"] - row["shuffled_auc"]
        rows.append(row)
    return pd.DataFrame(rows)


def cka_table(logs: probes.FeatureLogs, pooled: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Linear CKA between every pair of sets, on the rollout-pooled features of every rollout."""
    columns = block_columns(logs.blocks or [])
    x = np.stack([pooled[r] for r in sorted(pooled)])
    names = list(columns)
    return pd.DataFrame([{"set_a": a, "set_b": b, "linear_cka": linear_cka(x[:, columns[a]], x[:, columns[b]]),
                          "n_rollouts": len(x)} for i, a in enumerate(names) for b in names[i + 1:]])


@dataclass(frozen=True)
class Geometry:
    """Per feature set, a 2-D embedding of the rollouts' standardised pooled features: what the geometry figure
    (``report/monitors.py``) draws, coloured by task, marked by outcome."""

    method: str  # "UMAP", or "PCA (why not UMAP)"
    tasks: List[str]  # sorted
    task: np.ndarray  # per rollout, in rollout-id order
    success: np.ndarray  # per rollout (bool)
    embeddings: Dict[str, np.ndarray]  # per set, input side first: (rollouts, 2)


def geometry(logs: probes.FeatureLogs, pooled: Mapping[str, np.ndarray], seed: int) -> Geometry:
    """Per set, a 2-D embedding of the standardised pooled features: UMAP when umap-learn is installed, else PCA
    (the method then says why)."""
    try:
        import umap  # noqa: F401  (umap-learn, the geometry extra)

        method = "UMAP"
    except ImportError:
        method = "PCA (umap-learn is not installed: pip install -e '.[geometry]')"
    ids = sorted(pooled)
    info = logs.rollouts.set_index("rollout_id").loc[ids]
    embeddings = {}
    for name, cols in block_columns(logs.blocks or []).items():
        x = np.stack([pooled[r][cols] for r in ids])
        x = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 1e-12, x.std(axis=0), 1.0)
        if method == "UMAP" and len(ids) > 3:
            import umap

            xy = umap.UMAP(n_neighbors=min(15, len(ids) - 1), random_state=seed % (2**32), n_jobs=1).fit_transform(x)
        else:
            u, s, _ = np.linalg.svd(x - x.mean(axis=0), full_matrices=False)
            xy = u[:, :2] * s[:2] if x.shape[1] >= 2 else np.column_stack([x[:, 0], np.zeros(len(x))])
        embeddings[name] = xy
    return Geometry(method=method, tasks=sorted(info["task"].unique().tolist()), task=info["task"].to_numpy(),
                    success=info["success"].astype(bool).to_numpy(), embeddings=embeddings)


# --------------------------------------------------------------------------- the study's part


def _records(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    from robocasa_shift.monitoring.analyses import _plain

    return [{k: _plain(v) for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def run(logs: Optional[probes.FeatureLogs], splits, early: Mapping[str, Optional[int]], seed: int, out: Path,
        figures: bool = True) -> Tuple[Dict[str, Any], List[str], Optional[Geometry]]:
    """Every analysis of the module docstring; writes ``incremental.csv``, ``fusion.csv`` and ``cka.csv`` into
    ``out``; returns the summary's part, the Markdown lines and, with ``figures``, the embeddings the geometry
    figure draws (:data:`GEOMETRY_FIGURE`, drawn by the report's ``report/monitors.py``)."""
    from robocasa_shift.monitoring.analyses import table
    from robocasa_shift.rundir.files import write_csv

    if logs is None:
        return {"reason": "no step log holds the policy's features"}, [], None
    if not logs.blocks or len(logs.blocks) < 2:
        reason = ("the policy names no feature sets (Policy.feature_blocks)" if not logs.blocks else
                  "the policy names one feature set: nothing to compare")
        return {"reason": reason}, ["## Feature sets (the pooled-AUC report's Sec. 4)", "", f"Not run: {reason}.", ""], None
    pooled = pooled_features(logs, early)
    cka = cka_table(logs, pooled)
    incremental = incremental_table(logs, splits, pooled)
    inc_summary = _summaries(incremental, ("added", "method"), ("delta",))
    fusion, fus_summary, added = pd.DataFrame(), pd.DataFrame(), None
    if len(inc_summary):
        pca = inc_summary[inc_summary["method"] == "pca"].dropna(subset=["mean"])
        added = str(pca.sort_values("mean", ascending=False, kind="stable")["added"].iloc[0]) if len(pca) else None
    fusion_reason = None
    if added is not None:
        try:
            fusion = fusion_table(logs, splits, early, added, seed)
            fus_summary = _summaries(fusion, ("added",), ("fusion_minus_base", "fusion_minus_shuffled"))
        except DependencyMissing as exc:  # torch, the sequence head's
            fusion_reason = str(exc)
    for frame, file in ((incremental, "incremental.csv"), (fusion, "fusion.csv"), (cka, "cka.csv")):
        write_csv(frame, out / file)
    embedded = geometry(logs, pooled, seed) if figures else None
    method = embedded.method if embedded is not None else None
    n_tasks = int(logs.rollouts["task"].nunique())
    summary = {"blocks": [[n, int(w)] for n, w in logs.blocks], "base": logs.blocks[-1][0],
               "pooling": "mean over the early window's boundaries (at least the first)",
               "pca_components": PCA_COMPONENTS, "pls_components": PLS_COMPONENTS,
               "incremental": _records(inc_summary), "fusion_added": added, "fusion": _records(fus_summary),
               "fusion_per_task": _records(fusion), "fusion_not_run": fusion_reason,
               "cka": _records(cka), "geometry": method,
               "reason": None if n_tasks > 1 else "one task: nothing to leave out (CKA and the figure only)"}
    lines = ["## Feature sets (the pooled-AUC report's Sec. 4)", "",
             f"The policy's feature sets, input side first: "
             + ", ".join(f"`{n}` ({w})" for n, w in logs.blocks) + f"; the base is `{logs.blocks[-1][0]}`. Rollout "
             "features pooled over the early window. Each held-out task: fitted on the other tasks' validation "
             "rollouts, evaluated on its test rollouts; mean over tasks, t-interval (none below 3 tasks), "
             "positive tasks, exact sign-flip p.", ""]
    if len(inc_summary):
        lines += ["### Incremental held-out value of an added set (AUC of base + set minus base)", "",
                  f"A logistic combiner on the base probe's logit and the added set's first {PCA_COMPONENTS} principal "
                  f"components (`pca`) or {PLS_COMPONENTS} PLS directions targeting the base probe's residual (`pls`).",
                  "", table(inc_summary, ["added", "method", "mean", "ci95", "positive", "signflip_p", "n_tasks"]), ""]
    if len(fus_summary):
        lines += [f"### Time-resolved fusion: the sequence head on `{logs.blocks[-1][0]}` + `{added}`, with a shuffled "
                  "control", "",
                  "Three capacity-matched inputs: the base beside zeros, beside the added set, beside the added set "
                  "of another rollout of the same task and partition (episode alignment broken).", "",
                  table(fusion, ["task", "base_auc", "fusion_auc", "shuffled_auc", "fusion_minus_base",
                                 "fusion_minus_shuffled"]), "",
                  table(fus_summary, ["added", "contrast", "mean", "ci95", "positive", "signflip_p", "n_tasks"]), ""]
    if summary["reason"]:
        lines += [f"Leave one task out not run: {summary['reason']}.", ""]
    lines += ["### Latent geometry (descriptive, not a detector's performance)", "",
              "Linear CKA between the sets (every rollout's pooled features):", "",
              table(cka, ["set_a", "set_b", "linear_cka", "n_rollouts"]), ""]
    if method:
        lines += [f"`{GEOMETRY_FIGURE}`: {method} of each set, coloured by task.", ""]
    return summary, lines, embedded


__all__ = ["GEOMETRY_FIGURE", "Geometry", "PCA_COMPONENTS", "PLS_COMPONENTS", "block_columns", "cka_table",
           "fusion_table", "geometry", "incremental_table", "pooled_features", "run"]
