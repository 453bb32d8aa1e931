"""Every measure of docs/protocol.md section 7, as pure functions over a records table.

The input is the records table (docs/records.md): one row per
rollout, from this project's ``export`` or from anywhere else. Nothing here
imports a simulator, so the analysis runs wherever pandas and numpy do.

Measures (docs/protocol.md section 7), all from rows of one phase:

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

And what makes the numbers publishable (README, "summary.json: validity,
intervals, tests, power and verdicts"; the statistics live in
:mod:`robocasa_shift.analysis.statistics`):

- validity: a perturbed rollout whose pairing fingerprints differ from its
  clean twin's is invalid (docs/protocol.md section 6); invalid rollouts and
  invalid pairs are counted per condition and task, by reason; a table mixing
  policies, backends or a task's stage-spec versions is refused;
- a macro over fewer tasks than the table has is null, with ``missing_tasks``;
- pairs are sorted by key before resampling, so no interval depends on the
  row order of the table;
- the calibrated interval (Tango's corrected score interval per task,
  combined by square-and-add for the macro) before the paper's percentile
  bootstrap, the exact stratified sign-flip test of the macro (Holm across
  conditions), interval and verdict as one object (the interval reaches 0
  wherever the test does not reject; NO CHANGE DETECTED is Holm-controlled
  through equivalence tests), the minimum detectable dSR over random pair
  outcomes (smallest and stable), and per factor a severity reversal test and
  an exact stratified trend test.

Every measure except the noise floor uses replicate 0, so SR and dSR are
computed on the same rollouts.
"""

from __future__ import annotations

import itertools
import json
import math
import numbers
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from robocasa_shift.analysis.sections import Section, StudyData, compute_sections, register_section, section_tables
from robocasa_shift.analysis import statistics as stats
from robocasa_shift.analysis.statistics import (
    holm_adjust,
    mcnemar_exact_p,
    wilson_interval,
)
from robocasa_shift.core.conditions import (
    CLEAN,
    Condition,
    factor_levels,
    order_conditions,
)
from robocasa_shift.errors import AnalysisError, BadInput

REQUIRED_COLUMNS = ("task", "episode", "condition", "success", "n_stages", "stages_completed", "first_incomplete")
OPTIONAL_DEFAULTS: Dict[str, Any] = {
    "valid": True,
    "phase": "formal",
    "replicate": 0,
    "spec_hash": None,
    "stage_error": False,
}
# Optional text columns carried through normalize for the validity checks: the pairing fingerprints
# (a perturbed rollout whose fingerprint differs from its clean twin's is invalid, docs/protocol.md
# section 6) and the identity a table must not mix (one policy, one backend, one stage spec per task).
IDENTITY_COLUMNS = ("env_fingerprint", "policy_rng_fingerprint", "stage_spec_hash", "policy", "backend")
FINGERPRINT_COLUMNS = ("env_fingerprint", "policy_rng_fingerprint")
KEY_COLUMNS = ("phase", "task", "episode", "condition", "replicate")
PAIRED_REPLICATE = 0
NOISE_REPLICATE = 1
# Two-sided 95%: the 0.975 quantile of the standard normal.
CI_QUANTILES = (0.025, 0.975)
COMPLETE = "complete"
TRANSITIONS = ("SS", "SF", "FS", "FF")

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
    """One cell as an int or None (missing); a non-integral value, or one outside 64 bits, raises AnalysisError."""
    if _is_missing(value):
        return None
    if isinstance(value, (bool, np.bool_)):
        raise AnalysisError(f"column '{column}': {value!r} is a boolean, expected an integer")
    try:
        number = int(value.strip()) if isinstance(value, str) and value.strip().lstrip("+-").isdigit() else float(value)
    except (TypeError, ValueError):
        raise AnalysisError(f"column '{column}': {str(value)[:80]!r} is not an integer") from None
    if isinstance(number, float) and not number.is_integer():
        raise AnalysisError(f"column '{column}': {str(value)[:80]!r} is not an integer")
    if not -2**63 <= number < 2**63:
        raise AnalysisError(f"column '{column}': {str(value)[:80]!r} is outside the 64-bit integers a records "
                            f"table holds")
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
        df: one row per rollout with the required columns of the records table (docs/records.md);
            extra columns are dropped.

    Returns:
        A new frame with exactly the required and optional columns: ``success``,
        ``valid``, ``stage_error`` as bool; ``episode``, ``replicate``,
        ``n_stages``, ``stages_completed`` as nullable integers;
        ``first_incomplete`` as a nullable integer with <NA> for ``complete``;
        ``spec_hash`` as str or None; then the identity columns
        (:data:`IDENTITY_COLUMNS`) as str or None (None where the table lacks
        them). Invalid rollouts keep whatever they hold; their outcome and
        stage columns are never read.

    Raises:
        AnalysisError: a required column is missing; a cell cannot be parsed;
            a condition is neither ``clean`` nor ``factor:Lk``; the table mixes
            spec hashes, policies, backends or stage-spec hashes within a task;
            a key (phase, task, episode, condition, replicate)
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
    for name in IDENTITY_COLUMNS:
        if name in df.columns:
            columns[name] = list(df[name])

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
    for name in IDENTITY_COLUMNS:
        out[name] = texts(name, None) if name in columns else pd.Series([None] * len(df), dtype=object)
    out["valid"] = out["valid"].astype(bool)
    out["stage_error"] = out["stage_error"].astype(bool)

    for name in ("task", "episode", "condition"):
        if out[name].isna().any():
            rows = list(np.flatnonzero(out[name].isna().to_numpy())[:5])
            raise AnalysisError(f"column '{name}' is empty in row(s) {rows}; every rollout needs a key")
    for condition in sorted(set(out["condition"])):
        try:
            Condition.parse(condition)
        except BadInput as exc:
            raise AnalysisError(str(exc)) from None

    hashes = sorted({h for h in out["spec_hash"] if h is not None})
    if len(hashes) > 1:
        raise AnalysisError(
            f"records table mixes perturbation spec hashes {hashes}; analyze runs of one frozen spec at a time"
        )

    _refuse_mixed_identity(out)

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


def _refuse_mixed_identity(frame: pd.DataFrame) -> None:
    """Refuse a table whose rows come from different policies, backends or stage-spec versions.

    Pairs and macros across such rows compare different things. Stage specs differ between tasks
    by design, so ``stage_spec_hash`` must be single-valued within each task only. Missing values
    (a hand-made table) are not a second value.
    """
    problems = []
    for name in ("policy", "backend"):
        values = sorted({v for v in frame[name] if v is not None})
        if len(values) > 1:
            problems.append(f"column '{name}' has {len(values)} values {values}")
    for task, rows in frame.groupby("task", sort=True):
        values = sorted({v for v in rows["stage_spec_hash"] if v is not None})
        if len(values) > 1:
            problems.append(f"column 'stage_spec_hash' has {len(values)} values for task '{task}' {values}")
    if problems:
        raise AnalysisError(
            "records table mixes runs that cannot be paired or averaged: " + "; ".join(problems)
            + "; analyze one policy, one backend and one stage-spec version per task at a time "
            "(filter the rows, or use `compare` for two policies)"
        )


def _check_stage_columns(frame: pd.DataFrame) -> None:
    """Refuse stage columns that cannot come from a latched StageTracker (docs/protocol.md section 3)."""
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
        # Ordered latching makes the first incomplete subgoal g_{k+1}; unordered groups (BDDL conjuncts) may
        # leave an earlier one open. Either way it is empty exactly when all K latched.
        "first_incomplete outside 1..stages_completed + 1 (empty only when all subgoals latched)": (
            (first.isna() & (done != k).fillna(True))
            | (first.notna() & ((first < 1) | (first > done + 1) | (done == k)).fillna(True))
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
    from robocasa_shift.analysis.export import (
        read_records_csv,  # names the file and line of a broken CSV
    )

    return normalize(read_records_csv(path, REQUIRED_COLUMNS + tuple(OPTIONAL_DEFAULTS) + IDENTITY_COLUMNS))


# --------------------------------------------------------------------------- small statistics


def _percentile_interval(values: np.ndarray) -> Optional[List[float]]:
    if values.size == 0:
        return None
    lo, hi = np.quantile(values, CI_QUANTILES)  # linear interpolation, docs/protocol.md section 7
    return [float(lo), float(hi)]


def _mean_or_none(values: Iterable[Optional[float]]) -> Optional[float]:
    present = [v for v in values if v is not None]
    return float(sum(present) / len(present)) if present else None


# --------------------------------------------------------------------------- conditions and pairs


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
    factor_order: Optional[Sequence[str]] = None,
    min_effect: float = stats.MIN_EFFECT,
    variant_of: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    """Every measure of docs/protocol.md section 7 for one phase, as a JSON-ready summary.

    Args:
        df: a records table (normalized here; see :func:`normalize`).
        phase: rows of other phases are ignored.
        n_boot: bootstrap resamples for every interval except Wilson's.
        bootstrap_seed: recorded in the summary; each (condition, task)
            draws from its own stream derived from it and the two names.
        factor_order: display order of the factors; by default the frozen protocol's (``study.yaml``), factors
            it does not know after them, by name.
        min_effect: the declared margin of the verdicts: NO CHANGE DETECTED
            needs the calibrated interval inside [-min_effect, +min_effect].
        variant_of: scene-variant task -> the task it changes (LIBERO-PRO's); where both are in the
            table, ``unpaired_variants`` compares their clean success rates, unpaired.

    Returns:
        The summary (docs/records.md: ``tasks``, ``conditions``) plus the extra keys
        described in the module docstring and in the README ("summary.json:
        validity, intervals, tests, power and verdicts"). Only plain ints,
        floats, str, lists, dicts and None: undefined values are None, never NaN.

    Raises:
        AnalysisError: the table is unusable (see :func:`normalize`) or has no
            rows of ``phase``.
    """
    if n_boot < 1:
        raise AnalysisError(f"n_boot must be at least 1, got {n_boot}")
    if not 0 < min_effect < 1:
        raise AnalysisError(f"min_effect must lie between 0 and 1, got {min_effect}")
    records = normalize(df)
    rows = records[records["phase"] == phase]
    if rows.empty:
        phases = sorted(set(records["phase"]))
        raise AnalysisError(f"no rows of phase '{phase}'; phases in the table: {phases}")
    rows = mark_fingerprint_mismatches(rows)

    if factor_order is None:
        from robocasa_shift.core.specs import load_protocol

        factor_order = load_protocol().factor_order
    tasks = sorted(set(rows["task"]))
    n_stages = {task: _task_n_stages(rows, task) for task in tasks}
    conditions = order_conditions(list(rows["condition"]) + [CLEAN], factor_order)
    paired_rows = rows[rows["replicate"] == PAIRED_REPLICATE]

    summary_conditions: Dict[str, Dict[str, Any]] = {}
    for condition in conditions:
        summary_conditions[condition] = _success_rates(paired_rows, condition, tasks)

    perturbed = [c for c in conditions if c != CLEAN]
    clean_rows = paired_rows[paired_rows["condition"] == CLEAN]
    valid_pairs: Dict[str, pd.DataFrame] = {}
    for condition in perturbed:
        measures, valid_pairs[condition] = _paired_measures(
            clean_rows, paired_rows, condition, tasks, n_stages, n_boot, bootstrap_seed
        )
        summary_conditions[condition].update(measures)
    _add_holm(summary_conditions, perturbed, tasks)
    _add_verdicts(summary_conditions, perturbed, tasks, min_effect)

    hashes = [h for h in rows["spec_hash"] if h is not None]
    data = StudyData(rows=rows, paired_rows=paired_rows, tasks=tasks, conditions=conditions,
                     summary_conditions=summary_conditions, valid_pairs=valid_pairs, factor_order=factor_order,
                     min_effect=min_effect, n_boot=n_boot, bootstrap_seed=bootstrap_seed, variant_of=variant_of or {})
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
            "pair_order": "pairs sorted by (task, episode) before resampling, so the interval does not depend "
            "on the row order of the table",
        },
        "intervals": {
            "dsr_ci95_calibrated": stats.CALIBRATED_METHOD,
            "per_task_dsr_ci95_calibrated": stats.TASK_METHOD + "; extended to reach 0 wherever the task's "
            "Holm-adjusted McNemar test does not reject",
            "dsr_ci95": stats.PERCENTILE_METHOD,
            "coverage": dict(stats.MEASURED_COVERAGE),
            "coverage_short": dict(stats.COVERAGE_SHORT),
        },
        "tests": {
            "signflip": "exact stratified sign-flip test of the macro dSR: within each task every discordant pair "
            "is S->F or F->S with probability 1/2 under the null; statistic the macro itself (pair weights "
            "1/(n_tasks * n_pairs_t)); null distribution by convolution of the per-task binomials; two-sided",
            "mcnemar": "exact McNemar on the discordant pairs, per task (it drives the per-task verdicts) and pooled "
            "over tasks (a diagnostic: it weights pairs, not tasks, and can disagree with the macro in sign)",
            "equivalence": "two one-sided tests of |dSR| >= min_effect, the tests the calibrated interval inverts: "
            "p <= a exactly when the (1 - 2a) calibrated interval lies inside +-min_effect (conditions[c].equivalence)",
        },
        "holm_families": HOLM_FAMILIES,
        "verdict_rule": {
            "vocabulary": list(stats.VERDICTS),
            "alpha": stats.ALPHA,
            "min_effect": float(min_effect),
            "equivalence_alpha": stats.EQUIVALENCE_ALPHA,
            "rule": "interval and verdict are one object: the calibrated 95% interval is extended to reach 0 wherever "
            "the Holm-adjusted exact test (signflip for a condition, McNemar for a task) does not reject at alpha, and "
            "the verdict is read off that interval: DEGRADED when it lies above 0, IMPROVED below 0 (so the test "
            "rejected too), NO CHANGE DETECTED when it lies inside [-min_effect, +min_effect] and the Holm-adjusted "
            "equivalence test rejects at equivalence_alpha, else UNDERPOWERED; null where the estimate is undefined "
            "(no pairs, or a task missing from the macro)",
            "multiplicity": stats.MULTIPLICITY,
        },
        "power": {
            "alpha": stats.ALPHA,
            "power": stats.POWER,
            "verdict": "DEGRADED: the two-sided exact stratified sign-flip test rejects at alpha (unadjusted) and the "
                       "calibrated interval lies above 0",
            "assumption": stats.VERDICT_POWER_ASSUMPTION,
            "mde_dsr": "the smallest grid value at which the verdict reads DEGRADED with probability >= power",
            "mde_dsr_stable": "the smallest from which every larger grid value has power >= power (they differ where "
            "the exact test's power saw-tooths)",
            "reachable": "whether any outcome of the condition's design could read DEGRADED (every pair S->F) or NO "
                         "CHANGE DETECTED (no discordant pair), before the Holm adjustment, which only makes both "
                         "harder; per_task_reachable the same for a task's own verdict",
            "smallest_reachable": {
                "macro": {"n_tasks": len(tasks), "degraded": stats.smallest_reachable(len(tasks), stats.DEGRADED),
                          "no_change": stats.smallest_reachable(len(tasks), stats.NO_CHANGE,
                                                                min_effect=min_effect)},
                "per_task": {"degraded": stats.smallest_reachable(1, stats.DEGRADED),
                             "no_change": stats.smallest_reachable(1, stats.NO_CHANGE, min_effect=min_effect)},
                "unit": "base episodes per task (equal across tasks) from which the verdict is reachable",
            },
        },
        "invalid_pair_reasons": list(INVALID_PAIR_REASONS),
        "wilson_z": stats.Z95,
        # the registered analyses (analysis/sections.py): severity trend, noise floor, scene variants, interactions
        **compute_sections(data),
    }


def _unpaired_variants(rows: pd.DataFrame, variant_of: Mapping[str, str], n_boot: int, seed: int) -> List[Dict[str, Any]]:
    """Clean success of each scene variant minus its original's, with an unpaired bootstrap interval.

    A variant has its own scene and initial states, so no rollout of it has a twin: each group is
    resampled on its own (two-sample percentile bootstrap), never as pairs.
    """
    clean = rows[(rows["condition"] == CLEAN) & rows["valid"]]
    out = []
    for variant, original in sorted(variant_of.items()):
        a = clean[clean["task"] == variant]["success"].to_numpy(dtype=float)
        b = clean[clean["task"] == original]["success"].to_numpy(dtype=float)
        if not (len(a) and len(b)):
            continue
        rng = _condition_rng(seed, "unpaired", variant)
        boot = rng.choice(a, (n_boot, len(a))).mean(axis=1) - rng.choice(b, (n_boot, len(b))).mean(axis=1)
        out.append({"task": variant, "original": original, "pairing": "UNPAIRED", "n_variant": len(a),
                    "n_original": len(b), "sr_variant": float(a.mean()), "sr_original": float(b.mean()),
                    "difference": float(a.mean() - b.mean()), "ci95": _percentile_interval(boot)})
    return out


INVALID_PAIR_REASONS = ("missing_twin", "fingerprint_mismatch", "perturbed_invalid", "clean_invalid")
HOLM_FAMILIES = {
    "signflip": "the headline test: one family of all perturbed conditions (p_holm in conditions[c].signflip)",
    "mcnemar_pooled": "pooled McNemar: one family of all perturbed conditions (conditions[c].mcnemar.p_holm)",
    "mcnemar_per_task": "per-task McNemar: one family per task, across the perturbed conditions "
    "(conditions[c].mcnemar.per_task[t].p_holm); these drive the per-task verdicts",
    "equivalence": "the equivalence tests of the macro: one family of all perturbed conditions "
    "(conditions[c].equivalence.p_holm); NO CHANGE DETECTED needs p_holm < 0.025",
    "equivalence_per_task": "the per-task equivalence tests: one family per task, across the perturbed conditions "
    "(conditions[c].equivalence.per_task[t].p_holm)",
    "reversal": "severity reversal test: one family of the factors (trend[f].p_holm); within a factor the level "
    "comparisons are combined by Bonferroni (trend[f].p)",
    "trend": "severity trend test: one family of the factors (trend[f].trend_p_holm)",
}


def _differ(a: Any, b: Any) -> bool:
    """Two fingerprints differ; two missing ones (a table without fingerprints) do not."""
    if _is_missing(a) and _is_missing(b):
        return False
    return _is_missing(a) or _is_missing(b) or a != b


def mark_fingerprint_mismatches(rows: pd.DataFrame) -> pd.DataFrame:
    """Invalidate every perturbed rollout whose pairing fingerprints differ from its clean twin's.

    docs/protocol.md section 6: a fingerprint mismatch makes a rollout invalid. The twin is the valid
    clean rollout of the same (phase, task, episode, replicate); ``env_fingerprint`` (the initial
    simulator state) and ``policy_rng_fingerprint`` (the policy's RNG state) must both equal its
    values. The perturbed rollout then leaves SR and every paired measure; the clean twin stays
    valid (it is the reference every other condition is paired with).

    Returns:
        A copy of ``rows`` with ``valid`` cleared where a mismatch was found and a bool column
        ``fingerprint_mismatch`` marking those rows.
    """
    out = rows.copy()
    out["fingerprint_mismatch"] = False
    keys = ["phase", "task", "episode", "replicate"]
    clean = out.loc[(out["condition"] == CLEAN) & out["valid"], keys + list(FINGERPRINT_COLUMNS)]
    perturbed = out.loc[(out["condition"] != CLEAN) & out["valid"], keys + list(FINGERPRINT_COLUMNS)]
    if clean.empty or perturbed.empty:
        return out
    merged = perturbed.reset_index().merge(clean, on=keys, suffixes=("", "_clean"), how="inner")
    mismatch = np.zeros(len(merged), dtype=bool)
    for column in FINGERPRINT_COLUMNS:
        mismatch |= np.array([_differ(a, b) for a, b in zip(merged[column], merged[f"{column}_clean"])], dtype=bool)
    flagged = merged.loc[mismatch, "index"].to_numpy()
    out.loc[flagged, "fingerprint_mismatch"] = True
    out.loc[flagged, "valid"] = False
    return out


def _task_n_stages(rows: pd.DataFrame, task: str) -> Optional[int]:
    sizes = rows.loc[rows["task"] == task, "n_stages"].dropna()
    return int(sizes.iloc[0]) if len(sizes) else None


def _success_rates(rows: pd.DataFrame, condition: str, tasks: List[str]) -> Dict[str, Any]:
    """SR per task with Wilson intervals, and the macro SR, over the valid rollouts of a condition.

    The macro is null when a task has no valid rollout (``missing_tasks_sr`` names them): an
    average over fewer tasks is another quantity, and beside a full one it would mislead.
    """
    of_condition = rows[rows["condition"] == condition]
    chosen = of_condition[of_condition["valid"]]
    n_valid = chosen.groupby("task")["success"].size()
    successes = chosen.groupby("task")["success"].sum()
    invalid = of_condition[~of_condition["valid"]].groupby("task").size()
    per_task_n = {t: int(n_valid.get(t, 0)) for t in tasks}
    per_task_s = {t: int(successes.get(t, 0)) for t in tasks}
    per_task_sr = {t: (per_task_s[t] / per_task_n[t] if per_task_n[t] else None) for t in tasks}
    per_task_invalid = {t: int(invalid.get(t, 0)) for t in tasks}
    missing = [t for t in tasks if per_task_sr[t] is None]
    result = {
        "macro_sr": None if missing else _mean_or_none(per_task_sr.values()),
        "per_task_sr": per_task_sr,
        "per_task_n_valid": per_task_n,
        "per_task_successes": per_task_s,
        "per_task_sr_ci95": {t: wilson_interval(per_task_s[t], per_task_n[t]) for t in tasks},
        "n_invalid": int(sum(per_task_invalid.values())),
        "per_task_n_invalid": per_task_invalid,
        "missing_tasks_sr": missing,
    }
    if condition == CLEAN:
        result["missing_tasks"] = missing
    return result


def _pair_reasons(both: pd.DataFrame) -> np.ndarray:
    """Why each row of the outer clean/perturbed merge is not a valid pair ('' when it is one).

    One reason per pair, the first that applies: missing_twin (one of the two rollouts absent),
    fingerprint_mismatch, perturbed_invalid, clean_invalid.
    """
    present = (both["_merge"] == "both").to_numpy()
    mismatch = both["fingerprint_mismatch_pert"].fillna(False).to_numpy(dtype=bool)
    valid_pert = both["valid_pert"].fillna(False).to_numpy(dtype=bool)
    valid_clean = both["valid_clean"].fillna(False).to_numpy(dtype=bool)
    return np.select(
        [~present, mismatch, ~valid_pert, ~valid_clean],
        list(INVALID_PAIR_REASONS),
        default="",
    )


def _paired_measures(
    clean_rows: pd.DataFrame,
    rows: pd.DataFrame,
    condition: str,
    tasks: List[str],
    n_stages: Mapping[str, Optional[int]],
    n_boot: int,
    seed: int,
) -> Tuple[Dict[str, Any], pd.DataFrame]:
    """dSR, its intervals and tests, transitions, invalid pairs and the S->F stage measures of one condition.

    Returns:
        The measures, and the valid pairs (task, episode, success_pert) for the severity trend.
    """
    pert_rows = rows[rows["condition"] == condition]
    both = pert_rows.merge(clean_rows, on=["task", "episode"], suffixes=("_pert", "_clean"), how="outer",
                           indicator=True)
    # Canonical order: the bootstrap draws pair positions, so the pairs must sit in an order that
    # depends on the keys only, never on the row order of the input table.
    both = both.sort_values(["task", "episode"], kind="stable").reset_index(drop=True)
    reasons = _pair_reasons(both)
    per_task_invalid = {
        t: {r: int(np.sum((reasons == r) & (both["task"] == t).to_numpy())) for r in INVALID_PAIR_REASONS}
        for t in tasks
    }
    merged = both[reasons == ""].copy()
    for name in ("success_pert", "success_clean", "stage_error_pert"):
        merged[name] = merged[name].astype(bool)

    per_task_dsr: Dict[str, Optional[float]] = {}
    per_task_ci: Dict[str, Optional[List[float]]] = {}
    per_task_calibrated: Dict[str, Optional[List[float]]] = {}
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
            per_task_calibrated[task] = None
            continue
        counts = per_task_transitions[task]
        per_task_p[task] = mcnemar_exact_p(counts["SF"], counts["FS"])
        per_task_calibrated[task] = stats.calibrated_interval([[counts[k] for k in TRANSITIONS]])
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
    # A macro over the tasks that have pairs would silently be another quantity: null, and say which.
    missing = [t for t in tasks if per_task_n[t] == 0]
    complete = any_pairs and not missing
    macro_ci = _percentile_interval(np.mean(boot_dsr, axis=0)) if complete else None
    task_counts = [[per_task_transitions[t][k] for k in TRANSITIONS] for t in tasks]
    signflip = (
        stats.signflip_test([per_task_n[t] for t in tasks], [c[1] for c in task_counts], [c[2] for c in task_counts])
        if complete else None
    )
    # A resample without any S->F pair has no stage measure; the interval is
    # over the resamples where it is defined.
    defined = boot_sf_n > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        boot_progress = boot_sf_progress[defined] / boot_sf_n[defined]
        boot_first = boot_sf_first[defined] / boot_sf_n[defined]
    measures = {
        "n_pairs": int(sum(per_task_n.values())),
        "per_task_n_pairs": per_task_n,
        "macro_dsr": _mean_or_none(per_task_dsr.values()) if complete else None,
        "dsr_ci95": macro_ci,
        "dsr_ci95_zero_width": None if macro_ci is None else bool(macro_ci[1] - macro_ci[0] < 1e-12),
        "dsr_ci95_calibrated": stats.calibrated_interval(task_counts) if complete else None,
        "missing_tasks": missing,
        "per_task_dsr": per_task_dsr,
        "per_task_dsr_ci95": per_task_ci,
        "per_task_dsr_ci95_zero_width": {
            t: None if per_task_ci[t] is None else bool(per_task_ci[t][1] - per_task_ci[t][0] < 1e-12) for t in tasks
        },
        "per_task_dsr_ci95_calibrated": per_task_calibrated,
        "invalid_pairs": {r: int(sum(per_task_invalid[t][r] for t in tasks)) for r in INVALID_PAIR_REASONS},
        "per_task_invalid_pairs": per_task_invalid,
        "transitions": pooled,
        "per_task_transitions": per_task_transitions,
        "signflip": None if signflip is None else {**signflip.to_json(), "p_holm": None},
        "power": {
            **(stats.minimum_detectable_dsr(
                [per_task_n[t] for t in tasks],
                [per_task_transitions[t]["changed"] / per_task_n[t] for t in tasks],
                seed=seed,
            ).to_json() if complete else _NO_POWER),
            "per_task_discordance": {
                t: (per_task_transitions[t]["changed"] / per_task_n[t] if per_task_n[t] else None) for t in tasks
            },
        },
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
    return measures, merged[["task", "episode", "success_pert"]].reset_index(drop=True)


def _first_incomplete_counts(merged: pd.DataFrame, pairs: _TaskPairs, k: Optional[int]) -> Dict[str, int]:
    """Counts of the first incomplete subgoal over a task's S->F pairs: every index 1..K and complete."""
    counts = {str(i): 0 for i in range(1, (k or 0) + 1)}
    counts[COMPLETE] = 0
    chosen = merged["first_incomplete_pert"].to_numpy(dtype=float, na_value=np.nan)[pairs.is_stage_sf.astype(bool)]
    for value in chosen:
        counts[COMPLETE if math.isnan(value) else str(int(value))] += 1
    return counts


def _add_holm(conditions: Dict[str, Dict[str, Any]], perturbed: List[str], tasks: List[str]) -> None:
    """Holm across the perturbed conditions (the families of :data:`HOLM_FAMILIES`)."""
    pooled = holm_adjust({c: conditions[c]["mcnemar"]["p"] for c in perturbed})
    for condition in perturbed:
        conditions[condition]["mcnemar"]["p_holm"] = pooled[condition]
    for task in tasks:
        adjusted = holm_adjust({c: conditions[c]["mcnemar"]["per_task"][task]["p"] for c in perturbed})
        for condition in perturbed:
            conditions[condition]["mcnemar"]["per_task"][task]["p_holm"] = adjusted[condition]
    headline = holm_adjust({c: (conditions[c]["signflip"] or {}).get("p") for c in perturbed})
    for condition in perturbed:
        if conditions[condition]["signflip"] is not None:
            conditions[condition]["signflip"]["p_holm"] = headline[condition]


_NO_POWER = {"mde_dsr": None, "mde_dsr_stable": None, "method": None, "power_at_mde": None,
             "monte_carlo_standard_error": None, "monte_carlo_studies": None, "grid_step": stats.MDE_STEP}


def equivalence_p_values(task_counts: Mapping[str, Optional[Sequence[Sequence[int]]]],
                         margin: float) -> Dict[str, Optional[float]]:
    """:func:`stats.equivalence_p` of several designs with the same number of tasks at once ({name: counts})."""
    named = [(name, np.asarray(counts, dtype=float)) for name, counts in task_counts.items() if counts is not None]
    out: Dict[str, Optional[float]] = {name: None for name in task_counts}
    by_shape: Dict[Tuple[int, ...], List[Tuple[str, np.ndarray]]] = {}
    for name, counts in named:
        by_shape.setdefault(counts.shape, []).append((name, counts))
    for group in by_shape.values():
        values = stats.equivalence_p(np.stack([counts for _, counts in group]), margin)
        out.update({name: float(v) for (name, _), v in zip(group, values)})
    return out


def _decide(interval: Optional[List[float]], p_holm: Optional[float],
            p_equivalence_holm: Optional[float],
            min_effect: float) -> Tuple[Optional[List[float]], Optional[str], Optional[bool]]:
    chosen = stats.decision(interval, p_holm, p_equivalence_holm, min_effect)
    if chosen is None:
        return None, None, None
    return chosen["interval"], chosen["verdict"], chosen["extended_to_zero"]


def _add_verdicts(conditions: Dict[str, Dict[str, Any]], perturbed: List[str], tasks: List[str],
                  min_effect: float) -> None:
    """Interval and verdict as one object, per condition (sign-flip test) and per task (McNemar).

    The calibrated interval is extended to 0 wherever the Holm-adjusted exact test does not reject,
    and the verdict is read off the interval (:func:`stats.decide`); NO CHANGE DETECTED also needs
    the Holm-adjusted equivalence test (family: the perturbed conditions; per task: the conditions
    within the task).
    """
    def counts(condition: str, task: str) -> List[int]:
        return [conditions[condition]["per_task_transitions"][task][k] for k in TRANSITIONS]

    macro_counts = {c: ([counts(c, t) for t in tasks] if conditions[c]["macro_dsr"] is not None else None)
                    for c in perturbed}
    macro_p = equivalence_p_values(macro_counts, min_effect)
    macro_holm = holm_adjust(macro_p)
    task_p = equivalence_p_values({(c, t): ([counts(c, t)] if conditions[c]["per_task_n_pairs"][t] else None)
                                   for c in perturbed for t in tasks}, min_effect)
    task_holm = {}
    for task in tasks:
        task_holm.update({(c, task): v for c, v in holm_adjust({c: task_p[(c, task)] for c in perturbed}).items()})
    for condition in perturbed:
        measures = conditions[condition]
        signflip = measures["signflip"] or {}
        measures["equivalence"] = {"margin": float(min_effect), "p": macro_p[condition],
                                   "p_holm": macro_holm[condition],
                                   "per_task": {t: {"p": task_p[(condition, t)], "p_holm": task_holm[(condition, t)]}
                                                for t in tasks}}
        interval, measures["verdict"], measures["dsr_ci95_calibrated_extended_to_zero"] = _decide(
            measures["dsr_ci95_calibrated"] if measures["macro_dsr"] is not None else None,
            signflip.get("p_holm"), macro_holm[condition], min_effect)
        measures["dsr_ci95_calibrated"] = interval
        per_task = {t: _decide(measures["per_task_dsr_ci95_calibrated"][t],
                               measures["mcnemar"]["per_task"][t]["p_holm"], task_holm[(condition, t)], min_effect)
                    for t in tasks}
        measures["per_task_dsr_ci95_calibrated"] = {t: v[0] for t, v in per_task.items()}
        measures["per_task_verdict"] = {t: v[1] for t, v in per_task.items()}
        measures["per_task_dsr_ci95_calibrated_extended_to_zero"] = {t: v[2] for t, v in per_task.items()}
        # could any outcome of this design read DEGRADED / NO CHANGE DETECTED at all (before Holm)?
        n_pairs = measures["per_task_n_pairs"]
        measures["power"]["reachable"] = (stats.reachable_verdicts([n_pairs[t] for t in tasks], min_effect=min_effect)
                                          .to_json() if measures["macro_dsr"] is not None else None)
        measures["power"]["per_task_reachable"] = {
            t: stats.reachable_verdicts([n_pairs[t]], min_effect=min_effect).to_json() if n_pairs[t] else None
            for t in tasks}


def severity_trend(conditions: Mapping[str, Mapping[str, Any]], valid_pairs: Mapping[str, pd.DataFrame],
                   tasks: List[str], factor_order: Sequence[str]) -> Dict[str, Any]:
    """Per factor, two exact tests over its levels: a reversal test and a trend test.

    Reversal (``p``, ``p_holm``, ``flag``): the null hypothesis is the protocol's premise, dSR
    non-decreasing in the level. For every pair of levels Li < Lj the test compares the perturbed
    outcomes of the same base episodes (valid pairs under both levels; their clean twin is shared,
    so dSR(Li) - dSR(Lj) = SR(Lj) - SR(Li) on them) with the exact stratified sign-flip test of
    :func:`stats.signflip_test`, one-sided towards "Lj succeeds more than Li" (a reversal). The
    factor's p-value is the smallest of these, Bonferroni-adjusted for the number of level pairs;
    Holm then runs across the factors. ``flag`` is true when the adjusted p-value is below 0.05:
    the data reject "L1 <= L2 <= L3". Not rejecting is no evidence of a reversal, and it does not
    show that dSR grows with the level. Point-estimate reversals (a higher level with a smaller
    macro dSR) are listed as ``reversals`` whether or not the test rejects.

    Trend (``trend_p``, ``trend_p_holm``, ``trend``): :func:`stats.stratified_trend_test` over every
    level at once, on the base episodes that are valid pairs under every level, one-sided towards
    "perturbed failures rise with the level"; Holm across the factors. ``trend`` true (adjusted p
    below 0.05) supports "dSR rises with the level"; false is no evidence of a trend.
    """
    by_factor = {factor: [(Condition.parse(c).single.level_index, c) for c in levels]
                 for factor, levels in factor_levels(conditions, factor_order)}
    result: Dict[str, Any] = {}
    for factor, levels in by_factor.items():
        comparisons = []
        reversals = []
        for (li, ci), (lj, cj) in itertools.combinations(levels, 2):
            low, high = conditions[ci]["macro_dsr"], conditions[cj]["macro_dsr"]
            if low is not None and high is not None and high < low - 1e-12:
                reversals.append(f"{cj} dSR {high:+.3f} < {ci} dSR {low:+.3f}")
            both = valid_pairs[ci].merge(valid_pairs[cj], on=["task", "episode"], suffixes=("_low", "_high"))
            n, up, down, used = [], [], [], []
            for task in tasks:
                rows = both[both["task"] == task]
                if rows.empty:
                    continue
                low_ok = rows["success_pert_low"].to_numpy(bool)
                high_ok = rows["success_pert_high"].to_numpy(bool)
                n.append(len(rows))
                up.append(int(np.sum(high_ok & ~low_ok)))
                down.append(int(np.sum(low_ok & ~high_ok)))
                used.append(task)
            test = stats.signflip_test(n, up, down) if n else None
            comparisons.append({
                "low": ci, "high": cj, "tasks": used, "n_pairs": int(sum(n)),
                "higher_level_only_success": int(sum(up)), "lower_level_only_success": int(sum(down)),
                "p_reversal": None if test is None else test.p_greater,
            })
        p_values = [c["p_reversal"] for c in comparisons if c["p_reversal"] is not None]
        trend = _trend_test([c for _, c in levels], valid_pairs, tasks)
        result[factor] = {
            "levels": [c for _, c in levels],
            "p": min(1.0, min(p_values) * len(p_values)) if p_values else None,
            "p_holm": None,
            "flag": None,
            "reversals": reversals,
            "comparisons": comparisons,
            "trend_p": None if trend is None else trend.p_increasing,
            "trend_p_holm": None,
            "trend": None,
            "trend_n_episodes": 0 if trend is None else trend.n_episodes,
            "trend_n_informative": 0 if trend is None else trend.n_informative,
        }
    adjusted = holm_adjust({f: v["p"] for f, v in result.items()})
    adjusted_trend = holm_adjust({f: v["trend_p"] for f, v in result.items()})
    for factor, value in result.items():
        value["p_holm"] = adjusted[factor]
        value["flag"] = None if adjusted[factor] is None else bool(adjusted[factor] < stats.ALPHA)
        value["trend_p_holm"] = adjusted_trend[factor]
        value["trend"] = None if adjusted_trend[factor] is None else bool(adjusted_trend[factor] < stats.ALPHA)
    return result


def _trend_test(levels: Sequence[str], valid_pairs: Mapping[str, pd.DataFrame],
                tasks: List[str]) -> Optional[stats.TrendResult]:
    """The stratified trend test of one factor's levels (in order), on base episodes valid under every level."""
    if len(levels) < 2:
        return None
    merged = None
    for i, condition in enumerate(levels):
        frame = valid_pairs[condition][["task", "episode", "success_pert"]].rename(columns={"success_pert": f"ok{i}"})
        merged = frame if merged is None else merged.merge(frame, on=["task", "episode"])
    failures = []
    for task in tasks:
        rows = merged[merged["task"] == task]
        if len(rows):
            failures.append(1 - rows[[f"ok{i}" for i in range(len(levels))]].to_numpy(dtype=np.int64))
    return stats.stratified_trend_test(failures) if failures else None


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
    """The summary as tidy tables: ``sr``, ``dsr``, ``transitions``, ``stages``, ``first_incomplete``, and every
    registered section's (``trend``, ``interactions``, ...).

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
            cal_lo, cal_hi = _interval_parts(measures["per_task_dsr_ci95_calibrated"][task])
            dsr_rows.append(
                {
                    "task": task,
                    "condition": condition,
                    "n_pairs": measures["per_task_n_pairs"][task],
                    "dsr": measures["per_task_dsr"][task],
                    "ci_lo": lo,
                    "ci_hi": hi,
                    "calibrated_lo": cal_lo,
                    "calibrated_hi": cal_hi,
                    "verdict": measures["per_task_verdict"][task],
                    "test_p_holm": measures["mcnemar"]["per_task"][task]["p_holm"],
                    "mde_dsr": None,
                    **{f"invalid_{r}": n for r, n in measures["per_task_invalid_pairs"][task].items()},
                    "mde_dsr_stable": None,
                    "equivalence_p_holm": measures["equivalence"]["per_task"][task]["p_holm"],
                }
            )
        lo, hi = _interval_parts(measures["dsr_ci95"])
        cal_lo, cal_hi = _interval_parts(measures["dsr_ci95_calibrated"])
        dsr_rows.append(
            {"task": "macro", "condition": condition, "n_pairs": measures["n_pairs"], "dsr": measures["macro_dsr"],
             "ci_lo": lo, "ci_hi": hi, "calibrated_lo": cal_lo, "calibrated_hi": cal_hi, "verdict": measures["verdict"],
             "test_p_holm": (measures["signflip"] or {}).get("p_holm"), "mde_dsr": measures["power"]["mde_dsr"],
             **{f"invalid_{r}": n for r, n in measures["invalid_pairs"].items()},
             "mde_dsr_stable": measures["power"]["mde_dsr_stable"],
             "equivalence_p_holm": measures["equivalence"]["p_holm"]}
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
        # new columns follow the original six, so readers of the old layout keep working
        "dsr": frame(dsr_rows, ["task", "condition", "n_pairs", "dsr", "ci_lo", "ci_hi", "calibrated_lo", "calibrated_hi",
                                "verdict", "test_p_holm", "mde_dsr", *(f"invalid_{r}" for r in INVALID_PAIR_REASONS),
                                "mde_dsr_stable", "equivalence_p_holm"]),
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
        **section_tables(summary),  # the registered analyses' tables (trend, interactions, ...)
    }


def write_analysis(df: pd.DataFrame, out_dir: Path | str, behaviour: Optional[Mapping[str, Any]] = None,
                   **kwargs: Any) -> Dict[str, Any]:
    """Analyze a records table and write ``summary.json`` and the tidy CSV tables into ``out_dir``.

    Args:
        df: a records table.
        out_dir: created if missing; existing files of the same names are replaced.
        behaviour: task -> paired behaviour differences from the step logs (``behaviour.formal_behaviour``), kept as
            the summary's ``behaviour`` when given and not empty.
        **kwargs: passed to :func:`analyze` (``phase``, ``n_boot``, ``bootstrap_seed``, ...).

    Returns:
        The summary written to ``summary.json``.
    """
    from robocasa_shift.rundir.files import atomic_write_text, write_csv

    summary = analyze(df, **kwargs)
    if behaviour:
        summary["behaviour"] = dict(behaviour)
    out = Path(out_dir)
    # allow_nan=False: a NaN that slipped through is a bug, not a number to publish.
    text = json.dumps(summary, indent=2, allow_nan=False)
    # the one safe writer: never through a symbolic link below a confined run directory (see rundir.files)
    atomic_write_text(out / "summary.json", text + "\n")
    for name, table in tables(summary).items():
        write_csv(table, out / f"{name}.csv")
    return summary


def _trend_tables(summary: Mapping[str, Any]) -> Dict[str, pd.DataFrame]:
    """The severity tests as a table: one row per (factor, level pair)."""
    rows = [
        {"factor": factor, "low": c["low"], "high": c["high"], "n_pairs": c["n_pairs"],
         "higher_level_only_success": c["higher_level_only_success"],
         "lower_level_only_success": c["lower_level_only_success"], "p_reversal": c["p_reversal"],
         "factor_p": value["p"], "factor_p_holm": value["p_holm"], "flag": value["flag"],
         "trend_p": value.get("trend_p"), "trend_p_holm": value.get("trend_p_holm"), "trend": value.get("trend")}
        for factor, value in (summary.get("trend") or {}).items() for c in value["comparisons"]
    ]
    return {"trend": pd.DataFrame(rows, columns=["factor", "low", "high", "n_pairs", "higher_level_only_success",
                                                 "lower_level_only_success", "p_reversal", "factor_p", "factor_p_holm",
                                                 "flag", "trend_p", "trend_p_holm", "trend"]).astype(object)}


register_section(Section(
    "trend", lambda d: {"trend": severity_trend(d.summary_conditions, d.valid_pairs, d.tasks, d.factor_order)},
    tables=_trend_tables, report="robocasa_shift.report.page:trend_section", order=10))
register_section(Section(
    "unpaired_variants",
    lambda d: {"unpaired_variants": _unpaired_variants(d.paired_rows, d.variant_of, d.n_boot, d.bootstrap_seed)},
    report="robocasa_shift.report.page:unpaired_section", order=30))
register_section(Section(
    "noise_floor", lambda d: {"noise_floor": _noise_floor(d.rows, d.tasks)},
    report="robocasa_shift.report.page:noise_floor_section", order=40))
