"""Helpers shared by the tests: fresh interpreters and the CLI in a subprocess."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_python(code: str, timeout: float = 300) -> str:
    """Run code in a fresh interpreter; return its stdout (fails the test on a non-zero exit)."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def cli(*args: str, timeout: float = 600, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, "-m", "robocasa_shift", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )
    if check:
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc
