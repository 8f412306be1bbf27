"""The CPU EP: numpy kernels, the correctness oracle and the fallback for every other EP.

Written as a plugin EP library like any third-party one (``create_ep_factories`` in this package's
``__init__``); the environment registers it implicitly, first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from onnxhal.hal import (
    CustomOp,
    Ep,
    EpFactory,
    EpGraphSupportInfo,
    Graph,
    Kernel,
    KernelCreateContext,
    Node,
    OrtEpDevice,
    OrtHardwareDevice,
    OrtHardwareDeviceType,
)
from onnxhal.runtime.providers.cpu.kernels.blas_threads import (
    LoadAwareBlasThreads,
    get_blas_threads,
    startup_blas_threads,
)

CPU_EP_VERSION = "0.1.0"


class CpuEp(Ep):
    name = "CPUExecutionProvider"
    runs_onnxhal_fused_ops = True

    def __init__(self, logger: logging.Logger, custom_ops: Mapping[tuple[str, str], CustomOp] | None = None,
                 blas_threads: LoadAwareBlasThreads | None = None) -> None:
        self._logger = logger
        self._blas = blas_threads
        # Set by create_kernel: a session whose nodes all run on other EPs runs no BLAS product here
        # (host plans of other EPs govern their own runs: graph_plan.GovernedHostPlan).
        self._has_kernels = False
        # the custom ops EP libraries bring for the CPU EP (no execution_provider, as onnxruntime's default)
        self._custom = {k: op for k, op in (custom_ops or {}).items()
                        if op.execution_provider in (None, "", self.name)}

    def get_capability(self, graph: Graph, support_info: EpGraphSupportInfo) -> None:
        from onnxhal.runtime.providers.cpu.kernel_factory import supports_node

        for node in graph.nodes:
            if (node.domain, node.op_type) in self._custom or supports_node(node, graph.opset_version(node.domain)):
                support_info.add_single_node(node)

    def on_run_start(self, run_options: Any) -> None:
        # The load reading (/proc/self/task/*/stat, every 50 ms) cost 200-300 us of a run of the CNN
        # on the OpenCL EP, whose runs outlast 50 ms, for products this EP never ran.
        if self._blas is not None and self._has_kernels:
            self._blas.apply()

    def create_kernel(self, node: Node, context: KernelCreateContext) -> Kernel:
        from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel

        self._has_kernels = True
        custom = self._custom.get((node.domain, node.op_type))
        if custom is not None:
            return custom.create_kernel(node)
        return create_cpu_kernel(node, context)


class CpuEpFactory(EpFactory):
    name = "CPUExecutionProvider"
    vendor = "onnxhal"
    vendor_id = 0
    version = CPU_EP_VERSION

    def __init__(self, api: Any) -> None:
        self.api = api

    def get_supported_devices(self, hardware_devices: Sequence[OrtHardwareDevice]) -> list[OrtEpDevice]:
        for d in hardware_devices:
            if d.type == OrtHardwareDeviceType.CPU and not d.is_virtual:
                return [self.api.create_ep_device(self, d)]
        return []

    def create_ep(self, devices: Sequence[OrtHardwareDevice], ep_metadata: Sequence[Mapping[str, str]],
                  session_options: Any, logger: logging.Logger) -> Ep:
        # ORT sizes the CPU EP's thread pool from intra_op_num_threads. Here numpy's BLAS gets n
        # threads for the products (its threads spin briefly between calls and take work in C,
        # where waking a Python pool thread costs as much as a small product), and the fused kernels' pool
        # gets n threads for large elementwise and depthwise work. If the BLAS is not OpenBLAS
        # (its threads cannot be set), the pool splits the products too. Both are process-wide.
        # 0 keeps the defaults: BLAS's own threads, serial fused kernels. Either way, each run takes
        # fewer BLAS threads while other processes hold the cores (LoadAwareBlasThreads).
        threads = int(getattr(session_options, "intra_op_num_threads", 0) or 0)
        default = startup_blas_threads()
        if threads > 0:
            from onnxhal.runtime.providers.cpu.kernels.blas_threads import set_blas_threads
            from onnxhal.runtime.providers.cpu.kernels.worker_pool import set_workers

            blas = set_blas_threads(threads)
            set_workers(threads, split_products=not blas)
        requested = threads or default
        adapt = os.environ.get("ONNXHAL_LOAD_AWARE_THREADS", "1") != "0"
        governor = (LoadAwareBlasThreads(requested) if adapt and requested and requested > 1 and get_blas_threads()
                    else None)
        return CpuEp(logger, getattr(session_options, "custom_ops", None), governor)
