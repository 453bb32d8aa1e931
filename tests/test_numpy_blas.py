"""Compiled code calling numpy's own BLAS gives np.dot's bits, for every layout numpy meets."""

import numpy as np
import pytest

pytest.importorskip("numba")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from robocasa_shift.backends import numpy_blas  # noqa: E402

# Where numpy_blas was verified: Linux, numpy's own pip wheel (its OpenBLAS in numpy.libs), the pinned numpy.
# There it must work; elsewhere (another OS, a conda or distribution numpy) it says why not and the fast path
# keeps numpy's code, so these tests skip with that reason instead of failing.
VERIFIED_HERE = (sys.platform == "linux" and np.__version__ == numpy_blas.VERIFIED_NUMPY
                 and (Path(np.__file__).resolve().parent.parent / "numpy.libs").is_dir())
if not VERIFIED_HERE:
    pytest.skip(f"numpy's own BLAS is not callable here: {numpy_blas.problem() or 'not a Linux pip wheel of numpy'}",
                allow_module_level=True)


def layouts(rng, rows, cols):
    """The same matrix as numpy may hold it: C and Fortran order, a strided view, a view with negative strides."""
    scale = 10.0 ** rng.integers(-4, 5, (rows, cols))  # mixed magnitudes: the order of the sums shows in the bits
    values = rng.normal(size=(rows, cols)) * scale
    return [values, np.asfortranarray(values), np.repeat(values, 2, axis=1)[:, ::2],
            np.ascontiguousarray(values[::-1])[::-1]]


def naive(a, x):
    """Left-to-right sums, as a hand-written loop would do them."""
    out = np.zeros(a.shape[0])
    for i in range(a.shape[0]):
        for k in range(a.shape[1]):
            out[i] += a[i, k] * x[k]
    return out


def test_numpys_blas_is_found_where_it_was_verified():
    assert numpy_blas.problem() is None, numpy_blas.problem()
    assert "numpy.libs/libopenblas" in numpy_blas.LIBRARY


def test_matrix_vector_and_matrix_products_equal_np_dot_byte_for_byte():
    rng = np.random.default_rng(0)
    naive_differs = 0
    for _ in range(150):
        rows, cols, more = (int(v) for v in rng.integers(2, 15, 3))
        vector = rng.normal(size=cols) * 10.0 ** rng.integers(-4, 5, cols)
        for x in (vector, np.repeat(vector, 3)[::3], np.ascontiguousarray(vector[::-1])[::-1]):
            for a in layouts(rng, rows, cols):
                assert numpy_blas.dot_mv(a, x).tobytes() == np.dot(a, x).tobytes()
                naive_differs += naive(a, x).tobytes() != np.dot(a, x).tobytes()
        for a in layouts(rng, rows, cols):
            for b in layouts(rng, cols, more)[:2]:
                assert numpy_blas.dot_mm(a, b).tobytes() == np.dot(a, b).tobytes()
    one, scalar = np.array([[3.1]]), np.array([-0.7])
    assert numpy_blas.dot_mv(one, scalar).tobytes() == np.dot(one, scalar).tobytes()
    assert naive_differs > 100  # the sums' order is visible in these bits: agreement is not a matter of course


def test_products_numpy_would_compute_with_other_routines_are_refused():
    row, square = np.ones((1, 4)), np.ones((3, 3))
    with pytest.raises(ValueError, match="row or column"):
        numpy_blas.dot_mv(row, np.ones(4))
    with pytest.raises(ValueError, match="syrk"):
        numpy_blas.dot_mm(square, square.T)  # numpy computes a matrix times its own transpose with syrk
    with pytest.raises(ValueError, match="not aligned"):
        numpy_blas.dot_mv(square, np.ones(4))


def test_another_numpy_is_not_called_into(monkeypatch):
    monkeypatch.setattr(np, "__version__", "2.0.0")
    path, why = numpy_blas._find_library()
    assert path is None and numpy_blas.VERIFIED_NUMPY in why and "2.0.0" in why


def test_the_compiled_calls_leave_numba_s_own_lapack_working_when_imported_first():
    """numpy's BLAS and MuJoCo's functions reach compiled code by name only: a process that imports them before
    numba's ``np.linalg`` first loads scipy's LAPACK still gets a single-precision eigendecomposition (robosuite
    1.4's ``mat2quat``), where loading the libraries whole into llvmlite made it abort ("Insufficient memory for buffer
    allocation required by LAPACK")."""
    import subprocess

    script = ("import numpy as np\n"
              "from robocasa_shift.backends import mujoco_calls, numpy_blas\n"
              "assert numpy_blas.problem() is None, numpy_blas.problem()\n"
              "import numba\n"
              "eigh = numba.njit(lambda a: np.linalg.eigh(a)[0])\n"
              "print(eigh(np.diag(np.array([1.0, 2.0, 3.0], dtype=np.float32))).tolist())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0 and done.stdout.strip() == "[1.0, 2.0, 3.0]", done.stderr[-2000:]
