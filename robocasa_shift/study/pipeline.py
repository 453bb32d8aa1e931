"""The protocol around single runs: clean-competence screening, the formal matrix, merging shards."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift import errors, specs
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.errors import RunDirError
from robocasa_shift.study.plan import pending_keys, plan_keys
from robocasa_shift.study.runner import RunSession
from robocasa_shift.study.store import IDENTITY_FIELDS, RunStore, atomic_write_json

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
           pool_path: Optional[Path] = None) -> Dict[str, Any]:
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
    out = Path(run_dir)
    atomic_write_json(out / "screening" / "screening.json", result)
    atomic_write_json(out / "suite.json", {"tasks": suite, "note": note, "pool_sha256": pool.content_hash})
    (out / "screening" / "screening.md").write_text(screening_markdown(result))
    return result


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


def formal_suite(run_dir: Path | str) -> Optional[List[str]]:
    """The tasks screening retained in ``run_dir`` (``suite.json``), or None before screening."""
    path = Path(run_dir) / "suite.json"
    return json.loads(path.read_text())["tasks"] if path.exists() else None


def estimate(run_dir: Path | str, keys: Sequence[RolloutKey], workers: int) -> Dict[str, Any]:
    """Rollouts left and an ETA from the per-rollout wall times already measured in ``run_dir``."""
    store = RunStore(run_dir)
    todo = pending_keys(store, keys)
    walls: Dict[str, List[float]] = {}
    for rec in store.records():
        walls.setdefault(rec["task"], []).append(float(rec.get("wall_s") or 0.0))
    per_task = {t: sum(v) / len(v) for t, v in walls.items() if v}
    fallback = sum(per_task.values()) / len(per_task) if per_task else None
    seconds = None
    if fallback is not None:
        seconds = sum(per_task.get(k.task, fallback) for k in todo) / max(1, workers)
    return {"planned": len(keys), "pending": len(todo), "eta_s": seconds, "measured_s_per_rollout": per_task}


def merge(out: Path | str, sources: Sequence[Path | str]) -> Dict[str, Any]:
    """Combine shard run directories into ``out``; refuse mismatched manifests and duplicate keys."""
    out = Path(out)
    stores = [RunStore(s) for s in sources]
    manifests = [s.manifest() for s in stores]
    for src, m in zip(sources, manifests):
        if m is None:
            raise RunDirError(f"{src} has no manifest.json: not a run directory")
    first = manifests[0]
    for src, m in zip(sources[1:], manifests[1:]):
        for name in IDENTITY_FIELDS:
            a, b = first.get(name), m.get(name)
            if isinstance(a, dict) and isinstance(b, dict) and name == "stage_spec_hashes":
                clash = [t for t in set(a) & set(b) if a[t] != b[t]]
                if clash:
                    raise RunDirError(f"{src}: stage spec hashes of {clash} differ from {sources[0]}")
            elif a != b:
                raise RunDirError(f"{src}: manifest field {name} differs from {sources[0]}:\n  {json.dumps(a)}\n  {json.dumps(b)}")
    seen: Dict[RolloutKey, str] = {}
    for src, store in zip(sources, stores):
        for rec in store.records():
            key = RolloutKey.from_record(rec)
            if key in seen:
                raise RunDirError(f"duplicate key {key.id} in {seen[key]} and {src}")
            seen[key] = str(src)
    target = RunStore(out)
    with target:
        if any(True for _ in target.record_files()):
            raise RunDirError(f"{out} already holds records; merge into a new directory")
        merged = dict(first)
        merged["stage_spec_hashes"] = {k: v for m in manifests for k, v in (m.get("stage_spec_hashes") or {}).items()}
        merged["merged_from"] = [str(s) for s in sources]
        atomic_write_json(target.manifest_path, merged)
        target.log_command({"merged_from": [str(s) for s in sources]})
        for src, store in zip(sources, stores):
            for base in ("records", "history"):
                for path in store.record_files(base):
                    dest = out / path.relative_to(store.root)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, dest)
            target.add_to_plan(store.planned_keys())
    return {"records": len(seen), "sources": len(sources)}
