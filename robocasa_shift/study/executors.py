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

from robocasa_shift.engine.records import Record, RolloutKey
from robocasa_shift.registry import Registry

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
    batch: int = 1


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
        from robocasa_shift.study.runner import Study

        self.parent = os.getppid()
        self.study = Study(config.backend, config.policy, config.render_profile, dict(config.policy_options or {}))

    def run(self, keys: Sequence[RolloutKey]) -> List[Dict[str, Any]]:
        """Run one lockstep group (see ``lockstep_groups``); one result per key."""
        records = self.study.run_keys(keys)
        info, rss = getattr(self.study, "renderer_info", None), peak_rss_mb()
        return [{"record": r.to_json(), "renderer_info": info, "pid": os.getpid(), "rss_mb": rss} for r in records]


def peak_rss_mb() -> float:
    """This process's peak resident memory. ``VmHWM``, not ``ru_maxrss``: a spawned worker's
    ``ru_maxrss`` keeps its parent's peak across ``exec``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


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


_WORKER: Optional[_Worker] = None


def _init_worker(config: WorkerConfig) -> None:
    global _WORKER
    _WORKER = _Worker(config)


def _run_in_worker(keys: Sequence[RolloutKey]) -> List[Dict[str, Any]]:
    if os.getppid() != _WORKER.parent:  # the writer died: stop instead of computing for nobody
        os._exit(0)
    return _WORKER.run(keys)


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
            for group in lockstep_groups(keys, self.config.batch):
                yield from self._inline.run(group)
            return
        if self._pool is None:
            import multiprocessing as mp

            self._pool = mp.get_context("spawn").Pool(self.workers, initializer=_init_worker, initargs=(self.config,))
        # chunksize 1: a worker takes the next group only when done, so tasks stay grouped per worker
        for results in self._pool.imap_unordered(_run_in_worker, lockstep_groups(keys, self.config.batch), chunksize=1):
            yield from results

    def describe(self) -> Dict[str, Any]:
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.config.threads,
                "batch": self.config.batch}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
        if self._inline is not None:
            self._inline.study.close()
            self._inline = None


EXECUTORS.register("local", LocalExecutor)
EXECUTORS.register("ray", "robocasa_shift.study.ray_executor:RayExecutor")


def make_executor(name: str, config: WorkerConfig, workers: int, address: Optional[str] = None):
    return EXECUTORS.get(name)(config, workers=workers, address=address)


def as_record(result: Dict[str, Any]) -> Record:
    return Record.from_json(result["record"])


def group_by_task(keys: Sequence[RolloutKey]) -> List[RolloutKey]:
    """Keys ordered so each task's rollouts are contiguous (first-appearance order of tasks)."""
    order = {t: i for i, t in enumerate(dict.fromkeys(k.task for k in keys))}
    return sorted(keys, key=lambda k: (order[k.task], k.phase, k.episode, k.replicate))


__all__ = ["EXECUTORS", "LocalExecutor", "WorkerConfig", "apply_threads", "as_record", "default_threads",
           "group_by_task", "lockstep_groups", "make_executor", "peak_rss_mb"]
