"""The Ray executor: the same rollouts as the local executor, on a Ray cluster.

Each Ray actor holds one worker (one study cache, one live environment reused
across keys of a task); keys are dealt to actors in task-grouped order and
results stream back to the caller, the one writer of the run directory (no
actor writes a file). Without an address a local Ray instance is started for
the run.

Connecting (``connect``, called by the run session before the run directory is
touched): an address is the head's ``HOST:PORT`` (its GCS port, ``ray start
--head --port PORT``) or ``ray://HOST:PORT`` (Ray Client). Within
``connect_timeout_s`` the executor checks that something listens there, that the
cluster accepts this driver's token, that it runs this driver's Ray and Python
versions and that a node of it runs on this machine (``ray.init(address=...)``
attaches the driver to a node of its own machine: the driver runs on a node of
the cluster, typically the head, or reaches it through Ray Client); any of these
failing is a :class:`~robocasa_shift.errors.ClusterUnavailable` (exit 3) that
names the address and what to check. Ray replaces a loopback address
(``127.0.0.1``) by this machine's interface address, where the head also
listens. Token authentication: Ray's driver sends no token to an address given
explicitly unless ``RAY_AUTH_MODE=token``; this executor turns token mode on for
its process when a token is named for it (``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH``) or when the address is this machine's and
``~/.ray/auth_token`` (the token ``ray start`` uses here) exists. It never sends
that file to another machine unasked.

What reaches the workers: the study (a ``StudyConfig`` with secret options
resolved, see below) and a thread count once per actor, then jobs (rollout keys)
one group at a time; back come results (record dicts, step-log bytes, renderer
information). A source checkout goes on the workers' ``PYTHONPATH`` (nodes on
this machine or on a shared filesystem at the same path); otherwise every node
needs robocasa-shift installed (a wheel carries the frozen data) with the same
simulator packages. The ``ROBOCASA_SHIFT_*`` data-folder overrides are passed on.
Each actor reports the frozen-spec hash it loaded, and a worker whose hash is
not this driver's stops the command (exit 3) before it runs a rollout.

Faults, as Ray 2.x behaves and as this executor uses it: actors are created
with ``max_restarts=0`` and ``max_task_retries=0`` (Ray's defaults for actors,
set explicitly; Ray's automatic retries, ``max_retries=3``, apply to plain
tasks, not to actor methods). When an actor's process or its node dies
(segfault, OOM kill, a node lost) the rollout group it was running fails with
``ActorDiedError`` and Ray neither restarts the actor nor retries the group: a
rollout that crashed its process would most likely crash again, and an
at-least-once retry could run a rollout twice. This executor records one invalid
record of kind ``worker_crash`` per key of that group, starts a fresh actor in
its place without waiting for it (on a cluster that lost a node it may wait for
room) and goes on with the actors that are ready, as the local executor does; a
group that shows no progress within ``rollout_timeout_s`` per key has its actor
killed and leaves ``worker_timeout`` records. An actor whose construction raises
fails the command once, with the error; one that dies before it is ready (its
node died) is replaced, up to :data:`START_DEATHS_TO_STOP` times in a row. When
no actor is ready within the start limit the command stops (exit 3) and the
rollouts not run stay pending.

Secrets: a secret policy option given as ``env:NAME`` is resolved here, in the
caller, and travels to the actors in memory as a constructor argument (a
remote cluster's processes do not see the caller's environment); Ray keeps
actor-creation arguments in the cluster's memory (its GCS) for the actor's
lifetime. Ray pickles what it ships, both ways: run the Ray executor only on a
cluster you trust, with token authentication on.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import platform
import socket
import threading
import time
from collections import deque
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from robocasa_shift.config import SECRET_PLACEHOLDER, ExecutionConfig, StudyConfig
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.errors import BadInput, ClusterUnavailable, Error
from robocasa_shift.extras import require
from robocasa_shift.policies import resolve_secret_options
from robocasa_shift.study.executors import (
    WorkerStartError,
    lockstep_groups,
    start_limit_s,
)
from robocasa_shift.study.worker import RolloutGroup, Worker, WorkerError

RAY_CLIENT_PREFIX = "ray://"
# The data-folder overrides of core.specs: they decide the frozen protocol, so workers must see the driver's.
DATA_VARIABLES = ("ROBOCASA_SHIFT_PERTURBATIONS", "ROBOCASA_SHIFT_STAGE_SPECS", "ROBOCASA_SHIFT_POOLS",
                  "ROBOCASA_SHIFT_INTERVENTIONS")
# Actors that die before they are ready (not a constructor that raised: a node lost under them), in a row,
# before the command stops instead of starting yet another one.
START_DEATHS_TO_STOP = 3


def _first_words(text: str, limit: int = 300) -> str:
    """Ray's messages run to many lines; a record's error keeps the start of it on one line."""
    return " ".join(str(text).split())[:limit]


def shown_address(address: str) -> str:
    """``address`` as messages and logs show it: the user part of ``ray://user:PASS@host:port`` (or of a
    ``user:PASS@host:port``) replaced by the placeholder."""
    scheme, sep, rest = address.rpartition("://")
    if "@" not in rest:
        return address
    return f"{scheme}{sep}{SECRET_PLACEHOLDER}@{rest.rpartition('@')[2]}"


def _without_credentials(error: BaseException, address: str) -> BaseException:
    """``error`` with the credentials of ``address`` (the whole address, and its user part) taken out of its
    message: Ray quotes the address it was given."""
    shown = shown_address(address)
    if shown == address or not error.args:
        return error
    secret = address.rpartition("://")[2].rpartition("@")[0]
    text = str(error).replace(address, shown).replace(secret, SECRET_PLACEHOLDER)
    error.args = (text, *error.args[1:])
    return error


def split_address(address: str) -> Tuple[bool, str, int]:
    """``(ray_client, host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT`` (``[v6]:PORT`` too).

    Raises:
        BadInput: anything else, with the expected forms.
    """
    text = address.strip()
    client = text.startswith(RAY_CLIENT_PREFIX)
    host, sep, port = (text[len(RAY_CLIENT_PREFIX):] if client else text).rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadInput(f"--address {shown_address(address)!r} is not HOST:PORT (the Ray head's GCS port, as `ray start --head "
                       f"--port 6379` prints it: 10.0.0.5:6379) or ray://HOST:PORT (Ray Client, port 10001)")
    return client, host, int(port)


def on_this_machine(host: str) -> bool:
    """Whether ``host`` names this machine (loopback, its name, or one of its addresses)."""
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        if host == "localhost":
            return True
    names = {socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    try:
        from ray._private.services import get_node_ip_address  # the address Ray advertises for this machine

        names.add(get_node_ip_address())
    except Exception:  # another Ray version: its name for this machine is not needed
        pass
    return host in names


def token_source(host: str) -> Optional[str]:
    """Where this driver's token for a cluster on ``host`` comes from, or None when it sends none unasked."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return f"RAY_AUTH_TOKEN_PATH={os.environ['RAY_AUTH_TOKEN_PATH']}"
    default = Path.home() / ".ray" / "auth_token"
    if default.is_file() and on_this_machine(host):
        return str(default)
    return None


def use_token_auth(host: str) -> str:
    """Turn on Ray's token authentication for this driver where a token is meant for ``host``'s cluster.

    ``RAY_AUTH_MODE``, when set, is respected. When it is not, Ray's driver sends no token to an
    address given explicitly; this turns token mode on when a token is named (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``) or the cluster runs on this machine and ``~/.ray/auth_token`` exists.
    Token mode does no harm with a cluster that has authentication off.

    Returns:
        What the driver sends, in words, for error messages.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    source = token_source(host)
    if mode is not None:
        return f"RAY_AUTH_MODE={mode}" + (f", token from {source}" if mode == "token" and source else "")
    if source is None:
        return "no token: RAY_AUTH_MODE is not set and no token was named for this cluster"
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # Ray caches its configuration on import: refresh it, as Ray does when it turns token mode on itself
        from ray._private.authentication.authentication_token_setup import _enable_token_auth

        _enable_token_auth()
    except Exception:
        try:
            from ray._raylet import Config

            Config.initialize("")
        except Exception:  # another Ray version: the variable alone must do
            pass
    return f"token from {source} (RAY_AUTH_MODE=token turned on for this driver)"


def own_version() -> str:
    try:
        return metadata.version("robocasa-shift")
    except metadata.PackageNotFoundError:
        return "source"


def package_dir() -> Path:
    """The directory of the robocasa_shift package this process imports."""
    return Path(__file__).resolve().parents[1]


class RayWorker(Worker):
    """A :class:`~robocasa_shift.study.worker.Worker` as a Ray actor; ``describe`` says what it imported."""

    def describe(self) -> Dict[str, Any]:
        """Where this worker runs and what it loaded (its frozen-spec hash is checked against the driver's)."""
        return {"pid": os.getpid(), "host": socket.gethostname(), "package": str(package_dir()),
                "version": own_version(), "spec_hash": self.cache.protocol.spec_hash,
                "python": platform.python_version()}


class _NoThreadWarning(logging.Filter):
    """Ray warns that a driver connected from another thread sets no SIGTERM handler; the CLI needs none."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class _Actor:
    """One Ray actor: its handle, its readiness and the job it holds."""

    def __init__(self, handle: Any):
        self.handle = handle
        self.ready_ref = handle.describe.remote()
        self.started = time.monotonic()
        self.ready = False
        self.job: Any = None
        self.ref: Any = None
        self.deadline = float("inf")

    def take(self):
        """The job this actor held, which it no longer holds."""
        job, self.job, self.ref, self.deadline = self.job, None, None, float("inf")
        return job


class RayExecutor:
    """Runs keys on Ray actors, one :class:`RayWorker` each.

    Args:
        study: what each worker builds.
        execution: resolved execution settings (workers, threads per worker, batch, cluster address and
            connect timeout, rollout timeout).

    Raises:
        DependencyMissing: Ray is not installed.
    """

    name = "ray"

    def __init__(self, study: StudyConfig, execution: ExecutionConfig):
        ray = require("ray", "cluster", "the ray executor")  # optional and heavy: only this executor needs it
        self.execution = execution.resolved()
        self.ray, self.study = ray, study
        self.workers, self.address = self.execution.workers, self.execution.address
        if self.address and self.address != "auto":
            split_address(self.address)  # a malformed address is refused before anything starts
        self._actors: List[_Actor] = []
        self._actor_class = None
        self._remote_study: Optional[StudyConfig] = None
        self._started_here = False
        self._protocol: Optional[specs.Protocol] = None
        self._start_deaths = 0

    # ------------------------------------------------------------------ connecting

    def runtime_env(self) -> Dict[str, Any]:
        """What Ray sets in every worker process: the renderer, the data-folder overrides, a checkout's path."""
        env = {"MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
        env.update({name: os.environ[name] for name in DATA_VARIABLES if os.environ.get(name)})
        root = package_dir().parent
        if (root / "setup.cfg").is_file() or (root / "pyproject.toml").is_file():  # a checkout, not site-packages
            env["PYTHONPATH"] = str(root)
        return {"env_vars": env}

    def connect(self) -> None:
        """Connect to the cluster at the address (or start a local Ray instance), once.

        Raises:
            ClusterUnavailable: the cluster could not be reached or used within ``connect_timeout_s``.
        """
        ray = self.ray
        if ray.is_initialized():
            return
        if not self.address:
            ray.init(num_cpus=self.workers, runtime_env=self.runtime_env(), log_to_driver=False,
                     include_dashboard=False)
            self._started_here = True
            return
        self._connect()

    def _connect(self) -> None:
        try:
            self._attach()
        except Exception as exc:
            raise _without_credentials(exc, self.address)

    def _attach(self) -> None:
        limit = self.execution.connect_timeout_s
        deadline = time.monotonic() + limit
        address = self.address
        client, host, port = (False, None, None) if address == "auto" else split_address(address)
        where, gcs = address, None
        if host is not None and not client:
            try:
                from ray._private.services import canonicalize_bootstrap_address

                gcs = canonicalize_bootstrap_address(address)  # a loopback host becomes this machine's address
            except Exception:
                gcs = address
            if gcs != address:
                where = f"{address} (Ray connects to {gcs})"
        auth = use_token_auth(host) if host is not None else "as Ray decides for address=auto"
        if host is not None:  # where Ray will connect: a loopback host became this machine's address
            self._probe(split_address(gcs)[1] if gcs else host, port, client, where, deadline)

        outcome: Dict[str, Any] = {}
        done, lock = threading.Event(), threading.Lock()

        def attach() -> None:
            try:
                if gcs is not None:
                    self._preflight(gcs, where, deadline)
                quiet = _NoThreadWarning()
                logging.getLogger("ray._private.worker").addFilter(quiet)
                try:
                    self.ray.init(address=address, runtime_env=self.runtime_env(), log_to_driver=False)
                finally:
                    logging.getLogger("ray._private.worker").removeFilter(quiet)
                outcome["ok"] = True
            except BaseException as exc:  # handed to the caller's thread
                outcome["error"] = exc
            with lock:
                done.set()
                if outcome.get("abandoned") and outcome.get("ok"):
                    self.ray.shutdown()  # connected after the caller gave up: let go again

        threading.Thread(target=attach, name="ray-connect", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            with lock:
                if not done.is_set():
                    outcome["abandoned"] = True
                    raise ClusterUnavailable(
                        f"no answer from the Ray cluster at {where} within {limit:g} s (--connect-timeout). Check: "
                        f"that this is the head's GCS address and its port is reachable from here (no firewall in "
                        f"between); that this driver has the cluster's token ({auth}); that this driver's Ray "
                        f"{self.ray.__version__} and Python {platform.python_version()} are the cluster's; that a "
                        f"node of the cluster runs on this machine. `ray status --address {address}` tells most of it.")
        error = outcome.get("error")
        if error is not None:
            raise self._explain(error, where, auth)

    def _probe(self, host: str, port: int, client: bool, where: str, deadline: float) -> None:
        """Fail at once when nothing listens at the address (the usual typo: a wrong port, a head not started)."""
        try:
            with socket.create_connection((host, port), timeout=max(0.1, deadline - time.monotonic())):
                return
        except socket.timeout:
            reason = "no answer to a connection"
        except OSError as exc:
            reason = exc.strerror or type(exc).__name__
        if client:
            check = (f"that the head runs Ray Client's server on port {port} (`ray start --head` starts it on 10001, "
                     f"--ray-client-server-port changes it)")
        else:
            check = (f"that the Ray head node runs there (`ray start --head --port {port}` on it; "
                     f"`ray status --address {host}:{port}` answers) and that {port} is its GCS port, not the "
                     f"dashboard's (8265) or Ray Client's (10001, which takes ray://HOST:10001)")
        raise ClusterUnavailable(f"nothing answers at {where} ({reason}): check {check}.")

    def _preflight(self, gcs: str, where: str, deadline: float) -> None:
        """Before ``ray.init``: the token, the versions and a node on this machine, each failing at once and by name.

        Uses Ray's own GCS client; under a Ray version without these internals, ``ray.init`` decides alone.
        """
        try:
            from ray._raylet import GcsClient
        except ImportError:
            return
        gcs_client = GcsClient(address=gcs)  # a refused token raises AuthenticationError here, at once
        try:
            from ray._common.usage.usage_lib import get_cluster_metadata
            from ray._private.utils import check_version_info
        except ImportError:
            pass
        else:
            cluster = get_cluster_metadata(gcs_client)
            if cluster:
                check_version_info(cluster, f"{socket.gethostname()} (this driver)")  # RuntimeError: Version mismatch
        try:
            from ray._private.services import find_node_ids
            from ray._raylet import NodeID
            from ray.core.generated.gcs_pb2 import GcsNodeInfo
        except ImportError:
            return
        alive = {NodeID(info.node_id).hex() for info in gcs_client.get_all_node_info(
            timeout=max(1.0, deadline - time.monotonic()), state_filter=GcsNodeInfo.GcsNodeState.ALIVE).values()}
        if alive and not alive & set(find_node_ids()):
            raise ClusterUnavailable(
                f"no node of the Ray cluster at {where} runs on this machine ({len(alive)} node(s) alive elsewhere): "
                f"a Ray driver attaches to a node of its own machine. Run the command on a node of the cluster "
                f"(the head), join this machine to it first (`ray start --address {self.address}` with the "
                f"cluster's token in RAY_AUTH_TOKEN), or reach it through Ray Client (--address ray://HEAD:10001).")

    def _explain(self, error: BaseException, where: str, auth: str) -> BaseException:
        """The error of a failed connection, as a ClusterUnavailable saying what to check."""
        if isinstance(error, Error):
            return error
        text = " ".join(f"{type(e).__name__}: {e}" for e in _chain(error))
        if "AuthenticationError" in text or "InvalidAuthToken" in text or "Unauthenticated" in text:
            return ClusterUnavailable(
                f"the Ray cluster at {where} refused this driver's token ({auth}). Give the driver the cluster's "
                f"token: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<token> or RAY_AUTH_TOKEN_PATH=<file> "
                f"(`ray get-auth-token` on the head prints it; ~/.ray/auth_token is used when the cluster runs on "
                f"this machine).")
        if "Version mismatch" in text:
            versions = _first_words(text[text.index("Version mismatch"):], 400)
            return ClusterUnavailable(
                f"the Ray cluster at {where} runs other versions than this driver ({versions}). The driver and "
                f"every node need the same Ray version and the same Python version (to the patch level unless "
                f"RAY_DEFAULT_PYTHON_VERSION_MATCH_LEVEL=minor): run the command from an environment that matches "
                f"the cluster's.")
        return ClusterUnavailable(f"could not connect to the Ray cluster at {where}: {_first_words(text, 600)}")

    # ------------------------------------------------------------------ actors

    def _ensure(self) -> None:
        """Connect to (or start) Ray and start the actors, once."""
        self.connect()
        if self._actor_class is None:
            # a crashed rollout is recorded, never restarted or retried (see the module docstring)
            self._actor_class = self.ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(RayWorker)
        if not self._actors:
            self._actors = [self._new_actor() for _ in range(self.workers)]

    def _new_actor(self) -> _Actor:
        """A new actor, not waited for: it takes jobs once it is ready (``describe`` answered)."""
        if self._remote_study is None:
            options = resolve_secret_options(self.study.policy_kwargs)
            self._remote_study = replace(self.study, policy_options=tuple(options.items()))
        return _Actor(self._actor_class.remote(self._remote_study, self.execution.threads))

    def _kill(self, actors: Sequence[_Actor]) -> None:
        """Kill ``actors`` for good (no restart); dead ones are skipped."""
        for actor in actors:
            try:
                self.ray.kill(actor.handle, no_restart=True)
            except Exception:  # already dead: nothing to stop
                pass

    def _replace(self, index: int) -> None:
        """Kill actor ``index`` (dead or hung) and start a fresh one in its place (not waited for)."""
        self._kill([self._actors[index]])
        self._actors[index] = self._new_actor()

    def _driver_protocol(self) -> specs.Protocol:
        if self._protocol is None:
            self._protocol = specs.load_protocol(verify=True)
        return self._protocol

    def check_worker(self, info: Dict[str, Any]) -> None:
        """Refuse a worker that loaded other frozen specs than this driver.

        Raises:
            ClusterUnavailable: its spec hash differs (the message says which package each side imports).
        """
        expected = self._driver_protocol().spec_hash
        if info.get("spec_hash") == expected:
            return
        raise ClusterUnavailable(
            f"the Ray worker on {info.get('host')} loaded frozen specs with hash {info.get('spec_hash')} from "
            f"robocasa_shift {info.get('version')} at {info.get('package')}; this driver's are {expected} "
            f"(robocasa_shift {own_version()} at {package_dir()}). Every node must import the same robocasa-shift "
            f"and frozen data: install the same version on each node, or keep the checkout on a filesystem the "
            f"nodes share at the same path. No rollout ran on that worker.")

    def _on_ready(self, index: int) -> None:
        """Actor ``index`` answered ``describe`` (or died trying)."""
        actor = self._actors[index]
        try:
            info = self.ray.get(actor.ready_ref)
        except self.ray.exceptions.RayActorError as exc:
            if exc.actor_init_failed:
                raise WorkerStartError(f"a Ray worker could not be built: {exc.error_msg}") from None
            # died before it was ready without an error of its own (its node died): start another, a few times
            self._start_deaths += 1
            if self._start_deaths >= START_DEATHS_TO_STOP:
                raise WorkerStartError(f"{self._start_deaths} Ray workers in a row died before they were ready; "
                                       f"the last: {_first_words(exc.error_msg)}") from None
            self._replace(index)
            return
        self.check_worker(info)
        actor.ready = True
        self._start_deaths = 0

    def _on_result(self, index: int) -> Iterator[Dict[str, Any]]:
        """Actor ``index`` finished its job (or died running it)."""
        ray, actor = self.ray, self._actors[index]
        ref, job = actor.ref, actor.take()
        try:
            results = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            if exc.actor_init_failed:
                raise WorkerStartError(f"a Ray worker could not be built: {exc.error_msg}") from None
            self._replace(index)
            yield from self._unrun(job, "worker_crash",
                                   f"the Ray worker running this rollout died: {_first_words(exc.error_msg)}")
            return
        except ray.exceptions.ObjectLostError as exc:  # done, but its results went down with the worker's node
            self._replace(index)
            yield from self._unrun(job, "worker_crash", f"the results of this rollout were lost with the Ray "
                                                        f"worker's node: {_first_words(str(exc))}")
            return
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Error):
                raise WorkerError(str(cause), cause.exit_code) from None
            raise
        yield from results

    def _no_room(self, limit: float) -> ClusterUnavailable:
        try:
            free, total = self.ray.available_resources().get("CPU", 0), self.ray.cluster_resources().get("CPU", 0)
            room = f"the cluster has {free:g} of {total:g} CPUs free and each worker takes 1 (`ray status`)"
        except Exception:
            room = "the cluster had no room for one (`ray status`)"
        return ClusterUnavailable(
            f"no Ray worker was ready within {limit:g} s: {room}, or building a worker took longer. The rollouts "
            f"not run stay pending: rerun the same command once the cluster has room.")

    def _unrun(self, job, kind: str, message: str) -> List[Dict[str, Any]]:
        """The results of ``kind`` that stand for a job an actor took and never finished."""
        return job.unrun(self.study, kind, message, self._driver_protocol())

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
        limit, start_limit = self.execution.rollout_timeout_s, start_limit_s(self.execution)
        queue = deque(jobs)
        while queue or any(a.job is not None for a in self._actors):
            for actor in self._actors:
                if actor.ready and actor.job is None and queue:
                    actor.job = queue.popleft()
                    actor.ref = actor.handle.run.remote(actor.job)
                    actor.deadline = time.monotonic() + limit * actor.job.size
            watched = {a.ref: a for a in self._actors if a.job is not None}
            watched.update({a.ready_ref: a for a in self._actors if not a.ready})
            due = [a.deadline for a in self._actors if a.job is not None]
            due += [a.started + start_limit for a in self._actors if not a.ready]
            if not watched:  # cannot happen (an idle ready actor takes a job); never wait on nothing
                raise WorkerStartError("the Ray executor has no actor to wait on")
            done, _ = self.ray.wait(list(watched), num_returns=1, timeout=max(0.0, min(due) - time.monotonic()))
            for ref in done:
                actor = watched[ref]
                index = self._actors.index(actor)
                if actor.ready:
                    yield from self._on_result(index)
                else:
                    self._on_ready(index)
            now = time.monotonic()
            for index, actor in enumerate(self._actors):
                if actor.job is not None and now > actor.deadline:
                    job = actor.take()
                    self._replace(index)
                    yield from self._unrun(job, "worker_timeout",
                                           f"the Ray worker made no progress on its {job.size} rollout(s) within "
                                           f"{limit:g} s per rollout (rollout_timeout_s): killed")
            if not any(a.ready for a in self._actors) and all(now > a.started + start_limit for a in self._actors):
                raise self._no_room(start_limit)

    def describe(self) -> Dict[str, Any]:
        """The executor's settings, for logs."""
        return {"executor": self.name, "workers": self.workers, "threads_per_worker": self.execution.threads,
                "batch": self.execution.batch, "address": self.address and shown_address(self.address),
                "connect_timeout_s": self.execution.connect_timeout_s,
                "rollout_timeout_s": self.execution.rollout_timeout_s}

    def close(self) -> None:
        """Kill the actors (pending ones too); shut down a Ray instance started for the run."""
        self._kill(self._actors)
        self._actors = []
        if self._started_here:
            self.ray.shutdown()
            self._started_here = False


def _chain(error: BaseException) -> List[BaseException]:
    """``error`` and its causes, outermost first."""
    out: List[BaseException] = []
    while error is not None and error not in out:
        out.append(error)
        error = error.__cause__ or error.__context__
    return out


__all__ = ["DATA_VARIABLES", "RayExecutor", "RayWorker", "START_DEATHS_TO_STOP", "on_this_machine", "split_address",
           "token_source", "use_token_auth"]
