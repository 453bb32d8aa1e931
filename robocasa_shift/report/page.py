"""``report D``: one HTML page per run directory, with its figures and paired videos beside it.

The page leads with one screen: what was run, whether the audit passed, one verdict per factor and
level, the degradation figure and where the lost pairs stopped. Everything else follows in sections,
the long per-task detail folded. The analysis is recomputed from the records (``analysis/``); the
audit is shown as ``audit`` wrote it (``audit.json``; never re-audited here), and the page says when
it is missing or older than the records.

Every value taken from the run directory (record fields, manifest entries, file names) is escaped,
and record conditions are checked against the frozen spec first: rows with an unknown condition are
left out and listed at the top of the page.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import pandas as pd

from robocasa_shift.analysis.export import records_frame
from robocasa_shift.analysis import statistics as stats
from robocasa_shift.analysis.behaviour import formal_behaviour
from robocasa_shift.analysis.measures import write_analysis
from robocasa_shift.checks.audit import LABELS, ZERO_CHECKS, read_audit
from robocasa_shift.core import kits
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.specs import load_protocol
from robocasa_shift.errors import BadInput, RunDirError, UnknownNameError
from robocasa_shift.report.figures import (
    factor_groups,
    fig_interactions,
    fig_macro_dsr,
    fig_stage_depth,
    fig_task_dsr,
    fig_transitions,
)
from robocasa_shift.report.html import (
    CSS,
    ci,
    esc,
    frame_table,
    html_table,
    identity_html,
    markdown_html,
    num,
    src,
)
from robocasa_shift.report.studies import behaviour_tables, branching_sections, judge_sections, monitor_sections, sweep_sections
from robocasa_shift.report.videos import check_video_dependencies, make_videos, stage_steps_text
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    atomic_write_json,
    atomic_write_text,
    confined,
    read_json,
    read_text,
)
from robocasa_shift.rundir.store import RunStore

VERDICT_CLASS = {"DEGRADED": "bad", "IMPROVED": "good", "NO CHANGE DETECTED": "good", "UNDERPOWERED": "warn"}
PROTOCOL_PAGE = "the protocol (docs/protocol.md)"


# --------------------------------------------------------------------------- tables


def sr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    """Success rate per condition (rows) and task (columns), with the macro column: as many rows as
    conditions, so the table stays inside the page however many conditions a run has."""
    rows = []
    for c, v in summary["conditions"].items():
        rows.append({"condition": c, **{t: v["per_task_sr"].get(t) for t in summary["tasks"]}, "macro": v["macro_sr"]})
    return pd.DataFrame(rows)


DSR_HEADER = ["condition", "pairs", "macro dSR", "calibrated 95% CI", "verdict", "sign-flip p (Holm)",
              "min. dSR read DEGRADED with 80% power (smallest / from which every larger has it)",
              "95% CI, percentile bootstrap (the paper's method, for comparison)", "invalid pairs"]
TRANSITION_HEADER = ["condition", "S->S", "S->F", "F->S", "F->F", "changed", "McNemar p, pooled (Holm)",
                     "S->F mean progress", "first-stage fraction"]


def _invalid_text(counts: Mapping[str, int], missing: Sequence[str] = ()) -> str:
    text = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in counts.items() if n) or "0"
    if missing:
        text += f"; no valid pair for {', '.join(missing)}: macro not computed"
    return text


def _verdict_cell(verdict: Optional[str]):
    return (verdict, VERDICT_CLASS.get(verdict, "")) if verdict else "-"


def dsr_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    """One row per perturbed condition for :data:`DSR_HEADER`, the calibrated interval and its verdict first;
    zero-width percentile intervals and verdicts carry a class."""
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        percentile = ci(v["dsr_ci95"])
        if v.get("dsr_ci95_zero_width"):
            percentile = (percentile + " zero width", "bad")
        rows.append([
            c, v.get("n_pairs"), num(v["macro_dsr"]), ci(v.get("dsr_ci95_calibrated")), _verdict_cell(v.get("verdict")),
            num((v.get("signflip") or {}).get("p_holm"), ".3g"), _mde_text(v.get("power") or {}),
            percentile,
            (_invalid_text(v.get("invalid_pairs") or {}, v.get("missing_tasks") or []),
             "warn" if v.get("missing_tasks") or any((v.get("invalid_pairs") or {}).values()) else ""),
        ])
    return rows


def _mde_text(power: Mapping[str, Any]) -> str:
    """'first / stable' minimum detectable dSR (one number when they agree); '-' when undefined."""
    first, stable = power.get("mde_dsr"), power.get("mde_dsr_stable")
    if first is None:
        return "-"
    text = num(first, ".3f") if stable == first else f"{num(first, '.3f')} / {num(stable, '.3f')}"
    return text + (" (MC)" if str(power.get("method") or "").startswith("monte carlo") else "")


def transition_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    """One row per perturbed condition for :data:`TRANSITION_HEADER` (pooled over tasks)."""
    rows = []
    for c, v in summary["conditions"].items():
        if c != "clean":
            t = v["transitions"]
            rows.append([c, t["SS"], t["SF"], t["FS"], t["FF"], t["changed"],
                         num((v.get("mcnemar") or {}).get("p_holm"), ".3g"), num(v["sf"]["mean_progress"], ".3f"),
                         num(v["sf"]["first_stage_fraction"], ".3f")])
    return rows


def dsr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    """The paired-degradation table as a frame of display strings (what the page shows)."""
    return pd.DataFrame([[cell[0] if isinstance(cell, tuple) else cell for cell in row] for row in dsr_rows(summary)],
                        columns=DSR_HEADER)


def _per_task_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        for task in summary["tasks"]:
            percentile = ci(v["per_task_dsr_ci95"][task])
            if (v.get("per_task_dsr_ci95_zero_width") or {}).get(task):
                percentile = (percentile + " zero width", "bad")
            rows.append([c, task, v["per_task_n_pairs"][task], num(v["per_task_dsr"][task]),
                         ci((v.get("per_task_dsr_ci95_calibrated") or {}).get(task)),
                         _verdict_cell((v.get("per_task_verdict") or {}).get(task)),
                         num(v["mcnemar"]["per_task"][task]["p_holm"], ".3g"), percentile,
                         _invalid_text((v.get("per_task_invalid_pairs") or {}).get(task, {}))])
    return rows


def _per_task_section(summary: Dict[str, Any]) -> str:
    """Per-task verdicts, folded: the summary line counts them by verdict so the fold is worth opening or not."""
    rows = _per_task_rows(summary)
    counts: Dict[str, int] = {}
    for row in rows:
        verdict = row[5][0] if isinstance(row[5], tuple) else row[5]
        counts[verdict] = counts.get(verdict, 0) + 1
    tally = ", ".join(f"{n} {v}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    header = ["condition", "task", "pairs", "dSR", "calibrated 95% CI", "verdict", "McNemar p (Holm within task)",
              "95% CI, percentile pair bootstrap (the paper's method, for comparison)", "invalid pairs"]
    return (f"<details><summary>Per task: {len(rows)} verdicts ({esc(tally)})</summary>"
            "<figure><img src='task_dsr.png' alt='per-task dSR'></figure>"
            f"<div class='scroll'>{html_table(header, rows)}</div></details>")


def unreachable_sentence(summary: Dict[str, Any]) -> Optional[str]:
    """One sentence on the verdicts no outcome of this design could have given, and the size that could; None when
    every verdict was reachable."""
    power = summary.get("power") or {}
    sizes = power.get("smallest_reachable") or {}
    perturbed = {c: v for c, v in summary["conditions"].items() if c != "clean"}
    if not perturbed or not sizes:
        return None
    macro_missing = {kind: [c for c, v in perturbed.items() if (v.get("power") or {}).get("reachable") is not None
                            and not v["power"]["reachable"][kind]] for kind in ("no_change", "degraded")}
    task_cells = [r for v in perturbed.values() for r in ((v.get("power") or {}).get("per_task_reachable") or {}).values()
                  if r is not None]
    task_forced = bool(task_cells) and not any(r["degraded"] or r["no_change"] for r in task_cells)
    parts = []
    names = {"no_change": "NO CHANGE DETECTED", "degraded": "DEGRADED"}
    macro, per_task = sizes.get("macro") or {}, sizes.get("per_task") or {}
    for kind in ("no_change", "degraded"):
        conditions = macro_missing[kind]
        if conditions:
            which = "any condition" if len(conditions) == len(perturbed) else ", ".join(conditions)
            parts.append(f"{names[kind]} for {which} (with {macro.get('n_tasks')} tasks it needs at least "
                         f"{macro.get(kind)} base episodes per task)")
    if task_forced:
        parts.append(f"any per-task verdict but UNDERPOWERED (a task needs {per_task.get('degraded')} pairs for "
                     f"DEGRADED and {per_task.get('no_change')} for NO CHANGE DETECTED)")
    if not parts:
        return None
    return ("No outcome of this design could have given " + "; nor ".join(parts) + ": those verdicts were decided by "
            "the design, not by the policy. `robocasa-shift plan-power` gives the base episodes per task for 80% "
            "power (--verdict no-change, or --dsr for DEGRADED).")


def _statistics_notes(summary: Dict[str, Any]) -> str:
    """What the intervals, tests, verdicts and power numbers are, and which conditions lack a macro."""
    notes = []
    forced = unreachable_sentence(summary)
    if forced:
        notes.append(f"<p class='note'>{esc(forced)}</p>")
    missing = {c: v["missing_tasks"] for c, v in summary["conditions"].items() if c != "clean" and v.get("missing_tasks")}
    if missing:
        notes.append("<p class='note'>Macro not computed (a macro over fewer tasks would be another quantity): "
                     + "; ".join(f"{esc(c)}: no valid pair for {esc(', '.join(t))}" for c, t in missing.items())
                     + ". Per-task values are shown below.</p>")
    zero = [c for c, v in summary["conditions"].items() if v.get("dsr_ci95_zero_width")]
    if zero:
        notes.append("<p class='note'>Zero-width percentile interval for " + esc(", ".join(zero)) + ": every "
                     "bootstrap resample gave the same macro (each task's pairs all moved the same way). That is not "
                     "certainty; read the calibrated interval beside it.</p>")
    intervals = summary.get("intervals") or {}
    coverage = intervals.get("coverage") or {}
    rule = summary.get("verdict_rule") or {}
    power = summary.get("power") or {}
    families = summary.get("holm_families") or {}
    extended = [c for c, v in summary["conditions"].items() if v.get("dsr_ci95_calibrated_extended_to_zero")]
    if extended:
        notes.append("<p class='note'>Calibrated interval extended to reach 0 for " + esc(", ".join(extended)) + ": its "
                     "95% interval alone excludes 0, but the exact sign-flip test does not reject after Holm across "
                     "the conditions, so no direction is claimed and the interval shown says so.</p>")
    undirected = [c for c, v in summary["conditions"].items()
                  if c != "clean" and (v.get("signflip") or {}).get("p_holm") is not None
                  and v["signflip"]["p_holm"] < rule.get("alpha", 0.05) and v.get("verdict") in ("UNDERPOWERED",
                                                                                                "NO CHANGE DETECTED")]
    if undirected:
        notes.append("<p class='note'>The exact sign-flip test rejects after Holm, but the calibrated interval still "
                     "reaches 0, for " + esc(", ".join(undirected)) + ": a direction is claimed only where the test and "
                     "the interval agree (typically a task at the ceiling, whose interval keeps the width its pair "
                     "count allows while the test, conditional on the discordant pairs, ignores it).</p>")
    notes.append(
        "<p class='small'>"
        f"<b>Calibrated 95% CI</b> (the interval every verdict is read from; {esc(coverage.get('calibrated', ''))}): "
        f"{esc(intervals.get('dsr_ci95_calibrated', ''))}.<br>"
        f"<b>Percentile 95% CI</b> (the paper's method, for comparison only; {esc(coverage.get('percentile', ''))}): "
        f"{esc(intervals.get('dsr_ci95', ''))}. Coverage grid: {esc(coverage.get('grid', ''))}.<br>"
        f"Bootstrap: {summary['bootstrap']['n_boot']} resamples within task, seed {summary['bootstrap']['seed']}; "
        f"Macro = equal-weight mean over tasks. Stage measures over strictly matched S->F pairs.<br>"
        f"Verdicts ({esc(', '.join(rule.get('vocabulary', [])))}), margin +-{num(rule.get('min_effect'), '.2f')}: "
        f"{esc(rule.get('rule', ''))}.<br>"
        f"Across conditions: {esc(rule.get('multiplicity', 'verdicts are per condition'))}.<br>"
        f"Minimum dSR read DEGRADED (smallest / from which every larger one has the power): "
        f"{esc(power.get('verdict', ''))}, "
        f"alpha {esc(power.get('alpha', ''))}, power {esc(power.get('power', ''))}; the discordance assumption: "
        f"{esc(power.get('assumption', ''))}.<br>"
        "Holm families: " + "; ".join(f"<b>{esc(k)}</b>: {esc(v)}" for k, v in families.items()) + ".</p>"
    )
    return "".join(notes)


def _invalid_section(summary: Dict[str, Any]) -> str:
    """Invalid rollouts and pairs: open when there are any, folded when every rollout and pair is valid."""
    reasons = summary.get("invalid_pair_reasons") or []
    rows, any_invalid = [], False
    for c, v in summary["conditions"].items():
        pairs = v.get("invalid_pairs") or {}
        any_invalid |= bool(v.get("n_invalid")) or any(pairs.values())
        rows.append([c, v.get("n_invalid", 0), *[pairs.get(r, "-") if c != "clean" else "-" for r in reasons]])
    table = html_table(["condition", "invalid rollouts", *[f"pairs: {r.replace('_', ' ')}" for r in reasons]], rows)
    note = ("<p class='small'>A pair is valid when both twins are valid and the perturbed rollout's env and policy "
            f"fingerprints equal its clean twin's ({PROTOCOL_PAGE}, section 6); one reason per invalid pair, the first "
            "that applies in this order.</p>")
    title = "Invalid rollouts and pairs" if any_invalid else "Invalid rollouts and pairs: none"
    return f"<details{' open' if any_invalid else ''}><summary>{title}</summary><div class='scroll'>{table}</div>{note}</details>"


def _analysis_sections(summary: Dict[str, Any], out: Path) -> List[str]:
    """The blocks of the registered analyses (``analysis/sections.py``), in their order."""
    from robocasa_shift.analysis.sections import sections
    from robocasa_shift.registry import resolve_target

    return [resolve_target(s.report)(summary, out) for s in sections() if s.report]


def unpaired_section(summary: Dict[str, Any], out: Path) -> str:
    """Scene variants against their originals, unpaired (analysis section ``unpaired_variants``)."""
    if not summary.get("unpaired_variants"):
        return ""
    return ("<h2>Scene variants against their originals (UNPAIRED)</h2>"
            "<p class='small'>A scene variant has its own objects or positions and its own initial states, "
            "so none of its rollouts has a twin: clean success rates are compared as two samples, with a "
            "two-sample percentile bootstrap. The perturbation tables above stay paired within each task.</p>"
            + html_table(["variant", "original", "SR variant (n)", "SR original (n)", "difference", "95% CI"],
                         [[r["task"], r["original"], f"{r['sr_variant']:.3f} ({r['n_variant']})",
                           f"{r['sr_original']:.3f} ({r['n_original']})", f"{r['difference']:+.3f}",
                           ci(r["ci95"])] for r in summary["unpaired_variants"]]))


def noise_floor_section(summary: Dict[str, Any], out: Path) -> str:
    """The clean-vs-clean flip rate (analysis section ``noise_floor``), when the run has replicate-1 clean rollouts."""
    nf = summary.get("noise_floor")
    if not nf or nf["macro_flip_rate"] is None:
        return ""
    return f"<p>Clean-vs-clean flip rate (noise floor, replicate 1): macro {nf['macro_flip_rate']:.3f}</p>"


def trend_section(summary: Dict[str, Any], out: Path) -> str:
    """The severity tests' block (analysis section ``trend``)."""
    return "<h2>Severity: does a higher level ever hurt less?</h2>" + _trend_html(summary)


def _trend_html(summary: Dict[str, Any]) -> str:
    trend = summary.get("trend") or {}
    if not trend:
        return "<p>No factor has two levels in this run.</p>"
    rows, notes = [], []
    for factor, t in trend.items():
        dsr = ", ".join(f"{Condition.parse(c).level} {num(summary['conditions'][c]['macro_dsr'])}" for c in t["levels"])
        if t["flag"]:
            status = ("REVERSAL: the test rejects L1 <= L2 <= L3", "bad")
        elif t["flag"] is None:
            status = "no test (no shared pairs)"
        else:
            status = "no evidence of a reversal"
        if t.get("trend"):
            trend_status = ("TREND: dSR rises with the level", "good")
        elif t.get("trend") is None:
            trend_status = "no test (no base episode valid under every level)"
        else:
            trend_status = "no evidence of a trend"
        rows.append([factor, dsr, num(t["p"], ".3g"), num(t["p_holm"], ".3g"), status,
                     num(t.get("trend_p"), ".3g"), num(t.get("trend_p_holm"), ".3g"), trend_status])
        notes += [f"{factor}: point-estimate reversal, {r}" for r in t["reversals"]]
    out = html_table(["factor", "macro dSR by level", "reversal p (one-sided, Bonferroni over level pairs)",
                      "reversal p (Holm across factors)", "reversal test", "trend p (one-sided)",
                      "trend p (Holm across factors)", "trend test"], rows)
    if notes:
        out += "<p class='small'>Notes: " + "<br>".join(esc(n) for n in notes) + "</p>"
    return out + ("<p class='small'>Reversal test: for every pair of levels, the exact stratified sign-flip test on the "
                  "perturbed outcomes of the same base episodes, one-sided towards the higher level succeeding more. Not "
                  "rejecting is no evidence of a reversal; it does not show that dSR grows with the level. Trend test: "
                  "the exact stratified trend test over every level at once, within base episode (episodes valid "
                  "under every level; within an episode the levels at which it failed are exchangeable under the "
                  "null), tasks weighted as in the macro, one-sided towards failures rising with the level; a "
                  "rejection (Holm across factors) supports \"dSR rises with the level\", a trend, not that every "
                  "step rises.</p>")


# --------------------------------------------------------------------------- the lead screen


def _verdict_grid(summary: Dict[str, Any], factor_order: Sequence[str]) -> str:
    """One row per factor, grouped by family (the dSR figure's order), one cell per level: macro dSR, calibrated
    interval and verdict on three lines, coloured by verdict, so every level fits a 1280-pixel window."""
    groups = factor_groups(summary["conditions"], factor_order)
    if not groups:
        return "<p>No perturbed condition in this run.</p>"
    width = max(len(levels) for _, _, levels in groups)
    rows = []
    for family, factor, levels in groups:
        cells = [f"<td>{esc(family)}</td><td>{esc(factor)}</td>"]
        for c in levels:
            v = summary["conditions"][c]
            verdict = v.get("verdict") or "no valid pair"
            cells.append(f"<td class='{esc(VERDICT_CLASS.get(verdict, ''))}'><b>{esc(Condition.parse(c).level)}</b> "
                         f"{esc(num(v['macro_dsr']))}<br>{esc(ci(v.get('dsr_ci95_calibrated')))}<br>{esc(verdict)}</td>")
        rows.append("<tr>" + "".join(cells) + "<td>-</td>" * (width - len(levels)) + "</tr>")
    head = "".join(f"<th>{esc(h)}</th>" for h in ["family", "factor", *[f"level {i + 1}" for i in range(width)]])
    return f"<table class='verdicts'><tr>{head}</tr>{''.join(rows)}</table>"


INTERACTION_HEADER = ["combination A+B", "episodes (quadruples)", "dSR(A)", "dSR(B)", "dSR(A) + dSR(B)", "dSR(A+B)",
                      "interaction dSR(A+B) - dSR(A) - dSR(B)", "calibrated 95% CI", "verdict",
                      "additivity test p (Holm)"]
INTERACTION_CLASS = {"COMPOUNDING": "bad", "SUB-ADDITIVE": "good", "ADDITIVE": "good", "UNDERPOWERED": "warn"}


def interaction_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    """One row per combination for :data:`INTERACTION_HEADER` (macro over tasks, same base episodes)."""
    rows = []
    for condition, v in (summary.get("interactions") or {}).items():
        total = None if v["dsr_a"] is None else v["dsr_a"] + v["dsr_b"]
        verdict = v.get("verdict")
        rows.append([condition, v["n_quadruples"], num(v["dsr_a"]), num(v["dsr_b"]), num(total), num(v["dsr_ab"]),
                     num(v["interaction"]), ci(v.get("interval_shown")),
                     (verdict, INTERACTION_CLASS.get(verdict, "")) if verdict else
                     ("no valid quadruple for " + ", ".join(v["missing_tasks"]), "warn"),
                     num((v.get("additivity_test") or {}).get("p_holm"), ".3g")])
    return rows


def interaction_section(summary: Dict[str, Any], out: Path) -> str:
    """The interaction table and figure (analysis section ``interactions``), and how to read them; empty when the
    run has no combination."""
    if not summary.get("interactions"):
        return ""
    fig_interactions(summary, out / "interactions.png")
    method = summary.get("interaction_method") or {}
    per_task = [[c, t, p["n"], num(p["dsr_a"]), num(p["dsr_b"]), num(p["dsr_ab"]), num(p["interaction"]),
                 ci(p["interval"])] for c, v in summary["interactions"].items() for t, p in v["per_task"].items()]
    return ("<h2>Combined shifts: does A+B hurt more than A and B alone add up to?</h2>"
            f"<div class='scroll'>{html_table(INTERACTION_HEADER, interaction_rows(summary))}</div>"
            "<figure><img src='interactions.png' alt='interactions of combined conditions'></figure>"
            "<details><summary>Per task</summary><div class='scroll'>"
            + html_table(["combination", "task", "episodes", "dSR(A)", "dSR(B)", "dSR(A+B)", "interaction",
                          "calibrated 95% CI"], per_task)
            + "</div></details>"
            f"<p class='small'>Every number is on the same base episodes: those valid clean, under A, under B and under "
            f"A+B (the combined rollout reuses exactly the single factors' draws). COMPOUNDING: the combination hurts "
            f"more than the sum (LIBERO-Plus's negative compositional effect); SUB-ADDITIVE: less; ADDITIVE only when "
            f"the interval lies inside the margin; otherwise UNDERPOWERED. {esc(method.get('estimate', ''))}. "
            f"Coverage of the interval: {esc(method.get('coverage', ''))}.</p>")


def _family_section(summary: Dict[str, Any]) -> str:
    """Every factor by family, with its levels in this run and the backends that can run it (folded)."""
    from robocasa_shift.checks.factor_support import YES, factor_table
    from robocasa_shift.core.shifts import FAMILIES

    table = factor_table(load_protocol())
    backends = sorted(table[0]["backends"]) if table else []
    rows = []
    for row in table:
        run = [c for c in row["levels"] if c in summary["conditions"]]
        rows.append([row["family"], row["factor"], "matrix" if row["matrix"] else "optional",
                     ", ".join(Condition.parse(c).level for c in run) or "-",
                     *[("yes", "good") if row["backends"][b]["status"] == YES else
                       (f"{row['backends'][b]['status']}: {row['backends'][b]['why']}", "") for b in backends]])
    legend = "; ".join(f"<b>{esc(f)}</b>: {esc(d)}" for f, d in FAMILIES.items())
    return ("<details><summary>Factors by family, and the backends that run them</summary><div class='scroll'>"
            + html_table(["family", "factor", "in", "levels in this run", *backends], rows)
            + f"</div><p class='small'>{legend}. A backend runs a factor when its environment offers every hook the "
              "factor's kind calls (core/backend.py); image transforms and deployment shifts need none.</p></details>")


def _coverage_line(summary: Dict[str, Any]) -> str:
    """The measured coverage of both intervals, beside the lead's verdicts."""
    short = (summary.get("intervals") or {}).get("coverage_short") or {}
    if not short:
        return ""
    return (f"<p class='small'>Calibrated 95% CI ({esc(short.get('calibrated', ''))}), extended to 0 wherever the "
            f"exact test does not reject, so an interval that excludes 0 is always DEGRADED or IMPROVED; the paper's "
            f"percentile bootstrap ({esc(short.get('percentile', ''))}) is in the table below, for comparison. "
            "Verdicts are Holm-adjusted across the conditions (NO CHANGE DETECTED too).</p>")


def _stage_story(summary: Dict[str, Any], stage_names: Dict[str, List[str]]) -> str:
    """Where the lost (S->F) pairs stopped, in a sentence, and why the stage diagnostic says little when they all
    stopped at the first subgoal."""
    perturbed = [v for c, v in summary["conditions"].items() if c != "clean"]
    n_sf = sum(v["sf"]["n"] for v in perturbed)
    if not n_sf:
        return "<p>No pair lost success under any condition (no S->F pair), so there is no failure to locate.</p>"
    counts: Dict[str, Dict[str, int]] = {}
    for v in perturbed:
        for task, by_stage in v["sf"]["first_incomplete_by_task"].items():
            for stage, n in by_stage.items():
                counts.setdefault(task, {}).setdefault(stage, 0)
                counts[task][stage] += int(n)
    parts = []
    for task, by_stage in sorted(counts.items()):
        total = sum(by_stage.values())
        if not total:
            continue
        names = stage_names.get(task, [])
        top = max(by_stage, key=lambda s: by_stage[s])
        label = f"g{top} {names[int(top) - 1]}" if top != "complete" and int(top) <= len(names) else top
        parts.append(f"{task}: {by_stage[top]} of {total} at {label}")
    at_first = sum(by.get("1", 0) for by in counts.values())
    text = (f"<p>{n_sf} pairs lost success under a shift. The first subgoal the perturbed rollout did not reach, "
            f"most often: {esc('; '.join(parts))}.</p>")
    if at_first == n_sf:
        text += ("<p class='note'>Every lost pair stopped before its first subgoal: the shifts broke the policy before "
                 "it first reached its first milestone, so the stage diagnostic cannot tell the conditions apart on "
                 "this run (every S->F pair has the same depth). It separates them when some failures happen later "
                 "in the task, as on tasks with more stages or a policy that gets further under shift.</p>")
    return text


def _design_reach(summary: Dict[str, Any]) -> str:
    """What the study's design could and could not have shown, in words, for the first screen.

    Could: the minimum detectable dSR (80% power) across the perturbed conditions. Could not: NO CHANGE
    DETECTED when even a study in which no pair changed would leave the calibrated interval wider than the
    margin, and DEGRADED when even every pair lost would not reject after Holm with an interval above 0; then
    the base episodes per task that would make it reachable.
    """
    perturbed = {c: v for c, v in summary["conditions"].items() if c != "clean" and v.get("per_task_n_pairs")}
    if not perturbed:
        return ""
    margin = (summary.get("verdict_rule") or {}).get("min_effect", stats.MIN_EFFECT)
    pairs = min((min(v["per_task_n_pairs"].values()) for v in perturbed.values()), default=0)
    n_tasks = len(summary["tasks"])
    if pairs < 1:
        return ""

    def no_change_possible(n: int) -> bool:
        lo, hi = stats.calibrated_interval([[n, 0, 0, 0]] * n_tasks)
        return max(-lo, hi) <= margin + 1e-12

    def degraded_possible(n: int) -> bool:
        p = stats.signflip_test([n] * n_tasks, [n] * n_tasks, [0] * n_tasks).p
        return p * len(perturbed) < stats.ALPHA and stats.calibrated_interval([[0, n, 0, 0]] * n_tasks)[0] > 0

    def first(possible) -> Optional[int]:
        return next((n for n in range(pairs, 401) if possible(n)), None)

    mdes = [v["power"]["mde_dsr"] for v in perturbed.values() if (v.get("power") or {}).get("mde_dsr") is not None]
    design = f"{n_tasks} task(s) x {pairs} base episode(s)"
    could = (f"at its observed discordance, each condition had 80% power to detect a macro dSR of "
             f"{min(mdes):.2f} to {max(mdes):.2f} (\"min. detectable dSR\" below)" if mdes else
             "no condition's power could be computed")
    cannot = []
    for word, possible in (("DEGRADED", degraded_possible), ("NO CHANGE DETECTED", no_change_possible)):
        if not possible(pairs):
            needed = first(possible)
            cannot.append(f"no outcome of this design could have given {word}" + (
                f" (it needs at least {needed} base episodes per task)" if needed else ""))
    tail = ("; " + "; ".join(cannot)) if cannot else "; every verdict was within its reach"
    return f"<p><b>What this study could show</b> ({esc(design)}): {esc(could)}{esc(tail)}.</p>"


def _lead(run_dir: Path, summary: Dict[str, Any], manifest: Mapping[str, Any], audit: Optional[Dict[str, Any]],
          audit_note: Optional[str], stage_names: Dict[str, List[str]], factor_order: Sequence[str],
          formal: pd.DataFrame) -> str:
    policy = (manifest.get("policy") or {}).get("name", "?") if isinstance(manifest.get("policy"), dict) else "?"
    episodes = formal[formal["condition"] == "clean"]["episode"].nunique()
    planned = len({k.episode for k in RunStore(run_dir).planned_keys() if k.phase == "formal"})
    episodes_text = f"{episodes} base episode(s) each" if planned <= episodes else \
        f"{episodes} of {planned} planned base episode(s) recorded"
    clean = summary["conditions"]["clean"]["macro_sr"]
    if audit is None:
        status = ("audit missing: run robocasa-shift audit", "warn")
    elif audit_note:
        status = (("audit PASSED" if audit["passed"] else "audit FAILED") + " (older than the records)", "warn")
    else:
        status = ("audit PASSED", "good") if audit["passed"] else ("audit FAILED", "bad")
    facts = (f"Policy <b>{esc(policy)}</b> on backend <b>{esc(manifest.get('backend', '?'))}</b>: "
             f"{len(summary['tasks'])} task(s) ({esc(', '.join(summary['tasks']))}), {episodes_text}, "
             f"{len(summary['conditions'])} conditions. Clean macro success "
             f"{'not computed (a task has no valid clean rollout)' if clean is None else f'{clean:.3f}'}. "
             f"<span class='{status[1]} badge'>{esc(status[0])}</span>")
    return ("<section class='lead'>"
            f"<p>{facts}</p>"
            f"{_design_reach(summary)}"
            "<h2>Verdicts: paired macro dSR (clean - perturbed), calibrated 95% CI</h2>"
            f"<div class='scroll'>{_verdict_grid(summary, factor_order)}</div>"
            f"{_coverage_line(summary)}"
            "<figure><img src='macro_dsr.png' alt='macro dSR per factor and level'></figure>"
            f"{_stage_story(summary, stage_names)}"
            "</section>")


# --------------------------------------------------------------------------- other sections


def _subgoal_legend(stage_names: Dict[str, List[str]]) -> str:
    return "<p class='small'>" + "<br>".join(
        f"{esc(t)}: " + ", ".join(f"g{i + 1} {esc(n)}" for i, n in enumerate(names)) for t, names in stage_names.items()
    ) + "</p>"


def _first_incomplete_table(summary: Dict[str, Any], stage_names: Dict[str, List[str]]) -> str:
    """Counts of the first incomplete subgoal of S->F pairs: integers, g1..gK in order, then complete.

    A subgoal a task does not have is shown as '-', never as 0.
    """
    k_max = max([len(n) for n in stage_names.values()] + [
        int(key) for v in summary["conditions"].values() for counts in (v.get("sf") or {}).get("first_incomplete_by_task", {}).values()
        for key in counts if key != "complete"] + [0])
    header = ["condition", "task", *[f"g{i}" for i in range(1, k_max + 1)], "complete"]
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        for task, counts in v["sf"]["first_incomplete_by_task"].items():
            if sum(counts.values()):
                rows.append([c, task, *[int(counts[str(i)]) if str(i) in counts else "-" for i in range(1, k_max + 1)],
                             int(counts.get("complete", 0))])
    if not rows:
        return "<p>No S->F pairs.</p>"
    return html_table(header, rows)


def _audit_table(audit: Dict[str, Any]) -> str:
    rows = []
    for task, t in audit["tasks"].items():
        row = {"task": task, "expected": t["expected_rollouts"], "valid": t["valid_rollouts"], "distinct episodes": t["distinct_base_episodes"]}
        # an audit written before a check existed has no count for it
        row.update({LABELS[c]: t["checks"].get(c, {}).get("count", "-") for c in ZERO_CHECKS})
        row["passed"] = "yes" if t["passed"] else "NO"
        rows.append(row)
    verdict = "<p class='good'>Audit passed.</p>" if audit["passed"] else "<p class='bad'>Audit FAILED: see audit.md.</p>"
    return verdict + (f"<details><summary>Per task, every check</summary><div class='scroll'>{frame_table(pd.DataFrame(rows))}"
                      "</div></details>" if rows else "")


def _known_conditions(df: pd.DataFrame) -> Tuple[pd.DataFrame, List[str]]:
    """Rows whose condition the frozen spec knows, and the conditions it does not know.

    A record's condition string is data from the run directory; it is checked against the protocol
    before it reaches a table, a file name or the page.
    """
    if df.empty:
        return df, []
    protocol = load_protocol()
    unknown = []
    for condition in sorted(set(map(str, df["condition"]))):
        try:
            protocol.condition(condition)
        except (UnknownNameError, BadInput):
            unknown.append(condition)
    return df[~df["condition"].astype(str).isin(unknown)].reset_index(drop=True), unknown


def _record_kits(df: pd.DataFrame) -> List[Dict[str, Any]]:
    """The asset kit each record ran on (the records table's ``asset_kit`` columns; empty means none)."""
    if df.empty or "asset_kit" not in df:
        return [{} for _ in range(len(df))]
    return [{"asset_kit": a or None, "asset_kit_sha256": s or None}
            for a, s in zip(df["asset_kit"].fillna(""), df["asset_kit_sha256"].fillna(""))]


def incomplete_notice(store: RunStore) -> Optional[str]:
    """A sentence when formal rollouts planned on the run are not recorded yet (a run in progress, or stopped)."""
    planned = [k for k in store.planned_keys() if k.phase == "formal"]
    recorded = {k for k in store.recorded_keys() if k.phase == "formal"}
    missing = [k for k in planned if k not in recorded]
    if not missing:
        return None
    episodes = len({(k.task, k.episode) for k in planned})
    return (f"INCOMPLETE RUN: {len(planned) - len(missing)} of {len(planned)} planned formal rollouts are recorded "
            f"({episodes} task-episode pairs planned); every number here is from the recorded part. Finish the run "
            f"(the same command skips what is recorded), then report again.")


def _banner_html(text: str) -> str:
    """The run's label (stand-in kit, fake backend), at the top and the bottom of the page."""
    return (f"<p class='standin-banner' style='background:#a40000;color:#fff;font-weight:bold;padding:0.6em;"
            f"font-size:1.1em'>{esc(text)}</p>")


def _run_details(run_dir: Path, manifest: Mapping[str, Any], n_records: int) -> str:
    meta = {
        "policy": manifest.get("policy"),
        "policy options": manifest.get("policy_options"),
        "backend": manifest.get("backend"),
        "asset kit": kits.run_asset_kit(manifest),
        "spec hash": manifest.get("spec_hash"),
        "study seed": manifest.get("study_seed"),
        "renderer": {k: (manifest.get("renderer") or {}).get(k) for k in ("gl_renderer", "render_profile", "MUJOCO_GL")},
        "simulator": manifest.get("simulator"),
        "versions": manifest.get("versions"),
        "records": n_records,
    }
    return ("<details><summary>Run details: policy identity, specs, renderer, versions</summary>"
            "<table class='meta'>" + "".join(f"<tr><th>{esc(k)}</th><td>{identity_html(v)}</td></tr>"
                                             for k, v in meta.items()) + "</table></details>")


def _video_section(videos: List[Dict[str, Any]], videos_per_kind: int, external_loop: bool) -> List[str]:
    parts = ["<h2>Matched pairs, clean beside perturbed</h2>"]
    if not videos:
        if not videos_per_kind:
            parts.append("<p>No videos requested (--videos 0).</p>")
        elif external_loop:
            parts.append("<p>No videos: this run was driven by another program's loop (robocasa_shift.gym), which "
                         "the report cannot re-run to capture frames.</p>")
        else:
            parts.append("<p>No S->F or F->S pair in this run.</p>")
    for v in videos:
        if v.get("source") == "logged":
            status = ("filmed from the third-person frames the run logged (nothing re-run; both files have the "
                      "SHA-256 their records hold)")
        else:
            status = "re-run reproduced the recorded outcome and subgoal steps exactly" if v["reproduced"] else \
                "<b>re-run did NOT reproduce the record</b>: " + esc("; ".join(v["problems"]))
        if v.get("kept"):
            status = "kept from the previous report of these same two records (not filmed again); " + status
        parts.append(f"<h3>{esc(v['kind'])}: {esc(v['task'])} episode {esc(v['episode'])}, {esc(v['condition'])}</h3>"
                     f"<video controls preload='metadata' src='{src(v['file'])}'></video><p class='small'>{status}. "
                     f"Subgoal steps, clean: {esc(stage_steps_text(v['subgoals'], v['clean_stage_steps']))}; "
                     f"perturbed: {esc(stage_steps_text(v['subgoals'], v['perturbed_stage_steps']))}.</p>")
    return parts


def _check_reports(run_dir: Path) -> List[str]:
    """Screening, calibration and the validations, each folded, as their commands wrote them."""
    parts = []
    for title, path in (("Screening", "screening/screening.md"), ("Severity calibration", "calibration/calibration.md"),
                        ("Stage validation", "validation/stages.md"), ("Pairing validation", "validation/pairing.md")):
        if os.path.lexists(run_dir / path):
            body = markdown_html(read_text(run_dir / path, run_dir, MAX_JSON_BYTES, "check report"))
            if path.startswith("calibration"):
                for sheet in sorted((run_dir / "calibration").glob("contact_sheet_*.png")):
                    body += (f"<figure><img src='{src('../calibration/' + sheet.name)}' alt='{esc(sheet.stem)}' "
                             f"style='max-width:480px'><figcaption>{esc(sheet.stem)}</figcaption></figure>")
            parts.append(f"<details><summary>{title}</summary><div class='scroll'>{body}</div></details>")
    return (["<h2>Protocol checks</h2>"] + parts) if parts else []


# --------------------------------------------------------------------------- the page


def build_report(run_dir: Path | str, videos_per_kind: int = 2, bootstrap_seed: int = 0, n_boot: int = 10000,
                 min_effect: float = 0.10, policy_options: Optional[Mapping[str, Any]] = None,
                 trust_run_dir: bool = False, progress: bool = False) -> Path:
    """Write ``run_dir/report/index.html`` with its figures and videos; return the page's path.

    The pair videos re-run rollouts with the run's policy; where it connects and how it decodes
    replies come from ``policy_options`` (the caller's command line), never from the run
    directory, unless ``trust_run_dir`` (see ``engine.replay.replay_policy_options``). ``progress``: a bar
    with the time left while the pair videos re-run their rollouts.

    Raises:
        RunDirError: ``run_dir`` has no manifest (not a run directory: nothing is written into it).
    """
    run_dir = Path(run_dir)
    with confined(run_dir):  # below the run directory nothing is read or written through a symbolic link
        if "imported" in (RunStore(run_dir).manifest() or {}):
            from robocasa_shift.report.imported import build_imported_report

            return build_imported_report(run_dir, min_effect=min_effect)
        return _build_report(run_dir, videos_per_kind, bootstrap_seed, n_boot, min_effect, policy_options,
                             trust_run_dir, progress)


def _behaviour_section(behaviour: Mapping[str, Any]) -> List[str]:
    """The "Behaviour" tables beside the verdicts: per task, the paired differences from the step logs (none without
    step logs)."""
    if not behaviour:
        return []
    parts = ["<h2>Behaviour (paired, from the step logs)</h2>"]
    for task, per_condition in behaviour.items():
        parts += [f"<h3>{esc(task)}</h3>", *[f"<div class='scroll'>{t}</div>" if t.startswith("<table") else t
                                            for t in behaviour_tables(per_condition)]]
    return parts


def _build_report(run_dir: Path, videos_per_kind: int, bootstrap_seed: int, n_boot: int, min_effect: float,
                  policy_options: Optional[Mapping[str, Any]], trust_run_dir: bool, progress: bool) -> Path:
    out = run_dir / "report"
    store = RunStore(run_dir)
    manifest = store.require_manifest("report")
    df, unknown = _known_conditions(records_frame(run_dir))
    check_video_dependencies(run_dir, manifest, df, videos_per_kind)  # a missing extra is said before anything is written
    audit, audit_note = read_audit(run_dir)
    factor_order = load_protocol().factor_order
    kit = kits.run_asset_kit(manifest)
    mixed = kits.kit_problems(manifest, _record_kits(df))
    if mixed:
        raise RunDirError(f"{run_dir}: no report of a run that mixes asset kits: {'; '.join(mixed)}")
    kit_banner = kits.run_banner(manifest)
    parts = [_banner_html(kit_banner)] if kit_banner else []
    parts.append(f"<h1>robocasa-shift report: {esc(run_dir.name)}</h1>")
    incomplete = incomplete_notice(store)
    if incomplete:
        parts.append(f"<p class='bad'><b>{esc(incomplete)}</b></p>")
    if unknown:
        parts.append("<p class='bad'>Left out: records whose condition is not in the frozen spec: "
                     + esc(", ".join(repr(c) for c in unknown)) + ". The audit fails on such a run directory.</p>")
    suite_path = run_dir / "suite.json"
    suite = read_json(suite_path, run_dir, MAX_JSON_BYTES, "suite file") if os.path.lexists(suite_path) else {}
    if isinstance(suite, dict) and suite.get("note"):
        parts.append(f"<p class='note'>{esc(suite['note'])}</p>")

    formal = df[df["phase"] == "formal"] if not df.empty else df
    videos: List[Dict[str, Any]] = []
    if not formal.empty:
        variants = manifest.get("task_variants") if isinstance(manifest.get("task_variants"), dict) else {}
        behaviour = formal_behaviour(store, store.records())
        summary = write_analysis(formal, run_dir / "analysis", behaviour, n_boot=n_boot, bootstrap_seed=bootstrap_seed,
                                 min_effect=min_effect, variant_of={str(k): str(v) for k, v in variants.items()},
                                 factor_order=factor_order)
        stage_names = {t: json.loads(formal[formal.task == t].stage_names.iloc[0]) for t in summary["tasks"]}
        fig_macro_dsr(summary, out / "macro_dsr.png", factor_order)
        fig_task_dsr(summary, out / "task_dsr.png")
        fig_transitions(summary, out / "transitions.png")
        fig_stage_depth(summary, stage_names, out / "stage_depth.png")
        parts += [
            _lead(run_dir, summary, manifest, audit, audit_note, stage_names, factor_order, formal),
            "<h2>Paired degradation (macro over tasks)</h2>",
            f"<div class='scroll'>{html_table(DSR_HEADER, dsr_rows(summary))}</div>",
            *_behaviour_section(behaviour),
            _statistics_notes(summary),
            _per_task_section(summary),
            "<h2>Success rate per condition and task</h2>",
            f"<div class='scroll'>{frame_table(sr_table(summary))}</div>",
            _invalid_section(summary),
            *_analysis_sections(summary, out),
            "<h2>Where the lost pairs stopped (stage depth of S->F pairs)</h2>",
            "<figure><img src='stage_depth.png' alt='first incomplete subgoal'></figure>",
            _subgoal_legend(stage_names),
            f"<div class='scroll'>{_first_incomplete_table(summary, stage_names)}</div>",
            "<h2>Outcome transitions (clean -> perturbed)</h2>",
            "<figure><img src='transitions.png' alt='transitions'></figure>",
            f"<div class='scroll'>{html_table(TRANSITION_HEADER, transition_rows(summary))}</div>",
            "<p class='small'>McNemar pooled over tasks weights pairs, not tasks: a diagnostic beside the "
            "sign-flip test of the macro.</p>",
            _family_section(summary),
        ]
        videos = make_videos(run_dir, df, out, videos_per_kind, policy_options, trust_run_dir, progress)
        external = bool((manifest.get("policy") or {}).get("driver")) if isinstance(manifest.get("policy"), dict) else False
        parts += _video_section(videos, videos_per_kind, external)
    else:
        parts.append("<p>No formal-phase records yet.</p>")

    parts += sweep_sections(run_dir)
    parts += branching_sections(run_dir)
    parts += monitor_sections(run_dir)
    parts += judge_sections(run_dir)
    parts += ["<h2>Integrity audit</h2>"]
    if audit_note:
        parts.append(f"<p class='note'>{esc(audit_note)}</p>")
    if audit is not None:
        parts.append(_audit_table(audit))
    parts += _check_reports(run_dir)
    parts.append(_run_details(run_dir, manifest, len(df)))
    if kit_banner:
        parts.append(_banner_html(kit_banner))
    title = f"{kits.STANDIN_BANNER if kits.is_standin(kit) else kits.TESTING_BANNER}: " if kit_banner else ""
    page = (f"<!doctype html><html><head><meta charset='utf-8'><meta name='viewport' content='width=device-width'>"
            f"<title>{esc(title)}robocasa-shift report: {esc(run_dir.name)}</title><style>{CSS}</style></head>"
            f"<body>{''.join(parts)}</body></html>")
    atomic_write_text(out / "index.html", page)
    atomic_write_json(out / "videos.json", videos)
    return out / "index.html"
