"""``robocasa-shift monitors RUN_DIR``: runtime monitors judged as intervention rules on a run's step logs.

From the step logs of a run's formal rollouts (``--log-steps``), every monitor's
score at every action-chunk boundary; then, with base episodes split into
validation and test per task (clean and perturbed twins together; seed stream
``monitor_split`` of the study seed):

1. **Detection and timing** (``detection.csv``): pooled and macro ROC-AUC with the
   within/between-task decomposition, at the end of the rollout, in the early
   window (per task, the shortest clean validation success) and under a step cap
   (a quarter of the horizon), the length-only baseline beside each; a threshold
   chosen on clean validation successes for the target false-alarm rate (5%),
   frozen for every condition, with its realised false-alarm rate, catch rate and
   alarm position on test rollouts; leave-one-task-out (``loto.csv``).
2. **Decision value of stop-and-reset** (``decision.csv``): RESCUE's worksheet per
   monitor and condition on the test rollouts (the per-step cost from the clean
   test successes' median length), the excess cost over never intervening with a
   bootstrap interval over base episodes within task (each with all its conditions'
   rollouts) that re-selects the threshold in each resample,
   the break-even false-alarm rate, the ideal-detector ceiling, and a
   rate-matched random alarm on the same rollouts. Where branch studies of the
   run hold ``recover`` branches at alarm checkpoints (``alarms.csv`` lists every
   test alarm), routing the alarms to the scripted recovery is priced from them.
3. **Verdicts** (``verdicts.csv``): which criteria admit each monitor on the test
   rollouts of every condition pooled (condition ``all``; thresholds still from
   clean validation): a detection metric when its 95% bootstrap interval lies
   above 0.5; decision value when the excess cost's interval lies below 0
   (cheaper than never intervening).

Everything is written to ``RUN_DIR/monitors/`` (``summary.json``, the CSV tables,
``summary.md`` and the figures the report's ``report/monitors.py`` draws from
:class:`MonitorFigures`); ``robocasa-shift report`` shows it. Pure over the run
directory: nothing is re-run, no simulator is imported and nothing is drawn here.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift import seeding
from robocasa_shift.core.conditions import order_conditions
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.core.specs import load_protocol
from robocasa_shift.errors import AnalysisError, DependencyMissing, RunDirError
from robocasa_shift.analysis import monitor_decision as decision
from robocasa_shift.analysis import monitor_detection as detection
from robocasa_shift.monitoring.monitors import (
    CONTROLS,
    LABEL_LEAK,
    REAL_MONITORS,
    label_leak_scores,
    monitor_names,
    score,
)
from robocasa_shift.rundir.files import atomic_write_text, confined, write_csv
from robocasa_shift.rundir.store import RunStore

if TYPE_CHECKING:
    from robocasa_shift.monitoring.feature_sets import Geometry

OUT = "monitors"
# the monitors trained on the policy's features (monitoring/probe.py, monitoring/sequence.py)
TRAINED = ("hidden_state_probe", "sequence_head")
DECISION_WINDOW = "end"  # a stop-and-reset rule watches the whole attempt
DETECTION_WINDOWS = detection.WINDOW_KINDS


def boundary_scores(run_dir: Path | str, monitors: Sequence[str], phase: str = "formal"
                    ) -> Tuple[Dict[str, pd.DataFrame], Dict[str, Any]]:
    """Every monitor's boundary-scores table over the run's logged rollouts, and what was left out.

    Rollouts count when they are valid, of ``phase``, replicate 0 and have a step log.

    Raises:
        RunDirError: not a run directory; a step log missing or changed (see ``RunStore.step_log``).
        AnalysisError: no logged rollout at all (the message says how to make some).
    """
    store = RunStore(run_dir)
    if store.manifest() is None:
        raise RunDirError(f"{run_dir}: no manifest.json; not a run directory")
    rows: Dict[str, List[pd.DataFrame]] = {m: [] for m in monitors}
    excluded = {"invalid": 0, "without_step_log": 0, "other": 0}
    for record in store.records():
        if record.get("phase") != phase or record.get("replicate", 0) != 0:
            excluded["other"] += 1
            continue
        if not record.get("valid"):
            excluded["invalid"] += 1
            continue
        log = store.step_log(record)
        if log is None:
            excluded["without_step_log"] += 1
            continue
        key = RolloutKey.from_record(record)
        base = {"rollout_id": key.id, "task": key.task, "episode": key.episode, "condition": key.condition,
                "success": bool(record["success"]), "steps": int(record["steps"]), "horizon": int(record["horizon"]),
                "step": log.boundary.astype(int)}
        for name in monitors:
            rows[name].append(pd.DataFrame({**base, "score": score(name, log)}))
    if not any(rows.values()) or not rows[monitors[0]]:
        raise AnalysisError(f"{run_dir}: no valid {phase} rollout with a step log ({excluded}); run "
                            f"`robocasa-shift formal ... --log-steps` (or `run ... --log-steps`) first")
    return {m: pd.concat(parts, ignore_index=True) for m, parts in rows.items()}, excluded


# --------------------------------------------------------------------------- branch outcomes at alarms


RECOVER = "recover"


def branch_outcomes(run_dir: Path | str, intervention: str = RECOVER) -> Dict[Tuple[str, int], List[Tuple[bool, int]]]:
    """Counterfactual branches of ``intervention`` by (rollout id, checkpoint step), from every branch study.

    Only checkpoints that are valid, branched and reproduced their trunk count (the rule of
    ``analysis/branching.py``); each branch gives (success, control steps from the episode's start).
    Run them at a monitor's alarms with ``robocasa-shift branch RUN_DIR --key K --steps S`` (keys and
    steps in ``monitors/alarms.csv``).
    """
    from robocasa_shift.analysis.branching import _usable, load_branch_study

    out: Dict[Tuple[str, int], List[Tuple[bool, int]]] = {}
    for manifest in sorted((Path(run_dir) / "branching").glob("*/manifest.json")):
        study = load_branch_study(manifest.parent)
        for checkpoint in study.checkpoints:
            entry = (checkpoint.get("interventions") or {}).get(intervention)
            if not _usable(checkpoint) or not entry:
                continue
            key = RolloutKey.from_record(checkpoint).id
            out.setdefault((key, int(checkpoint["step"])), []).extend(
                (bool(b["success"]), int(b["steps"])) for b in entry["branches"])
    return out


# --------------------------------------------------------------------------- the measures


# Every bootstrap of the study resamples base episodes within task (clusters): a base episode's rollouts under
# the different conditions share their initial state and are correlated, so they are drawn together.
BOOTSTRAP_STRATA, BOOTSTRAP_CLUSTERS = ("task",), ("episode",)
BOOTSTRAP_TEXT = ("base episodes resampled with replacement within task, each bringing all its rollouts (every "
                  "condition of that base episode: they share its initial state); the threshold re-selected on each "
                  "validation resample")


# RESCUE's robustness check of the decision cost: whole base tasks resampled with replacement (each bringing all its
# rollouts) instead of base episodes within task; with fewer than two tasks there is nothing to resample.
TASK_CLUSTERS = ("task",)
TASK_RESAMPLING_TEXT = ("base tasks resampled with replacement, as many as the study has, each bringing all its "
                        "rollouts (validation and test drawn independently; the threshold re-selected on each "
                        "validation resample)")


def _auc_interval(ep: pd.DataFrame, n_resamples: int, seed: int) -> Tuple[Optional[float], Optional[float]]:
    """95% percentile interval of the pooled AUC, base episodes resampled within task (:data:`BOOTSTRAP_TEXT`).

    A resample with one outcome only has no AUC and is left out.
    """
    rng = np.random.default_rng(seed)
    ep = ep.reset_index(drop=True)
    clustered = decision.cluster_positions(ep, BOOTSTRAP_STRATA, BOOTSTRAP_CLUSTERS)
    fail = ~ep["success"].astype(bool).to_numpy()
    score = ep["score"].to_numpy(dtype=float)
    values = []
    for _ in range(n_resamples):
        drawn = decision.draw_clusters(clustered, rng)
        auc = detection.roc_auc(score[drawn[fail[drawn]]], score[drawn[~fail[drawn]]])
        if auc is not None:
            values.append(auc)
    if not values:
        return None, None
    lo, hi = np.quantile(values, [0.025, 0.975])
    return float(lo), float(hi)


def _episodes(scores: pd.DataFrame, splits, limits) -> pd.DataFrame:
    return detection.add_split_column(detection.episode_scores(detection.check_boundary_scores(scores), limits), splits)


def clean_threshold(ep: pd.DataFrame, target_fa: float) -> float:
    """The threshold for ``target_fa``, chosen on the clean validation successes of an episode-score table."""
    validation = ep[(ep[detection.SPLIT_COLUMN] == detection.VALIDATION) & (ep["condition"] == detection.CLEAN)]
    return detection.select_threshold(validation[validation["success"].astype(bool)], target_fa)


def alarms_on_test(scores: pd.DataFrame, splits, limits, target_fa: float) -> pd.DataFrame:
    """The first alarm of every test rollout at the monitor's threshold (``detection.alarm_steps``'s table)."""
    ep = _episodes(scores, splits, limits)
    test_ids = set(ep.loc[ep[detection.SPLIT_COLUMN] == detection.TEST, "rollout_id"])
    threshold = clean_threshold(ep, target_fa)
    return detection.alarm_steps(scores[scores["rollout_id"].isin(test_ids)], threshold, limits).assign(threshold=threshold)


def decision_rows(name: str, scores: pd.DataFrame, splits, limits, conditions: Sequence[str], c: float,
                  cost_model: decision.CostModel, target_fa: float, n_resamples: int, seed: int,
                  recover: Optional[Mapping[Tuple[str, int], List[Tuple[bool, int]]]] = None) -> List[Dict[str, Any]]:
    """One worksheet row per condition: the monitor as a stop-and-reset rule, and a rate-matched random alarm.

    With ``recover`` (see :func:`branch_outcomes`), also the cost of routing each alarm to the
    scripted recovery, priced from the branches at the alarm's checkpoint; an alarm without
    branches there is priced as stop-and-reset and counted (``recover_missing``).
    """
    ep = _episodes(scores, splits, limits)
    index = detection.AlarmIndex(scores, limits)
    validation = ep[(ep[detection.SPLIT_COLUMN] == detection.VALIDATION) & (ep["condition"] == detection.CLEAN)]

    threshold = clean_threshold(ep, target_fa)
    thresholds: Dict[bytes, float] = {}

    def threshold_of(values: np.ndarray) -> float:
        # a function of the multiset of scores, which bootstrap resamples repeat: chosen once per multiset
        if values.dtype != np.float64:
            return detection.select_threshold(values, target_fa)
        key = np.sort(values).tobytes()
        if key not in thresholds:
            thresholds[key] = detection.select_threshold(values, target_fa)
        return thresholds[key]

    rows = []
    for condition in conditions:
        same = (ep["condition"] == condition) if condition != detection.ALL_CONDITIONS else True
        test = ep[(ep[detection.SPLIT_COLUMN] == detection.TEST) & same].reset_index(drop=True)
        if test.empty:
            continue
        alarms = index.alarms(test["rollout_id"].tolist(), threshold)
        episodes = pd.DataFrame({"success": test["success"], "steps": test["steps"], "alarm_step": alarms})
        sheet = decision.worksheet(episodes, cost_model, c=c)
        test_ids, alarms_on_test = test["rollout_id"].tolist(), {}

        def alarms_at(positions: np.ndarray, thr: float, ids=test_ids, known=alarms_on_test) -> np.ndarray:
            if thr not in known:  # resampled thresholds repeat: the test rows' alarms once per threshold
                known[thr] = index.alarms(ids, thr)
            return known[thr][positions]

        rate = float(np.mean(~np.isnan(alarms)))
        rng = np.random.default_rng(seeding.derive_seed(seed, stream="random_alarm", monitor=name, condition=condition))
        test_scores = scores[scores["rollout_id"].isin(set(test["rollout_id"]))]
        random_alarms = detection.rate_matched_random_alarm(test_scores, rate, rng, limits)
        # the random alarm stays fixed per rollout across resamples: the rule minus it, resample by resample
        reference = random_alarms.set_index("rollout_id").loc[test_ids, "alarm_step"].to_numpy(dtype=float)
        boot = decision.bootstrap_excess(
            validation, test, cost_model=cost_model, n_resamples=n_resamples,
            seed=seeding.derive_seed(seed, stream="monitor_bootstrap", monitor=name, condition=condition), c=c,
            select_threshold=threshold_of,
            alarms_for=alarms_at, strata=BOOTSTRAP_STRATA, clusters=BOOTSTRAP_CLUSTERS, reference_alarms=reference)
        random_sheet = decision.worksheet(random_alarms[["success", "steps", "alarm_step"]], cost_model, c=c)
        tasks = {}
        if condition == detection.ALL_CONDITIONS:  # the verdict's row: its robustness to resampling whole tasks
            n_tasks = int(test["task"].nunique())
            by_task = decision.bootstrap_excess(
                validation, test, cost_model=cost_model, n_resamples=n_resamples,
                seed=seeding.derive_seed(seed, stream="monitor_task_bootstrap", monitor=name), c=c,
                select_threshold=threshold_of, alarms_for=alarms_at, strata=(),
                clusters=TASK_CLUSTERS) if n_tasks > 1 else None
            tasks = {"n_tasks": n_tasks,
                     "excess_ci95_tasks": [by_task.lo, by_task.hi] if by_task else [None, None]}
        row = {"monitor": name, "condition": condition, "threshold": threshold, "alarm_rate": rate,
               **{k: _plain(v) for k, v in sheet.items()},
               "excess_ci95": [boot.lo, boot.hi], "excess_ci95_undefined": boot.n_undefined,
               "n_resamples": boot.n_resamples, "random_alarm_excess": random_sheet["excess_direct"],
               "random_diff": boot.diff_point, "random_diff_ci95": [boot.diff_lo, boot.diff_hi],
               "beats_random_admits": bool(boot.diff_hi is not None and boot.diff_hi < 0), **tasks}
        if recover:
            alarmed = ~np.isnan(alarms)
            outcomes = {rid: recover[(rid, int(step))] for rid, step in zip(test["rollout_id"][alarmed], alarms[alarmed])
                        if (rid, int(step)) in recover}
            routed = decision.recover_routing_cost(episodes.assign(rollout_id=test["rollout_id"]), outcomes, cost_model,
                                                   c=c, missing="stop")
            row.update(recover_excess=_plain(routed["excess_recover"]), recover_priced=len(outcomes),
                       recover_missing=int(alarmed.sum()) - len(outcomes))
        rows.append(row)
    return rows


def alarm_table(name: str, scores: pd.DataFrame, splits, limits, target_fa: float) -> pd.DataFrame:
    """Every test rollout's first alarm at the monitor's threshold (from clean validation): where to branch."""
    alarms = alarms_on_test(scores, splits, limits, target_fa)
    alarms = alarms[alarms["alarmed"]]
    return pd.DataFrame({"monitor": name, "rollout_id": alarms["rollout_id"], "condition": alarms["condition"],
                         "success": alarms["success"], "alarm_step": alarms["alarm_step"].astype(int),
                         "threshold": alarms["threshold"]})


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, (np.floating, float)):  # +inf (a threshold that never fires) and NaN: null
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def verdict_rows(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows, decisions: pd.DataFrame,
                 n_resamples: int, seed: int) -> List[Dict[str, Any]]:
    """Per monitor, on the test rollouts of every condition: each criterion's estimate, interval and verdict."""
    rows = []
    for name in names:
        row: Dict[str, Any] = {"monitor": name}
        for window in DETECTION_WINDOWS:
            ep = _episodes(scores[name], splits, windows[window])
            ep = ep[ep[detection.SPLIT_COLUMN] == detection.TEST]
            auc = detection.auc_decomposition(ep).summary()["pooled_auc"]
            lo, hi = _auc_interval(ep, n_resamples, seeding.derive_seed(seed, stream="auc_bootstrap", monitor=name,
                                                                        window=window))
            row.update({f"{window}_auc": auc, f"{window}_auc_ci95": [lo, hi],
                        f"{window}_auc_admits": bool(lo is not None and lo > 0.5)})
        pooled = decisions[(decisions["monitor"] == name) & (decisions["condition"] == detection.ALL_CONDITIONS)]
        if len(pooled):
            d = pooled.iloc[0]
            lo, hi = d["excess_ci95"]
            task_lo, task_hi = d.get("excess_ci95_tasks") or (None, None)
            admits, admits_tasks = bool(hi is not None and hi < 0), bool(task_hi is not None and task_hi < 0)
            row.update({"excess": d["excess_direct"], "excess_ci95": [lo, hi],
                        "decision_admits": admits,
                        # RESCUE's robustness check: the zero-exclusion verdict with whole base tasks resampled
                        "excess_ci95_tasks": [task_lo, task_hi],
                        "decision_admits_tasks": admits_tasks if task_hi is not None else None,
                        "task_resampling_changes_verdict": (admits != admits_tasks) if task_hi is not None else None,
                        "random_alarm_excess": d["random_alarm_excess"],
                        "excess_minus_random_ci95": d.get("random_diff_ci95"),
                        # an interval, not a comparison of point estimates: the difference's upper end below 0
                        "beats_random_alarm": bool(d.get("beats_random_admits", False)),
                        "beats_random_point": bool(d["excess_direct"] is not None and d["random_alarm_excess"] is not None
                                                   and d["excess_direct"] < d["random_alarm_excess"])})
        rows.append(row)
    return rows


def evaluate(run_dir: Path | str, monitors: Optional[Sequence[str]] = None, target_fa: float = detection.DEFAULT_TARGET_FA,
             kappa: float = 0.1, n_resamples: int = 1000, figures: Optional[FigureWriter] = None,
             bundle: Optional[Path | str] = None) -> Dict[str, Any]:
    """Evaluate ``monitors`` (default: every registered one) on ``run_dir``'s step logs; write ``RUN_DIR/monitors/``
    with the figures ``figures`` draws from :class:`MonitorFigures` (the report's ``report/monitors.py``; None: no
    figure, this module draws none).

    Returns:
        The summary written to ``summary.json``: settings, counts, the split, the windows, the
        clean-condition headline rows and the verdicts (the full tables are the CSV files).

    Raises:
        UnknownNameError: an unknown monitor (the message lists them).
        AnalysisError: no logged rollouts, or too few to split (a task needs two base episodes).
        TypeError: ``figures`` is not a figure writer (a flag of the days this module drew them).
    """
    from robocasa_shift.monitoring.monitors import MONITORS

    if figures is not None and not callable(figures):
        raise TypeError(f"figures={figures!r}: a figure writer or None; the figures are drawn by "
                        "robocasa_shift.report.monitors (evaluate_monitors)")

    # the label leak reads the records' outcomes; the trained heads join when the logs hold features
    names = list(monitors or [*monitor_names(), LABEL_LEAK, *TRAINED])
    for name in names:
        if name not in (*TRAINED, LABEL_LEAK):
            MONITORS.get(name)  # unknown names fail here, listing the registered ones
    run_dir = Path(run_dir)
    with confined(run_dir):  # below the run directory nothing is read or written through a symbolic link
        return _evaluate(run_dir, names, target_fa, kappa, n_resamples, figures, bundle)


def _evaluate(run_dir: Path, names: List[str], target_fa: float, kappa: float, n_resamples: int,
              figures: Optional[FigureWriter], bundle: Optional[Path | str] = None) -> Dict[str, Any]:
    from robocasa_shift.monitoring import analyses, probe, sequence

    store = RunStore(run_dir)
    manifest = store.manifest() or {}
    study_seed = int(manifest.get("study_seed", 0))
    requested, wants_leak = list(names), LABEL_LEAK in names
    registered = [n for n in names if n not in (*TRAINED, LABEL_LEAK)]
    # the rollouts' rows come with any registered monitor's scores (the clock's when none is asked for)
    scores, excluded = boundary_scores(run_dir, registered or ["clock"])
    first = next(iter(scores.values()))
    if not registered:
        scores = {}
    names = list(registered)
    if wants_leak:
        scores[LABEL_LEAK] = label_leak_scores(first)
        names.append(LABEL_LEAK)
    bundle_info = None
    if bundle is not None:  # monitors computed elsewhere, scored by every analysis below like built-in ones
        from robocasa_shift.monitoring import bundle as bundles

        rollouts = first.drop_duplicates("rollout_id")
        imported = bundles.bundle_scores(bundle, rollouts, {*monitor_names(), *TRAINED, LABEL_LEAK})
        scores.update(imported)
        names += list(imported)
        bundle_info = {"file": Path(bundle).name, "sha256": hashlib.sha256(Path(bundle).read_bytes()).hexdigest(),
                       "monitors": bundles.coverage(imported, rollouts)}
    split_seed = seeding.derive_seed(study_seed, stream="monitors")
    splits = detection.split_episodes(first, split_seed)
    for task, parts in splits.items():
        if not parts[detection.TEST] or not parts[detection.VALIDATION]:
            raise AnalysisError(f"task {task}: {len(parts[detection.VALIDATION]) + len(parts[detection.TEST])} base "
                                f"episode(s) with step logs; a split needs at least two")
    trained_info, trained_loto, logs = {}, {}, None
    wanted = [n for n in TRAINED if n in requested]
    if wanted:  # SAFE-style: trained on validation rollouts' features, scored on every rollout
        logs = probe.read_feature_logs(run_dir)
    for name in wanted:
        if logs is None:
            trained_info[name] = {"name": name, "reason": "no step log holds the policy's features (Policy.features): "
                                                         "the run's policy exposes none"}
            continue
        try:
            if name == probe.PROBE:
                scores[name], info = probe.probe_scores(logs, splits)
                trained_loto[name] = probe.loto_scores(logs, splits)
            else:
                scores[name], info = sequence.head_scores(logs, splits, study_seed)
                trained_loto[name] = sequence.loto_scores(logs, splits, study_seed)
            trained_info[name] = {**info, "name": name}
            names.append(name)
        except (AnalysisError, DependencyMissing) as exc:
            trained_info[name] = {"name": name, "reason": f"not trained: {exc}"}
    windows = detection.standard_windows(first, splits)
    conditions = order_conditions(first["condition"].unique(), load_protocol().factor_order)
    evaluated = [*conditions, detection.ALL_CONDITIONS]  # every condition, then all of them pooled
    detection_df = pd.concat([detection.detection_table(scores[n], splits, windows, target_fa, evaluated)
                              .assign(monitor=n) for n in names], ignore_index=True)
    # leave-one-task-out needs another task to choose each held-out task's threshold on
    loto_df = pd.concat([detection.leave_one_task_out(detection.add_split_column(scores[n], splits),
                                                      windows[DECISION_WINDOW], target_fa).assign(monitor=n)
                         for n in names], ignore_index=True) if len(splits) > 1 else pd.DataFrame()
    ep = _episodes(first, splits, windows[DECISION_WINDOW])
    clean_test = ep[(ep[detection.SPLIT_COLUMN] == detection.TEST) & (ep["condition"] == detection.CLEAN)]
    cost_model = decision.CostModel(kappa=kappa)
    c = cost_model.per_step_cost(clean_test.loc[clean_test["success"].astype(bool), "steps"].to_numpy(dtype=float))
    recover = branch_outcomes(run_dir)
    decision_df = pd.DataFrame([row for n in names for row in
                                decision_rows(n, scores[n], splits, windows[DECISION_WINDOW], evaluated, c, cost_model,
                                              target_fa, n_resamples, study_seed, recover)])
    alarms_df = pd.concat([alarm_table(n, scores[n], splits, windows[DECISION_WINDOW], target_fa) for n in names],
                          ignore_index=True)
    verdicts = pd.DataFrame(verdict_rows(names, scores, splits, windows, decision_df, n_resamples, study_seed))
    real = [n for n in names if n in REAL_MONITORS or n in TRAINED or n in ((bundle_info or {}).get("monitors") or {})]
    extra, extra_md, functional_cp = analyses.run(
        run_dir, run_dir / OUT, names, scores, splits, windows, conditions, decision_df, target_fa, cost_model, c,
        n_resamples, study_seed, real, trained_info, trained_loto)
    feature_sets_summary, geometry = None, None
    if wanted:  # the pooled-AUC report's feature-set analyses, on the sets the policy names
        from robocasa_shift.monitoring import feature_sets

        feature_sets_summary, more_md, geometry = feature_sets.run(logs, splits, windows["early"], study_seed,
                                                                   run_dir / OUT, figures is not None)
        extra_md = [*extra_md, *more_md]
    out = run_dir / OUT
    for frame, file in ((detection_df, "detection.csv"), (loto_df, "loto.csv"), (decision_df, "decision.csv"),
                        (verdicts, "verdicts.csv"), (alarms_df, "alarms.csv")):
        write_csv(frame, out / file)
    counts = first.drop_duplicates("rollout_id").assign(split=lambda d: d.apply(
        lambda r: detection.VALIDATION if r["episode"] in splits[r["task"]][detection.VALIDATION] else detection.TEST,
        axis=1)).groupby(["split", "success"]).size()
    summary = {
        "run_dir": str(run_dir), "monitors": names, "real_monitors": real,
        "controls": [n for n in names if n in CONTROLS], "target_fa": target_fa, "kappa": kappa, "c": c,
        "n_resamples": n_resamples, "bootstrap": BOOTSTRAP_TEXT, "split_seed": split_seed, "splits": splits,
        "windows": {w: {t: v for t, v in lim.items()} for w, lim in windows.items()},
        "counts": {f"{split}_{'successes' if ok else 'failures'}": int(n) for (split, ok), n in counts.items()},
        "rollouts": int(first["rollout_id"].nunique()), "excluded": excluded, "conditions": conditions,
        "recover_checkpoints": len(recover),
        "all_failures_timeouts": bool((ep.loc[~ep["success"].astype(bool), "steps"] == ep.loc[~ep["success"].astype(bool),
                                                                                               "horizon"]).all()),
        "verdicts": _records(verdicts),
        "pooled_detection": _records(detection_df[detection_df["condition"] == detection.ALL_CONDITIONS]),
        "pooled_decision": _records(decision_df[decision_df["condition"] == detection.ALL_CONDITIONS]),
        "task_resampling": {"definition": TASK_RESAMPLING_TEXT, "text": task_resampling_line(verdicts)},
        "lengths_by_task": _records(length_table(ep).drop(columns=["successes", "failures"])),
        "ideal_detector_ceiling": ideal_detector_ceiling(ep, cost_model, c, conditions),
        "score_bundle": bundle_info,
        "feature_sets": feature_sets_summary,
        **extra,
        "figures": [],
    }
    if figures is not None:
        summary["figures"] = figures(out, figure_data(scores, splits, windows, names, target_fa, functional_cp,
                                                      geometry))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, allow_nan=False, default=_plain) + "\n")
    atomic_write_text(out / "summary.md", summary_markdown(summary, detection_df, decision_df, verdicts)
                      + "\n".join(extra_md) + "\n")
    return summary


def _records(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    out = []
    for row in frame.astype(object).to_dict("records"):
        out.append({k: _plain(v) for k, v in row.items()})
    return out


# --------------------------------------------------------------------------- figures and Markdown


@dataclass(frozen=True)
class MonitorFigures:
    """What the study's figures draw (the report's ``report/monitors.py``), computed here."""

    lengths: Optional[pd.DataFrame]  # :func:`length_table` of every logged rollout (None: no monitor)
    # per monitor, its ROC curves on the test rollouts of every condition (end window): (label, false-alarm
    # rates, catch rates, AUC), pooled first, then per task (a curve with one class left out)
    roc: Dict[str, List[Tuple[str, np.ndarray, np.ndarray, float]]]
    alarms: Dict[str, pd.DataFrame]  # per monitor, :func:`alarms_on_test` (as the decision table's)
    functional_cp: pd.DataFrame  # ``functional_cp.csv``'s rows (analyses.functional_cp_table)
    geometry: Optional["Geometry"]  # the feature sets' embeddings (feature_sets.geometry; None: not run)


# (out, what to draw) -> [{"monitor", "kind", "file"}]: draws the figures below ``out`` (report/monitors.py)
FigureWriter = Callable[[Path, MonitorFigures], List[Dict[str, str]]]


def figure_data(scores: Mapping[str, pd.DataFrame], splits, windows, names: Sequence[str], target_fa: float,
                functional_cp: pd.DataFrame, geometry: Optional["Geometry"]) -> MonitorFigures:
    """The episode lengths of successes and failures per task, then per monitor its ROC curves (pooled vs per task;
    test rollouts of every condition, end window) and its alarm times on the test rollouts."""
    limits = windows[DECISION_WINDOW]
    roc, alarms = {}, {}
    for name in names:
        ep = _episodes(scores[name], splits, limits)
        test = ep[ep[detection.SPLIT_COLUMN] == detection.TEST]
        roc[name] = []
        for label, part in [("pooled", test), *[(t, g) for t, g in test.groupby("task")]]:
            fpr, tpr = roc_curve(part)
            if fpr is not None:
                auc = detection.roc_auc(part.loc[~part["success"].astype(bool), "score"],
                                        part.loc[part["success"].astype(bool), "score"])
                roc[name].append((label, fpr, tpr, auc))
        alarms[name] = alarms_on_test(scores[name], splits, limits, target_fa)
    lengths = length_table(_episodes(scores[names[0]], splits, limits)) if names else None
    return MonitorFigures(lengths=lengths, roc=roc, alarms=alarms, functional_cp=functional_cp, geometry=geometry)


LENGTH_FIGURE = "figures/lengths__by_task.png"


def length_table(ep: pd.DataFrame) -> pd.DataFrame:
    """Per task (sorted), the episode lengths of successes and of failures over every rollout of an episode table:
    counts, medians and the lengths themselves (what the report's length figure draws)."""
    rows = []
    for task, part in ep.groupby("task", sort=True):
        row: Dict[str, Any] = {"task": task}
        for ok, label in ((True, "successes"), (False, "failures")):
            steps = sorted(part.loc[part["success"].astype(bool) == ok, "steps"].astype(int).tolist())
            row.update({f"n_{label}": len(steps), f"median_{label}": float(np.median(steps)) if steps else None,
                        label: steps})
        rows.append(row)
    return pd.DataFrame(rows, columns=["task", "n_successes", "median_successes", "successes", "n_failures",
                                       "median_failures", "failures"])


def roc_curve(ep: pd.DataFrame) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(false-alarm rates, catch rates) over every threshold of an episode-score table; None with one class."""
    fail = ~ep["success"].astype(bool).to_numpy()
    values = ep["score"].fillna(-np.inf).to_numpy(dtype=float)
    if fail.all() or not fail.any():
        return None, None
    thresholds = np.unique(values)[::-1]
    fpr = np.array([0.0] + [np.mean(values[~fail] >= t) for t in thresholds])
    tpr = np.array([0.0] + [np.mean(values[fail] >= t) for t in thresholds])
    return fpr, tpr


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):  # costs are differences of sums: float noise below 1e-12 shows as 0
        return "0" if abs(value) < 1e-12 else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value)


def _table(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in frame[list(columns)].astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


DETECTION_COLUMNS = ("monitor", "window", "pooled_auc", "macro_auc", "within_auc", "between_auc", "weight_between",
                     "length_pooled_auc", "length_macro_auc", "elapsed_pooled_auc", "task_identity_pooled_auc",
                     "threshold", "false_alarm_rate", "catch_rate", "mean_alarm_position_fraction")
DECISION_COLUMNS = ("monitor", "condition", "p", "d", "t_d", "f", "t_fa", "T_s_fa", "C_never", "f_star",
                    "excess_direct", "excess_ci95", "random_alarm_excess", "random_diff_ci95", "f_star_ideal_any_success",
                    "recover_excess",
                    "recover_priced", "recover_missing")

IDEAL_CEILING_TEXT = (
    "the break-even false-alarm rate of an ideal detector (catches every failure at step 0: d = 1, t_d = 0) on the test "
    "rollouts, over a false alarm anywhere in a success of the longest natural duration, t_fa in [0, T_s,max]: "
    "low end at t_fa = T_s,max, high end at t_fa = 0 (RESCUE Sec. IV-C); one range per run (and per condition), "
    "whichever monitor ran"
)


def ideal_detector_ceiling(ep: pd.DataFrame, cost_model: decision.CostModel, c: float,
                           conditions: Sequence[str]) -> Dict[str, Any]:
    """The ideal-detector ceiling as one range per run: ``f_star_ideal_any_success`` of the test rollouts.

    It depends on the rollouts only (failure prevalence, their mean length, the cost of never
    intervening, the longest natural success), never on a monitor's own false alarms (``f_star_ideal``
    in ``decision.csv`` is that monitor's). ``ep`` is any monitor's episode table (the rollouts are
    the same for all).
    """
    test = ep[ep[detection.SPLIT_COLUMN] == detection.TEST]
    out: Dict[str, Any] = {"definition": IDEAL_CEILING_TEXT, "per_condition": {}}
    for condition in [detection.ALL_CONDITIONS, *conditions]:
        rows = test if condition == detection.ALL_CONDITIONS else test[test["condition"] == condition]
        success = rows["success"].astype(bool).to_numpy()
        if not len(rows) or not success.any():
            out["per_condition"][condition] = None
            continue
        sheet = decision.worksheet(pd.DataFrame({"success": success, "steps": rows["steps"].to_numpy(dtype=float),
                                                 "alarm_step": np.nan}), cost_model, c=c)
        lo, hi = sheet["f_star_ideal_any_success"] or (None, None)
        out["per_condition"][condition] = {
            "f_star": [_plain(lo), _plain(hi)], "T_s_longest": float(rows.loc[success, "steps"].max()),
            "p": sheet["p"], "T_f_all": sheet["T_f_all"], "C_never": sheet["C_never"], "c": sheet["c"],
            "n_rollouts": int(len(rows))}
    pooled = out["per_condition"].get(detection.ALL_CONDITIONS)
    out["f_star"] = None if pooled is None else pooled["f_star"]
    return out
VERDICT_COLUMNS = ("monitor", "end_auc", "end_auc_ci95", "end_auc_admits", "early_auc", "early_auc_admits", "cap_auc",
                   "cap_auc_admits", "excess", "excess_ci95", "decision_admits", "excess_minus_random_ci95",
                   "beats_random_alarm")


def _calibration_warning(summary: Mapping[str, Any], detection_df: pd.DataFrame) -> List[str]:
    """A warning when too few clean validation successes exist for any finite threshold to meet the target."""
    n = int(detection_df["n_calibration_successes"].min()) if len(detection_df) else 0
    target = float(summary["target_fa"])
    if target > 0 and n * target >= 1:
        return []
    return [f"**Warning**: {n} clean validation successes: one false alarm among them is already "
            f"{1 / max(n, 1):.1%}, above the target {target:g}, so the threshold is +inf (never alarm) wherever "
            f"no score separates them; run more base episodes (at least {math.ceil(1 / target) if target else '-'} clean "
            "validation successes) or raise --target-fa.", ""]


def _ceiling_lines(summary: Mapping[str, Any]) -> List[str]:
    ceiling = summary.get("ideal_detector_ceiling") or {}
    pooled = (ceiling.get("per_condition") or {}).get(detection.ALL_CONDITIONS)
    if not pooled:
        return []
    lo, hi = pooled["f_star"]
    return [f"Ideal-detector ceiling of this run (test rollouts of every condition): f* {_cell(lo)}-{_cell(hi)} "
            f"(failure prevalence {pooled['p']:.3f}, longest natural success {pooled['T_s_longest']:g} steps): "
            f"{ceiling['definition']}. `f_star_ideal_any_success` gives it per condition.", ""]


def task_resampling_line(verdicts: pd.DataFrame) -> str:
    """How many monitors' zero-exclusion verdict on the decision cost survives resampling whole base tasks."""
    defined = verdicts[verdicts["task_resampling_changes_verdict"].notna()] \
        if "task_resampling_changes_verdict" in verdicts else verdicts.iloc[0:0]
    if not len(defined):
        return ("Base-task resampling: not defined (fewer than two tasks, or no pooled decision row): the excess-cost "
                "interval is over base episodes within task only.")
    changed = defined[defined["task_resampling_changes_verdict"].astype(bool)]
    text = (f"Base-task resampling: the zero-exclusion verdict on the excess cost is unchanged for "
            f"{len(defined) - len(changed)}/{len(defined)} monitors when whole base tasks are resampled")
    return text + (f"; it changes for {', '.join(changed['monitor'])}." if len(changed) else ".")


def _task_resampling_lines(verdicts: pd.DataFrame) -> List[str]:
    lines = ["### Robustness: base tasks resampled (test rollouts of every condition)", "",
             task_resampling_line(verdicts) + f" Resampling: {TASK_RESAMPLING_TEXT}.", ""]
    columns = ("monitor", "excess", "excess_ci95", "decision_admits", "excess_ci95_tasks", "decision_admits_tasks",
               "task_resampling_changes_verdict")
    if all(c in verdicts for c in columns):
        lines += [_table(verdicts, columns), ""]
    return lines


def summary_markdown(summary: Mapping[str, Any], detection_df: pd.DataFrame, decision_df: pd.DataFrame,
                     verdicts: pd.DataFrame) -> str:
    """``summary.md``: counts and windows, clean detection, decision value per condition, verdicts."""
    windows = "; ".join(f"{w}: " + ", ".join(f"{t} {v if v is not None else 'all'}" for t, v in lim.items())
                        for w, lim in summary["windows"].items())
    shift = detection_df[(detection_df["window"] == DECISION_WINDOW)]
    lines = ["# Runtime monitors as intervention rules", "",
             f"{summary['rollouts']} logged rollouts ({summary['counts']}); left out: {summary['excluded']}. "
             f"Target false-alarm rate {summary['target_fa']:g} on clean validation successes; kappa "
             f"{summary['kappa']:g} (c = {summary['c']:.5f} resets per step); {summary['n_resamples']} bootstrap "
             f"resamples ({summary.get('bootstrap', BOOTSTRAP_TEXT)}). Every failure is a horizon timeout: "
             f"{summary['all_failures_timeouts']}.", "",
             f"Windows (last step counted): {windows}.", "",
             *_calibration_warning(summary, detection_df),
             "## Verdicts (test rollouts of every condition)", "",
             _table(verdicts, [c for c in VERDICT_COLUMNS if c in verdicts]), "",
             "## Detection and timing (test rollouts of every condition)", "",
             _table(detection_df[detection_df["condition"] == detection.ALL_CONDITIONS], DETECTION_COLUMNS), "",
             "## Under shift (end window; thresholds frozen from clean validation)", "",
             _table(shift, ("monitor", "condition", "pooled_auc", "length_pooled_auc", "false_alarm_rate", "catch_rate")),
             "", "## Episode length by task (every logged rollout)", "",
             "Successes beside failures (`figures/lengths__by_task.png` draws every rollout): where failures are "
             "horizon timeouts, length alone separates them within a task, and differing task lengths inflate a "
             "pooled AUC between tasks.", "",
             _table(pd.DataFrame(summary.get("lengths_by_task") or []),
                    ("task", "n_successes", "median_successes", "n_failures", "median_failures"))
             if summary.get("lengths_by_task") else "-", "",
             "## Decision value of stop-and-reset (test rollouts)", "",
             *_ceiling_lines(summary),
             _table(decision_df, [c for c in DECISION_COLUMNS if c in decision_df]), "",
             *_task_resampling_lines(verdicts),
             "Routing alarms to `recover` is priced from branches at the alarm checkpoints where a branch study has "
             f"them ({summary['recover_checkpoints']} checkpoints with recover branches found); `alarms.csv` lists every "
             "test alarm (key and step) to branch, e.g. `robocasa-shift branch RUN_DIR --name alarms --key KEY "
             "--steps STEP --intervention recover`.", ""]
    return "\n".join(lines) + "\n"


__all__ = ["DECISION_WINDOW", "FigureWriter", "LENGTH_FIGURE", "MonitorFigures", "OUT", "boundary_scores",
           "clean_threshold", "decision_rows", "evaluate", "figure_data", "roc_curve", "alarms_on_test",
           "length_table", "summary_markdown", "task_resampling_line", "verdict_rows"]
