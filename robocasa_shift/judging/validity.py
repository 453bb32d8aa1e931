"""Whether a judge's score means what it seems to: the checks FailBench runs beside its accuracy tables.

- **All-failure baseline** (``all-failure``): a judge that answers failure to everything. On a balanced
  set its balanced accuracy is 0.5; on an unbalanced published split its plain accuracy is the failure
  share, which a specialist's published number may barely beat.
- **Accuracy under a prior**: a judge's two recalls held fixed and the class prior changed to a
  published split's (``score-judge --prior FAILURES:SUCCESSES``), beside the all-failure constant's
  accuracy on that split: whether a published number is more than the prior.
- **Reasoning length** of wrong against right verdicts (characters of the ``reasoning`` column): a judge
  whose wrong answers carry longer reasoning is not failing for want of reasoning.
- **Rank agreement across slices**: Spearman's rank correlation between the judges' ranking in each
  slice (a task, a condition, a failure depth) and their ranking overall, with its dispersion over the
  slices (mean, SD, min, max): whether "judge A is better than judge B" holds slice by slice.
- **Progress estimation** (a ``predicted_stage`` column): the stage a judge says the attempt reached,
  scored against the StageTracker's count of latched subgoals: exact and within one, and the mean
  absolute error, overall and by true depth. Only a harness with true stage labels can score this.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

ALL_FAILURE = "all-failure"
SLICES = ("task", "condition", "stratum")


def all_failure(table: pd.DataFrame) -> pd.DataFrame:
    """The all-failure baseline's predictions on a judge set's table."""
    return pd.DataFrame({"sample_id": table["sample_id"], "predicted_success": 0, "confidence": 0.0})


def prior_accuracy(success_recall: Optional[float], failure_recall: Optional[float], failures: int,
                   successes: int) -> Optional[float]:
    """Plain accuracy of a judge with these recalls on a split of ``failures`` and ``successes``."""
    if success_recall is None or failure_recall is None or failures + successes == 0:
        return None
    return (failures * failure_recall + successes * success_recall) / (failures + successes)


def prior_check(frames: Mapping[str, pd.DataFrame], prior: Tuple[int, int]) -> Dict[str, Any]:
    """Each judge's pooled recalls reweighted to ``prior`` = (failures, successes), beside the constant's."""
    failures, successes = prior
    rows = []
    for name, frame in frames.items():
        s, p = frame["success"].to_numpy(bool), frame["predicted"].to_numpy(bool)
        success_recall = float(p[s].mean()) if s.any() else None
        failure_recall = float((~p[~s]).mean()) if (~s).any() else None
        rows.append({"judge": name, "success_recall": success_recall, "failure_recall": failure_recall,
                     "accuracy_at_prior": prior_accuracy(success_recall, failure_recall, failures, successes)})
    return {"failures": failures, "successes": successes,
            "all_failure_accuracy": failures / (failures + successes) if failures + successes else None,
            "judges": rows}


def reasoning_lengths(frame: pd.DataFrame) -> Optional[Dict[str, Any]]:
    """Characters of reasoning behind wrong and right verdicts (None when the judge kept none)."""
    if "reasoning" not in frame.columns:
        return None
    length = frame["reasoning"].fillna("").astype(str).str.len()
    if not (length > 0).any():
        return None
    out: Dict[str, Any] = {}
    for name, part in (("wrong", length[~frame["correct"]]), ("right", length[frame["correct"]])):
        out[name] = {"n": int(len(part)), "mean_chars": float(part.mean()) if len(part) else None,
                     "median_chars": float(part.median()) if len(part) else None}
    return out


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean rank), as Spearman's correlation uses them."""
    order = values.argsort(kind="stable")
    ranks = np.empty(len(values))
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation (Pearson on average ranks); None when either side is constant."""
    rx, ry = _ranks(np.asarray(x, float)), _ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def _slice_score(part: pd.DataFrame) -> Optional[float]:
    """Balanced accuracy of a slice with both classes, else the recall of its one class."""
    s, p = part["success"].to_numpy(bool), part["predicted"].to_numpy(bool)
    recalls = [float((p[s == c] == c).mean()) for c in (True, False) if (s == c).any()]
    return float(np.mean(recalls)) if recalls else None


def rank_agreement(frames: Mapping[str, pd.DataFrame], slices: Sequence[str] = SLICES) -> Dict[str, Any]:
    """Spearman correlation of the judges' ranking in every slice with their overall ranking, and its spread.

    Needs three judges or more (two judges' ranks correlate +-1 by construction); every judge is
    scored on the samples all of them judged, so the slices hold the same samples for each.
    """
    names = list(frames)
    if len(names) < 3:
        return {"judges": names, "note": "fewer than three judges: a rank correlation says nothing"}
    common = set.intersection(*(set(f["sample_id"]) for f in frames.values()))
    frames = {n: f[f["sample_id"].isin(common)] for n, f in frames.items()}
    overall = np.array([_slice_score(f) for f in frames.values()], float)
    out: Dict[str, Any] = {"judges": names, "samples": len(common), "overall": dict(zip(names, overall.tolist())),
                           "slices": {}}
    for column in slices:
        rows = []
        for value in sorted(set(next(iter(frames.values()))[column].dropna())):
            scores = [_slice_score(f[f[column] == value]) for f in frames.values()]
            if any(v is None for v in scores):
                continue
            rows.append({"slice": str(value), "n": int((next(iter(frames.values()))[column] == value).sum()),
                         "scores": dict(zip(names, scores)), "spearman": spearman(scores, overall)})
        rho = np.array([r["spearman"] for r in rows if r["spearman"] is not None], float)
        out["slices"][column] = {
            "rows": rows, "slices": len(rows), "defined": int(len(rho)),
            "mean": float(rho.mean()) if len(rho) else None, "sd": float(rho.std(ddof=1)) if len(rho) > 1 else None,
            "min": float(rho.min()) if len(rho) else None, "max": float(rho.max()) if len(rho) else None}
    return out


def progress(frame: pd.DataFrame) -> Optional[Dict[str, Any]]:
    """A judge's predicted stage against the true count of latched subgoals (None without predictions)."""
    if "predicted_stage" not in frame.columns:
        return None
    part = frame[pd.to_numeric(frame["predicted_stage"], errors="coerce").notna()]
    if part.empty:
        return None
    predicted = pd.to_numeric(part["predicted_stage"]).to_numpy(float)
    true = part["stages_completed"].to_numpy(float)
    error = np.abs(predicted - true)
    by_depth = []
    for depth in sorted(set(true)):
        at = true == depth
        by_depth.append({"stages_completed": int(depth), "n": int(at.sum()), "exact": float((error[at] == 0).mean()),
                         "within_one": float((error[at] <= 1).mean()), "mean_abs_error": float(error[at].mean())})
    return {"n": int(len(part)), "exact": float((error == 0).mean()), "within_one": float((error <= 1).mean()),
            "mean_abs_error": float(error.mean()), "by_depth": by_depth}
