"""The success judges' figure, drawn from the scores ``judging/scoring.py`` computes (it draws nothing), and the
scores written with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

import numpy as np

from robocasa_shift.judging.scoring import N_BOOT, score_files
from robocasa_shift.report.figures import pyplot
from robocasa_shift.rundir.files import save_figure


def draw_scores_figure(result: Mapping[str, Any], path: Path) -> None:
    """Macro BA per condition (with intervals) and verdict flip rate per condition, one line per judge."""
    plt = pyplot()
    fig, (ax_ba, ax_flip) = plt.subplots(1, 2, figsize=(12, 4))
    for judge, r in result["judges"].items():
        conds = list(r["accuracy"]["conditions"])
        ba = [r["accuracy"]["conditions"][c]["macro"]["ba"] for c in conds]
        ax_ba.plot(conds, [np.nan if v is None else v for v in ba], marker="o", label=judge)
        pc = list(r["paired"])
        ax_flip.plot(pc, [np.nan if r["paired"][c]["verdict_flip"]["rate"] is None else r["paired"][c]["verdict_flip"]["rate"]
                          for c in pc], marker="o", label=judge)
    ax_ba.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax_ba.set_ylabel("macro balanced accuracy")
    ax_flip.set_ylabel("verdict flip rate (outcome held)")
    for ax in (ax_ba, ax_flip):
        ax.tick_params(axis="x", rotation=60)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    plt.close(fig)


def write_judge_scores(judge_set: Path | str, prediction_files: Sequence[Path | str], out: Optional[Path | str] = None,
                       seed: int = 0, n_boot: int = N_BOOT, ensembles: Sequence[Sequence[str]] = (),
                       compare: Sequence[Sequence[str]] = (), prior: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """The scores of ``judging.scoring.score_files`` (same arguments) with their figure."""
    return score_files(judge_set, prediction_files, out, seed=seed, n_boot=n_boot, ensembles=ensembles, compare=compare,
                       prior=prior, figure=draw_scores_figure)


__all__ = ["draw_scores_figure", "write_judge_scores"]
