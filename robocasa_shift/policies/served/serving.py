"""What every server of this harness shares (the GR00T launcher, the openpi serving shim).

- ``check_bind``: loopback unless a credential is set (anyone on a network could reach the model).
- ``same_credential``: a constant-time comparison of a credential a request carries.
- ``load_factory`` / ``factory_options``: the model a server wraps, from ``MODULE:FUNCTION``.
"""

from __future__ import annotations

import hmac
import importlib
import ipaddress
from typing import Any, Callable, Dict, Iterable, Optional, Union

from robocasa_shift.policies.served.connection import Secret

DEFAULT_HOST = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # "0.0.0.0", "*", an interface or host name: may face a network
        return False


def check_bind(host: str, credential: Optional[Secret], how_to_set: str) -> None:
    """Refuse to bind anything but loopback without a credential.

    Raises:
        ValueError: naming the host and ``how_to_set`` (the option or variable that sets the credential).
    """
    if not is_loopback(str(host)) and credential is None:
        raise ValueError(f"binding {host!r} lets other machines reach the server: give it {how_to_set}, or bind "
                         f"{DEFAULT_HOST} and reach it through an SSH tunnel")


def same_credential(given: Union[str, bytes, None], expected: Secret) -> bool:
    """Whether ``given`` is ``expected``, compared in constant time (the time taken does not tell how much of a
    guess was right)."""
    if isinstance(given, str):
        given = given.encode("utf-8")
    return isinstance(given, bytes) and hmac.compare_digest(given, expected.reveal().encode("utf-8"))


def load_factory(spec: str, flag: str = "--policy-factory") -> Callable[..., Any]:
    """``MODULE:FUNCTION`` -> the function (``flag``: the option that gave it, for messages).

    Raises:
        ValueError: not of that form, or the module has no such callable.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{flag} {spec!r}: expected MODULE:FUNCTION, e.g. my_policies:make_pi05")
    module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{flag} {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def factory_options(pairs: Iterable[str]) -> Dict[str, Any]:
    """``--factory-option KEY=VALUE`` pairs as keyword arguments (values read as YAML, safely)."""
    import yaml

    options: Dict[str, Any] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--factory-option {pair!r}: expected KEY=VALUE")
        options[name] = yaml.safe_load(value)
    return options


__all__ = ["DEFAULT_HOST", "check_bind", "factory_options", "is_loopback", "load_factory", "same_credential"]
