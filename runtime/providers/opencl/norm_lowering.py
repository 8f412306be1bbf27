"""Lowering of the normalisations beyond LayerNormalization to one launch each: onnxruntime's
com.microsoft SkipLayerNormalization (onnxruntime-optimized BERT and GPT-2 exports) and ONNX
InstanceNormalization (wav2vec2's and conformer's feature extractors, RAFT). Their claim rules are
``op_support.check_skip_layernorm`` and ``check_instance_norm``; a mixin of ``PartitionPlanBuilder``."""

from __future__ import annotations

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.opencl.gemm_lowering import prod
from onnxhal.runtime.providers.opencl.norm_sources import INSTANCE_NORM_SOURCE, SKIP_LAYERNORM_SOURCE
from onnxhal.runtime.providers.opencl.partition_plan import Buf

I32, F = np.int32, np.float32


class NormLowering:
    """``_lower_SkipLayerNormalization`` and ``_lower_InstanceNormalization`` for the plan builder
    (which provides ``data``, ``output``, ``shape`` and ``plan``)."""

    def _lower_SkipLayerNormalization(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        h = xs[-1]
        rows = prod(xs[:-1])
        skip_rows = prod(self.shape(n.inputs[1])[:-1])
        if not skip_rows or rows % skip_rows:
            raise OrtNotImplemented(f"SkipLayerNormalization {n.name!r}: skip {list(self.shape(n.inputs[1]))} does not "
                                    f"repeat over input {list(xs)}")

        def optional(k: int) -> str | None:
            return self.data(n.inputs[k]) if len(n.inputs) > k and n.inputs[k] else None
        gamma, beta, bias = self.data(n.inputs[2]), optional(3), optional(4)
        out = self.output(n.outputs[0])
        total = self.output(n.outputs[3]) if len(n.outputs) > 3 and n.outputs[3] else out
        self.plan.add_launch_1d(SKIP_LAYERNORM_SOURCE, "skip_layernorm_rows", rows, [
            Buf(out), Buf(self.data(n.inputs[0])), Buf(self.data(n.inputs[1])), Buf(gamma), Buf(beta or gamma),
            Buf(bias or gamma), Buf(total), I32(skip_rows), I32(beta is not None), I32(bias is not None), I32(h),
            F(n.attr("epsilon", 1e-12))])

    def _lower_InstanceNormalization(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(INSTANCE_NORM_SOURCE, "instance_norm_rows", xs[0] * xs[1], [
            Buf(out), Buf(self.data(n.inputs[0])), Buf(self.data(n.inputs[1])), Buf(self.data(n.inputs[2])),
            I32(xs[1]), I32(prod(xs[2:])), F(n.attr("epsilon", 1e-5))])
