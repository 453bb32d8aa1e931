"""The main study's analyses beyond the paired measures, each registered once (:data:`SECTIONS`).

A :class:`Section` says what it adds to ``summary.json`` (``compute``), the tidy tables it gives beside the
core ones (``tables``: ``write_analysis`` writes them as CSV) and the report block that shows it (``report``: a
lazy ``"module:function"`` target the report imports and calls, so this module imports nothing of the report).
``analysis.measures.analyze`` computes every registered section, ``tables`` gathers their tables and the report
page renders their blocks in ``order``: a new analysis is one ``register_section`` call, in the module that
computes it or in a plug-in (entry-point group ``robocasa_shift.analyses``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import pandas as pd

from robocasa_shift.registry import Registry


@dataclass(frozen=True)
class StudyData:
    """What a section computes from: the phase's rows and what ``analyze`` derived before the sections.

    Attributes:
        rows: every row of the phase (normalized; replicate 1 included, for the noise floor).
        paired_rows: the replicate-0 rows every paired measure uses.
        tasks: the tasks, sorted.
        conditions: the conditions, clean first, in the protocol's order.
        summary_conditions: condition -> its measures (``summary["conditions"]``), verdicts included.
        valid_pairs: perturbed condition -> its valid pairs (task, episode, success_pert).
        factor_order: the factors' display order.
        min_effect: the declared margin of the verdicts.
        n_boot: bootstrap resamples.
        bootstrap_seed: the seed every bootstrap stream derives from.
        variant_of: scene-variant task -> the task it changes.
    """

    rows: pd.DataFrame
    paired_rows: pd.DataFrame
    tasks: List[str]
    conditions: List[str]
    summary_conditions: Mapping[str, Dict[str, Any]]
    valid_pairs: Mapping[str, pd.DataFrame]
    factor_order: Sequence[str]
    min_effect: float
    n_boot: int
    bootstrap_seed: int
    variant_of: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Section:
    """One analysis of the main study.

    Attributes:
        name: its registry name.
        compute: ``StudyData -> {summary key: JSON-ready value}`` (None for undefined values, never NaN).
        tables: ``summary -> {table name: frame}`` written beside the core tables (None: no table).
        report: ``"module:function"`` of the report block, ``function(summary, out_dir) -> html`` ("" when there
            is nothing to show); None: not on the page.
        order: where its block sits among the sections' blocks (ascending).
    """

    name: str
    compute: Callable[[StudyData], Dict[str, Any]]
    tables: Optional[Callable[[Mapping[str, Any]], Dict[str, pd.DataFrame]]] = None
    report: Optional[str] = None
    order: float = 100.0


SECTIONS: Registry[Section] = Registry("analysis section", "robocasa_shift.analyses",
                                       modules=("robocasa_shift.analysis.measures",
                                                "robocasa_shift.analysis.interactions"))


def register_section(section: Section) -> Section:
    """Register ``section`` under its name (a duplicate raises)."""
    SECTIONS.register(section.name, section)
    return section


def sections() -> List[Section]:
    """Every registered section, in ``order`` (then by name)."""
    found = [SECTIONS.get(name) for name in SECTIONS.names()]
    return sorted(found, key=lambda s: (s.order, s.name))


def compute_sections(data: StudyData) -> Dict[str, Any]:
    """Every section's summary keys; two sections claiming one key is a bug, refused."""
    out: Dict[str, Any] = {}
    for section in sections():
        values = section.compute(data)
        clash = sorted(set(values) & set(out))
        if clash:
            raise ValueError(f"analysis section {section.name!r} writes summary keys {clash} another section wrote")
        out.update(values)
    return out


def section_tables(summary: Mapping[str, Any]) -> Dict[str, pd.DataFrame]:
    """Every section's tables."""
    out: Dict[str, pd.DataFrame] = {}
    for section in sections():
        if section.tables is not None:
            out.update(section.tables(summary))
    return out


__all__ = ["SECTIONS", "Section", "StudyData", "compute_sections", "register_section", "section_tables", "sections"]
