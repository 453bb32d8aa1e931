"""A run's records as a pandas table (DESIGN.md, "Records table"), and reading such a table back."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pandas as pd

from robocasa_shift.engine.records import to_row
from robocasa_shift.errors import AnalysisError
from robocasa_shift.study.store import RunStore


def read_records_csv(path: Path | str) -> pd.DataFrame:
    """A records table from a CSV file, every column as text (see ``measures.load_records``).

    Raises:
        AnalysisError: the file cannot be read, is not UTF-8, is empty, or has a row with more
            fields than the header (the message names the file and the line).
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise AnalysisError(f"{path}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise AnalysisError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            f"save the records table as UTF-8 CSV") from None
    if not text.strip():
        raise AnalysisError(f"{path}: empty file; expected a records table with a header row "
                            f"(write one with `robocasa-shift export RUN_DIR --out {path.name}`)")
    # pandas names a ragged row only by a parser message; count the fields per line ourselves first
    rows = csv.reader(io.StringIO(text, newline=""))  # quoted fields may hold newlines (error tracebacks)
    try:
        header = next(rows)
        for row in rows:
            if row and len(row) != len(header):
                raise AnalysisError(f"{path}, line {rows.line_num}: {len(row)} fields, but the header has "
                                    f"{len(header)} ({', '.join(header)})")
    except csv.Error as exc:
        raise AnalysisError(f"{path}, line {rows.line_num}: not CSV ({exc})") from None
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=True, encoding="utf-8")
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
    frame = records_frame(run_dir)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return len(frame)
