"""``python -m robocasa_shift.policies.openpi serve --policy-factory MODULE:FUNCTION``: see ``server``."""

import sys

from robocasa_shift.policies.openpi.server import main

sys.exit(main())
