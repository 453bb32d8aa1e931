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
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.analysis.export import records_frame
from robocasa_shift.analysis.measures import write_analysis
from robocasa_shift.checks.audit import LABELS, ZERO_CHECKS, read_audit
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.engine.replay import FrameCapture, Replayer
from robocasa_shift.specs import load_stage_spec
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
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def _factor_levels(conditions: List[str]) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for c in conditions:
        if c != "clean":
            f, lv = c.split(":")
            out.setdefault(f, []).append(c)
    return out


def fig_macro_dsr(summary: Dict[str, Any], path: Path) -> None:
    plt = _plt()
    groups = _factor_levels(list(summary["conditions"]))
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    x, ticks, labels = 0, [], []
    colors = plt.cm.viridis(np.linspace(0.15, 0.85, 3))
    for factor, conds in groups.items():
        for i, c in enumerate(conds):
            v = summary["conditions"][c]
            if v["macro_dsr"] is not None:
                lo, hi = v["dsr_ci95"] or (v["macro_dsr"], v["macro_dsr"])
                ax.bar(x, v["macro_dsr"], color=colors[i % 3], width=0.8)
                ax.errorbar(x, v["macro_dsr"], yerr=[[v["macro_dsr"] - lo], [hi - v["macro_dsr"]]], color="k", capsize=3)
            ticks.append(x)
            labels.append(c.split(":")[1])
            x += 1
        ax.text(x - len(conds) / 2 - 0.5, ax.get_ylim()[1], factor, ha="center", va="bottom", fontsize=9)
        x += 0.7
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(ticks, labels)
    ax.set_ylabel("macro dSR (clean - perturbed)")
    ax.set_title("Paired degradation with 95% bootstrap CI", fontsize=10, pad=16)
    _save(fig, path)


def fig_task_dsr(summary: Dict[str, Any], path: Path) -> None:
    plt = _plt()
    conds = [c for c in summary["conditions"] if c != "clean"]
    tasks = summary["tasks"]
    grid = np.array([[summary["conditions"][c]["per_task_dsr"].get(t) if summary["conditions"][c]["per_task_dsr"].get(t) is not None else np.nan
                      for c in conds] for t in tasks], dtype=float)
    fig, ax = plt.subplots(figsize=(8, 0.6 + 0.5 * len(tasks)))
    im = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
    ax.set_xticks(range(len(conds)), conds, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(len(tasks)), tasks, fontsize=9)
    for i in range(len(tasks)):
        for j in range(len(conds)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=ax, label="dSR")
    ax.set_title("Per-task paired degradation", fontsize=10)
    _save(fig, path)


def fig_transitions(summary: Dict[str, Any], path: Path) -> None:
    plt = _plt()
    conds = [c for c in summary["conditions"] if c != "clean"]
    parts = {"SS": "#4c9a2a", "SF": "#d1495b", "FS": "#00798c", "FF": "#b0b0b0"}
    fig, ax = plt.subplots(figsize=(8, 3.2))
    bottom = np.zeros(len(conds))
    for name, color in parts.items():
        values = np.array([summary["conditions"][c]["transitions"][name] for c in conds], dtype=float)
        ax.bar(range(len(conds)), values, bottom=bottom, color=color, label=name.replace("S", "S").replace("F", "F"))
        bottom += values
    ax.set_xticks(range(len(conds)), conds, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("pairs")
    ax.legend(ncol=4, fontsize=8, title="clean -> perturbed", title_fontsize=8, loc="upper left", bbox_to_anchor=(0, 1.25))
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


def make_videos(run_dir: Path, df: pd.DataFrame, out: Path, per_kind: int = 2) -> List[Dict[str, Any]]:
    """Re-run the selected pairs with frame capture and write one side-by-side MP4 per pair."""
    pairs = select_pairs(df, per_kind)
    if not pairs:
        return []
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stored = {RolloutKey.from_record(r): r for r in RunStore(run_dir).records()}
    videos = []
    with Replayer(manifest) as replayer:
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
figure{margin:1em 0} img{max-width:100%} video{max-width:100%;border:1px solid #ccc}
.meta td{text-align:left} .small{font-size:.85em;color:#555}
"""


def _table(df: pd.DataFrame, cls: str = "") -> str:
    return df.to_html(index=False, border=0, classes=cls, na_rep="-", float_format=lambda v: f"{v:.3f}", escape=True)


def sr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    rows = []
    for task in summary["tasks"] + ["macro"]:
        row = {"task": task}
        for c, v in summary["conditions"].items():
            value = v["macro_sr"] if task == "macro" else v["per_task_sr"].get(task)
            row[c] = value
        rows.append(row)
    return pd.DataFrame(rows)


def dsr_table(summary: Dict[str, Any]) -> pd.DataFrame:
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        ci = v.get("dsr_ci95") or [None, None]
        t = v["transitions"]
        m = v.get("mcnemar") or {}
        rows.append({"condition": c, "pairs": v.get("n_pairs"), "macro dSR": v["macro_dsr"], "CI low": ci[0], "CI high": ci[1],
                     "S->S": t["SS"], "S->F": t["SF"], "F->S": t["FS"], "F->F": t["FF"], "changed": t["changed"],
                     "McNemar p (Holm)": m.get("p_holm"),
                     "S->F mean progress": v["sf"]["mean_progress"], "first-stage fraction": v["sf"]["first_stage_fraction"]})
    return pd.DataFrame(rows)


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


def build_report(run_dir: Path | str, videos_per_kind: int = 2, bootstrap_seed: int = 0, n_boot: int = 10000) -> Path:
    run_dir = Path(run_dir)
    out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((run_dir / "manifest.json").read_text()) if (run_dir / "manifest.json").exists() else {}
    df = records_frame(run_dir)
    audit, audit_note = read_audit(run_dir)
    parts = [f"<h1>robocasa-shift report: {html.escape(run_dir.name)}</h1>"]
    meta = {
        "policy": json.dumps(manifest.get("policy")),
        "backend": manifest.get("backend"),
        "spec hash": manifest.get("spec_hash"),
        "study seed": manifest.get("study_seed"),
        "renderer": json.dumps({k: (manifest.get("renderer") or {}).get(k) for k in ("gl_renderer", "render_profile", "MUJOCO_GL")}),
        "versions": json.dumps(manifest.get("versions")),
        "records": len(df),
    }
    parts.append("<table class='meta'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in meta.items()) + "</table>")
    suite_path = run_dir / "suite.json"
    if suite_path.exists() and json.loads(suite_path.read_text()).get("note"):
        parts.append(f"<p class='note'>{html.escape(json.loads(suite_path.read_text())['note'])}</p>")

    formal = df[df["phase"] == "formal"] if not df.empty else df
    videos: List[Dict[str, Any]] = []
    if not formal.empty:
        summary = write_analysis(formal, run_dir / "analysis", n_boot=n_boot, bootstrap_seed=bootstrap_seed)
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
            "<h2>Paired degradation (macro over tasks, 95% bootstrap CI)</h2>",
            "<figure><img src='macro_dsr.png' alt='macro dSR per factor and level'></figure>",
            _table(dsr_table(summary)),
            f"<p class='small'>Bootstrap: {summary['bootstrap']['n_boot']} resamples within task, seed {summary['bootstrap']['seed']}. "
            f"Macro = equal-weight mean over tasks. Stage measures over strictly matched S->F pairs.</p>",
            "<h2>Per-task degradation</h2>",
            "<figure><img src='task_dsr.png' alt='per-task dSR'></figure>",
            "<h2>Outcome transitions (clean -> perturbed)</h2>",
            "<figure><img src='transitions.png' alt='transitions'></figure>",
            "<h2>Stage depth of S->F failures</h2>",
            "<figure><img src='stage_depth.png' alt='first incomplete subgoal'></figure>",
            _subgoal_legend(stage_names),
            _first_incomplete_table(summary, stage_names),
        ]
        if summary.get("noise_floor"):
            nf = summary["noise_floor"]
            parts.append(f"<p>Clean-vs-clean flip rate (noise floor, replicate 1): macro {nf['macro_flip_rate']:.3f}</p>")
        videos = make_videos(run_dir, df, out, videos_per_kind)
        parts.append("<h2>Matched pairs, clean beside perturbed</h2>")
        if not videos:
            parts.append("<p>No S->F or F->S pair in this run.</p>")
        for v in videos:
            status = "re-run reproduced the recorded outcome and subgoal steps exactly" if v["reproduced"] else \
                "<b>re-run did NOT reproduce the record</b>: " + html.escape("; ".join(v["problems"]))
            parts.append(f"<h3>{v['kind']}: {html.escape(v['task'])} episode {v['episode']}, {html.escape(v['condition'])}</h3>"
                         f"<video controls preload='metadata' src='{v['file']}'></video><p class='small'>{status}. "
                         f"Clean subgoal steps {v['clean_stage_steps']}, perturbed {v['perturbed_stage_steps']}.</p>")
    else:
        parts.append("<p>No formal-phase records yet.</p>")

    parts += ["<h2>Integrity audit</h2>"]
    if audit_note:
        parts.append(f"<p class='note'>{html.escape(audit_note)}</p>")
    if audit is not None:
        parts.append(_audit_table(audit))
    for title, path in (("Screening", "screening/screening.md"), ("Severity calibration", "calibration/calibration.md"),
                        ("Stage validation", "validation/stages.md"), ("Pairing validation", "validation/pairing.md")):
        if (run_dir / path).exists():
            parts += [f"<h2>{title}</h2>", _md_table_to_html((run_dir / path).read_text())]
            if path.startswith("calibration"):
                for sheet in sorted((run_dir / "calibration").glob("contact_sheet_*.png")):
                    rel = Path("..") / "calibration" / sheet.name
                    parts.append(f"<figure><img src='{rel}' alt='{sheet.stem}' style='max-width:480px'><figcaption>{sheet.stem}</figcaption></figure>")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>robocasa-shift report</title><style>{CSS}</style></head><body>{''.join(parts)}</body></html>"
    (out / "index.html").write_text(page)
    (out / "videos.json").write_text(json.dumps(videos, indent=1))
    return out / "index.html"


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
        lines.append(f"<li><b>{html.escape(c)}</b>: macro dSR {dsr:+.3f}{where}</li>")
    clean = summary["conditions"]["clean"]["macro_sr"]
    return f"<p>Clean macro success {clean:.3f}. Largest degradations:</p><ul>{''.join(lines)}</ul>" if lines else ""


def _subgoal_legend(stage_names: Dict[str, List[str]]) -> str:
    return "<p class='small'>" + "<br>".join(
        f"{html.escape(t)}: " + ", ".join(f"g{i + 1} {html.escape(n)}" for i, n in enumerate(names)) for t, names in stage_names.items()
    ) + "</p>"


def _first_incomplete_table(summary: Dict[str, Any], stage_names: Dict[str, List[str]]) -> str:
    rows = []
    for c, v in summary["conditions"].items():
        if c == "clean":
            continue
        for task, counts in v["sf"]["first_incomplete_by_task"].items():
            if sum(counts.values()):
                rows.append({"condition": c, "task": task, **{f"g{k}" if k != "complete" else k: n for k, n in counts.items()}})
    if not rows:
        return "<p>No S->F pairs.</p>"
    return _table(pd.DataFrame(rows).fillna(0))


def _audit_table(audit: Dict[str, Any]) -> str:
    rows = []
    for task, t in audit["tasks"].items():
        row = {"task": task, "expected": t["expected_rollouts"], "valid": t["valid_rollouts"], "distinct episodes": t["distinct_base_episodes"]}
        row.update({LABELS[c]: t["checks"][c]["count"] for c in ZERO_CHECKS})
        row["passed"] = "yes" if t["passed"] else "NO"
        rows.append(row)
    verdict = "<p class='good'>Audit passed.</p>" if audit["passed"] else "<p class='bad'>Audit FAILED: see audit.md.</p>"
    return verdict + (_table(pd.DataFrame(rows)) if rows else "")
