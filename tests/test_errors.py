"""Every error of the harness's one tree reaches the command line as a message and its exit status."""

import inspect

import click
import pytest
from click.testing import CliRunner

from robocasa_shift import errors
from robocasa_shift.cli import handle_errors

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
