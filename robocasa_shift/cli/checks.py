"""The protocol's checks: ``validate-stages``, ``validate-pairing``, ``calibrate``, ``audit``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import click

from robocasa_shift.checks.audit import audit_run, audit_stem
from robocasa_shift.checks.calibration import calibrate as run_calibration
from robocasa_shift.core.factors import family_conditions
from robocasa_shift.checks.reproduction import diff_runs, run_digest
from robocasa_shift.checks.validation import validate_pairing, validate_stages
from robocasa_shift.cli.common import (
    ASSET_KIT_OPTION,
    BACKEND_OPTION,
    RUN_DIR_OPTION,
    TASK_OPTION,
    config_option,
    finish,
    handle_errors,
    policy_option,
    split_names,
    tasks_of,
)
from robocasa_shift.config import StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.rundir.files import atomic_write_text
from robocasa_shift.seeding import PHASES
from robocasa_shift.study.pipeline import formal_suite
from robocasa_shift.study.plan import parse_episodes


@click.command(name="validate-stages")
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--demos", "n_demos", default=5, show_default=True, help="Successful demonstrations per task.")
@click.option("--random-rollouts", "n_random", default=5, show_default=True,
              help="Negative-control rollouts per task (the backend's negative-control policy).")
@click.option("--demo-policy", default=None,
              help="Policy that records missing demonstrations [default: the backend's own, e.g. expert on robosuite, "
                   "fake-expert on fake].")
@ASSET_KIT_OPTION
@handle_errors
def validate_stages_command(task_opts: Tuple[str, ...], backend: str, run_dir: Path, n_demos: int,
                            n_random: int, demo_policy: Optional[str], asset_kit: Optional[str]) -> None:
    """Replay expert demonstrations through the StageTracker; exit 1 on any miss.

    Records the demonstrations (actions and bit-exact states) into RUN_DIR/demos/
    if absent, replays their states, and checks that every milestone is reached,
    in order, with no predicate error; negative controls: no milestone holds on
    the initial states, and random rollouts never reach the last milestone.
    Writes RUN_DIR/validation/stages.json and stages.md.
    """
    report = validate_stages(run_dir, tasks_of(backend, task_opts), backend, n_demos=n_demos, n_random=n_random,
                             demo_policy=demo_policy, asset_kit=asset_kit)
    finish(report, "stage validation", run_dir / "validation" / "stages.md")


@click.command(name="validate-pairing")
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@config_option(StudyConfig, "policy", show_default=True, help="Policy whose pairing is checked.")
@click.option("--steps", default=120, show_default=True, help="Control steps of each compared rollout.")
@ASSET_KIT_OPTION
@handle_errors
def validate_pairing_command(task_opts: Tuple[str, ...], backend: str, run_dir: Path, policy: str, steps: int,
                             asset_kit: Optional[str]) -> None:
    """Check pairing (paper Table II); exit 1 when it does not hold.

    Environment side: repeated resets of an episode give identical fingerprints.
    Policy side: two clean rollouts with uncontrolled policy randomness act
    differently (N/A for a deterministic policy); with the shared seed, identically.
    Writes RUN_DIR/validation/pairing.json and pairing.md.
    """
    report = validate_pairing(run_dir, tasks_of(backend, task_opts), policy=policy, backend=backend, steps=steps,
                              asset_kit=asset_kit)
    finish(report, "pairing validation", run_dir / "validation" / "pairing.md")


@click.command(name="calibrate")
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--episodes", default="0-2", show_default=True, help="Fixed base episodes (formal phase).")
@click.option("--image-size", type=click.IntRange(min=8), default=None,
              help="Square render size in pixels, the resolution the policy receives [default: the image size of "
                   "the policy RUN_DIR's manifest names, else 128].")
@click.option("--condition", "condition_opts", multiple=True, default=("all",), show_default=True,
              help="Conditions to render; comma list; 'all' is the matrix's 13, 'optional' every optional factor's "
                   "level and predeclared combination the backend can apply, a family's name (e.g. 'dynamics') its "
                   "factors' levels.")
@ASSET_KIT_OPTION
@handle_errors
def calibrate_command(task_opts: Tuple[str, ...], backend: str, run_dir: Path, episodes: str,
                      image_size: Optional[int], asset_kit: Optional[str], condition_opts: Tuple[str, ...]) -> None:
    """Model-free severity audit: 3 episodes x 13 conditions per task, no policy; exit 1 on a failed check.

    --task suite takes the tasks that screening retained in RUN_DIR. Every camera
    (third-person and wrist) is rendered at --image-size and measured per role.

    Writes RUN_DIR/calibration/ (records.csv, calibration.json, calibration.md and
    a contact sheet per task: rows = conditions, columns = episodes and cameras).
    """
    tasks = tasks_of(backend, task_opts)
    if "suite" in task_opts:  # the tasks screening retained in this run directory
        tasks = formal_suite(run_dir) or []
        if not tasks:
            raise click.UsageError(f"--task suite: no tasks in {run_dir}/suite.json; run `screen` first")
    protocol = specs.load_protocol()
    named = [item.strip() for value in condition_opts for item in value.split(",")]
    families = family_conditions(protocol)
    expanded = [",".join(protocol.optional_conditions) if item == "optional" else ",".join(families[item])
                if item in families else item for item in named]
    conditions = split_names(expanded, protocol.conditions)
    report = run_calibration(run_dir, tasks, backend, parse_episodes(episodes), image_size=image_size,
                             asset_kit=asset_kit, conditions=conditions)
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    finish(report, "calibration", run_dir / "calibration" / "calibration.md")


@click.command(name="audit")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--phase", type=click.Choice(PHASES), default="formal", show_default=True,
              help="The phase audited; rollouts of other phases in RUN_DIR are left out.")
@handle_errors
def audit_command(run_dir: Path, phase: str) -> None:
    """Integrity audit (paper Table VII) of one phase of a run directory; exit 0 only when it passes.

    Per task: expected and valid rollouts, distinct base episodes, and the counts
    that must be zero (missing or duplicated records, fingerprint and policy-seed
    mismatches, renderer errors, invalid perturbation records, runtime failures,
    StageTracker errors, unexpected truncations); each failing check names its
    rollouts. Writes RUN_DIR/audit.json and RUN_DIR/audit.md (another phase:
    RUN_DIR/audit-PHASE.json and .md, so the formal audit the report reads stays).

    \b
    Examples:
      robocasa-shift audit runs/study && robocasa-shift report runs/study
      robocasa-shift audit runs/study --phase screening
    """
    report = audit_run(run_dir, phase=phase)
    if report.get("banner"):
        click.echo(report["banner"])
    for task, t in report["tasks"].items():
        bad = {name: c["count"] for name, c in t["checks"].items() if c["count"]}
        click.echo(f"  {task:<18} expected {t['expected_rollouts']:>4}  valid {t['valid_rollouts']:>4}  "
                   f"{'ok' if t['passed'] else 'FAILED ' + json.dumps(bad)}")
    for problem in report["run_problems"]:
        click.echo(f"  run: {problem}")
    finish(report, audit_stem(phase), run_dir / f"{audit_stem(phase)}.md")


@click.command(name="diff-runs")
@click.argument("run_a", type=click.Path(exists=True, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, path_type=Path))
@click.option("--save", "save", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write RUN_A's digest (its records less timings) to this JSON file, to keep as a reference.")
@click.option("--ignore", "ignore", multiple=True, metavar="FIELD",
              help="A record field not to compare (repeatable), e.g. spec_hash against a reference recorded "
                   "before an optional factor was added to the protocol; the ignored fields are printed.")
@handle_errors
def diff_runs_command(run_a: Path, run_b: Path, save: Optional[Path], ignore: Tuple[str, ...]) -> None:
    """Check that two runs of the same keys hold the same records; exit 1 where they do not.

    \b
    Every field of every record is compared (outcome, subgoal steps, fingerprints, seeds,
    perturbation read-backs and measurements) except timings and the renderer's name.
    RUN_A and RUN_B are run directories or digests written by --save.
    Example: robocasa-shift diff-runs runs/before runs/after
    """
    result = diff_runs(run_a, run_b, ignore=ignore)
    if save:
        from robocasa_shift.rundir.files import atomic_write_text

        atomic_write_text(save, json.dumps(run_digest(run_a), indent=1, sort_keys=True) + "\n")
    click.echo(f"{result['identical']}/{result['shared']} shared records identical; only in A: "
               f"{len(result['only_a'])}, only in B: {len(result['only_b'])}"
               + (f" (not compared: {', '.join(result['ignored'])})" if ignore else ""))
    for key, diffs in list(result["differing"].items())[:20]:
        click.echo(f"  {key}: " + ", ".join(d["field"] for d in diffs))
    if not result["passed"]:
        sys.exit(1)


@click.command(name="check-backend")
@click.argument("backend")
@TASK_OPTION
@click.option("--episodes", default="0-1", show_default=True, help="Base episodes (validation phase) checked per task.")
@click.option("--image-size", type=click.IntRange(min=8), default=64, show_default=True, help="Square frame size checked.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the result as JSON here.")
@ASSET_KIT_OPTION
@handle_errors
def check_backend_command(backend: str, task_opts: Tuple[str, ...], episodes: str, image_size: int,
                          out: Optional[Path], asset_kit: Optional[str]) -> None:
    """Run the backend contract on BACKEND; exit 1 when it breaks it.

    What pairing rests on, checked on every task (or --task) and base episode: seeded resets give one
    fingerprint and physics state, in two environments too; reading, rendering and the success check and
    predicates change nothing; a step changes the fingerprint and set_state(get_state()) undoes it; every
    condition the environment can apply reads back what it asked for and leaves nothing behind for the next
    reset; every camera renders the same RGB frame twice. Run it on a new backend before its first study:

      robocasa-shift check-backend my_backend --task MyTask
    """
    from robocasa_shift.checks.backend_check import check_backend

    result = check_backend(backend, tasks_of(backend, task_opts), parse_episodes(episodes), image_size,
                           asset_kit=asset_kit)
    click.echo(result.markdown)
    if out is not None:
        atomic_write_text(out, json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    if not result.passed:
        sys.exit(1)


@click.command(name="check-policy")
@click.argument("policy")
@BACKEND_OPTION
@click.option("--task", default=None, help="The task it runs on [default: the backend's first].")
@policy_option()
@click.option("--boundaries", type=click.IntRange(min=2), default=4, show_default=True,
              help="Chunk boundaries of the base episode the checks run over.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the result as JSON here.")
@ASSET_KIT_OPTION
@handle_errors
def check_policy_command(policy: str, backend: str, task: Optional[str], policy_options: Dict[str, Any],
                         boundaries: int, out: Optional[Path], asset_kit: Optional[str]) -> None:
    """Run the policy checklist on POLICY; exit 1 when it breaks it.

    On a base episode of a backend whose embodiment it speaks: its declared cameras and image size, an unknown
    option refused, finite (k, action_dim) chunks, one seed giving one fingerprint and one action sequence (and a
    stochastic policy another for another seed), get_state/set_state continuing bit for bit through an .npz round
    trip (or "not offered" with the reason), sample_actions leaving its state as it was, act_batch agreeing with
    act. Run it on a new policy before its first study:

      robocasa-shift check-policy my_vla --backend robosuite --task Lift
    """
    from robocasa_shift.checks.policy_check import check_policy

    result = check_policy(policy, backend, task, policy_options, boundaries, asset_kit=asset_kit)
    click.echo(result.markdown)
    if out is not None:
        atomic_write_text(out, json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n")
    if not result.passed:
        sys.exit(1)
