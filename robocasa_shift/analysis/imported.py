"""The statistics of imported results (``robocasa-shift import-results``): rates and differences
clustered by base task, paired verdicts only where the source proves the pairing.

Another harness's variants of a task share the task's objects, layout and often its initial states,
so rollouts of one base task are not independent: every interval here is clustered by base task
(a cluster-robust ratio estimator with a t quantile on k - 1 degrees of freedom, k the number of
base tasks; none below :data:`MIN_CLUSTERS`). Where the source proves that a variant started from
the clean task's initial state (one variant per clean rollout), the pairs go through the main
study's paired analysis (:func:`robocasa_shift.analysis.measures.analyze`) and carry its verdicts;
every other difference is labelled ``UNPAIRED`` and its verdict is read off the unpaired interval.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.errors import AnalysisError

CLEAN = "clean"
MIN_CLUSTERS = 5   # fewer base tasks than this: no clustered interval (its level is not kept)
UNPAIRED = "UNPAIRED"
METHOD = ("cluster-robust (CR1) standard error of the pooled rate, clusters = base tasks, t quantile with k - 1 "
          "degrees of freedom, clipped to [0, 1]; none with fewer than 5 base tasks")
DIFF_METHOD = ("dSR = clean minus variant pooled rates over the base tasks that have both; cluster-robust (CR1) standard "
               "error from each base task's joint influence on both rates (so a task's shared difficulty counts "
               "once), t quantile with k - 1 degrees of freedom; none with fewer than 5 base tasks")


def _t_quantile(df: int, q: float = 0.975) -> float:
    from scipy.stats import t

    return float(t.ppf(q, df))


def clustered_rate(rows: pd.DataFrame) -> Dict[str, Any]:
    """Pooled success rate of ``rows`` (columns task, success) with its task-clustered 95% interval."""
    per = rows.groupby("task")["success"].agg(["sum", "count"])
    n, k = int(per["count"].sum()), len(per)
    if n == 0:
        return {"n": 0, "tasks": 0, "sr": None, "ci95": None, "note": "no rollouts"}
    sr = float(per["sum"].sum() / n)
    out: Dict[str, Any] = {"n": n, "tasks": k, "successes": int(per["sum"].sum()), "sr": sr, "ci95": None}
    if k < MIN_CLUSTERS:
        out["note"] = f"{k} base task(s): too few for a clustered interval (at least {MIN_CLUSTERS})"
        return out
    resid = (per["sum"] - sr * per["count"]).to_numpy(float)
    se = math.sqrt(k / (k - 1) * float(np.sum(resid ** 2))) / n
    half = _t_quantile(k - 1) * se
    out["ci95"] = [max(0.0, sr - half), min(1.0, sr + half)]
    return out


def clustered_difference(variant: pd.DataFrame, clean: pd.DataFrame) -> Dict[str, Any]:
    """Unpaired dSR: pooled clean rate minus ``variant``'s over the base tasks both have, task-clustered."""
    tasks = sorted(set(variant["task"]) & set(clean["task"]))
    v = variant[variant["task"].isin(tasks)].groupby("task")["success"].agg(["sum", "count"]).reindex(tasks)
    c = clean[clean["task"].isin(tasks)].groupby("task")["success"].agg(["sum", "count"]).reindex(tasks)
    k = len(tasks)
    if k == 0:
        return {"tasks": 0, "dsr": None, "ci95": None, "note": "no base task has both clean and variant rollouts"}
    nv, nc = float(v["count"].sum()), float(c["count"].sum())
    pv, pc = float(v["sum"].sum()) / nv, float(c["sum"].sum()) / nc
    out: Dict[str, Any] = {"tasks": k, "n_variant": int(nv), "n_clean": int(nc), "sr_variant": pv, "sr_clean": pc,
                           "dsr": pc - pv, "ci95": None, "pairing": UNPAIRED}
    if k < MIN_CLUSTERS:
        out["note"] = f"{k} base task(s) with both: too few for a clustered interval (at least {MIN_CLUSTERS})"
        return out
    influence = ((c["sum"] - pc * c["count"]) / nc - (v["sum"] - pv * v["count"]) / nv).to_numpy(float)
    se = math.sqrt(k / (k - 1) * float(np.sum(influence ** 2)))
    half = _t_quantile(k - 1) * se
    out["ci95"] = [max(-1.0, pc - pv - half), min(1.0, pc - pv + half)]
    return out


def unpaired_verdict(ci95: Optional[Sequence[float]], min_effect: float) -> Optional[str]:
    """The verdict an unpaired interval of dSR (clean - variant) supports, in the paired study's words."""
    if ci95 is None:
        return None
    lo, hi = ci95
    if lo > 0:
        return "DEGRADED"
    if hi < 0:
        return "IMPROVED"
    if -min_effect <= lo and hi <= min_effect:
        return "NO CHANGE DETECTED"
    return "UNDERPOWERED"


def provable_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """Clean rows plus each variant row with a provable clean twin, renumbered to the twin's episode.

    A clean rollout that several variants of one condition claim as their twin would count once per
    variant, so such variants are left to the unpaired analysis.
    """
    clean = frame[frame["condition"] == CLEAN]
    claimed = frame[(frame["condition"] != CLEAN) & frame["twin_episode"].notna()].copy()
    claimed["twin_episode"] = claimed["twin_episode"].astype(int)
    claims = claimed.groupby(["task", "condition", "twin_episode"])["episode"].transform("count")
    unique = claimed[claims == 1].copy()
    has_twin = unique.set_index(["task", "twin_episode"]).index.isin(clean.set_index(["task", "episode"]).index)
    unique = unique[has_twin]
    unique["episode"] = unique["twin_episode"]
    return pd.concat([clean, unique], ignore_index=True)


def _analysis_table(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame[["task", "episode", "condition", "success"]].copy()
    out["phase"] = "formal"
    out["replicate"] = 0
    out["n_stages"] = 1
    out["stages_completed"] = out["success"].astype(int)
    out["first_incomplete"] = [None if s else 1 for s in out["success"]]
    return out


def summarize(frame: pd.DataFrame, min_effect: float = stats.MIN_EFFECT, n_boot: int = 2000,
              bootstrap_seed: int = 0) -> Dict[str, Any]:
    """Every condition's clustered rate, its difference from clean (paired where provable) and a verdict.

    ``frame``: one row per imported rollout, columns task, condition, episode, success, twin_episode
    (the clean twin's episode where the source proves it, else NaN), unpaired_reason.
    """
    if frame.empty:
        raise AnalysisError("no imported rollouts")
    frame = frame.copy()
    frame["success"] = frame["success"].astype(bool)
    clean = frame[frame["condition"] == CLEAN]
    conditions: Dict[str, Dict[str, Any]] = {}
    pairs = provable_pairs(frame) if not clean.empty else frame.iloc[:0]
    paired_summary: Dict[str, Any] = {}
    # the conditions that have pairs on the same base tasks are analysed together (one Holm family): the macro
    # needs every task it averages
    families: Dict[tuple, List[str]] = {}
    for cond in sorted(set(pairs["condition"]) - {CLEAN}):
        families.setdefault(tuple(sorted(set(pairs[pairs["condition"] == cond]["task"]))), []).append(cond)
    for tasks, conds in families.items():
        from robocasa_shift.analysis.measures import analyze

        subset = pairs[pairs["task"].isin(tasks) & pairs["condition"].isin([CLEAN, *conds])]
        result = analyze(_analysis_table(subset), n_boot=n_boot, bootstrap_seed=bootstrap_seed,
                         min_effect=min_effect, factor_order=())["conditions"]
        paired_summary.update({c: result[c] for c in conds})
    for cond in sorted(set(frame["condition"]), key=lambda c: (c != CLEAN, c)):
        rows = frame[frame["condition"] == cond]
        entry: Dict[str, Any] = {"rate": clustered_rate(rows)}
        if cond != CLEAN and not clean.empty:
            entry["unpaired"] = clustered_difference(rows, clean)
            entry["unpaired"]["verdict"] = unpaired_verdict(entry["unpaired"]["ci95"], min_effect)
            reasons = rows["unpaired_reason"].dropna().value_counts()
            entry["unpaired_reasons"] = {str(k): int(v) for k, v in reasons.items()}
            paired = paired_summary.get(cond)
            if paired is not None and paired.get("n_pairs", 0):
                entry["paired"] = {"pairs": paired.get("n_pairs"), "dsr": paired.get("macro_dsr"),
                                   "dsr_ci95_calibrated": paired.get("dsr_ci95_calibrated"),
                                   "verdict": paired.get("verdict")}
        conditions[cond] = entry
    return {
        "conditions": conditions,
        "grid": dimension_grid(conditions),
        "min_effect": float(min_effect),
        "methods": {"rate": METHOD, "unpaired_difference": DIFF_METHOD,
                    "paired": "the main study's paired analysis (dSR = clean - variant, calibrated interval, Holm) on "
                              "the variants whose clean twin the source proves; the conditions with pairs on the same "
                              "base tasks form one Holm family",
                    "verdict_unpaired": "read off the unpaired 95% interval of dSR (clean - variant): DEGRADED above "
                                        "0, IMPROVED below 0, NO CHANGE DETECTED inside +-min_effect, else UNDERPOWERED; "
                                        "labelled UNPAIRED"},
    }


def dimension_grid(conditions: Mapping[str, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """One row per dimension, a cell per difficulty level: rate, interval, verdict (paired if proven)."""
    rows: Dict[str, Dict[str, Any]] = {}
    for cond, entry in conditions.items():
        if cond == CLEAN:
            continue
        factor, level = cond.rsplit(":", 1)
        paired = entry.get("paired")
        verdict = paired["verdict"] if paired else (entry.get("unpaired") or {}).get("verdict")
        rows.setdefault(factor, {"dimension": factor})[level] = {
            "sr": entry["rate"]["sr"], "ci95": entry["rate"]["ci95"], "n": entry["rate"]["n"],
            "verdict": verdict, "pairing": "PAIRED" if paired else UNPAIRED}
    return [rows[k] for k in sorted(rows)]
