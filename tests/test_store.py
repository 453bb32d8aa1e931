import json
import os
import signal
import subprocess
import sys

import pytest
from helpers import ROOT

from robocasa_shift.core.records import Record, RolloutKey
from robocasa_shift.errors import RunDirError, RunDirLocked
from robocasa_shift.rundir.store import RunStore


def record(episode=0, condition="clean", valid=True):
    rec = Record(
        phase="formal", task="Lift", episode=episode, condition=condition, replicate=0, backend="robosuite",
        policy="expert", spec_hash="s", stage_spec_hash="t", study_seed=1, env_seed=2, policy_seed=3,
        horizon=400, n_stages=3, stage_names=["a", "b", "c"], success=True, steps=10,
    )
    if not valid:
        rec.fail("runtime", "boom")
    return rec


def hold_lock(run_dir):
    code = (
        "import sys, time; from robocasa_shift.rundir.store import RunStore; "
        f"s = RunStore({str(run_dir)!r}).lock(); print('locked', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_records_are_written_atomically_and_read_back(tmp_path):
    store = RunStore(tmp_path)
    path = store.write(record(3, "camera:L2"))
    assert path.name == "0003__camera-L2__r0.json"
    assert not list(path.parent.glob(".*.tmp"))
    ((file, rec),) = store.record_entries()
    assert rec["condition"] == "camera:L2" and rec["success"] is True and file.startswith("records/formal/Lift/")
    assert store.records() == [rec] and "_file" not in rec
    assert store.recorded_keys() == {RolloutKey("formal", "Lift", 3, "camera:L2"): True}


def test_supersede_moves_the_old_record_to_history(tmp_path):
    store = RunStore(tmp_path)
    store.write(record(0, valid=False))
    store.supersede(RolloutKey("formal", "Lift", 0, "clean"))
    assert store.records() == []
    (old,) = store.records("history")
    assert old["error"] == "boom"


def test_second_process_is_refused_and_lock_dies_with_a_killed_holder(tmp_path):
    proc = hold_lock(tmp_path)
    try:
        with pytest.raises(RunDirLocked, match=f"in use by another process \\(pid {proc.pid}"):
            RunStore(tmp_path).lock()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with RunStore(tmp_path) as store:  # no stale lock after SIGKILL
        assert store._lock_fd is not None


def test_manifest_mismatch_is_refused(tmp_path):
    store = RunStore(tmp_path)
    store.ensure_manifest({"spec_hash": "a", "study_seed": 1, "stage_spec_hashes": {"Lift": "x"}})
    # another task's stage spec is added, not a conflict
    merged = store.ensure_manifest({"spec_hash": "a", "study_seed": 1, "stage_spec_hashes": {"Stack": "y"}})
    assert merged["stage_spec_hashes"] == {"Lift": "x", "Stack": "y"}
    with pytest.raises(RunDirError, match="different spec_hash"):
        store.ensure_manifest({"spec_hash": "b", "study_seed": 1})
    with pytest.raises(RunDirError, match="different stage_spec_hashes"):
        store.ensure_manifest({"spec_hash": "a", "stage_spec_hashes": {"Lift": "z"}})
    assert json.loads((tmp_path / "manifest.json").read_text())["spec_hash"] == "a"
