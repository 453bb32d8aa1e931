"""``branch``: counterfactual continuations from restored checkpoints of a run's failures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Tuple

import click

from robocasa_shift.analysis import recoverability
from robocasa_shift.branching.checkpoints import BUDGETS, BranchSettings
from robocasa_shift.branching.interventions import INTERVENTIONS
from robocasa_shift.branching.study import SELECTION_KINDS, Selection, branch
from robocasa_shift.cli.common import (
    REPLAY_POLICY_OPTIONS,
    RETRY_OPTION,
    execution_options,
    handle_errors,
)
from robocasa_shift.config import ExecutionConfig
from robocasa_shift.errors import BadInput


def _names(values: Tuple[str, ...]) -> Tuple[str, ...]:
    return tuple(n.strip() for v in values for n in v.split(",") if n.strip())


def _ints(text: Optional[str]) -> Tuple[int, ...]:
    if not text:
        return ()
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"expected a comma list of control steps, got {text!r}", param_hint="--steps")


@click.command(name="branch")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", default="default", show_default=True,
              help="Branch study folder, RUN_DIR/branching/NAME (other settings need another name).")
@click.option("--select", "kinds", multiple=True, default=SELECTION_KINDS, show_default=True,
              help=f"Which failures become trunks: {', '.join(SELECTION_KINDS)} (shift_failure: perturbed "
                   "failures whose clean twin succeeded, the S->F pairs).")
@click.option("--task", "tasks", multiple=True, help="Only these tasks (comma list).")
@click.option("--condition", "conditions", multiple=True, help="Only these conditions (comma list).")
@click.option("--key", "keys", multiple=True,
              help="Explicit trunk key(s) instead of --select, e.g. formal/Lift/0003/base:L2/r0.")
@click.option("--max-trunks", type=int, default=None,
              help="At most this many trunks, round-robin over (condition, task).")
@click.option("--stride", default=1, show_default=True, type=click.IntRange(min=1),
              help="Branch every STRIDE-th action-chunk boundary (1: every one).")
@click.option("--steps", default=None, help="Explicit checkpoint steps (chunk boundaries), e.g. 40,80; replaces --stride.")
@click.option("--intervention", "interventions", multiple=True, default=("continue", "recover"), show_default=True,
              help="The repertoire (comma list); registered: " + ", ".join(INTERVENTIONS.names()) + ".")
@click.option("--k", "k_initial", default=recoverability.K_INITIAL, show_default=True, type=click.IntRange(min=1),
              help="Branches per (checkpoint, intervention).")
@click.option("--k-expanded", default=recoverability.K_EXPANDED, show_default=True, type=click.IntRange(min=1),
              help="Branches in all where the central 50% posterior interval straddles --tau.")
@click.option("--k-fixed", type=click.IntRange(min=1), default=None,
              help="Also run every (checkpoint, intervention) to this many branches in all (e.g. 32): a fixed-K "
                   "reference for the adaptive rule, whose agreement the summary reports (RESCUE Sec. IV-E).")
@click.option("--tau", default=recoverability.TAU, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Primary recovery criterion (0.3 and 0.7 are reported too).")
@click.option("--sigma", default=0.05, show_default=True, type=click.FloatRange(min=0),
              help="Execution noise on the six continuous arm commands (0: none).")
@click.option("--budget", type=click.Choice(BUDGETS), default="inherited", show_default=True,
              help="inherited: a branch ends at the task's horizon, B(t) = horizon - t; fresh: --fresh-budget "
                   "steps after its checkpoint.")
@click.option("--fresh-budget", type=click.IntRange(min=1), default=None, help="Steps for --budget fresh.")
@REPLAY_POLICY_OPTIONS
@click.option("--dry-run", is_flag=True, help="Count trunks, checkpoints and branch rollouts and estimate the time; run nothing.")
@RETRY_OPTION
@execution_options
@handle_errors
def branch_command(run_dir: Path, name: str, kinds, tasks, conditions, keys, max_trunks: Optional[int], stride: int,
                   steps: Optional[str], interventions, k_initial: int, k_expanded: int, k_fixed: Optional[int],
                   tau: float, sigma: float,
                   budget: str, fresh_budget: Optional[int], policy_options, trust_run_dir: bool, dry_run: bool,
                   retry_errors: bool, execution: ExecutionConfig) -> None:
    """Where could a failure still have been saved, and by what? (RESCUE, stage-aware.)

    Re-runs each selected failure (the trunk) with a snapshot at every action-chunk
    boundary, checks that a restored checkpoint reproduces the trunk bit for bit,
    then runs K seeded counterfactual branches per (checkpoint, intervention),
    expanded to --k-expanded where the verdict is unclear. A checkpoint is
    recoverable when the lower Jeffreys quantile (q = 0.25) of its success
    probability reaches --tau; the recoverability horizon is the latest such
    checkpoint. Results, figures and summary.json go to RUN_DIR/branching/NAME/;
    `robocasa-shift report RUN_DIR` shows them. Rerunning resumes.

    \b
    Example: four S->F failures of base-shift conditions, every 4th chunk boundary
      robocasa-shift branch runs/demo --condition base:L2,base:L3 --max-trunks 4 --stride 4 --dry-run
    """
    try:
        settings = BranchSettings(interventions=_names(interventions), k_initial=k_initial, k_expanded=k_expanded,
                                  tau=tau, sigma=sigma, budget=budget, fresh_budget=fresh_budget, stride=stride,
                                  k_fixed=k_fixed)
        selection = Selection(kinds=_names(kinds), tasks=_names(tasks) or None, conditions=_names(conditions) or None,
                              keys=_names(keys), steps=_ints(steps), max_trunks=max_trunks)
    except BadInput as exc:
        raise click.UsageError(str(exc)) from None
    result = branch(run_dir, selection, settings, execution, name=name, policy_options=policy_options,
                    trust_run_dir=trust_run_dir, retry_errors=retry_errors, dry_run=dry_run)
    if dry_run:
        click.echo(json.dumps({k: v for k, v in result.items() if k != "trunks"}, indent=1))
        for trunk in result["trunks"]:
            click.echo(f"  {trunk['key']}  ({trunk['selection']})")
        return
    from robocasa_shift.report.branching import write_branch_outputs

    summary = write_branch_outputs(Path(result["branch_dir"]))
    fidelity = summary.get("fidelity", {})
    click.echo(f"{result['trunks_selected']} trunks ({result['trunks_reproduced']} reproduced), "
               f"{result['checkpoints_run']} checkpoints run ({result['checkpoints_invalid']} invalid, "
               f"{result['fidelity_failed']} failed replay fidelity); fidelity so far "
               f"{fidelity.get('ok', '?')}/{fidelity.get('checked', '?')} -> {result['branch_dir']}")
