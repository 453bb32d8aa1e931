"""Decision value of a runtime monitor's alarms: stop-and-reset and recover routing (RESCUE Sec. III-C, IV-C/D).

Pure over tables of rollouts; no simulator, no plotting, no global random state.

The cost model (renewal, one rollout = one attempt):

- one reset costs ``reset_cost`` (1 by default); a per-step execution cost ``c`` is chosen so that
  the median successful episode costs ``kappa`` resets: ``c = kappa * reset_cost / median(T_s)``;
- never intervening, a success costs ``c T`` (its natural length) and a failure ``c T + reset_cost``
  (it runs to its end, then is reset);
- under a stopping rule an alarmed rollout (failure or success) stops at its alarm step ``t``, costs
  ``c t + reset_cost`` and completes nothing; an un-alarmed rollout costs what it costs when never
  intervening;
- the cost per completed task is the total cost over the number of completions (direct episode
  accounting). With ``p`` the failure prevalence, ``d`` the alarm rate on failures, ``t_d`` the mean
  alarm step and ``T_f`` the mean length of the ALARMED failures, ``f`` the false-alarm rate on
  successes, ``t_fa`` the mean false-alarm step and ``T_s_fa`` the mean natural length of the
  false-alarmed successes, the closed form (with ``R = reset_cost``)::

      C_never = (p (R + c mean(T_f, all failures)) + (1 - p) c mean(T_s)) / (1 - p)
      f*      = p d c (T_f - t_d) / ((1 - p) (R + C_never + c (t_fa - T_s_fa)))
      C_rule - C_never = (R + C_never + c (t_fa - T_s_fa)) (f - f*) / (1 - f)

  is an identity on any episode set, not an approximation: both sides are the same sums.

Alarm steps count control steps from the episode start, like ``steps``; an alarm may not come after
the rollout's natural end (``alarm_step <= steps``; a monitor that would fire later never fired).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import (
    Any,
    Callable,
    Dict,
    Hashable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypedDict,
)

import numpy as np
import pandas as pd

from robocasa_shift.errors import AnalysisError

EPISODE_COLUMNS = ("success", "steps", "alarm_step")
BOOTSTRAP_COLUMNS = ("rollout_id", "task", "success", "steps")
MISSING_POLICIES = ("raise", "stop")


# --------------------------------------------------------------------------- cost model


@dataclass(frozen=True)
class CostModel:
    """The declared stop-and-reset cost model.

    Attributes:
        kappa: cost of the median successful episode, in resets (RESCUE uses 0.1).
        reset_cost: cost of one reset (the unit of every reported cost).
    """

    kappa: float = 0.1
    reset_cost: float = 1.0

    def __post_init__(self) -> None:
        for name in ("kappa", "reset_cost"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
                raise AnalysisError(f"CostModel.{name} must be a positive finite number, got {value!r}")

    def per_step_cost(self, successful_lengths: Sequence[float]) -> float:
        """The per-step cost ``c`` that makes the median successful episode cost ``kappa`` resets.

        Args:
            successful_lengths: natural lengths (control steps) of the successful rollouts.

        Returns:
            ``kappa * reset_cost / median(successful_lengths)``.

        Raises:
            AnalysisError: no successful rollout (the median is undefined), or a length that is not
                a positive finite number.
        """
        lengths = np.asarray(successful_lengths, dtype=float).ravel()
        if lengths.size == 0:
            raise AnalysisError("no successful rollouts: the per-step cost c = kappa / median(successful lengths) "
                                "is undefined; pass c explicitly (e.g. from the clean condition's successes)")
        if not np.all(np.isfinite(lengths)) or np.any(lengths <= 0):
            raise AnalysisError(f"successful lengths must be positive finite step counts, got {lengths.tolist()[:10]}")
        return float(self.kappa * self.reset_cost / np.median(lengths))


# --------------------------------------------------------------------------- closed form


def _check_number(name: str, value: Any, lo: float = -math.inf, hi: float = math.inf,
                  lo_open: bool = False, hi_open: bool = False) -> float:
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise AnalysisError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise AnalysisError(f"{name} must be finite, got {value}")
    if value < lo or (lo_open and value == lo) or value > hi or (hi_open and value == hi):
        left, right = "(" if lo_open else "[", ")" if hi_open else "]"
        raise AnalysisError(f"{name} must lie in {left}{lo}, {hi}{right}, got {value}")
    return value


def _false_alarm_timing(c: float, t_fa: Optional[float], T_s_fa: Optional[float]) -> float:
    """``c (t_fa - T_s_fa)``, taken as 0 when there are no false alarms (both None)."""
    if (t_fa is None) != (T_s_fa is None):
        raise AnalysisError("t_fa and T_s_fa are both defined (some false alarms) or both None (none); "
                            f"got t_fa={t_fa!r}, T_s_fa={T_s_fa!r}")
    if t_fa is None:
        return 0.0
    t_fa = _check_number("t_fa", t_fa, lo=0.0)
    T_s_fa = _check_number("T_s_fa", T_s_fa, lo=0.0)
    if t_fa > T_s_fa:
        raise AnalysisError(f"mean false-alarm step t_fa={t_fa} exceeds the false-alarmed successes' mean length "
                            f"T_s_fa={T_s_fa}: an alarm cannot come after the rollout ended")
    return c * (t_fa - T_s_fa)


def closed_form_break_even(p: float, d: float, c: float, T_f: float, t_d: float, t_fa: Optional[float],
                           T_s_fa: Optional[float], C_never: float, *, reset_cost: float = 1.0) -> float:
    """The break-even false-alarm rate ``f*`` of stop-and-reset against never intervening (RESCUE Eq. 9).

    ``f* = p d c (T_f - t_d) / ((1 - p) (R + C_never + c (t_fa - T_s_fa)))``: a realised false-alarm rate
    below it makes the stopping rule cheaper per completed task than never intervening.

    Args:
        p: failure prevalence, in [0, 1).
        d: fraction of failures the rule alarms on, in [0, 1].
        c: per-step execution cost (> 0).
        T_f: mean terminal length of the ALARMED failures (any value when ``d == 0``; pass 0).
        t_d: mean alarm step of the alarmed failures (``<= T_f``; pass 0 when ``d == 0``).
        t_fa: mean false-alarm step, or None when there are no false alarms.
        T_s_fa: mean natural length of the false-alarmed successes, or None with ``t_fa``.
        C_never: cost per completed task when never intervening.
        reset_cost: cost of one reset, ``R`` (1 in the paper).

    Returns:
        ``f*`` as a fraction (0.0101 for 1.01%). With no false alarms the timing term
        ``c (t_fa - T_s_fa)`` is taken as 0: the limit of a first false alarm that costs exactly one
        reset plus the completion it forfeits, which keeps the excess-cost identity exact at ``f = 0``.

    Raises:
        AnalysisError: an argument out of range, or a non-positive denominator (a false alarm would be
            cheaper than letting that success finish, so no break-even rate exists).
    """
    p = _check_number("p", p, 0.0, 1.0, hi_open=True)
    d = _check_number("d", d, 0.0, 1.0)
    c = _check_number("c", c, 0.0, lo_open=True)
    T_f = _check_number("T_f", T_f, lo=0.0)
    t_d = _check_number("t_d", t_d, lo=0.0)
    C_never = _check_number("C_never", C_never, lo=0.0)
    reset_cost = _check_number("reset_cost", reset_cost, 0.0, lo_open=True)
    if t_d > T_f:
        raise AnalysisError(f"mean alarm step of failures t_d={t_d} exceeds their mean length T_f={T_f}: "
                            "an alarm cannot come after the rollout ended")
    per_false_alarm = reset_cost + C_never + _false_alarm_timing(c, t_fa, T_s_fa)
    if per_false_alarm <= 0:
        raise AnalysisError(f"the excess cost of a false alarm, R + C_never + c (t_fa - T_s_fa) = {per_false_alarm}, "
                            "is not positive: stopping those successes is cheaper than finishing them, so no "
                            "break-even false-alarm rate exists")
    return p * d * c * (T_f - t_d) / ((1.0 - p) * per_false_alarm)


def excess_cost(f: float, f_star: float, C_never: float, c: float, t_fa: Optional[float],
                T_s_fa: Optional[float], *, reset_cost: float = 1.0) -> float:
    """Excess cost per completed task of stop-and-reset over never intervening, from the closed form.

    ``C_rule - C_never = (R + C_never + c (t_fa - T_s_fa)) (f - f*) / (1 - f)``.

    Args:
        f: realised false-alarm rate on successes, in [0, 1).
        f_star: break-even false-alarm rate from :func:`closed_form_break_even` (same arguments).
        C_never: cost per completed task when never intervening.
        c: per-step execution cost (> 0).
        t_fa: mean false-alarm step, or None when there are no false alarms (timing term taken as 0).
        T_s_fa: mean natural length of the false-alarmed successes, or None with ``t_fa``.
        reset_cost: cost of one reset, ``R``.

    Returns:
        The excess in reset-equivalents per completed task (positive: the rule costs more).

    Raises:
        AnalysisError: ``f == 1`` (every success false-alarmed: nothing completes, the cost per
            completion is undefined) or another argument out of range.
    """
    f = _check_number("f", f, 0.0, 1.0)
    if f == 1.0:
        raise AnalysisError("f = 1: every success is false-alarmed, the rule completes no task and its cost per "
                            "completed task is undefined")
    f_star = _check_number("f_star", f_star, lo=0.0)
    C_never = _check_number("C_never", C_never, lo=0.0)
    c = _check_number("c", c, 0.0, lo_open=True)
    reset_cost = _check_number("reset_cost", reset_cost, 0.0, lo_open=True)
    per_false_alarm = reset_cost + C_never + _false_alarm_timing(c, t_fa, T_s_fa)
    return per_false_alarm * (f - f_star) / (1.0 - f)


def ideal_ceiling(p: float, c: float, T_f_all: float, C_never: float, T_s: float, *,
                  reset_cost: float = 1.0) -> Tuple[float, Optional[float]]:
    """The break-even false-alarm rate of an ideal detector (``d = 1``, ``t_d = 0``), over ``t_fa`` in [0, T_s].

    ``f*`` grows as the false alarm comes earlier, so the range is its value at ``t_fa = T_s`` (low end)
    and at ``t_fa = 0`` (high end).

    Args:
        p: failure prevalence, in [0, 1).
        c: per-step execution cost.
        T_f_all: mean length of ALL failures (an ideal detector alarms on every one, at step 0).
        C_never: cost per completed task when never intervening.
        T_s: natural length of the false-alarmed successes the range is taken over.
        reset_cost: cost of one reset.

    Returns:
        ``(lo, hi)``; ``hi`` is None when a false alarm at step 0 on such a success would be cheaper
        than finishing it (``R + C_never - c T_s <= 0``: no finite break-even rate).
    """
    lo = closed_form_break_even(p, 1.0, c, T_f_all, 0.0, T_s, T_s, C_never, reset_cost=reset_cost)
    try:
        hi: Optional[float] = closed_form_break_even(p, 1.0, c, T_f_all, 0.0, 0.0, T_s, C_never,
                                                     reset_cost=reset_cost)
    except AnalysisError:
        if reset_cost + C_never - c * T_s > 0:
            raise
        hi = None
    return lo, hi


# --------------------------------------------------------------------------- the worksheet


class Worksheet(TypedDict):
    """Every Table I quantity of one stopping rule on one episode set (None where undefined)."""

    n_episodes: int
    n_failures: int
    n_successes: int
    n_alarmed_failures: int
    n_false_alarms: int
    n_completions_never: int
    n_completions_rule: int
    p: float
    T_f: Optional[float]
    T_f_all: Optional[float]
    T_s_fa: Optional[float]
    T_s_median: Optional[float]
    T_s_mean: Optional[float]
    kappa: float
    reset_cost: float
    c: float
    c_source: str
    kappa_effective: Optional[float]
    C_never: Optional[float]
    d: Optional[float]
    t_d: Optional[float]
    f: Optional[float]
    t_fa: Optional[float]
    f_star: Optional[float]
    C_rule_direct: Optional[float]
    C_rule_closed: Optional[float]
    excess_direct: Optional[float]
    excess_closed: Optional[float]
    f_star_ideal: Optional[Tuple[float, Optional[float]]]
    f_star_ideal_any_success: Optional[Tuple[float, Optional[float]]]


def _episode_arrays(episodes: pd.DataFrame, extra: Sequence[str] = ()) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Validated (success, steps, alarm_step) arrays of an episodes table."""
    if not isinstance(episodes, pd.DataFrame):
        raise AnalysisError(f"episodes must be a pandas DataFrame, got {type(episodes).__name__}")
    missing = [col for col in (*EPISODE_COLUMNS, *extra) if col not in episodes.columns]
    if missing:
        raise AnalysisError(f"episodes table lacks column(s) {missing}; it needs one row per rollout with "
                            f"{list(EPISODE_COLUMNS) + list(extra)} (alarm_step NaN when the rule never alarmed)")
    if len(episodes) == 0:
        raise AnalysisError("episodes table is empty: no rollouts to account for")
    success_col = episodes["success"]
    bad = ~success_col.map(lambda v: isinstance(v, (bool, np.bool_)) or v in (0, 1)).astype(bool)
    if bad.any():
        raise AnalysisError(f"column 'success' must be boolean; rows {list(episodes.index[bad][:10])} are "
                            f"{success_col[bad].tolist()[:10]}")
    success = success_col.astype(bool).to_numpy()
    try:
        steps = pd.to_numeric(episodes["steps"]).to_numpy(dtype=float)
        alarm = pd.to_numeric(episodes["alarm_step"]).to_numpy(dtype=float)
    except (TypeError, ValueError) as exc:
        raise AnalysisError(f"columns 'steps' and 'alarm_step' must be numeric: {exc}") from exc
    bad_steps = ~np.isfinite(steps) | (steps < 1) | (steps != np.round(steps))
    if bad_steps.any():
        raise AnalysisError(f"column 'steps' must hold positive whole step counts; rows "
                            f"{list(episodes.index[bad_steps][:10])} hold {steps[bad_steps].tolist()[:10]}")
    _check_alarm_steps(alarm, steps, episodes.index)
    return success, steps, alarm


def _check_alarm_steps(alarm: np.ndarray, steps: np.ndarray, index: Sequence[Hashable]) -> None:
    """Raise unless every alarm step is NaN (no alarm) or a step in [0, steps] of its row."""
    if not ((alarm < 0) | (alarm > steps)).any():  # NaN compares False; +-inf is caught (steps are finite)
        return
    alarmed = ~np.isnan(alarm)
    bad_alarm = alarmed & (~np.isfinite(alarm) | (alarm < 0) | (alarm > steps))
    if bad_alarm.any():
        raise AnalysisError(f"column 'alarm_step' must be NaN (no alarm) or a step in [0, steps]; rows "
                            f"{list(pd.Index(index)[bad_alarm][:10])} hold {alarm[bad_alarm].tolist()[:10]} "
                            "(an alarm after a rollout's natural end never fired: use NaN)")


def _mean(values: np.ndarray) -> Optional[float]:
    return float(values.mean()) if values.size else None


def _given_c(c: Any) -> float:
    return _check_number("c", c, 0.0, lo_open=True)


def _excess_direct(success: np.ndarray, steps: np.ndarray, alarm: np.ndarray, c: float,
                   reset_cost: float) -> Optional[float]:
    """``worksheet(...)["excess_direct"]`` of validated arrays, bit for bit, without building a table.

    The same floating-point operations in the same order as :func:`worksheet` (the bootstrap calls it
    once per resample, on a few rows, where numpy's per-call overhead is the whole cost).

    Args:
        success: bool per rollout; steps: natural lengths (float); alarm: alarm steps (float, NaN for
            none), already checked against ``steps``.
        c: the per-step cost; reset_cost: the cost of one reset (``cost_model.reset_cost``).

    Returns:
        ``C_rule_direct - C_never``, or None when either is undefined (no successes, or every success
        false-alarmed).
    """
    alarmed = ~np.isnan(alarm)
    n_s = int(np.count_nonzero(success))
    completions_rule = n_s - int(np.count_nonzero(alarmed & success))
    if not n_s or not completions_rule:
        return None
    never_total = float(c * steps.sum() + reset_cost * (success.size - n_s))
    # alarmed rows are finite, so c * alarm equals worksheet's c * nan_to_num(alarm) wherever it is taken
    rule_total = float(np.where(alarmed, c * alarm + reset_cost, c * steps + reset_cost * ~success).sum())
    return rule_total / completions_rule - never_total / n_s


def worksheet(episodes: pd.DataFrame, cost_model: CostModel = CostModel(), c: Optional[float] = None) -> Worksheet:
    """The complete stop-and-reset break-even worksheet (RESCUE Table I) of one stopping rule.

    Args:
        episodes: one row per rollout: ``success`` (bool), ``steps`` (its natural length, control steps)
            and ``alarm_step`` (float; NaN when the rule never alarmed). Row multiplicities count:
            a row present twice is two attempts.
        cost_model: kappa and the reset cost.
        c: the per-step cost; None derives it from this table's successes
            (``cost_model.per_step_cost``). Pass it to price a condition with, e.g., the clean median.

    Returns:
        A :class:`Worksheet`. Definitions: ``p`` failures / rollouts; ``d`` alarmed failures / failures;
        ``t_d`` and ``T_f`` mean alarm step and mean length of the alarmed failures (``T_f_all``: of all
        failures); ``f`` false alarms / successes; ``t_fa`` and ``T_s_fa`` mean alarm step and mean natural
        length of the false-alarmed successes; ``C_never`` and ``C_rule_direct`` by direct episode
        accounting; ``C_rule_closed = C_never + excess_closed`` with ``excess_closed`` from
        :func:`excess_cost`; ``f_star_ideal``: :func:`ideal_ceiling` over ``t_fa`` in ``[0, T_s_fa]``;
        ``f_star_ideal_any_success``: the same with the longest successful length in place of ``T_s_fa``
        (the widest range any false alarm could give). ``kappa_effective = c T_s_median / reset_cost``
        (differs from ``kappa`` when ``c`` was given).

        None where undefined: ``d``/``T_f_all`` without failures; ``t_d``/``T_f`` without alarmed failures;
        ``f``, ``C_never``, ``f_star`` and everything after them without successes; ``t_fa``/``T_s_fa``/
        ``f_star_ideal`` without false alarms; ``C_rule_*``/``excess_*`` when every success is false-alarmed
        (the rule completes nothing). With no failures, or no alarmed failure, the numerator of ``f*`` is
        0 and ``f* = 0``. With no false alarms ``f = 0`` and the timing term ``c (t_fa - T_s_fa)`` of ``f*``
        is taken as 0 (the closed form then still equals direct accounting exactly). ``f_star`` is None
        also when ``R + C_never + c (t_fa - T_s_fa) <= 0`` (no break-even rate); ``excess_closed`` is then
        computed from the undivided form
        ``((1-p) f (R + C_never + c (t_fa - T_s_fa)) - p d c (T_f - t_d)) / ((1-p)(1-f))``.

    Raises:
        AnalysisError: a malformed table, or no successes while ``c`` is None.
    """
    return _worksheet_arrays(*_episode_arrays(episodes), cost_model, c)


def _worksheet_arrays(success: np.ndarray, steps: np.ndarray, alarm: np.ndarray, cost_model: CostModel,
                      c: Optional[float]) -> Worksheet:
    """:func:`worksheet` of the validated arrays that :func:`_episode_arrays` returns."""
    reset = cost_model.reset_cost
    fail = ~success
    alarmed = ~np.isnan(alarm)
    alarmed_fail, false_alarm = alarmed & fail, alarmed & success
    n, n_f, n_s = len(success), int(fail.sum()), int(success.sum())
    n_af, n_fa = int(alarmed_fail.sum()), int(false_alarm.sum())

    if c is None:
        c_value, c_source = cost_model.per_step_cost(steps[success]), "median of these successes"
    else:
        c_value, c_source = _given_c(c), "given"

    p = n_f / n
    T_f_all = _mean(steps[fail])
    d = n_af / n_f if n_f else None
    t_d, T_f = _mean(alarm[alarmed_fail]), _mean(steps[alarmed_fail])
    f = n_fa / n_s if n_s else None
    t_fa, T_s_fa = _mean(alarm[false_alarm]), _mean(steps[false_alarm])
    T_s_median = float(np.median(steps[success])) if n_s else None
    T_s_mean = _mean(steps[success])

    never_total = float(c_value * steps.sum() + reset * n_f)
    rule_cost = np.where(alarmed, c_value * np.nan_to_num(alarm) + reset, c_value * steps + reset * fail)
    rule_total = float(rule_cost.sum())
    completions_rule = n_s - n_fa
    C_never = never_total / n_s if n_s else None
    C_rule_direct = rule_total / completions_rule if completions_rule else None
    excess_direct = C_rule_direct - C_never if C_rule_direct is not None and C_never is not None else None

    f_star = C_rule_closed = excess_closed = None
    ideal = ideal_any = None
    if C_never is not None and f is not None:
        saved_T_f, saved_t_d = (T_f, t_d) if n_af else (0.0, 0.0)
        per_false_alarm = reset + C_never + _false_alarm_timing(c_value, t_fa, T_s_fa)
        if per_false_alarm > 0:
            f_star = closed_form_break_even(p, d or 0.0, c_value, saved_T_f, saved_t_d, t_fa, T_s_fa, C_never,
                                            reset_cost=reset)
        if f < 1.0:
            if f_star is not None:
                excess_closed = excess_cost(f, f_star, C_never, c_value, t_fa, T_s_fa, reset_cost=reset)
            else:
                saved = p * (d or 0.0) * c_value * (saved_T_f - saved_t_d)
                excess_closed = ((1 - p) * f * per_false_alarm - saved) / ((1 - p) * (1 - f))
            C_rule_closed = C_never + excess_closed
        ceiling_T_f = T_f_all if n_f else 0.0
        if n_fa:
            ideal = ideal_ceiling(p, c_value, ceiling_T_f, C_never, T_s_fa, reset_cost=reset)
        ideal_any = ideal_ceiling(p, c_value, ceiling_T_f, C_never, float(steps[success].max()), reset_cost=reset)

    return Worksheet(
        n_episodes=n, n_failures=n_f, n_successes=n_s, n_alarmed_failures=n_af, n_false_alarms=n_fa,
        n_completions_never=n_s, n_completions_rule=completions_rule,
        p=p, T_f=T_f, T_f_all=T_f_all, T_s_fa=T_s_fa, T_s_median=T_s_median, T_s_mean=T_s_mean,
        kappa=float(cost_model.kappa), reset_cost=float(reset), c=c_value, c_source=c_source,
        kappa_effective=c_value * T_s_median / reset if T_s_median is not None else None,
        C_never=C_never, d=d, t_d=t_d, f=f, t_fa=t_fa, f_star=f_star,
        C_rule_direct=C_rule_direct, C_rule_closed=C_rule_closed,
        excess_direct=excess_direct, excess_closed=excess_closed,
        f_star_ideal=ideal, f_star_ideal_any_success=ideal_any,
    )


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class BootstrapResult:
    """A percentile interval of the stop-and-reset excess cost over never intervening.

    Attributes:
        lo, hi: the interval's ends over the resamples with a defined value (None if none had one).
        point: the excess cost on the unresampled data (None if undefined there).
        threshold: the threshold selected on the unresampled validation set.
        c: the per-step cost used throughout (fixed across resamples).
        n_resamples: resamples drawn.
        n_undefined: resamples whose excess was undefined (the rule or never intervening completed
            nothing); they are left out of the interval and counted here.
        seed: the seed of the ``numpy.random.Generator`` that drew the resamples.
        confidence: the interval's nominal coverage.
        diff_lo, diff_hi, diff_point: with reference alarms (``bootstrap_excess(reference_alarms=...)``), the
            interval and point estimate of the rule's excess minus the reference's on the same resamples
            (below 0: the rule is cheaper than the reference); None otherwise.
        n_diff_undefined: resamples where either excess was undefined (left out of the difference's interval).
    """

    lo: Optional[float]
    hi: Optional[float]
    point: Optional[float]
    threshold: float
    c: float
    n_resamples: int
    n_undefined: int
    seed: int
    confidence: float
    diff_lo: Optional[float] = None
    diff_hi: Optional[float] = None
    diff_point: Optional[float] = None
    n_diff_undefined: int = 0


def _strata_positions(frame: pd.DataFrame, strata: Sequence[str], name: str) -> List[np.ndarray]:
    """Row positions of each stratum, strata in sorted order (deterministic for a seed)."""
    missing = [col for col in (*BOOTSTRAP_COLUMNS, *strata) if col not in frame.columns]
    if missing:
        raise AnalysisError(f"{name} table lacks column(s) {missing}; it needs {list(BOOTSTRAP_COLUMNS)} and "
                            f"the strata {list(strata)}")
    if len(frame) == 0:
        raise AnalysisError(f"{name} table is empty: nothing to resample")
    columns = [frame[col] for col in strata]
    if all(_plain_stratum(col) for col in columns):
        # bool, integer or str columns: no missing values, and str tells their values apart, so grouping
        # in Python gives groupby's strata in the same order (the order is the str sort below either way)
        plain: dict = {}
        for i, key in enumerate(zip(*(col.tolist() for col in columns))):
            plain.setdefault(key, []).append(i)
        return [np.asarray(plain[key], dtype=np.intp) for key in sorted(plain, key=lambda k: tuple(map(str, k)))]
    for col in strata:
        if frame[col].isna().any():
            raise AnalysisError(f"{name} table: stratum column '{col}' has missing values in rows "
                                f"{list(frame.index[frame[col].isna()][:10])}; every row must belong to a stratum")
    groups = frame.groupby(list(strata), sort=True).indices
    return [np.asarray(groups[key]) for key in sorted(groups, key=lambda k: tuple(map(str, np.atleast_1d(k))))]


def _plain_stratum(column: pd.Series) -> bool:
    """A bool or integer column, or an object or string column of str only (a dict groups it like groupby)."""
    dtype = column.dtype
    if dtype == bool or (isinstance(dtype, np.dtype) and dtype.kind in "iu"):
        return True
    return (dtype == object or isinstance(dtype, pd.StringDtype)) \
        and all(type(value) is str for value in column.tolist())


def _draw(positions: List[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """Row positions drawn with replacement within each stratum (strata in order), stratum sizes kept."""
    return np.concatenate([pos[rng.integers(0, pos.size, size=pos.size)] for pos in positions])


def cluster_positions(frame: pd.DataFrame, strata: Sequence[str], clusters: Sequence[str]) -> List[List[np.ndarray]]:
    """Row positions of every cluster, grouped by stratum (both in sorted order): what :func:`draw_clusters` resamples."""
    frame = frame.reset_index(drop=True)
    out = []
    for positions in _strata_positions(frame, strata, "clustered") if strata else [np.arange(len(frame))]:
        keys = [tuple(v) for v in frame.loc[positions, list(clusters)].astype(str).itertuples(index=False)]
        groups: Dict[Tuple[str, ...], List[int]] = {}
        for position, key in zip(positions.tolist(), keys):
            groups.setdefault(key, []).append(position)
        out.append([np.asarray(groups[key], dtype=np.intp) for key in sorted(groups)])
    return out


def draw_clusters(clustered: List[List[np.ndarray]], rng: np.random.Generator) -> np.ndarray:
    """A cluster bootstrap resample: within each stratum, as many clusters as it has, drawn with replacement, each
    bringing all its rows (a base episode brings every condition's rollout: they are correlated)."""
    drawn = []
    for groups in clustered:
        for index in rng.integers(0, len(groups), size=len(groups)):
            drawn.append(groups[index])
    return np.concatenate(drawn) if drawn else np.zeros(0, dtype=np.intp)


def _position_alarms(alarms: Any, n: int) -> np.ndarray:
    values = np.asarray(alarms, dtype=float).ravel()
    if values.size != n:
        raise AnalysisError(f"alarms_for returned {values.size} alarm steps for {n} positions; it must "
                            "return one per position, in their order")
    return values


def bootstrap_excess(validation: pd.DataFrame, test: pd.DataFrame,
                     select_threshold: Callable[[np.ndarray], float],
                     alarms_for: Callable[[np.ndarray, float], np.ndarray],
                     cost_model: CostModel = CostModel(), n_resamples: int = 1000, seed: int = 0,
                     strata: Sequence[str] = ("task", "success"), c: Optional[float] = None,
                     confidence: float = 0.95, clusters: Sequence[str] = (),
                     reference_alarms: Optional[np.ndarray] = None, select_on: str = "successes") -> BootstrapResult:
    """Stratified episode bootstrap of the stop-and-reset excess cost, re-selecting the threshold each time.

    Each resample draws rows with replacement within each stratum (by default task x outcome) of the
    validation set and, independently, of the test set, keeping every stratum's size; a row drawn
    twice is two attempts. The threshold is re-selected on the validation resample, the test resample's
    alarms are recomputed with it, and the excess is priced by direct accounting (exactly
    :func:`worksheet`'s ``excess_direct``). The test table's outcomes and lengths are validated once, on
    the unresampled data; every resample's alarm steps are checked against its rows' lengths. The
    callables get numpy arrays, and no table is built per resample.

    Args:
        validation: rows with ``rollout_id``, ``task``, ``success``, ``steps``, ``score`` (and the strata
            columns).
        test: rows with ``rollout_id``, ``task``, ``success``, ``steps`` (and the strata columns);
            ``alarms_for`` maps positions into it to alarm steps.
        select_threshold: ``select_threshold(scores) -> threshold``, ``scores`` the numpy array of the
            validation resample's ``score`` values on its successful rows (``success`` as bool), in
            resample order; called once on the unresampled validation set (errors propagate) and once
            per resample that drew a success (a resample that drew none gets +inf: never alarm).
        alarms_for: ``alarms_for(positions, threshold) -> alarm steps``, ``positions`` the test
            resample's row positions into ``test`` (``np.arange(len(test))`` for the point estimate),
            the alarm steps (NaN for no alarm) one per position, in order.
        cost_model: kappa and the reset cost.
        n_resamples: resamples to draw (>= 1).
        seed: seed of the ``numpy.random.default_rng`` that draws them (validation first, then test, in
            each resample; strata in sorted order).
        strata: columns whose combinations are the strata, in both tables.
        clusters: columns whose combinations are clusters within a stratum (e.g. ``("episode",)`` with
            ``strata=("task",)``: base episodes within task); when given, whole clusters are drawn with
            replacement, as many as the stratum has, each bringing all its rows, instead of single rows.
        c: the per-step cost; None fixes it once from the UNRESAMPLED test set's successes (the cost
            model is declared, not re-estimated per resample).
        confidence: nominal coverage of the percentile interval (``numpy.quantile``, linear).
        reference_alarms: alarm steps of a reference rule (e.g. a rate-matched random alarm), one per test
            row (NaN: no alarm), fixed across resamples: the result then also holds the interval of the rule's
            excess minus the reference's excess on the same resamples (``diff_lo``/``diff_hi``), "beats the
            reference" as an interval rather than a comparison of point estimates.
        select_on: ``"successes"`` (``select_threshold`` gets the successful rows' scores, as above) or
            ``"positions"`` (it gets the validation resample's row positions into ``validation``, e.g. for a
            threshold that minimises the validation cost: :func:`cost_optimal_selector`).

    Returns:
        A :class:`BootstrapResult`.

    Raises:
        AnalysisError: malformed tables, bad arguments (``select_threshold`` or ``alarms_for`` not
            callable), or alarms not one per position. Errors raised by the callables propagate unchanged.
    """
    for name, f in (("select_threshold", select_threshold), ("alarms_for", alarms_for)):
        if not callable(f):
            raise AnalysisError(f"{name} must be callable, got {f!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise AnalysisError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise AnalysisError(f"seed must be an integer, got {seed!r}")
    confidence = _check_number("confidence", confidence, 0.0, 1.0, lo_open=True, hi_open=True)
    if select_on not in ("successes", "positions"):
        raise AnalysisError(f"select_on must be 'successes' or 'positions', got {select_on!r}")
    strata = tuple(strata)
    validation = validation.reset_index(drop=True)
    test = test.reset_index(drop=True)
    val_positions = _strata_positions(validation, strata, "validation")
    test_positions = _strata_positions(test, strata, "test")
    if clusters:
        val_clusters = cluster_positions(validation, strata, clusters)
        test_clusters = cluster_positions(test, strata, clusters)
    if "score" not in validation.columns:
        raise AnalysisError("validation table lacks column 'score', whose successful rows select_threshold is given")
    if c is None:
        c_value = cost_model.per_step_cost(test["steps"].to_numpy(dtype=float)[test["success"].astype(bool).to_numpy()])
    else:
        c_value = _given_c(c)
    reset = cost_model.reset_cost

    # the point estimate, priced by the worksheet itself; validating its table validates the test
    # table's success and steps once for every resample
    val_success = validation["success"].astype(bool).to_numpy()
    val_scores = validation["score"].to_numpy()

    def select(drawn: np.ndarray, resample: bool = True) -> float:
        if select_on == "positions":
            return select_threshold(drawn)
        successes = drawn[val_success[drawn]]
        if resample and not successes.size:
            # a resample that drew no success has no false alarm to bound: never alarm, the rule's
            # answer whenever too few successes exist (a study with few gets an interval, not a crash)
            return math.inf
        return select_threshold(val_scores[successes])

    point_threshold = select(np.arange(len(validation)), resample=False)
    point_alarms = _position_alarms(alarms_for(np.arange(len(test)), point_threshold), len(test))
    episodes = pd.DataFrame({"success": test["success"].to_numpy(), "steps": test["steps"].to_numpy(),
                             "alarm_step": point_alarms}, index=test.index)
    test_success, test_steps, point_alarms = _episode_arrays(episodes)
    point = _worksheet_arrays(test_success, test_steps, point_alarms, cost_model, c_value)["excess_direct"]
    reference = None
    diff_point = None
    if reference_alarms is not None:
        reference = _position_alarms(reference_alarms, len(test))
        _check_alarm_steps(reference, test_steps, test.index)
        ref_point = _excess_direct(test_success, test_steps, reference, c_value, reset)
        diff_point = None if point is None or ref_point is None else point - ref_point

    rng = np.random.default_rng(int(seed))
    values: List[float] = []
    diffs: List[float] = []
    n_undefined = n_diff_undefined = 0
    for _ in range(int(n_resamples)):
        if clusters:
            val_drawn, test_drawn = draw_clusters(val_clusters, rng), draw_clusters(test_clusters, rng)
        else:
            val_drawn, test_drawn = _draw(val_positions, rng), _draw(test_positions, rng)
        success, steps = test_success[test_drawn], test_steps[test_drawn]
        threshold = select(val_drawn)
        alarm = _position_alarms(alarms_for(test_drawn, threshold), test_drawn.size)
        _check_alarm_steps(alarm, steps, range(test_drawn.size))
        value = _excess_direct(success, steps, alarm, c_value, reset)
        if value is None:
            n_undefined += 1
        else:
            values.append(value)
        if reference is not None:
            ref_value = _excess_direct(success, steps, reference[test_drawn], c_value, reset)
            if value is None or ref_value is None:
                n_diff_undefined += 1
            else:
                diffs.append(value - ref_value)
    lo = hi = None
    if values:
        tail = (1.0 - confidence) / 2.0
        lo_q, hi_q = np.quantile(np.asarray(values), [tail, 1.0 - tail])
        lo, hi = float(lo_q), float(hi_q)
    diff_lo = diff_hi = None
    if diffs:
        tail = (1.0 - confidence) / 2.0
        d_lo, d_hi = np.quantile(np.asarray(diffs), [tail, 1.0 - tail])
        diff_lo, diff_hi = float(d_lo), float(d_hi)
    return BootstrapResult(lo=lo, hi=hi, point=point, threshold=float(point_threshold), c=c_value,
                           n_resamples=int(n_resamples), n_undefined=n_undefined, seed=int(seed),
                           confidence=confidence, diff_lo=diff_lo, diff_hi=diff_hi, diff_point=diff_point,
                           n_diff_undefined=n_diff_undefined)


# --------------------------------------------------------------------------- cost-optimal thresholds


def excess_by_candidate(success: np.ndarray, steps: np.ndarray, alarms: np.ndarray, c: float,
                        reset_cost: float = 1.0) -> np.ndarray:
    """The direct-accounting excess cost over never intervening of each candidate rule at once.

    Args:
        success, steps: per rollout (n,); alarms: (n, m) alarm steps of m candidate rules (NaN: no alarm).

    Returns:
        (m,) excess per candidate (``worksheet``'s ``excess_direct``); +inf where the rule completes nothing
        or there is no success to price never intervening with.
    """
    success = np.asarray(success, dtype=bool)
    steps = np.asarray(steps, dtype=float)
    alarms = np.asarray(alarms, dtype=float).reshape(len(success), -1)
    n_s = int(success.sum())
    if not n_s:
        return np.full(alarms.shape[1], np.inf)
    alarmed = ~np.isnan(alarms)
    completions = n_s - (alarmed & success[:, None]).sum(axis=0)
    never_total = c * steps.sum() + reset_cost * (~success).sum()
    unalarmed_cost = (c * steps + reset_cost * ~success)[:, None]
    rule_total = np.where(alarmed, c * np.nan_to_num(alarms) + reset_cost, unalarmed_cost).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(completions > 0, rule_total / np.maximum(completions, 1) - never_total / n_s, np.inf)
    return excess


def cost_optimal_selector(validation: pd.DataFrame, candidates: np.ndarray, candidate_alarms: np.ndarray,
                          c: float, reset_cost: float = 1.0) -> Callable[[np.ndarray], float]:
    """A threshold selector (``bootstrap_excess(select_on="positions")``) that minimises the validation cost.

    Args:
        validation: rows with ``success`` and ``steps``, in the order of ``candidate_alarms``' rows.
        candidates: (m,) candidate thresholds, ascending (the observed episode scores and +inf).
        candidate_alarms: (n, m) alarm step of each validation row at each candidate (NaN: none).

    Returns:
        ``select(positions) -> threshold``: on the validation rows at ``positions`` (a resample), the
        candidate with the lowest excess cost over never intervening; ties go to the highest threshold
        (the fewest alarms: +inf, never intervening, when nothing is cheaper).
    """
    success = validation["success"].astype(bool).to_numpy()
    steps = validation["steps"].to_numpy(dtype=float)
    candidates = np.asarray(candidates, dtype=float)
    alarms = np.asarray(candidate_alarms, dtype=float)
    if alarms.shape != (len(validation), len(candidates)):
        raise AnalysisError(f"candidate_alarms must be (validation rows, candidates) = ({len(validation)}, "
                            f"{len(candidates)}), got {alarms.shape}")

    def select(positions: np.ndarray) -> float:
        excess = excess_by_candidate(success[positions], steps[positions], alarms[positions], c, reset_cost)
        best = np.flatnonzero(excess <= excess.min() + 1e-12)
        return float(candidates[best[-1]])

    return select


# --------------------------------------------------------------------------- recover routing


class RecoverCost(TypedDict):
    """Cost per completed task when alarms route to a scripted recovery (None where undefined)."""

    c: float
    C_never: Optional[float]
    C_recover: Optional[float]
    excess_recover: Optional[float]
    C_stop: Optional[float]
    excess_stop: Optional[float]
    expected_total_cost: float
    expected_completions: float
    n_episodes: int
    n_alarmed: int
    n_routed: int
    n_missing: int
    missing_ids: List[Hashable]
    n_branches: int
    n_unused_branch_sets: int


def _branch_arrays(rollout_id: Hashable, branches: Any, alarm_step: float) -> Tuple[np.ndarray, np.ndarray]:
    oks, ends = [], []
    for i, branch in enumerate(branches):
        try:
            ok, end = branch
        except (TypeError, ValueError) as exc:
            raise AnalysisError(f"rollout {rollout_id!r}: branch {i} must be a pair (success, steps), "
                                f"got {branch!r}") from exc
        if not isinstance(ok, (bool, np.bool_)):
            raise AnalysisError(f"rollout {rollout_id!r}: branch {i} success must be a bool, got {ok!r}")
        if isinstance(end, bool) or not isinstance(end, (int, np.integer, float, np.floating)) \
                or not math.isfinite(end) or end != int(end):
            raise AnalysisError(f"rollout {rollout_id!r}: branch {i} steps must be a whole step count, got {end!r}")
        if end < alarm_step:
            raise AnalysisError(f"rollout {rollout_id!r}: branch {i} ends at step {end}, before its alarm step "
                                f"{alarm_step}; branch steps count from the episode start")
        oks.append(bool(ok))
        ends.append(float(end))
    return np.asarray(oks, dtype=bool), np.asarray(ends, dtype=float)


def recover_routing_cost(episodes: pd.DataFrame, branch_outcomes: Mapping[Hashable, Sequence[Tuple[bool, int]]],
                         cost_model: CostModel = CostModel(), c: Optional[float] = None,
                         missing: str = "raise") -> RecoverCost:
    """Cost per completed task when every alarm routes the rollout to scripted Recover instead of a stop.

    An alarmed rollout (failure or success) is continued from its alarm checkpoint under ``recover``;
    its counterfactual branches give its expected cost, ``mean(c * steps + (0 if success else R))``
    (a failed branch runs to its end, then resets), and its expected completions, the branch success
    fraction. Un-alarmed rollouts cost what they cost when never intervening. The cost per completion is
    the expected total cost over the expected completions.

    Args:
        episodes: the :func:`worksheet` columns plus ``rollout_id``; duplicate ids (e.g. a resample)
            share their branches.
        branch_outcomes: ``{rollout_id: [(success, steps), ...]}``, ``steps`` the total control steps at
            the branch's end, counted from the episode start. Entries for un-alarmed rollouts are
            ignored (counted in ``n_unused_branch_sets``).
        cost_model: kappa and the reset cost.
        c: the per-step cost; None derives it from this table's successes.
        missing: what to do with an alarmed rollout that has no (or an empty list of) branch outcomes:
            ``"raise"`` (default) or ``"stop"`` (price it as stop-and-reset: ``c t + R``, no completion).

    Returns:
        A :class:`RecoverCost`, with the stop-and-reset figures of the same alarms beside it.
        ``C_recover`` (and its excess) is None when the expected completions are 0; ``C_never`` and
        ``C_stop`` are None as in :func:`worksheet`.

    Raises:
        AnalysisError: malformed inputs, an unknown ``missing``, or alarmed rollouts without branch
            outcomes while ``missing == "raise"`` (the message lists them).
    """
    if missing not in MISSING_POLICIES:
        raise AnalysisError(f"unknown missing policy {missing!r}; known: {', '.join(MISSING_POLICIES)}")
    success, steps, alarm = _episode_arrays(episodes, extra=("rollout_id",))
    ids = episodes["rollout_id"].tolist()
    c_value = cost_model.per_step_cost(steps[success]) if c is None else _given_c(c)
    reset = cost_model.reset_cost
    alarmed = ~np.isnan(alarm)

    total, completions = 0.0, 0.0
    n_routed = n_branches = 0
    missing_ids: List[Hashable] = []
    alarmed_ids = {rid for rid, is_alarmed in zip(ids, alarmed) if is_alarmed}
    for rid, ok, length, t, is_alarmed in zip(ids, success, steps, alarm, alarmed):
        if not is_alarmed:
            total += c_value * length + (0.0 if ok else reset)
            completions += 1.0 if ok else 0.0
            continue
        branches = branch_outcomes.get(rid)
        if branches is None or len(branches) == 0:
            missing_ids.append(rid)
            total += c_value * t + reset
            continue
        oks, ends = _branch_arrays(rid, branches, t)
        total += float(np.mean(c_value * ends + np.where(oks, 0.0, reset)))
        completions += float(oks.mean())
        n_routed += 1
        n_branches += int(oks.size)
    if missing_ids and missing == "raise":
        shown = ", ".join(map(repr, missing_ids[:10])) + (" ..." if len(missing_ids) > 10 else "")
        raise AnalysisError(f"{len(missing_ids)} alarmed rollout(s) have no recover branch outcomes: {shown}; "
                            "branch them, or pass missing='stop' to price them as stop-and-reset")

    stop = worksheet(episodes, cost_model, c=c_value)
    C_recover = total / completions if completions > 0 else None
    C_never = stop["C_never"]
    return RecoverCost(
        c=c_value, C_never=C_never, C_recover=C_recover,
        excess_recover=C_recover - C_never if C_recover is not None and C_never is not None else None,
        C_stop=stop["C_rule_direct"], excess_stop=stop["excess_direct"],
        expected_total_cost=total, expected_completions=completions,
        n_episodes=len(ids), n_alarmed=int(alarmed.sum()), n_routed=n_routed, n_missing=len(missing_ids),
        missing_ids=missing_ids, n_branches=n_branches,
        n_unused_branch_sets=sum(1 for key in branch_outcomes if key not in alarmed_ids),
    )
