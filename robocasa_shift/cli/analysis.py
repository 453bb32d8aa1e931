"""Commands over recorded runs: ``export``, ``analyze``, ``report``, ``compare``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from robocasa_shift.analysis.compare import write_comparison
from robocasa_shift.analysis.export import export_records
from robocasa_shift.analysis.measures import load_records, write_analysis
from robocasa_shift.analysis.report import build_report
from robocasa_shift.cli.common import handle_errors


def fmt(value: Optional[float]) -> str:
    """A measure for the console: three decimals, a sign when negative, '-' when missing."""
    return "-" if value is None else f"{value:+.3f}" if value < 0 else f"{value:.3f}"


@click.command(name="export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="CSV file to write.")
@handle_errors
def export_command(run_dir: Path, out: Path) -> None:
    """Write a run's records as the records table (CSV, one row per rollout)."""
    n = export_records(run_dir, out)
    click.echo(f"{n} records -> {out}")


@click.command(name="analyze")
@click.argument("records", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for summary.json and the CSV tables.")
@click.option("--phase", default="formal", show_default=True, help="Rows of this phase are analysed.")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@click.option("--n-boot", default=10000, show_default=True, help="Bootstrap resamples.")
@handle_errors
def analyze_command(records: Path, out_dir: Path, phase: str, bootstrap_seed: int, n_boot: int) -> None:
    """Every measure of the protocol from a records table (this harness's or anyone's).

    \b
    Writes OUT/summary.json (SR, paired dSR with bootstrap CIs, transitions,
    S->F stage depth, McNemar with Holm, Wilson intervals, noise floor) and
    tidy CSV tables: sr.csv, dsr.csv, transitions.csv, stages.csv,
    first_incomplete.csv. Required columns: task, episode, condition, success,
    n_stages, stages_completed, first_incomplete; optional: valid, phase,
    replicate, spec_hash, stage_error.
    """
    summary = write_analysis(load_records(records), out_dir, phase=phase, n_boot=n_boot, bootstrap_seed=bootstrap_seed)
    click.echo(f"{len(summary['tasks'])} tasks, {len(summary['conditions'])} conditions -> {out_dir}/summary.json")
    for cond, values in summary["conditions"].items():
        if cond == "clean":
            click.echo(f"  {cond:<18} SR {fmt(values['macro_sr'])}")
        else:
            ci = values["dsr_ci95"]
            ci_text = f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "[-]"
            click.echo(f"  {cond:<18} SR {fmt(values['macro_sr'])}  dSR {fmt(values['macro_dsr'])} {ci_text}  "
                       f"S->F {values['transitions']['SF']}  F->S {values['transitions']['FS']}")


@click.command(name="report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--videos", "videos_per_kind", default=2, show_default=True,
              help="Matched pairs to film per kind (S->F and F->S).")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@handle_errors
def report_command(run_dir: Path, videos_per_kind: int, bootstrap_seed: int) -> None:
    """RUN_DIR/report/index.html: tables, figures and side-by-side videos of matched pairs.

    Also refreshes RUN_DIR/analysis/ (summary.json, CSV tables) and the audit.
    Videos re-run the selected pairs with frame capture; the page says whether
    each re-run reproduced the recorded outcome and subgoal steps exactly.
    """
    page = build_report(run_dir, videos_per_kind=videos_per_kind, bootstrap_seed=bootstrap_seed)
    click.echo(f"report -> {page}")


@click.command(name="compare")
@click.argument("run_a", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for compare.json/.md [default: RUN_A/compare-<name of RUN_B>].")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@handle_errors
def compare_command(run_a: Path, run_b: Path, out_dir: Optional[Path], bootstrap_seed: int) -> None:
    """Two policies (or versions) on the same frozen suite, pair by pair (A - B).

    Refused when the runs' spec hashes or study seeds differ. Per condition:
    paired success and stage-depth differences with bootstrap CIs, and McNemar
    on the discordant pairs (Holm-adjusted).
    """
    out_dir = out_dir or run_a / f"compare-{run_b.name}"
    result = write_comparison(run_a, run_b, out_dir, bootstrap_seed=bootstrap_seed)
    for cond, v in result["conditions"].items():
        click.echo(f"  {cond:<18} success {v['macro_success_diff']:+.3f}  depth {v['macro_depth_diff']:+.3f}  "
                   f"p(Holm) {v['mcnemar_p_holm']:.3g}")
    click.echo(f"-> {out_dir}/compare.md")


COMMANDS = [export_command, analyze_command, report_command, compare_command]
