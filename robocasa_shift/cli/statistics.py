"""Commands about the statistics themselves: ``check-coverage`` (do the intervals keep their promise?)
and ``plan-power`` (how many base episodes does a wanted detectable dSR need?)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import click

from robocasa_shift.analysis import statistics as stats
from robocasa_shift.cli.common import handle_errors
from robocasa_shift.core.specs import load_protocol
from robocasa_shift.errors import BadInput, CheckFailed
from robocasa_shift.rundir.files import atomic_write_text

THRESHOLD = 0.93


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
    low = min(cell.calibrated, cell.task_calibrated)
    flag = "" if low >= THRESHOLD or not cell.in_range else f"  BELOW {THRESHOLD}"
    timing = f"  {seconds:5.1f} s" if seconds is not None else ""
    return (f"{cell.concordance:>5.2f} {cell.clean_success:>5.2f} {cell.dsr:>5.2f} {cell.n_tasks:>5d} "
            f"{cell.ceiling_tasks:>4d} {cell.n_pairs:>5d}   "
            f"{cell.calibrated:>6.3f} {cell.calibrated_width:>6.3f}  {cell.task_calibrated:>6.3f}   "
            f"{cell.percentile:>6.3f} {cell.percentile_zero_width:>6.3f} {cell.percentile_width:>6.3f}  "
            f"{cell.task_percentile:>6.3f}{flag}{timing}")


HEADER = ("conc. clean   dSR tasks ceil pairs    calibrated (the shown one)      percentile bootstrap (the paper's)\n"
          "                                      macro  width  per task        macro zero-w  width  per task")

# Which interval each worst-cell line reports: (label, attribute).
INTERVALS = (("calibrated, macro", "calibrated"), ("calibrated, per task", "task_calibrated"),
             ("percentile bootstrap, macro", "percentile"), ("percentile bootstrap, per task", "task_percentile"))
EXACT_PAIRS = (10, 20, 30, 50)


@click.command(name="check-coverage")
@click.option("--clean-success", default="0.6,0.8,0.95", show_default=True, help="Clean success rates (comma list).")
@click.option("--dsr", "true_dsr", default="0,0.2,0.5", show_default=True, help="True per-task dSR values (comma list).")
@click.option("--tasks", "n_tasks", default="1,2,3,4,8", show_default=True, help="Task counts (comma list).")
@click.option("--pairs", "n_pairs", default="10,20,50", show_default=True, help="Pairs per task (comma list).")
@click.option("--studies", default=2000, show_default=True, type=click.IntRange(10), help="Simulated studies per cell.")
@click.option("--n-boot", default=1000, show_default=True, type=click.IntRange(10, 10000),
              help="Bootstrap resamples per simulated study (capped at 10,000; the analysis uses 10,000).")
@click.option("--seed", default=0, show_default=True, help="Simulation seed; each cell has its own stream from it.")
@click.option("--concordance", default="-0.5,0,0.5,1", show_default=True,
              help="Dependence of the clean and perturbed outcomes (comma list, each in [-1, 1]): 1 comonotone (the "
                   "perturbation only hurts), 0 independent, below 0 negatively dependent (-1: as discordant as the "
                   "rates allow); the per-task pair probabilities mix the two extremes.")
@click.option("--ceiling/--no-ceiling", default=True, show_default=True,
              help="Also the heterogeneous cells: all tasks but one at the ceiling (every pair S->S).")
@click.option("--exact/--no-exact", "exact", default=True, show_default=True,
              help="Also the exact one-task coverage of the per-task interval, by enumeration, at 10, 20, 30 and 50 "
                   "pairs over every (p_SF, p_FS) on a 0.01 grid.")
@click.option("--studies-intervals/--no-studies-intervals", "study_intervals", default=True, show_default=True,
              help="Also the intervals of the studies beyond the matrix: the interaction interval on its grid "
                   "(dSR(A), dSR(B) 0 / 0.2 / 0.3, 10 to 200 episodes, independent to fully dependent failures) and "
                   "on random dependent joints, and the monitors' intervals over tasks (LOTO macro AUC, "
                   "pooled-minus-macro gap) on a task-population grid.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1), help="Processes (cells in parallel).")
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=Path), help="Also write the cells as JSON.")
@handle_errors
def check_coverage_command(clean_success: str, true_dsr: str, n_tasks: str, n_pairs: str, studies: int, n_boot: int,
                           seed: int, concordance: str, ceiling: bool, exact: bool, study_intervals: bool,
                           workers: int, out: Optional[Path]) -> None:
    """Simulate studies with a known true macro dSR and print how often each interval covers it.

    \b
    Every cell of the grid (concordance x clean success x true per-task dSR x
    tasks x pairs, then, with --ceiling, the same with all tasks but one at
    the ceiling) draws STUDIES studies, then computes for each the calibrated
    intervals as a single condition publishes them (macro and per task,
    extended to 0 where the exact test does not reject) and the paper's
    percentile pair bootstrap (N_BOOT resamples; macro and per task). It ends
    with the grid's worst cell per interval and, with --exact, the exact
    one-task coverage of the per-task interval, then, with
    --studies-intervals, the interaction interval's and the monitors'
    intervals over tasks (about 30 min more on 2 shared cores). Exit status 1
    when a calibrated or interaction interval covers less than 0.93 in a cell
    whose true success rates lie in [0.05, 0.95]. Not part of the test suite (`make
    check-coverage`); the default grid (924 cells) took 27 min with
    --workers 2 on 2 shared cores.
    """
    grid = dict(clean_success=_floats(clean_success, "clean-success"), true_dsr=_floats(true_dsr, "dsr"),
                n_tasks=_ints(n_tasks, "tasks"), n_pairs=_ints(n_pairs, "pairs"))
    concordances = _floats(concordance, "concordance")
    if any(not -1 <= r <= 1 for r in concordances) or not concordances:
        raise BadInput(f"--concordance: {concordance!r} must list values in [-1, 1]")
    for c in grid["clean_success"]:
        for d in grid["true_dsr"]:
            if not 0 <= c - d <= 1 or not 0 <= c <= 1:
                raise BadInput(f"clean success {c} and dSR {d} give a perturbed success rate {c - d} outside [0, 1]")
    click.echo(f"coverage of the 95% intervals of the macro dSR and of each task's dSR: {studies} studies per cell, "
               f"{n_boot} bootstrap resamples, seed {seed}, concordance {', '.join(f'{r:g}' for r in concordances)}"
               f"{', with the ceiling cells' if ceiling else ''}")
    click.echo(HEADER)
    started = time.perf_counter()
    cells = stats.coverage_grid(**grid, studies=studies, n_boot=n_boot, seed=seed, concordance=concordances,
                                workers=workers, ceiling=ceiling,
                                progress=lambda cell, s: click.echo(_cell_line(cell, s)))
    elapsed = time.perf_counter() - started
    in_range = [c for c in cells if c.in_range] or cells
    click.echo(f"\n{len(cells)} cells in {elapsed:.1f} s ({workers} worker(s)); Monte Carlo standard error about "
               f"{(0.95 * 0.05 / studies) ** 0.5:.4f} at 0.95")
    worst_cells = {}
    for label, attribute in INTERVALS:
        worst = min(in_range, key=lambda c: getattr(c, attribute))
        worst_cells[attribute] = worst.to_json()
        click.echo(f"worst cell, {label + ':':<32} {getattr(worst, attribute):.3f}  ({_cell_name(worst)})")
    exact_rows = []
    if exact:
        click.echo("exact one-task coverage of the per-task calibrated interval (every (p_SF, p_FS) on a 0.01 grid):")
        for n in EXACT_PAIRS:
            realistic = stats.one_task_worst_coverage(n, 0.01, 0.7)
            every = stats.one_task_worst_coverage(n, 0.01, 1.0)
            exact_rows.append({"n_pairs": n, "worst_discordance_0_7": realistic.__dict__, "worst_all": every.__dict__})
            click.echo(f"  {n:>3d} pairs: worst {realistic.worst:.3f} where at most 70% of pairs are discordant "
                       f"(p_SF {realistic.p_sf:.2f}, p_FS {realistic.p_fs:.2f}); {every.worst:.3f} over every "
                       f"(p_SF {every.p_sf:.2f}, p_FS {every.p_fs:.2f}); mean {every.mean:.3f}")
    beyond = _study_interval_coverage(studies, seed) if study_intervals else {}
    if out is not None:
        atomic_write_text(out, json.dumps({"studies": studies, "n_boot": n_boot, "seed": seed, "concordance": concordances,
                                           "ceiling": ceiling, "seconds": elapsed, "worst": worst_cells,
                                           "exact": exact_rows, "cells": [c.to_json() for c in cells],
                                           "studies_beyond_the_matrix": beyond}, indent=1) + "\n")
    failures = stats.coverage_failures(cells, THRESHOLD)
    failures += [f"interaction, {_interaction_name(c)}" for c in beyond.get("interaction_grid", []) + beyond.get(
        "interaction_random", []) if c["coverage"] < THRESHOLD]
    if failures:
        raise CheckFailed(f"a calibrated interval covers less than {THRESHOLD} in {len(failures)} cell(s) whose true "
                          f"success rates lie in [0.05, 0.95]: "
                          + "; ".join(c if isinstance(c, str) else _cell_name(c) for c in failures))
    click.echo(f"calibrated intervals (macro and per task): at least {THRESHOLD} in every cell whose true success rates "
               "lie in [0.05, 0.95]")


def _interaction_name(cell: Dict[str, Any]) -> str:
    if "cell" in cell:
        return (f"random dependent joint {cell['cell']} (success rates "
                f"{', '.join(f'{r:.2f}' for r in cell['rates'])}), {cell['n_tasks']} x {cell['n']}")
    return (f"clean {cell['clean']:g}, dSR(A) {cell['dsr_a']:g}, dSR(B) {cell['dsr_b']:g}, interaction "
            f"{cell['interaction']:g}, {cell['n_tasks']} x {cell['n']}, dependence {cell['dependence']:g}")


def _study_interval_coverage(studies: int, seed: int) -> Dict[str, Any]:
    """The coverage of the interaction interval and of the monitors' intervals over tasks, printed as measured."""
    import itertools

    import numpy as np

    from robocasa_shift.analysis import interactions
    from robocasa_shift.analysis import monitor_detection as detection

    started = time.perf_counter()
    grid = interactions.coverage_grid(studies=studies, seed=seed)
    worst = min(grid, key=lambda c: c["coverage"])
    click.echo(f"\ninteraction interval, {len(grid)} grid cells: worst {worst['coverage']:.4f} "
               f"({_interaction_name(worst)}), mean {np.mean([c['coverage'] for c in grid]):.4f}")
    random_cells = interactions.random_dependent_coverage(studies=studies, seed=seed)
    worst = min(random_cells, key=lambda c: c["coverage"])
    click.echo(f"interaction interval, {len(random_cells)} random dependent cells: worst {worst['coverage']:.4f} "
               f"({_interaction_name(worst)}), mean {np.mean([c['coverage'] for c in random_cells]):.4f}")
    click.echo("monitors' intervals over tasks (LOTO macro AUC: t-interval; gap: jackknife-t); per cell "
               "tasks, episodes per task, spread of the tasks' separation, sd of their score offsets:")
    task_cells = []
    g = detection.TASK_COVERAGE_GRID
    for index, (k, n, spread, offset) in enumerate(itertools.product(g["n_tasks"], g["n_episodes"], g["spread"],
                                                                     g["offset_sd"])):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))
        cell = detection.task_interval_coverage(k, n, spread, offset, studies, rng)
        task_cells.append(cell)
        click.echo(f"  {k} x {n:>3d}, spread {spread:g}, offsets {offset:g}: macro AUC {cell['macro']:.3f}, "
                   f"gap {cell['gap']:.3f}")
    for key in ("macro", "gap"):
        worst = min(task_cells, key=lambda c: c[key])
        click.echo(f"worst cell, {key}: {worst[key]:.3f} ({worst['n_tasks']} tasks x {worst['n_episodes']}, spread "
                   f"{worst['spread']:g}, offsets {worst['offset_sd']:g}); range {min(c[key] for c in task_cells):.3f}-"
                   f"{max(c[key] for c in task_cells):.3f}")
    click.echo(f"({time.perf_counter() - started:.0f} s)")
    return {"interaction_grid": grid, "interaction_random": random_cells, "task_intervals": task_cells}


def _cell_name(cell: stats.CoverageCell) -> str:
    ceiling = f", {cell.ceiling_tasks} at the ceiling" if cell.ceiling_tasks else ""
    return (f"{cell.n_tasks} x {cell.n_pairs}{ceiling}, clean {cell.clean_success:g}, dSR {cell.dsr:g}, "
            f"concordance {cell.concordance:g}")


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


def _mde_text(result: stats.DetectableShift, power: float) -> str:
    if result.first is None:
        return f"no macro dSR up to 1 reads DEGRADED with power {power}"
    how = "exact" if result.method == "exact" else \
        f"{result.method}, {result.studies} studies, standard error {result.standard_error:.3f}"
    stable = ("; no dSR from which every larger one has it" if result.stable is None else
              "; every larger dSR on the grid has it too" if result.stable == result.first else
              f"; every dSR from {result.stable:.3f} on has it")
    return (f"{result.first:.3f} (the smallest dSR with power >= {power}: {result.power_at_first:.3f}, {how})"
            f"{stable}")


@click.command(name="plan-power")
@click.option("--dsr", "wanted", default=0.2, show_default=True, type=click.FloatRange(0, 1, min_open=True),
              help="The true macro dSR the study must detect (with --verdict degraded).")
@click.option("--verdict", "wanted_verdict", default="degraded", show_default=True,
              type=click.Choice(["degraded", "no-change"]),
              help="The verdict the study must reach with the power: DEGRADED at --dsr, or NO CHANGE DETECTED "
                   "when nothing changed (true dSR 0, margin --min-effect).")
@click.option("--min-effect", default=stats.MIN_EFFECT, show_default=True,
              type=click.FloatRange(0, 1, min_open=True, max_open=True), help="The verdicts' margin.")
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
def plan_power_command(wanted: float, wanted_verdict: str, min_effect: float, n_tasks: int,
                       discordance: Optional[float], summary_path: Optional[Path], condition: Optional[str],
                       n_pairs: Optional[int], alpha: float, power: float) -> None:
    """How many base episodes a verdict needs (or what dSR a pair count can detect).

    \b
    Power is that of the verdict the report prints, not of the test alone:
    DEGRADED needs the exact stratified sign-flip test of the macro dSR
    (two-sided, unadjusted alpha) to reject AND the calibrated interval to lie
    above 0; NO CHANGE DETECTED needs the interval inside +-margin. Over random
    pair outcomes: in every task each pair is S->F with probability
    (r + dSR) / 2 and F->S with (r - dSR) / 2, r the discordance rate (raised
    to the dSR where it is smaller: a perturbation that only hurts), and every
    task moves by the same dSR; exact where the outcomes can be enumerated,
    else Monte Carlo with its standard error. The power can saw-tooth, so two
    answers are printed: the smallest pair count (or dSR) with the power, and
    the smallest from which every larger one checked has it. Discordance is
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
    verdict = stats.DEGRADED if wanted_verdict == "degraded" else stats.NO_CHANGE
    shift = wanted if verdict == stats.DEGRADED else 0.0
    smallest = stats.smallest_reachable(n_tasks, verdict, alpha, min_effect)
    click.echo(f"verdict: {verdict} (exact stratified sign-flip test, two-sided, alpha {alpha}, and the calibrated "
               f"interval; margin +-{min_effect:g}), power {power}; {n_tasks} task(s); no outcome reads {verdict} below "
               f"{smallest} base episodes per task")
    click.echo(f"assumption: {stats.VERDICT_POWER_ASSUMPTION}")
    for label, rates in rate_sets:
        if n_pairs is not None and verdict == stats.NO_CHANGE:
            chance = stats.verdict_power([n_pairs] * n_tasks, rates, 0.0, alpha, verdict, min_effect)
            click.echo(f"  discordance {label}: {n_pairs} base episodes per task read NO CHANGE DETECTED with "
                       f"probability {_power_text(chance)} when nothing changed")
            continue
        if n_pairs is not None:
            mde = stats.minimum_detectable_dsr([n_pairs] * n_tasks, rates, alpha, power)
            click.echo(f"  discordance {label}: {n_pairs} base episodes per task detect a macro dSR of "
                       f"{_mde_text(mde, power)}")
            continue
        plan = stats.plan_pairs(n_tasks, shift, rates, alpha, power, verdict=verdict, min_effect=min_effect)
        n_conditions = len(load_protocol().conditions)
        if plan.first is None:
            click.echo(f"  discordance {label}: more than {plan.checked_up_to} base episodes per task")
            continue
        stable = (f"every pair count from {plan.stable} to {plan.checked_up_to} has it" if plan.stable is not None
                  else f"some pair count up to {plan.checked_up_to} falls below it again")
        goal = (f"detect a macro dSR of {wanted:.3f} (DEGRADED)" if verdict == stats.DEGRADED else
                "read NO CHANGE DETECTED when nothing changed")
        click.echo(f"  discordance {label}: {plan.first} base episodes per task {goal} "
                   f"(the smallest pair count with power >= {power}: {_power_text(plan.power[plan.first])}; {stable}; "
                   f"{plan.first} x {n_tasks} tasks x {n_conditions} conditions = "
                   f"{plan.first * n_tasks * n_conditions} formal rollouts)")


def _power_text(result: stats.PowerResult) -> str:
    return (f"{result.power:.3f}" if result.method == "exact" else
            f"{result.power:.3f}, monte carlo, {result.studies} studies, standard error {result.standard_error:.3f}")
