"""Success judges under shift: ``export-judge``, ``judge``, ``score-judge``, ``train-judge``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import click

from robocasa_shift.cli.common import (
    REPLAY_POLICY_OPTIONS,
    execution_options,
    handle_errors,
    key_value_options,
    require_sim_and_torch,
)
from robocasa_shift.config import ExecutionConfig


@click.command(name="export-judge")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Export directory (rerunning resumes it).")
@click.option("--cameras", type=click.Choice(["third", "wrist", "both"]), default="both", show_default=True,
              help="Cameras of each sample: the third-person view(s), the wrist view, or both.")
@click.option("--frames", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Clip frames at evenly spaced steps over the attempt, before the end frame (a fixed count, "
                   "so a clip's length does not give its outcome away).")
@click.option("--size", default=224, show_default=True, type=click.IntRange(16, 1024), help="Image size (pixels).")
@click.option("--max-per-cell", default=None, type=click.IntRange(min=1),
              help="At most this many samples per (task, condition), the same base episodes in every cell.")
@click.option("--seed", default=0, show_default=True, help="Which episodes a --max-per-cell sample takes.")
@click.option("--video", is_flag=True, help="Also write each camera's clip as an MP4 (input mode 'video').")
@click.option("--per-failure-type", default=None, type=click.IntRange(min=1),
              help="At most this many failures of each type (no_subgoal, mid_task, near_success) per task, in the "
                   "--seed order; successes all kept (balanced sampling per failure type).")
@REPLAY_POLICY_OPTIONS
@click.option("--retry-errors", is_flag=True, help="Also redo samples left out because their replay differed.")
@execution_options
@handle_errors
def export_judge_command(run_dir: Path, out: Path, cameras: str, frames: int, size: int, max_per_cell: Optional[int],
                         seed: int, video: bool, per_failure_type: Optional[int], policy_options, trust_run_dir: bool, retry_errors: bool,
                         execution: ExecutionConfig) -> None:
    """A labelled success-judge benchmark from RUN_DIR: one sample per rollout.

    \b
    Each sample: the instruction, a clip per camera (--frames frames over the
    attempt plus the end frame; start and end frames named separately), the
    official label, stage depth (subgoals latched, first incomplete, stratum:
    success / no_subgoal / mid_task / near_success), condition, task, pair id
    and episode key, in OUT/manifest.jsonl with PNG files under OUT/media/,
    content-hashed in OUT/export.json. Frames come from replaying each
    rollout's logged actions (runs made with --log-steps; no policy involved),
    checked against the record; rollouts without logs are re-run only when
    their policy runs here with its own generators.

    \b
    Example:
      robocasa-shift export-judge runs/monitors-demo --out runs/judge-set --max-per-cell 8
    """
    from robocasa_shift.judging.export import ExportSettings, export_judge

    settings = ExportSettings(cameras=cameras, frames=frames, size=size, max_per_cell=max_per_cell, seed=seed,
                              video=video, per_failure_type=per_failure_type)
    info = export_judge(run_dir, out, settings, execution, policy_options, trust_run_dir, retry_errors)
    strata = {}
    for counts in info["strata"].values():
        for name, n in counts.items():
            strata[name] = strata.get(name, 0) + n
    click.echo(f"{info['samples']} samples ({info['made']} made now), {len(info['excluded'])} left out; strata "
               f"{strata}; export hash {info['export_hash'][:12]} -> {out}/manifest.jsonl")
    for item in info["excluded"][:10]:
        click.echo(f"  left out {item['sample_id']}: {item['reason']}")


@click.command(name="judge")
@click.argument("judge_set", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--judge", "judge_name", default="end-state", show_default=True,
              help="Registered judge (entry-point group robocasa_shift.judges): end-state, openai, or a plug-in.")
@click.option("--judge-option", "judge_options", multiple=True, metavar="KEY=VALUE", callback=key_value_options,
              help="Option for the judge, repeatable, e.g. model=... base_url=http://127.0.0.1:8000/v1 "
                   "api_key=env:OPENAI_API_KEY (a key is read from the variable, never written).")
@click.option("--out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Predictions CSV [default: JUDGE_SET/predictions/<judge>.csv]; rerunning resumes it.")
@click.option("--chunk", default=16, show_default=True, type=click.IntRange(min=1), help="Samples per job.")
@click.option("--crop", type=click.Choice(["cut", "blackout", "upscaled"]), is_flag=False, flag_value="cut",
              default=None,
              help="Localise and crop: third-person images rendered to the box around the task's objects that the "
                   "export recorded (wrist images whole): cut (the default of a bare --crop), blackout (the whole "
                   "frame, black outside the box) or upscaled (the cut resized to the frame) [default --out: "
                   "JUDGE_SET/predictions/<judge>-crop[-MODE].csv].")
@click.option("--boxes", default=None, metavar="NAME",
              help="Crop to the boxes `robocasa-shift localise --name NAME` wrote (a VLM localiser) instead of the "
                   "export's simulator boxes [default --out: JUDGE_SET/predictions/<judge>-crop-NAME.csv].")
@execution_options
@handle_errors
def judge_command(judge_set: Path, judge_name: str, judge_options, out: Optional[Path], chunk: int, crop: Optional[str],
                  boxes: Optional[str], execution: ExecutionConfig) -> None:
    """Run a success judge over JUDGE_SET (an export-judge directory) into a predictions CSV.

    The CSV has sample_id, predicted_success (0/1), confidence (P(success))
    and reasoning (the judge's explanation, where it gives one); OUT.json
    beside it names the judge, its options (secrets never, a prompt template
    by its SHA-256), the input mode (--crop) and the judge set's hash. A
    killed run resumes; nothing is judged twice.

    \b
    Example:
      robocasa-shift judge runs/judge-set --judge end-state
      robocasa-shift judge runs/judge-set --judge openai --judge-option model=Qwen2.5-VL-7B-Instruct
    """
    from robocasa_shift.judging.judges import run_judge

    suffix = "" if crop is None and boxes is None else "-crop" if crop in (None, "cut") else f"-crop-{crop}"
    out = out or judge_set / "predictions" / f"{judge_name}{suffix}{f'-{boxes}' if boxes else ''}.csv"
    result = run_judge(judge_set, judge_name, out, judge_options, execution, chunk, crop=crop, boxes=boxes)
    click.echo(f"{result['judged']}/{result['samples']} samples judged ({result['judged_now']} now) -> {out}")
    for error in result["errors"][:10]:
        click.echo(f"  no verdict for {error}")
    if result["errors"]:
        raise SystemExit(1)


def _prior(ctx: click.Context, param: click.Parameter, value: Optional[str]):
    """``--prior FAILURES:SUCCESSES`` as two counts (a malformed one is a usage error)."""
    if value is None:
        return None
    parts = value.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts) or sum(int(p) for p in parts) == 0:
        raise click.BadParameter(f"expected FAILURES:SUCCESSES, two counts such as 960:244, got {value!r}")
    return int(parts[0]), int(parts[1])


@click.command(name="localise")
@click.argument("judge_set", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--name", required=True, help="Name of the boxes (JUDGE_SET/boxes/NAME.json), used by judge --boxes.")
@click.option("--localiser-option", "options", multiple=True, metavar="KEY=VALUE", callback=key_value_options,
              help="Option of the OpenAI-compatible endpoint, as the openai judge's: model=... "
                   "base_url=http://127.0.0.1:8000/v1 api_key=env:NAME timeout_s=... prompt_file=...")
@handle_errors
def localise_command(judge_set: Path, name: str, options) -> None:
    """Ask a VLM behind an OpenAI-compatible endpoint where each sample's outcome is decided (a box per
    third-person camera), for localise-and-crop with any detector (FailBench Sec. 4.4, App. C).

    \b
    Example:
      robocasa-shift localise runs/judge-set --name qwen --localiser-option model=Qwen2.5-VL-7B-Instruct
      robocasa-shift judge runs/judge-set --judge openai --boxes qwen   # -> predictions/openai-crop-qwen.csv
      robocasa-shift score-judge runs/judge-set runs/judge-set/predictions/openai-crop.csv \\
          runs/judge-set/predictions/openai-crop-qwen.csv --compare openai-crop,openai-crop-qwen
    """
    from robocasa_shift.judging.localiser import localise_set

    result = localise_set(judge_set, name, options)
    found = sum(1 for by_camera in result["boxes"].values() for box in by_camera.values() if box is not None)
    total = sum(len(by_camera) for by_camera in result["boxes"].values())
    click.echo(f"{len(result['boxes'])} samples localised, {found}/{total} camera views boxed -> {result['path']}")
    for error in result["errors"][:10]:
        click.echo(f"  no boxes for {error}")
    if result["errors"]:
        raise SystemExit(1)


@click.command(name="score-judge")
@click.argument("judge_set", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("predictions", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for scores.json/.md, the CSV tables and the figure [default: JUDGE_SET/scores].")
@click.option("--seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@click.option("--n-boot", default=2000, show_default=True, type=click.IntRange(min=100), help="Bootstrap resamples.")
@click.option("--ensemble", "ensembles", multiple=True, metavar="A,B,C",
              help="A majority-vote ensemble of these judges (file stems, or length-only), scored like a judge "
                   "(repeatable).")
@click.option("--compare", "compare", multiple=True, metavar="A,B",
              help="Two judges compared on the same samples: fixes, breaks and exact McNemar (repeatable).")
@click.option("--prior", default=None, metavar="FAILURES:SUCCESSES", callback=_prior,
              help="A published split's class counts, e.g. 960:244: each judge's recalls reweighted to it, beside "
                   "the accuracy of answering failure to everything there.")
@handle_errors
def score_judge_command(judge_set: Path, predictions, out: Optional[Path], seed: int, n_boot: int, ensembles,
                        compare, prior) -> None:
    """Score judges' PREDICTIONS.csv files (sample_id, predicted_success, confidence) on JUDGE_SET.

    \b
    Balanced accuracy per (task, condition) with bootstrap intervals, macro
    over two-class subsets and micro pooled (a one-class subset is scored by
    its recall); false-success rate overall and by stage depth (no_subgoal,
    mid_task, near_success); error-set IoU between every two judges; on
    pairs, the verdict flip rate where the outcome held, S->F changes caught
    and exact McNemar on correctness clean vs perturbed. A length-only
    baseline and an all-failure baseline are scored beside every judge.
    Score validity: the judges' rank agreement slice by slice (Spearman),
    reasoning length of wrong vs right verdicts (a `reasoning` column),
    progress estimation (a `predicted_stage` column, scored against the
    StageTracker's depth) and, with --prior, accuracy at a published split.

    \b
    Examples:
      robocasa-shift score-judge runs/js preds/end-state.csv preds/vlm.csv
      robocasa-shift score-judge runs/js preds/vlm.csv --prior 960:244
    """
    from robocasa_shift.judging.export import NEAR_SUCCESS
    from robocasa_shift.report.judges import write_judge_scores

    groups = [[n.strip() for n in value.split(",") if n.strip()] for value in ensembles]
    pairs = [[n.strip() for n in value.split(",") if n.strip()] for value in compare]
    result = write_judge_scores(judge_set, predictions, out, seed=seed, n_boot=n_boot, ensembles=groups,
                                compare=pairs, prior=prior)
    for name, r in result["judges"].items():
        macro, micro = r["accuracy"]["macro"], r["accuracy"]["micro"]
        near = r["success_bias"]["strata"][NEAR_SUCCESS]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        subsets = f"{macro['subsets']}/{macro['of_subsets']} subsets" + ("" if macro["ba"] is not None else
                                                                           ", not estimable")
        click.echo(f"  {name:<14} macro BA {fmt(macro['ba'])} ({subsets})  micro BA {fmt(micro['ba'])}  false-success "
                   f"{fmt(r['success_bias']['false_success']['rate'])}  near successes judged success "
                   f"{near['k']}/{near['n']}")
    click.echo(f"-> {result['out']}/scores.md")


@click.command(name="train-judge")
@click.option("--runs-dir", default=Path("runs/judge-training"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the training rollouts (one run per policy) and their judge sets go; rerunning resumes.")
@click.option("--out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Weights folder [default: the package's committed end-state weights].")
@execution_options
@handle_errors
def train_judge_command(runs_dir: Path, out: Optional[Path], execution: ExecutionConfig) -> None:
    """Regenerate the end-state judge's weights from fixed seeds.

    Records clean rollouts of the reference, expert and random policies on the
    judge-training seed stream (never evaluated), exports them as judge sets,
    and trains one small classifier per task on their end frames.
    """
    from robocasa_shift.judging.endstate import WEIGHTS_DIR, make_training_sets, train

    require_sim_and_torch("train-judge")
    sets = make_training_sets(runs_dir, execution)
    manifest = train(sets, out or WEIGHTS_DIR)
    for task, entry in manifest["tasks"].items():
        click.echo(f"  {task:<14} {entry['examples']} examples, held-out BA {entry['held_out_balanced_accuracy']}, "
                   f"{entry['train_s']} s")
    click.echo(f"weights -> {out or WEIGHTS_DIR} ({manifest['wall_s']} s training)")
