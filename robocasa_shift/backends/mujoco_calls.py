"""MuJoCo's C functions for compiled code: the very library the ``mujoco`` bindings loaded.

A compiled loop over physics substeps (``robosuite_kernels.middle_substeps``) calls ``mj_step1``, ``mj_step2``,
``mj_fullM``, ``mj_jacSite`` and ``mj_getState`` on the model's and data's own addresses (``MjModel._address``), so the code that
runs is the code the bindings run, on the same memory. Each function's address is handed to llvmlite under its name,
as :mod:`numpy_blas` hands numpy's BLAS, so compiled code that calls them is cached on disk like any other. Only the MuJoCo versions whose C signatures these declarations were checked against
are accepted: ``mj_fullM``'s arguments changed within 3.x (each compiled loop asks :func:`problem` for the form it was written for); any other leaves :func:`problem` saying why,
and the substeps then run one by one from Python.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

from numba import types

from robocasa_shift.backends.numpy_blas import add_symbols

# mj_fullM's arguments after the model in each verified MuJoCo (robosuite 1.5's and LIBERO's environments); the others
# are the same in both: mj_step1(m, d), mj_step2(m, d), mj_jacSite(m, d, jacp, jacr, site), mj_getState(m, d, state, sig)
VERIFIED_MUJOCO = {"3.9.0": "dst, M", "3.17.0": "d, dst"}
_FUNCTIONS = ("mj_step1", "mj_step2", "mj_fullM", "mj_jacSite", "mj_getState")


def _find_library() -> Optional[str]:
    """None when MuJoCo's library is loaded into llvmlite's symbols, or why not."""
    try:
        import mujoco
    except ImportError as exc:
        return f"mujoco cannot be imported ({exc})"
    if mujoco.__version__ not in VERIFIED_MUJOCO:
        return f"MuJoCo's C calls declared for {', '.join(VERIFIED_MUJOCO)}, not {mujoco.__version__}"
    path = os.path.realpath(os.path.join(os.path.dirname(mujoco.__file__), f"libmujoco.so.{mujoco.__version__}"))
    try:
        with open("/proc/self/maps") as maps:  # the library the bindings loaded, not another copy
            loaded = {os.path.realpath(line.split()[-1]) for line in maps if "libmujoco.so" in line}
        if loaded != {path}:
            return f"the mujoco bindings loaded {sorted(loaded) or 'no libmujoco'}, not {path}"
        library = ctypes.CDLL(path)  # the same handle: dlopen returns the loaded library
    except Exception as exc:  # no memory map: the substeps stay in Python
        return f"MuJoCo's library cannot be called from compiled code ({type(exc).__name__}: {exc})"
    return add_symbols(library, _FUNCTIONS)


_PROBLEM = _find_library()


def problem(full_m: str) -> Optional[str]:
    """Why a compiled loop written for ``mj_fullM``'s ``full_m`` form ("dst, M" or "d, dst") cannot call the functions
    below in this process, or None when it can."""
    if _PROBLEM is not None:
        return _PROBLEM
    import mujoco

    if VERIFIED_MUJOCO[mujoco.__version__] != full_m:
        return f"mj_fullM is called as (m, {VERIFIED_MUJOCO[mujoco.__version__]}) in MuJoCo {mujoco.__version__}"
    return None


# pointers as integers: an address and a pointer travel in the same register on x86-64 and aarch64
_P = types.intp
mj_step1 = types.ExternalFunction("mj_step1", types.void(_P, _P))
mj_step2 = types.ExternalFunction("mj_step2", types.void(_P, _P))
mj_fullM = types.ExternalFunction("mj_fullM", types.void(_P, _P, _P))  # either form: three pointers
mj_jacSite = types.ExternalFunction("mj_jacSite", types.void(_P, _P, _P, _P, types.int32))
mj_getState = types.ExternalFunction("mj_getState", types.void(_P, _P, _P, types.int32))
