"""The branching study's figures (RESCUE Fig. 2 per task and condition), drawn from the analysis's tables
(``analysis/branching.py``, which draws nothing), and the study's outputs written with them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import pandas as pd

from robocasa_shift.analysis.branching import (
    COMBINED,
    CONTINUE,
    RECOVER,
    BranchStudy,
    checkpoints_by_trunk,
    figure_name,
    is_included,
    record_key,
    trunk_frame,
    trunk_label,
    trunk_series,
    write_outputs,
)
from robocasa_shift.report.figures import pyplot
from robocasa_shift.rundir.files import save_figure

MAX_TRUNKS_PLOTTED = 8
INTERVENTION_COLORS = {CONTINUE: "#1f77b4", RECOVER: "#e07000"}


def _color(name: str, index: int) -> str:
    if name in INTERVENTION_COLORS:
        return INTERVENTION_COLORS[name]
    palette = ["#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
    return palette[index % len(palette)]


def plot_condition(study: BranchStudy, task: str, condition: str, out_path: Path | str, tau: Optional[float] = None,
                   max_trunks: int = MAX_TRUNKS_PLOTTED) -> Path:
    """Fig. 2 of RESCUE for one (task, condition): estimate per checkpoint, per intervention, per trunk.

    One small axis per trunk (the first ``max_trunks`` by episode): a line with markers per
    intervention, the criterion ``tau`` dashed, the subgoal latch steps as labelled grey lines, the
    combined horizon as a green line, each intervention's horizon as a ringed marker, and
    checkpoints left out by the fidelity check as red crosses at the bottom.
    """
    plt = pyplot()
    tau = study.tau if tau is None else float(tau)
    out_path = Path(out_path)
    frame = trunk_frame(study, tau)
    frame = frame[(frame["task"] == task) & (frame["condition"] == condition)]
    trunks = {trunk_label(t): t for t in study.trunks if is_included(t)}
    by_trunk = checkpoints_by_trunk(study)
    shown = frame.head(max_trunks)
    names = study.interventions
    n = max(len(shown), 1)
    ncols = min(4, n)
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.7 * nrows + 0.6), squeeze=False, sharey=True)
    for ax in axes.flat[len(shown):]:
        ax.axis("off")
    if shown.empty:
        axes[0][0].text(0.5, 0.5, "no valid, reproduced trunk", ha="center", va="center",
                        transform=axes[0][0].transAxes)
    for ax, (_, row) in zip(axes.flat, shown.iterrows()):
        trunk = trunks[row["trunk"]]
        steps, series = trunk_series(study, trunk, by_trunk)
        for i, name in enumerate(names):
            points = [(s, e) for s, e in zip(steps, series[name]) if e is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", ms=3.5, lw=1.2, color=_color(name, i), label=name)
            horizon = row[f"{name}_horizon"]
            if not pd.isna(horizon):
                ax.plot([horizon], [series[name][steps.index(int(horizon))]], marker="o", ms=9, mfc="none",
                        mec=_color(name, i), mew=1.5)
        dropped = [int(c["step"]) for c in by_trunk.get(record_key(trunk), [])
                   if (c.get("fidelity") or {}).get("ok") is False]
        if dropped:
            ax.plot(dropped, [0.02] * len(dropped), "x", color="#c00000", ms=6, label="fidelity failed")
        ax.axhline(tau, color="black", ls="--", lw=0.9, label=f"tau = {tau:g}")
        for goal, latched in zip(trunk.get("stage_names") or [], trunk.get("stage_steps") or []):
            if latched is not None:
                ax.axvline(latched, color="grey", ls=":", lw=0.9)
                ax.text(latched, 0.98, f" {goal}", rotation=90, va="top", ha="right", fontsize=6.5, color="#555")
        combined = row[f"{COMBINED}_horizon"]
        if not pd.isna(combined):
            ax.axvline(int(combined), color="#2a9d2a", lw=1.6, alpha=0.8, label="horizon (combined)")
        end = max([*steps, int(row["steps"]) if not pd.isna(row["steps"]) else 0, 1])
        ax.set_xlim(-0.03 * end, end * 1.03)
        ax.set_ylim(-0.03, 1.03)
        failed = "all subgoals latched" if pd.isna(row["failed_subgoal"]) else f"failed at {row['failed_subgoal']}"
        horizon_text = "none" if pd.isna(combined) else f"step {int(combined)}"
        ax.set_title(f"ep {row['episode']} r{row['replicate']}: {failed}\ncombined horizon {horizon_text}", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("control step", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(f"estimate (q={study.q:g})", fontsize=8)
    handles, labels = {}, []
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            if label not in handles:
                handles[label] = h
                labels.append(label)
    if handles:
        from matplotlib.lines import Line2D

        handles["horizon (per intervention)"] = Line2D([], [], ls="none", marker="o", ms=9, mfc="none", mec="grey")
        labels.append("horizon (per intervention)")
        fig.legend([handles[label] for label in labels], labels, loc="upper center", fontsize=8, frameon=False,
                   ncol=min(len(labels), 2 * ncols + 1), bbox_to_anchor=(0.5, 0.0))
    more = f" (first {len(shown)} of {len(frame)} trunks)" if len(frame) > len(shown) else ""
    fig.suptitle(f"{task}, {condition}: recoverability per checkpoint{more}", fontsize=10)
    fig.tight_layout()
    # the legend sits below the axes; bbox_inches="tight" keeps it inside the image (as report._save)
    save_figure(fig, out_path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out_path


def draw_figures(study: BranchStudy, branch_dir: Path, tau: float) -> List[Dict[str, Any]]:
    """``figures/<task>__<condition>.png`` for every (task, condition) with trunks; their entries for the summary."""
    out = []
    for (task, condition), _ in trunk_frame(study, tau).groupby(["task", "condition"], sort=True):
        name = figure_name(task, condition)
        plot_condition(study, task, condition, branch_dir / "figures" / name, tau)
        out.append({"task": task, "condition": condition, "file": f"figures/{name}"})
    return out


def write_branch_outputs(branch_dir: Path | str, tau: Optional[float] = None,
                         workload: Optional[Mapping[Tuple[str, str], Mapping[str, Any]]] = None) -> Dict[str, Any]:
    """The study's ``summary.json``, ``summary.md`` (``analysis.branching.write_outputs``) and its figures."""
    return write_outputs(branch_dir, tau, workload, figures=draw_figures)


__all__ = ["MAX_TRUNKS_PLOTTED", "draw_figures", "plot_condition", "write_branch_outputs"]
