"""``monitors``: runtime failure monitors judged as intervention rules, from a run's step logs."""

from __future__ import annotations

from pathlib import Path

import click

from robocasa_shift.cli.common import handle_errors
from robocasa_shift.analysis.monitor_detection import DEFAULT_TARGET_FA
from robocasa_shift.monitoring.monitors import monitor_names


@click.command(name="monitors")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--monitor", "monitors", multiple=True,
              help="Monitor(s) to evaluate (comma list) [default: every registered one ("
                   + ", ".join(monitor_names()) + "), the label_leak control and, where the step logs hold the "
                   "policy's features, hidden_state_probe and sequence_head].")
@click.option("--target-fa", default=DEFAULT_TARGET_FA, show_default=True, type=click.FloatRange(0, 1),
              help="False-alarm rate the threshold targets on clean validation successes.")
@click.option("--kappa", default=0.1, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Cost of the median clean success's execution, in resets (the per-step cost).")
@click.option("--resamples", default=1000, show_default=True, type=click.IntRange(min=1),
              help="Bootstrap resamples of every interval: base episodes resampled within task, each with all its "
                   "rollouts (a base episode's conditions share its initial state, so they are drawn together).")
@click.option("--scores", "bundle", default=None, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A score bundle: monitors computed elsewhere (CSV: rollout_id, step, monitor, score), judged by "
                   "every analysis beside the registered ones (docs/monitors.md).")
@handle_errors
def monitors_command(run_dir: Path, monitors, target_fa: float, kappa: float, resamples: int, bundle) -> None:
    """Is a monitor's alarm worth acting on? Detection, timing and decision value (RESCUE).

    Reads the step logs of RUN_DIR's formal rollouts (run them with --log-steps),
    splits base episodes into validation and test per task (clean and perturbed
    twins together), scores every monitor at every action-chunk boundary and
    writes RUN_DIR/monitors/: pooled vs macro AUC with its within/between-task
    decomposition, early-window and step-cap AUCs, the length-only baseline
    beside each, leave-one-task-out, thresholds for --target-fa frozen from
    clean validation and their realised rates on test rollouts under every
    condition, and the stop-and-reset worksheet (excess cost over never
    intervening with a bootstrap interval over base episodes, break-even
    false-alarm rate, the ideal-detector ceiling as one range per run,
    rate-matched random alarm). Beside them (the pooled-AUC report and RESCUE):
    length-only, elapsed-time and task-identity baselines in every AUC table,
    leave-one-task-out macro AUC with a t-interval over tasks, the
    pooled-minus-macro gap with a jackknife-t interval, functional conformal
    thresholds over an alpha sweep and calibration splits, predeclared fixed
    horizons, RESCUE Table II (End, Early, <100, AUC-PDT, Timely beside decision
    value), cost-optimal thresholds and a kappa sweep, RESCUE's label-leak
    control; for policies whose logs hold features, a hidden-state probe and a
    GRU sequence head, and on the feature sets the policy names, the
    incremental held-out value of each set (PCA / PLS combiner), time-resolved
    fusion against a shuffled control, CKA and a UMAP figure. `robocasa-shift
    report` shows it.

    \b
    Example:
      robocasa-shift formal --policy reference --episodes 0-9 --log-steps --run-dir runs/m
      robocasa-shift monitors runs/m
      robocasa-shift monitors runs/m --scores my_monitor_scores.csv   # monitors computed elsewhere
    """
    from robocasa_shift.report.monitors import evaluate_monitors

    names = [n.strip() for v in monitors for n in v.split(",") if n.strip()] or None
    summary = evaluate_monitors(run_dir, names, target_fa=target_fa, kappa=kappa, n_resamples=resamples,
                                bundle=bundle)
    click.echo(f"{summary['rollouts']} logged rollouts {summary['counts']}; every failure a timeout: "
               f"{summary['all_failures_timeouts']}")
    for v in summary["verdicts"]:
        ci = v.get("excess_ci95") or [None, None]
        fmt = lambda x: "-" if x is None else f"{x:+.4f}"  # noqa: E731
        click.echo(f"  {v['monitor']:<22} end AUC {v['end_auc'] if v['end_auc'] is None else round(v['end_auc'], 3)}"
                   f"  early {v['early_auc'] if v['early_auc'] is None else round(v['early_auc'], 3)}"
                   f"  excess cost {fmt(v.get('excess'))} [{fmt(ci[0])}, {fmt(ci[1])}]"
                   f"  decision admits: {v.get('decision_admits')}")
    click.echo(f"-> {run_dir}/monitors/summary.md")
