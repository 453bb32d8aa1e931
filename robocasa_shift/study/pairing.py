"""Pairing validity at run time: a perturbed rollout must start where its clean twin started.

docs/protocol.md section 6: a rollout whose pre-perturbation ``env_fingerprint`` or
``policy_rng_fingerprint`` differs from its clean twin's (same phase, task,
base episode and replicate) is invalid, and so is the pair. The runner calls
:func:`mark_unpaired` before and after it runs keys, so that the records say so
themselves (``valid: false``) and ``--retry-errors`` re-runs the perturbed
twin. A mismatch that survives that one retry is a determinism failure: its
record keeps the kind :data:`DETERMINISM`, and ``--retry-errors`` never re-runs
it again (:data:`FINAL_ERROR_KINDS`).

The twin is checked only when the clean record is valid: without a valid clean
twin the pair is invalid anyway, and the clean key is the one to retry.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.specs import CLEAN
from robocasa_shift.rundir.files import atomic_write_json
from robocasa_shift.rundir.store import RunStore, parse_record

# Error kinds of a record invalidated here: a first mismatch (re-run by --retry-errors) and one that
# survived the retry (never re-run: re-running a nondeterministic pair again would only hide it).
FINGERPRINT_MISMATCH = "fingerprint_mismatch"
DETERMINISM = "determinism"
FINAL_ERROR_KINDS = (DETERMINISM,)
FINGERPRINT_FIELDS = ("env_fingerprint", "policy_rng_fingerprint")


def twin_mismatch(record: Dict[str, Any], clean: Dict[str, Any]) -> Optional[str]:
    """What differs between a perturbed record and its clean twin, or None when both fingerprints match."""
    diffs = [f"{name} {record.get(name)} != clean twin's {clean.get(name)}"
             for name in FINGERPRINT_FIELDS if record.get(name) != clean.get(name)]
    return "; ".join(diffs) or None


def _history_kinds(store: RunStore, key: RolloutKey) -> List[Optional[str]]:
    """The error kinds of the superseded records of ``key`` (``history/``), oldest first."""
    path = store.record_path(key, base="history")
    kinds = []
    for old in sorted(path.parent.glob(f"{path.stem}.*.json")):
        rec, _ = parse_record(old.read_bytes())
        if rec is not None:
            kinds.append(rec.get("error_kind"))
    return kinds


def mark_unpaired(store: RunStore, keys: Iterable[RolloutKey]) -> List[Record]:
    """Mark invalid every valid perturbed record among ``keys`` whose fingerprints differ from its clean twin's.

    The record is rewritten in place (atomically) with ``valid: false``, the error naming both
    fingerprints, and kind :data:`FINGERPRINT_MISMATCH`, or :data:`DETERMINISM` when the key's
    history already holds a fingerprint mismatch (the mismatch survived its retry). Every other
    field stays as the rollout wrote it. Only the caller (the run directory's single writer,
    holding its lock) may call this.

    Returns:
        The records marked now, as written.
    """
    wanted = {k for k in keys if k.condition != CLEAN}
    if not wanted:
        return []
    records = {RolloutKey.from_record(r): r for r in store.records()}
    marked = []
    for key in sorted(wanted):
        rec = records.get(key)
        clean = records.get(RolloutKey(key.phase, key.task, key.episode, CLEAN, key.replicate))
        if rec is None or clean is None or rec.get("valid") is not True or clean.get("valid") is not True:
            continue
        problem = twin_mismatch(rec, clean)
        if problem is None:
            continue
        record = Record.from_json(rec)
        if FINGERPRINT_MISMATCH in _history_kinds(store, key):
            record.fail(DETERMINISM, f"determinism failure: the fingerprint mismatch survived a retry ({problem}); "
                                     f"not retried again")
        else:
            record.fail(FINGERPRINT_MISMATCH, f"pairing broken: {problem}; `--retry-errors` re-runs this rollout once")
        atomic_write_json(store.record_path(key), {**rec, **record.to_json()})
        marked.append(record)
    return marked


__all__ = ["DETERMINISM", "FINAL_ERROR_KINDS", "FINGERPRINT_FIELDS", "FINGERPRINT_MISMATCH", "mark_unpaired",
           "twin_mismatch"]
