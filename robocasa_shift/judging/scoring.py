"""Scoring success judges on a judge set: accuracy per subset, success bias by stage depth, paired robustness.

Pure pandas/numpy over the judge set's table and predictions frames, so any
judge run anywhere can be scored. A subset is (task, condition).

- **Balanced accuracy** (mean of the success and failure recalls) per subset,
  with a stratified bootstrap interval; a subset with one class is scored by
  that class's recall (Wilson interval) and enters only the micro figure.
  Macro: the mean over two-class subsets (per condition: over its tasks),
  printed with how many subsets entered it, and not estimable (null) below
  :data:`MIN_MACRO_SUBSETS` two-class subsets; micro: the recalls of every
  sample pooled.
- **Success bias**: the false-success rate (failures judged successes), overall
  and per stratum of stage depth: ``no_subgoal``, ``mid_task`` and
  ``near_success`` (every subgoal latched, the official check failed), each
  with its count (Wilson intervals; a stratum may be small).
- **Error-set overlap**: IoU of the samples two judges get wrong, for every two.
- **Paired robustness**: on pairs whose official outcome did not change (S->S,
  F->F) a judge's verdict should not change either: the verdict flip rate per
  condition; on S->F pairs, the share it catches (success on the clean twin,
  failure on the perturbed one); exact McNemar on the judge's correctness,
  clean vs perturbed.
- **length-only**, a baseline beside every table: success iff the attempt
  ended before the horizon (its confidence 1 - steps / horizon). It reads the
  duration a clip of fixed frame count hides; what it scores is what a judge
  shown real-time video could get from duration alone.
- **Majority-vote ensembles** (FailBench Sec. 4.3) of any judges (the
  length-only baseline too), scored like a judge: on the samples every member
  judged, success when more than half vote success; a tie (an even count) goes
  to the members' mean confidence when each has one, and to failure otherwise.
- **Pipelines compared on the same samples** (FailBench Sec. 4.4, Table 4): of
  two judges (e.g. full frames vs localise-and-crop), the samples the second
  fixes (first wrong, second right) and breaks, exact McNemar on them, and both
  balanced accuracies on the common samples, overall and per condition.
"""

from __future__ import annotations

import json
import os
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from robocasa_shift.analysis.statistics import mcnemar_exact_p, wilson_interval
from robocasa_shift.judging import validity
from robocasa_shift.judging.export import MID_TASK, NEAR_SUCCESS, NO_SUBGOAL
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    atomic_write_text,
    confined,
    read_json,
    write_csv,
)

LENGTH_ONLY = "length-only"
BASELINES = (LENGTH_ONLY, validity.ALL_FAILURE)  # judges every set gets, scored beside the real ones
FAILURE_STRATA = (NO_SUBGOAL, MID_TASK, NEAR_SUCCESS)
N_BOOT = 2000
# A macro over one two-class subset is that subset's BA, not a mean over tasks: two noisy judges (micro BA 0.95
# and 0.85) both read macro 1.000 [1.00, 1.00] when only one subset held both classes.
MIN_MACRO_SUBSETS = 2


def length_only(table: pd.DataFrame) -> pd.DataFrame:
    """The length-only baseline's predictions on a judge set's table."""
    return pd.DataFrame({"sample_id": table["sample_id"],
                         "predicted_success": (table["steps"] < table["horizon"]).astype(int),
                         "confidence": 1.0 - table["steps"] / table["horizon"]})


def _recalls(success: np.ndarray, predicted: np.ndarray) -> Dict[str, Any]:
    pos, neg = success, ~success
    return {"n": int(len(success)), "successes": int(pos.sum()), "failures": int(neg.sum()),
            "success_recall": float(predicted[pos].mean()) if pos.any() else None,
            "failure_recall": float((~predicted[neg]).mean()) if neg.any() else None}


def balanced_accuracy(success: np.ndarray, predicted: np.ndarray) -> Optional[float]:
    """Mean of the two recalls; None unless both classes are present."""
    r = _recalls(np.asarray(success, bool), np.asarray(predicted, bool))
    if r["success_recall"] is None or r["failure_recall"] is None:
        return None
    return (r["success_recall"] + r["failure_recall"]) / 2


def _boot_recall_means(groups: Sequence[tuple], rng: np.random.Generator, n_boot: int) -> np.ndarray:
    """Bootstrap draws of the mean over groups (success, predicted) of each group's balanced accuracy,
    resampling each group's successes and failures separately (class counts fixed)."""
    draws = np.zeros(n_boot)
    for success, predicted in groups:
        correct = predicted == success
        bas = np.zeros(n_boot)
        for cls in (True, False):
            hits = correct[success == cls].astype(float)
            bas += rng.choice(hits, size=(n_boot, len(hits)), replace=True).mean(axis=1) / 2
        draws += bas / len(groups)
    return draws


def _interval(draws: np.ndarray) -> List[float]:
    return [float(np.quantile(draws, 0.025)), float(np.quantile(draws, 0.975))]


def _ba_with_interval(groups: Sequence[tuple], rng: np.random.Generator, n_boot: int,
                      min_subsets: int = 1) -> Dict[str, Any]:
    """Mean balanced accuracy over the two-class groups (success, predicted), with its bootstrap interval;
    ``subsets`` of ``of_subsets`` groups entered it, and below ``min_subsets`` it is not estimable (null)."""
    total = len(groups)
    groups = [(s, p) for s, p in groups if s.any() and (~s).any()]
    out: Dict[str, Any] = {"ba": None, "ci95": None, "subsets": len(groups), "of_subsets": total}
    if len(groups) < max(1, min_subsets):
        out["not_estimable"] = (f"{len(groups)} of {total} subsets hold both classes; a macro needs {min_subsets}"
                                if min_subsets > 1 else "no subset holds both classes")
        return out
    out["ba"] = float(np.mean([balanced_accuracy(s, p) for s, p in groups]))
    out["ci95"] = _interval(_boot_recall_means(groups, rng, n_boot))
    return out


def _macro(groups: Sequence[tuple], rng: np.random.Generator, n_boot: int) -> Dict[str, Any]:
    """A macro balanced accuracy: over at least :data:`MIN_MACRO_SUBSETS` two-class subsets, else not estimable."""
    return _ba_with_interval(groups, rng, n_boot, MIN_MACRO_SUBSETS)


def _rate(k: int, n: int) -> Dict[str, Any]:
    return {"k": int(k), "n": int(n), "rate": (k / n) if n else None, "ci95": wilson_interval(int(k), int(n))}


def judged_table(table: pd.DataFrame, predictions: pd.DataFrame) -> pd.DataFrame:
    """The judge set's table with a judge's ``predicted`` and ``correct`` columns (judged samples only)."""
    kept = [c for c in ("sample_id", "predicted_success", "confidence", "reasoning", "predicted_stage")
            if c in predictions.columns]
    merged = table.merge(predictions[kept], on="sample_id", how="inner")
    merged["success"] = merged["success"].astype(bool)
    merged["predicted"] = merged["predicted_success"].astype(bool)
    merged["correct"] = merged["predicted"] == merged["success"]
    return merged


def accuracy(frame: pd.DataFrame, rng: np.random.Generator, n_boot: int = N_BOOT) -> Dict[str, Any]:
    """Subset, per-condition, macro and micro balanced accuracy of one judge (see the module docstring)."""
    subsets = []
    for (task, condition), cell in frame.groupby(["task", "condition"], sort=True):
        s, p = cell["success"].to_numpy(), cell["predicted"].to_numpy()
        row = {"task": task, "condition": condition, **_recalls(s, p)}
        two_class = row["successes"] > 0 and row["failures"] > 0
        if two_class:
            row.update(_ba_with_interval([(s, p)], rng, n_boot), kind="balanced accuracy")
        else:
            cls = row["successes"] > 0
            k = int((p == cls).sum())
            row.update(ba=k / len(p), ci95=wilson_interval(k, len(p)), subsets=0,
                       kind="success recall" if cls else "failure recall")
        row["false_success"] = _rate(int((p & ~s).sum()), int((~s).sum()))
        subsets.append(row)
    conditions = {}
    for condition, part in frame.groupby("condition", sort=False):
        groups = [(c["success"].to_numpy(), c["predicted"].to_numpy()) for _, c in part.groupby("task")]
        s, p = part["success"].to_numpy(), part["predicted"].to_numpy()
        conditions[condition] = {"macro": _macro(groups, rng, n_boot),
                                 "micro": _micro(s, p, rng, n_boot), "n": int(len(part)),
                                 "false_success": _rate(int((p & ~s).sum()), int((~s).sum()))}
    groups = [(c["success"].to_numpy(), c["predicted"].to_numpy()) for _, c in frame.groupby(["task", "condition"])]
    s, p = frame["success"].to_numpy(), frame["predicted"].to_numpy()
    return {"subsets": subsets, "conditions": conditions, "macro": _macro(groups, rng, n_boot),
            "micro": _micro(s, p, rng, n_boot), "n": int(len(frame))}


def _macro_text(macro: Mapping[str, Any]) -> str:
    """A macro BA with its interval and the subsets that entered it, or why it is not estimable."""
    count = f"{macro.get('subsets', 0)}/{macro.get('of_subsets', 0)} subsets"
    if macro.get("ba") is None:
        return f"not estimable ({count} with both classes)"
    return f"{_fmt(macro['ba'])}{_fmt_ci(macro['ci95'])} ({count})"


def _micro(success: np.ndarray, predicted: np.ndarray, rng, n_boot: int) -> Dict[str, Any]:
    out = _ba_with_interval([(success, predicted)], rng, n_boot)
    return {"ba": out["ba"], "ci95": out["ci95"]}


def success_bias(frame: pd.DataFrame) -> Dict[str, Any]:
    """False-success rate overall, on clean and perturbed samples, and per failure stratum (with counts)."""
    failures = frame[~frame["success"]]
    out = {"false_success": _rate(int(failures["predicted"].sum()), len(failures)),
           "false_failure": _rate(int((~frame.loc[frame["success"], "predicted"]).sum()), int(frame["success"].sum())),
           "strata": {}}
    for name in FAILURE_STRATA:
        part = failures[failures["stratum"] == name]
        out["strata"][name] = _rate(int(part["predicted"].sum()), len(part))
    if "failure_origin" in failures.columns:  # organic here; planned and synthetic in an imported set
        out["origins"] = {str(name): _rate(int(part["predicted"].sum()), len(part))
                          for name, part in failures.groupby(failures["failure_origin"].fillna("unknown"))}
    for name, part in (("clean", failures[failures["condition"] == "clean"]),
                       ("perturbed", failures[failures["condition"] != "clean"])):
        out[f"false_success_{name}"] = _rate(int(part["predicted"].sum()), len(part))
    return out


def paired(frame: pd.DataFrame) -> Dict[str, Any]:
    """Verdict flips on pairs whose outcome held, S->F catches and McNemar on correctness, per condition."""
    clean = frame[frame["condition"] == "clean"].set_index("pair_id")
    perturbed = frame[frame["condition"] != "clean"]
    out: Dict[str, Any] = {}
    for condition, part in perturbed.groupby("condition", sort=False):
        part = part[part["pair_id"].isin(clean.index)]
        twin = clean.loc[part["pair_id"]]
        c_s, p_s = twin["success"].to_numpy(), part["success"].to_numpy()
        c_v, p_v = twin["predicted"].to_numpy(), part["predicted"].to_numpy()
        c_ok, p_ok = twin["correct"].to_numpy(), part["correct"].to_numpy()
        held = c_s == p_s
        sf = c_s & ~p_s
        b, c = int((c_ok & ~p_ok).sum()), int((~c_ok & p_ok).sum())
        out[condition] = {
            "pairs": int(len(part)),
            "outcome_held": int(held.sum()),
            "verdict_flip": _rate(int((c_v != p_v)[held].sum()), int(held.sum())),
            "verdict_flip_SS": _rate(int((c_v != p_v)[held & c_s].sum()), int((held & c_s).sum())),
            "verdict_flip_FF": _rate(int((c_v != p_v)[held & ~c_s].sum()), int((held & ~c_s).sum())),
            "sf_caught": _rate(int((c_v & ~p_v)[sf].sum()), int(sf.sum())),
            "mcnemar": {"clean_right_perturbed_wrong": b, "clean_wrong_perturbed_right": c,
                        "p_exact": mcnemar_exact_p(b, c)},
        }
    return out


def overlap(frames: Mapping[str, pd.DataFrame]) -> List[Dict[str, Any]]:
    """IoU of the error sets of every two judges, on the samples both judged."""
    rows = []
    for a, b in combinations(frames, 2):
        both = frames[a][["sample_id", "correct"]].merge(frames[b][["sample_id", "correct"]], on="sample_id")
        wrong_a, wrong_b = ~both["correct_x"].to_numpy(), ~both["correct_y"].to_numpy()
        union = int((wrong_a | wrong_b).sum())
        rows.append({"judge_a": a, "judge_b": b, "samples": int(len(both)), "errors_a": int(wrong_a.sum()),
                     "errors_b": int(wrong_b.sum()), "both_wrong": int((wrong_a & wrong_b).sum()),
                     "iou": (int((wrong_a & wrong_b).sum()) / union) if union else None})
    return rows


def majority_vote(members: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """A majority-vote ensemble's predictions (``sample_id``, ``predicted_success``, ``confidence``) from its
    members' predictions, on the samples every member judged.

    Success when more than half the members vote success; with an even count a tie goes to the members'
    mean confidence (success at 0.5 or more) when every member has a confidence for that sample, and to
    failure otherwise. The ensemble's confidence is the share of success votes.

    Raises:
        ValueError: fewer than two members.
    """
    if len(members) < 2:
        raise ValueError(f"a majority vote needs at least two judges, got {list(members)}")
    merged = None
    for i, frame in enumerate(members.values()):
        part = frame[["sample_id", "predicted_success", "confidence"]].rename(
            columns={"predicted_success": f"v{i}", "confidence": f"c{i}"})
        merged = part if merged is None else merged.merge(part, on="sample_id", how="inner")
    n = len(members)
    votes = merged[[f"v{i}" for i in range(n)]].to_numpy(dtype=float).sum(axis=1)
    confidence = merged[[f"c{i}" for i in range(n)]].to_numpy(dtype=float)
    tie_break = np.where(np.isnan(confidence).any(axis=1), False, np.nan_to_num(confidence).mean(axis=1) >= 0.5)
    predicted = np.where(2 * votes > n, True, np.where(2 * votes < n, False, tie_break))
    return pd.DataFrame({"sample_id": merged["sample_id"], "predicted_success": predicted.astype(int),
                         "confidence": votes / n})


def ensemble_name(members: Sequence[str]) -> str:
    """An ensemble's name in the tables, e.g. ``majority(end-state+end-state-crop+length-only)``."""
    return "majority(" + "+".join(members) + ")"


def pipelines(frames: Mapping[str, pd.DataFrame], pairs: Sequence[Sequence[str]]) -> List[Dict[str, Any]]:
    """Each (first, second) judge pair on the samples both judged: fixes (first wrong, second right), breaks
    (first right, second wrong), exact McNemar on them and both micro balanced accuracies; overall (condition
    ``all``) and per condition."""
    rows = []
    for first, second in pairs:
        both = frames[first][["sample_id", "condition", "success", "correct"]].merge(
            frames[second][["sample_id", "correct"]], on="sample_id", suffixes=("_a", "_b"))
        for condition, part in [("all", both), *both.groupby("condition", sort=True)]:
            a, b = part["correct_a"].to_numpy(bool), part["correct_b"].to_numpy(bool)
            s = part["success"].to_numpy(bool)
            fixes, breaks = int((~a & b).sum()), int((a & ~b).sum())
            ba_a, ba_b = balanced_accuracy(s, a == s), balanced_accuracy(s, b == s)
            rows.append({"first": first, "second": second, "condition": condition, "samples": int(len(part)),
                         "fixes": fixes, "breaks": breaks, "mcnemar_p": mcnemar_exact_p(fixes, breaks),
                         "ba_first": ba_a, "ba_second": ba_b,
                         "ba_delta": None if ba_a is None or ba_b is None else ba_b - ba_a})
    return rows


def score(table: pd.DataFrame, predictions: Mapping[str, pd.DataFrame], seed: int = 0,
          n_boot: int = N_BOOT, baseline: bool = True, ensembles: Sequence[Sequence[str]] = (),
          compare: Sequence[Sequence[str]] = (), prior: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Every measure of the module docstring for each judge (and the length-only baseline), each majority-vote
    ensemble of ``ensembles`` (lists of judge names, the baseline allowed) and each pipeline pair of ``compare``.

    Raises:
        ValueError: an ensemble or a pair naming a judge that is not scored here.
    """
    judges = dict(predictions)
    if baseline:
        judges[LENGTH_ONLY] = length_only(table)
        judges[validity.ALL_FAILURE] = validity.all_failure(table)
    members_of: Dict[str, List[str]] = {}
    for members in ensembles:
        unknown = [m for m in members if m not in judges]
        if unknown:
            raise ValueError(f"ensemble member {unknown[0]!r} is not a scored judge; scored: {', '.join(judges)}")
        name = ensemble_name(members)
        members_of[name] = list(members)
        judges[name] = majority_vote({m: judges[m] for m in members})
    frames = {name: judged_table(table, p) for name, p in judges.items()}
    result: Dict[str, Any] = {"samples": int(len(table)), "seed": seed, "n_boot": n_boot, "judges": {}}
    for i, (name, frame) in enumerate(frames.items()):
        rng = np.random.default_rng([seed, i])
        result["judges"][name] = {"judged": int(len(frame)), "missing": int(len(table) - len(frame)),
                                  "baseline": name in BASELINES, "accuracy": accuracy(frame, rng, n_boot),
                                  "success_bias": success_bias(frame), "paired": paired(frame)}
        if name in members_of:
            result["judges"][name]["ensemble"] = members_of[name]
    result["overlap"] = overlap(frames)
    for pair in compare:
        unknown = [m for m in pair if m not in frames]
        if unknown or len(pair) != 2:
            raise ValueError(f"compare takes two scored judges, got {list(pair)}; scored: {', '.join(frames)}")
    result["pipelines"] = pipelines(frames, [tuple(p) for p in compare])
    # does a score mean what it seems to (FailBench App. B): rank agreement over slices, reasoning length,
    # progress estimation, the accuracy a published class prior gives
    judged = {n: f for n, f in frames.items() if n not in BASELINES}
    result["validity"] = {
        "rank_agreement": validity.rank_agreement(judged),
        "reasoning": {n: r for n, r in ((n, validity.reasoning_lengths(f)) for n, f in judged.items()) if r},
        "progress": {n: r for n, r in ((n, validity.progress(f)) for n, f in judged.items()) if r},
        "prior": validity.prior_check(frames, tuple(prior)) if prior else None,
    }
    counts = table.assign(success=table["success"].astype(bool))
    result["strata_counts"] = {k: int(v) for k, v in counts.groupby("stratum").size().items()}
    return result


# --------------------------------------------------------------------------- files


def _fmt(value: Optional[float], digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _fmt_ci(ci: Optional[Sequence[float]]) -> str:
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _fmt_rate(rate: Mapping[str, Any]) -> str:
    return "-" if not rate["n"] else f"{rate['rate']:.2f}{_fmt_ci(rate['ci95'])} ({rate['k']}/{rate['n']})"


def tables(result: Mapping[str, Any]) -> Dict[str, pd.DataFrame]:
    """The tidy CSV tables of a score: subsets, conditions, strata, flips, overlap."""
    subsets, conditions, strata, flips = [], [], [], []
    for judge, r in result["judges"].items():
        for row in r["accuracy"]["subsets"]:
            fs = row["false_success"]
            subsets.append({"judge": judge, **{k: row[k] for k in ("task", "condition", "n", "successes", "failures",
                                                                   "success_recall", "failure_recall", "kind", "ba")},
                            "ba_lo": (row["ci95"] or [None, None])[0], "ba_hi": (row["ci95"] or [None, None])[1],
                            "false_success_rate": fs["rate"]})
        for cond, v in r["accuracy"]["conditions"].items():
            conditions.append({"judge": judge, "condition": cond, "n": v["n"], "macro_ba": v["macro"]["ba"],
                               "macro_lo": (v["macro"]["ci95"] or [None])[0],
                               "macro_hi": (v["macro"]["ci95"] or [None, None])[1],
                               "macro_subsets": v["macro"]["subsets"], "of_subsets": v["macro"]["of_subsets"],
                               "micro_ba": v["micro"]["ba"], "false_success_rate": v["false_success"]["rate"]})
        for name, rate in r["success_bias"]["strata"].items():
            strata.append({"judge": judge, "stratum": name, "failures": rate["n"], "judged_success": rate["k"],
                           "false_success_rate": rate["rate"]})
        for cond, v in r["paired"].items():
            flips.append({"judge": judge, "condition": cond, "pairs": v["pairs"], "outcome_held": v["outcome_held"],
                          "flip_rate": v["verdict_flip"]["rate"], "flips": v["verdict_flip"]["k"],
                          "sf_pairs": v["sf_caught"]["n"], "sf_caught": v["sf_caught"]["k"],
                          "mcnemar_b": v["mcnemar"]["clean_right_perturbed_wrong"],
                          "mcnemar_c": v["mcnemar"]["clean_wrong_perturbed_right"], "mcnemar_p": v["mcnemar"]["p_exact"]})
    return {"subsets": pd.DataFrame(subsets), "conditions": pd.DataFrame(conditions), "strata": pd.DataFrame(strata),
            "flips": pd.DataFrame(flips), "overlap": pd.DataFrame(result["overlap"]),
            "pipelines": pd.DataFrame(result.get("pipelines") or [],
                                      columns=["first", "second", "condition", "samples", "fixes", "breaks", "mcnemar_p",
                                               "ba_first", "ba_second", "ba_delta"])}


def markdown(result: Mapping[str, Any]) -> str:
    """``scores.md``: the headline tables for people."""
    lines = [f"# Success judges on judge set {result['export_hash'][:12]}", "",
             f"{result['samples']} samples; balanced accuracy (BA) with 95% intervals (bootstrap for BA, Wilson for "
             f"rates); `{LENGTH_ONLY}` is the duration baseline (see the scoring module). A macro BA is the mean "
             f"over the (task, condition) subsets that hold both classes, with how many entered it; below "
             f"{MIN_MACRO_SUBSETS} it is not estimable.", "",
             "| judge | judged | macro BA | micro BA | false-success rate | on near successes |",
             "|---|---|---|---|---|---|"]
    for judge, r in result["judges"].items():
        a, b = r["accuracy"], r["success_bias"]
        lines.append(f"| {judge} | {r['judged']} | {_macro_text(a['macro'])} | "
                     f"{_fmt(a['micro']['ba'])}{_fmt_ci(a['micro']['ci95'])} | {_fmt_rate(b['false_success'])} | "
                     f"{_fmt_rate(b['strata'][NEAR_SUCCESS])} |")
    lines += ["", "## Per condition: macro BA over tasks, and verdict flips on pairs whose outcome held", ""]
    names = list(result["judges"])
    lines += ["| condition | " + " | ".join(f"{n} BA | {n} flips | {n} S->F caught | {n} McNemar p" for n in names) + " |",
              "|---|" + "---|" * (4 * len(names))]
    conditions = list(next(iter(result["judges"].values()))["accuracy"]["conditions"]) if names else []
    for cond in conditions:
        cells = []
        for n in names:
            r = result["judges"][n]
            acc = r["accuracy"]["conditions"].get(cond, {}).get("macro", {})
            pair = r["paired"].get(cond)
            cells += [_macro_text(acc) if acc else "-",
                      _fmt_rate(pair["verdict_flip"]) if pair else "-",
                      _fmt_rate(pair["sf_caught"]) if pair else "-",
                      _fmt(pair["mcnemar"]["p_exact"], 3) if pair else "-"]
        lines.append(f"| {cond} | " + " | ".join(cells) + " |")
    lines += ["", "## False-success rate by stage depth of the failure", "",
              "| judge | " + " | ".join(FAILURE_STRATA) + " |", "|---|" + "---|" * len(FAILURE_STRATA)]
    for judge, r in result["judges"].items():
        lines.append(f"| {judge} | " + " | ".join(_fmt_rate(r["success_bias"]["strata"][s]) for s in FAILURE_STRATA) + " |")
    if result["overlap"]:
        lines += ["", "## Error-set overlap", "", "| judges | samples | errors | both wrong | IoU |", "|---|---|---|---|---|"]
        for row in result["overlap"]:
            lines.append(f"| {row['judge_a']} / {row['judge_b']} | {row['samples']} | {row['errors_a']} / "
                         f"{row['errors_b']} | {row['both_wrong']} | {_fmt(row['iou'])} |")
    ensembles = {n: r["ensemble"] for n, r in result["judges"].items() if r.get("ensemble")}
    if ensembles:
        lines += ["", "## Majority-vote ensembles", "",
                  "Scored like a judge above (FailBench Sec. 4.3); members, and each member's micro BA on all its "
                  "samples beside the ensemble's:", "", "| ensemble | members' micro BA | ensemble micro BA |",
                  "|---|---|---|"]
        for name, members in ensembles.items():
            cells = ", ".join(f"{m} {_fmt(result['judges'][m]['accuracy']['micro']['ba'])}" for m in members)
            lines.append(f"| {name} | {cells} | {_fmt(result['judges'][name]['accuracy']['micro']['ba'])} |")
    lines += validity_markdown(result.get("validity") or {})
    if result.get("pipelines"):
        lines += ["", "## Pipelines on the same samples (fixes, breaks, exact McNemar)", "",
                  "FailBench Table 4: the second judge against the first on the samples both judged.", "",
                  "| first -> second | condition | samples | fixes | breaks | McNemar p | BA first | BA second | delta |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in result["pipelines"]:
            delta = "-" if row["ba_delta"] is None else f"{row['ba_delta']:+.3f}"
            lines.append(f"| {row['first']} -> {row['second']} | {row['condition']} | {row['samples']} | {row['fixes']} | "
                         f"{row['breaks']} | {_fmt(row['mcnemar_p'], 4)} | {_fmt(row['ba_first'])} | "
                         f"{_fmt(row['ba_second'])} | {delta} |")
    return "\n".join(lines) + "\n"


def validity_markdown(v: Mapping[str, Any]) -> List[str]:
    """The score-validity sections of ``scores.md`` (see :mod:`robocasa_shift.judging.validity`)."""
    lines: List[str] = []
    ranks = v.get("rank_agreement") or {}
    if ranks.get("slices"):
        lines += ["", "## Do the judges rank the same way in every slice?", "",
                  "Spearman correlation of the judges' ranking in each slice with their overall ranking (balanced "
                  "accuracy; a slice with one class: that class's recall), over the samples every judge judged.", "",
                  "| slice by | slices | mean rho | SD | min | max |", "|---|---|---|---|---|---|"]
        for column, r in ranks["slices"].items():
            lines.append(f"| {column} | {r['defined']} of {r['slices']} | {_fmt(r['mean'])} | {_fmt(r['sd'])} | "
                         f"{_fmt(r['min'])} | {_fmt(r['max'])} |")
    elif ranks.get("note"):
        lines += ["", f"Rank agreement across slices: {ranks['note']}."]
    if v.get("reasoning"):
        lines += ["", "## Reasoning length of wrong and right verdicts (characters)", "",
                  "| judge | wrong: n, mean, median | right: n, mean, median |", "|---|---|---|"]
        for judge, r in v["reasoning"].items():
            cells = [f"{r[k]['n']}, {_fmt(r[k]['mean_chars'], 0)}, {_fmt(r[k]['median_chars'], 0)}" for k in ("wrong", "right")]
            lines.append(f"| {judge} | {cells[0]} | {cells[1]} |")
    if v.get("progress"):
        lines += ["", "## Progress estimation against the StageTracker's depth", "",
                  "| judge | samples | exact stage | within one | mean absolute error |", "|---|---|---|---|---|"]
        for judge, r in v["progress"].items():
            lines.append(f"| {judge} | {r['n']} | {_fmt(r['exact'])} | {_fmt(r['within_one'])} | "
                         f"{_fmt(r['mean_abs_error'])} |")
    prior = v.get("prior")
    if prior:
        lines += ["", f"## Accuracy at a published prior ({prior['failures']} failures : {prior['successes']} "
                      f"successes)", "",
                  f"Each judge's two recalls held fixed, the class prior changed; answering failure to everything "
                  f"scores {_fmt(prior['all_failure_accuracy'])} there.", "",
                  "| judge | success recall | failure recall | accuracy at the prior |", "|---|---|---|---|"]
        for row in prior["judges"]:
            lines.append(f"| {row['judge']} | {_fmt(row['success_recall'])} | {_fmt(row['failure_recall'])} | "
                         f"{_fmt(row['accuracy_at_prior'])} |")
    return lines


# (result, path) -> None: draws the scores' figure (report/judges.py); this module draws none
FigureWriter = Callable[[Mapping[str, Any], Path], None]
FIGURE = "judges_by_condition.png"


def score_files(judge_set: Path | str, prediction_files: Sequence[Path | str], out: Optional[Path | str] = None,
                seed: int = 0, n_boot: int = N_BOOT, ensembles: Sequence[Sequence[str]] = (),
                compare: Sequence[Sequence[str]] = (), prior: Optional[Sequence[int]] = None,
                figure: Optional[FigureWriter] = None) -> Dict[str, Any]:
    """Score prediction files on a judge set; write scores.json, scores.md, the CSV tables and the figure ``figure``
    draws (the report's ``report/judges.py``: :data:`FIGURE`; None: no figure) in ``out`` (default
    JUDGE_SET/scores). A predictions sidecar naming another judge set is refused. Judges are named by their file's
    stem; ``ensembles`` and ``compare`` name them so (see :func:`score`)."""
    from robocasa_shift.judging.judgeset import JudgeSet

    js = JudgeSet(judge_set)
    with confined(js.root):  # below the judge set nothing is read or written through a symbolic link
        return _score_files(js, prediction_files, out, seed, n_boot, ensembles, compare, prior, figure)


def _score_files(js, prediction_files: Sequence[Path | str], out: Optional[Path | str], seed: int,
                 n_boot: int, ensembles: Sequence[Sequence[str]] = (),
                 compare: Sequence[Sequence[str]] = (), prior: Optional[Sequence[int]] = None,
                 figure: Optional[FigureWriter] = None) -> Dict[str, Any]:
    from robocasa_shift.judging.judges import (
        SIDECAR_SUFFIX,
        PredictionsError,
        read_predictions,
    )

    table = js.table()
    predictions, identities = {}, {}
    for path in map(Path, prediction_files):
        sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
        identity = {"judge": {"name": path.stem}}
        if os.path.lexists(sidecar):
            try:
                identity = read_json(sidecar, None, MAX_JSON_BYTES, "predictions sidecar")
            except OSError as exc:
                raise PredictionsError(f"{sidecar}: cannot be read ({exc.strerror})") from None
            if not isinstance(identity, dict):
                raise PredictionsError(f"{sidecar}: not a JSON object")
        if identity.get("export_hash") not in (None, js.export_hash):
            raise PredictionsError(f"{path}: judged judge set {str(identity['export_hash'])[:12]}, not "
                                   f"{js.export_hash[:12]} ({js.root}); score it on the set it judged")
        name = path.stem
        if name in predictions or name in BASELINES:
            raise PredictionsError(f"{path}: two prediction files are named {name!r}; rename one")
        predictions[name] = read_predictions(path, known_ids=list(js.by_id))
        identities[name] = identity
    try:
        result = score(table, predictions, seed=seed, n_boot=n_boot, ensembles=ensembles, compare=compare,
                       prior=prior)
    except ValueError as exc:
        raise PredictionsError(str(exc)) from None
    result.update(export_hash=js.export_hash, judge_set=str(js.root), identities=identities,
                  source=js.info.get("source"))
    out = Path(out) if out is not None else js.root / "scores"
    atomic_write_text(out / "scores.json", json.dumps(result, indent=2, sort_keys=True, default=float) + "\n")
    atomic_write_text(out / "scores.md", markdown(result))
    for name, frame in tables(result).items():
        write_csv(frame, out / f"{name}.csv")
    if figure is not None:
        figure(result, out / FIGURE)
    result["out"] = str(out)
    return result


__all__ = ["FIGURE", "FigureWriter", "LENGTH_ONLY", "accuracy", "balanced_accuracy", "ensemble_name", "length_only", "majority_vote", "markdown",
           "overlap", "paired", "pipelines", "score", "score_files", "success_bias", "tables"]
