"""The package as users install it: a wheel built from the checkout, in fresh virtual environments outside it.

Every command runs from the wheel with only the base requirements: each that needs an optional dependency exits 3
with the pip line of its extra, before writing anything, and nothing prints a traceback. Then the light extras
(report, gym, the policy clients) go into the same environment and the commands that waited for them run; the heavy
ones (sim, policy) get an environment of their own. pip's cache is reused between runs (nothing here disables it),
so a second run of this file installs from it; nothing is byte-compiled at install time (see ``pip_install``).
"""

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_LINE = "pip install 'robocasa-shift[{}]'"
FAKE = ("--backend", "fake", "--workers", "1", "--no-progress")


def _run(args, cwd, timeout=900):
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{args}\nexit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of the checkout's tracked files; the copy must come back without build/ or
    *.egg-info (setuptools' scratch folders go elsewhere)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "checkout"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for name in filter(None, files):
        path = ROOT / os.fsdecode(name)
        if path.is_file():
            (source / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / path.relative_to(ROOT))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"),
          str(source)], cwd=tmp)
    left = sorted(p.name for p in source.iterdir() if p.name == "build" or p.name.endswith(".egg-info"))
    assert left == [], f"pip wheel left {left} in the checkout"
    (built,) = (tmp / "dist").glob("robocasa_shift-*.whl")
    return built


def pip_install(python: Path, *requirements: str) -> None:
    """``pip install`` into the environment of ``python``, by this interpreter's pip (``--python``).

    ``--no-compile``: the interpreter compiles what a command imports, once, when it first imports it; compiling
    every installed file up front (torch's thousands) took most of the install (measured in docs/install.md).
    """
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile", *requirements],
         cwd=python.parent.parent.parent)


def fresh_venv(where: Path, requirement: str) -> Path:
    """A new virtual environment with ``requirement`` installed; its python.

    The environment gets no pip of its own (``ensurepip`` installs and compiles one, and nothing here needs it):
    this interpreter's pip installs into it, resolving for its interpreter as its own pip would.
    """
    venv.create(where, with_pip=False)
    python = where / "bin" / "python"
    pip_install(python, requirement)
    return python


class Cli:
    """``python -m robocasa_shift`` of one environment, run in a work folder outside the checkout."""

    def __init__(self, python: Path, work: Path):
        self.python, self.work = python, work
        self.commands = set()  # every command invoked
        work.mkdir(exist_ok=True)

    def __call__(self, *args, code=0, timeout=600):
        self.commands.add(args[0])
        proc = subprocess.run([str(self.python), "-m", "robocasa_shift", *args], cwd=self.work, capture_output=True,
                              text=True, timeout=timeout)
        assert "Traceback" not in proc.stderr, f"{args}: {proc.stderr[-3000:]}"
        assert proc.returncode in ((code,) if isinstance(code, int) else code), \
            f"{args}: exit {proc.returncode}, wanted {code}\n{proc.stderr[-2000:]}"
        return proc

    def missing(self, extra, *args, leaves=None):
        """``args`` exit 3 naming ``extra``'s pip line; ``leaves`` (a path) is not created."""
        proc = self(*args, code=3)
        assert PIP_LINE.format(extra) in proc.stderr, f"{args}: {proc.stderr}"
        if leaves is not None:
            assert not (self.work / leaves).exists(), f"{args} wrote {leaves}"
        return proc


@pytest.mark.slow
def test_every_command_runs_from_the_wheel_with_the_base_requirements_then_with_the_light_extras(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv", str(wheel))
    cli = Cli(python, tmp_path / "elsewhere")
    versions = json.loads(_run([str(python), "-c", "import json, numpy, cv2, importlib.metadata as m; print(json.dumps("
                                "[numpy.__version__, sorted(d.metadata['Name'] for d in m.distributions())]))"],
                               cwd=cli.work))
    assert int(versions[0].split(".")[0]) >= 2  # the core runs on numpy 2
    assert "opencv-python-headless" in versions[1] and "opencv-python" not in versions[1]
    # the frozen data comes from inside the installed package, not from this repository
    where = _run([str(python), "-c", "from robocasa_shift.core import specs; print(specs.PERTURBATIONS_DIR)"], cwd=cli.work)
    assert Path(where.strip()).is_relative_to(tmp_path / "venv") and not Path(where.strip()).is_relative_to(ROOT)

    # -- base requirements: the whole fake-backend pipeline
    conditions = json.loads(cli("conditions", "--json").stdout)
    assert len([c for c in conditions["conditions"] if not c.get("optional")]) == 13
    cli("tasks", "--backend", "fake")
    assert "reference" in cli("policies").stdout
    cli("screen", *FAKE, "--policy", "fake-expert", "--run-dir", "screened")
    cli("run", *FAKE, "--policy", "fake", "--task", "Reach,PickPlace", "--condition", "clean,blur:L3,camera:L3",
        "--episodes", "0-2", "--run-dir", "run")
    cli("run", *FAKE, "--policy", "fake-expert", "--task", "Reach", "--condition", "clean,camera:L2", "--episodes",
        "0-1", "--log-steps", "--run-dir", "expert")
    cli("audit", "run")
    cli("export", "run", "--out", "run/records.csv")
    cli("analyze", "run/records.csv", "--out", "run/analysis")
    cli.missing("report", "report", "run", leaves="run/report")  # its pair videos need imageio: nothing written
    cli("report", "run", "--videos", "0")
    assert "Audit passed." in (cli.work / "run" / "report" / "index.html").read_text()
    cli("compare", "run", "expert")
    cli("diff-runs", "run", "run")
    cli("merge", "merged", "run")
    cli("formal", *FAKE, "--policy", "fake", "--task", "Reach", "--episodes", "0", "--dry-run", "--run-dir", "dry")
    cli("calibrate", "--backend", "fake", "--task", "Reach", "--episodes", "0", "--run-dir", "checks")
    cli("validate-stages", "--backend", "fake", "--task", "Reach", "--run-dir", "checks")
    cli("validate-pairing", "--backend", "fake", "--task", "Reach", "--policy", "fake", "--run-dir", "checks")
    cli("check-backend", "fake")
    cli("branch", "expert", "--condition", "camera:L2", "--max-trunks", "1", "--workers", "1")  # scipy: core
    cli("monitors", "expert")  # step logs read under numpy 2
    cli("export-judge", "expert", "--out", "judge-set")
    cli("score-judge", "judge-set", "--help")
    assert "OPENAI_API_KEY" in cli("localise", "judge-set", "--name", "boxes", "--localiser-option", "model=m",
                                   code=2).stderr  # its endpoint's key is asked for before anything is sent
    cli("sweep", "--backend", "fake", "--policy", "fake", "--task", "Reach", "--factor", "camera", "--episodes", "0-1",
        "--grid", "2", "--run-dir", "sweep")  # its derived spec goes into the run directory, not the installed package
    cli("plan-power", "--tasks", "2", "--pairs", "10", "--discordance", "0.3")
    cli("check-coverage", "--help")  # hours of simulation; its code is the statistics run above
    cli("import-liberoplus", "--help")  # it reads LIBERO-Plus's wheel, not installed here
    cli("freeze", "--help")  # it would write into the installed package's frozen data
    cli("check-policy", "fake", "--backend", "fake")
    (cli.work / "eval_info.json").write_text(json.dumps({"per_episode": [
        {"episode_ix": i, "sum_reward": 1.0, "max_reward": 1.0, "success": i % 2 == 0, "seed": 1000 + i}
        for i in range(4)], "aggregated": {}}))
    cli("import-results", "lerobot-eval", "eval_info.json", "--run-dir", "imported")
    (cli.work / "not-a-kit").mkdir()
    assert "not a stand-in kit" in cli("standin-kit", "verify", "not-a-kit", code=3).stderr
    # -- what needs an extra says which, before it starts
    cli.missing("policy", "judge", "judge-set", "--judge", "end-state")
    cli.missing("sim", "run", "--task", "Lift", "--policy", "expert", "--episodes", "0", "--run-dir", "lift",
                leaves="lift")
    cli.missing("policy", "run", *FAKE, "--policy", "reference", "--task", "Reach", "--episodes", "0",
                "--run-dir", "reference", leaves="reference")
    for policy, extra in (("gr00t", "gr00t"), ("openpi", "openpi"), ("vla-eval", "vlaeval")):
        cli.missing(extra, "run", *FAKE, "--policy", policy, "--task", "Reach", "--episodes", "0", "--run-dir", policy,
                    leaves=policy)
    cli.missing("cluster", "run", *FAKE, "--executor", "ray", "--policy", "fake", "--task", "Reach", "--episodes", "0",
                "--run-dir", "ray", leaves="ray")
    cli.missing("sim", "bench", "--out", "bench.json", leaves="bench.json")
    cli.missing("sim", "train-reference", "--data-dir", "data", leaves="data")
    cli.missing("sim", "train-judge", "--runs-dir", "judge-training", leaves="judge-training")
    gym = subprocess.run([str(python), "-c", "import robocasa_shift.gym"], cwd=cli.work, capture_output=True, text=True)
    assert gym.returncode == 1 and "DependencyMissing" in gym.stderr and PIP_LINE.format("gym") in gym.stderr
    # backends and tools that live in their own virtual environments say where
    assert "make setup-libero" in cli("run", "--backend", "libero", "--policy", "expert", "--task", "spatial-0",
                                      "--episodes", "0", "--run-dir", "libero", code=3).stderr
    assert "make setup-robocasa" in cli("standin-kit", "build", "kit", code=3).stderr
    assert "make setup-lerobot" in cli("train-lerobot", "--out", "lerobot", code=3).stderr
    assert "make setup-libero" in cli("libero-stage-specs", "--task", "spatial-0", "--out", "specs", code=3).stderr
    from robocasa_shift.cli import COMMANDS

    missing = sorted(set(COMMANDS) - cli.commands)
    assert missing == [], f"commands not run from the wheel: {missing}"

    # -- the light extras: the same environment, then what waited for them
    pip_install(python, f"{wheel}[report,gym,gr00t,openpi,vlaeval]")
    cli("report", "run")
    videos = json.loads((cli.work / "run" / "report" / "videos.json").read_text())
    assert videos and all((cli.work / "run" / "report" / v["file"]).stat().st_size > 0 for v in videos)
    quick = {"gr00t": ("timeout_s=2", "retries=0"), "openpi": ("connect_timeout_s=2",),
             "vla-eval": ("connect_timeout_s=2", "action_layout=fake-planar")}
    for policy, options in quick.items():  # installed now: nothing listens on port 1, said without a traceback
        proc = cli("run", *FAKE, "--policy", policy, "--policy-option", "port=1",
                   *[f"--policy-option={o}" for o in options], "--task", "Reach", "--episodes", "0",
                   "--run-dir", f"{policy}-served", code=(0, 1, 3), timeout=300)
        assert "pip install" not in proc.stderr, proc.stderr
    loop = ("import gymnasium, numpy as np, robocasa_shift.gym\n"
            "envs = gymnasium.make_vec('robocasa_shift/fake-Reach-v0', num_envs=2, vectorization_mode='async',\n"
            "                          run_dir='gym-run', camera_roles=(), image_size=16)\n"
            "envs.reset()\n"
            "for _ in range(40):\n"
            "    envs.step(np.zeros(envs.action_space.shape))\n"
            "envs.close()\n")
    _run([str(python), "-c", loop], cwd=cli.work)
    assert "audit: PASSED" in cli("audit", "gym-run").stdout


@pytest.mark.slow
@pytest.mark.sim
def test_the_wheel_with_the_sim_and_policy_extras_runs_the_robosuite_backend_on_numpy_1(wheel, tmp_path):
    python = fresh_venv(tmp_path / "venv", f"{wheel}[sim,policy]")
    cli = Cli(python, tmp_path / "elsewhere")
    numpy, cv2 = _run([str(python), "-c", "import numpy, cv2; print(numpy.__version__, cv2.__version__)"],
                      cwd=cli.work).split()
    assert numpy.startswith("1."), numpy  # robosuite's mink keeps numpy 1 where the sim extra is installed
    cli("run", "--task", "Lift", "--policy", "reference", "--condition", "clean,blur:L2", "--episodes", "0",
        "--workers", "1", "--no-progress", "--run-dir", "lift", timeout=900)
    cli("audit", "lift")
    cli("report", "lift", "--videos", "0")
