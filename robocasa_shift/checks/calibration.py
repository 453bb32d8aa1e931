"""Model-free severity calibration (docs/protocol.md section 5): no policy runs.

For each task, 3 fixed base episodes x the matrix's conditions, one reset-and-render
record each. Every camera is rendered at the resolution the policy receives
(``image_size``: by default the image size of the policy the run directory's
manifest names, else the policy contract's default) and measured per camera
role (``third_person``, ``wrist``), since blur and illumination act on every
image the policy reads. Checks per record: valid initialization; observation
integrity (finite, right shape, not blank); the pre-perturbation fingerprint
equals the clean one; the intended change happened, as the factor's kind defines it (illumination: every role
darker than clean; blur: every camera's sharpness ratio to its clean render
inside the frozen range of the level, the one the audit checks; both with a
monotonicity warning across L1-L3 per role; camera: the third-person image
changes and the wrist image is identical to clean; base: the offset read back
equals the scaled draw; a dynamics factor: the scaled values read back and no
image changes).

A dynamics factor changes nothing a render shows, so its levels are read out
physically instead: the quantity as the model holds it (``readout``: the mean over
its elements, e.g. the object's mass in kg), and one rollout of the backend's
scripted expert per episode (its demonstration policy, deterministic: no policy
under test runs) with its success, its steps, the subgoal where a failure
stopped, how far the first manipulated object rose (``object_rise_m``) and how
fast the gripper moved over its first steps (``eef_speed_m_per_step``). Writes a
records table, JSON, Markdown and a contact sheet per task (rows = conditions,
columns = episodes and cameras) into ``<run dir>/calibration/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from robocasa_shift.backends import get_backend
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.core import specs
from robocasa_shift.core.backend import missing_hooks
from robocasa_shift.core.conditions import CLEAN, factor_levels
from robocasa_shift.core.dynamics import FAMILY
from robocasa_shift.core.factors import (
    CalibrationView,
    factor_kind,
    laplacian_variance,
    perturbation_entries,
)
from robocasa_shift.core.policy import Policy
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.rollout import Observer, inject, prepare_episode
from robocasa_shift.errors import BadInput, PerturbationError
from robocasa_shift.rundir.store import RunStore

MIN_IMAGE_STD = 2.0  # a frame with less spread than this (0-255 scale) is blank
SPEED_STEPS = 20  # the expert's gripper speed is read over this many first control steps
ROLES = ("third_person", "wrist")
sharpness = laplacian_variance  # the measure the rollouts record and the audit checks (core.factors)


def policy_image_size(run_dir: Path | str) -> Optional[int]:
    """The image size of the policy the run directory's manifest names (screening or a run wrote it), or None.

    Read without building the policy (calibration is model-free): the size in the policy's recorded
    identity or options, else the size its class declares.
    """
    try:
        manifest = RunStore(run_dir).manifest() or {}
    except Exception:  # an unreadable manifest names no policy; calibration needs none
        return None
    identity = manifest.get("policy") if isinstance(manifest.get("policy"), dict) else {}
    options = manifest.get("policy_options") if isinstance(manifest.get("policy_options"), dict) else {}
    for value in (identity.get("image_size"), options.get("image_size")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    if not isinstance(identity.get("name"), str):
        return None
    from robocasa_shift.policies import POLICIES

    try:
        size = getattr(POLICIES.get(identity["name"]), "image_size", None)
    except (KeyError, ImportError):
        return None
    return size if isinstance(size, int) and size > 0 else None


def calibrate(
    run_dir: Path | str,
    tasks: Sequence[str],
    backend: str = "robosuite",
    episodes: Sequence[int] = (0, 1, 2),
    phase: str = "formal",
    image_size: Optional[int] = None,
    asset_kit: Optional[str] = None,
    conditions: Optional[Sequence[str]] = None,
) -> CheckResult:
    """Model-free severity calibration of ``tasks``: every condition rendered and checked, no policy.

    Args:
        run_dir: the run directory (``calibration/`` is written into it).
        tasks: the tasks.
        backend: the backend.
        episodes: the fixed base episodes of ``phase``.
        phase: the seed stream of the episodes.
        image_size: the square render size in pixels; None: the size of the policy the run
            directory names (:func:`policy_image_size`), else the policy contract's default.
        asset_kit: a generated asset kit to run on (``standin``: robocasa's stand-in kitchens), or None.
        conditions: the conditions to render (default: the matrix's 13); optional factors' conditions and
            combinations whose hooks a task's environment lacks are left out and listed (``skipped``).

    Raises:
        BadInput: ``image_size`` is not a positive integer.
    """
    size_source = "--image-size"
    if image_size is None:
        image_size = policy_image_size(run_dir)
        size_source = "the run directory's policy"
        if image_size is None:
            image_size, size_source = Policy.image_size, "the policy contract's default"
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 8:
        raise BadInput(f"image size must be an integer of at least 8 pixels, got {image_size!r}")
    protocol = specs.load_protocol()
    conditions = [CLEAN] + [c for c in (conditions or protocol.conditions) if c != CLEAN]
    for condition in conditions:
        protocol.condition(condition)  # an unknown one lists the known ones
    b = get_backend(backend, asset_kit=asset_kit)
    out = Path(run_dir) / "calibration"
    rows: List[Dict[str, Any]] = []
    warnings: List[str] = []
    skipped: Dict[str, List[str]] = {}
    for task in tasks:
        env = b.make(task)
        lacking = [c for c in conditions if any(missing_hooks(env, factor_kind(protocol.factor(f)).requires)
                                                for f in protocol.condition(c).factors)]
        if lacking:
            skipped[task] = lacking
        task_conditions = [c for c in conditions if c not in lacking]
        cameras = list(env.third_person_cameras) + list(env.wrist_cameras)
        third, wrist = env.third_person_cameras, env.wrist_cameras
        by_role = {role: list(cams) for role, cams in zip(ROLES, (third, wrist)) if cams}
        sheet: Dict[str, Dict[int, Dict[str, np.ndarray]]] = {}
        for ep in episodes:
            clean_fp = prepare_episode(env, protocol, RolloutKey(phase, task, ep, "clean"))
            clean = {c: env.render(c, image_size) for c in cameras}
            for cond in task_conditions:
                key = RolloutKey(phase, task, ep, cond)
                fp = prepare_episode(env, protocol, key)
                row: Dict[str, Any] = {"task": task, "episode": ep, "condition": cond, "fingerprint_matches": fp == clean_fp}
                try:
                    pert = inject(env, protocol, key)
                    entries = perturbation_entries(pert)
                    row["valid_init"] = pert is None or bool(pert["ok"])
                    row["draws_rejected"] = sum(int(e.get("draws_rejected", 0)) for e in entries)
                    applied = [e["applied"] for e in entries]
                    row["perturbation_params"] = json.dumps(None if pert is None else
                                                            applied[0] if len(applied) == 1 else applied)
                except PerturbationError as exc:
                    pert, row["valid_init"], row["error"] = None, False, str(exc)
                images = {c: env.render(c, image_size) for c in cameras}
                for entry in perturbation_entries(pert):  # observation-side factors, as the policy's first frame
                    spec = protocol.factor(entry["factor"])
                    kind = factor_kind(spec)
                    if kind.side == "obs":
                        role = {c: "wrist" if c in wrist else "third_person" for c in cameras}
                        images = {c: kind.transform_frame(im, spec.level(entry["level"]), entry.get("draw"), 0, c,
                                                          role[c]) for c, im in images.items()}
                sheet.setdefault(cond, {})[ep] = images
                row["obs_ok"] = all(
                    im.shape == (image_size, image_size, 3) and np.isfinite(im).all() and im.std() > MIN_IMAGE_STD
                    for im in images.values()
                )
                row["third_change"] = float(np.mean([np.abs(images[c].astype(float) - clean[c]).mean() for c in third]))
                row["wrist_identical"] = all(np.array_equal(images[c], clean[c]) for c in wrist)
                ratios = {}
                for role, cams in by_role.items():
                    row[f"brightness_{role}"] = float(np.mean([images[c].mean() for c in cams]))
                    row[f"clean_brightness_{role}"] = float(np.mean([clean[c].mean() for c in cams]))
                    row[f"sharpness_{role}"] = float(np.mean([sharpness(images[c]) for c in cams]))
                    row[f"clean_sharpness_{role}"] = float(np.mean([sharpness(clean[c]) for c in cams]))
                    ratios[role] = [sharpness(images[c]) / max(sharpness(clean[c]), 1e-12) for c in cams]
                    row[f"sharpness_ratio_{role}"] = float(np.mean(ratios[role]))
                row["intended_change"] = _intended(cond, row, pert, protocol, ratios, list(by_role))
                if _is_dynamics(protocol, cond) or (cond == CLEAN and any(_is_dynamics(protocol, c) for c in task_conditions)):
                    row.update(_dynamics_readout(env, b, backend, protocol, key, pert))
                row["passed"] = bool(row["valid_init"] and row["obs_ok"] and row["fingerprint_matches"] and row["intended_change"]
                                     and row.get("expert_valid", True))
                rows.append(row)
        env.close()
        _contact_sheet(sheet, task_conditions, list(episodes), cameras, out / f"contact_sheet_{task}.png")
        warnings += _monotonicity(rows, task, episodes, list(by_role), protocol, task_conditions)
        warnings += _expert_trend(rows, task, protocol, task_conditions)

    import pandas as pd

    from robocasa_shift.rundir.files import write_csv

    table = pd.DataFrame(rows)
    write_csv(table, out / "records.csv", run_dir)  # the one safe writer (rundir.files), below the run dir
    failed = table[~table["passed"]]
    report = {
        "backend": backend,
        "spec_hash": protocol.spec_hash,
        "episodes": list(episodes),
        "phase": phase,
        "image_size": image_size,
        "image_size_from": size_source,
        "n_records": len(table),
        "n_conditions": len(conditions),
        "conditions": list(conditions),
        "skipped": skipped,  # task -> conditions whose hooks its environment lacks
        "n_failed": int(len(failed)),
        "failed": failed[["task", "episode", "condition"]].to_dict("records"),
        "warnings": warnings,
        "passed": failed.empty,
    }
    result = CheckResult("calibration", report["passed"], report, _markdown(table, report), "calibration/calibration")
    write_result(result, run_dir)
    return result


def _intended(condition: str, row: Dict[str, Any], pert, protocol: specs.Protocol,
              ratios: Dict[str, List[float]], roles: Sequence[str]) -> bool:
    """Whether the condition changed the images as its factor's kind intends, in every camera role."""
    parsed = protocol.condition(condition)
    if parsed.is_clean:
        return row["third_change"] == 0.0 and row["wrist_identical"]
    if parsed.is_combined:  # each factor's own check reads renders the other factor changed too: the read-back only
        return pert is not None and bool(pert["ok"])
    spec = protocol.factor(parsed.factor)
    view = CalibrationView(brightness={r: row[f"brightness_{r}"] for r in roles},
                           clean_brightness={r: row[f"clean_brightness_{r}"] for r in roles},
                           sharpness_ratios=ratios, third_person_change=row["third_change"],
                           wrist_identical=row["wrist_identical"], readback_ok=None if pert is None else bool(pert["ok"]))
    return factor_kind(spec).calibration_intended(spec, parsed.level, view)


def _is_dynamics(protocol: specs.Protocol, condition: str) -> bool:
    """A condition of the dynamics family only (its levels are read out physically and by the expert)."""
    parsed = protocol.condition(condition)
    return not parsed.is_clean and all(factor_kind(protocol.factor(f)).family == FAMILY for f in parsed.factors)


class _ExpertWatch(Observer):
    """The first manipulated object's height and the gripper's position at every step of an expert rollout."""

    def __init__(self, obj: Optional[str]):
        self.key, self.heights, self.eef = f"{obj}_pos" if obj else None, [], []

    def _read(self, env) -> None:
        self.eef.append(np.array(env.eef_pos(), dtype=float))
        if self.key is not None:
            position = env.privileged_state().get(self.key)
            if position is not None:
                self.heights.append(float(np.asarray(position)[2]))

    def on_start(self, env) -> None:
        self._read(env)

    def on_step(self, step, action, env, latched) -> None:
        self._read(env)


def _dynamics_readout(env, backend, backend_name: str, protocol: specs.Protocol, key: RolloutKey,
                      pert: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """A dynamics condition's read-outs: the quantity as the model holds it, and one rollout of the backend's expert."""
    from robocasa_shift.core.dynamics import dynamics_readout, stage_objects
    from robocasa_shift.engine.rollout import run_rollout
    from robocasa_shift.policies import make_policy

    out: Dict[str, Any] = {}
    for entry in perturbation_entries(pert):
        kind = factor_kind(protocol.factor(entry["factor"]))
        if getattr(kind, "quantity", None):
            out["readout"] = dynamics_readout(env, kind.quantity)["mean"]
    if backend.demo_policy is None:
        return out
    stage_spec = specs.load_stage_spec(backend_name, key.task)
    objects = stage_objects(stage_spec)
    watch = _ExpertWatch(objects[0] if objects else None)
    record = run_rollout(env, make_policy(backend.demo_policy), key, protocol, stage_spec, backend_name, observer=watch)
    path = np.array(watch.eef[:SPEED_STEPS + 1])
    stopped = "" if record.success or not record.first_incomplete else stage_spec.names[record.first_incomplete - 1]
    return {**out, "expert_valid": bool(record.valid), "expert_success": bool(record.success),
            "expert_steps": int(record.steps), "expert_stopped_at": stopped,
            "object_rise_m": (max(watch.heights) - watch.heights[0]) if watch.heights else None,
            "eef_speed_m_per_step": float(np.linalg.norm(np.diff(path, axis=0), axis=1).mean()) if len(path) > 1 else None}


def _expert_trend(rows: List[Dict[str, Any]], task: str, protocol: specs.Protocol,
                  conditions: Sequence[str]) -> List[str]:
    """Warnings where a dynamics factor's expert success rate rises with its level (L1 mild, L2 clear, L3 severe)."""
    out = []
    for factor, levels in factor_levels(conditions, protocol.factor_order):
        rates = []
        for c in levels:
            runs = [r["expert_success"] for r in rows if r["task"] == task and r["condition"] == c and "expert_success" in r]
            rates.append(float(np.mean(runs)) if runs else None)
        known = [r for r in rates if r is not None]
        if len(known) > 1 and any(b > a for a, b in zip(known, known[1:])):
            out.append(f"{task}: {factor}'s expert success rate rises with its level: {known}")
    return out


def _monotonicity(rows: List[Dict[str, Any]], task: str, episodes: Sequence[int], roles: Sequence[str],
                  protocol: specs.Protocol, conditions: Optional[Sequence[str]] = None) -> List[str]:
    """Warnings where the measure a factor's kind lowers (``calibration_trend``) does not fall over its levels."""
    out = []
    for factor, conditions in factor_levels(conditions or protocol.conditions, protocol.factor_order):
        measure = factor_kind(protocol.factor(factor)).calibration_trend
        if measure is None:
            continue
        for role in roles:
            column = f"{measure}_{role}"
            for ep in episodes:
                values = [r[column] for c in conditions for r in rows
                          if r["task"] == task and r["episode"] == ep and r["condition"] == c]
                if len(set(values)) > 1 and any(b >= a for a, b in zip(values, values[1:])):  # equal: role untouched
                    out.append(f"{task} episode {ep}: {factor} {role} {measure} is not decreasing over its levels: "
                               f"{[round(v, 2) for v in values]}")
    return out


def _contact_sheet(sheet, conditions, episodes, cameras, path: Path) -> None:
    import cv2

    label_w = 150
    rows = []
    for cond in conditions:
        tiles = [sheet[cond][ep][c] for ep in episodes for c in cameras]
        strip = np.concatenate(tiles, axis=1)
        label = np.full((strip.shape[0], label_w, 3), 255, np.uint8)
        cv2.putText(label, cond, (6, strip.shape[0] // 2 + 5), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0), 1, cv2.LINE_AA)
        rows.append(np.concatenate([label, strip], axis=1))
    grid = np.concatenate(rows, axis=0)
    size = sheet[conditions[0]][episodes[0]][cameras[0]].shape[0]
    header = np.full((24, grid.shape[1], 3), 255, np.uint8)
    for i, (ep, cam) in enumerate((ep, c) for ep in episodes for c in cameras):
        cv2.putText(header, f"ep {ep} {cam.replace('robot0_', '')}", (label_w + i * size + 4, 16),
                    cv2.FONT_HERSHEY_SIMPLEX, 0.38, (0, 0, 0), 1, cv2.LINE_AA)
    ok, png = cv2.imencode(".png", cv2.cvtColor(np.concatenate([header, grid], axis=0), cv2.COLOR_RGB2BGR))
    from robocasa_shift.rundir.files import atomic_write_bytes

    atomic_write_bytes(path, png.tobytes(), Path(path).parent.parent)  # RUN_DIR/calibration/: below the run dir


def _markdown(table, report) -> str:
    """The calibration table: one row per task and condition, brightness and sharpness per camera role."""
    roles = [r for r in ROLES if f"brightness_{r}" in table]
    measures = [f"{m} {r.replace('_', '-')}" for r in roles for m in ("brightness", "sharpness ratio")]
    head = ["task", "condition", "valid init", "obs ok", "fingerprint = clean", "intended change", *measures,
            "third-person change", "wrist identical"]
    lines = ["# Severity calibration (model-free)", "",
             f"{report['n_records']} records ({len(report['episodes'])} episodes x {report['n_conditions']} conditions "
             f"per task) at "
             f"{report['image_size']} x {report['image_size']} px ({report['image_size_from']}); "
             f"{report['n_failed']} failed.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    grouped = table.groupby(["task", "condition"], sort=False)
    for (task, cond), g in grouped:
        cells = [task, cond, g.valid_init.all(), g.obs_ok.all(), g.fingerprint_matches.all(), g.intended_change.all()]
        for r in roles:
            cells += [f"{g[f'brightness_{r}'].mean():.1f}", f"{g[f'sharpness_ratio_{r}'].mean():.4f}"]
        cells += [f"{g.third_change.mean():.2f}", g.wrist_identical.all()]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if "expert_success" in table:
        lines += _dynamics_markdown(table[table["expert_success"].notna()])
    if report["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in report["warnings"]]
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)


def _dynamics_markdown(table) -> List[str]:
    """The dynamics levels' read-outs: the model's value, the expert's success, steps and where it stopped."""
    head = ["task", "condition", "read-out (model)", "expert success", "expert steps (mean)", "failures stopped at",
            "object rise (m, mean)", "gripper speed (m / step, first steps)"]
    lines = ["", "## Dynamics: physical read-outs and the scripted expert", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, cond), g in table.groupby(["task", "condition"], sort=False):
        stopped = sorted({s for s in g.expert_stopped_at if isinstance(s, str) and s})
        readout = g["readout"].mean() if "readout" in g and g["readout"].notna().any() else None
        rise = g.object_rise_m.dropna()
        cells = [task, cond, "-" if readout is None else f"{readout:.4g}",
                 f"{int(g.expert_success.sum())}/{len(g)}", f"{g.expert_steps.mean():.0f}", ", ".join(stopped) or "-",
                 f"{rise.mean():.3f}" if len(rise) else "-", f"{g.eef_speed_m_per_step.mean():.4f}"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines
