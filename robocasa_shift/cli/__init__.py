"""The ``robocasa-shift`` command line (also ``python -m robocasa_shift``).

Every command is a thin call into the Python API. Exit status 2 means bad
input (an unknown name, a malformed or tampered spec, a bad range); the
message lists the valid names or names the file and field.

One module per group of commands: ``info`` (conditions, tasks, policies),
``run`` (run, screen, formal, merge), ``checks`` (validate-stages,
validate-pairing, calibrate, audit, diff-runs, check-backend, check-policy),
``analysis`` (export, analyze, report, compare), ``statistics`` (check-coverage,
plan-power), ``imports`` (import-results: other harnesses' results), ``branch``,
``sweep``, ``monitors``, ``judges`` (export-judge, judge, localise, score-judge,
train-judge), ``tools`` (freeze, train-reference, train-lerobot, bench,
libero-stage-specs, import-liberoplus) and ``kits`` (standin-kit: the robocasa
backend's generated stand-in kitchens); ``common`` holds the error handling
and the options they share, built from the fields of :mod:`robocasa_shift.config`.

A command's module is imported only when that command runs (or ``--help``
lists it): the report's and the statistics' imports (pandas, scipy) cost a
second, which ``conditions`` or ``audit`` need not pay.
"""

from __future__ import annotations

from importlib import import_module
from typing import Dict, List, Optional

import click

# Every command: its name -> "module:attribute" of its click command.
COMMANDS: Dict[str, str] = {
    "conditions": "robocasa_shift.cli.info:conditions_command",
    "tasks": "robocasa_shift.cli.info:tasks_command",
    "policies": "robocasa_shift.cli.info:policies_command",
    "run": "robocasa_shift.cli.run:run_command",
    "screen": "robocasa_shift.cli.run:screen_command",
    "formal": "robocasa_shift.cli.run:formal_command",
    "merge": "robocasa_shift.cli.run:merge_command",
    "validate-stages": "robocasa_shift.cli.checks:validate_stages_command",
    "validate-pairing": "robocasa_shift.cli.checks:validate_pairing_command",
    "calibrate": "robocasa_shift.cli.checks:calibrate_command",
    "audit": "robocasa_shift.cli.checks:audit_command",
    "diff-runs": "robocasa_shift.cli.checks:diff_runs_command",
    "check-backend": "robocasa_shift.cli.checks:check_backend_command",
    "check-policy": "robocasa_shift.cli.checks:check_policy_command",
    "export": "robocasa_shift.cli.analysis:export_command",
    "analyze": "robocasa_shift.cli.analysis:analyze_command",
    "report": "robocasa_shift.cli.analysis:report_command",
    "compare": "robocasa_shift.cli.analysis:compare_command",
    "check-coverage": "robocasa_shift.cli.statistics:check_coverage_command",
    "plan-power": "robocasa_shift.cli.statistics:plan_power_command",
    "import-results": "robocasa_shift.cli.imports:import_results_command",
    "branch": "robocasa_shift.cli.branch:branch_command",
    "sweep": "robocasa_shift.cli.sweep:sweep_command",
    "monitors": "robocasa_shift.cli.monitors:monitors_command",
    "export-judge": "robocasa_shift.cli.judges:export_judge_command",
    "judge": "robocasa_shift.cli.judges:judge_command",
    "localise": "robocasa_shift.cli.judges:localise_command",
    "score-judge": "robocasa_shift.cli.judges:score_judge_command",
    "train-judge": "robocasa_shift.cli.judges:train_judge_command",
    "freeze": "robocasa_shift.cli.tools:freeze_command",
    "train-reference": "robocasa_shift.cli.tools:train_reference_command",
    "train-lerobot": "robocasa_shift.cli.tools:train_lerobot_command",
    "bench": "robocasa_shift.cli.tools:bench_command",
    "libero-stage-specs": "robocasa_shift.cli.tools:libero_stage_specs_command",
    "import-liberoplus": "robocasa_shift.cli.tools:import_liberoplus_command",
    "standin-kit": "robocasa_shift.cli.kits:standin_kit_group",
}


class LazyGroup(click.Group):
    """A click group whose commands are imported on first use from a name -> "module:attribute" table
    (click's documented lazy-loading pattern)."""

    def __init__(self, *args, lazy_commands: Dict[str, str], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy_commands = lazy_commands

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted({*self.commands, *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> Optional[click.Command]:
        if cmd_name not in self.commands and cmd_name in self.lazy_commands:
            module, attribute = self.lazy_commands[cmd_name].split(":")
            command = getattr(import_module(module), attribute)
            if not isinstance(command, click.Command) or command.name != cmd_name:
                raise TypeError(f"{self.lazy_commands[cmd_name]} is not the click command {cmd_name!r}")
            self.add_command(command)
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: List[str]):
        # click suggests close names for an unknown one from self.commands, the commands loaded so far:
        # load them all first, so that the error lists the same names as before.
        if click.utils.make_str(args[0]) not in self.list_commands(ctx):
            for name in self.lazy_commands:
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)


@click.group(cls=LazyGroup, lazy_commands=COMMANDS,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="robocasa-shift")
def main():
    """Measure how manipulation policies break under controlled distribution shift, and where.

    A study runs every (task, base episode) clean and under 12 frozen
    perturbations (4 factors x 3 levels), pairing each perturbed rollout with
    its clean twin: same seed, same initial simulator state, same policy RNG
    state. A StageTracker records the deepest subgoal each rollout reached.

    \b
    Typical use:
      robocasa-shift conditions                  # the 13 frozen conditions
      robocasa-shift tasks                       # tasks, horizons, subgoals
      robocasa-shift run --task Lift --condition all --episodes 0-4 --run-dir runs/try
      robocasa-shift export runs/try --out runs/try/records.csv
    """


__all__ = ["COMMANDS", "LazyGroup", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
