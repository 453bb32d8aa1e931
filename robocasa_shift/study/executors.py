"""Executors: where rollouts run. The caller is the one writer of the run directory.

- ``local`` (default): a process pool, one worker per core; each worker keeps
  one live environment and reuses it across rollouts of the same task (keys
  arrive grouped by task).
- ``ray``: the same rollouts as tasks of actors on an existing Ray cluster
  (``address``), or on a local Ray instance started for the run.

A rollout's record depends only on its key, never on the worker that ran it.
Workers are single-threaded by default when there are several of them, so
the software renderer and torch do not oversubscribe the cores.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import Any, Dict, Iterator, List, Optional, Sequence

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.registry import Registry
from robocasa_shift.study.worker import Worker, init_worker, run_in_worker

EXECUTORS: Registry[type] = Registry("executor", "robocasa_shift.executors")


def lockstep_groups(keys: Sequence[RolloutKey], batch: int) -> List[List[RolloutKey]]:
    """Task-grouped keys cut into groups of at most ``batch`` that share (task, phase, episode, replicate):
    the conditions of one base episode, which a worker can step side by side."""
    groups: List[List[RolloutKey]] = []
    for key in group_by_task(keys):
        last = groups[-1] if groups else None
        same = last and len(last) < batch and (last[0].task, last[0].phase, last[0].episode, last[0].replicate) == (
            key.task, key.phase, key.episode, key.replicate)
        if same:
            last.append(key)
        else:
            groups.append([key])
    return groups


class LocalExecutor:
    """Runs keys in a spawn-context process pool (or in this process when there is one worker).

    Args:
        study: what each worker builds.
        execution: resolved execution settings (workers, threads per worker, batch).
    """

    name = "local"

    def __init__(self, study: StudyConfig, execution: ExecutionConfig):
        self.study, self.execution = study, execution.resolved()
        self.workers = self.execution.workers
        self._pool = None
        self._inline: Optional[Worker] = None

    def map(self, keys: Sequence[RolloutKey]) -> Iterator[Dict[str, Any]]:
        """Run ``keys`` (task-grouped), yielding one result per key as it completes."""
        if not keys:
            return
        groups = lockstep_groups(keys, self.execution.batch)
        if self.workers == 1:
            if self._inline is None:
                self._inline = Worker(self.study, self.execution.threads)
            for group in groups:
                yield from self._inline.run(group)
            return
        if self._pool is None:
            self._pool = mp.get_context("spawn").Pool(self.workers, initializer=init_worker,
                                                      initargs=(self.study, self.execution.threads))
        # chunksize 1: a worker takes the next group only when done, so tasks stay grouped per worker
        for results in self._pool.imap_unordered(run_in_worker, groups, chunksize=1):
            yield from results

    def describe(self) -> Dict[str, Any]:
        """The executor's settings, for logs."""
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.execution.threads,
                "batch": self.execution.batch}

    def close(self) -> None:
        """Stop the pool (or close the in-process worker)."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        if self._inline is not None:
            self._inline.close()
            self._inline = None


EXECUTORS.register("local", LocalExecutor)
EXECUTORS.register("ray", "robocasa_shift.study.ray_executor:RayExecutor")


def make_executor(study: StudyConfig, execution: ExecutionConfig):
    """The executor registered as ``execution.executor``, built from the two configs.

    Raises:
        UnknownNameError: no executor of that name (the message lists the registered ones).
    """
    return EXECUTORS.get(execution.executor)(study, execution)


def as_record(result: Dict[str, Any]) -> Record:
    """The record inside a worker's result."""
    return Record.from_json(result["record"])


def group_by_task(keys: Sequence[RolloutKey]) -> List[RolloutKey]:
    """Keys ordered so each task's rollouts are contiguous (first-appearance order of tasks)."""
    order = {t: i for i, t in enumerate(dict.fromkeys(k.task for k in keys))}
    return sorted(keys, key=lambda k: (order[k.task], k.phase, k.episode, k.replicate))


__all__ = ["EXECUTORS", "LocalExecutor", "as_record", "group_by_task", "lockstep_groups", "make_executor"]
