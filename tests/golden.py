"""The golden reference runs: one per renderer that draws the reference frame its own way.

llvmpipe's pixels depend on the Mesa build and on the CPU it runs on, and the reference policy reads
pixels, so a golden run can only be reproduced where its reference frame is drawn bit for bit the
same. ``data/golden/renderers.json`` lists, per reference frame hash, the digest recorded there with
the code from before the fast path (``diff-runs RUN RUN --save``).

``python tests/golden.py`` prints the digest for this machine's renderer (``make golden`` compares
its run with it, every field but ``NOT_COMPARED``), or exits 1 naming the frame this renderer draws and the ones on record.
"""

import hashlib
import json
import sys
from pathlib import Path
from typing import Optional, Tuple

GOLDEN_DIR = Path(__file__).resolve().parent / "data" / "golden"
# The protocol's hash covers every frozen file, the optional factors added after the golden runs included;
# what the 13 conditions apply (parameters, draws, read-backs) is in each record's own fields, compared.
NOT_COMPARED = ("spec_hash",)


def reference_frame_sha256() -> str:
    """The full scene of Lift's first formal episode, third-person camera, 128 px, fast profile without culling, as
    this machine's renderer draws it: the reference policy reads such frames, so other pixels change records."""
    from robocasa_shift.backends import get_backend
    from robocasa_shift.core.records import RolloutKey
    from robocasa_shift.core.specs import load_protocol
    from robocasa_shift.engine.rollout import prepare_episode

    env = get_backend("robosuite").make("Lift", stock_simulator=True)  # every geom drawn, as before culling
    try:
        prepare_episode(env, load_protocol(), RolloutKey("formal", "Lift", 0, "clean"))
        return hashlib.sha256(env.render(env.third_person_cameras[0], 128).tobytes()).hexdigest()
    finally:
        env.close()


def golden_digest() -> Tuple[Optional[Path], str]:
    """(the digest recorded on this renderer or None, why: which renderer it was, or what is on record)."""
    drawn = reference_frame_sha256()
    references = json.loads((GOLDEN_DIR / "renderers.json").read_text())["references"]
    for ref in references:
        if ref["frame_sha256"] == drawn:
            return GOLDEN_DIR / ref["digest"], ref["renderer"]
    known = "; ".join(f"{r['frame_sha256'][:16]} ({r['renderer']})" for r in references)
    return None, (f"this renderer draws the reference frame as {drawn[:16]}; golden runs are on record for {known}. "
                  "To add one, see docs/performance.md (the golden reference run)")


if __name__ == "__main__":
    digest, why = golden_digest()
    if digest is None:
        sys.exit(why)
    print(digest)
