"""Simulator backends. Each lives in its own module so ``import robocasa_shift`` needs no simulator."""

from __future__ import annotations

from robocasa_shift.registry import Registry

BACKENDS: Registry[type] = Registry("backend", "robocasa_shift.backends")
BACKENDS.register("robosuite", "robocasa_shift.backends.robosuite_backend:RobosuiteBackend")
BACKENDS.register("robocasa", "robocasa_shift.backends.robocasa_backend:RobocasaBackend")
BACKENDS.register("libero", "robocasa_shift.backends.libero_backend:LiberoBackend")  # in .venv-libero
BACKENDS.register("fake", "robocasa_shift.backends.fake:FakeBackend")  # the testing backend (no simulator)


def get_backend(name: str):
    """An instance of the backend registered under ``name``."""
    return BACKENDS.get(name)()
