"""``OpenCLEp``: the OpenCL EP at the hal contract, over the backend it holds (``backend.py``).

``get_capability`` claims the nodes the OpenCL kernels cover, by rules, fused into convex groups
(``EpGraphSupportInfo.convex_groups``); ``compile`` plans each group once and builds its programs.
A partition smaller than its launches and copies stays on the host (``cost_rule.py``; provider
option ``cost_rule=off`` claims it anyway).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from onnxhal.hal.ep import Ep, EpGraphSupportInfo, NodeComputeInfo
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl.backend import OpenCLBackend
from onnxhal.runtime.providers.opencl.cost_rule import DEFAULT_COST_DIM
from onnxhal.runtime.providers.opencl.device_context import OpenCLDeviceContext
from onnxhal.runtime.providers.opencl.dynamic_partition import DynamicNodeComputeInfo
from onnxhal.runtime.providers.opencl.memory import OpenCLAllocator
from onnxhal.runtime.providers.opencl.partition_plan import PartitionPlan

EP_NAME = "OpenCLExecutionProvider"


class OpenCLEp(Ep):
    name = EP_NAME
    runs_onnxhal_fused_ops = True  # op_support.FUSED_DOMAIN_OPS

    def __init__(self, device: OpenCLDeviceContext, allocator: OpenCLAllocator, logger: logging.Logger,
                 cost_rule: bool = True, disabled_fusions: frozenset[str] = frozenset(),
                 cost_dim: int = DEFAULT_COST_DIM) -> None:
        self.device = device
        self.allocator = allocator
        self.logger = logger
        self.backend = OpenCLBackend(EP_NAME, device, allocator, logger, disabled_fusions, cost_rule, host_islands=True,
                                     cost_dim=cost_dim)

    @property
    def declined(self) -> dict[str, str]:
        """Node name (or op) -> why this EP left it to the next one."""
        return self.backend.declined

    @property
    def compiled_plans(self) -> list[PartitionPlan]:
        """The plans of the compiled partitions of static shape (tests count their launches)."""
        return self.backend.compiled_plans

    def get_capability(self, graph: Graph, support_info: EpGraphSupportInfo) -> None:
        self.backend.claim(graph, support_info)

    def compile(self, graphs: Sequence[Graph], fused_nodes: Sequence[Node]) -> list[NodeComputeInfo]:
        return self.backend.compile(graphs, fused_nodes)

    @property
    def dynamic_partitions(self) -> dict[str, DynamicNodeComputeInfo]:
        """The partitions with symbolic dimensions, by fused node name: each one's shape cache and
        its hit/miss/host-run figures (``stats``), as the profiling trace reports them."""
        return self.backend.dynamic_partitions

    def profiling_step_args(self, node: Node | None, ep_name: str, inputs: list, outputs: list) -> dict:
        """For a partition with symbolic dimensions: its shape-specialisation cache figures."""
        return self.backend.profiling_step_args(node)
