"""``robocasa_shift.gym``: a perturbed, paired episode for someone else's loop, recorded as the CLI records it.

A plain Python loop drives ``PerturbedEnv`` (and ``gymnasium.make`` ids) on the fake backend, where the
same keys run by the harness itself give identical records, and on the robosuite backend; the run
directories then pass ``audit``, and ``export``, ``analyze``, ``compare`` and ``report`` read them.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gymnasium = pytest.importorskip("gymnasium", reason="the Gymnasium wrapper needs gymnasium: pip install -e '.[gym]'")

import robocasa_shift.gym as rsgym  # noqa: E402
from robocasa_shift import seeding  # noqa: E402
from robocasa_shift.config import ExecutionConfig, StudyConfig  # noqa: E402
from robocasa_shift.core.policy import Observation  # noqa: E402
from robocasa_shift.core.records import RolloutKey  # noqa: E402
from robocasa_shift.errors import BadInput, RunDirError, UnknownNameError  # noqa: E402
from robocasa_shift.policies.scripted.fake import FakePolicy  # noqa: E402
from robocasa_shift.rundir.store import RunStore  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONDITIONS = ["clean", "camera:L3", "illumination:L3", "blur:L3", "base:L2"]
SAME = ("success", "steps", "stage_steps", "stages_completed", "first_incomplete", "env_fingerprint",
        "policy_rng_fingerprint", "perturbation", "env_seed", "policy_seed", "horizon", "valid", "truncated")


def cli(*args):
    proc = subprocess.run([sys.executable, "-m", "robocasa_shift", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def drive_fake_policy(env, episode, condition):
    """Someone else's loop: the fake policy fed from gymnasium observations, its chunks run open loop."""
    obs, info = env.reset(options={"episode": episode, "condition": condition})
    policy = FakePolicy()
    policy.reset(info["policy_seed"])
    env.unwrapped.report_policy_fingerprint(policy.rng_fingerprint())
    while True:
        seen = Observation(obs["images"], info["camera_roles"], obs["proprio"], obs["instruction"], info["step"],
                           task=info["task"])
        for action in policy.act(seen):
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                return reward, terminated, truncated, info


def test_a_plain_loop_on_the_fake_backend_records_what_the_harness_records_and_audits_clean(tmp_path):
    harness, loop = tmp_path / "harness", tmp_path / "loop"
    from robocasa_shift import run_study

    run_study(harness, ["PickPlace"], CONDITIONS, range(3), StudyConfig(backend="fake", policy="fake"),
              ExecutionConfig(workers=1, progress=False))
    env = gymnasium.make("robocasa_shift/fake-PickPlace-v0", run_dir=str(loop), policy="fake",
                         camera_roles=("third_person",), image_size=64)
    outcomes = []
    for episode in range(3):
        for condition in CONDITIONS:
            reward, terminated, truncated, info = drive_fake_policy(env, episode, condition)
            outcomes.append((terminated, truncated))
            assert terminated != truncated and reward == float(terminated)
            assert info["policy_seed"] == seeding.policy_seed(seeding_study_seed(), "PickPlace", "formal", episode)
            assert info["record"] is not None and Path(info["record"]).exists()
            if terminated:
                assert info["success"] and info["latched"] == list(info["subgoals"])
                assert info["step"] < info["horizon"]
            else:
                assert info["step"] == info["horizon"] == 40
    env.close()
    assert (True, False) in outcomes and (False, True) in outcomes  # both endings were seen
    ours = {RolloutKey.from_record(r): r for r in RunStore(loop).records()}
    theirs = {RolloutKey.from_record(r): r for r in RunStore(harness).records()}
    assert set(ours) == set(theirs) and len(ours) == 15
    for key, rec in ours.items():
        assert {f: rec[f] for f in SAME} == {f: theirs[key][f] for f in SAME}, key.id
        assert rec["policy_calls"] == rec["steps"]  # the loop observes every step
    manifest = RunStore(loop).manifest()
    assert manifest["policy"] == {"name": "fake", "driver": rsgym.DRIVER, "camera_roles": ["third_person"],
                                  "image_size": 64}
    assert "gymnasium" in manifest["versions"] and manifest["renderer"]
    assert "audit: PASSED" in cli("audit", str(loop))
    cli("export", str(loop), "--out", str(tmp_path / "records.csv"))
    cli("analyze", str(tmp_path / "records.csv"), "--out", str(tmp_path / "analysis"))
    summary = json.loads((tmp_path / "analysis" / "summary.json").read_text())
    assert set(summary["conditions"]) == set(CONDITIONS)
    compared = cli("compare", str(loop), str(harness), "--out", str(tmp_path / "compare"))
    assert "camera:L3" in compared
    cli("report", str(loop))  # its matched-pair videos are left out: an external loop cannot be re-run
    assert (loop / "report" / "index.html").exists() and not list((loop / "report").glob("*.mp4"))
    assert "the report cannot re-run" in (loop / "report" / "index.html").read_text()


def seeding_study_seed():
    from robocasa_shift.core import specs

    return specs.load_protocol().study_seed


def test_reset_pairs_the_conditions_of_a_base_episode_and_returns_the_delivered_observation(tmp_path):
    env = rsgym.PerturbedEnv("fake", "PickPlace", "clean", 2, run_dir=tmp_path / "run", image_size=32)
    try:
        infos = {}
        for n, condition in enumerate(("clean", "blur:L3", "language:L1", "clean")):
            obs, info = env.reset(options={"condition": condition, "episode": 2})
            assert obs in env.observation_space
            assert list(obs["images"]) == ["agentview", "eye_in_hand"] and obs["images"]["agentview"].shape == (32, 32, 3)
            infos.setdefault(condition, []).append((obs, info))
            env.step(np.zeros(3))
            env.reset(options={"condition": "camera:L1", "replicate": n + 1})  # ends the episode above after 1 step
            env.step(np.zeros(3))
        clean, blur, language = infos["clean"][0], infos["blur:L3"][0], infos["language:L1"][0]
        assert clean[1]["env_fingerprint"] == blur[1]["env_fingerprint"] == language[1]["env_fingerprint"]
        assert clean[1]["policy_seed"] == blur[1]["policy_seed"]
        assert not np.array_equal(clean[0]["images"]["agentview"], blur[0]["images"]["agentview"])  # blurred
        assert np.array_equal(clean[0]["proprio"]["eef_pos"], blur[0]["proprio"]["eef_pos"])
        assert language[0]["instruction"] != clean[0]["instruction"]  # the paraphrase is what is delivered
        assert blur[1]["perturbation"]["factor"] == "blur" and clean[1]["perturbation"] is None
        assert set(clean[1]["subgoals"]) == set(env.stage_spec.names) and clean[1]["latched"] == []
        # the second clean reset of key formal/PickPlace/2/clean/r0 supersedes the first one, truncated
        assert np.array_equal(infos["clean"][1][0]["images"]["agentview"], clean[0]["images"]["agentview"])
    finally:
        env.close()
    store = RunStore(tmp_path / "run")
    records = store.records()
    # an episode the loop ended (reset, close) is a valid record truncated where it stopped, not an error
    assert all(r["valid"] and r["truncated"] and r["steps"] == 1 and r["success"] is False for r in records)
    assert {(r["condition"], r["replicate"]) for r in records} == {
        ("clean", 0), ("blur:L3", 0), ("language:L1", 0), *(("camera:L1", n) for n in range(1, 5))}
    assert len(store.records("history")) == 1  # the first clean episode, superseded
    assert "FAILED {\"unexpected_truncations\": 7}" in cli_status(tmp_path / "run")


def test_misuse_is_refused_and_a_key_runs_once(tmp_path):
    env = rsgym.PerturbedEnv("fake", "Reach", run_dir=tmp_path / "run", camera_roles=("third_person",),
                             image_size=16)
    try:
        with pytest.raises(gymnasium.error.ResetNeeded):
            env.step(np.zeros(3))
        obs, info = env.reset(options={"policy_rng_fingerprint": "my-generator-hash"})
        assert info["policy_rng_fingerprint"] == "my-generator-hash"
        with pytest.raises(ValueError, match=r"has shape \(3,\), got \(12,\)"):
            env.step(np.zeros(12))
        with pytest.raises(ValueError, match="non-finite"):
            env.step(np.array([np.nan, 0, 0]))
        while True:  # the episode goes on after a refused action
            *_, terminated, truncated, info = env.step(np.zeros(3))
            if terminated or truncated:
                break
        with pytest.raises(gymnasium.error.ResetNeeded):
            env.step(np.zeros(3))
        with pytest.raises(RunDirError, match="formal/Reach/0000/clean/r0 already has a complete record"):
            env.reset(seed=0)
        with pytest.raises(RunDirError, match="formal/Reach/0000/clean/r0 already has a complete record"):
            env.reset(options={"episode": 0})
        assert env.reset()[1]["key"] == "formal/Reach/0001/clean/r0"  # the next episode not yet planned
        with pytest.raises(BadInput, match="takes no option 'seed_of_policy'"):
            env.reset(options={"seed_of_policy": 1})
        with pytest.raises(UnknownNameError, match="unknown condition|unknown level|unknown factor"):
            env.reset(options={"condition": "camera:L9"})
        env.reset(options={"episode": 3})  # the one above was never stepped: unclaimed, not recorded
        env.step(np.zeros(3))
    finally:
        env.close()  # writes the episode in progress as truncated
    assert [k.episode for k in RunStore(tmp_path / "run").planned_keys()] == [0, 3]
    assert "audit: PASSED" not in cli_status(tmp_path / "run")
    with pytest.raises(UnknownNameError, match="unknown task"):
        rsgym.PerturbedEnv("fake", "Lift")
    with pytest.raises(UnknownNameError, match="phase"):
        rsgym.PerturbedEnv("fake", "Reach", phase="training")


def cli_status(run):
    proc = subprocess.run([sys.executable, "-m", "robocasa_shift", "audit", str(run)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    return proc.stdout


def test_envs_share_the_run_directory_with_each_other_and_a_command_is_refused_beside_them(tmp_path):
    run = tmp_path / "run"
    a = rsgym.PerturbedEnv("fake", "Reach", run_dir=run, camera_roles=(), image_size=16)
    b = rsgym.PerturbedEnv("fake", "PickPlace", run_dir=run, camera_roles=(), image_size=16)
    try:
        code = (f"import robocasa_shift.gym as g\ng.PerturbedEnv('fake', 'Reach', run_dir={str(run)!r}, camera_roles=(), image_size=16).close()\n"
                "print('shared')")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert out.stdout.strip() == "shared", out.stderr  # another process's env (an async sub-env) shares it
        proc = subprocess.run([sys.executable, "-m", "robocasa_shift", "run", "--backend", "fake", "--policy", "fake",
                               "--task", "Reach", "--condition", "clean", "--episodes", "5", "--run-dir", str(run)],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert proc.returncode == 4 and "in use by another process (Gymnasium environments" in proc.stderr, proc.stderr
        for env in (a, b):
            obs, _ = env.reset()
            assert "images" not in obs  # a policy that reads no camera gets no image, as in the harness
            while not any(env.step(np.zeros(3))[2:4]):
                pass
    finally:
        a.close()
        b.close()
    assert "audit: PASSED" in cli("audit", str(run))


def test_the_registered_ids_pass_gymnasium_s_env_checker():
    assert "robocasa_shift/PerturbedEnv-v0" in gymnasium.registry
    assert {"robocasa_shift/robosuite-Lift-v0", "robocasa_shift/libero-spatial-0-v0"} <= set(rsgym.ENV_IDS)
    env = gymnasium.make("robocasa_shift/PerturbedEnv-v0", backend="fake", task="Reach", condition="camera:L1",
                         image_size=24, render_mode="rgb_array")
    try:
        from gymnasium.utils.env_checker import check_env

        with _no_warnings():
            check_env(env.unwrapped, skip_render_check=False)
        env.reset()
        assert env.render().shape == (24, 24, 3)
    finally:
        env.close()
    # a policy that reads no camera: no images key (gymnasium.make's passive checker refuses an empty Dict space)
    blind = gymnasium.make("robocasa_shift/fake-Reach-v0", camera_roles=(), image_size=16)
    try:
        with _no_warnings():
            check_env(blind.unwrapped)
        assert "images" not in blind.reset()[0]
    finally:
        blind.close()


class _no_warnings:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings(record=True)
        self.caught = self._catch.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)
        # proprio is unbounded (as in gymnasium's own MuJoCo environments, which earn the same warning)
        relevant = [str(w.message) for w in self.caught if ("robocasa_shift" in str(w.filename) or "gymnasium" in
                    str(w.filename)) and "infinity" not in str(w.message)]
        assert relevant == [], relevant


def run_to_the_end(env):
    """Zero actions until the episode ends: the fake gripper stays put, so every episode runs its 40 steps."""
    steps = 0
    while True:
        obs, reward, terminated, truncated, info = env.step(np.zeros(env.action_space.shape))
        steps += 1
        if terminated or truncated:
            return steps, reward, terminated, truncated, info


def test_gymnasium_s_standard_wrappers_keep_their_keys_and_a_time_limit_is_recorded_as_truncation(tmp_path):
    from gymnasium.wrappers import RecordEpisodeStatistics, TimeLimit

    assert gymnasium.spec("robocasa_shift/fake-Reach-v0").max_episode_steps == 40  # the official horizon
    assert gymnasium.spec("robocasa_shift/robosuite-Lift-v0").max_episode_steps == 400
    assert gymnasium.spec("robocasa_shift/libero-spatial-0-v0").max_episode_steps == 220
    kwargs = dict(condition="camera:L1", policy="mine", camera_roles=("third_person",), image_size=16)

    full = tmp_path / "full"
    env = RecordEpisodeStatistics(TimeLimit(gymnasium.make("robocasa_shift/fake-Reach-v0", run_dir=str(full),
                                                           **kwargs), max_episode_steps=40))
    assert env.spec.max_episode_steps == 40
    keys = []
    for _ in range(3):
        obs, info = env.reset()
        steps, reward, terminated, truncated, info = run_to_the_end(env)
        assert (steps, terminated, truncated) == (40, False, True)
        assert info["episode"]["l"] == 40 and info["episode"]["r"] == 0.0  # the wrapper's own statistics
        keys.append((info["base_episode"], info["key"]))
    env.close()
    assert keys == [(e, f"formal/Reach/{e:04d}/camera:L1/r0") for e in range(3)]
    assert "audit: PASSED" in cli("audit", str(full))

    short = tmp_path / "short"
    env = TimeLimit(gymnasium.make("robocasa_shift/fake-Reach-v0", run_dir=str(short), **kwargs), max_episode_steps=25)
    for _ in range(2):
        env.reset()
        assert run_to_the_end(env)[0] == 25
    env.close()
    records = RunStore(short).records()
    assert len(records) == 2 and all(r["valid"] and r["truncated"] and r["steps"] == 25 and r["horizon"] == 40
                                     for r in records)
    status = cli_status(short)
    assert "unexpected_truncations\": 2" in status and "runtime_failures" not in status, status


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_make_vec_loop_runs_distinct_keys_in_its_sub_envs_and_audits_clean(tmp_path, mode):
    run = tmp_path / "run"
    envs = gymnasium.make_vec("robocasa_shift/fake-Reach-v0", num_envs=2, vectorization_mode=mode, run_dir=str(run),
                              condition="camera:L1", policy="mine", camera_roles=("third_person",), image_size=16)
    obs, info = envs.reset()
    assert obs["images"]["agentview"].shape == (2, 16, 16, 3)
    ended = []
    for _ in range(3 * 41 - 1):  # three episodes of 40 steps in each sub-env, an autoreset step between them
        obs, reward, terminated, truncated, info = envs.step(np.zeros(envs.action_space.shape))
        ended += [info["key"][i] for i in range(2) if terminated[i] or truncated[i]]
    envs.close()
    assert sorted(ended) == [f"formal/Reach/{e:04d}/camera:L1/r0" for e in range(6)]  # six keys, none twice
    assert "audit: PASSED" in cli("audit", str(run))
    assert len(RunStore(run).planned_keys()) == 6


@pytest.mark.sim
@pytest.mark.slow
def test_a_plain_loop_on_the_robosuite_backend_audits_clean(tmp_path):
    run = tmp_path / "run"
    env = gymnasium.make("robocasa_shift/robosuite-Lift-v0", run_dir=str(run), policy="scripted-descend",
                         camera_roles=("third_person",), image_size=64)
    fingerprints = set()
    for condition in ("clean", "camera:L2"):
        obs, info = env.reset(options={"episode": 0, "condition": condition})
        assert obs["images"]["robot0_robotview"].shape == (64, 64, 3)
        fingerprints.add(info["env_fingerprint"])
        rng = np.random.default_rng(info["policy_seed"])
        steps = 0
        while True:
            action = np.zeros(12)
            action[:3] = [0.0, 0.0, -0.3] + rng.normal(0, 0.05, 3)  # descend, with seeded noise
            action[10] = 1.0 if steps > 60 else -1.0  # then close the gripper
            action[11] = -1.0  # arm mode
            obs, reward, terminated, truncated, info = env.step(action)
            steps += 1
            if terminated or truncated:
                break
        assert truncated and info["step"] == 400 and not info["success"]
    env.close()
    assert len(fingerprints) == 1  # one base state for both conditions
    assert "audit: PASSED" in cli("audit", str(run))
    records = RunStore(run).records()
    # one observation per step (the last step's comes after the record is written), one camera
    assert len(records) == 2 and all(r["valid"] and r["frames_rendered"] == r["policy_calls"] == 400 for r in records)
