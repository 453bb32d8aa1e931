"""The ``gr00t`` policy: a client of a GR00T N1.5 inference server, and a seeding launcher for it.

``wire`` (wire format), ``client`` (``Gr00tClient``), ``mapping``
(observations to payloads, replies to PandaOmron actions), ``policy``
(``Gr00tPolicy``) and ``server`` (``Gr00tLauncher`` and the command line:
``python -m robocasa_shift.policies.gr00t serve|ping|curve-keygen``). What the
launcher and the client guard against is in SECURITY.md.
"""

from robocasa_shift.policies.gr00t.client import Gr00tClient
from robocasa_shift.policies.gr00t.server import Gr00tLauncher
from robocasa_shift.policies.gr00t.policy import Gr00tPolicy

__all__ = ["Gr00tClient", "Gr00tLauncher", "Gr00tPolicy"]
