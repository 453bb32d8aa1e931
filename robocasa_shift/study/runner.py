"""The Python API behind the CLI: plan rollout keys, run the missing ones, record them."""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from robocasa_shift import specs
from robocasa_shift.backends import get_backend
from robocasa_shift.checks.audit import add_to_plan
from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.engine.rollout import run_lockstep, run_rollout
from robocasa_shift.errors import BadInput
from robocasa_shift.policies import check_policy_options, make_policy
from robocasa_shift.seeding import PHASES
from robocasa_shift.study.store import RunStore

SEED_RULE = (
    "env seed = derive_seed(study_seed, stream=env, task, phase, episode); "
    "policy seed = derive_seed(study_seed, stream=policy, task, phase, episode, replicate); "
    "factor draw = derive_seed(study_seed, stream=<factor>, task, phase, episode); "
    "derive_seed: numpy SeedSequence(entropy=study_seed, spawn_key=sha256 words of 'name=value', sorted by name)"
)


def parse_episodes(text: str) -> List[int]:
    """``'0-19'`` -> 0..19; ``'0,3,5-7'`` -> [0, 3, 5, 6, 7]."""
    out: List[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise BadInput(f"episodes must look like '0-19' or '0,3,5-7', got {text!r}") from None
        if first < 0 or last < first:
            raise BadInput(f"bad episode range {part!r} in {text!r}")
        out.extend(range(first, last + 1))
    if not out:
        raise BadInput(f"no episodes in {text!r}")
    return sorted(set(out))


def plan_keys(
    tasks: Sequence[str],
    episodes: Iterable[int],
    conditions: Sequence[str],
    phase: str = "formal",
    replicates: Sequence[int] = (0,),
) -> List[RolloutKey]:
    """Keys in execution order: task, episode, replicate, then condition (clean first)."""
    if phase not in PHASES:
        from robocasa_shift.errors import UnknownNameError

        raise UnknownNameError("phase", phase, list(PHASES))
    episodes = list(episodes)
    return [
        RolloutKey(phase, task, ep, cond, rep)
        for task in tasks
        for ep in episodes
        for rep in replicates
        for cond in conditions
    ]


def package_versions(extra: Dict[str, str]) -> Dict[str, str]:
    try:
        own = metadata.version("robocasa-shift")
    except metadata.PackageNotFoundError:
        own = "source"
    return {"python": platform.python_version(), "robocasa-shift": own, **extra}


@dataclass


class Study:
    """Everything fixed for one run directory: protocol, backend, policy, render profile."""

    backend_name: str = "robosuite"
    policy_name: str = "expert"
    render_profile: str = "fast"
    policy_options: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.protocol = specs.load_protocol(verify=True)
        self.backend = get_backend(self.backend_name)
        self._policies: List[Any] = []
        self._envs: Dict[str, List[Any]] = {}

    @property
    def policy(self):
        return self.policies(1)[0]

    def policies(self, n: int) -> List[Any]:
        """``n`` policy instances (lockstep rollouts need one each; each has its own generators)."""
        while len(self._policies) < n:
            self._policies.append(make_policy(self.policy_name, **self.policy_options))
        return self._policies[:n]

    def check_names(self, tasks: Sequence[str], conditions: Sequence[str]) -> None:
        """Raise UnknownNameError (listing valid names), PolicyOptionError or BackendUnavailable before anything runs."""
        check_policy_options(self.policy_name, self.policy_options)
        for task in tasks:
            self.backend.task(task)
        for cond in conditions:
            specs.parse_condition(cond, self.protocol)
        # a backend whose simulator or assets may be missing says so here, not in every rollout's record
        check = getattr(self.backend, "check_available", None)
        if check is not None:
            check()

    def stage_spec(self, task: str) -> specs.StageSpec:
        return specs.load_stage_spec(self.backend_name, task)

    def env(self, task: str):
        """The live environment of ``task``, reused across rollouts."""
        return self.envs(task, 1)[0]

    def envs(self, task: str, n: int) -> List[Any]:
        """``n`` live environments of ``task``; switching tasks closes the previous task's."""
        for other in [t for t in self._envs if t != task]:
            for env in self._envs.pop(other):
                env.close()
        live = self._envs.setdefault(task, [])
        while len(live) < n:
            live.append(self.backend.make(task, render_profile=self.render_profile))
        return live[:n]

    def manifest(self, tasks: Sequence[str]) -> Dict[str, Any]:
        return {
            "spec_hash": self.protocol.spec_hash,
            "spec_files": dict(self.protocol.file_hashes),
            "study_seed": self.protocol.study_seed,
            "backend": self.backend_name,
            "env_config": self.backend.config(),
            "policy": self.policy.identity(),
            "policy_options": self.policy_options,
            "stage_spec_hashes": {t: self.stage_spec(t).content_hash for t in tasks},
            "versions": package_versions(self.backend.versions()),
            "render_profile": self.render_profile,
            "seed_rule": SEED_RULE,
            "command": " ".join(sys.argv),
        }

    def run_key(self, key: RolloutKey) -> Record:
        return self.run_keys([key])[0]

    def run_keys(self, keys: Sequence[RolloutKey]) -> List[Record]:
        """Run keys of one task: alone, or in lockstep with one batched policy call per decision point."""
        task = keys[0].task
        envs, spec = self.envs(task, len(keys)), self.stage_spec(task)
        if len(keys) == 1:
            records = [run_rollout(envs[0], self.policy, keys[0], self.protocol, spec, self.backend_name)]
        else:
            records = run_lockstep(envs, self.policies(len(keys)), keys, self.protocol, spec, self.backend_name)
        for record in records:
            record.renderer = self._renderer_summary(envs[0])
        return records

    def _renderer_summary(self, env) -> str:
        if not hasattr(self, "_renderer"):
            info = env.renderer_info()
            self._renderer = f"{info.get('MUJOCO_GL')}/{info.get('gl_renderer')}/{info.get('render_profile')}"
            self.renderer_info = info
        return self._renderer

    def close(self) -> None:
        for envs in self._envs.values():
            for env in envs:
                env.close()
        self._envs.clear()
        for policy in self._policies:
            policy.close()
        self._policies.clear()


def pending_keys(store: RunStore, keys: Sequence[RolloutKey], retry_errors: bool = False) -> List[RolloutKey]:
    """Keys without a record; with ``retry_errors`` also keys whose record is invalid."""
    done = store.recorded_keys()
    return [k for k in keys if k not in done or (retry_errors and not done[k])]


def parse_shard(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """``'2/8'`` -> (2, 8): the third of eight slices (0-based index i of n)."""
    if not text:
        return None
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise BadInput(f"--shard must look like i/n (e.g. 0/4), got {text!r}") from None
    if not 0 <= i < n:
        raise BadInput(f"--shard {text}: need 0 <= i < n")
    return i, n


def shard_keys(keys: Sequence[RolloutKey], shard: Optional[Tuple[int, int]]) -> List[RolloutKey]:
    """A disjoint, deterministic slice: base episodes (all their conditions together) dealt round-robin."""
    if shard is None:
        return list(keys)
    i, n = shard
    groups = sorted({(k.phase, k.task, k.episode, k.replicate) for k in keys})
    mine = {g for j, g in enumerate(groups) if j % n == i}
    return [k for k in keys if (k.phase, k.task, k.episode, k.replicate) in mine]


@dataclass


class Execution:
    """Where and how rollouts run; recorded per command in ``commands.jsonl``."""

    executor: str = "local"
    workers: Optional[int] = None  # default: one per core
    address: Optional[str] = None  # Ray cluster address
    threads: Optional[int] = None  # per worker; default: cores / workers
    batch: int = 1  # rollouts of one base episode a worker steps in lockstep (one policy call per step for all)

    def resolved(self) -> "Execution":
        import os

        from robocasa_shift.study.executors import default_threads

        workers = self.workers or os.cpu_count() or 1
        return Execution(self.executor, workers, self.address, self.threads or default_threads(workers), self.batch)


class RunSession:
    """One command's hold on a run directory: lock, manifest, plan, executor, single writer."""

    def __init__(self, run_dir: Path | str, study: Study, tasks: Sequence[str], execution: Execution = Execution(),
                 progress: bool = True):
        self.store = RunStore(run_dir)
        self.study, self.tasks, self.progress = study, list(tasks), progress
        self.execution = execution.resolved()
        self._executor = None

    def __enter__(self) -> "RunSession":
        self.store.lock()
        try:
            self.store.ensure_manifest(self.study.manifest(self.tasks))
            self.store.note_execution(dict(self.execution.__dict__))
            self.store.log_command({"execution": self.execution.__dict__})
        except BaseException:
            self.store.unlock()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._executor is not None:
                self._executor.close()
            self.study.close()
        finally:
            self.store.unlock()

    def executor(self):
        if self._executor is None:
            from robocasa_shift.study.executors import WorkerConfig, make_executor

            config = WorkerConfig(self.study.backend_name, self.study.policy_name, self.study.render_profile,
                                  self.execution.threads, self.study.policy_options, self.execution.batch)
            self._executor = make_executor(self.execution.executor, config, self.execution.workers, self.execution.address)
        return self._executor

    def execute(self, keys: Sequence[RolloutKey], retry_errors: bool = False, desc: str = "rollouts") -> Dict[str, Any]:
        """Plan ``keys``, run the ones not yet recorded, write each record as it arrives."""
        from robocasa_shift.study.executors import as_record, group_by_task

        add_to_plan(self.store.root, list(keys))
        todo = group_by_task(pending_keys(self.store, keys, retry_errors))
        failures = invalid = 0
        renderer_written = False
        bar = _progress(len(todo), self.progress, desc)
        try:
            for result in self.executor().map(todo):
                record = as_record(result)
                if retry_errors:
                    self.store.supersede(record.key)
                self.store.write(record)
                if not renderer_written and result.get("renderer_info"):
                    self.store.ensure_manifest({"renderer": result["renderer_info"]})
                    renderer_written = True
                failures += int(record.valid and not record.success)
                invalid += int(not record.valid)
                bar.set_postfix(failures=failures, invalid=invalid, refresh=False)
                bar.update(1)
        finally:
            bar.close()
        return {"planned": len(keys), "ran": len(todo), "skipped": len(keys) - len(todo), "failures": failures,
                "invalid": invalid}


def run(
    run_dir: Path | str,
    tasks: Sequence[str],
    conditions: Sequence[str],
    episodes: Iterable[int],
    policy: str = "expert",
    backend: str = "robosuite",
    phase: str = "formal",
    replicates: Sequence[int] = (0,),
    retry_errors: bool = False,
    render_profile: str = "fast",
    progress: bool = True,
    execution: Execution = Execution(),
    shard: Optional[Tuple[int, int]] = None,
    policy_options: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Run every key not yet recorded in ``run_dir``; return a summary of what was done."""
    study = Study(backend_name=backend, policy_name=policy, render_profile=render_profile,
                  policy_options=dict(policy_options or {}))
    study.check_names(tasks, conditions)
    keys = shard_keys(plan_keys(tasks, episodes, conditions, phase=phase, replicates=replicates), shard)
    with RunSession(run_dir, study, tasks, execution, progress) as session:
        return session.execute(keys, retry_errors=retry_errors)


def _progress(total: int, enabled: bool, desc: str = "rollouts"):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="rollout", disable=not enabled, dynamic_ncols=True)
