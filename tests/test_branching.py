"""Counterfactual branching (issue 14) on the fake backend: snapshots, fidelity, estimator, study, audit.

The simulator's own fidelity (robosuite, restored in a fresh process) is in ``test_branching_sim.py``.
"""

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT, cli

from robocasa_shift.analysis import recoverability
from robocasa_shift.backends import get_backend
from robocasa_shift.branching.checkpoints import (
    BranchSettings,
    record_trunk,
    replay_fidelity,
    run_branch,
    run_checkpoint,
    zero_noise_check,
)
from robocasa_shift.branching.interventions import (
    INTERVENTIONS,
    Context,
    make_intervention,
)
from robocasa_shift.branching.snapshot import SnapshotError, TrunkTape
from robocasa_shift.branching.study import BranchStore, Selection, branch, select_trunks
from robocasa_shift.checks.branch_audit import audit_branch_study
from robocasa_shift.core import specs
from robocasa_shift.core.policy import Policy
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.embodiments.panda_omron import LAYOUT as PANDA
from robocasa_shift.engine.rollout import Observer
from robocasa_shift.errors import BadInput, RunDirError, StateUnsupported
from robocasa_shift.policies import POLICIES, make_policy

FAKE = ["--backend", "fake", "--policy", "fake", "--no-progress"]


def comparable(result):
    """A checkpoint or trunk result without its wall time."""
    return {k: v for k, v in result.items() if k != "wall_s"}


# --------------------------------------------------------------------------- the estimator's known answers


def test_jeffreys_lower_quantiles_for_k_of_4_are_the_papers():
    got = [recoverability.jeffreys_lower(k, 4, 0.25) for k in range(5)]
    assert got == pytest.approx([0.012, 0.150, 0.3455, 0.576, 0.856], abs=6e-4)
    # at tau = 0.5 a checkpoint needs k >= 3 of 4, and only k = 2 straddles tau (expanded to 16)
    assert [g >= 0.5 for g in got] == [False, False, False, True, True]
    assert [recoverability.needs_expansion(k, 4, 0.5) for k in range(5)] == [False, False, True, False, False]


def test_the_horizon_is_the_latest_recoverable_checkpoint_without_assuming_monotonicity():
    steps = [0, 8, 16, 24]
    assert recoverability.recoverability_horizon(steps, [0.576, 0.15, 0.576, 0.012]) == 16
    assert recoverability.recoverability_horizon(steps, [0.15, 0.15, None, 0.012]) is None
    assert recoverability.combined_estimate({"continue": 0.15, "recover": 0.576}) == 0.576


# --------------------------------------------------------------------------- interventions


def test_recover_is_30_steps_after_a_closing_command_and_20_otherwise_with_the_frozen_magnitudes():
    recover = make_intervention("recover")
    closed = PANDA.arm_action([0.3, 0.0, 0.0], PANDA.close)
    script = recover.script(Context(PANDA, 40, closed))
    assert script.shape == (30, 12)
    assert np.all(script[:8, 10] == PANDA.close) and np.all(script[:14, 2][8:] < 0)  # freeze, then lower holding
    assert np.all(script[14:18, 10] == PANDA.open) and np.all(script[18:26, 2] > 0)  # release, retract
    assert np.all(script[:, 11] == -1.0) and np.all(script[:, 3:10] == 0)  # arm mode; no rotation, torso or base
    opened = recover.script(Context(PANDA, 40, PANDA.arm_action([0, 0, 0], PANDA.open)))
    assert opened.shape == (20, 12) and recover.script(Context(PANDA, 0, None)).shape == (20, 12)
    assert make_intervention("continue").script(Context(PANDA, 40, closed)).shape == (0, 12)
    assert recover.spec_hash == specs.load_intervention_spec("recover").content_hash


def test_a_tampered_recover_spec_is_refused_with_both_hashes(tmp_path):
    import shutil

    shutil.copytree(specs.INTERVENTIONS_DIR, tmp_path / "iv")
    path = tmp_path / "iv" / "recover.yaml"
    path.write_text(path.read_text().replace("steps: 8", "steps: 9", 1))
    with pytest.raises(specs.FrozenSpecError, match="frozen sha256") as err:
        specs.load_intervention_spec("recover", tmp_path / "iv")
    assert "current sha256" in str(err.value)
    path.write_text(path.read_text().replace("gripper: hold", "gripper: squeeze", 1))
    with pytest.raises(specs.SpecError, match=r"phases\[0\]\.gripper"):
        specs.load_intervention_spec("recover", tmp_path / "iv", verify=False)


def test_an_unknown_intervention_lists_the_registered_ones():
    with pytest.raises(KeyError, match="continue") as err:
        make_intervention("rewind")
    assert "recover" in str(err.value)
    assert {"continue", "recover"} <= set(INTERVENTIONS.names())


# --------------------------------------------------------------------------- snapshots and fidelity (engine)


@pytest.fixture(scope="module")
def fake_study():
    protocol = specs.load_protocol()
    return protocol, get_backend("fake")


def _trunk(fake_study, key, policy="fake"):
    protocol, backend = fake_study
    env = backend.make(key.task)
    record, tape = record_trunk(env, make_policy(policy), key, protocol, specs.load_stage_spec("fake", key.task), "fake")
    return record, tape


def _restore_in_fresh_process(path, key, steps, settings, queue):
    """Child of a spawn context: fidelity and noise-free continue branches from a snapshot file."""
    protocol = specs.load_protocol()
    env, policy = get_backend("fake").make(key.task), make_policy("fake")
    stage_spec = specs.load_stage_spec("fake", key.task)
    tape = TrunkTape.read(path)
    out = []
    for step in steps:
        fidelity = replay_fidelity(env, policy, key, protocol, stage_spec, "fake", tape, step)
        branch = run_branch(env, policy, key, protocol, stage_spec, "fake", tape, step, make_intervention("continue"),
                            0, settings)
        out.append((step, fidelity, branch))
    queue.put(out)


@pytest.mark.parametrize("episode,condition", [(3, "base:L3"), (0, "clean")])
def test_without_noise_continue_from_a_fresh_process_equals_the_trunk_bit_for_bit(fake_study, tmp_path, episode,
                                                                                    condition):
    key = RolloutKey("formal", "PickPlace", episode, condition)
    record, tape = _trunk(fake_study, key)
    path = tmp_path / "trunk.npz"
    path.write_bytes(tape.to_bytes())
    steps = tape.chunk_steps[:: max(1, len(tape.chunk_steps) // 4)]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_restore_in_fresh_process, args=(str(path), key, steps, BranchSettings(sigma=0.0), queue))
    child.start()
    results = queue.get(timeout=120)
    child.join()
    assert len(results) == len(steps) >= 3
    for step, fidelity, continued in results:
        assert fidelity["ok"] and fidelity["max_qpos_dev"] == 0.0 and fidelity["max_state_dev"] == 0.0, (step, fidelity)
        # the branch (continue, noise off) is the trunk's continuation: same outcome at the same step
        assert (continued["success"], continued["steps"], continued["stage_steps"]) == (
            record.success, record.steps, record.stage_steps), step
    assert record.success == (condition == "clean")  # a failed trunk and a successful clean one


def test_the_zero_noise_known_answer_holds_at_every_checkpoint_and_fails_when_the_trunk_differs(fake_study):
    protocol, backend = fake_study
    key = RolloutKey("formal", "PickPlace", 3, "base:L3")
    record, tape = _trunk(fake_study, key)
    env, policy = backend.make(key.task), make_policy("fake")
    stage_spec = specs.load_stage_spec("fake", key.task)
    # a noisy study with a fresh budget shorter than the trunk: the check still runs at sigma 0 on the trunk's budget
    settings = BranchSettings(sigma=0.2, budget="fresh", fresh_budget=3, k_initial=1, k_expanded=1)
    steps = tape.chunk_steps[:: max(1, len(tape.chunk_steps) // 3)]
    for step in steps:
        result = run_checkpoint(env, policy, key, protocol, stage_spec, "fake", tape, step, settings)
        zero = result["zero_noise"]
        assert result["fidelity"]["ok"] and zero["ok"], (step, zero)
        assert (zero["success"], zero["steps"], zero["stage_steps"]) == (record.success, record.steps,
                                                                          record.stage_steps)
        assert zero["max_qpos_dev"] == 0.0 and zero["max_state_dev"] == 0.0
        # the study's own branches do differ from the trunk (noise, a 3-step budget)
        assert result["interventions"]["continue"]["branches"][0]["steps"] == min(step + 3, record.steps)
    # one physics state of the trunk after the checkpoint moved by 1e-9: the check must fail, naming the deviation
    step = steps[1]
    tape.states[step + 2] = tape.states[step + 2] + 1e-9
    zero = zero_noise_check(env, policy, key, protocol, stage_spec, "fake", tape, step, settings)
    assert not zero["ok"] and zero["max_state_dev"] == pytest.approx(1e-9) and zero["same_outcome"]
    # a trunk recorded with another outcome: the check fails on the outcome
    tape.states[step + 2] = tape.states[step + 2] - 1e-9
    tape.meta["steps"] = record.steps + 1
    zero = zero_noise_check(env, policy, key, protocol, stage_spec, "fake", tape, step, settings)
    assert not zero["ok"] and not zero["same_outcome"]


def test_a_corrupted_or_foreign_snapshot_file_is_refused_and_nothing_is_unpickled(fake_study, tmp_path):
    _, tape = _trunk(fake_study, RolloutKey("formal", "Reach", 0, "clean"))
    data = tape.to_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(SnapshotError, match="cut.npz"):
        TrunkTape.read(tmp_path / "cut.npz")
    np.savez(tmp_path / "pickled.npz", meta=np.array([{"format": "x"}], dtype=object))
    with pytest.raises(SnapshotError, match="pickled.npz"):  # allow_pickle=False refuses object arrays
        TrunkTape.read(tmp_path / "pickled.npz")
    tape.checkpoints[tape.chunk_steps[0]]["policy"]["bad"] = np.array([object()], dtype=object)
    with pytest.raises(TypeError, match="not a plain array"):
        tape.to_bytes()
    with pytest.raises(SnapshotError, match="no checkpoint at step 3"):
        tape.checkpoint(3)


def test_snapshot_files_round_trip_to_the_same_bytes_and_a_forged_packed_index_is_refused(fake_study, tmp_path):
    from robocasa_shift.branching.snapshot import pack, text_array, unpack

    _, tape = _trunk(fake_study, RolloutKey("formal", "Reach", 1, "base:L2"))
    data = tape.to_bytes()
    (tmp_path / "t.npz").write_bytes(data)
    again = TrunkTape.read(tmp_path / "t.npz")
    assert again.to_bytes() == data == tape.to_bytes()  # fixed zip timestamps: same tape, same bytes
    assert all(again.checkpoint_hash(s) == tape.checkpoint_hash(s) for s in tape.chunk_steps)
    # shapes survive packing, 0-d ones included (a controller's alias is a 0-d string array)
    packed = {"a": np.arange(3.0), "b": np.array("text"), "c": np.zeros((2, 3))[:, ::2], "d": np.array(7)}
    unpacked = unpack(*pack(packed), "here")
    assert {k: (v.shape, v.dtype, v.tolist()) for k, v in unpacked.items()} == \
        {k: (v.shape, v.dtype, v.tolist()) for k, v in packed.items()}
    _, blob = pack({"a": np.arange(3.0), "b": np.array("text")})
    step = f"c{tape.chunk_steps[0]:04d}/policy"
    for forged in ([["a", "<f8", [3], 0, 10_000]], [["a", "|O", [1], 0, 8]], [["a", "<f8", [4], 0, 24]]):
        entries = dict(np.load(tmp_path / "t.npz", allow_pickle=False))
        entries[f"{step}.index"], entries[step] = text_array(json.dumps(forged)), blob
        np.savez(tmp_path / "forged.npz", **entries)
        with pytest.raises(SnapshotError, match=f"forged.npz: {step}: malformed packed state"):
            TrunkTape.read(tmp_path / "forged.npz")


def test_the_policy_is_idle_during_the_recover_script(fake_study):
    protocol, backend = fake_study
    key = RolloutKey("formal", "PickPlace", 3, "base:L3")
    _, tape = _trunk(fake_study, key)
    step = tape.chunk_steps[3]

    class Seen(Observer):
        def __init__(self):
            self.steps = []

        def on_observation(self, step, images):
            self.steps.append(step)

    seen = Seen()
    recover = make_intervention("recover")
    layout = backend.make("PickPlace").action_layout
    script_steps = len(recover.script(Context(layout, step, tape.previous_action(step))))
    run_branch(backend.make("PickPlace"), make_policy("fake"), key, protocol, specs.load_stage_spec("fake", "PickPlace"),
               "fake", tape, step, recover, 0, BranchSettings(), observer=seen)
    assert seen.steps and seen.steps[0] == step + script_steps


# --------------------------------------------------------------------------- selection and refusals


def _record(task, episode, condition, success, valid=True):
    return {"phase": "formal", "task": task, "episode": episode, "condition": condition, "replicate": 0,
            "success": success, "valid": valid}


def test_selection_takes_shift_failures_and_clean_failures_round_robin_and_refuses_unknown_keys():
    records = [_record("A", 0, "clean", True), _record("A", 0, "base:L1", False), _record("A", 0, "blur:L1", False),
               _record("A", 1, "clean", False), _record("A", 1, "base:L1", False), _record("A", 2, "clean", True),
               _record("A", 2, "base:L1", False), _record("A", 2, "camera:L1", True),
               _record("A", 3, "clean", True), _record("A", 3, "base:L1", False, valid=False)]
    chosen = select_trunks(records, Selection())
    assert [(t.key.episode, t.key.condition, t.selection) for t in chosen] == [
        (0, "base:L1", "shift_failure"), (0, "blur:L1", "shift_failure"), (1, "clean", "clean_failure"),
        (2, "base:L1", "shift_failure")]  # round-robin over (condition, task); F->F and invalid left out
    assert len(select_trunks(records, Selection(max_trunks=2))) == 2
    assert [t.key.episode for t in select_trunks(records, Selection(kinds=("clean_failure",)))] == [1]
    assert select_trunks(records, Selection(keys=("formal/A/0001/base:L1/r0",)))[0].selection == "requested"
    with pytest.raises(BadInput, match="no valid record"):
        select_trunks(records, Selection(keys=("formal/A/0003/base:L1/r0",)))
    with pytest.raises(KeyError, match="shift_failure"):
        Selection(kinds=("near_miss",))


def test_settings_out_of_range_are_refused_by_name():
    with pytest.raises(BadInput, match="k_initial"):
        BranchSettings(k_initial=8, k_expanded=4)
    with pytest.raises(BadInput, match="fresh_budget"):
        BranchSettings(budget="fresh")
    assert BranchSettings(budget="fresh", fresh_budget=50).horizon(100, 400) == 150
    assert BranchSettings().horizon(100, 400) == 400


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("branching") / "run"
    cli("run", *FAKE, "--task", "all", "--condition", "clean,base:L3,blur:L1", "--episodes", "0-5", "--workers", "1",
        "--run-dir", str(run_dir))
    return run_dir


def test_a_policy_that_cannot_snapshot_its_state_is_refused_with_the_reason(fake_run, tmp_path):
    class Opaque(Policy):
        name = "opaque-test"

        def act(self, obs):
            return np.zeros((1, 3))

    import shutil

    run = tmp_path / "run"
    shutil.copytree(fake_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["policy"] = {"name": "opaque-test"}
    manifest["policy_options"] = {}
    (run / "manifest.json").write_text(json.dumps(manifest))
    POLICIES.register("opaque-test", Opaque)
    try:
        with pytest.raises(StateUnsupported, match="opaque-test.*get_state/set_state"):
            branch(run, Selection(max_trunks=1))
    finally:
        POLICIES._entries.pop("opaque-test")
    assert not (run / "branching").exists()


# --------------------------------------------------------------------------- the study: run, resume, audit, report


@pytest.mark.slow
def test_branch_runs_resumes_audits_and_reports_on_the_fake_backend(fake_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fake_run, run)
    dry = cli("branch", str(run), "--max-trunks", "3", "--stride", "1", "--dry-run")
    plan = json.loads(dry.stdout[: dry.stdout.rindex("}") + 1])
    assert plan["trunks_to_record"] == 3 and plan["checkpoints"] > 0 and plan["eta_s"] >= 0
    assert plan["branch_rollouts_at_k"] == plan["checkpoints"] * 9
    assert not (run / "branching").exists()  # a dry run writes nothing

    out = cli("branch", str(run), "--max-trunks", "3", "--stride", "1", "--workers", "2", "--no-progress")
    assert "3 trunks (3 reproduced)" in out.stdout
    bdir = run / "branching" / "default"
    summary = json.loads((bdir / "summary.json").read_text())
    assert summary["fidelity"]["checked"] == summary["fidelity"]["ok"] > 0
    zero = summary["fidelity"]["zero_noise"]
    assert zero["ok"] == zero["checked"] == summary["fidelity"]["ok"] and zero["failed"] == []
    assert (f"Zero-noise known answer: {zero['ok']}/{zero['checked']} Continue branches at sigma 0 reproduced their "
            "trunk.") in (bdir / "summary.md").read_text()
    results = {p.relative_to(bdir): comparable(json.loads(p.read_text())) for p in (bdir / "checkpoints").rglob("*.json")}
    assert len(results) == plan["checkpoints"]
    for result in results.values():
        assert result["branched"] and set(result["interventions"]) == {"continue", "recover"}
        for cell in result["interventions"].values():
            assert cell["n"] == (16 if cell["expanded"] else 4)
            assert cell["estimate"] == pytest.approx(recoverability.jeffreys_lower(cell["k"], cell["n"]))
    assert any(c["expanded"] for r in results.values() for c in r["interventions"].values())

    # nothing runs twice: a rerun has nothing to do; a lost result is the only unit that runs again
    again = cli("branch", str(run), "--max-trunks", "3", "--stride", "1", "--workers", "2", "--no-progress")
    assert "0 checkpoints run" in again.stdout
    lost = sorted((bdir / "checkpoints").rglob("*.json"))[1]
    lost.unlink()
    again = cli("branch", str(run), "--max-trunks", "3", "--stride", "1", "--no-progress")
    assert "1 checkpoints run" in again.stdout
    assert comparable(json.loads(lost.read_text())) == results[lost.relative_to(bdir)]

    # other settings in the same study are refused; another name is a new study
    refused = cli("branch", str(run), "--max-trunks", "3", "--sigma", "0.1", "--no-progress", check=False)
    assert refused.returncode == 4 and "give another --name" in refused.stderr

    assert cli("audit", str(run)).returncode == 0
    audit = json.loads((run / "audit.json").read_text())["branching"]["default"]
    assert audit["passed"] and audit["fidelity"]["ok"] == len(results)
    assert audit["zero_noise"] == {"ok": len(results), "checked": len(results)}
    cli("report", str(run), "--videos", "0")
    page = (run / "report" / "index.html").read_text()
    assert "Counterfactual branching" in page and "figures/" in page

    # tampering is caught: a seed, an estimate, a snapshot file
    path = sorted((bdir / "checkpoints").rglob("*.json"))[0]
    result = json.loads(path.read_text())
    result["interventions"]["continue"]["branches"][0]["seed"] += 1
    result["interventions"]["recover"]["estimate"] = 0.99
    path.write_text(json.dumps(result))
    snapshot = sorted((bdir / "trunks").rglob("*.npz"))[0]
    snapshot.write_bytes(snapshot.read_bytes() + b"x")
    # the zero-noise known answer: one that did not reproduce its trunk, one missing, one whose flags lie
    paths = sorted((bdir / "checkpoints").rglob("*.json"))
    for path, change in zip(paths[1:4], ("failed", "missing", "lies")):
        result = json.loads(path.read_text())
        if change == "failed":
            result["zero_noise"].update(ok=False, same_outcome=False, steps=result["zero_noise"]["steps"] + 1)
        elif change == "missing":
            result["zero_noise"] = None
        else:
            result["zero_noise"]["steps"] += 1
        path.write_text(json.dumps(result))
    problems = "\n".join(audit_branch_study(run, "default")["problems"])
    assert "the Continue branch at sigma 0 did not reproduce the trunk" in problems
    assert "no zero-noise known-answer check" in problems
    assert "zero-noise check ok but the branch deviates from the trunk" in problems
    assert "seeds other than their stream's" in problems and "not the Jeffreys" in problems
    assert "snapshot file sha256" in problems and "recorded" in problems
    assert cli("audit", str(run), check=False).returncode == 1


@pytest.mark.slow
def test_a_killed_branch_command_resumes_with_nothing_lost_and_nothing_duplicated(fake_run, tmp_path):
    import shutil

    args = ["--max-trunks", "2", "--stride", "2", "--workers", "2", "--no-progress"]
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    shutil.copytree(fake_run, reference)
    shutil.copytree(fake_run, killed)
    cli("branch", str(reference), *args)
    slow = ["--policy-option", "act_delay_s=0.004"]  # changes no record, only the wall time
    proc = subprocess.Popen([sys.executable, "-m", "robocasa_shift", "branch", str(killed), *args, *slow], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    checkpoints = killed / "branching" / "default" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(checkpoints.rglob("s*.json"))) < 3:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(checkpoints.rglob("s*.json")))
    assert done_before >= 3
    out = cli("branch", str(killed), *args, *slow)
    want = {p.relative_to(reference): comparable(json.loads(p.read_text()))
            for p in (reference / "branching" / "default" / "checkpoints").rglob("*.json")}
    got = {p.relative_to(killed): comparable(json.loads(p.read_text())) for p in checkpoints.rglob("*.json")}
    assert got == want and f"{len(want) - done_before} checkpoints run" in out.stdout
    assert not list(checkpoints.rglob(".*.tmp"))
    assert audit_branch_study(killed, "default")["passed"]


def test_explicit_keys_and_steps_branch_only_those_and_report_steps_off_the_boundaries(fake_run, tmp_path):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(fake_run, run)
    record = next(r for r in json.loads(json.dumps(
        [json.loads(p.read_text()) for p in (run / "records").rglob("*.json")])) if r["condition"] == "clean")
    key = RolloutKey.from_record(record)
    counts = branch(run, Selection(keys=(key.id,), steps=(0, 4, 5)), BranchSettings(interventions=("continue",)),
                    name="alarms")
    assert counts["trunks_selected"] == 1 and counts["checkpoints_run"] == 2
    trunk = BranchStore(run, "alarms").trunk(key)
    assert trunk["selection"] == "requested" and trunk["checkpoint_steps"] == [0, 4]
    assert trunk["steps_not_at_boundaries"] == [5]
    with pytest.raises(RunDirError, match="another --name"):
        branch(run, Selection(keys=(key.id,)), BranchSettings(interventions=("recover",)), name="alarms")


@pytest.mark.slow
def test_branches_on_ray_equal_those_of_the_local_executor(fake_run, tmp_path):
    import shutil

    results = {}
    for executor in ("local", "ray"):
        run = tmp_path / executor
        shutil.copytree(fake_run, run)
        cli("branch", str(run), "--max-trunks", "2", "--stride", "4", "--workers", "2", "--executor", executor,
            "--no-progress", timeout=900)
        bdir = run / "branching" / "default"
        results[executor] = {p.relative_to(bdir): comparable(json.loads(p.read_text()))
                             for p in bdir.rglob("*.json") if p.parent.name != "default"}
    assert results["ray"] == results["local"] and len(results["local"]) > 4
