"""Branching and sampling served policies: the GR00T launcher's and the openpi shim's session state, on loopback.

Stand-in models act in the fake backend's world and draw their noise from the generator the server
manages (``served_standins``): GR00T's from torch's global generator, openpi's from a PRNG key held in
the policy's ``_rng`` and split at every call, as openpi's JAX ``Policy`` does. Checked: what the servers
advertise, that a restored session continues bit for bit (chunk and step modes, the client-side buffer
included), that sampling leaves the state as it was, that a stock server keeps the refusal with its
reason, and every refusal of a state blob (another server, model or client, altered, oversized, not a
blob), with the token checked before anything is decoded.
"""

import hashlib
import json

import msgpack
import numpy as np
import pytest
from served_standins import (
    GR00T_OPTIONS,
    OPENPI_OPTIONS,
    Gr00tFakeModel,
    OpenpiFakePolicy,
    split_key,
)
from test_policy_state import SEED, assert_portable, check_continuation, through_npz

from robocasa_shift.backends import get_backend
from robocasa_shift.core.backend import cameras_for_roles
from robocasa_shift.core.policy import Observation, state_support
from robocasa_shift.errors import PolicyServerError, StateUnsupported
from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.policy import Gr00tPolicy
from robocasa_shift.policies.gr00t.wire import packb, unpackb
from robocasa_shift.policies.served.policy import PolicyStateRefused
from robocasa_shift.policies.served.state import (
    MAX_STATE_BYTES,
    StateRefused,
    StateSealer,
    describe_blob,
    owner_tag,
)

pytest.importorskip("openpi_client", reason="openpi-client is not installed: pip install -e '.[openpi]'")
from openpi_client.websocket_client_policy import WebsocketClientPolicy  # noqa: E402

from robocasa_shift.policies.openpi.client import OpenpiPolicy  # noqa: E402
from robocasa_shift.policies.openpi.server import OpenpiShim  # noqa: E402

HOST = "127.0.0.1"
TOKEN = "a-token-for-the-state-tests"
REMOTE_REASON = ("the policy server holds its generators and the protocol has no call to read or restore them, "
                 "so remote policies cannot be branched")


def boundary_observations(env, make, task, n):
    """The observations at ``n`` successive decision points of a rollout of a fresh policy in the fake world
    (as ``Rollout.observe`` builds them: the policy's cameras at its size, the embodiment's action layout)."""
    policy, steps, out = make(), 0, []
    env.reset(SEED)
    policy.reset(SEED)
    for _ in range(n):
        cameras = cameras_for_roles(env, policy.camera_roles)
        out.append(Observation({c: env.render(c, policy.image_size) for c in cameras},
                               {c: ("wrist" if c in env.wrist_cameras else "third_person") for c in cameras},
                               env.proprio(), env.task.instruction, steps, task=task, action_layout=env.action_layout))
        for action in np.atleast_2d(policy.act(out[-1])):
            env.step(action)
            steps += 1
    return out


@pytest.fixture(scope="module")
def env():
    env = get_backend("fake").make("Reach")
    yield env
    env.close()


@pytest.fixture(scope="module")
def launcher():
    server = Gr00tLauncher(Gr00tFakeModel(), HOST, 0)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def shim():
    server = OpenpiShim(OpenpiFakePolicy(), HOST, 0)
    server.start()
    yield server
    server.stop()


def gr00t(server, **options):
    return Gr00tPolicy(host=HOST, port=server.port, timeout_s=5.0, **{**GR00T_OPTIONS, **options})


def openpi(server, **options):
    return OpenpiPolicy(host=HOST, port=server.port, timeout_s=5.0, **{**OPENPI_OPTIONS, **options})


MAKERS = {"gr00t": (gr00t, "launcher"), "openpi": (openpi, "shim")}


@pytest.fixture(params=sorted(MAKERS))
def served(request):
    """(name, make(**options) -> a policy connected to its server, the server)."""
    make, fixture = MAKERS[request.param]
    server = request.getfixturevalue(fixture)
    made = []

    def build(**options):
        made.append(make(server, **options))
        return made[-1]

    yield request.param, build, server
    for policy in made:
        policy.close()


# --------------------------------------------------------------------------- what is offered, and to whom


def test_our_servers_advertise_state_and_samples_and_their_policies_can_be_branched(served, launcher):
    name, make, _ = served
    policy = make()
    assert state_support(policy) is None
    assert policy.capabilities()["session_state"] is True and policy.capabilities()["sample"] is True
    # the class, not connected to any server, keeps the refusal a stock server gets
    assert state_support(type(policy)) == f"policy '{name}': {REMOTE_REASON}"
    ping = Gr00tClient(HOST, launcher.port, timeout_s=5.0).call("ping", requires_input=False)
    assert ping["capabilities"]["session_state"] and ping["capabilities"]["sample"] and ping["session_seeding"]


def test_a_stock_server_keeps_the_refusal_with_its_reason_and_offers_no_samples(env):
    from test_openpi import StandInServer

    plain_gr00t = Gr00tLauncher(Gr00tFakeModel(), HOST, 0, session_seeding=False)  # a stock N1.5 server's endpoints
    plain_gr00t.start()
    stock_openpi = StandInServer(seeded=False).start()  # openpi's own protocol
    seeded_openpi = StandInServer(seeded=True).start()  # seeded resets, but no state calls
    try:
        policies = {"gr00t": gr00t(plain_gr00t), "openpi": openpi(stock_openpi), "openpi-seeded": openpi(seeded_openpi)}
        obs = boundary_observations(env, lambda: make_fake(), "Reach", 1)[0]
        for label, policy in policies.items():
            why = state_support(policy)
            assert why.startswith(f"policy '{policy.name}': {REMOTE_REASON} (") and "offers no session state" in why
            assert "python -m robocasa_shift.policies." in why and "serve" in why, label
            with pytest.raises(StateUnsupported, match="cannot be branched"):
                policy.get_state()
            with pytest.raises(StateUnsupported, match="cannot be branched"):
                policy.set_state({})
            assert policy.sample_actions(obs, 4, np.random.default_rng(0)) is None, label
            policy.close()
    finally:
        plain_gr00t.stop()
        stock_openpi.stop()
        seeded_openpi.stop()


def make_fake():
    from robocasa_shift.policies import make_policy

    return make_policy("fake")


def test_stock_openpi_clients_are_served_by_the_shim_as_by_openpi(shim, env):
    client = WebsocketClientPolicy(HOST, shim.port)
    metadata = client.get_server_metadata()
    assert metadata["name"] == "openpi-fake" and metadata["seeded_reset"] and metadata["session_state"]
    payload = openpi(shim).payload(boundary_observations(env, make_fake, "Reach", 1)[0])
    first, second = client.infer(payload), client.infer(payload)
    assert first["actions"].shape == (4, 3) and "server_timing" in first
    assert not np.array_equal(first["actions"], second["actions"])  # the policy's own key moved on, as in openpi
    reference = OpenpiFakePolicy()
    for reply in (first, second):
        expected = reference.infer(payload)["actions"]
        assert np.array_equal(reply["actions"], expected)  # an unseeded connection draws from the policy's key


# --------------------------------------------------------------------------- state: bit for bit


@pytest.mark.parametrize("mode, at", [("chunk", 3), ("step", 6)])
def test_a_restored_session_continues_bit_for_bit_through_an_npz_file(served, env, mode, at):
    _, make, _ = served
    observations = boundary_observations(env, lambda: make(mode=mode), "Reach", 12)
    state = check_continuation(lambda: make(mode=mode), observations, at, stochastic=True)
    assert_portable(state)
    assert state["remote.blob"].dtype == np.uint8 and len(state["remote.blob"]) <= MAX_STATE_BYTES
    if mode == "step":  # 6 decisions into 4-step chunks: the restore lands mid-buffer
        assert state["buffer.actions"].shape == (4, 3) and int(state["buffer.index"]) == 2
    else:
        assert state["buffer.actions"].size == 0


def test_without_its_chunk_buffer_a_step_mode_restore_would_not_continue(served, env):
    _, make, _ = served
    observations = boundary_observations(env, lambda: make(mode="step"), "Reach", 10)
    original = make(mode="step")
    original.reset(SEED)
    for obs in observations[:6]:
        original.act(obs)
    state = original.get_state()
    expected = [original.act(obs) for obs in observations[6:]]
    restored = make(mode="step")
    restored.reset(SEED)
    restored.set_state({**state, "buffer.actions": np.zeros((0, 0)), "buffer.index": np.array(0, dtype=np.int64)})
    assert not all(np.array_equal(e, restored.act(obs)) for e, obs in zip(expected, observations[6:]))


def test_sampling_leaves_the_state_as_it_was_and_draws_from_the_callers_rng(served, env):
    _, make, _ = served
    observations = boundary_observations(env, lambda: make(), "Reach", 4)
    policy, twin = make(), make()
    for p in (policy, twin):
        p.reset(SEED)
        p.act(observations[0])
    before = policy.get_state()
    one = policy.sample_actions(observations[1], 8, np.random.default_rng(5))
    after = policy.get_state()
    assert set(before) == set(after) and all(np.array_equal(before[k], after[k]) for k in before)
    assert np.array_equal(policy.act(observations[1]), twin.act(observations[1]))  # the rollout is unchanged
    assert one.shape == (8, 3) and one[:, :2].std(axis=0).min() > 0  # the draws disagree
    assert np.array_equal(one, policy.sample_actions(observations[1], 8, np.random.default_rng(5)))
    assert not np.array_equal(one, policy.sample_actions(observations[1], 8, np.random.default_rng(6)))


# --------------------------------------------------------------------------- refusals: server, model, client, blob


def test_a_state_from_another_server_or_model_is_refused_before_it_is_sent(served, env):
    name, make, server = served
    observations = boundary_observations(env, lambda: make(), "Reach", 2)
    policy = make()
    policy.reset(SEED)
    policy.act(observations[0])
    state = policy.get_state()
    if name == "gr00t":
        restarted = Gr00tLauncher(Gr00tFakeModel(), HOST, 0)  # the same model; a new key: another fingerprint
        other_model = Gr00tLauncher(Gr00tFakeModel("another-checkpoint"), HOST, 0)
        make_on = gr00t
    else:
        restarted = OpenpiShim(OpenpiFakePolicy(), HOST, 0)
        other_model = OpenpiShim(OpenpiFakePolicy("another-checkpoint"), HOST, 0)
        make_on = openpi
    for other in (restarted, other_model):
        other.start()
    try:
        moved = make_on(restarted)
        moved.reset(SEED)
        with pytest.raises(PolicyStateRefused, match="fingerprint of .* changed between trunk and branch") as info:
            moved.set_state(state)
        assert info.value.error_kind == "policy_state" and "--state-key-file" in str(info.value)
        swapped = make_on(other_model)
        swapped.reset(SEED)
        with pytest.raises(PolicyStateRefused, match="model identity of .* changed between trunk and branch"):
            swapped.set_state(state)
        for p in (moved, swapped):
            p.close()
    finally:
        restarted.stop()
        other_model.stop()


def raw_set_state(policy, blob):
    """Send a blob straight to the server (past the client's own checks)."""
    return policy.state_request("set_state", {"blob": blob})


def test_the_server_refuses_a_blob_of_another_client_another_server_altered_oversized_or_not_a_blob(served, env):
    name, make, server = served
    obs = boundary_observations(env, lambda: make(), "Reach", 1)[0]
    alice = make(state_secret="alice")
    alice.reset(SEED)
    alice.act(obs)
    blob = alice.get_state()["remote.blob"].tobytes()
    claims = describe_blob(blob)
    assert claims["owner"] == server.sealer.owner_binding(owner_tag("alice"))
    assert claims["server"] == server.sealer.server_id

    def refused(policy, payload, match):
        with pytest.raises(PolicyServerError, match=match):
            raw_set_state(policy, payload)
        if name == "openpi":  # openpi's protocol closes the connection after a failure: reconnect
            policy.reset(SEED)

    for secret in ("bob", None):
        mallory = make(state_secret=secret)
        mallory.reset(SEED)
        refused(mallory, blob, "belongs to another client")
    alice_again = make(state_secret="alice")  # another session of the same client: accepted
    alice_again.reset(SEED)
    assert raw_set_state(alice_again, blob)["rng_fingerprint"]
    assert np.array_equal(alice_again.act(obs), alice.act(obs))  # it continues alice's session

    header, data, tag = (msgpack.unpackb(blob)[k] for k in ("header", "data", "tag"))
    flipped = bytearray(data)
    flipped[0] ^= 1
    altered = msgpack.packb({"header": header, "data": bytes(flipped), "tag": tag}, use_bin_type=True)
    refused(alice_again, altered, "altered")
    foreign = StateSealer().seal({"torch.cpu": np.zeros(3, np.uint8)}, claims["model"], claims["owner"])
    refused(alice_again, foreign, "sealed by another server")
    refused(alice_again, b"\x00" * (MAX_STATE_BYTES + 1), "exceeds the limit")
    import pickle

    refused(alice_again, pickle.dumps({"header": header}), "not a state blob")


def test_a_blob_s_owner_cannot_be_claimed_by_copying_it_into_a_reset(served, env):
    """Holding a blob (a shared run directory) confers no right to load it: the owner binding in its header is
    the server's HMAC of the owner tag, and a reset that names the copied binding as its owner binds another."""
    name, make, server = served
    alice = make(state_secret="alice")
    alice.reset(SEED)
    blob = alice.get_state()["remote.blob"].tobytes()
    copied = describe_blob(blob)["owner"]
    mallory = make(state_secret="mallory")
    mallory._owner = copied  # the attacker names alice's binding, as read from the blob, at its reset
    mallory.reset(SEED)
    with pytest.raises(PolicyServerError, match="belongs to another client"):
        raw_set_state(mallory, blob)
    # before the fix the header held the owner tag itself: naming it at reset was enough
    assert copied != owner_tag("alice")


def test_no_fast_hash_of_the_token_reaches_a_run_directory(served, env):
    """A state blob (what a snapshot keeps) holds nothing a reader can grind to the token: a 6-character token's
    owner tag is not in it, and the binding it carries depends on the server's key."""
    name, make, server = served
    token = "abc123"
    policy = make(state_secret=token)
    policy.reset(SEED)
    blob = policy.get_state()["remote.blob"].tobytes()
    tag = owner_tag(token)
    assert tag.encode() not in blob and bytes.fromhex(tag) not in blob
    assert describe_blob(blob)["owner"] == server.sealer.owner_binding(tag)
    assert StateSealer(b"another server's key, 32 bytes!!").owner_binding(tag) != server.sealer.owner_binding(tag)


@pytest.mark.parametrize("forged", ["nan", "inf", "huge", "wide", "long", "index"])
def test_a_forged_chunk_buffer_is_refused_as_a_forged_server_reply_is(served, env, forged):
    """The client-side buffer is outside the seal: restored buffers get the check server chunks get."""
    name, make, server = served
    obs = boundary_observations(env, lambda: make(), "Reach", 1)[0]
    policy = make(mode="step")
    policy.reset(SEED)
    policy.act(obs)
    state = policy.get_state()
    actions = state["buffer.actions"].copy()
    assert actions.shape[1] == 3 and len(actions) >= 2
    index = state["buffer.index"]
    if forged == "nan":
        actions[1, 0] = np.nan
    elif forged == "inf":
        actions[1, 0] = np.inf
    elif forged == "huge":
        actions[1, 0] = 1e300
    elif forged == "wide":
        actions = np.zeros((len(actions), 7))
    elif forged == "long":
        actions = np.zeros((10**6, 3))
    else:
        index = np.array(len(actions) + 1, dtype=np.int64)
    fresh = make(mode="step")
    fresh.reset(SEED)
    with pytest.raises(PolicyStateRefused, match="chunk buffer|buffer index"):
        fresh.set_state({**state, "buffer.actions": actions, "buffer.index": index})
    fresh.set_state(state)  # the real one is taken
    assert np.array_equal(fresh.act(obs), policy.act(obs))


def test_the_gr00t_launcher_checks_the_token_before_it_decodes_any_array_or_state_blob(monkeypatch):
    from test_security import raw_request

    import robocasa_shift.policies.gr00t.wire as protocol
    import robocasa_shift.policies.served.state as session_state

    decoded, opened = [], []
    monkeypatch.setattr(protocol, "_decode", lambda obj, real=protocol._decode: decoded.append(1) or real(obj))
    monkeypatch.setattr(session_state.StateSealer, "open",
                        lambda self, *a, real=session_state.StateSealer.open: opened.append(1) or real(self, *a))
    server = Gr00tLauncher(Gr00tFakeModel(), HOST, 0, api_token=TOKEN)
    server.start()
    try:
        array = packb({"x": np.zeros(3)})  # a tagged array
        decoded.clear()
        for message in (packb({"endpoint": "set_state", "session": "s", "data": {"blob": b"x" * 64}}),
                        packb({"endpoint": "get_action", "api_token": "wrong", "data": unpackb(array, arrays=False)})):
            decoded.clear()
            reply = msgpack.unpackb(raw_request(server.port, message))  # (no hook: only the server's decoding counts)
            assert reply == {"error": "Unauthorized: Invalid API token"}
            assert decoded == [] and opened == []  # refused before any array or blob was looked at
        client = Gr00tClient(HOST, server.port, timeout_s=5.0, api_token=TOKEN)
        client.reset(1)
        assert client.get_state()["blob"] and opened == []
        client.close()
    finally:
        server.stop()


def test_the_openpi_shim_checks_its_api_key_in_the_handshake_and_never_binds_an_open_port_without_one():
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(ValueError, match="API key"):
        OpenpiShim(OpenpiFakePolicy(), "0.0.0.0", 0)
    server = OpenpiShim(OpenpiFakePolicy(), HOST, 0, api_key=TOKEN)
    server.start()
    try:
        for headers in (None, {"Authorization": "Api-Key wrong"}):
            with pytest.raises(InvalidStatus, match="401"):
                connect(f"ws://{HOST}:{server.port}", additional_headers=headers, open_timeout=5)
        assert server.connections == 0  # no frame was read: the handler never ran
        policy = OpenpiPolicy(host=HOST, port=server.port, api_key=TOKEN, timeout_s=5.0, **OPENPI_OPTIONS)
        policy.reset(3)  # the API key is also the owner secret when no state_secret is given
        owner = describe_blob(policy.get_state()["remote.blob"].tobytes())["owner"]
        assert owner == server.sealer.owner_binding(owner_tag(TOKEN)) != owner_tag(TOKEN)
        policy.close()
    finally:
        server.stop()


def test_sealed_blobs_are_deterministic_plain_and_refuse_non_numeric_arrays():
    sealer = StateSealer(b"k" * 32)
    arrays = {"torch.cpu": np.arange(5, dtype=np.uint8), "numpy.pos": np.array(3, dtype=np.int64)}
    blob = sealer.seal(arrays, "m" * 64, owner_tag(None))
    assert blob == StateSealer(b"k" * 32).seal(arrays, "m" * 64, owner_tag(None))  # no time, no session id
    opened = StateSealer(b"k" * 32).open(blob, "m" * 64, owner_tag(None))  # the same key: a restart with the key file
    assert {k: (v.dtype, v.shape, v.tolist()) for k, v in opened.items()} == \
        {k: (v.dtype, v.shape, v.tolist()) for k, v in arrays.items()}
    with pytest.raises(StateRefused, match="only bool, integer and float"):
        sealer.seal({"x": np.array(["text"])}, "m", owner_tag(None))
    with pytest.raises(StateRefused, match="another model"):
        sealer.open(blob, "n" * 64, owner_tag(None))
    header = json.loads(msgpack.unpackb(blob)["header"])
    header["index"][0][1] = "|O"  # an object dtype in a forged header (the tag then fails first)
    forged = msgpack.packb({**msgpack.unpackb(blob), "header": json.dumps(header).encode()}, use_bin_type=True)
    with pytest.raises(StateRefused, match="altered"):
        sealer.open(forged, "m" * 64, owner_tag(None))
    with pytest.raises(StateRefused, match="refused"):
        describe_blob(forged)  # what an audit reads without the key is checked as strictly


def test_the_standin_key_split_is_deterministic_and_the_shim_swaps_the_key_per_connection(shim, env):
    key = np.array([0, 7], dtype=np.uint32)
    assert all(np.array_equal(a, b) for a, b in zip(split_key(key), split_key(key)))
    a, b = openpi(shim), openpi(shim)
    obs = boundary_observations(env, make_fake, "Reach", 1)[0]
    a.reset(7)
    first = a.act(obs)
    b.reset(7)
    assert np.array_equal(b.act(obs), first)  # one seed, one key, one chunk, whatever else the shim served
    assert hashlib.sha256(shim.policy._rng.tobytes()).hexdigest()  # the policy's own key is put back
    for p in (a, b):
        p.close()


def test_states_survive_an_npz_round_trip_unchanged(served, env):
    _, make, _ = served
    policy = make(mode="step")
    policy.reset(SEED)
    for obs in boundary_observations(env, lambda: make(mode="step"), "Reach", 3):
        policy.act(obs)
    state = policy.get_state()
    loaded = through_npz(state)
    assert all(np.array_equal(loaded[k], state[k]) and loaded[k].dtype == state[k].dtype for k in state)


def test_the_shim_holds_real_jax_keys_as_openpi_s_jax_policy_splits_them():
    """Skipped without jax (not a dependency): run it where jax is installed, e.g. beside openpi."""
    jax = pytest.importorskip("jax", reason="jax is not installed here (openpi's JAX policies need it)")
    from robocasa_shift.policies.openpi.server import KeySessionRNG
    from robocasa_shift.policies.served.state import restore_rng, rng_arrays

    class JaxPolicy:  # openpi's Policy.infer: self._rng, sample_rng = jax.random.split(self._rng)
        def __init__(self, key):
            self._rng = key

        def infer(self, obs):
            self._rng, sample_rng = jax.random.split(self._rng)
            return {"actions": np.asarray(jax.random.normal(sample_rng, (4, 3)))}

    for make_key in (jax.random.key, jax.random.PRNGKey):  # typed keys and raw uint32 keys
        policy = JaxPolicy(make_key(0))
        own = policy._rng
        session = KeySessionRNG(policy, 7)
        first = session.run(lambda: policy.infer({}))["actions"]
        assert policy._rng is own  # the policy's own key is put back
        assert np.array_equal(first, JaxPolicy(make_key(7)).infer({})["actions"])  # the seed is PRNGKey(seed)'s
        saved = rng_arrays(session)
        second = session.run(lambda: policy.infer({}))["actions"]
        restored = KeySessionRNG(policy, 0)
        restore_rng(restored, saved)
        assert np.array_equal(restored.run(lambda: policy.infer({}))["actions"], second)


def test_sample_without_a_seed_draws_from_a_copy_of_the_sessions_generator_without_advancing_it(launcher, env):
    obs = boundary_observations(env, make_fake, "Reach", 1)[0]
    policy = gr00t(launcher)
    payload = policy.payload(obs)
    client = Gr00tClient(HOST, launcher.port, timeout_s=5.0)
    client.reset(4)
    copies = client.sample(payload, 3, None)["samples"]
    assert all(np.array_equal(a["action.planar"], b["action.planar"])
               for a, b in zip(copies, client.sample(payload, 3, None)["samples"]))  # the session did not move
    nxt = client.get_action(payload)  # the copy's first draw is the session's next one
    assert np.array_equal(copies[0]["action.planar"], nxt["action.planar"])
    assert not np.array_equal(copies[1]["action.planar"], nxt["action.planar"])
    client.close()
    policy.close()


def test_the_launchers_state_key_file_keeps_its_id_and_a_short_one_is_refused_before_the_model_loads(tmp_path,
                                                                                                  monkeypatch):
    from robocasa_shift.policies.gr00t import server as launcher_cli

    key = tmp_path / "state.key"
    key.write_bytes(b"x" * 32)
    args = launcher_cli.argparse.Namespace(curve_secret_key_file=None, host=HOST, port=0, serializer="msgpack",
                                           api_token=None, max_sessions=8, session_idle_s=60.0, allow_kill=False,
                                           max_message_bytes=2**20, state_key_file=str(key))
    built = launcher_cli._build_launcher(args, Gr00tFakeModel(), {})
    assert built.sealer.server_id == StateSealer(b"x" * 32).server_id  # a restart with the file: the same id

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(launcher_cli, "build_gr00t_model", no_model)
    key.write_bytes(b"short")
    assert launcher_cli.main(["serve", "--model-path", "m", "--data-config", "d", "--state-key-file", str(key)]) == 2


def test_the_shim_command_refuses_a_bad_factory_an_open_bind_without_a_key_and_a_short_state_key(tmp_path,
                                                                                              monkeypatch, capsys):
    from robocasa_shift.policies.openpi import server as openpi_server

    monkeypatch.delenv(openpi_server.KEY_ENV, raising=False)
    factory = ["serve", "--policy-factory", "served_standins:make_openpi_policy", "--port", "0"]
    assert openpi_server.main(["serve", "--policy-factory", "served_standins"]) == 2
    assert "expected MODULE:FUNCTION" in capsys.readouterr().err
    assert openpi_server.main(["serve", "--policy-factory", "served_standins:nothing_here"]) == 2
    assert "no callable 'nothing_here'" in capsys.readouterr().err
    assert openpi_server.main([*factory, "--host", "0.0.0.0"]) == 2
    assert "OPENPI_API_KEY" in capsys.readouterr().err
    (tmp_path / "k").write_bytes(b"short")
    assert openpi_server.main([*factory, "--state-key-file", str(tmp_path / "k")]) == 2
    assert "at least 32 bytes" in capsys.readouterr().err


def test_the_launcher_command_serves_a_model_factory_and_refuses_bad_source_arguments(monkeypatch, capsys):
    from robocasa_shift.policies.gr00t import server as launcher_cli

    monkeypatch.delenv(launcher_cli.TOKEN_ENV, raising=False)
    monkeypatch.setattr(launcher_cli, "build_gr00t_model", lambda *a, **k: pytest.fail("no model may load"))
    assert launcher_cli.main(["serve", "--model-path", "m"]) == 2
    assert "--model-path needs --data-config" in capsys.readouterr().err
    assert launcher_cli.main(["serve", "--model-path", "m", "--data-config", "d", "--factory-option", "a=1"]) == 2
    assert "--factory-option is for --model-factory" in capsys.readouterr().err
    assert launcher_cli.main(["serve", "--model-factory", "served_standins"]) == 2
    assert "--model-factory 'served_standins': expected MODULE:FUNCTION" in capsys.readouterr().err
    assert launcher_cli.main(["serve", "--model-factory", "served_standins:nothing_here"]) == 2
    assert "no callable 'nothing_here'" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # exactly one source of the model
        launcher_cli.main(["serve", "--model-path", "m", "--model-factory", "served_standins:make_gr00t_model"])
    # a factory's model is served as a checkpoint's would be; --factory-option reaches the factory (start is
    # stubbed: the launcher never runs, so main returns at once; the branch studies serve one for real)
    served = {}
    monkeypatch.setattr(launcher_cli.Gr00tLauncher, "start", lambda self, timeout_s=10.0: served.setdefault("l", self).port)
    assert launcher_cli.main(["serve", "--model-factory", "served_standins:make_gr00t_model", "--factory-option",
                              "name=other", "--port", "0"]) == 0
    launcher = served["l"]
    assert launcher.model.name == "other" and launcher.offers_session_state
    assert launcher.model_info == {"model_factory": "served_standins:make_gr00t_model", "factory_options": {"name": "other"}}
    assert "serving served_standins:make_gr00t_model on tcp://127.0.0.1:0" in capsys.readouterr().out
