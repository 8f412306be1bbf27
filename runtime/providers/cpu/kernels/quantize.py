"""DynamicQuantizeLinear: float32 to uint8 with a scale and zero point computed from the data."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.registry import register


@register("DynamicQuantizeLinear", since=11)
class DynamicQuantizeLinear(Kernel):
    """The spec's formula. Where it divides by zero (every value 0, or no value at all) the scale
    is 1, as onnxruntime (onnx.reference gives 1/255 for all zeros and fails on an empty input:
    numpy's max of nothing); the quantized values are 0 either way."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        hi = np.float32(max(0.0, float(x.max()))) if x.size else np.float32(0)
        lo = np.float32(min(0.0, float(x.min()))) if x.size else np.float32(0)
        scale = np.float32(1.0) if hi == lo else (hi - lo) / np.float32(255)
        zero = np.float32(np.rint(np.clip(-lo / scale, 0, 255)))
        y = np.clip(np.rint(x / scale) + zero, 0, 255).astype(np.uint8)
        return [y, np.array(scale, dtype=np.float32), np.array(zero, dtype=np.uint8)]
