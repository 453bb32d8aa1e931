"""The package's shape: no import cycles, documented contracts, layers that import without a simulator."""

import ast
import re
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from robocasa_shift.core import specs
from robocasa_shift.core.backend import (
    Cameras,
    Lights,
    MobileBase,
    check_hooks,
    missing_hooks,
)
from robocasa_shift.core.factors import required_hooks
from robocasa_shift.errors import BackendUnavailable

PACKAGE = Path(__file__).resolve().parent.parent / "robocasa_shift"
CONTRACT_MODULES = (
    "robocasa_shift.core.backend",
    "robocasa_shift.core.policy",
    "robocasa_shift.errors",
    "robocasa_shift.registry",
    "robocasa_shift.core.factors",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph():
    """Module -> the package's modules it imports anywhere in its body (function bodies included)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges |= {t for t in targets if t in modules and t != name and t != "robocasa_shift"}
        graph[name] = edges
    return graph


def cycles(graph):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle_even_through_imports_inside_functions():
    graph = import_graph()
    assert "robocasa_shift.engine.rollout" in graph and graph["robocasa_shift.engine.rollout"]
    assert cycles(graph) == []


# The floors of the package, lowest first. A module may import the modules of lower floors and of its own
# package, never a higher floor nor another package of its own floor (``backends`` and ``policies`` know
# nothing of each other; ``analysis`` is pure: no simulator, no policy, no executor). The foundation's
# modules are floors of their own, in this order.
LAYERS = (
    ("errors",),
    ("geometry", "seeding", "arrays", "registry", "extras"),
    ("config", "embodiments"),
    ("core",),
    ("rundir",),
    ("analysis", "backends", "policies"),
    ("engine",),
    ("study",),
    ("branching", "gym", "sweep"),
    ("checks", "monitoring", "judging", "training", "importing"),
    ("report",),
    ("bench",),
    ("cli",),
    ("__main__",),
)


def floor_of(module: str):
    """(floor, package) of a module of the package; the package facade ``robocasa_shift`` has none."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for floor, packages in enumerate(LAYERS):
        if parts[1] in packages:
            return floor, parts[1]
    raise AssertionError(f"{module} is on no floor of LAYERS: place it there")


def upward_imports(graph):
    """Imports that run up a floor or sideways into another package of the same floor."""
    out = []
    for module, targets in sorted(graph.items()):
        here = floor_of(module)
        for target in sorted(targets):
            there = floor_of(target)
            if here is None or there is None:
                continue
            if there[0] > here[0] or (there[0] == here[0] and there[1] != here[1]):
                out.append(f"{module} -> {target}")
    return out


def test_every_import_points_down_the_floors_or_stays_in_its_package():
    assert upward_imports(import_graph()) == []


def test_the_floor_check_catches_an_import_up_and_one_sideways():
    graph = {"robocasa_shift.core.specs": {"robocasa_shift.engine.rollout"},
             "robocasa_shift.analysis.measures": {"robocasa_shift.backends.fake", "robocasa_shift.core.records"},
             "robocasa_shift.engine.rollout": {"robocasa_shift.core.specs", "robocasa_shift.engine.step_logger"},
             "robocasa_shift.engine.step_logger": set(), "robocasa_shift.backends.fake": set(),
             "robocasa_shift.core.records": set()}
    assert upward_imports(graph) == ["robocasa_shift.analysis.measures -> robocasa_shift.backends.fake",
                                     "robocasa_shift.core.specs -> robocasa_shift.engine.rollout"]


# Packages above ``backends`` that still see an environment only through the Env contract (core/backend.py): a
# simulator detail they need is a method or a declared capability of every backend, never a backend's module.
CONTRACT_ONLY = {"branching": ("backends",), "judging": ("backends",), "monitoring": ("backends",)}


def contract_breaches(graph):
    """Imports from a package of :data:`CONTRACT_ONLY` into a package it must not see."""
    out = []
    for module, targets in sorted(graph.items()):
        banned = CONTRACT_ONLY.get(module.split(".")[1] if module.count(".") else "", ())
        out += [f"{module} -> {t}" for t in sorted(targets) if t.count(".") and t.split(".")[1] in banned]
    return out


def test_branching_judging_and_monitoring_never_import_a_backend():
    assert contract_breaches(import_graph()) == []


def test_the_contract_check_catches_a_judge_reading_a_backend_module():
    graph = {"robocasa_shift.judging.crops": {"robocasa_shift.backends.fake", "robocasa_shift.core.backend"},
             "robocasa_shift.checks.backend_check": {"robocasa_shift.backends"}}
    assert contract_breaches(graph) == ["robocasa_shift.judging.crops -> robocasa_shift.backends.fake"]


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function_body():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_every_public_function_and_class_of_the_contract_modules_has_a_docstring():
    missing = []
    for name in CONTRACT_MODULES:
        module = importlib.import_module(name)
        for attr, obj in vars(module).items():
            if attr.startswith("_") or getattr(obj, "__module__", None) != name:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                if not inspect.getdoc(obj):
                    missing.append(f"{name}.{attr}")
                if inspect.isclass(obj):
                    for meth, fn in vars(obj).items():  # an override may inherit its contract's docstring
                        if not meth.startswith("_") and inspect.isfunction(fn) and not inspect.getdoc(getattr(obj, meth)):
                            missing.append(f"{name}.{attr}.{meth}")
    assert missing == []


def test_measures_compare_export_and_the_report_page_import_without_a_simulator_or_torch():
    code = (
        "import sys\n"
        "import robocasa_shift.analysis.measures, robocasa_shift.analysis.compare\n"
        "import robocasa_shift.analysis.export, robocasa_shift.report.page, robocasa_shift.checks.audit\n"
        "heavy = sorted(m for m in ('mujoco', 'robosuite', 'torch', 'matplotlib', 'cv2') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


class NoLights:
    """An environment with cameras and a base but no light hook."""

    third_person_cameras = ("cam",)

    def nominal_camera_quat(self, camera): ...
    def camera_quat(self, camera): ...
    def camera_vertical(self, camera): ...
    def set_camera_quat(self, camera, quat): ...
    def base_offset(self): ...
    def set_base_offset(self, offset): ...
    def base_offset_problem(self, offset): ...


def test_every_factor_kind_of_the_protocol_declares_the_hooks_it_requires():
    needs = required_hooks(specs.load_protocol())
    assert needs == {"illumination": ("lights",), "camera": ("cameras",), "base": ("base",), "blur": ()}


def test_an_environment_without_a_hook_a_factor_requires_is_refused_naming_factor_and_hook():
    env = NoLights()
    assert isinstance(env, Cameras) and isinstance(env, MobileBase) and not isinstance(env, Lights)
    assert missing_hooks(env, ("lights", "cameras", "base")) == ["lights"]
    with pytest.raises(BackendUnavailable, match="cannot run factor 'illumination'.*'lights' hook.*set_lights"):
        check_hooks(env, required_hooks(specs.load_protocol()), "toy")
    check_hooks(env, {"camera": ("cameras",), "base": ("base",), "blur": ()}, "toy")  # what it has is enough


class FakeEnvWithoutLights:
    """The fake backend's environment with its light hook taken away (delegates everything else)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        if name in ("nominal_lights", "lights", "set_lights"):
            raise AttributeError(name)
        return getattr(self._env, name)


def test_a_run_on_a_backend_whose_env_lacks_a_required_hook_is_refused_before_any_record(tmp_path, monkeypatch):
    from robocasa_shift import run_study
    from robocasa_shift.backends.fake import FakeBackend
    from robocasa_shift.config import ExecutionConfig, StudyConfig

    make = FakeBackend.make
    monkeypatch.setattr(FakeBackend, "make", lambda self, *a, **kw: FakeEnvWithoutLights(make(self, *a, **kw)))
    with pytest.raises(BackendUnavailable, match="backend 'fake' cannot run factor 'illumination'"):
        run_study(tmp_path / "run", ["Reach"], ["clean"], [0], study=StudyConfig(backend="fake", policy="fake"),
                  execution=ExecutionConfig(workers=1, progress=False))
    assert not list((tmp_path / "run").rglob("records/*/*/*.json"))


ARCHITECTURE_PAGE = PACKAGE.parent / "docs" / "architecture.md"


def documented_modules(page: str):
    """The modules named in the Packages block of docs/architecture.md, as paths relative to the package.

    The block's conventions: a top-level entry starts two spaces in (``errors.py``, ``core/``); a package's
    modules are named ``name.py`` in its entry; a subpackage is ``sub/ (a, b.py, c: what it is, ...)``, each
    comma-separated item of its parentheses starting with a module's name (``.py`` optional).
    """
    block = page.split("## Packages", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    out = set()
    for entry in re.split(r"\n(?=  \S)", block):
        head = entry.strip().split()[0] if entry.strip() else ""
        if head.endswith(".py"):
            out.add(head)
            continue
        if not head.endswith("/") or head == "robocasa_shift/":
            continue
        body, rest = entry.strip()[len(head):], ""
        while True:  # take the subpackages' parentheses out, leave the package's own text
            m = re.search(r"(\w+)/\s*\(", body)
            if not m:
                break
            depth, end = 0, m.end() - 1
            for end in range(m.end() - 1, len(body)):
                depth += {"(": 1, ")": -1}.get(body[end], 0)
                if depth == 0:
                    break
            for item in body[m.end():end].split(","):
                name = re.match(r"\s*(\w+)(?:\.py)?\b", item)
                if name:
                    out.add(f"{head}{m.group(1)}/{name.group(1)}.py")
            rest += body[: m.start()] + " "
            body = body[end + 1:]
        out |= {f"{head}{name}" for name in re.findall(r"\b(\w+\.py)\b", rest + body) if name != "__init__.py"}
    return out


def package_modules():
    """Every module of the package (``__init__.py`` files aside), relative to it: read from the package itself, so
    a module added anywhere must be placed on the page."""
    return {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}


def test_architecture_md_lists_every_module_of_the_package_and_no_other():
    documented, actual = documented_modules(ARCHITECTURE_PAGE.read_text()), package_modules()
    assert sorted(actual - documented) == [], "modules missing from docs/architecture.md's Packages block"
    assert sorted(documented - actual) == [], "docs/architecture.md names modules that do not exist"


def test_the_module_list_reader_finds_packages_subpackages_and_a_missing_module():
    page = ("## Packages\n\n```text\nrobocasa_shift/\n  errors.py        the tree\n  core/            specs.py and\n"
            "                   factors.py (kinds); served/ (codec.py bounded, transport, policy: its base)\n```\n")
    assert documented_modules(page) == {"errors.py", "core/specs.py", "core/factors.py", "core/served/codec.py",
                                        "core/served/transport.py", "core/served/policy.py"}


def test_no_module_of_analysis_draws_a_figure_or_imports_a_plotting_library():
    drawing = []
    for path in (PACKAGE / "analysis").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            drawing += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("matplotlib", "cv2", "PIL")]
            if isinstance(node, ast.Attribute) and node.attr in ("save_figure", "savefig"):
                drawing.append(f"{path.name}: {node.attr}")
            if isinstance(node, ast.alias) and node.name in ("save_figure",):
                drawing.append(f"{path.name}: imports {node.name}")
    assert drawing == []


# Figures are the report's: the packages below it compute tables and numbers and hand them over (the branching,
# monitor and judge studies pass a figure writer of ``report/`` down). ``rundir/files.py`` only writes the bytes.
DRAWING_PACKAGES = ("report",)


def drawing_outside_the_report():
    """Modules outside :data:`DRAWING_PACKAGES` that import matplotlib or save a figure, anywhere in their body."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        if module.split(".")[1:2] and module.split(".")[1] in DRAWING_PACKAGES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            out += [f"{module}: imports {n}" for n in names if n.split(".")[0] == "matplotlib"]
            called = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
            if called == "save_figure":
                out.append(f"{module}: calls save_figure")
    return sorted(set(out))


def test_only_the_report_imports_matplotlib_or_saves_a_figure():
    assert drawing_outside_the_report() == []
