"""The golden reference runs: one per renderer that draws the reference frame its own way.

llvmpipe's pixels depend on the Mesa build and on the CPU it runs on, and the reference policy reads
pixels, so a golden run can only be reproduced where its reference frame is drawn bit for bit the
same, on a CPU with the same vector instructions. ``data/golden/renderers.json`` lists, per reference
frame hash and vector instruction set, the digest recorded there with
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


def simd() -> str:
    """The widest vector instructions this CPU offers (``AVX512``, ``AVX2``, ``baseline``): numpy's SIMD loops (its
    trigonometry) and torch's kernels dispatch on them, so records differ in the last digits between CPUs that draw
    the reference frame alike (an AVX-512 and an AVX2 EPYC)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy 1
        from numpy.core._multiarray_umath import __cpu_features__ as features
    return "AVX512" if features.get("AVX512F") else "AVX2" if features.get("AVX2") else "baseline"


def golden_digest() -> Tuple[Optional[Path], str]:
    """(the digest recorded on this renderer and this CPU's vector instructions, or None; why: which it was, or what
    is on record)."""
    drawn, kernels = reference_frame_sha256(), simd()
    references = json.loads((GOLDEN_DIR / "renderers.json").read_text())["references"]
    for ref in references:
        if ref["frame_sha256"] == drawn and ref["simd"] == kernels:
            return GOLDEN_DIR / ref["digest"], ref["renderer"]
    known = "; ".join(f"{r['frame_sha256'][:16]} on {r['simd']} ({r['renderer']})" for r in references)
    return None, (f"this renderer draws the reference frame as {drawn[:16]} on a CPU with {kernels}; "
                  f"golden runs are on record for {known}. To add one, see docs/performance.md (the golden reference run)")


# The other backends' golden runs: the scripted expert, which reads simulator state and no pixels, so a run depends on
# the simulator and on numpy's BLAS kernels (robosuite's controllers multiply with them; OpenBLAS picks its kernels
# for the CPU), not on the renderer. index.json names, per backend, the run's arguments, its digest and the BLAS
# kernels it was recorded with.
BACKENDS_DIR = GOLDEN_DIR / "backends"


def blas_architecture() -> str:
    """The kernels numpy's OpenBLAS chose on this CPU (``Zen``, ``SkylakeX``, ...).

    numpy's own library, named by its path: SciPy loads another OpenBLAS whose kernel names differ, and which of the
    two is listed first depends on what was imported before (a golden test was skipped or not by import order)."""
    import numpy  # noqa: F401  (loads the BLAS library whose kernels are asked for)
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
    found = [f"{i['internal_api']} {i.get('architecture')}" for i in
             sorted(blas, key=lambda i: not Path(i["filepath"]).parent.name.startswith("numpy"))]  # numpy.libs first
    return found[0] if found else "no BLAS"


def backend_golden(backend: str) -> Tuple[Optional[Path], dict, str]:
    """(the digest of ``backend``'s golden run or None, its index entry, why None)."""
    entry = json.loads((BACKENDS_DIR / "index.json").read_text()).get(backend)
    if entry is None:
        return None, {}, f"no golden run of {backend} on record"
    here = blas_architecture()
    if here != entry["blas"]:
        return None, entry, (f"the {backend} golden run was recorded with {entry['blas']}'s kernels, this machine's numpy "
                             f"uses {here}'s: record one here (docs/performance.md, the golden runs)")
    return BACKENDS_DIR / entry["digest"], entry, ""


def assert_reproduced(digest: Path, run_dir: Path, count: int) -> None:
    """Each of the ``count`` records of ``run_dir`` equals the golden run's record of its key, field for field."""
    from robocasa_shift.checks.reproduction import run_digest

    golden, fresh = run_digest(digest), run_digest(run_dir)
    assert len(fresh) == count and set(fresh) <= set(golden), sorted(fresh)
    for key, rec in fresh.items():
        assert set(rec) == set(golden[key]), key
        assert {k: v for k, v in rec.items() if k not in NOT_COMPARED} == \
            {k: v for k, v in golden[key].items() if k not in NOT_COMPARED}, key


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] in ("--backend", "--run-args"):
        digest, entry, why = backend_golden(sys.argv[2])
        if sys.argv[1] == "--run-args":
            print(" ".join(entry["run_args"]))
            sys.exit(0)
    else:
        digest, why = golden_digest()
    if digest is None:
        sys.exit(why)
    print(digest)
