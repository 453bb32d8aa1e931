"""What the command modules share: error handling, option decorators built from the config fields, helpers.

An option that sets a field of :class:`~robocasa_shift.config.StudyConfig` or
:class:`~robocasa_shift.config.ExecutionConfig` takes its help and default from
that field (:func:`config_option`), and a value the field refuses is a usage
error (exit 2) raised while the command line is parsed, before anything starts.
:func:`study_options` and :func:`execution_options` hand a command its options
as one config object.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import MISSING
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import click
import yaml

from robocasa_shift.backends import get_backend
from robocasa_shift.config import (
    ASSET_KITS,
    ExecutionConfig,
    StudyConfig,
    check_field,
    config_field,
)
from robocasa_shift.errors import BadInput, Error, UnknownNameError
from robocasa_shift.extras import require
from robocasa_shift.study.plan import MAX_KEYS, parse_shard


def fail(message: str, code: int) -> None:
    """Print ``error: message`` on stderr and exit with ``code``."""
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# Ctrl-C: the shell's convention, 128 + SIGINT
INTERRUPTED_EXIT = 130


def handle_errors(fn: Callable) -> Callable:
    """Turn the harness's errors (one tree, ``robocasa_shift.errors``) into messages and exit statuses, and
    Ctrl-C into one line and exit status 130 (workers ignore it: the command stops them)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Error as exc:
            fail(str(exc), exc.exit_code)
        except KeyboardInterrupt:
            fail("interrupted (Ctrl-C); what was written is kept: run the same command again to resume",
                 INTERRUPTED_EXIT)

    return wrapper


def require_sim_and_torch(command: str) -> None:
    """A training command's extras, checked before it renders anything: robosuite (``sim``) and torch (``policy``).

    Raises:
        DependencyMissing: either is not installed (the message gives the extra's pip line).
    """
    get_backend("robosuite").check_available()
    require("torch", "policy", command)


def split_names(values: Iterable[str], universe: Sequence[str]) -> List[str]:
    """Repeated or comma-separated option values, first occurrence kept; 'all' means every valid name."""
    out: List[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if item == "all":
                out.extend(universe)
            elif item:
                out.append(item)
    return list(dict.fromkeys(out))


def tasks_of(backend: str, task_opts: Iterable[str]) -> List[str]:
    """The tasks named by ``--task`` options ('all' = every task of ``backend``)."""
    return split_names(task_opts, get_backend(backend).task_names())


def finish(report: Dict[str, Any], what: str, path: Path) -> None:
    """Say whether a check passed and where its report is; exit 1 when it did not pass."""
    click.echo(f"{what}: {'PASSED' if report['passed'] else 'FAILED'} -> {path}")
    if not report["passed"]:
        sys.exit(1)


def report_run(result: Dict[str, Any], run_dir: Path) -> None:
    """One line on what a run did."""
    click.echo(
        f"{result['ran']} rollouts run, {result['skipped']} already recorded; "
        f"{result['failures']} failed, {result['invalid']} invalid -> {run_dir}"
    )


def parse_policy_options(opts: Iterable[str], hint: str = "--policy-option") -> Dict[str, Any]:
    """``KEY=VALUE`` texts -> ``{KEY: value}``, each value read as YAML (``8`` is an int, ``true`` a bool);
    ``hint`` names the option in errors.

    Raises:
        click.BadParameter: a text without ``=`` or without a key.
    """
    options: Dict[str, Any] = {}
    for text in opts:
        key, sep, value = text.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {text!r}", param_hint=hint)
        try:
            options[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise click.BadParameter(f"{key.strip()}: the value is not valid YAML ({exc})",
                                     param_hint=hint) from None
    return options


# --------------------------------------------------------------------------- options from config fields


def checked(cls: type, name: str) -> Callable:
    """A click callback refusing values that field ``name`` of ``cls`` refuses (a usage error, exit 2)."""

    def callback(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        problem = check_field(cls, name, value)
        if problem:
            raise click.BadParameter(problem)
        return value

    return callback


def config_option(cls: type, name: str, *flags: str, **kwargs: Any) -> Callable:
    """A click option for field ``name`` of config class ``cls``, passed to the command as ``name``.

    The option's help and default come from the field unless given; a field
    with a check gets a callback that applies it while the command line is parsed.
    ``flags`` default to ``--<name with dashes>``.
    """
    f = config_field(cls, name)
    kwargs.setdefault("help", f.metadata["help"])
    if "default" not in kwargs and f.default is not MISSING:
        kwargs["default"] = f.default
    if "callback" not in kwargs and "check" in f.metadata:
        kwargs["callback"] = checked(cls, name)
    return click.option(*(flags or ("--" + name.replace("_", "-"),)), name, **kwargs)


def config_options(cls: type, dest: str, options: Sequence[Tuple[str, Callable]]) -> Callable:
    """Add ``options`` (field name, option decorator) to a command; it receives them as one ``cls`` in ``dest``."""
    names = [name for name, _ in options]

    def decorate(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in names}
            try:
                config = cls(**values)
            except BadInput as exc:
                raise click.UsageError(str(exc)) from None
            return fn(*args, **{dest: config}, **kwargs)

        for _, option in reversed(options):
            wrapper = option(wrapper)
        return wrapper

    return decorate


def key_value_options(ctx: click.Context, param: click.Parameter, value: Tuple[str, ...]) -> Dict[str, Any]:
    """``--policy-option`` (or ``--judge-option``) texts as a dict (a malformed one is a usage error)."""
    return parse_policy_options(value)


# --policy-option and --trust-run-dir, declared once. A command that re-runs a run directory's rollouts (report,
# branch, export-judge) takes both: REPLAY_POLICY_OPTIONS.
POLICY_OPTION_HELP = "Policy option KEY=VALUE (repeatable, YAML values; a secret as env:NAME)."
TRUST_RUN_DIR_OPTION = click.option(
    "--trust-run-dir", is_flag=True,
    help="Also take the manifest's options that connect, authenticate or load files (host, port, checkpoint, ...) "
         "for the re-runs. Only for a run directory you trust; allow_pickle and the torch serializer never come "
         "from it.")


def policy_option(help: str = POLICY_OPTION_HELP) -> Callable:
    """The ``--policy-option KEY=VALUE`` option, passed to the command as ``policy_options`` (a dict)."""
    return click.option("--policy-option", "policy_options", multiple=True, metavar="KEY=VALUE",
                        callback=key_value_options, help=help)


def REPLAY_POLICY_OPTIONS(fn: Callable) -> Callable:
    """``--policy-option`` for re-runs of a run directory's rollouts, and ``--trust-run-dir``."""
    fn = TRUST_RUN_DIR_OPTION(fn)
    return policy_option("Policy option for the re-runs (repeatable), e.g. host=... port=... api_token=env:NAME. "
                         "Options that connect, authenticate or load files come only from here (see "
                         "--trust-run-dir).")(fn)


def study_options(policy_help: Optional[str] = None, render_profile: bool = False, log_steps: bool = False) -> Callable:
    """--policy, --backend, --policy-option, --stock-simulator (and --render-profile, --log-steps with
    --log-frames): the command gets ``study: StudyConfig``."""

    options = [
        ("policy", config_option(StudyConfig, "policy", show_default=True,
                                 **({"help": policy_help} if policy_help else {}))),
        ("backend", config_option(StudyConfig, "backend", show_default=True)),
    ]
    if render_profile:
        options.append(("render_profile", config_option(StudyConfig, "render_profile", show_default=True,
                                                        type=click.Choice(["fast", "default"]))))
    options.append(("policy_options", config_option(StudyConfig, "policy_options", "--policy-option", multiple=True,
                                                    metavar="KEY=VALUE", callback=key_value_options)))
    if log_steps:
        options.append(("log_steps", config_option(StudyConfig, "log_steps", "--log-steps/--no-log-steps",
                                                   show_default=True)))
        options.append(("log_frames", config_option(StudyConfig, "log_frames", "--log-frames/--no-log-frames",
                                                    show_default=True)))
    options.append(("stock_simulator", config_option(StudyConfig, "stock_simulator",
                                                     "--stock-simulator/--no-stock-simulator", show_default=True)))
    options.append(("asset_kit", ASSET_KIT_OPTION))
    return config_options(StudyConfig, "study", options)


def _registered_executor(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """An executor registered in ``EXECUTORS`` (built in, or a plug-in's); an unknown one lists the valid names."""
    from robocasa_shift.study.executors import EXECUTORS

    if value not in EXECUTORS:
        raise click.BadParameter(str(UnknownNameError("executor", value, EXECUTORS.names())))
    return value


execution_options = config_options(ExecutionConfig, "execution", [
    ("executor", config_option(ExecutionConfig, "executor", show_default=True, callback=_registered_executor,
                               metavar="NAME")),
    ("workers", config_option(ExecutionConfig, "workers", type=int)),
    ("address", config_option(ExecutionConfig, "address")),
    ("connect_timeout_s", config_option(ExecutionConfig, "connect_timeout_s", "--connect-timeout", type=float,
                                        show_default=True, metavar="SECONDS")),
    ("threads", config_option(ExecutionConfig, "threads", type=int)),
    ("batch", config_option(ExecutionConfig, "batch", type=int, show_default=True)),
    ("rollout_timeout_s", config_option(ExecutionConfig, "rollout_timeout_s", "--rollout-timeout", type=float,
                                        show_default=True, metavar="SECONDS")),
    ("progress", config_option(ExecutionConfig, "progress", "--progress/--no-progress")),
])
execution_options.__doc__ = ("--executor, --workers, --address, --connect-timeout, --threads, --batch, "
                             "--rollout-timeout, --progress: the command gets ``execution: ExecutionConfig``.")


def _shard(ctx: click.Context, param: click.Parameter, value: Optional[str]) -> Optional[Tuple[int, int]]:
    try:
        return parse_shard(value)
    except BadInput as exc:
        raise click.BadParameter(str(exc)) from None


SHARD_OPTION = click.option("--shard", default=None, callback=_shard,
                            help="Run only slice i of n (e.g. 0/4) into this run dir; see merge.")
RETRY_OPTION = click.option("--retry-errors", is_flag=True, help="Re-run invalid records; the old ones go to history/.")
FORCE_OPTION = click.option("--force", is_flag=True,
                            help=f"Plan more than {MAX_KEYS:,} rollouts in one command (a typo in --episodes "
                                 f"otherwise plans billions).")
TASK_OPTION = click.option("--task", "task_opts", multiple=True, default=("all",), show_default=True,
                           help="Task name(s); comma list or 'all'.")
BACKEND_OPTION = config_option(StudyConfig, "backend", show_default=True)
ASSET_KIT_OPTION = config_option(StudyConfig, "asset_kit", type=click.Choice(list(ASSET_KITS)), default=None)
RUN_DIR_OPTION = click.option("--run-dir", required=True, type=click.Path(file_okay=False, path_type=Path),
                              help="Run directory the outputs go into.")

__all__ = ["ASSET_KIT_OPTION", "BACKEND_OPTION", "FORCE_OPTION", "REPLAY_POLICY_OPTIONS", "RETRY_OPTION",
           "RUN_DIR_OPTION", "SHARD_OPTION", "TASK_OPTION", "TRUST_RUN_DIR_OPTION", "checked", "config_option",
           "config_options", "execution_options", "fail", "finish", "handle_errors", "key_value_options",
           "parse_policy_options", "policy_option", "report_run", "split_names", "study_options", "tasks_of"]
