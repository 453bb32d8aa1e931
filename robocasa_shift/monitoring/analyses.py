"""The monitors study's further analyses: what the pooled-AUC report and RESCUE report beyond the main tables.

``study.evaluate`` calls :func:`run` after its own tables; everything here reads the same boundary scores,
splits and windows, writes its tables beside theirs in ``RUN_DIR/monitors/`` and returns the summary's
parts and the Markdown sections of ``summary.md``:

- ``horizons.csv``: a predeclared set of fixed horizons (1/8, 1/4, 1/2 of each task's horizon), each with
  its AUCs beside the length-only, elapsed-time and task-identity baselines and its 5% operating point
  (report Sec. 3.5);
- ``loto_macro.csv``: leave one task out as the report summarises it (Sec. 3.3): macro AUC over held-out
  tasks with a t-interval over tasks, SD and range, per window, beside the baselines' (the
  hidden-state probe and the sequence head are refitted without each held-out task);
- ``gap.csv``: the pooled-minus-macro gap, its exact decomposition and a jackknife-t interval over tasks
  (Sec. 3.2);
- ``functional_cp.csv`` (drawn by the report as ``figures/fcp__<window>.png``): time-varying thresholds by
  functional conformal prediction over an alpha sweep and 10 calibration splits, with the detection /
  false-alarm trade-off and the spread across splits, beside the constant 5% threshold (Sec. 3.4);
- ``table2.csv``: RESCUE Table II per monitor and universe (each condition's test rollouts): End, Early,
  <100 steps, AUC-PDT and Timely beside decision value against never intervening and against the
  rate-matched random alarm, each with its interval and verdict, and the tally (Sec. IV-D);
- ``cost_optimal.csv`` and ``kappa.csv``: thresholds chosen on validation to minimise the expected cost, and
  a sweep over the cost ratio kappa for both rules (Sec. IV-D, IV-E).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift import seeding
from robocasa_shift.analysis import monitor_conformal as conformal
from robocasa_shift.analysis import monitor_decision as decision
from robocasa_shift.analysis import monitor_detection as detection

STRATA, CLUSTERS = ("task",), ("episode",)
KAPPAS = (0.05, 0.1, 0.2, 0.5)  # RESCUE Sec. IV-E: a median success valued at 0.05 to 0.5 resets
FCP_WINDOWS = ("end", "early")
TABLE2_COLUMNS = ("end", "early", "lt100", "auc_pdt", "timely", "vs_never", "vs_random")
DETECTION_COLUMNS = ("end", "early", "lt100", "auc_pdt", "timely")


# --------------------------------------------------------------------------- small helpers


# Within one :func:`run`, the same (scores, window) is read by many analyses: computed once, kept until it ends.
_CACHE: Dict[tuple, Tuple[Any, Any]] = {}


def _cached(kind: str, scores: pd.DataFrame, extra: Any, limits: Mapping[str, Optional[int]], make):
    key = (kind, id(scores), id(extra), tuple(sorted((str(k), v) for k, v in limits.items())))
    held = _CACHE.get(key)
    if held is None or held[0] is not scores:
        held = (scores, make())
        _CACHE[key] = held
    return held[1]


def episodes(scores: pd.DataFrame, splits, limits) -> pd.DataFrame:
    """Episode scores with their split (one row per rollout); the caller must not change the frame."""
    return _cached("episodes", scores, splits, limits, lambda: detection.add_split_column(
        detection.episode_scores(detection.check_boundary_scores(scores), limits), splits))


def first_alarms(scores: pd.DataFrame, limits) -> detection.AlarmIndex:
    """:class:`~robocasa_shift.analysis.monitor_detection.AlarmIndex` of a table and window (kept for the run)."""
    return _cached("alarms", scores, None, limits, lambda: detection.AlarmIndex(scores, limits))


def _plain(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(float(value)) else None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def _universe(ep: pd.DataFrame, universe: str) -> pd.DataFrame:
    same = ep["condition"] == universe if universe != detection.ALL_CONDITIONS else np.ones(len(ep), dtype=bool)
    return ep[(ep[detection.SPLIT_COLUMN] == detection.TEST) & same].reset_index(drop=True)


def _percentile(values: Sequence[float], confidence: float = 0.95) -> List[Optional[float]]:
    if not len(values):
        return [None, None]
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(np.asarray(values, dtype=float), [tail, 1.0 - tail])
    return [float(lo), float(hi)]


# --------------------------------------------------------------------------- fixed horizons, LOTO, the gap


def horizons_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, target_fa: float,
                   fractions: Sequence[float] = detection.FIXED_HORIZON_FRACTIONS) -> pd.DataFrame:
    """Every monitor at every predeclared fixed horizon: AUCs beside the three baselines, and its 5% operating
    point, on the test rollouts of every condition pooled and of the clean condition."""
    first = scores[names[0]]
    windows = detection.fixed_horizon_windows(first, fractions)
    rates = detection.task_base_rates(detection.add_split_column(detection.check_boundary_scores(first), splits))
    frames = []
    for name in names:
        frame = detection.detection_table(scores[name], splits, windows, target_fa,
                                          [detection.ALL_CONDITIONS, detection.CLEAN], task_rates=rates)
        frames.append(frame.assign(monitor=name, fraction=[float(w.split("_", 1)[1]) for w in frame["window"]]))
    return pd.concat(frames, ignore_index=True)


def _per_task_test_auc(ep: pd.DataFrame) -> Dict[str, Optional[float]]:
    return detection.per_task_auc(ep[ep[detection.SPLIT_COLUMN] == detection.TEST])


def loto_macro_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows,
                     trained_loto: Mapping[str, Mapping[str, pd.DataFrame]]) -> pd.DataFrame:
    """Per monitor (and baseline) and window: the macro AUC over held-out tasks, a t-interval over tasks, the
    SD and the range (each task's AUC on its test rollouts, every condition; a trained monitor's, the probe or
    the sequence head, from one fitted without that task: ``trained_loto[name][task]``)."""
    rows = []
    first = detection.add_split_column(detection.check_boundary_scores(scores[names[0]]), splits)
    baselines = detection.baseline_scores(first, detection.task_base_rates(first))
    for window in detection.WINDOW_KINDS:
        limits = windows[window]
        entries: List[Tuple[str, str, Dict[str, Optional[float]]]] = []
        for name in names:
            if trained_loto.get(name):
                per_task = {}
                for task, frame in trained_loto[name].items():
                    ep = episodes(frame, splits, {t: limits[t] for t in frame["task"].unique()})
                    per_task[task] = detection.per_task_auc(ep[ep[detection.SPLIT_COLUMN] == detection.TEST]).get(task)
                entries.append((name, "refitted without the held-out task", per_task))
            else:
                entries.append((name, "monitor (not trained on tasks)", _per_task_test_auc(episodes(scores[name], splits,
                                                                                                  limits))))
        for base, frame in baselines.items():
            entries.append((f"{base} (baseline)", "baseline", _per_task_test_auc(episodes(frame, splits, limits))))
        for name, kind, per_task in entries:
            summary = detection.task_macro(per_task)
            rows.append({"monitor": name, "window": window, "kind": kind, "macro_auc": summary["macro"],
                         "ci95": summary["ci95"], "interval": summary["interval"], "sd": summary["sd"], "min": summary["min"], "max": summary["max"],
                         "n_tasks": summary["n_tasks"],
                         "per_task": ", ".join(f"{t}={'-' if v is None else f'{v:.3f}'}"
                                               for t, v in sorted(per_task.items()))})
    return pd.DataFrame(rows)


def gap_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows) -> pd.DataFrame:
    """Per monitor and window, on the test rollouts of every condition: the pooled-minus-macro gap, its two
    terms and its jackknife-t interval over tasks."""
    rows = []
    for name in names:
        for window in detection.WINDOW_KINDS:
            ep = episodes(scores[name], splits, windows[window])
            test = ep[ep[detection.SPLIT_COLUMN] == detection.TEST]
            result = detection.gap_interval(test)
            rows.append({"monitor": name, "window": window, **result})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- functional conformal prediction


def functional_cp_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows,
                        target_fa: float, seed: int, alphas: Sequence[float] = conformal.ALPHAS,
                        n_splits: int = conformal.N_SPLITS) -> Tuple[pd.DataFrame, List[str]]:
    """The alpha sweep of every monitor in :data:`FCP_WINDOWS`, and a row per (monitor, window, evaluation) for
    the constant threshold at ``target_fa`` (alpha None). Monitors that cannot be calibrated are named."""
    rows, skipped = [], []
    for name in names:
        for window in FCP_WINDOWS:
            limits = windows[window]
            try:
                sweep = conformal.sweep(scores[name], splits, limits, alphas, n_splits,
                                        seeding.derive_seed(seed, stream="functional_cp", monitor=name, window=window))
            except Exception as exc:  # noqa: BLE001 - too few calibration trajectories: named, not fatal
                skipped.append(f"{name} ({window}): {exc}")
                continue
            rows.append(sweep.assign(monitor=name, window=window, rule="functional CP"))
            test = episodes(scores[name], splits, limits)
            test = test[test[detection.SPLIT_COLUMN] == detection.TEST]
            for evaluation, conditions in ((detection.ALL_CONDITIONS, sorted(test["condition"].unique().tolist())),
                                           (detection.CLEAN, [detection.CLEAN])):
                point = conformal.constant_point(scores[name], splits, limits, target_fa, conditions)
                rows.append(pd.DataFrame([{"monitor": name, "window": window, "rule": f"constant {target_fa:g}",
                                           "evaluation": evaluation, "alpha": None,
                                           "false_alarm_rate_mean": point["false_alarm_rate"],
                                           "catch_rate_mean": point["catch_rate"],
                                           "effective_alarm_position_mean": point["effective_alarm_position"]}]))
    frame = pd.concat(rows, ignore_index=True) if rows else pd.DataFrame()
    return frame, skipped


# --------------------------------------------------------------------------- RESCUE Table II


def branch_horizons(run_dir: Path) -> Dict[str, Optional[float]]:
    """The combined recoverability horizon of every trunk a branch study of the run holds, by rollout id (None
    when the trunk has no recoverable checkpoint)."""
    from robocasa_shift.analysis.branching import COMBINED, load_branch_study, trunk_frame
    from robocasa_shift.core.records import RolloutKey

    out: Dict[str, Optional[float]] = {}
    for manifest in sorted((Path(run_dir) / "branching").glob("*/manifest.json")):
        frame = trunk_frame(load_branch_study(manifest.parent))
        for row in frame.to_dict("records"):
            key = RolloutKey.from_record(row).id
            horizon = row[f"{COMBINED}_horizon"]
            if key not in out or out[key] is None:
                out[key] = None if pd.isna(horizon) else float(horizon)
    return out


def table2(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows, universes: Sequence[str],
           decisions: pd.DataFrame, horizons: Mapping[str, Optional[float]], target_fa: float, n_resamples: int,
           seed: int) -> pd.DataFrame:
    """RESCUE Table II per monitor and universe (a condition's test rollouts, or ``all`` pooled).

    Detection and timing: End, Early and <100 (pooled AUC of the max score over the whole attempt, the early
    window, the boundaries before step 100), AUC-PDT (:func:`detection.auc_pdt`), each admitted when its 95%
    interval (base episodes resampled within task) lies above 0.5; Timely (:func:`detection.timely_rate` at
    the constant ``target_fa`` threshold, on failures with a recoverability horizon from a branch study),
    admitted when the interval of its difference from a rate-matched random alarm's on the same rollouts lies
    above 0. Decision value: admitted against never intervening when the excess cost's interval lies below 0,
    against the random alarm when the interval of the excess-cost difference lies below 0 (``decisions``).
    """
    rows = []
    lt100 = detection.below_step_window(scores[names[0]])
    for name in names:
        eps = {w: episodes(scores[name], splits, windows[w]) for w in ("end", "early")}
        eps["lt100"] = episodes(scores[name], splits, lt100)
        fractions = detection.add_split_column(detection.fraction_scores(scores[name]), splits)
        pdt_cols = [f"f{f:g}" for f in detection.PDT_FRACTIONS]
        calibration = eps["end"][(eps["end"][detection.SPLIT_COLUMN] == detection.VALIDATION)
                                 & (eps["end"]["condition"] == detection.CLEAN) & eps["end"]["success"]]
        threshold = detection.select_threshold(calibration, target_fa)
        index = first_alarms(scores[name], windows["end"])
        for universe in universes:
            base = _universe(eps["end"], universe)
            if base.empty:
                continue
            ids = base["rollout_id"].tolist()
            fail = ~base["success"].to_numpy(dtype=bool)
            columns = {w: eps[w].set_index("rollout_id").loc[ids, "score"].to_numpy(dtype=float)
                       for w in ("end", "early", "lt100")}
            pdt = fractions.set_index("rollout_id").loc[ids, pdt_cols].to_numpy(dtype=float)
            alarms = index.alarms(ids, threshold)
            horizon = np.array([np.nan if horizons.get(r) is None else horizons[r] for r in ids], dtype=float)
            horizon[~fail] = np.nan
            rate = float(np.mean(~np.isnan(alarms)))
            rng = np.random.default_rng(seeding.derive_seed(seed, stream="table2_random", monitor=name,
                                                            universe=universe))
            random = detection.rate_matched_random_alarm(scores[name][scores[name]["rollout_id"].isin(set(ids))],
                                                         rate, rng, windows["end"]).set_index("rollout_id")
            random_alarms = random.loc[ids, "alarm_step"].to_numpy(dtype=float)
            row: Dict[str, Any] = {"monitor": name, "universe": universe, "n_rollouts": len(ids),
                                   "n_failures": int(fail.sum())}
            for w, values in columns.items():
                row[w] = detection.roc_auc(values[fail], values[~fail])
            row["auc_pdt"] = detection.auc_pdt(pdt[fail], pdt[~fail])
            k, n, timely = detection.timely_rate(alarms[fail], horizon[fail])
            rk, rn, random_timely = detection.timely_rate(random_alarms[fail], horizon[fail])
            row.update(timely=timely, timely_k=k, timely_n=n, random_timely=random_timely)
            clustered = decision.cluster_positions(base, STRATA, CLUSTERS)
            boot_rng = np.random.default_rng(seeding.derive_seed(seed, stream="table2_bootstrap", monitor=name,
                                                                 universe=universe))
            draws: Dict[str, List[float]] = {c: [] for c in DETECTION_COLUMNS}
            for _ in range(int(n_resamples)):
                drawn = decision.draw_clusters(clustered, boot_rng)
                f = fail[drawn]
                if f.all() or not f.any():
                    continue
                for w, values in columns.items():
                    draws[w].append(detection.roc_auc(values[drawn][f], values[drawn][~f]))
                draws["auc_pdt"].append(detection.auc_pdt(pdt[drawn][f], pdt[drawn][~f]))
                if n:
                    _, m_n, m = detection.timely_rate(alarms[drawn][f], horizon[drawn][f])
                    _, r_n, r = detection.timely_rate(random_alarms[drawn][f], horizon[drawn][f])
                    if m is not None and r is not None:
                        draws["timely"].append(m - r)
            for column in ("end", "early", "lt100", "auc_pdt"):
                lo, hi = _percentile(draws[column])
                row[f"{column}_ci95"] = [lo, hi]
                row[f"{column}_admits"] = bool(lo is not None and lo > 0.5)
            lo, hi = _percentile(draws["timely"])
            row["timely_minus_random_ci95"] = [lo, hi]
            row["timely_admits"] = bool(lo is not None and lo > 0)
            d = decisions[(decisions["monitor"] == name) & (decisions["condition"] == universe)]
            if len(d):
                d = d.iloc[0]
                lo, hi = d["excess_ci95"]
                row.update(excess=d["excess_direct"], excess_ci95=[lo, hi], vs_never_admits=bool(hi is not None
                                                                                                  and hi < 0))
                diff = d.get("random_diff_ci95") if "random_diff_ci95" in d else None
                diff = diff if isinstance(diff, (list, tuple)) else [None, None]
                row.update(excess_minus_random=d.get("random_diff"), excess_minus_random_ci95=list(diff),
                           vs_random_admits=bool(diff[1] is not None and diff[1] < 0))
            rows.append(row)
    return pd.DataFrame(rows)


def table2_tally(frame: pd.DataFrame, universes: Sequence[str], real: Sequence[str]) -> Dict[str, Any]:
    """Per monitor, how many universes each column admits it in (``k/u``), over the conditions (``all`` apart),
    and the headline counts: detection/timing verdicts admitting the real monitors vs decision value's."""
    per_monitor, detection_admits, detection_total, decision_admits, decision_total = {}, 0, 0, 0, 0
    conditions = [u for u in universes if u != detection.ALL_CONDITIONS]
    for name, part in frame[frame["universe"].isin(conditions)].groupby("monitor", sort=False):
        u = len(part)
        counts = {c: int(part.get(f"{c}_admits", pd.Series(dtype=bool)).fillna(False).astype(bool).sum())
                  for c in TABLE2_COLUMNS}
        timely_defined = int((part["timely_n"] > 0).sum()) if "timely_n" in part else 0
        per_monitor[name] = {"u": u, **{c: f"{counts[c]}/{u}" for c in TABLE2_COLUMNS},
                             "timely_defined_in": timely_defined}
        if name in real:
            detection_admits += sum(counts[c] for c in ("end", "early", "lt100", "auc_pdt", "timely"))
            detection_total += 5 * u
            decision_admits += counts["vs_never"]
            decision_total += u
    return {"per_monitor": per_monitor, "real_monitors": list(real),
            "detection_timing_admits": detection_admits, "detection_timing_verdicts": detection_total,
            "decision_admits": decision_admits, "decision_verdicts": decision_total}


# --------------------------------------------------------------------------- cost-optimal thresholds, kappa


def _candidates(ep_validation: pd.DataFrame) -> np.ndarray:
    values = ep_validation["score"].to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    return np.append(np.unique(finite), np.inf)


def _cost_rule(name: str, scores: pd.DataFrame, splits, limits, universe: str, c: float,
               cost_model: decision.CostModel, target_fa: float, n_resamples: int, seed: int,
               rule: str) -> Optional[Dict[str, Any]]:
    """One rule's worksheet and bootstrap on a universe: ``constant`` (target_fa on clean validation successes,
    as ``decision.csv``) or ``cost_optimal`` (the threshold of least validation cost in that universe)."""
    ep = episodes(scores, splits, limits)
    same = (ep["condition"] == universe) if universe != detection.ALL_CONDITIONS else np.ones(len(ep), dtype=bool)
    test = ep[(ep[detection.SPLIT_COLUMN] == detection.TEST) & same].reset_index(drop=True)
    if test.empty or not test["success"].any():
        return None
    index = first_alarms(scores, limits)
    test_ids = test["rollout_id"].tolist()
    known: Dict[float, np.ndarray] = {}

    def alarms_at(positions: np.ndarray, thr: float) -> np.ndarray:
        if thr not in known:
            known[thr] = index.alarms(test_ids, thr)
        return known[thr][positions]

    if rule == "constant":
        validation = ep[(ep[detection.SPLIT_COLUMN] == detection.VALIDATION)
                        & (ep["condition"] == detection.CLEAN)].reset_index(drop=True)
        boot = decision.bootstrap_excess(validation, test, lambda v: detection.select_threshold(v, target_fa),
                                         alarms_at, cost_model, n_resamples, seed, STRATA, c, clusters=CLUSTERS)
    else:
        validation = ep[(ep[detection.SPLIT_COLUMN] == detection.VALIDATION) & same].reset_index(drop=True)
        if validation.empty or not validation["success"].any():
            return None
        candidates = _candidates(validation)
        ids = validation["rollout_id"].tolist()
        matrix = np.stack([index.alarms(ids, thr) for thr in candidates], axis=1)
        selector = decision.cost_optimal_selector(validation, candidates, matrix, c, cost_model.reset_cost)
        boot = decision.bootstrap_excess(validation, test, selector, alarms_at, cost_model, n_resamples, seed,
                                         STRATA, c, clusters=CLUSTERS, select_on="positions")
    sheet = decision.worksheet(pd.DataFrame({"success": test["success"], "steps": test["steps"],
                                             "alarm_step": alarms_at(np.arange(len(test)), boot.threshold)}),
                               cost_model, c=c)
    return {"monitor": name, "universe": universe, "rule": rule, "threshold": _plain(boot.threshold),
            "f": sheet["f"], "d": sheet["d"], "t_d": sheet["t_d"], "f_star": sheet["f_star"],
            "excess": _plain(boot.point), "excess_ci95": [boot.lo, boot.hi],
            "admits": bool(boot.hi is not None and boot.hi < 0),
            "never_alarms": bool(not np.isfinite(boot.threshold))}


def cost_optimal_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, limits,
                       universes: Sequence[str], c: float, cost_model: decision.CostModel, target_fa: float,
                       n_resamples: int, seed: int) -> pd.DataFrame:
    """Per monitor and universe: the threshold of least expected cost on that universe's validation rollouts,
    evaluated on its test rollouts (threshold re-selected in every resample)."""
    rows = []
    for name in names:
        for universe in universes:
            row = _cost_rule(name, scores[name], splits, limits, universe, c, cost_model, target_fa, n_resamples,
                             seeding.derive_seed(seed, stream="cost_optimal", monitor=name, universe=universe),
                             "cost_optimal")
            if row is not None:
                rows.append(row)
    return pd.DataFrame(rows)


def kappa_table(names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, limits, c: float,
                cost_model: decision.CostModel, target_fa: float, n_resamples: int, seed: int,
                kappas: Sequence[float] = KAPPAS) -> pd.DataFrame:
    """Both rules at every kappa (the per-step cost scaled with it), on the test rollouts of every condition."""
    rows = []
    for kappa in kappas:
        model = decision.CostModel(kappa=float(kappa), reset_cost=cost_model.reset_cost)
        c_k = c * float(kappa) / cost_model.kappa
        for name in names:
            for rule in ("constant", "cost_optimal"):
                row = _cost_rule(name, scores[name], splits, limits, detection.ALL_CONDITIONS, c_k, model, target_fa,
                                 n_resamples, seeding.derive_seed(seed, stream="kappa_sweep", monitor=name, rule=rule,
                                                                  kappa=str(kappa)), rule)
                if row is not None:
                    rows.append({"kappa": float(kappa), "c": c_k, **row})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- Markdown


def _cell(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "0" if abs(value) < 1e-12 else f"{value:.3g}"
    if isinstance(value, list):
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return str(value).replace("|", "\\|")


def table(frame: pd.DataFrame, columns: Sequence[str]) -> str:
    columns = [c for c in columns if c in frame.columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in frame[columns].astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    return "\n".join(lines)


def markdown(parts: Mapping[str, Any]) -> List[str]:
    """The Markdown sections of these analyses for ``summary.md``."""
    lines: List[str] = []
    trained = parts.get("trained") or {}
    if trained:
        lines += ["## Hidden-state monitors (SAFE-style: a linear probe and a sequence head)", ""]
        for name, info in trained.items():
            model = ("an L2 logistic probe; its score at a boundary is the running mean of its logits so far"
                     if name == "hidden_state_probe" else
                     f"a GRU of {info.get('hidden')} units and a linear read-out ({info.get('epochs')} full-batch "
                     "Adam steps, initial weights from the study seed's `sequence_head` stream); its score at a "
                     "boundary is the failure logit after the boundaries so far")
            lines += [f"- `{name}`: " + (f"{model}, on the policy's {info['feature_width']} features per boundary, "
                                         f"trained on {info['n_training_rollouts']} {info['trained_on']} "
                                         f"({info['n_training_failures']} failures); evaluated like every other "
                                         "monitor, and refitted without each held-out task for leave one task out."
                                         if info.get("feature_width") else info.get("reason", ""))]
        lines.append("")
    tally = parts.get("table2_tally")
    if tally is not None:
        frame = parts["table2"]
        lines += ["## RESCUE Table II: detection and timing metrics beside decision value", "",
                  "Per universe (a condition's test rollouts): End, Early and <100 steps (pooled AUC of the maximum "
                  "score over the attempt, the early window, the boundaries before step 100) and AUC-PDT admit a "
                  "monitor when their 95% interval lies above 0.5; Timely (alarm at or before the recoverability "
                  "horizon of a branch study, at the constant threshold) when its difference from a rate-matched "
                  "random alarm lies above 0; decision value when the excess cost's interval lies below 0 (vs "
                  "never intervening) or the interval of the excess-cost difference from the random alarm does "
                  "(vs random). Admitted in k of u universes:", ""]
        rows = [{"monitor": m, **v} for m, v in tally["per_monitor"].items()]
        if rows:
            lines += [table(pd.DataFrame(rows), ["monitor", "u", *TABLE2_COLUMNS, "timely_defined_in"]), ""]
        lines += [f"Detection and timing metrics admit the real monitors in {tally['detection_timing_admits']} of "
                  f"{tally['detection_timing_verdicts']} verdicts; decision value (vs never) admits them in "
                  f"{tally['decision_admits']} of {tally['decision_verdicts']}.", ""]
        pooled = frame[frame["universe"] == detection.ALL_CONDITIONS]
        if len(pooled):
            lines += ["Every condition pooled:", "",
                      table(pooled, ["monitor", "end", "early", "lt100", "auc_pdt", "timely", "timely_n", "excess",
                                     "excess_ci95", "excess_minus_random", "excess_minus_random_ci95"]), ""]
    horizons = parts.get("horizons")
    if horizons is not None and len(horizons):
        lines += ["## Predeclared fixed horizons (1/8, 1/4, 1/2 of each task's horizon)", "",
                  "Test rollouts of every condition; thresholds from clean validation successes at the target rate.",
                  "", table(horizons[horizons["condition"] == detection.ALL_CONDITIONS],
                            ["monitor", "window_max_steps", "pooled_auc", "macro_auc", "length_pooled_auc",
                             "elapsed_pooled_auc", "task_identity_pooled_auc", "false_alarm_rate", "catch_rate",
                             "mean_alarm_position_fraction"]), ""]
    loto = parts.get("loto_macro")
    if loto is not None and len(loto):
        lines += ["## Leave one task out: macro AUC over held-out tasks", "",
                  "Each task's AUC on its test rollouts (every condition); macro = the mean over tasks, a t-interval "
                  f"over tasks ({detection.TASK_INTERVAL_COVERAGE['macro']}; none below "
                  f"{detection.MIN_TASKS_FOR_INTERVAL} tasks), the SD and the range across tasks (few tasks: wide).", "",
                  table(loto, ["monitor", "window", "macro_auc", "ci95", "sd", "min", "max", "n_tasks", "per_task"]),
                  ""]
    gap = parts.get("gap")
    if gap is not None and len(gap):
        lines += ["## Pooled minus macro AUC", "",
                  "gap = w (between - within) + (within - macro); interval: "
                  f"{detection.TASK_INTERVAL_COVERAGE['gap']}; none below {detection.MIN_TASKS_FOR_INTERVAL} tasks.", "",
                  table(gap, ["monitor", "window", "pooled_auc", "macro_auc", "gap", "ci95", "term_between",
                              "term_weights", "weight_between", "n_tasks"]), ""]
    fcp = parts.get("functional_cp")
    if fcp is not None and len(fcp):
        shown = fcp[fcp["evaluation"] == detection.ALL_CONDITIONS]
        lines += ["## Functional conformal thresholds (SAFE's procedure) beside the constant threshold", "",
                  "Calibrated on clean validation successes (30/70 split, 10 splits); test rollouts of every "
                  "condition; mean over splits, SD across them (sensitivity to the calibration split).", "",
                  table(shown, ["monitor", "window", "rule", "alpha", "false_alarm_rate_mean", "false_alarm_rate_sd",
                                "catch_rate_mean", "catch_rate_sd", "effective_alarm_position_mean",
                                "finite_bands"]), ""]
        for item in parts.get("functional_cp_skipped") or []:
            lines.append(f"- not calibrated: {item}")
        if parts.get("functional_cp_skipped"):
            lines.append("")
    cost = parts.get("cost_optimal")
    if cost is not None and len(cost):
        lines += ["## Thresholds chosen to minimise expected cost", "",
                  "Chosen on each universe's validation rollouts (the threshold of least excess cost; +inf, never "
                  "intervening, when nothing is cheaper), evaluated on its test rollouts.", "",
                  table(cost[cost["universe"] == detection.ALL_CONDITIONS],
                        ["monitor", "threshold", "f", "d", "excess", "excess_ci95", "admits", "never_alarms"]), ""]
    kappa = parts.get("kappa")
    if kappa is not None and len(kappa):
        lines += ["## Sensitivity to the cost ratio kappa (every condition pooled)", "",
                  table(kappa, ["kappa", "monitor", "rule", "threshold", "f", "excess", "excess_ci95", "admits"]), ""]
    return lines


def _records(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    return [{k: _plain(v) for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def run(run_dir: Path, out: Path, names: Sequence[str], scores: Mapping[str, pd.DataFrame], splits, windows,
        conditions: Sequence[str], decisions: pd.DataFrame, target_fa: float, cost_model: decision.CostModel,
        c: float, n_resamples: int, seed: int, real: Sequence[str],
        trained: Optional[Mapping[str, Dict[str, Any]]] = None,
        trained_loto: Optional[Mapping[str, Mapping[str, pd.DataFrame]]] = None
        ) -> Tuple[Dict[str, Any], List[str], pd.DataFrame]:
    """Every analysis of the module docstring: writes its CSV tables into ``out``; returns the summary's parts
    (JSON-ready), the Markdown lines for ``summary.md`` and the functional CP table (what the report's
    ``report/monitors.py`` draws as ``figures/fcp__<window>.png``)."""
    _CACHE.clear()
    try:
        return _run(run_dir, out, names, scores, splits, windows, conditions, decisions, target_fa, cost_model, c,
                    n_resamples, seed, real, trained or {}, trained_loto or {})
    finally:
        _CACHE.clear()


def _run(run_dir, out, names, scores, splits, windows, conditions, decisions, target_fa, cost_model, c, n_resamples,
         seed, real, trained, trained_loto):
    from robocasa_shift.rundir.files import write_csv

    universes = [*conditions, detection.ALL_CONDITIONS]
    horizons = horizons_table(names, scores, splits, target_fa)
    loto = loto_macro_table(names, scores, splits, windows, trained_loto)
    gap = gap_table(names, scores, splits, windows)
    fcp, fcp_skipped = functional_cp_table(names, scores, splits, windows, target_fa, seed)
    table_ii = table2(names, scores, splits, windows, universes, decisions, branch_horizons(run_dir), target_fa,
                      n_resamples, seed)
    tally = table2_tally(table_ii, universes, real)
    cost = cost_optimal_table(names, scores, splits, windows["end"], universes, c, cost_model, target_fa,
                              n_resamples, seed)
    kappa = kappa_table(names, scores, splits, windows["end"], c, cost_model, target_fa, n_resamples, seed)
    for frame, file in ((horizons, "horizons.csv"), (loto, "loto_macro.csv"), (gap, "gap.csv"),
                        (fcp, "functional_cp.csv"), (table_ii, "table2.csv"), (cost, "cost_optimal.csv"),
                        (kappa, "kappa.csv")):
        write_csv(frame, out / file)
    parts = {"horizons": horizons, "loto_macro": loto, "gap": gap, "functional_cp": fcp,
             "functional_cp_skipped": fcp_skipped, "table2": table_ii, "table2_tally": tally, "cost_optimal": cost,
             "kappa": kappa, "trained": trained}
    pooled = lambda f, col: f[f[col] == detection.ALL_CONDITIONS] if len(f) else f  # noqa: E731
    summary = {
        "baselines": list(detection.BASELINES),
        "fixed_horizon_fractions": list(detection.FIXED_HORIZON_FRACTIONS),
        "horizons": _records(pooled(horizons, "condition")),
        "loto_macro": _records(loto),
        "gap": _records(gap),
        "functional_cp": {"alphas": list(conformal.ALPHAS), "n_splits": conformal.N_SPLITS,
                          "fit_fraction": conformal.FIT_FRACTION, "windows": list(FCP_WINDOWS),
                          "rows": _records(pooled(fcp, "evaluation")) if len(fcp) else [],
                          "not_calibrated": fcp_skipped},
        "table2": _records(table_ii), "table2_tally": tally,
        "cost_optimal": _records(cost), "kappa_sweep": {"kappas": list(KAPPAS), "rows": _records(kappa)},
        **{name: info for name, info in trained.items()},
    }
    return summary, markdown(parts), fcp


__all__ = ["KAPPAS", "branch_horizons", "cost_optimal_table", "functional_cp_table", "gap_table",
           "horizons_table", "kappa_table", "loto_macro_table", "markdown", "run", "table2", "table2_tally"]
