"""The run configuration: what is studied (:class:`StudyConfig`) and how it is executed (:class:`ExecutionConfig`).

Both are frozen dataclasses, built once per command (by the CLI or a notebook)
and passed whole down to the run session, the executors and the workers; both
pickle, so a spawned or remote worker gets exactly what the caller built. Each
field carries its help text in ``field(metadata={"help": ...})`` (the CLI takes
its option help from there) and, where a value can be wrong, a ``check`` that
runs on construction and raises :class:`~robocasa_shift.errors.BadInput`.

Names (backend, policy, tasks, conditions) are checked against their registries
when a run starts, not here, so building a config never imports a simulator.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from robocasa_shift.errors import BadInput

DEFAULT_POLICY = "reference"
DEFAULT_BACKEND = "robosuite"

# A field check returns a problem ("must be at least 1, got 0") or None.
Check = Callable[[Any], Optional[str]]


def at_least_one(value: Any) -> Optional[str]:
    """Field check: ``None`` (meaning "choose for me") or an integer >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    return None if value >= 1 else f"must be at least 1, got {value}"


def positive_seconds(value: Any) -> Optional[str]:
    """Field check: a finite number of seconds > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number of seconds, got {value!r}"
    return None if math.isfinite(value) and value > 0 else f"must be a finite number of seconds > 0, got {value}"


def a_name(value: Any) -> Optional[str]:
    """Field check: a non-empty string."""
    return None if isinstance(value, str) and value.strip() else f"must be a non-empty name, got {value!r}"


ASSET_KITS = ("standin",)


def an_asset_kit(value: Any) -> Optional[str]:
    """Field check: None (the backend's own assets) or a known kind of generated asset kit."""
    if value is None or value in ASSET_KITS:
        return None
    return f"must be one of {', '.join(ASSET_KITS)} (or not given), got {value!r}"


def _option(default: Any = MISSING, *, help: str, check: Optional[Check] = None, **kwargs) -> Any:
    """A dataclass field with its help text (and optional check) beside it."""
    metadata = {"help": help, **({"check": check} if check else {})}
    return field(default=default, metadata=metadata, **kwargs)


def config_field(cls: type, name: str) -> Field:
    """The dataclass field ``name`` of config class ``cls`` (KeyError listing the fields on a miss)."""
    by_name = {f.name: f for f in fields(cls)}
    if name not in by_name:
        raise KeyError(f"{cls.__name__} has no field '{name}'; fields: {', '.join(by_name)}")
    return by_name[name]


def field_help(cls: type, name: str) -> str:
    """The help text of field ``name`` of ``cls``: what the CLI shows for the matching option."""
    return config_field(cls, name).metadata["help"]


def check_field(cls: type, name: str, value: Any) -> Optional[str]:
    """The problem with ``value`` for field ``name`` of ``cls``, or None when it is acceptable."""
    check = config_field(cls, name).metadata.get("check")
    return check(value) if check else None


def _validate(config: Any) -> None:
    for f in fields(config):
        problem = check_field(type(config), f.name, getattr(config, f.name))
        if problem:
            raise BadInput(f"{type(config).__name__}.{f.name} {problem}")


def freeze_options(options: Optional[Mapping[str, Any]] | Tuple[Tuple[str, Any], ...]) -> Tuple[Tuple[str, Any], ...]:
    """Policy options as a tuple of ``(name, value)`` pairs in their given order (frozen, picklable)."""
    if options is None:
        return ()
    items = tuple(options.items()) if isinstance(options, Mapping) else tuple(tuple(item) for item in options)
    for item in items:
        if len(item) != 2 or not isinstance(item[0], str) or not item[0]:
            raise BadInput(f"policy options must map option names to values, got {item!r}")
    names = [name for name, _ in items]
    if len(set(names)) != len(names):
        raise BadInput(f"policy option given twice: {sorted({n for n in names if names.count(n) > 1})}")
    return items


# ---------------------------------------------------------------------------- secrets in policy options

SECRET_PLACEHOLDER = "<redacted>"
ENV_PREFIX = "env:"
_SECRET_NAME = re.compile(r"token|key|secret|passw(or)?d", re.IGNORECASE)
# Built-in options whose names contain "key" but name a field of a message (openpi, GR00T), not a credential:
# kept readable in the manifest.
MESSAGE_KEY_OPTIONS = frozenset({"state_key", "prompt_key", "actions_key", "language_key"})
# KEY=VALUE inside a command line; KEY may follow an option given as --option=KEY=VALUE.
_ASSIGNMENT = re.compile(r"(?P<name>[A-Za-z_][\w.-]*)=(?P<value>.*)", re.DOTALL)


def is_secret_option(name: str) -> bool:
    """Whether a policy option's value is a credential (its name contains token, key, secret or password).

    Such values are never written into a run directory (see :func:`redact_options`), and may be given
    as ``env:NAME`` to read them from an environment variable when the policy is built.
    """
    return bool(_SECRET_NAME.search(name)) and name.lower() not in MESSAGE_KEY_OPTIONS


def is_env_reference(value: Any) -> bool:
    """Whether ``value`` is an ``env:NAME`` reference to an environment variable."""
    return isinstance(value, str) and value.startswith(ENV_PREFIX) and len(value) > len(ENV_PREFIX)


def redact_url(value: str) -> str:
    """A URL with its credentials replaced by :data:`SECRET_PLACEHOLDER`; any other string unchanged.

    ``ws://alice:PW@host:8000/?api_key=Q&x=1`` becomes
    ``ws://alice:<redacted>@host:8000/?api_key=<redacted>&x=1``: the password of the user part (or the
    whole user part when it has no password: a token given as a user name) and the value of every
    query parameter whose name is a secret's (see :func:`is_secret_option`).
    """
    if not isinstance(value, str) or "://" not in value:
        return value
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    try:
        parts = urlsplit(value)
    except ValueError:
        return SECRET_PLACEHOLDER if "@" in value else value
    netloc = parts.netloc
    if "@" in netloc:
        user, _, host = netloc.rpartition("@")
        name, sep, _password = user.partition(":")
        netloc = f"{name}:{SECRET_PLACEHOLDER}@{host}" if sep else f"{SECRET_PLACEHOLDER}@{host}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        query = urlencode([(k, SECRET_PLACEHOLDER if is_secret_option(k) else v) for k, v in pairs], safe="<>")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` with the value of every secret option replaced by :data:`SECRET_PLACEHOLDER`, and the
    credentials of every URL-valued option too (:func:`redact_url`).

    An ``env:NAME`` reference is kept: it names where the secret comes from, not the secret. The
    placeholder is fixed (never a hash: a hash of a short or guessable secret leaks it), so two
    runs with different tokens still agree wherever run directories are compared.
    """
    return {name: (SECRET_PLACEHOLDER if is_secret_option(name) and value is not None and not is_env_reference(value)
                   else redact_url(value)) for name, value in options.items()}


def redact_argv(argv: Sequence[str]) -> List[str]:
    """A command line with the value of every secret ``KEY=VALUE`` (or ``--option=KEY=VALUE``) replaced, and
    the credentials of every URL in it (:func:`redact_url`)."""
    out = []
    for arg in argv:
        prefix, rest = "", arg
        if arg.startswith("--") and "=" in arg:
            option, _, rest = arg.partition("=")
            prefix = option + "="
        match = _ASSIGNMENT.fullmatch(rest)
        if match and is_secret_option(match["name"]) and not is_env_reference(match["value"]):
            arg = f"{prefix}{match['name']}={SECRET_PLACEHOLDER}"
        elif match and "://" in match["value"]:
            arg = f"{prefix}{match['name']}={redact_url(match['value'])}"
        elif "://" in rest:
            arg = prefix + redact_url(rest)
        out.append(arg)
    return out


def redact_text(text: str) -> str:
    """A space-joined command line with its secret values replaced (see :func:`redact_argv`)."""
    return " ".join(redact_argv(text.split(" ")))


def a_ray_address(value: Any) -> Optional[str]:
    """Field check: None or a Ray address without credentials (it is written to manifests and error messages;
    Ray takes its token from ``RAY_AUTH_TOKEN``, never from the address)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        return "must be HOST:PORT or ray://HOST:PORT"
    if "@" in value:
        shown = redact_url(value) if "://" in value else f"{SECRET_PLACEHOLDER}@{value.rpartition('@')[2]}"
        return (f"must not hold credentials (user:password@): give the cluster's token in RAY_AUTH_TOKEN; got "
                f"{shown}")
    return None


def default_threads(workers: int) -> int:
    """Renderer and torch threads per worker when not given: the cores shared out among the workers."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


@dataclass(frozen=True)
class StudyConfig:
    """What is studied: the backend, the policy and its options, the render profile; and whether steps are logged.

    Everything here is fixed for one run directory (the manifest records it);
    ``policy_options`` is kept as a tuple of ``(name, value)`` pairs so the
    config stays frozen, and may be given as any mapping; :attr:`policy_kwargs`
    is its dict view.
    """

    backend: str = _option(DEFAULT_BACKEND, help="Simulator backend.", check=a_name)
    policy: str = _option(DEFAULT_POLICY, help="Registered policy name.", check=a_name)
    policy_options: Tuple[Tuple[str, Any], ...] = _option(
        (), help="Option for the policy's constructor, repeatable; values are YAML "
                 "(e.g. --policy-option checkpoint=ckpt/ --policy-option port=8000). Recorded in the manifest.")
    render_profile: str = _option("fast", help="fast: no shadows, reflections or multisampling.", check=a_name)
    stock_simulator: bool = _option(False, help="Step and render with the simulator's own code only: no fused control "
                                                "step, no compiled substeps, no frame culling. Records are identical "
                                                "either way (tested); slower. The manifest records what ran.")
    log_steps: bool = _option(False, help="Write a per-step log beside each record (end effector, actions, latched "
                                          "subgoals, policy samples at each boundary), for runtime monitors and "
                                          "judges; records are unchanged.")
    log_frames: bool = _option(False, help="Keep the third-person frames of every formal rollout beside its record "
                                           "(compressed, at most 16 MiB a rollout, hashed in the record), so `report` "
                                           "films its pair videos without re-running rollouts; records are "
                                           "unchanged.")
    asset_kit: Optional[str] = _option(None, help="Run on a generated asset kit: 'standin' accepts the robocasa "
                                                  "backend's stand-in kitchens (`robocasa-shift standin-kit build`), "
                                                  "primitive geometry under RoboCasa's names, refused without this. "
                                                  "Its results are not RoboCasa's: the kit is recorded in the "
                                                  "manifest and every record, and audit, report and compare say so "
                                                  "on every page.", check=an_asset_kit)

    def __post_init__(self):
        object.__setattr__(self, "policy_options", freeze_options(self.policy_options))
        _validate(self)

    @property
    def policy_kwargs(self) -> Dict[str, Any]:
        """The policy options as a new dict (keyword arguments of the policy's constructor)."""
        return dict(self.policy_options)


@dataclass(frozen=True)
class ExecutionConfig:
    """How rollouts are executed: where, by how many workers, with how many threads, in what batches.

    None of it changes a record, except ``batch`` for a policy whose outputs
    depend on the batch's composition; :meth:`record` is what the manifest and
    ``commands.jsonl`` keep of it.
    """

    executor: str = _option("local", help="local: a process pool on this machine; ray: an existing Ray cluster; or an "
                                     "executor a plug-in registers.",
                            check=a_name)
    workers: Optional[int] = _option(None, help="Parallel workers [default: one per core].", check=at_least_one)
    address: Optional[str] = _option(None, help="Ray cluster address (ray executor): the head's HOST:PORT, as "
                                                "`ray start --head --port PORT` gives it, or ray://HOST:PORT for Ray "
                                                "Client; none starts a local Ray.", check=a_ray_address)
    connect_timeout_s: float = _option(
        30.0, help="How long the ray executor may take to reach the cluster at --address (its port, token, Ray and "
                   "Python versions) before the command stops with an error (exit 3), before the run directory is "
                   "touched.", check=positive_seconds)
    threads: Optional[int] = _option(None, help="Renderer and torch threads per worker [default: cores / workers].",
                                     check=at_least_one)
    batch: int = _option(1, help="Conditions of one base episode a worker steps in lockstep, with one batched policy "
                                 "call per decision point. Records are unchanged for policies whose outputs do not "
                                 "depend on the batch (reference); the batch size is recorded in commands.jsonl.",
                         check=at_least_one)
    rollout_timeout_s: float = _option(
        3600.0, help="Wall-clock limit per rollout in a worker process: a worker that shows no progress for this "
                     "long (times the rollouts of a lockstep group) is killed, its rollouts are recorded as invalid "
                     "(worker_timeout) and a fresh worker takes over. Recorded with the run.", check=positive_seconds)
    progress: bool = _option(True, help="Show a progress bar with ETA.")

    def __post_init__(self):
        _validate(self)
        if self.batch is None:
            raise BadInput("ExecutionConfig.batch must be at least 1, got None")

    def resolved(self) -> "ExecutionConfig":
        """A copy with the defaults filled in: workers = one per core, threads = cores / workers."""
        workers = self.workers or os.cpu_count() or 1
        return replace(self, workers=workers, threads=self.threads or default_threads(workers))

    def record(self) -> Dict[str, Any]:
        """The settings kept with the run (manifest ``executions``, ``commands.jsonl``); not the progress bar."""
        return {"executor": self.executor, "workers": self.workers, "address": self.address,
                "threads": self.threads, "batch": self.batch, "rollout_timeout_s": self.rollout_timeout_s}


__all__ = ["DEFAULT_BACKEND", "DEFAULT_POLICY", "ENV_PREFIX", "ExecutionConfig", "SECRET_PLACEHOLDER", "StudyConfig",
           "a_ray_address", "check_field", "config_field", "default_threads", "field_help", "freeze_options",
           "is_env_reference", "is_secret_option", "redact_argv", "redact_options", "redact_text", "redact_url"]
