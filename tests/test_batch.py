"""Batched policy calls and lockstep rollouts: same records as one rollout at a time."""

import json

import numpy as np
import pytest
from helpers import cli

from robocasa_shift.core.records import RolloutKey
from robocasa_shift.study.executors import lockstep_groups


def test_lockstep_groups_hold_conditions_of_one_base_episode():
    keys = [RolloutKey("formal", t, e, c) for t in ("Lift", "Stack") for e in (0, 1) for c in ("clean", "blur:L1", "base:L2")]
    groups = lockstep_groups(list(reversed(keys)), batch=2)
    assert sorted(k for g in groups for k in g) == sorted(keys)  # nothing lost, nothing duplicated
    for group in groups:
        assert 1 <= len(group) <= 2
        assert len({(k.task, k.phase, k.episode, k.replicate) for k in group}) == 1
    assert [len(g) for g in lockstep_groups(keys, batch=1)] == [1] * len(keys)
    assert len(lockstep_groups(keys, batch=13)) == 4  # 2 tasks x 2 episodes


def test_keypoint_net_output_does_not_depend_on_the_batch():
    torch = pytest.importorskip("torch")
    from robocasa_shift.policies.reference.nets import KeypointNet

    torch.manual_seed(0)
    net = KeypointNet(6).eval()
    images = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (13, 96, 96, 3), dtype=np.uint8))
    batched = net.predict(images)
    alone = torch.cat([net.predict(images[i : i + 1]) for i in range(len(images))])
    assert torch.equal(batched, alone)
    assert torch.equal(net.predict(images[3:9])[2], batched[5])
    with torch.no_grad():
        assert float((batched - net(images)).abs().max()) < 1e-5  # the training-time forward, up to the last bits


def _records(run_dir):
    out = {}
    for path in sorted(run_dir.glob("records/**/*.json")):
        rec = json.loads(path.read_text())
        out[path.name] = {k: v for k, v in rec.items() if k not in ("timing", "wall_s")}
    return out


def test_batched_run_writes_the_records_of_an_unbatched_run(tmp_path):
    conditions = "clean,blur:L3,camera:L3,illumination:L1"
    for batch in (1, 3):
        cli("run", "--backend", "fake", "--task", "Reach", "--condition", conditions, "--episodes", "0-1",
            "--policy", "fake", "--workers", "1", "--batch", str(batch), "--no-progress",
            "--run-dir", str(tmp_path / f"b{batch}"))
    one, three = _records(tmp_path / "b1"), _records(tmp_path / "b3")
    assert len(one) == 8 and one == three
    assert all(r["valid"] and r["policy_calls"] > 0 for r in one.values())
    # the lockstep rollouts end at different steps (blur:L3 fails at the horizon, the others succeed early)
    assert len({r["steps"] for r in one.values()}) > 1 and {r["success"] for r in one.values()} == {True, False}
    manifest = json.loads((tmp_path / "b3" / "manifest.json").read_text())
    assert manifest["executions"][0]["batch"] == 3


def test_each_backends_bench_result_goes_beside_the_others_in_one_file(tmp_path):
    from robocasa_shift.bench import merged
    from robocasa_shift.errors import BadInput

    out = tmp_path / "bench.json"
    assert merged(out, {"backend": "libero", "figures": {}}) == {"backends": {"libero": {"backend": "libero", "figures": {}}}}
    out.write_text(json.dumps({"task": "Lift", "figures": {"physics_sps": {}}}))  # a result of one backend, from before
    document = merged(out, {"backend": "robocasa", "figures": {"x": 1}})
    assert sorted(document["backends"]) == ["robocasa", "robosuite"]
    assert document["backends"]["robosuite"]["task"] == "Lift"
    out.write_text(json.dumps(document))
    again = merged(out, {"backend": "robocasa", "figures": {"x": 2}})  # the backend's own entry is replaced
    assert again["backends"]["robocasa"]["figures"] == {"x": 2} and again["backends"]["robosuite"]["task"] == "Lift"
    for text in ("[1, 2]", "{not json", '{"figures": 3}'):
        out.write_text(text)
        with pytest.raises(BadInput, match="bench.json: not a bench result"):
            merged(out, {"backend": "libero"})
    proc = cli("bench", "--backend", "robosuite", "--out", str(out), check=False)  # refused before anything is measured
    assert proc.returncode == 2 and "not a bench result" in proc.stderr and out.read_text() == '{"figures": 3}'
    proc = cli("bench", "--backend", "fake", "--out", str(tmp_path / "new.json"), check=False)
    assert proc.returncode == 2 and "not 'fake'" in proc.stderr and not (tmp_path / "new.json").exists()


@pytest.mark.sim
def test_bench_compares_like_with_like(lift_env):
    """The bare loop the overhead is measured against ends in the harness rollout's exact state."""
    from robocasa_shift.bench import InProcess

    local = InProcess(lift_env, steps=24)
    _, steps, harness_qpos = local.harness(4)
    _, bare_qpos = local.bare(4, steps)
    assert steps == 24 and np.array_equal(harness_qpos, bare_qpos)
    assert local.physics_sps() > 0


@pytest.mark.sim
def test_the_physics_limit_retraces_the_harness_rollout_and_the_profile_adds_up(lift_env):
    """physics_limit_ratio's denominator is bare mj_step over the rollout's own substep controls, ending in its
    exact state; render_limit_ratio's renders are the frames the rollout rendered; the stock rollouts of
    fastpath_speedup end there too, with and without cameras; the profile's parts are all there."""
    from robocasa_shift.bench import InProcess

    local = InProcess(lift_env, steps=16)
    starts, controls, frames, harness_qpos, integrated_qpos = local.limits(4)
    seconds, physics_qpos = local.bare_physics(starts, controls)
    assert len(controls) == 16 * 25 and seconds > 0 and np.array_equal(physics_qpos, harness_qpos)
    assert np.array_equal(integrated_qpos, harness_qpos)  # nothing writes the state after the last integration
    assert [(cam, size) for _, cam, size in frames[:2]] == [("robot0_robotview", 128), ("robot0_eye_in_hand", 128)]
    assert len(frames) == 2 * 4 and local.bare_renders(frames) > 0
    for cameras in (True, False):
        _, stock_qpos = local.stock(4, cameras=cameras)
        assert np.array_equal(stock_qpos, harness_qpos)
    assert lift_env.fastpath["enabled"] and "step" in vars(lift_env.raw)  # the fast path is back on
    assert "action_dim" in vars(type(lift_env.raw.robots[0]))
    parts = local.profile(4)
    assert set(parts) == {"physics", "controller", "observables", "render", "policy", "bookkeeping"}
    assert all(parts[p] > 0 for p in ("physics", "controller", "observables", "render"))
    assert parts["bookkeeping"] > 0  # the timed parts do not overlap (they would add up to more than the total)
    renders = local.render_ms(culled=True, frames=2)
    assert set(renders) == {"robot0_robotview", "robot0_eye_in_hand", "empty"} and renders["empty"] < renders["robot0_robotview"]

def test_the_bench_pools_stay_within_libero_s_formal_base_episodes():
    """Five repeats of eight pool rollouts on LIBERO used base episodes up to 33, past the 25 formal ones LIBERO fixes
    per task: the fourth repeat's rollouts failed at reset. Each repeat now takes the conditions of two episodes,
    other ones each repeat."""
    from robocasa_shift.backends.libero_tasks import PHASE_SHARES
    from robocasa_shift.bench import FORMAL_CONDITIONS, pool_keys

    repeats = [pool_keys("spatial-0", r, 8) for r in range(5)]
    assert all(len(keys) == 8 and len(set(keys)) == 8 for keys in repeats)
    episodes = [{k.episode for k in keys} for keys in repeats]
    assert max(max(e) for e in episodes) < PHASE_SHARES["formal"]
    assert all(not (a & b) for i, a in enumerate(episodes) for b in episodes[i + 1:])  # other episodes each repeat
    assert {k.condition for k in repeats[0]} == set(FORMAL_CONDITIONS)
    assert [len(pool_keys("Lift", 0, n)) for n in (1, 3, 5)] == [1, 3, 5]
