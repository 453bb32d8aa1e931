"""Which factor runs on which backend, grouped by family: what ``conditions``, the report and the docs list.

A factor's kind names the backend hooks it calls (``requires``, ``core/backend.py``'s ``HOOKS``). A backend
supports the factor when the environment class its ``make`` returns (read from its annotation, without building
an environment or starting a simulator) has every method of those hooks; a kind that calls none (an image
transform, a deployment shift) runs on every backend. A backend whose module cannot be imported here is
``unknown``, with the reason.
"""

from __future__ import annotations

import typing
from typing import Any, Dict, List, Mapping, Optional

from robocasa_shift.backends import BACKENDS
from robocasa_shift.core.backend import offers_hook
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.factors import FACTOR_KINDS
from robocasa_shift.core.shifts import FAMILIES

YES, NO, UNKNOWN = "yes", "no", "unknown"


def environment_classes() -> Dict[str, Any]:
    """Backend name -> its environment class, or the reason it could not be read (a string)."""
    out: Dict[str, Any] = {}
    for name in BACKENDS.names():
        try:
            hints = typing.get_type_hints(BACKENDS.get(name).make)
            out[name] = hints.get("return") or "its make() names no environment class"
        except Exception as exc:  # a backend module that cannot be imported without its simulator
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def support(kind_cls: type, env_class: Any) -> Dict[str, str]:
    """``{"status": yes|no|unknown, "why": ...}`` for one factor kind on one backend's environment class."""
    if isinstance(env_class, str):
        return {"status": UNKNOWN, "why": env_class}
    lacking = [hook for hook in kind_cls.requires if not offers_hook(env_class, hook)]
    if lacking:
        return {"status": NO, "why": f"lacks the {', '.join(lacking)} hook"}
    return {"status": YES, "why": "" if kind_cls.requires else "needs no hook"}


def factor_table(protocol, environments: Optional[Mapping[str, Any]] = None) -> List[Dict[str, Any]]:
    """One row per factor, grouped by family (in :data:`core.shifts.FAMILIES`' order, the protocol's order within):
    family, factor, kind, side, whether it is in the matrix, its levels, and per backend its support."""
    environments = dict(environments if environments is not None else environment_classes())
    rows = []
    for name in protocol.factor_order:
        spec = protocol.factor(name)
        kind = FACTOR_KINDS.get(spec.kind)
        rows.append({"family": kind.family or "other", "factor": name, "kind": spec.kind, "side": kind.side,
                     "matrix": name not in protocol.optional_factors, "levels": protocol.factor_conditions(name),
                     "description": " ".join(spec.description.split()),
                     "backends": {b: support(kind, cls) for b, cls in environments.items()}})
    order = list(FAMILIES) + ["other"]
    return sorted(rows, key=lambda r: order.index(r["family"]) if r["family"] in order else len(order))


def combination_rows(protocol, table: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The predeclared combinations, each with its factors' families and the backends that support both."""
    by_factor = {row["factor"]: row for row in table}
    out = []
    for text in protocol.combinations:
        factors = Condition.parse(text).factors
        backends = sorted(by_factor[factors[0]]["backends"])
        both = [b for b in backends if all(by_factor[f]["backends"][b]["status"] == YES for f in factors)]
        out.append({"condition": text, "families": [by_factor[f]["family"] for f in factors], "backends": both})
    return out


__all__ = ["NO", "UNKNOWN", "YES", "combination_rows", "environment_classes", "factor_table", "support"]
