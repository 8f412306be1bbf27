"""Dropout (inference: identity) and the random generators: RandomNormal, RandomUniform, their
``*Like`` forms, Bernoulli and Multinomial.

As in onnxruntime, each node draws from its own generator, created with the kernel and advancing
from run to run: seeded by the node's ``seed`` attribute, else by the seed ``set_seed`` gave (every
such node then starts from the same seed, as in onnxruntime), else by fresh OS entropy. The values
are numpy's (PCG64), not onnxruntime's: a seed reproduces onnxhal's own runs, not onnxruntime's.
"""

from __future__ import annotations

import threading

import numpy as np
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.registry import register

_GLOBAL_SEED: list[int | None] = [None]


def set_seed(seed: int) -> None:
    """onnxruntime's ``set_seed``: the seed of random nodes without a ``seed`` attribute in
    sessions created afterwards."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise InvalidArgument(f"set_seed: expected an int, got {seed!r}")
    _GLOBAL_SEED[0] = int(seed)


class _Random(Kernel):
    """A generator per node; a lock, since many threads may run the session at once."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        seed = node.attr("seed")
        if seed is not None:  # a float attribute: onnxruntime takes its integer part
            seed = int(seed)
        elif _GLOBAL_SEED[0] is not None:
            seed = _GLOBAL_SEED[0]
        self.rng = np.random.default_rng(None if seed is None else abs(seed))
        self.lock = threading.Lock()

    def _dtype(self, node: Node, default) -> np.dtype:
        code = node.attr("dtype")
        dtype = np.dtype(default) if code is None else np.dtype(helper.tensor_dtype_to_np_dtype(code))
        if dtype.kind != "f":
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: dtype {dtype}; the spec allows float16, "
                                  f"float32 and float64.")
        return dtype


class _Distribution(_Random):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.normal = node.op_type.startswith("RandomNormal")
        if self.normal:
            self.a, self.b = float(node.attr("mean", 0.0)), float(node.attr("scale", 1.0))
        else:
            self.a, self.b = float(node.attr("low", 0.0)), float(node.attr("high", 1.0))

    def _draw(self, shape: tuple, dtype: np.dtype) -> np.ndarray:
        with self.lock:
            if self.normal:
                values = self.rng.normal(self.a, self.b, size=shape)
            else:
                values = self.rng.uniform(self.a, self.b, size=shape)
        return values.astype(dtype)


@register("RandomNormal", since=1)
@register("RandomUniform", since=1)
class RandomDistribution(_Distribution):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        shape = node.attr("shape")
        if shape is None:
            raise InvalidArgument(f"{node.op_type} node {node.name!r} has no 'shape' attribute; the spec requires it.")
        self.shape = tuple(int(d) for d in shape)
        self.dtype = self._dtype(node, np.float32)

    def compute(self, inputs: list) -> list:
        return [self._draw(self.shape, self.dtype)]


@register("RandomNormalLike", since=1)
@register("RandomUniformLike", since=1)
class RandomDistributionLike(_Distribution):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.node = node
        self.dtype = self._dtype(node, np.float32) if node.attr("dtype") is not None else None

    def compute(self, inputs: list) -> list:
        x = inputs[0]  # no dtype attribute: the input's, which must be float
        return [self._draw(x.shape, self.dtype or self._dtype(self.node, x.dtype))]


@register("Bernoulli", since=15)
class Bernoulli(_Random):
    """1 with probability x, else 0, in ``dtype`` (default: the input's)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        code = node.attr("dtype")
        self.dtype = None if code is None else np.dtype(helper.tensor_dtype_to_np_dtype(code))

    def compute(self, inputs: list) -> list:
        p = inputs[0]
        with self.lock:
            u = self.rng.random(p.shape)
        return [(u < p).astype(self.dtype or p.dtype)]


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
class Multinomial(_Random):
    """Samples ``sample_size`` class indices per batch row from unnormalized log-probabilities."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.sample_size = node.attr("sample_size", 1)
        self.dtype = np.dtype(helper.tensor_dtype_to_np_dtype(node.attr("dtype", 6)))

    def compute(self, inputs: list) -> list:
        logits = inputs[0].astype(np.float64)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        cdf = np.cumsum(p, axis=1)
        with self.lock:
            u = self.rng.random((logits.shape[0], self.sample_size))
        idx = np.minimum((u[:, :, None] > cdf[:, None, :]).sum(axis=2), logits.shape[1] - 1)
        return [idx.astype(self.dtype)]
