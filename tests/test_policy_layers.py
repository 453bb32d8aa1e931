"""The policy layers: one PandaOmron action layout, one shared remote layer, no task guessing.

The import checks read the source (every ``import``, also those inside
functions), so they hold without openpi-client, lerobot or a GPU installed.
"""

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import robocasa_shift
from robocasa_shift.core.policy import Observation
from robocasa_shift.embodiments import panda_omron

PACKAGE_ROOT = Path(robocasa_shift.__file__).resolve().parent
SERVED_PROTOCOLS = ("robocasa_shift.policies.gr00t", "robocasa_shift.policies.openpi", "robocasa_shift.policies.vla_eval")
REMOTE_ADAPTERS = SERVED_PROTOCOLS + ("robocasa_shift.policies.lerobot",)


def source_files(module: str):
    """The .py files of a module, or of every module in a package."""
    path = PACKAGE_ROOT.joinpath(*module.split(".")[1:])
    return sorted(path.rglob("*.py")) if path.is_dir() else [path.with_suffix(".py")]


def module_name(file: Path) -> str:
    parts = list(file.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(module: str):
    """(importing file, imported module, imported name or None) for every import statement in ``module``."""
    found = []
    for file in source_files(module):
        here = module_name(file)
        is_package = file.name == "__init__.py"
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                found += [(file, alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolve against this module's package
                    package = here.split(".")[: len(here.split(".")) - node.level + is_package]
                    base = ".".join(package + ([base] if base else []))
                found += [(file, base, alias.name) for alias in node.names]
    return found


def imported_modules(module: str):
    """Every module ``module`` imports; ``from p import m`` counts both ``p`` and ``p.m``."""
    names = set()
    for _, base, name in imports(module):
        names.add(base)
        if name is not None:
            names.add(f"{base}.{name}")
    return names


def reaches(names, target: str) -> bool:
    return any(n == target or n.startswith(target + ".") for n in names)


def test_the_remote_adapters_share_one_layer_and_never_import_each_other():
    for adapter in REMOTE_ADAPTERS:
        names = imported_modules(adapter)
        assert "robocasa_shift.policies.model_io" in names, adapter
        if adapter in SERVED_PROTOCOLS:
            assert reaches(names, "robocasa_shift.policies.served"), adapter
        for other in REMOTE_ADAPTERS:
            if other != adapter:
                assert not reaches(names, other), f"{adapter} imports {other}"
    # the ones the issue named, spelled out
    assert not reaches(imported_modules("robocasa_shift.policies.lerobot"), "robocasa_shift.policies.openpi")
    assert not reaches(imported_modules("robocasa_shift.policies.openpi"), "robocasa_shift.policies.gr00t")


def test_the_served_base_imports_no_protocol():
    names = imported_modules("robocasa_shift.policies.served") | imported_modules("robocasa_shift.policies.model_io")
    for protocol in REMOTE_ADAPTERS:
        assert not reaches(names, protocol), protocol


def test_no_function_in_policies_is_over_120_lines():
    long = []
    for file in source_files("robocasa_shift.policies"):
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 120:
                long.append(f"{file.relative_to(PACKAGE_ROOT).as_posix()}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert long == []


def test_no_policy_module_imports_a_private_name_of_another_policy():
    def package(module: str) -> str:
        return module.rsplit(".", 1)[0]

    # a private name may cross files inside one policy's package (gr00t/, reference/), never between policies
    private = [(file.relative_to(PACKAGE_ROOT).as_posix(), f"{base}:{name}")
               for file, base, name in imports("robocasa_shift.policies")
               if name and name.startswith("_") and not name.endswith("__") and base.startswith("robocasa_shift")
               and not (package(module_name(file)) == package(base) != "robocasa_shift.policies")]
    assert private == []


def test_the_import_walker_sees_imports_inside_functions():
    names = imported_modules("robocasa_shift.policies.gr00t.server")
    assert "gr00t.model.policy" in names  # imported inside build_gr00t_model
    assert "robocasa_shift.policies.gr00t.client.Gr00tClient" in names


def test_the_panda_omron_action_layout_is_defined_once():
    from robocasa_shift.backends import robocasa_backend
    from robocasa_shift.policies.gr00t.mapping import ACTION_LAYOUT
    from robocasa_shift.policies.model_io import ACTION_LAYOUTS

    assert robocasa_backend.HARNESS_ACTION_LAYOUT is panda_omron.PART_RANGES
    parts = [i for start, end in panda_omron.PART_RANGES.values() for i in range(start, end)]
    assert sorted(parts + [panda_omron.MODE]) == list(range(panda_omron.ACTION_DIM))
    assert panda_omron.PART_RANGES == {"right": (0, 6), "torso": (6, 7), "base": (7, 10), "right_gripper": (10, 11)}
    assert panda_omron.BASE_MOTION == (7, 8, 9, 6)
    assert sorted(i for slot in ACTION_LAYOUT for i in slot.targets) == list(range(panda_omron.ACTION_DIM))
    from robocasa_shift.embodiments import panda

    from robocasa_shift.embodiments import fake_planar

    for name, layout in ACTION_LAYOUTS.items():  # each fills one embodiment's action exactly (LIBERO's: 7-D)
        dim = {"libero": panda.ACTION_DIM, "fake-planar": fake_planar.ACTION_DIM}.get(name, panda_omron.ACTION_DIM)
        assert sorted(i for slot in layout for i in slot.targets) == list(range(dim)), name
    # no policy or backend module defines the indices again
    layout_names = {"ACTION_DIM", "ARM_POS", "ARM_ROT", "GRIPPER", "MODE", "HARNESS_ACTION_LAYOUT"}
    # (the fake backend is an embodiment of its own: a 3-D point gripper)
    files = source_files("robocasa_shift.policies") + [f for f in source_files("robocasa_shift.backends")
                                                        if f.name != "fake.py"]
    redefined = [(file.relative_to(PACKAGE_ROOT).as_posix(), target.id)
                 for file in files for node in ast.parse(file.read_text()).body
                 if isinstance(node, (ast.Assign, ast.AnnAssign))
                 for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                 for target in (target.elts if isinstance(target, ast.Tuple) else [target])
                 if isinstance(target, ast.Name) and target.id in layout_names]
    assert redefined == []


def test_the_gr00t_command_line_still_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "robocasa_shift.policies.gr00t", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m robocasa_shift.policies.gr00t" in proc.stdout and "serve" in proc.stdout


def test_an_observation_must_name_its_task():
    with pytest.raises(TypeError, match="task"):
        Observation({}, {}, {}, "lift the red cube", 0)
    assert Observation({}, {}, {}, "lift the red cube", 0, task="Lift").task == "Lift"


def test_the_expert_follows_the_named_task_and_refuses_an_unknown_one():
    from robocasa_shift.policies.scripted.expert import ExpertPolicy

    proprio = {"robot0_eef_pos": np.array([0.0, 0.0, 1.0]), "robot0_base_quat": np.array([0.0, 0.0, 0.0, 1.0]),
               "robot0_eef_quat": np.array([0.0, 0.0, 0.0, 1.0])}
    # a scene with the markers of several tasks: only obs.task decides
    privileged = {"cube_pos": np.array([0.1, 0.0, 0.9]), "nut_pos": np.array([-0.5, 0.5, 0.9]),
                  "table_z": np.array([0.8])}
    expert = ExpertPolicy()
    action = expert.act(Observation({}, {}, proprio, "", 0, privileged, task="Lift"))
    assert action.shape == (1, panda_omron.ACTION_DIM)
    assert action[0, panda_omron.ARM_POS][0] > 0  # toward the cube, not the nut
    with pytest.raises(ValueError, match="no plan for task 'OpenDrawer'.*Lift, .*NutAssemblySquare"):
        ExpertPolicy().act(Observation({}, {}, proprio, "lift the red cube", 0, privileged, task="OpenDrawer"))
