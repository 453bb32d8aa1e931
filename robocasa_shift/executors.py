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

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence

from .records import Record, RolloutKey
from .registry import Registry

EXECUTORS: Registry[type] = Registry("executor", "robocasa_shift.executors")
THREAD_VARIABLES = ("LP_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to build its own Study: plain data, so it pickles."""

    backend: str
    policy: str
    render_profile: str = "fast"
    threads: int = 1
    policy_options: Optional[Dict[str, Any]] = None


def default_threads(workers: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def apply_threads(threads: int) -> None:
    """Thread counts for the renderer (llvmpipe) and torch; must run before either starts."""
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    try:
        import torch

        torch.set_num_threads(threads)
    except ImportError:
        pass


class _Worker:
    """A Study living in one process; its environment is reused across keys of the same task."""

    def __init__(self, config: WorkerConfig):
        apply_threads(config.threads)
        from .study import Study

        self.parent = os.getppid()
        self.study = Study(config.backend, config.policy, config.render_profile, dict(config.policy_options or {}))

    def run(self, key: RolloutKey) -> Dict[str, Any]:
        record = self.study.run_key(key)
        return {"record": record.to_json(), "renderer_info": getattr(self.study, "renderer_info", None), "pid": os.getpid()}


_WORKER: Optional[_Worker] = None


def _init_worker(config: WorkerConfig) -> None:
    global _WORKER
    _WORKER = _Worker(config)


def _run_in_worker(key: RolloutKey) -> Dict[str, Any]:
    if os.getppid() != _WORKER.parent:  # the writer died: stop instead of computing for nobody
        os._exit(0)
    return _WORKER.run(key)


class LocalExecutor:
    """Runs keys in a spawn-context process pool (or in this process when ``workers == 1``)."""

    name = "local"

    def __init__(self, config: WorkerConfig, workers: int = 2, address: Optional[str] = None):
        self.config, self.workers = config, max(1, int(workers))
        self._pool = None
        self._inline: Optional[_Worker] = None

    def map(self, keys: Sequence[RolloutKey]) -> Iterator[Dict[str, Any]]:
        if not keys:
            return
        if self.workers == 1:
            if self._inline is None:
                apply_threads(self.config.threads)
                self._inline = _Worker(self.config)
                self._inline.parent = os.getppid()
            for key in keys:
                yield self._inline.run(key)
            return
        if self._pool is None:
            import multiprocessing as mp

            self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_init_worker, initargs=(self.config,))
        # chunksize 1: a worker takes the next key only when done, so tasks stay grouped per worker
        yield from self._pool.imap_unordered(_run_in_worker, list(keys), chunksize=1)

    def describe(self) -> Dict[str, Any]:
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.config.threads}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        if self._inline is not None:
            self._inline.study.close()
            self._inline = None


EXECUTORS.register("local", LocalExecutor)
EXECUTORS.register("ray", "robocasa_shift.ray_executor:RayExecutor")


def make_executor(name: str, config: WorkerConfig, workers: int, address: Optional[str] = None):
    return EXECUTORS.get(name)(config, workers=workers, address=address)


def as_record(result: Dict[str, Any]) -> Record:
    return Record.from_json(result["record"])


def group_by_task(keys: Sequence[RolloutKey]) -> List[RolloutKey]:
    """Keys ordered so each task's rollouts are contiguous (first-appearance order of tasks)."""
    order = {t: i for i, t in enumerate(dict.fromkeys(k.task for k in keys))}
    return sorted(keys, key=lambda k: (order[k.task], k.phase, k.episode, k.replicate))


__all__ = ["EXECUTORS", "LocalExecutor", "WorkerConfig", "apply_threads", "as_record", "default_threads",
           "group_by_task", "make_executor"]
