import pytest

from robocasa_shift.errors import DuplicateNameError, UnknownNameError
from robocasa_shift.registry import Registry


def test_duplicate_name_raises():
    reg = Registry("widget")
    reg.register("a", object())
    with pytest.raises(DuplicateNameError, match="widget 'a' is already registered"):
        reg.register("a", object())


def test_unknown_name_lists_known_and_suggests():
    reg = Registry("factor")
    for name in ("base", "blur", "camera", "illumination"):
        reg.register(name, name.upper())
    with pytest.raises(UnknownNameError) as info:
        reg.get("blurr")
    assert str(info.value) == "unknown factor 'blurr' (did you mean 'blur'?); known: base, blur, camera, illumination"
    assert info.value.known == ["base", "blur", "camera", "illumination"]


def test_lazy_targets_resolve_on_first_use():
    reg = Registry("thing")
    reg.register("join", "os.path:join")
    import os.path

    assert reg.get("join") is os.path.join


def test_decorator_returns_the_class():
    reg = Registry("policy")

    @reg.register("mine")
    class Mine:
        pass

    assert reg.get("mine") is Mine


def test_builtin_registries_know_their_names():
    from robocasa_shift.backends import BACKENDS
    from robocasa_shift.core.factors import FACTOR_KINDS
    from robocasa_shift.policies import POLICIES

    assert "robosuite" in BACKENDS.names()
    assert {"expert", "random"} <= set(POLICIES.names())
    assert FACTOR_KINDS.names() == ["action_hold", "action_latency", "actuator_gain", "arm_joint_offset",
                                    "base_offset", "camera_pose", "camera_rotation", "execution_noise", "fog",
                                    "gaussian_blur", "glass_blur", "gripper_force", "instruction_graded",
                                    "instruction_paraphrase", "joint_damping", "joint_friction", "light_scale",
                                    "motion_blur", "object_friction", "object_mass", "observation_latency",
                                    "zoom_blur"]


def test_package_api_is_lazy_and_complete():
    import subprocess
    import sys

    code = (
        "import sys, robocasa_shift as rs; "
        "assert callable(rs.run_study) and callable(rs.analyze) and callable(rs.build_report); "
        "assert not {'mujoco', 'robosuite', 'torch'} & set(sys.modules), sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
