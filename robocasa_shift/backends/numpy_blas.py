"""``np.dot`` for compiled code: numba calling the very BLAS routines numpy calls, chosen the way numpy chooses them.

A dot product's last bits depend on the order of its sums, and that order is the BLAS kernel's. numba's own
``np.dot`` calls scipy's BLAS, a separate OpenBLAS build with its own kernels, so a compiled copy of numpy code
that uses it can differ from numpy in the last bit. The functions here call numpy's own OpenBLAS (the library
numpy's multiarray module loaded, found in this process's memory map) through its exported CBLAS symbols (each
handed to llvmlite by its address), with
the routine (gemv, gemm or a scalar product), order, transposition and leading dimensions numpy 1.26's
``cblas_matrixproduct`` (numpy/core/src/common/cblasfuncs.c) picks for the same arrays, a zeroed output and
alpha 1, beta 0, as numpy passes them: the same call with the same arguments, so the same bits.

Verified on numpy 1.26.4's wheels (OpenBLAS 0.3.23, 64-bit integers, symbols suffixed ``64_``); anything else
leaves :func:`problem` saying why, and callers keep their numpy code.
"""

from __future__ import annotations

import ctypes
from typing import Optional

import numpy as np

VERIFIED_NUMPY = "1.26.4"
_SYMBOLS = ("cblas_dgemv64_", "cblas_dgemm64_")


def _find_library() -> tuple:
    """(path of the OpenBLAS numpy loaded, None) or (None, why not)."""
    if np.__version__ != VERIFIED_NUMPY:
        return None, f"verified with numpy {VERIFIED_NUMPY}, not {np.__version__}"
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "numpy.libs/libopenblas" in line}
    except OSError as error:
        return None, f"no memory map to find numpy's BLAS in ({error})"
    if len(paths) != 1:
        return None, f"numpy's OpenBLAS not found in numpy.libs (found {sorted(paths)})"
    path = paths.pop()
    library = ctypes.CDLL(path)  # the loaded library again: the same handle numpy's symbols resolved to
    missing = [name for name in _SYMBOLS if not hasattr(library, name)]
    if missing:
        return None, f"{path} lacks {missing}"
    why = add_symbols(library, _SYMBOLS)
    return (None, why) if why else (path, None)


def add_symbols(library: ctypes.CDLL, names) -> Optional[str]:
    """Make ``names`` of an already loaded ``library`` resolve in numba-compiled code, each by its address; None, or
    why not. Only these names: loading the library into llvmlite (``load_library_permanently``) would reopen it with
    its every symbol global, and a shared library loaded afterwards (scipy's LAPACK, which numba's ``np.linalg``
    calls) could then bind to numpy's 64-bit-integer OpenBLAS and fail."""
    try:
        import llvmlite.binding

        for name in names:
            llvmlite.binding.add_symbol(name, ctypes.cast(getattr(library, name), ctypes.c_void_p).value)
    except Exception as exc:  # a broken llvmlite: the callers keep their numpy code
        return f"llvmlite cannot take the symbols of {library._name} ({type(exc).__name__}: {exc})"
    return None


LIBRARY, _PROBLEM = _find_library()


def problem() -> Optional[str]:
    """Why the functions below cannot be used in this process, or None when they can."""
    return _PROBLEM


# ---------------------------------------------------------------------------------------------- compiled side
import numba  # noqa: E402
from numba import types  # noqa: E402

# Arrays are passed as their data addresses: an address and a pointer travel in the same register on the
# x86-64 and aarch64 calling conventions.
_I, _P, _D, _E = types.int64, types.intp, types.float64, types.int32
_dgemv = types.ExternalFunction("cblas_dgemv64_", types.void(_E, _E, _I, _I, _D, _P, _I, _P, _I, _D, _P, _I))
_dgemm = types.ExternalFunction("cblas_dgemm64_", types.void(_E, _E, _E, _I, _I, _I, _D, _P, _I, _P, _I, _D, _P, _I))
_ROW_MAJOR, _COL_MAJOR, _NO_TRANS, _TRANS = 101, 102, 111, 112
_ITEM = 8  # bytes of a float64


@numba.njit(cache=True)
def _c_contiguous(a) -> bool:
    return a.strides[1] == _ITEM and a.strides[0] == _ITEM * a.shape[1]


@numba.njit(cache=True)
def _f_contiguous(a) -> bool:
    return a.strides[0] == _ITEM and a.strides[1] == _ITEM * a.shape[0]


@numba.njit(cache=True)
def _blasable(a) -> bool:
    """numpy's ``_bad_strides`` negated: item-aligned data, no negative, odd or (over a real axis) zero strides."""
    if a.ctypes.data % _ITEM != 0:
        return False
    for axis in range(a.ndim):
        stride = a.strides[axis]
        if stride < 0 or stride % _ITEM != 0 or (stride == 0 and a.shape[axis] > 1):
            return False
    return True


@numba.njit(cache=True)
def _one_segment(a):
    """The matrix numpy hands to BLAS: a copy (kept in Fortran order if it was) when its strides are bad, then a C
    copy when it is neither C- nor Fortran-contiguous."""
    if not _blasable(a):
        a = a.T.copy().T if _f_contiguous(a) else a.copy()
    if not (_c_contiguous(a) or _f_contiguous(a)):
        a = a.copy()
    return a


@numba.njit(cache=True)
def dot_mv(a, x):
    """``np.dot(a, x)`` for a float64 matrix ``a`` and vector ``x``: gemv on a matrix, the product on 1 x 1."""
    m, n = a.shape
    if x.shape[0] != n:
        raise ValueError("dot_mv: shapes not aligned")
    if not _blasable(x):
        x = x.copy()
    out = np.zeros(m)
    if m == 1 and n == 1:  # numpy's scalar case: one multiplication (scalar first)
        out[0] = x[0] * a[0, 0]
        return out
    if m == 1 or n == 1:  # a row or a column: numpy takes other routines (dot, axpy) that are not mirrored
        raise ValueError("dot_mv: a row or column matrix is not mirrored")
    a = _one_segment(a)
    incx = x.strides[0] // _ITEM
    if _c_contiguous(a):
        _dgemv(_ROW_MAJOR, _NO_TRANS, m, n, 1.0, a.ctypes.data, n, x.ctypes.data, incx, 0.0, out.ctypes.data, 1)
    else:
        _dgemv(_COL_MAJOR, _NO_TRANS, m, n, 1.0, a.ctypes.data, m, x.ctypes.data, incx, 0.0, out.ctypes.data, 1)
    return out


@numba.njit(cache=True)
def dot_mm(a, b):
    """``np.dot(a, b)`` for float64 matrices with every dimension above 1: gemm, transposing what is Fortran-ordered."""
    rows, inner = a.shape
    if b.shape[0] != inner:
        raise ValueError("dot_mm: shapes not aligned")
    cols = b.shape[1]
    if rows < 2 or inner < 2 or cols < 2:
        raise ValueError("dot_mm: a row or column matrix is not mirrored")
    a, b = _one_segment(a), _one_segment(b)
    trans_a, lda = _NO_TRANS, inner
    if _f_contiguous(a):
        trans_a, lda = _TRANS, rows
    trans_b, ldb = _NO_TRANS, cols
    if _f_contiguous(b):
        trans_b, ldb = _TRANS, inner
    if (a.ctypes.data == b.ctypes.data and rows == cols and a.strides[0] == b.strides[1]
            and a.strides[1] == b.strides[0] and trans_a != trans_b):
        raise ValueError("dot_mm: a matrix times its own transpose (numpy's syrk) is not mirrored")
    out = np.zeros((rows, cols))
    _dgemm(_ROW_MAJOR, trans_a, trans_b, rows, cols, inner, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb, 0.0,
           out.ctypes.data, cols)
    return out
