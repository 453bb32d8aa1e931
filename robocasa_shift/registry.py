"""Named registries for the parts users extend: backends, policies, factors, predicates.

One small generic class, one instance per kind. A duplicate name raises; an
unknown name lists the known ones. Third-party packages add entries through
the setup.cfg entry-point group of the kind (``robocasa_shift.<kind>s``); an
entry may be a lazy ``"module:attr"`` string so heavy imports (MuJoCo, torch)
happen only when the entry is used.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import (
    Any,
    Callable,
    Dict,
    Generic,
    Iterator,
    List,
    Optional,
    Tuple,
    TypeVar,
    Union,
)

from robocasa_shift.errors import DuplicateNameError, UnknownNameError

T = TypeVar("T")


def resolve_target(target: str) -> Any:
    """The object a lazy ``"module:attr"`` target names (the module imported now)."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split(".") if attr else []:
        obj = getattr(obj, part)
    return obj


class Registry(Generic[T]):
    """Maps names to objects (or lazy ``"module:attr"`` targets) of one kind.

    ``modules``: the project's modules whose ``@register`` decorators add entries beside the ones registered where
    the registry is defined, imported when the registry is first read (so a class is registered where it is
    written, and the heavy module is imported only when the registry is used).
    """

    def __init__(self, kind: str, entry_point_group: Optional[str] = None, modules: Tuple[str, ...] = ()):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self.modules = tuple(modules)
        self._entries: Dict[str, Union[T, str]] = {}
        self._entry_points_loaded = entry_point_group is None and not modules

    def register(self, name: str, obj: Union[T, str, None] = None) -> Callable[[T], T]:
        """Register ``obj`` under ``name``; without ``obj``, return a decorator."""

        def add(target):
            if name in self._entries:
                raise DuplicateNameError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = target
            return target

        if obj is not None:
            add(obj)
            return lambda x: x
        return add

    def _load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for module in self.modules:
            importlib.import_module(module)
        if self.entry_point_group is None:
            return
        for ep in metadata.entry_points(group=self.entry_point_group):
            self.register(ep.name, ep.value)

    def get(self, name: str) -> T:
        """The entry registered under ``name`` (lazy targets imported now); unknown names list the known ones."""
        self._load_entry_points()
        if name not in self._entries:
            raise UnknownNameError(self.kind, name, self.names())
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = resolve_target(entry)
            self._entries[name] = entry
        return entry

    def names(self) -> List[str]:
        """Every registered name (entry points included), sorted."""
        self._load_entry_points()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._load_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
