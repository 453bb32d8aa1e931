"""Integrity audit of a run directory (PROTOCOL.md section 8, paper Table VII).

Per task: expected rollouts, valid rollouts, distinct base episodes, and the
counts that must be zero: missing and duplicated records, base-state
fingerprint mismatches, policy-seed mismatches, renderer errors, invalid
perturbation runtime records, runtime failures, StageTracker errors and
unexpected truncations. Each failing check names the rollouts that fail it.
The audit recomputes what it can instead of trusting the records: seeds from
the study seed, the frozen level parameters from the spec files, the scaled
draws, and the shared draw across the levels of an episode.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from robocasa_shift import seeding, specs
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.engine.perturbations import READBACK_ATOL, BaseOffset, max_abs_difference
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.study.store import RunStore

# Checks whose count must be zero, in the order of the paper's Table VII.
ZERO_CHECKS = (
    "missing_records",
    "duplicate_records",
    "fingerprint_mismatches",
    "policy_seed_mismatches",
    "renderer_errors",
    "invalid_perturbation_records",
    "runtime_failures",
    "stage_tracker_errors",
    "unexpected_truncations",
)


def _expected_perturbation(rec: Dict[str, Any], protocol: specs.Protocol) -> List[str]:
    """Problems with a record's perturbation runtime record, checked against the frozen spec."""
    factor, _, level = rec["condition"].partition(":")
    pert = rec.get("perturbation")
    if rec["condition"] == specs.CLEAN:
        return [] if pert is None else ["clean rollout carries a perturbation record"]
    if pert is None:
        return ["no perturbation record"]
    problems = []
    spec = protocol.factor(factor)
    if pert.get("factor") != factor or pert.get("level") != level:
        problems.append(f"record is for {pert.get('factor')}:{pert.get('level')}")
    if pert.get("params") != spec.level(level):
        problems.append(f"params {pert.get('params')} differ from the frozen level {spec.level(level)}")
    error = max_abs_difference(pert.get("applied"), pert.get("expected"))
    if not error <= READBACK_ATOL:
        problems.append(f"read-back differs from the expected values by {error:.3g}")
    draw = pert.get("draw")
    if spec.kind == "base_offset":
        want = BaseOffset.offset(spec.level(level), draw or [np.nan] * 3)
        if max_abs_difference(pert.get("expected"), want) > READBACK_ATOL:
            problems.append("base offset is not the scaled draw")
    if spec.kind == "camera_rotation":
        scaled = [spec.level(level)["theta_max_deg"] * u for u in (draw or [np.nan, np.nan])]
        for cam, values in (pert.get("expected") or {}).items():
            if max_abs_difference([values.get("yaw_deg"), values.get("pitch_deg")], scaled) > READBACK_ATOL:
                problems.append(f"{cam} offset is not the scaled draw")
    return problems


def audit_run(run_dir: Path | str) -> CheckResult:
    """Audit ``run_dir``; write ``audit.json`` and ``audit.md`` into it and return the result."""
    store = RunStore(run_dir)
    manifest = store.manifest() or {}
    protocol = specs.load_protocol()
    entries = store.record_entries()
    expected = store.planned_keys()
    horizons = (manifest.get("env_config") or {}).get("horizons", {})

    by_key: Dict[RolloutKey, List[Dict[str, Any]]] = defaultdict(list)
    files: Dict[RolloutKey, List[str]] = defaultdict(list)
    for file, rec in entries:
        by_key[RolloutKey.from_record(rec)].append(rec)
        files[RolloutKey.from_record(rec)].append(file)
    tasks = sorted({k.task for k in expected} | {k.task for k in by_key})
    report: Dict[str, Any] = {"run_dir": str(run_dir), "spec_hash": protocol.spec_hash, "run_problems": [], "tasks": {}}
    if manifest.get("spec_hash") not in (None, protocol.spec_hash):
        report["run_problems"].append(
            f"manifest spec hash {manifest.get('spec_hash')} differs from the frozen specs {protocol.spec_hash}"
        )
    if manifest.get("study_seed") not in (None, protocol.study_seed):
        report["run_problems"].append(f"manifest study seed {manifest.get('study_seed')} is not {protocol.study_seed}")

    for task in tasks:
        failing: Dict[str, List[str]] = {name: [] for name in ZERO_CHECKS}
        task_expected = [k for k in expected if k.task == task]
        task_keys = sorted(k for k in by_key if k.task == task)
        for key in task_expected:
            if key not in by_key:
                failing["missing_records"].append(key.id)
        for key in task_keys:
            if len(by_key[key]) > 1:
                failing["duplicate_records"].append(f"{key.id} ({', '.join(files[key])})")
        current = {k: v[0] for k, v in by_key.items() if k.task == task}

        # Pairing: every rollout of a base episode shares the fingerprint and seeds of its clean twin.
        groups: Dict[Tuple, List[Tuple[RolloutKey, Dict]]] = defaultdict(list)
        for key, rec in current.items():
            groups[(key.phase, key.episode)].append((key, rec))
        for (phase, episode), members in groups.items():
            fps = [rec.get("env_fingerprint") for _, rec in members if rec.get("env_fingerprint")]
            clean = [rec.get("env_fingerprint") for key, rec in members if key.condition == specs.CLEAN]
            reference = clean[0] if clean and clean[0] else (Counter(fps).most_common(1)[0][0] if fps else None)
            for key, rec in members:
                if rec.get("env_fingerprint") != reference or rec.get("env_seed") != seeding.env_seed(protocol.study_seed, task, phase, episode):
                    failing["fingerprint_mismatches"].append(key.id)
        seed_groups: Dict[Tuple, List[Tuple[RolloutKey, Dict]]] = defaultdict(list)
        for key, rec in current.items():
            seed_groups[(key.phase, key.episode, key.replicate)].append((key, rec))
        for (phase, episode, replicate), members in seed_groups.items():
            want_seed = seeding.policy_seed(protocol.study_seed, task, phase, episode, replicate)
            prints = [rec.get("policy_rng_fingerprint") for key, rec in members if key.condition == specs.CLEAN]
            prints = prints or [Counter(rec.get("policy_rng_fingerprint") for _, rec in members).most_common(1)[0][0]]
            for key, rec in members:
                if rec.get("policy_seed") != want_seed or rec.get("policy_rng_fingerprint") != prints[0]:
                    failing["policy_seed_mismatches"].append(key.id)

        # Shared draws: every level of a factor in an episode uses the same draw.
        draws: Dict[Tuple, set] = defaultdict(set)
        for key, rec in current.items():
            pert = rec.get("perturbation") or {}
            if pert.get("draw") is not None:
                draws[(key.phase, key.episode, key.replicate, pert.get("factor"))].add(json.dumps(pert["draw"]))
        for key, rec in current.items():
            problems = _expected_perturbation(rec, protocol)
            pert = rec.get("perturbation") or {}
            if len(draws.get((key.phase, key.episode, key.replicate, pert.get("factor")), ())) > 1:
                problems.append("levels of this episode used different draws")
            if problems or rec.get("error_kind") == "perturbation":
                failing["invalid_perturbation_records"].append(f"{key.id}: {'; '.join(problems) or rec.get('error')}")
            kind = rec.get("error_kind")
            if kind == "renderer":
                failing["renderer_errors"].append(key.id)
            if kind in ("runtime", "policy_server"):
                failing["runtime_failures"].append(f"{key.id}: {(rec.get('error') or '').splitlines()[0][:160]}")
            if rec.get("stage_error"):
                failing["stage_tracker_errors"].append(f"{key.id}: {rec['stage_error'][:160]}")
            official = horizons.get(task, rec.get("horizon"))
            ended_early = rec.get("valid") and not rec.get("success") and rec.get("steps", 0) < rec.get("horizon", 0)
            if rec.get("truncated") or ended_early or rec.get("horizon") != official:
                failing["unexpected_truncations"].append(
                    f"{key.id}: {rec.get('steps')} of {rec.get('horizon')} steps (official horizon {official})"
                )

        valid = sum(bool(rec.get("valid")) for k, rec in current.items() if k in set(task_expected))
        invalid_expected = [k.id for k in task_expected if k in current and not current[k].get("valid")]
        checks = {name: {"count": len(v), "rollouts": sorted(v)} for name, v in failing.items()}
        report["tasks"][task] = {
            "expected_rollouts": len(task_expected),
            "recorded_rollouts": len(task_keys),
            "valid_rollouts": valid,
            "invalid_rollouts": invalid_expected,
            "distinct_base_episodes": len({(k.phase, k.episode) for k in task_keys}),
            "checks": checks,
            "passed": all(c["count"] == 0 for c in checks.values()) and valid == len(task_expected) and bool(task_expected),
        }
    report["passed"] = bool(report["tasks"]) and not report["run_problems"] and all(t["passed"] for t in report["tasks"].values())
    report["records_sha256"] = records_digest(run_dir)
    result = CheckResult("audit", report.pop("passed"), report, "", "audit")
    result = replace(result, markdown=audit_markdown(result))
    write_result(result, run_dir)
    return result


def records_digest(run_dir: Path | str) -> str:
    """SHA-256 over the plan and every record file (names and bytes): what an audit of the run saw."""
    root = Path(run_dir)
    h = hashlib.sha256()
    for path in [root / "plan.json", *RunStore(root).record_files()]:
        if path.exists():
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def read_audit(run_dir: Path | str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The run's ``audit.json`` and a note when it is missing or older than the records (never re-audits)."""
    path = Path(run_dir) / "audit.json"
    if not path.exists():
        return None, f"No audit yet: run `robocasa-shift audit {run_dir}`."
    audit = json.loads(path.read_text())
    if audit.get("records_sha256") != records_digest(run_dir):
        return audit, (f"audit.json is stale: the records or the plan changed after it was written; "
                       f"run `robocasa-shift audit {run_dir}` again. The table below is the old audit.")
    return audit, None


LABELS = {
    "missing_records": "missing",
    "duplicate_records": "duplicated",
    "fingerprint_mismatches": "base-state fingerprint mismatches",
    "policy_seed_mismatches": "policy-seed mismatches",
    "renderer_errors": "renderer errors",
    "invalid_perturbation_records": "invalid perturbation records",
    "runtime_failures": "runtime failures",
    "stage_tracker_errors": "StageTracker errors",
    "unexpected_truncations": "unexpected truncations",
}


def audit_markdown(report: Mapping[str, Any]) -> str:
    """The audit as a Markdown table, then the failing rollouts of each check."""
    head = ["task", "expected", "valid", "distinct episodes"] + [LABELS[c] for c in ZERO_CHECKS] + ["passed"]
    lines = ["# Integrity audit", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, t in report["tasks"].items():
        cells = [task, t["expected_rollouts"], t["valid_rollouts"], t["distinct_base_episodes"]]
        cells += [t["checks"][c]["count"] for c in ZERO_CHECKS] + ["yes" if t["passed"] else "**NO**"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for problem in report["run_problems"]:
        lines += ["", f"- run: {problem}"]
    for task, t in report["tasks"].items():
        for name in ZERO_CHECKS:
            rollouts = t["checks"][name]["rollouts"]
            if rollouts:
                lines += ["", f"**{task}: {LABELS[name]}** ({len(rollouts)})", ""]
                lines += [f"- {r}" for r in rollouts[:50]] + ([f"- ... {len(rollouts) - 50} more"] if len(rollouts) > 50 else [])
        if t["invalid_rollouts"]:
            lines += ["", f"**{task}: invalid rollouts** ({len(t['invalid_rollouts'])})", ""] + [f"- {r}" for r in t["invalid_rollouts"][:50]]
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)
