"""A run's records as a pandas table (DESIGN.md, "Records table")."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from robocasa_shift.engine.records import to_row
from robocasa_shift.study.store import RunStore


def records_frame(run_dir: Path | str) -> pd.DataFrame:
    """One row per recorded rollout, sorted by key."""
    rows = [to_row(r) for r in RunStore(run_dir).records()]
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    return frame.sort_values(["phase", "task", "episode", "replicate", "condition"], kind="stable").reset_index(drop=True)


def export_records(run_dir: Path | str, out: Path | str) -> int:
    frame = records_frame(run_dir)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out, index=False)
    return len(frame)
