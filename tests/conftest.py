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
