import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(scope="session")
def protocol():
    from robocasa_shift.core import specs

    return specs.load_protocol()


@pytest.fixture()
def spec_copy(tmp_path):
    """A writable copy of the frozen perturbation specs."""
    dest = tmp_path / "perturbations"
    shutil.copytree(ROOT / "perturbations", dest)
    return dest


@pytest.fixture(scope="module")
def lift_env():
    from robocasa_shift.backends import get_backend

    env = get_backend("robosuite").make("Lift")
    yield env
    env.close()


def pytest_collection_modifyitems(config, items):
    """Files that hold a ``slow`` test run first, the others after them, each group in its own order.

    ``make test`` hands whole files to its two workers (pytest-xdist's ``--dist loadfile``, ``--no-loadscope-reorder``
    so that this order is kept) as they free up. A long file handed out last would run alone while the other worker
    has nothing left: handed out first, the short files fill in beside it.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
