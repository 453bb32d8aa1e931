"""Clean-competence screening (PROTOCOL.md section 2, paper Table IV) from a frozen candidate pool.

Screening runs clean rollouts from the screening seed stream, applies the pool's
rule and N+M schedule, and writes the table and the formal suite
(``D/screening/``, ``D/suite.json``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift import errors, specs
from robocasa_shift.checks.results import CheckResult, write_result
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.study.plan import plan_keys
from robocasa_shift.study.runner import RunSession
from robocasa_shift.study.store import RunStore, atomic_write_json

POOLS_DIR = specs.PROJECT_ROOT / "pools"


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
    path = Path(path or POOLS_DIR / f"{backend}.yaml")
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


def screening_decisions(pool: Pool, outcomes: Dict[str, List[bool]]) -> Dict[str, Dict[str, Any]]:
    """Apply the screening rule to each task's clean outcomes, in episode order."""
    out = {}
    for task, results in outcomes.items():
        first = sum(results[: pool.first_batch])
        if len(results) < pool.first_batch:
            decision = "incomplete"
        elif first <= pool.exclude_at_most:
            decision = "excluded (clean floor)"
        elif len(results) < pool.extended:
            decision = "extend"
        else:
            decision = "retained" if sum(results[: pool.extended]) >= pool.retain_at_least else "excluded (below retention)"
        out[task] = {"rollouts": len(results), "successes": int(sum(results)), "first_batch_successes": int(first),
                     "decision": decision}
    return out


def _outcomes(store: RunStore, tasks: Sequence[str], n: int) -> Dict[str, List[bool]]:
    by_key = {RolloutKey.from_record(r): r for r in store.records() if r["phase"] == "screening"}
    return {
        t: [bool(by_key[k]["success"]) for k in plan_keys([t], range(n), ["clean"], phase="screening") if k in by_key]
        for t in tasks
    }


def screen(run_dir: Path | str, study: StudyConfig = StudyConfig(), execution: ExecutionConfig = ExecutionConfig(),
           pool_path: Optional[Path] = None) -> CheckResult:
    """Clean-competence screening with the pool's N+M schedule; writes the table and the formal suite.

    Args:
        run_dir: the run directory (screening rollouts use the screening seed stream).
        study: the policy screened and its backend (whose pool ``pools/<backend>.yaml`` is used).
        execution: how the rollouts are executed.
        pool_path: another candidate-pool file.
    """
    pool = load_pool(study.backend, pool_path)
    with RunSession(run_dir, pool.candidates, ["clean"], study, execution) as session:

        def screen_tasks(tasks: Sequence[str]) -> Dict[str, Dict[str, Any]]:
            session.execute(plan_keys(tasks, range(pool.first_batch), ["clean"], phase="screening"), desc="screening")
            decisions = screening_decisions(pool, _outcomes(session.store, tasks, pool.first_batch))
            extend = [t for t, d in decisions.items() if d["decision"] == "extend"]
            if extend:
                session.execute(plan_keys(extend, range(pool.extended), ["clean"], phase="screening"), desc="screening")
            final = screening_decisions(pool, _outcomes(session.store, tasks, pool.extended))
            return {t: {**final[t], "stage": stage} for t in tasks}

        stage = "initial"
        table = screen_tasks(pool.candidates[: pool.initial])
        qualified = [t for t, d in table.items() if d["decision"] == "retained"]
        activated = len(qualified) < pool.minimum_suite and pool.reserve > 0
        if activated:
            stage = "reserve"
            table.update(screen_tasks(pool.candidates[pool.initial:]))
    suite = [t for t in pool.candidates if table.get(t, {}).get("decision") == "retained"]
    note = None
    if len(suite) < pool.minimum_suite:
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
        "suite": suite,
        "note": note,
    }
    # passed: the suite is as large as the pool asks (a smaller one still proceeds, with the note)
    screening = CheckResult("screening", note is None, result, screening_markdown(result), "screening/screening")
    write_result(screening, run_dir)
    atomic_write_json(Path(run_dir) / "suite.json", {"tasks": suite, "note": note, "pool_sha256": pool.content_hash})
    return screening


def screening_markdown(result: Dict[str, Any]) -> str:
    """The screening table as Markdown (``screening/screening.md``)."""
    r = result["rule"]
    lines = [
        "# Clean-competence screening (paper Table IV)", "",
        f"Rule: {r['first_batch']} clean rollouts; at most {r['exclude_at_most']} successes excludes; otherwise "
        f"extended to {r['extended']}; retained iff at least {r['retain_at_least']}/{r['extended']}. "
        f"Schedule {r['schedule']}, minimum suite {r['minimum_suite']}.", "",
        "| task | stage | rollouts | successes | first batch | decision |", "|---|---|---|---|---|---|",
    ]
    for task, d in result["screening"].items():
        lines.append(f"| {task} | {d['stage']} | {d['rollouts']} | {d['successes']} | {d['first_batch_successes']} | {d['decision']} |")
    lines += ["", f"Formal suite: {', '.join(result['suite']) or '(empty)'}"]
    if result["note"]:
        lines += ["", f"**Note:** {result['note']}"]
    return "\n".join(lines) + "\n"
