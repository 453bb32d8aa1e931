"""What the kitchen tests (tests/test_robocasa*.py) ask of the Python running them: RoboCasa's code, the kit, kitchens."""

import importlib.util
import inspect
import os

import pytest

from robocasa_shift.backends import robocasa_backend as rb
from robocasa_shift.errors import BackendUnavailable


def robocasa_importable() -> bool:
    if importlib.util.find_spec("robocasa") is None:
        return False
    from robosuite.environments.base import MujocoEnv

    return "load_model_on_init" in inspect.signature(MujocoEnv.__init__).parameters


# Set by `make test-robocasa`: there, a kitchen test that cannot run fails instead of skipping, so CI never passes
# green with the kitchens untested (a kit that did not build, a broken .venv-robocasa).
REQUIRE_KITCHENS = os.environ.get("ROBOCASA_SHIFT_REQUIRE_KITCHENS") == "1"


def skip_unless_required(reason: str):
    if REQUIRE_KITCHENS:
        pytest.fail(f"ROBOCASA_SHIFT_REQUIRE_KITCHENS=1 but {reason}")
    pytest.skip(reason)


needs_robocasa = pytest.mark.skipif(
    not REQUIRE_KITCHENS and not robocasa_importable(),
    reason="RoboCasa's code on a robosuite with load_model_on_init is not installed in this Python "
           "(run `make test-robocasa`, which builds .venv-robocasa)",
)


def kit_opt_in():
    """``standin`` when the assets in use are the generated stand-in kit (the tests opt in, as a study must)."""
    if not robocasa_importable():
        return None
    import robocasa.models

    return rb.standin.KIT_KIND if rb.standin.kit_manifest(robocasa.models.assets_root) else None


def unavailable_reason():
    try:
        rb.check_available(kit_opt_in())
    except BackendUnavailable as exc:
        return str(exc)
    return None
