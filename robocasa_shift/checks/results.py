"""The result every protocol check returns, and the one function that writes it into a run directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping

from robocasa_shift.rundir.files import atomic_write_text


@dataclass(frozen=True)
class CheckResult(Mapping[str, Any]):
    """A check's verdict, its details (JSON-able) and a readable Markdown table.

    It reads like the details mapping (``result["tasks"]``), so scripts written
    against the JSON file work on the returned value too.

    Attributes:
        check: what ran ("audit", "stage validation", "pairing validation", "calibration", "screening", "compare").
        passed: the verdict; the CLI exits 1 when it is False.
        details: everything the check found; written as ``<stem>.json`` (with ``passed``).
        markdown: the readable report; written as ``<stem>.md``.
        stem: where it goes, relative to the run directory, without suffix (e.g. ``validation/stages``).
    """

    check: str
    passed: bool
    details: Dict[str, Any] = field(repr=False)
    markdown: str = field(repr=False)
    stem: str = ""

    def __getitem__(self, key: str) -> Any:
        if key == "passed":
            return self.passed
        return self.details[key]

    def __iter__(self) -> Iterator[str]:
        return iter({**self.details, "passed": self.passed})

    def __len__(self) -> int:
        return len({**self.details, "passed": self.passed})

    def to_json(self) -> Dict[str, Any]:
        """The details with the verdict, as written to ``<stem>.json``."""
        return {**self.details, "passed": self.passed}


def write_result(result: CheckResult, run_dir: Path | str) -> Path:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``run_dir`` atomically; return the Markdown path."""
    base = Path(run_dir) / result.stem
    atomic_write_text(base.with_suffix(".json"), json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n", run_dir)
    atomic_write_text(base.with_suffix(".md"), result.markdown, run_dir)
    return base.with_suffix(".md")
