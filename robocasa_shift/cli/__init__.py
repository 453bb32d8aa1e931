"""The ``robocasa-shift`` command line (also ``python -m robocasa_shift``).

Every command is a thin call into the Python API. Exit status 2 means bad
input (an unknown name, a malformed or tampered spec, a bad range); the
message lists the valid names or names the file and field.

One module per group of commands: ``info`` (conditions, tasks, policies),
``run`` (run, screen, formal, merge), ``checks`` (validate-stages,
validate-pairing, calibrate, audit), ``analysis`` (export, analyze, report,
compare), ``imports`` (import-results: other harnesses' results), ``branch``, ``sweep``, ``monitors``, ``judges`` (export-judge, judge, score-judge, train-judge), ``tools``
(freeze, train-reference, train-lerobot, bench) and ``kits``
(standin-kit: the robocasa backend's generated stand-in kitchens); ``common`` holds the
error handling and the options they share, built from the fields of
:mod:`robocasa_shift.config`.
"""

from __future__ import annotations

import click

from robocasa_shift.cli import (
    analysis,
    branch,
    checks,
    imports,
    info,
    judges,
    kits,
    monitors,
    run,
    statistics,
    sweep,
    tools,
)
from robocasa_shift.cli.common import handle_errors


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


for _module in (info, run, checks, analysis, imports, branch, monitors, judges, tools, statistics, kits, sweep):
    for _command in _module.COMMANDS:
        main.add_command(_command)

__all__ = ["handle_errors", "main"]

if __name__ == "__main__":  # pragma: no cover
    main()
