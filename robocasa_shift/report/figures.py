"""The report's figures (matplotlib, written as PNG files beside the page)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from robocasa_shift.core.conditions import Condition, factor_levels
from robocasa_shift.rundir.files import save_figure


def pyplot():
    """matplotlib's pyplot on the Agg backend (headless; imported when a figure is drawn, not with the report)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # bbox_inches="tight" keeps a legend placed beside the axes inside the image
    save_figure(fig, path, dpi=110, bbox_inches="tight")  # never through a symbolic link (see rundir.files)
    pyplot().close(fig)


def factor_groups(conditions, factor_order: Sequence[str]) -> List[Tuple[str, str, List[str]]]:
    """[(family, factor, [its conditions, level by level])]: families in the order of ``core.shifts.FAMILIES``,
    factors within a family in ``factor_order``. The one order of the verdict grid and the dSR figure."""
    from robocasa_shift.core.factors import FACTOR_KINDS
    from robocasa_shift.core.shifts import FAMILIES
    from robocasa_shift.core.specs import load_protocol

    protocol = load_protocol()
    families = {f: FACTOR_KINDS.get(protocol.factor(f).kind).family or "other" for f in protocol.factor_order}
    order = list(FAMILIES) + ["other"]
    groups = [(families.get(factor, "other"), factor, levels) for factor, levels in factor_levels(conditions, factor_order)]
    return sorted(groups, key=lambda g: order.index(g[0]))  # stable: factor_order within a family


def fig_macro_dsr(summary: Dict[str, Any], path: Path, factor_order: Sequence[str]) -> List[str]:
    """Macro dSR per condition with both intervals: the calibrated one first (the verdicts' interval, bold), the
    paper's percentile bootstrap beside it for comparison, each with its measured coverage in the legend.
    Returns the factors in the order drawn (:func:`factor_groups`)."""
    plt = pyplot()
    ordered = factor_groups(summary["conditions"], factor_order)
    groups = {factor: levels for _, factor, levels in ordered}
    family_of = {factor: family for family, factor, _ in ordered}
    # wide enough for every factor's label above its levels (LIBERO-Plus's dimensions add ten factors)
    fig, ax = plt.subplots(figsize=(max(7.5, 0.42 * sum(len(c) + 0.7 for c in groups.values())), 3.4))
    x, ticks, labels, factor_x, spans = 0, [], [], {}, []  # spans: [family, first x, last x], one shaded band each
    colors = plt.cm.viridis(np.linspace(0.15, 0.85, 3))
    for factor, conds in groups.items():
        if spans and spans[-1][0] == family_of[factor]:
            spans[-1][2] = x + len(conds) - 1
        else:
            spans.append([family_of[factor], x, x + len(conds) - 1])
        for i, c in enumerate(conds):
            v = summary["conditions"][c]
            if v["macro_dsr"] is not None:
                ax.bar(x, v["macro_dsr"], color=colors[i % 3], width=0.8)
                for offset, key, color, width in ((-0.15, "dsr_ci95_calibrated", "#e07000", 2.2),
                                                  (0.15, "dsr_ci95", "k", 0.9)):
                    lo, hi = v.get(key) or (v["macro_dsr"], v["macro_dsr"])
                    ax.errorbar(x + offset, v["macro_dsr"], yerr=[[v["macro_dsr"] - lo], [hi - v["macro_dsr"]]],
                                color=color, capsize=3, fmt="none", elinewidth=width)
            else:
                ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=7, color="#a00")
            ticks.append(x)
            labels.append(Condition.parse(c).level)
            x += 1
        factor_x[factor] = x - len(conds) / 2 - 0.5
        x += 0.7
    for factor, position in factor_x.items():  # after every bar, so all labels sit on the final top edge
        ax.text(position, ax.get_ylim()[1], factor, ha="center", va="bottom", fontsize=9)
    for i, (family, first, last) in enumerate(spans):  # each family on its band, named below the axis
        ax.axvspan(first - 0.5, last + 0.5, color="#f0f0f0" if i % 2 == 0 else "#e2e8f0", zorder=0)
        ax.text((first + last) / 2, -0.14, family, transform=ax.get_xaxis_transform(), ha="center", va="top",
                fontsize=8, style="italic")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(ticks, labels)
    ax.set_ylabel("macro dSR (clean - perturbed)")
    short = (summary.get("intervals") or {}).get("coverage_short") or {}
    calibrated = f"; {short['calibrated']}" if short.get("calibrated") else ""
    percentile = f"; {short['percentile']}" if short.get("percentile") else ""
    ax.set_title(f"Paired degradation, 95% intervals: calibrated (orange, bold: the verdicts'{calibrated}) and "
                 f"percentile pair bootstrap (black: the paper's method, for comparison{percentile})", fontsize=7,
                 pad=16, wrap=True)
    _save(fig, path)
    return list(groups)


def _label_color(rgba) -> str:
    """Black or white, whichever reads on a cell of this colour (relative luminance, sRGB weights)."""
    r, g, b = rgba[:3]
    return "white" if 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.5 else "black"


def fig_task_dsr(summary: Dict[str, Any], path: Path) -> None:
    """Per-task dSR heat map; labels white on dark cells, black on light ones."""
    plt = pyplot()
    conds = [c for c in summary["conditions"] if c != "clean"]
    tasks = summary["tasks"]
    grid = np.array([[summary["conditions"][c]["per_task_dsr"].get(t) if summary["conditions"][c]["per_task_dsr"].get(t) is not None else np.nan
                      for c in conds] for t in tasks], dtype=float)
    longest = max([len(c) for c in conds] + [0])  # rotated labels below the cells (combinations are long)
    fig, ax = plt.subplots(figsize=(max(8, 0.3 * len(conds)), 0.6 + 0.5 * len(tasks) + 0.07 * longest))
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
    plt = pyplot()
    conds = [c for c in summary["conditions"] if c != "clean"]
    parts = {"SS": "#4c9a2a", "SF": "#d1495b", "FS": "#00798c", "FF": "#b0b0b0"}
    longest = max([len(c) for c in conds] + [0])
    fig, ax = plt.subplots(figsize=(max(8, 0.3 * len(conds)), 2.4 + 0.07 * longest))
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
    plt = pyplot()
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


def fig_interactions(summary: Dict[str, Any], path: Path) -> None:
    """Per combination A+B: dSR(A), dSR(B), their sum and dSR(A+B) as bars, and the interaction with its calibrated
    interval as a point with an error bar, on the same base episodes."""
    plt = pyplot()
    items = [(c, v) for c, v in (summary.get("interactions") or {}).items() if v.get("interaction") is not None]
    fig, ax = plt.subplots(figsize=(max(4.5, 2.6 * len(items) + 1.5), 3.4))
    if not items:
        ax.text(0.5, 0.5, "no combination with a valid quadruple in every task", ha="center", va="center")
        ax.set_axis_off()
        _save(fig, path)
        return
    width = 0.18
    colours = {"dSR(A)": "#7aa6c2", "dSR(B)": "#9ccf8f", "dSR(A) + dSR(B)": "#b0b0b0", "dSR(A+B)": "#d1495b"}
    for i, (condition, v) in enumerate(items):
        values = [v["dsr_a"], v["dsr_b"], v["dsr_a"] + v["dsr_b"], v["dsr_ab"]]
        for j, (label, value) in enumerate(zip(colours, values)):
            ax.bar(i + (j - 1.5) * width, value, width, color=colours[label], label=label if i == 0 else None)
        lo, hi = v.get("interval_shown") or v.get("interval_calibrated") or (v["interaction"], v["interaction"])
        ax.errorbar(i + 2.6 * width, v["interaction"], yerr=[[v["interaction"] - lo], [hi - v["interaction"]]],
                    fmt="D", color="k", capsize=3, label="interaction (calibrated 95% CI)" if i == 0 else None)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(items)), [c.replace("+", "+\n") for c, _ in items], fontsize=8)
    ax.set_ylabel("macro, same base episodes")
    ax.set_title("Combined shifts: dSR(A+B) against dSR(A) + dSR(B); interaction = the difference", fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    _save(fig, path)


def fig_robustness(result: Dict[str, Any], path: Path) -> List[str]:
    """``compare R1 R2 R3 ...``: each run's paired macro dSR as a heat map, runs down, conditions across grouped
    by factor (:func:`factor_groups`), the clean success rate beside each run's name. Returns the columns drawn."""
    from robocasa_shift.core.specs import load_protocol

    plt = pyplot()
    groups = factor_groups(result["conditions"], load_protocol().factor_order)
    conds = [c for _, _, levels in groups for c in levels]
    runs = list(result["robustness"])
    grid = np.array([[np.nan if result["robustness"][r][c]["macro_dsr"] is None else result["robustness"][r][c]["macro_dsr"]
                      for c in conds] for r in runs], dtype=float)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * len(conds) + 2.5), 1.4 + 0.45 * len(runs)))
    cmap, norm = plt.get_cmap("RdBu_r"), plt.Normalize(vmin=-1, vmax=1)
    im = ax.imshow(grid, cmap=cmap, norm=norm, aspect="auto")
    ax.set_xticks(range(len(conds)), [Condition.parse(c).level for c in conds], fontsize=8)
    clean = [result["robustness"][r].get("clean", {}).get("macro_sr") for r in runs]
    ax.set_yticks(range(len(runs)), [f"{r} (clean SR {'-' if s is None else f'{s:.2f}'})" for r, s in zip(runs, clean)],
                  fontsize=8)
    start = 0
    for _, factor, levels in groups:
        ax.text(start + (len(levels) - 1) / 2, -0.7, factor, ha="center", va="bottom", fontsize=8)
        if start:
            ax.axvline(start - 0.5, color="white", lw=2)
        start += len(levels)
    for i in range(len(runs)):
        for j in range(len(conds)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color=_label_color(cmap(norm(grid[i, j]))))
    fig.colorbar(im, ax=ax, label="macro dSR (clean - perturbed)")
    ax.set_title("Robustness: each run's paired degradation per factor and level", fontsize=9, pad=24)
    _save(fig, path)
    return conds
