"""Integrity audit of a run directory (docs/protocol.md section 8, paper Table VII).

Per task: expected rollouts, valid rollouts, distinct base episodes, and the
counts that must be zero: missing and duplicated records, base-state
fingerprint mismatches, policy-seed mismatches, renderer errors, invalid
perturbation runtime records, runtime failures, StageTracker errors and
unexpected truncations. Each failing check names the rollouts that fail it.
The audit recomputes what it can instead of trusting the records: seeds from
the study seed, the frozen level parameters from the spec files, every draw
from its factor's seed stream (``seeding.draw_rng``; a base draw is the
``draws_rejected + 1``-th triple of the stream), the scaled draws, the shared
draw across the levels of an episode, and for blur what was measured on the
delivered images against the frozen ranges. Every comparison is NaN-safe (a
missing or NaN value fails), and a record without an env or policy fingerprint
fails the pairing checks (two missing fingerprints are not a match).

One audit covers one phase (``formal`` by default): the expected rollouts,
distinct base episodes and tasks are those of that phase only, so screening or
validation rollouts in the same run directory never enter a formal audit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from robocasa_shift import seeding
from robocasa_shift.checks.branch_audit import audit_branch_studies
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.core import kits, specs
from robocasa_shift.core.factors import (
    READBACK_ATOL,
    AuditContext,
    factor_kind,
    max_abs_difference,
    perturbation_entries,
)
from robocasa_shift.analysis.behaviour import differences, formal_behaviour, run_behaviour
from robocasa_shift.core.framelog import FrameLogError
from robocasa_shift.core.records import RolloutKey, unlatched_success
from robocasa_shift.core.steplog import StepLogError
from robocasa_shift.errors import Error, RunDirError, SpecError, UnknownNameError
from robocasa_shift.rundir.files import MAX_JSON_BYTES, read_bytes, read_json
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.pairing import DETERMINISM
from robocasa_shift.sweep.spec import audited_protocol

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
    "step_log_problems",
    "frame_log_problems",
    "unexpected_truncations",
)


def _close(a: Any, b: Any) -> bool:
    """``a`` equals ``b`` to the read-back tolerance; NaN, None or a shape mismatch is never close."""
    return max_abs_difference(a, b) <= READBACK_ATOL


def _expected_perturbation(rec: Dict[str, Any], protocol: specs.Protocol,
                           third_person_cameras: Optional[List[str]] = None) -> List[str]:
    """Problems with a record's perturbation runtime record, checked against the frozen spec.

    The draw is recomputed from the factor's seed stream for the record's (task, phase, episode),
    and the expected values from that recomputed draw, never from the draw the record carries.

    Args:
        rec: the record.
        protocol: the frozen protocol.
        third_person_cameras: the cameras a camera rotation must move (from the manifest), when known.
    """
    try:
        condition = protocol.condition(rec["condition"])
    except Error as exc:
        return [f"condition: {exc}"]
    pert = rec.get("perturbation")
    if condition.is_clean:
        return [] if pert is None else ["clean rollout carries a perturbation record"]
    if not isinstance(pert, dict):
        return ["no perturbation record"]
    if not condition.is_combined:
        return _entry_problems(rec, protocol, condition.single, pert, third_person_cameras)
    # a combined condition: one entry per factor, in the condition's order, each checked as its single factor's
    entries = pert.get("entries")
    if pert.get("condition") != str(condition) or not isinstance(entries, list) or len(entries) != len(condition.shifts):
        return [f"record is for {pert.get('condition')!r} with {len(entries) if isinstance(entries, list) else 'no'} "
                f"entries, not {condition} with {len(condition.shifts)}"]
    problems = []
    for shift, entry in zip(condition.shifts, entries):
        if not isinstance(entry, dict):
            problems.append(f"{shift}: no entry")
            continue
        problems += [f"{shift}: {p}" for p in _entry_problems(rec, protocol, shift, entry, third_person_cameras)]
    if pert.get("ok") is not all(bool(e.get("ok")) for e in entries if isinstance(e, dict)):
        problems.append("'ok' is not whether every entry read back")
    return problems


def _entry_problems(rec: Dict[str, Any], protocol: specs.Protocol, shift, pert: Dict[str, Any],
                    third_person_cameras: Optional[List[str]] = None) -> List[str]:
    """Problems with one factor's runtime record (a single-factor record, or an entry of a combined one)."""
    factor, level = shift.factor, shift.level
    problems = []
    spec = protocol.factor(factor)
    kind = factor_kind(spec)
    params = spec.level(level)
    if pert.get("factor") != factor or pert.get("level") != level or pert.get("kind") != spec.kind:
        problems.append(f"record is for {pert.get('factor')}:{pert.get('level')} (kind {pert.get('kind')})")
    if pert.get("params") != params:
        problems.append(f"params {pert.get('params')} differ from the frozen level {params}")
    error = max_abs_difference(pert.get("applied"), pert.get("expected"))
    if not error <= kind.readback_atol:
        problems.append(f"read-back differs from the expected values by {error:.3g} (tolerance {kind.readback_atol:.3g})")

    rng = seeding.draw_rng(protocol.study_seed, factor, rec["task"], rec["phase"], int(rec["episode"]))
    try:
        want = kind.replay_draw(spec, rng, pert.get("draws_rejected", 0))
    except ValueError as exc:
        return problems + [f"draws_rejected: {exc}"]
    if want is None:
        if pert.get("draw") is not None:
            problems.append(f"carries a draw {pert.get('draw')} but kind {spec.kind} draws nothing")
    elif not _close(pert.get("draw"), want):
        problems.append(f"draw {pert.get('draw')} is not the one its seed stream gives "
                        f"({pert.get('draws_rejected', 0)} rejected first): {want}")
    # a policy that reads no camera gets no image to transform (frames_rendered 0): nothing to measure
    delivered = not (isinstance(rec.get("frames_rendered"), int) and rec["frames_rendered"] == 0)
    return problems + kind.audit(spec, level, want, pert, AuditContext(third_person_cameras, delivered))


def _pairing_failures(members, fp_field: str, reference: Optional[str], seed_field: str, want_seed: int,
                      what: str) -> List[str]:
    """Members whose fingerprint is missing (valid records only), differs from the reference, or whose seed
    is not the one recomputed from the study seed."""
    out = []
    for key, rec in members:
        fp = rec.get(fp_field)
        if not fp and rec.get("valid"):
            out.append(f"{key.id}: no {what}")
        elif (fp and fp != reference) or rec.get(seed_field) != want_seed:
            out.append(_pairing_entry(key, rec))
    return out


def audit_run(run_dir: Path | str, phase: str = "formal") -> CheckResult:
    """Audit the ``phase`` rollouts of ``run_dir``; write the result into it (:func:`audit_stem`) and return it.

    Args:
        run_dir: the run directory.
        phase: the phase audited (``formal``, ``screening`` or ``validation``); keys and records of
            other phases are left out (``other_phases`` in the report counts their records).

    Raises:
        UnknownNameError: ``phase`` is not a phase of the protocol.
        RunDirError: ``run_dir`` has no manifest (not a run directory: nothing is written into it).
    """
    if phase not in seeding.PHASES:
        raise UnknownNameError("phase", phase, list(seeding.PHASES))
    store = RunStore(run_dir)
    manifest = store.require_manifest("audit")
    protocol = specs.load_protocol()
    sweep_problem = None
    try:  # a sweep's records mean the levels of its derived spec, derived again here from the frozen one
        protocol = audited_protocol(run_dir, protocol) or protocol
    except SpecError as exc:
        sweep_problem = str(exc)
    all_entries = store.record_entries()
    entries = [(file, rec) for file, rec in all_entries if rec["phase"] == phase]
    expected = [k for k in store.planned_keys() if k.phase == phase]
    env_config = manifest.get("env_config") or {}
    horizons = env_config.get("horizons", {})
    third_person = env_config.get("third_person_cameras")

    by_key: Dict[RolloutKey, List[Dict[str, Any]]] = defaultdict(list)
    files: Dict[RolloutKey, List[str]] = defaultdict(list)
    for file, rec in entries:
        by_key[RolloutKey.from_record(rec)].append(rec)
        files[RolloutKey.from_record(rec)].append(file)
    tasks = sorted({k.task for k in expected} | {k.task for k in by_key})
    by_phase = dict(Counter(rec["phase"] for _, rec in all_entries))
    report: Dict[str, Any] = {"run_dir": str(run_dir), "phase": phase, "spec_hash": protocol.spec_hash,
                              "run_problems": [], "tasks": {},
                              "other_phases": {p: n for p, n in by_phase.items() if p != phase}}
    if not tasks:
        elsewhere = ", ".join(f"{p} {n}" for p, n in sorted(by_phase.items()))
        report["run_problems"].append(f"no {phase} rollouts planned or recorded" + (
            f"; records of other phases: {elsewhere} (audit one with --phase)" if elsewhere else ", nor any other"))
    if sweep_problem:
        report["run_problems"].append(sweep_problem)
    if manifest.get("spec_hash") not in (None, protocol.spec_hash):
        report["run_problems"].append(
            f"manifest spec hash {manifest.get('spec_hash')} differs from the frozen specs {protocol.spec_hash}"
        )
    if manifest.get("study_seed") not in (None, protocol.study_seed):
        report["run_problems"].append(f"manifest study seed {manifest.get('study_seed')} is not {protocol.study_seed}")
    # Files under records/ that are not records (truncated, stray, mistyped): skipped above, named and failed here.
    unreadable = store.unreadable_records()
    report["unreadable_records"] = [{"file": file, "problem": problem} for file, problem in unreadable]
    report["run_problems"] += [f"unreadable record {file}: {problem}" for file, problem in unreadable]

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
        # A missing fingerprint on a valid record fails (two missing ones are no match); an invalid
        # record may have ended before its fingerprint was taken and fails as invalid anyway.
        for (ep_phase, episode), members in groups.items():
            reference = _reference(members, "env_fingerprint")
            want_env = seeding.env_seed(protocol.study_seed, task, ep_phase, episode)
            failing["fingerprint_mismatches"] += _pairing_failures(
                members, "env_fingerprint", reference, "env_seed", want_env, "env fingerprint")
        seed_groups: Dict[Tuple, List[Tuple[RolloutKey, Dict]]] = defaultdict(list)
        for key, rec in current.items():
            seed_groups[(key.phase, key.episode, key.replicate)].append((key, rec))
        for (ep_phase, episode, replicate), members in seed_groups.items():
            want_seed = seeding.policy_seed(protocol.study_seed, task, ep_phase, episode, replicate)
            reference = _reference(members, "policy_rng_fingerprint")
            failing["policy_seed_mismatches"] += _pairing_failures(
                members, "policy_rng_fingerprint", reference, "policy_seed", want_seed, "policy RNG fingerprint")

        # Shared draws: every level of a factor in an episode, and every combination it enters, uses the same draw.
        draws: Dict[Tuple, set] = defaultdict(set)
        for key, rec in current.items():
            for pert in perturbation_entries(rec.get("perturbation")):
                if pert.get("draw") is not None:
                    shared = json.dumps([pert["draw"], pert.get("draws_rejected")])
                    draws[(key.phase, key.episode, key.replicate, pert.get("factor"))].add(shared)
        for key, rec in current.items():
            problems = _expected_perturbation(rec, protocol, third_person)
            for pert in perturbation_entries(rec.get("perturbation")):
                if len(draws.get((key.phase, key.episode, key.replicate, pert.get("factor")), ())) > 1:
                    problems.append(f"the levels and combinations of {pert.get('factor')} in this episode used "
                                    "different draws")
            if problems or rec.get("error_kind") == "perturbation":
                failing["invalid_perturbation_records"].append(f"{key.id}: {'; '.join(problems) or rec.get('error')}")
            kind = rec.get("error_kind")
            if kind == "renderer":
                failing["renderer_errors"].append(key.id)
            if kind in ("runtime", "policy_server", "worker_crash", "worker_timeout"):
                failing["runtime_failures"].append(f"{key.id}: {(rec.get('error') or '').splitlines()[0][:160]}")
            if rec.get("stage_error"):
                failing["stage_tracker_errors"].append(f"{key.id}: {rec['stage_error'][:160]}")
            problem = step_log_problem(store, rec)
            if problem:
                failing["step_log_problems"].append(f"{key.id}: {problem}")
            problem = frame_log_problem(store, rec)
            if problem:
                failing["frame_log_problems"].append(f"{key.id}: {problem}")
            official = horizons.get(task, rec.get("horizon"))
            ended_early = rec.get("valid") and not rec.get("success") and rec.get("steps", 0) < rec.get("horizon", 0)
            if rec.get("truncated") or ended_early or rec.get("horizon") != official:
                failing["unexpected_truncations"].append(
                    f"{key.id}: {rec.get('steps')} of {rec.get('horizon')} steps (official horizon {official})"
                )

        # Notes that fail nothing: official successes whose stage spec asked for more (a subgoal left unlatched).
        unlatched = sorted(f"{key.id}: {first}" for key, rec in current.items()
                           for first in [unlatched_success(rec)] if first is not None)
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
            "unlatched_successes": unlatched,
            "passed": all(c["count"] == 0 for c in checks.values()) and valid == len(task_expected) and bool(task_expected),
        }
    # A generated asset kit (robocasa's stand-in kitchens): named on every page; records on another kit fail the run.
    report["asset_kit"] = kits.run_asset_kit(manifest)
    report["banner"] = kits.run_banner(manifest)
    report["run_problems"] += kits.kit_problems(manifest, [rec for _, rec in all_entries])
    # Behaviour metrics a summary reports (a sweep's, the formal analysis's), recomputed from the step logs.
    if phase == "formal":
        report["behaviour_checked"], problems = behaviour_problems(store, [rec for _, rec in all_entries])
        report["run_problems"] += problems
    # Branch studies (counterfactual continuations) of this run: seeds, snapshot hashes, fidelity, estimates.
    report["branching"] = audit_branch_studies(run_dir)
    report["run_problems"] += [f"branch study {name}: {problem}" for name, study in report["branching"].items()
                               for problem in study["problems"]]
    report["passed"] = bool(report["tasks"]) and not report["run_problems"] and all(t["passed"] for t in report["tasks"].values())
    report["records_sha256"] = records_digest(run_dir)
    result = CheckResult("audit", report.pop("passed"), report, "", audit_stem(phase))
    result = replace(result, markdown=audit_markdown(result))
    write_result(result, run_dir)
    return result


BEHAVIOUR_SUMMARIES = ("sweep/summary.json", "analysis/summary.json")  # a sweep's, and the formal analysis's (report)


def behaviour_problems(store: RunStore, records: List[Dict[str, Any]]) -> Tuple[List[str], List[str]]:
    """(the summaries whose ``behaviour`` was recomputed, the problems): every behaviour metric a summary of the run
    directory reports is recomputed from the step logs (``analysis/behaviour.py``), and any difference is named."""
    checked, problems = [], []
    for name in BEHAVIOUR_SUMMARIES:
        path = store.root / name
        if not os.path.lexists(path):
            continue
        try:
            summary = read_json(path, store.root, MAX_JSON_BYTES, "summary")
            reported = summary.get("behaviour") if isinstance(summary, dict) else None
            if reported is None:
                continue
            if name.startswith("sweep/"):
                recomputed = run_behaviour(store, records, str(summary.get("task")))
            else:
                recomputed = formal_behaviour(store, records)
        except (Error, OSError, ValueError) as exc:
            problems.append(f"{name}: its behaviour cannot be checked ({type(exc).__name__}: {str(exc)[:200]})")
            continue
        checked.append(name)
        found = differences(recomputed, reported, where=f"{name}: behaviour")
        if found:
            problems.append(f"{name}: the behaviour it reports is not what the step logs give: " + "; ".join(found))
    return checked, problems


def step_log_problem(store: RunStore, rec: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a record's step log (None when it has none, or a sound one).

    The file must be there with the SHA-256 the record holds, and agree with the record: as many
    steps, one boundary per policy call, the subgoals the record counts, and the key it belongs to.
    """
    try:
        log = store.step_log(rec)
    except StepLogError as exc:
        return str(exc)
    if log is None:
        return None
    info, problems = rec["step_log"], []
    if log.steps != rec.get("steps") or info.get("steps") != log.steps:
        problems.append(f"{log.steps} logged steps, the record has {rec.get('steps')}")
    if len(log.boundary) != rec.get("policy_calls") or info.get("boundaries") != len(log.boundary):
        problems.append(f"{len(log.boundary)} logged boundaries, the record has {rec.get('policy_calls')} policy calls")
    latched = int(log.latched[-1]) if log.steps else 0
    if rec.get("valid") and not rec.get("stage_error") and latched != rec.get("stages_completed"):
        problems.append(f"{latched} subgoals latched in the log, {rec.get('stages_completed')} in the record")
    if log.meta.get("key") != RolloutKey.from_record(rec).to_json():
        problems.append(f"the log belongs to {log.meta.get('key')}")
    return "; ".join(problems) or None


def frame_log_problem(store: RunStore, rec: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a record's frame log (None when it has none, or a sound one).

    The file must be there with the size and SHA-256 the record holds, decode within the size the record
    declares, hold a frame after the injection and after every step the record counts, and name its key.
    """
    try:
        log = store.frame_log(rec)
    except FrameLogError as exc:
        return str(exc)
    if log is None:
        return None
    info, problems = rec["frame_log"], []
    if log.steps != rec.get("steps") or info.get("steps") != log.steps:
        problems.append(f"{log.steps + 1} logged frames, the record has {rec.get('steps')} steps")
    if info.get("cameras") != len(log.meta["cameras"]) or info.get("size") != log.delta.shape[2]:
        problems.append(f"{len(log.meta['cameras'])} cameras of {log.delta.shape[2]} px logged, the record says "
                        f"{info.get('cameras')} of {info.get('size')}")
    if log.meta.get("key") != RolloutKey.from_record(rec).to_json():
        problems.append(f"the log belongs to {str(log.meta.get('key'))[:200]}")
    return "; ".join(problems) or None


def audit_stem(phase: str = "formal") -> str:
    """Where the audit of ``phase`` goes: ``audit`` for the formal phase (what ``report`` reads), else ``audit-<phase>``."""
    return "audit" if phase == "formal" else f"audit-{phase}"


def _reference(members: List[Tuple[RolloutKey, Dict[str, Any]]], field: str) -> Optional[str]:
    """The fingerprint a base episode's rollouts must share: the clean twin's, else the most common one."""
    clean = [rec.get(field) for key, rec in members if key.condition == specs.CLEAN and rec.get(field)]
    if clean:
        return clean[0]
    present = [rec.get(field) for _, rec in members if rec.get(field)]
    return Counter(present).most_common(1)[0][0] if present else None


def _pairing_entry(key: RolloutKey, rec: Dict[str, Any]) -> str:
    """A fingerprint or seed mismatch as listed: the rollout, and a note when it survived a retry."""
    if rec.get("error_kind") == DETERMINISM:
        return f"{key.id} (determinism failure: the mismatch survived a retry)"
    return key.id


def records_digest(run_dir: Path | str) -> str:
    """SHA-256 over the plan and every record file (names and bytes): what an audit of the run saw."""
    root = Path(run_dir)
    h = hashlib.sha256()
    for path in [root / "plan.json", *RunStore(root).record_files()]:
        if os.path.lexists(path):
            try:  # a regular file reached without a link, never blocking (a shared run directory)
                data = read_bytes(path, root, MAX_JSON_BYTES, "record")
            except OSError as exc:
                data = f"unreadable: {exc.strerror}".encode()
            h.update(str(path.relative_to(root)).encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def read_audit(run_dir: Path | str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """The run's ``audit.json`` and a note when it is missing or older than the records (never re-audits)."""
    path = Path(run_dir) / "audit.json"
    if not os.path.lexists(path):
        return None, f"No audit yet: run `robocasa-shift audit {run_dir}`."
    try:
        audit = read_json(path, run_dir, MAX_JSON_BYTES, "audit")
    except (OSError, RunDirError) as exc:
        return None, f"audit.json cannot be read ({getattr(exc, 'strerror', None) or exc}); run `robocasa-shift audit {run_dir}` again."
    if not isinstance(audit, dict):
        return None, f"audit.json is not a JSON object; run `robocasa-shift audit {run_dir}` again."
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
    "step_log_problems": "step-log problems",
    "frame_log_problems": "frame-log problems",
    "unexpected_truncations": "unexpected truncations",
}


def audit_markdown(report: Mapping[str, Any]) -> str:
    """The audit as a Markdown table, then the failing rollouts of each check."""
    head = ["task", "expected", "valid", "distinct episodes"] + [LABELS[c] for c in ZERO_CHECKS] + ["passed"]
    lines = ([f"**{report['banner']}**", ""] if report.get("banner") else []) + [
             "# Integrity audit", "", f"Phase: {report.get('phase', 'formal')}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, t in report["tasks"].items():
        cells = [task, t["expected_rollouts"], t["valid_rollouts"], t["distinct_base_episodes"]]
        cells += [t["checks"][c]["count"] for c in ZERO_CHECKS] + ["yes" if t["passed"] else "**NO**"]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for name, study in (report.get("branching") or {}).items():
        fidelity = study.get("fidelity") or {}
        lines += ["", f"Branch study `{name}`: {study.get('branches', 0)} branches; replay fidelity "
                      f"{fidelity.get('ok', 0)}/{fidelity.get('checked', 0)} checkpoints bit-identical; "
                      f"zero-noise known answer {(study.get('zero_noise') or {}).get('ok', 0)}/"
                      f"{(study.get('zero_noise') or {}).get('checked', 0)} Continue branches at sigma 0 reproduced "
                      f"their trunk; {'passed' if study['passed'] else '**FAILED**'}."]
    for problem in report["run_problems"]:
        lines += ["", f"- run: {problem}"]
    for task, t in report["tasks"].items():
        for name in ZERO_CHECKS:
            rollouts = t["checks"][name]["rollouts"]
            if rollouts:
                lines += ["", f"**{task}: {LABELS[name]}** ({len(rollouts)})", ""]
                lines += [f"- {r}" for r in rollouts[:50]] + ([f"- ... {len(rollouts) - 50} more"] if len(rollouts) > 50 else [])
        if t.get("unlatched_successes"):
            notes = t["unlatched_successes"]
            lines += ["", f"{task}: {len(notes)} official success(es) with a subgoal the stage tracker did not latch "
                          "(the stage spec asks more than the success check; they count as successes, not as stages "
                          "reached; first unlatched subgoal):", ""] + [f"- {n}" for n in notes[:50]]
        if t["invalid_rollouts"]:
            lines += ["", f"**{task}: invalid rollouts** ({len(t['invalid_rollouts'])})", ""] + [f"- {r}" for r in t["invalid_rollouts"][:50]]
    lines += ["", f"**{'PASSED' if report['passed'] else 'FAILED'}**", ""]
    return "\n".join(lines)
