"""A run's records as a pandas table (docs/records.md), and reading such a table back."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Optional, Sequence

import pandas as pd

from robocasa_shift.core.records import RolloutKey, to_row
from robocasa_shift.errors import AnalysisError
from robocasa_shift.rundir.store import RunStore


def read_records_csv(path: Path | str, columns: Optional[Sequence[str]] = None) -> pd.DataFrame:
    """A records table from a CSV file, every column as text (see ``measures.load_records``).

    Args:
        columns: read only these columns, where the header has them (all when None): a table with many
            other columns costs what its needed ones cost.

    Raises:
        AnalysisError: the file cannot be read, is larger than a records table may be (``MAX_FILE_BYTES``), is
            not UTF-8, is empty, has a header over ``MAX_CSV_HEADER_BYTES`` or ``MAX_CSV_COLUMNS``, or has a row
            with another number of fields than the header (the message names the file and the line).
    """
    from robocasa_shift.rundir.files import MAX_FILE_BYTES, csv_header, read_bytes

    path = Path(path)
    try:
        data = read_bytes(path, None, MAX_FILE_BYTES, "records table")
        header = csv_header(data, path)
        text = data.decode("utf-8-sig")  # a spreadsheet's byte-order mark is not part of the first column's name
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise AnalysisError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            f"save the records table as UTF-8 CSV") from None
    except ValueError as exc:
        raise AnalysisError(str(exc)) from None
    if not text.strip():
        raise AnalysisError(f"{path}: empty file; expected a records table with a header row "
                            f"(write one with `robocasa-shift export RUN_DIR --out {path.name}`)")
    # pandas names a ragged row only by a parser message; count the fields per line ourselves first
    rows = csv.reader(io.StringIO(text, newline=""))  # quoted fields may hold newlines (error tracebacks)
    try:
        next(rows)
        for row in rows:
            if row and len(row) != len(header):
                raise AnalysisError(f"{path}, line {rows.line_num}: {len(row)} fields, but the header has "
                                    f"{len(header)} ({', '.join(header)[:2000]})")
    except csv.Error as exc:
        raise AnalysisError(f"{path}, line {rows.line_num}: not CSV ({exc})") from None
    wanted = None if columns is None else list(dict.fromkeys(c for c in header if c in set(columns)))
    try:
        return pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=True, usecols=wanted)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
        raise AnalysisError(f"{path}: not a CSV records table ({exc})") from None


def records_frame(run_dir: Path | str) -> pd.DataFrame:
    """One row per recorded rollout, sorted by key."""
    rows = [to_row(r) for r in RunStore(run_dir).records()]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["phase", "task", "episode", "replicate", "condition"], kind="stable").reset_index(drop=True)


def export_records(run_dir: Path | str, out: Path | str) -> int:
    """Write the records table of ``run_dir`` to ``out`` (CSV); return the number of rows."""
    from robocasa_shift.rundir.files import confined, write_csv

    frame = records_frame(run_dir)
    with confined(run_dir):  # an --out inside the run directory is never written through a symbolic link
        write_csv(frame, out)
    return len(frame)


def steps_frame(run_dir: Path | str) -> pd.DataFrame:
    """The step logs of ``run_dir`` as one tidy table: one row per control step of every logged rollout.

    Columns: the key (``phase, task, episode, condition, replicate``), ``success``, ``step``
    (1-based: the state after that step), ``boundary`` (the policy was asked before this step),
    ``eef_x, eef_y, eef_z`` (after the step), ``action_0 ...`` (the command of the step),
    ``gripper``, ``latched`` (subgoals latched so far) and, at boundaries of policies that draw
    monitor samples, ``sample_std`` (mean std of the arm commands across the samples).

    Raises:
        StepLogError: a step log that is missing or changed since it was written.
    """
    store = RunStore(run_dir)
    parts = []
    for record in store.records():
        log = store.step_log(record)
        if log is None or not log.steps:
            continue
        key = RolloutKey.from_record(record)
        part = pd.DataFrame({**key.to_json(), "success": record["success"], "step": range(1, log.steps + 1)})
        part["boundary"] = part["step"].isin(log.boundary + 1)
        part[["eef_x", "eef_y", "eef_z"]] = log.eef_pos[1:]
        for i in range(log.action.shape[1]):
            part[f"action_{i}"] = log.action[:, i]
        part["gripper"] = log.gripper
        part["latched"] = log.latched
        if log.samples is not None:
            spread = pd.Series(log.samples.std(axis=1).mean(axis=1), index=log.boundary + 1)
            part["sample_std"] = part["step"].map(spread)
        parts.append(part)
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True)
