"""Commands over recorded runs: ``export``, ``analyze``, ``report``, ``compare``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import click

from robocasa_shift.analysis.compare import FAIL_ON, compare_many_markdown, default_out, write_comparison, write_many
from robocasa_shift.analysis.export import export_records
from robocasa_shift.analysis.measures import load_records, write_analysis
from robocasa_shift.cli.common import REPLAY_POLICY_OPTIONS, handle_errors
from robocasa_shift.report.page import build_report


def fmt(value: Optional[float]) -> str:
    """A measure for the console: three decimals, a sign when negative, '-' when missing."""
    return "-" if value is None else f"{value:+.3f}" if value < 0 else f"{value:.3f}"


@click.command(name="export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="CSV file to write.")
@click.option("--steps", "steps_out", default=None, type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the step logs (runs made with --log-steps) as one table, a row per control step.")
@handle_errors
def export_command(run_dir: Path, out: Path, steps_out: Optional[Path]) -> None:
    """Write a run's records as the records table (CSV, one row per rollout).

    \b
    Examples:
      robocasa-shift export runs/study --out runs/study/records.csv
      robocasa-shift export runs/study --out records.csv --steps steps.csv   # with the per-step logs
    """
    n = export_records(run_dir, out)
    click.echo(f"{n} records -> {out}")
    if steps_out is not None:
        from robocasa_shift.analysis.export import steps_frame

        from robocasa_shift.rundir.files import write_csv

        frame = steps_frame(run_dir)
        write_csv(frame, steps_out)
        rollouts = len(frame.drop_duplicates(["phase", "task", "episode", "condition", "replicate"])) if len(frame) else 0
        click.echo(f"{len(frame)} logged steps of {rollouts} rollouts -> {steps_out}")


@click.command(name="analyze")
@click.argument("records", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for summary.json and the CSV tables.")
@click.option("--phase", default="formal", show_default=True, help="Rows of this phase are analysed.")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@click.option("--n-boot", default=10000, show_default=True, help="Bootstrap resamples.")
@click.option("--min-effect", default=0.10, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Declared margin: NO CHANGE DETECTED needs the calibrated interval inside +-this dSR and the "
                   "equivalence test, Holm-adjusted across conditions, to reject.")
@handle_errors
def analyze_command(records: Path, out_dir: Path, phase: str, bootstrap_seed: int, n_boot: int,
                    min_effect: float) -> None:
    """Every measure of the protocol from a records table (this harness's or anyone's).

    \b
    Writes OUT/summary.json (SR, paired dSR with the paper's bootstrap CI and
    a calibrated CI, transitions, S->F stage depth, the exact stratified
    sign-flip test and McNemar with Holm, Wilson intervals, invalid counts,
    minimum detectable dSR, verdicts, severity trend, noise floor) and tidy
    CSV tables: sr.csv, dsr.csv, transitions.csv, stages.csv,
    first_incomplete.csv, trend.csv. Required columns: task, episode,
    condition, success, n_stages, stages_completed, first_incomplete;
    optional: valid, phase, replicate, spec_hash, stage_error, and
    env_fingerprint, policy_rng_fingerprint, stage_spec_hash, policy, backend
    (checked for pairing and mixing).
    """
    summary = write_analysis(load_records(records), out_dir, phase=phase, n_boot=n_boot, bootstrap_seed=bootstrap_seed,
                             min_effect=min_effect)
    click.echo(f"{len(summary['tasks'])} tasks, {len(summary['conditions'])} conditions -> {out_dir}/summary.json")
    for cond, values in summary["conditions"].items():
        if cond == "clean":
            click.echo(f"  {cond:<18} SR {fmt(values['macro_sr'])}")
        else:
            ci, cal = values["dsr_ci95"], values["dsr_ci95_calibrated"]
            ci_text = f"[{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "[-]"
            cal_text = f"[{fmt(cal[0])}, {fmt(cal[1])}]" if cal else "[-]"
            missing = f"  no valid pair for {', '.join(values['missing_tasks'])}" if values["missing_tasks"] else ""
            click.echo(f"  {cond:<18} SR {fmt(values['macro_sr'])}  dSR {fmt(values['macro_dsr'])} {ci_text} "
                       f"calibrated {cal_text}  S->F {values['transitions']['SF']}  F->S {values['transitions']['FS']}  "
                       f"{values['verdict'] or '-'}{missing}")


@click.command(name="report")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--videos", "videos_per_kind", default=2, show_default=True,
              help="Matched pairs to film per kind (S->F and F->S).")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@REPLAY_POLICY_OPTIONS
@click.option("--min-effect", default=0.10, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Declared margin: NO CHANGE DETECTED needs the calibrated interval inside +-this dSR and the "
                   "equivalence test, Holm-adjusted across conditions, to reject.")
@click.option("--progress/--no-progress", default=True, show_default=True,
              help="A bar with the time left while the pair videos re-run their rollouts.")
@handle_errors
def report_command(run_dir: Path, videos_per_kind: int, bootstrap_seed: int, policy_options: Dict[str, Any],
                   trust_run_dir: bool, min_effect: float, progress: bool) -> None:
    """RUN_DIR/report/index.html: tables, figures and side-by-side videos of matched pairs.

    Also refreshes RUN_DIR/analysis/ (summary.json, CSV tables) and the audit.
    A pair whose rollouts logged their frames (run with --log-frames) is
    filmed from them, with no simulator; any other pair is re-run with frame
    capture, and the page says whether each re-run reproduced the recorded
    outcome and subgoal steps exactly. The re-runs rebuild the run's policy, but where it connects and how it
    decodes replies come from this command line, not from RUN_DIR (which
    anyone may have written), unless --trust-run-dir is given. A run with
    planned rollouts not yet recorded gets a page that says so, and exit 1.
    A folder without a manifest is not a run: nothing is written (exit 4).

    \b
    Examples:
      robocasa-shift report runs/study                    # then open runs/study/report/index.html
      robocasa-shift report runs/study --videos 0         # tables and figures only, nothing re-run
      robocasa-shift report runs/gr00t-study --policy-option port=5555   # a served policy's videos
    """
    page = build_report(run_dir, videos_per_kind=videos_per_kind, bootstrap_seed=bootstrap_seed,
                        min_effect=min_effect, policy_options=policy_options, trust_run_dir=trust_run_dir,
                        progress=progress)
    from robocasa_shift.core import kits
    from robocasa_shift.errors import CheckFailed
    from robocasa_shift.report.page import incomplete_notice
    from robocasa_shift.rundir.store import RunStore

    store = RunStore(run_dir)
    banner = kits.run_banner(store.manifest())
    if banner:
        click.echo(banner)
    click.echo(f"report -> {page}")
    incomplete = incomplete_notice(store)
    if incomplete:  # the page says so at its top; a script must not take it for the finished study's
        raise CheckFailed(incomplete)


@click.command(name="compare")
@click.argument("runs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", "out_dir", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="Folder for the results, outside every compared run [default: ./compare-A-vs-B].")
@click.option("--fail-on", "fail_on", multiple=True, type=click.Choice(sorted(FAIL_ON)),
              help="Exit 1 when a condition's verdict is REGRESSED (A below the baseline B, Holm-adjusted), or "
                   "UNDERPOWERED / none (the study could not tell); repeatable. Two runs only.")
@click.option("--seed", "bootstrap_seed", default=0, show_default=True, help="Bootstrap seed (recorded).")
@click.option("--min-effect", default=0.10, show_default=True, type=click.FloatRange(0, 1, min_open=True, max_open=True),
              help="Declared margin: NO CHANGE DETECTED needs the calibrated interval inside +-this difference and "
                   "the equivalence test, Holm-adjusted across conditions, to reject.")
@handle_errors
def compare_command(runs: Tuple[Path, ...], out_dir: Optional[Path], fail_on: Tuple[str, ...], bootstrap_seed: int,
                    min_effect: float) -> None:
    """Runs of one frozen suite, pair by pair: A B (B the baseline), or R1 R2 R3 ... (a robustness table).

    \b
    Two runs: A - B per condition, paired by key (same base episode, initial
    state and perturbation): success and stage-depth differences, the
    calibrated interval, the exact stratified sign-flip test (Holm across the
    conditions) and a verdict from A's side: IMPROVED, REGRESSED, NO CHANGE
    DETECTED, UNDERPOWERED. Writes compare.json, compare.md,
    compare_per_task.csv and junit.xml (one test case per condition).
    --fail-on regressed makes it a gate: exit 1 when any condition REGRESSED.
    Three or more: each run's success rate and paired dSR per condition, and
    every pair compared the same way, Holm across every pair and condition;
    writes compare.json, compare.md and robustness.png (runs x conditions).
    Refused when the runs' spec hashes, study seeds, backends, stage specs or
    asset kits differ.

    \b
    Example (a CI gate, the baseline's run kept from an earlier job):
      robocasa-shift compare runs/candidate runs/baseline --fail-on regressed --out gate
    """
    from robocasa_shift.errors import BadInput, CheckFailed

    if len(runs) < 2:
        raise BadInput(f"compare needs two runs or more, got {len(runs)}")
    if fail_on and len(runs) > 2:
        raise BadInput("--fail-on gates one candidate against one baseline: give two runs (A B)")
    out_dir = out_dir or default_out(runs)
    if len(runs) > 2:
        result = write_many(runs, out_dir, bootstrap_seed=bootstrap_seed, min_effect=min_effect)
        from robocasa_shift.report.figures import fig_robustness

        fig_robustness(result, out_dir / "robustness.png")
        if result.get("banner"):
            click.echo(result["banner"])
        table = compare_many_markdown(result).split("## Each run: ")[1].split("## Every pair")[0]
        click.echo(table.strip())
        click.echo(f"-> {out_dir}/compare.md, {out_dir}/robustness.png")
        return
    run_a, run_b = runs
    result = write_comparison(run_a, run_b, out_dir, fail_on=fail_on, bootstrap_seed=bootstrap_seed,
                              min_effect=min_effect)
    if result.get("banner"):
        click.echo(result["banner"])
    click.echo(f"A = {run_a}, B = {run_b} (the baseline): IMPROVED / REGRESSED say whether A succeeds more / less than B")
    for cond, v in result["conditions"].items():
        p = (v["signflip"] or {}).get("p_holm")
        signed = {k: "-" if v[k] is None else format(v[k], "+.3f") for k in ("macro_success_diff", "macro_depth_diff")}
        click.echo(f"  {cond:<18} success {signed['macro_success_diff']}  depth {signed['macro_depth_diff']}  "
                   f"sign-flip p(Holm) {'-' if p is None else format(p, '.3g')}  {v['verdict'] or '-'}")
    agree = result.get("agreement") or {}
    if agree.get("n"):
        kappa = "-" if agree["kappa"] is None else format(agree["kappa"], ".3f")
        click.echo(f"  agreement {agree['agreement']:.3f} over {agree['n']} pairs, discordance {agree['discordance']:.3f}, "
                   f"Cohen's kappa {kappa}")
    click.echo(f"-> {out_dir}/compare.md, {out_dir}/junit.xml")
    verdict_gate = result["gate"]
    if not verdict_gate["passed"]:
        raise CheckFailed(f"gate failed (--fail-on {', '.join(fail_on)}): " + ", ".join(
            f"{c} {v or 'no verdict'}" for c, v in verdict_gate["failing"].items()))
    if fail_on:
        click.echo(f"gate passed (--fail-on {', '.join(fail_on)})")
