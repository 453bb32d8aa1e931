"""Every error a user can cause, in one tree; the CLI turns each into a message and an exit status.

Exit statuses (kept stable for scripts):

- 1 ``CheckFailed`` and errors inside a rollout (they become records, not exits)
- 2 ``BadInput``: an unknown name, a malformed or tampered spec, a bad option or range
- 3 ``Unavailable``: a backend, its assets, weights or a policy server that cannot be reached, an optional
  dependency that is not installed (``DependencyMissing``, with the pip line of its extra)
- 4 ``RunDirError``: a run directory in use, or made for a different study

Callers catch ``Error``; the subclasses say what went wrong and what to do.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import List, Optional


class Error(Exception):
    """Base of the harness's errors; ``exit_code`` is the CLI's exit status for it."""

    exit_code = 1


class CheckFailed(Error):
    """A protocol check (audit, validation, screening) ran and did not pass."""

    exit_code = 1


# --------------------------------------------------------------------------- bad input (exit 2)


class BadInput(Error, ValueError):
    """A malformed value from the user: an episode range, a shard, a replicate list, an option."""

    exit_code = 2


class UnknownNameError(BadInput, KeyError):
    """A name that is not in a registry or list; the message lists the valid names."""

    def __init__(self, kind: str, name: str, known: List[str]):
        self.kind, self.name, self.known = kind, name, known
        close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        super().__init__(f"unknown {kind} '{name}'{hint}; known: {', '.join(map(str, known)) or '(none)'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class DuplicateNameError(BadInput):
    """A name registered twice in one registry (two plug-ins claiming it)."""


class SpecError(BadInput):
    """A malformed spec file; the message names the file and the field."""

    def __init__(self, path: Path | str, field_name: str, problem: str):
        self.path, self.field, self.problem = str(path), field_name, problem
        super().__init__(f"{path}: field '{field_name}': {problem}")


class FrozenSpecError(BadInput):
    """A frozen spec whose content changed without a version bump, or was never frozen."""


class PolicyOptionError(BadInput):
    """An option the policy's constructor does not take, or a value it cannot use."""


class AnalysisError(BadInput):
    """A records table the analysis cannot use; the message says which rows or columns and why."""


class ImportFormatError(BadInput):
    """Another harness's result file that is not what its format says (names the file, line and field)."""


class StateUnsupported(BadInput):
    """A policy that cannot snapshot its state (``get_state`` / ``set_state``) is refused for branching,
    since a branch restored without its generators would not continue the rollout it claims to."""


class NpzLimitError(BadInput):
    """An ``.npz`` file that declares more than it may hold, or an entry that is not a plain array
    (``arrays.read_npz``: refused before anything is decompressed)."""


class StateRefused(BadInput):
    """A policy state blob or state arrays that will not be applied (forged, altered, another model's, too
    large); the message says why."""


# --------------------------------------------------------------------------- unavailable (exit 3)


class Unavailable(Error):
    """Something the command needs is not installed or cannot be reached."""

    exit_code = 3


class DependencyMissing(Unavailable, ImportError):
    """An optional dependency that is not installed; the message gives the pip line of the extra that installs it.

    Raised by :func:`robocasa_shift.extras.require` before a command starts its work, so nothing is half-written.
    """

    def __init__(self, purpose: str, module: str, extra: str):
        self.purpose, self.module, self.extra = purpose, module, extra
        super().__init__(f"{purpose} needs {module}, which is not installed: pip install 'robocasa-shift[{extra}]' "
                         f"(in a checkout: pip install -e '.[{extra}]')")


class BackendUnavailable(Unavailable):
    """The backend's simulator, package or assets are missing; the message says how to get them."""


class ClusterUnavailable(Unavailable):
    """A Ray cluster that cannot be used: nothing answers at its address in time, it refuses this
    driver's token, it runs another Ray or Python version, no node of it runs on this machine, or its
    workers import other frozen specs. The message names the address and what to check."""


class WeightsMissing(Unavailable):
    """A policy's weights are not where they should be; the message says how to make them."""


class PolicyServerError(Unavailable):
    """The policy server failed a request, did not answer, or answered something unusable.

    Inside a rollout it becomes the record's error (kind ``policy_server``); at the
    command line it exits 3.
    """

    error_kind = "policy_server"  # the harness files the rollout's record under this kind

    def __init__(self, message: str, endpoint: Optional[str] = None, server_message: Optional[str] = None):
        super().__init__(message)
        self.endpoint = endpoint
        self.server_message = server_message

    @property
    def unknown_endpoint(self) -> bool:
        """True when the server does not have the endpoint (a plain N1.5 server asked to ``reset``)."""
        return bool(self.server_message) and "Unknown endpoint" in self.server_message


class PolicyServerTimeout(PolicyServerError):
    """The policy server did not answer within the client's timeout."""


class ActionFormatError(PolicyServerError, ValueError):
    """The server's action chunk lacks a key or has the wrong shape."""


# --------------------------------------------------------------------------- run directory (exit 4)


class RunDirError(Error):
    """A run directory that cannot take this command (made for another study, malformed)."""

    exit_code = 4


class RunDirLocked(RunDirError):
    """Another process holds the run directory's lock."""


# --------------------------------------------------------------------------- inside a rollout


class RolloutError(Error):
    """A failure inside one rollout; the engine turns it into an invalid record with its kind."""

    error_kind = "runtime"


class PerturbationError(RolloutError):
    """A perturbation could not be applied as specified (e.g. no valid base draw)."""

    error_kind = "perturbation"


class RendererError(RolloutError):
    """The renderer failed to produce an image the policy asked for."""

    error_kind = "renderer"
