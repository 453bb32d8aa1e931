"""The ``robocasa-shift`` command line (also ``python -m robocasa_shift``).

Every command is a thin call into the Python API. Exit status 2 means bad
input (an unknown name, a malformed or tampered spec, a bad range); the
message lists the valid names or names the file and field.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import List

import click

from robocasa_shift import specs
from robocasa_shift.errors import Error

DEFAULT_POLICY = "reference"


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def handle_errors(fn):
    """Turn the harness's errors (one tree, ``robocasa_shift.errors``) into messages and exit statuses."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Error as exc:
            _fail(str(exc), exc.exit_code)

    return wrapper


def _split(values: tuple, universe: List[str]) -> List[str]:
    """Repeated or comma-separated option values; 'all' means every valid name."""
    out: List[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if item == "all":
                out.extend(universe)
            elif item:
                out.append(item)
    return list(dict.fromkeys(out))


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


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handle_errors
def conditions(as_json):
    """List the 13 conditions with their frozen parameters and spec hash."""
    from robocasa_shift.engine.perturbations import describe_conditions

    protocol = specs.load_protocol(verify=True)
    rows = describe_conditions(protocol)
    if as_json:
        click.echo(
            json.dumps(
                {"spec_hash": protocol.spec_hash, "study_seed": protocol.study_seed, "conditions": rows}, indent=2
            )
        )
        return
    click.echo(f"spec hash {protocol.spec_hash}   study seed {protocol.study_seed}")
    for row in rows:
        params = ", ".join(f"{k}={v:g}" for k, v in row["params"].items())
        extra = f"  draw: {row['draw']}" if row.get("draw", "none") != "none" else ""
        click.echo(f"  {row['condition']:<18} {params}{extra}")


@main.command()
@click.option("--backend", default="robosuite", show_default=True, help="Simulator backend.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@handle_errors
def tasks(backend, as_json):
    """List a backend's tasks with their official horizon and ordered subgoals."""
    from robocasa_shift.backends import get_backend

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
                "subgoals": [{"id": g.id, "description": g.description} for g in spec.subgoals],
                "stage_spec_sha256": spec.content_hash,
            }
        )
    if as_json:
        click.echo(json.dumps({"backend": backend, "tasks": rows}, indent=2))
        return
    for row in rows:
        click.echo(f"{row['task']}  (horizon {row['horizon']}): {row['instruction']}")
        for i, goal in enumerate(row["subgoals"], 1):
            click.echo(f"  g{i} {goal['id']}: {goal['description']}")


def _tasks_of(backend: str, task_opts) -> List[str]:
    from robocasa_shift.backends import get_backend

    return _split(task_opts, get_backend(backend).task_names())


def _finish(report: dict, what: str, path: Path) -> None:
    click.echo(f"{what}: {'PASSED' if report['passed'] else 'FAILED'} -> {path}")
    if not report["passed"]:
        sys.exit(1)


TASK_OPTION = click.option("--task", "task_opts", multiple=True, default=("all",), show_default=True,
                           help="Task name(s); comma list or 'all'.")
BACKEND_OPTION = click.option("--backend", default="robosuite", show_default=True, help="Simulator backend.")
RUN_DIR_OPTION = click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
                              help="Run directory the outputs go into.")


@main.command(name="validate-stages")
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--demos", "n_demos", default=5, show_default=True, help="Successful demonstrations per task.")
@click.option("--random-rollouts", "n_random", default=5, show_default=True,
              help="Negative-control rollouts of the random policy per task.")
@handle_errors
def validate_stages_cmd(task_opts, backend, run_dir, n_demos, n_random):
    """Replay expert demonstrations through the StageTracker; exit 1 on any miss.

    Records the demonstrations (actions and bit-exact states) into RUN_DIR/demos/
    if absent, replays their states, and checks that every milestone is reached,
    in order, with no predicate error; negative controls: no milestone holds on
    the initial states, and random rollouts never reach the last milestone.
    Writes RUN_DIR/validation/stages.json and stages.md.
    """
    from robocasa_shift.checks.validation import validate_stages

    report = validate_stages(run_dir, _tasks_of(backend, task_opts), backend, n_demos=n_demos, n_random=n_random)
    _finish(report, "stage validation", run_dir / "validation" / "stages.md")


@main.command(name="validate-pairing")
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--policy", default="reference", show_default=True, help="Policy whose pairing is checked.")
@click.option("--steps", default=120, show_default=True, help="Control steps of each compared rollout.")
@handle_errors
def validate_pairing_cmd(task_opts, backend, run_dir, policy, steps):
    """Check pairing (paper Table II); exit 1 when it does not hold.

    Environment side: repeated resets of an episode give identical fingerprints.
    Policy side: two clean rollouts with uncontrolled policy randomness act
    differently (N/A for a deterministic policy); with the shared seed, identically.
    Writes RUN_DIR/validation/pairing.json and pairing.md.
    """
    from robocasa_shift.checks.validation import validate_pairing

    report = validate_pairing(run_dir, _tasks_of(backend, task_opts), policy=policy, backend=backend, steps=steps)
    _finish(report, "pairing validation", run_dir / "validation" / "pairing.md")


@main.command()
@TASK_OPTION
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--episodes", default="0-2", show_default=True, help="Fixed base episodes (formal phase).")
@handle_errors
def calibrate(task_opts, backend, run_dir, episodes):
    """Model-free severity audit: 3 episodes x 13 conditions per task, no policy; exit 1 on a failed check.

    --task suite takes the tasks that screening retained in RUN_DIR.

    Writes RUN_DIR/calibration/ (records.csv, calibration.json, calibration.md and
    a contact sheet per task: rows = conditions, columns = episodes and cameras).
    """
    from robocasa_shift.checks.calibration import calibrate as run_calibration
    from robocasa_shift.study.runner import parse_episodes

    tasks = _tasks_of(backend, task_opts)
    if "suite" in task_opts:  # the tasks screening retained in this run directory
        from robocasa_shift.study.pipeline import formal_suite

        tasks = formal_suite(run_dir) or []
        if not tasks:
            raise click.UsageError(f"--task suite: no tasks in {run_dir}/suite.json; run `screen` first")
    report = run_calibration(run_dir, tasks, backend, parse_episodes(episodes))
    for warning in report["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    _finish(report, "calibration", run_dir / "calibration" / "calibration.md")


def execution_options(fn):
    """--executor, --workers, --address, --threads, --batch, --shard, --retry-errors, --progress."""
    for option in reversed([
        click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
                     help="local: a process pool on this machine; ray: an existing Ray cluster."),
        click.option("--workers", type=int, default=None, help="Parallel workers [default: one per core]."),
        click.option("--address", default=None, help="Ray cluster address (ray executor); none starts a local Ray."),
        click.option("--threads", type=int, default=None,
                     help="Renderer and torch threads per worker [default: cores / workers]."),
        click.option("--batch", type=int, default=1, show_default=True,
                     help="Conditions of one base episode a worker steps in lockstep, with one batched policy "
                          "call per decision point. Records are unchanged for policies whose outputs do not "
                          "depend on the batch (reference); the batch size is recorded in commands.jsonl."),
        click.option("--shard", default=None, help="Run only slice i of n (e.g. 0/4) into this run dir; see merge."),
        click.option("--retry-errors", is_flag=True, help="Re-run invalid records; the old ones go to history/."),
        click.option("--progress/--no-progress", default=True, help="Show a progress bar with ETA."),
    ]):
        fn = option(fn)
    return fn


POLICY_OPTION = click.option(
    "--policy-option", "policy_option_opts", multiple=True, metavar="KEY=VALUE",
    help="Option for the policy's constructor, repeatable; values are YAML "
         "(e.g. --policy-option checkpoint=ckpt/ --policy-option port=8000). Recorded in the manifest.")


def _policy_options(opts) -> dict:
    import yaml

    options = {}
    for text in opts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint="--policy-option")
        options[key.strip()] = yaml.safe_load(value)
    return options


def _execution(executor, workers, address, threads, batch):
    from robocasa_shift.study.runner import Execution

    if batch < 1:
        raise click.BadParameter(f"must be at least 1, got {batch}", param_hint="--batch")
    return Execution(executor=executor, workers=workers, address=address, threads=threads, batch=batch)


@main.command()
@click.option("--task", "task_opts", multiple=True, required=True, help="Task name(s); comma list or 'all'.")
@click.option("--condition", "condition_opts", multiple=True, default=("clean",), show_default=True,
              help="Condition(s) such as clean or camera:L2; comma list or 'all'.")
@click.option("--episodes", default="0-19", show_default=True, help="Base episodes, e.g. 0-19 or 0,3,5-7.")
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, help="Registered policy name.")
@click.option("--backend", default="robosuite", show_default=True, help="Simulator backend.")
@click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory; rerunning skips keys already recorded.")
@click.option("--phase", type=click.Choice(["formal", "screening", "validation"]), default="formal",
              show_default=True, help="Seed stream of the base episodes.")
@click.option("--replicates", default="0", show_default=True,
              help="Policy-seed replicates, e.g. 0-1 for a clean-vs-clean noise floor.")
@click.option("--render-profile", type=click.Choice(["fast", "default"]), default="fast", show_default=True,
              help="fast: no shadows, reflections or multisampling.")
@POLICY_OPTION
@execution_options
@handle_errors
def run(task_opts, condition_opts, episodes, policy, backend, run_dir, phase, replicates, render_profile,
        policy_option_opts, executor, workers, address, threads, batch, shard, retry_errors, progress):
    """Run rollouts of one or more tasks under one or more conditions.

    \b
    Example: 13 conditions x 5 base episodes of Lift with the scripted expert
      robocasa-shift run --task Lift --condition all --episodes 0-4 --policy expert --run-dir runs/lift
    """
    from robocasa_shift.study.runner import parse_episodes, parse_shard
    from robocasa_shift.study.runner import run as run_study

    protocol = specs.load_protocol(verify=True)
    result = run_study(
        run_dir,
        _tasks_of(backend, task_opts),
        _split(condition_opts, protocol.conditions),
        parse_episodes(episodes),
        policy=policy,
        backend=backend,
        phase=phase,
        replicates=parse_episodes(replicates),
        retry_errors=retry_errors,
        render_profile=render_profile,
        progress=progress,
        execution=_execution(executor, workers, address, threads, batch),
        shard=parse_shard(shard),
        policy_options=_policy_options(policy_option_opts),
    )
    _report_run(result, run_dir)


@main.command()
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, help="Policy to screen.")
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--pool", "pool_path", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Candidate-pool file [default: pools/<backend>.yaml].")
@POLICY_OPTION
@execution_options
@handle_errors
def screen(policy, backend, run_dir, pool_path, policy_option_opts, executor, workers, address, threads, batch, shard, retry_errors, progress):
    """Clean-competence screening (paper Table IV) from the frozen candidate pool.

    \b
    Each candidate: 10 clean rollouts from the screening seed stream; at most 3
    successes excludes it; otherwise 20; retained iff >= 12/20. The pool's N+M
    schedule activates the reserve candidates when too few qualify. Writes
    RUN_DIR/screening/ (table) and RUN_DIR/suite.json (the formal suite).
    """
    from robocasa_shift.study.pipeline import screen as run_screen

    if shard:
        raise click.UsageError("screening decides as it goes: run it unsharded")
    result = run_screen(run_dir, policy, backend, _execution(executor, workers, address, threads, batch), progress, pool_path,
                        _policy_options(policy_option_opts))
    for task, d in result["screening"].items():
        click.echo(f"  {task:<18} {d['successes']:>2}/{d['rollouts']:<2} {d['decision']}")
    click.echo(f"formal suite: {', '.join(result['suite']) or '(empty)'} -> {run_dir}/suite.json")
    if result["note"]:
        click.echo(f"note: {result['note']}")


@main.command()
@click.option("--task", "task_opts", multiple=True, default=None,
              help="Tasks [default: the suite that screening wrote to RUN_DIR/suite.json].")
@click.option("--condition", "condition_opts", multiple=True, default=("all",), show_default=True,
              help="Conditions; comma list or 'all'.")
@click.option("--episodes", default="0-19", show_default=True, help="Formal base episodes.")
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, help="Registered policy name.")
@BACKEND_OPTION
@RUN_DIR_OPTION
@click.option("--replicates", default="0", show_default=True,
              help="Policy-seed replicates; 0-1 adds a clean-vs-clean noise floor (use with --condition clean).")
@click.option("--dry-run", is_flag=True, help="Print the rollout count and an ETA from measured rollout times.")
@POLICY_OPTION
@execution_options
@handle_errors
def formal(task_opts, condition_opts, episodes, policy, backend, run_dir, replicates, dry_run, policy_option_opts,
           executor, workers, address, threads, batch, shard, retry_errors, progress):
    """The formal matrix: suite x episodes x 13 conditions, every rollout at its official horizon."""
    from robocasa_shift.study.pipeline import estimate, formal_suite
    from robocasa_shift.study.runner import Execution, parse_episodes, parse_shard, plan_keys, shard_keys
    from robocasa_shift.study.runner import run as run_study

    protocol = specs.load_protocol(verify=True)
    tasks = _tasks_of(backend, task_opts) if task_opts else formal_suite(run_dir)
    if not tasks:
        raise click.UsageError(f"no --task given and no {run_dir}/suite.json: run `screen` first or name the tasks")
    conditions = _split(condition_opts, protocol.conditions)
    if dry_run:
        keys = shard_keys(plan_keys(tasks, parse_episodes(episodes), conditions, "formal", parse_episodes(replicates)),
                          parse_shard(shard))
        ex = Execution(executor, workers, address, threads, batch).resolved()
        est = estimate(run_dir, keys, ex.workers)
        eta = "unknown (no rollouts measured in this run directory yet)" if est["eta_s"] is None else \
            f"{est['eta_s'] / 60:.1f} min with {ex.workers} worker(s)"
        click.echo(f"{est['planned']} rollouts planned ({len(tasks)} tasks x {len(parse_episodes(episodes))} episodes x "
                   f"{len(conditions)} conditions), {est['pending']} to run; ETA {eta}")
        for task, s in est["measured_s_per_rollout"].items():
            click.echo(f"  {task:<18} {s:.1f} s per rollout (measured)")
        return
    result = run_study(run_dir, tasks, conditions, parse_episodes(episodes), policy=policy, backend=backend,
                       phase="formal", replicates=parse_episodes(replicates), retry_errors=retry_errors,
                       progress=progress, execution=_execution(executor, workers, address, threads, batch),
                       shard=parse_shard(shard), policy_options=_policy_options(policy_option_opts))
    _report_run(result, run_dir)


@main.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@handle_errors
def merge(out, sources):
    """Combine shard run directories (--shard i/n) into OUT; refuses mismatched manifests and duplicate keys."""
    from robocasa_shift.study.pipeline import merge as merge_runs

    result = merge_runs(out, sources)
    click.echo(f"{result['records']} records from {result['sources']} run directories -> {out}")


def _report_run(result: dict, run_dir: Path) -> None:
    click.echo(
        f"{result['ran']} rollouts run, {result['skipped']} already recorded; "
        f"{result['failures']} failed, {result['invalid']} invalid -> {run_dir}"
    )


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="CSV file to write.")
@handle_errors
def export(run_dir, out):
    """Write a run's records as the records table (CSV, one row per rollout)."""
    from robocasa_shift.analysis.export import export_records

    n = export_records(run_dir, out)
    click.echo(f"{n} records -> {out}")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@handle_errors
def audit(run_dir):
    """Integrity audit (paper Table VII) of a run directory; exit 0 only when it passes.

    Per task: expected and valid rollouts, distinct base episodes, and the counts
    that must be zero (missing or duplicated records, fingerprint and policy-seed
    mismatches, renderer errors, invalid perturbation records, runtime failures,
    StageTracker errors, unexpected truncations); each failing check names its
    rollouts. Writes RUN_DIR/audit.json and RUN_DIR/audit.md.
    """
    from robocasa_shift.checks.audit import audit_run

    report = audit_run(run_dir)
    for task, t in report["tasks"].items():
        bad = {name: c["count"] for name, c in t["checks"].items() if c["count"]}
        click.echo(f"  {task:<18} expected {t['expected_rollouts']:>4}  valid {t['valid_rollouts']:>4}  "
                   f"{'ok' if t['passed'] else 'FAILED ' + json.dumps(bad)}")
    _finish(report, "audit", run_dir / "audit.md")


@main.command()
@click.argument("records", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for summary.json and the CSV tables.")
@click.option("--phase", default="formal", show_default=True, help="Rows of this phase are analysed.")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@click.option("--n-boot", default=10000, show_default=True, help="Bootstrap resamples.")
@handle_errors
def analyze(records, out_dir, phase, bootstrap_seed, n_boot):
    """Every measure of the protocol from a records table (this harness's or anyone's).

    \b
    Writes OUT/summary.json (SR, paired dSR with bootstrap CIs, transitions,
    S->F stage depth, McNemar with Holm, Wilson intervals, noise floor) and
    tidy CSV tables: sr.csv, dsr.csv, transitions.csv, stages.csv,
    first_incomplete.csv. Required columns: task, episode, condition, success,
    n_stages, stages_completed, first_incomplete; optional: valid, phase,
    replicate, spec_hash, stage_error.
    """
    from robocasa_shift.analysis.measures import load_records, write_analysis

    summary = write_analysis(load_records(records), out_dir, phase=phase, n_boot=n_boot, bootstrap_seed=bootstrap_seed)
    click.echo(f"{len(summary['tasks'])} tasks, {len(summary['conditions'])} conditions -> {out_dir}/summary.json")
    for cond, values in summary["conditions"].items():
        if cond == "clean":
            click.echo(f"  {cond:<18} SR {_fmt(values['macro_sr'])}")
        else:
            ci = values["dsr_ci95"]
            ci_text = f"[{_fmt(ci[0])}, {_fmt(ci[1])}]" if ci else "[-]"
            click.echo(f"  {cond:<18} SR {_fmt(values['macro_sr'])}  dSR {_fmt(values['macro_dsr'])} {ci_text}  "
                       f"S->F {values['transitions']['SF']}  F->S {values['transitions']['FS']}")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:+.3f}" if value < 0 else f"{value:.3f}"


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--videos", "videos_per_kind", default=2, show_default=True,
              help="Matched pairs to film per kind (S->F and F->S).")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@handle_errors
def report(run_dir, videos_per_kind, bootstrap_seed):
    """RUN_DIR/report/index.html: tables, figures and side-by-side videos of matched pairs.

    Also refreshes RUN_DIR/analysis/ (summary.json, CSV tables) and the audit.
    Videos re-run the selected pairs with frame capture; the page says whether
    each re-run reproduced the recorded outcome and subgoal steps exactly.
    """
    from robocasa_shift.analysis.report import build_report

    page = build_report(run_dir, videos_per_kind=videos_per_kind, bootstrap_seed=bootstrap_seed)
    click.echo(f"report -> {page}")


@main.command()
@click.argument("run_a", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("run_b", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for compare.json/.md [default: RUN_A/compare-<name of RUN_B>].")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@handle_errors
def compare(run_a, run_b, out_dir, bootstrap_seed):
    """Two policies (or versions) on the same frozen suite, pair by pair (A - B).

    Refused when the runs' spec hashes or study seeds differ. Per condition:
    paired success and stage-depth differences with bootstrap CIs, and McNemar
    on the discordant pairs (Holm-adjusted).
    """
    from robocasa_shift.analysis.compare import write_comparison

    out_dir = out_dir or run_a / f"compare-{run_b.name}"
    result = write_comparison(run_a, run_b, out_dir, bootstrap_seed=bootstrap_seed)
    for cond, v in result["conditions"].items():
        click.echo(f"  {cond:<18} success {v['macro_success_diff']:+.3f}  depth {v['macro_depth_diff']:+.3f}  "
                   f"p(Holm) {v['mcnemar_p_holm']:.3g}")
    click.echo(f"-> {out_dir}/compare.md")


@main.command()
@handle_errors
def freeze():
    """Freeze new versions of the perturbation specs (record their content hashes in spec.lock).

    A frozen version is never rewritten: to change a number, bump the file's
    version first.
    """
    done = specs.freeze()
    click.echo("\n".join(done) if done else "every spec version is already frozen")


@main.command(name="train-reference")
@click.option("--task", "task_opts", multiple=True, default=("all",), show_default=True,
              help="Tasks to train (comma list or 'all').")
@click.option("--data-dir", default="build/reference-data", show_default=True, type=click.Path(path_type=Path),
              help="Where the rendered training sets go (reused if present).")
@click.option("--out", "out_dir", default=None, type=click.Path(path_type=Path),
              help="Weights folder [default: the package's own].")
@click.option("--workers", default=2, show_default=True, help="Processes for data generation and training.")
@click.option("--epochs", default=None, type=int, help="Override the frozen epoch count (for quick checks).")
@click.option("--frames", default=None, type=int, help="Override the frames per task (for quick checks).")
@handle_errors
def train_reference(task_opts, data_dir, out_dir, workers, epochs, frames):
    """Regenerate the reference policy's weights from fixed seeds (data, training, manifest).

    Deterministic: the same code on the same kind of machine gives bit-identical weights.
    """
    from dataclasses import replace

    from robocasa_shift.policies.reference.data import PERCEPTION
    from robocasa_shift.policies.reference.train import WEIGHTS_DIR, TrainConfig
    from robocasa_shift.policies.reference.train import train_reference as train

    config = TrainConfig() if epochs is None else replace(TrainConfig(), epochs=epochs)
    manifest = train(_split(task_opts, list(PERCEPTION)), data_dir, out_dir or WEIGHTS_DIR, workers, config, frames)
    for key, net in manifest["nets"].items():
        click.echo(f"{key:<20} val error {net['val_mean_error_mm']} mm (predict-the-mean {net['predict_mean_error_mm']} mm)")
    click.echo(f"weights sha256 {manifest['weights_sha256']}")


@main.command()
@click.option("--repeats", default=5, show_default=True, help="Interleaved repeats; each figure is median [min, max].")
@click.option("--steps", default=200, show_default=True, help="Control steps of the in-process rollouts.")
@click.option("--rollouts", default=8, show_default=True, help="Formal rollouts per pool and repeat (scaling).")
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, help="Policy of the formal-run pools.")
@click.option("--out", default="build/bench.json", show_default=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where the JSON result goes.")
@click.option("--progress/--no-progress", default=True, help="Show a progress bar with ETA.")
@handle_errors
def bench(repeats, steps, rollouts, policy, out, progress):
    """Benchmark the harness against the simulator's own limit (all figures side by side, one run).

    \b
    physics_sps        bare robosuite control steps per second, no rendering (one core)
    render_ms          one 128x128 camera frame
    reset_ms           between-rollout reset: restore nominal, seeded reset, fingerprint
    overhead_ratio     harness time per step / bare robosuite loop, same actions and cadence (goal <= 1.05)
    cadence_speedup_k  observing every k steps vs every step (k = 4, 8)
    batch_speedup      reference policy: one batched call for 13 conditions vs 13 calls
    throughput_WxT     formal rollouts per second with W workers of T threads
    scaling_2_workers  throughput 2x1 / 1x1 (goal >= 1.8)
    wall_vs_parts      formal wall time per rollout / its physics + render + policy time (goal <= 1.2)
    rss_mb             peak resident memory per worker
    """
    import json

    from robocasa_shift.bench import run_bench, table

    result = run_bench(repeats=repeats, steps=steps, rollouts=rollouts, policy=policy, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    click.echo(json.dumps(result["figures"]))
    click.echo(table(result))
    click.echo(f"wrote {out}")


@main.command(name="policies")
def list_policies():
    """List registered policies."""
    from robocasa_shift.policies import POLICIES

    click.echo("\n".join(POLICIES.names()))


if __name__ == "__main__":  # pragma: no cover
    main()
