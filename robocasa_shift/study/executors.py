"""Executors: where rollouts run. The caller is the one writer of the run directory.

- ``local`` (default): supervised worker processes, one per core; each worker
  keeps one live environment and reuses it across rollouts of the same task
  (keys arrive grouped by task). With one worker the rollouts run in the
  caller's process instead (no isolation: a crash there ends the command,
  which a rerun resumes).
- ``ray``: the same rollouts as tasks of actors on an existing Ray cluster
  (``address``), or on a local Ray instance started for the run.

A rollout's record depends only on its key, never on the worker that ran it.
Workers are single-threaded by default when there are several of them, so
the software renderer and torch do not oversubscribe the cores.

Faults: a worker process that dies (segfault, OOM kill) while it holds a
lockstep group leaves one invalid record of kind ``worker_crash`` per key of
the group; one that shows no progress within ``rollout_timeout_s`` per key of
its group is killed and leaves ``worker_timeout`` records. Either way a fresh
worker takes its place and the study goes on; ``--retry-errors`` re-runs
those keys. A worker that cannot be built (its initialisation raises or it
dies before it is ready) fails the command once, with its error: it is never
respawned.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import signal
import threading
import time
from collections import deque
from multiprocessing.connection import wait as wait_for
from typing import Any, Dict, Iterator, List, Optional, Sequence

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.errors import Error
from robocasa_shift.registry import Registry
from robocasa_shift.study.worker import RolloutGroup, Worker, serve

EXECUTORS: Registry[type] = Registry("executor", "robocasa_shift.executors")
# A worker gets at least this long to start (imports, simulator), however short the rollout timeout:
# a loaded machine must not turn a slow start into a failed command.
WORKER_START_MIN_S = 300.0


def start_limit_s(execution: ExecutionConfig) -> float:
    """How long a new worker may take to be ready: the rollout timeout, at least :data:`WORKER_START_MIN_S`."""
    return max(execution.rollout_timeout_s, WORKER_START_MIN_S)


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


class WorkerStartError(Error):
    """A worker process that could not be built or died before it was ready; never respawned."""


def describe_exit(exitcode: Optional[int]) -> str:
    """How a process ended, in words (``killed by SIGKILL``, ``exit status 3``)."""
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit status {exitcode}"


@contextlib.contextmanager
def sigint_ignored() -> Iterator[None]:
    """Processes started inside are born ignoring SIGINT (an ignored signal stays ignored across exec).

    Ctrl-C reaches the terminal's whole process group; only the supervisor should answer it, stopping its
    workers, so the command ends with one line and exit status 130 instead of a traceback per worker.
    """
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _Slot:
    """One supervised worker process: its pipe, the group it holds and when that group is overdue."""

    def __init__(self, ctx, study: StudyConfig, threads: int):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(child, study, threads), daemon=True,
                                   name="robocasa-shift-worker")
        with sigint_ignored():
            self.process.start()
        child.close()  # only the worker holds its end: a dead worker reads as end-of-file here
        self.started = time.monotonic()
        self.ready = False
        self.job = None  # the job it holds
        self.deadline = float("inf")

    def give(self, job, seconds_per_rollout: float) -> bool:
        """Hand ``job`` to the worker; False when it died before it could take it (the job was not run)."""
        try:
            self.conn.send(job)
        except OSError:
            return False
        self.job = job
        self.deadline = time.monotonic() + seconds_per_rollout * job.size
        return True

    def take(self):
        """The job this worker held, which it no longer holds."""
        group, self.job, self.deadline = self.job, None, float("inf")
        return group

    def stop(self, grace_s: float = 5.0) -> None:
        """Ask the worker to finish (it closes its environments); kill it if it does not within ``grace_s``."""
        if self.process.is_alive() and self.job is None:
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(grace_s)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.conn.close()


class LocalExecutor:
    """Runs keys in supervised spawn-context worker processes (or in this process when there is one worker).

    Each worker process takes one lockstep group at a time over its own pipe; the executor
    watches every pipe and every process sentinel, so a dead or hung worker is noticed, its
    keys recorded as invalid and the worker replaced (see the module docstring).

    Args:
        study: what each worker builds.
        execution: resolved execution settings (workers, threads per worker, batch, rollout timeout).
    """

    name = "local"

    def __init__(self, study: StudyConfig, execution: ExecutionConfig):
        self.study, self.execution = study, execution.resolved()
        self.workers = self.execution.workers
        # one worker runs in this process unless a caller asks for isolation (branching's restores)
        self.inline = self.workers == 1
        self._ctx = mp.get_context("spawn")
        self._slots: List[_Slot] = []
        self._inline: Optional[Worker] = None
        self._protocol: Optional[specs.Protocol] = None

    def map(self, keys: Sequence[RolloutKey]) -> Iterator[Dict[str, Any]]:
        """Run ``keys`` (task-grouped), yielding one result per key as it completes.

        Raises:
            Error: a worker could not be built, or a group raised an error of the harness (no
                record could be made for it), re-raised here with its message and exit status.
        """
        yield from self.run_jobs([RolloutGroup(g) for g in lockstep_groups(keys, self.execution.batch)])

    def run_jobs(self, jobs: Sequence[Any]) -> Iterator[Dict[str, Any]]:
        """Run jobs (see ``worker.RolloutGroup``), yielding their results as they complete."""
        if not jobs:
            return
        if self.inline:
            if self._inline is None:
                self._inline = Worker(self.study, self.execution.threads)
            for job in jobs:
                yield from self._inline.run(job)
            return
        yield from self._supervise(deque(jobs))

    def _supervise(self, queue: deque) -> Iterator[Dict[str, Any]]:
        """Deal ``queue``'s groups to the worker processes; record and replace dead or hung ones."""
        limit, start_limit = self.execution.rollout_timeout_s, start_limit_s(self.execution)
        while len(self._slots) < self.workers:
            self._slots.append(self._spawn())
        while queue or any(slot.job is not None for slot in self._slots):
            for slot in self._slots:
                if slot.ready and slot.job is None and queue:
                    group = queue.popleft()
                    if not slot.give(group, limit):
                        queue.appendleft(group)  # the worker just died: its replacement takes the group
            now = time.monotonic()
            due = [s.deadline for s in self._slots] + [s.started + start_limit for s in self._slots if not s.ready]
            wait_for([s.conn for s in self._slots] + [s.process.sentinel for s in self._slots],
                     timeout=max(0.0, min(due) - now) if due and min(due) < float("inf") else None)
            for i, slot in enumerate(self._slots):
                # messages first: a worker may have answered just before it died
                yield from self._receive(slot)
                if not slot.process.is_alive():
                    slot.process.join()
                    if not slot.ready:
                        raise WorkerStartError(f"a worker process died before it was ready "
                                               f"({describe_exit(slot.process.exitcode)}); see its output above")
                    if slot.job is not None:
                        message = (f"the worker process (pid {slot.process.pid}) running this rollout died: "
                                   f"{describe_exit(slot.process.exitcode)}")
                        yield from self._unrun(slot.take(), "worker_crash", message)
                    slot.stop()
                    self._slots[i] = self._spawn()
                elif slot.job is not None and time.monotonic() > slot.deadline:
                    group = slot.take()
                    slot.process.kill()
                    message = (f"the worker process (pid {slot.process.pid}) made no progress on its "
                               f"{group.size} rollout(s) within {limit:g} s per rollout (rollout_timeout_s): killed")
                    slot.stop()
                    self._slots[i] = self._spawn()
                    yield from self._unrun(group, "worker_timeout", message)
                elif not slot.ready and time.monotonic() > slot.started + start_limit:
                    slot.process.kill()
                    slot.stop()
                    raise WorkerStartError(f"a worker process was not ready within {start_limit:g} s: killed")

    def _receive(self, slot: _Slot) -> Iterator[Dict[str, Any]]:
        """Handle every message waiting on ``slot``'s pipe."""
        while True:
            try:
                if not slot.conn.poll():
                    return
                kind, payload = slot.conn.recv()
            except (EOFError, OSError):  # the worker is gone; the caller sees it in its sentinel
                return
            if kind == "ready":
                slot.ready = True
            elif kind == "results":
                slot.take()
                yield from payload
            elif kind in ("init_error", "error"):
                raise payload

    def _spawn(self) -> _Slot:
        """A fresh worker process (it answers "ready" once built)."""
        return _Slot(self._ctx, self.study, self.execution.threads)

    def _unrun(self, job, kind: str, message: str) -> List[Dict[str, Any]]:
        """The results of ``kind`` that stand for a job a worker took and never finished."""
        if self._protocol is None:
            self._protocol = specs.load_protocol(verify=True)
        return job.unrun(self.study, kind, message, self._protocol)

    def describe(self) -> Dict[str, Any]:
        """The executor's settings, for logs."""
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.execution.threads,
                "batch": self.execution.batch, "rollout_timeout_s": self.execution.rollout_timeout_s}

    def close(self) -> None:
        """Stop the worker processes (or close the in-process worker)."""
        slots, self._slots = self._slots, []
        for slot in slots:
            slot.stop()
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


__all__ = ["EXECUTORS", "LocalExecutor", "WORKER_START_MIN_S", "WorkerStartError", "as_record", "describe_exit", "group_by_task",
           "lockstep_groups", "make_executor", "start_limit_s"]
