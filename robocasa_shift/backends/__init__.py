"""Simulator backends. Each lives in its own module so ``import robocasa_shift`` needs no simulator."""

from __future__ import annotations

from typing import Optional

from robocasa_shift.errors import BadInput
from robocasa_shift.registry import Registry

BACKENDS: Registry[type] = Registry("backend", "robocasa_shift.backends")
BACKENDS.register("robosuite", "robocasa_shift.backends.robosuite_backend:RobosuiteBackend")
BACKENDS.register("robocasa", "robocasa_shift.backends.robocasa_backend:RobocasaBackend")
BACKENDS.register("libero", "robocasa_shift.backends.libero_backend:LiberoBackend")  # in .venv-libero
BACKENDS.register("fake", "robocasa_shift.backends.fake:FakeBackend")  # the testing backend (no simulator)


def get_backend(name: str, asset_kit: Optional[str] = None):
    """An instance of the backend registered under ``name``.

    Args:
        asset_kit: a generated asset kit the study opts into (``standin``: the robocasa backend's stand-in
            kitchens); a backend refuses such a kit unless opted into, and one without asset kits refuses the option.

    Raises:
        BadInput: ``asset_kit`` given for a backend that has no asset kits.
    """
    backend = BACKENDS.get(name)()
    accept = getattr(backend, "accept_asset_kit", None)
    if accept is not None:
        accept(asset_kit)
    elif asset_kit is not None:
        raise BadInput(f"--asset-kit {asset_kit}: backend '{name}' has no asset kits (only robocasa has: its stand-in "
                       f"kitchens)")
    return backend
