"""The Ray executor: the same rollouts as the local pool, on a Ray cluster.

Each Ray actor holds one worker (one study cache, one live environment reused
across keys of a task); keys are dealt to actors in task-grouped order and
results stream back to the caller, the one writer of the run directory.
Without an address a local Ray instance is started for the run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Iterator, Sequence

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.engine.records import RolloutKey
from robocasa_shift.errors import BackendUnavailable
from robocasa_shift.study.executors import lockstep_groups
from robocasa_shift.study.worker import Worker


class RayExecutor:
    """Runs keys on Ray actors, one :class:`~robocasa_shift.study.worker.Worker` each.

    Args:
        study: what each worker builds.
        execution: resolved execution settings (workers, threads per worker, batch, cluster address).

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
        self._actors = []
        self._started_here = False

    def _ensure(self):
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
        if not self._actors:
            actor = ray.remote(num_cpus=1)(Worker)
            self._actors = [actor.remote(self.study, self.execution.threads) for _ in range(self.workers)]

    def map(self, keys: Sequence[RolloutKey]) -> Iterator[Dict[str, Any]]:
        """Run ``keys`` (task-grouped), yielding one result per key as it completes."""
        if not keys:
            return
        self._ensure()
        ray = self.ray
        pending = {}
        queue = lockstep_groups(keys, self.execution.batch)
        idle = list(self._actors)
        while queue or pending:
            while idle and queue:
                actor = idle.pop(0)
                pending[actor.run.remote(queue.pop(0))] = actor
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                idle.append(pending.pop(ref))
                yield from ray.get(ref)

    def describe(self) -> Dict[str, Any]:
        """The executor's settings, for logs."""
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.execution.threads,
                "batch": self.execution.batch, "address": self.address}

    def close(self) -> None:
        """Kill the actors; shut down a Ray instance started for the run."""
        for actor in self._actors:
            self.ray.kill(actor)
        self._actors = []
        if self._started_here:
            self.ray.shutdown()
            self._started_here = False
