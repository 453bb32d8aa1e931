"""Optional dependencies: each behind an extra of the package named after what it is for.

A module that needs one imports it through :func:`require`, which raises :class:`~robocasa_shift.errors.
DependencyMissing` (exit status 3, the pip line of the extra) instead of a bare ``ModuleNotFoundError``;
commands call it before they start writing, so a missing extra never leaves half a result behind.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Optional

from robocasa_shift.errors import DependencyMissing

# extra -> what it is for (setup.cfg's [options.extras_require] lists the packages)
EXTRAS = {
    "sim": "the robosuite backend (robosuite 1.5.2, MuJoCo): run, screen, formal, bench and training on its tasks",
    "policy": "the reference policy's and the end-state judge's networks (torch)",
    "report": "the report's matched-pair videos (imageio with ffmpeg)",
    "geometry": "the monitors study's UMAP figure of a policy's feature sets (umap-learn; without it, PCA)",
    "gym": "robocasa_shift.gym, the Gymnasium wrapper (gymnasium)",
    "gr00t": "the GR00T client and launcher (pyzmq, msgpack)",
    "openpi": "the openpi client (openpi-client, websockets)",
    "vlaeval": "the vla-eval client (websockets, msgpack)",
    "cluster": "the Ray executor (ray)",
}


def require(module: str, extra: str, purpose: str, load: bool = True) -> Optional[ModuleType]:
    """Import ``module``, or raise :class:`DependencyMissing` naming ``purpose`` and ``extra``'s pip line.

    ``load=False`` only checks that it is installed (importing torch costs 180 MB: a command that may stop on
    bad input first checks, and imports where it computes).

    Raises:
        DependencyMissing: ``module`` (or a module it imports) is not installed.
        KeyError: ``extra`` is not one of :data:`EXTRAS` (a mistake in the caller).
    """
    if extra not in EXTRAS:
        raise KeyError(f"no extra {extra!r}; extras: {', '.join(EXTRAS)}")
    if not load:
        if importlib.util.find_spec(module) is None:
            raise DependencyMissing(purpose, module, extra)
        return None
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise DependencyMissing(purpose, exc.name or module, extra) from None


__all__ = ["EXTRAS", "require"]
