"""A new served protocol is one folder and a registry line: a toy protocol, written here in under 60 lines on
the served base, runs a paired study on the fake backend against a loopback server and is seeded, refused
and bounded as the built-in clients are."""

import sys
import textwrap
import threading

import msgpack
import pytest

from robocasa_shift.errors import PolicyServerError

websockets = pytest.importorskip("websockets")

TOY = {
    "__init__.py": '"""A toy served protocol: the fake world\'s planar gripper over plain msgpack."""\n',
    "client.py": textwrap.dedent('''\
        """The toy client: the gripper's position out, (k, 3) planar actions back."""

        from robocasa_shift.policies.model_io import checked_chunk
        from robocasa_shift.policies.served.connection import Connection
        from robocasa_shift.policies.served.policy import ServedPolicy


        class ToyPolicy(ServedPolicy):
            name = "toy"
            camera_roles = ()
            image_size = 16

            def __init__(self, host="127.0.0.1", port=8000, timeout_s=5.0, mode="chunk"):
                self.open(Connection(f"ws://{host}:{int(port)}", "the toy server", timeout_s=timeout_s), mode)

            def payload(self, obs):
                return {"position": [float(v) for v in obs.proprio["eef_pos"]]}

            def actions_of(self, reply):
                return checked_chunk(reply.get("actions"), 3, "actions")

            def action_dim(self):
                return 3
        '''),
}
REGISTRY_LINE = 'POLICIES.register("toy", "toyproto.client:ToyPolicy")'


class ToyServer:
    """The toy protocol's server: metadata first, then one chunk toward the origin per position; ``seeded``
    advertises seeding (the noise then comes from the seed)."""

    def __init__(self, reply=None):
        from websockets.sync.server import serve

        self.reply = reply
        self.server = serve(self.handle, "127.0.0.1", 0)
        self.port = self.server.socket.getsockname()[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, ws):
        self.authorization = ws.request.headers.get_all("Authorization")
        ws.send(msgpack.packb({"model": "toy-1"}))
        for message in ws:
            request = msgpack.unpackb(message)
            if self.reply is not None:
                ws.send(self.reply)
                continue
            x, y = request["position"][:2]
            ws.send(msgpack.packb({"actions": [[-x, -y, 1.0]] * 4}))

    def close(self):
        self.server.shutdown()


@pytest.fixture()
def toy_registered(tmp_path, monkeypatch):
    folder = tmp_path / "toyproto"
    folder.mkdir()
    for name, text in TOY.items():
        (folder / name).write_text(text)
    assert sum(len(text.splitlines()) for text in TOY.values()) + 1 < 60  # the folder and the registry line
    monkeypatch.syspath_prepend(str(tmp_path))
    from robocasa_shift.policies import POLICIES

    exec(REGISTRY_LINE, {"POLICIES": POLICIES})
    yield
    POLICIES._entries.pop("toy", None)
    sys.modules.pop("toyproto.client", None)
    sys.modules.pop("toyproto", None)


def test_a_toy_protocol_in_one_folder_runs_a_paired_study_through_the_registry(toy_registered, tmp_path):
    from robocasa_shift.config import ExecutionConfig, StudyConfig
    from robocasa_shift.study.runner import run

    server = ToyServer()
    try:
        study = StudyConfig(backend="fake", policy="toy", policy_options={"port": server.port})
        with pytest.warns(RuntimeWarning, match="takes no seed"):
            result = run(tmp_path / "run", ["Reach"], ["clean", "blur:L3"], [0], study,
                         ExecutionConfig(workers=1, progress=False))
    finally:
        server.close()
    import json

    records = [json.loads(p.read_text()) for p in sorted((tmp_path / "run" / "records").rglob("*.json"))]
    assert len(records) == 2 and result is not None
    for record in records:  # the toy's chunks reached the simulator: valid rollouts, recorded as unseeded
        assert record["valid"] and record["error"] is None and record["steps"] > 0, record
        assert record["policy"] == "toy" and record["policy_rng_fingerprint"] == "unseeded-server"


def test_the_toy_client_gets_the_bases_bounds_and_refusals(toy_registered):
    from robocasa_shift.policies import make_policy

    bomb = b"\xdd" + (2**31).to_bytes(4, "big") + b"\x90" * 1000  # a reply claiming 2^31 empty lists
    for reply, match in ((bomb, "values refused"), (msgpack.packb({"actions": [[float("nan")] * 3]}), "non-finite"),
                         (msgpack.packb({"actions": [[1.0, 2.0]]}), "expected")):
        server = ToyServer(reply)
        try:
            policy = make_policy("toy", port=server.port)
            with pytest.warns(RuntimeWarning):
                policy.reset(0)
            with pytest.raises(PolicyServerError, match=match):
                policy.act(_observation())
            policy.close()
        finally:
            server.close()


def _observation():
    import numpy as np

    from robocasa_shift.core.policy import Observation

    return Observation({}, {}, {"eef_pos": np.array([0.1, 0.2])}, "reach", 0, task="Reach")


def test_after_a_failure_the_base_refuses_until_the_next_reset_reconnects(toy_registered):
    """A reconnect mid-rollout would reach a fresh server session (its seed lost): only a reset reconnects."""
    from robocasa_shift.policies import make_policy

    server = ToyServer()
    try:
        policy = make_policy("toy", port=server.port, timeout_s=0.3)
        with pytest.warns(RuntimeWarning):
            policy.reset(0)
        server.reply = msgpack.packb([1, 2])  # not a dict: the connection is closed
        with pytest.raises(PolicyServerError, match="expected a dict"):
            policy.act(_observation())
        server.reply = None
        with pytest.raises(PolicyServerError, match="was closed after an earlier error"):
            policy.act(_observation())
        assert policy.client.closed
        policy.reset(1)
        assert not policy.client.closed and policy.act(_observation()).shape == (4, 3)
        policy.close()
    finally:
        server.close()


def test_the_connection_keeps_its_key_and_the_uri_password_out_of_its_attributes():
    from robocasa_shift.policies.served.connection import Connection

    server = ToyServer()
    try:
        client = Connection(f"ws://user:pw-XYZ@127.0.0.1:{server.port}", "the toy server", api_key="key-XYZ",
                            auth_scheme="Api-Key")
        client.connect()
        assert "Api-Key key-XYZ" in server.authorization  # the key still reaches the server
        shown = repr(vars(client)) + client.uri
        assert "key-XYZ" not in shown and "pw-XYZ" not in shown and "user:<redacted>@" in client.uri
        client.close()
    finally:
        server.close()
