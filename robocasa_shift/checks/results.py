"""The result every protocol check returns, the findings of a checklist, and the one function that writes a result
into a run directory."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Sequence

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


class Findings:
    """A checklist's problems per check (a check with none passes) and notes on what was not offered."""

    def __init__(self, checks: Sequence[str]):
        self.problems: Dict[str, List[str]] = {name: [] for name in checks}
        self.notes: Dict[str, str] = {}

    def add(self, check: str, problem: str) -> None:
        self.problems[check].append(problem)

    def guard(self, check: str, what: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn``; an exception is a problem of ``check`` (a contract breach), never a crash of the checker."""
        try:
            return fn()
        except Exception as exc:  # the checker reports every breach; it must survive them
            self.add(check, f"{what} raised {type(exc).__name__}: {exc}")
            return None

    def checks(self) -> Dict[str, Dict[str, Any]]:
        """Per check: passed, and its problems."""
        return {check: {"passed": not problems, "problems": problems} for check, problems in self.problems.items()}

    def table(self) -> List[str]:
        """The Markdown table of the checks: result, the first three problems (or the note, or -)."""
        lines = ["| check | result | problems |", "|---|---|---|"]
        for check, problems in self.problems.items():
            shown = "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")
            lines.append(f"| {check} | {'FAILED' if problems else 'ok'} | {shown or self.notes.get(check) or '-'} |")
        return lines


def write_result(result: CheckResult, run_dir: Path | str) -> Path:
    """Write ``<stem>.json`` and ``<stem>.md`` under ``run_dir`` atomically; return the Markdown path."""
    base = Path(run_dir) / result.stem
    atomic_write_text(base.with_suffix(".json"), json.dumps(result.to_json(), indent=1, sort_keys=True) + "\n", run_dir)
    atomic_write_text(base.with_suffix(".md"), result.markdown, run_dir)
    return base.with_suffix(".md")
