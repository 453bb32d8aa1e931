"""Failure detection and alarm timing of runtime monitors, from scores at action-chunk boundaries.

Pure pandas / numpy over one table, the *boundary scores* of one monitor: one row per
action-chunk boundary of one rollout (columns :data:`BOUNDARY_COLUMNS`). ``step`` is the
number of control steps taken before the boundary (the first boundary has step 0), ``score``
uses only the logs up to it (higher = more likely failing) and may be NaN where the monitor
is undefined; a NaN never raises an alarm (it counts as -inf). The positive class is failure
(``success`` false).

What is measured, following the pooled-AUC audit of SAFE and RESCUE (Sec. IV-D, IV-E):

- **Windows** (:func:`window_limits`): ``end`` (the whole rollout), ``early`` (per task, the
  shortest clean success among that task's *validation* episodes; retrospective, as SAFE's
  benchmark cap) and ``cap`` (a fixed fraction of the task's horizon, predeclared). A window is
  ``{task: max_step or None}``; a boundary is in it when ``step <= max_step``.
- **Ranking** (:func:`auc_decomposition`): episode score = max over the window's boundaries;
  exact Mann-Whitney AUC split into within-task and between-task pairs, so that
  ``pooled == w_within * auc_within + w_between * auc_between``, beside the macro (equal-task)
  AUC. :func:`length_only_scores` is the boundary-count baseline that recovers the label
  whenever failures are timeouts; :func:`detection_table` puts it beside every AUC.
- **Operating points** (:func:`select_threshold`, :func:`alarm_steps`, :func:`operating_point`):
  a threshold chosen on validation clean successes for a target false-alarm rate, then the
  realised false-alarm rate, catch rate and alarm timing elsewhere, misses counted at the
  window end; :func:`rate_matched_random_alarm` is the control on the same rollouts.
- **Splits** (:func:`split_episodes`): by base episode, so a clean rollout and its perturbed
  twins never straddle validation and test; :func:`leave_one_task_out` selects each task's
  threshold without it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import pandas as pd

from robocasa_shift.analysis.statistics import student_t_quantile
from robocasa_shift.errors import AnalysisError
from robocasa_shift.seeding import derive_seed

CLEAN = "clean"
ALL_CONDITIONS = "all"  # a pseudo-condition: the test rollouts of every condition, pooled
VALIDATION, TEST = "validation", "test"
SPLIT_COLUMN = "split"
SPLIT_STREAM = "monitor_split"  # the seed stream of split_episodes (seeding.derive_seed)

ROLLOUT_COLUMNS = ("rollout_id", "task", "episode", "condition", "success", "steps", "horizon")
BOUNDARY_COLUMNS = ROLLOUT_COLUMNS + ("step", "score")
INTEGER_COLUMNS = ("episode", "steps", "horizon", "step")

WINDOW_KINDS = ("end", "early", "cap")
DEFAULT_CAP_FRACTION = 0.25
DEFAULT_TARGET_FA = 0.05

Limits = Dict[str, Optional[int]]
"""A window: {task: the last control step whose boundary counts, or None for no limit}."""

Splits = Dict[str, Dict[str, List[int]]]
"""{task: {"validation": [base episodes], "test": [base episodes]}}."""


# --------------------------------------------------------------------------- the input table


def check_boundary_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """Check a boundary-scores table and return a typed copy sorted by (rollout_id, step).

    Args:
        scores: one row per action-chunk boundary with the columns of :data:`BOUNDARY_COLUMNS`;
            extra columns (e.g. ``split``) are kept.

    Returns:
        A new frame: ``success`` bool; ``episode``, ``steps``, ``horizon``, ``step`` int64;
        ``score`` float64 (NaN kept); rows sorted by rollout_id then step, index reset.

    Raises:
        AnalysisError: a column is missing, empty in some row or of the wrong type; a rollout's
            per-rollout column (task, episode, condition, success, steps, horizon) varies
            across its boundaries; a rollout has two boundaries at one step; a step lies
            outside ``[0, steps]``; ``steps`` or ``horizon`` is below 1.
    """
    if not isinstance(scores, pd.DataFrame):
        raise AnalysisError(f"boundary scores must be a pandas DataFrame, got {type(scores).__name__}")
    if _already_checked(scores):  # a row subset of a checked table (the analyses re-read one table many times)
        return scores.reset_index(drop=True)
    missing = [c for c in BOUNDARY_COLUMNS if c not in scores.columns]
    if missing:
        raise AnalysisError(
            f"boundary scores lack column(s) {', '.join(repr(c) for c in missing)}; "
            f"required: {', '.join(BOUNDARY_COLUMNS)}"
        )
    if scores.empty:
        raise AnalysisError("boundary scores are empty: no boundary of any rollout")
    df = scores.copy()
    for column in ROLLOUT_COLUMNS + ("step",):
        if df[column].isna().any():
            rows = list(df.index[df[column].isna()][:5])
            raise AnalysisError(f"column '{column}' is empty in row(s) {rows}; every boundary needs it")
    df["success"] = _as_bool(df["success"])
    for column in INTEGER_COLUMNS:
        df[column] = _as_int(df[column], column)
    numeric = pd.to_numeric(df["score"], errors="coerce")
    bad = numeric.isna() & df["score"].notna()
    if bad.any():
        raise AnalysisError(f"column 'score': {df['score'][bad].iloc[0]!r} is not a number")
    df["score"] = numeric.astype(float)
    varying = df.groupby("rollout_id", sort=False)[list(ROLLOUT_COLUMNS[1:])].nunique()
    for column in ROLLOUT_COLUMNS[1:]:
        if (varying[column] > 1).any():
            rollout = varying.index[varying[column] > 1][0]
            raise AnalysisError(f"column '{column}' varies across the boundaries of rollout '{rollout}'; "
                                "it must be one value per rollout")
    duplicated = df.duplicated(["rollout_id", "step"])
    if duplicated.any():
        first = df[duplicated].iloc[0]
        raise AnalysisError(f"column 'step': rollout '{first['rollout_id']}' has two boundaries "
                            f"at step {first['step']}")
    for column in ("steps", "horizon"):
        if (df[column] < 1).any():
            raise AnalysisError(f"column '{column}': {int(df[column].min())} is below 1")
    outside = (df["step"] < 0) | (df["step"] > df["steps"])
    if outside.any():
        first = df[outside].iloc[0]
        raise AnalysisError(f"column 'step': {first['step']} of rollout '{first['rollout_id']}' is outside "
                            f"[0, steps={first['steps']}]")
    df = df.sort_values(["rollout_id", "step"], kind="mergesort").reset_index(drop=True)
    df.attrs[_CHECKED] = True
    return df


_CHECKED = "robocasa_shift.boundary_scores_checked"
_CHECKED_DTYPES = {"success": "b", "episode": "i", "steps": "i", "horizon": "i", "step": "i", "score": "f"}


def _already_checked(scores: pd.DataFrame) -> bool:
    """A frame :func:`check_boundary_scores` returned (or a row subset of one, in its order): the mark it
    carries, every column of its type, and its rows still sorted by (rollout_id, step) with no repeat."""
    if not scores.attrs.get(_CHECKED) or scores.empty:
        return False
    if any(c not in scores.columns for c in BOUNDARY_COLUMNS):
        return False
    if any(scores[c].dtype.kind != kind for c, kind in _CHECKED_DTYPES.items()):
        return False
    if scores[list(ROLLOUT_COLUMNS) + ["step"]].isna().to_numpy().any():
        return False
    rid = scores["rollout_id"].to_numpy()
    step = scores["step"].to_numpy()
    try:
        ordered = bool(np.all((rid[1:] > rid[:-1]) | ((rid[1:] == rid[:-1]) & (step[1:] > step[:-1]))))
    except TypeError:
        return False
    return ordered and bool(((step >= 0) & (step <= scores["steps"].to_numpy())).all())


def _as_bool(series: pd.Series) -> pd.Series:
    if series.dtype == bool:
        return series
    for value in series.unique().tolist():
        if isinstance(value, str) or value not in (0, 1):  # True == 1, False == 0
            raise AnalysisError(f"column 'success': {value!r} is not a boolean (use True/False or 1/0)")
    return series.astype(bool)


def _as_int(series: pd.Series, column: str) -> pd.Series:
    if series.dtype == bool:
        raise AnalysisError(f"column '{column}' holds booleans, expected integers")
    numeric = pd.to_numeric(series, errors="coerce").astype(float)
    bad = ~np.isfinite(numeric) | (numeric != np.floor(numeric))
    if bad.any():
        raise AnalysisError(f"column '{column}': {series[bad].iloc[0]!r} is not an integer")
    return numeric.astype(np.int64)


def _rollouts(df: pd.DataFrame) -> pd.DataFrame:
    """One row per rollout of a checked frame: its per-rollout columns (and ``split`` when present)."""
    columns = list(ROLLOUT_COLUMNS) + ([SPLIT_COLUMN] if SPLIT_COLUMN in df.columns else [])
    return df.drop_duplicates("rollout_id")[columns].reset_index(drop=True)


def _tasks(df: pd.DataFrame) -> List[str]:
    return sorted(df["task"].unique().tolist())


# --------------------------------------------------------------------------- windows


def window_limits(
    scores: pd.DataFrame,
    kind: str,
    validation: Optional[Mapping[str, Any]] = None,
    cap_fraction: float = DEFAULT_CAP_FRACTION,
) -> Limits:
    """The evaluation window of every task in ``scores``.

    Args:
        scores: boundary scores.
        kind: ``"end"`` (no limit), ``"early"`` (per task, the shortest ``steps`` among the
            clean successes of that task's validation episodes: SAFE's retrospective benchmark
            cap) or ``"cap"`` (``floor(cap_fraction * horizon)`` per task: a predeclared fixed
            horizon).
        validation: for ``"early"`` only: {task: validation base episodes}, or the splits of
            :func:`split_episodes` (their ``"validation"`` lists are read).
        cap_fraction: for ``"cap"``: the fraction of the horizon, in (0, 1].

    Returns:
        {task: max_step or None}; a boundary is in the window when its step <= max_step.

    Raises:
        AnalysisError: an unknown kind; ``"early"`` without validation episodes, or a task
            without a clean validation success (named); ``"cap"`` with a fraction outside
            (0, 1], a task whose horizon varies, or a cap below one step.
    """
    df = check_boundary_scores(scores)
    if kind == "end":
        return {task: None for task in _tasks(df)}
    if kind == "early":
        return _early_limits(df, validation)
    if kind == "cap":
        return _cap_limits(df, cap_fraction)
    raise AnalysisError(f"unknown window kind '{kind}'; known: {', '.join(WINDOW_KINDS)}")


def _validation_episodes(validation: Optional[Mapping[str, Any]], task: str) -> List[int]:
    if validation is None:
        raise AnalysisError("the 'early' window needs the validation episodes of every task "
                            "(pass validation=split_episodes(...))")
    if task not in validation:
        raise AnalysisError(f"task '{task}' has no validation episodes; the 'early' window needs them")
    episodes = validation[task]
    if isinstance(episodes, Mapping):
        episodes = episodes.get(VALIDATION, [])
    return [int(e) for e in episodes]


def _early_limits(df: pd.DataFrame, validation: Optional[Mapping[str, Any]]) -> Limits:
    rollouts = _rollouts(df)
    limits: Limits = {}
    for task in _tasks(df):
        episodes = _validation_episodes(validation, task)
        mine = rollouts[(rollouts["task"] == task) & (rollouts["condition"] == CLEAN) & rollouts["success"]
                        & rollouts["episode"].isin(episodes)]
        if mine.empty:
            raise AnalysisError(f"task '{task}' has no clean success among its validation episodes {sorted(episodes)}; "
                                "the 'early' window needs one (use the 'cap' or 'end' window for it)")
        limits[task] = int(mine["steps"].min())
    return limits


def _cap_limits(df: pd.DataFrame, cap_fraction: float) -> Limits:
    if not 0 < cap_fraction <= 1:
        raise AnalysisError(f"cap_fraction {cap_fraction!r} must lie in (0, 1]")
    rollouts = _rollouts(df)
    limits: Limits = {}
    for task in _tasks(df):
        horizons = sorted(rollouts.loc[rollouts["task"] == task, "horizon"].unique().tolist())
        if len(horizons) > 1:
            raise AnalysisError(f"column 'horizon' varies within task '{task}' ({horizons}); "
                                "the 'cap' window needs one")
        cap = math.floor(cap_fraction * horizons[0])
        if cap < 1:
            raise AnalysisError(f"task '{task}': a cap of {cap_fraction} x horizon {horizons[0]} is below one step")
        limits[task] = int(cap)
    return limits


def standard_windows(scores: pd.DataFrame, splits: Mapping[str, Any],
                     cap_fraction: float = DEFAULT_CAP_FRACTION) -> Dict[str, Limits]:
    """The three windows at once, ``{"end": ..., "early": ..., "cap": ...}`` (see :func:`window_limits`)."""
    return {kind: window_limits(scores, kind, splits, cap_fraction) for kind in WINDOW_KINDS}


def limits_frame(limits_by_window: Mapping[str, Mapping[str, Optional[int]]]) -> pd.DataFrame:
    """The windows as a tidy table (columns window, task, max_step; None for no limit), to report them."""
    rows = [{"window": window, "task": task, "max_step": limits[task]}
            for window, limits in limits_by_window.items() for task in sorted(limits)]
    return pd.DataFrame(rows, columns=["window", "task", "max_step"])


def _limit_per_rollout(rollouts: pd.DataFrame, limits: Mapping[str, Optional[int]]) -> np.ndarray:
    """Each rollout's max step as a float array (+inf where the window has no limit)."""
    out = np.empty(len(rollouts), dtype=float)
    for task in rollouts["task"].unique().tolist():
        if task not in limits:
            raise AnalysisError(f"task '{task}' has no window limit; the window covers {sorted(limits)}")
        limit = limits[task]
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 1):
            raise AnalysisError(f"task '{task}': window limit {limit!r} is not a positive integer or None")
        out[(rollouts["task"] == task).to_numpy()] = np.inf if limit is None else float(limit)
    return out


def _in_window(df: pd.DataFrame, limits: Mapping[str, Optional[int]]) -> Tuple[pd.DataFrame, np.ndarray]:
    """The rollouts with their ``window_end`` = min(limit, steps), and a mask of in-window boundaries."""
    rollouts = _rollouts(df)
    limit = _limit_per_rollout(rollouts, limits)
    rollouts["window_end"] = np.minimum(limit, rollouts["steps"].to_numpy(dtype=float)).astype(np.int64)
    per_row = pd.Series(limit, index=rollouts["rollout_id"]).loc[df["rollout_id"]].to_numpy()
    return rollouts, df["step"].to_numpy(dtype=float) <= per_row


def episode_scores(scores: pd.DataFrame, limits: Mapping[str, Optional[int]]) -> pd.DataFrame:
    """One score per rollout: the max of its boundary scores inside the window.

    Args:
        scores: boundary scores.
        limits: a window (:func:`window_limits`) covering every task of ``scores``.

    Returns:
        One row per rollout, sorted by rollout_id: rollout_id, task, episode, condition,
        success, steps, horizon (and ``split`` when ``scores`` has it), ``score`` (NaN-safe max
        over the boundaries with step <= limit; -inf when there is none or all are NaN) and
        ``window_end`` (min(limit, steps), or steps without a limit: where a miss is counted).

    Raises:
        AnalysisError: the table is malformed, or a task has no limit in ``limits``.
    """
    df = check_boundary_scores(scores)
    rollouts, inside = _in_window(df, limits)
    masked = np.where(inside, df["score"].fillna(-np.inf).to_numpy(), -np.inf)
    best = pd.Series(masked, index=df["rollout_id"]).groupby(level=0, sort=False).max()
    rollouts["score"] = best.loc[rollouts["rollout_id"]].to_numpy()
    return _order_columns(rollouts, ["score", "window_end"])


def _order_columns(rollouts: pd.DataFrame, tail: Sequence[str]) -> pd.DataFrame:
    head = list(ROLLOUT_COLUMNS) + ([SPLIT_COLUMN] if SPLIT_COLUMN in rollouts.columns else [])
    return rollouts[head + list(tail)].reset_index(drop=True)


# --------------------------------------------------------------------------- ranking


def _finite_or_low(values: Iterable[float]) -> np.ndarray:
    """Scores as a float array with NaN read as -inf (no alarm)."""
    array = np.asarray(list(values) if not isinstance(values, (np.ndarray, pd.Series)) else values, dtype=float)
    return np.where(np.isnan(array), -np.inf, array)


def _double_wins(pos: np.ndarray, neg: np.ndarray) -> int:
    """2 x (pairs with pos > neg) + (tied pairs): an integer, so pair sums stay exact."""
    if pos.size == 0 or neg.size == 0:
        return 0
    ordered = np.sort(neg)
    below = np.searchsorted(ordered, pos, side="left")
    at_or_below = np.searchsorted(ordered, pos, side="right")
    return int(below.sum()) + int(at_or_below.sum())


def roc_auc(pos: Iterable[float], neg: Iterable[float]) -> Optional[float]:
    """Exact ROC AUC (Mann-Whitney): P(pos > neg) + P(pos == neg) / 2 over all pairs.

    Args:
        pos: scores of the positive class (failures); NaN counts as -inf.
        neg: scores of the negative class (successes); NaN counts as -inf.

    Returns:
        The AUC, or None when either class is empty.
    """
    p, n = _finite_or_low(pos), _finite_or_low(neg)
    if p.size == 0 or n.size == 0:
        return None
    return _double_wins(p, n) / (2 * p.size * n.size)


@dataclass(frozen=True)
class TaskAuc:
    """One task's AUC (None when it has only one class) and its class counts."""

    task: str
    auc: Optional[float]
    n_failures: int
    n_successes: int


@dataclass(frozen=True)
class AucDecomposition:
    """Pooled AUC split exactly into within-task and between-task pairs, beside the macro AUC.

    ``pooled_auc == weight_within * within_auc + weight_between * between_auc`` (a part with no
    pairs has AUC None and weight 0). ``within_auc`` is the within-task *micro* AUC (pairs of
    all tasks pooled); ``macro_auc`` is the unweighted mean of the per-task AUCs over the tasks
    with both classes (``skipped_tasks`` lists the others).
    """

    pooled_auc: Optional[float]
    within_auc: Optional[float]
    between_auc: Optional[float]
    weight_within: Optional[float]
    weight_between: Optional[float]
    macro_auc: Optional[float]
    n_pairs: int
    n_pairs_within: int
    n_pairs_between: int
    n_failures: int
    n_successes: int
    per_task: Tuple[TaskAuc, ...]
    skipped_tasks: Tuple[str, ...]

    def summary(self) -> Dict[str, Any]:
        """The scalar fields as a flat dict (per-task results left out; skipped tasks comma-joined)."""
        out = {k: v for k, v in asdict(self).items() if k not in ("per_task", "skipped_tasks")}
        out["skipped_tasks"] = ", ".join(self.skipped_tasks)
        return out

    def per_task_frame(self) -> pd.DataFrame:
        """The per-task AUCs and counts, one row per task."""
        return pd.DataFrame([asdict(t) for t in self.per_task], columns=["task", "auc", "n_failures", "n_successes"])


def _check_episode_frame(ep: pd.DataFrame) -> None:
    missing = [c for c in ("task", "success", "score") if c not in ep.columns]
    if missing:
        raise AnalysisError(f"episode scores lack column(s) {', '.join(repr(c) for c in missing)}")
    if ep["success"].dtype != bool:
        raise AnalysisError("column 'success' of the episode scores must be boolean (use episode_scores)")


def auc_decomposition(ep: pd.DataFrame) -> AucDecomposition:
    """Pooled, within-task, between-task, macro and per-task AUC of episode scores.

    Args:
        ep: episode scores (:func:`episode_scores`): columns task, success (bool), score.

    Returns:
        An :class:`AucDecomposition`; AUCs are None where their pairs do not exist.

    Raises:
        AnalysisError: a column is missing or ``success`` is not boolean.
    """
    _check_episode_frame(ep)
    score = _finite_or_low(ep["score"].to_numpy())
    failed = ~ep["success"].to_numpy(dtype=bool)
    task = ep["task"].to_numpy()
    wins = {"within": 0, "between": 0}
    pairs = {"within": 0, "between": 0}
    per_task: List[TaskAuc] = []
    for name in sorted(set(task.tolist())):
        mine = task == name
        pos, neg, neg_other = score[mine & failed], score[mine & ~failed], score[~mine & ~failed]
        wins["within"] += _double_wins(pos, neg)
        pairs["within"] += pos.size * neg.size
        wins["between"] += _double_wins(pos, neg_other)
        pairs["between"] += pos.size * neg_other.size
        per_task.append(TaskAuc(name, roc_auc(pos, neg), int(pos.size), int(neg.size)))
    total = pairs["within"] + pairs["between"]
    rated = [t for t in per_task if t.auc is not None]

    def auc_of(part: str) -> Optional[float]:
        return wins[part] / (2 * pairs[part]) if pairs[part] else None

    return AucDecomposition(
        pooled_auc=roc_auc(score[failed], score[~failed]),
        within_auc=auc_of("within"),
        between_auc=auc_of("between"),
        weight_within=pairs["within"] / total if total else None,
        weight_between=pairs["between"] / total if total else None,
        macro_auc=float(np.mean([t.auc for t in rated])) if rated else None,
        n_pairs=total,
        n_pairs_within=pairs["within"],
        n_pairs_between=pairs["between"],
        n_failures=int(failed.sum()),
        n_successes=int((~failed).sum()),
        per_task=tuple(per_task),
        skipped_tasks=tuple(t.task for t in per_task if t.auc is None),
    )


def length_only_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """The length-only baseline: each boundary scored by the number of boundaries reached so far.

    At the end window a rollout's episode score is its boundary count, so when every failure
    is a horizon timeout and successes end earlier, this "monitor" recovers the label (AUC 1.0)
    without any failure information; within an early window it mostly cannot.

    Args:
        scores: boundary scores of any monitor (only the rollouts and their steps are read).

    Returns:
        The same rows and columns (sorted by rollout_id, step) with ``score`` = 1, 2, 3, ... along
        each rollout's boundaries.
    """
    df = check_boundary_scores(scores)
    df["score"] = (df.groupby("rollout_id", sort=False).cumcount() + 1).astype(float)
    return df


LENGTH_ONLY, ELAPSED_TIME, TASK_IDENTITY = "length_only", "elapsed_time", "task_identity"
BASELINES = (LENGTH_ONLY, ELAPSED_TIME, TASK_IDENTITY)
"""The baselines beside every AUC (the pooled-AUC report, Sec. 6, item 3): boundaries reached, control steps
elapsed, and the task's base rate of failure (a score that knows only which task it is)."""
BASELINE_PREFIX = {LENGTH_ONLY: "length", ELAPSED_TIME: "elapsed", TASK_IDENTITY: "task_identity"}


def elapsed_time_scores(scores: pd.DataFrame) -> pd.DataFrame:
    """The elapsed-time baseline: each boundary scored by its control step (the time since the start).

    Like :func:`length_only_scores` it reads how long a rollout has run, in steps rather than in
    boundaries (they differ where chunks differ in length).
    """
    df = check_boundary_scores(scores)
    df["score"] = df["step"].astype(float)
    return df


def task_base_rates(scores: pd.DataFrame, part: Optional[str] = VALIDATION) -> Dict[str, float]:
    """Each task's failure rate over its rollouts (of ``part`` of the split when ``scores`` has a ``split``
    column and ``part`` is given; every rollout otherwise): the task-identity baseline's score.

    A task without rollouts in ``part`` gets the rate over every rollout of ``part`` (of all tasks).
    """
    df = check_boundary_scores(scores)
    rollouts = _rollouts(df)
    if part is not None and SPLIT_COLUMN in rollouts.columns:
        chosen = rollouts[rollouts[SPLIT_COLUMN] == part]
        rollouts = chosen if len(chosen) else rollouts
    overall = float((~rollouts["success"]).mean()) if len(rollouts) else 0.5
    rates = {}
    for task in _tasks(df):
        mine = rollouts[rollouts["task"] == task]
        rates[task] = float((~mine["success"]).mean()) if len(mine) else overall
    return rates


def task_identity_scores(scores: pd.DataFrame, rates: Mapping[str, float]) -> pd.DataFrame:
    """The task-identity baseline: every boundary of a rollout scored by its task's base rate of failure.

    Its AUC within one task is 0.5 (all ties); pooled over tasks it ranks by base rate only, so it
    shows how much of a pooled AUC task identity alone buys (the pooled-AUC report, Sec. 3.2).
    """
    df = check_boundary_scores(scores)
    overall = float(np.mean(list(rates.values()))) if rates else 0.5
    df["score"] = df["task"].map(lambda task: float(rates.get(task, overall))).astype(float)
    return df


def baseline_scores(scores: pd.DataFrame, rates: Optional[Mapping[str, float]] = None) -> Dict[str, pd.DataFrame]:
    """The boundary scores of every baseline of :data:`BASELINES` on the rollouts of ``scores``."""
    df = check_boundary_scores(scores)
    rates = task_base_rates(df) if rates is None else rates
    return {LENGTH_ONLY: length_only_scores(df), ELAPSED_TIME: elapsed_time_scores(df),
            TASK_IDENTITY: task_identity_scores(df, rates)}


# --------------------------------------------------------------------------- thresholds and alarms


def select_threshold(ep_validation_successes: Union[pd.DataFrame, Sequence[float], np.ndarray],
                     target_fa: float = DEFAULT_TARGET_FA) -> float:
    """The smallest threshold whose false-alarm rate on validation successes is at most the target.

    An alarm fires when score >= threshold. Candidates are the observed scores and +inf; the
    result is the smallest candidate t with ``mean(score >= t) <= target_fa``.

    Args:
        ep_validation_successes: episode scores of the validation successes (a frame with a
            ``score`` column, and if it has ``success``, only True rows) or the scores
            themselves; NaN counts as -inf.
        target_fa: the false-alarm target, in [0, 1].

    Returns:
        The threshold (+inf when no observed score meets the target: never alarm).

    Raises:
        AnalysisError: no scores; a target outside [0, 1]; a frame that holds failures; +inf
            scores on more than ``target_fa`` of the successes (no threshold can meet it).
    """
    if not 0 <= target_fa <= 1:
        raise AnalysisError(f"target_fa {target_fa!r} must lie in [0, 1]")
    if isinstance(ep_validation_successes, pd.DataFrame):
        frame = ep_validation_successes
        if "score" not in frame.columns:
            raise AnalysisError("validation successes lack column 'score'")
        if "success" in frame.columns and not frame["success"].astype(bool).all():
            raise AnalysisError("column 'success': the threshold is chosen on successes only, "
                                "but the validation frame holds failures")
        values = frame["score"].to_numpy()
    else:
        values = ep_validation_successes
    s = np.sort(_finite_or_low(values))
    if s.size == 0:
        raise AnalysisError("no validation successes to choose a threshold on")
    candidates = np.append(np.unique(s), np.inf) if s[-1] < np.inf else np.unique(s)
    alarmed = s.size - np.searchsorted(s, candidates, side="left")
    meets = alarmed / s.size <= target_fa
    if not meets.any():
        raise AnalysisError(f"column 'score': +inf on {alarmed[-1]} of {s.size} validation successes; "
                            f"no threshold meets the false-alarm target {target_fa}")
    return float(candidates[np.argmax(meets)])


def alarm_steps(scores: pd.DataFrame, threshold: float, limits: Mapping[str, Optional[int]]) -> pd.DataFrame:
    """The first alarm of every rollout inside the window.

    Args:
        scores: boundary scores.
        threshold: an alarm fires at the first boundary with score >= threshold (NaN never fires).
        limits: a window covering every task of ``scores``.

    Returns:
        One row per rollout, sorted by rollout_id: its per-rollout columns, ``window_end``,
        ``alarm_step`` (float; NaN when no in-window boundary fires) and ``alarmed`` (bool).
    """
    df = check_boundary_scores(scores)
    rollouts, inside = _in_window(df, limits)
    fires = inside & (df["score"].fillna(-np.inf).to_numpy() >= threshold)
    first = df.loc[fires].groupby("rollout_id", sort=False)["step"].min()
    return _with_alarms(rollouts, first)


def _with_alarms(rollouts: pd.DataFrame, first: pd.Series) -> pd.DataFrame:
    rollouts["alarm_step"] = first.reindex(rollouts["rollout_id"]).to_numpy(dtype=float)
    rollouts["alarmed"] = ~np.isnan(rollouts["alarm_step"].to_numpy())
    return _order_columns(rollouts, ["window_end", "alarm_step", "alarmed"])


@dataclass(frozen=True)
class OperatingPoint:
    """What one alarm rule does on a set of rollouts (rates and means are None without rollouts to average).

    - ``false_alarm_rate``: alarmed successes / successes; ``catch_rate``: alarmed failures / failures.
    - ``mean_alarm_step_caught``: mean first-alarm step of the caught failures (RESCUE's t_d).
    - ``mean_alarm_position_steps`` / ``_fraction``: over all failures, a miss counted at the
      window end (``window_end`` = min(limit, steps)); the fraction is alarm_step / window_end
      per failure (1.0 for a miss), then averaged.
    - ``mean_false_alarm_step``: mean first-alarm step of the false-alarmed successes (t_fa).
    - ``mean_length_false_alarmed``: mean natural length (steps) of the false-alarmed successes
      (RESCUE's T_s,FA: the successes this rule alarms on, not all successes).
    """

    threshold: Optional[float]
    n_successes: int
    n_false_alarms: int
    false_alarm_rate: Optional[float]
    n_failures: int
    n_caught: int
    catch_rate: Optional[float]
    mean_alarm_step_caught: Optional[float]
    mean_alarm_position_steps: Optional[float]
    mean_alarm_position_fraction: Optional[float]
    mean_false_alarm_step: Optional[float]
    mean_length_false_alarmed: Optional[float]

    def as_dict(self) -> Dict[str, Any]:
        """The fields as a flat dict."""
        return asdict(self)


def _mean(values: np.ndarray) -> Optional[float]:
    return float(np.mean(values)) if values.size else None


def summarize_alarms(alarms: pd.DataFrame, threshold: Optional[float] = None) -> OperatingPoint:
    """The operating point of any alarm table (:func:`alarm_steps`, :func:`rate_matched_random_alarm`).

    Args:
        alarms: one row per rollout with success, steps, window_end, alarm_step, alarmed.
        threshold: recorded in the result (None for a rule without one, e.g. random alarms).

    Returns:
        An :class:`OperatingPoint`.
    """
    success = alarms["success"].to_numpy(dtype=bool)
    alarmed = alarms["alarmed"].to_numpy(dtype=bool)
    step = alarms["alarm_step"].to_numpy(dtype=float)
    end = alarms["window_end"].to_numpy(dtype=float)
    length = alarms["steps"].to_numpy(dtype=float)
    failed = ~success
    caught, false_alarm = failed & alarmed, success & alarmed
    position = np.where(alarmed, step, end)[failed]
    fraction = np.where(alarmed, step / end, 1.0)[failed]
    n_s, n_f = int(success.sum()), int(failed.sum())
    return OperatingPoint(
        threshold=threshold,
        n_successes=n_s,
        n_false_alarms=int(false_alarm.sum()),
        false_alarm_rate=int(false_alarm.sum()) / n_s if n_s else None,
        n_failures=n_f,
        n_caught=int(caught.sum()),
        catch_rate=int(caught.sum()) / n_f if n_f else None,
        mean_alarm_step_caught=_mean(step[caught]),
        mean_alarm_position_steps=_mean(position),
        mean_alarm_position_fraction=_mean(fraction),
        mean_false_alarm_step=_mean(step[false_alarm]),
        mean_length_false_alarmed=_mean(length[false_alarm]),
    )


def operating_point(scores: pd.DataFrame, threshold: float, limits: Mapping[str, Optional[int]]) -> OperatingPoint:
    """Realised false alarms, catches and alarm timing of one threshold inside one window.

    Args:
        scores: boundary scores of the rollouts to evaluate (e.g. test rollouts).
        threshold: alarm when score >= threshold.
        limits: a window covering every task of ``scores``.

    Returns:
        An :class:`OperatingPoint` (misses counted at the window end).
    """
    return summarize_alarms(alarm_steps(scores, threshold, limits), threshold)


def rate_matched_random_alarm(scores: pd.DataFrame, rate: float, rng: np.random.Generator,
                              limits: Optional[Mapping[str, Optional[int]]] = None) -> pd.DataFrame:
    """A control alarm: each rollout fires with probability ``rate`` at a uniform in-window boundary.

    Rollouts are visited in rollout_id order and two draws are taken for every rollout
    (whether it fires, and at which boundary), so the result depends only on the generator's
    state and the rollouts, never on the row order or the outcomes.

    Args:
        scores: boundary scores (only rollouts and boundary steps are read).
        rate: the per-rollout alarm probability, e.g. the monitor's realised alarm rate on the
            same rollouts, in [0, 1].
        rng: a seeded numpy Generator (never the global ``np.random``).
        limits: a window; None for the end window.

    Returns:
        The table of :func:`alarm_steps` for these random alarms (summarise it with
        :func:`summarize_alarms`).

    Raises:
        AnalysisError: a rate outside [0, 1] or ``rng`` not a numpy Generator.
    """
    if not 0 <= rate <= 1:
        raise AnalysisError(f"rate {rate!r} must lie in [0, 1]")
    if not isinstance(rng, np.random.Generator):
        raise AnalysisError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    df = check_boundary_scores(scores)
    if limits is None:
        limits = {task: None for task in _tasks(df)}
    rollouts, inside = _in_window(df, limits)
    in_window = df.loc[inside, ["rollout_id", "step"]]  # sorted by rollout_id, step
    counts = in_window.groupby("rollout_id", sort=False).size().reindex(rollouts["rollout_id"], fill_value=0)
    counts = counts.to_numpy()
    fires = rng.random(len(rollouts)) < rate
    pick = rng.integers(0, np.maximum(counts, 1))
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    fires &= counts > 0
    steps = in_window["step"].to_numpy()
    first = pd.Series(steps[(start + pick)[fires]], index=rollouts["rollout_id"].to_numpy()[fires], dtype=float)
    return _with_alarms(rollouts, first)


# --------------------------------------------------------------------------- splits


def split_episodes(scores: pd.DataFrame, seed: int, validation_fraction: float = 0.5) -> Splits:
    """Split every task's base episodes into validation and test, by a seeded permutation.

    Per task, the sorted base episodes are permuted by a generator seeded with
    ``derive_seed(seed, stream="monitor_split", task=task)`` (numpy SeedSequence), so a task's
    split does not depend on the other tasks or the row order; the first
    ``max(1, floor(n * validation_fraction))`` are validation, the rest test. A base episode's
    clean and perturbed rollouts share its split.

    Args:
        scores: boundary (or episode) scores with columns task and episode.
        seed: an int seed.
        validation_fraction: the share of base episodes for validation, in (0, 1).

    Returns:
        {task: {"validation": sorted episodes, "test": sorted episodes}}.

    Raises:
        AnalysisError: a missing column, a seed that is not an int, or a fraction outside (0, 1).
    """
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AnalysisError(f"seed {seed!r} must be an int")
    if not 0 < validation_fraction < 1:
        raise AnalysisError(f"validation_fraction {validation_fraction!r} must lie in (0, 1)")
    for column in ("task", "episode"):
        if column not in scores.columns:
            raise AnalysisError(f"scores lack column '{column}'; splits are by task and base episode")
    splits: Splits = {}
    for task in sorted(scores["task"].unique().tolist()):
        episodes = sorted(int(e) for e in scores.loc[scores["task"] == task, "episode"].unique())
        order = np.random.default_rng(derive_seed(int(seed), stream=SPLIT_STREAM, task=task)).permutation(len(episodes))
        n_validation = max(1, math.floor(len(episodes) * validation_fraction))
        chosen = [episodes[i] for i in order]
        splits[task] = {VALIDATION: sorted(chosen[:n_validation]), TEST: sorted(chosen[n_validation:])}
    return splits


def add_split_column(scores: pd.DataFrame, splits: Mapping[str, Mapping[str, Sequence[int]]]) -> pd.DataFrame:
    """A copy of ``scores`` with a ``split`` column ("validation" or "test") from its (task, episode).

    Raises:
        AnalysisError: a task missing from ``splits``, or a base episode in neither or both lists.
    """
    lookup: Dict[Tuple[str, int], str] = {}
    for task, parts in splits.items():
        for part in (VALIDATION, TEST):
            for episode in parts.get(part, []):
                if (task, int(episode)) in lookup:
                    raise AnalysisError(f"task '{task}': base episode {episode} is in both validation and test")
                lookup[(task, int(episode))] = part
    out = scores.copy()
    keys = list(zip(out["task"].tolist(), [int(e) for e in out["episode"].tolist()]))
    unknown = sorted({k for k in keys if k not in lookup})
    if unknown:
        task, episode = unknown[0]
        raise AnalysisError(f"task '{task}': base episode {episode} is in no split "
                            f"({len(unknown)} (task, episode) key(s) unsplit)")
    out[SPLIT_COLUMN] = [lookup[k] for k in keys]
    return out


def _require_split(df: pd.DataFrame) -> None:
    if SPLIT_COLUMN not in df.columns:
        raise AnalysisError(f"boundary scores lack column '{SPLIT_COLUMN}'; add it with add_split_column")
    odd = sorted(set(df[SPLIT_COLUMN].unique().tolist()) - {VALIDATION, TEST})
    if odd:
        raise AnalysisError(f"column '{SPLIT_COLUMN}': {odd} are neither '{VALIDATION}' nor '{TEST}'")


def _calibration_successes(ep: pd.DataFrame) -> pd.DataFrame:
    """The episode scores thresholds are chosen on: clean successes of validation episodes."""
    return ep[(ep[SPLIT_COLUMN] == VALIDATION) & (ep["condition"] == CLEAN) & ep["success"]]


# --------------------------------------------------------------------------- leave one task out


def leave_one_task_out(scores: pd.DataFrame, limits: Mapping[str, Optional[int]],
                       target_fa: float = DEFAULT_TARGET_FA) -> pd.DataFrame:
    """Every task held out once: its threshold chosen on the other tasks, evaluated on it.

    The monitors here are not trained, so this does not test a learned detector's transfer to an
    unseen task: it tests the transfer of the *operating point* (a threshold selected on the
    validation clean successes of the other tasks, at ``target_fa``) to the held-out task's test
    rollouts (every condition present in ``scores``; filter the frame to restrict). An
    ``"early"`` window uses each task's own validation successes, so for a strictly unseen task
    prefer ``"cap"`` or ``"end"``.

    Args:
        scores: boundary scores with a ``split`` column (:func:`add_split_column`).
        limits: a window covering every task.
        target_fa: the false-alarm target of the threshold selection.

    Returns:
        One row per held-out task: task, threshold, n_calibration_successes, n_test_rollouts,
        n_failures, n_successes, auc (the monitor's AUC on the task's test rollouts),
        length_only_auc (the boundary-count baseline on the same rollouts), elapsed_time_auc
        and task_identity_auc (the other baselines; a task's base rate is one score for all its
        rollouts, so its AUC within one task is 0.5 by construction), n_false_alarms,
        false_alarm_rate, n_caught, catch_rate, mean_alarm_position_fraction.

    Raises:
        AnalysisError: no ``split`` column, or no validation clean success outside a task.
    """
    df = check_boundary_scores(scores)
    _require_split(df)
    ep = episode_scores(df, limits)
    length_ep = episode_scores(length_only_scores(df), limits)
    elapsed_ep = episode_scores(elapsed_time_scores(df), limits)
    identity_ep = episode_scores(task_identity_scores(df, task_base_rates(df)), limits)
    rows = []
    for task in _tasks(df):
        calibration = _calibration_successes(ep[ep["task"] != task])
        if calibration.empty:
            raise AnalysisError(f"task '{task}': no validation clean success in the other tasks "
                                "to choose its threshold on")
        threshold = select_threshold(calibration, target_fa)
        held = ep[(ep["task"] == task) & (ep[SPLIT_COLUMN] == TEST)]
        held_ids = set(held["rollout_id"].tolist())
        point = summarize_alarms(_alarms_of(df, held_ids, threshold, limits), threshold)
        length_held = length_ep[length_ep["rollout_id"].isin(held_ids)]
        rows.append({
            "task": task, "threshold": threshold, "n_calibration_successes": len(calibration),
            "n_test_rollouts": len(held), "n_failures": point.n_failures, "n_successes": point.n_successes,
            "auc": _split_auc(held), "length_only_auc": _split_auc(length_held),
            "elapsed_time_auc": _split_auc(elapsed_ep[elapsed_ep["rollout_id"].isin(held_ids)]),
            "task_identity_auc": _split_auc(identity_ep[identity_ep["rollout_id"].isin(held_ids)]),
            "n_false_alarms": point.n_false_alarms, "false_alarm_rate": point.false_alarm_rate,
            "n_caught": point.n_caught, "catch_rate": point.catch_rate,
            "mean_alarm_position_fraction": point.mean_alarm_position_fraction,
        })
    return pd.DataFrame(rows)


def _split_auc(ep: pd.DataFrame) -> Optional[float]:
    success = ep["success"].to_numpy(dtype=bool)
    score = ep["score"].to_numpy(dtype=float)
    return roc_auc(score[~success], score[success])


def _alarms_of(df: pd.DataFrame, rollout_ids: set, threshold: float,
               limits: Mapping[str, Optional[int]]) -> pd.DataFrame:
    """Alarm table of the given rollouts (an empty table, with its columns, when there are none)."""
    subset = df[df["rollout_id"].isin(rollout_ids)]
    if subset.empty:
        columns = list(ROLLOUT_COLUMNS) + [SPLIT_COLUMN, "window_end", "alarm_step", "alarmed"]
        return pd.DataFrame({c: pd.Series(dtype=bool if c in ("success", "alarmed") else float) for c in columns})
    return alarm_steps(subset, threshold, limits)


# --------------------------------------------------------------------------- the detection table


def _conditions(df: pd.DataFrame, conditions: Optional[Sequence[str]]) -> List[str]:
    present = set(df["condition"].unique().tolist())
    if conditions is None:
        return ([CLEAN] if CLEAN in present else []) + sorted(present - {CLEAN})
    unknown = [c for c in conditions if c not in present and c != ALL_CONDITIONS]
    if unknown:
        raise AnalysisError(f"column 'condition': {unknown} not in the scores; present: {sorted(present)}")
    return list(conditions)


def _evaluation_row(ep: pd.DataFrame, length_ep: pd.DataFrame, alarms: pd.DataFrame,
                    threshold: float, baseline_eps: Optional[Mapping[str, pd.DataFrame]] = None) -> Dict[str, Any]:
    """The detection measures of one set of rollouts (already restricted to one window and condition), with the
    AUCs of every baseline in ``baseline_eps`` (name -> its episode scores on the same rollouts) beside them."""
    monitor, length = auc_decomposition(ep), auc_decomposition(length_ep)
    point = summarize_alarms(alarms, threshold)
    extra: Dict[str, Any] = {}
    for name, base_ep in (baseline_eps or {}).items():
        base = auc_decomposition(base_ep)
        extra[f"{BASELINE_PREFIX[name]}_pooled_auc"] = base.pooled_auc
        extra[f"{BASELINE_PREFIX[name]}_macro_auc"] = base.macro_auc
    return {
        "n_rollouts": len(ep), "n_tasks": int(ep["task"].nunique()),
        "n_failures": monitor.n_failures, "n_successes": monitor.n_successes,
        "pooled_auc": monitor.pooled_auc, "macro_auc": monitor.macro_auc,
        "within_auc": monitor.within_auc, "between_auc": monitor.between_auc,
        "weight_within": monitor.weight_within, "weight_between": monitor.weight_between,
        "n_pairs": monitor.n_pairs, "skipped_tasks": ", ".join(monitor.skipped_tasks),
        "length_pooled_auc": length.pooled_auc, "length_macro_auc": length.macro_auc, **extra,
        "threshold": threshold,
        "n_false_alarms": point.n_false_alarms, "false_alarm_rate": point.false_alarm_rate,
        "n_caught": point.n_caught, "catch_rate": point.catch_rate,
        "mean_alarm_step_caught": point.mean_alarm_step_caught,
        "mean_alarm_position_steps": point.mean_alarm_position_steps,
        "mean_alarm_position_fraction": point.mean_alarm_position_fraction,
    }


def _limits_text(limits: Mapping[str, Optional[int]]) -> str:
    """A window as text for a table cell, e.g. ``"Door=55, Lift=25"`` (``none`` for no limit)."""
    return ", ".join(f"{task}={'none' if limits[task] is None else limits[task]}" for task in sorted(limits))


def detection_table(
    scores: pd.DataFrame,
    splits: Mapping[str, Mapping[str, Sequence[int]]],
    limits_by_window: Mapping[str, Mapping[str, Optional[int]]],
    target_fa: float = DEFAULT_TARGET_FA,
    conditions: Optional[Sequence[str]] = None,
    task_rates: Optional[Mapping[str, float]] = None,
) -> pd.DataFrame:
    """Ranking and operating-point measures over windows x conditions, on test rollouts.

    Per window, one threshold is chosen on the validation clean successes of every task
    (:func:`select_threshold` at ``target_fa``) and frozen for every condition; each condition
    is then evaluated on its test rollouts. The length-only baseline's AUCs on the same rollouts
    and window sit beside the monitor's.

    Args:
        scores: boundary scores of one monitor.
        splits: :func:`split_episodes` of the same rollouts.
        limits_by_window: {window name: limits}, e.g. :func:`standard_windows`.
        target_fa: the false-alarm target of the threshold selection.
        conditions: the conditions to evaluate, in order; None: clean first, then the others sorted.
            ``"all"`` (:data:`ALL_CONDITIONS`) pools the test rollouts of every condition.
        task_rates: the task-identity baseline's score per task (:func:`task_base_rates`); None: the
            failure rate of each task's validation rollouts in ``scores``.

    Returns:
        One row per (window, condition): window, window_max_steps (the window's per-task limits as
        text, e.g. ``"Lift=25"``), condition, n_calibration_successes, then
        n_rollouts, n_tasks, n_failures, n_successes, pooled_auc, macro_auc, within_auc,
        between_auc, weight_within, weight_between, n_pairs, skipped_tasks (tasks left out of
        the macro for having one class, comma-joined), length_pooled_auc, length_macro_auc,
        elapsed_pooled_auc, elapsed_macro_auc, task_identity_pooled_auc, task_identity_macro_auc
        (the three baselines of :data:`BASELINES` on the same rollouts and window), threshold, n_false_alarms, false_alarm_rate, n_caught, catch_rate,
        mean_alarm_step_caught, mean_alarm_position_steps, mean_alarm_position_fraction.

    Raises:
        AnalysisError: a malformed table, an unsplit episode, an unknown condition, a window
            missing a task, or a window without validation clean successes.
    """
    df = add_split_column(check_boundary_scores(scores), splits)
    length = length_only_scores(df)
    rates = dict(task_rates) if task_rates is not None else task_base_rates(df)
    others = {ELAPSED_TIME: elapsed_time_scores(df), TASK_IDENTITY: task_identity_scores(df, rates)}
    chosen = _conditions(df, conditions)
    rows = []
    for window, limits in limits_by_window.items():
        ep, length_ep = episode_scores(df, limits), episode_scores(length, limits)
        other_eps = {name: episode_scores(frame, limits) for name, frame in others.items()}
        calibration = _calibration_successes(ep)
        if calibration.empty:
            raise AnalysisError(f"window '{window}': no validation clean success to choose a threshold on")
        threshold = select_threshold(calibration, target_fa)
        alarms = alarm_steps(df, threshold, limits)
        for condition in chosen:
            same = (ep["condition"] == condition) if condition != ALL_CONDITIONS else True
            test = ((ep[SPLIT_COLUMN] == TEST) & same).to_numpy()
            row = {"window": window, "window_max_steps": _limits_text(limits), "condition": condition,
                   "n_calibration_successes": len(calibration)}
            row.update(_evaluation_row(ep[test], length_ep[test], alarms[test], threshold,
                                       {name: e[test] for name, e in other_eps.items()}))
            rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- fixed horizons, task-level summaries


FIXED_HORIZON_FRACTIONS = (0.125, 0.25, 0.5)
"""The predeclared fixed horizons, as fractions of each task's horizon (50, 100 and 200 steps of a 400-step
task; the pooled-AUC report, Sec. 3.5, predeclares 50/100/148 steps of 520). Declared here, before any run."""
BELOW_STEP = 100
"""RESCUE Table II's ``<100`` column: the episode score restricted to boundaries before control step 100."""


def fixed_window_name(fraction: float) -> str:
    """The window name of a fixed horizon, e.g. ``fixed_0.125``."""
    return f"fixed_{fraction:g}"


def fixed_horizon_windows(scores: pd.DataFrame,
                          fractions: Sequence[float] = FIXED_HORIZON_FRACTIONS) -> Dict[str, Limits]:
    """One window per predeclared fixed horizon: ``{fixed_<fraction>: {task: floor(fraction * horizon)}}``.

    Every rollout is observed through the horizon or to its own end, whichever comes first (nothing is
    padded, extended or left out).
    """
    return {fixed_window_name(f): window_limits(scores, "cap", cap_fraction=float(f)) for f in fractions}


def below_step_window(scores: pd.DataFrame, step: int = BELOW_STEP) -> Limits:
    """The window of the boundaries before control step ``step`` (``step <= step - 1``) for every task."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 2:
        raise AnalysisError(f"step {step!r} must be an integer of at least 2")
    return {task: int(step) - 1 for task in _tasks(check_boundary_scores(scores))}


def per_task_auc(ep: pd.DataFrame) -> Dict[str, Optional[float]]:
    """Each task's AUC on an episode-score table (None for a task with one class)."""
    return {t.task: t.auc for t in auc_decomposition(ep).per_task}


MIN_TASKS_FOR_INTERVAL = 3  # fewer tasks: no interval over tasks is estimable (a jackknife of 2 tasks is 0)
# Measured by `robocasa-shift check-coverage` (task_interval_coverage, seed 0, 2,000 studies per cell): quoted
# beside the intervals in loto_macro.csv, gap.csv and the summary.
TASK_INTERVAL_COVERAGE = {
    "macro": "t-interval over tasks: measured coverage of the task-population mean 0.91-0.95 with 3 / 5 / 8 tasks "
             "(below 0.94 where the tasks' AUCs spread widely; `check-coverage`)",
    "gap": "jackknife-t over tasks: measured coverage 0.92-0.99 with 3 / 5 / 8 tasks (below 0.94 where the tasks' "
           "score levels differ; `check-coverage`)",
}


def task_macro(per_task: Mapping[str, Optional[float]], confidence: float = 0.95) -> Dict[str, Any]:
    """Macro mean of per-task values with a t-interval over tasks, the SD across tasks and the range.

    As the pooled-AUC report summarises leave-one-task-out (Sec. 3.3), with an interval that keeps its level
    with few tasks: mean +- t(k - 1) SD / sqrt(k), clipped to [0, 1]. The task bootstrap used before was the
    range of the values with three tasks and covered the task-population mean 0.74 / 0.82 / 0.87 of the time
    with 3 / 5 / 8 tasks. Below :data:`MIN_TASKS_FOR_INTERVAL` tasks the interval is null and ``interval``
    says why. ``sd`` uses ``ddof = 1`` (None with one task).

    Returns:
        ``{"macro", "ci95": [lo, hi], "interval", "sd", "min", "max", "n_tasks", "tasks_without_value"}``
        (None where there is no task with a value).
    """
    values = np.array([float(v) for v in per_task.values() if v is not None], dtype=float)
    missing = sorted(t for t, v in per_task.items() if v is None)
    if values.size == 0:
        return {"macro": None, "ci95": [None, None], "interval": "no task with a value", "sd": None, "min": None,
                "max": None, "n_tasks": 0, "tasks_without_value": missing}
    sd = float(values.std(ddof=1)) if values.size > 1 else None
    ci: List[Optional[float]] = [None, None]
    note = f"not estimable: {values.size} task(s), an interval over tasks needs {MIN_TASKS_FOR_INTERVAL}"
    if values.size >= MIN_TASKS_FOR_INTERVAL:
        half = student_t_quantile(0.5 + confidence / 2, values.size - 1) * sd / math.sqrt(values.size)
        ci = [float(max(0.0, values.mean() - half)), float(min(1.0, values.mean() + half))]
        note = TASK_INTERVAL_COVERAGE["macro"]
    return {"macro": float(values.mean()), "ci95": ci, "interval": note, "sd": sd,
            "min": float(values.min()), "max": float(values.max()), "n_tasks": int(values.size),
            "tasks_without_value": missing}


# --------------------------------------------------------------------------- the pooled-minus-macro gap


def gap_terms(ep: pd.DataFrame) -> Dict[str, Optional[float]]:
    """The pooled-minus-macro AUC gap and its exact decomposition (the pooled-AUC report, Sec. 3.2)::

        pooled - macro = w (between - within_micro) + (within_micro - macro)

    ``w`` is the share of between-task pairs. The first term is what easier (or harder) cross-task
    pairs add, the second what unequal within-task pair counts add. None where a part is undefined.
    """
    d = auc_decomposition(ep)
    out: Dict[str, Optional[float]] = {"pooled_auc": d.pooled_auc, "macro_auc": d.macro_auc,
                                       "within_auc": d.within_auc, "between_auc": d.between_auc,
                                       "weight_between": d.weight_between, "gap": None, "term_between": None,
                                       "term_weights": None}
    if d.pooled_auc is not None and d.macro_auc is not None:
        out["gap"] = d.pooled_auc - d.macro_auc
    if d.within_auc is not None and d.macro_auc is not None:
        out["term_weights"] = d.within_auc - d.macro_auc
        out["term_between"] = (d.weight_between or 0.0) * ((d.between_auc if d.between_auc is not None
                                                            else d.within_auc) - d.within_auc)
    return out


def _gap_of_clusters(clusters: Sequence[Tuple[np.ndarray, np.ndarray]]) -> Optional[float]:
    """Pooled minus macro AUC of (failure scores, success scores) clusters, each cluster a task."""
    fails = np.concatenate([f for f, _ in clusters]) if clusters else np.zeros(0)
    succs = np.concatenate([s for _, s in clusters]) if clusters else np.zeros(0)
    if fails.size == 0 or succs.size == 0:
        return None
    pooled = _double_wins(fails, succs) / (2 * fails.size * succs.size)
    per = [_double_wins(f, s) / (2 * f.size * s.size) for f, s in clusters if f.size and s.size]
    return pooled - float(np.mean(per)) if per else None


def gap_interval(ep: pd.DataFrame, confidence: float = 0.95) -> Dict[str, Any]:
    """A jackknife-t interval over tasks of the pooled-minus-macro gap (report, Sec. 3.2).

    Each task is left out in turn; the interval is gap +- t(k - 1) * sqrt((k - 1) / k * sum (gap_-i - mean)^2),
    tasks being the independent units. The task-clustered bootstrap used before covered 0.71 with 3 tasks and
    0.855 with 8; this one's measured coverage is quoted in ``interval`` (:data:`TASK_INTERVAL_COVERAGE`).
    Below :data:`MIN_TASKS_FOR_INTERVAL` tasks, or when a leave-one-out gap is undefined, the interval is null
    and ``interval`` says why.

    Returns:
        :func:`gap_terms` of ``ep`` with ``ci95`` ([lo, hi] or [None, None]), ``interval`` and ``n_tasks``.
    """
    _check_episode_frame(ep)
    out: Dict[str, Any] = dict(gap_terms(ep))
    score = _finite_or_low(ep["score"].to_numpy())
    failed = ~ep["success"].to_numpy(dtype=bool)
    task = ep["task"].to_numpy()
    tasks = sorted(set(task.tolist()))
    clusters = [(score[(task == t) & failed], score[(task == t) & ~failed]) for t in tasks]
    out["ci95"], out["interval"] = _jackknife_gap_interval(clusters, out["gap"], confidence)
    out["n_tasks"] = len(tasks)
    return out


def _jackknife_gap_interval(clusters: Sequence[Tuple[np.ndarray, np.ndarray]], gap: Optional[float],
                            confidence: float = 0.95) -> Tuple[List[Optional[float]], str]:
    """(interval, what it is) of :func:`gap_interval` from the tasks' (failure scores, success scores)."""
    k = len(clusters)
    if gap is None:
        return [None, None], "the gap is undefined"
    if k < MIN_TASKS_FOR_INTERVAL:
        return [None, None], f"not estimable: {k} task(s), an interval over tasks needs {MIN_TASKS_FOR_INTERVAL}"
    left_out = [_gap_of_clusters(list(clusters[:i]) + list(clusters[i + 1:])) for i in range(k)]
    if any(g is None for g in left_out):
        return [None, None], "not estimable: a leave-one-task-out gap is undefined"
    spread = np.asarray(left_out, dtype=float)
    se = math.sqrt((k - 1) / k * float(((spread - spread.mean()) ** 2).sum()))
    half = student_t_quantile(0.5 + confidence / 2, k - 1) * se
    return [float(gap - half), float(gap + half)], TASK_INTERVAL_COVERAGE["gap"]


def _binormal_study(rng: np.random.Generator, n_tasks: int, n_episodes: int, separation: float, spread: float,
                    offset_sd: float) -> List[Tuple[np.ndarray, np.ndarray]]:
    """One simulated monitor study as per-task (failure scores, success scores): per task a separation
    d ~ N(separation, spread^2), a score offset ~ N(0, offset_sd^2) and a failure rate ~ U(0.2, 0.6); failures
    score N(offset + d, 1), successes N(offset, 1)."""
    d = rng.normal(separation, spread, n_tasks)
    offset = rng.normal(0.0, offset_sd, n_tasks)
    rate = rng.uniform(0.2, 0.6, n_tasks)
    failed = rng.random((n_tasks, n_episodes)) < rate[:, None]
    scores = rng.normal(size=(n_tasks, n_episodes)) + offset[:, None] + np.where(failed, d[:, None], 0.0)
    return [(scores[t][failed[t]], scores[t][~failed[t]]) for t in range(n_tasks)]


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.vectorize(math.erf, otypes=[float])(np.asarray(x, dtype=float) / math.sqrt(2.0)))


def _expected_gap(rng: np.random.Generator, n_tasks: int, separation: float, spread: float, offset_sd: float,
                  draws: int = 20000) -> float:
    """E[pooled - macro AUC] of ``n_tasks`` tasks drawn from the population, each with infinitely many episodes."""
    d = rng.normal(separation, spread, (draws, n_tasks))
    offset = rng.normal(0.0, offset_sd, (draws, n_tasks))
    rate = rng.uniform(0.2, 0.6, (draws, n_tasks))
    wins = _normal_cdf((offset[:, :, None] + d[:, :, None] - offset[:, None, :]) / math.sqrt(2.0))  # [i fails, j]
    weights = rate[:, :, None] * (1 - rate)[:, None, :]
    pooled = (wins * weights).sum(axis=(1, 2)) / weights.sum(axis=(1, 2))
    macro = _normal_cdf(d / math.sqrt(2.0)).mean(axis=1)
    return float((pooled - macro).mean())


def task_interval_coverage(n_tasks: int, n_episodes: int, spread: float, offset_sd: float, studies: int,
                           rng: np.random.Generator, separation: float = 1.0) -> Dict[str, Any]:
    """How often the macro AUC's t-interval covers the task-population mean AUC, and the gap's jackknife-t
    interval the expected gap of ``n_tasks`` such tasks (:func:`_binormal_study`); a study whose interval is
    null counts as not covering."""
    truth_macro = float(_normal_cdf(separation / math.sqrt(2.0 + spread ** 2)))
    truth_gap = _expected_gap(rng, n_tasks, separation, spread, offset_sd)
    macro_hits = gap_hits = 0
    for _ in range(studies):
        clusters = _binormal_study(rng, n_tasks, n_episodes, separation, spread, offset_sd)
        per_task = {i: (_double_wins(f, s) / (2 * f.size * s.size) if f.size and s.size else None)
                    for i, (f, s) in enumerate(clusters)}
        lo, hi = task_macro(per_task)["ci95"]
        macro_hits += lo is not None and lo <= truth_macro <= hi
        lo, hi = _jackknife_gap_interval(clusters, _gap_of_clusters(clusters))[0]
        gap_hits += lo is not None and lo <= truth_gap <= hi
    return {"n_tasks": n_tasks, "n_episodes": n_episodes, "spread": spread, "offset_sd": offset_sd,
            "truth_macro": truth_macro, "truth_gap": truth_gap, "macro": macro_hits / studies, "gap": gap_hits / studies}


TASK_COVERAGE_GRID = {"n_tasks": (3, 5, 8), "n_episodes": (20, 60), "spread": (0.3, 1.0), "offset_sd": (0.0, 1.0)}


# --------------------------------------------------------------------------- AUC-PDT and timeliness


PDT_FRACTIONS = tuple(round(k / 10, 1) for k in range(1, 11))


def fraction_scores(scores: pd.DataFrame, fractions: Sequence[float] = PDT_FRACTIONS) -> pd.DataFrame:
    """Per rollout, its score (max over boundaries) with only a fraction of the attempt observed.

    Column ``f<fraction>`` holds the max over the boundaries with ``step <= fraction * steps`` (-inf when
    none); one row per rollout with its per-rollout columns (and ``split`` when present).
    """
    df = check_boundary_scores(scores)
    rollouts = _rollouts(df)
    steps = pd.Series(rollouts["steps"].to_numpy(dtype=float), index=rollouts["rollout_id"])
    per_row = steps.loc[df["rollout_id"]].to_numpy()
    values = df["score"].fillna(-np.inf).to_numpy()
    for fraction in fractions:
        inside = df["step"].to_numpy(dtype=float) <= fraction * per_row
        best = pd.Series(np.where(inside, values, -np.inf), index=df["rollout_id"]).groupby(level=0, sort=False).max()
        rollouts[f"f{fraction:g}"] = best.loc[rollouts["rollout_id"]].to_numpy()
    return rollouts


def auc_pdt(failure_scores: np.ndarray, success_scores: np.ndarray) -> Optional[float]:
    """AUC-PDT as this harness computes it: the mean over the observed fractions (columns) of the ROC-AUC of
    the running-max score with that fraction of each attempt observed: the area under "AUC against the share
    of the attempt seen" (VLA-FAIL's detection-and-timing summary, read as an area over detection time).

    Args:
        failure_scores, success_scores: (rollouts, fractions) arrays from :func:`fraction_scores`.
    """
    f, s = np.asarray(failure_scores, dtype=float), np.asarray(success_scores, dtype=float)
    if f.ndim != 2 or s.ndim != 2 or not len(f) or not len(s):
        return None
    return float(np.mean([roc_auc(f[:, j], s[:, j]) for j in range(f.shape[1])]))


def timely_rate(alarm_step: np.ndarray, horizon: np.ndarray) -> Tuple[int, int, Optional[float]]:
    """RESCUE's Timely (Sec. IV-D): of the alarmed failures with a defined recoverability horizon, the share
    whose alarm comes at or before it. Returns (timely, eligible, rate or None)."""
    alarm, horizon = np.asarray(alarm_step, dtype=float), np.asarray(horizon, dtype=float)
    eligible = ~np.isnan(alarm) & ~np.isnan(horizon)
    n = int(eligible.sum())
    k = int((alarm[eligible] <= horizon[eligible]).sum())
    return k, n, (k / n if n else None)


class AlarmIndex:
    """Each rollout's first boundary at or above any threshold, by binary search (bootstraps ask often).

    Per rollout the running maximum of its in-window scores is non-decreasing, so the first
    boundary that fires at threshold t is the first whose running maximum reaches t.
    """

    def __init__(self, scores: pd.DataFrame, limits: Mapping[str, Optional[int]]):
        self._runs: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}
        for rollout_id, part in scores.sort_values(["rollout_id", "step"]).groupby("rollout_id", sort=False):
            limit = limits.get(part["task"].iloc[0])
            if limit is not None:
                part = part[part["step"] <= limit]
            values = np.maximum.accumulate(part["score"].fillna(-np.inf).to_numpy(dtype=float)) if len(part) \
                else np.zeros(0)
            self._runs[rollout_id] = (values, part["step"].to_numpy(dtype=float))

    def alarm_step(self, rollout_id: str, threshold: float) -> float:
        values, steps = self._runs[rollout_id]
        i = int(np.searchsorted(values, threshold, side="left"))
        return float(steps[i]) if i < len(values) else math.nan

    def alarms(self, rollout_ids: Sequence[str], threshold: float) -> np.ndarray:
        return np.array([self.alarm_step(r, threshold) for r in rollout_ids], dtype=float)
