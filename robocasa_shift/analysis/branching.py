"""The counterfactual-branching study, read from its files: horizons, contrasts, fidelity, figures.

A branch study (``RUN_DIR/branching/<name>/``, layout in :mod:`robocasa_shift.branching`) holds a
manifest, one verdict per trunk and one file per checkpoint with the branch counts of every
intervention. Everything here is pure over those files: nothing is re-run and no simulator is
imported, so it works on a laptop with a copied study.

What it reports follows RESCUE (Sec. IV-B, Fig. 2 and 3):

- per trunk and intervention (and for the repertoire, ``combined``: the best intervention at each
  checkpoint), the recoverability horizon: the latest branched checkpoint whose estimate reaches
  ``tau``, with no assumption that recoverability falls with time; undefined when none does;
- per (task, condition): how many trunks have a recoverable checkpoint, the median horizon and its
  IQR, and the two-sided exact sign test of the recover-minus-continue horizon shift;
- where the combined horizon sits relative to the trunk's subgoals (``closes_after_steps``);
- the replay-fidelity tally (restored checkpoints that reproduced their trunk / checked) and the
  sensitivity of the counts to ``tau``.

Only checkpoints that are valid, branched and whose fidelity check passed enter an estimate; only
trunks that are valid and reproduced their stored record get a row.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.analysis import recoverability
from robocasa_shift.analysis.recoverability import (
    combined_estimate,
    jeffreys_lower,
    recoverability_horizon,
)
from robocasa_shift.core.conditions import Condition, order_conditions
from robocasa_shift.core.specs import load_protocol
from robocasa_shift.errors import AnalysisError, BadInput
from robocasa_shift.seeding import derive_seed
from robocasa_shift.rundir.files import (
    MAX_JSON_BYTES,
    atomic_write_text,
    confined,
    read_bytes,
)

KEY_FIELDS = ("phase", "task", "episode", "condition", "replicate")
# Task events a trunk records (branching/events.py): the horizon is placed relative to each of them.
EVENTS = ("grasp_attempt", "drop", "target_contact")
EVENT_TEXT = {"grasp_attempt": "the first grasp attempt", "drop": "the first drop",
              "target_contact": "the first contact with the target"}
COMBINED = "combined"
ALL_TASKS = "all"
CONTINUE, RECOVER = "continue", "recover"
# The written estimate must equal the lower Jeffreys quantile of its own k, n; hand-written
# studies round to three decimals, so the tolerance is a little above half of 0.001.
ESTIMATE_TOLERANCE = 1e-3


# --------------------------------------------------------------------------- loading


@dataclass
class BranchStudy:
    """One branch study as written on disk: the manifest, the trunk verdicts and the checkpoint files."""

    manifest: Dict[str, Any]
    trunks: List[Dict[str, Any]]
    checkpoints: List[Dict[str, Any]]
    path: Optional[Path] = None

    @property
    def settings(self) -> Dict[str, Any]:
        """The manifest's branch settings (``BranchSettings.record()``)."""
        return dict(self.manifest.get("settings") or {})

    @property
    def tau(self) -> float:
        """The primary criterion of the study (the settings' ``tau``, else the estimator's)."""
        return float(self.settings.get("tau", recoverability.TAU))

    @property
    def q(self) -> float:
        return float(self.settings.get("q", recoverability.Q))

    @property
    def taus(self) -> List[float]:
        """The criteria of the sensitivity table: the manifest's ``taus`` (else the reported ones) and ``tau``."""
        return sorted({float(t) for t in (self.settings.get("taus") or recoverability.TAUS_REPORTED)} | {self.tau})

    @property
    def interventions(self) -> List[str]:
        """The manifest's interventions in its order, then any other name a checkpoint carries (sorted)."""
        declared = _intervention_names(self.settings.get("interventions"))
        seen = {name for c in self.checkpoints for name in (c.get("interventions") or {})}
        return declared + sorted(seen - set(declared))


def _intervention_names(value: Any) -> List[str]:
    """Names from the manifest's ``interventions``: a mapping name -> spec, a list of names, or of {name: ...}."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        return [str(k) for k in value]
    names = []
    for item in value:
        names.append(str(item["name"]) if isinstance(item, Mapping) else str(item))
    return names


def _read_json(path: Path) -> Dict[str, Any]:
    try:
        data = json.loads(read_bytes(path, None, MAX_JSON_BYTES, "branch study file").decode("utf-8"))
    except RecursionError:
        raise AnalysisError(f"{path}: JSON nested too deeply") from None
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise AnalysisError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise AnalysisError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                            f"a unit that was cut off is re-run by `robocasa-shift branch` (it resumes)") from None
    if not isinstance(data, dict):
        raise AnalysisError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_key(path: Path, data: Mapping[str, Any]) -> None:
    missing = [f for f in KEY_FIELDS if f not in data]
    if missing:
        raise AnalysisError(f"{path}: missing key field(s) {', '.join(missing)}")
    for name in ("episode", "replicate"):
        if not _is_int(data[name]):
            raise AnalysisError(f"{path}: field '{name}' must be an integer, found {data[name]!r}")
    try:
        Condition.parse(data["condition"])
    except BadInput as exc:
        raise AnalysisError(f"{path}: field 'condition': {exc}") from None
    for name in ("phase", "task"):
        if not isinstance(data[name], str) or not data[name]:
            raise AnalysisError(f"{path}: field '{name}' must be a non-empty string, found {data[name]!r}")
    if not isinstance(data.get("valid"), bool):
        raise AnalysisError(f"{path}: field 'valid' must be true or false, found {data.get('valid')!r}")


def _check_trunk(path: Path, trunk: Mapping[str, Any]) -> None:
    _check_key(path, trunk)
    names, steps = trunk.get("stage_names"), trunk.get("stage_steps")
    if trunk["valid"]:
        if not isinstance(names, list) or not isinstance(steps, list) or len(names) != len(steps):
            raise AnalysisError(f"{path}: 'stage_names' and 'stage_steps' must be lists of one length")
        if any(s is not None and not _is_int(s) for s in steps):
            raise AnalysisError(f"{path}: 'stage_steps' must hold integers or null, found {steps!r}")
        first = trunk.get("first_incomplete")
        if first is not None and (not _is_int(first) or not 1 <= first <= len(names)):
            raise AnalysisError(f"{path}: 'first_incomplete' must be null or 1..{len(names)}, found {first!r}")


def _check_checkpoint(path: Path, checkpoint: Mapping[str, Any], q: float) -> None:
    _check_key(path, checkpoint)
    if not _is_int(checkpoint.get("step")) or checkpoint["step"] < 0:
        raise AnalysisError(f"{path}: field 'step' must be a non-negative integer, found {checkpoint.get('step')!r}")
    for field in ("fidelity", "zero_noise"):
        if checkpoint.get(field) is not None and not isinstance(checkpoint[field], Mapping):
            raise AnalysisError(f"{path}: '{field}' must be an object or null")
    interventions = checkpoint.get("interventions") or {}
    if not isinstance(interventions, Mapping):
        raise AnalysisError(f"{path}: 'interventions' must be an object name -> counts")
    for name, entry in interventions.items():
        if not isinstance(entry, Mapping):
            raise AnalysisError(f"{path}: intervention '{name}' must be an object with k, n, estimate")
        k, n, estimate = entry.get("k"), entry.get("n"), entry.get("estimate")
        if not (_is_int(k) and _is_int(n) and 0 <= k <= n):
            raise AnalysisError(f"{path}: intervention '{name}': need integers 0 <= k <= n, found k={k!r}, n={n!r}")
        if n == 0:
            if estimate is not None:
                raise AnalysisError(f"{path}: intervention '{name}': an estimate without branches (n=0)")
            continue
        if estimate is None:
            continue  # computed from k, n when read
        if not isinstance(estimate, (int, float)) or isinstance(estimate, bool):
            raise AnalysisError(f"{path}: intervention '{name}': 'estimate' must be a number, found {estimate!r}")
        expected = jeffreys_lower(k, n, q)
        if abs(float(estimate) - expected) > ESTIMATE_TOLERANCE:
            raise AnalysisError(f"{path}: intervention '{name}': estimate {estimate} is not the lower {q} Jeffreys "
                                f"quantile of k={k}, n={n} ({expected:.4f})")
        fixed = entry.get("fixed")
        if fixed is not None:
            fk, fn = (fixed.get("k"), fixed.get("n")) if isinstance(fixed, Mapping) else (None, None)
            if not (_is_int(fk) and _is_int(fn) and k <= fk <= fn and n <= fn and fk - k <= fn - n):
                raise AnalysisError(f"{path}: intervention '{name}': the fixed-K reference needs integers with "
                                    f"k <= fixed k <= fixed n, n <= fixed n, found {fk!r}/{fn!r} beside {k}/{n}")


def load_branch_study(branch_dir: Path | str) -> BranchStudy:
    """Read ``manifest.json``, ``trunks/**/*.json`` and ``checkpoints/**/*.json`` of one branch study.

    Raises:
        AnalysisError: the directory has no manifest, or a file is not a JSON object of its schema
            (the message names the file and the field).
    """
    branch_dir = Path(branch_dir)
    manifest_path = branch_dir / "manifest.json"
    if not manifest_path.is_file():
        raise AnalysisError(f"{branch_dir}: not a branch study (no manifest.json); "
                            f"`robocasa-shift branch` writes one under RUN_DIR/branching/<name>/")
    manifest = _read_json(manifest_path)
    study = BranchStudy(manifest=manifest, trunks=[], checkpoints=[], path=branch_dir)
    for path in sorted((branch_dir / "trunks").glob("**/*.json")):
        trunk = _read_json(path)
        _check_trunk(path, trunk)
        study.trunks.append(trunk)
    for path in sorted((branch_dir / "checkpoints").glob("**/*.json")):
        checkpoint = _read_json(path)
        _check_checkpoint(path, checkpoint, study.q)
        study.checkpoints.append(checkpoint)
    return study


# --------------------------------------------------------------------------- frames


def record_key(record: Mapping[str, Any]) -> Tuple[Any, ...]:
    return tuple(record[f] for f in KEY_FIELDS)


def _slug(text: str) -> str:
    """A condition or task as a file-name part: ':' as '-' (as the run store names records), nothing else odd."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", str(text).replace(":", "-"))


def trunk_label(record: Mapping[str, Any]) -> str:
    """The trunk's path-like name: ``phase/task/episode__condition__r<replicate>`` (as its files are named)."""
    return (f"{record['phase']}/{record['task']}/{int(record['episode']):04d}__{_slug(record['condition'])}"
            f"__r{record['replicate']}")


def _fidelity_ok(checkpoint: Mapping[str, Any]) -> bool:
    return (checkpoint.get("fidelity") or {}).get("ok") is True


def _usable(checkpoint: Mapping[str, Any]) -> bool:
    """Valid, branched and its replay reproduced the trunk: the only checkpoints an estimate may use."""
    return bool(checkpoint.get("valid")) and bool(checkpoint.get("branched")) and _fidelity_ok(checkpoint)


def _estimate(entry: Mapping[str, Any], q: float) -> Optional[float]:
    if not entry.get("n"):
        return None
    if entry.get("estimate") is not None:
        return float(entry["estimate"])
    return jeffreys_lower(int(entry["k"]), int(entry["n"]), q)


def checkpoint_frame(study: BranchStudy) -> pd.DataFrame:
    """One row per (trunk key, step, intervention) of the usable checkpoints: k, n, expanded, estimate.

    Usable: valid, branched, and its fidelity check passed (``fidelity_tally`` counts the others).
    ``invalid_branches`` counts branches that ended in an error (they are not in k or n as the
    engine counts them; shown so that a reader can see them).
    """
    rows = []
    for c in study.checkpoints:
        if not _usable(c):
            continue
        for name, entry in (c.get("interventions") or {}).items():
            branches = entry.get("branches") or []
            rows.append({**{f: c[f] for f in KEY_FIELDS}, "step": int(c["step"]), "intervention": name,
                         "k": int(entry["k"]), "n": int(entry["n"]), "expanded": bool(entry.get("expanded", False)),
                         "estimate": _estimate(entry, study.q),
                         "invalid_branches": sum(1 for b in branches if b.get("valid") is False)})
    columns = [*KEY_FIELDS, "step", "intervention", "k", "n", "expanded", "estimate", "invalid_branches"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values([*KEY_FIELDS, "step", "intervention"], kind="stable").reset_index(drop=True)


def checkpoints_by_trunk(study: BranchStudy) -> Dict[Tuple[Any, ...], List[Dict[str, Any]]]:
    out: Dict[Tuple[Any, ...], List[Dict[str, Any]]] = {}
    for c in study.checkpoints:
        out.setdefault(record_key(c), []).append(c)
    for checkpoints in out.values():
        checkpoints.sort(key=lambda c: c["step"])
    return out


def trunk_series(study: BranchStudy, trunk: Mapping[str, Any],
                 by_trunk: Optional[Mapping[Tuple[Any, ...], List[Dict[str, Any]]]] = None,
                 ) -> Tuple[List[int], Dict[str, List[Optional[float]]]]:
    """The trunk's usable checkpoint steps and, per intervention and ``combined``, the estimate at each.

    ``by_trunk`` (from one pass over the checkpoints) saves regrouping them for every trunk.
    """
    by_trunk = checkpoints_by_trunk(study) if by_trunk is None else by_trunk
    usable = [c for c in by_trunk.get(record_key(trunk), []) if _usable(c)]
    names = study.interventions
    steps = [int(c["step"]) for c in usable]
    series: Dict[str, List[Optional[float]]] = {name: [] for name in names}
    series[COMBINED] = []
    for c in usable:
        entries = c.get("interventions") or {}
        values = {name: _estimate(entries[name], study.q) if name in entries else None for name in names}
        for name in names:
            series[name].append(values[name])
        series[COMBINED].append(combined_estimate(values))
    return steps, series


def _last_latched(trunk: Mapping[str, Any], step: int) -> Tuple[Optional[str], Optional[int]]:
    """The subgoal latched last at or before ``step`` (a subgoal latched at s holds in the checkpoint at s)."""
    best: Tuple[Optional[str], Optional[int]] = (None, None)
    for name, latched in zip(trunk.get("stage_names") or [], trunk.get("stage_steps") or []):
        if latched is not None and latched <= step and (best[1] is None or latched >= best[1]):
            best = (name, int(latched))
    return best


def is_included(trunk: Mapping[str, Any]) -> bool:
    return bool(trunk.get("valid")) and trunk.get("reproduced") is True


def excluded_trunks(study: BranchStudy) -> List[Dict[str, Any]]:
    """The trunks without a row: invalid, or a re-run that did not reproduce the stored record, and why."""
    out = []
    for t in study.trunks:
        if not t.get("valid"):
            out.append({"trunk": trunk_label(t), "reason": "invalid", "detail": t.get("error_kind") or t.get("error")})
        elif t.get("reproduced") is not True:
            out.append({"trunk": trunk_label(t), "reason": "not reproduced", "detail": t.get("mismatch")})
    return out


def trunk_frame(study: BranchStudy, tau: Optional[float] = None) -> pd.DataFrame:
    """One row per valid, reproduced trunk: its horizons per intervention and combined at ``tau``.

    Columns: the key fields and ``trunk`` (its name); ``selection``, ``success``, ``steps``;
    ``first_incomplete`` and ``failed_subgoal`` (None when every subgoal latched); for each
    intervention and ``combined``: ``<name>_horizon`` (the latest recoverable usable checkpoint,
    <NA> when none) and ``<name>_recoverable``; for the combined horizon, ``last_subgoal`` and
    ``last_subgoal_step`` (the subgoal latched last at or before it) and ``closes_after_steps``
    (horizon minus that latch step; <NA> when no subgoal had latched by then); ``fidelity_ok`` and
    ``fidelity_checked`` (this trunk's checkpoints) and ``n_branched`` (checkpoints in the estimate).
    """
    tau = study.tau if tau is None else float(tau)
    names = [*study.interventions, COMBINED]
    by_trunk = checkpoints_by_trunk(study)
    rows = []
    for t in study.trunks:
        if not is_included(t):
            continue
        own = by_trunk.get(record_key(t), [])
        steps, series = trunk_series(study, t, by_trunk)
        stage_names = t.get("stage_names") or []
        first = t.get("first_incomplete")
        row: Dict[str, Any] = {**{f: t[f] for f in KEY_FIELDS}, "trunk": trunk_label(t),
                               "selection": t.get("selection"), "success": t.get("success"), "steps": t.get("steps"),
                               "first_incomplete": first,
                               "failed_subgoal": stage_names[first - 1] if first is not None else None}
        for name in names:
            horizon = recoverability_horizon(steps, series[name], tau)
            row[f"{name}_horizon"] = horizon
            row[f"{name}_recoverable"] = horizon is not None
        horizon = row[f"{COMBINED}_horizon"]
        subgoal, latched = _last_latched(t, horizon) if horizon is not None else (None, None)
        events = t.get("events") if isinstance(t.get("events"), Mapping) else {}
        for event in EVENTS:
            step = events.get(event)
            step = int(step) if _is_int(step) else None
            row[f"{event}_step"] = step
            row[f"horizon_minus_{event}"] = horizon - step if horizon is not None and step is not None else None
        row.update(last_subgoal=subgoal, last_subgoal_step=latched,
                   closes_after_steps=horizon - latched if latched is not None else None,
                   fidelity_ok=sum(_fidelity_ok(c) for c in own),
                   fidelity_checked=sum(isinstance(c.get("fidelity"), Mapping) and c["fidelity"].get("ok") is not None
                                        for c in own),
                   n_branched=len(steps))
        rows.append(row)
    columns = [*KEY_FIELDS, "trunk", "selection", "success", "steps", "first_incomplete", "failed_subgoal",
               *[f"{n}_{part}" for n in names for part in ("horizon", "recoverable")],
               "last_subgoal", "last_subgoal_step", "closes_after_steps",
               *[f"{e}_step" for e in EVENTS], *[f"horizon_minus_{e}" for e in EVENTS],
               "fidelity_ok", "fidelity_checked", "n_branched"]
    frame = pd.DataFrame(rows, columns=columns)
    for column in ("first_incomplete", "last_subgoal_step", "closes_after_steps", "steps",
                   *[f"{e}_step" for e in EVENTS], *[f"horizon_minus_{e}" for e in EVENTS],
                   *[f"{n}_horizon" for n in names]):
        frame[column] = frame[column].astype("Int64")
    for column in [f"{n}_recoverable" for n in names]:
        frame[column] = frame[column].astype(bool)
    return frame.sort_values(list(KEY_FIELDS), kind="stable").reset_index(drop=True)


def _quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    if not len(values):
        return (math.nan, math.nan, math.nan)
    q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75])
    return float(median), float(q1), float(q3)


def sign_test(shifts: Iterable[float]) -> Dict[str, Any]:
    """The two-sided exact sign test of paired shifts: zeros dropped, positives vs negatives ~ Binomial(m, 1/2).

    Returns n (pairs), median (over all pairs, zeros included), n_pos, n_neg, n_zero and p (None
    when every shift is zero or there is none).
    """
    from scipy.stats import binomtest

    values = np.asarray(list(shifts), dtype=float)
    n_pos, n_neg = int((values > 0).sum()), int((values < 0).sum())
    p = float(binomtest(n_pos, n_pos + n_neg, 0.5, alternative="two-sided").pvalue) if n_pos + n_neg else None
    return {"n": int(values.size), "median": float(np.median(values)) if values.size else None, "n_pos": n_pos,
            "n_neg": n_neg, "n_zero": int(values.size - n_pos - n_neg), "p": p}


def _condition_row(task: str, condition: str, rows: pd.DataFrame, names: Sequence[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"task": task, "condition": condition, "n_trunks": len(rows)}
    for name in names:
        horizons = rows[f"{name}_horizon"].dropna().astype(float).tolist()
        median, q1, q3 = _quartiles(horizons)
        out.update({f"{name}_recoverable": int(rows[f"{name}_recoverable"].sum()), f"{name}_median_horizon": median,
                    f"{name}_horizon_q1": q1, f"{name}_horizon_q3": q3})
    if CONTINUE in names and RECOVER in names:
        both = rows[rows[f"{CONTINUE}_horizon"].notna() & rows[f"{RECOVER}_horizon"].notna()]
        shifts = both[f"{RECOVER}_horizon"].astype(float) - both[f"{CONTINUE}_horizon"].astype(float)
        test = sign_test(shifts.tolist())
        out.update({"shift_n_both": test["n"], "shift_median": test["median"], "shift_n_pos": test["n_pos"],
                    "shift_n_neg": test["n_neg"], "shift_n_zero": test["n_zero"], "shift_p": test["p"]})
    return out


def condition_frame(trunks_df: pd.DataFrame, interventions: Sequence[str]) -> pd.DataFrame:
    """Per (task, condition), then an ``all`` row per condition across tasks, from :func:`trunk_frame`.

    Columns: ``n_trunks``; per intervention and ``combined``: ``<name>_recoverable`` (trunks with
    a recoverable checkpoint), ``<name>_median_horizon``, ``<name>_horizon_q1``/``_q3`` (over the
    trunks with a defined horizon; NaN when none). When both ``continue`` and ``recover`` are
    among ``interventions``: the recover-minus-continue horizon shift on trunks defined under both,
    ``shift_n_both``, ``shift_median``, ``shift_n_pos``, ``shift_n_neg``, ``shift_n_zero`` and
    ``shift_p`` (two-sided exact sign test, zeros dropped; None when no shift is non-zero).
    """
    names = [n for n in interventions if n != COMBINED] + [COMBINED]
    rows = []
    if not trunks_df.empty:
        conditions = order_conditions(trunks_df["condition"], load_protocol().factor_order)
        for task in sorted(trunks_df["task"].unique()):
            for condition in conditions:
                part = trunks_df[(trunks_df["task"] == task) & (trunks_df["condition"] == condition)]
                if len(part):
                    rows.append(_condition_row(task, condition, part, names))
        for condition in conditions:
            rows.append(_condition_row(ALL_TASKS, condition, trunks_df[trunks_df["condition"] == condition], names))
    columns = ["task", "condition", "n_trunks",
               *[f"{n}_{part}" for n in names
                 for part in ("recoverable", "median_horizon", "horizon_q1", "horizon_q3")]]
    if CONTINUE in names and RECOVER in names:
        columns += ["shift_n_both", "shift_median", "shift_n_pos", "shift_n_neg", "shift_n_zero", "shift_p"]
    return pd.DataFrame(rows, columns=columns)


def sensitivity_frame(study: BranchStudy) -> pd.DataFrame:
    """Recoverable counts and median horizons per (tau, task, condition) at each of ``study.taus``.

    The branch counts were expanded around the study's primary ``tau``; at another criterion an
    estimate near it may rest on the initial K branches only.
    """
    frames = []
    names = [*study.interventions, COMBINED]
    for tau in study.taus:
        frame = condition_frame(trunk_frame(study, tau), study.interventions)
        keep = ["task", "condition", "n_trunks",
                *[f"{n}_{part}" for n in names for part in ("recoverable", "median_horizon")]]
        frames.append(frame[keep].assign(tau=tau))
    if not frames:
        return pd.DataFrame()
    out = pd.concat(frames, ignore_index=True)
    return out[["tau", *[c for c in out.columns if c != "tau"]]]


def fidelity_tally(study: BranchStudy) -> Dict[str, Any]:
    """Restored checkpoints that reproduced their trunk, out of those checked, across the study.

    Also: checkpoints that are invalid (an error before or during the check), the largest qpos and
    state deviations seen over the checked ones, the failed checks (trunk and step), and how many
    trunks re-ran to their stored record.
    """
    checked = [c for c in study.checkpoints
               if isinstance(c.get("fidelity"), Mapping) and c["fidelity"].get("ok") is not None]
    failed = [c for c in checked if c["fidelity"]["ok"] is not True]

    def largest(name: str) -> Optional[float]:
        values = [float(c["fidelity"][name]) for c in checked if c["fidelity"].get(name) is not None]
        return max(values) if values else None

    return {
        "checked": len(checked), "ok": len(checked) - len(failed),
        "invalid": sum(1 for c in study.checkpoints if not c.get("valid")),
        "checkpoints": len(study.checkpoints),
        "max_qpos_dev": largest("max_qpos_dev"), "max_state_dev": largest("max_state_dev"),
        "failed": [{"trunk": trunk_label(c), "step": int(c["step"]),
                    "same_stages": c["fidelity"].get("same_stages"), "same_outcome": c["fidelity"].get("same_outcome")}
                   for c in failed],
        "trunks": len(study.trunks), "trunks_valid": sum(1 for t in study.trunks if t.get("valid")),
        "trunks_reproduced": sum(1 for t in study.trunks if is_included(t)),
        "zero_noise": zero_noise_tally(study),
    }


def zero_noise_tally(study: BranchStudy) -> Dict[str, Any]:
    """RESCUE's zero-noise known answer across the study: of the checkpoints whose replay passed fidelity,
    how many ran the check (``checked``) and how many of those Continue branches at sigma 0 reproduced their
    trunk (``ok``); the ones that did not (trunk and step)."""
    checked = [c for c in study.checkpoints if _fidelity_ok(c) and isinstance(c.get("zero_noise"), Mapping)]
    failed = [c for c in checked if c["zero_noise"].get("ok") is not True]
    return {"checked": len(checked), "ok": len(checked) - len(failed),
            "eligible": sum(1 for c in study.checkpoints if _fidelity_ok(c)),
            "failed": [{"trunk": trunk_label(c), "step": int(c["step"])} for c in failed]}


def zero_noise_line(tally: Mapping[str, Any]) -> str:
    """The summary's line for :func:`zero_noise_tally`."""
    text = (f"Zero-noise known answer: {tally['ok']}/{tally['checked']} Continue branches at sigma 0 reproduced "
            f"their trunk")
    unchecked = tally.get("eligible", tally["checked"]) - tally["checked"]
    if unchecked:
        text += f" ({unchecked} checkpoint(s) that passed fidelity have no check: written before it existed)"
    if tally.get("failed"):
        text += "; not reproduced at " + ", ".join(f"{f['trunk']} step {f['step']}" for f in tally["failed"][:5])
    return text + "."


# --------------------------------------------------------------------------- non-monotone recoverability


def antitonic_fit(k: Sequence[int], n: Sequence[int]) -> np.ndarray:
    """The non-increasing success probabilities closest to k/n (weighted least squares, weights n: the
    pool-adjacent-violators algorithm), which is also their maximum-likelihood fit under the order."""
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    blocks: List[List[float]] = []  # [sum k, sum n, count]
    for ki, ni in zip(k, n):
        blocks.append([ki, ni, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            a, b = blocks[-2], blocks.pop()
            a[0] += b[0]
            a[1] += b[1]
            a[2] += b[2]
    return np.concatenate([np.full(int(c), s / m) for s, m, c in blocks]) if blocks else np.zeros(0)


def _loglik(k: np.ndarray, n: np.ndarray, p: np.ndarray) -> float:
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(k > 0, k * np.log(p), 0.0)
        b = np.where(n - k > 0, (n - k) * np.log1p(-p), 0.0)
    return float(np.sum(a + b))


def monotone_statistic(k: Sequence[int], n: Sequence[int]) -> float:
    """The likelihood-ratio statistic of the checkpoints' own success rates against the best non-increasing
    fit, ``G = 2 (log L(k/n) - log L(antitonic fit))`` (0 when the rates already never rise)."""
    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    return max(0.0, 2.0 * (_loglik(k, n, k / n) - _loglik(k, n, antitonic_fit(k, n))))


NONMONOTONE_METHOD = (
    "likelihood-ratio statistic of the checkpoints' success rates against the best non-increasing fit; p-value "
    "conditional on the total successes: the branches' outcomes reallocated among the checkpoints at random (the "
    "checkpoints' branch counts kept), (1 + #{G* >= G}) / (n_perm + 1). At a flat recoverability, the null's least "
    "favourable edge, the outcomes are exchangeable across checkpoints, so the size is at most alpha whatever the "
    "level; the parametric bootstrap from the fitted probabilities used before rejected 0.077-0.092 of the time at "
    "nominal 0.05"
)


def monotone_statistics(k_rows: np.ndarray, n: Sequence[int]) -> np.ndarray:
    """:func:`monotone_statistic` of many count vectors at once (rows of ``k_rows``, one column per checkpoint).

    The best non-increasing fit is min over s <= i of max over t >= i of the pooled rate of checkpoints s..t (the
    min-max formula of antitonic regression), computed for every row over the m^2 stretches.
    """
    k = np.asarray(k_rows, dtype=float)
    n = np.asarray(n, dtype=float)
    m = n.size
    ck = np.concatenate([np.zeros((k.shape[0], 1)), np.cumsum(k, axis=1)], axis=1)
    cn = np.concatenate([[0.0], np.cumsum(n)])
    s, t = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    valid = s <= t
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = (ck[:, t + 1] - ck[:, s]) / np.where(valid, cn[t + 1] - cn[s], 1.0)  # (rows, s, t)
    fitted = np.empty_like(k)
    for i in range(m):
        stretch = rate[:, : i + 1, i:]  # s <= i <= t
        fitted[:, i] = stretch.max(axis=2).min(axis=1)
    return np.maximum(0.0, 2.0 * (_logliks(k, n, k / n) - _logliks(k, n, fitted)))


def _logliks(k: np.ndarray, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(k > 0, k * np.log(p), 0.0)
        b = np.where(n - k > 0, (n - k) * np.log1p(-p), 0.0)
    return (a + b).sum(axis=1)


def nonmonotone_test(k: Sequence[int], n: Sequence[int], n_perm: int = 1000, seed: int = 0) -> Dict[str, Any]:
    """Is recoverability along a trunk non-monotone (recoverable, then not, then again)?

    Null: the success probability never rises with time. The statistic is :func:`monotone_statistic`. Its
    p-value is conditional on the total number of successes (:data:`NONMONOTONE_METHOD`): under a flat
    probability, the least favourable null, every allocation of the successes among the checkpoints' branches
    is equally likely whatever the probability, so the test keeps its level exactly there; a falling
    probability only makes large statistics rarer. Exact (every allocation with its hypergeometric weight)
    where the design has at most :data:`MAX_EXACT_ALLOCATIONS` count vectors, else ``n_perm`` random
    allocations from ``numpy.random.default_rng(seed)`` (``exact`` says which).
    """
    k, n = np.asarray(k, dtype=int), np.asarray(n, dtype=int)
    g = monotone_statistic(k, n)
    fitted = antitonic_fit(k, n)
    if g <= 0:
        return {"statistic": 0.0, "p": 1.0, "fitted": fitted.tolist(), "exact": True}
    if float(np.prod(n + 1.0)) <= MAX_EXACT_ALLOCATIONS:
        rows, weights = _allocations(tuple(n.tolist()), int(k.sum()))
        stats = monotone_statistics(rows, n)
        return {"statistic": g, "p": float(min(1.0, weights[stats >= g - 1e-9].sum())), "fitted": fitted.tolist(),
                "exact": True}
    rng = np.random.default_rng(int(seed))
    outcomes = np.zeros(int(n.sum()), dtype=int)
    outcomes[:int(k.sum())] = 1
    shuffled = np.argsort(rng.random((int(n_perm), outcomes.size)), axis=1)  # a random order of the branches
    edges = np.concatenate([[0], np.cumsum(n)])
    draws = np.stack([outcomes[shuffled[:, a:b]].sum(axis=1) for a, b in zip(edges[:-1], edges[1:])], axis=1)
    exceed = int(np.sum(monotone_statistics(draws, n) >= g - 1e-9))
    return {"statistic": g, "p": (1 + exceed) / (int(n_perm) + 1), "fitted": fitted.tolist(), "exact": False}


MAX_EXACT_ALLOCATIONS = 50_000  # designs with at most this many count vectors get the exact conditional p-value


def _allocations(n: Tuple[int, ...], total: int) -> Tuple[np.ndarray, np.ndarray]:
    """Every count vector (k_1..k_m), 0 <= k_i <= n_i, summing to ``total``, with its multivariate hypergeometric
    probability prod C(n_i, k_i) / C(N, total): the null distribution given the total at any flat probability."""
    grids = np.meshgrid(*[np.arange(v + 1) for v in n], indexing="ij")
    rows = np.stack([g.ravel() for g in grids], axis=1)
    rows = rows[rows.sum(axis=1) == total]
    log_c = np.array([[math.lgamma(v + 1) - math.lgamma(j + 1) - math.lgamma(v - j + 1) for j in range(max(n) + 1)]
                      for v in n])
    log_w = sum(log_c[i][rows[:, i]] for i in range(len(n)))
    whole = math.lgamma(sum(n) + 1) - math.lgamma(total + 1) - math.lgamma(sum(n) - total + 1)
    return rows, np.exp(log_w - whole)


def nonmonotone_exact_size(n: Sequence[int], probabilities: Sequence[float], alpha: float = 0.05) -> Dict[float, float]:
    """The exact rejection rate of :func:`nonmonotone_test` at a flat success probability, for each of
    ``probabilities``, by enumerating every outcome of a design with exact p-values (at most
    :data:`MAX_EXACT_ALLOCATIONS` count vectors)."""
    n = tuple(int(v) for v in n)
    if float(np.prod(np.asarray(n) + 1.0)) > MAX_EXACT_ALLOCATIONS:
        raise AnalysisError(f"{n}: too many outcomes to enumerate")
    grids = np.meshgrid(*[np.arange(v + 1) for v in n], indexing="ij")
    rows = np.stack([g.ravel() for g in grids], axis=1)
    stats = monotone_statistics(rows, n)
    totals = rows.sum(axis=1)
    rejects = np.zeros(len(rows), dtype=bool)
    log_c = sum(np.array([math.lgamma(v + 1) - math.lgamma(j + 1) - math.lgamma(v - j + 1) for j in rows[:, i]])
                for i, v in enumerate(n))
    for total in np.unique(totals):
        members = np.flatnonzero(totals == total)
        _, weights = _allocations(n, int(total))  # same order: the rows of this total, as enumerated
        g = stats[members]
        p_values = np.array([weights[g >= value - 1e-9].sum() for value in g])
        rejects[members] = (g > 0) & (p_values <= alpha + 1e-12)
    out = {}
    for p in probabilities:
        log_p = log_c + totals * math.log(p) + (sum(n) - totals) * math.log1p(-p)
        out[float(p)] = float(np.exp(log_p)[rejects].sum())
    return out


def nonmonotone_size(p: Sequence[float], n: Sequence[int], alpha: float = 0.05, trunks: int = 2000,
                     n_perm: int = 400, seed: int = 0) -> Dict[str, Any]:
    """The share of simulated trunks (true success probabilities ``p`` per checkpoint, ``n`` branches each) that
    :func:`nonmonotone_test` calls non-monotone at ``alpha``, with its Monte Carlo standard error."""
    rng = np.random.default_rng(int(seed))
    counts = rng.binomial(np.asarray(n)[None, :], np.asarray(p, dtype=float)[None, :], size=(trunks, len(n)))
    rejected = sum(nonmonotone_test(row, n, n_perm, seed=i)["p"] <= alpha for i, row in enumerate(counts))
    rate = rejected / trunks
    return {"p": list(map(float, p)), "n": list(map(int, n)), "alpha": alpha, "rejection_rate": rate,
            "standard_error": float(np.sqrt(max(rate * (1 - rate), 1e-12) / trunks)), "trunks": trunks}


def _counts(entry: Mapping[str, Any]) -> Tuple[int, int, str]:
    """(k, n, source) of an intervention's entry: the fixed-K reference when it has one, else the adaptive set."""
    fixed = entry.get("fixed")
    if isinstance(fixed, Mapping) and fixed.get("n"):
        return int(fixed["k"]), int(fixed["n"]), "fixed K"
    return int(entry["k"]), int(entry["n"]), "adaptive"


def has_pattern(verdicts: Sequence[bool]) -> bool:
    """Recoverable, then not, then recoverable again (in time order)."""
    seen_true = seen_gap = False
    for v in verdicts:
        if v and seen_gap:
            return True
        if v:
            seen_true = True
        elif seen_true:
            seen_gap = True
    return False


def nonmonotone_frame(study: BranchStudy, tau: Optional[float] = None, n_perm: int = 1000, seed: int = 0,
                      alpha: float = 0.05) -> pd.DataFrame:
    """Per reproduced trunk and intervention with at least three usable checkpoints: the pattern (a recoverable
    checkpoint, a later one that is not, a later one that is again, at ``tau``) and the test of
    :func:`nonmonotone_test` on the branch counts (the fixed-K reference's where it exists), ``significant``
    at ``alpha``."""
    tau = study.tau if tau is None else float(tau)
    by_trunk = checkpoints_by_trunk(study)
    rows = []
    for t in study.trunks:
        if not is_included(t):
            continue
        usable = [c for c in by_trunk.get(record_key(t), []) if _usable(c)]
        for name in study.interventions:
            cells = [(int(c["step"]), c["interventions"][name]) for c in usable if name in (c.get("interventions") or {})]
            if len(cells) < 3:
                continue
            counts = [_counts(e) for _, e in cells]
            estimates = [_estimate(e, study.q) for _, e in cells]
            test = nonmonotone_test([c[0] for c in counts], [c[1] for c in counts], n_perm,
                                    derive_seed(seed, stream="nonmonotone", trunk=trunk_label(t), intervention=name))
            rows.append({"trunk": trunk_label(t), "task": t["task"], "condition": t["condition"], "intervention": name,
                         "n_checkpoints": len(cells), "counts_from": ", ".join(sorted({c[2] for c in counts})),
                         "steps": [s for s, _ in cells], "k": [c[0] for c in counts], "n": [c[1] for c in counts],
                         "pattern": has_pattern([e is not None and e >= tau for e in estimates]),
                         "statistic": test["statistic"], "p": test["p"], "significant": bool(test["p"] < alpha)})
    columns = ["trunk", "task", "condition", "intervention", "n_checkpoints", "counts_from", "steps", "k", "n",
               "pattern", "statistic", "p", "significant"]
    return pd.DataFrame(rows, columns=columns)


def nonmonotone_summary(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per intervention: trunks tested, with the pattern, significantly non-monotone."""
    out = []
    for name, part in frame.groupby("intervention", sort=False):
        out.append({"intervention": name, "trunks": int(len(part)), "pattern": int(part["pattern"].sum()),
                    "significant": int(part["significant"].sum()),
                    "text": f"{name}: {int(part['significant'].sum())}/{len(part)} trunks significantly non-monotone "
                            f"(p < 0.05), {int(part['pattern'].sum())}/{len(part)} recoverable, then not, then again"})
    return out


# --------------------------------------------------------------------------- fixed-K agreement


def fixed_k_frame(study: BranchStudy, tau: Optional[float] = None) -> pd.DataFrame:
    """Per usable checkpoint and intervention with a fixed-K reference: the adaptive rule's verdict
    (recoverable when its estimate reaches ``tau``) and the reference's (the same estimator on the K branches),
    and whether they agree."""
    tau = study.tau if tau is None else float(tau)
    rows = []
    for c in study.checkpoints:
        if not _usable(c):
            continue
        for name, entry in (c.get("interventions") or {}).items():
            fixed = entry.get("fixed")
            if not isinstance(fixed, Mapping) or not fixed.get("n"):
                continue
            adaptive = _estimate(entry, study.q)
            reference = jeffreys_lower(int(fixed["k"]), int(fixed["n"]), study.q)
            rows.append({"trunk": trunk_label(c), "task": c["task"], "condition": c["condition"], "step": int(c["step"]),
                         "intervention": name, "k": int(entry["k"]), "n": int(entry["n"]), "estimate": adaptive,
                         "k_fixed": int(fixed["k"]), "n_fixed": int(fixed["n"]), "estimate_fixed": reference,
                         "recoverable": bool(adaptive >= tau), "recoverable_fixed": bool(reference >= tau),
                         "agree": bool((adaptive >= tau) == (reference >= tau))})
    columns = ["trunk", "task", "condition", "step", "intervention", "k", "n", "estimate", "k_fixed", "n_fixed",
               "estimate_fixed", "recoverable", "recoverable_fixed", "agree"]
    return pd.DataFrame(rows, columns=columns)


def operating_characteristic_rows(study: BranchStudy, tau: Optional[float] = None) -> List[Dict[str, Any]]:
    """:func:`recoverability.operating_characteristic` at the study's settings for p = 0.1 .. 0.9."""
    settings = study.settings
    tau = study.tau if tau is None else float(tau)
    k_initial = int(settings.get("k_initial", recoverability.K_INITIAL))
    k_expanded = int(settings.get("k_expanded", recoverability.K_EXPANDED))
    k_fixed = int(settings.get("k_fixed") or 32)
    return [{**recoverability.operating_characteristic(p, tau, study.q, k_initial, k_expanded, k_fixed),
             "tau": tau, "k_initial": k_initial, "k_expanded": k_expanded, "k_fixed": k_fixed}
            for p in recoverability.OC_PROBABILITIES]


def fixed_k_summary(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per intervention: checkpoints compared and disagreements, and per trunk whether "any recoverable
    checkpoint" and the horizon (latest recoverable checkpoint) change under the reference."""
    out = []
    for name, part in frame.groupby("intervention", sort=False):
        trunks = part.groupby("trunk", sort=False)
        any_changed = horizon_moved = 0
        for _, rows in trunks:
            adaptive = recoverability_horizon(rows["step"].tolist(), [1.0 if r else 0.0 for r in rows["recoverable"]], 0.5)
            fixed = recoverability_horizon(rows["step"].tolist(), [1.0 if r else 0.0 for r in rows["recoverable_fixed"]],
                                           0.5)
            any_changed += int((adaptive is None) != (fixed is None))
            horizon_moved += int(adaptive != fixed)
        disagree = int((~part["agree"]).sum())
        # where the reference saw every branch fail (or succeed), the two rules cannot disagree: agreement there
        # says nothing, so it is counted apart
        informative = part[(part["k_fixed"] > 0) & (part["k_fixed"] < part["n_fixed"])]
        informative_disagree = int((~informative["agree"]).sum())
        out.append({"intervention": name, "checkpoints": int(len(part)), "disagree": disagree,
                    "disagree_rate": disagree / len(part) if len(part) else None,
                    "informative": int(len(informative)), "informative_disagree": informative_disagree,
                    "trunks": int(trunks.ngroups),
                    "any_recoverable_changed": any_changed, "horizon_moved": horizon_moved,
                    "text": f"{name}: the adaptive rule disagrees with fixed K = {int(part['n_fixed'].max())} on "
                            f"{disagree}/{len(part)} checkpoints, {informative_disagree}/{len(informative)} of those "
                            f"where the reference saw both outcomes (0 < k < K; elsewhere they cannot disagree); "
                            f"'any recoverable checkpoint' changes on {any_changed}/{trunks.ngroups} trunks, the "
                            f"horizon moves on {horizon_moved}"})
    return out


# --------------------------------------------------------------------------- horizons relative to task events


def event_summary(trunks_df: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per (task, condition) and event: over the trunks with both a combined horizon and the event, the median
    of horizon minus event step (positive: the horizon comes after the event) and a sentence."""
    out = []
    if trunks_df.empty:
        return out
    for (task, condition), part in trunks_df.groupby(["task", "condition"], sort=True):
        for event in EVENTS:
            values = part[f"horizon_minus_{event}"].dropna().astype(float)
            events = int(part[f"{event}_step"].notna().sum())
            if not len(values):
                out.append({"task": task, "condition": condition, "event": event, "n": 0, "trunks_with_event": events,
                            "median": None, "text": f"{task}, {condition}: {EVENT_TEXT[event]} happens on {events} of "
                                                    f"{len(part)} trunks; no recoverable horizon beside it"})
                continue
            median = float(values.median())
            where = "after" if median >= 0 else "before"
            out.append({"task": task, "condition": condition, "event": event, "n": int(len(values)),
                        "trunks_with_event": events, "median": median,
                        "text": f"{task}, {condition}: the horizon comes a median {abs(median):g} steps {where} "
                                f"{EVENT_TEXT[event]} ({len(values)} trunk{'s' if len(values) != 1 else ''} with both)"})
    return out


# --------------------------------------------------------------------------- expected cost per (state, intervention)


STOP = "stop"


def workload_costs(records: Sequence[Mapping[str, Any]], kappa: float = 0.1, reset_cost: float = 1.0,
                   phase: str = "formal") -> Dict[Tuple[str, str], Dict[str, Any]]:
    """The renewal model's prices per (task, condition) workload, from a run's valid records of ``phase``.

    ``c`` (per step) makes the task's median clean success cost ``kappa`` resets; ``A`` is the expected cost
    to eventual completion from a fresh attempt of that workload, never intervening:
    ``(p (R + c T_f) + (1 - p) c T_s) / (1 - p)`` with the cell's failure rate and mean lengths (None when
    nothing in it succeeds). RESCUE Sec. III-C.
    """
    valid = [r for r in records if r.get("valid") and r.get("phase") == phase and r.get("success") is not None]
    out: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for task in sorted({r["task"] for r in valid}):
        clean = [int(r["steps"]) for r in valid if r["task"] == task and r["condition"] == "clean" and r["success"]]
        mine = [r for r in valid if r["task"] == task]
        if not clean:
            clean = [int(r["steps"]) for r in mine if r["success"]]
        c = kappa * reset_cost / float(np.median(clean)) if clean else None
        for condition in sorted({r["condition"] for r in mine}):
            cell = [r for r in mine if r["condition"] == condition]
            steps = np.array([float(r["steps"]) for r in cell])
            ok = np.array([bool(r["success"]) for r in cell])
            A = None
            if c is not None and ok.any():
                A = float((c * steps.sum() + reset_cost * (~ok).sum()) / ok.sum())
            out[(task, condition)] = {"c": c, "A": A, "p": float((~ok).mean()), "n": len(cell), "kappa": kappa,
                                      "reset_cost": reset_cost}
    return out


def cost_frame(study: BranchStudy, workload: Mapping[Tuple[str, str], Mapping[str, Any]]) -> pd.DataFrame:
    """Expected cost to eventual completion of every (usable checkpoint, intervention), and of stopping.

    ``Q(s_t, a) = mean over a's branches of c L + (R + A) [failed]`` with ``L`` the steps a branch ran after
    the checkpoint (a failed branch runs to its budget, then resets and starts a fresh attempt, which costs
    ``A`` in expectation); ``Q(s_t, stop) = R + A``. The cost already incurred, ``c t``, is common to every
    choice at the checkpoint and left out (RESCUE Sec. III-C). ``best`` is the cheapest. None where the
    workload's price is unknown (no run records, or nothing of it succeeded).
    """
    names = study.interventions
    rows = []
    for c in study.checkpoints:
        if not _usable(c):
            continue
        price = workload.get((c["task"], c["condition"])) or {}
        per_step, A, R = price.get("c"), price.get("A"), price.get("reset_cost", 1.0)
        row: Dict[str, Any] = {"trunk": trunk_label(c), "task": c["task"], "condition": c["condition"],
                               "step": int(c["step"]), f"Q_{STOP}": (R + A) if A is not None else None}
        for name in names:
            entry = (c.get("interventions") or {}).get(name)
            branches = [b for b in (entry or {}).get("branches") or [] if b.get("valid", True)]
            if not branches or per_step is None or A is None:
                row[f"Q_{name}"] = None
                continue
            costs = [per_step * (int(b["steps"]) - int(c["step"])) + (0.0 if b["success"] else R + A) for b in branches]
            row[f"Q_{name}"] = float(np.mean(costs))
        options = {k[2:]: v for k, v in row.items() if k.startswith("Q_") and v is not None}
        row["best"] = min(options, key=lambda k: (options[k], k != STOP)) if options else None
        rows.append(row)
    columns = ["trunk", "task", "condition", "step", *[f"Q_{n}" for n in names], f"Q_{STOP}", "best"]
    return pd.DataFrame(rows, columns=columns)


def cost_summary(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per (task, condition): checkpoints priced, and how often each action is the cheapest."""
    out = []
    if frame.empty:
        return out
    for (task, condition), part in frame.groupby(["task", "condition"], sort=True):
        priced = part[part["best"].notna()]
        counts = {str(k): int(v) for k, v in priced["best"].value_counts().items()}
        out.append({"task": task, "condition": condition, "checkpoints": int(len(part)), "priced": int(len(priced)),
                    "best": counts,
                    "text": f"{task}, {condition}: cheapest action over {len(priced)} priced checkpoints: "
                            + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none")})
    return out


# --------------------------------------------------------------------------- outputs


def figure_name(task: str, condition: str) -> str:
    """``<task>__<condition>.png`` with ':' as '-' (as the run store names records)."""
    return f"{_slug(task)}__{_slug(condition)}.png"


def _json_value(value: Any) -> Any:
    """A frame cell as JSON: NaN, NA and None as null, numpy scalars as Python numbers."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, dict):
        return {k: _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return value


def _records(frame: pd.DataFrame) -> List[Dict[str, Any]]:
    return [{k: _json_value(v) for k, v in row.items()} for row in frame.astype(object).to_dict("records")]


def closing_sentences(trunks_df: pd.DataFrame) -> List[Dict[str, Any]]:
    """Per (task, condition) and subgoal: the median of ``closes_after_steps`` over its trunks, and a sentence."""
    out = []
    if trunks_df.empty:
        return out
    for (task, condition), part in trunks_df.groupby(["task", "condition"], sort=True):
        defined = part[part[f"{COMBINED}_horizon"].notna()]
        for subgoal, group in defined[defined["last_subgoal"].notna()].groupby("last_subgoal", sort=True):
            values = group["closes_after_steps"].astype(float)
            median = float(values.median())
            out.append({"task": task, "condition": condition, "subgoal": subgoal, "n": len(group), "median": median,
                        "text": f"{task}, {condition}: recovery closes {median:g} steps after {subgoal} latched "
                                f"(median over {len(group)} trunk{'s' if len(group) != 1 else ''})"})
        before = int(defined["last_subgoal"].isna().sum())
        if before:
            out.append({"task": task, "condition": condition, "subgoal": None, "n": before, "median": None,
                        "text": f"{task}, {condition}: on {before} trunk{'s' if before != 1 else ''} the horizon "
                                f"comes before any subgoal latched"})
        never = int((~part[f"{COMBINED}_recoverable"]).sum())
        if never:
            out.append({"task": task, "condition": condition, "subgoal": None, "n": never, "median": None,
                        "text": f"{task}, {condition}: {never} of {len(part)} trunks have no recoverable checkpoint "
                                f"under any intervention"})
    return out


def _md_cell(value: Any) -> str:
    value = _json_value(value)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1 and value != 0 else f"{value:g}"
    return str(value).replace("|", "\\|")


def markdown_table(frame: pd.DataFrame, columns: Optional[Sequence[str]] = None) -> str:
    """A frame as a Markdown table (no extra dependency); missing values as '-'."""
    columns = list(frame.columns if columns is None else columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in frame[columns].astype(object).itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
    return "\n".join(lines)


def condition_display(conditions: pd.DataFrame, interventions: Sequence[str]) -> pd.DataFrame:
    """The per-condition frame as short display strings: ``k/N`` recoverable, ``median (q1-q3)``, the sign test."""
    names = [*[n for n in interventions if n != COMBINED], COMBINED]
    rows = []
    for row in conditions.astype(object).to_dict("records"):
        out = {"task": row["task"], "condition": row["condition"], "trunks": row["n_trunks"]}
        for name in names:
            median = _json_value(row[f"{name}_median_horizon"])
            out[f"{name}: recoverable"] = f"{row[f'{name}_recoverable']}/{row['n_trunks']}"
            out[f"{name}: median horizon (IQR)"] = "-" if median is None else \
                f"{median:g} ({row[f'{name}_horizon_q1']:g}-{row[f'{name}_horizon_q3']:g})"
        if "shift_p" in row:
            shift, p = _json_value(row["shift_median"]), _json_value(row["shift_p"])
            out["recover - continue: median shift"] = "-" if shift is None else f"{shift:+g}"
            out["shifts + / - / 0"] = f"{row['shift_n_pos']} / {row['shift_n_neg']} / {row['shift_n_zero']}"
            out["sign test p"] = "-" if p is None else f"{p:.3g}"
        rows.append(out)
    return pd.DataFrame(rows)


def _settings_text(manifest: Mapping[str, Any]) -> List[str]:
    lines = []
    for key, value in manifest.items():
        if key == "interventions":
            value = ", ".join(_intervention_names(value))
        elif isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        lines.append(f"- **{key}**: {value}")
    return lines


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """``summary.md``: settings, the fidelity tally, per-condition and per-trunk tables, tau sensitivity."""
    tally = summary["fidelity"]
    names = [*summary["interventions"], COMBINED]
    conditions = pd.DataFrame(summary["conditions"])
    trunks = pd.DataFrame(summary["trunks"])
    lines = [f"# Counterfactual branching: {summary['name']}", "", *_settings_text(summary["settings"]), "",
             "## Replay fidelity", "",
             f"{tally['ok']}/{tally['checked']} restored checkpoints reproduced their trunk "
             f"(largest qpos deviation {_md_cell(tally['max_qpos_dev'])}, largest state deviation "
             f"{_md_cell(tally['max_state_dev'])}); {tally['invalid']} checkpoint(s) invalid. "
             f"{tally['trunks_reproduced']} of {tally['trunks']} trunks are valid and re-ran to their stored "
             f"record.", "", zero_noise_line(tally["zero_noise"]), ""]
    lines += ["## Per condition", "",
              f"At tau = {summary['tau']:g} (estimate: lower {summary['q']:g} Jeffreys quantile). Recoverable: trunks "
              f"with at least one recoverable checkpoint; horizons over those trunks (median, IQR q1-q3).", ""]
    if not conditions.empty:
        lines += [markdown_table(condition_display(conditions, summary["interventions"])), ""]
    if summary["closing"]:
        lines += [f"- {s['text']}" for s in summary["closing"]] + [""]
    lines += ["## Per trunk", ""]
    if not trunks.empty:
        columns = ["trunk", "selection", "failed_subgoal", *[f"{n}_horizon" for n in names], "last_subgoal",
                   "closes_after_steps", "fidelity_ok", "fidelity_checked"]
        lines += [markdown_table(trunks, columns), ""]
    if summary["excluded_trunks"]:
        lines += ["Trunks left out:", ""]
        lines += [f"- {e['trunk']}: {e['reason']}" + (f" ({e['detail']})" if e["detail"] else "")
                  for e in summary["excluded_trunks"]] + [""]
    lines += _study_sections(summary)
    lines += ["## Sensitivity to tau", "",
              "Checkpoints were expanded to more branches around the primary tau only.", ""]
    sensitivity = pd.DataFrame(summary["sensitivity"])
    if not sensitivity.empty:
        lines += [markdown_table(sensitivity), ""]
    if summary["figures"]:
        lines += ["## Figures", ""] + [f"- `{f['file']}`: {f['task']}, {f['condition']}" for f in summary["figures"]]
    return "\n".join(lines) + "\n"


def extended_outputs(study: BranchStudy, trunks: pd.DataFrame, tau: float,
                     workload: Mapping[Tuple[str, str], Mapping[str, Any]]) -> Dict[str, Any]:
    """The summary's parts beyond horizons: non-monotone recoverability, the fixed-K agreement, horizons
    relative to task events and the expected cost of every (checkpoint, intervention)."""
    monotone = nonmonotone_frame(study, tau)
    fixed = fixed_k_frame(study, tau)
    costs = cost_frame(study, workload)
    return {
        "nonmonotone": {"summary": nonmonotone_summary(monotone), "trunks": _records(monotone),
                        "definition": "per trunk and intervention (three or more checkpoints): the pattern "
                                      "recoverable, then not, then again at tau; and a likelihood-ratio test of the "
                                      "branch counts against the best non-increasing success probability "
                                      "(p-value conditional on the total successes, exact in level at a flat "
                                      "recoverability; fixed-K counts where they exist)", "method": NONMONOTONE_METHOD},
        "fixed_k": {"summary": fixed_k_summary(fixed), "checkpoints": _records(fixed),
                    "operating_characteristic": operating_characteristic_rows(study, tau)},
        "events": {"summary": event_summary(trunks),
                   "definitions": {e: EVENT_TEXT[e] for e in EVENTS},
                   "trunks_with_events": int(sum(isinstance(t.get("events"), Mapping) and "error" not in t["events"]
                                                 for t in study.trunks if is_included(t)))},
        "expected_cost": {"summary": cost_summary(costs), "checkpoints": _records(costs),
                          "workload": [{"task": k[0], "condition": k[1], **v} for k, v in sorted(workload.items())],
                          "definition": "Q(s_t, a) = mean over a's branches of c L + (R + A) [failed]; Q(s_t, stop) "
                                        "= R + A; c t (already spent) left out (RESCUE Sec. III-C)"},
    }


def _study_sections(summary: Mapping[str, Any]) -> List[str]:
    """Markdown of :func:`extended_outputs`."""
    lines: List[str] = []
    monotone = summary.get("nonmonotone") or {}
    lines += ["## Non-monotone recoverability", "", str(monotone.get("definition", "")) + ".", ""]
    lines += [f"- {s['text']}" for s in monotone.get("summary") or []] or ["- no trunk with three usable checkpoints"]
    lines.append("")
    fixed = summary.get("fixed_k") or {}
    lines += ["## Adaptive K against a fixed-K reference", ""]
    lines += [f"- {s['text']}" for s in fixed.get("summary") or []] or [
        "- no fixed-K reference in this study (run `branch ... --k-fixed 32`)"]
    rows = fixed.get("operating_characteristic") or []
    if rows:
        first = rows[0]
        lines += ["", f"Operating characteristic, exact: P(recoverable) at a true success probability p under the "
                      f"adaptive rule ({first['k_initial']} branches, {first['k_expanded']} when the central 50% "
                      f"interval straddles tau = {first['tau']:g}) and under a fixed {first['k_fixed']}, and P(they "
                      f"disagree) when the fixed reference reuses the adaptive branches:", "",
                  "| p | adaptive | fixed K | disagree | expanded |", "|---|---|---|---|---|"]
        lines += [f"| {r['p']:.1f} | {r['adaptive']:.3f} | {r['fixed']:.3f} | {r['disagree']:.3f} | {r['expanded']:.3f} |"
                  for r in rows]
    lines.append("")
    events = summary.get("events") or {}
    lines += ["## Horizons relative to task events", "",
              f"{events.get('trunks_with_events', 0)} trunks recorded their events (first grasp attempt, first drop, "
              "first contact with the target; from the trunk's actions and simulator predicates).", ""]
    lines += [f"- {s['text']}" for s in events.get("summary") or []]
    lines.append("")
    cost = summary.get("expected_cost") or {}
    lines += ["## Expected cost per (checkpoint, intervention)", "", str(cost.get("definition", "")) + ".", ""]
    lines += [f"- {s['text']}" for s in cost.get("summary") or []] or ["- no priced checkpoint"]
    rows = pd.DataFrame(cost.get("checkpoints") or [])
    if not rows.empty:
        lines += ["", markdown_table(rows.drop(columns=["task", "condition"]))]
    lines.append("")
    return lines


# (study, branch_dir, tau) -> [{"task", "condition", "file"}]: draws the figures (report/branching.py)
FigureWriter = Callable[["BranchStudy", Path, float], List[Dict[str, Any]]]


def write_outputs(branch_dir: Path | str, tau: Optional[float] = None,
                  workload: Optional[Mapping[Tuple[str, str], Mapping[str, Any]]] = None,
                  figures: Optional[FigureWriter] = None) -> Dict[str, Any]:
    """Write ``summary.json`` and ``summary.md`` into ``branch_dir``, and the figures ``figures`` draws (the report's
    ``report/branching.py``: ``figures/<task>__<condition>.png``; None: no figure, this module draws none).

    ``workload`` prices the expected costs (:func:`workload_costs`); None: from the records of the run the
    study lies in (``RUN_DIR/branching/<name>``), when it lies in one.

    Returns:
        The summary written to ``summary.json`` (settings, fidelity tally, per-trunk, per-condition
        and sensitivity rows, closing sentences, figure files; missing values as null).
    """
    branch_dir = Path(branch_dir)
    # below the run directory (or the study's folder) nothing is read or written through a symbolic link
    with confined(branch_dir.parent.parent if branch_dir.parent.name == "branching" else branch_dir):
        if workload is None and branch_dir.parent.name == "branching":
            workload = _run_workload(branch_dir.parent.parent)
        return _write_outputs(branch_dir, tau, workload or {}, figures)


def _run_workload(run_dir: Path) -> Dict[Tuple[str, str], Dict[str, Any]]:
    """:func:`workload_costs` of the run's records ({} when it is not a run directory)."""
    from robocasa_shift.rundir.store import RunStore

    store = RunStore(run_dir)
    if store.manifest() is None:
        return {}
    return workload_costs(store.records())


def _write_outputs(branch_dir: Path, tau: Optional[float], workload: Mapping[Tuple[str, str], Mapping[str, Any]],
                   figures: Optional[FigureWriter]) -> Dict[str, Any]:
    study = load_branch_study(branch_dir)
    tau = study.tau if tau is None else float(tau)
    trunks = trunk_frame(study, tau)
    conditions = condition_frame(trunks, study.interventions)
    summary = {
        "name": branch_dir.name,
        "settings": _json_value({**study.settings, "selection": study.manifest.get("selection")}),
        "interventions": study.interventions,
        "tau": tau, "q": study.q, "taus": study.taus,
        "fidelity": fidelity_tally(study),
        "excluded_trunks": excluded_trunks(study),
        "trunks": _records(trunks),
        "conditions": _records(conditions),
        "closing": closing_sentences(trunks),
        "sensitivity": _records(sensitivity_frame(study)),
        **extended_outputs(study, trunks, tau, workload),
        "figures": figures(study, branch_dir, tau) if figures is not None else [],
    }
    # allow_nan=False: a NaN that slipped through is a bug, not a number to publish.
    atomic_write_text(branch_dir / "summary.json", json.dumps(summary, indent=2, allow_nan=False) + "\n")
    atomic_write_text(branch_dir / "summary.md", summary_markdown(summary))
    return summary


__all__ = ["ALL_TASKS", "COMBINED", "EVENTS", "BranchStudy", "antitonic_fit", "checkpoint_frame", "closing_sentences",
           "condition_display", "cost_frame", "cost_summary", "event_summary", "extended_outputs", "fixed_k_frame",
           "fixed_k_summary", "has_pattern", "operating_characteristic_rows", "monotone_statistic", "nonmonotone_frame", "nonmonotone_summary",
           "nonmonotone_exact_size", "nonmonotone_size", "nonmonotone_test", "workload_costs",
           "condition_frame",
           "excluded_trunks", "figure_name", "fidelity_tally", "FigureWriter", "load_branch_study", "markdown_table",
           "sensitivity_frame", "sign_test", "summary_markdown", "trunk_frame", "trunk_label",
           "trunk_series", "write_outputs", "zero_noise_line", "zero_noise_tally"]
