"""Every error of the harness's one tree reaches the command line as a message and its exit status."""

import inspect

import click
import pytest
from click.testing import CliRunner

from robocasa_shift import errors
from robocasa_shift.cli.common import handle_errors

ERROR_CLASSES = sorted(
    (obj for obj in vars(errors).values()
     if inspect.isclass(obj) and issubclass(obj, errors.Error) and obj.__module__ == errors.__name__),
    key=lambda cls: cls.__name__,
)


def instance(cls):
    """An instance of ``cls`` built from placeholder values for its required arguments."""
    try:
        params = inspect.signature(cls).parameters
    except ValueError:  # Exception's own __init__: no signature, takes a message
        params = {}
    args = []
    for name, param in params.items():
        if param.default is not inspect.Parameter.empty or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        args.append(["first", "second"] if name == "known" else f"<{name} of {cls.__name__}>")
    if not args:
        args = [f"<message of {cls.__name__}>"]
    return cls(*args)


def test_the_walk_finds_the_whole_tree():
    names = {cls.__name__ for cls in ERROR_CLASSES}
    assert {"Error", "BadInput", "UnknownNameError", "SpecError", "Unavailable", "PolicyServerError",
            "RunDirLocked", "RendererError"} <= names
    assert len(names) >= 19


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_each_error_exits_with_its_status_and_prints_its_message_without_a_traceback(cls):
    exc = instance(cls)

    @click.command()
    @handle_errors
    def throwaway():
        raise exc

    result = CliRunner().invoke(throwaway, [])
    assert result.exit_code == cls.exit_code
    assert isinstance(result.exception, SystemExit)  # handled: not the error itself escaping
    assert result.stderr == f"error: {exc}\n"
    assert str(exc) and "Traceback" not in result.output and result.stdout == ""


def test_an_exception_outside_the_tree_is_not_swallowed():
    @click.command()
    @handle_errors
    def throwaway():
        raise RuntimeError("a bug")

    result = CliRunner().invoke(throwaway, [])
    assert isinstance(result.exception, RuntimeError) and result.exit_code == 1


def test_a_refused_state_and_an_npz_over_its_limits_are_errors_of_the_tree_with_the_bad_input_status(tmp_path):
    import io
    import zipfile

    import numpy as np

    from robocasa_shift.arrays import NpzLimitError, read_npz
    from robocasa_shift.policies.served.state import StateRefused, pack_state

    assert NpzLimitError is errors.NpzLimitError and StateRefused is errors.StateRefused
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:  # declares 8 TB of float64 in a few bytes
        with archive.open("huge.npy", "w") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": False, "shape": (10**12,)})
    with pytest.raises(errors.Error) as caught:
        read_npz(buffer.getvalue(), max_bytes=1024)
    assert isinstance(caught.value, NpzLimitError) and caught.value.exit_code == 2
    with pytest.raises(errors.Error) as caught:
        pack_state({"rng": np.array(["not numbers"])})
    assert isinstance(caught.value, StateRefused) and caught.value.exit_code == 2
    assert isinstance(caught.value, ValueError)  # callers that caught ValueError still do


def test_a_plug_in_executor_registered_in_the_registry_is_taken_by_the_command_line(tmp_path):
    from robocasa_shift.cli import main
    from robocasa_shift.study.executors import EXECUTORS, LocalExecutor

    used = []

    class CountingExecutor(LocalExecutor):  # a plug-in: the local executor, counting what it ran
        name = "counting"

        def map(self, keys):
            used.extend(keys)
            return super().map(keys)

    EXECUTORS.register("counting", CountingExecutor)
    try:
        run_dir = tmp_path / "run"
        result = CliRunner().invoke(main, ["run", "--backend", "fake", "--policy", "fake", "--task", "Reach",
                                           "--condition", "clean", "--episodes", "0-1", "--workers", "1",
                                           "--no-progress", "--executor", "counting", "--run-dir", str(run_dir)])
        assert result.exit_code == 0, result.output
        assert len(used) == 2 and len(list(run_dir.glob("records/**/*.json"))) == 2
        result = CliRunner().invoke(main, ["run", "--backend", "fake", "--policy", "fake", "--task", "Reach",
                                           "--executor", "slurm", "--run-dir", str(tmp_path / "other")])
        assert result.exit_code == 2 and "unknown executor 'slurm'" in result.output
        assert "counting" in result.output and "local" in result.output and "ray" in result.output
    finally:
        EXECUTORS._entries.pop("counting")
