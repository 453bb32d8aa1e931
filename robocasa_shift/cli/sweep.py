"""``sweep``: where each base episode breaks along one factor's frozen direction."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from robocasa_shift.cli.common import handle_errors, study_options
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.errors import BadInput, CheckFailed
from robocasa_shift.study.plan import parse_episodes
from robocasa_shift.sweep.search import MODES
from robocasa_shift.sweep.spec import grid_severities
from robocasa_shift.sweep.study import SUMMARY, resolution_grid, run_sweep


def _severities(text: str) -> list:
    try:
        return [float(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise BadInput(f"severities must be a comma list of numbers such as 1,2.5,3, got {text!r}") from None


@click.command(name="sweep")
@click.option("--task", required=True, help="The task.")
@click.option("--factor", required=True, help="The factor to sweep (camera, blur, illumination, base).")
@click.option("--episodes", default="0-19", show_default=True, help="Formal base episodes, e.g. 0-19.")
@click.option("--grid", "grid_points", type=int, default=None,
              help="A predeclared grid of this many evenly spaced severities up to the top frozen level.")
@click.option("--resolution", type=float, default=None,
              help="Or: bisection to this resolution in severity units (1 = one frozen level).")
@click.option("--severities", default=None, help="Or: the grid itself, e.g. 0.5,1,1.5,2,3.")
@click.option("--mode", type=click.Choice(MODES), default="bisect", show_default=True,
              help="bisect: about log2(grid) + 2 rollouts per episode; grid: every level (sees every non-monotone "
                   "episode).")
@click.option("--confirm-episodes", default=None, help="Held-out base episodes of the confirmation seed stream.")
@click.option("--confirm-severities", default=None, help="Grid severities the held-out episodes check (declared "
                                                         "before they run).")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory of this sweep (one factor and grid each); rerunning resumes it.")
@study_options(log_steps=True)
@handle_errors
def sweep_command(task: str, factor: str, episodes: str, grid_points: Optional[int], resolution: Optional[float],
                  severities: Optional[str], mode: str, confirm_episodes: Optional[str],
                  confirm_severities: Optional[str], run_dir: Path, study: StudyConfig) -> None:
    """Breaking points per base episode on one factor's frozen direction, with a survival curve.

    Severity 0 is nominal, 1-3 the frozen L1-L3, linear in between; one draw per base episode serves
    every severity. Writes RUN_DIR/sweep/summary.json; exits 1 when the held-out confirmation fails.

    \b
    Examples:
      robocasa-shift sweep --backend fake --policy fake --task Reach --factor camera \\
          --episodes 0-19 --grid 12 --confirm-episodes 0-19 --confirm-severities 1.5,3 --run-dir runs/sweep-camera
      robocasa-shift sweep --task Lift --factor blur --resolution 0.25 --episodes 0-19 --run-dir runs/sweep-blur
    """
    protocol = specs.load_protocol(verify=True)
    given = [x is not None for x in (grid_points, resolution, severities)]
    if sum(given) != 1:
        raise BadInput("give exactly one of --grid, --resolution, --severities")
    top = float(len(protocol.factor(factor).levels))
    if grid_points is not None:
        grid = grid_severities(protocol, factor, grid_points)
    elif resolution is not None:
        grid = resolution_grid(resolution, top)
    else:
        grid = _severities(severities)
    summary = run_sweep(run_dir, task, factor, parse_episodes(episodes), grid, study, mode,
                        parse_episodes(confirm_episodes) if confirm_episodes else (),
                        _severities(confirm_severities) if confirm_severities else ())
    curve, spent = summary["curve"], summary["cost"]
    med = curve["median_breaking_point"]
    click.echo(f"{factor} on {task}: {curve['n']} episodes succeeded clean, {curve['failed_clean']} failed clean, "
               f"{curve['never_broke']} never broke up to {top:g}; non-monotone: {curve['non_monotone'] or 'none'}")
    for row in curve["points"]:
        lo, hi = row["simultaneous"]
        click.echo(f"  severity {row['severity']:<6g} surviving {row['surviving']}/{row['n']}  "
                   f"simultaneous band [{lo:.2f}, {hi:.2f}]")
    shown = "beyond the maximum" if med["beyond_max"] else med["median"]
    click.echo(f"median breaking point {shown}, interval {med['interval']}")
    click.echo(f"rollouts {spent['rollouts']} (dense grid {spent['dense_grid_rollouts']}, frozen three levels "
               f"{spent['frozen_levels_rollouts']})")
    if summary["invalid"]:
        click.echo(f"invalid rollouts left {len(summary['invalid'])} episode(s) without a breaking point")
    if summary["unlatched_successes"]:
        click.echo(f"{len(summary['unlatched_successes'])} success(es) with subgoals the stage tracker did not latch "
                   "(the stage spec asks more than the success check; counted as successes)")
    click.echo(f"-> {run_dir / SUMMARY}")
    if "confirmation" in summary:
        conf = summary["confirmation"]
        for p in conf["points"]:
            click.echo(f"  held out at {p['severity']:g}: {p['held_out_rate']} vs curve {p['curve_rate']} "
                       f"-> {'confirmed' if p['confirmed'] else 'NOT confirmed'}")
        if not conf["passed"]:
            raise CheckFailed("the held-out confirmation did not confirm the curve")
