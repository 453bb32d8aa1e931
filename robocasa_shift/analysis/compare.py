"""``compare D1 D2``: two policies (or two versions of one) on the same frozen suite, pair by pair.

Rollouts are paired by key (phase, task, episode, condition, replicate):
both runs saw the same initial state and perturbation. Per condition: the
paired difference in success (A - B) and in normalized stage depth, with
within-task bootstrap CIs (macro = equal-weight mean over tasks), and an
exact McNemar test on the discordant pairs, Holm-adjusted across conditions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pandas as pd

from robocasa_shift.analysis.export import records_frame
from robocasa_shift.analysis.measures import (
    AnalysisError,
    _condition_rng,
    _percentile_interval,
    holm_adjust,
    mcnemar_exact_p,
    normalize,
    order_conditions,
)
from robocasa_shift.study.store import RunStore


def compare_runs(run_a: Path | str, run_b: Path | str, phase: str = "formal", n_boot: int = 10000,
                 bootstrap_seed: int = 0) -> Dict[str, Any]:
    ma, mb = RunStore(run_a).manifest() or {}, RunStore(run_b).manifest() or {}
    for field in ("spec_hash", "study_seed", "backend"):
        if ma.get(field) != mb.get(field):
            raise AnalysisError(f"runs differ in {field}: {ma.get(field)} vs {mb.get(field)}; compare only runs of one frozen suite")
    keys = ["phase", "task", "episode", "condition", "replicate"]
    a = normalize(records_frame(run_a))
    b = normalize(records_frame(run_b))
    a, b = a[(a.phase == phase) & a.valid], b[(b.phase == phase) & b.valid]
    merged = a.merge(b, on=keys, suffixes=("_a", "_b"))
    if merged.empty:
        raise AnalysisError("the runs share no valid rollout keys")
    merged["depth_a"] = merged.stages_completed_a / merged.n_stages_a
    merged["depth_b"] = merged.stages_completed_b / merged.n_stages_b
    out: Dict[str, Any] = {
        "a": {"run": str(run_a), "policy": ma.get("policy")},
        "b": {"run": str(run_b), "policy": mb.get("policy")},
        "spec_hash": ma.get("spec_hash"),
        "bootstrap": {"seed": bootstrap_seed, "n_boot": n_boot, "method": "within-task pair bootstrap, macro over tasks"},
        "conditions": {},
    }
    tasks = sorted(set(merged.task))
    for cond in order_conditions(set(merged.condition)):
        rows = merged[merged.condition == cond]
        per_task, boots_s, boots_d = {}, [], []
        for task in tasks:
            t = rows[rows.task == task]
            if t.empty:
                continue
            ds = t.success_a.astype(float).to_numpy() - t.success_b.astype(float).to_numpy()
            dd = (t.depth_a - t.depth_b).to_numpy(dtype=float)
            idx = _condition_rng(bootstrap_seed, cond, task).integers(0, len(t), size=(n_boot, len(t)))
            bs, bd = ds[idx].mean(1), dd[idx].mean(1)
            boots_s.append(bs)
            boots_d.append(bd)
            b_, c_ = int(((t.success_a) & (~t.success_b)).sum()), int(((~t.success_a) & (t.success_b)).sum())
            per_task[task] = {"n_pairs": len(t), "success_diff": float(ds.mean()), "success_diff_ci95": _percentile_interval(bs),
                              "depth_diff": float(dd.mean()), "depth_diff_ci95": _percentile_interval(bd),
                              "a_only": b_, "b_only": c_, "mcnemar_p": mcnemar_exact_p(b_, c_)}
        a_only = sum(v["a_only"] for v in per_task.values())
        b_only = sum(v["b_only"] for v in per_task.values())
        out["conditions"][cond] = {
            "n_pairs": int(len(rows)),
            "macro_success_diff": float(np.mean([v["success_diff"] for v in per_task.values()])),
            "success_diff_ci95": _percentile_interval(np.mean(boots_s, axis=0)),
            "macro_depth_diff": float(np.mean([v["depth_diff"] for v in per_task.values()])),
            "depth_diff_ci95": _percentile_interval(np.mean(boots_d, axis=0)),
            "a_only_success": a_only,
            "b_only_success": b_only,
            "mcnemar_p": mcnemar_exact_p(a_only, b_only),
            "per_task": per_task,
        }
    adjusted = holm_adjust({c: v["mcnemar_p"] for c, v in out["conditions"].items()})
    for c, v in out["conditions"].items():
        v["mcnemar_p_holm"] = adjusted[c]
    return out


def compare_markdown(result: Dict[str, Any]) -> str:
    lines = ["# Paired comparison", "",
             f"A = `{json.dumps(result['a']['policy'])}` ({result['a']['run']}); B = `{json.dumps(result['b']['policy'])}` ({result['b']['run']}).",
             "Differences are A - B over rollouts with the same key; CIs from the within-task pair bootstrap.", "",
             "| condition | pairs | success diff | 95% CI | depth diff | 95% CI | A only | B only | McNemar p (Holm) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c, v in result["conditions"].items():
        ci, dci = v["success_diff_ci95"] or [None, None], v["depth_diff_ci95"] or [None, None]
        lines.append(f"| {c} | {v['n_pairs']} | {v['macro_success_diff']:+.3f} | [{ci[0]:+.3f}, {ci[1]:+.3f}] | "
                     f"{v['macro_depth_diff']:+.3f} | [{dci[0]:+.3f}, {dci[1]:+.3f}] | {v['a_only_success']} | "
                     f"{v['b_only_success']} | {v['mcnemar_p_holm']:.3g} |")
    return "\n".join(lines) + "\n"


def write_comparison(run_a, run_b, out_dir: Path | str, **kw) -> Dict[str, Any]:
    result = compare_runs(run_a, run_b, **kw)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "compare.md").write_text(compare_markdown(result))
    rows: List[Dict[str, Any]] = []
    for c, v in result["conditions"].items():
        for task, t in v["per_task"].items():
            rows.append({"condition": c, "task": task, **{k: t[k] for k in ("n_pairs", "success_diff", "depth_diff", "a_only", "b_only", "mcnemar_p")}})
    pd.DataFrame(rows).to_csv(out / "compare_per_task.csv", index=False)
    return result
