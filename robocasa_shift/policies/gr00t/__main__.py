"""``python -m robocasa_shift.policies.gr00t serve|ping``: see ``launcher``."""

import sys

from robocasa_shift.policies.gr00t.launcher import main

sys.exit(main())
