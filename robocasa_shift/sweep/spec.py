"""A sweep's derived protocol: one factor at G grid severities on its frozen direction.

Severity is a dial on the frozen factor: 0 is nominal (the clean twin), 1, 2, 3 are the frozen L1, L2, L3,
and every severity in between interpolates each level parameter linearly between its two neighbours. The
factor's random draw (a camera's direction, a base offset's normal triple) derives from the study seed, the
factor, task, phase and episode only, so every grid level of a base episode shares it exactly as L1-L3 do.

The derived spec is written into the run directory (``sweep/spec/``) with its own lock, and loaded like the
frozen one (:func:`~robocasa_shift.core.specs.load_protocol`): the records, the manifest and the audit read it
as they read the frozen protocol. ``sweep/spec/derived.json`` names the frozen spec's hash it came from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import yaml

from robocasa_shift.core import specs
from robocasa_shift.errors import BadInput, SpecError, UnknownNameError
from robocasa_shift.rundir.files import MAX_JSON_BYTES, read_text

SPEC_DIR = "sweep/spec"
MAX_SPEC_BYTES = 2**20  # largest file of a derived spec the audit reads back from a run directory
MAX_GRID = 64  # most levels a derived spec holds: a dense grid past this is a typo, not a sweep

# The parameters at severity 0 (nothing changed), per factor kind: the kinds a sweep can dial continuously
# (a paraphrase or a data file's entry has nothing between two levels; a latency counts whole steps). Options the spec freezes per level (a blur's expected sharpness range) are interpolated by
# ``_level_options``; ``nominal_options`` is their value at severity 0.
NOMINAL: Dict[str, Dict[str, Any]] = {
    "light_scale": {"params": {"alpha": 1.0}},
    "camera_rotation": {"params": {"theta_max_deg": 0.0}},
    "base_offset": {"params": {"sigma_xy_m": 0.0, "sigma_psi_deg": 0.0}},
    # an unblurred image's sharpness ratio reads 1.0
    "gaussian_blur": {"params": {"sigma_px": 0.0}, "nominal_options": {"sharpness_ratio_range": [1.0, 1.0]}},
}


def check_severities(spec: specs.FactorSpec, severities: Sequence[float]) -> List[float]:
    """``severities`` sorted, each checked: finite, inside the frozen range, distinct, at most :data:`MAX_GRID`.

    Raises:
        BadInput: naming the offending severity and the allowed range.
    """
    if spec.kind not in NOMINAL:
        raise BadInput(f"factor '{spec.factor}' (kind {spec.kind}) has no declared continuous severity; sweepable "
                       f"kinds: {', '.join(NOMINAL)}")
    low, high = 0.0, float(len(spec.levels))
    out = sorted(float(s) for s in severities)
    if not out:
        raise BadInput("a sweep needs at least one severity")
    if len(out) > MAX_GRID:
        raise BadInput(f"{len(out)} severities, more than {MAX_GRID}; use bisection (--resolution) instead")
    for s in out:
        if not low < s <= high:
            raise BadInput(f"severity {s:g} of factor '{spec.factor}' is outside ({low:g}, {high:g}] "
                           f"(0 nominal, 1-{high:g} its frozen levels)")
    if len(set(out)) != len(out):
        raise BadInput(f"severity listed twice in {out}")
    return out


def _anchors(spec: specs.FactorSpec) -> List[tuple]:
    """(severity, params) pairs: the nominal (when known) and the frozen levels."""
    points = [(0.0, NOMINAL[spec.kind]["params"])]
    names = sorted(spec.levels, key=lambda n: int(n[1:]))
    return points + [(float(i + 1), spec.level(n)) for i, n in enumerate(names)]


def severity_params(spec: specs.FactorSpec, severity: float) -> Dict[str, float]:
    """Every level parameter of ``spec`` at ``severity``, linear between the two neighbouring anchors."""
    points = _anchors(spec)
    for (s0, p0), (s1, p1) in zip(points, points[1:]):
        if s0 <= severity <= s1:
            t = (severity - s0) / (s1 - s0)
            return {k: float(p0[k] + t * (p1[k] - p0[k])) for k in p1}
    raise BadInput(f"severity {severity:g} is outside factor '{spec.factor}''s range")


def _level_options(spec: specs.FactorSpec, severity: float) -> Dict[str, Any]:
    """The spec's options at ``severity``: an option frozen per level as a [low, high] range becomes the envelope of
    the ranges of the two neighbouring anchors (a severity between L1 and L2 may read anything L1 or L2 may)."""
    options = json.loads(json.dumps(dict(spec.options)))
    names = sorted(spec.levels, key=lambda n: int(n[1:]))
    nominal = NOMINAL.get(spec.kind, {}).get("nominal_options", {})
    for name, value in spec.options.items():
        if not (isinstance(value, dict) and set(value) == set(names)):
            continue
        ranges = [(0.0, nominal.get(name))] + [(float(i + 1), value[n]) for i, n in enumerate(names)]
        lower = max((r for r in ranges if r[0] <= severity and r[1] is not None), key=lambda r: r[0])
        upper = min((r for r in ranges if r[0] >= severity and r[1] is not None), key=lambda r: r[0])
        if upper[0] == severity:
            lower = upper
        bounds = [lower[1], upper[1]]
        options[name] = {"L1": [float(min(b[0] for b in bounds)), float(max(b[1] for b in bounds))]}
    return options


def derived_content(protocol: specs.Protocol, factor: str, severities: Sequence[float]) -> Dict[str, Dict[str, Any]]:
    """The derived spec's files (``study.yaml``, ``<factor>.yaml``) as parsed content: level ``Lk`` is the k-th
    smallest severity."""
    spec = protocol.factor(factor)
    grid = check_severities(spec, severities)
    levels = [f"L{i + 1}" for i in range(len(grid))]
    per_level = [_level_options(spec, s) for s in grid]
    options = dict(per_level[0]) if per_level else {}
    for name, value in options.items():  # per-level options, gathered under the derived level names
        if isinstance(value, dict) and set(value) == {"L1"}:
            options[name] = {lv: opts[name]["L1"] for lv, opts in zip(levels, per_level)}
    study = {"version": 1, "study_seed": protocol.study_seed, "levels": levels, "factors": [factor]}
    factor_file = {
        "factor": factor, "version": 1, "kind": spec.kind, "draw": spec.draw,
        "description": f"{spec.factor} swept at severities {grid} on its frozen direction (derived from the "
                       f"frozen spec {protocol.spec_hash[:12]}).",
        "levels": {lv: severity_params(spec, s) for lv, s in zip(levels, grid)},
        "options": options,
    }
    return {"study.yaml": study, f"{factor}.yaml": factor_file}


def write_derived_spec(run_dir: Path | str, protocol: specs.Protocol, factor: str,
                       severities: Sequence[float]) -> specs.Protocol:
    """Write the derived spec into ``run_dir/sweep/spec`` (or check the one there is the same), freeze it there and
    load it back as a :class:`~robocasa_shift.core.specs.Protocol`.

    Raises:
        BadInput: a severity out of range.
        SpecError: a derived spec already in the run directory differs (another sweep's directory).
    """
    directory = Path(run_dir) / SPEC_DIR
    content = derived_content(protocol, factor, severities)
    grid = check_severities(protocol.factor(factor), severities)
    origin = {"frozen_spec_hash": protocol.spec_hash, "factor": factor, "severities": grid,
              "derived_spec_hash": None}
    if (directory / "derived.json").exists():
        before = json.loads((directory / "derived.json").read_text())
        if {k: before.get(k) for k in ("frozen_spec_hash", "factor", "severities")} != \
                {k: origin[k] for k in ("frozen_spec_hash", "factor", "severities")}:
            raise SpecError(directory / "derived.json", "(document)",
                            f"this run directory sweeps {before.get('factor')!r} at {before.get('severities')} "
                            f"under spec {str(before.get('frozen_spec_hash'))[:12]}; use a new --run-dir")
        return specs.load_protocol(directory, verify=True)
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in content.items():
        (directory / name).write_text(yaml.safe_dump(data, sort_keys=False))
    specs.freeze(directory)
    derived = specs.load_protocol(directory, verify=True)
    origin["derived_spec_hash"] = derived.spec_hash
    (directory / "derived.json").write_text(json.dumps(origin, indent=1))
    return derived


def grid_severities(protocol: specs.Protocol, factor: str, points: int) -> List[float]:
    """``points`` evenly spaced severities up to the factor's top frozen level (the top level included)."""
    spec = protocol.factor(factor)
    if not 1 <= points <= MAX_GRID:
        raise BadInput(f"--grid must be 1-{MAX_GRID} points, got {points}")
    low, high = 0.0, float(len(spec.levels))
    step = (high - low) / points
    return [round(low + step * (i + 1), 6) for i in range(points)]



def audited_protocol(run_dir: Path | str, frozen: specs.Protocol) -> Optional[specs.Protocol]:
    """The derived protocol of a sweep's run directory, recomputed from ``frozen`` and checked against the copy in
    the directory (None when the directory holds no sweep). Nothing in the directory is trusted for its numbers:
    the levels are derived again from the frozen spec and the factor and severities ``derived.json`` names.

    Raises:
        SpecError: ``derived.json`` is malformed, names another frozen spec, or the copy differs from the derivation.
    """
    directory = Path(run_dir) / SPEC_DIR
    path = directory / "derived.json"
    if not os.path.lexists(path):
        return None
    try:
        origin = json.loads(read_text(path, run_dir, MAX_JSON_BYTES, "sweep spec origin"))
        factor, severities = origin["factor"], [float(s) for s in origin["severities"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(path, "(document)", f"not a sweep's derived-spec record ({type(exc).__name__}: {exc})") from None
    if origin.get("frozen_spec_hash") != frozen.spec_hash:
        raise SpecError(path, "frozen_spec_hash", f"{origin.get('frozen_spec_hash')!r} is not the frozen spec's "
                                                  f"{frozen.spec_hash}")
    try:
        expected = derived_content(frozen, factor, severities)
    except (BadInput, UnknownNameError) as exc:
        raise SpecError(path, "severities", str(exc)) from None
    for file in directory.iterdir():  # the copy is parsed whole: regular files of a spec's size only
        if file.is_symlink() or not file.is_file() or file.stat().st_size > MAX_SPEC_BYTES:
            raise SpecError(file, "(document)", f"not a regular file of at most {MAX_SPEC_BYTES} bytes")
    copy = specs.load_protocol(directory, verify=True)
    want = {name: specs.canonical_hash(content) for name, content in expected.items()}
    if dict(copy.file_hashes) != want:
        raise SpecError(directory, "(document)", "the derived spec in the run directory is not the one its frozen "
                                                 "spec, factor and severities give")
    return copy


__all__ = ["MAX_GRID", "NOMINAL", "SPEC_DIR", "check_severities", "derived_content", "grid_severities",
           "audited_protocol", "severity_params", "write_derived_spec"]
