"""Conditions: ``clean``, or shifts of one or more factors at frozen levels (``camera:L2``, ``camera:L2+blur:L1``).

A condition travels as text (records, file names, tables, the command line) and is read once into a
:class:`Condition`, which every module uses: nothing else splits the string. Parsing checks the syntax
only (so records made under another protocol can still be read); :meth:`Condition.check` checks it
against a protocol and lists the valid conditions on a miss. Conditions are ordered by the protocol's
factor order (``perturbations/study.yaml``), not alphabetically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple

from robocasa_shift.errors import BadInput, UnknownNameError

CLEAN = "clean"
_SHIFT = re.compile(r"^(?P<factor>[A-Za-z0-9_.\-]+):L(?P<level>[1-9][0-9]*)$")


@dataclass(frozen=True)
class Shift:
    """One factor at one level: ``camera:L2`` is ``Shift("camera", 2)``."""

    factor: str
    level_index: int

    @property
    def level(self) -> str:
        """The level's name in the spec files (``"L2"``)."""
        return f"L{self.level_index}"

    def __str__(self) -> str:
        return f"{self.factor}:{self.level}"


@dataclass(frozen=True)
class Condition:
    """A condition of a study: no shift (``clean``) or shifts of distinct factors, applied together.

    Attributes:
        shifts: the shifts, in the order they were written (``camera:L2+blur:L1``); empty for ``clean``.
    """

    shifts: Tuple[Shift, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Condition":
        """Read ``clean``, ``factor:Lk`` or ``factor:Lk+factor:Lk...`` (syntax only).

        Raises:
            BadInput: not a condition's syntax, or a factor named twice; the message shows the forms.
        """
        if not isinstance(text, str):
            raise BadInput(f"condition {text!r} is not text; expected '{CLEAN}', 'factor:Lk' or 'factor:Lk+factor:Lk'")
        if text == CLEAN:
            return cls()
        shifts = []
        for part in text.split("+"):
            match = _SHIFT.match(part)
            if match is None:
                raise BadInput(f"condition {text!r} is neither '{CLEAN}' nor 'factor:Lk' (e.g. 'camera:L2'), "
                               f"nor factor:Lk joined by '+' (e.g. 'camera:L2+blur:L1')")
            shifts.append(Shift(match["factor"], int(match["level"])))
        factors = [s.factor for s in shifts]
        if len(set(factors)) != len(factors):
            raise BadInput(f"condition {text!r} names a factor twice")
        return cls(tuple(shifts))

    @classmethod
    def of(cls, factor: str, level: str) -> "Condition":
        """The single-factor condition ``factor`` at ``level`` (``"L2"``)."""
        return cls.parse(f"{factor}:{level}")

    def __str__(self) -> str:
        return "+".join(str(s) for s in self.shifts) if self.shifts else CLEAN

    @property
    def is_clean(self) -> bool:
        return not self.shifts

    @property
    def is_combined(self) -> bool:
        """More than one factor shifted at once."""
        return len(self.shifts) > 1

    @property
    def factors(self) -> Tuple[str, ...]:
        return tuple(s.factor for s in self.shifts)

    @property
    def single(self) -> Shift:
        """The one shift of a single-factor condition.

        Raises:
            BadInput: the condition is clean or combines factors.
        """
        if len(self.shifts) != 1:
            raise BadInput(f"condition '{self}' is not a single factor at one level")
        return self.shifts[0]

    @property
    def factor(self) -> Optional[str]:
        """The factor of a single-factor condition, None for ``clean``."""
        return None if self.is_clean else self.single.factor

    @property
    def level(self) -> Optional[str]:
        """The level (``"L2"``) of a single-factor condition, None for ``clean``."""
        return None if self.is_clean else self.single.level

    def check(self, known: Sequence[str]) -> "Condition":
        """This condition, if it is one of ``known`` (a protocol's ``known_conditions``).

        Raises:
            UnknownNameError: it is not; the message lists the known conditions.
        """
        if str(self) not in known:
            raise UnknownNameError("condition", str(self), list(known))
        return self

    def sort_key(self, factor_order: Sequence[str]) -> Tuple:
        """``clean`` first, then single factors in ``factor_order`` (others after, by name), levels by number,
        then combinations (by their parts in the same order)."""
        rank = {name: i for i, name in enumerate(factor_order)}
        parts = tuple((rank.get(s.factor, len(rank)), s.factor, s.level_index) for s in self.shifts)
        return (len(self.shifts) > 1, len(self.shifts), parts)


def order_conditions(conditions: Iterable[str], factor_order: Sequence[str]) -> List[str]:
    """Distinct conditions, ``clean`` first, in ``factor_order`` (a protocol's ``factor_order``).

    Raises:
        BadInput: a condition that is not one's syntax.
    """
    return sorted(set(conditions), key=lambda c: Condition.parse(c).sort_key(factor_order))


def factor_levels(conditions: Iterable[str], factor_order: Sequence[str]) -> List[Tuple[str, List[str]]]:
    """The single-factor conditions grouped by factor, each factor's levels in order: [(factor, [conditions])]."""
    grouped: dict = {}
    for text in order_conditions(conditions, factor_order):
        condition = Condition.parse(text)
        if len(condition.shifts) == 1:
            grouped.setdefault(condition.factor, []).append(text)
    return list(grouped.items())
