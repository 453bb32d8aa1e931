"""Frozen, content-hashed data: the study protocol, perturbation levels and stage specs.

The numbers of the benchmark live in YAML files, never in function bodies.
A content hash is the SHA-256 of the canonical JSON of the parsed content
(sorted keys, no whitespace), so comments and formatting do not change it.
``perturbations/spec.lock`` holds the hash of every frozen version of every
perturbation file; a file whose content no longer matches the hash locked for
its version is refused, with both hashes, until its version is bumped and
frozen (``robocasa-shift freeze``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

from robocasa_shift.core.conditions import CLEAN, Condition
from robocasa_shift.core.factors import FACTOR_KINDS
from robocasa_shift.errors import FrozenSpecError, SpecError, UnknownNameError

PACKAGE_DIR = Path(__file__).resolve().parent.parent
# Entry-point group through which an installed package adds a folder of its own stage specs and pools.
DATA_ENTRY_POINTS = "robocasa_shift.data"


def builtin_data_dir(folder: str) -> Path:
    """The project's own copy of a frozen-data folder (``perturbations``, ``stage_specs``, ``pools``, ``interventions``).

    An installed wheel ships it inside the package (``robocasa_shift/data/<folder>``, copied there when
    the wheel is built); a checkout (an editable install included) reads the repository's top-level folder.
    """
    shipped = PACKAGE_DIR / "data" / folder
    return shipped if shipped.is_dir() else PACKAGE_DIR.parent / folder


PERTURBATIONS_DIR = Path(os.environ.get("ROBOCASA_SHIFT_PERTURBATIONS", builtin_data_dir("perturbations")))
STAGE_SPECS_DIR = Path(os.environ.get("ROBOCASA_SHIFT_STAGE_SPECS", builtin_data_dir("stage_specs")))
POOLS_DIR = Path(os.environ.get("ROBOCASA_SHIFT_POOLS", builtin_data_dir("pools")))
INTERVENTIONS_DIR = Path(os.environ.get("ROBOCASA_SHIFT_INTERVENTIONS", builtin_data_dir("interventions")))


def plugin_data_dirs() -> List[Path]:
    """The data folders installed packages add (entry-point group ``robocasa_shift.data``), by entry name.

    Each entry names a directory, or a module whose directory is meant, holding ``stage_specs/<backend>/``
    and/or ``pools/<backend>.yaml`` for the backends that package registers, e.g. in its setup.cfg::

        [options.entry_points]
        robocasa_shift.data =
            my_backend = my_pkg.data
    """
    from importlib.metadata import entry_points

    out = []
    for entry in sorted(entry_points(group=DATA_ENTRY_POINTS), key=lambda e: e.name):
        target = entry.load()
        path = Path(target.__file__).parent if hasattr(target, "__file__") else Path(target)
        out.append(path)
    return out


def data_search_path(folder: str) -> List[Path]:
    """Where stage specs (``folder="stage_specs"``) or pools (``"pools"``) are looked for, first match first:
    the project's folder (or its ``ROBOCASA_SHIFT_*`` override), then each plug-in's ``<dir>/<folder>``."""
    own = {"stage_specs": STAGE_SPECS_DIR, "pools": POOLS_DIR}[folder]
    return [own, *(d / folder for d in plugin_data_dirs())]
LOCK_NAME = "spec.lock"


def canonical_hash(content: Any) -> str:
    """SHA-256 of the canonical JSON of parsed content (sorted keys, no whitespace)."""
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _non_finite(content: Any, where: str = "") -> Optional[str]:
    """The dotted path of the first NaN or infinite number in parsed content, or None.

    Content hashes are canonical JSON, which has no NaN: such a value must be refused by name,
    not crash the hash.
    """
    if isinstance(content, float) and not math.isfinite(content):
        return where or "(document)"
    items = content.items() if isinstance(content, dict) else enumerate(content) if isinstance(content, list) else ()
    for k, v in items:
        found = _non_finite(v, f"{where}[{k}]" if isinstance(k, int) else f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


def _read_yaml(path: Path) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            content = yaml.safe_load(f)
    except yaml.YAMLError as exc:
        raise SpecError(path, "(document)", f"not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecError(path, "(document)", f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(content, dict):
        raise SpecError(path, "(document)", "expected a mapping at the top level")
    bad = _non_finite(content)
    if bad:
        raise SpecError(path, bad, "must be a finite number (NaN and infinity have no canonical hash)")
    return content


def _require(content: Mapping, path: Path, name: str, kind: type | Tuple[type, ...], prefix: str = "") -> Any:
    label = f"{prefix}{name}"
    if name not in content:
        raise SpecError(path, label, "missing")
    value = content[name]
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise SpecError(path, label, f"expected {'a number' if kind is float else want}, got {value!r}")
    return value


# --------------------------------------------------------------------------- perturbations


@dataclass(frozen=True)
class FactorSpec:
    """One perturbation factor: its code kind, its random draw and its frozen levels."""

    factor: str
    version: int
    kind: str
    description: str
    draw: str
    levels: Mapping[str, Mapping[str, float]]
    options: Mapping[str, Any]
    path: str
    content_hash: str

    @property
    def data(self) -> Optional[Dict[str, Any]]:
        """The frozen data file ``options.data`` names (e.g. LIBERO-Plus's arm poses), parsed on first use; None when
        the spec names none. Its bytes were checked against the sha256 there when the spec was loaded."""
        entry = self.options.get("data")
        if not isinstance(entry, dict):
            return None
        return _parsed_data(str((Path(self.path).parent / entry["file"]).resolve()), entry["sha256"])

    def level(self, name: str) -> Dict[str, float]:
        if name not in self.levels:
            raise UnknownNameError(f"level of factor '{self.factor}'", name, list(self.levels))
        return dict(self.levels[name])


@dataclass(frozen=True)
class Protocol:
    """The frozen study: seed, factors and levels. ``spec_hash`` identifies it.

    ``factors`` holds every factor; the ``optional_factors`` among them are outside the
    matrix (``conditions``, what ``--condition all`` means) and run only when named, on the
    backends that can apply them (LIBERO-PRO's instruction paraphrases, for one).
    """

    version: int
    study_seed: int
    level_names: Tuple[str, ...]
    factors: Mapping[str, FactorSpec]
    file_hashes: Mapping[str, str]
    spec_hash: str
    directory: str
    optional_factors: Tuple[str, ...] = ()
    # predeclared combined conditions (``camera_pose:L2+fog:L1``), outside the matrix like the optional factors
    combinations: Tuple[str, ...] = ()

    def factor_conditions(self, factor: str) -> List[str]:
        """``factor:level`` for each level the factor defines, in the frozen level order."""
        spec = self.factor(factor)
        return [f"{factor}:{lv}" for lv in self.level_names if lv in spec.levels]

    @property
    def conditions(self) -> List[str]:
        """The matrix: ``clean`` followed by every ``factor:level`` of the non-optional factors, in the frozen order."""
        return [CLEAN] + [c for f in self.factors if f not in self.optional_factors for c in self.factor_conditions(f)]

    @property
    def known_conditions(self) -> List[str]:
        """The matrix, the optional factors' conditions and the predeclared combinations: every condition a rollout
        may have."""
        return self.optional_conditions_after(self.conditions)

    def optional_conditions_after(self, conditions: List[str]) -> List[str]:
        """``conditions`` followed by the optional factors' conditions and the combinations."""
        return conditions + [c for f in self.optional_factors for c in self.factor_conditions(f)] + list(self.combinations)

    @property
    def optional_conditions(self) -> List[str]:
        """Every condition outside the matrix: the optional factors' levels, then the predeclared combinations."""
        return self.optional_conditions_after([])

    @property
    def factor_order(self) -> Tuple[str, ...]:
        """Every factor in the frozen order (``factors`` of ``study.yaml``, optional ones last): tables and
        figures list conditions in this order."""
        return tuple(self.factors)

    def condition(self, text: str) -> Condition:
        """``text`` read as a condition this protocol knows.

        Raises:
            BadInput: not a condition's syntax.
            UnknownNameError: a condition the protocol does not know; the message lists the known ones.
        """
        return Condition.parse(text).check(self.known_conditions)

    def factor(self, name: str) -> FactorSpec:
        if name not in self.factors:
            raise UnknownNameError("factor", name, list(self.factors))
        return self.factors[name]


def _load_factor(path: Path, level_names: Tuple[str, ...], optional_factors: Sequence[str] = ()) -> FactorSpec:
    """One factor file; a factor of the matrix defines every level, an optional one a leading subset of them."""
    content = _read_yaml(path)
    factor = _require(content, path, "factor", str)
    optional = factor in optional_factors
    version = _require(content, path, "version", int)
    kind = _require(content, path, "kind", str)
    description = _require(content, path, "description", str)
    draw = _require(content, path, "draw", str)
    levels = _require(content, path, "levels", dict)
    options = content.get("options", {}) or {}
    if not isinstance(options, dict):
        raise SpecError(path, "options", f"expected a mapping, got {options!r}")
    if optional:
        wanted = list(level_names[:len(levels)])
        if not levels or sorted(levels) != sorted(wanted):
            raise SpecError(path, "levels", f"an optional factor defines the first of {list(level_names)} "
                            f"(e.g. {wanted or level_names[:1]}), got {list(levels)}")
    elif sorted(levels) != sorted(level_names):
        raise SpecError(path, "levels", f"expected exactly {list(level_names)}, got {list(levels)}")
    level_names = tuple(level_names[:len(levels)])
    try:
        kind_cls = FACTOR_KINDS.get(kind)
    except KeyError as exc:
        raise SpecError(path, "kind", str(exc)) from None
    if draw != kind_cls.draw_kind:
        raise SpecError(path, "draw", f"kind '{kind}' uses draw '{kind_cls.draw_kind}', got {draw!r}")
    parsed_levels: Dict[str, Dict[str, float]] = {}
    for name in level_names:
        params = levels[name]
        if not isinstance(params, dict):
            raise SpecError(path, f"levels.{name}", f"expected a mapping, got {params!r}")
        for param in kind_cls.level_params:
            _require(params, path, param, float, prefix=f"levels.{name}.")
        extra = sorted(set(params) - set(kind_cls.level_params))
        if extra:
            raise SpecError(path, f"levels.{name}.{extra[0]}", f"unknown parameter for kind '{kind}'")
        parsed_levels[name] = {k: float(v) for k, v in params.items()}
    _check_factor_data(path, options)
    return FactorSpec(
        factor=factor,
        version=version,
        kind=kind,
        description=description,
        draw=draw,
        levels=parsed_levels,
        options=options,
        path=str(path),
        content_hash=canonical_hash(content),
    )


def _check_factor_data(path: Path, options: Mapping[str, Any]) -> None:
    """Check the data file a factor spec names in ``options.data`` (``{file, sha256}``: a file below the spec's folder
    and the SHA-256 of its bytes); nothing when it names none. Parsing waits for first use (``FactorSpec.data``).

    Raises:
        SpecError: the entry is malformed, the file is missing or outside the folder, or its bytes differ.
    """
    entry = options.get("data")
    if entry is None:
        return
    if not (isinstance(entry, dict) and isinstance(entry.get("file"), str) and isinstance(entry.get("sha256"), str)):
        raise SpecError(path, "options.data", f"expected {{file: <path>, sha256: <hex>}}, got {entry!r}")
    folder = path.parent.resolve()
    target = (folder / entry["file"]).resolve()
    if folder not in target.parents:
        raise SpecError(path, "options.data.file", f"{entry['file']!r} is not a file below {folder}")
    if not target.is_file():
        raise SpecError(path, "options.data.file", f"{target} not found")
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != entry["sha256"]:
        raise SpecError(path, "options.data.sha256", f"{entry['file']} has sha256 {digest}, the spec names "
                                                     f"{entry['sha256']}: restore the file or bump the spec's version")


@functools.lru_cache(maxsize=16)
def _parsed_data(path: str, sha256: str) -> Dict[str, Any]:
    """A data file's content, parsed once per process (its bytes checked against ``sha256`` again)."""
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SpecError(Path(path), "(document)", f"changed since its spec was loaded (sha256 {sha256} expected)")
    return _load_yaml_text(data.decode("utf-8"), Path(path))


def _load_yaml_text(text: str, path: Path) -> Dict[str, Any]:
    """YAML through libyaml's loader where it is built (data files run to hundreds of kilobytes)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        content = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        raise SpecError(path, "(document)", f"not valid YAML: {exc}") from None
    if not isinstance(content, dict):
        raise SpecError(path, "(document)", "expected a mapping at the top level")
    return content


def load_data_file(relative: str, directory: Path | str | None = None) -> Dict[str, Any]:
    """A frozen data file below the perturbation folder (``liberoplus/paraphrases.yaml``), checked against the hash
    ``spec.lock`` holds for its version (``robocasa-shift freeze`` records data files too).

    Raises:
        SpecError: the file is missing or malformed.
        FrozenSpecError: its content differs from the hash frozen for its version.
    """
    directory = Path(directory or PERTURBATIONS_DIR)
    path = directory / relative
    if not path.is_file():
        raise SpecError(path, "(document)", "file not found (run `robocasa-shift import-liberoplus`)")
    content = _cached_data_file(str(path.resolve()), path.stat().st_mtime_ns, path.stat().st_size)
    version = _require(content, path, "version", int)
    _check_frozen(read_lock(directory), directory, Path(relative).as_posix(), version, canonical_hash(content))
    return content


@functools.lru_cache(maxsize=16)
def _cached_data_file(path: str, mtime_ns: int, size: int) -> Dict[str, Any]:
    return _load_yaml_text(Path(path).read_text(encoding="utf-8"), Path(path))


def data_files(directory: Path | str | None = None) -> List[Path]:
    """The frozen data files below the perturbation folder (one level of subfolders, ``*.yaml``)."""
    return sorted(Path(directory or PERTURBATIONS_DIR).glob("*/*.yaml"))


def read_lock(directory: Path) -> Dict[str, Dict[str, str]]:
    """The lock file's ``{file name: {version: sha256}}`` ({} before anything was frozen).

    Raises:
        FrozenSpecError: the lock file is not that (corrupt, truncated, not UTF-8); the message names it.
    """
    path = Path(directory) / LOCK_NAME
    if not path.exists():
        return {}
    fix = (f"restore it from version control (git checkout -- {path}); regenerating it with `freeze` would "
           f"freeze whatever the spec files say now")
    try:
        lock = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrozenSpecError(f"{path}: the lock file is corrupt ({exc}); {fix}") from None
    if not (isinstance(lock, dict) and all(isinstance(v, dict) and all(isinstance(h, str) for h in v.values())
                                           for v in lock.values())):
        raise FrozenSpecError(f"{path}: the lock file is not a mapping of file -> version -> sha256; {fix}")
    return lock


def _check_frozen(lock: Mapping[str, Mapping[str, str]], directory: Path, name: str, version: int, digest: str) -> None:
    locked = lock.get(name, {}).get(str(version))
    if locked is None:
        raise FrozenSpecError(
            f"{directory / name}: version {version} is not frozen (sha256 {digest}); "
            f"freeze it with `robocasa-shift freeze`"
        )
    if locked != digest:
        raise FrozenSpecError(
            f"{directory / name}: content changed but version {version} is frozen.\n"
            f"  frozen sha256:  {locked}\n  current sha256: {digest}\n"
            f"Restore the frozen numbers, or bump 'version' and run `robocasa-shift freeze`."
        )


def _spec_files(directory: Path) -> Tuple[Path, List[Path]]:
    study_path = directory / "study.yaml"
    if not study_path.exists():
        raise SpecError(study_path, "(document)", "file not found")
    return study_path, sorted(p for p in directory.glob("*.yaml") if p.name != "study.yaml")


def load_protocol(directory: Path | str | None = None, verify: bool = True) -> Protocol:
    """Load and (by default) verify the frozen study protocol.

    Raises:
        SpecError: a file is malformed (the message names the file and field).
        FrozenSpecError: a file's content differs from the hash frozen for its version.
    """
    directory = Path(directory or PERTURBATIONS_DIR)
    study_path, factor_paths = _spec_files(directory)
    study = _read_yaml(study_path)
    version = _require(study, study_path, "version", int)
    study_seed = _require(study, study_path, "study_seed", int)
    level_names = tuple(_require(study, study_path, "levels", list))
    matrix_factors = _require(study, study_path, "factors", list)
    optional = study.get("optional_factors", []) or []
    if not (isinstance(optional, list) and all(isinstance(f, str) for f in optional)):
        raise SpecError(study_path, "optional_factors", f"expected a list of factor names, got {optional!r}")
    both = sorted(set(optional) & set(matrix_factors))
    if both:
        raise SpecError(study_path, "optional_factors", f"{both} also listed in 'factors'")
    factor_order = list(matrix_factors) + list(optional)
    combinations = study.get("combinations", []) or []
    if not (isinstance(combinations, list) and all(isinstance(c, str) for c in combinations)):
        raise SpecError(study_path, "combinations", f"expected a list of conditions, got {combinations!r}")
    file_hashes = {"study.yaml": canonical_hash(study)}

    by_name: Dict[str, FactorSpec] = {}
    for path in factor_paths:
        spec = _load_factor(path, level_names, optional)
        if spec.factor in by_name:
            raise SpecError(path, "factor", f"'{spec.factor}' is also defined in {by_name[spec.factor].path}")
        by_name[spec.factor] = spec
        file_hashes[path.name] = spec.content_hash
    missing = [f for f in factor_order if f not in by_name]
    if missing:
        raise SpecError(study_path, "factors", f"no spec file defines factor(s) {missing}")
    unused = sorted(set(by_name) - set(factor_order))
    if unused:
        raise SpecError(study_path, "factors", f"spec files define factors not listed here: {unused}")

    if verify:
        lock = read_lock(directory)
        _check_frozen(lock, directory, "study.yaml", version, file_hashes["study.yaml"])
        for name in factor_order:
            spec = by_name[name]
            _check_frozen(lock, directory, Path(spec.path).name, spec.version, spec.content_hash)

    protocol = Protocol(
        version=version,
        study_seed=study_seed,
        level_names=level_names,
        factors={name: by_name[name] for name in factor_order},
        file_hashes=file_hashes,
        spec_hash=canonical_hash(file_hashes),
        directory=str(directory),
        optional_factors=tuple(optional),
    )
    checked = tuple(_check_combination(protocol, study_path, i, text) for i, text in enumerate(combinations))
    if len(set(checked)) != len(checked):
        raise SpecError(study_path, "combinations", f"a combination is listed twice: {list(checked)}")
    return replace(protocol, combinations=checked)


def _check_combination(protocol: Protocol, path: Path, index: int, text: str) -> str:
    """A predeclared combination, checked: two known single-factor conditions of different factors, written in
    the protocol's factor order, whose kinds can act together (not two that edit the same simulator values, two
    instructions or two edits of one loop setting).

    Raises:
        SpecError: naming the entry and why.
    """
    from robocasa_shift.errors import BadInput

    where = f"combinations[{index}]"
    try:
        condition = Condition.parse(text)
    except BadInput as exc:
        raise SpecError(path, where, str(exc)) from None
    if len(condition.shifts) != 2:
        raise SpecError(path, where, f"{text!r}: a combination joins exactly two factors (A+B), so that its "
                                     "interaction dSR(A+B) - dSR(A) - dSR(B) is defined")
    singles = protocol.conditions + [c for f in protocol.optional_factors for c in protocol.factor_conditions(f)]
    for shift in condition.shifts:
        if str(shift) not in singles:
            raise SpecError(path, where, f"{shift} is not a condition of this protocol (a combination joins the "
                                         "single-factor conditions it is compared with)")
    order = list(protocol.factor_order)
    if [order.index(f) for f in condition.factors] != sorted(order.index(f) for f in condition.factors):
        raise SpecError(path, where, f"{text!r}: write its factors in the protocol's order "
                                     f"({'+'.join(sorted(condition.factors, key=order.index))})")
    kinds = [FACTOR_KINDS.get(protocol.factor(f).kind) for f in condition.factors]
    # hooks each kind edits through, and those whose values it edits too (camera_pose and camera both turn a camera)
    touched = [set(k.requires) | set(getattr(k, "conflicts", ())) for k in kinds]
    shared = touched[0] & touched[1]
    if shared:
        raise SpecError(path, where, f"{text!r}: both factors edit what the {sorted(shared)} hook holds")
    if kinds[0].side == kinds[1].side == "instruction" or (kinds[0] is kinds[1]):
        raise SpecError(path, where, f"{text!r}: both factors change the same thing")
    return str(condition)


def freeze(directory: Path | str | None = None) -> List[str]:
    """Record the hash of every spec version not yet frozen; never rewrite a frozen one.

    Returns the lines describing what was frozen.
    """
    directory = Path(directory or PERTURBATIONS_DIR)
    load_protocol(directory, verify=False)  # refuse malformed files before freezing them
    study_path, factor_paths = _spec_files(directory)
    return _freeze_files(directory, [study_path, *factor_paths, *data_files(directory)])


def freeze_interventions(directory: Path | str | None = None) -> List[str]:
    """:func:`freeze` for the intervention specs (``interventions/*.yaml``)."""
    directory = Path(directory or INTERVENTIONS_DIR)
    paths = sorted(directory.glob("*.yaml"))
    for path in paths:  # refuse malformed files before freezing them
        load_intervention_spec(path.stem, directory, verify=False)
    return _freeze_files(directory, paths)


def _freeze_files(directory: Path, paths: Sequence[Path]) -> List[str]:
    """Add each file's version and hash to the directory's lock; a frozen version whose content changed is refused."""
    lock = read_lock(directory)
    frozen = []
    for path in paths:
        content = _read_yaml(path)
        name = path.relative_to(directory).as_posix()  # a data file below the folder: its relative path
        if "version" not in content:
            raise SpecError(path, "version", "missing")
        version, digest = str(content["version"]), canonical_hash(content)
        entry = lock.setdefault(name, {})
        if version in entry:
            if entry[version] != digest:
                _check_frozen(lock, directory, name, int(version), digest)
            continue
        entry[version] = digest
        frozen.append(f"{name} version {version}: {digest}")
    _write_lock(directory, lock)
    return frozen


def _write_lock(directory: Path, lock: Mapping[str, Mapping[str, str]]) -> None:
    tmp = directory / (LOCK_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(lock, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, directory / LOCK_NAME)


# --------------------------------------------------------------------------- stage specs


@dataclass(frozen=True)
class Subgoal:
    id: str
    description: str
    predicate: str
    args: Mapping[str, Any] = field(default_factory=dict)
    group: Optional[str] = None  # unordered specs: the group (a chain of subgoals) this one belongs to


POINT_ARGS = ("object", "target", "support")  # subgoal arguments that name a task point


@dataclass(frozen=True)
class StageSpec:
    """Subgoals of one task, each a named simulator-state predicate.

    Ordered (no subgoal names a ``group``): each latches only after the one before it. Unordered
    (every subgoal names one): the groups are chains of consecutive subgoals, latched independently
    of each other (a BDDL goal's conjuncts have no order); within a chain a subgoal that holds
    latches its unlatched predecessors with it (a placement implies its grasp). The file's order is
    the canonical order the first incomplete subgoal is read in.
    """

    task: str
    backend: str
    version: int
    description: str
    subgoals: Tuple[Subgoal, ...]
    path: str
    content_hash: str

    @property
    def names(self) -> List[str]:
        return [g.id for g in self.subgoals]

    @property
    def unordered(self) -> bool:
        return self.subgoals[0].group is not None

    def point_names(self) -> List[str]:
        """The task points its subgoals name (``object``, ``target``, ``support`` arguments), first seen first: what
        settles an attempt (the judge crops' ``ObjectPoints.outcome_points``)."""
        names: List[str] = []
        for goal in self.subgoals:
            for arg in POINT_ARGS:
                value = dict(goal.args).get(arg)
                if isinstance(value, str) and value not in names:
                    names.append(value)
        return names

    def chains(self) -> List[List[int]]:
        """Subgoal indices per chain: one chain of all of them when ordered, one per group otherwise."""
        if not self.unordered:
            return [list(range(len(self.subgoals)))]
        chains: List[List[int]] = []
        for i, goal in enumerate(self.subgoals):
            if i and goal.group == self.subgoals[i - 1].group:
                chains[-1].append(i)
            else:
                chains.append([i])
        return chains


def find_data_file(folder: str, relative: str, what: str, directory: Path | str | None = None) -> Path:
    """The first ``<dir>/<relative>`` on :func:`data_search_path` (only ``directory`` when given); ``what``
    names the file in the error.

    Raises:
        SpecError: no such file anywhere on the path; the message lists the places searched and what
            they hold beside it.
    """
    places = [Path(directory)] if directory else data_search_path(folder)
    for place in places:
        if (place / relative).is_file():
            return place / relative
    wanted = Path(relative)
    available = sorted({p.stem for place in places for p in (place / wanted.parent).glob("*.yaml")})
    raise SpecError(places[0] / relative, "(document)",
                    f"no {what}; available: {available} (searched {', '.join(str(p) for p in places)})")


def load_stage_spec(backend: str, task: str, directory: Path | str | None = None) -> StageSpec:
    """The stage spec of ``task`` on ``backend``: ``stage_specs/<backend>/<task>.yaml`` on the data search path
    (only under ``directory`` when given), checked field by field and against its predicates' registry."""
    path = find_data_file("stage_specs", f"{backend}/{task}.yaml", f"stage spec for task '{task}'", directory)
    content = _read_yaml(path)
    spec_task = _require(content, path, "task", str)
    if spec_task != task:
        raise SpecError(path, "task", f"expected '{task}' (the file name), got {spec_task!r}")
    spec_backend = _require(content, path, "backend", str)
    if spec_backend != backend:
        raise SpecError(path, "backend", f"expected '{backend}' (the folder name), got {spec_backend!r}")
    raw = _require(content, path, "subgoals", list)
    if not raw:
        raise SpecError(path, "subgoals", "needs at least one subgoal")
    subgoals = []
    for i, item in enumerate(raw):
        prefix = f"subgoals[{i}]."
        if not isinstance(item, dict):
            raise SpecError(path, f"subgoals[{i}]", f"expected a mapping, got {item!r}")
        args = item.get("args", {}) or {}
        if not isinstance(args, dict):
            raise SpecError(path, prefix + "args", f"expected a mapping, got {args!r}")
        group = item.get("group")
        if group is not None and not isinstance(group, str):
            raise SpecError(path, prefix + "group", f"expected a string, got {group!r}")
        subgoals.append(
            Subgoal(
                id=_require(item, path, "id", str, prefix),
                description=_require(item, path, "description", str, prefix),
                predicate=_require(item, path, "predicate", str, prefix),
                args=args,
                group=group,
            )
        )
    ids = [g.id for g in subgoals]
    if len(set(ids)) != len(ids):
        raise SpecError(path, "subgoals", f"subgoal ids must be unique, got {ids}")
    grouped = [g.group is not None for g in subgoals]
    if any(grouped) and not all(grouped):
        first = grouped.index(False) if grouped[0] else grouped.index(True)
        raise SpecError(path, f"subgoals[{first}].group", "either every subgoal names a group (unordered groups) or none")
    runs = [g.group for i, g in enumerate(subgoals) if g.group is not None and (i == 0 or subgoals[i - 1].group != g.group)]
    if len(set(runs)) != len(runs):
        raise SpecError(path, "subgoals", f"a group's subgoals must be consecutive; groups in order: {runs}")
    return StageSpec(
        task=task,
        backend=backend,
        version=_require(content, path, "version", int),
        description=_require(content, path, "description", str),
        subgoals=tuple(subgoals),
        path=str(path),
        content_hash=canonical_hash(content),
    )


# --------------------------------------------------------------------------- intervention specs

GRIPPER_COMMANDS = ("hold", "open", "close")
PHASE_CONDITIONS = ("always", "closing")


@dataclass(frozen=True)
class ManoeuvrePhase:
    """One phase of a scripted manoeuvre: ``steps`` control steps of one arm velocity and gripper command.

    ``gripper`` is ``hold`` (the trunk's command before the checkpoint), ``open`` or ``close``;
    ``when`` is ``always`` or ``closing`` (only when the trunk's command before the checkpoint closed).
    """

    name: str
    steps: int
    arm_velocity: Tuple[float, ...]
    gripper: str
    when: str = "always"


@dataclass(frozen=True)
class InterventionSpec:
    """The frozen magnitudes of a scripted intervention (``interventions/<name>.yaml``)."""

    name: str
    version: int
    description: str
    phases: Tuple[ManoeuvrePhase, ...]
    path: str
    content_hash: str


def load_intervention_spec(name: str, directory: Path | str | None = None, verify: bool = True) -> InterventionSpec:
    """Load (and by default verify against ``interventions/spec.lock``) the spec of intervention ``name``.

    Raises:
        SpecError: the file is missing or malformed (the message names the file and field).
        FrozenSpecError: its content differs from the hash frozen for its version.
    """
    directory = Path(directory or INTERVENTIONS_DIR)
    path = directory / f"{name}.yaml"
    if not path.exists():
        available = sorted(p.stem for p in directory.glob("*.yaml"))
        raise SpecError(path, "(document)", f"no intervention spec '{name}'; available: {available}")
    content = _read_yaml(path)
    version = _require(content, path, "version", int)
    if _require(content, path, "name", str) != name:
        raise SpecError(path, "name", f"expected '{name}' (the file name), got {content['name']!r}")
    phases = []
    for i, item in enumerate(_require(content, path, "phases", list)):
        prefix = f"phases[{i}]."
        if not isinstance(item, dict):
            raise SpecError(path, f"phases[{i}]", f"expected a mapping, got {item!r}")
        velocity = _require(item, path, "arm_velocity", list, prefix)
        if len(velocity) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in velocity):
            raise SpecError(path, prefix + "arm_velocity", f"expected three numbers (x, y, z), got {velocity!r}")
        steps = _require(item, path, "steps", int, prefix)
        if steps < 0:
            raise SpecError(path, prefix + "steps", f"must be >= 0, got {steps}")
        gripper = _require(item, path, "gripper", str, prefix)
        if gripper not in GRIPPER_COMMANDS:
            raise SpecError(path, prefix + "gripper", f"expected one of {list(GRIPPER_COMMANDS)}, got {gripper!r}")
        when = item.get("when", "always")
        if when not in PHASE_CONDITIONS:
            raise SpecError(path, prefix + "when", f"expected one of {list(PHASE_CONDITIONS)}, got {when!r}")
        phases.append(ManoeuvrePhase(_require(item, path, "name", str, prefix), steps,
                                     tuple(float(v) for v in velocity), gripper, when))
    spec = InterventionSpec(name, version, _require(content, path, "description", str), tuple(phases), str(path),
                            canonical_hash(content))
    if verify:
        _check_frozen(read_lock(directory), directory, path.name, version, spec.content_hash)
    return spec
