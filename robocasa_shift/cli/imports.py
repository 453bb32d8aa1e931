"""``import-results``: another harness's results as a run directory of this one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from robocasa_shift.cli.common import handle_errors
from robocasa_shift.importing.sources import FORMATS


def _fmt(value: Optional[float], spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


@click.command(name="import-results")
@click.argument("fmt", metavar="FORMAT", type=click.Choice(sorted(FORMATS)))
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="A new (or empty) run directory to write; nothing is written there if the import is refused.")
@click.option("--classification", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="liberoplus: LIBERO-Plus's task_classification.json (libero/libero/benchmark/ in its package).")
@click.option("--policy", default=None, help="The policy's name for the records [default: from the source, else "
                                             "'unknown'].")
@handle_errors
def import_results_command(fmt: str, path: Path, run_dir: Path, classification: Optional[Path],
                           policy: Optional[str]) -> None:
    """Read another harness's per-episode results and judge them by this harness's statistics.

    \b
    FORMAT is one of:
      liberoplus    a LIBERO-Plus per-episode table (CSV or JSON Lines: suite, name or id,
                    success, episode, instruction) joined with --classification
      lerobot-eval  eval_info.json written by lerobot-eval
      vla-eval      the result JSON of one vla-eval benchmark run

    Writes RUN_DIR with one record per episode (each naming its source file's
    SHA-256 and line) and RUN_DIR/analysis/imported.json: success per condition
    (dimension x difficulty) with intervals clustered by base task, and dSR
    against clean: paired, with the main study's verdicts, only where the source
    proves that a variant started from its clean twin's initial state; else
    labelled UNPAIRED. Instructions that carry the variant's id are flagged.

    \b
    Examples:
      robocasa-shift import-results liberoplus eval_log.csv \\
          --classification task_classification.json --run-dir runs/lp-openvla
      robocasa-shift import-results vla-eval results/libero_spatial.json --run-dir runs/ve-pi0
      robocasa-shift report runs/lp-openvla             # the page says the harness did not run them
      robocasa-shift compare runs/lp-openvla runs/lp-pi0  # variant by variant; test-retest agreement
    """
    from robocasa_shift.importing.writer import import_results

    summary = import_results(fmt, path, run_dir, classification=classification, policy=policy)
    info = summary["imported"]
    click.echo(f"{info['episodes']} episodes from {path} ({fmt}, sha256 {info['source_sha256'][:12]}...) -> {run_dir}")
    click.echo(f"  {info['note']}; across runs: {info['cross_run_pairing']}")
    for cond, entry in summary["conditions"].items():
        rate = entry["rate"]
        ci = rate["ci95"]
        line = f"  {cond:<28} SR {_fmt(rate['sr'])} [{_fmt(ci[0]) if ci else '-'}, {_fmt(ci[1]) if ci else '-'}] n {rate['n']}"
        if entry.get("paired"):
            p = entry["paired"]
            line += f"  dSR {_fmt(p['dsr'], '+.3f')} paired ({p['pairs']} pairs) {p['verdict'] or '-'}"
        elif entry.get("unpaired"):
            u = entry["unpaired"]
            line += f"  dSR {_fmt(u['dsr'], '+.3f')} UNPAIRED {u.get('verdict') or '-'}"
        click.echo(line)
    if summary["instruction_leaks"]:
        click.echo(f"  WARNING: {info['instruction_leaks']} instruction(s) carry their variant's id "
                   f"(see analysis/imported.json, instruction_leaks)")
