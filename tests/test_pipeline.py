"""Screening schedule, executors, shards and merge, SIGKILL-and-resume, retry-errors."""

import json
import re
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import ROOT, cli

from robocasa_shift.checks.screening import Pool, load_pool, screening_decisions
from robocasa_shift.core.records import RolloutKey, comparable
from robocasa_shift.rundir.store import RunStore


def pool(**kw):
    base = dict(backend="robosuite", version=1, candidates=("A", "B"), initial=1, reserve=1, minimum_suite=1,
                first_batch=10, exclude_at_most=3, extended=20, retain_at_least=12, path="-", content_hash="-")
    return Pool(**{**base, **kw})


@pytest.mark.parametrize(
    "results, decision",
    [
        ([True] * 3 + [False] * 7, "excluded (clean floor)"),
        ([True] * 4 + [False] * 6, "extend"),
        ([True] * 4 + [False] * 6 + [True] * 8 + [False] * 2, "retained"),  # 12/20
        ([True] * 4 + [False] * 6 + [True] * 7 + [False] * 3, "excluded (below retention)"),  # 11/20
        ([True] * 9, "incomplete"),
    ],
)
def test_screening_rule(results, decision):
    assert screening_decisions(pool(), {"A": results})["A"]["decision"] == decision


def test_embedded_pool_file():
    p = load_pool("robosuite")
    assert p.candidates == ("Lift", "Stack", "PickPlaceCan", "NutAssemblySquare")
    assert (p.initial, p.reserve, p.minimum_suite) == (3, 1, 3)
    assert (p.first_batch, p.exclude_at_most, p.extended, p.retain_at_least) == (10, 3, 20, 12)


def test_shards_are_disjoint_deterministic_and_cover_the_plan():
    from robocasa_shift.study.plan import plan_keys, shard_keys

    keys = plan_keys(["Lift", "Stack"], range(5), ["clean", "blur:L1", "camera:L2"])
    shards = [shard_keys(keys, (i, 3)) for i in range(3)]
    assert sorted(k for s in shards for k in s) == sorted(keys)
    assert all(not set(a) & set(b) for i, a in enumerate(shards) for b in shards[i + 1:])
    assert shard_keys(keys, (1, 3)) == shards[1]
    # a base episode's conditions stay together
    for s in shards:
        groups = {(k.task, k.episode) for k in s}
        assert len(s) == 3 * len(groups)




def records_of(run_dir):
    return {file: comparable(r) for file, r in RunStore(run_dir).record_entries()}


def test_screen_with_a_small_pool_writes_table_and_suite(tmp_path):
    path = tmp_path / "pool.yaml"
    path.write_text(
        "backend: fake\nversion: 1\ncandidates: [Reach, PickPlace]\nschedule: {initial: 1, reserve: 1}\n"
        "minimum_suite: 2\nscreening: {first_batch: 2, exclude_at_most: 0, extended: 3, retain_at_least: 3}\n"
    )
    proc = cli("screen", "--backend", "fake", "--policy", "fake-expert", "--run-dir", str(tmp_path / "run"),
               "--pool", str(path), "--workers", "1", "--no-progress")
    result = json.loads((tmp_path / "run" / "screening" / "screening.json").read_text())
    # Reach alone is below the minimum suite of 2, so the reserve (PickPlace) is activated
    assert result["reserve_activated"] and result["suite"] == ["Reach", "PickPlace"]
    assert result["screening"]["Reach"]["rollouts"] == 3 and result["screening"]["PickPlace"]["stage"] == "reserve"
    assert json.loads((tmp_path / "run" / "suite.json").read_text())["tasks"] == ["Reach", "PickPlace"]
    assert "formal suite: Reach, PickPlace" in proc.stdout
    keys = RunStore(tmp_path / "run").recorded_keys()
    assert all(k.phase == "screening" for k in keys) and len(keys) == 6
    dry = cli("formal", "--backend", "fake", "--run-dir", str(tmp_path / "run"), "--episodes", "0-1", "--dry-run",
              "--workers", "2")
    assert "52 rollouts planned (2 tasks x 2 episodes x 13 conditions), 52 to run; ETA" in dry.stdout


def test_run_and_formal_dry_runs_estimate_from_measured_rollouts_or_a_probe_and_write_nothing(tmp_path):
    run = tmp_path / "run"
    dry = cli("formal", "--backend", "fake", "--policy", "fake", "--task", "Reach,PickPlace", "--episodes", "0-9",
              "--dry-run", "--run-dir", str(run))
    assert "260 rollouts planned (2 tasks x 10 episodes x 13 conditions), 260 to run; ETA " in dry.stdout
    assert "unknown" not in dry.stdout
    for task in ("Reach", "PickPlace"):
        assert re.search(rf"{task} +at most [0-9.]+ s per rollout \(probed here", dry.stdout), dry.stdout
    assert not run.exists()
    fake = ["--backend", "fake", "--policy", "fake", "--condition", "clean"]
    cli("run", *fake, "--task", "Reach", "--episodes", "0-1", "--workers", "1", "--no-progress", "--run-dir", str(run))
    dry = cli("run", *fake, "--task", "Reach,PickPlace", "--episodes", "0-3", "--dry-run", "--run-dir", str(run))
    assert "8 rollouts planned (2 tasks x 4 episodes x 1 conditions), 6 to run; ETA " in dry.stdout
    assert re.search(r"Reach +[0-9.]+ s per rollout \(measured\)", dry.stdout), dry.stdout
    assert re.search(r"PickPlace +at most [0-9.]+ s per rollout \(probed here", dry.stdout), dry.stdout
    assert len(records_of(run)) == 2  # the dry run wrote nothing


def test_two_shards_merged_equal_the_unsharded_run(tmp_path):
    args = ["run", "--backend", "fake", "--task", "Reach", "--condition", "clean,base:L3", "--episodes", "0-2",
            "--policy", "fake", "--workers", "1", "--no-progress"]
    cli(*args, "--run-dir", str(tmp_path / "all"))
    cli(*args, "--run-dir", str(tmp_path / "s0"), "--shard", "0/2")
    cli(*args, "--run-dir", str(tmp_path / "s1"), "--shard", "1/2")
    assert len(records_of(tmp_path / "s0")) == 4 and len(records_of(tmp_path / "s1")) == 2
    cli("merge", str(tmp_path / "merged"), str(tmp_path / "s0"), str(tmp_path / "s1"))
    assert records_of(tmp_path / "merged") == records_of(tmp_path / "all")
    assert cli("audit", str(tmp_path / "merged")).returncode == 0
    # merging a shard twice duplicates keys: refused
    proc = cli("merge", str(tmp_path / "again"), str(tmp_path / "s0"), str(tmp_path / "s0"), check=False)
    assert proc.returncode == 4 and "duplicate key" in proc.stderr


def test_merge_refuses_mismatched_manifests(tmp_path):
    cli("run", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--policy", "fake-expert", "--workers", "1",
        "--no-progress", "--run-dir", str(tmp_path / "a"))
    cli("run", "--backend", "fake", "--task", "Reach", "--episodes", "1", "--policy", "fake-random", "--workers", "1",
        "--no-progress", "--run-dir", str(tmp_path / "b"))
    proc = cli("merge", str(tmp_path / "m"), str(tmp_path / "a"), str(tmp_path / "b"), check=False)
    assert proc.returncode == 4 and "manifest field policy differs" in proc.stderr


def test_sigkill_and_resume_records_every_key_once(tmp_path):
    run_dir = tmp_path / "run"
    # each decision of the fake policy takes 30 ms, so the study lasts long enough to be killed half-way
    args = [sys.executable, "-m", "robocasa_shift", "run", "--backend", "fake", "--task", "Reach,PickPlace",
            "--condition", "clean,blur:L3", "--episodes", "0-2", "--policy", "fake", "--policy-option",
            "act_delay_s=0.03", "--workers", "2", "--no-progress", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    records = run_dir / "records"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(records.rglob("*.json"))) < 3:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # the writer dies mid-study
    proc.wait()
    done_before = len(list(records.rglob("*.json")))
    assert 3 <= done_before < 12
    assert not list(records.rglob(".*.tmp"))  # no half-written record is visible
    # the kernel released the lock with the process: the same command resumes
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{12 - done_before} rollouts run, {done_before} already recorded" in result.stdout
    keys = [RolloutKey.from_record(json.loads(p.read_text())) for p in records.rglob("*.json")]
    assert len(keys) == len(set(keys)) == 12
    assert cli("audit", str(run_dir)).returncode == 0


def test_ctrl_c_with_workers_prints_one_line_exits_130_and_the_same_command_resumes(tmp_path):
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "robocasa_shift", "run", "--backend", "fake", "--task", "Reach,PickPlace",
            "--condition", "clean,blur:L3", "--episodes", "0-2", "--policy", "fake", "--policy-option",
            "act_delay_s=0.03", "--workers", "2", "--no-progress", "--run-dir", str(run_dir)]
    # its own process group, as a terminal's foreground job: Ctrl-C reaches the command and its workers alike; and
    # SIGINT at its default, as a terminal gives it (an ignored SIGINT is inherited: a test process that ran other
    # files may carry one, and the command then rightly runs to its end)
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    records = run_dir / "records"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(records.rglob("*.json"))) < 3:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.splitlines() == ["error: interrupted (Ctrl-C); what was written is kept: run the same command again "
                                "to resume"], err  # no traceback from any worker
    done_before = len(list(records.rglob("*.json")))
    result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{12 - done_before} rollouts run, {done_before} already recorded" in result.stdout
    assert cli("audit", str(run_dir)).returncode == 0


def test_retry_errors_supersedes_invalid_records_and_keeps_history(tmp_path):
    run_dir = tmp_path / "run"
    base = ["run", "--backend", "fake", "--task", "Reach", "--condition", "clean,camera:L2", "--episodes", "0",
            "--policy", "fake", "--workers", "1", "--no-progress", "--run-dir", str(run_dir)]
    cli(*base)
    path = run_dir / "records" / "formal" / "Reach" / "0000__camera-L2__r0.json"
    before = json.loads(path.read_text())
    rec = json.loads(path.read_text())
    rec.update(valid=False, error="ConnectionError: policy server stopped answering", error_kind="policy_server")
    path.write_text(json.dumps(rec))
    assert cli("audit", str(run_dir), check=False).returncode == 1
    assert "0 rollouts run, 2 already recorded" in cli(*base).stdout  # plain reruns keep invalid records
    assert "1 rollouts run, 1 already recorded" in cli(*base, "--retry-errors").stdout
    assert comparable(json.loads(path.read_text())) == comparable(before)  # the retry recomputed the same rollout
    (old,) = RunStore(run_dir).records("history")
    assert old["error_kind"] == "policy_server"
    assert cli("audit", str(run_dir)).returncode == 0


@pytest.mark.slow
def test_local_and_ray_executors_give_identical_records(tmp_path):
    pytest.importorskip("ray")
    args = ["run", "--backend", "fake", "--task", "Reach", "--condition", "clean,camera:L3", "--episodes", "0-1",
            "--policy", "fake", "--workers", "2", "--no-progress"]
    cli(*args, "--run-dir", str(tmp_path / "local"))
    cli(*args, "--run-dir", str(tmp_path / "ray"), "--executor", "ray", timeout=900)
    local, ray = records_of(tmp_path / "local"), records_of(tmp_path / "ray")
    assert len(local) == 4 and local == ray


def test_two_local_workers_write_the_records_of_one(tmp_path):
    args = ["run", "--backend", "fake", "--task", "Reach,PickPlace", "--condition", "clean,camera:L3,base:L2",
            "--episodes", "0-1", "--policy", "fake", "--no-progress"]
    cli(*args, "--workers", "1", "--run-dir", str(tmp_path / "one"))
    cli(*args, "--workers", "2", "--run-dir", str(tmp_path / "two"))
    one, two = records_of(tmp_path / "one"), records_of(tmp_path / "two")
    assert len(one) == 12 and one == two
    assert {r["success"] for r in one.values()} == {True, False}  # outcomes differ between keys, and still agree
    executions = json.loads((tmp_path / "two" / "manifest.json").read_text())["executions"]
    assert [e["workers"] for e in executions] == [2]


def test_a_dry_run_probes_the_tasks_it_has_no_rollouts_of_and_says_how_workers_scale_it(tmp_path):
    from robocasa_shift.config import StudyConfig
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.study.pipeline import estimate

    run = tmp_path / "run"
    cli("run", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--condition", "clean", "--policy", "fake",
        "--workers", "1", "--no-progress", "--run-dir", str(run))
    keys = [RolloutKey("formal", t, e, "clean") for t in ("Reach", "PickPlace") for e in range(1, 5)]
    est = estimate(run, keys, 2, StudyConfig(backend="fake", policy="fake"))
    assert list(est["measured_s_per_rollout"]) == ["Reach"] and list(est["probed"]) == ["PickPlace"]
    probe = est["probed"]["PickPlace"]
    assert probe["horizon"] == 40 and probe["rollout_s"] >= probe["reset_s"] + 40 * probe["step_s"] > 0
    start_up = probe["make_s"] + probe["reset_s"]
    one, two, four = (est["scaling"][n] - start_up for n in (1, 2, 4))
    assert one == pytest.approx(est["serial_s"]) and two == pytest.approx(one / 2) and four == pytest.approx(one / 4)
    assert est["eta_s"] == est["scaling"][2]
    assert estimate(run, keys, 2)["probed"] == {}  # without the study: measured times only, nothing built
    dry = cli("screen", "--backend", "fake", "--policy", "fake", "--run-dir", str(tmp_path / "new"), "--dry-run",
              "--workers", "2").stdout
    assert "rollouts to run at least (first batches)" in dry and "probed here" in dry and "by workers (1: " in dry
    assert not (tmp_path / "new").exists()  # a dry run writes nothing
