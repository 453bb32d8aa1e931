"""The Ray executor against a real cluster (issue 37): two nodes on this machine, each a separate
`ray start` process tree, with Ray's token authentication on, and drivers that reach it through
``--address`` as a user's would.

A study run through the cluster records what the local executor records, field for field (timings
aside); a worker node killed in the middle of a run leaves ``worker_crash`` records for the rollouts
it held while the study goes on, and ``--retry-errors`` completes the run with nothing duplicated. A
cluster that cannot be used (nothing listening, a port that never answers, a refused token, another
Ray version, no node on this machine) is an exit-3 error within the connect timeout, naming the
address, and no run directory is created or touched.

Every process the cluster starts is killed at the end by its session (``start_new_session``), pid by
pid, whatever the tests did.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from helpers import ROOT

from robocasa_shift.checks.reproduction import diff_runs
from robocasa_shift.rundir.store import RunStore

pytestmark = pytest.mark.slow

STUDY = ["run", "--backend", "fake", "--policy", "fake", "--task", "Reach,PickPlace", "--condition", "clean,camera:L3",
         "--episodes", "0-5", "--no-progress"]
N_KEYS = 24
SECRET_VARIABLE = "RS_CLUSTER_TEST_SECRET"
ONE_KEY = ["run", "--backend", "fake", "--policy", "fake", "--task", "Reach", "--episodes", "0", "--workers", "1",
           "--executor", "ray", "--no-progress"]
# a driver in which Ray believes it is another version (a cluster of another version cannot be installed here)
OTHER_RAY_VERSION = "import ray\nray.__version__ = '0.0.1'\n"
# a driver on a machine that runs no node of the cluster (all nodes run on this one here)
NO_LOCAL_NODE = "import ray._private.services as s\ns.find_node_ids = lambda: []\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_pids(sid: int):
    """Every live process of session ``sid`` (a `ray start` and all it started: raylet, GCS, actors)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # a zombie is gone already, waiting to be reaped
                pids.append(int(entry))
    return pids


def kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``, pid by pid, until none is left."""
    for _ in range(50):
        pids = session_pids(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def clean_env(**extra):
    """This process's environment without Ray's address and token settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN",
                                                            "RAY_AUTH_TOKEN_PATH")}
    env.update(extra)
    return env


class Cluster:
    def __init__(self, root: Path):
        self.root, self.token, self.port = root, secrets.token_hex(16), free_port()
        self.address = f"127.0.0.1:{self.port}"
        # token authentication as Ray ships it; node deaths noticed within seconds (defaults: 15 s)
        self.env = clean_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token, RAY_USAGE_STATS_ENABLED="0",
                             RAY_health_check_period_ms="1000", RAY_health_check_failure_threshold="3")
        self.nodes = {}

    def start_node(self, name: str, *args: str) -> None:
        log = open(self.root / f"{name}.log", "w")
        self.nodes[name] = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--num-cpus", "2", "--block",
             "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port()),
             "--temp-dir", str(self.root / name)],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (self.root / f"{name}.log").read_text():
            assert self.nodes[name].poll() is None, (self.root / f"{name}.log").read_text()[-3000:]
            assert time.monotonic() < deadline, (self.root / f"{name}.log").read_text()[-3000:]
            time.sleep(0.5)

    def wait_for_nodes(self, n: int) -> None:
        code = ("import time\nfrom ray._raylet import GcsClient\nfrom ray._private.services import "
                "canonicalize_bootstrap_address as c\nfrom ray.core.generated.gcs_pb2 import GcsNodeInfo\n"
                f"g = GcsClient(address=c('{self.address}'))\nend = time.time() + 60\n"
                f"while len(g.get_all_node_info(timeout=10, state_filter=GcsNodeInfo.GcsNodeState.ALIVE)) < {n}:\n"
                "    assert time.time() < end\n    time.sleep(0.5)\n")
        subprocess.run([sys.executable, "-c", code], env=self.env, check=True, timeout=90, capture_output=True)

    def running_rollouts(self, name: str) -> int:
        """How many actors of node ``name`` are running a job (Ray titles such a process ``ray::RayWorker.run``)."""
        titles = []
        for pid in session_pids(self.nodes[name].pid):
            try:
                titles.append(Path(f"/proc/{pid}/cmdline").read_bytes())
            except OSError:
                pass
        return sum(title.startswith(b"ray::RayWorker.run") for title in titles)

    def kill(self, name: str) -> None:
        node = self.nodes.pop(name)
        kill_session(node.pid)
        node.wait()

    def stop(self) -> None:
        for name in list(self.nodes):
            self.kill(name)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    # short: Ray's socket paths under the temp dir must stay within 107 characters
    root = Path(tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp"))
    cluster = Cluster(root)
    try:
        cluster.start_node("head", "--head", "--port", str(cluster.port), "--include-dashboard=false")
        cluster.start_node("worker", "--address", cluster.address)
        cluster.wait_for_nodes(2)
        yield cluster
    finally:
        cluster.stop()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def driver(*args, env=None, preamble="", timeout=300):
    """The CLI in a fresh process with ``env`` (and ``preamble`` run first); the completed process."""
    code = preamble + "import runpy, sys\nsys.argv = ['robocasa-shift'] + sys.argv[1:]\n" \
                      "runpy.run_module('robocasa_shift', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, env=env or clean_env())


def succeeded(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def assert_cluster_error(proc, elapsed, limit_s, address, *phrases):
    """Exit 3 within ``limit_s``, an ``error:`` line naming ``address`` and holding ``phrases``, no traceback."""
    assert proc.returncode == 3, (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert address in line, line
    for phrase in phrases:
        assert phrase in line, line
    assert elapsed < limit_s, elapsed


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("local") / "run"
    succeeded(driver(*STUDY, "--workers", "2", "--policy-option", f"api_token=env:{SECRET_VARIABLE}",
                     "--run-dir", str(run_dir), env=clean_env(**{SECRET_VARIABLE: "local-secret"})))
    return run_dir


def test_a_study_through_the_address_records_what_the_local_executor_records(cluster, local_run, tmp_path):
    secret = "s3cret-0xFACADE"
    # the driver names the cluster's token only: it turns Ray's token mode on itself; the secret is set in the
    # driver alone, so a worker that read env:NAME itself (instead of being given the value) would fail
    env = clean_env(RAY_AUTH_TOKEN=cluster.token, **{SECRET_VARIABLE: secret})
    run_dir = tmp_path / "cluster"
    proc = succeeded(driver(*STUDY, "--executor", "ray", "--address", cluster.address, "--workers", "4",
                            "--policy-option", f"api_token=env:{SECRET_VARIABLE}", "--run-dir", str(run_dir), env=env))
    assert f"{N_KEYS} rollouts run" in proc.stdout and "0 invalid" in proc.stdout
    diff = diff_runs(local_run, run_dir)
    assert diff["passed"] and diff["shared"] == N_KEYS, diff
    assert not any(secret in p.read_text(errors="replace") for p in run_dir.rglob("*") if p.is_file())
    (execution,) = json.loads((run_dir / "manifest.json").read_text())["executions"]
    assert execution["executor"] == "ray" and execution["address"] == cluster.address


def test_a_lost_worker_node_leaves_crash_records_and_retry_errors_completes_the_run(cluster, local_run, tmp_path):
    # before the fix the executor waited for each replacement actor to be ready: one placed on the dying node
    # failed the command as "could not be built", one with no room left waited 300 s and more
    run_dir = tmp_path / "lost"
    args = [*STUDY, "--executor", "ray", "--address", cluster.address, "--workers", "4",
            "--policy-option", "act_delay_s=0.03", "--run-dir", str(run_dir)]
    env = clean_env(RAY_AUTH_TOKEN=cluster.token)
    result = {}
    runner = threading.Thread(target=lambda: result.update(proc=driver(*args, env=env)))
    runner.start()
    deadline = time.monotonic() + 120
    # killed once the run has records and the worker node is running rollouts (its actors are titled so)
    while not (list(run_dir.glob("records/**/*.json")) and cluster.running_rollouts("worker")):
        assert runner.is_alive() and time.monotonic() < deadline, result
        time.sleep(0.1)
    cluster.kill("worker")
    runner.join(300)
    proc = succeeded(result["proc"])
    assert f"{N_KEYS} rollouts run" in proc.stdout
    records = RunStore(run_dir).records()
    crashed = [r for r in records if not r["valid"]]
    assert len(records) == N_KEYS and 1 <= len(crashed) < N_KEYS, proc.stdout
    assert all(r["error_kind"] == "worker_crash" and "Ray worker" in r["error"] for r in crashed), crashed
    assert f"{len(crashed)} invalid" in proc.stdout

    retry = succeeded(driver(*args, "--retry-errors", env=env))  # the head alone: its two actors
    assert f"{len(crashed)} rollouts run, {N_KEYS - len(crashed)} already recorded" in retry.stdout
    assert "0 invalid" in retry.stdout
    entries = RunStore(run_dir).record_entries()
    assert len(entries) == N_KEYS == len({file for file, _ in entries})
    assert len(RunStore(run_dir).records("history")) == len(crashed)
    diff = diff_runs(local_run, run_dir)
    assert diff["passed"] and diff["shared"] == N_KEYS, diff


@pytest.mark.parametrize("case", ["wrong token", "no token", "other Ray version", "no node on this machine"])
def test_a_cluster_that_refuses_the_driver_is_an_exit_3_error_and_no_run_directory(cluster, tmp_path, case):
    env, preamble, phrases = clean_env(RAY_AUTH_TOKEN=cluster.token), "", ()
    if case == "wrong token":
        env, phrases = clean_env(RAY_AUTH_TOKEN="not-the-token"), ("refused this driver's token", "RAY_AUTH_TOKEN")
    elif case == "no token":
        env, phrases = clean_env(RAY_AUTH_MODE="disabled"), ("refused this driver's token", "RAY_AUTH_MODE=token")
    elif case == "other Ray version":
        preamble, phrases = OTHER_RAY_VERSION, ("Version mismatch", "0.0.1", "2.")
    else:
        preamble, phrases = NO_LOCAL_NODE, ("runs on this machine", "ray start --address")
    start = time.monotonic()
    proc = driver(*ONE_KEY, "--address", cluster.address, "--run-dir", str(tmp_path / "run"), env=env,
                  preamble=preamble, timeout=120)
    assert_cluster_error(proc, time.monotonic() - start, 30, cluster.address, *phrases)
    assert not (tmp_path / "run").exists()


def test_an_address_where_nothing_listens_is_an_exit_3_error_at_once(tmp_path):
    pytest.importorskip("ray")
    # before the fix: the run sat at 0/1 rollouts, with no error, until it was killed
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    proc = driver(*ONE_KEY, "--address", address, "--run-dir", str(tmp_path / "run"), timeout=120)
    assert_cluster_error(proc, time.monotonic() - start, 30, address, "nothing answers", "ray start --head")
    assert not (tmp_path / "run").exists()


def test_a_port_that_never_answers_is_an_exit_3_error_within_the_connect_timeout(tmp_path):
    pytest.importorskip("ray")
    with socket.socket() as silent:  # accepts connections, says nothing: a GCS that hangs, a wrong service
        silent.bind(("0.0.0.0", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        run_dir = tmp_path / "run"
        first = driver(*ONE_KEY, "--run-dir", str(run_dir), "--executor", "local")  # an existing run directory
        succeeded(first)
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        start = time.monotonic()
        proc = driver(*ONE_KEY, "--address", address, "--connect-timeout", "3", "--run-dir", str(run_dir),
                      "--episodes", "1", timeout=120)
        # 3 s to connect, plus the interpreter's start and exit
        assert_cluster_error(proc, time.monotonic() - start, 25, address, "no answer", "within 3 s")
    # the run directory is untouched: no manifest change, no command logged, nothing planned
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


def test_a_malformed_address_is_refused_before_anything_starts(tmp_path):
    pytest.importorskip("ray")
    proc = driver(*ONE_KEY, "--address", "head-node", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert proc.returncode == 2 and "is not HOST:PORT" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_password_in_a_ray_client_address_is_never_echoed(tmp_path):
    pytest.importorskip("ray")
    # before the fix: "ray://user:PASS@host" came back in clear in the error message
    for address in (f"ray://alice:S3CRET-PW@127.0.0.1:{free_port()}", "ray://alice:S3CRET-PW@head-node"):
        proc = driver(*ONE_KEY, "--address", address, "--connect-timeout", "3", "--run-dir", str(tmp_path / "run"),
                      timeout=120)
        assert proc.returncode in (2, 3) and "Traceback" not in proc.stderr, proc.stderr
        assert "S3CRET-PW" not in proc.stderr + proc.stdout and "<redacted>" in proc.stderr, proc.stderr


def test_the_driver_sends_a_token_only_where_it_is_meant_for(monkeypatch, tmp_path):
    from robocasa_shift.study.ray_executor import split_address, token_source

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert token_source("127.0.0.1") is None
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("t")
    assert token_source("127.0.0.1") == str(tmp_path / ".ray" / "auth_token")  # a cluster on this machine
    assert token_source("203.0.113.9") is None  # the home token never goes to another machine unasked
    monkeypatch.setenv("RAY_AUTH_TOKEN", "named")
    assert token_source("203.0.113.9") == "RAY_AUTH_TOKEN"
    assert split_address("ray://10.0.0.5:10001") == (True, "10.0.0.5", 10001)
    assert split_address("[::1]:6379") == (False, "::1", 6379)


def test_a_worker_with_other_frozen_specs_is_refused(tmp_path):
    pytest.importorskip("ray")
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.errors import ClusterUnavailable
    from robocasa_shift.study.ray_executor import RayExecutor

    executor = RayExecutor(StudyConfig(backend="fake", policy="fake"), ExecutionConfig(executor="ray", workers=1))
    expected = executor._driver_protocol().spec_hash
    executor.check_worker({"spec_hash": expected, "host": "n1"})
    with pytest.raises(ClusterUnavailable, match="n1 loaded frozen specs with hash 0ther") as info:
        executor.check_worker({"spec_hash": "0ther", "host": "n1", "version": "0.1", "package": "/elsewhere"})
    assert info.value.exit_code == 3 and expected in str(info.value)
