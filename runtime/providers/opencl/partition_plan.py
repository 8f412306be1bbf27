"""A compiled partition of the OpenCL EP: the launches of one fused node, and running them.

``PartitionPlan`` is built once per fused node (``compile``): a list of kernel launches over named
buffers (the partition's inputs, outputs, intermediates, workspaces and uploaded constants).
``PartitionState`` (``create_state``) uploads the constants and runs one-off launches such as
weight packing. ``run`` binds a run's DeviceTensors to the names and enqueues every launch on the
stream's queue without waiting. Each launch site has its own kernel object, whose arguments stay set
between runs: constants are bound once, intermediates live in a workspace kept per queue, so a run
replays the recorded launches and sets only the arguments that are its inputs and outputs. Where
the optional extension ``_replay`` is built (``native_replay``), that replay is one C call per run.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import pyopencl as cl

from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import RUN_OPTIONS, check_terminate
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.op_geometry import first_out_of_range
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext
from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator
from onnxhal.runtime.providers.opencl.native_replay import raise_cl_error, replay_module

#: Work-group size of the 1-D kernels: fixed, so PoCL compiles each kernel for one local size only.
LOCAL_1D = 64
#: Work-group size of the GEMM-family kernels on a GPU (see ``_BoundLaunch``).
GPU_LOCAL = 64
#: Queues (streams) a partition state keeps a workspace of temporaries for; the least recently
#: used one is freed beyond this.
MAX_WORKSPACES = 4


@dataclass(frozen=True)
class Buf:
    """A kernel argument that is a named buffer of the plan."""

    name: str


@dataclass
class Launch:
    """One kernel launch: the kernel ``kernel_name`` of program ``source``, its NDRange and its
    arguments (``Buf`` names resolved per run, numpy scalars as they are)."""

    source: str
    kernel_name: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list


@dataclass
class CopyStep:
    """A byte copy between two named buffers (a view that must own its memory, e.g. an output)."""

    dst: str
    src: str
    nbytes: int


@dataclass
class PartitionPlan:
    """Everything ``compile`` decided about one fused node."""

    input_names: list[str]
    output_names: list[str]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # uploaded once
    prepacked: dict[str, int] = field(default_factory=dict)  # name -> bytes, filled by init_steps
    init_steps: list[Launch] = field(default_factory=list)
    temps: dict[str, int] = field(default_factory=dict)  # name -> bytes, a workspace per queue
    #: Temps zeroed once when their workspace is allocated: padded planes whose border no launch
    #: writes (rule ``conv_lanes_padded_output``), so every run reads zeros there.
    zeroed_temps: set[str] = field(default_factory=set)
    aliases: dict[str, str] = field(default_factory=dict)  # view value -> value it shares memory with
    steps: list = field(default_factory=list)  # Launch | CopyStep
    op_types: list[str] = field(default_factory=list)
    #: Inputs that are Gather indices fed at run time -> the gathered axis length. They come in host
    #: memory, are range-checked (the kernel cannot raise) and uploaded by ``PartitionState.run``.
    host_indices: dict[str, int] = field(default_factory=dict)

    def base(self, name: str) -> str:
        while name in self.aliases:
            name = self.aliases[name]
        return name

    def nbytes(self, name: str) -> int:
        return int(math.prod(self.shapes[name])) * self.dtypes[name].itemsize

    def add_launch_1d(self, source: str, kernel: str, total: int, args: list, init: bool = False) -> None:
        """A 1-D launch of ``total`` work-items (rounded up to ``LOCAL_1D``); the kernel's last argument is
        ``total`` so it can skip the padding."""
        if total <= 0:
            return
        padded = -(-total // LOCAL_1D) * LOCAL_1D
        launch = Launch(source, kernel, (padded,), (LOCAL_1D,), [*args, np.int32(total)])
        (self.init_steps if init else self.steps).append(launch)

    @property
    def launches_per_run(self) -> int:
        """Commands one run enqueues (kernel launches and buffer copies)."""
        return len(self.steps)


class _BoundLaunch:
    """A launch with its kernel object; the lock makes set_args + enqueue atomic across threads."""

    __slots__ = ("kernel", "global_size", "local_size", "args", "dynamic", "bound")

    def __init__(self, device: OpenCLDeviceContext, launch: Launch) -> None:
        self.kernel = device.kernel(launch.source, launch.kernel_name)
        self.global_size = launch.global_size
        self.local_size = launch.local_size
        if launch.local_size == (1, 1) and device.device.type & cl.device_type.GPU:
            # The GEMM-family kernels use one work-item per register block, work-groups of one on a
            # CPU (PoCL compiles per local size). A GPU runs a work-group of one on one lane of a
            # 32-wide unit: groups of GPU_LOCAL instead, the padding work-items return early.
            g0 = -(-launch.global_size[0] // GPU_LOCAL) * GPU_LOCAL
            self.global_size, self.local_size = (g0, *launch.global_size[1:]), (GPU_LOCAL, 1)
        self.args = launch.args
        self.dynamic: list[tuple[int, str]] | None = None  # set by bind_static
        self.bound: list = []  # the buffer each dynamic argument holds now, as set_arg left it

    def bind_static(self, const_buffers: dict[str, cl.Buffer], native: ModuleType | None = None) -> None:
        """Set the arguments that are the same in every run (scalars, constant and prepacked buffers)
        once: ``set_arg`` costs ~4 us through pyopencl, and a GEMM launch has ~20 arguments, of which
        the runs change 3-5 (inputs, outputs, temporaries). ``native``: the native replay module,
        which sets a numpy scalar's bytes directly (pyopencl's ``set_arg`` spends ~6 us on one
        trying the memory-object conversions first)."""
        dynamic = []
        for i, a in enumerate(self.args):
            if not isinstance(a, Buf):
                if native is not None and isinstance(a, np.generic):
                    code = native.set_scalar_arg(self.kernel.int_ptr, i, a)
                    if code:
                        raise_cl_error(code, "clSetKernelArg")
                else:
                    self.kernel.set_arg(i, a)
            elif a.name in const_buffers:
                self.kernel.set_arg(i, const_buffers[a.name])
            else:
                dynamic.append((i, a.name))
        self.dynamic = dynamic
        self.bound = [None] * len(dynamic)


class PartitionState:
    """Per-session state of one fused node: kernels, constant buffers, prepacked weights."""

    def __init__(self, plan: PartitionPlan, device: OpenCLDeviceContext, allocator: OpenCLAllocator) -> None:
        self.plan = plan
        self.device = device
        self.allocator = allocator
        # Re-entrant for release(), which the garbage collector may run (a session's finalizer).
        self.lock = threading.RLock()
        # The last run's index uploads (pyopencl NannyEvents): each keeps its host copy alive until
        # the transfer is done, and waits for it when dropped, which the next run does.
        self._uploads: list = []
        self.launches = [_BoundLaunch(device, s) if isinstance(s, Launch) else s for s in plan.steps]
        init = [_BoundLaunch(device, s) for s in plan.init_steps]
        self.const_buffers: dict[str, cl.Buffer] = {}
        mf = cl.mem_flags
        # What the runs read; a constant only the one-off packing reads is released after it, and
        # one nothing reads (a weight the lowering repacked on the host) is never uploaded.
        used = {a.name for s in plan.steps if isinstance(s, Launch) for a in s.args if isinstance(a, Buf)}
        used |= {n for s in plan.steps if isinstance(s, CopyStep) for n in (s.src, s.dst)}
        used |= set(plan.aliases.values())
        init_used = {a.name for s in plan.init_steps for a in s.args if isinstance(a, Buf)}
        for name, arr in plan.constants.items():
            if name not in used and name not in init_used:
                continue
            host = np.ascontiguousarray(arr)
            if host.nbytes == 0:
                host = np.zeros(1, host.dtype)
            self.const_buffers[name] = cl.Buffer(device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=host)
        for name, nbytes in plan.prepacked.items():
            self.const_buffers[name] = cl.Buffer(device.context, mf.READ_WRITE, max(nbytes, 4))
        if init:
            queue = device.queue
            for b in init:
                _enqueue(queue, b, self.const_buffers)
            queue.finish()
            # Raw weights read only by the one-off packing are not kept twice on the device.
            for name in [n for n in self.const_buffers if n in plan.constants and n not in used]:
                self.const_buffers.pop(name).release()
            device.recycle_kernels(b.kernel for b in init)
        native = replay_module()
        for b in self.launches:
            if isinstance(b, _BoundLaunch):
                b.bind_static(self.const_buffers, native)
        #: the launches recorded for the native replay (kernel handles, NDRanges, the arguments a run
        #: sets by slot), None where the runs replay from Python (``native_replay.replay_module``)
        self.recording = None
        #: the buffer names whose buffers a run hands the recording, in slot order
        self.slot_names: list[str] = []
        if native is not None:
            self.recording, self.slot_names = _record(native, self.launches)
        #: where each slot's buffer comes from in a run (``_slot_sources``), for the native replay
        self.slot_sources = _slot_sources(plan, self.slot_names, self.const_buffers)
        self._indices = [(k, name) for k, name in enumerate(plan.input_names) if name in plan.host_indices]
        self._outputs = [(plan.shapes[n], plan.dtypes[n]) for n in plan.output_names]
        #: ``run_host``'s (slot per input, slot per output), None where it declines every run
        self._host_slots = _host_slots(plan, self.slot_sources) if self.recording is not None else None
        #: ``run_host``'s (input index, axis length) of each Gather index input, range-checked per run
        self._host_index_bounds = [(k, plan.host_indices[name]) for k, name in self._indices]
        #: ``run_host``'s input and output buffers per queue key, kept: its runs end finished, so the
        #: next one may overwrite them
        self._host_buffers: dict[int, tuple[list, list]] = {}
        self.runs = 0
        self._workspaces: OrderedDict[int, tuple[cl.CommandQueue, dict[str, cl.Buffer]]] = OrderedDict()

    def release(self) -> None:
        self.device.recycle_kernels(b.kernel for b in self.launches if isinstance(b, _BoundLaunch))
        self.launches = []
        self.recording = None  # it holds the kernels and the buffers their arguments were last set to
        self._host_slots = None
        for buf in self.const_buffers.values():
            buf.release()
        self.const_buffers.clear()
        with self.lock:
            for ins, outs in self._host_buffers.values():
                for buf in (*ins, *outs):
                    self.allocator.free(buf)
            self._host_buffers.clear()
            for _, temps in self._workspaces.values():
                for buf in temps.values():
                    self.allocator.free(buf)
            self._workspaces.clear()

    def _upload_indices(self, name: str, t, queue: cl.CommandQueue, owned: list, uploads: list) -> cl.Buffer:
        """Gather indices fed at run time (input ``name``, value ``t``), in host memory: out-of-range
        ones are an error (onnxruntime's), not a silent zero from the kernel."""
        if isinstance(t, DeviceTensor):  # the fused node lists it in host_inputs: the runtime copies it
            raise InvalidArgument(f"OpenCL fused node input {name!r} (Gather indices) must come in host memory, got a "
                                  f"DeviceTensor on {t.memory_info.name}; the EP's "
                                  "NodeComputeInfo must list it in host_inputs")
        idx = np.asarray(t, dtype=np.int64)
        if idx.shape != self.plan.shapes[name]:
            raise InvalidArgument(f"OpenCL fused node input {name!r} expects int64 {list(self.plan.shapes[name])}, "
                                  f"got {list(idx.shape)}")
        _check_indices(name, idx, self.plan.host_indices[name])
        buf = self.allocator.alloc(max(idx.nbytes, 8))
        owned.append(buf)
        if idx.nbytes:
            # Not blocking, so the run waits once, at its end: the copy is the run's own (the caller
            # may reuse its array once run() returns), and ``uploads`` keeps it until it is on the device.
            private = np.array(idx.reshape(-1), dtype=np.int64, copy=True)
            uploads.append(cl.enqueue_copy(queue, buf, private, is_blocking=False))
        return buf

    def run(self, inputs: list, queue: cl.CommandQueue) -> list[DeviceTensor]:
        """Enqueue one run; returns the output tensors (their data is ready when ``queue`` gets there)."""
        plan = self.plan
        if len(inputs) != len(plan.input_names):
            raise InvalidArgument(f"OpenCL fused node expects {len(plan.input_names)} inputs "
                                  f"({plan.input_names}), got {len(inputs)}")
        in_bufs: list = [None] * len(inputs)
        owned: list[cl.Buffer] = []
        uploads: list = []
        try:
            for k, name in self._indices:
                in_bufs[k] = self._upload_indices(name, inputs[k], queue, owned, uploads)
            for k, (name, t) in enumerate(zip(plan.input_names, inputs)):
                if in_bufs[k] is not None:
                    continue
                if not isinstance(t, DeviceTensor) or not isinstance(t.buffer, cl.Buffer):
                    raise InvalidArgument(f"OpenCL fused node input {name!r}: expected an OpenCL DeviceTensor, got "
                                          f"{type(t).__name__}; the runtime must copy it to {self.allocator.info.name}")
                if t.shape != plan.shapes[name]:
                    raise InvalidArgument(f"OpenCL fused node input {name!r} expects float32 {list(plan.shapes[name])}, "
                                          f"got {t.dtype}{list(t.shape)}")
                if t.offset:  # kernels take bare pointers: move offset views to their own buffer
                    buf = self.allocator.alloc(t.nbytes)
                    owned.append(buf)
                    cl.enqueue_copy(queue, buf, t.buffer, byte_count=t.nbytes, src_offset=t.offset)
                    in_bufs[k] = buf
                else:
                    in_bufs[k] = t.buffer
        except BaseException:  # a bad input or OutOfMemory: give back what this run took so far
            for b in owned:
                self.allocator.free(b)
            raise
        outputs = []
        try:
            for shape, dtype in self._outputs:
                # allocate(): the buffer returns to the allocator when the runtime drops the last reference.
                outputs.append(DeviceTensor.allocate(shape, dtype, self.allocator))
            with self.lock:
                if uploads or self._uploads:
                    self._uploads = uploads
                temps = self._workspace(queue)
                stoppable = RUN_OPTIONS.get() is not None  # no RunOptions: nothing can ask this run to stop
                if self.recording is not None:
                    _replay_native(queue, self.recording, self.slot_buffers(in_bufs, outputs, temps), stoppable)
                else:
                    bufs = self.buffers(in_bufs, outputs, temps)
                    if not stoppable:
                        for step in self.launches:
                            _replay_step(queue, step, bufs)
                    else:
                        _enqueue_stoppable(queue, self.launches, bufs)
                self.runs += 1
        except BaseException:  # e.g. OutOfMemory: give back what this run took, the session stays usable
            for out in outputs:
                self.allocator.release_if_owned(out.buffer)
            raise
        finally:  # offset inputs' own copies: released once their readers are done (OpenCL defers it)
            for buf in owned:
                self.allocator.free(buf)
        return outputs

    def run_host(self, inputs: Sequence[Any]) -> list[np.ndarray] | None:
        """A whole run from host arrays to host arrays by one native call (``_replay.Recording.run_host``:
        the feeds written to buffers this state keeps, the launches replayed, the outputs read back,
        one finish) on the device's own queue; None, before anything is enqueued, where it does not
        apply: no native recording, an input that is not a C-contiguous numpy array of the plan's dtype
        and shape, or Gather indices (fed at run time) not int64 or out of range (``run`` takes those,
        with its errors). In-range int64 indices are written as they are, as ``run`` uploads them."""
        host_slots = self._host_slots
        if host_slots is None:
            return None
        plan = self.plan
        if len(inputs) != len(plan.input_names):
            return None
        for name, t in zip(plan.input_names, inputs):
            if t.__class__ is not np.ndarray or t.dtype != plan.dtypes[name] or t.shape != plan.shapes[name] \
                    or not t.flags.c_contiguous:
                return None
        for k, n in self._host_index_bounds:
            if inputs[k].dtype != np.int64 or first_out_of_range(inputs[k], n) is not None:
                return None
        in_slots, out_slots = host_slots
        queue = self.device.queue
        outputs = [np.empty(shape, dtype) for shape, dtype in self._outputs]
        with self.lock:
            temps = self._workspace(queue)
            in_bufs, out_bufs = self._host_buffers_for(queue)
            slots = [in_bufs[i] if kind == 0 else out_bufs[i] if kind == 1 else temps[i] if kind == 2 else i
                     for kind, i in self.slot_sources]
            writes = [(slot, t) for slot, t in zip(in_slots, inputs) if slot is not None]
            reads = list(zip(out_slots, outputs))
            code, _, routine = self.recording.run_host(queue, slots, writes, reads)
            if code:
                raise_cl_error(code, routine)
            self.runs += 1
        return outputs

    def _host_buffers_for(self, queue: cl.CommandQueue) -> tuple[list, list]:
        """``run_host``'s input and output buffers on ``queue`` (caller holds ``lock``), allocated once."""
        key = queue.int_ptr
        found = self._host_buffers.get(key)
        if found is not None:
            return found
        plan = self.plan
        taken: list = []
        try:
            for name in (*plan.input_names, *plan.output_names):
                nbytes = int(np.prod(plan.shapes[name], dtype=np.int64)) * np.dtype(plan.dtypes[name]).itemsize
                taken.append(self.allocator.alloc(max(nbytes, 4)))
        except BaseException:
            for buf in taken:
                self.allocator.free(buf)
            raise
        n = len(plan.input_names)
        found = self._host_buffers[key] = (taken[:n], taken[n:])
        return found

    def slot_buffers(self, in_bufs: list, outputs: list[DeviceTensor], temps: dict[str, cl.Buffer]) -> list:
        """The buffer of each of ``slot_names`` in a run given its inputs' buffers, its outputs and
        its workspace's temporaries: what the native replay is handed."""
        return [in_bufs[i] if kind == 0 else outputs[i].buffer if kind == 1 else temps[i] if kind == 2 else i
                for kind, i in self.slot_sources]

    def buffers(self, in_bufs: list, outputs: list[DeviceTensor], temps: dict[str, cl.Buffer]) -> dict[str, cl.Buffer]:
        """Every buffer name of the plan -> its buffer in a run (the Python replay's lookup), from
        the same pieces as ``slot_buffers``."""
        plan = self.plan
        bufs: dict[str, cl.Buffer] = dict(self.const_buffers)
        bufs.update(zip(plan.input_names, in_bufs))
        bufs.update((n, t.buffer) for n, t in zip(plan.output_names, outputs))
        bufs.update(temps)
        for name in plan.aliases:
            if name not in bufs:
                bufs[name] = bufs[plan.base(name)]
        return bufs

    def _workspace(self, queue: cl.CommandQueue) -> dict[str, cl.Buffer]:
        """The temporaries of runs on ``queue`` (caller holds ``lock``): allocated at the first run on
        that queue and kept, so a replayed launch finds its intermediate buffers already bound. Runs on
        one in-order queue never overlap, so they can share them; another queue gets its own."""
        key = queue.int_ptr
        entry = self._workspaces.get(key)
        if entry is not None:
            self._workspaces.move_to_end(key)
            return entry[1]
        temps: dict[str, cl.Buffer] = {}
        try:
            for name, nbytes in self.plan.temps.items():
                temps[name] = self.allocator.alloc(nbytes)
                if name in self.plan.zeroed_temps:
                    # A pooled buffer holds an earlier plan's data; the in-order queue finishes the
                    # fill before any launch of this workspace.
                    cl.enqueue_fill_buffer(queue, temps[name], np.float32(0), 0, nbytes)
        except BaseException:
            for buf in temps.values():
                self.allocator.free(buf)
            raise
        # The queue is kept with its buffers: its handle cannot be reused by a new queue while held.
        self._workspaces[key] = (queue, temps)
        while len(self._workspaces) > MAX_WORKSPACES:
            _, (_, old) = self._workspaces.popitem(last=False)
            for buf in old.values():  # OpenCL defers the release until queued readers finish
                self.allocator.free(buf)
        return temps


def _slot_sources(plan: PartitionPlan, slot_names: list[str], const_buffers: dict[str, cl.Buffer]) -> list[tuple]:
    """For each slot name, where a run finds its buffer: (0, k) the k-th input's, (1, k) the k-th
    output's, (2, name) the workspace's temporary, (3, buffer) a constant; an alias as the value it
    views. The precedence is ``PartitionState.buffers``' (temporaries, outputs, inputs, constants),
    so both replays bind the same buffers."""
    inputs = {n: k for k, n in enumerate(plan.input_names)}
    outputs = {n: k for k, n in enumerate(plan.output_names)}

    def source(name: str) -> tuple | None:
        if name in plan.temps:
            return (2, name)
        if name in outputs:
            return (1, outputs[name])
        if name in inputs:
            return (0, inputs[name])
        if name in const_buffers:
            return (3, const_buffers[name])
        return None

    found = []
    for name in slot_names:
        src = source(name)
        if src is None and name in plan.aliases:
            src = source(plan.base(name))
        if src is None:
            raise InvalidArgument(f"OpenCL partition plan: buffer {name!r} is neither an input, output, temporary, "
                                  "constant nor a view of one; the plan builder left it unbound")
        found.append(src)
    return found


def _host_slots(plan: PartitionPlan, sources: list[tuple]) -> tuple[list, list] | None:
    """``run_host``'s slot for each input (None: no step reads it, nothing to write) and each output;
    None where an output is in no slot (no recorded step writes it: ``run_host`` declines)."""
    where = {src: k for k, src in enumerate(sources) if src[0] in (0, 1)}
    ins = [where.get((0, k)) for k in range(len(plan.input_names))]
    outs = [where.get((1, k)) for k in range(len(plan.output_names))]
    return None if None in outs else (ins, outs)


def _check_indices(name: str, idx: np.ndarray, n: int) -> None:
    bad = first_out_of_range(idx, n)
    if bad is not None:
        raise InvalidArgument(f"Gather: index {bad} in {name!r} is out of range for an axis of length {n}; "
                              f"indices must lie in [{-n}, {n - 1}].")


def _replay_step(queue: cl.CommandQueue, step: _BoundLaunch | CopyStep, bufs: dict[str, cl.Buffer]) -> None:
    """Enqueue one recorded step of a run. A kernel object keeps its arguments between launches, so
    only an argument whose buffer differs from the one it holds is set again: the workspace's
    temporaries stay bound from run to run, and only inputs and outputs are rebound."""
    if isinstance(step, CopyStep):
        if step.nbytes:
            cl.enqueue_copy(queue, bufs[step.dst], bufs[step.src], byte_count=step.nbytes)
        return
    kernel, bound = step.kernel, step.bound
    for k, (i, name) in enumerate(step.dynamic):
        buf = bufs[name]
        if buf is not bound[k]:
            kernel.set_arg(i, buf)
            bound[k] = buf
    cl.enqueue_nd_range_kernel(queue, kernel, step.global_size, step.local_size)


#: Launches a run given RunOptions may have queued ahead of the device: the work left after a
#: terminate request is at most twice this many launches.
IN_FLIGHT = 64


def _enqueue_stoppable(queue: cl.CommandQueue, steps: list, bufs: dict[str, cl.Buffer]) -> None:
    """Enqueue ``steps`` reading ``RunOptions.terminate`` before each, as onnxruntime between nodes.
    Enqueueing is asynchronous, so the host also waits, every ``IN_FLIGHT`` launches, for a marker
    placed ``IN_FLIGHT`` launches earlier: the device never lags by more than two batches, so a stop
    request is honoured after a bounded amount of device work, not after the whole partition."""
    pending = None
    for k, step in enumerate(steps):
        check_terminate()
        if k and k % IN_FLIGHT == 0:
            marker = cl.enqueue_marker(queue)
            queue.flush()
            if pending is not None:
                pending.wait()
            pending = marker
        _replay_step(queue, step, bufs)


def _record(native, steps: list) -> tuple[object, list[str]]:
    """A ``_replay.Recording`` of ``steps`` (after ``bind_static``) and its slot names: each buffer
    name a run binds (the launches' dynamic arguments, the copies' ends) gets one slot."""
    slots: dict[str, int] = {}

    def slot(name: str) -> int:
        return slots.setdefault(name, len(slots))

    recorded = []
    for step in steps:
        if isinstance(step, CopyStep):
            recorded.append((1, slot(step.dst), slot(step.src), step.nbytes))
        else:
            dynamic = tuple((i, slot(name)) for i, name in step.dynamic)
            recorded.append((0, step.kernel, step.global_size, step.local_size, dynamic))
    return native.Recording(recorded, len(slots)), list(slots)


def _replay_native(queue: cl.CommandQueue, recording, slots: list, stoppable: bool) -> None:
    """``_replay_step`` over every step, or ``_enqueue_stoppable`` when ``stoppable``, by the native
    recording: one call per run, or one per ``IN_FLIGHT`` steps with the terminate flag read and the
    device's lag bounded between them as ``_enqueue_stoppable`` does."""
    n = recording.steps
    if not stoppable:
        code, _, routine = recording.replay(queue, slots)
        if code:
            raise_cl_error(code, routine)
        return
    pending = None
    for start in range(0, n, IN_FLIGHT):
        check_terminate()
        if start:
            marker = cl.enqueue_marker(queue)
            queue.flush()
            if pending is not None:
                pending.wait()
            pending = marker
        code, _, routine = recording.replay(queue, slots, start, start + IN_FLIGHT)
        if code:
            raise_cl_error(code, routine)


def _enqueue(queue: cl.CommandQueue, launch: _BoundLaunch, bufs: dict[str, cl.Buffer]) -> None:
    """A one-off (init) launch: every argument set."""
    kernel = launch.kernel
    for i, a in enumerate(launch.args):
        kernel.set_arg(i, bufs[a.name] if isinstance(a, Buf) else a)
    cl.enqueue_nd_range_kernel(queue, kernel, launch.global_size, launch.local_size)
