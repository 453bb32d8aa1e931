"""Commands that run rollouts into a run directory: ``run``, ``screen``, ``formal``, ``merge``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Tuple

import click

from robocasa_shift.checks.screening import load_pool
from robocasa_shift.checks.screening import screen as run_screen
from robocasa_shift.cli.common import (
    FORCE_OPTION,
    RETRY_OPTION,
    RUN_DIR_OPTION,
    SHARD_OPTION,
    execution_options,
    handle_errors,
    report_run,
    split_names,
    study_options,
    tasks_of,
)
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.errors import CheckFailed
from robocasa_shift.seeding import PHASES
from robocasa_shift.study.pipeline import estimate, formal_suite
from robocasa_shift.study.pipeline import merge as merge_runs
from robocasa_shift.study.plan import MAX_KEYS, parse_episodes, plan_keys, shard_keys
from robocasa_shift.study.runner import run as run_study
from robocasa_shift.study.worker import StudyCache


DRY_RUN_OPTION = click.option("--dry-run", is_flag=True,
                              help="Print the rollout count and an ETA (measured rollouts or a short probe); run "
                                   "and write nothing.")


@click.command(name="run")
@click.option("--task", "task_opts", multiple=True, required=True, help="Task name(s); comma list or 'all'.")
@click.option("--condition", "condition_opts", multiple=True, default=("clean",), show_default=True,
              help="Condition(s) such as clean or camera:L2; comma list or 'all'.")
@click.option("--episodes", default="0-19", show_default=True, help="Base episodes, e.g. 0-19 or 0,3,5-7.")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory; rerunning skips keys already recorded.")
@click.option("--phase", type=click.Choice(PHASES), default="formal",
              show_default=True, help="Seed stream of the base episodes.")
@click.option("--replicates", default="0", show_default=True,
              help="Policy-seed replicates, e.g. 0-1 for a clean-vs-clean noise floor.")
@DRY_RUN_OPTION
@study_options(render_profile=True, log_steps=True)
@execution_options
@SHARD_OPTION
@RETRY_OPTION
@FORCE_OPTION
@handle_errors
def run_command(task_opts, condition_opts, episodes: str, run_dir: Path, phase: str, replicates: str, dry_run: bool,
                study: StudyConfig, execution: ExecutionConfig, shard: Optional[Tuple[int, int]],
                retry_errors: bool, force: bool) -> None:
    """Run rollouts of one or more tasks under one or more conditions.

    \b
    Example: 13 conditions x 5 base episodes of Lift with the scripted expert
      robocasa-shift run --task Lift --condition all --episodes 0-4 --policy expert --run-dir runs/lift
      (add --dry-run first for the count and an ETA)
    """
    protocol = specs.load_protocol(verify=True)
    limit = None if force else MAX_KEYS
    tasks, conditions = tasks_of(study.backend, task_opts), split_names(condition_opts, protocol.conditions)
    episode_list, replicate_list = parse_episodes(episodes, limit), parse_episodes(replicates, limit)
    if dry_run:
        keys = shard_keys(plan_keys(tasks, episode_list, conditions, phase, replicate_list, force=force), shard)
        print_dry_run(run_dir, keys, tasks, episode_list, conditions, study, execution)
        return
    result = run_study(run_dir, tasks, conditions, episode_list, study, execution, phase=phase,
                       replicates=replicate_list, retry_errors=retry_errors, shard=shard, force=force)
    report_run(result, run_dir)


@click.command(name="screen")
@RUN_DIR_OPTION
@click.option("--pool", "pool_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Candidate-pool file [default: pools/<backend>.yaml].")
@study_options(policy_help="Policy to screen.")
@execution_options
@SHARD_OPTION
@RETRY_OPTION
@click.option("--dry-run", is_flag=True, help="Print the rollout count and an ETA (measured rollouts or a short probe).")
@handle_errors
def screen_command(run_dir: Path, pool_path: Optional[Path], study: StudyConfig, execution: ExecutionConfig,
                   shard: Optional[Tuple[int, int]], retry_errors: bool, dry_run: bool) -> None:
    """Clean-competence screening (paper Table IV) from the frozen candidate pool.

    \b
    Each candidate: 10 clean rollouts from the screening seed stream; at most 3
    successes excludes it; otherwise 20; retained iff >= 12/20. The pool's N+M
    schedule activates the reserve candidates when too few qualify. Writes
    RUN_DIR/screening/ (table) and RUN_DIR/suite.json (the formal suite).
    """
    if shard:
        raise click.UsageError("screening decides as it goes: run it unsharded")
    if dry_run:
        pool = load_pool(study.backend, pool_path)
        workers = execution.resolved().workers
        first = plan_keys(pool.candidates[: pool.initial], range(pool.first_batch), ["clean"], phase="screening")
        every = plan_keys(pool.candidates, range(pool.extended), ["clean"], phase="screening")
        probed: dict = {}
        least, most = (estimate(run_dir, keys, workers, study, probed) for keys in (first, every))
        click.echo(f"screening {pool.initial} candidates (+{pool.reserve} in reserve): {least['pending']} rollouts to "
                   f"run at least (first batches), ETA {format_eta(least, workers)}; at most {most['pending']} (every "
                   f"candidate extended), ETA {format_eta(most, workers)}")
        echo_estimate(most)
        return
    result = run_screen(run_dir, study, execution, pool_path, retry_errors=retry_errors)
    for task, d in result["screening"].items():
        click.echo(f"  {task:<18} {d['successes']:>2}/{d['rollouts']:<2} {d['decision']}")
    if result["undecided"]:  # invalid rollouts: the decision is unknown, so nothing may proceed on it
        raise CheckFailed(f"screening: {result['note']}")
    click.echo(f"formal suite: {', '.join(result['suite']) or '(empty)'} -> {run_dir}/suite.json")
    if result["note"]:
        click.echo(f"note: {result['note']}")


@click.command(name="formal")
@click.option("--task", "task_opts", multiple=True, default=None,
              help="Tasks [default: the suite that screening wrote to RUN_DIR/suite.json].")
@click.option("--condition", "condition_opts", multiple=True, default=("all",), show_default=True,
              help="Conditions; comma list or 'all'.")
@click.option("--episodes", default="0-19", show_default=True, help="Formal base episodes.")
@RUN_DIR_OPTION
@click.option("--replicates", default="0", show_default=True,
              help="Policy-seed replicates; 0-1 adds a clean-vs-clean noise floor (use with --condition clean).")
@DRY_RUN_OPTION
@study_options(log_steps=True)
@execution_options
@SHARD_OPTION
@RETRY_OPTION
@FORCE_OPTION
@handle_errors
def formal_command(task_opts, condition_opts, episodes: str, run_dir: Path, replicates: str, dry_run: bool,
                   study: StudyConfig, execution: ExecutionConfig, shard: Optional[Tuple[int, int]],
                   retry_errors: bool, force: bool) -> None:
    """The formal matrix: suite x episodes x 13 conditions, every rollout at its official horizon."""
    protocol = specs.load_protocol(verify=True)
    limit = None if force else MAX_KEYS
    episode_list, replicate_list = parse_episodes(episodes, limit), parse_episodes(replicates, limit)
    tasks = tasks_of(study.backend, task_opts) if task_opts else formal_suite(run_dir)
    if not tasks:
        raise click.UsageError(f"no --task given and no {run_dir}/suite.json: run `screen` first or name the tasks")
    conditions = split_names(condition_opts, protocol.conditions)
    if dry_run:
        keys = shard_keys(plan_keys(tasks, episode_list, conditions, "formal", replicate_list, force=force), shard)
        print_dry_run(run_dir, keys, tasks, episode_list, conditions, study, execution)
        return
    result = run_study(run_dir, tasks, conditions, episode_list, study, execution, phase="formal",
                       replicates=replicate_list, retry_errors=retry_errors, shard=shard, force=force)
    report_run(result, run_dir)


def print_dry_run(run_dir: Path, keys, tasks, episodes, conditions, study: StudyConfig,
                  execution: ExecutionConfig) -> None:
    """What a dry run prints (``run`` and ``formal`` alike): the rollouts planned and pending, and the ETA of
    :func:`estimate`; names, extras and the policy's fit to the backend are checked first; nothing is written."""
    cache = StudyCache(study)
    try:
        cache.check_names(tasks, conditions)
    finally:
        cache.close()
    workers = execution.resolved().workers
    est = estimate(run_dir, keys, workers, study)
    click.echo(f"{est['planned']} rollouts planned ({len(tasks)} tasks x {len(episodes)} episodes x "
               f"{len(conditions)} conditions), {est['pending']} to run; ETA {format_eta(est, workers)}")
    echo_estimate(est)
    note = one_action_note(study, run_dir, keys)
    if note:
        click.echo(note)


def format_eta(est, workers: int) -> str:
    """The ETA of an :func:`estimate` with ``workers`` workers, in words."""
    if est["eta_s"] is None:
        return "unknown (no rollouts measured in this run directory yet)"
    return f"{est['eta_s'] / 60:.1f} min with {workers} worker(s)"


def echo_estimate(est) -> None:
    """Where an estimate's times come from, and how the ETA scales with workers and a Ray cluster."""
    for task, s in est["measured_s_per_rollout"].items():
        click.echo(f"  {task:<18} {s:.1f} s per rollout (measured)")
    for task, p in est["probed"].items():
        click.echo(f"  {task:<18} at most {p['rollout_s']:.1f} s per rollout (probed here: build {p['make_s']:.1f} s, "
                   f"reset {p['reset_s']:.2f} s, step {1000 * p['step_s']:.1f} ms, two frames "
                   f"{1000 * p['frames_s']:.1f} ms, horizon {p['horizon']}; policy time not included)")
    if est["serial_s"] is not None and est["pending"]:
        scaled = ", ".join(f"{n}: {s / 60:.1f} min" for n, s in est["scaling"].items())
        click.echo(f"  by workers ({scaled}): rollouts spread over the workers, each building its environment "
                   f"first; on a Ray cluster (--executor ray) count its CPUs as workers, one per core as locally "
                   f"(the machine's other load slows each)")


def one_action_note(study: StudyConfig, run_dir: Path, keys) -> Optional[str]:
    """For a policy that answers one action per observation (``actions_per_observation = 1``, e.g. ``vla-eval``):
    what that costs, beside the ETA (None for a policy that returns chunks)."""
    from robocasa_shift.backends import get_backend
    from robocasa_shift.policies import POLICIES
    from robocasa_shift.rundir.store import RunStore
    from robocasa_shift.study.plan import pending_keys

    if getattr(POLICIES.get(study.policy), "actions_per_observation", None) != 1:
        return None
    backend = get_backend(study.backend)
    steps = sum(backend.task(k.task).horizon for k in pending_keys(RunStore(run_dir), keys))
    return (f"  note: policy {study.policy} answers one action per observation, so every control step renders the "
            f"cameras it reads and waits for one server round trip: up to {steps:,} renders per camera and "
            f"{steps:,} round trips for the rollouts to run (a chunking policy renders once per chunk); the ETA "
            f"above holds only if it was measured with this policy and server")


@click.command(name="merge")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@handle_errors
def merge_command(out: Path, sources: Tuple[Path, ...]) -> None:
    """Combine shard run directories (--shard i/n) into OUT; refuses mismatched manifests and duplicate keys.

    \b
    Example: a study split over two machines, then merged and audited
      robocasa-shift formal --shard 0/2 --run-dir runs/part0 ...   # machine 1
      robocasa-shift formal --shard 1/2 --run-dir runs/part1 ...   # machine 2
      robocasa-shift merge runs/study runs/part0 runs/part1 && robocasa-shift audit runs/study
    """
    result = merge_runs(out, sources)
    click.echo(f"{result['records']} records from {result['sources']} run directories -> {out}")
    for file, problem in result["unreadable"]:
        click.echo(f"  skipped unreadable record {file}: {problem}", err=True)
