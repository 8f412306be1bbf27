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
import time

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


@functools.cache
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


@functools.cache
def startup_blas_threads() -> int | None:
    """OpenBLAS's thread count before onnxhal first set it (the CPU EP calls this first): the
    default a session with ``intra_op_num_threads`` 0 asks for."""
    return get_blas_threads()


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count (process-wide); False when OpenBLAS is not in use."""
    if n < 1:
        from onnxhal.hal.errors import InvalidArgument

        raise InvalidArgument(f"BLAS thread count must be >= 1, got {n}")
    fn = _symbol(_SETTERS)
    if fn is None:
        return False
    startup_blas_threads()  # recorded before the first change
    # OpenBLAS's setter takes its lock and walks its thread table even for the count it has
    # (4-8 us, each session's creation sets it): read first (0.3 us), set only a change
    if get_blas_threads() != int(n):
        fn(ctypes.c_int(int(n)))
    return True


#: (when, machine's runnable count, this process's own): the last reading, shared by the sessions
#: of the process (reading /proc at each session's first run costs more with a few thread pools)
_last_reading: tuple[float, int | None, int | None] = (-1.0, None, None)


def _machine_reading(now: float, own_runnable, runnable) -> tuple[int | None, int | None]:
    """The machine's runnable count and this process's own, read again when the last reading, of
    any session, is 50 ms old."""
    global _last_reading
    when, count, own = _last_reading
    if 0 <= now - when < 0.05:
        return count, own
    machine = runnable()
    if machine is not None and machine <= 1:
        # The machine's one runnable thread is the one reading: no other load, whatever this
        # process's other threads do (``threads_now``'s others come out 0 for any own count of at
        # least 1). A quiet machine's reading is then one small file, not every thread's stat
        # twice (150-230 us of CPU with 6-8 threads, most of a small model's first run).
        _last_reading = (now, machine, 1)
        return machine, 1
    # Own threads read before and after the machine's count: one that went to sleep or woke in
    # between is still counted as this process's, not as another's.
    before = own_runnable()
    count = runnable()
    after = own_runnable()
    own = max(before, after) if before is not None and after is not None else None
    _last_reading = (now, count, own)
    return count, own


@functools.cache
def _cpu_count() -> int:
    """The machine's logical CPUs, read once a process (each session's EP asks; a read is a sysfs
    file)."""
    import os

    return os.cpu_count() or 1


def _running(stat: bytes) -> bool:
    """Whether a /proc task stat line says the thread is runnable (R). The command name, in
    parentheses, may hold spaces and parentheses: the state follows the last ")"."""
    end = stat.rfind(b")")
    return end >= 0 and stat[end + 2:end + 3] == b"R"


class LoadAwareBlasThreads:
    """BLAS threads for each run: the session's count where that many cores are idle, fewer where
    other processes hold them.

    OpenBLAS splits a product into equal parts, one per thread, and waits for all of them. On a
    machine whose cores are busy with other processes (a shared CI runner, ``pytest -n auto``) a
    part whose thread is descheduled waits a scheduler slice (milliseconds) for its core, at every
    product: medium BERT with 2 BLAS threads took 705 ms a run against 11 ms with one while the
    2-core machine was loaded (onnxruntime 7 ms; its pool lets the calling thread take the parts
    no worker has started). So before each run the runnable count of the machine
    (``/proc/loadavg``) says how many cores others hold, and the count is held down for a second
    after a peak (loads come and go faster than a run); this process's own runnable threads (the
    caller, BLAS's, which spin briefly after each product, and any other library's pool in the
    process, such as onnxruntime's or an OpenCL driver's) are counted from ``/proc/self/task`` and
    are not others: a process that alternates onnxhal and onnxruntime runs would otherwise see
    onnxruntime's finishing workers as a competing load and halve its own BLAS threads. Read at
    most every 50 ms; one read costs about 10 us plus about 3 us per thread of the process."""

    def __init__(self, requested: int, cores: int | None = None) -> None:
        self.requested = max(1, int(requested))
        self.cores = cores or _cpu_count()
        self._checked = -1.0
        self._applied = -1.0
        self._others = 0.0
        self._others_at = -1.0
        self.current = self.requested

    @staticmethod
    def _runnable() -> int | None:
        """The machine's runnable threads (/proc/loadavg's fourth field, before the "/")."""
        import os

        try:
            fd = os.open("/proc/loadavg", os.O_RDONLY)
            try:
                line = os.read(fd, 256)
            finally:
                os.close(fd)
            return int(line.split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):  # not Linux: keep the requested count
            return None

    @staticmethod
    def _own_runnable() -> int | None:
        """Runnable threads of this process (state R in /proc/self/task/*/stat). Each file is read
        by ``os.open``/``os.read``: the kernel's formatting of a thread's stat is most of a read,
        and Python's buffered ``open`` added about half as much again (6 threads: 85 -> 57 us of
        CPU a pass on the 2-core development machine, load 5; a reading makes two passes)."""
        import os

        try:
            tids = os.listdir("/proc/self/task")
        except OSError:
            return None
        count = 0
        for tid in tids:
            try:
                fd = os.open(f"/proc/self/task/{tid}/stat", os.O_RDONLY)
            except OSError:  # the thread ended meanwhile
                continue
            try:
                stat = os.read(fd, 512)  # the state is within the first 20 bytes after the name
            except OSError:
                continue
            finally:
                os.close(fd)
            if _running(stat):
                count += 1
        return count

    def threads_now(self, now: float | None = None, runnable: int | None = None, own: int | None = None) -> int:
        """The BLAS thread count for a run starting now (``now``/``runnable``/``own`` for tests; an
        injected ``runnable`` without ``own`` counts the session's own threads as its request)."""
        now = time.monotonic() if now is None else now
        if self.requested == 1 or now - self._checked < 0.05:
            return self.current
        self._checked = now
        if runnable is None:
            runnable, own = _machine_reading(now, self._own_runnable, self._runnable) if own is None else \
                (self._runnable(), own)
        if runnable is None:
            return self.current
        others = max(0, runnable - (self.requested if own is None else max(1, own)))
        if others >= self._others or now - self._others_at > 1.0:
            self._others, self._others_at = others, now
        idle = self.cores - self._others
        self.current = self.requested if idle >= self.requested else max(1, idle)
        return self.current

    def apply(self) -> None:
        """Set BLAS's threads for the run about to start (process-wide, as the pool is). At most
        every 50 ms, as the load is read: the check reads BLAS's count too (another session of the
        process may have set its own), and costs 0.8 us, a sixth of a one-node model's run."""
        now = time.monotonic()
        if now - self._applied < 0.05:
            return
        self._applied = now
        before = self.current
        n = self.threads_now(now)
        if n != before or n != get_blas_threads():
            set_blas_threads(n)
