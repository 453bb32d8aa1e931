import json
import subprocess
import sys

import pandas as pd
import pytest
from helpers import ROOT, cli


def test_conditions_json_lists_the_thirteen_of_the_matrix_then_the_optional_ones():
    out = json.loads(cli("conditions", "--json").stdout)
    rows = {r["condition"]: r["params"] for r in out["conditions"]}
    assert list(rows) == [
        "clean",
        "illumination:L1", "illumination:L2", "illumination:L3",
        "camera:L1", "camera:L2", "camera:L3",
        "base:L1", "base:L2", "base:L3",
        "blur:L1", "blur:L2", "blur:L3",
        *(f"{f}:L{i}" for f in ("camera_pose", "motion_blur", "zoom_blur", "fog", "glass_blur", "arm_init", "language",
                                "action_latency", "obs_latency", "control_rate", "joint_friction", "joint_damping",
                                "actuator_gain", "gripper_force", "object_mass", "object_friction", "execution_noise")
          for i in (1, 2, 3)),
        "camera_pose:L2+motion_blur:L2", "arm_init:L2+action_latency:L2", "obs_latency:L2+control_rate:L2",
    ]
    assert [r["condition"] for r in out["conditions"] if r.get("optional")] == list(rows)[13:]
    assert rows["language:L1"] == {"min_distance": 0.0, "max_distance": 0.5}
    # every factor under its family, with the backends that run it
    factors = {f["factor"]: f for f in out["factors"]}
    assert [f["family"] for f in out["factors"]] == sorted((f["family"] for f in out["factors"]),
                                                           key=list(out["families"]).index)
    assert factors["language"]["backends"]["robosuite"]["status"] == "no"
    assert factors["control_rate"]["backends"]["robocasa"]["status"] == "yes"
    assert rows["illumination:L3"] == {"alpha": 0.4}
    assert rows["camera:L2"] == {"theta_max_deg": 6.0}
    assert rows["base:L3"] == {"sigma_xy_m": 0.1, "sigma_psi_deg": 10.0}
    assert rows["blur:L1"] == {"sigma_px": 1.0}
    assert len(out["spec_hash"]) == 64 and isinstance(out["study_seed"], int)


def test_tasks_json():
    out = json.loads(cli("tasks", "--json").stdout)
    tasks = {t["task"]: t for t in out["tasks"]}
    assert list(tasks) == ["Lift", "Stack", "PickPlaceCan", "NutAssemblySquare"]
    assert all(t["horizon"] == 400 for t in tasks.values())
    assert [g["id"] for g in tasks["Stack"]["subgoals"]] == ["grasp_cubeA", "lift_cubeA", "cubeA_above_cubeB", "cubeA_on_cubeB"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--task", "Lfit", "--run-dir", "X"], "unknown task 'Lfit' (did you mean 'Lift'?); known: Lift, Stack"),
        (["run", "--task", "Lift", "--condition", "blur:L9", "--run-dir", "X"], "unknown condition 'blur:L9'"),
        (["run", "--task", "Lift", "--policy", "gpt", "--run-dir", "X"], "unknown policy 'gpt'; known: expert"),
        (["run", "--task", "Lift", "--backend", "isaac", "--run-dir", "X"], "unknown backend 'isaac'; known: "),
        (["run", "--task", "Lift", "--episodes", "5-2", "--run-dir", "X"],
         "bad episode range '5-2' in '5-2': it ends before it starts (write the lower number first: '2-5')"),
        (["tasks", "--backend", "isaac"], "unknown backend 'isaac'"),
        (["run", "--task", "Lift", "--policy-option", "bogus=1", "--run-dir", "X"],
         "policy 'reference' takes no option 'bogus'; its options: weights_dir, blind"),
        (["run", "--task", "Lift", "--policy-option", "gain", "--run-dir", "X"], "expected KEY=VALUE, got 'gain'"),
        (["run", "--task", "Lift", "--batch", "0", "--run-dir", "X"], "must be at least 1"),
        (["run", "--task", "Lift", "--workers", "0", "--run-dir", "X"], "'--workers': must be at least 1, got 0"),
        (["run", "--task", "Lift", "--threads", "-1", "--run-dir", "X"], "'--threads': must be at least 1, got -1"),
        (["formal", "--task", "Lift", "--workers", "0", "--run-dir", "X"], "'--workers': must be at least 1"),
        (["screen", "--batch", "0", "--run-dir", "X"], "'--batch': must be at least 1"),
        (["run", "--task", "Lift", "--shard", "3/2", "--run-dir", "X"], "need 0 <= i < n"),
        (["run", "--backend", "fake", "--task", "Reach", "--policy", "gr00t", "--policy-option", "port=1",
          "--policy-option", 'action_map=[{"kee": "a", "dim": 3, "targets": [0, 1, 2]}]', "--run-dir", "X"],
         "action_map: slot 1, {\"kee\": \"a\", \"dim\": 3, \"targets\": [0, 1, 2]}, is not {key, dim, targets, "
         "binary}: it has no 'key'"),
        (["run", "--backend", "fake", "--task", "Reach", "--policy", "vla-eval", "--policy-option", "port=1",
          "--policy-option", 'action_layout=[{"name": "a", "columns": [0], "targets": 5}]', "--run-dir", "X"],
         "action_layout: slot 1, {\"name\": \"a\", \"columns\": [0], \"targets\": 5}, is not {name, columns, "
         "targets, binary}: 'int' object is not iterable"),
        # vla-eval's default preset (libero, 7-D actions) on the fake backend's 3-D embodiment: refused before any
        # connection (nothing listens on its default port here)
        (["run", "--backend", "fake", "--task", "Reach", "--policy", "vla-eval", "--run-dir", "X"],
         "policy 'vla-eval' with options {} makes 7-D actions; backend 'fake' takes 3-D ones"),
    ],
)
def test_bad_names_exit_2_with_the_valid_ones(tmp_path, args, message):
    args = [str(tmp_path / "run") if a == "X" else a for a in args]
    proc = cli(*args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing was started


def test_a_record_without_the_fields_that_have_defaults_exports_them_as_their_defaults(tmp_path):
    """The store accepts a record file that leaves out a field with a default (an older version wrote fewer); the
    records table read it with ``rec[name]`` and export died with a KeyError instead."""
    import json

    run_dir = tmp_path / "run"
    cli("run", "--backend", "fake", "--task", "Reach", "--condition", "clean", "--episodes", "0", "--run-dir",
        str(run_dir), "--policy", "fake-expert", "--workers", "1", "--no-progress")
    (path,) = (run_dir / "records").rglob("*.json")
    record = json.loads(path.read_text())
    for name in ("policy_rng_fingerprint", "env_fingerprint", "renderer", "error", "error_kind", "perturbation"):
        del record[name]
    path.write_text(json.dumps(record))
    proc = cli("export", str(run_dir), "--out", str(tmp_path / "records.csv"), check=False)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(tmp_path / "records.csv", keep_default_na=False)
    assert table.policy_rng_fingerprint.tolist() == [""] and table.error.tolist() == [""]
    assert table.success.tolist() == [True]


def test_run_and_export_records_table(tmp_path):
    run_dir = tmp_path / "run"
    proc = cli("run", "--backend", "fake", "--task", "Reach", "--condition", "clean,camera:L3", "--episodes", "0",
               "--run-dir", str(run_dir), "--policy", "fake-expert", "--workers", "1", "--no-progress")
    assert "2 rollouts run, 0 already recorded" in proc.stdout
    cli("export", str(run_dir), "--out", str(tmp_path / "records.csv"))
    table = pd.read_csv(tmp_path / "records.csv")
    required = ["task", "episode", "condition", "success", "n_stages", "stages_completed", "first_incomplete",
                "valid", "phase", "replicate", "spec_hash", "stage_error"]
    exported = ["backend", "policy", "steps", "horizon", "env_fingerprint", "policy_rng_fingerprint",
                "perturbation_params", "stage_steps", "error", "renderer", "wall_s"]
    assert set(required + exported) <= set(table.columns)
    assert list(table.condition) == ["camera:L3", "clean"]
    assert table.success.tolist() == [True, True] and table.valid.all()
    assert table.env_fingerprint.nunique() == 1
    assert table.first_incomplete.isna().all()  # every subgoal latched
    cam = json.loads(table.loc[0, "perturbation_params"])["agentview"]
    assert 0 < (cam["yaw_deg"] ** 2 + cam["pitch_deg"] ** 2) ** 0.5 <= 10
    again = cli("run", "--backend", "fake", "--task", "Reach", "--condition", "clean", "--episodes", "0-1",
                "--run-dir", str(run_dir), "--policy", "fake-expert", "--workers", "1", "--no-progress")
    assert "1 rollouts run, 1 already recorded" in again.stdout


def test_tampered_spec_refuses_to_run(tmp_path, spec_copy):
    import os
    import subprocess
    import sys

    from helpers import ROOT

    path = spec_copy / "illumination.yaml"
    path.write_text(path.read_text().replace("alpha: 0.4", "alpha: 0.3"))
    env = {**os.environ, "ROBOCASA_SHIFT_PERTURBATIONS": str(spec_copy)}
    proc = subprocess.run([sys.executable, "-m", "robocasa_shift", "run", "--backend", "fake", "--task", "Reach",
                           "--policy", "fake", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 2
    assert "frozen sha256:" in proc.stderr and "current sha256:" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_policy_options_are_typed_yaml_and_reach_the_manifest(tmp_path):
    from robocasa_shift.cli.common import parse_policy_options
    from robocasa_shift.config import StudyConfig
    from robocasa_shift.study.runner import study_manifest
    from robocasa_shift.study.worker import StudyCache

    options = parse_policy_options(["gain=6.5", "blind=true", "weights_dir=some/dir/", "chunk=8"])
    assert options == {"gain": 6.5, "blind": True, "weights_dir": "some/dir/", "chunk": 8}
    study = StudyConfig("robosuite", "reference", policy_options={"gain": 6.5, "chunk": 8})
    assert study.policy_options == (("gain", 6.5), ("chunk", 8)) and study.policy_kwargs == {"gain": 6.5, "chunk": 8}
    manifest = study_manifest(StudyCache(study), ["Lift"])
    assert manifest["policy_options"] == {"gain": 6.5, "chunk": 8}
    assert manifest["policy"]["gain"] == 6.5 and manifest["policy"]["chunk"] == 8


def test_workers_below_one_exits_2_before_the_run_directory_exists(tmp_path):
    from click.testing import CliRunner

    from robocasa_shift.cli import main

    run_dir = tmp_path / "run"
    result = CliRunner().invoke(main, ["run", "--task", "Lift", "--workers", "0", "--run-dir", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--workers': must be at least 1, got 0" in result.stderr
    assert not run_dir.exists()


def test_the_default_policy_is_reference_in_the_cli_and_the_api():
    import inspect

    from click.testing import CliRunner

    from robocasa_shift.checks.screening import screen
    from robocasa_shift.cli import main
    from robocasa_shift.config import DEFAULT_POLICY, StudyConfig

    assert DEFAULT_POLICY == "reference" and StudyConfig().policy == "reference"
    assert inspect.signature(screen).parameters["study"].default.policy == "reference"
    for command in ("run", "formal", "screen", "validate-pairing", "bench"):
        assert "[default: reference]" in " ".join(CliRunner().invoke(main, [command, "--help"]).output.split())


def test_execution_and_study_configs_validate_on_construction_and_pickle():
    import pickle

    from robocasa_shift.config import ExecutionConfig, StudyConfig, field_help
    from robocasa_shift.errors import BadInput

    for bad in ({"workers": 0}, {"threads": 0}, {"batch": 0}, {"batch": None}, {"workers": 1.5}, {"workers": True}):
        with pytest.raises(BadInput, match="ExecutionConfig"):
            ExecutionConfig(**bad)
    with pytest.raises(BadInput, match="StudyConfig.policy must be a non-empty name"):
        StudyConfig(policy="")
    execution = ExecutionConfig(workers=2, batch=3, progress=False).resolved()
    assert execution.workers == 2 and execution.threads >= 1 and execution.batch == 3
    assert execution.record() == {"executor": "local", "workers": 2, "address": None,
                                  "threads": execution.threads, "batch": 3, "rollout_timeout_s": 3600.0}
    study = StudyConfig(policy="expert", policy_options={"gain": 2})
    assert pickle.loads(pickle.dumps(study)) == study and pickle.loads(pickle.dumps(execution)) == execution
    assert hash(study) == hash(StudyConfig(policy="expert", policy_options=(("gain", 2),)))
    assert field_help(ExecutionConfig, "workers").startswith("Parallel workers")


@pytest.mark.parametrize("command", ["report", "audit", "compare", "export", "merge"])
def test_the_help_of_the_commands_that_read_a_run_shows_an_example(command):
    from click.testing import CliRunner

    from robocasa_shift.cli import main

    text = CliRunner().invoke(main, [command, "--help"], terminal_width=100).output
    assert "Example" in text and f"robocasa-shift {command} runs/" in text, text


def test_help_lists_every_command_and_each_loads_from_its_module_under_its_name():
    import importlib
    import re

    import click

    from robocasa_shift.cli import COMMANDS, main

    listed = cli("--help").stdout.split("Commands:\n")[1]
    assert re.findall(r"^  (\S+)", listed, re.M) == sorted(COMMANDS)
    # every command a command module defines is in the table (a subcommand through its group)
    defined = set()
    for path in sorted((ROOT / "robocasa_shift" / "cli").glob("[!_]*.py")):
        module = importlib.import_module(f"robocasa_shift.cli.{path.stem}")
        objects = {name: obj for name, obj in vars(module).items() if isinstance(obj, click.Command)}
        below = {id(sub) for obj in objects.values() if isinstance(obj, click.Group) for sub in obj.commands.values()}
        defined |= {f"{module.__name__}:{name}" for name, obj in objects.items() if id(obj) not in below}
    assert defined == set(COMMANDS.values())
    ctx = click.Context(main)
    assert all(main.get_command(ctx, name).name == name for name in COMMANDS)
    assert main.get_command(ctx, "nope") is None


def test_an_unknown_command_is_refused_with_the_close_names_of_every_command():
    proc = cli("conditon", check=False)
    assert proc.returncode == 2
    assert "No such command 'conditon'. (Did you mean one of: 'conditions', 'monitors'?)" in proc.stderr


# The CLI in a fresh interpreter: the command's exit status, then which of the heavy modules it imported.
IMPORTS_OF_A_COMMAND = """
import sys
from robocasa_shift.cli import main
try:
    main(sys.argv[1:], prog_name="robocasa-shift")
except SystemExit as exc:
    print("exit", exc.code)
print(sorted(m for m in ("pandas", "scipy", "matplotlib") if m in sys.modules))
"""


def test_the_light_commands_import_no_pandas_scipy_or_matplotlib(tmp_path):
    run = tmp_path / "run"
    fake = ["--backend", "fake", "--policy", "fake", "--task", "Reach", "--episodes", "0", "--no-progress"]
    for args in (["conditions"], ["tasks"], ["policies"], ["run", *fake, "--run-dir", str(run)], ["audit", str(run)]):
        proc = subprocess.run([sys.executable, "-c", IMPORTS_OF_A_COMMAND, *args], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        assert proc.stdout.splitlines()[-2:] == ["exit 0", "[]"], (args, proc.stdout[-2000:], proc.stderr[-2000:])
    # the records table's command does import pandas (the check sees an import when there is one)
    proc = subprocess.run([sys.executable, "-c", IMPORTS_OF_A_COMMAND, "export", str(run), "--out", str(tmp_path / "r.csv")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.stdout.splitlines()[-2] == "exit 0" and "'pandas'" in proc.stdout.splitlines()[-1], proc.stdout[-2000:]
