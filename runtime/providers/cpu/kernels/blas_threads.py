"""Control of the BLAS thread pool numpy's matmul uses (Conv, Gemm, MatMul kernels).

OpenBLAS's worker threads busy-wait; on a machine whose cores are shared (CI, 2 cores and other
processes) a small-model run with its default pool can be several times slower than with one
thread. The session maps ``intra_op_num_threads`` here, as ORT sizes its own pool from it. The
setting is process-wide (it is OpenBLAS's); ``None`` means the library is not OpenBLAS or was
not found, and nothing is changed.
"""

from __future__ import annotations

import ctypes
import functools

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")


@functools.cache
def _openblas() -> ctypes.CDLL | None:
    """The OpenBLAS shared library numpy loaded (found in this process's memory map)."""
    import numpy  # noqa: F401 - make sure numpy (and its BLAS) is loaded first

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:  # not Linux
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if any(hasattr(lib, name) for name in _SETTERS):
            return lib
    return None


def _symbol(names: tuple[str, ...]):
    lib = _openblas()
    if lib is None:
        return None
    for name in names:
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def get_blas_threads() -> int | None:
    """Current OpenBLAS thread count, or None when OpenBLAS is not in use."""
    fn = _symbol(_GETTERS)
    return int(fn()) if fn is not None else None


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count (process-wide); False when OpenBLAS is not in use."""
    if n < 1:
        from onnxhal.hal.errors import InvalidArgument

        raise InvalidArgument(f"BLAS thread count must be >= 1, got {n}")
    fn = _symbol(_SETTERS)
    if fn is None:
        return False
    fn(ctypes.c_int(int(n)))
    return True
