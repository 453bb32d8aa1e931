"""Work robosuite 1.5.2 does every physics substep that no one reads, skipped without changing a bit.

A control step of robosuite is 25 substeps of: controller, ``mj_step1/2``, then every observable's
update. Two pieces of that are pure waste for this harness:

- ``robot.action_dim`` is a property that rebuilds the action limits (array concatenations over
  every part controller) and is read three times per substep, though it never changes once the
  robot is built. Here it is read once and the robot instance gets a subclass that returns it.
- The object observables (``cube_pos``, ``gripper_to_cube_pos``, the ``object-state``
  concatenation, ...) are sampled every control step, but the harness delivers only the robot's
  own sensing (``robot0_*``) and reads object poses from the simulator. They are disabled.

Neither touches what the physics integrates: the identity test (tests/test_fastpath.py) steps
the same actions with and without these shortcuts on several tasks and conditions and compares
the full MuJoCo integration state and the delivered observations after every control step,
byte for byte. The shortcuts are applied only to the robosuite version they were verified on;
another version gets stock robosuite, and the identity test, which pins the version, fails.
"""

from __future__ import annotations

from typing import Any, Dict

VERIFIED_ROBOSUITE = "1.5.2"
# observable modalities nothing in the harness reads (robot0_* proprioception is delivered to policies)
UNREAD_MODALITIES = ("object",)


def applicable() -> bool:
    """Whether the installed robosuite is the one the shortcuts were verified on."""
    import robosuite

    return robosuite.__version__ == VERIFIED_ROBOSUITE


def enable(raw) -> Dict[str, Any]:
    """Apply the shortcuts to a built robosuite environment; what was done (for the manifest)."""
    if not applicable():
        import robosuite

        return {"enabled": False, "reason": f"verified on robosuite {VERIFIED_ROBOSUITE}, not {robosuite.__version__}"}
    for robot in raw.robots:
        if not getattr(type(robot), "_fastpath", False):
            dim = robot.action_dim
            cls = type(robot)
            robot.__class__ = type(cls.__name__, (cls,), {"action_dim": property(lambda self, d=dim: d),
                                                          "_fastpath": True, "_stock_class": cls,
                                                          "__module__": cls.__module__})
    disabled = sorted(name for name, obs in raw._observables.items() if obs.modality in UNREAD_MODALITIES)
    for name in disabled:
        raw._observables[name].set_enabled(False)
    return {"enabled": True, "robosuite": VERIFIED_ROBOSUITE, "action_dim_cached": True,
            "observables_disabled": disabled}


def disable(raw) -> None:
    """Stock robosuite again (the identity test's reference)."""
    for robot in raw.robots:
        if getattr(type(robot), "_fastpath", False):
            robot.__class__ = type(robot)._stock_class
    for obs in raw._observables.values():
        if obs.modality in UNREAD_MODALITIES:
            obs.set_enabled(True)
