"""Model-free severity calibration (PROTOCOL.md section 5): no policy runs.

For each task, 3 fixed base episodes x 13 conditions, one reset-and-render
record each. Checks per record: valid initialization; observation integrity
(finite, right shape, not blank); the pre-perturbation fingerprint equals the
clean one; the intended change happened (illumination and blur: darker /
blurrier than clean, with a monotonicity warning across L1-L3; camera: the
third-person image changes and the wrist image is identical to clean; base:
the offset read back equals the scaled draw). Writes a records table, JSON,
Markdown and a contact sheet per task (rows = conditions, columns = episodes
and cameras) into ``<run dir>/calibration/``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence

import numpy as np

from robocasa_shift import specs
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.engine.perturbations import factor_kind
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.engine.rollout import inject, prepare_episode
from robocasa_shift.errors import PerturbationError

MIN_IMAGE_STD = 2.0  # a frame with less spread than this (0-255 scale) is blank
MIN_CAMERA_CHANGE = 0.5  # mean absolute pixel change that counts as "the image moved"


def sharpness(image: np.ndarray) -> float:
    import cv2

    return float(cv2.Laplacian(cv2.cvtColor(image, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var())


def calibrate(
    run_dir: Path | str,
    tasks: Sequence[str],
    backend: str = "robosuite",
    episodes: Sequence[int] = (0, 1, 2),
    phase: str = "formal",
    image_size: int = 128,
) -> CheckResult:
    protocol = specs.load_protocol()
    b = get_backend(backend)
    out = Path(run_dir) / "calibration"
    out.mkdir(parents=True, exist_ok=True)
    rows: List[Dict[str, Any]] = []
    warnings: List[str] = []
    for task in tasks:
        env = b.make(task)
        cameras = list(env.third_person_cameras) + list(env.wrist_cameras)
        third, wrist = env.third_person_cameras, env.wrist_cameras
        sheet: Dict[str, Dict[int, Dict[str, np.ndarray]]] = {}
        for ep in episodes:
            clean_fp = prepare_episode(env, protocol, RolloutKey(phase, task, ep, "clean"))
            clean = {c: env.render(c, image_size) for c in cameras}
            for cond in protocol.conditions:
                key = RolloutKey(phase, task, ep, cond)
                fp = prepare_episode(env, protocol, key)
                row: Dict[str, Any] = {"task": task, "episode": ep, "condition": cond, "fingerprint_matches": fp == clean_fp}
                try:
                    pert = inject(env, protocol, key)
                    row["valid_init"] = pert is None or bool(pert["ok"])
                    row["draws_rejected"] = 0 if pert is None else pert["draws_rejected"]
                    row["perturbation_params"] = json.dumps(None if pert is None else pert["applied"])
                except PerturbationError as exc:
                    pert, row["valid_init"], row["error"] = None, False, str(exc)
                images = {c: env.render(c, image_size) for c in cameras}
                if pert is not None:
                    spec = protocol.factor(pert["factor"])
                    kind = factor_kind(spec)
                    if kind.side == "obs":
                        images = {c: kind.transform(im, spec.level(pert["level"])) for c, im in images.items()}
                sheet.setdefault(cond, {})[ep] = images
                row["obs_ok"] = all(
                    im.shape == (image_size, image_size, 3) and np.isfinite(im).all() and im.std() > MIN_IMAGE_STD
                    for im in images.values()
                )
                row["brightness"] = float(np.mean([images[c].mean() for c in third]))
                row["sharpness"] = float(np.mean([sharpness(images[c]) for c in third]))
                row["third_change"] = float(np.mean([np.abs(images[c].astype(float) - clean[c]).mean() for c in third]))
                row["wrist_identical"] = all(np.array_equal(images[c], clean[c]) for c in wrist)
                row["clean_brightness"] = float(np.mean([clean[c].mean() for c in third]))
                row["clean_sharpness"] = float(np.mean([sharpness(clean[c]) for c in third]))
                row["intended_change"] = _intended(cond, row, pert)
                row["passed"] = bool(row["valid_init"] and row["obs_ok"] and row["fingerprint_matches"] and row["intended_change"])
                rows.append(row)
        env.close()
        _contact_sheet(sheet, protocol.conditions, list(episodes), cameras, out / f"contact_sheet_{task}.png")
        warnings += _monotonicity(rows, task, episodes)

    import pandas as pd

    table = pd.DataFrame(rows)
    table.to_csv(out / "records.csv", index=False)
    failed = table[~table["passed"]]
    report = {
        "backend": backend,
        "spec_hash": protocol.spec_hash,
        "episodes": list(episodes),
        "phase": phase,
        "n_records": len(table),
        "n_failed": int(len(failed)),
        "failed": failed[["task", "episode", "condition"]].to_dict("records"),
        "warnings": warnings,
        "passed": failed.empty,
    }
    result = CheckResult("calibration", report["passed"], report, _markdown(table, report), "calibration/calibration")
    write_result(result, run_dir)
    return result


def _intended(condition: str, row: Dict[str, Any], pert) -> bool:
    if condition == "clean":
        return row["third_change"] == 0.0 and row["wrist_identical"]
    factor = condition.split(":")[0]
    if factor == "illumination":
        return row["brightness"] < row["clean_brightness"]
    if factor == "blur":
        return row["sharpness"] < row["clean_sharpness"]
    if factor == "camera":
        return row["third_change"] > MIN_CAMERA_CHANGE and row["wrist_identical"]
    if factor == "base":
        return pert is not None and bool(pert["ok"])
    return pert is not None and bool(pert["ok"])


def _monotonicity(rows: List[Dict[str, Any]], task: str, episodes: Sequence[int]) -> List[str]:
    out = []
    for factor, measure in (("illumination", "brightness"), ("blur", "sharpness")):
        for ep in episodes:
            values = [r[measure] for r in rows if r["task"] == task and r["episode"] == ep and r["condition"].startswith(factor + ":")]
            if any(b >= a for a, b in zip(values, values[1:])):
                out.append(f"{task} episode {ep}: {factor} {measure} is not decreasing over L1-L3: {[round(v, 2) for v in values]}")
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
    cv2.imwrite(str(path), cv2.cvtColor(np.concatenate([header, grid], axis=0), cv2.COLOR_RGB2BGR))


def _markdown(table, report) -> str:
    lines = ["# Severity calibration (model-free)", "",
             f"{report['n_records']} records ({len(report['episodes'])} episodes x 13 conditions per task); "
             f"{report['n_failed']} failed.", "",
             "| task | condition | valid init | obs ok | fingerprint = clean | intended change | brightness | sharpness | third-person change | wrist identical |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    grouped = table.groupby(["task", "condition"], sort=False)
    for (task, cond), g in grouped:
        lines.append(
            f"| {task} | {cond} | {g.valid_init.all()} | {g.obs_ok.all()} | {g.fingerprint_matches.all()} | "
            f"{g.intended_change.all()} | {g.brightness.mean():.1f} | {g.sharpness.mean():.1f} | "
            f"{g.third_change.mean():.2f} | {g.wrist_identical.all()} |"
        )
    if report["warnings"]:
        lines += ["", "Warnings:", ""] + [f"- {w}" for w in report["warnings"]]
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)
