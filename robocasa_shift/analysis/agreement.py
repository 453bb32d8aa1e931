"""Test-retest agreement of two runs on the same rollouts: Cohen's kappa and the paired discordance.

Two runs of one policy on one frozen suite should agree rollout by rollout; how often they do not
is the noise any comparison of two policies has to beat.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence

import numpy as np


def agreement(a: Sequence[bool], b: Sequence[bool]) -> Dict[str, Any]:
    """Test-retest agreement of two runs' outcomes on the same rollouts: Cohen's kappa and discordance."""
    x, y = np.asarray(a, bool), np.asarray(b, bool)
    n = len(x)
    if n == 0:
        return {"n": 0, "kappa": None, "discordance": None, "agreement": None}
    observed = float(np.mean(x == y))
    pa, pb = float(x.mean()), float(y.mean())
    expected = pa * pb + (1 - pa) * (1 - pb)
    kappa = None if expected == 1 else (observed - expected) / (1 - expected)
    return {"n": n, "agreement": observed, "discordance": 1 - observed, "kappa": kappa,
            "a_only": int(np.sum(x & ~y)), "b_only": int(np.sum(~x & y)),
            "note": "kappa undefined: both runs give one outcome throughout" if kappa is None else None}
