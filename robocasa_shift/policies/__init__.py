"""Policies. Built-ins are registered lazily so that importing the package needs no torch."""

from __future__ import annotations

import inspect
import os
from typing import Any, Dict, Mapping

from robocasa_shift.config import ENV_PREFIX, is_env_reference, is_secret_option
from robocasa_shift.core.policy import Observation, Policy
from robocasa_shift.errors import PolicyOptionError
from robocasa_shift.extras import require
from robocasa_shift.registry import Registry

POLICIES: Registry[type] = Registry("policy", "robocasa_shift.policies")
POLICIES.register("expert", "robocasa_shift.policies.scripted.expert:ExpertPolicy")
POLICIES.register("random", "robocasa_shift.policies.scripted.expert:RandomPolicy")
POLICIES.register("replay", "robocasa_shift.policies.scripted.replay:ReplayPolicy")
POLICIES.register("reference", "robocasa_shift.policies.reference:ReferencePolicy")
POLICIES.register("reference-blind", "robocasa_shift.policies.reference:BlindReferencePolicy")
POLICIES.register("gr00t", "robocasa_shift.policies.gr00t.policy:Gr00tPolicy")
POLICIES.register("openpi", "robocasa_shift.policies.openpi.client:OpenpiPolicy")
POLICIES.register("lerobot", "robocasa_shift.policies.lerobot:LeRobotPolicy")
POLICIES.register("vla-eval", "robocasa_shift.policies.vla_eval.client:VlaEvalPolicy")
# policies of the testing backend (policies/scripted/fake.py): image-driven, privileged, negative control
POLICIES.register("fake", "robocasa_shift.policies.scripted.fake:FakePolicy")
POLICIES.register("fake-expert", "robocasa_shift.policies.scripted.fake:FakeExpertPolicy")
POLICIES.register("fake-random", "robocasa_shift.policies.scripted.fake:FakeRandomPolicy")


def make_policy(name: str, **options: Any) -> Policy:
    """An instance of the policy registered under ``name``; unknown options list the valid ones.

    A secret option given as ``env:NAME`` is read from the environment variable here, in the
    process that builds the policy, so the secret itself never travels through a config or a file.
    """
    options = resolve_secret_options(options)
    return check_policy_options(name, options)(**options)


def resolve_secret_options(options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` with each secret option's ``env:NAME`` value replaced by that variable's value.

    Raises:
        PolicyOptionError: a referenced variable is not set (the message names it).
    """
    resolved = dict(options)
    for option, value in options.items():
        if is_secret_option(option) and is_env_reference(value):
            variable = value[len(ENV_PREFIX):]
            if variable not in os.environ:
                raise PolicyOptionError(f"policy option {option}={value}: the environment variable {variable} is not "
                                        f"set; export it in the shell that runs the command")
            resolved[option] = os.environ[variable]
    return resolved


def check_policy_options(name: str, options: Dict[str, Any]) -> type:
    """The policy class registered under ``name``, after checking that its constructor takes ``options`` and that
    the optional modules it ``requires`` are installed.

    Raises:
        PolicyOptionError: an option the constructor does not take.
        DependencyMissing: a module of ``requires`` is not installed (the message gives its extra's pip line).
    """
    cls = POLICIES.get(name)
    for module, extra in getattr(cls, "requires", ()):
        require(module, extra, f"policy {name!r}")
    if cls.__init__ is object.__init__:  # no constructor of its own: it takes no option
        params = {}
    else:
        params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    known = [n for n, p in params.items() if n != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = sorted(set(options) - set(known))
    if unknown and not takes_any:
        raise PolicyOptionError(f"policy {name!r} takes no option {unknown[0]!r}; its options: {', '.join(known) or '(none)'}")
    return cls


__all__ = ["POLICIES", "Observation", "Policy", "PolicyOptionError", "check_policy_options", "make_policy",
           "resolve_secret_options"]
