"""Faults a study must survive, and inputs it must refuse cleanly (issue 13, findings 4, 7, 8, 9, 11).

Each test builds its own run directories on the fake backend (milliseconds per rollout) and injects
the fault itself: a worker that SIGKILLs itself or hangs on a given policy seed, a policy server that
is down while a flag file exists, broken record files, CSVs and spec files.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
import yaml
from helpers import ROOT, cli, run_python

from robocasa_shift import seeding
from robocasa_shift.core import specs
from robocasa_shift.core.records import Record, RolloutKey, comparable
from robocasa_shift.errors import (
    BadInput,
    FrozenSpecError,
    PolicyOptionError,
    RunDirError,
    SpecError,
)
from robocasa_shift.rundir.store import RunStore

FAKE = ["--backend", "fake", "--policy", "fake", "--no-progress"]


def policy_seed(task, episode, replicate=0):
    """The policy seed of a formal key: what the fake policy's fault knobs are keyed on."""
    return seeding.policy_seed(specs.load_protocol().study_seed, task, "formal", episode, replicate)


def records_of(run_dir):
    """``{file: record without machine fields}`` of a run directory."""
    return {file: comparable(r) for file, r in RunStore(run_dir).record_entries()}


def everything_written(run_dir):
    """Every byte under a run directory, as text."""
    return "".join(p.read_bytes().decode("utf-8", "replace") for p in run_dir.rglob("*") if p.is_file())


def cli_env(*args, env=None, timeout=300):
    """The CLI in a subprocess with extra environment variables."""
    return subprocess.run([sys.executable, "-m", "robocasa_shift", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def assert_clean_refusal(proc, code, *phrases):
    """Exit status ``code`` with an ``error:`` message holding ``phrases`` and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout[-1500:], proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "error" in proc.stderr.lower()
    for phrase in phrases:
        assert phrase in proc.stderr, proc.stderr[-3000:]


# --------------------------------------------------------------------------- finding 4: dead and hung workers


def test_a_worker_killed_mid_rollout_leaves_worker_crash_records_and_the_study_goes_on(tmp_path):
    args = ["run", *FAKE, "--task", "Reach", "--condition", "clean,camera:L3", "--episodes", "0-2", "--workers", "2"]
    cli(*args, "--run-dir", str(tmp_path / "healthy"))
    # episode 1's policy seed kills the worker process (SIGKILL: a segfault or an OOM kill) for both
    # of its conditions; before the fix the pool lost the task and the study hung forever
    crash = ["--policy-option", f"crash_on_seed={policy_seed('Reach', 1)}"]
    proc = cli(*args, *crash, "--run-dir", str(tmp_path / "run"), timeout=120)
    assert "6 rollouts run, 0 already recorded" in proc.stdout and "2 invalid" in proc.stdout
    crashed = {RolloutKey.from_record(r): r for r in RunStore(tmp_path / "run").records() if not r["valid"]}
    assert set(crashed) == {RolloutKey("formal", "Reach", 1, "clean"), RolloutKey("formal", "Reach", 1, "camera:L3")}
    for rec in crashed.values():
        assert rec["error_kind"] == "worker_crash" and "killed by SIGKILL" in rec["error"]
        assert rec["policy_seed"] == policy_seed("Reach", 1) and rec["policy"] == "fake"
    # two deaths, two fresh workers: every healthy record is the one a healthy run writes
    healthy, run = records_of(tmp_path / "healthy"), records_of(tmp_path / "run")
    assert {f: r for f, r in run.items() if r["valid"]} == {f: r for f, r in healthy.items() if "0001__" not in f}
    audit = cli("audit", str(tmp_path / "run"), check=False)
    assert audit.returncode == 1 and "worker process" in (tmp_path / "run" / "audit.md").read_text()
    # the crashed keys are ordinary invalid records: --retry-errors redoes them
    cli(*args, "--retry-errors", "--run-dir", str(tmp_path / "run"))
    assert records_of(tmp_path / "run") == healthy
    assert cli("audit", str(tmp_path / "run")).returncode == 0


def test_with_batch_every_rollout_of_a_dead_workers_lockstep_group_is_recorded_as_crashed(tmp_path):
    proc = cli("run", *FAKE, "--task", "Reach", "--condition", "clean,camera:L3,blur:L1", "--episodes", "0-1",
               "--workers", "2", "--batch", "3", "--policy-option", f"crash_on_seed={policy_seed('Reach', 0)}",
               "--run-dir", str(tmp_path / "run"), timeout=120)
    assert "6 rollouts run" in proc.stdout
    kinds = {(r["episode"], r["condition"]): r["error_kind"] for r in RunStore(tmp_path / "run").records()}
    assert kinds == {(0, "clean"): "worker_crash", (0, "camera:L3"): "worker_crash", (0, "blur:L1"): "worker_crash",
                     (1, "clean"): None, (1, "camera:L3"): None, (1, "blur:L1"): None}


def test_a_hung_worker_is_killed_recorded_as_worker_timeout_and_replaced(tmp_path):
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    proc = cli("run", *FAKE, "--task", "Reach", "--condition", "clean", "--episodes", "0-3", "--workers", "2",
               "--rollout-timeout", "6", "--policy-option", f"hang_on_seed={policy_seed('Reach', 2)}",
               "--run-dir", str(run_dir), timeout=120)
    assert time.monotonic() - t0 < 60
    assert "4 rollouts run" in proc.stdout and "1 invalid" in proc.stdout
    (hung,) = [r for r in RunStore(run_dir).records() if not r["valid"]]
    assert (hung["episode"], hung["error_kind"]) == (2, "worker_timeout") and "within 6 s" in hung["error"]
    executions = json.loads((run_dir / "manifest.json").read_text())["executions"]
    assert [e["rollout_timeout_s"] for e in executions] == [6.0]  # the limit is kept with the run


def test_a_worker_that_cannot_be_built_fails_the_command_once_instead_of_respawning_forever():
    # before the fix the pool's initializer raised in every new worker and the pool respawned them forever
    out = run_python(
        "from robocasa_shift.config import ExecutionConfig, StudyConfig\n"
        "from robocasa_shift.core.records import RolloutKey\n"
        "from robocasa_shift.errors import Error\n"
        "from robocasa_shift.study.executors import LocalExecutor\n"
        "ex = LocalExecutor(StudyConfig(backend='no-such-backend', policy='fake'), ExecutionConfig(workers=2))\n"
        "try:\n"
        "    list(ex.map([RolloutKey('formal', 'Reach', 0, 'clean')]))\n"
        "except Error as exc:\n"
        "    print('refused with exit', exc.exit_code, exc)\n"
        "finally:\n"
        "    ex.close()\n",
        timeout=60,
    )
    assert "refused with exit 2 unknown backend 'no-such-backend'" in out  # the error's message and exit status


@pytest.mark.parametrize("option", [["--workers", "0"], ["--workers", "-1"], ["--threads", "0"], ["--threads", "-1"],
                                    ["--rollout-timeout", "0"]])
def test_workers_threads_and_timeout_below_their_minimum_are_refused_before_anything_starts(tmp_path, option):
    proc = cli("run", *FAKE, "--task", "Reach", "--episodes", "0", *option, "--run-dir", str(tmp_path / "run"),
               check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "Invalid value" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_dead_ray_worker_leaves_worker_crash_records_and_a_fresh_actor(tmp_path):
    pytest.importorskip("ray")
    # Ray neither restarts the actor nor retries its task (max_restarts=0, max_task_retries=0): before
    # the fix its ActorDiedError ended the command with a traceback
    proc = cli("run", *FAKE, "--task", "Reach", "--condition", "clean,camera:L3", "--episodes", "0-2",
               "--workers", "2", "--executor", "ray", "--batch", "2",
               "--policy-option", f"crash_on_seed={policy_seed('Reach', 1)}", "--run-dir", str(tmp_path / "ray"),
               timeout=600)
    assert "6 rollouts run" in proc.stdout and "2 invalid" in proc.stdout
    bad = {(r["episode"], r["condition"]): r for r in RunStore(tmp_path / "ray").records() if not r["valid"]}
    assert set(bad) == {(1, "clean"), (1, "camera:L3")}
    assert all(r["error_kind"] == "worker_crash" and "Ray worker" in r["error"] for r in bad.values())


# --------------------------------------------------------------------------- finding 7: secrets


def test_secret_policy_options_never_reach_the_run_directory_and_env_references_resolve(tmp_path):
    secret, from_env = "s3cret-literal-0xC0FFEE", "tok-from-env-0xBEEF"
    base = ["run", *FAKE, "--task", "Reach", "--episodes", "0"]
    literal = cli_env(*base, "--workers", "1", "--policy-option", f"api_token={secret}",
                      "--run-dir", str(tmp_path / "literal"))
    assert literal.returncode == 0, literal.stderr[-2000:]
    by_env = cli_env(*base, "--workers", "2", "--policy-option", "api_token=env:FAKE_TOKEN",
                     "--run-dir", str(tmp_path / "env"), env={"FAKE_TOKEN": from_env})
    assert by_env.returncode == 0, by_env.stderr[-2000:]
    assert secret not in everything_written(tmp_path / "literal")
    assert from_env not in everything_written(tmp_path / "env")
    manifest = json.loads((tmp_path / "literal" / "manifest.json").read_text())
    assert manifest["policy_options"] == {"api_token": "<redacted>"} and "api_token=<redacted>" in manifest["command"]
    (entry,) = [json.loads(line) for line in (tmp_path / "literal" / "commands.jsonl").read_text().splitlines()]
    assert "api_token=<redacted>" in entry["argv"]
    assert json.loads((tmp_path / "env" / "manifest.json").read_text())["policy_options"] == {
        "api_token": "env:FAKE_TOKEN"}
    # a variable that is not set: exit 2 naming it, before any run directory exists
    missing = cli_env(*base, "--policy-option", "api_token=env:NO_SUCH_TOKEN_VAR", "--run-dir", str(tmp_path / "m"))
    assert_clean_refusal(missing, 2, "NO_SUCH_TOKEN_VAR")
    assert not (tmp_path / "m").exists()


def test_make_policy_reads_env_references_of_secret_options_only(monkeypatch):
    from robocasa_shift.config import redact_argv, redact_options
    from robocasa_shift.policies import make_policy

    monkeypatch.setenv("FAKE_TOKEN", "abc123")
    assert make_policy("fake", api_token="env:FAKE_TOKEN").api_token == "abc123"
    monkeypatch.delenv("FAKE_TOKEN")
    with pytest.raises(PolicyOptionError, match="FAKE_TOKEN is not set"):
        make_policy("fake", api_token="env:FAKE_TOKEN")
    # names holding token/key/secret/password are secrets; a message field such as state_key is not
    options = {"api_key": "k", "Password": "p", "client_secret": "s", "state_key": "observation/state", "port": 8}
    assert redact_options(options) == {"api_key": "<redacted>", "Password": "<redacted>",
                                       "client_secret": "<redacted>", "state_key": "observation/state", "port": 8}
    assert redact_argv(["--policy-option", "api_key=k", "--policy-option=token=t", "port=8"]) == [
        "--policy-option", "api_key=<redacted>", "--policy-option=token=<redacted>", "port=8"]


def test_the_store_redacts_secrets_whoever_hands_them_in(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["robocasa-shift", "run", "--policy-option", "api_key=hunter2"])
    store = RunStore(tmp_path)
    store.ensure_manifest({"policy_options": {"api_key": "hunter2", "port": 1}, "command": "x api_key=hunter2"})
    store.log_command()
    assert "hunter2" not in everything_written(tmp_path)
    assert store.manifest()["policy_options"] == {"api_key": "<redacted>", "port": 1}


# --------------------------------------------------------------------------- finding 8: bad record files


def test_unreadable_record_files_are_skipped_named_and_failed_by_the_audit(tmp_path):
    run_dir = tmp_path / "run"
    args = ["run", *FAKE, "--task", "Reach", "--condition", "clean,camera:L2", "--episodes", "0-1", "--workers", "1",
            "--run-dir", str(run_dir)]
    cli(*args)
    folder = run_dir / "records" / "formal" / "Reach"
    truncated = folder / "0000__clean__r0.json"
    truncated.write_text(truncated.read_text()[:50])  # a torn copy
    stray = json.loads((folder / "0001__clean__r0.json").read_text())
    del stray["phase"]
    (folder / "stray.json").write_text(json.dumps(stray))
    mistyped = json.loads((folder / "0001__camera-L2__r0.json").read_text())
    (folder / "0001__camera-L2__r0.json").write_text(json.dumps({**mistyped, "valid": "false"}))
    # every command still works and names the files; the keys of unreadable records run again
    proc = cli(*args)
    assert "2 rollouts run, 2 already recorded" in proc.stdout
    assert "stray.json: missing field(s) phase" in proc.stderr
    assert cli("export", str(run_dir), "--out", str(tmp_path / "t.csv")).stdout.startswith("4 records")
    audit = cli("audit", str(run_dir), check=False)
    assert audit.returncode == 1 and "Traceback" not in audit.stderr
    report = json.loads((run_dir / "audit.json").read_text())
    assert report["unreadable_records"] == [{"file": "records/formal/Reach/stray.json",
                                             "problem": "missing field(s) phase"}]
    (folder / "stray.json").unlink()
    assert cli("audit", str(run_dir)).returncode == 0


@pytest.mark.parametrize("change, problem", [
    ({"valid": "false"}, "field 'valid' must be true or false"),
    ({"episode": "3"}, "field 'episode' must be an integer"),
    ({"episode": True}, "field 'episode' must be an integer"),
    ({"success": 1}, "field 'success' must be true or false or null"),
    ({"phase": "nope"}, "field 'phase' must be one of"),
    ({"condition": "../x"}, "field 'condition' must be a non-empty name"),
])
def test_a_record_with_a_mistyped_field_is_not_read_as_a_record(tmp_path, change, problem):
    store = RunStore(tmp_path)
    rec = Record(phase="formal", task="Lift", episode=0, condition="clean", replicate=0, backend="fake",
                 policy="fake", spec_hash="s", stage_spec_hash="t", study_seed=1, env_seed=2, policy_seed=3,
                 horizon=40, n_stages=1, stage_names=["a"], success=True)
    path = store.write(rec)
    path.write_text(json.dumps({**rec.to_json(), **change}))
    with pytest.warns(RuntimeWarning, match="skipping unreadable record"):
        assert store.recorded_keys() == {}
    ((file, why),) = store.unreadable_records()
    assert file == "records/formal/Lift/0000__clean__r0.json" and problem in why


def test_a_corrupt_manifest_or_plan_is_a_run_directory_error_naming_the_file(tmp_path):
    store = RunStore(tmp_path)
    (tmp_path / "manifest.json").write_text('{"spec_hash": ')
    with pytest.raises(RunDirError, match="manifest.json: the run's manifest is not valid JSON"):
        store.manifest()
    (tmp_path / "plan.json").write_text('{"nokeys": []}')
    with pytest.raises(RunDirError, match="plan.json: not a plan"):
        store.planned_keys()


def test_merge_places_each_record_by_the_key_inside_it_and_copies_atomically(tmp_path):
    args = ["run", *FAKE, "--task", "Reach", "--condition", "clean,base:L3", "--episodes", "0-2", "--workers", "1"]
    cli(*args, "--run-dir", str(tmp_path / "all"))
    cli(*args, "--run-dir", str(tmp_path / "s0"), "--shard", "0/2")
    cli(*args, "--run-dir", str(tmp_path / "s1"), "--shard", "1/2")
    # shard 0 holds episodes 0 and 2; its episode-0 record renamed to episode 1's file name, which shard 1 also has
    folder = tmp_path / "s0" / "records" / "formal" / "Reach"
    os.replace(folder / "0000__clean__r0.json", folder / "0001__clean__r0.json")
    (folder / "junk.json").write_text("{")
    proc = cli("merge", str(tmp_path / "merged"), str(tmp_path / "s0"), str(tmp_path / "s1"))
    assert "6 records from 2 run directories" in proc.stdout and "junk.json" in proc.stderr
    merged = tmp_path / "merged" / "records"
    assert len([p for p in merged.rglob("*.json")]) == 6 and not list(merged.rglob(".*"))
    # before the fix shard 1's record overwrote the misnamed one: "6 records" wrote 5
    assert records_of(tmp_path / "merged") == records_of(tmp_path / "all")
    assert cli("audit", str(tmp_path / "merged")).returncode == 0


def test_merge_never_reads_a_source_record_twice(tmp_path, monkeypatch):
    """The bytes written are the bytes checked: a copy made by re-reading (shutil.copy2) could tear."""
    cli("run", *FAKE, "--task", "Reach", "--episodes", "0-1", "--workers", "1", "--run-dir", str(tmp_path / "a"))
    from robocasa_shift.study import pipeline

    def no_copy(*a, **k):
        raise AssertionError("merge copied a file instead of writing the bytes it checked")

    monkeypatch.setattr(shutil, "copy2", no_copy)
    monkeypatch.setattr(shutil, "copyfile", no_copy)
    assert pipeline.merge(tmp_path / "m", [tmp_path / "a"])["records"] == 2


# --------------------------------------------------------------------------- finding 9: clean errors


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("options, code, phrase", [
    (["--policy", "openpi", "--policy-option", "port=notanint"], 2, "cannot be built with the options"),
    (["--policy", "openpi", "--policy-option", "host=127.0.0.1", "--policy-option", "port=PORT"], 3,
     "cannot connect to the openpi server"),
    (["--policy", "fake", "--policy-option", "action_noise=[1"], 2, "not valid YAML"),
])
def test_policy_problems_exit_with_a_message_and_leave_no_run_directory(tmp_path, options, code, phrase):
    options = [o.replace("PORT", str(free_port())) for o in options]
    proc = cli("run", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--workers", "1", "--no-progress",
               *options, "--run-dir", str(tmp_path / "run"), check=False)
    assert_clean_refusal(proc, code, phrase)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("content, phrase", [
    (b"", "empty file"),
    (b"task,episode,condition\nLift,0,clean,extra\n", "line 2: 4 fields, but the header has 3"),
    (b"task,episode,condition\n\xff\xfe,0,clean\n", "not UTF-8 text"),
])
def test_analyze_refuses_an_empty_ragged_or_non_utf8_csv_with_a_message(tmp_path, content, phrase):
    path = tmp_path / "records.csv"
    path.write_bytes(content)
    proc = cli("analyze", str(path), "--out", str(tmp_path / "out"), check=False)
    assert_clean_refusal(proc, 2, phrase, "records.csv")
    assert not (tmp_path / "out").exists()


def test_a_corrupt_lock_file_a_nan_and_a_non_utf8_spec_are_spec_errors(spec_copy):
    lock = spec_copy / "spec.lock"
    frozen = lock.read_text()
    lock.write_text(frozen[: len(frozen) // 2])
    with pytest.raises(FrozenSpecError, match="spec.lock: the lock file is corrupt"):
        specs.load_protocol(spec_copy)
    proc = cli_env("conditions", env={"ROBOCASA_SHIFT_PERTURBATIONS": str(spec_copy)})
    assert_clean_refusal(proc, 2, "spec.lock")
    lock.write_text(frozen)
    blur = spec_copy / "blur.yaml"
    text = blur.read_text()
    content = yaml.safe_load(text)
    content["options"] = {**(content.get("options") or {}), "nan_option": float("nan")}
    blur.write_text(yaml.safe_dump(content))  # written as .nan
    with pytest.raises(SpecError, match="blur.yaml: field 'options.nan_option': must be a finite number"):
        specs.load_protocol(spec_copy)
    blur.write_bytes(text.encode() + b"\n# \xff\n")
    with pytest.raises(SpecError, match="blur.yaml: field '\\(document\\)': not UTF-8 text"):
        specs.load_protocol(spec_copy)


def test_after_five_policy_server_failures_in_a_row_the_study_stops_and_resumes_later(tmp_path):
    run_dir, down = tmp_path / "run", tmp_path / "server-is-down"
    down.touch()
    args = ["run", *FAKE, "--task", "Reach", "--condition", "clean,camera:L2", "--episodes", "0-5", "--workers", "2",
            "--policy-option", f"server_down_while={down}", "--run-dir", str(run_dir)]
    proc = cli(*args, check=False, timeout=120)
    assert_clean_refusal(proc, 3, "the policy server failed 5 rollouts in a row", "stay pending")
    records = RunStore(run_dir).records()
    assert len(records) == 5 and {r["error_kind"] for r in records} == {"policy_server"}
    down.unlink()  # the server is back: the same command runs the keys still pending
    assert "7 rollouts run, 5 already recorded" in cli(*args).stdout
    assert "5 rollouts run, 7 already recorded" in cli(*args, "--retry-errors").stdout
    assert cli("audit", str(run_dir)).returncode == 0


# --------------------------------------------------------------------------- finding 11: low


def test_more_than_100000_keys_need_force_and_are_refused_before_any_list_is_built(tmp_path):
    from robocasa_shift.study.plan import MAX_KEYS, parse_episodes, plan_keys

    t0 = time.monotonic()
    with pytest.raises(BadInput, match="--force"):
        parse_episodes("0-999999999")
    with pytest.raises(BadInput, match="more than 100,000"):
        plan_keys(["Reach", "PickPlace"], range(5000), [f"c{i}" for i in range(13)])
    assert time.monotonic() - t0 < 1.0
    assert len(plan_keys(["Reach"], range(MAX_KEYS + 1), ["clean"], force=True)) == MAX_KEYS + 1
    proc = cli("run", *FAKE, "--task", "Reach", "--episodes", "0-999999999", "--run-dir", str(tmp_path / "run"),
               check=False, timeout=60)
    assert_clean_refusal(proc, 2, "--force")
    assert not (tmp_path / "run").exists()


def test_reference_weights_are_loaded_with_weights_only(monkeypatch):
    torch = pytest.importorskip("torch")
    from robocasa_shift.policies.reference import policy as reference

    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    monkeypatch.setattr(reference, "_NETS", {})
    p = reference.ReferencePolicy()
    p._net(next(iter(p.manifest["nets"])))
    assert calls and all(c.get("weights_only") is True for c in calls)


def test_a_record_rename_is_followed_by_an_fsync_of_its_directory(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    rec = Record(phase="formal", task="Lift", episode=0, condition="clean", replicate=0, backend="fake",
                 policy="fake", spec_hash="s", stage_spec_hash="t", study_seed=1, env_seed=2, policy_seed=3,
                 horizon=40, n_stages=1, stage_names=["a"], success=True)
    RunStore(tmp_path).write(rec)
    assert synced == ["file", "dir"]
