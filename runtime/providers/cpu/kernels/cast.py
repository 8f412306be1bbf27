"""Cast and CastLike: ``astype`` between plain numeric types; strings, float8/float4/int4/int2 and
saturating casts go through onnx.reference's conversion code (``cast_to``), which is the spec."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.graph import dtype_to_elem_type
from onnxhal.runtime.providers.cpu.kernels.registry import register

_PLAIN = frozenset("fiub")
_PLAIN_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT8,
                TensorProto.INT16, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8,
                TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64, TensorProto.BOOL}
_NP_PLAIN = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.float16, np.int8, np.int16, np.int32,
                                            np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))


def _cast_special(x: np.ndarray, to: int, saturate: bool, round_mode: str) -> np.ndarray:
    from onnx.reference.ops.op_cast import cast_to

    if x.dtype == object and to != TensorProto.STRING:
        # Strings parse as float64 first ("1e3", "NaN", "INF" all work), then convert.
        x = np.array([float(s) for s in x.reshape(-1)], dtype=np.float64).reshape(x.shape)
    if to == TensorProto.STRING and x.dtype.kind == "f" and x.dtype.itemsize < 4:
        x = x.astype(np.float32)
    r = cast_to(x, to, saturate, round_mode)
    if to == TensorProto.STRING:
        r = r.astype(object)
    return np.asarray(r)


class _CastBase(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.saturate = bool(node.attr("saturate", 1))
        self.round_mode = node.attr("round_mode", "up")

    def _cast(self, x: np.ndarray, to: int, dtype: np.dtype) -> np.ndarray:
        if x.dtype in _NP_PLAIN and to in _PLAIN_TYPES:
            return np.asarray(x.astype(dtype))
        if to == TensorProto.BFLOAT16 and x.dtype in _NP_PLAIN:
            return np.asarray(x.astype(dtype))
        if x.dtype.name == "bfloat16" and to in _PLAIN_TYPES:
            return np.asarray(x.astype(dtype))
        return _cast_special(x, to, self.saturate, self.round_mode)


@register("Cast", since=1)
class Cast(_CastBase):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        to = node.attr("to")
        if isinstance(to, str):  # opset 1 spelled the type as a string
            to = getattr(TensorProto, to.upper())
        self.to = int(to)
        self.dtype = np.dtype(object) if self.to == TensorProto.STRING else np.dtype(
            helper.tensor_dtype_to_np_dtype(self.to))

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.dtype == self.dtype:
            return x
        return self._cast(x, self.to, self.dtype)


@register("CastLike", since=15)
class CastLike(_CastBase):
    def compute(self, inputs: list) -> list:
        x, like = inputs[0], inputs[1]
        dtype = like.dtype
        if x.dtype == dtype:
            return [x]
        return [self._cast(x, dtype_to_elem_type(dtype), dtype)]
