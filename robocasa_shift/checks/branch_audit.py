"""The integrity audit of branch studies (``RUN_DIR/branching/<name>/``).

Recomputed, never trusted: every branch's noise seed (from the study seed, the
trunk's key, the step and the index), every checkpoint's snapshot hash (from
the snapshot file, itself checked against the hash written with it), the
fidelity verdicts (a checkpoint is branched only when its replay was
bit-identical), the zero-noise known answer (every branched checkpoint ran one
Continue branch at sigma 0, and it reproduced the trunk's outcome, steps and
trajectory), the success counts, the expansion rule and the estimate; the
trunk's selection against the run's own records; the interventions' frozen spec
hashes against the current specs; that every planned checkpoint has a result; and, for a
served policy, that every checkpoint's session state names the study's model and one server
(``policy_state_audit``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Dict, List, Mapping

from robocasa_shift.analysis import recoverability
from robocasa_shift.branching.checkpoints import branch_seed
from robocasa_shift.branching.interventions import make_intervention
from robocasa_shift.branching.study import BRANCHING, TRUNK_FIELDS, BranchStore, read_snapshot
from robocasa_shift.checks.policy_state_audit import policy_state_problems
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import Error
from robocasa_shift.rundir.files import MAX_JSON_BYTES, read_bytes
from robocasa_shift.rundir.store import RunStore


def audit_branch_studies(run_dir: Path | str) -> Dict[str, Dict[str, Any]]:
    """The audit of every branch study of ``run_dir``: name -> {passed, problems, fidelity, counts}."""
    root = Path(run_dir) / BRANCHING
    if not root.is_dir():
        return {}
    return {d.name: audit_branch_study(run_dir, d.name) for d in sorted(root.iterdir()) if d.is_dir()}


def audit_branch_study(run_dir: Path | str, name: str) -> Dict[str, Any]:
    """Audit one branch study; see the module docstring for what is checked."""
    store, bstore = RunStore(run_dir), BranchStore(run_dir, name)
    problems: List[str] = []
    try:
        manifest = bstore.manifest()
    except Error as exc:
        return {"passed": False, "problems": [str(exc)]}
    if manifest is None:
        return {"passed": False, "problems": [f"{bstore.root}: no manifest.json"]}
    run_manifest = store.manifest() or {}
    protocol = specs.load_protocol()
    settings = manifest.get("settings") or {}
    if not isinstance(settings, dict) or not isinstance(settings.get("interventions") or {}, dict):
        return {"passed": False, "problems": [f"{bstore.root}/manifest.json: settings are not those of a branch study"]}
    if manifest.get("run_spec_hash") != run_manifest.get("spec_hash"):
        problems.append(f"branch study spec hash {manifest.get('run_spec_hash')} is not the run's "
                        f"{run_manifest.get('spec_hash')}")
    for intervention, digest in (settings.get("interventions") or {}).items():
        try:
            current = make_intervention(intervention).spec_hash
        except Error as exc:
            problems.append(f"intervention {intervention}: {exc}")
            continue
        if current != digest:
            problems.append(f"intervention {intervention}: spec hash {digest} recorded, the frozen spec is {current}")
    stored = {RolloutKey.from_record(r): r for r in store.records()}
    clean = {k.pair_id: r.get("success") for k, r in stored.items() if k.condition == specs.CLEAN and r.get("valid")}
    checked = ok = branches = zero_checked = zero_ok = 0
    for path in sorted((bstore.root / "trunks").rglob("*.json")):
        try:
            trunk = _read(path, bstore.run_dir)
            key = RolloutKey.from_record(trunk)
        except (Error, KeyError, ValueError, TypeError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        try:
            problems += [f"trunk {key.id}: {p}" for p in _trunk_problems(bstore, key, trunk, stored.get(key),
                                                                          clean.get(key.pair_id))]
        except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a forged trunk file
            problems.append(f"trunk {key.id}: malformed ({type(exc).__name__}: {str(exc)[:120]})")
        if not trunk.get("reproduced"):
            continue
        tape = _tape(bstore, trunk, problems, key)
        if tape is not None:  # served policies' session states: server, model, format (policy_state_audit)
            problems += [f"trunk {key.id}: {p}" for p in policy_state_problems(tape, manifest.get("policy"))]
        steps = trunk.get("checkpoint_steps") or []
        if not (isinstance(steps, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)):
            problems.append(f"trunk {key.id}: checkpoint_steps {json.dumps(steps)[:60]} is not a list of steps")
            continue
        for step in steps:
            try:
                result = bstore.checkpoint(key, step)
            except Error as exc:
                problems.append(f"checkpoint {key.id} step {step}: {exc}")
                continue
            if result is None:
                problems.append(f"checkpoint {key.id} step {step}: no result")
                continue
            checked += 1
            try:
                ok += bool((result.get("fidelity") or {}).get("ok"))
                zero = result.get("zero_noise")
                zero_checked += isinstance(zero, dict)
                zero_ok += isinstance(zero, dict) and zero.get("ok") is True
                branches += sum(len(v.get("branches") or []) for v in (result.get("interventions") or {}).values())
                problems += [f"checkpoint {key.id} step {step}: {p}"
                             for p in _checkpoint_problems(result, key, step, tape, settings, protocol.study_seed,
                                                      trunk)]
            except (AttributeError, KeyError, TypeError, ValueError, IndexError) as exc:  # a forged result file
                problems.append(f"checkpoint {key.id} step {step}: malformed ({type(exc).__name__}: {str(exc)[:120]})")
    return {"passed": not problems, "problems": problems, "fidelity": {"ok": ok, "checked": checked},
            "zero_noise": {"ok": zero_ok, "checked": zero_checked}, "branches": branches}


def _read(path: Path, root: Path) -> Dict[str, Any]:
    try:
        data = json.loads(read_bytes(path, root, MAX_JSON_BYTES, "trunk file").decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise ValueError(f"not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data


def _trunk_problems(bstore: BranchStore, key: RolloutKey, trunk: Mapping[str, Any], record, twin) -> List[str]:
    problems = []
    if record is None:
        return ["no record of this key in the run"]
    kind = trunk.get("selection")
    if kind in ("shift_failure", "clean_failure") and record.get("success") is not False:
        problems.append(f"selected as {kind} but its record is not a failure")
    if kind == "shift_failure" and twin is not True:
        problems.append("selected as a shift failure but its clean twin did not succeed")
    if trunk.get("valid") and "success" in trunk:
        differs = [f for f in TRUNK_FIELDS if f in trunk and trunk.get(f) != record.get(f)]
        if bool(trunk.get("reproduced")) == bool(differs):
            problems.append(f"reproduced is {trunk.get('reproduced')} but the re-run differs from the record on {differs}")
    return problems


def _tape(bstore: BranchStore, trunk: Mapping[str, Any], problems: List[str], key: RolloutKey):
    """The trunk's snapshot file, checked against the hash written with it (None when it is not usable).

    Only a regular file inside the branch study, reached without a link, is read (``BranchStore.snapshot_path``).
    """
    try:
        return read_snapshot(bstore.snapshot_path(key, dict(trunk)), trunk["snapshot_sha256"], bstore.run_dir)
    except Error as exc:
        problems.append(f"trunk {key.id}: {exc}")
        return None


def _checkpoint_problems(result: Mapping[str, Any], key: RolloutKey, step: int, tape, settings: Mapping[str, Any],
                         study_seed: int, trunk: Mapping[str, Any]) -> List[str]:
    problems = []
    if not result.get("valid"):
        return [f"invalid: {result.get('error')}"]
    if tape is not None and result.get("snapshot_sha256") != tape.checkpoint_hash(step):
        problems.append("snapshot hash differs from the snapshot file's checkpoint")
    fidelity = result.get("fidelity") or {}
    exact = (fidelity.get("max_qpos_dev") == 0.0 and fidelity.get("max_state_dev") == 0.0
             and fidelity.get("same_stages") is True and fidelity.get("same_outcome") is True)
    if fidelity.get("ok") and not exact:
        problems.append(f"fidelity ok but the replay deviates: {fidelity}")
    if bool(result.get("branched")) != bool(fidelity.get("ok")):
        problems.append("branched without a bit-identical replay, or not branched after one")
    problems += _zero_noise_problems(result, trunk)
    interventions = result.get("interventions") or {}
    if result.get("branched") and set(interventions) != set(settings.get("interventions") or {}):
        problems.append(f"interventions {sorted(interventions)}, the study declares {sorted(settings.get('interventions') or {})}")
    k0, kmax, tau, q = (settings.get(n) for n in ("k_initial", "k_expanded", "tau", "q"))
    for name, cell in interventions.items():
        runs = cell.get("branches") or []
        if [b.get("index") for b in runs] != list(range(len(runs))):
            problems.append(f"{name}: branch indices are not 0..{len(runs) - 1}")
        wrong = [b.get("index") for b in runs if b.get("seed") != branch_seed(study_seed, key, step, b.get("index"))]
        if wrong:
            problems.append(f"{name}: branches {wrong} have seeds other than their stream's")
        k = sum(bool(b.get("success")) for b in runs)
        first = sum(bool(b.get("success")) for b in runs[:k0])
        expand = kmax > k0 and recoverability.needs_expansion(first, k0, tau)
        if len(runs) != (kmax if expand else k0) or bool(cell.get("expanded")) != expand:
            problems.append(f"{name}: {len(runs)} branches (expanded={cell.get('expanded')}); the rule gives "
                            f"{kmax if expand else k0} from {first} of the first {k0}")
        if cell.get("k") != k or cell.get("n") != len(runs):
            problems.append(f"{name}: k/n recorded {cell.get('k')}/{cell.get('n')}, counted {k}/{len(runs)}")
        if runs and not math.isclose(cell.get("estimate", -1.0), recoverability.jeffreys_lower(k, len(runs), q), abs_tol=1e-12):
            problems.append(f"{name}: estimate {cell.get('estimate')} is not the Jeffreys q={q} quantile of {k}/{len(runs)}")
        fixed, k_fixed = cell.get("fixed"), settings.get("k_fixed")
        if (fixed is not None) != (k_fixed is not None):
            problems.append(f"{name}: a fixed-K reference {'without' if fixed is not None else 'missing for'} the "
                            f"study's k_fixed {k_fixed}")
        elif fixed is not None:
            extra = fixed.get("branches") or []
            if [b.get("index") for b in extra] != list(range(len(runs), k_fixed)):
                problems.append(f"{name}: fixed-K branches are not {len(runs)}..{k_fixed - 1}")
            if any(b.get("seed") != branch_seed(study_seed, key, step, b.get("index")) for b in extra):
                problems.append(f"{name}: fixed-K branches have seeds other than their stream's")
            k_all = k + sum(bool(b.get("success")) for b in extra)
            if fixed.get("k") != k_all or fixed.get("n") != k_fixed or not math.isclose(
                    fixed.get("estimate", -1.0), recoverability.jeffreys_lower(k_all, k_fixed, q), abs_tol=1e-12):
                problems.append(f"{name}: fixed-K k/n/estimate recorded {fixed.get('k')}/{fixed.get('n')}/"
                                f"{fixed.get('estimate')}, counted {k_all}/{k_fixed}")
    return problems


def _zero_noise_problems(result: Mapping[str, Any], trunk: Mapping[str, Any]) -> List[str]:
    """RESCUE's zero-noise known answer: a branched checkpoint's Continue branch at sigma 0 is the trunk.

    The outcome is compared with the trunk's own (its file, itself checked against the run's record),
    never taken from the check's flags."""
    zero = result.get("zero_noise")
    if not result.get("branched"):
        return [] if zero is None else ["a zero-noise check at a checkpoint that was not branched"]
    if not isinstance(zero, dict):
        return ["no zero-noise known-answer check (one Continue branch at sigma 0) at a branched checkpoint"]
    if zero.get("ok") is not True:
        return [f"the Continue branch at sigma 0 did not reproduce the trunk (success {zero.get('success')}, "
                f"steps {zero.get('steps')}, largest state deviation {zero.get('max_state_dev')})"]
    exact = (zero.get("max_qpos_dev") == 0.0 and zero.get("max_state_dev") == 0.0
             and zero.get("same_stages") is True and zero.get("same_outcome") is True
             and all(zero.get(f) == trunk.get(f) for f in ("success", "steps", "stage_steps")))
    return [] if exact else [f"zero-noise check ok but the branch deviates from the trunk: {zero}"]


__all__ = ["audit_branch_studies", "audit_branch_study"]
