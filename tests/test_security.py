"""Security of the network-facing parts: the GR00T launcher and client, the openpi client, re-runs from a run dir.

Each test plays the attacker (or the unlucky user) against loopback servers and run
directories it makes itself (127.0.0.1 only, bounded loops and timeouts). "Runs nothing"
is shown with payloads whose unpickling would create a marker file.
"""

import asyncio
import io
import json
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings

import msgpack
import numpy as np
import pytest
import torch
import zmq
from click.testing import CliRunner
from helpers import ROOT

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.engine.replay import Replayer, replay_policy_options
from robocasa_shift.errors import (
    PolicyOptionError,
    PolicyServerError,
    PolicyServerTimeout,
)
from robocasa_shift.policies import POLICIES
from robocasa_shift.policies.scripted.fake import FakeExpertPolicy
from robocasa_shift.policies.gr00t import server as launcher_cli
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.policy import Gr00tPolicy
from robocasa_shift.policies.gr00t.wire import (
    PickleSerializerWarning,
    packb,
    torch_packb,
    unpackb,
)

HOST = "127.0.0.1"
TOKEN = "s3cret-token-for-tests"


class CreatesFile:
    """Unpickling this object creates ``path`` (``open(path, "w")``): proof that a payload ran."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


class CountingModel:
    """A stand-in GR00T model: counts its calls, draws its noise from the global torch RNG as N1.5 does."""

    def __init__(self):
        self.calls = 0

    def get_modality_config(self):
        return {"action": {"delta_indices": [0, 1, 2, 3]}}

    def get_action(self, obs):
        self.calls += 1
        return {"action.x": torch.randn(4).numpy(), "instruction": obs.get("instruction", "")}


def start(model=None, **options):
    """A started launcher on loopback around ``model`` (a fresh ``CountingModel`` by default)."""
    launcher = Gr00tLauncher(model or CountingModel(), HOST, 0, **options)
    launcher.start()
    return launcher


def raw_request(port, message: bytes, timeout_s: float = 5.0):
    """Send raw bytes to a ZeroMQ REP server; its raw reply, or None after ``timeout_s``."""
    context = zmq.Context.instance()
    sock = context.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(timeout_s * 1000))
    sock.connect(f"tcp://{HOST}:{port}")
    try:
        sock.send(message)
        return sock.recv()
    except zmq.Again:
        return None
    finally:
        sock.close(linger=0)


def object_array_npy(obj) -> bytes:
    """``np.save`` bytes of an object array holding ``obj``: loading them with pickle allowed unpickles it."""
    buf = io.BytesIO()
    np.save(buf, np.array([obj], dtype=object), allow_pickle=True)
    return buf.getvalue()


# =========================================================================== 1: no code execution on the launcher


def test_a_pickled_request_without_a_token_runs_nothing_on_the_gr00t_launcher(tmp_path):
    marker = tmp_path / "payload-ran"
    # the old --serializer torch is refused outright, never served
    with pytest.raises(ValueError, match="never unpickles"):
        Gr00tLauncher(CountingModel(), HOST, 0, serializer="torch", api_token=TOKEN)
    model = CountingModel()
    launcher = start(model, api_token=TOKEN)
    try:
        attacks = {
            "plain pickle": pickle.dumps({"endpoint": "get_action", "data": CreatesFile(marker)}),
            "torch.save": torch_packb({"endpoint": "kill", "data": CreatesFile(marker)}),
            # msgpack whose array is a pickled object array, even with the right token
            "object array": msgpack.packb({"endpoint": "get_action", "api_token": TOKEN, "data": {
                "x": {"__ndarray_class__": True, "as_npy": object_array_npy(CreatesFile(marker))}}}),
        }
        for name, message in attacks.items():
            reply = raw_request(launcher.port, message)
            assert reply is not None, name
            assert "error" in unpackb(reply), name
            assert not marker.exists(), f"{name}: the payload ran"
        no_token = unpackb(raw_request(launcher.port, packb({"endpoint": "get_action", "data": {}})))
        wrong = unpackb(raw_request(launcher.port, packb({"endpoint": "get_action", "api_token": "nope"})))
        odd = unpackb(raw_request(launcher.port, packb({"endpoint": "ping", "api_token": [TOKEN]})))
        assert no_token["error"] == wrong["error"] == odd["error"] == "Unauthorized: Invalid API token"
        assert model.calls == 0  # nothing reached the model
        assert launcher.running  # and nothing stopped the server
        client = Gr00tClient(HOST, launcher.port, timeout_s=5.0, api_token=TOKEN)
        client.reset(0)
        assert client.ping() and client.get_action({"instruction": "ok"})["action.x"].shape == (4,)
        client.close()
    finally:
        launcher.stop()


def test_the_launcher_binds_loopback_by_default_and_refuses_an_open_bind_without_a_token(monkeypatch):
    assert Gr00tLauncher(CountingModel()).host == "127.0.0.1"
    for host in ("*", "0.0.0.0", "::", "192.168.1.7"):
        with pytest.raises(ValueError, match="API token"):
            Gr00tLauncher(CountingModel(), host, 0)
    assert Gr00tLauncher(CountingModel(), "0.0.0.0", 0, api_token=TOKEN).requires_token  # built, not started

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(launcher_cli, "build_gr00t_model", no_model)
    monkeypatch.delenv(launcher_cli.TOKEN_ENV, raising=False)
    base = ["serve", "--model-path", "m", "--data-config", "d"]
    assert launcher_cli.main(base + ["--host", "0.0.0.0"]) == 2
    assert launcher_cli.main(base + ["--serializer", "torch"]) == 2
    assert launcher_cli.main(base + ["--allow-kill"]) == 2


def test_the_client_torch_serializer_needs_an_explicit_opt_in_and_warns_every_time():
    with pytest.raises(PolicyOptionError, match="allow_pickle"):
        Gr00tClient(HOST, 1, serializer="torch")
    for _ in range(2):
        with pytest.warns(PickleSerializerWarning, match="unpickled"):
            Gr00tClient(HOST, 1, serializer="torch", allow_pickle=True).close()


# =========================================================================== 2: a shared run directory


class EvilTorchServer:
    """Answers every request with a torch-serialized (pickled) reply that creates ``marker`` when loaded."""

    def __init__(self, marker):
        self.context = zmq.Context()
        self.sock = self.context.socket(zmq.REP)
        self.port = self.sock.bind_to_random_port(f"tcp://{HOST}")
        self.reply = torch_packb({"rng_fingerprint": CreatesFile(marker)})
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(50):
                self.sock.recv()
                self.requests += 1
                self.sock.send(self.reply)

    def stop(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close(linger=0)
        self.context.term()


def evil_manifest(port):
    """What a sharer could write: a GR00T run whose server (``port``) speaks the torch serializer."""
    return {"backend": "fake", "policy": {"name": "gr00t"}, "render_profile": "fast",
            "policy_options": {"host": HOST, "port": port, "serializer": "torch", "timeout_s": 2.0, "retries": 0}}


def test_a_manifest_cannot_make_a_replay_connect_or_unpickle(tmp_path):
    marker = tmp_path / "payload-ran"
    evil = EvilTorchServer(marker)
    try:
        key = RolloutKey("formal", "Reach", 0, "clean")
        with pytest.raises(PolicyOptionError, match="host='127.0.0.1'") as info:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Replayer(evil_manifest(evil.port)) as replayer:
                    replayer.replay(key, {"success": False, "steps": 0, "stage_steps": []})
        assert "--trust-run-dir" in str(info.value) and "--policy-option" in str(info.value)
        assert not marker.exists() and evil.requests == 0
        # trusting the directory still never takes allow_pickle or the torch serializer from it
        with pytest.raises(PolicyOptionError, match="serializer='torch'"):
            Replayer(evil_manifest(evil.port), trust_run_dir=True)
        assert not marker.exists() and evil.requests == 0
    finally:
        evil.stop()


def test_replay_options_come_from_the_command_line_unless_the_run_dir_is_trusted():
    manifest = {"policy": {"name": "gr00t"}, "policy_options": {
        "host": "10.9.8.7", "port": 5555, "chunk_size": 16, "api_token": "<redacted>", "session": "study"}}
    with pytest.raises(PolicyOptionError, match=r"host='10.9.8.7', port=5555, api_token\)"):
        replay_policy_options(manifest)
    mine = {"host": HOST, "port": 6000, "api_token": "env:MY_TOKEN"}
    assert replay_policy_options(manifest, mine) == {"chunk_size": 16, "session": "study", **mine}
    with pytest.raises(PolicyOptionError, match="api_token"):  # a redacted secret is never usable
        replay_policy_options(manifest, trust_run_dir=True)
    assert replay_policy_options(manifest, {"api_token": "t"}, trust_run_dir=True)["host"] == "10.9.8.7"
    loads_files = {"policy": {"name": "lerobot"}, "policy_options": {"checkpoint": "ckpt", "weights_dir": "w",
                                                                     "device": "cpu"}}
    with pytest.raises(PolicyOptionError, match="checkpoint='ckpt', weights_dir='w'"):
        replay_policy_options(loads_files)
    assert replay_policy_options(loads_files, {"checkpoint": "/mine"}, trust_run_dir=True)["weights_dir"] == "w"
    torch_run = {"policy": {"name": "gr00t"}, "policy_options": {"serializer": "torch", "allow_pickle": True}}
    with pytest.raises(PolicyOptionError, match="allow_pickle"):
        replay_policy_options(torch_run, trust_run_dir=True)
    # the reader may choose the torch serializer on their own command line (the client then warns)
    assert replay_policy_options(torch_run, {"serializer": "torch", "allow_pickle": True})["serializer"] == "torch"


HOSTS_SEEN = []


class BlurShyPolicy(FakeExpertPolicy):
    """The fake expert with a connection option; it freezes on a blurry wrist image, so blur:L3 makes an S->F pair."""

    name = "blur-shy"
    camera_roles = ("third_person", "wrist")
    privileged = True

    def __init__(self, host="localhost"):
        super().__init__()
        HOSTS_SEEN.append(host)

    def act(self, obs):
        import cv2

        wrist = next(img for cam, img in obs.images.items() if obs.camera_roles[cam] == "wrist")
        action = super().act(obs)
        if cv2.Laplacian(cv2.cvtColor(wrist, cv2.COLOR_RGB2GRAY), cv2.CV_64F).var() < 3:
            action[:, :2] = 0.0
        return action


@pytest.fixture(scope="module")
def shared_run_dir(tmp_path_factory):
    from robocasa_shift.study.runner import run

    if "blur-shy" not in POLICIES:
        POLICIES.register("blur-shy", BlurShyPolicy)
    run_dir = tmp_path_factory.mktemp("shared") / "run"
    run(run_dir, ["Reach"], ["clean", "blur:L3"], [0],
        StudyConfig(backend="fake", policy="blur-shy", policy_options={"host": "recorded.invalid"}),
        ExecutionConfig(workers=1, progress=False))
    return run_dir


def test_report_takes_connection_options_from_its_command_line(shared_run_dir, tmp_path):
    from robocasa_shift.cli import main

    runner = CliRunner()
    # a copy of the directory, its manifest rewritten to name a GR00T server that answers with a pickle
    marker = tmp_path / "payload-ran"
    evil = EvilTorchServer(marker)
    try:
        shared = shutil.copytree(shared_run_dir, tmp_path / "shared")
        manifest = json.loads((shared / "manifest.json").read_text())
        manifest.update({k: v for k, v in evil_manifest(evil.port).items() if k in ("policy", "policy_options")})
        (shared / "manifest.json").write_text(json.dumps(manifest))
        for extra in ([], ["--trust-run-dir"]):
            result = runner.invoke(main, ["report", str(shared), "--videos", "1", *extra])
            assert not marker.exists() and evil.requests == 0
            assert result.exit_code == 2 and "serializer='torch'" in result.output, result.output
    finally:
        evil.stop()
    # the directory as written: its connection option is used only when given here or trusted
    refused = runner.invoke(main, ["report", str(shared_run_dir), "--videos", "1"])
    assert refused.exit_code == 2, refused.output
    assert "host='recorded.invalid'" in refused.output and "--trust-run-dir" in refused.output
    HOSTS_SEEN.clear()
    ok = runner.invoke(main, ["report", str(shared_run_dir), "--videos", "1", "--policy-option", "host=cli.invalid"])
    assert ok.exit_code == 0, ok.output
    assert HOSTS_SEEN == ["cli.invalid"]
    videos = json.loads((shared_run_dir / "report" / "videos.json").read_text())
    assert [v["kind"] for v in videos] == ["S->F"] and videos[0]["reproduced"]
    HOSTS_SEEN.clear()
    shutil.rmtree(shared_run_dir / "report")  # a report keeps videos of unchanged records: make it film again
    trusted = runner.invoke(main, ["report", str(shared_run_dir), "--videos", "1", "--trust-run-dir"])
    assert trusted.exit_code == 0, trusted.output
    assert HOSTS_SEEN == ["recorded.invalid"]


# =========================================================================== 3: openpi replies


def _openpi_server(replies, metadata=None):
    """A websocket server speaking openpi's framing on loopback; ``replies(obs_bytes)`` gives each reply's bytes.

    Returns (port, stop, headers): ``headers`` collects the request headers of each connection.
    """
    import websockets.asyncio.server
    from openpi_client import msgpack_numpy

    ready, state, headers = threading.Event(), {}, []
    first = metadata if metadata is not None else msgpack_numpy.packb({"name": "evil"})

    async def handler(ws):
        headers.append(dict(ws.request.headers))
        await ws.send(first)
        async for message in ws:
            await ws.send(replies(message))

    async def serve():
        state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with websockets.asyncio.server.serve(handler, HOST, 0, compression=None, max_size=None) as server:
            state["port"] = server.sockets[0].getsockname()[1]
            ready.set()
            await state["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)

    def stop():
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)

    return state["port"], stop, headers


def forged_array(dtype, shape, data):
    """A reply whose ``actions`` is an array encoded by hand, with whatever dtype, shape and bytes are given."""
    return msgpack.packb({"actions": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}})


def test_an_openpi_reply_with_an_object_array_cannot_crash_the_process():
    pytest.importorskip("openpi_client")
    # 8 bytes that an object dtype would read as a pointer to address 0x4141414141414141
    port, stop, _ = _openpi_server(lambda _: forged_array("|O", [1], struct.pack("<Q", 0x4141414141414141)))
    code = f"""
import numpy as np
from robocasa_shift.errors import PolicyServerError
from robocasa_shift.policies.openpi.client import make_client
client = make_client({HOST!r}, {port}, timeout_s=5.0)
try:
    reply = client.infer({{"prompt": "x"}})
    print("decoded", np.asarray(reply["actions"], dtype=np.float64))
except PolicyServerError as exc:
    print("refused:", exc)
"""
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    finally:
        stop()
    assert proc.returncode == 0, f"the client process died with {proc.returncode}: {proc.stderr[-2000:]}"
    assert "refused:" in proc.stdout and "dtype '|O' refused" in proc.stdout, proc.stdout


def test_openpi_replies_are_decoded_strictly_and_bounded_in_size():
    pytest.importorskip("openpi_client")
    from robocasa_shift.policies.openpi.client import make_client

    good = np.arange(6, dtype=np.float32).reshape(2, 3)
    cases = {
        "void": (forged_array("|V8", [1], b"\0" * 8), "refused"),
        "structured": (forged_array("<i4,|O", [1], b"\0" * 12), "refused"),
        "unicode": (forged_array("<U1", [1], b"\0" * 4), "refused"),
        "not a dtype string": (forged_array(["<f4"], [1], b"\0" * 4), "dtype string"),
        "short buffer": (forged_array("<f4", [2, 3], b"\0" * 8), "needs 24 bytes"),
        "huge shape": (forged_array("<f8", [2**31, 2**31], b"\0" * 8), "needs"),
        "negative shape": (forged_array("<f8", [-1], b""), "shape"),
        "too big": (msgpack.packb({"actions": b"\0" * 4096}), "max_message_bytes"),
        "good": (msgpack.packb({"actions": {b"__ndarray__": True, b"data": good.tobytes(), b"dtype": "<f4",
                                            b"shape": [2, 3]}}), None),
    }
    current = {}
    port, stop, _ = _openpi_server(lambda _: current["reply"])
    try:
        for name, (reply, error) in cases.items():
            current["reply"] = reply
            client = make_client(HOST, port, timeout_s=5.0, max_message_bytes=1024)
            if error is None:
                actions = client.infer({"prompt": "x"})["actions"]
                assert actions.dtype == np.float32 and np.array_equal(actions, good) and actions.flags.writeable
            else:
                with pytest.raises(PolicyServerError, match=error):
                    client.infer({"prompt": "x"})
                assert client.closed, name
            client.close()
    finally:
        stop()
    # metadata goes through the same decoder
    port, stop, _ = _openpi_server(lambda _: b"", metadata=forged_array("|O", [1], b"\0" * 8))
    try:
        with pytest.raises(PolicyServerError, match="metadata this client refuses"):
            make_client(HOST, port, timeout_s=5.0)
    finally:
        stop()


# =========================================================================== 5: sessions per policy instance


def test_policy_instances_given_one_session_name_never_share_a_session():
    launcher = start()
    try:
        payload = {"instruction": "lift"}
        solo = Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0)
        solo.client.reset(1)
        expected = [solo.client.get_action(payload)["action.x"] for _ in range(2)]
        a = Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0, session="study")
        b = Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0, session="study")
        assert a.client.session != b.client.session
        assert a.client.session.startswith("study-") and b.client.session.startswith("study-")
        a.client.reset(1)
        b.client.reset(2)  # another worker's reset must not re-seed a
        first = a.client.get_action(payload)["action.x"]
        b.client.get_action(payload)
        second = a.client.get_action(payload)["action.x"]
        assert np.array_equal(first, expected[0]) and np.array_equal(second, expected[1])
        with pytest.raises(PolicyOptionError, match="session prefix"):
            Gr00tPolicy(host=HOST, port=launcher.port, session="a b/c")
    finally:
        launcher.stop()


def test_the_retry_cache_answers_only_the_very_same_request():
    launcher = start()
    try:
        a = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        b = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        b.session = a.session  # a client that reuses someone else's session id
        a.reset(5)
        mine = a.call("get_action", {"instruction": "a"}, seq=1)
        assert np.array_equal(a.call("get_action", {"instruction": "a"}, seq=1)["action.x"], mine["action.x"])
        with pytest.raises(PolicyServerError, match="two different requests numbered 1"):
            b.call("get_action", {"instruction": "b"}, seq=1)
        a.close()
        b.close()
    finally:
        launcher.stop()


# =========================================================================== 6: launcher access control


def test_kill_needs_a_token_and_an_explicit_switch():
    launcher = start()
    try:
        client = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        with pytest.raises(PolicyServerError, match="kill is disabled"):
            client.kill_server()
        assert client.ping() and launcher.running
        client.close()
    finally:
        launcher.stop()
    with pytest.raises(ValueError, match="allow_kill needs an API token"):
        Gr00tLauncher(CountingModel(), HOST, 0, allow_kill=True)
    launcher = start(api_token=TOKEN, allow_kill=True)
    try:
        stranger = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        with pytest.raises(PolicyServerError, match="Unauthorized"):
            stranger.kill_server()
        assert launcher.running
        Gr00tClient(HOST, launcher.port, timeout_s=5.0, api_token=TOKEN).kill_server()
        deadline = time.monotonic() + 5
        while launcher.running and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not launcher.running
        stranger.close()
    finally:
        launcher.stop()


def test_a_flood_of_sessions_cannot_evict_an_active_one():
    launcher = start(max_sessions=3, session_idle_s=60.0)
    try:
        victim = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        victim.reset(1)
        flood = [Gr00tClient(HOST, launcher.port, timeout_s=5.0) for _ in range(4)]
        flood[0].reset(0)
        flood[1].reset(0)
        with pytest.raises(PolicyServerError, match="holds 3 sessions, its maximum"):
            flood[2].reset(0)
        assert victim.get_action({"instruction": "still here"})["action.x"].shape == (4,)
        flood[0].reset(7)  # an existing session may always be re-seeded
        launcher.session_idle_s = 0.0  # now every session counts as idle: the least recently used makes room
        flood[3].reset(0)
        assert flood[1].session not in launcher.sessions and victim.session in launcher.sessions
        for client in flood + [victim]:
            client.close()
    finally:
        launcher.stop()


def test_oversized_requests_are_dropped_and_the_launcher_keeps_serving():
    launcher = start(max_message_bytes=4096)
    try:
        assert raw_request(launcher.port, packb({"endpoint": "ping", "blob": b"\0" * 65536}), timeout_s=0.5) is None
        assert "exceeds the limit" in unpackb(launcher.handle(packb({"endpoint": "ping", "blob": b"\0" * 8192})))["error"]
        client = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
        assert client.ping()
        client.close()
    finally:
        launcher.stop()


def test_curve_encryption_is_optional_and_needs_the_server_key():
    if not zmq.has("curve"):
        pytest.skip("this libzmq has no CURVE")
    public, secret = zmq.curve_keypair()
    launcher = start(curve_secret_key=secret.decode())
    try:
        assert launcher.curve_public_key == public.decode()
        encrypted = Gr00tClient(HOST, launcher.port, timeout_s=5.0, curve_server_key=public.decode())
        assert encrypted.ping()
        plain = Gr00tClient(HOST, launcher.port, timeout_s=0.3, retries=0)
        assert not plain.ping()  # no handshake without the key
        encrypted.close()
        plain.close()
    finally:
        launcher.stop()


# =========================================================================== 7: clients never show tokens


def test_clients_never_log_or_return_their_tokens(caplog):
    launcher = start(api_token=TOKEN)
    try:
        policy = Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0, api_token=TOKEN)
        policy.client.reset(1)  # the token still reaches the server
        seen = [repr(vars(policy)), repr(vars(policy.client)), json.dumps(policy.identity())]
        wrong = Gr00tPolicy(host=HOST, port=launcher.port, timeout_s=5.0, api_token=TOKEN + "-wrong")
        with pytest.raises(PolicyServerError) as info:
            wrong.client.ping() or wrong.client.call("ping", requires_input=False)
        seen.append(str(info.value))
        silent = zmq.Context.instance().socket(zmq.REP)
        port = silent.bind_to_random_port(f"tcp://{HOST}")
        quiet = Gr00tClient(HOST, port, timeout_s=0.2, retries=0, api_token=TOKEN)
        with pytest.raises(PolicyServerTimeout) as info:
            quiet.get_modality_config()
        seen.append(str(info.value))
        silent.close(linger=0)
        for thing in (policy, wrong, quiet):
            thing.close()
    finally:
        launcher.stop()
    seen.append(caplog.text)
    assert not [text for text in seen if TOKEN in text]


def test_the_openpi_client_sends_its_key_but_never_shows_it():
    pytest.importorskip("openpi_client")
    from openpi_client import msgpack_numpy

    from robocasa_shift.policies.openpi.client import OpenpiPolicy

    key = "openpi-key-XYZ"
    reply = msgpack_numpy.packb({"actions": np.zeros((10, 12), np.float32)})
    port, stop, headers = _openpi_server(lambda _: reply)
    try:
        policy = OpenpiPolicy(host=HOST, port=port, timeout_s=5.0, api_key=key)
        assert headers[-1].get("authorization") == f"Api-Key {key}"
        seen = [repr(vars(policy)), repr(vars(policy.client)), json.dumps(policy.identity())]
        policy.close()
    finally:
        stop()
    with pytest.raises(PolicyServerError) as info:  # a password in the URI stays out of errors
        OpenpiPolicy(host=f"ws://user:pw-XYZ@{HOST}:{port}", port=None, connect_timeout_s=2.0)
    seen.append(str(info.value))
    assert "user:<redacted>@" in str(info.value)
    assert not [text for text in seen if key in text or "pw-XYZ" in text]
