"""Every measure of PROTOCOL.md section 7, as pure functions over a records table.

The input is the records table of DESIGN.md ("Records table"): one row per
rollout, from this project's ``export`` or from anywhere else. Nothing here
imports a simulator, so the analysis runs wherever pandas and numpy do.

Measures (PROTOCOL.md section 7), all from rows of one phase:

- SR(t, c) = successes / valid rollouts of task t under condition c.
- A pair is the clean and the perturbed rollout of one (task, episode,
  replicate); only valid pairs (both rollouts valid) enter paired measures.
  dSR(t, c) = SR of the clean members - SR of the perturbed members over the
  valid pairs (positive = degradation).
- Macro = equal-weight mean of the task-level values (never pooled).
- 95% CI of macro dSR: pair-level bootstrap, pairs resampled with
  replacement within each task, macro recomputed per resample, percentile
  interval with linear interpolation (``numpy.quantile``).
- Transitions SS / SF / FS / FF (clean outcome first), changed = SF + FS.
- Stage-aware measures over strictly matched S->F pairs, pooled over tasks;
  pairs whose perturbed rollout has a StageTracker error are left out of
  these (and only these).

Beyond the paper, the summary also holds exact McNemar tests (Holm-adjusted
across conditions), Wilson intervals for every success rate, per-task dSR
intervals, bootstrap intervals for the stage measures and a clean-vs-clean
noise floor (from replicate-1 clean rollouts, when the table has them).

Every measure except the noise floor uses replicate 0, so SR and dSR are
computed on the same rollouts.
"""

from __future__ import annotations

import json
import math
import numbers
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.errors import AnalysisError

CLEAN = "clean"
REQUIRED_COLUMNS = ("task", "episode", "condition", "success", "n_stages", "stages_completed", "first_incomplete")
OPTIONAL_DEFAULTS: Dict[str, Any] = {
    "valid": True,
    "phase": "formal",
    "replicate": 0,
    "spec_hash": None,
    "stage_error": False,
}
KEY_COLUMNS = ("phase", "task", "episode", "condition", "replicate")
# Display order of the factors (PROTOCOL.md section 1; the `factors` list of
# perturbations/study.yaml). It only orders the output; unknown factors follow, sorted.
DEFAULT_FACTOR_ORDER = ("illumination", "camera", "base", "blur")
PAIRED_REPLICATE = 0
NOISE_REPLICATE = 1
# Two-sided 95%: the 0.975 quantile of the standard normal.
WILSON_Z = 1.959963984540054
CI_QUANTILES = (0.025, 0.975)
COMPLETE = "complete"
TRANSITIONS = ("SS", "SF", "FS", "FF")

_CONDITION_RE = re.compile(r"^(?P<factor>[A-Za-z0-9_.\-]+):L(?P<level>[0-9]+)$")
_TRUE_STRINGS = {"true", "1", "1.0"}
_FALSE_STRINGS = {"false", "0", "0.0"}

# --------------------------------------------------------------------------- loading and normalizing


def _is_missing(value: Any) -> bool:
    if value is None or value is pd.NA:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return isinstance(value, str) and value.strip() == ""


def _parse_bool(value: Any, column: str) -> Optional[bool]:
    """One cell as True / False / None (missing); anything else raises AnalysisError."""
    if _is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Number) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE_STRINGS:
            return True
        if text in _FALSE_STRINGS:
            return False
    raise AnalysisError(f"column '{column}': {value!r} is not a boolean (use true/false or 1/0)")


def _parse_int(value: Any, column: str) -> Optional[int]:
    """One cell as an int or None (missing); a non-integral value raises AnalysisError."""
    if _is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        raise AnalysisError(f"column '{column}': {value!r} is a boolean, expected an integer")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise AnalysisError(f"column '{column}': {value!r} is not an integer") from None
    if not number.is_integer():
        raise AnalysisError(f"column '{column}': {value!r} is not an integer")
    return int(number)


def _parse_first_incomplete(value: Any) -> Optional[int]:
    """The 1-based first incomplete subgoal; None means every subgoal latched (``complete``)."""
    if isinstance(value, str) and value.strip().lower() == COMPLETE:
        return None
    return _parse_int(value, "first_incomplete")


def _keys_text(frame: pd.DataFrame, limit: int = 5) -> str:
    keys = [tuple(row) for row in frame[list(KEY_COLUMNS)].itertuples(index=False)]
    more = f" (and {len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(map(str, keys[:limit])) + more


def normalize(df: pd.DataFrame) -> pd.DataFrame:
    """Check a records table and return it with typed columns and defaults filled in.

    Args:
        df: one row per rollout with the required columns of DESIGN.md
            ("Records table"); extra columns are dropped.

    Returns:
        A new frame with exactly the required and optional columns: ``success``,
        ``valid``, ``stage_error`` as bool; ``episode``, ``replicate``,
        ``n_stages``, ``stages_completed`` as nullable integers;
        ``first_incomplete`` as a nullable integer with <NA> for ``complete``;
        ``spec_hash`` as str or None. Invalid rollouts keep whatever they hold;
        their outcome and stage columns are never read.

    Raises:
        AnalysisError: a required column is missing; a cell cannot be parsed;
            a condition is neither ``clean`` nor ``factor:Lk``; the table mixes
            spec hashes; a key (phase, task, episode, condition, replicate)
            appears twice; a valid rollout lacks its outcome or has stage
            columns out of range or inconsistent with each other.
    """
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise AnalysisError(
            f"records table lacks required column(s): {', '.join(missing)}; "
            f"required: {', '.join(REQUIRED_COLUMNS)}"
        )
    columns: Dict[str, List[Any]] = {}
    for name in REQUIRED_COLUMNS + tuple(OPTIONAL_DEFAULTS):
        columns[name] = list(df[name]) if name in df.columns else [OPTIONAL_DEFAULTS[name]] * len(df)

    def texts(name: str, default: Optional[str]) -> pd.Series:
        # dtype object keeps None as None (a str column would turn it into NaN).
        values = [default if _is_missing(v) else str(v).strip() for v in columns[name]]
        return pd.Series(values, dtype=object, index=pd.RangeIndex(len(df)))

    def bool_or(name: str, default: Optional[bool]) -> List[Optional[bool]]:
        parsed = [_parse_bool(v, name) for v in columns[name]]
        return [default if v is None else v for v in parsed]

    out = pd.DataFrame(
        {
            "phase": texts("phase", OPTIONAL_DEFAULTS["phase"]),
            "task": texts("task", None),
            "episode": pd.array([_parse_int(v, "episode") for v in columns["episode"]], dtype="Int64"),
            "condition": texts("condition", None),
            "replicate": pd.array(
                [OPTIONAL_DEFAULTS["replicate"] if r is None else r for r in (_parse_int(v, "replicate") for v in columns["replicate"])],
                dtype="Int64",
            ),
            "valid": bool_or("valid", OPTIONAL_DEFAULTS["valid"]),
            "success": pd.Series([_parse_bool(v, "success") for v in columns["success"]], dtype=object),
            "n_stages": pd.array([_parse_int(v, "n_stages") for v in columns["n_stages"]], dtype="Int64"),
            "stages_completed": pd.array(
                [_parse_int(v, "stages_completed") for v in columns["stages_completed"]], dtype="Int64"
            ),
            "first_incomplete": pd.array([_parse_first_incomplete(v) for v in columns["first_incomplete"]], dtype="Int64"),
            "spec_hash": texts("spec_hash", None),
            "stage_error": bool_or("stage_error", OPTIONAL_DEFAULTS["stage_error"]),
        },
        index=pd.RangeIndex(len(df)),
    )
    out["valid"] = out["valid"].astype(bool)
    out["stage_error"] = out["stage_error"].astype(bool)

    for name in ("task", "episode", "condition"):
        if out[name].isna().any():
            rows = list(np.flatnonzero(out[name].isna().to_numpy())[:5])
            raise AnalysisError(f"column '{name}' is empty in row(s) {rows}; every rollout needs a key")
    bad_conditions = sorted({c for c in out["condition"] if c != CLEAN and not _CONDITION_RE.match(c)})
    if bad_conditions:
        raise AnalysisError(f"condition(s) {bad_conditions} are neither '{CLEAN}' nor 'factor:Lk' (e.g. 'camera:L2')")

    hashes = sorted({h for h in out["spec_hash"] if h is not None})
    if len(hashes) > 1:
        raise AnalysisError(
            f"records table mixes perturbation spec hashes {hashes}; analyze runs of one frozen spec at a time"
        )

    duplicated = out.duplicated(list(KEY_COLUMNS), keep=False)
    if duplicated.any():
        raise AnalysisError(
            f"duplicate rollout key(s) (phase, task, episode, condition, replicate): {_keys_text(out[duplicated])}; "
            "a key is run once - merge or drop the superseded rows"
        )

    # The outcome of an invalid rollout is never read, so it may be missing;
    # a valid rollout without one cannot be counted either way.
    valid = out["valid"].to_numpy(bool)
    no_outcome = valid & np.array([s is None for s in out["success"]], dtype=bool)
    if no_outcome.any():
        raise AnalysisError(f"valid rollout(s) without a 'success' value: {_keys_text(out[no_outcome])}")
    out["success"] = [bool(s) if s is not None else False for s in out["success"]]
    out["success"] = out["success"].astype(bool)

    _check_stage_columns(out)
    return out


def _check_stage_columns(frame: pd.DataFrame) -> None:
    """Refuse stage columns that cannot come from a latched StageTracker (PROTOCOL.md section 3)."""
    for task, rows in frame.groupby("task", sort=True):
        sizes = sorted(set(rows["n_stages"].dropna().astype(int)))
        if len(sizes) > 1:
            raise AnalysisError(f"task '{task}' has rows with different n_stages {sizes}; one task has one stage spec")
    # Only rows whose stage columns are read: valid rollouts without a StageTracker error.
    checked = frame[frame["valid"] & ~frame["stage_error"]]
    if checked.empty:
        return
    k = checked["n_stages"]
    done = checked["stages_completed"]
    first = checked["first_incomplete"]
    problems = {
        "n_stages missing or < 1": k.isna() | (k.fillna(0) < 1),
        "stages_completed missing or outside 0..n_stages": done.isna() | (done.fillna(-1) < 0) | (done > k).fillna(False),
        # Latching makes the first incomplete subgoal g_{k+1}, or `complete` when all K latched.
        "first_incomplete != stages_completed + 1 (empty only when all subgoals latched)": (
            (first.isna() & (done != k).fillna(True)) | (first.notna() & (first != done + 1).fillna(True))
        ),
    }
    for problem, mask in problems.items():
        mask = mask.to_numpy(dtype=bool, na_value=True)
        if mask.any():
            raise AnalysisError(f"{problem}: {_keys_text(checked[mask])}")


def load_records(path: Path | str) -> pd.DataFrame:
    """Read a records CSV and return it normalized (see :func:`normalize`).

    Every column is read as text first so task names such as ``007`` stay
    strings and booleans written as true/false/1/0 all parse the same way.
    """
    frame = pd.read_csv(path, dtype=str, keep_default_na=True)
    return normalize(frame)


# --------------------------------------------------------------------------- small statistics


def wilson_interval(successes: int, n: int, z: float = WILSON_Z) -> Optional[List[float]]:
    """Wilson score interval of a binomial proportion; None when n == 0."""
    if n <= 0:
        return None
    p = successes / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half_width = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return [max(0.0, centre - half_width), min(1.0, centre + half_width)]


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant counts b (S->F) and c (F->S).

    p = min(1, 2 * P[Binomial(b + c, 1/2) <= min(b, c)]), and 1 when b + c == 0.
    Computed in exact integer arithmetic, so it stays accurate for hundreds of pairs.
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / (1 << n))


def holm_adjust(p_values: Mapping[str, Optional[float]]) -> Dict[str, Optional[float]]:
    """Holm step-down adjusted p-values over the non-null entries; nulls stay null.

    The i-th smallest of m p-values becomes max_{j <= i} min(1, (m - j + 1) p_(j)).
    """
    named = sorted(((p, name) for name, p in p_values.items() if p is not None), key=lambda item: item[0])
    m = len(named)
    adjusted: Dict[str, Optional[float]] = {name: None for name in p_values}
    running_max = 0.0
    for rank, (p, name) in enumerate(named):
        running_max = max(running_max, min(1.0, (m - rank) * p))
        adjusted[name] = running_max
    return adjusted


def _percentile_interval(values: np.ndarray) -> Optional[List[float]]:
    if values.size == 0:
        return None
    lo, hi = np.quantile(values, CI_QUANTILES)  # linear interpolation, PROTOCOL.md section 7
    return [float(lo), float(hi)]


def _mean_or_none(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return float(sum(present) / len(present)) if present else None


# --------------------------------------------------------------------------- conditions and pairs


def order_conditions(conditions: Iterable[str], factor_order: Sequence[str] = DEFAULT_FACTOR_ORDER) -> List[str]:
    """``clean`` first, then factors in ``factor_order`` (unknown ones after, sorted), levels by number."""
    rank = {name: i for i, name in enumerate(factor_order)}

    def key(condition: str) -> Tuple[int, int, str, int]:
        if condition == CLEAN:
            return (0, 0, "", 0)
        match = _CONDITION_RE.match(condition)
        if match is None:
            raise AnalysisError(f"condition {condition!r} is neither '{CLEAN}' nor 'factor:Lk'")
        factor = match["factor"]
        return (1, rank.get(factor, len(rank)), factor, int(match["level"]))

    return sorted(set(conditions), key=key)


@dataclass(frozen=True)
class _TaskPairs:
    """The valid pairs of one task under one perturbed condition, as aligned arrays."""

    clean_success: np.ndarray  # float 0/1 per pair
    perturbed_success: np.ndarray
    # Stage-measure inputs, zero outside the strictly matched S->F pairs that
    # have no StageTracker error on the perturbed rollout.
    is_stage_sf: np.ndarray
    sf_progress: np.ndarray
    sf_first_stage: np.ndarray

    @property
    def n(self) -> int:
        return int(self.clean_success.size)


def _task_pairs(merged: pd.DataFrame) -> _TaskPairs:
    clean = merged["success_clean"].to_numpy(bool)
    perturbed = merged["success_pert"].to_numpy(bool)
    is_stage_sf = clean & ~perturbed & ~merged["stage_error_pert"].to_numpy(bool)
    k = merged["n_stages_pert"].to_numpy(dtype=float, na_value=np.nan)
    done = merged["stages_completed_pert"].to_numpy(dtype=float, na_value=np.nan)
    first = merged["first_incomplete_pert"].to_numpy(dtype=float, na_value=np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        progress = np.where(is_stage_sf, done / k, 0.0)
    return _TaskPairs(
        clean_success=clean.astype(float),
        perturbed_success=perturbed.astype(float),
        is_stage_sf=is_stage_sf.astype(float),
        sf_progress=progress,
        sf_first_stage=(is_stage_sf & (first == 1)).astype(float),
    )


def _condition_rng(seed: int, condition: str, task: str) -> np.random.Generator:
    """The bootstrap stream of one (condition, task): a function of the seed and the names only.

    Adding or dropping a condition or a task therefore leaves every other
    interval unchanged (STYLE.md habit 4).
    """
    spawn_key = (zlib.crc32(condition.encode()), zlib.crc32(task.encode()))
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=spawn_key))


def _transitions(clean: np.ndarray, perturbed: np.ndarray) -> Dict[str, int]:
    clean, perturbed = clean.astype(bool), perturbed.astype(bool)
    counts = {
        "SS": int(np.sum(clean & perturbed)),
        "SF": int(np.sum(clean & ~perturbed)),
        "FS": int(np.sum(~clean & perturbed)),
        "FF": int(np.sum(~clean & ~perturbed)),
    }
    counts["changed"] = counts["SF"] + counts["FS"]
    return counts


# --------------------------------------------------------------------------- the summary


def analyze(
    df: pd.DataFrame,
    *,
    phase: str = "formal",
    n_boot: int = 10000,
    bootstrap_seed: int = 0,
    factor_order: Sequence[str] = DEFAULT_FACTOR_ORDER,
) -> Dict[str, Any]:
    """Every measure of PROTOCOL.md section 7 for one phase, as a JSON-ready summary.

    Args:
        df: a records table (normalized here; see :func:`normalize`).
        phase: rows of other phases are ignored.
        n_boot: bootstrap resamples for every interval except Wilson's.
        bootstrap_seed: recorded in the summary; each (condition, task)
            draws from its own stream derived from it and the two names.
        factor_order: display order of the factors.

    Returns:
        The summary of DESIGN.md (``tasks``, ``conditions``) plus the extra keys
        described in the module docstring. Only plain ints, floats, str, lists,
        dicts and None: undefined values are None, never NaN.

    Raises:
        AnalysisError: the table is unusable (see :func:`normalize`) or has no
            rows of ``phase``.
    """
    if n_boot < 1:
        raise AnalysisError(f"n_boot must be at least 1, got {n_boot}")
    records = normalize(df)
    rows = records[records["phase"] == phase]
    if rows.empty:
        phases = sorted(set(records["phase"]))
        raise AnalysisError(f"no rows of phase '{phase}'; phases in the table: {phases}")

    tasks = sorted(set(rows["task"]))
    n_stages = {task: _task_n_stages(rows, task) for task in tasks}
    conditions = order_conditions(list(rows["condition"]) + [CLEAN], factor_order)
    paired_rows = rows[rows["replicate"] == PAIRED_REPLICATE]

    summary_conditions: Dict[str, Dict[str, Any]] = {}
    for condition in conditions:
        summary_conditions[condition] = _success_rates(paired_rows, condition, tasks)

    perturbed = [c for c in conditions if c != CLEAN]
    clean_rows = paired_rows[paired_rows["condition"] == CLEAN]
    for condition in perturbed:
        summary_conditions[condition].update(
            _paired_measures(clean_rows, paired_rows, condition, tasks, n_stages, n_boot, bootstrap_seed)
        )
    _add_holm(summary_conditions, perturbed, tasks)

    hashes = [h for h in rows["spec_hash"] if h is not None]
    return {
        "tasks": tasks,
        "conditions": summary_conditions,
        "phase": phase,
        "spec_hash": hashes[0] if hashes else None,
        "n_stages": n_stages,
        "replicate": PAIRED_REPLICATE,
        "bootstrap": {
            "seed": int(bootstrap_seed),
            "n_boot": int(n_boot),
            "method": "pair-level bootstrap, pairs resampled with replacement within each task, macro recomputed "
            "per resample; percentile interval, numpy.quantile linear interpolation",
            "quantiles": list(CI_QUANTILES),
            "rng": "numpy.random.default_rng(SeedSequence(seed, spawn_key=(crc32(condition), crc32(task))))",
        },
        "wilson_z": WILSON_Z,
        "noise_floor": _noise_floor(rows, tasks),
    }


def _task_n_stages(rows: pd.DataFrame, task: str) -> Optional[int]:
    sizes = rows.loc[rows["task"] == task, "n_stages"].dropna()
    return int(sizes.iloc[0]) if len(sizes) else None


def _success_rates(rows: pd.DataFrame, condition: str, tasks: List[str]) -> Dict[str, Any]:
    """SR per task with Wilson intervals, and the macro SR, over the valid rollouts of a condition."""
    chosen = rows[(rows["condition"] == condition) & rows["valid"]]
    n_valid = chosen.groupby("task")["success"].size()
    successes = chosen.groupby("task")["success"].sum()
    per_task_n = {t: int(n_valid.get(t, 0)) for t in tasks}
    per_task_s = {t: int(successes.get(t, 0)) for t in tasks}
    per_task_sr = {t: (per_task_s[t] / per_task_n[t] if per_task_n[t] else None) for t in tasks}
    return {
        "macro_sr": _mean_or_none(per_task_sr.values()),
        "per_task_sr": per_task_sr,
        "per_task_n_valid": per_task_n,
        "per_task_successes": per_task_s,
        "per_task_sr_ci95": {t: wilson_interval(per_task_s[t], per_task_n[t]) for t in tasks},
    }


def _paired_measures(
    clean_rows: pd.DataFrame,
    rows: pd.DataFrame,
    condition: str,
    tasks: List[str],
    n_stages: Mapping[str, Optional[int]],
    n_boot: int,
    seed: int,
) -> Dict[str, Any]:
    """dSR, its intervals, transitions, McNemar and the S->F stage measures of one condition."""
    pert_rows = rows[rows["condition"] == condition]
    merged = pert_rows.merge(clean_rows, on=["task", "episode"], suffixes=("_pert", "_clean"), how="inner")
    merged = merged[merged["valid_pert"] & merged["valid_clean"]]

    per_task_dsr: Dict[str, Optional[float]] = {}
    per_task_ci: Dict[str, Optional[List[float]]] = {}
    per_task_n: Dict[str, int] = {}
    per_task_transitions: Dict[str, Dict[str, int]] = {}
    per_task_p: Dict[str, Optional[float]] = {}
    first_incomplete_by_task: Dict[str, Dict[str, int]] = {}
    # Bootstrap replicates per task, combined below into macro and pooled measures.
    boot_dsr: List[np.ndarray] = []
    boot_sf_n = np.zeros(n_boot)
    boot_sf_progress = np.zeros(n_boot)
    boot_sf_first = np.zeros(n_boot)
    pooled_clean: List[np.ndarray] = []
    pooled_pert: List[np.ndarray] = []
    sf_n = 0
    sf_progress_sum = 0.0
    sf_first_sum = 0.0
    n_stage_error_dropped = 0

    for task in tasks:
        task_merged = merged[merged["task"] == task]
        pairs = _task_pairs(task_merged)
        per_task_n[task] = pairs.n
        per_task_transitions[task] = _transitions(pairs.clean_success, pairs.perturbed_success)
        first_incomplete_by_task[task] = _first_incomplete_counts(task_merged, pairs, n_stages[task])
        pooled_clean.append(pairs.clean_success)
        pooled_pert.append(pairs.perturbed_success)
        if pairs.n == 0:
            per_task_dsr[task], per_task_ci[task], per_task_p[task] = None, None, None
            continue
        counts = per_task_transitions[task]
        per_task_p[task] = mcnemar_exact_p(counts["SF"], counts["FS"])
        n_stage_error_dropped += counts["SF"] - int(pairs.is_stage_sf.sum())
        differences = pairs.clean_success - pairs.perturbed_success
        per_task_dsr[task] = float(differences.mean())
        sf_n += int(pairs.is_stage_sf.sum())
        sf_progress_sum += float(pairs.sf_progress.sum())
        sf_first_sum += float(pairs.sf_first_stage.sum())

        # One (n_boot, n_pairs) index array per task: every resample of every
        # measure below reuses it, so the intervals describe the same resamples.
        index = _condition_rng(seed, condition, task).integers(0, pairs.n, size=(n_boot, pairs.n))
        task_boot = differences[index].mean(axis=1)
        boot_dsr.append(task_boot)
        per_task_ci[task] = _percentile_interval(task_boot)
        boot_sf_n += pairs.is_stage_sf[index].sum(axis=1)
        boot_sf_progress += pairs.sf_progress[index].sum(axis=1)
        boot_sf_first += pairs.sf_first_stage[index].sum(axis=1)

    pooled = _transitions(np.concatenate(pooled_clean), np.concatenate(pooled_pert))
    any_pairs = bool(boot_dsr)
    # A resample without any S->F pair has no stage measure; the interval is
    # over the resamples where it is defined.
    defined = boot_sf_n > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_progress = boot_sf_progress[defined] / boot_sf_n[defined]
        boot_first = boot_sf_first[defined] / boot_sf_n[defined]
    return {
        "n_pairs": int(sum(per_task_n.values())),
        "per_task_n_pairs": per_task_n,
        "macro_dsr": _mean_or_none(per_task_dsr.values()),
        "dsr_ci95": _percentile_interval(np.mean(boot_dsr, axis=0)) if any_pairs else None,
        "per_task_dsr": per_task_dsr,
        "per_task_dsr_ci95": per_task_ci,
        "transitions": pooled,
        "per_task_transitions": per_task_transitions,
        "mcnemar": {
            "b": pooled["SF"],
            "c": pooled["FS"],
            "p": mcnemar_exact_p(pooled["SF"], pooled["FS"]) if any_pairs else None,
            "p_holm": None,  # filled in by _add_holm, across the conditions
            "per_task": {t: {"p": per_task_p[t], "p_holm": None} for t in tasks},
        },
        "sf": {
            "n": sf_n,
            "mean_progress": sf_progress_sum / sf_n if sf_n else None,
            "first_stage_fraction": sf_first_sum / sf_n if sf_n else None,
            "first_incomplete_by_task": first_incomplete_by_task,
            "mean_progress_ci95": _percentile_interval(boot_progress) if sf_n else None,
            "first_stage_fraction_ci95": _percentile_interval(boot_first) if sf_n else None,
            "n_stage_error_dropped": n_stage_error_dropped,
        },
    }


def _first_incomplete_counts(merged: pd.DataFrame, pairs: _TaskPairs, k: Optional[int]) -> Dict[str, int]:
    """Counts of the first incomplete subgoal over a task's S->F pairs: every index 1..K and complete."""
    counts = {str(i): 0 for i in range(1, (k or 0) + 1)}
    counts[COMPLETE] = 0
    chosen = merged["first_incomplete_pert"].to_numpy(dtype=float, na_value=np.nan)[pairs.is_stage_sf.astype(bool)]
    for value in chosen:
        counts[COMPLETE if math.isnan(value) else str(int(value))] += 1
    return counts


def _add_holm(conditions: Dict[str, Dict[str, Any]], perturbed: List[str], tasks: List[str]) -> None:
    """Holm across the perturbed conditions: pooled p-values together, per-task ones within each task."""
    pooled = holm_adjust({c: conditions[c]["mcnemar"]["p"] for c in perturbed})
    for condition in perturbed:
        conditions[condition]["mcnemar"]["p_holm"] = pooled[condition]
    for task in tasks:
        adjusted = holm_adjust({c: conditions[c]["mcnemar"]["per_task"][task]["p"] for c in perturbed})
        for condition in perturbed:
            conditions[condition]["mcnemar"]["per_task"][task]["p_holm"] = adjusted[condition]


def _noise_floor(rows: pd.DataFrame, tasks: List[str]) -> Optional[Dict[str, Any]]:
    """Clean-vs-clean flip rate from episodes with valid clean replicates 0 and 1; None without replicate 1."""
    clean = rows[rows["condition"] == CLEAN]
    if not (clean["replicate"] == NOISE_REPLICATE).any():
        return None
    clean = clean[clean["valid"]]
    first = clean[clean["replicate"] == PAIRED_REPLICATE][["task", "episode", "success"]]
    second = clean[clean["replicate"] == NOISE_REPLICATE][["task", "episode", "success"]]
    both = first.merge(second, on=["task", "episode"], suffixes=("_r0", "_r1"))
    flipped = both["success_r0"] != both["success_r1"]
    per_task_n = {t: int((both["task"] == t).sum()) for t in tasks}
    per_task_flips = {t: int(flipped[both["task"] == t].sum()) for t in tasks}
    per_task_rate = {t: (per_task_flips[t] / per_task_n[t] if per_task_n[t] else None) for t in tasks}
    return {
        "macro_flip_rate": _mean_or_none(per_task_rate.values()),
        "per_task_flip_rate": per_task_rate,
        "per_task_n_episodes": per_task_n,
        "per_task_n_flips": per_task_flips,
        "n_episodes": int(len(both)),
    }


# --------------------------------------------------------------------------- tables and files


def _interval_parts(interval: Optional[Sequence[float]]) -> Tuple[Optional[float], Optional[float]]:
    return (None, None) if interval is None else (interval[0], interval[1])


def tables(summary: Mapping[str, Any]) -> Dict[str, pd.DataFrame]:
    """The summary as tidy tables: ``sr``, ``dsr``, ``transitions``, ``stages``, ``first_incomplete``.

    Args:
        summary: the dict :func:`analyze` returns.

    Returns:
        Frames keyed by table name; missing values are None (empty in CSV).
    """
    tasks = summary["tasks"]
    sr_rows, dsr_rows, transition_rows, stage_rows, first_rows = [], [], [], [], []
    for condition, measures in summary["conditions"].items():
        for task in tasks:
            lo, hi = _interval_parts(measures["per_task_sr_ci95"][task])
            sr_rows.append(
                {
                    "task": task,
                    "condition": condition,
                    "n_valid": measures["per_task_n_valid"][task],
                    "successes": measures["per_task_successes"][task],
                    "sr": measures["per_task_sr"][task],
                    "wilson_lo": lo,
                    "wilson_hi": hi,
                }
            )
        if condition == CLEAN:
            continue
        for task in tasks:
            lo, hi = _interval_parts(measures["per_task_dsr_ci95"][task])
            dsr_rows.append(
                {
                    "task": task,
                    "condition": condition,
                    "n_pairs": measures["per_task_n_pairs"][task],
                    "dsr": measures["per_task_dsr"][task],
                    "ci_lo": lo,
                    "ci_hi": hi,
                }
            )
        lo, hi = _interval_parts(measures["dsr_ci95"])
        dsr_rows.append(
            {"task": "macro", "condition": condition, "n_pairs": measures["n_pairs"], "dsr": measures["macro_dsr"], "ci_lo": lo, "ci_hi": hi}
        )
        mcnemar = measures["mcnemar"]
        for task in tasks:
            transition_rows.append(
                {
                    "task": task,
                    "condition": condition,
                    **measures["per_task_transitions"][task],
                    "mcnemar_p": mcnemar["per_task"][task]["p"],
                    "mcnemar_p_holm": mcnemar["per_task"][task]["p_holm"],
                }
            )
        transition_rows.append(
            {
                "task": "pooled",
                "condition": condition,
                **measures["transitions"],
                "mcnemar_p": mcnemar["p"],
                "mcnemar_p_holm": mcnemar["p_holm"],
            }
        )
        sf = measures["sf"]
        progress_lo, progress_hi = _interval_parts(sf["mean_progress_ci95"])
        first_lo, first_hi = _interval_parts(sf["first_stage_fraction_ci95"])
        stage_rows.append(
            {
                "condition": condition,
                "n_sf": sf["n"],
                "mean_progress": sf["mean_progress"],
                "mean_progress_ci_lo": progress_lo,
                "mean_progress_ci_hi": progress_hi,
                "first_stage_fraction": sf["first_stage_fraction"],
                "first_stage_fraction_ci_lo": first_lo,
                "first_stage_fraction_ci_hi": first_hi,
            }
        )
        for task, counts in sf["first_incomplete_by_task"].items():
            for subgoal, count in counts.items():
                first_rows.append({"condition": condition, "task": task, "subgoal": subgoal, "count": count})

    def frame(rows: List[Dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=list(columns)).astype(object)

    return {
        "sr": frame(sr_rows, ["task", "condition", "n_valid", "successes", "sr", "wilson_lo", "wilson_hi"]),
        "dsr": frame(dsr_rows, ["task", "condition", "n_pairs", "dsr", "ci_lo", "ci_hi"]),
        "transitions": frame(
            transition_rows, ["task", "condition", *TRANSITIONS, "changed", "mcnemar_p", "mcnemar_p_holm"]
        ),
        "stages": frame(
            stage_rows,
            [
                "condition",
                "n_sf",
                "mean_progress",
                "mean_progress_ci_lo",
                "mean_progress_ci_hi",
                "first_stage_fraction",
                "first_stage_fraction_ci_lo",
                "first_stage_fraction_ci_hi",
            ],
        ),
        "first_incomplete": frame(first_rows, ["condition", "task", "subgoal", "count"]),
    }


def write_analysis(df: pd.DataFrame, out_dir: Path | str, **kwargs: Any) -> Dict[str, Any]:
    """Analyze a records table and write ``summary.json`` and the tidy CSV tables into ``out_dir``.

    Args:
        df: a records table.
        out_dir: created if missing; existing files of the same names are replaced.
        **kwargs: passed to :func:`analyze` (``phase``, ``n_boot``, ``bootstrap_seed``, ...).

    Returns:
        The summary written to ``summary.json``.
    """
    summary = analyze(df, **kwargs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: a NaN that slipped through is a bug, not a number to publish.
    text = json.dumps(summary, indent=2, allow_nan=False)
    (out / "summary.json").write_text(text + "\n")
    for name, table in tables(summary).items():
        table.to_csv(out / f"{name}.csv", index=False)
    return summary
