"""Branch studies and sampling monitors of served policies, end to end on loopback (fake backend).

``run --log-steps`` -> ``branch`` (every chunk boundary) -> ``audit`` -> ``monitors`` with ``--policy gr00t``
against this harness's GR00T launcher (``python -m robocasa_shift.policies.gr00t serve --model-factory ...``)
and with ``--policy openpi`` against its serving shim (``python -m robocasa_shift.policies.openpi serve
--policy-factory ...``), both started from their command lines, around the
stand-ins of ``served_standins`` (noise from the generator the server manages). Every checkpoint must
reproduce its trunk in a fresh worker process (replay fidelity), the audit must pass, and the sampling
disagreement monitor must be computed from the servers' samples. A server restarted without its state
key between trunk and branch is refused; with the key it is the same server.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from helpers import ROOT, cli
from served_standins import GR00T_OPTIONS, OPENPI_OPTIONS, Gr00tFakeModel

from robocasa_shift.backends import get_backend
from robocasa_shift.branching.checkpoints import BranchSettings, record_trunk, run_checkpoint
from robocasa_shift.branching.snapshot import TrunkTape
from robocasa_shift.checks.branch_audit import audit_branch_study
from robocasa_shift.core import specs
from robocasa_shift.core.records import RolloutKey
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.policy import Gr00tPolicy

pytest.importorskip("openpi_client", reason="openpi-client is not installed: pip install -e '.[openpi]'")

HOST = "127.0.0.1"
TESTS = os.path.dirname(os.path.abspath(__file__))


def option_args(options):
    return [a for k, v in options.items() for a in ("--policy-option", f"{k}={json.dumps(v)}")]


def study(run_dir, policy, options, port):
    """A logged run, a branch study at every chunk boundary of two trunks, its audit and the monitors."""
    cli("run", "--backend", "fake", "--policy", policy, *option_args({**options, "port": port}), "--task", "Reach",
        "--condition", "clean,camera:L3,blur:L3", "--episodes", "0-5", "--workers", "1", "--log-steps",
        "--no-progress", "--run-dir", str(run_dir))
    out = cli("branch", str(run_dir), "--max-trunks", "2", "--stride", "1", "--intervention", "continue", "--k", "1",
              "--k-expanded", "1", "--workers", "2", "--no-progress", "--policy-option", f"port={port}")
    audit = cli("audit", str(run_dir), check=False)
    monitors = cli("monitors", str(run_dir), "--monitor", "sampling_disagreement,length_only", "--resamples", "20")
    return out.stdout, audit, monitors.stdout


def check_study(run_dir, branch_out, audit, monitors_out):
    bdir = run_dir / "branching" / "default"
    summary = json.loads((bdir / "summary.json").read_text())
    checkpoints = [json.loads(p.read_text()) for p in (bdir / "checkpoints").rglob("s*.json")]
    trunks = [json.loads(p.read_text()) for p in (bdir / "trunks").rglob("*.json")]
    assert "2 trunks (2 reproduced)" in branch_out
    # replay fidelity at every chunk boundary of every trunk, each restored in a fresh worker process
    assert len(checkpoints) == sum(len(t["chunk_steps"]) for t in trunks) >= 10
    assert summary["fidelity"]["ok"] == summary["fidelity"]["checked"] == len(checkpoints)
    assert all(c["valid"] and c["branched"] and c["fidelity"]["max_state_dev"] == 0.0 for c in checkpoints)
    assert audit.returncode == 0, audit.stdout[-2000:]
    report = json.loads((run_dir / "audit.json").read_text())["branching"]["default"]
    assert report["passed"] and report["fidelity"] == {"ok": len(checkpoints), "checked": len(checkpoints)}
    # the policy part of every checkpoint is a sealed session state in the snapshot file
    trunk = trunks[0]
    tape = TrunkTape.read(bdir / trunk["snapshot_file"])
    assert all("remote.blob" in tape.checkpoint(s)["policy"] for s in tape.chunk_steps)
    # the monitors read the servers' samples
    detection = pd.read_csv(run_dir / "monitors" / "detection.csv")
    row = detection[(detection.monitor == "sampling_disagreement") & (detection.window == "end")
                    & (detection.condition == "all")].iloc[0]
    assert np.isfinite(row.pooled_auc) and row.n_failures > 0 and row.n_successes > 0
    assert "sampling_disagreement" in monitors_out
    return bdir


def serve(module, factory_flag, factory, pattern):
    """Start a server from its command line on a free loopback port; (process, port)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    server = subprocess.Popen([sys.executable, "-m", module, "serve", factory_flag, factory, "--port", "0"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = server.stdout.readline()
    match = re.search(pattern, line)
    if not match:
        server.terminate()
        server.wait(10)
        raise AssertionError(f"the server did not start: {line!r}")
    return server, int(match.group(1))


@pytest.fixture(scope="module")
def gr00t_study(tmp_path_factory):
    server, port = serve("robocasa_shift.policies.gr00t", "--model-factory", "served_standins:make_gr00t_model",
                         r"on tcp://127\.0\.0\.1:(\d+) \(msgpack, session state and samples\)")
    run_dir = tmp_path_factory.mktemp("gr00t") / "run"
    try:
        yield run_dir, *study(run_dir, "gr00t", GR00T_OPTIONS, port)
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.slow
def test_a_gr00t_branch_study_reproduces_every_checkpoint_and_the_monitors_read_the_launchers_samples(gr00t_study):
    check_study(*gr00t_study)


@pytest.mark.slow
def test_an_openpi_branch_study_through_the_serving_shim_command_reproduces_every_checkpoint(tmp_path):
    server, port = serve("robocasa_shift.policies.openpi", "--policy-factory", "served_standins:make_openpi_policy",
                         r"on ws://127\.0\.0\.1:(\d+) \(seeded sessions, state, samples\)")
    try:
        run_dir = tmp_path / "run"
        check_study(run_dir, *study(run_dir, "openpi", OPENPI_OPTIONS, port))
    finally:
        server.terminate()
        server.wait(10)


def test_the_audit_refuses_policy_states_of_another_model_than_the_studys(gr00t_study, tmp_path):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(gr00t_study[0], run_dir)
    path = run_dir / "branching" / "default" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["policy"]["modality_config_sha256"] = "0" * 64  # as if the trunks were recorded with another model
    path.write_text(json.dumps(manifest))
    problems = "\n".join(audit_branch_study(run_dir, "default")["problems"])
    assert "policy state: taken with model" in problems and f"the branch study's policy is {'0' * 64}" in problems


def test_a_launcher_restarted_between_trunk_and_branch_is_refused_unless_it_kept_its_state_key():
    protocol = specs.load_protocol()
    key = RolloutKey("formal", "Reach", 1, "blur:L3")  # the object hidden: a failure, the whole horizon long
    stage_spec = specs.load_stage_spec("fake", "Reach")
    env = get_backend("fake").make("Reach")
    state_key = b"k" * 32
    servers = {name: Gr00tLauncher(Gr00tFakeModel(), HOST, 0, state_key=k)
               for name, k in (("trunk", state_key), ("restarted", None), ("same key", state_key))}
    for server in servers.values():
        server.start()
    try:
        policies = {name: Gr00tPolicy(host=HOST, port=s.port, timeout_s=5.0, **GR00T_OPTIONS)
                    for name, s in servers.items()}
        record, tape = record_trunk(env, policies["trunk"], key, protocol, stage_spec, "fake")
        tape = TrunkTape.read(tape.to_bytes())
        step = tape.chunk_steps[len(tape.chunk_steps) // 2]
        settings = BranchSettings(interventions=("continue",), k_initial=1, k_expanded=1)
        refused = run_checkpoint(env, policies["restarted"], key, protocol, stage_spec, "fake", tape, step, settings)
        assert not refused["valid"] and refused["error_kind"] == "policy_state"
        assert "changed between trunk and branch" in refused["error"] and "--state-key-file" in refused["error"]
        same = run_checkpoint(env, policies["same key"], key, protocol, stage_spec, "fake", tape, step, settings)
        assert same["valid"] and same["fidelity"]["ok"], same
        for policy in policies.values():
            policy.close()
    finally:
        for server in servers.values():
            server.stop()
