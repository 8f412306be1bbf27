"""OpenCL contexts and the program cache of the OpenCL EP.

One ``OpenCLDeviceContext`` (a ``cl.Context`` and an in-order ``cl.CommandQueue``) exists per
OpenCL device per process, shared by every session, allocator and stream on that device. Programs
are built once per (source, build options), a large source only in the part a launched kernel needs
(``program_slices``), and kept in a dict for the process. Across processes: PoCL keeps its own build
cache (``driver_caches_builds``); on other drivers onnxhal stores device binaries on disk under
``$ONNXHAL_CACHE_DIR`` (default ``~/.cache/onnxhal/opencl``), keyed by platform, device name, driver
version and a hash of source + options, so a second process loads the binary instead of compiling.

A build failure raises ``ProgramBuildError``; the EP's ``get_capability`` turns it into "decline those
nodes" (and says so); anywhere else it is an error like any other. A failure is remembered for the
process, per (source, options), and raised again without calling the compiler.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from onnxhal.devices.opencl_env import cache_root, prepare_opencl_environment
from onnxhal.hal.errors import EPFail
from onnxhal.runtime.providers.opencl.program_slices import kernel_slice

# PoCL compiles a kernel again for every new local size at first launch and keeps those
# objects in POCL_CACHE_DIR, which it reads once: set before pyopencl is first used (a no-op when
# onnxhal/__init__ did it already; a user's own setting wins).
prepare_opencl_environment()

import pyopencl as cl  # noqa: E402  (after the environment, on purpose)

#: Options every program is built with: contract a*b+c into FMA instructions (fma() itself is a slow
#: library call on PoCL) and let the compiler reassociate and relax precision, as ORT's GPU EPs do.
#: Not -cl-fast-relaxed-math: its -cl-finite-math-only lets the compiler drop the `v != v` tests
#: that keep NaN flowing through max, min, Relu and Clip (kernel_sources.ACTIVATION_HELPERS).
DEFAULT_BUILD_OPTIONS = "-cl-mad-enable -cl-unsafe-math-optimizations"

#: Kernels call ``ONNXHAL_EXP``: ``native_exp`` where the device's is accurate (PoCL: ~1e-7 relative,
#: and its ``exp()`` is a slow call), else ``exp`` (Intel's CPU runtime: native_exp errs by ~2e-4,
#: which shows in Sigmoid, Tanh and GELU). Each device context measures which, once.
EXP_SOURCE = r"""
__kernel void onnxhal_exp_check(__global const float* x, __global float* y) {
    int i = get_global_id(0);
    y[i] = native_exp(x[i]);
}
"""
NATIVE_EXP_RTOL = 2e-6
#: Idle kernel objects kept per (program, kernel name) for reuse.
MAX_IDLE_KERNELS = 64


class ProgramBuildError(EPFail):
    """An OpenCL program failed to build; ``log`` holds the compiler output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


@dataclass
class BuildStats:
    """How programs were obtained in this process (tests and benchmarks read it)."""

    compiled: int = 0
    loaded_from_disk: int = 0
    memory_hits: int = 0
    compile_seconds: float = 0.0
    load_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # digests, each once: a failed build is not retried
    failure_hits: int = 0  # requests answered with a remembered build failure
    kernels_created: int = 0
    kernels_reused: int = 0  # kernel objects a released partition state gave back, taken again


@dataclass(frozen=True)
class LaunchCosts:
    """What the host waits for one launch (enqueue + finish of a one-work-item kernel) and for one
    small copy (a blocking 16-byte write), on one device: the fastest of several, measured once per
    process."""

    launch_s: float
    copy_s: float


class OpenCLDeviceContext:
    """The process-wide context and in-order queue of one OpenCL device, with its program cache."""

    def __init__(self, device: cl.Device) -> None:
        self.device = device
        self.context = cl.Context([device])
        self.queue = cl.CommandQueue(self.context, device)
        self._programs: dict[str, cl.Program] = {}
        self._digests: dict[tuple[str, str], str] = {}  # (options, source) -> its digest
        # A build that failed fails again (same source, options and device): remembered, so that each
        # session creation does not pay the compiler again for the partitions it will decline.
        self._failed: dict[str, ProgramBuildError] = {}
        self._lock = threading.Lock()
        self.stats = BuildStats()
        platform = device.platform
        self.device_key = "|".join((platform.name, platform.version, device.name, device.driver_version,
                                    device.version))
        self._exp_option: str | None = None
        # OpenCL lets `/` err by 2.5 ulp by default, and NVIDIA's does: Div feeding Round
        # (DynamicQuantizeLinear) gave 25 where ONNX says 26. PoCL divides exactly either way.
        fp = device.single_fp_config
        self.divide_option = (" -cl-fp32-correctly-rounded-divide-sqrt"
                              if fp & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT else "")
        self._exp_lock = threading.Lock()
        # Kernel objects released partition states gave back, by (program, kernel name).
        self._idle_kernels: dict[tuple[int, str], list[cl.Kernel]] = {}
        # Its own re-entrant lock: a state released by the garbage collector (a session's
        # finalizer) gives its kernels back on whatever thread, holding whatever lock, it interrupts.
        self._idle_lock = threading.RLock()
        self._launch_costs: LaunchCosts | None = None
        self._known_queue: cl.CommandQueue | None = None  # the last queue ``in_context`` accepted
        self.stores_binaries = not driver_caches_builds(platform.name)

    def in_context(self, queue: object) -> bool:
        """Whether ``queue`` is a pyopencl command queue of this context. Reading a queue's context
        makes a new pyopencl object each time (about 1 us, at every run and copy), so the last
        queue accepted is remembered (a strong reference: pyopencl queues take no weak ones, and
        identity, unlike a handle value a released queue's successor may reuse, cannot mislead)."""
        if queue is self._known_queue and queue is not None:
            return True
        if isinstance(queue, cl.CommandQueue) and queue.context == self.context:
            self._known_queue = queue
            return True
        return False

    @property
    def exp_option(self) -> str:
        """``-DONNXHAL_EXP=native_exp`` if this device's native_exp is within ``NATIVE_EXP_RTOL`` of
        exp over [-80, 80], else ``-DONNXHAL_EXP=exp`` (measured on first use)."""
        with self._exp_lock:
            if self._exp_option is None:
                self._exp_option = self._measure_exp_option()
        return self._exp_option

    def _measure_exp_option(self) -> str:
        import numpy as np

        x = np.linspace(-80.0, 80.0, 4096, dtype=np.float32)
        y = np.empty_like(x)
        mf = cl.mem_flags
        bx = cl.Buffer(self.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        by = cl.Buffer(self.context, mf.WRITE_ONLY, y.nbytes)
        prg = self._build_cached(EXP_SOURCE, DEFAULT_BUILD_OPTIONS)
        prg.onnxhal_exp_check(self.queue, (x.size,), None, bx, by)
        cl.enqueue_copy(self.queue, y, by, is_blocking=True)
        want = np.exp(x.astype(np.float64))
        err = float(np.max(np.abs(y - want) / want))
        return f"-DONNXHAL_EXP={'native_exp' if err <= NATIVE_EXP_RTOL else 'exp'}"

    def launch_costs(self) -> LaunchCosts:
        """This device's ``LaunchCosts``, measured at first use (about 2 ms on PoCL) and kept."""
        with self._exp_lock:
            if self._launch_costs is None:
                self._launch_costs = self._measure_launch_costs()
            return self._launch_costs

    def _measure_launch_costs(self, repeat: int = 15) -> LaunchCosts:

        import numpy as np

        host = np.ones(4, np.float32)
        mf = cl.mem_flags
        bx = cl.Buffer(self.context, mf.READ_WRITE | mf.COPY_HOST_PTR, hostbuf=host)
        by = cl.Buffer(self.context, mf.READ_WRITE, host.nbytes)
        queue = self.new_queue()  # not the shared queue: others' work would count as this launch's
        knl = cl.Kernel(self._build_cached(EXP_SOURCE, DEFAULT_BUILD_OPTIONS), "onnxhal_exp_check")
        knl.set_arg(0, bx)
        knl.set_arg(1, by)
        launches, copies = [], []
        for k in range(repeat + 2):  # the first two warm the driver (PoCL compiles per local size)
            t = time.perf_counter()
            cl.enqueue_nd_range_kernel(queue, knl, (1,), (1,))
            queue.finish()
            t1 = time.perf_counter()
            cl.enqueue_copy(queue, bx, host, is_blocking=True)
            t2 = time.perf_counter()
            if k >= 2:
                launches.append(t1 - t)
                copies.append(t2 - t1)
        bx.release()
        by.release()
        # The fastest of the repeats, as host_rates takes: the median moved with the machine's load
        # (11-19 us a launch on PoCL at load 7-9), so the cost rule sent borderline models to the
        # device in one process and to the host in the next.
        return LaunchCosts(min(launches), min(copies))

    @property
    def name(self) -> str:
        return self.device.name

    def new_queue(self) -> cl.CommandQueue:
        """A further in-order queue on this device (one per sync stream)."""
        return cl.CommandQueue(self.context, self.device)

    def _disk_path(self, digest: str) -> Path:
        dev = hashlib.sha256(self.device_key.encode()).hexdigest()[:16]
        return cache_root() / "programs" / dev / f"{digest}.bin"

    def program(self, source: str, options: str = DEFAULT_BUILD_OPTIONS, kernel: str | None = None) -> cl.Program:
        """The built program for ``source``: from memory, from the disk cache, or compiled. Built with
        ``options`` and this device's ``exp_option``. With ``kernel``, only the part of a large
        ``source`` that kernel needs is built (``program_slices.kernel_slice``)."""
        if kernel is not None:
            source = kernel_slice(source, kernel)
        return self._build_cached(source, f"{options} {self.exp_option}{self.divide_option}")

    def _build_cached(self, source: str, options: str) -> cl.Program:
        # The digest names the binary on disk; in memory a (options, source) pair finds it by the
        # strings' own hashes (a kernel source is tens of KB: hashing it again per launch site adds up)
        digest = self._digests.get((options, source))
        if digest is None:
            digest = self._digests[(options, source)] = hashlib.sha256(f"{options}\0{source}".encode()).hexdigest()
        with self._lock:
            prg = self._programs.get(digest)
            if prg is not None:
                self.stats.memory_hits += 1
                return prg
            failed = self._failed.get(digest)
            if failed is not None:
                self.stats.failure_hits += 1
                raise ProgramBuildError(str(failed), failed.log)
            prg = self._load(digest, options) or self._compile(source, options, digest)
            self._programs[digest] = prg
            return prg

    def kernel(self, source: str, name: str, options: str = DEFAULT_BUILD_OPTIONS) -> cl.Kernel:
        """A kernel object of its own for the caller (kernels hold arguments): one a released state
        gave back (``recycle_kernels``) if there is one, else a new one. Either way its arguments are
        the caller's to set, every one of them, before its first launch."""
        prg = self.program(source, options, name)
        key = (prg.int_ptr, name)
        with self._idle_lock:
            idle = self._idle_kernels.get(key)
            if idle:
                self.stats.kernels_reused += 1
                return idle.pop()
            self.stats.kernels_created += 1
        # pyopencl sets up each new kernel object's argument handling (a look-up in its
        # on-disk cache): many partition states in a process (sessions, shapes) pay it once per
        # launch site when the objects are reused.
        return cl.Kernel(prg, name)

    def recycle_kernels(self, kernels: Iterable[cl.Kernel]) -> None:
        """Give back kernel objects whose owner no longer launches them (a released partition state,
        one-off packing launches), for ``kernel`` to hand out again; at most ``MAX_IDLE_KERNELS``
        are kept per kernel."""
        with self._idle_lock:
            for k in kernels:
                idle = self._idle_kernels.setdefault((k.program.int_ptr, k.function_name), [])
                if len(idle) < MAX_IDLE_KERNELS:
                    idle.append(k)

    def _load(self, digest: str, options: str) -> cl.Program | None:
        path = self._disk_path(digest)
        if not path.is_file():
            return None
        start = time.perf_counter()
        try:
            prg = cl.Program(self.context, [self.device], [path.read_bytes()]).build(options=options)
        except (cl.Error, OSError):  # stale or corrupt binary: rebuild from source
            return None
        self.stats.loaded_from_disk += 1
        self.stats.load_seconds += time.perf_counter() - start
        return prg

    def _compile(self, source: str, options: str, digest: str) -> cl.Program:
        start = time.perf_counter()
        # pyopencl's private unbuilt program: its public Program(context, source).build() keeps a
        # second on-disk cache of its own (keyed by source, next to ours by digest) and, on a
        # failed build, writes the source to a temporary file; no public call builds without both.
        prg = cl._cl._Program(self.context, source)
        try:
            prg._build(options=options.encode())
        except cl.Error as exc:
            try:
                log = prg.get_build_info(self.device, cl.program_build_info.LOG)
            except cl.Error:
                log = str(exc)
            first = source.strip().splitlines()[0] if source.strip() else ""
            self.stats.failures.append(digest)
            error = ProgramBuildError(
                f"OpenCL program ({first[:80]!r}...) failed to build on {self.device.name}: {log.strip()[:2000]}",
                log[:20000])
            self._failed[digest] = error
            raise error from exc
        self.stats.compiled += 1
        self.stats.compile_seconds += time.perf_counter() - start
        program = cl.Program(prg)
        if self.stores_binaries:
            self._store(digest, program)
        return program

    def _store(self, digest: str, prg: cl.Program) -> None:
        path = self._disk_path(digest)
        try:
            binary = prg.get_info(cl.program_info.BINARIES)[0]
            if not binary:
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent process never reads half a binary.
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(binary)
            os.replace(tmp, path)
        except (OSError, cl.Error):
            pass  # the cache is an optimisation: an unwritable disk only costs a rebuild next time


def driver_caches_builds(platform_name: str) -> bool:
    """Whether the driver keeps built programs on disk itself, so that onnxhal stores no binaries.

    PoCL does (in ``POCL_CACHE_DIR``, keyed by source and options, unless ``POCL_KERNEL_CACHE=0``),
    and asking it for a program's binary makes it generate code for every kernel of the program
    for a generic work-group size, which its launches never use: about 1.6 s of CPU a GEMM slice
    at load 4 (docs/opencl-internals.md), holding the GIL. A later process builds the same source
    from PoCL's cache in about 0.08 s instead of loading onnxhal's binary in 0.01 s.
    """
    return platform_name == "Portable Computing Language" and os.environ.get("POCL_KERNEL_CACHE", "1") != "0"


_contexts: dict[int, OpenCLDeviceContext] = {}
_contexts_lock = threading.Lock()


def device_context(device: cl.Device) -> OpenCLDeviceContext:
    """The one ``OpenCLDeviceContext`` of ``device`` in this process."""
    key = device.int_ptr
    with _contexts_lock:
        ctx = _contexts.get(key)
        if ctx is None:
            ctx = _contexts[key] = OpenCLDeviceContext(device)
        return ctx


def opencl_device(platform_index: int, device_index: int) -> cl.Device:
    """``pyopencl.get_platforms()[platform_index].get_devices()[device_index]``, with a clear error."""
    from onnxhal.hal.errors import InvalidArgument

    platforms = cl.get_platforms()
    if not 0 <= platform_index < len(platforms):
        raise InvalidArgument(f"OpenCL platform index {platform_index} out of range: {len(platforms)} platform(s)")
    devices = platforms[platform_index].get_devices()
    if not 0 <= device_index < len(devices):
        raise InvalidArgument(f"OpenCL device index {device_index} out of range on platform "
                              f"{platforms[platform_index].name!r}: {len(devices)} device(s)")
    return devices[device_index]
