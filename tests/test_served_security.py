"""The served policies' network surfaces under attack, on loopback: a pre-token flood of decoding bombs against
the GR00T launcher's command, a /health that drips its headers, hellos and metadata nested a thousand deep."""

import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

from robocasa_shift.errors import PolicyServerError, PolicyServerTimeout
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.served.transport import http_ready

zmq = pytest.importorskip("zmq")

ROOT = Path(__file__).resolve().parents[1]
TESTS = str(Path(__file__).resolve().parent)
HOST = "127.0.0.1"
TOKEN = "a-launcher-token-for-the-flood"


def rss_kb(pid: int, field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak) of a process, in kB."""
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


@pytest.fixture()
def launcher_process():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, str(ROOT)]), "GR00T_API_TOKEN": TOKEN}
    server = subprocess.Popen([sys.executable, "-m", "robocasa_shift.policies.gr00t", "serve", "--model-factory",
                               "served_standins:make_gr00t_model", "--port", "0"], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    match = re.search(r"on tcp://127\.0\.0\.1:(\d+)", server.stdout.readline())
    try:
        assert match, "the launcher did not start"
        yield server, int(match.group(1))
    finally:
        server.terminate()
        server.wait(10)


def empty_lists(n_bytes: int) -> bytes:
    """A GR00T request that is one msgpack array of empty lists: each byte would be a 64-byte Python object."""
    count = n_bytes - 5
    return b"\xdd" + count.to_bytes(4, "big") + b"\x90" * count


def test_a_flood_of_unauthenticated_decoding_bombs_leaves_the_launcher_small_and_answering(launcher_process):
    server, port = launcher_process
    client = Gr00tClient(HOST, port, timeout_s=10.0, api_token=TOKEN)
    client.reset(1)
    observation = {"video.agentview": np.zeros((1, 64, 64, 3), np.uint8), "state.eef": np.zeros((1, 2)),
                   "state.grasping": np.zeros((1, 1)), "annotation.human.task_description": ["reach"]}
    before = rss_kb(server.pid, "VmRSS")
    bomb = empty_lists(64 * 2**20 - 1024)  # just under --max-message-bytes: the socket lets it through
    context = zmq.Context.instance()
    sockets = [context.socket(zmq.DEALER)]  # one peer, its requests pipelined: the queue bound is per peer
    for sock in sockets:
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 120_000)
        sock.connect(f"tcp://{HOST}:{port}")
    start = time.monotonic()
    senders = [threading.Thread(target=lambda s=s: [s.send_multipart([b"", bomb]) for _ in range(100)])
               for s in sockets]
    for thread in senders:
        thread.start()
    replies = []
    for sock in sockets:  # every bomb is answered, without its token
        replies += [msgpack.unpackb(sock.recv_multipart()[-1]) for _ in range(100)]
    for thread in senders:
        thread.join()
    flood_s = time.monotonic() - start
    answered = time.monotonic()
    reply = client.get_action(observation)
    latency_s = time.monotonic() - answered
    peak = rss_kb(server.pid, "VmHWM")
    for sock in sockets:
        sock.close()
    client.close()
    assert len(replies) == 100 and all("error" in r for r in replies)
    assert all("values refused" in r["error"] for r in replies), replies[0]
    assert "action.planar" in reply and latency_s < 1.0, latency_s
    assert (peak - before) / 1024 < 300, f"the launcher grew {(peak - before) / 1024:.0f} MB during the flood"
    print(f"100 bombs of 64 MiB in {flood_s:.1f} s; RSS {before / 1024:.0f} MB before, peak {peak / 1024:.0f} MB; "
          f"get_action {latency_s * 1000:.0f} ms after")


class DrippingHealth:
    """An HTTP server that sends its status line one byte every ``every_s``: never idle long enough for a
    per-read timeout, never finished."""

    def __init__(self, every_s: float = 0.5):
        self.listener = socket.create_server((HOST, 0))
        self.port = self.listener.getsockname()[1]
        self.every_s, self.stop = every_s, threading.Event()
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except socket.timeout:
                continue
            threading.Thread(target=self.drip, args=(conn,), daemon=True).start()

    def drip(self, conn):
        with conn:
            for byte in b"HTTP/1.1 200 OK" * 1000:
                if self.stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(self.every_s)

    def close(self):
        self.stop.set()
        self.listener.close()


def test_a_health_check_against_a_dripping_server_ends_at_its_deadline():
    server = DrippingHealth()
    try:
        start = time.monotonic()
        with pytest.raises(PolicyServerTimeout, match="did not report ready on /health within 3 s"):
            http_ready(f"http://{HOST}:{server.port}/health", f"ws://{HOST}:{server.port}", 3.0, "the server",
                       "check it")
        assert time.monotonic() - start < 5.0
    finally:
        server.close()


def test_a_vla_eval_client_whose_health_drips_ends_at_ready_timeout_s():
    from robocasa_shift.policies.vla_eval.client import VlaEvalPolicy

    server = DrippingHealth()
    try:
        start = time.monotonic()
        with pytest.raises(PolicyServerTimeout, match="within 3 s"):
            VlaEvalPolicy(host=HOST, port=server.port, ready_timeout_s=3, connect_timeout_s=2)
        assert time.monotonic() - start < 6.0
    finally:
        server.close()


def nested_map(depth: int):
    value = {"leaf": 1}
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize("where", ["vla-eval hello", "openpi metadata", "gr00t modality config"])
def test_a_hello_or_metadata_nested_a_thousand_deep_is_a_clean_server_error(where):
    """Before: a RecursionError traceback out of ``run``; now the client refuses the message, naming the bound."""
    deep = b"\x81\xa1x" * 1000 + b"\xc0"  # {"x": {"x": ... None}} a thousand deep, written without recursion
    if where == "gr00t modality config":
        from robocasa_shift.policies.gr00t.wire import unpackb
        with pytest.raises(PolicyServerError, match="deeper than"):
            unpackb(deep)
        return
    if where == "openpi metadata":
        from robocasa_shift.policies.openpi.wire import unpackb
        with pytest.raises(PolicyServerError, match="deeper than"):
            unpackb(deep)
        return
    from robocasa_shift.policies.vla_eval.wire import unpack_message
    message = msgpack.packb({"type": "hello", "payload": {}, "seq": 1, "timestamp": 0.0})
    message = message.replace(b"\xa7payload\x80", b"\xa7payload\x81\xa1y" + deep)
    with pytest.raises(PolicyServerError, match="deeper than"):
        unpack_message(message)


def test_a_gr00t_client_says_in_seconds_that_nothing_listens():
    """Before: 3 tries x timeout_s of silence (90 s here) before a timeout; now a TCP probe says it at once."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    client = Gr00tClient(HOST, port, timeout_s=30.0, retries=2)
    start = time.monotonic()
    with pytest.raises(PolicyServerTimeout, match="nothing listens at tcp://127.0.0.1"):
        client.call("ping", requires_input=False)
    assert time.monotonic() - start < 5.0
    client.close()


def test_a_gr00t_client_stops_calling_a_server_that_went_away_and_tries_again_later():
    """The served base's circuit breaker, shared by the ZeroMQ client: after three failed calls in a row the next
    is refused at once (no probe, no timeout), until ``open_s`` has passed; a failure to reach the server then
    fails again by its own message."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    client = Gr00tClient(HOST, port, timeout_s=30.0, retries=0)
    client.breaker.open_s = 0.5
    for _ in range(3):
        with pytest.raises(PolicyServerTimeout, match="nothing listens"):
            client.call("ping", requires_input=False)
    with pytest.raises(PolicyServerError, match="failed 3 times in a row .*nothing listens.*not trying again") as info:
        client.call("ping", requires_input=False)
    assert not isinstance(info.value, PolicyServerTimeout) and info.value.endpoint == "circuit"
    assert client.ping() is False  # a refused ping is a server that does not answer
    time.sleep(0.6)
    with pytest.raises(PolicyServerTimeout, match="nothing listens"):  # half open: one try goes through
        client.call("ping", requires_input=False)
    client.close()


def test_a_launcher_taking_the_token_in_its_own_frame_reads_nothing_of_a_message_before_it(monkeypatch):
    import robocasa_shift.policies.served.codec as codec
    from robocasa_shift.policies.gr00t.server import Gr00tLauncher
    from robocasa_shift.policies.gr00t.standin import ACTION_KEY, STATE_KEY, CostModel

    scanned = []
    monkeypatch.setattr(codec, "prescan", lambda data, *a, real=codec.prescan: scanned.append(len(data)) or real(data, *a))
    with pytest.raises(ValueError, match="needs an API token"):
        Gr00tLauncher(CostModel(0.0, 0.0), HOST, 0, auth_frame_only=True)
    launcher = Gr00tLauncher(CostModel(0.0, 0.0), HOST, 0, api_token=TOKEN, auth_frame_only=True)
    launcher.start()
    try:
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(f"tcp://{HOST}:{launcher.port}")
        bomb = empty_lists(8 * 2**20)
        for frames in ([b"", b"wrong-token", bomb], [b"", bomb]):  # a wrong token frame; the token inside only
            sock.send_multipart(frames)
            reply = msgpack.unpackb(sock.recv_multipart()[-1])
            assert reply["error"].startswith("Unauthorized"), reply
        assert scanned == []  # refused before a byte of either message was read
        sock.close()
        for auth_frame, answered in ((True, True), (False, False)):
            client = Gr00tClient(HOST, launcher.port, timeout_s=10.0, api_token=TOKEN, auth_frame=auth_frame)
            if answered:
                client.reset(3)
                assert ACTION_KEY in client.get_action({STATE_KEY: np.zeros((1, 3))})
            else:  # GR00T's way, the token inside the message: refused by this launcher
                with pytest.raises(PolicyServerError, match="token in its own frame"):
                    client.reset(3)
            client.close()
    finally:
        launcher.stop()
