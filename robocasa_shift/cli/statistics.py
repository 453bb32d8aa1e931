"""Commands about the statistics themselves: ``check-coverage`` (do the intervals keep their promise?)
and ``plan-power`` (how many base episodes does a wanted detectable dSR need?)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import click

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.cli.common import handle_errors
from robocasa_shift.errors import BadInput, CheckFailed

# Formal conditions per base episode (PROTOCOL.md section 1: clean + 4 factors x 3 levels), for the rollout count.
FORMAL_CONDITIONS = 13


def _floats(text: str, name: str) -> List[float]:
    try:
        return [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BadInput(f"--{name}: {text!r} is not a comma-separated list of numbers") from None


def _ints(text: str, name: str) -> List[int]:
    values = _floats(text, name)
    if any(v != int(v) or v < 1 for v in values):
        raise BadInput(f"--{name}: {text!r} must list positive integers")
    return [int(v) for v in values]


def _cell_line(cell: stats.CoverageCell, seconds: Optional[float] = None) -> str:
    flag = "" if cell.calibrated >= 0.93 or not cell.in_range else "  BELOW 0.93"
    timing = f"  {seconds:5.1f} s" if seconds is not None else ""
    return (f"{cell.clean_success:>5.2f} {cell.dsr:>5.2f} {cell.n_tasks:>5d} {cell.n_pairs:>5d}   "
            f"{cell.percentile:>10.3f} {cell.percentile_zero_width:>9.3f} {cell.percentile_width:>7.3f}   "
            f"{cell.calibrated:>10.3f} {cell.calibrated_width:>7.3f}{flag}{timing}")


HEADER = ("clean   dSR tasks pairs   percentile zero-wdth   width   calibrated   width\n"
          "                          (the paper's bootstrap)          (adjusted Wald)")


@click.command(name="check-coverage")
@click.option("--clean-success", default="0.6,0.8,0.95", show_default=True, help="Clean success rates (comma list).")
@click.option("--dsr", "true_dsr", default="0,0.2,0.5", show_default=True, help="True per-task dSR values (comma list).")
@click.option("--tasks", "n_tasks", default="3,4,8", show_default=True, help="Task counts (comma list).")
@click.option("--pairs", "n_pairs", default="10,20,50", show_default=True, help="Pairs per task (comma list).")
@click.option("--studies", default=2000, show_default=True, type=click.IntRange(10), help="Simulated studies per cell.")
@click.option("--n-boot", default=1000, show_default=True, type=click.IntRange(10, 10000),
              help="Bootstrap resamples per simulated study (capped at 10,000; the analysis uses 10,000).")
@click.option("--seed", default=0, show_default=True, help="Simulation seed; each cell has its own stream from it.")
@click.option("--concordance", default=stats.CONCORDANCE, show_default=True, type=click.FloatRange(0, 1),
              help="Dependence of the clean and perturbed outcomes: 1 comonotone (the perturbation only hurts), "
                   "0 independent; the per-task pair probabilities mix the two.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Processes (cells in parallel).")
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Also write the cells as JSON.")
@handle_errors
def check_coverage_command(clean_success: str, true_dsr: str, n_tasks: str, n_pairs: str, studies: int, n_boot: int,
                           seed: int, concordance: float, workers: int, out: Optional[Path]) -> None:
    """Simulate studies with a known true macro dSR and print how often each interval covers it.

    \b
    Every cell of the grid (clean success x true per-task dSR x tasks x pairs)
    draws STUDIES studies whose tasks all have the pair probabilities (SS, SF,
    FS, FF) of the cell, then computes the paper's percentile pair bootstrap
    (N_BOOT resamples) and the calibrated interval for each. Exit status 1
    when the calibrated interval covers less than 0.93 in a cell whose true
    success rates lie in [0.05, 0.95]. Not part of the test suite (`make
    check-coverage`); the default grid took about 80 s on one core.
    """
    grid = dict(clean_success=_floats(clean_success, "clean-success"), true_dsr=_floats(true_dsr, "dsr"),
                n_tasks=_ints(n_tasks, "tasks"), n_pairs=_ints(n_pairs, "pairs"))
    for c in grid["clean_success"]:
        for d in grid["true_dsr"]:
            if not 0 <= c - d <= 1 or not 0 <= c <= 1:
                raise BadInput(f"clean success {c} and dSR {d} give a perturbed success rate {c - d} outside [0, 1]")
    click.echo(f"coverage of the 95% intervals of the macro dSR: {studies} studies per cell, {n_boot} bootstrap "
               f"resamples, seed {seed}, concordance {concordance}")
    click.echo(HEADER)
    started = time.perf_counter()
    cells = stats.coverage_grid(**grid, studies=studies, n_boot=n_boot, seed=seed, concordance=concordance,
                                workers=workers, progress=lambda cell, s: click.echo(_cell_line(cell, s)))
    elapsed = time.perf_counter() - started
    in_range = [c for c in cells if c.in_range] or cells
    worst_pct = min(in_range, key=lambda c: c.percentile)
    worst_cal = min(in_range, key=lambda c: c.calibrated)
    click.echo(f"\n{len(cells)} cells in {elapsed:.1f} s ({workers} worker(s)); Monte Carlo standard error about "
               f"{(0.95 * 0.05 / studies) ** 0.5:.4f} at 0.95")
    click.echo("worst cell, percentile bootstrap: " + _cell_line(worst_pct).strip())
    click.echo("worst cell, calibrated:           " + _cell_line(worst_cal).strip())
    for cell in cells:
        if cell.n_tasks == 4 and cell.n_pairs == 20:
            click.echo("4 tasks x 20 pairs:               " + _cell_line(cell).strip())
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"studies": studies, "n_boot": n_boot, "seed": seed, "concordance": concordance,
                                   "seconds": elapsed, "cells": [{**c.__dict__, "in_range": c.in_range} for c in cells]},
                                  indent=1) + "\n")
    failures = stats.coverage_failures(cells)
    if failures:
        raise CheckFailed(f"the calibrated interval covers less than 0.93 in {len(failures)} cell(s) whose true success "
                          f"rates lie in [0.05, 0.95]: " + "; ".join(_cell_line(c).strip() for c in failures))
    click.echo("calibrated interval: at least 0.93 in every cell whose true success rates lie in [0.05, 0.95]")


def _summary_rates(path: Path, condition: str) -> Tuple[List[float], List[int]]:
    """Observed per-task discordance rates and pair counts of one condition of a summary.json."""
    summary = json.loads(path.read_text())
    if condition not in summary.get("conditions", {}) or condition == "clean":
        known = [c for c in summary.get("conditions", {}) if c != "clean"]
        raise BadInput(f"{path}: no perturbed condition {condition!r}; known: {', '.join(known)}")
    measures = summary["conditions"][condition]
    tasks = [t for t in summary["tasks"] if measures["per_task_n_pairs"].get(t)]
    if not tasks:
        raise BadInput(f"{path}: condition {condition!r} has no valid pairs")
    return ([measures["per_task_transitions"][t]["changed"] / measures["per_task_n_pairs"][t] for t in tasks],
            [measures["per_task_n_pairs"][t] for t in tasks])


@click.command(name="plan-power")
@click.option("--dsr", "wanted", default=0.2, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="The true macro dSR the study must detect.")
@click.option("--tasks", "n_tasks", default=4, show_default=True, type=click.IntRange(1), help="Tasks in the suite.")
@click.option("--discordance", default=None, type=click.FloatRange(0, 1),
              help="Share of discordant pairs (S->F plus F->S) per task; default: a table over several values.")
@click.option("--from-summary", "summary_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Take the per-task discordance rates (and task count) observed in this summary.json ...")
@click.option("--condition", default=None, help="... under this condition (with --from-summary).")
@click.option("--pairs", "n_pairs", default=None, type=click.IntRange(2),
              help="Instead: the minimum detectable dSR at this many base episodes per task.")
@click.option("--alpha", default=stats.ALPHA, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True))
@click.option("--power", default=stats.POWER, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True))
@handle_errors
def plan_power_command(wanted: float, n_tasks: int, discordance: Optional[float], summary_path: Optional[Path],
                       condition: Optional[str], n_pairs: Optional[int], alpha: float, power: float) -> None:
    """How many base episodes a wanted detectable dSR needs (or what a pair count can detect).

    \b
    Power is that of the headline test (the exact stratified sign-flip test of
    the macro dSR, two-sided, unadjusted alpha). Assumption: every task keeps
    the given discordance rate (raised to the dSR where the dSR needs more
    discordant pairs) and every task moves by the same dSR. Discordance is
    what the answer hangs on: take it from a pilot or an earlier study
    (--from-summary), or read the table.
    """
    if (summary_path is None) != (condition is None):
        raise BadInput("--from-summary and --condition go together")
    rate_sets: List[Tuple[str, Sequence[float]]]
    if summary_path is not None:
        rates, observed_pairs = _summary_rates(summary_path, condition)
        n_tasks = len(rates)
        rate_sets = [(f"observed in {summary_path} under {condition} "
                      f"({', '.join(f'{r:.2f}' for r in rates)}; pairs {observed_pairs})", rates)]
    elif discordance is not None:
        rate_sets = [(f"{discordance:.2f} in every task", [discordance] * n_tasks)]
    else:
        values = sorted({round(wanted, 3), 0.3, 0.5, 0.7} - {v for v in (0.3, 0.5, 0.7) if v < wanted})
        rate_sets = [(f"{v:.2f} in every task", [v] * n_tasks) for v in values]
    click.echo(f"headline test: exact stratified sign-flip, two-sided, alpha {alpha}, power {power}; {n_tasks} task(s)")
    click.echo(f"assumption: {stats.POWER_ASSUMPTION}")
    for label, rates in rate_sets:
        if n_pairs is not None:
            mde = stats.minimum_detectable_dsr([n_pairs] * n_tasks, rates, alpha, power)
            text = "none up to 1" if mde is None else f"{mde:.3f}"
            click.echo(f"  discordance {label}: {n_pairs} base episodes per task detect a macro dSR of {text}")
            continue
        needed = stats.plan_pairs(n_tasks, wanted, rates, alpha, power)
        if needed is None:
            click.echo(f"  discordance {label}: more than 5000 base episodes per task")
        else:
            click.echo(f"  discordance {label}: {needed} base episodes per task detect a macro dSR of {wanted:.3f} "
                       f"({needed} x {n_tasks} tasks x {FORMAL_CONDITIONS} conditions = "
                       f"{needed * n_tasks * FORMAL_CONDITIONS} formal rollouts)")


COMMANDS = [check_coverage_command, plan_power_command]
