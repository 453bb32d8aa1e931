"""The make targets of served and LeRobot policies expand to commands a shell can run (``make -n``, nothing built)."""

import shutil
import subprocess

import pytest
from helpers import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def dry_run(*args: str) -> str:
    proc = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_setup_lerobot_installs_the_project_with_both_extras_in_a_line_bash_can_parse(tmp_path):
    # a comma written inside $(call ...) split the extras into two arguments: -e ".[sim  and  test]")
    out = dry_run("setup-lerobot", f"LEROBOT_VENV={tmp_path / 'venv'}")
    install = next(line for line in out.splitlines() if "pip install -q $index" in line)
    assert '-e ".[sim,test]"' in install
    assert subprocess.run(["bash", "-n", "-c", install], capture_output=True).returncode == 0


def test_branch_demo_can_be_pointed_at_a_lerobot_checkpoint_and_at_a_gr00t_launcher(tmp_path):
    run = tmp_path / "demo"
    run.mkdir()
    (run / "manifest.json").write_text("{}")
    lerobot = dry_run("branch-demo", "POLICY=lerobot", f"DEMO_RUN={run}", "LEROBOT_VENV=.venv-lerobot",
                      "POLICY_ARGS=--policy-option checkpoint=/ckpt", "BRANCH_ARGS=--select clean_failure")
    branch = next(line for line in lerobot.splitlines() if " branch " in line)
    assert branch.startswith(f".venv-lerobot/bin/robocasa-shift branch {run} --select clean_failure ")
    assert "--policy-option checkpoint=/ckpt" in branch
    assert f".venv-lerobot/bin/robocasa-shift report {run} --policy-option checkpoint=/ckpt" in lerobot
    gr00t = dry_run("branch-demo", "POLICY=gr00t", f"DEMO_RUN={run}", "POLICY_ARGS=--policy-option port=5555")
    branch = next(line for line in gr00t.splitlines() if " branch " in line)
    assert branch.startswith(f".venv/bin/robocasa-shift branch {run} --condition base:L2,base:L3 --max-trunks 4 ")
    assert "--policy-option port=5555" in branch
    demo = dry_run("demo", "POLICY=lerobot", "POLICY_ARGS=--policy-option checkpoint=/ckpt")
    assert ".venv-lerobot/bin/robocasa-shift formal --backend robosuite --policy lerobot --policy-option " \
           "checkpoint=/ckpt" in demo
