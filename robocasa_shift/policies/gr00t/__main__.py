"""``python -m robocasa_shift.policies.gr00t serve|ping``: see ``launcher``."""

import sys

from robocasa_shift.policies.gr00t.server import main

sys.exit(main())
