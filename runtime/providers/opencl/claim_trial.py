"""The cost rule's timed trial of a static partition at claim time (rule ``claim_trial``).

The rule's formula (``cost_rule.host_reason``) leaves out the host plan's dispatch (about 1.6 us a
node) and PoCL's own cost per kernel and arithmetic, so near its line it guesses: resnet_ts at
2 images came out device-worth and ran there 2.4 times slower than the host. A static partition's
shapes are known when it is claimed, so where the formula is not decisive (its work less than
``cost_rule.CLAIM_UNTRIED_FACTOR`` times the device's price) the claim runs it both ways, alternating
(``SignatureTrial``), on inputs of its shapes: the device side with the copies of the values that
cross to and from the host as claimed, the host side with those a decline would make cross
instead (values the device's other partitions make or read). A partition the host wins stays with
the CPU EP: no copies, launches or waits are left in the session's runs. Partitions with symbolic
dims are tried per concrete signature at run time instead (``dynamic_partition``).

The trial's inputs are zeros: every index is then in range and the timings do not depend on the
values (a float kernel's speed does not, and no claimed op branches on them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import numpy as np
import pyopencl as cl

from onnxhal.hal.graph import Graph, Node
from onnxhal.hal.host_execution import host_plan
from onnxhal.hal.run_control import RUN_OPTIONS
from onnxhal.hal.tensor import DeviceTensor
from onnxhal.runtime.providers.opencl.cost_rule import SignatureTrial
from onnxhal.runtime.providers.opencl.partition_plan import PartitionPlan, PartitionState


def host_crossings(graph: Graph, part: Sequence[Node], on_device: set[int], inputs: Sequence[str],
                   outputs: Sequence[str]) -> tuple[list[str], list[str]]:
    """The values that would cross if ``part`` ran on the host: its ``inputs`` made by another
    partition of this EP (``on_device``: ids of the nodes it claims) and its ``outputs`` read by one."""
    inside = {id(n) for n in part}
    down = [v for v in inputs if (p := graph.producer(v)) is not None and id(p) in on_device and id(p) not in inside]
    up = [v for v in outputs if any(id(c) in on_device and id(c) not in inside for c in graph.consumers(v))]
    return down, up


class ClaimTrial:
    """Times partition ``part`` (its ``plan`` built on ``device``) on both sides. ``shapes`` and
    ``dtypes``: of its inputs; ``device_crossing``: the values copied with it on the device;
    ``host_crossing``: (inputs downloaded, outputs uploaded) with it on the host."""

    def __init__(self, part: Graph, plan: PartitionPlan, device, allocator, logger: logging.Logger,
                 shapes: dict[str, tuple[int, ...]], dtypes: dict[str, np.dtype], device_crossing: Sequence[str],
                 host_crossing: tuple[Sequence[str], Sequence[str]]) -> None:
        self.part = part
        self.plan = plan
        self.device = device
        self.allocator = allocator
        self.feeds = {name: np.zeros(shapes[name], dtypes[name]) for name in part.input_names}
        crossing = set(device_crossing)
        self.upload = [n for n in part.input_names if n in crossing]
        self.download = [i for i, n in enumerate(part.output_names) if n in crossing]
        down, up = host_crossing
        self.host_download = [n for n in part.input_names if n in set(down)]
        self.host_upload = [i for i, n in enumerate(part.output_names) if n in set(up)]
        self.host = host_plan(part, part.output_names, logger)

    def run(self) -> SignatureTrial:
        """Both sides, alternating, host first, until the trial settles; raises what the runs raise."""
        trial = SignatureTrial()
        queue = self.device.new_queue()  # others' work on the shared queue would count as this trial's
        state = PartitionState(self.plan, self.device, self.allocator)
        try:
            resident = {n: self._device_tensor(self.feeds[n], queue) for n in self.part.input_names}
            queue.finish()
            while not trial.settled:
                side = trial.next_side()
                start = time.perf_counter()
                if side == "host":
                    self._host_run(resident, queue)
                else:
                    self._device_run(state, resident, queue)
                trial.record(side, time.perf_counter() - start)
        finally:
            queue.finish()
            state.release()
        return trial

    def _device_tensor(self, a: np.ndarray, queue: cl.CommandQueue) -> DeviceTensor:
        t = DeviceTensor.allocate(a.shape, a.dtype, self.allocator)
        if a.nbytes:
            cl.enqueue_copy(queue, t.buffer, a, is_blocking=False)
        return t

    def _device_run(self, state: PartitionState, resident: dict[str, DeviceTensor], queue: cl.CommandQueue) -> None:
        # the values made on the host go up as the runtime's copies would, the plan runs, the values
        # read on the host come down (a blocking copy: the run's end)
        uploaded = {n: self._device_tensor(self.feeds[n], queue) for n in self.upload}
        args = [self.feeds[n] if n in self.plan.host_indices else uploaded.get(n, resident[n])
                for n in self.plan.input_names]
        outputs = state.run(args, queue)
        for i in self.download:
            _download(outputs[i], queue)
        queue.finish()

    def _host_run(self, resident: dict[str, DeviceTensor], queue: cl.CommandQueue) -> None:
        feeds = dict(self.feeds)
        for n in self.host_download:
            feeds[n] = _download(resident[n], queue)
        values = self.host.run(feeds, RUN_OPTIONS.get())
        for i in self.host_upload:
            self._device_tensor(np.ascontiguousarray(values[i]), queue)
        queue.finish()


def _download(t, queue: cl.CommandQueue) -> np.ndarray:
    if not isinstance(t, DeviceTensor):  # an output handed over in host memory
        return np.asarray(t)
    out = np.empty(t.shape, t.dtype)
    if out.nbytes:
        cl.enqueue_copy(queue, out, t.buffer, src_offset=t.offset, is_blocking=True)
    return out
