"""``compare D1 D2``: two policies (or two versions of one) on the same frozen suite, pair by pair.

Rollouts are paired by key (phase, task, episode, condition, replicate):
both runs saw the same initial state and perturbation. Per condition: the
paired difference in success (A - B) and in normalized stage depth, with
within-task bootstrap CIs (macro = equal-weight mean over tasks), the
calibrated interval and the exact stratified sign-flip test of the macro
success difference (Holm-adjusted across conditions), and an exact McNemar
test on the discordant pairs as a pooled diagnostic.

B is the baseline, and the verdicts read from the reader's side: IMPROVED when A succeeds more
than B (the interval of A - B lies above 0), REGRESSED when it succeeds less, NO CHANGE DETECTED,
UNDERPOWERED. Swapping A and B negates every difference and interval and swaps IMPROVED and
REGRESSED.

A pair is valid when both rollouts are valid, neither is a perturbed rollout
whose fingerprints differ from its own clean twin's (docs/protocol.md section 6),
and both runs started from the same initial state (equal ``env_fingerprint``).
Stage depth compares only pairs without a StageTracker error on either side.
A macro over fewer tasks than the runs share is null, with ``missing_tasks``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.analysis.agreement import agreement
from robocasa_shift.analysis.export import records_frame
from robocasa_shift.analysis.measures import (
    AnalysisError,
    _condition_rng,
    _differ,
    _percentile_interval,
    equivalence_p_values,
    mark_fingerprint_mismatches,
    normalize,
)
from robocasa_shift.analysis.statistics import holm_adjust, mcnemar_exact_p
from robocasa_shift.core import kits
from robocasa_shift.core.conditions import order_conditions
from robocasa_shift.core.specs import load_protocol
from robocasa_shift.rundir.store import RunStore

KEYS = ["phase", "task", "episode", "condition", "replicate"]
COMPARE_INVALID_REASONS = ("missing_in_a", "missing_in_b", "fingerprint_mismatch", "invalid_in_a", "invalid_in_b")


def _check_stage_specs(ma: Dict[str, Any], mb: Dict[str, Any]) -> None:
    """Refuse runs whose stage specs differ for a task they share: depth would mean different things."""
    ha, hb = ma.get("stage_spec_hashes") or {}, mb.get("stage_spec_hashes") or {}
    differing = {t: (ha[t], hb[t]) for t in sorted(set(ha) & set(hb)) if ha[t] != hb[t]}
    if differing:
        text = "; ".join(f"{t}: {a} vs {b}" for t, (a, b) in differing.items())
        raise AnalysisError(f"runs differ in stage_spec_hashes ({text}); compare only runs of one stage-spec version")


def _check_asset_kits(run_a, run_b, ma: Dict[str, Any], mb: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The asset kit both runs were made on; refuse runs on different kits, or a run whose records mix kits."""
    try:
        kits.same_kit_or_raise(kits.run_asset_kit(ma), kits.run_asset_kit(mb), f"run A ({run_a})", f"run B ({run_b})")
    except Exception as exc:
        raise AnalysisError(str(exc)) from None
    for run, manifest in ((run_a, ma), (run_b, mb)):
        problems = kits.kit_problems(manifest, RunStore(run).records())
        if problems:
            raise AnalysisError(f"{run}: {'; '.join(problems)}")
    return kits.run_asset_kit(ma)


def _run_rows(run_dir: Path | str, phase: str) -> pd.DataFrame:
    """One run's rows of ``phase``, normalized, with twin-fingerprint mismatches marked invalid."""
    rows = normalize(records_frame(run_dir))
    return mark_fingerprint_mismatches(rows[rows.phase == phase])


def _compare_reasons(both: pd.DataFrame) -> np.ndarray:
    """Why each row of the outer merge of the two runs is not a valid pair ('' when it is one)."""
    where = both["_merge"].to_numpy()
    mismatch = both["fingerprint_mismatch_a"].fillna(False).to_numpy(bool) | both["fingerprint_mismatch_b"].fillna(
        False).to_numpy(bool)
    mismatch |= np.array([_differ(a, b) for a, b in zip(both["env_fingerprint_a"], both["env_fingerprint_b"])])
    return np.select(
        [where == "right_only", where == "left_only", mismatch,
         ~both["valid_a"].fillna(False).to_numpy(bool), ~both["valid_b"].fillna(False).to_numpy(bool)],
        list(COMPARE_INVALID_REASONS), default="",
    )


def compare_runs(run_a: Path | str, run_b: Path | str, phase: str = "formal", n_boot: int = 10000,
                 bootstrap_seed: int = 0, min_effect: float = stats.MIN_EFFECT) -> Dict[str, Any]:
    """Pair two runs' rollouts by key and measure A - B per condition (see the module docstring).

    Raises:
        AnalysisError: the runs differ in spec hash, study seed, backend or a shared task's stage
            spec, or share no valid pair.
    """
    out = _measure_pair(run_a, run_b, phase, n_boot, bootstrap_seed, min_effect)
    _decide_family([out], min_effect)
    return out


def _measure_pair(run_a: Path | str, run_b: Path | str, phase: str, n_boot: int, bootstrap_seed: int,
                  min_effect: float) -> Dict[str, Any]:
    """Every measure of ``compare_runs`` before the Holm adjustments and verdicts (:func:`_decide_family`)."""
    ma, mb = RunStore(run_a).manifest() or {}, RunStore(run_b).manifest() or {}
    for field in ("spec_hash", "study_seed", "backend"):
        if ma.get(field) != mb.get(field):
            raise AnalysisError(f"runs differ in {field}: {ma.get(field)} vs {mb.get(field)}; compare only runs of one frozen suite")
    for run, manifest in ((run_a, ma), (run_b, mb)):
        imported = manifest.get("imported") or {}
        if imported.get("cross_run_pairable") is False:
            raise AnalysisError(f"{run}: imported results that cannot be paired with another run's "
                                f"({imported.get('cross_run_pairing')}); each run's success rates with their "
                                f"task-clustered intervals are in its analysis/imported.json, never a paired verdict")
    _check_stage_specs(ma, mb)
    kit = _check_asset_kits(run_a, run_b, ma, mb)
    a, b = _run_rows(run_a, phase), _run_rows(run_b, phase)
    both = a.merge(b, on=KEYS, suffixes=("_a", "_b"), how="outer", indicator=True)
    # Canonical order: the bootstrap draws pair positions, which must not depend on file order.
    both = both.sort_values(["task", "condition", "episode", "replicate"], kind="stable").reset_index(drop=True)
    reasons = _compare_reasons(both)
    merged = both[reasons == ""].copy()
    if merged.empty:
        raise AnalysisError("the runs share no valid rollout keys")
    for name in ("success_a", "success_b", "stage_error_a", "stage_error_b"):
        merged[name] = merged[name].astype(bool)
    merged["depth_a"] = merged.stages_completed_a.astype(float) / merged.n_stages_a.astype(float)
    merged["depth_b"] = merged.stages_completed_b.astype(float) / merged.n_stages_b.astype(float)
    # docs/protocol.md section 6: a StageTracker error leaves a rollout valid for success, not for stage measures.
    merged["depth_ok"] = ~(merged.stage_error_a | merged.stage_error_b)
    out: Dict[str, Any] = {
        "asset_kit": kit,
        "banner": kits.run_banner(ma),
        "a": {"run": str(run_a), "policy": ma.get("policy")},
        "b": {"run": str(run_b), "policy": mb.get("policy")},
        "baseline": "b",
        "verdict_rule": {
            "vocabulary": list(stats.COMPARE_VERDICTS),
            "rule": "B is the baseline; the calibrated interval of the macro success difference A - B, extended to 0 "
                    "where the Holm-adjusted sign-flip test does not reject: IMPROVED when it lies above 0 (A succeeds "
                    "more than B), REGRESSED below 0, NO CHANGE DETECTED inside +-min_effect with the Holm-adjusted "
                    "equivalence test rejecting, else UNDERPOWERED",
        },
        "spec_hash": ma.get("spec_hash"),
        "stage_spec_hashes": ma.get("stage_spec_hashes"),
        "bootstrap": {"seed": bootstrap_seed, "n_boot": n_boot, "method": "within-task pair bootstrap, macro over tasks",
                      "pair_order": "pairs sorted by (task, episode, replicate) before resampling"},
        "intervals": {"success_diff_ci95": stats.PERCENTILE_METHOD,
                      "success_diff_ci95_calibrated": stats.CALIBRATED_METHOD},
        "holm_families": {
            "signflip": "the stratified sign-flip test of the macro success difference, across conditions",
            "mcnemar": "the pooled McNemar test (a diagnostic), across conditions",
            "equivalence": "the equivalence tests at +-min_effect, across conditions (NO CHANGE DETECTED needs "
            "p_holm < 0.025)",
        },
        "min_effect": float(min_effect),
        "invalid_pair_reasons": list(COMPARE_INVALID_REASONS),
        "conditions": {},
        # test-retest: how often the two runs agree rollout by rollout (two runs of one policy should)
        "agreement": agreement(merged.success_a.to_numpy(bool), merged.success_b.to_numpy(bool)),
    }
    tasks = sorted(set(both.task))
    for cond in order_conditions(set(both.condition), load_protocol().factor_order):
        out["conditions"][cond] = _compare_condition(merged[merged.condition == cond], both[both.condition == cond],
                                                     reasons[(both.condition == cond).to_numpy()], tasks, cond,
                                                     n_boot, bootstrap_seed)
    return out


FAMILY_OF_PAIRS = {
    "signflip": "the stratified sign-flip test of the macro success difference, across every pair of runs and "
                "every condition",
    "mcnemar": "the pooled McNemar test (a diagnostic), across every pair of runs and every condition",
    "equivalence": "the equivalence tests at +-min_effect, across every pair of runs and every condition (NO CHANGE "
                   "DETECTED needs p_holm < 0.025)",
}


def _decide_family(comparisons: List[Dict[str, Any]], min_effect: float) -> None:
    """Holm-adjust the tests of every (comparison, condition) as one family, then read each interval's verdict.

    One comparison: the family is its conditions. Several (``compare R1 R2 R3 ...``): every pair of runs and
    every condition, so a verdict anywhere in the robustness table keeps the family-wise error.
    """
    keys = [(i, c) for i, result in enumerate(comparisons) for c in result["conditions"]]

    def cell(key):
        return comparisons[key[0]]["conditions"][key[1]]

    adjusted = holm_adjust({k: cell(k)["mcnemar_p"] for k in keys})
    headline = holm_adjust({k: (cell(k)["signflip"] or {}).get("p") for k in keys})
    # NO CHANGE DETECTED is Holm-controlled across the family too (the equivalence tests the interval inverts)
    equivalence = equivalence_p_values({k: cell(k).pop("_task_counts") for k in keys}, min_effect)
    equivalence_holm = holm_adjust(equivalence)
    for k in keys:
        v = cell(k)
        v["mcnemar_p_holm"] = adjusted[k]
        if v["signflip"] is not None:
            v["signflip"]["p_holm"] = headline[k]
        v["equivalence"] = {"margin": float(min_effect), "p": equivalence[k], "p_holm": equivalence_holm[k]}
        # interval and verdict as one object: extended to 0 where the Holm-adjusted test does not reject
        chosen = stats.decision(v["success_diff_ci95_calibrated"], headline[k], equivalence_holm[k], min_effect,
                                directions=stats.SUCCESS_DIFF_DIRECTIONS)
        v["success_diff_ci95_calibrated"] = None if chosen is None else chosen["interval"]
        v["success_diff_ci95_calibrated_extended_to_zero"] = None if chosen is None else chosen["extended_to_zero"]
        v["verdict"] = None if chosen is None or v["macro_success_diff"] is None else chosen["verdict"]
    if len(comparisons) > 1:
        for result in comparisons:
            result["holm_families"] = dict(FAMILY_OF_PAIRS)


def _compare_condition(rows: pd.DataFrame, all_rows: pd.DataFrame, reasons: np.ndarray, tasks: List[str], cond: str,
                       n_boot: int, seed: int) -> Dict[str, Any]:
    """The measures of one condition over its valid pairs ``rows``."""
    per_task, boots_s, boots_d, counts = {}, [], [], []
    n_depth_dropped = 0
    for task in tasks:
        t = rows[rows.task == task]
        if t.empty:
            continue
        ds = t.success_a.astype(float).to_numpy() - t.success_b.astype(float).to_numpy()
        depth_rows = t[t.depth_ok]
        n_depth_dropped += len(t) - len(depth_rows)
        dd = (depth_rows.depth_a - depth_rows.depth_b).to_numpy(dtype=float)
        rng = _condition_rng(seed, cond, task)
        idx = rng.integers(0, len(t), size=(n_boot, len(t)))
        bs = ds[idx].mean(1)
        boots_s.append(bs)
        # depth resamples its own pairs (those without a StageTracker error), from the same stream
        bd = dd[rng.integers(0, len(dd), size=(n_boot, len(dd)))].mean(1) if len(dd) else None
        if bd is not None:
            boots_d.append(bd)
        a_only = int(((t.success_a) & (~t.success_b)).sum())
        b_only = int(((~t.success_a) & (t.success_b)).sum())
        both_ok = int((t.success_a & t.success_b).sum())
        table = [both_ok, a_only, b_only, len(t) - both_ok - a_only - b_only]
        counts.append(table)
        per_task[task] = {"n_pairs": len(t), "success_diff": float(ds.mean()), "success_diff_ci95": _percentile_interval(bs),
                          "success_diff_ci95_calibrated": stats.calibrated_interval([table]),
                          "n_depth_pairs": int(len(dd)),
                          "depth_diff": float(dd.mean()) if len(dd) else None,
                          "depth_diff_ci95": _percentile_interval(bd) if bd is not None else None,
                          "a_only": a_only, "b_only": b_only, "mcnemar_p": mcnemar_exact_p(a_only, b_only)}
    missing = [t for t in tasks if t not in per_task]
    complete = bool(per_task) and not missing
    depth_complete = complete and all(v["n_depth_pairs"] for v in per_task.values())
    a_only = sum(v["a_only"] for v in per_task.values())
    b_only = sum(v["b_only"] for v in per_task.values())
    signflip: Optional[stats.SignFlipResult] = (
        stats.signflip_test([v["n_pairs"] for v in per_task.values()], [v["a_only"] for v in per_task.values()],
                            [v["b_only"] for v in per_task.values()]) if complete else None
    )
    return {
        "n_pairs": int(len(rows)),
        "missing_tasks": missing,
        "macro_success_diff": float(np.mean([v["success_diff"] for v in per_task.values()])) if complete else None,
        "success_diff_ci95": _percentile_interval(np.mean(boots_s, axis=0)) if complete else None,
        "success_diff_ci95_calibrated": stats.calibrated_interval(counts) if complete else None,
        "_task_counts": counts if complete else None,
        "macro_depth_diff": float(np.mean([v["depth_diff"] for v in per_task.values()])) if depth_complete else None,
        "depth_diff_ci95": _percentile_interval(np.mean(boots_d, axis=0)) if depth_complete else None,
        "n_stage_error_dropped": n_depth_dropped,
        "a_only_success": a_only,
        "b_only_success": b_only,
        "mcnemar_p": mcnemar_exact_p(a_only, b_only),
        "signflip": None if signflip is None else {**signflip.to_json(), "p_holm": None},
        "invalid_pairs": {r: int(np.sum(reasons == r)) for r in COMPARE_INVALID_REASONS},
        "per_task": per_task,
    }


def _fmt(value: Optional[float], spec: str = "+.3f") -> str:
    return "-" if value is None else format(value, spec)


def _fmt_ci(ci: Optional[List[float]]) -> str:
    return "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def compare_markdown(result: Dict[str, Any]) -> str:
    """The comparison as a Markdown page (compare.md)."""
    lines = ([f"**{result['banner']}**", ""] if result.get("banner") else []) + ["# Paired comparison", "",
             f"A = `{json.dumps(result['a']['policy'])}` ({result['a']['run']}); B = `{json.dumps(result['b']['policy'])}` "
             f"({result['b']['run']}), the baseline: IMPROVED means A succeeds more than B, REGRESSED less.",
             "Differences are A - B over rollouts with the same key; CIs from the within-task pair bootstrap "
             "(the paper's method) and the calibrated interval; p from the exact stratified sign-flip test of the macro "
             "(Holm across conditions); McNemar pooled over tasks is a diagnostic.", "",
             "| condition | pairs | success diff | 95% CI | calibrated 95% CI | sign-flip p (Holm) | verdict | depth diff | 95% CI | A only | B only | McNemar p (Holm) | invalid pairs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    agree = result.get("agreement") or {}
    if agree.get("n"):
        kappa = "undefined (one outcome throughout)" if agree["kappa"] is None else format(agree["kappa"], ".3f")
        lines[-2:-2] = [f"Agreement over all {agree['n']} valid pairs (test-retest when A and B are one policy): "
                        f"{agree['agreement']:.3f}, discordance {agree['discordance']:.3f}, Cohen's kappa {kappa}.", ""]
    for c, v in result["conditions"].items():
        invalid = ", ".join(f"{k} {n}" for k, n in v["invalid_pairs"].items() if n) or "0"
        if v["missing_tasks"]:
            invalid += f"; no valid pair for {', '.join(v['missing_tasks'])} (macro null)"
        lines.append(f"| {c} | {v['n_pairs']} | {_fmt(v['macro_success_diff'])} | {_fmt_ci(v['success_diff_ci95'])} | "
                     f"{_fmt_ci(v['success_diff_ci95_calibrated'])} | {_fmt((v['signflip'] or {}).get('p_holm'), '.3g')} | "
                     f"{v['verdict'] or '-'} | {_fmt(v['macro_depth_diff'])} | {_fmt_ci(v['depth_diff_ci95'])} | "
                     f"{v['a_only_success']} | {v['b_only_success']} | {_fmt(v['mcnemar_p_holm'], '.3g')} | {invalid} |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- the gate: compare --fail-on

# What a gate may fail on, and the verdicts (B the baseline) that fail it. A condition without a verdict (no valid
# pair in some task) fails an ``underpowered`` gate too: nothing was shown there.
FAIL_ON = {"regressed": (stats.REGRESSED,), "underpowered": (stats.UNDERPOWERED, None)}


def gate(result: Dict[str, Any], fail_on: Sequence[str]) -> Dict[str, Any]:
    """Which conditions fail a gate on ``fail_on`` (keys of :data:`FAIL_ON`): ``{"fail_on", "failing", "passed"}``.

    ``regressed``: a condition whose verdict is REGRESSED - A's macro success is below the baseline B's, the
    calibrated interval of A - B below 0 and the exact sign-flip test rejecting after Holm across the
    conditions. ``underpowered``: a condition where the study could not tell (UNDERPOWERED, or no verdict).
    """
    unknown = [f for f in fail_on if f not in FAIL_ON]
    if unknown:
        raise AnalysisError(f"--fail-on {unknown[0]!r}: not one of {', '.join(FAIL_ON)}")
    failing_verdicts = {v for f in fail_on for v in FAIL_ON[f]}
    failing = {c: v["verdict"] for c, v in result["conditions"].items() if v["verdict"] in failing_verdicts}
    return {"fail_on": list(fail_on), "failing": failing, "passed": not failing}


def _verdict_line(v: Mapping[str, Any]) -> str:
    p = (v.get("signflip") or {}).get("p_holm")
    return (f"{v['verdict'] or 'no verdict'}: A - B success {_fmt(v['macro_success_diff'])}, calibrated 95% CI "
            f"{_fmt_ci(v['success_diff_ci95_calibrated'])}, sign-flip p (Holm) {_fmt(p, '.3g')}, {v['n_pairs']} pairs, "
            f"A only {v['a_only_success']}, B only {v['b_only_success']}")


def junit_xml(result: Dict[str, Any]) -> str:
    """The gate as JUnit XML: one test case per condition; a failure where the gate fails, skipped where the
    comparison could not tell (UNDERPOWERED, or no verdict) and the gate does not fail on it, passed otherwise."""
    import xml.etree.ElementTree as ET

    verdict_gate = result.get("gate") or gate(result, ())
    name = f"{Path(result['a']['run']).name} vs {Path(result['b']['run']).name} (baseline)"
    suite = ET.Element("testsuite", name=f"robocasa-shift compare: {name}", tests=str(len(result["conditions"])))
    if result.get("banner"):  # the schema puts properties before the test cases
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="banner", value=result["banner"])
    failures = skipped = 0
    for cond, v in result["conditions"].items():
        case = ET.SubElement(suite, "testcase", classname="robocasa-shift.compare", name=cond, time="0")
        text = _verdict_line(v)
        if cond in verdict_gate["failing"]:
            failures += 1
            ET.SubElement(case, "failure", message=text, type=str(v["verdict"] or "no verdict")).text = text
        elif v["verdict"] in (stats.UNDERPOWERED, None):
            skipped += 1
            ET.SubElement(case, "skipped", message=text)
        ET.SubElement(case, "system-out").text = text
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    return ET.tostring(ET.ElementTree(suite).getroot(), encoding="unicode", xml_declaration=True) + "\n"


def outside_runs(out_dir: Path | str, runs: Sequence[Path | str]) -> Path:
    """``out_dir``, refused when it is a compared run or inside one: a compared run is read, never written.

    Raises:
        BadInput: ``out_dir`` is inside one of ``runs``.
    """
    from robocasa_shift.errors import BadInput

    out = Path(out_dir).resolve()
    for run in runs:
        root = Path(run).resolve()
        if out == root or root in out.parents:
            raise BadInput(f"--out {out_dir} is inside the compared run {run}: a compared run is read, never "
                           f"written; choose a folder outside it")
    return Path(out_dir)


def default_out(runs: Sequence[Path | str]) -> Path:
    """``compare-<A>-vs-<B>[-vs-...]`` in the working directory (never inside a compared run)."""
    return Path(f"compare-{'-vs-'.join(Path(r).resolve().name for r in runs)}")


def write_comparison(run_a, run_b, out_dir: Path | str, fail_on: Sequence[str] = (), **kw) -> Dict[str, Any]:
    """Compare two runs and write compare.json, compare.md, compare_per_task.csv and junit.xml into ``out_dir``
    (outside both runs); ``result["gate"]`` says whether the gate on ``fail_on`` passed."""
    outside_runs(out_dir, (run_a, run_b))
    result = compare_runs(run_a, run_b, **kw)
    result["gate"] = gate(result, fail_on)
    from robocasa_shift.rundir.files import atomic_write_text, write_csv

    out = Path(out_dir)
    atomic_write_text(out / "compare.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "compare.md", compare_markdown(result))
    atomic_write_text(out / "junit.xml", junit_xml(result))
    rows: List[Dict[str, Any]] = []
    for c, v in result["conditions"].items():
        for task, t in v["per_task"].items():
            rows.append({"condition": c, "task": task, **{k: t[k] for k in ("n_pairs", "success_diff", "depth_diff", "a_only", "b_only", "mcnemar_p")}})
    write_csv(pd.DataFrame(rows), out / "compare_per_task.csv")
    return result


# --------------------------------------------------------------------------- N runs: the robustness table


def _labels(runs: Sequence[Path | str]) -> List[str]:
    """Each run's label: its folder's name, or its path where two folders share a name."""
    names = [Path(r).name for r in runs]
    return [n if names.count(n) == 1 else str(r) for n, r in zip(names, runs)]


def _robustness(run_dir: Path | str, phase: str, conditions: Sequence[str]) -> Dict[str, Any]:
    """One run's own macro success rate per condition and its paired macro dSR (clean twin minus perturbed, on
    the base episodes where both are valid), each macro an equal-weight mean over the run's tasks."""
    rows = _run_rows(run_dir, phase)
    rows = rows[rows.valid.astype(bool)]  # a twin-fingerprint mismatch has cleared valid
    tasks = sorted(set(rows.task))
    clean = rows[rows.condition == "clean"].set_index(["task", "episode", "replicate"]).success.astype(float)
    out: Dict[str, Any] = {}
    for cond in conditions:
        here = rows[rows.condition == cond]
        sr = [here[here.task == t].success.astype(float).mean() for t in tasks if (here.task == t).any()]
        dsr, n_pairs = [], 0
        if cond != "clean":
            for t in tasks:
                mine = here[here.task == t].set_index(["task", "episode", "replicate"]).success.astype(float)
                shared = mine.index.intersection(clean.index)
                n_pairs += len(shared)
                if len(shared):
                    dsr.append(float((clean.loc[shared] - mine.loc[shared]).mean()))
        out[cond] = {"macro_sr": float(np.mean(sr)) if len(sr) == len(tasks) and tasks else None,
                     "macro_dsr": float(np.mean(dsr)) if len(dsr) == len(tasks) and tasks and cond != "clean" else None,
                     "n_pairs": n_pairs}
    return out


def compare_many(runs: Sequence[Path | str], phase: str = "formal", n_boot: int = 10000, bootstrap_seed: int = 0,
                 min_effect: float = stats.MIN_EFFECT) -> Dict[str, Any]:
    """N runs of the same frozen suite: each run's robustness, and every pair of runs compared pair by pair.

    Every pair (R_i, R_j), i < j, is :func:`compare_runs` of R_i against R_j (R_j the pair's baseline, differences
    R_i - R_j, paired on the keys both ran validly); the sign-flip, equivalence and McNemar tests of every pair
    and condition are Holm-adjusted as one family before the verdicts are read.

    Raises:
        AnalysisError: fewer than 3 runs, or two runs that :func:`compare_runs` refuses to pair.
    """
    if len(runs) < 3:
        raise AnalysisError(f"compare_many needs 3 or more runs, got {len(runs)}; two runs: compare_runs")
    labels = _labels(runs)
    pairs = [_measure_pair(runs[i], runs[j], phase, n_boot, bootstrap_seed, min_effect)
             for i in range(len(runs)) for j in range(i + 1, len(runs))]
    _decide_family(pairs, min_effect)
    names = iter((labels[i], labels[j]) for i in range(len(runs)) for j in range(i + 1, len(runs)))
    for pair, (a, b) in zip(pairs, names):
        pair["a"]["label"], pair["b"]["label"] = a, b
    conditions = order_conditions({c for p in pairs for c in p["conditions"]}, load_protocol().factor_order)
    manifests = [RunStore(r).manifest() or {} for r in runs]
    return {
        "banner": pairs[0]["banner"],
        "runs": [{"label": label, "run": str(r), "policy": m.get("policy")} for label, r, m in zip(labels, runs, manifests)],
        "spec_hash": pairs[0]["spec_hash"],
        "conditions": conditions,
        "robustness": {label: _robustness(r, phase, conditions) for label, r in zip(labels, runs)},
        "robustness_method": "per run: macro success rate (valid rollouts) and paired macro dSR (clean twin minus "
                             "perturbed, base episodes valid in both), each an equal-weight mean over tasks",
        "holm_families": dict(FAMILY_OF_PAIRS),
        "n_family": sum(len(p["conditions"]) for p in pairs),
        "min_effect": float(min_effect),
        "pairs": pairs,
    }


def compare_many_markdown(result: Dict[str, Any]) -> str:
    """The robustness table and the pairwise verdicts as a Markdown page (compare.md)."""
    conds = result["conditions"]
    lines = ([f"**{result['banner']}**", ""] if result.get("banner") else []) + [
        "# Robustness of several runs on one frozen suite", "",
        "Runs: " + ", ".join(f"`{r['label']}` ({r['run']})" for r in result["runs"]) + ".", "",
        "## Each run: macro success rate / paired macro dSR per condition", "",
        "| run | " + " | ".join(conds) + " |", "|---|" + "---|" * len(conds)]
    for label, per in result["robustness"].items():
        cells = [_fmt(per[c]["macro_sr"], ".3f") + ("" if c == "clean" else f" / {_fmt(per[c]['macro_dsr'])}")
                 for c in conds]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "## Every pair, A - B (B the baseline of the pair): verdict and macro success difference", "",
              f"Holm across the family of {result['n_family']} (pair, condition) tests: "
              f"{result['holm_families']['signflip']}.", "",
              "| A | B | " + " | ".join(conds) + " |", "|---|---|" + "---|" * len(conds)]
    for pair in result["pairs"]:
        cells = [(f"{v['verdict'] or '-'} {_fmt(v['macro_success_diff'])} {_fmt_ci(v['success_diff_ci95_calibrated'])}"
                  if (v := pair["conditions"].get(c)) else "-") for c in conds]
        lines.append(f"| {pair['a']['label']} | {pair['b']['label']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_many(runs: Sequence[Path | str], out_dir: Path | str, **kw) -> Dict[str, Any]:
    """:func:`compare_many`, written into ``out_dir`` (outside every run): compare.json, compare.md."""
    outside_runs(out_dir, runs)
    result = compare_many(runs, **kw)
    from robocasa_shift.rundir.files import atomic_write_text

    out = Path(out_dir)
    atomic_write_text(out / "compare.json", json.dumps(result, indent=1) + "\n")
    atomic_write_text(out / "compare.md", compare_many_markdown(result))
    return result
