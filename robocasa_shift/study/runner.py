"""The Python API behind the CLI: plan rollout keys, run the missing ones, record them.

``run`` is one command on one run directory: it checks every name, plans the
keys, and in a :class:`RunSession` (the directory's lock, its manifest, the
executor, the one writer) runs the keys not yet recorded. What is studied and
how it is executed arrive whole, as a :class:`~robocasa_shift.config.StudyConfig`
and an :class:`~robocasa_shift.config.ExecutionConfig`.
"""

from __future__ import annotations

import platform
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Tuple

from tqdm import tqdm

from robocasa_shift.config import ExecutionConfig, StudyConfig, redact_argv
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import PolicyServerError
from robocasa_shift.rundir.store import RunStore
from robocasa_shift.study.executors import as_record, group_by_task, make_executor
from robocasa_shift.study.pairing import mark_unpaired
from robocasa_shift.study.plan import pending_keys, plan_keys, shard_keys
from robocasa_shift.study.worker import StudyCache

SEED_RULE = (
    "env seed = derive_seed(study_seed, stream=env, task, phase, episode); "
    "policy seed = derive_seed(study_seed, stream=policy, task, phase, episode, replicate); "
    "factor draw = derive_seed(study_seed, stream=<factor>, task, phase, episode); "
    "derive_seed: numpy SeedSequence(entropy=study_seed, spawn_key=sha256 words of 'name=value', sorted by name)"
)
# Consecutive rollouts failed by the policy server (records of kind policy_server) that stop a study:
# past this the server is down, and each further rollout would only wait out the client's timeout.
SERVER_FAILURES_TO_STOP = 5


def package_versions(extra: Dict[str, str]) -> Dict[str, str]:
    """Python's and this package's versions, with ``extra`` (the backend's packages) beside them."""
    try:
        own = metadata.version("robocasa-shift")
    except metadata.PackageNotFoundError:
        own = "source"
    return {"python": platform.python_version(), "robocasa-shift": own, **extra}


def study_manifest(cache: StudyCache, tasks: Sequence[str]) -> Dict[str, Any]:
    """The manifest of a run of ``cache``'s study on ``tasks``: spec hashes, seeds, versions, policy, command."""
    study = cache.config
    env_config = cache.backend.config()
    # a generated asset kit (robocasa's stand-in kitchens): named at the top, so no reader can miss it
    kit = {"asset_kit": env_config["asset_kit"]} if env_config.get("asset_kit") else {}
    return {
        **kit,
        "spec_hash": cache.protocol.spec_hash,
        "spec_files": dict(cache.protocol.file_hashes),
        "study_seed": cache.protocol.study_seed,
        "backend": study.backend,
        "env_config": env_config,
        "policy": cache.policy.identity(),
        "policy_options": study.policy_kwargs,
        "stage_spec_hashes": {t: cache.stage_spec(t).content_hash for t in tasks},
        # scene variants and the task each changes, for the report's unpaired comparison (no backend needed there)
        "task_variants": {t: cache.backend.task(t).variant_of for t in tasks if cache.backend.task(t).variant_of},
        "versions": package_versions(cache.backend.versions()),
        "render_profile": study.render_profile,
        "seed_rule": SEED_RULE,
        "command": " ".join(redact_argv(sys.argv)),
    }


class RunSession:
    """One command's hold on a run directory: lock, manifest, plan, executor, single writer.

    Constructing a session checks every name (tasks, conditions, policy options,
    the backend's availability) and touches nothing on disk; entering it builds
    the manifest (which builds the policy: a bad option or an unreachable server
    fails here, before the run directory is touched), connects the executor (a
    Ray cluster it cannot reach or use fails here too, within
    ``connect_timeout_s``), then takes the lock and writes or checks the
    manifest. A run directory this session created is removed again when
    entering fails.

    Args:
        run_dir: the run directory.
        tasks: the tasks this command may run (their stage-spec hashes go into the manifest).
        conditions: the conditions this command may run.
        study: what is studied.
        execution: how it is executed.

    Raises:
        UnknownNameError, PolicyOptionError, BackendUnavailable: from the name checks.
    """

    def __init__(self, run_dir: Path | str, tasks: Sequence[str], conditions: Sequence[str],
                 study: StudyConfig = StudyConfig(), execution: ExecutionConfig = ExecutionConfig()):
        self.store = RunStore(run_dir)
        self.study, self.execution = study, execution.resolved()
        self.tasks = list(tasks)
        self.cache = StudyCache(study)  # this process's view of the study: names, manifest (no rollouts)
        self.cache.check_names(self.tasks, conditions)
        self._executor = None

    def __enter__(self) -> "RunSession":
        manifest = study_manifest(self.cache, self.tasks)
        # an executor that reaches out (a Ray cluster) connects now: a cluster it cannot use fails the command
        # here, within its bounded time, before the run directory is created or touched
        connect = getattr(self.executor(), "connect", None)
        if connect is not None:
            try:
                connect()
            except BaseException:
                self._executor.close()
                self._executor = None
                self.cache.close()
                raise
        created = not self.store.root.exists()
        self.store.lock()
        try:
            self.store.ensure_manifest(manifest)
            self.store.note_execution(self.execution.record())
            self.store.log_command({"execution": self.execution.record()})
        except BaseException:
            self.store.unlock()
            if created:  # leave no empty or half-made run directory behind
                shutil.rmtree(self.store.root, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._executor is not None:
                self._executor.close()
            self.cache.close()
        finally:
            self.store.unlock()

    def executor(self):
        """The session's executor, started on first use."""
        if self._executor is None:
            self._executor = make_executor(self.study, self.execution)
        return self._executor

    def execute(self, keys: Sequence[RolloutKey], retry_errors: bool = False, desc: str = "rollouts") -> Dict[str, Any]:
        """Plan ``keys``, run the ones not yet recorded, write each record as it arrives.

        Returns:
            Counts: ``planned``, ``ran``, ``skipped``, ``failures`` (valid, unsuccessful), ``invalid``.

        Raises:
            PolicyServerError: :data:`SERVER_FAILURES_TO_STOP` rollouts in a row failed at the policy
                server (circuit breaker, exit 3); their records are written, the keys not yet run stay
                pending, so the same command resumes once the server is back.
        """
        self.store.add_to_plan(keys)
        # Pairing (PROTOCOL section 6): records whose fingerprints differ from their clean twin's are
        # invalid; marked before planning, so --retry-errors re-runs them now, and again after the
        # run for the pairs it completed (a mismatch that survives its retry is a determinism failure).
        mark_unpaired(self.store, keys)
        todo = group_by_task(pending_keys(self.store, keys, retry_errors))
        done = failures = invalid = server_failures = 0
        renderer_written = False
        bar = _progress(len(todo), self.execution.progress, desc)
        try:
            for result in self.executor().map(todo):
                record = as_record(result)
                if retry_errors:
                    self.store.supersede(record.key)
                self.store.write(record, result.get("step_log"), result.get("frame_log"))
                if not renderer_written and result.get("renderer_info"):
                    # what drew the frames and what ran of the simulator's shortcuts, as the first worker saw them
                    self.store.ensure_manifest({"renderer": result["renderer_info"],
                                                "simulator": result.get("simulator_info") or {}})
                    renderer_written = True
                done += 1
                failures += int(record.valid and not record.success)
                invalid += int(not record.valid)
                server_failures = server_failures + 1 if record.error_kind == "policy_server" else 0
                if server_failures >= SERVER_FAILURES_TO_STOP:
                    last = (record.error or "").partition("\n")[0]
                    raise PolicyServerError(
                        f"the policy server failed {server_failures} rollouts in a row; stopped the study after "
                        f"{done} of {len(todo)} rollouts. Last error: {last}\n"
                        f"The {len(todo) - done} rollouts not run stay pending: once the server is back, rerun the "
                        f"same command (add --retry-errors to redo the {server_failures} failed ones).")
                bar.set_postfix(failures=failures, invalid=invalid, refresh=False)
                bar.update(1)
        finally:
            bar.close()
            ran = set(todo)
            unpaired = [r for r in mark_unpaired(self.store, keys) if r.key in ran]
        # rollouts of this command that ran valid and turned invalid once compared with their clean twin
        invalid += len(unpaired)
        failures -= sum(not r.success for r in unpaired)
        return {"planned": len(keys), "ran": len(todo), "skipped": len(keys) - len(todo), "failures": failures,
                "invalid": invalid}


def run(
    run_dir: Path | str,
    tasks: Sequence[str],
    conditions: Sequence[str],
    episodes: Iterable[int],
    study: StudyConfig = StudyConfig(),
    execution: ExecutionConfig = ExecutionConfig(),
    phase: str = "formal",
    replicates: Sequence[int] = (0,),
    retry_errors: bool = False,
    shard: Optional[Tuple[int, int]] = None,
    force: bool = False,
) -> Dict[str, Any]:
    """Run every key of tasks x episodes x replicates x conditions not yet recorded in ``run_dir``.

    Args:
        run_dir: the run directory (created on first use; rerunning skips keys already recorded).
        tasks, conditions, episodes: what to run; ``phase`` and ``replicates`` pick the seed streams.
        study: what is studied (backend, policy and its options, render profile).
        execution: how it is executed (executor, workers, threads, batch, progress bar).
        retry_errors: re-run keys whose record is invalid (the old record goes to ``history/``), except
            determinism failures (a fingerprint mismatch with the clean twin that survived its retry).
        shard: ``(i, n)``: only the i-th of n disjoint slices of the keys (see ``plan.shard_keys``).
        force: plan more than ``plan.MAX_KEYS`` keys.

    Returns:
        Counts: ``planned``, ``ran``, ``skipped``, ``failures``, ``invalid``.
    """
    keys = shard_keys(plan_keys(tasks, episodes, conditions, phase=phase, replicates=replicates, force=force), shard)
    with RunSession(run_dir, tasks, conditions, study, execution) as session:
        return session.execute(keys, retry_errors=retry_errors)


def _progress(total: int, enabled: bool, desc: str = "rollouts") -> tqdm:
    return tqdm(total=total, desc=desc, unit="rollout", disable=not enabled, dynamic_ncols=True)


def progress_iter(results: Iterable[Any], total: int, desc: str, enabled: bool = True) -> Iterator[Any]:
    """``results`` passed through, with a progress bar (ETA) of ``total`` units."""
    bar = tqdm(total=total, desc=desc, unit="unit", dynamic_ncols=True, disable=not enabled or total == 0)
    try:
        for result in results:
            yield result
            bar.update(1)
    finally:
        bar.close()


__all__ = ["RunSession", "SEED_RULE", "SERVER_FAILURES_TO_STOP", "package_versions", "progress_iter", "run", "study_manifest"]
