"""Dropout (inference: identity) and Multinomial. The other random generators (RandomNormal,
RandomUniform, Bernoulli, ...) use onnx.reference: they have no reproducible expected values."""

from __future__ import annotations

import numpy as np
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("Dropout", since=1)
class Dropout(Kernel):
    """Inference Dropout: y = x, mask all true. Opset 12+ ``training_mode`` true goes to
    onnx.reference (random mask)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.with_mask = len(node.outputs) > 1 and bool(node.outputs[1])
        self.node, self.ctx = node, ctx
        self.legacy_mask = 0 < node.since_version < 10  # before opset 10 the mask has the input type
        self._ref = None

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        training = inputs[2] if len(inputs) > 2 else None
        if training is not None and bool(training.reshape(-1)[0]):
            if self._ref is None:  # built once; a concurrent first build is harmless
                from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

                self._ref = ReferenceKernel(self.node, self.ctx, self.node.since_version or 12)
            return self._ref.compute(inputs)
        if not self.with_mask:
            return [x]
        mask = np.ones(x.shape, dtype=x.dtype if self.legacy_mask else np.bool_)
        return [x, mask]


@register("Multinomial", since=7)
class Multinomial(Kernel):
    """Samples ``sample_size`` class indices per batch row from unnormalized log-probabilities."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.sample_size = node.attr("sample_size", 1)
        self.dtype = np.dtype(helper.tensor_dtype_to_np_dtype(node.attr("dtype", 6)))
        seed = node.attr("seed")
        self.seed = None if seed is None else int(seed)

    def compute(self, inputs: list) -> list:
        logits = inputs[0].astype(np.float64)
        rng = np.random.default_rng(self.seed)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        cdf = np.cumsum(p, axis=1)
        u = rng.random((logits.shape[0], self.sample_size))
        idx = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(axis=2), logits.shape[1] - 1)
        return [idx.astype(self.dtype)]
