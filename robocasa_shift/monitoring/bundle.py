"""Monitors computed elsewhere, judged by this study: a per-timestep score bundle replayed onto a run.

A bundle is a CSV table, one row per (rollout, step, monitor)::

    rollout_id,step,monitor,score
    formal/Lift/0003/clean/r0,8,my_vla_uncertainty,0.12
    formal/Lift/0003/clean/r0,16,my_vla_uncertainty,0.31

``rollout_id`` is a record's key (``phase/task/episode/condition/rREPLICATE``, as ``export`` writes it),
``step`` the control step the score was computed at (0 to the rollout's length; the score may read
only what happened up to it, which the bundle's author must guarantee: the harness cannot check it),
``monitor`` a name (letters, digits, ``_.+-``; it must not shadow a registered monitor) and ``score``
a number (empty or NaN: undefined there, never an alarm). Every row must name a valid, recorded
rollout of the run; every analysis the study runs (AUCs, thresholds frozen on clean validation, decision
value, RESCUE's Table II, leave-one-task-out) then treats the monitor like a built-in one. The rollouts
a bundle leaves out of a monitor are left out of that monitor's tables and counted.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Dict, Mapping

import numpy as np
import pandas as pd

from robocasa_shift.errors import AnalysisError
from robocasa_shift.rundir.files import MAX_FILE_BYTES, csv_header, read_bytes

COLUMNS = ("rollout_id", "step", "monitor", "score")
MAX_ROWS = 10_000_000
MAX_MONITORS = 64
_NAME = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


def read_bundle(path: Path | str) -> pd.DataFrame:
    """The bundle's rows, checked column by column (a bad value names the file, its line and the field)."""
    path = Path(path)
    try:
        data = read_bytes(path, None, MAX_FILE_BYTES, "score bundle")
        header = csv_header(data, path)
    except (OSError, ValueError) as exc:
        raise AnalysisError(f"{path}: cannot read the score bundle ({exc})") from None
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise AnalysisError(f"{path}: no column {missing[0]!r} (a score bundle has {', '.join(COLUMNS)})")
    try:
        frame = pd.read_csv(io.BytesIO(data), usecols=list(COLUMNS), dtype={"rollout_id": str, "monitor": str},
                            nrows=MAX_ROWS + 1, keep_default_na=False, na_values=[""])
    except (ValueError, pd.errors.ParserError) as exc:
        raise AnalysisError(f"{path}: not a CSV table ({str(exc)[:200]})") from None
    if len(frame) > MAX_ROWS:
        raise AnalysisError(f"{path}: more than {MAX_ROWS} rows")
    for column in ("step", "score"):
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() & frame[column].notna() if column == "score" else values.isna()
        if column == "step":
            bad |= (values < 0) | (values % 1 != 0) | (values > 2**31)
        if column == "score":
            bad |= np.isinf(values.fillna(0))
        if bad.any():
            i = int(bad.to_numpy().argmax())
            raise AnalysisError(f"{path}, line {i + 2}: field {column!r} must be "
                                f"{'a whole step >= 0' if column == 'step' else 'a finite number or empty'}, "
                                f"got {str(frame[column].iloc[i])[:40]!r}")
        frame[column] = values
    names = frame["monitor"].fillna("")
    bad_name = ~names.str.match(_NAME.pattern)
    if bad_name.any():
        i = int(bad_name.to_numpy().argmax())
        raise AnalysisError(f"{path}, line {i + 2}: field 'monitor' {str(names.iloc[i])[:40]!r} is not a name "
                            f"(letters, digits, '_', '.', '+', '-'; at most 64)")
    if names.nunique() > MAX_MONITORS:
        raise AnalysisError(f"{path}: {names.nunique()} monitors, more than {MAX_MONITORS}")
    twice = frame.duplicated(["rollout_id", "step", "monitor"])
    if twice.any():
        i = int(twice.to_numpy().argmax())
        raise AnalysisError(f"{path}, line {i + 2}: rollout {frame['rollout_id'].iloc[i]!r} has two scores of "
                            f"{frame['monitor'].iloc[i]!r} at step {int(frame['step'].iloc[i])}")
    frame["step"] = frame["step"].astype(int)
    return frame


def bundle_scores(path: Path | str, rollouts: pd.DataFrame, registered) -> Dict[str, pd.DataFrame]:
    """The bundle's monitors as boundary-scores tables over ``rollouts`` (one row per rollout of the study:
    rollout_id, task, episode, condition, success, steps, horizon), like ``boundary_scores`` builds.

    Raises:
        AnalysisError: a row naming a rollout the study does not hold, a step past its rollout's end, a monitor
            named like a registered one.
    """
    path = Path(path)
    frame = read_bundle(path)
    known = rollouts.drop_duplicates("rollout_id").set_index("rollout_id")
    unknown = ~frame["rollout_id"].isin(known.index)
    if unknown.any():
        i = int(unknown.to_numpy().argmax())
        raise AnalysisError(f"{path}, line {i + 2}: rollout {str(frame['rollout_id'].iloc[i])[:80]!r} is not a valid, "
                            f"logged formal rollout of this run ({unknown.sum()} such row(s))")
    steps = known.loc[frame["rollout_id"], "steps"].to_numpy()
    past = frame["step"].to_numpy() > steps
    if past.any():
        i = int(past.argmax())
        raise AnalysisError(f"{path}, line {i + 2}: step {int(frame['step'].iloc[i])} is past the end of rollout "
                            f"{frame['rollout_id'].iloc[i]} ({int(steps[i])} steps)")
    out: Dict[str, pd.DataFrame] = {}
    for name, part in frame.groupby("monitor", sort=True):
        if name in registered:
            raise AnalysisError(f"{path}: monitor {name!r} has the name of a registered monitor; rename it")
        meta = known.loc[part["rollout_id"], ["task", "episode", "condition", "success", "steps", "horizon"]]
        table = pd.concat([part[["rollout_id"]].reset_index(drop=True), meta.reset_index(drop=True),
                           part[["step", "score"]].reset_index(drop=True)], axis=1)
        out[str(name)] = table.sort_values(["rollout_id", "step"], kind="stable").reset_index(drop=True)
    return out


def coverage(tables: Mapping[str, pd.DataFrame], rollouts: pd.DataFrame) -> Dict[str, Dict[str, int]]:
    """Per bundle monitor: the study's rollouts it scores and those it leaves out."""
    total = rollouts["rollout_id"].nunique()
    return {name: {"scored": int(t["rollout_id"].nunique()), "left_out": int(total - t["rollout_id"].nunique())}
            for name, t in tables.items()}
