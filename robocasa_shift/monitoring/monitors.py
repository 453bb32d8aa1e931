"""Runtime monitors: a function from a rollout's step log up to a boundary to a score.

A monitor maps a :class:`~robocasa_shift.core.steplog.StepLog` to one score per
action-chunk boundary (higher: more likely failing); the score at boundary ``i``
reads only the log up to that boundary (the end effector where it stands, the
actions already taken, the samples drawn there), so an alarm raised on it could
have been raised online. NaN means undefined there (never an alarm).

Built in (RESCUE, Sec. IV-A, and its controls):

- ``steps_since_progress``: boundaries since the end effector last moved more
  than 1 cm between successive boundaries;
- ``action_jerk``: mean absolute first difference of the continuous arm commands
  over the trailing 16 steps;
- ``sampling_disagreement``: mean standard deviation of the arm commands across
  the policy's samples at the boundary (NaN for a policy without samples);
- controls: ``clock`` (the boundary's step: its threshold is a fixed alarm step,
  chosen on validation like any other), ``length_only`` (boundaries reached so
  far: what a timeout alone reveals), ``inverted_progress`` (minus
  ``steps_since_progress``: a decoy that must not look good), ``label_leak``
  (RESCUE Table II's positive control: a score that reads the rollout's outcome,
  see :func:`label_leak_scores`; every criterion must admit it, so a criterion
  that does not is broken). The rate-matched random alarm is not a score;
  ``detection.rate_matched_random_alarm`` draws it.

A user's monitor plugs in through the entry-point group ``robocasa_shift.monitors``::

    [options.entry_points]
    robocasa_shift.monitors =
        my_score = my_pkg.monitors:my_score      # def my_score(log: StepLog) -> np.ndarray
"""

from __future__ import annotations

from typing import Callable, List

import numpy as np
import pandas as pd

from robocasa_shift.core.steplog import StepLog
from robocasa_shift.registry import Registry

Monitor = Callable[[StepLog], np.ndarray]
MONITORS: Registry[Monitor] = Registry("monitor", "robocasa_shift.monitors")

PROGRESS_M = 0.01  # end-effector motion between boundaries that counts as progress
JERK_WINDOW = 16  # trailing control steps of action_jerk


def boundary_positions(log: StepLog) -> np.ndarray:
    """The end effector at each boundary, (boundaries, 3) (``eef_pos[s]`` is the position after ``s`` steps)."""
    return log.eef_pos[log.boundary]


@MONITORS.register("steps_since_progress")
def steps_since_progress(log: StepLog) -> np.ndarray:
    """Boundaries since the end effector last moved more than 1 cm from one boundary to the next."""
    positions = boundary_positions(log)
    out = np.zeros(len(positions))
    for i in range(1, len(positions)):
        moved = np.linalg.norm(positions[i] - positions[i - 1]) > PROGRESS_M
        out[i] = 0.0 if moved else out[i - 1] + 1.0
    return out


@MONITORS.register("action_jerk")
def action_jerk(log: StepLog) -> np.ndarray:
    """Mean absolute first difference of the continuous arm commands over the trailing 16 steps (NaN before 2)."""
    arm = log.arm
    out = np.full(len(log.boundary), np.nan)
    for i, step in enumerate(log.boundary):
        window = arm[max(0, step - JERK_WINDOW): step]
        if len(window) >= 2:
            out[i] = float(np.abs(np.diff(window, axis=0)).mean())
    return out


@MONITORS.register("sampling_disagreement")
def sampling_disagreement(log: StepLog) -> np.ndarray:
    """Mean standard deviation of the arm commands across the policy's samples at each boundary."""
    if log.samples is None:
        return np.full(len(log.boundary), np.nan)
    return np.asarray(log.samples, dtype=np.float64).std(axis=1).mean(axis=1)


@MONITORS.register("clock")
def clock(log: StepLog) -> np.ndarray:
    """The boundary's control step: an alarm at a fixed step, whatever happens (a sensor-free control)."""
    return log.boundary.astype(np.float64)


@MONITORS.register("length_only")
def length_only(log: StepLog) -> np.ndarray:
    """Boundaries reached so far (1, 2, ...): all a rollout's length says about its outcome."""
    return np.arange(1, len(log.boundary) + 1, dtype=np.float64)


@MONITORS.register("inverted_progress")
def inverted_progress(log: StepLog) -> np.ndarray:
    """Minus ``steps_since_progress``: a decoy that alarms when the arm moves (it should look bad)."""
    return -steps_since_progress(log)


LABEL_LEAK = "label_leak"


def label_leak_scores(table: pd.DataFrame) -> pd.DataFrame:
    """RESCUE's label-leak control on a boundary-scores table: the same rows, the score replaced by the outcome.

    A failed rollout scores +inf at every boundary, from its first; a successful one scores 0. The
    threshold chosen on validation successes (``detection.select_threshold``: the smallest observed
    success score, or +inf, meeting the target) is then +inf, which only failures reach: an alarm at
    step 0 on every failure and none on any success, RESCUE's ideal detector (d = 1, t_d = 0, f = 0).
    A finite score for failures would not do: successes that all tie at one value leave +inf as the
    only threshold, and it would never fire. The control reads the label, so every criterion must
    admit it (a criterion that does not cannot admit any monitor); it is never a monitor.
    """
    out = table.copy()
    out["score"] = np.where(out["success"].astype(bool).to_numpy(), 0.0, np.inf)
    return out


REAL_MONITORS = ("steps_since_progress", "action_jerk", "sampling_disagreement")
CONTROLS = ("clock", "length_only", "inverted_progress", LABEL_LEAK)


def monitor_names() -> List[str]:
    """Every registered monitor (built-in and from entry points)."""
    return MONITORS.names()


def score(name: str, log: StepLog) -> np.ndarray:
    """Monitor ``name`` on ``log``: one float per boundary.

    Raises:
        UnknownNameError: no monitor of that name (the message lists them).
        AnalysisError: the monitor returned another number of scores than the log has boundaries.
    """
    from robocasa_shift.errors import AnalysisError

    values = np.asarray(MONITORS.get(name)(log), dtype=np.float64).reshape(-1)
    if len(values) != len(log.boundary):
        raise AnalysisError(f"monitor {name!r} returned {len(values)} scores for {len(log.boundary)} boundaries")
    return values


__all__ = ["CONTROLS", "JERK_WINDOW", "LABEL_LEAK", "label_leak_scores", "MONITORS", "Monitor", "PROGRESS_M", "REAL_MONITORS", "action_jerk",
           "boundary_positions", "clock", "inverted_progress", "length_only", "monitor_names", "sampling_disagreement",
           "score", "steps_since_progress"]
