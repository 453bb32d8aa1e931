"""The monitor study's figures, drawn from what ``monitoring/study.py`` computes (:class:`MonitorFigures`; the
``monitoring`` package draws nothing), and the study written with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import pandas as pd

from robocasa_shift.analysis import monitor_detection as detection
from robocasa_shift.monitoring.feature_sets import GEOMETRY_FIGURE, Geometry
from robocasa_shift.monitoring.study import LENGTH_FIGURE, MonitorFigures, evaluate
from robocasa_shift.report.figures import pyplot
from robocasa_shift.rundir.files import save_figure


def draw_figures(out: Path, data: MonitorFigures) -> List[Dict[str, str]]:
    """The episode lengths of successes and failures per task, then per monitor its ROC curves and alarm times, the
    functional CP trade-offs and the feature sets' geometry, below ``out``; their entries for the summary."""
    figures = [length_figure(out, data.lengths)] if data.lengths is not None else []
    for name, curves in data.roc.items():
        figures += [roc_figure(out, name, curves), alarm_figure(out, name, data.alarms[name])]
    figures += fcp_figures(out, data.functional_cp)
    if data.geometry is not None:
        figures.append(geometry_figure(out, data.geometry))
    return figures


def roc_figure(out: Path, name: str, curves: Sequence[Any]) -> Dict[str, str]:
    """A monitor's ROC curves on the test rollouts of every condition (end window): pooled, then per task."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 4.0))
    for label, fpr, tpr, auc in curves:
        ax.plot(fpr, tpr, lw=2.2 if label == "pooled" else 1.2, label=f"{label} (AUC {auc:.2f})")
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
    ax.set(xlabel="false-alarm rate (successes)", ylabel="catch rate (failures)", title=f"{name}: test rollouts")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    file = f"figures/roc__{name}.png"
    save_figure(fig, out / file, dpi=110)
    plt.close(fig)
    return {"monitor": name, "kind": "roc", "file": file}


def alarm_figure(out: Path, name: str, alarms: pd.DataFrame) -> Dict[str, str]:
    """A monitor's alarm times on test failures and successes (false alarms) against when the failures ended."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.4, 3.2))
    horizon = int(alarms["horizon"].max())
    bins = np.linspace(0, horizon, 21)
    failures = alarms[~alarms["success"].astype(bool)]
    ax.hist([failures["alarm_step"].dropna(), alarms.loc[alarms["success"].astype(bool), "alarm_step"].dropna()],
            bins=bins, label=["alarms on failures", "false alarms"], color=["#c0392b", "#7f8c8d"])
    ax.hist(failures["steps"], bins=bins, histtype="step", color="black", lw=1.2, label="failure ends")
    ax.set(xlabel="control step", ylabel="rollouts", title=f"{name}: alarm times (test, all conditions)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    file = f"figures/alarms__{name}.png"
    save_figure(fig, out / file, dpi=110)
    plt.close(fig)
    return {"monitor": name, "kind": "alarms", "file": file}


def length_figure(out: Path, table: pd.DataFrame) -> Dict[str, str]:
    """Per task, the episode length of successes beside failures (``study.length_table``: every logged rollout,
    every condition): how far length alone separates them, which a pooled AUC can pick up between tasks (the
    length-only control's row)."""
    plt = pyplot()
    tasks = table["task"].tolist()
    jitter = np.random.default_rng(0)  # a fixed spread: the figure is the same for the same run
    fig, ax = plt.subplots(figsize=(max(3.6, 1.3 * len(tasks) + 1.5), 3.4))
    for i, row in enumerate(table.to_dict("records")):
        for offset, color, label in ((-0.18, "#2e86c1", "successes"), (0.18, "#c0392b", "failures")):
            steps = np.asarray(row[label], dtype=float)
            ax.scatter(i + offset + jitter.uniform(-0.12, 0.12, steps.size), steps, s=9, alpha=0.6, color=color,
                       label=label if i == 0 else None)
            if steps.size:
                ax.hlines(np.median(steps), i + offset - 0.15, i + offset + 0.15, color="black", lw=1.4)
    ax.set_xticks(range(len(tasks)), tasks, rotation=20, fontsize=8)
    ax.set(ylabel="episode length (control steps)")
    ax.set_title("Successes vs failures (bar: median)", fontsize=9)  # short: a two-task figure is narrow
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / LENGTH_FIGURE, dpi=110)
    plt.close(fig)
    return {"monitor": "all", "kind": "episode length by task, successes vs failures", "file": LENGTH_FIGURE}


def fcp_figures(out: Path, table: pd.DataFrame) -> List[Dict[str, str]]:
    """Catch rate against realised false-alarm rate over the alpha sweep (every condition's test rollouts), one
    line per monitor, per window; the constant 5% threshold as a cross."""
    if table.empty:
        return []
    plt = pyplot()
    figures = []
    for window, part in table[table["evaluation"] == detection.ALL_CONDITIONS].groupby("window", sort=False):
        fig, ax = plt.subplots(figsize=(5.0, 4.0))
        for i, (name, rows) in enumerate(part.groupby("monitor", sort=False)):
            color = f"C{i % 10}"
            sweep = rows[rows["rule"] == "functional CP"].sort_values("alpha")
            if len(sweep):
                ax.plot(sweep["false_alarm_rate_mean"], sweep["catch_rate_mean"], marker="o", ms=3, color=color,
                        label=name)
            constant = rows[rows["rule"] != "functional CP"]
            if len(constant):
                ax.plot(constant["false_alarm_rate_mean"], constant["catch_rate_mean"], "x", ms=8, color=color)
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
        ax.set(xlim=(-0.02, 1.02), ylim=(-0.02, 1.02), xlabel="realised false-alarm rate (test successes)",
               ylabel="catch rate (test failures)",
               title=f"functional CP, {window} window: alpha sweep (x: constant threshold)")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        file = f"figures/fcp__{window}.png"
        save_figure(fig, out / file, dpi=110)
        plt.close(fig)
        figures.append({"monitor": "all", "kind": f"functional CP trade-off ({window})", "file": file})
    return figures


def geometry_figure(out: Path, geometry: Geometry) -> Dict[str, str]:
    """One axis per feature set: its 2-D embedding (``feature_sets.geometry``), coloured by task, marker by outcome."""
    plt = pyplot()
    sets = geometry.embeddings
    fig, axes = plt.subplots(1, len(sets), figsize=(2.8 * len(sets) + 0.6, 3.0), squeeze=False)
    for ax, (name, xy) in zip(axes[0], sets.items()):
        for i, task in enumerate(geometry.tasks):
            for ok, marker in ((True, "o"), (False, "x")):
                mask = (geometry.task == task) & (geometry.success == ok)
                ax.scatter(xy[mask, 0], xy[mask, 1], s=10, marker=marker, color=f"C{i % 10}",
                           label=f"{task} {'success' if ok else 'failure'}")
        ax.set_title(name, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    axes[0][-1].legend(fontsize=6, loc="best")
    method = geometry.method.split(" ")[0]
    fig.suptitle(f"{method} of early-window pooled features, by task (o success, x failure)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out / GEOMETRY_FIGURE, dpi=110)
    plt.close(fig)
    return {"monitor": "features", "kind": f"latent geometry ({method}) by task", "file": GEOMETRY_FIGURE}


def evaluate_monitors(run_dir: Path | str, monitors: Optional[Sequence[str]] = None,
                      target_fa: float = detection.DEFAULT_TARGET_FA, kappa: float = 0.1, n_resamples: int = 1000,
                      bundle: Optional[Path | str] = None) -> Dict[str, Any]:
    """``monitoring.study.evaluate`` (same arguments) with its figures: ``RUN_DIR/monitors/`` as the monitors
    command writes it."""
    return evaluate(run_dir, monitors, target_fa=target_fa, kappa=kappa, n_resamples=n_resamples,
                    figures=draw_figures, bundle=bundle)


__all__ = ["alarm_figure", "draw_figures", "evaluate_monitors", "fcp_figures", "geometry_figure", "length_figure",
           "roc_figure"]
