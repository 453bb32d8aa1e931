"""Shared directories made on the fake backend, for the tests that attack them (test_security_files, test_fuzz_inputs).

``make_corpus(root)`` builds, once: a run directory with step and frame logs, a branch study in it, and a judge
set exported from it with predictions of a test judge. Everything is small (two tasks, six base
episodes, two conditions) and takes a few seconds.
"""

import contextlib
import shutil
import signal
from pathlib import Path
from typing import Dict

from robocasa_shift.config import ExecutionConfig, StudyConfig
from robocasa_shift.judging.judges import JUDGES, Judge, Verdict

QUIET = ExecutionConfig(workers=1, progress=False)
TASKS, CONDITIONS, EPISODES = ["Reach", "PickPlace"], ["clean", "blur:L3"], range(6)
TEST_JUDGE = "always-test"


class AlwaysJudge(Judge):
    """A test judge: every sample succeeded, with confidence 0.9 (reads the end frames, as a real judge)."""

    name = TEST_JUDGE
    inputs = "end"

    def judge(self, samples):
        for s in samples:
            s.frame("end", next(iter(s.cameras)))  # decodes an image: the judge set's reads are exercised
        return [Verdict(True, 0.9) for _ in samples]


def register_test_judge() -> str:
    if TEST_JUDGE not in JUDGES:
        JUDGES.register(TEST_JUDGE, AlwaysJudge)
    return TEST_JUDGE


def make_corpus(root: Path) -> Dict[str, Path]:
    """``{"run": run dir with a branch study, "set": judge set, "predictions": its test judge's CSV}``."""
    import robocasa_shift as rs
    from robocasa_shift.branching.checkpoints import BranchSettings
    from robocasa_shift.branching.study import Selection, branch
    from robocasa_shift.judging.export import ExportSettings, export_judge
    from robocasa_shift.judging.judges import run_judge

    run = root / "run"
    rs.run_study(run, TASKS, CONDITIONS, EPISODES, study=StudyConfig(backend="fake", policy="fake", log_steps=True,
                                                                     log_frames=True),
                 execution=QUIET)
    branch(run, Selection(max_trunks=1), BranchSettings(interventions=("continue",), k_initial=1, k_expanded=1,
                                                        stride=4), QUIET)
    judge_set = root / "set"
    export_judge(run, judge_set, ExportSettings(size=16, frames=2), QUIET)
    predictions = judge_set / "predictions" / f"{register_test_judge()}.csv"
    run_judge(judge_set, TEST_JUDGE, predictions, {}, QUIET)
    return {"run": run, "set": judge_set, "predictions": predictions}


def copy_corpus(corpus: Dict[str, Path], dest: Path) -> Dict[str, Path]:
    """A private copy of ``corpus`` under ``dest`` (symbolic links copied as links)."""
    out = {}
    for name in ("run", "set"):
        out[name] = Path(shutil.copytree(corpus[name], dest / name, symlinks=True))
    out["predictions"] = out["set"] / corpus["predictions"].relative_to(corpus["set"])
    return out


class Hang(BaseException):
    """A command ran past its deadline (what a FIFO or a dripping server would do before the fix)."""


@contextlib.contextmanager
def deadline(seconds: float):
    def expire(signum, frame):
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
