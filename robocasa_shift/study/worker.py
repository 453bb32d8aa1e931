"""The worker side of a study: one process's cache of live environments and policies.

:class:`StudyCache` holds what a :class:`~robocasa_shift.config.StudyConfig`
describes, made live: the verified protocol, the backend, one environment per
lockstep slot (reused across rollouts of a task; switching tasks closes the
previous task's) and one policy per slot. :class:`Worker` is a cache living in
one executor process (or Ray actor); :func:`serve` is the body of a process
supervised by the local executor (one pipe, one group of keys at a time);
``init_worker`` / ``run_in_worker`` are the process-pool plumbing around one
process-global worker (``bench`` uses them). :func:`unrun_records` builds the
invalid records of keys whose worker died or hung before it could record them.

Everything a worker is built from (a ``StudyConfig`` and a thread count) is
plain, picklable data, so a spawned or remote worker builds exactly the study
its caller described.
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
import traceback
from typing import Any, Dict, List, Optional, Sequence, Tuple

from robocasa_shift import seeding
from robocasa_shift.backends import get_backend
from robocasa_shift.config import StudyConfig, redact_options
from robocasa_shift.core import specs
from robocasa_shift.core.backend import check_hooks
from robocasa_shift.core.conditions import Condition
from robocasa_shift.core.factors import required_hooks
from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.core.framelog import DEFAULT_MAX_BYTES
from robocasa_shift.engine.frame_logger import FrameLogger
from robocasa_shift.engine.rollout import observing, run_lockstep, run_rollout
from robocasa_shift.engine.step_logger import StepLogger
from robocasa_shift.errors import Error, PolicyOptionError
from robocasa_shift.policies import (
    POLICIES,
    check_policy_options,
    make_policy,
    resolve_secret_options,
)

THREAD_VARIABLES = ("LP_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def apply_threads(threads: int) -> None:
    """Thread counts for the renderer (llvmpipe), BLAS and torch; must run before the renderer and torch start.

    torch reads ``OMP_NUM_THREADS`` when it is first imported, so a policy that imports it
    later gets the same count; only an already imported torch needs telling (a worker that
    never runs a torch policy never imports it). numpy's OpenBLAS read its variable when numpy
    was imported, long before this, so its pool is set directly: robosuite inverts 4x4 frames
    in its observables every control step, and with an idle second BLAS thread to wake each
    inverse took about 1 ms instead of 12 us (measured; README "Rendering and performance").
    The thread count of a 4x4 inverse does not change its result (OpenBLAS runs it on one thread).
    """
    from threadpoolctl import threadpool_limits

    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    threadpool_limits(threads, user_api="blas")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MiB.

    ``VmHWM``, not ``ru_maxrss``: a spawned worker's ``ru_maxrss`` keeps its
    parent's peak across ``exec``.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0, 1)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


class StudyCache:
    """A study made live in one process: protocol, backend, and the environments and policies it reuses.

    Args:
        study: what is studied (backend, policy and its options, render profile).
        protocol: the protocol its conditions mean (default: the frozen one; a sweep passes its derived one).
    """

    def __init__(self, study: StudyConfig = StudyConfig(), protocol: Optional[specs.Protocol] = None):
        self.config = study
        self.protocol = protocol or specs.load_protocol(verify=True)
        self.backend = get_backend(study.backend, asset_kit=study.asset_kit)
        self.renderer_info: Optional[Dict[str, Any]] = None
        self.simulator_info: Optional[Dict[str, Any]] = None
        self._renderer: Optional[str] = None
        self._policies: List[Any] = []
        self._envs: Dict[str, List[Any]] = {}
        # what other jobs keep for the worker's lifetime (a success judge), closed with it
        self.kept: Dict[Any, Any] = {}

    @property
    def policy(self):
        """The first policy instance (made on first use)."""
        return self.policies(1)[0]

    def policies(self, n: int) -> List[Any]:
        """``n`` policy instances (lockstep rollouts need one each; each has its own generators)."""
        while len(self._policies) < n:
            try:
                self._policies.append(make_policy(self.config.policy, **self.config.policy_kwargs))
            except Error:
                raise
            except (TypeError, ValueError) as exc:  # a constructor refusing an option's value (port=notanint)
                options = redact_options(self.config.policy_kwargs)
                raise PolicyOptionError(f"policy {self.config.policy!r} cannot be built with the options {options}: "
                                        f"{type(exc).__name__}: {exc}") from None
        return self._policies[:n]

    def check_names(self, tasks: Sequence[str], conditions: Sequence[str]) -> None:
        """Check every name before anything runs.

        Raises:
            UnknownNameError: a task or condition that does not exist (the message lists the valid ones).
            PolicyOptionError: an option the policy does not take, or actions that do not fit the backend's
                embodiment (``Policy.fixed_action_dim``).
            BackendUnavailable: the backend's simulator or assets are missing.
        """
        cls = check_policy_options(self.config.policy, self.config.policy_kwargs)
        resolve_secret_options(self.config.policy_kwargs)  # an env:NAME whose variable is unset: refused now
        for task in tasks:
            self.backend.task(task)
        for cond in conditions:
            self.protocol.condition(cond)
        # a backend whose simulator or assets may be missing says so here, not in every rollout's record
        self.backend.check_available()
        # a policy whose actions are fixed by its options (a served model's layout) must fit the embodiment
        fixed = getattr(cls, "fixed_action_dim", None)
        wanted = fixed(self.config.policy_kwargs) if fixed is not None and tasks else None
        if wanted is not None:
            takes = self.env(tasks[0]).action_layout.dim
            if wanted != takes:
                raise PolicyOptionError(
                    f"policy {self.config.policy!r} with options {redact_options(self.config.policy_kwargs)} makes "
                    f"{wanted}-D actions; backend {self.config.backend!r} takes {takes}-D ones: choose the preset or "
                    f"action_layout of this embodiment (--policy-option preset=... or action_layout=...)")
        # the matrix's hooks are checked on every environment made; an optional factor's only when asked for
        named = {factor for c in conditions for factor in Condition.parse(c).factors}
        optional = sorted(named & set(self.protocol.optional_factors))
        if optional and tasks:
            check_hooks(self.env(tasks[0]), required_hooks(self.protocol, optional), self.config.backend)

    def stage_spec(self, task: str) -> specs.StageSpec:
        """The frozen stage spec of ``task`` on this backend."""
        return specs.load_stage_spec(self.config.backend, task)

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
            env = self.backend.make(task, render_profile=self.config.render_profile,
                                    stock_simulator=self.config.stock_simulator)
            check_hooks(env, required_hooks(self.protocol), self.config.backend)
            live.append(env)
        return live[:n]

    def run_key(self, key: RolloutKey) -> Record:
        """Run one key; return its record."""
        return self.run_keys([key])[0]

    def run_keys(self, keys: Sequence[RolloutKey]) -> List[Record]:
        """Run keys of one task: alone, or in lockstep with one batched policy call per decision point."""
        return [record for record, _, _ in self.run_keys_logged(keys)]

    def run_keys_logged(self, keys: Sequence[RolloutKey]) -> List[Tuple[Record, Optional[bytes], Optional[bytes]]]:
        """:meth:`run_keys`, each record with its step log's bytes (None unless ``log_steps``) and its frame log's
        (None unless ``log_frames``, the key is formal and the file fits its cap).

        A logged record's ``step_log`` and ``frame_log`` hold each file's SHA-256 and counts; the files are
        written beside the record by the store.
        """
        task = keys[0].task
        envs, spec = self.envs(task, len(keys)), self.stage_spec(task)
        backend = self.config.backend
        loggers = [StepLogger(k, self.protocol.study_seed) if self.config.log_steps else None for k in keys]
        filmers = [FrameLogger(k, self.protocol, self.policy.image_size, DEFAULT_MAX_BYTES)
                   if self.config.log_frames and k.phase == "formal" else None for k in keys]
        observers = [observing(logger, filmer) for logger, filmer in zip(loggers, filmers)]
        if len(keys) == 1:
            records = [run_rollout(envs[0], self.policy, keys[0], self.protocol, spec, backend, observers[0])]
        else:
            records = run_lockstep(envs, self.policies(len(keys)), keys, self.protocol, spec, backend,
                                   observers=observers)
        out = []
        for record, logger, filmer in zip(records, loggers, filmers):
            record.renderer = self._renderer_summary(envs[0])
            data = frames = None
            if logger is not None and logger.started:
                log = logger.log(spec.names)
                data = log.to_bytes()
                record.step_log = log.summary(data)
            if filmer is not None:
                frames, record.frame_log = filmer.encoded()
            out.append((record, data, frames))
        return out

    def _renderer_summary(self, env) -> str:
        if self._renderer is None:
            info = env.renderer_info()
            self._renderer = f"{info.get('MUJOCO_GL')}/{info.get('gl_renderer')}/{info.get('render_profile')}"
            self.renderer_info = info
            self.simulator_info = env.simulator_info() if hasattr(env, "simulator_info") else {}
        return self._renderer

    def close(self) -> None:
        """Close every live environment and policy."""
        for envs in self._envs.values():
            for env in envs:
                env.close()
        self._envs.clear()
        for policy in self._policies:
            policy.close()
        self._policies.clear()
        for kept in self.kept.values():
            kept.close()
        self.kept.clear()


class Worker:
    """A :class:`StudyCache` living in one executor process or Ray actor.

    Args:
        study: what is studied.
        threads: renderer and torch threads of this process (set before either starts).
    """

    def __init__(self, study: StudyConfig, threads: int = 1):
        apply_threads(threads)
        self.parent = os.getppid()
        self.cache = StudyCache(study)

    def ready(self) -> int:
        """This worker's process id, once it is built (the Ray executor waits on it before dealing keys)."""
        return os.getpid()

    def run(self, job) -> List[Dict[str, Any]]:
        """Run one job (a :class:`RolloutGroup`, or a branching unit); its results, with this process's id and peak memory."""
        results = job.run(self.cache)
        rss = peak_rss_mb()
        return [{**r, "pid": os.getpid(), "rss_mb": rss} for r in results]

    def close(self) -> None:
        """Close the worker's environments and policies."""
        self.cache.close()


class RolloutGroup:
    """A job for the executors: rollout keys run side by side (see ``executors.lockstep_groups``).

    A job is what an executor hands to a worker: ``size`` (rollouts it holds, which sets its
    timeout), ``run(cache)`` (its results, computed in the worker) and ``unrun(...)`` (the results
    that stand for it when its worker died or hung). Branching units are jobs too.
    """

    def __init__(self, keys: Sequence[RolloutKey]):
        self.keys = list(keys)

    @property
    def size(self) -> int:
        return len(self.keys)

    def run(self, cache: StudyCache) -> List[Dict[str, Any]]:
        """One result per key: the record, its step log's and frame log's bytes (or None) and the renderer in use."""
        return [{"record": r.to_json(), "step_log": log, "frame_log": frames, "renderer_info": cache.renderer_info,
                 "simulator_info": cache.simulator_info}
                for r, log, frames in cache.run_keys_logged(self.keys)]

    def unrun(self, study: StudyConfig, kind: str, message: str,
              protocol: Optional[specs.Protocol] = None) -> List[Dict[str, Any]]:
        """Invalid records of ``kind`` for every key (see :func:`unrun_records`)."""
        return unrun_records(study, self.keys, kind, message, protocol)


_WORKER: Optional[Worker] = None


def init_worker(study: StudyConfig, threads: int = 1) -> None:
    """Process-pool initializer: build this process's worker."""
    global _WORKER
    _WORKER = Worker(study, threads)


def run_in_worker(keys: Sequence[RolloutKey]) -> List[Dict[str, Any]]:
    """Process-pool task: run ``keys`` on this process's worker (see :func:`init_worker`)."""
    if os.getppid() != _WORKER.parent:  # the writer died: stop instead of computing for nobody
        os._exit(0)
    return _WORKER.run(RolloutGroup(keys))


class WorkerError(Error):
    """An error raised in a worker process that could not cross back to the caller as itself.

    It keeps the original's message and exit status (``exit_code``); a traceback is added for errors
    that are not the harness's own (bugs, not user mistakes).
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):
        return (WorkerError, (str(self), self.exit_code))


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (to cross a pipe or Ray), else a :class:`WorkerError` that carries it."""
    try:
        copy = pickle.loads(pickle.dumps(exc))
        if type(copy) is type(exc) and str(copy) == str(exc):
            return exc
    except Exception:
        pass
    if isinstance(exc, Error):
        return WorkerError(str(exc), exc.exit_code)
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))
    return WorkerError(f"{type(exc).__name__} in a worker process: {exc}\n{text}")


def serve(conn, study: StudyConfig, threads: int = 1) -> None:
    """Body of a worker process supervised by the local executor (``executors.LocalExecutor``).

    Builds the worker, answers ``("ready", pid)`` (or ``("init_error", error)`` and exits: a worker
    that cannot be built is never respawned), then runs each group of keys received, answering
    ``("results", [...])`` or ``("error", error)``, until it receives None or its supervisor is gone.
    """
    try:
        worker = Worker(study, threads)
    except BaseException as exc:
        conn.send(("init_error", portable_error(exc)))
        conn.close()
        return
    conn.send(("ready", os.getpid()))
    try:
        while True:
            try:
                job = conn.recv()
            except (EOFError, OSError):  # the supervisor died: stop instead of computing for nobody
                return
            if job is None:
                return
            try:
                reply = ("results", worker.run(job))
            except Exception as exc:
                reply = ("error", portable_error(exc))
            conn.send(reply)
    finally:
        worker.close()


def asset_kit_of(backend) -> Optional[Dict[str, Any]]:
    """The generated asset kit a backend's environments load (kind, version, sha256), or None (its own assets)."""
    record = getattr(backend, "asset_kit_record", None)
    return record() if record is not None else None


def policy_name(study: StudyConfig) -> str:
    """The name a policy writes into its records (its class's ``name``), without building it."""
    return getattr(POLICIES.get(study.policy), "name", None) or study.policy


def unrun_records(study: StudyConfig, keys: Sequence[RolloutKey], kind: str, message: str,
                  protocol: Optional[specs.Protocol] = None) -> List[Dict[str, Any]]:
    """Results (as a worker returns them) holding an invalid record of ``kind`` for each of ``keys``.

    For keys whose worker died (``worker_crash``) or hung (``worker_timeout``) before recording them:
    the record carries everything known without running the key (seeds, horizon, stages), so the
    audit and ``--retry-errors`` treat it like any other invalid record.
    """
    protocol = protocol or specs.load_protocol(verify=True)
    backend = get_backend(study.backend, asset_kit=study.asset_kit)
    kit = asset_kit_of(backend)
    name = policy_name(study)
    results = []
    for key in keys:
        spec = specs.load_stage_spec(study.backend, key.task)
        record = Record(
            phase=key.phase, task=key.task, episode=key.episode, condition=key.condition, replicate=key.replicate,
            backend=study.backend, policy=name, spec_hash=protocol.spec_hash, stage_spec_hash=spec.content_hash,
            study_seed=protocol.study_seed,
            env_seed=seeding.env_seed(protocol.study_seed, key.task, key.phase, key.episode),
            policy_seed=seeding.policy_seed(protocol.study_seed, key.task, key.phase, key.episode, key.replicate),
            horizon=backend.task(key.task).horizon, n_stages=len(spec.subgoals), stage_names=spec.names,
            stage_steps=[None] * len(spec.subgoals),
            asset_kit=(kit or {}).get("kind"), asset_kit_sha256=(kit or {}).get("sha256"),
        )
        record.fail(kind, message)
        results.append({"record": record.to_json(), "renderer_info": None, "pid": None, "rss_mb": None})
    return results


__all__ = ["RolloutGroup", "StudyCache", "THREAD_VARIABLES", "Worker", "WorkerError", "apply_threads", "init_worker", "peak_rss_mb",
           "policy_name", "portable_error", "run_in_worker", "serve", "unrun_records"]
