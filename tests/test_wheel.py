"""The package as users install it: a built wheel in a fresh virtual environment, outside the repository."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args, cwd, timeout=600):
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.slow
def test_a_wheel_installed_in_a_fresh_venv_runs_a_study_audits_and_reports_from_another_directory(tmp_path):
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT)],
         cwd=tmp_path)
    (wheel,) = wheels.glob("robocasa_shift-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "-q", f"{wheel}[report]"], cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    cli = [str(python), "-m", "robocasa_shift"]

    # the frozen data comes from inside the installed package, not from this repository
    where = _run([str(python), "-c", "from robocasa_shift.core import specs; print(specs.PERTURBATIONS_DIR)"], cwd=work)
    assert Path(where.strip()).is_relative_to(env_dir) and not Path(where.strip()).is_relative_to(ROOT)
    conditions = json.loads(_run([*cli, "conditions", "--json"], cwd=work))
    assert len([c for c in conditions["conditions"] if not c.get("optional")]) == 13

    _run([*cli, "run", "--backend", "fake", "--policy", "fake", "--task", "Reach,PickPlace", "--condition",
          "clean,blur:L2,base:L1", "--episodes", "0-2", "--workers", "1", "--run-dir", "run"], cwd=work)
    assert len(list((work / "run" / "records").rglob("*.json"))) == 18
    _run([*cli, "audit", "run", "--phase", "formal"], cwd=work)
    _run([*cli, "report", "run", "--videos", "0"], cwd=work)
    page = (work / "run" / "report" / "index.html").read_text()
    assert "blur:L2" in page and "Audit passed." in page
