"""NHWC versions of the layout-sensitive ops (ORT's ``com.ms.internal.nhwc`` domain).

The layout transformer creates them only for EPs that prefer NHWC; the CPU EP runs them when such
a node falls back to it (a declined group, a failed compile): it transposes the data inputs to
NCHW, runs the ordinary kernel and transposes the outputs back.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.optimizer.layout_transform import LAYOUT_SENSITIVE, NHWC_DOMAIN, TO_NCHW, TO_NHWC, original_domain
from onnxhal.runtime.providers.cpu.kernels.registry import register


class NhwcWrapper(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel

        domain = original_domain(node)
        twin = Node(node.op_type, node.inputs, node.outputs, name=node.name, domain=domain,
                    attribute_protos=list(node.attribute_protos.values()))
        twin.since_version = node.since_version
        self.inner = create_cpu_kernel(twin, ctx)
        self.data_in, self.data_out = LAYOUT_SENSITIVE[(domain, node.op_type)]

    def compute(self, inputs: list) -> list:
        args = list(inputs)
        for i in self.data_in:
            if i < len(args) and args[i] is not None:
                args[i] = np.ascontiguousarray(args[i].transpose(TO_NCHW))
        outs = list(self.inner.compute(args))
        for i in self.data_out:
            outs[i] = np.ascontiguousarray(outs[i].transpose(TO_NHWC))
        return outs


for _domain, _op in LAYOUT_SENSITIVE:
    register(_op, since=1, domain=NHWC_DOMAIN)(NhwcWrapper)
