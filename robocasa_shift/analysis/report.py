"""``report D``: an HTML page with tables, PNG figures and side-by-side videos of matched pairs.

Videos are made by re-running selected pairs with frame capture
(:mod:`robocasa_shift.engine.replay`; rollouts are deterministic given their
key) instead of recording every rollout; the re-run must reproduce the
recorded outcome and subgoal completion steps exactly, and the page says so
when it does not. The audit section shows ``audit.json`` as ``audit`` wrote
it, and says so when it is missing or older than the records.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple
from urllib.parse import quote

import numpy as np
import pandas as pd

from robocasa_shift.analysis.branching import condition_display
from robocasa_shift.analysis.export import records_frame
from robocasa_shift.analysis.measures import write_analysis
from robocasa_shift.checks.audit import LABELS, ZERO_CHECKS, read_audit
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.engine.replay import FrameCapture, Replayer
from robocasa_shift.errors import UnknownNameError
from robocasa_shift.specs import load_protocol, load_stage_spec, parse_condition
from robocasa_shift.study.store import RunStore

VIDEO_SCALE = 2  # frames are upscaled for viewing
VIDEO_FPS = 20  # the control rate: videos play in real time


# --------------------------------------------------------------------------- figures


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # bbox_inches="tight" keeps a legend placed beside the axes inside the image
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)


def _factor_levels(conditions: List[str]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for c in conditions:
        if c != "clean":
            f, lv = c.split(":")
            out.setdefault(f, []).append(c)
    return out


def fig_macro_dsr(summary: Dict[str, Any], path: Path) -> None:
    """Macro dSR per condition with both intervals: the paper's percentile bootstrap and the calibrated one."""
    plt = _plt()
    groups = _factor_levels(list(summary["conditions"]))
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    x, ticks, labels, factor_x = 0, [], [], {}
    colors = plt.cm.viridis(np.linspace(0.15, 0.85, 3))
    for factor, conds in groups.items():
        for i, c in enumerate(conds):
            v = summary["conditions"][c]
            if v["macro_dsr"] is not None:
                ax.bar(x, v["macro_dsr"], color=colors[i % 3], width=0.8)
                for offset, key, color in ((-0.15, "dsr_ci95", "k"), (0.15, "dsr_ci95_calibrated", "#e07000")):
                    lo, hi = v.get(key) or (v["macro_dsr"], v["macro_dsr"])
                    ax.errorbar(x + offset, v["macro_dsr"], yerr=[[v["macro_dsr"] - lo], [hi - v["macro_dsr"]]],
                                color=color, capsize=3, fmt="none")
            else:
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#a00")
            ticks.append(x)
            labels.append(c.split(":")[1])
            x += 1
        factor_x[factor] = x - len(conds) / 2 - 0.5
        x += 0.7
    for factor, position in factor_x.items():  # after every bar, so all labels sit on the final top edge
        ax.text(position, ax.get_ylim()[1], factor, ha="center", va="bottom", fontsize=9)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(ticks, labels)
    ax.set_ylabel("macro dSR (clean - perturbed)")
    ax.set_title("Paired degradation, 95% intervals: percentile pair bootstrap (black, the paper's method) "
                 "and calibrated (orange)", fontsize=8, pad=16)
    _save(fig, path)


def _label_color(rgba) -> str:
    """Black or white, whichever reads on a cell of this colour (relative luminance, sRGB weights)."""
    r, g, b = rgba[:3]
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "black"


def fig_task_dsr(summary: Dict[str, Any], path: Path) -> None:
    """Per-task dSR heat map; labels white on dark cells, black on light ones."""
    plt = _plt()
    conds = [c for c in summary["conditions"] if c != "clean"]
    tasks = summary["tasks"]
    grid = np.array([[summary["conditions"][c]["per_task_dsr"].get(t) if summary["conditions"][c]["per_task_dsr"].get(t) is not None else np.nan
                      for c in conds] for t in tasks], dtype=float)
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len(tasks)))
    cmap, norm = plt.get_cmap("RdBu_r"), plt.Normalize(vmin=-1, vmax=1)
    im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
    ax.set_xticks(range(len(conds)), conds, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(tasks)), tasks, fontsize=9)
    for i in range(len(tasks)):
        for j in range(len(conds)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color=_label_color(cmap(norm(grid[i, j]))))
    fig.colorbar(im, ax=ax, label="dSR")
    ax.set_title("Per-task paired degradation", fontsize=10)
    _save(fig, path)


def fig_transitions(summary: Dict[str, Any], path: Path) -> None:
    """Stacked transitions per condition; the legend sits beside the axes, never over the bars."""
    plt = _plt()
    conds = [c for c in summary["conditions"] if c != "clean"]
    parts = {"SS": "#4c9a2a", "SF": "#d1495b", "FS": "#00798c", "FF": "#b0b0b0"}
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bottom = np.zeros(len(conds))
    for name, color in parts.items():
        values = np.array([summary["conditions"][c]["transitions"][name] for c in conds], dtype=float)
        ax.bar(range(len(conds)), values, bottom=bottom, color=color, label=f"{name[0]}->{name[1]}")
        bottom += values
    ax.set_xticks(range(len(conds)), conds, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("pairs")
    ax.legend(fontsize=8, title="clean -> perturbed", title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0.0)
    _save(fig, path)


def fig_stage_depth(summary: Dict[str, Any], stage_names: Dict[str, List[str]], path: Path) -> None:
    """S->F pairs: where the perturbed rollout stopped, per task (stacked over conditions)."""
    plt = _plt()
    tasks = summary["tasks"]
    conds = [c for c in summary["conditions"] if c != "clean"]
    fig, axes = plt.subplots(1, len(tasks), figsize=(3.2 * len(tasks), 3.2), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        names = stage_names.get(task, [])
        labels = [f"g{i + 1}" for i in range(len(names))] + ["complete"]
        counts = np.zeros(len(labels))
        for c in conds:
            by_task = summary["conditions"][c]["sf"]["first_incomplete_by_task"].get(task, {})
            counts += [by_task.get(str(i + 1), 0) for i in range(len(names))] + [by_task.get("complete", 0)]
        ax.bar(range(len(labels)), counts, color="#d1495b")
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.yaxis.get_major_locator().set_params(integer=True)  # counts of pairs
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("first incomplete subgoal", fontsize=8)
    axes[0][0].set_ylabel("S->F pairs (all conditions)")
    _save(fig, path)


# --------------------------------------------------------------------------- videos


def _panel(frames: List[np.ndarray], title: str, goals: List[str], done: Dict[str, int], step: int, flash: bool,
           outcome: Optional[str]) -> np.ndarray:
    import cv2

    tiles = [cv2.resize(f, None, fx=VIDEO_SCALE, fy=VIDEO_SCALE, interpolation=cv2.INTER_NEAREST) for f in frames]
    body = np.concatenate(tiles, axis=0)
    if flash:
        cv2.rectangle(body, (0, 0), (body.shape[1] - 1, body.shape[0] - 1), (60, 200, 60), 6)
    w = body.shape[1]
    head = np.full((28, w, 3), 255, np.uint8)
    cv2.putText(head, f"{title}  step {step}", (6, 19), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    foot = np.full((18 * len(goals) + 30, w, 3), 255, np.uint8)
    for i, g in enumerate(goals):
        ok = g in done
        color = (40, 150, 40) if ok else (150, 150, 150)
        text = f"{'[x]' if ok else '[ ]'} g{i + 1} {g}" + (f" @{done[g]}" if ok else "")
        cv2.putText(foot, text, (6, 16 + 18 * i), cv2.FONT_HERSHEY_SIMPLEX, 0.42, color, 1, cv2.LINE_AA)
    if outcome:
        color = (40, 150, 40) if outcome == "SUCCESS" else (200, 40, 40)
        cv2.putText(foot, outcome, (6, 18 * len(goals) + 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, color, 2, cv2.LINE_AA)
    return np.concatenate([head, body, foot], axis=0)


def compose_video(path: Path, left: FrameCapture, right: FrameCapture, titles: Tuple[str, str], goals: List[str],
                  outcomes: Tuple[bool, bool]) -> None:
    import imageio.v2 as imageio

    n = max(len(left.frames), len(right.frames))
    writer = imageio.get_writer(path, fps=VIDEO_FPS, codec="libx264", quality=7, macro_block_size=1,
                                ffmpeg_log_level="error", pixelformat="yuv420p")
    try:
        for t in range(n):
            panels = []
            for cap, title, success in zip((left, right), titles, outcomes):
                i = min(t, len(cap.frames) - 1)
                done = {g: s for s, g in cap.latched if s <= i}
                flash = any(s == i for s, _ in cap.latched)
                end = i == len(cap.frames) - 1
                panels.append(_panel(cap.frames[i], title, goals, done, i, flash, ("SUCCESS" if success else "FAILURE") if end else None))
            frame = np.concatenate([panels[0], np.full((panels[0].shape[0], 8, 3), 255, np.uint8), panels[1]], axis=1)
            if frame.shape[0] % 2 or frame.shape[1] % 2:  # yuv420p needs even sizes
                frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), constant_values=255)
            writer.append_data(frame)
    finally:
        writer.close()


def select_pairs(df: pd.DataFrame, per_kind: int = 2) -> List[Tuple[str, Dict[str, Any], Dict[str, Any]]]:
    """Up to ``per_kind`` S->F and F->S pairs, preferring different conditions and tasks."""
    df = df[(df["phase"] == "formal") & (df["replicate"] == 0) & df["valid"]]
    clean = df[df["condition"] == "clean"].set_index(["task", "episode"])
    chosen = []
    for kind, (c_ok, p_ok) in (("S->F", (True, False)), ("F->S", (False, True))):
        used_conditions, used_tasks, picked = set(), set(), []
        candidates = []
        for _, row in df[df["condition"] != "clean"].iterrows():
            key = (row["task"], row["episode"])
            if key in clean.index and bool(clean.loc[key, "success"]) == c_ok and bool(row["success"]) == p_ok:
                candidates.append((row["condition"], row["task"], int(row["episode"]), row, clean.loc[key]))
        # severe conditions first, then spread over conditions and tasks
        candidates.sort(key=lambda c: (-int(c[0][-1]), c[0], c[1], c[2]))
        for cond, task, ep, row, twin in candidates:
            if len(picked) == per_kind:
                break
            if cond in used_conditions and task in used_tasks and len(candidates) > per_kind:
                continue
            used_conditions.add(cond)
            used_tasks.add(task)
            picked.append((kind, twin.to_dict() | {"task": task, "episode": ep}, row.to_dict()))
        chosen += picked
    return chosen


def make_videos(run_dir: Path, df: pd.DataFrame, out: Path, per_kind: int = 2,
                policy_options: Optional[Mapping[str, Any]] = None, trust_run_dir: bool = False) -> List[Dict[str, Any]]:
    """Re-run the selected pairs with frame capture and write one side-by-side MP4 per pair."""
    pairs = select_pairs(df, per_kind)
    if not pairs:
        return []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stored = {RolloutKey.from_record(r): r for r in RunStore(run_dir).records()}
    videos = []
    with Replayer(manifest, policy_options, trust_run_dir) as replayer:
        for n, (kind, clean_row, pert_row) in enumerate(pairs, start=1):
            task, ep = clean_row["task"], int(clean_row["episode"])
            keys = [RolloutKey("formal", task, ep, cond) for cond in ("clean", pert_row["condition"])]
            clean, perturbed = replayer.replay_all(keys, stored)
            goals = load_stage_spec(manifest["backend"], task).names
            name = f"pair_{n}_{task}_{ep:04d}_{pert_row['condition'].replace(':', '-')}.mp4"
            compose_video(out / name, clean.capture, perturbed.capture, ("clean", pert_row["condition"]), goals,
                          (bool(clean.record.success), bool(perturbed.record.success)))
            videos.append({"file": name, "kind": kind, "task": task, "episode": ep, "condition": pert_row["condition"],
                           "reproduced": clean.reproduced and perturbed.reproduced,
                           "problems": clean.problems + perturbed.problems,
                           "clean_stage_steps": clean.record.stage_steps,
                           "perturbed_stage_steps": perturbed.record.stage_steps, "subgoals": goals})
    return videos


# --------------------------------------------------------------------------- the page

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1180px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em} h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0} th,td{border:1px solid #ddd;padding:3px 7px;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.bad{background:#fbe3e4} .good{background:#e6f4e6} .note{background:#fff6d6;padding:.6em;border-left:4px solid #e0b000}
.warn{background:#fff6d6}
figure{margin:1em 0} img{max-width:100%} video{max-width:100%;border:1px solid #ccc}
.meta td{text-align:left} .meta table{margin:0} .small{font-size:.85em;color:#555} td{white-space:nowrap}
"""

VERDICT_CLASS = {"DEGRADED": "bad", "IMPROVED": "good", "NO CHANGE DETECTED": "good", "UNDERPOWERED": "warn"}


def _esc(value: Any) -> str:
    """Text or an attribute value, HTML-escaped (quotes included)."""
    return html.escape(str(value), quote=True)


def _src(name: str) -> str:
    """A file name as a src/href value: percent-encoded as a URL path, then HTML-escaped."""
    return _esc(quote(name))


def _num(value: Optional[float], spec: str = "+.3f") -> str:
    return "-" if value is None else format(value, spec)


def _ci(ci: Optional[Sequence[float]]) -> str:
    return "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """A table whose cells are values or (value, css class) pairs; every value is escaped."""
    def cell(value: Any) -> str:
        text, css = value if isinstance(value, tuple) else (value, "")
        text = "-" if text is None else text
        return f"<td class='{_esc(css)}'>{_esc(text)}</td>" if css else f"<td>{_esc(text)}</td>"

    head = "<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr>"
    body = "".join("<tr>" + "".join(cell(v) for v in row) + "</tr>" for row in rows)
    return f"<table class='{_esc(cls)}'>{head}{body}</table>"


def _table(df: pd.DataFrame, cls: str = "") -> str:
    return df.to_html(index=False, border=0, classes=cls, na_rep="-", float_format=lambda v: f"{v:.3f}", escape=True)


def _identity_html(value: Any) -> str:
    """A manifest value (policy identity, renderer, versions) as readable, escaped HTML: dicts as nested tables."""
    if isinstance(value, dict):
        if not value:
            return "-"
        return "<table class='meta'>" + "".join(
            f"<tr><th>{_esc(k)}</th><td>{_identity_html(v)}</td></tr>" for k, v in value.items()) + "</table>"
    if isinstance(value, list):
        simple = all(not isinstance(v, (dict, list)) for v in value)
        return _esc(", ".join(map(str, value))) if simple else "<br>".join(_identity_html(v) for v in value)
    return "-" if value is None else _esc(value)


def sr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    """Success rate per task (rows) and condition (columns), with the macro row."""
    rows = []
    for task in summary["tasks"] + ["macro"]:
        row = {"task": task}
        for c, v in summary["conditions"].items():
            value = v["macro_sr"] if task == "macro" else v["per_task_sr"].get(task)
            row[c] = value
        rows.append(row)
    return pd.DataFrame(rows)


DSR_HEADER = ["condition", "pairs", "macro dSR", "95% CI, percentile bootstrap (paper)", "calibrated 95% CI",
              "verdict", "sign-flip p (Holm)", "min. detectable dSR (80% power)", "invalid pairs"]
TRANSITION_HEADER = ["condition", "S->S", "S->F", "F->S", "F->F", "changed", "McNemar p, pooled (Holm)",
                     "S->F mean progress", "first-stage fraction"]


def _invalid_text(counts: Mapping[str, int], missing: Sequence[str] = ()) -> str:
    text = ", ".join(f"{reason.replace('_', ' ')} {n}" for reason, n in counts.items() if n) or "0"
    if missing:
        text += f"; no valid pair for {', '.join(missing)}: macro not computed"
    return text


def dsr_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    """One row per perturbed condition for :data:`DSR_HEADER`; zero-width intervals and verdicts carry a class."""
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        percentile = _ci(v["dsr_ci95"])
        if v.get("dsr_ci95_zero_width"):
            percentile = (percentile + " zero width", "bad")
        verdict = v.get("verdict")
        rows.append([
            c, v.get("n_pairs"), _num(v["macro_dsr"]), percentile, _ci(v.get("dsr_ci95_calibrated")),
            (verdict, VERDICT_CLASS.get(verdict, "")) if verdict else "-",
            _num((v.get("signflip") or {}).get("p_holm"), ".3g"), _num((v.get("power") or {}).get("mde_dsr"), ".3f"),
            (_invalid_text(v.get("invalid_pairs") or {}, v.get("missing_tasks") or []),
             "warn" if v.get("missing_tasks") or any((v.get("invalid_pairs") or {}).values()) else ""),
        ])
    return rows


def transition_rows(summary: Dict[str, Any]) -> List[List[Any]]:
    """One row per perturbed condition for :data:`TRANSITION_HEADER` (pooled over tasks)."""
    rows = []
    for c, v in summary["conditions"].items():
        if c != "clean":
            t = v["transitions"]
            rows.append([c, t["SS"], t["SF"], t["FS"], t["FF"], t["changed"],
                         _num((v.get("mcnemar") or {}).get("p_holm"), ".3g"), _num(v["sf"]["mean_progress"], ".3f"),
                         _num(v["sf"]["first_stage_fraction"], ".3f")])
    return rows


def dsr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    """The paired-degradation table as a frame of display strings (what the page shows)."""
    return pd.DataFrame([[cell[0] if isinstance(cell, tuple) else cell for cell in row] for row in dsr_rows(summary)],
                        columns=DSR_HEADER)


def _per_task_table(summary: Dict[str, Any]) -> str:
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        for task in summary["tasks"]:
            percentile = _ci(v["per_task_dsr_ci95"][task])
            if (v.get("per_task_dsr_ci95_zero_width") or {}).get(task):
                percentile = (percentile + " zero width", "bad")
            verdict = (v.get("per_task_verdict") or {}).get(task)
            rows.append([c, task, v["per_task_n_pairs"][task], _num(v["per_task_dsr"][task]), percentile,
                         _ci((v.get("per_task_dsr_ci95_calibrated") or {}).get(task)),
                         (verdict, VERDICT_CLASS.get(verdict, "")) if verdict else "-",
                         _num(v["mcnemar"]["per_task"][task]["p_holm"], ".3g"),
                         _invalid_text((v.get("per_task_invalid_pairs") or {}).get(task, {}))])
    header = ["condition", "task", "pairs", "dSR", "95% CI, percentile pair bootstrap", "calibrated 95% CI", "verdict",
              "McNemar p (Holm within task)", "invalid pairs"]
    return _html_table(header, rows)


def _statistics_notes(summary: Dict[str, Any]) -> str:
    """What the intervals, tests, verdicts and power numbers are, and which conditions lack a macro."""
    notes = []
    missing = {c: v["missing_tasks"] for c, v in summary["conditions"].items() if c != "clean" and v.get("missing_tasks")}
    if missing:
        notes.append("<p class='note'>Macro not computed (a macro over fewer tasks would be another quantity): "
                     + "; ".join(f"{_esc(c)}: no valid pair for {_esc(', '.join(t))}" for c, t in missing.items())
                     + ". Per-task values are shown below.</p>")
    zero = [c for c, v in summary["conditions"].items() if v.get("dsr_ci95_zero_width")]
    if zero:
        notes.append("<p class='note'>Zero-width percentile interval for " + _esc(", ".join(zero)) + ": every "
                     "bootstrap resample gave the same macro (each task's pairs all moved the same way). That is not "
                     "certainty; read the calibrated interval beside it.</p>")
    intervals = summary.get("intervals") or {}
    rule = summary.get("verdict_rule") or {}
    power = summary.get("power") or {}
    families = summary.get("holm_families") or {}
    notes.append(
        "<p class='small'>"
        f"Bootstrap: {summary['bootstrap']['n_boot']} resamples within task, seed {summary['bootstrap']['seed']}; "
        f"Macro = equal-weight mean over tasks. Stage measures over strictly matched S->F pairs.<br>"
        f"95% CI: {_esc(intervals.get('dsr_ci95', ''))}. Calibrated 95% CI: {_esc(intervals.get('dsr_ci95_calibrated', ''))}.<br>"
        f"Verdicts ({_esc(', '.join(rule.get('vocabulary', [])))}), margin +-{_num(rule.get('min_effect'), '.2f')}: "
        f"{_esc(rule.get('rule', ''))}.<br>"
        f"Minimum detectable dSR: {_esc(power.get('test', ''))}, alpha {_esc(power.get('alpha', ''))}, power "
        f"{_esc(power.get('power', ''))}; assumption: {_esc(power.get('assumption', ''))}.<br>"
        "Holm families: " + "; ".join(f"<b>{_esc(k)}</b>: {_esc(v)}" for k, v in families.items()) + ".</p>"
    )
    return "".join(notes)


def _invalid_table(summary: Dict[str, Any]) -> str:
    reasons = summary.get("invalid_pair_reasons") or []
    rows = []
    for c, v in summary["conditions"].items():
        pairs = v.get("invalid_pairs") or {}
        rows.append([c, v.get("n_invalid", 0), *[pairs.get(r, "-") if c != "clean" else "-" for r in reasons]])
    return _html_table(["condition", "invalid rollouts", *[f"pairs: {r.replace('_', ' ')}" for r in reasons]], rows)


def _trend_html(summary: Dict[str, Any]) -> str:
    trend = summary.get("trend") or {}
    if not trend:
        return "<p>No factor has two levels in this run.</p>"
    rows, notes = [], []
    for factor, t in trend.items():
        dsr = ", ".join(f"{c.split(':')[1]} {_num(summary['conditions'][c]['macro_dsr'])}" for c in t["levels"])
        if t["flag"]:
            status = ("NOT MONOTONE: the test rejects L1 <= L2 <= L3", "bad")
        elif t["flag"] is None:
            status = "no test (no shared pairs)"
        else:
            status = "no evidence against L1 <= L2 <= L3"
        rows.append([factor, dsr, _num(t["p"], ".3g"), _num(t["p_holm"], ".3g"), status])
        notes += [f"{factor}: point-estimate reversal, {r}" for r in t["reversals"]]
    out = _html_table(["factor", "macro dSR by level", "p (one-sided, Bonferroni over level pairs)",
                       "p (Holm across factors)", "severity"], rows)
    if notes:
        out += "<p class='small'>Notes: " + "<br>".join(_esc(n) for n in notes) + "</p>"
    return out + ("<p class='small'>Test: for every pair of levels, the exact stratified sign-flip test on the perturbed "
                  "outcomes of the same base episodes, one-sided towards the higher level succeeding more.</p>")


def _md_table_to_html(md: str) -> str:
    """Render the project's own Markdown reports (tables, bullets, bold) as HTML."""
    out, in_table, in_list = [], False, False
    for line in md.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-:") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{_inline(c)}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{_inline(line[2:])}</li>")
            continue
        if in_list:
            out.append("</ul>")
            in_list = False
        if line.startswith("# "):
            continue
        if line.startswith("## "):
            out.append(f"<h3>{_inline(line[3:])}</h3>")
            continue
        if line.strip():
            out.append(f"<p>{_inline(line)}</p>")
    if in_table:
        out.append("</table>")
    if in_list:
        out.append("</ul>")
    return "\n".join(out)


def _inline(text: str) -> str:
    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def _known_conditions(df: pd.DataFrame) -> Tuple[pd.DataFrame, List[str]]:
    """Rows whose condition the frozen spec knows, and the conditions it does not know.

    A record's condition string is data from the run directory; it is checked with the spec parser
    before it reaches a table, a file name or the page.
    """
    if df.empty:
        return df, []
    protocol = load_protocol()
    unknown = []
    for condition in sorted(set(map(str, df["condition"]))):
        try:
            parse_condition(condition, protocol)
        except UnknownNameError:
            unknown.append(condition)
    return df[~df["condition"].astype(str).isin(unknown)].reset_index(drop=True), unknown


def _variants(backend: Optional[str], formal: pd.DataFrame) -> Dict[str, str]:
    """Scene-variant task -> its original, for the run's tasks (backends with such variants: ``variant_of``)."""
    from robocasa_shift.backends import get_backend

    try:
        variant_of = getattr(get_backend(backend), "variant_of", None) if backend else None
    except UnknownNameError:
        return {}
    pairs = {t: variant_of(t) for t in sorted(set(formal["task"]))} if variant_of else {}
    return {t: o for t, o in pairs.items() if o is not None}


def build_report(run_dir: Path | str, videos_per_kind: int = 2, bootstrap_seed: int = 0, n_boot: int = 10000,
                 min_effect: float = 0.10, policy_options: Optional[Mapping[str, Any]] = None,
                 trust_run_dir: bool = False) -> Path:
    """Write ``run_dir/report/index.html`` with its figures and videos; return the page's path.

    The pair videos re-run rollouts with the run's policy; where it connects and how it decodes
    replies come from ``policy_options`` (the caller's command line), never from the run
    directory, unless ``trust_run_dir`` (see ``engine.replay.replay_policy_options``).

    Every value taken from the run directory (record fields, manifest entries, file names) is
    escaped, and record conditions are checked against the frozen spec first: rows with an
    unknown condition are left out and listed at the top of the page.
    """
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    df, unknown = _known_conditions(records_frame(run_dir))
    audit, audit_note = read_audit(run_dir)
    parts = [f"<h1>robocasa-shift report: {_esc(run_dir.name)}</h1>"]
    if unknown:
        parts.append("<p class='bad'>Left out: records whose condition is not in the frozen spec: "
                     + _esc(", ".join(repr(c) for c in unknown)) + ". The audit fails on such a run directory.</p>")
    meta = {
        "policy": manifest.get("policy"),
        "policy options": manifest.get("policy_options"),
        "backend": manifest.get("backend"),
        "spec hash": manifest.get("spec_hash"),
        "study seed": manifest.get("study_seed"),
        "renderer": {k: (manifest.get("renderer") or {}).get(k) for k in ("gl_renderer", "render_profile", "MUJOCO_GL")},
        "versions": manifest.get("versions"),
        "records": len(df),
    }
    parts.append("<table class='meta'>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_identity_html(v)}</td></tr>"
                                                  for k, v in meta.items()) + "</table>")
    suite_path = run_dir / "suite.json"
    if suite_path.exists() and json.loads(suite_path.read_text()).get("note"):
        parts.append(f"<p class='note'>{_esc(json.loads(suite_path.read_text())['note'])}</p>")

    formal = df[df["phase"] == "formal"] if not df.empty else df
    videos: List[Dict[str, Any]] = []
    if not formal.empty:
        summary = write_analysis(formal, run_dir / "analysis", n_boot=n_boot, bootstrap_seed=bootstrap_seed,
                                 min_effect=min_effect, variant_of=_variants(manifest.get("backend"), formal))
        stage_names = {t: json.loads(formal[formal.task == t].stage_names.iloc[0]) for t in summary["tasks"]}
        fig_macro_dsr(summary, out / "macro_dsr.png")
        fig_task_dsr(summary, out / "task_dsr.png")
        fig_transitions(summary, out / "transitions.png")
        fig_stage_depth(summary, stage_names, out / "stage_depth.png")
        parts += [
            "<h2>Where the policy broke</h2>",
            _headline(summary),
            "<h2>Success rate per task and condition</h2>",
            _table(sr_table(summary)),
            "<h2>Invalid rollouts and pairs</h2>",
            _invalid_table(summary),
            "<p class='small'>A pair is valid when both twins are valid and the perturbed rollout's env and policy "
            "fingerprints equal its clean twin's (PROTOCOL.md section 6); one reason per invalid pair, the first "
            "that applies in this order.</p>",
            "<h2>Paired degradation (macro over tasks)</h2>",
            "<figure><img src='macro_dsr.png' alt='macro dSR per factor and level'></figure>",
            _html_table(DSR_HEADER, dsr_rows(summary)),
            _statistics_notes(summary),
            "<h2>Severity: is dSR non-decreasing in the level?</h2>",
            _trend_html(summary),
            "<h2>Per-task degradation</h2>",
            "<figure><img src='task_dsr.png' alt='per-task dSR'></figure>",
            _per_task_table(summary),
            "<h2>Outcome transitions (clean -> perturbed)</h2>",
            "<figure><img src='transitions.png' alt='transitions'></figure>",
            _html_table(TRANSITION_HEADER, transition_rows(summary)),
            "<p class='small'>McNemar pooled over tasks weights pairs, not tasks: a diagnostic beside the "
            "sign-flip test of the macro.</p>",
            "<h2>Stage depth of S->F failures</h2>",
            "<figure><img src='stage_depth.png' alt='first incomplete subgoal'></figure>",
            _subgoal_legend(stage_names),
            _first_incomplete_table(summary, stage_names),
        ]
        if summary.get("unpaired_variants"):
            parts += ["<h2>Scene variants against their originals (UNPAIRED)</h2>",
                      "<p class='small'>A scene variant has its own objects or positions and its own initial states, "
                      "so none of its rollouts has a twin: clean success rates are compared as two samples, with a "
                      "two-sample percentile bootstrap. The perturbation tables above stay paired within each task.</p>",
                      _html_table(["variant", "original", "SR variant (n)", "SR original (n)", "difference", "95% CI"],
                                  [[r["task"], r["original"], f"{r['sr_variant']:.3f} ({r['n_variant']})",
                                    f"{r['sr_original']:.3f} ({r['n_original']})", f"{r['difference']:+.3f}",
                                    _ci(r["ci95"])] for r in summary["unpaired_variants"]])]
        if summary.get("noise_floor") and summary["noise_floor"]["macro_flip_rate"] is not None:
            nf = summary["noise_floor"]
            parts.append(f"<p>Clean-vs-clean flip rate (noise floor, replicate 1): macro {nf['macro_flip_rate']:.3f}</p>")
        videos = make_videos(run_dir, df, out, videos_per_kind, policy_options, trust_run_dir)
        parts.append("<h2>Matched pairs, clean beside perturbed</h2>")
        if not videos:
            parts.append("<p>No S->F or F->S pair in this run.</p>" if videos_per_kind else
                         "<p>No videos requested (--videos 0).</p>")
        for v in videos:
            status = "re-run reproduced the recorded outcome and subgoal steps exactly" if v["reproduced"] else \
                "<b>re-run did NOT reproduce the record</b>: " + _esc("; ".join(v["problems"]))
            parts.append(f"<h3>{_esc(v['kind'])}: {_esc(v['task'])} episode {_esc(v['episode'])}, {_esc(v['condition'])}</h3>"
                         f"<video controls preload='metadata' src='{_src(v['file'])}'></video><p class='small'>{status}. "
                         f"Clean subgoal steps {_esc(v['clean_stage_steps'])}, perturbed {_esc(v['perturbed_stage_steps'])}.</p>")
    else:
        parts.append("<p>No formal-phase records yet.</p>")

    parts += branching_sections(run_dir)
    parts += monitor_sections(run_dir)
    parts += ["<h2>Integrity audit</h2>"]
    if audit_note:
        parts.append(f"<p class='note'>{_esc(audit_note)}</p>")
    if audit is not None:
        parts.append(_audit_table(audit))
    for title, path in (("Screening", "screening/screening.md"), ("Severity calibration", "calibration/calibration.md"),
                        ("Stage validation", "validation/stages.md"), ("Pairing validation", "validation/pairing.md")):
        if (run_dir / path).exists():
            parts += [f"<h2>{title}</h2>", _md_table_to_html((run_dir / path).read_text())]
            if path.startswith("calibration"):
                for sheet in sorted((run_dir / "calibration").glob("contact_sheet_*.png")):
                    parts.append(f"<figure><img src='{_src('../calibration/' + sheet.name)}' alt='{_esc(sheet.stem)}' "
                                 f"style='max-width:480px'><figcaption>{_esc(sheet.stem)}</figcaption></figure>")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>robocasa-shift report</title><style>{CSS}</style></head><body>{''.join(parts)}</body></html>"
    (out / "index.html").write_text(page)
    (out / "videos.json").write_text(json.dumps(videos, indent=1))
    return out / "index.html"


_BRANCH_FIGURE = re.compile(r"figures/[A-Za-z0-9_.\-]+\.png")


def _branch_condition_rows(summary: Mapping[str, Any]) -> Tuple[List[str], List[List[Any]]]:
    """The per-condition table of a branch summary: recoverable counts, median horizons, the sign test."""
    frame = condition_display(pd.DataFrame(summary["conditions"]), summary["interventions"])
    return list(frame.columns), frame.astype(object).values.tolist()


def _branch_study_html(study_dir: Path) -> str:
    """One branch study from its ``summary.json`` (written by ``robocasa-shift branch``; nothing is re-run)."""
    try:
        summary = json.loads((study_dir / "summary.json").read_text())
        header, rows = _branch_condition_rows(summary)
        tally = summary["fidelity"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return (f"<h3>{_esc(study_dir.name)}</h3><p class='bad'>branching/{_esc(study_dir.name)}/summary.json cannot "
                f"be read ({_esc(type(exc).__name__)}: {_esc(exc)}); write it again with the branch command.</p>")
    good = tally["ok"] == tally["checked"] and tally["checked"] > 0
    parts = [
        f"<h3>{_esc(study_dir.name)}</h3>",
        "<table class='meta'>" + "".join(f"<tr><th>{_esc(k)}</th><td>{_identity_html(v)}</td></tr>"
                                         for k, v in (summary.get("settings") or {}).items()) + "</table>",
        f"<p class='{'good' if good else 'bad'}'>Replay fidelity: {_esc(tally['ok'])}/{_esc(tally['checked'])} restored "
        f"checkpoints reproduced their trunk (largest qpos deviation {_num(tally.get('max_qpos_dev'), '.3g')}, largest "
        f"state deviation {_num(tally.get('max_state_dev'), '.3g')}); {_esc(tally.get('invalid', 0))} invalid. "
        f"{_esc(tally.get('trunks_reproduced'))} of {_esc(tally.get('trunks'))} trunks are valid and re-ran to their "
        f"stored record.</p>",
        _html_table(header, rows),
        f"<p class='small'>tau = {_num(summary.get('tau'), 'g')}; estimate: lower {_num(summary.get('q'), 'g')} quantile "
        "of the Jeffreys posterior of each checkpoint's branches. Horizon: the latest checkpoint whose estimate reaches "
        "tau (not assumed monotone); combined: the best intervention at each checkpoint. Median and IQR over the trunks "
        "with a defined horizon; the sign test over trunks defined under both interventions, zeros dropped. Only "
        "checkpoints whose replay reproduced the trunk are used.</p>",
    ]
    closing = [c["text"] for c in summary.get("closing") or []]
    if closing:
        parts.append("<ul>" + "".join(f"<li>{_esc(text)}</li>" for text in closing) + "</ul>")
    for figure in summary.get("figures") or []:
        name = str(figure.get("file", ""))
        if _BRANCH_FIGURE.fullmatch(name) and (study_dir / name).is_file():
            src = f"../branching/{study_dir.name}/{name}"
            parts.append(f"<figure><img src='{_src(src)}' alt='{_esc(figure.get('task'))} {_esc(figure.get('condition'))}'>"
                         f"<figcaption>{_esc(figure.get('task'))}, {_esc(figure.get('condition'))}</figcaption></figure>")
    return "".join(parts)


def branching_sections(run_dir: Path) -> List[str]:
    """The "Counterfactual branching" section: one part per ``RUN_DIR/branching/*/summary.json`` (none: nothing)."""
    studies = sorted(p.parent for p in (Path(run_dir) / "branching").glob("*/summary.json"))
    if not studies:
        return []
    return ["<h2>Counterfactual branching</h2>", *(_branch_study_html(d) for d in studies)]


_MONITOR_FIGURE = re.compile(r"figures/(roc|alarms)__[A-Za-z0-9_.\-]+\.png")


def monitor_sections(run_dir: Path) -> List[str]:
    """The "Runtime monitors" section from ``RUN_DIR/monitors/`` (written by ``robocasa-shift monitors``)."""
    folder = Path(run_dir) / "monitors"
    if not (folder / "summary.json").exists():
        return []
    parts = ["<h2>Runtime monitors as intervention rules</h2>"]
    try:
        summary = json.loads((folder / "summary.json").read_text())
        parts.append(_md_table_to_html((folder / "summary.md").read_text()))
        figures = summary.get("figures") or []
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return parts + [f"<p class='bad'>monitors/summary.json cannot be read ({_esc(type(exc).__name__)}: "
                        f"{_esc(exc)}); write it again with the monitors command.</p>"]
    parts.append("<p class='small'>A detection metric admits a monitor when its 95% bootstrap interval lies above 0.5; "
                 "decision value admits it when the interval of its excess cost over never intervening lies below 0. "
                 "f* is the break-even false-alarm rate (RESCUE Eq. 9): a realised rate f above it costs more than never "
                 "intervening. Alarm times are compared with when the failures ended.</p>")
    for figure in figures:
        name = str(figure.get("file", ""))
        if _MONITOR_FIGURE.fullmatch(name) and (folder / name).is_file():
            parts.append(f"<figure><img src='{_src('../monitors/' + name)}' alt='{_esc(figure.get('monitor'))}'>"
                         f"<figcaption>{_esc(figure.get('monitor'))}: {_esc(figure.get('kind'))}</figcaption></figure>")
    return parts


def _headline(summary: Dict[str, Any]) -> str:
    items = []
    for c, v in summary["conditions"].items():
        if c != "clean" and v["macro_dsr"] is not None:
            items.append((v["macro_dsr"], c, v))
    items.sort(key=lambda x: -x[0])
    lines = []
    for dsr, c, v in items[:3]:
        sf = v["sf"]
        where = ""
        if sf["n"]:
            where = f"; in its {sf['n']} S->F pair(s) the perturbed rollout stopped at mean progress {sf['mean_progress']:.2f}, " \
                    f"{sf['first_stage_fraction']:.0%} at the first subgoal"
        verdict = f" ({_esc(v['verdict'])}, calibrated 95% CI {_ci(v.get('dsr_ci95_calibrated'))})" if v.get("verdict") else ""
        lines.append(f"<li><b>{_esc(c)}</b>: macro dSR {dsr:+.3f}{verdict}{_esc(where)}</li>")
    clean = summary["conditions"]["clean"]["macro_sr"]
    clean_text = f"{clean:.3f}" if clean is not None else "not computed (a task has no valid clean rollout)"
    return f"<p>Clean macro success {clean_text}. Largest degradations:</p><ul>{''.join(lines)}</ul>" if lines else ""


def _subgoal_legend(stage_names: Dict[str, List[str]]) -> str:
    return "<p class='small'>" + "<br>".join(
        f"{_esc(t)}: " + ", ".join(f"g{i + 1} {_esc(n)}" for i, n in enumerate(names)) for t, names in stage_names.items()
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
    return _html_table(header, rows)


def _audit_table(audit: Dict[str, Any]) -> str:
    rows = []
    for task, t in audit["tasks"].items():
        row = {"task": task, "expected": t["expected_rollouts"], "valid": t["valid_rollouts"], "distinct episodes": t["distinct_base_episodes"]}
        row.update({LABELS[c]: t["checks"][c]["count"] for c in ZERO_CHECKS})
        row["passed"] = "yes" if t["passed"] else "NO"
        rows.append(row)
    verdict = "<p class='good'>Audit passed.</p>" if audit["passed"] else "<p class='bad'>Audit FAILED: see audit.md.</p>"
    return verdict + (_table(pd.DataFrame(rows)) if rows else "")
