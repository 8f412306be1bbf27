"""The CPU kernels' worker pool: work split between ``WORKERS`` threads of one shared pool (numpy
releases the GIL in BLAS calls and ufuncs), each block getting its epilogue (bias, residual,
activation) while in cache. Waking a pool thread costs 0.1-0.2 ms on a small VM, so only work above
``PARALLEL_MIN_WORK`` is split, and products are split only when numpy's BLAS runs on one thread
(``SPLIT_PRODUCTS``); otherwise BLAS's own threads, which spin between calls and take work in C,
parallelize them. ``ONNXHAL_FUSED_THREADS`` sets the pool size; unset, it is up to 4 when BLAS
was pinned to one thread (``OPENBLAS_NUM_THREADS=1``), else 1. The CPU EP resizes both from
``intra_op_num_threads`` (``set_workers``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

#: Work (multiply-adds or elements) below which splitting costs more than it saves: waking a pool
#: thread takes a fraction of a millisecond on a VM, so a part must run for about a millisecond.
PARALLEL_MIN_WORK = 1 << 21


def _default_workers() -> int:
    """Threads for the fused kernels: ``ONNXHAL_FUSED_THREADS``, else up to 4 when BLAS is pinned
    to one thread, else 1 (BLAS parallelizes)."""
    if os.environ.get("ONNXHAL_FUSED_THREADS"):
        return max(1, int(os.environ["ONNXHAL_FUSED_THREADS"]))
    if os.environ.get("OPENBLAS_NUM_THREADS") == "1" or os.environ.get("OMP_NUM_THREADS") == "1":
        return max(1, min(4, os.cpu_count() or 1))
    return 1


WORKERS = _default_workers()
#: Whether the products (FusedConv/Gemm/MatMul) are split between ``WORKERS`` here. Only when
#: numpy's BLAS runs on one thread: BLAS's own threads hand work over in C while spinning, where a
#: Python pool thread must be woken by the kernel, a hand-off that costs a sizeable share of a
#: whole ResNet 3x3 convolution on a VM.
SPLIT_PRODUCTS = WORKERS > 1
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def get_pool() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="onnxhal-fused")
    return _pool


def set_workers(n: int, split_products: bool) -> None:
    """Resize the fused kernels' pool (the CPU EP maps ``intra_op_num_threads`` here) and say
    whether products are split over it (see ``SPLIT_PRODUCTS``). Work already submitted to the
    old pool finishes there."""
    global WORKERS, SPLIT_PRODUCTS, _pool
    with _pool_lock:
        n = max(1, int(n))
        SPLIT_PRODUCTS = split_products and n > 1
        if n == WORKERS:
            return
        old, _pool, WORKERS = _pool, None, n
    if old is not None:
        old.shutdown(wait=False)


def parallel_ranges(total: int, fn: Callable[[int, int], None], work: int) -> None:
    """Call ``fn(start, stop)`` over ``[0, total)`` split in ``WORKERS`` parts, or inline when
    ``work`` is below ``PARALLEL_MIN_WORK``, there is one worker, or BLAS threads itself
    (``SPLIT_PRODUCTS`` false). Its callers are BLAS products and the Gelu epilogue that follows
    one: while BLAS threads itself, its threads take the products in C, and its idle threads spin
    on the other cores for about 2 ms after each, so a pool thread would share a core with one (the
    encoder's 128x3072 Gelu, alternating in the model: 1.49 ms inline against 1.69 split, and 1.33
    against 2.52 with BLAS threads that stop spinning sooner, timeout 4). The caller's thread takes
    the last part."""
    parts = min(WORKERS, total)
    if (parts <= 1 or work < PARALLEL_MIN_WORK or not SPLIT_PRODUCTS
            or threading.current_thread().name.startswith("onnxhal-fused")):
        fn(0, total)
        return
    bounds = [total * i // parts for i in range(parts + 1)]
    futures = [get_pool().submit(fn, bounds[i], bounds[i + 1]) for i in range(parts - 1)]
    fn(bounds[-2], bounds[-1])
    for f in futures:
        f.result()
