"""Clean-competence screening (docs/protocol.md section 4, paper Table IV) from a frozen candidate pool.

Screening runs clean rollouts from the screening seed stream, applies the pool's
rule and N+M schedule, and writes the table and the formal suite
(``D/screening/``, ``D/suite.json``).

An invalid rollout (a crash, a renderer error) is not a failure: its outcome is
unknown. With ``retry_errors`` invalid screening rollouts are re-run; a task
whose counted rollouts still include invalid ones is ``undecided (N invalid
rollouts)``, and then the screening refuses to decide: no ``suite.json`` is
written and the result fails (the CLI exits 1 and says to rerun with
``--retry-errors``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift import errors
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.rundir.files import atomic_write_json
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.plan import plan_keys
from robocasa_shift.study.runner import RunSession


@dataclass(frozen=True)
class Pool:
    """A frozen candidate pool (``pools/<backend>.yaml``): candidates, N+M schedule, screening rule."""

    backend: str
    version: int
    candidates: Tuple[str, ...]
    initial: int
    reserve: int
    minimum_suite: int
    first_batch: int
    exclude_at_most: int
    extended: int
    retain_at_least: int
    path: str
    content_hash: str


def load_pool(backend: str, path: Optional[Path | str] = None) -> Pool:
    """The candidate pool of ``backend`` (or the file at ``path``), checked field by field.

    Raises:
        SpecError: no pool file, a missing or mistyped field, or a schedule that does not add up.
    """
    path = Path(path) if path else specs.find_data_file("pools", f"{backend}.yaml", f"candidate pool for backend '{backend}'")
    if not path.exists():
        raise errors.SpecError(path, "(document)", f"no candidate pool for backend '{backend}'")
    content = specs._read_yaml(path)
    req = specs._require
    schedule = req(content, path, "schedule", dict)
    screening = req(content, path, "screening", dict)
    candidates = tuple(req(content, path, "candidates", list))
    pool = Pool(
        backend=req(content, path, "backend", str),
        version=req(content, path, "version", int),
        candidates=candidates,
        initial=req(schedule, path, "initial", int, "schedule."),
        reserve=req(schedule, path, "reserve", int, "schedule."),
        minimum_suite=req(content, path, "minimum_suite", int),
        first_batch=req(screening, path, "first_batch", int, "screening."),
        exclude_at_most=req(screening, path, "exclude_at_most", int, "screening."),
        extended=req(screening, path, "extended", int, "screening."),
        retain_at_least=req(screening, path, "retain_at_least", int, "screening."),
        path=str(path),
        content_hash=specs.canonical_hash(content),
    )
    if pool.initial + pool.reserve != len(candidates):
        raise errors.SpecError(path, "schedule", f"initial + reserve must equal the {len(candidates)} candidates")
    return pool


UNDECIDED = "undecided"


def screening_decisions(pool: Pool, outcomes: Dict[str, List[Optional[bool]]]) -> Dict[str, Dict[str, Any]]:
    """Apply the screening rule to each task's clean outcomes, in episode order.

    Args:
        pool: the candidate pool (its rule).
        outcomes: per task, the official success of each rollout, None for an invalid rollout
            (its outcome is unknown: never read as a failure).

    Returns:
        Per task: ``rollouts``, ``successes``, ``first_batch_successes``, ``invalid`` and the
        ``decision``; a task with invalid rollouts among those the rule counts is
        ``undecided (N invalid rollouts)``.
    """
    out = {}
    for task, results in outcomes.items():
        first = sum(bool(r) for r in results[: pool.first_batch])
        counted = results[: pool.first_batch] if len(results) <= pool.first_batch else results[: pool.extended]
        n_invalid = sum(r is None for r in counted)
        if n_invalid:
            decision = f"{UNDECIDED} ({n_invalid} invalid rollout{'s' if n_invalid > 1 else ''})"
        elif len(results) < pool.first_batch:
            decision = "incomplete"
        elif first <= pool.exclude_at_most:
            decision = "excluded (clean floor)"
        elif len(results) < pool.extended:
            decision = "extend"
        else:
            retained = sum(bool(r) for r in results[: pool.extended]) >= pool.retain_at_least
            decision = "retained" if retained else "excluded (below retention)"
        out[task] = {"rollouts": len(results), "successes": int(sum(bool(r) for r in results)),
                     "first_batch_successes": int(first), "invalid": int(sum(r is None for r in results)),
                     "decision": decision}
    return out


def _outcomes(store: RunStore, tasks: Sequence[str], n: int) -> Dict[str, List[Optional[bool]]]:
    """Per task, the official outcome of its first ``n`` screening rollouts recorded (None: invalid)."""
    by_key = {RolloutKey.from_record(r): r for r in store.records() if r["phase"] == "screening"}

    def outcome(rec: Dict[str, Any]) -> Optional[bool]:
        # an invalid rollout (or one without an outcome) is unknown, not a failure
        return bool(rec["success"]) if rec.get("valid") is True and rec.get("success") is not None else None

    return {
        t: [outcome(by_key[k]) for k in plan_keys([t], range(n), ["clean"], phase="screening") if k in by_key]
        for t in tasks
    }


def screen(run_dir: Path | str, study: StudyConfig = StudyConfig(), execution: ExecutionConfig = ExecutionConfig(),
           pool_path: Optional[Path] = None, retry_errors: bool = False) -> CheckResult:
    """Clean-competence screening with the pool's N+M schedule; writes the table and the formal suite.

    Args:
        run_dir: the run directory (screening rollouts use the screening seed stream).
        study: the policy screened and its backend (whose pool ``pools/<backend>.yaml`` is used).
        execution: how the rollouts are executed.
        pool_path: another candidate-pool file.
        retry_errors: re-run invalid screening rollouts (the old records go to ``history/``).

    Returns:
        The result; it fails (``undecided`` lists the tasks, no ``suite.json`` is written) when a
        task's counted rollouts include invalid ones, since its decision is then unknown.
    """
    pool = load_pool(study.backend, pool_path)
    with RunSession(run_dir, pool.candidates, ["clean"], study, execution) as session:

        def screen_tasks(tasks: Sequence[str]) -> Dict[str, Dict[str, Any]]:
            session.execute(plan_keys(tasks, range(pool.first_batch), ["clean"], phase="screening"),
                            retry_errors=retry_errors, desc="screening")
            decisions = screening_decisions(pool, _outcomes(session.store, tasks, pool.first_batch))
            extend = [t for t, d in decisions.items() if d["decision"] == "extend"]
            if extend:
                session.execute(plan_keys(extend, range(pool.extended), ["clean"], phase="screening"),
                                retry_errors=retry_errors, desc="screening")
            final = screening_decisions(pool, _outcomes(session.store, tasks, pool.extended))
            return {t: {**final[t], "stage": stage} for t in tasks}

        stage = "initial"
        table = screen_tasks(pool.candidates[: pool.initial])
        qualified = [t for t, d in table.items() if d["decision"] == "retained"]
        # Whether the reserve is needed depends on every initial decision: none is made while one is undecided.
        undecided_initial = any(d["decision"].startswith(UNDECIDED) for d in table.values())
        activated = len(qualified) < pool.minimum_suite and pool.reserve > 0 and not undecided_initial
        if activated:
            stage = "reserve"
            table.update(screen_tasks(pool.candidates[pool.initial:]))
    undecided = [t for t in pool.candidates if table.get(t, {}).get("decision", "").startswith(UNDECIDED)]
    suite = [t for t in pool.candidates if table.get(t, {}).get("decision") == "retained"]
    note = None
    if undecided:
        n_invalid = sum(table[t]["invalid"] for t in undecided)
        note = (f"{', '.join(undecided)} undecided: {n_invalid} invalid rollout(s) whose outcome is unknown; "
                f"no formal suite was written. Rerun `screen` with --retry-errors to re-run them")
    elif len(suite) < pool.minimum_suite:
        note = (f"only {len(suite)} task(s) qualified, fewer than the pool's minimum suite of {pool.minimum_suite}; "
                f"the study proceeds with them")
    result = {
        "pool": pool.path,
        "pool_sha256": pool.content_hash,
        "policy": study.policy,
        "rule": {"first_batch": pool.first_batch, "exclude_at_most": pool.exclude_at_most,
                 "extended": pool.extended, "retain_at_least": pool.retain_at_least,
                 "schedule": f"{pool.initial}+{pool.reserve}", "minimum_suite": pool.minimum_suite},
        "reserve_activated": activated,
        "screening": {t: table[t] for t in pool.candidates if t in table},
        "suite": [] if undecided else suite,  # no formal suite while a decision is unknown
        "undecided": undecided,
        "note": note,
    }
    # passed: every task decided and the suite as large as the pool asks (a smaller one still proceeds,
    # with the note; an undecided screening does not)
    screening = CheckResult("screening", note is None, result, screening_markdown(result), "screening/screening")
    write_result(screening, run_dir)
    suite_path = Path(run_dir) / "suite.json"
    if undecided:
        suite_path.unlink(missing_ok=True)  # a suite written by an earlier decision is not this screening's
    else:
        atomic_write_json(suite_path, {"tasks": suite, "note": note, "pool_sha256": pool.content_hash})
    return screening


def screening_markdown(result: Dict[str, Any]) -> str:
    """The screening table as Markdown (``screening/screening.md``)."""
    r = result["rule"]
    lines = [
        "# Clean-competence screening (paper Table IV)", "",
        f"Rule: {r['first_batch']} clean rollouts; at most {r['exclude_at_most']} successes excludes; otherwise "
        f"extended to {r['extended']}; retained iff at least {r['retain_at_least']}/{r['extended']}. "
        f"Schedule {r['schedule']}, minimum suite {r['minimum_suite']}.", "",
        "| task | stage | rollouts | successes | invalid | first batch | decision |", "|---|---|---|---|---|---|---|",
    ]
    for task, d in result["screening"].items():
        lines.append(f"| {task} | {d['stage']} | {d['rollouts']} | {d['successes']} | {d.get('invalid', 0)} | "
                     f"{d['first_batch_successes']} | {d['decision']} |")
    undecided = result.get("undecided")
    lines += ["", f"Formal suite: {'(undecided)' if undecided else ', '.join(result['suite']) or '(empty)'}"]
    if result["note"]:
        lines += ["", f"**Note:** {result['note']}"]
    return "\n".join(lines) + "\n"
