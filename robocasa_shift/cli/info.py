"""Commands that describe the frozen suite: ``conditions``, ``tasks``, ``policies``."""

from __future__ import annotations

import json

import click

from robocasa_shift.backends import get_backend
from robocasa_shift.cli.common import BACKEND_OPTION, handle_errors
from robocasa_shift.core import specs
from robocasa_shift.core.factors import describe_conditions
from robocasa_shift.policies import POLICIES


@click.command(name="conditions")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handle_errors
def conditions_command(as_json: bool) -> None:
    """List the 13 conditions of the matrix with their frozen parameters and spec hash, then the
    optional factors' conditions and the predeclared combinations (run only when named, e.g.
    --condition language:L1), every factor under its family (scene, sensing, embodiment, language,
    deployment) with the backends that can run it."""
    from robocasa_shift.checks.factor_support import YES, combination_rows, factor_table
    from robocasa_shift.core.shifts import FAMILIES

    protocol = specs.load_protocol(verify=True)
    rows = describe_conditions(protocol)
    table = factor_table(protocol)
    combinations = combination_rows(protocol, table)
    if as_json:
        click.echo(
            json.dumps(
                {"spec_hash": protocol.spec_hash, "study_seed": protocol.study_seed, "conditions": rows,
                 "families": FAMILIES, "factors": table, "combinations": combinations}, indent=2
            )
        )
        return
    click.echo(f"spec hash {protocol.spec_hash}   study seed {protocol.study_seed}")
    by_condition = {row["condition"]: row for row in rows}
    click.echo(f"  {'clean':<18}")
    family = None
    for factor in table:
        if factor["family"] != family:
            family = factor["family"]
            click.echo(f"{family}: {FAMILIES.get(family, '')}")
        runs_on = [b for b, s in factor["backends"].items() if s["status"] == YES]
        where = "matrix" if factor["matrix"] else "optional: only when named"
        click.echo(f"  {factor['factor']} ({factor['kind']}; {where}; backends: {', '.join(runs_on) or 'none'})")
        for condition in factor["levels"]:
            row = by_condition[condition]
            params = ", ".join(f"{k}={v:g}" for k, v in row["params"].items())
            extra = f"  draw: {row['draw']}" if row.get("draw", "none") != "none" else ""
            click.echo(f"    {row['condition']:<18} {params}{extra}")
    if combinations:
        click.echo("combinations (optional: only when named; the interaction dSR(A+B) - dSR(A) - dSR(B) per pair)")
        for combo in combinations:
            click.echo(f"    {combo['condition']:<34} {' x '.join(combo['families'])}; backends: "
                       f"{', '.join(combo['backends']) or 'none'}")


@click.command(name="tasks")
@BACKEND_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handle_errors
def tasks_command(backend: str, as_json: bool) -> None:
    """List a backend's tasks: instruction, horizon, success, randomization and ordered subgoals."""
    b = get_backend(backend)
    rows = []
    for name in b.task_names():
        info = b.task(name)
        spec = specs.load_stage_spec(backend, name)
        rows.append(
            {
                "task": name,
                "horizon": info.horizon,
                "instruction": info.instruction,
                "success": info.description,
                "randomization": info.randomization,
                "subgoals": [{"id": g.id, "description": g.description} for g in spec.subgoals],
                "stage_spec_sha256": spec.content_hash,
            }
        )
    if as_json:
        click.echo(json.dumps({"backend": backend, "tasks": rows}, indent=2))
        return
    for row in rows:
        click.echo(f"{row['task']}  (horizon {row['horizon']}): {row['instruction']}")
        click.echo(f"  success: {row['success']}")
        if row["randomization"]:
            click.echo(f"  randomized: {row['randomization']}")
        for i, goal in enumerate(row["subgoals"], 1):
            click.echo(f"  g{i} {goal['id']}: {goal['description']}")


@click.command(name="policies")
@handle_errors
def policies_command() -> None:
    """List registered policies."""
    click.echo("\n".join(POLICIES.names()))
