"""The Ray executor: the same rollouts as the local executor, on a Ray cluster.

Each Ray actor holds one worker (one study cache, one live environment reused
across keys of a task); keys are dealt to actors in task-grouped order and
results stream back to the caller, the one writer of the run directory.
Without an address a local Ray instance is started for the run.

Faults, as Ray 2.x behaves and as this executor uses it: actors are created
with ``max_restarts=0`` and ``max_task_retries=0`` (Ray's defaults for actors,
set explicitly; Ray's automatic retries, ``max_retries=3``, apply to plain
tasks, not to actor methods). When an actor's process dies (segfault, OOM
kill) the rollout group it was running fails with ``ActorDiedError`` and Ray
neither restarts the actor nor retries the group: a rollout that crashed its
process would most likely crash again, and an at-least-once retry could run a
rollout twice. This executor records one invalid record of kind
``worker_crash`` per key of that group, replaces the dead actor with a fresh
one and goes on, exactly as the local executor does; a group that shows no
progress within ``rollout_timeout_s`` per key has its actor killed and leaves
``worker_timeout`` records. An actor whose construction raises (its creation
task fails) fails the command once, with the error; it is not replaced.

Secrets: a secret policy option given as ``env:NAME`` is resolved here, in the
caller, and travels to the actors in memory as a constructor argument (a
remote cluster's processes do not see the caller's environment). Ray pickles
what it ships, both ways: run the Ray executor only on a cluster you trust.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

from robocasa_shift import specs
from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.errors import BackendUnavailable, Error
from robocasa_shift.policies import resolve_secret_options
from robocasa_shift.study.executors import WorkerStartError, lockstep_groups, start_limit_s
from robocasa_shift.study.worker import RolloutGroup, Worker, WorkerError


def _first_words(text: str, limit: int = 300) -> str:
    """Ray's messages run to many lines; a record's error keeps the start of it on one line."""
    return " ".join(str(text).split())[:limit]


class RayExecutor:
    """Runs keys on Ray actors, one :class:`~robocasa_shift.study.worker.Worker` each.

    Args:
        study: what each worker builds.
        execution: resolved execution settings (workers, threads per worker, batch, cluster address,
            rollout timeout).

    Raises:
        BackendUnavailable: Ray is not installed.
    """

    name = "ray"

    def __init__(self, study: StudyConfig, execution: ExecutionConfig):
        try:
            import ray  # optional and heavy: only the ray executor needs it
        except ImportError:
            raise BackendUnavailable("the ray executor needs Ray: pip install 'ray>=2.40'") from None
        self.execution = execution.resolved()
        self.ray, self.study = ray, study
        self.workers, self.address = self.execution.workers, self.execution.address
        self._actors: List[Any] = []
        self._actor_class = None
        self._started_here = False
        self._protocol: Optional[specs.Protocol] = None

    def _ensure(self):
        """Connect to (or start) Ray and build the actors, once."""
        ray = self.ray
        if not ray.is_initialized():
            # the workers must import this package: ship the checkout's root on the path
            root = str(Path(__file__).resolve().parents[2])
            env = {"env_vars": {"PYTHONPATH": root, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}}
            if self.address:
                ray.init(address=self.address, runtime_env=env, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, runtime_env=env, log_to_driver=False, include_dashboard=False)
                self._started_here = True
        if self._actor_class is None:
            # a crashed rollout is recorded, never restarted or retried (see the module docstring)
            self._actor_class = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(Worker)
        if not self._actors:
            self._actors = self._start(self.workers)

    def _start(self, n: int) -> List[Any]:
        """``n`` new actors, once every one of them is built.

        Raises:
            WorkerStartError: an actor's construction raised, or it was not ready in time (``start_limit_s``).
        """
        ray = self.ray
        study = replace(self.study, policy_options=tuple(resolve_secret_options(self.study.policy_kwargs).items()))
        actors = [self._actor_class.remote(study, self.execution.threads) for _ in range(n)]
        limit = start_limit_s(self.execution)
        try:
            ray.get([a.ready.remote() for a in actors], timeout=limit)
        except ray.exceptions.RayActorError as exc:
            self._kill(actors)
            raise WorkerStartError(f"a Ray worker could not be built: {exc.error_msg}") from None
        except ray.exceptions.GetTimeoutError:
            self._kill(actors)
            raise WorkerStartError(f"a Ray worker was not ready within {limit:g} s") from None
        return actors

    def _kill(self, actors: Sequence[Any]) -> None:
        """Kill ``actors`` for good (no restart); dead ones are skipped."""
        for actor in actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already dead: nothing to stop
                pass

    def _replace(self, index: int) -> None:
        """Kill actor ``index`` (dead or hung) and put a fresh, ready one in its place."""
        self._kill([self._actors[index]])
        self._actors[index] = self._start(1)[0]

    def _unrun(self, job, kind: str, message: str) -> List[Dict[str, Any]]:
        """The results of ``kind`` that stand for a job an actor took and never finished."""
        if self._protocol is None:
            self._protocol = specs.load_protocol(verify=True)
        return job.unrun(self.study, kind, message, self._protocol)

    def map(self, keys: Sequence[RolloutKey]) -> Iterator[Dict[str, Any]]:
        """Run ``keys`` (task-grouped), yielding one result per key as it completes.

        Raises:
            Error: an actor could not be built, or a group raised an error of the harness.
        """
        yield from self.run_jobs([RolloutGroup(g) for g in lockstep_groups(keys, self.execution.batch)])

    def run_jobs(self, jobs: Sequence[Any]) -> Iterator[Dict[str, Any]]:
        """Run jobs (see ``worker.RolloutGroup``) on the actors, yielding their results as they complete."""
        if not jobs:
            return
        self._ensure()
        ray = self.ray
        limit = self.execution.rollout_timeout_s
        pending: Dict[Any, tuple] = {}  # ref -> (actor index, group, deadline)
        queue = deque(jobs)
        idle = list(range(len(self._actors)))
        while queue or pending:
            while idle and queue:
                index, group = idle.pop(0), queue.popleft()
                ref = self._actors[index].run.remote(group)
                pending[ref] = (index, group, time.monotonic() + limit * group.size)
            timeout = max(0.0, min(d for _, _, d in pending.values()) - time.monotonic())
            done, _ = ray.wait(list(pending), num_returns=1, timeout=timeout)
            for ref in done:
                index, group, _ = pending.pop(ref)
                try:
                    results = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    if exc.actor_init_failed:
                        raise WorkerStartError(f"a Ray worker could not be built: {exc.error_msg}") from None
                    self._replace(index)
                    idle.append(index)
                    yield from self._unrun(group, "worker_crash",
                                           f"the Ray worker running this rollout died: {_first_words(exc.error_msg)}")
                    continue
                except ray.exceptions.RayTaskError as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, Error):
                        raise WorkerError(str(cause), cause.exit_code) from None
                    raise
                idle.append(index)
                yield from results
            now = time.monotonic()
            for ref, (index, group, deadline) in list(pending.items()):
                if now > deadline:
                    del pending[ref]
                    self._replace(index)
                    idle.append(index)
                    yield from self._unrun(group, "worker_timeout",
                                           f"the Ray worker made no progress on its {group.size} rollout(s) within "
                                           f"{limit:g} s per rollout (rollout_timeout_s): killed")

    def describe(self) -> Dict[str, Any]:
        """The executor's settings, for logs."""
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.execution.threads,
                "batch": self.execution.batch, "address": self.address,
                "rollout_timeout_s": self.execution.rollout_timeout_s}

    def close(self) -> None:
        """Kill the actors; shut down a Ray instance started for the run."""
        self._kill(self._actors)
        self._actors = []
        if self._started_here:
            self.ray.shutdown()
            self._started_here = False
