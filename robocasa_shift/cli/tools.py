"""Maintenance commands: ``freeze`` (spec versions), ``train-reference`` (weights), ``bench`` (performance)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional, Tuple

import click

from robocasa_shift import specs
from robocasa_shift.bench import run_bench, table
from robocasa_shift.cli.common import checked, config_option, handle_errors, split_names
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.policies.reference.data import PERCEPTION
from robocasa_shift.policies.reference.train import TrainConfig
from robocasa_shift.policies.reference.train import train_reference as train
from robocasa_shift.policies.reference.weights import WEIGHTS_DIR


@click.command(name="freeze")
@handle_errors
def freeze_command() -> None:
    """Freeze new versions of the perturbation and intervention specs (record their content hashes in
    each folder's spec.lock).

    A frozen version is never rewritten: to change a number, bump the file's
    version first.
    """
    done = specs.freeze() + specs.freeze_interventions()
    click.echo("\n".join(done) if done else "every spec version is already frozen")


@click.command(name="train-reference")
@click.option("--task", "task_opts", multiple=True, default=("all",), show_default=True,
              help="Tasks to train (comma list or 'all').")
@click.option("--data-dir", default="build/reference-data", show_default=True, type=click.Path(path_type=Path),
              help="Where the rendered training sets go (reused if present).")
@click.option("--out", "out_dir", default=None, type=click.Path(path_type=Path),
              help="Weights folder [default: the package's own].")
@click.option("--workers", default=2, show_default=True, callback=checked(ExecutionConfig, "workers"),
              help="Processes for data generation and training.")
@click.option("--epochs", default=None, type=int, help="Override the frozen epoch count (for quick checks).")
@click.option("--frames", default=None, type=int, help="Override the frames per task (for quick checks).")
@handle_errors
def train_reference_command(task_opts: Tuple[str, ...], data_dir: Path, out_dir: Optional[Path], workers: int,
                            epochs: Optional[int], frames: Optional[int]) -> None:
    """Regenerate the reference policy's weights from fixed seeds (data, training, manifest).

    Deterministic: the same code on the same kind of machine gives bit-identical weights.
    """
    config = TrainConfig() if epochs is None else replace(TrainConfig(), epochs=epochs)
    manifest = train(split_names(task_opts, list(PERCEPTION)), data_dir, out_dir or WEIGHTS_DIR, workers, config,
                     frames)
    for key, net in manifest["nets"].items():
        click.echo(f"{key:<20} val error {net['val_mean_error_mm']} mm (predict-the-mean {net['predict_mean_error_mm']} mm)")
    click.echo(f"weights sha256 {manifest['weights_sha256']}")


@click.command(name="bench")
@click.option("--repeats", default=5, show_default=True, help="Interleaved repeats; each figure is median [min, max].")
@click.option("--steps", default=200, show_default=True, help="Control steps of the in-process rollouts.")
@click.option("--rollouts", default=8, show_default=True, help="Formal rollouts per pool and repeat (scaling).")
@config_option(StudyConfig, "policy", show_default=True, help="Policy of the formal-run pools.")
@click.option("--out", default="build/bench.json", show_default=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Where the JSON result goes.")
@config_option(ExecutionConfig, "progress", "--progress/--no-progress")
@handle_errors
def bench_command(repeats: int, steps: int, rollouts: int, policy: str, out: Path, progress: bool) -> None:
    """Benchmark the harness against the simulator's own limit (all figures side by side, one run).

    \b
    physics_sps          bare robosuite control steps per second, no rendering (one core)
    render_ms_CAMERA     one 128x128 frame, geoms out of view or hidden left out (render_full_ms_: the full
                         scene; render_ms_empty: a frame without geoms, i.e. clearing and reading back)
    reset_ms             between-rollout reset: restore nominal, seeded reset, fingerprint
    overhead_ratio       harness time per step / bare robosuite loop, same actions and cadence (goal <= 1.05)
    fastpath_speedup     stock robosuite and MuJoCo / the harness, same rollout (fused_step_: no cameras)
    physics_limit_ratio  harness time per step, no cameras / bare mj_step on the same trajectory (goal <= 4)
    bare_mj_step_ms      that bare mj_step's time per control step (25 substeps)
    render_limit_ratio   harness time per step, 2 cameras / bare mj_step + MuJoCo's renders of the same frames
    profile_ms_PART      one rollout's time per step: physics, controller, observables, render, policy, rest
    cadence_speedup_k    observing every k steps vs every step (k = 4, 8)
    batch_speedup        reference policy: one batched call for 13 conditions vs 13 calls
    throughput_WxT       formal rollouts per second with W workers of T threads
    scaling_2_workers    throughput 2x1 / 1x1 (goal >= 1.8)
    wall_vs_parts        formal wall time per rollout / its physics + render + policy time (goal <= 1.2)
    rss_mb               peak resident memory per worker
    """
    result = run_bench(repeats=repeats, steps=steps, rollouts=rollouts, policy=policy, progress=progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    click.echo(json.dumps(result["figures"]))
    click.echo(table(result))
    click.echo(f"wrote {out}")


@click.command(name="libero-stage-specs")
@click.option("--task", "task_opts", multiple=True, default=("all",), show_default=True,
              help="LIBERO task(s), e.g. spatial-0 or long-3 (comma list); 'all': Spatial, Object, Goal and 10.")
@click.option("--out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Folder [default: stage_specs/libero].")
@handle_errors
def libero_stage_specs_command(task_opts, out: Optional[Path]) -> None:
    """Generate LIBERO stage specs from the tasks' BDDL goals (in .venv-libero).

    Each goal conjunct becomes an unordered group: a grasp (or touch) of the object it
    moves, then the conjunct by LIBERO's own predicate. A spec already there with
    other content is refused, never overwritten.
    """
    from robocasa_shift.backends.libero_stages import generate
    from robocasa_shift.backends.libero_tasks import task_names
    from robocasa_shift.specs import STAGE_SPECS_DIR

    names = [n.strip() for v in task_opts for n in v.split(",") if n.strip()]
    tasks = list(task_names()) if names in ([], ["all"]) else names
    for task, what in generate(tasks, out or STAGE_SPECS_DIR / "libero").items():
        click.echo(f"  {task:<12} {what}")


COMMANDS = [freeze_command, train_reference_command, bench_command, libero_stage_specs_command]
