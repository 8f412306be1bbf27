"""CPU kernels of the ``com.onnxhal`` ops the graph optimizer introduces (runtime/optimizer/fusions.py).

- ``FusedConv(X, W, B?, Z?)``: in fused_conv.py.
- ``FusedGemm(A, B, C?)``: Gemm then activation.
- ``FusedMatMul(X, W, bias?)``: X @ W + bias (X of any rank >= 2, W 2-D), then Relu or Gelu.
- ``FusedBatchNormalization(X, multiplier, shift)``: X * multiplier + shift per channel (axis 1),
  then activation: inference BatchNormalization with its statistics folded in by the optimizer.
- ``Gelu(X)``: x * Phi(x) to 4e-7 absolute (numerics' registered fast paths ``gelu_polynomial_inplace``
  and, for small arrays, ``gelu_table_inplace``).
- ``LayerNormalization``: the ONNX contract, for models whose opset predates the ONNX op.

``activation`` names the op ("" for none); ``activation_params`` holds its float attributes
(LeakyRelu alpha; Clip min, max; HardSigmoid alpha, beta). Two gated activations, x * f(x), come
from ``fuse_conv_gated_activation``: ``Swish`` (alpha: x * sigmoid(alpha x), SiLU at 1) and
``HardSwish`` (alpha, beta: x * HardSigmoid(x)).

Threads: blocked work and products are split over the worker pool of ``worker_pool.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels import worker_pool
from onnxhal.runtime.providers.cpu.kernels.clamp import clamp_
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.normalization import layer_norm
from onnxhal.runtime.providers.cpu.kernels.numerics import GELU_TABLE_MAX, gelu_polynomial_inplace, gelu_table_inplace
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.cpu.kernels.worker_pool import parallel_ranges

DOMAIN = "com.onnxhal"

#: Elements per block of blocked elementwise work (the Gelu epilogue: 23 passes, two temporaries).
#: Each pass is one ufunc call with a fixed cost besides its work, so larger blocks pay less of it
#: until the block and its temporaries (768 KB at 2^16) fall out of the near caches; 2^16 was the
#: fastest of 2^15, 2^16 and 2^17 on the encoder's Gelu.
BLOCK = 1 << 16
def _blocked(fn: Callable[[np.ndarray], None], y: np.ndarray) -> None:
    """Apply the in-place elementwise ``fn`` to ``y`` in cache-sized blocks, split between workers."""
    if not y.flags.c_contiguous and not y.flags.f_contiguous:  # reshape(-1) would copy, and fn write the copy
        dense = np.ascontiguousarray(y)
        _blocked(fn, dense)
        np.copyto(y, dense)
        return
    flat = y.reshape(-1, order="C" if y.flags.c_contiguous else "F")  # a view (a transposed input is F-ordered)
    n = flat.size

    def run(start: int, stop: int) -> None:
        for s in range(start, stop, BLOCK):
            fn(flat[s:min(s + BLOCK, stop)])

    parallel_ranges(n, run, work=n * 16)


def gelu_inplace(y: np.ndarray) -> None:
    """gelu on a float array in place: the table for small float32 arrays, else the polynomial,
    in cache-sized blocks when large."""
    if y.size <= GELU_TABLE_MAX and y.dtype == np.float32:
        gelu_table_inplace(y)
    elif y.size <= BLOCK and y.flags.c_contiguous:  # one block: no blocking loop, no pool check
        gelu_polynomial_inplace(y)
    else:
        _blocked(gelu_polynomial_inplace, y)


def gelu(x: np.ndarray, fresh: bool = False) -> np.ndarray:
    """gelu(x) as a new array; ``fresh``: x is the caller's own float array, computed in place."""
    if fresh and x.dtype.kind == "f" and x.flags.writeable and x.flags.c_contiguous:
        y = x
    else:
        y = np.array(x, dtype=x.dtype if x.dtype.kind == "f" else np.float32, copy=True)
    gelu_inplace(y)
    return y


#: The fused activations' other ways to run, against their numpy forms in ``_activation``.
ACTIVATION_PATHS = path_table("fused._activation", "the numpy epilogue of each activation in _activation")
ACTIVATION_PATHS.add("hard_swish_native", "HardSwish on a C-contiguous, writable float32 or float64 output, the C "
                                          "extension _native built, ONNXHAL_NATIVE_KERNELS not 0 and "
                                          "NATIVE_HARD_SWISH_ENABLED (read when a kernel is built): _native.hard_swish, "
                                          "numpy's four operations in one pass, rounded alike")
#: The switch of ``ACTIVATION_PATHS["hard_swish_native"]``: False keeps the numpy epilogue.
NATIVE_HARD_SWISH_ENABLED = True
_NATIVE_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))


def _activation(name: str, params: list[float], node: Node) -> Callable[[np.ndarray], None] | None:
    """In-place activation for a fused kernel, or None for no activation."""
    if name == "":
        return None
    if name == "Relu":
        return lambda y: clamp_(y, 0)
    if name == "Gelu":
        return gelu_inplace
    if name == "Tanh":
        return lambda y: np.tanh(y, out=y)
    if name == "Sigmoid":
        def sigmoid(y: np.ndarray) -> None:  # 0.5 (1 + tanh(y / 2)) cannot overflow
            y *= 0.5
            np.tanh(y, out=y)
            y += 1.0
            y *= 0.5
        return sigmoid
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return lambda y: np.multiply(y, alpha, out=y, where=y < 0)
    if name == "Clip":
        lo, hi = params
        return lambda y: clamp_(y, lo, hi)
    if name == "HardSigmoid":
        alpha, beta = params

        def hard_sigmoid(y: np.ndarray) -> None:
            y *= alpha
            y += beta
            clamp_(y, 0.0, 1.0)
        return hard_sigmoid
    if name == "Swish":
        (alpha,) = params

        def swish(y: np.ndarray) -> None:  # the Sigmoid kernel's 0.5 (1 + tanh(a y / 2)): no overflow
            t = np.multiply(y, 0.5 * alpha, dtype=y.dtype)
            np.tanh(t, out=t)
            t *= 0.5
            t += 0.5
            y *= t
        return swish
    if name == "HardSwish":
        alpha, beta = params
        native = native_module() if NATIVE_HARD_SWISH_ENABLED else None

        def hard_swish(y: np.ndarray) -> None:
            if native is not None and y.dtype in _NATIVE_FLOATS and y.flags.c_contiguous and y.flags.writeable:
                native.hard_swish(y, alpha, beta)  # ACTIVATION_PATHS["hard_swish_native"]
                return
            t = y * alpha
            t += beta
            clamp_(t, 0.0, 1.0)
            y *= t
        return hard_swish
    raise InvalidArgument(f"{node.op_type} node {node.name!r}: activation {name!r} is not supported; "
                          "use one of Relu, Gelu, Tanh, Sigmoid, LeakyRelu, Clip, HardSigmoid, Swish, HardSwish")


def writable(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``y`` if the kernel may overwrite it (a fresh, writable array of ``dtype``), else a copy."""
    if isinstance(y, np.ndarray) and y.dtype == dtype and y.flags.writeable and y.flags.c_contiguous:
        return y
    return np.array(y, dtype=dtype)


class FusedBase(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.act = _activation(node.attr("activation", ""), node.attr("activation_params", []), node)
        self.act_contiguous = node.attr("activation", "") == "Gelu"  # blocked over flat memory
        self.widen = half.WidenedInputs(node, ctx)


def _split_product(a: np.ndarray, b: np.ndarray, bias: np.ndarray | None, act: Callable[[np.ndarray], None] | None,
                   act_contiguous: bool) -> np.ndarray:
    """act(a @ b + bias) for 2-D a, b. Workers split the longer side of the output: columns when
    it is wider than tall (a small batch times wide weights keeps each GEMM efficient), else rows.
    Bias and the activation are applied per block; an activation that needs contiguous memory
    (``act_contiguous``) runs on the whole result instead when columns were split."""
    m, n = a.shape[0], b.shape[1]
    if m * a.shape[1] * n < worker_pool.PARALLEL_MIN_WORK:  # one block, inline: no closures or pool checks (they would outweigh a tiny model's product)
        y = np.matmul(a, b)
        if bias is not None:
            y += bias
        if act is not None:
            act(y)
        return y
    y = np.empty((m, n), dtype=np.result_type(a, b))
    by_columns = n > m and worker_pool.WORKERS > 1 and worker_pool.SPLIT_PRODUCTS
    bias2 = None if bias is None else bias.reshape(1, -1) if bias.ndim < 2 else bias
    block_act = None if by_columns and act_contiguous else act

    def block(r0: int, r1: int, c0: int, c1: int) -> None:
        out = y[r0:r1, c0:c1]
        np.matmul(a[r0:r1], b[:, c0:c1], out=out)
        if bias2 is not None:
            out += bias2[slice(None) if bias2.shape[0] == 1 else slice(r0, r1),  # broadcast axes stay whole
                         slice(None) if bias2.shape[1] == 1 else slice(c0, c1)]
        if block_act is not None:
            block_act(out)

    if by_columns:
        parallel_ranges(n, lambda c0, c1: block(0, m, c0, c1), work=m * a.shape[1] * n)
        if act is not None and block_act is None:
            act(y)
    else:
        parallel_ranges(m, lambda r0, r1: block(r0, r1, 0, n), work=m * a.shape[1] * n)
    return y


@register("FusedMatMul", since=1, domain=DOMAIN)
class FusedMatMul(FusedBase):
    """X @ W + bias then activation; X's leading dimensions are folded into rows."""

    def compute(self, inputs: list) -> list:
        x, w = inputs[0], inputs[1]
        if x.dtype is half.F16 and half.applies(x, w):
            return half.via_float32(self.compute, inputs, self.widen)
        bias = inputs[2] if len(inputs) > 2 else None
        x2 = x.reshape(-1, x.shape[-1])
        y = _split_product(x2, w, bias, self.act, self.act_contiguous)
        return [y.reshape(*x.shape[:-1], w.shape[1])]


@register("FusedGemm", since=1, domain=DOMAIN)
class FusedGemm(FusedBase):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.alpha = node.attr("alpha", 1.0)
        self.beta = node.attr("beta", 1.0)
        self.trans_a = bool(node.attr("transA", 0))
        self.trans_b = bool(node.attr("transB", 0))

    def compute(self, inputs: list) -> list:
        a, b = inputs[0], inputs[1]
        if a.dtype is half.F16 and half.applies(a, b):
            return half.via_float32(self.compute, inputs, self.widen)
        c = inputs[2] if len(inputs) > 2 else None
        a = a.T if self.trans_a else a
        b = b.T if self.trans_b else b
        if self.alpha == 1.0 and (c is None or self.beta == 1.0):
            return [_split_product(a, b, c, self.act, self.act_contiguous)]
        y = np.matmul(a, b)
        if self.alpha != 1.0:
            y *= self.alpha
        if c is not None and self.beta != 0.0:
            y += c if self.beta == 1.0 else self.beta * c
        if self.act is not None:
            self.act(y)
        return [y]


@register("FusedBatchNormalization", since=1, domain=DOMAIN)
class FusedBatchNormalization(FusedBase):
    def compute(self, inputs: list) -> list:
        x, multiplier, shift = inputs[0], inputs[1], inputs[2]
        channel = (1, -1) + (1,) * (x.ndim - 2)
        y = np.multiply(x, multiplier.reshape(channel), dtype=x.dtype)
        y += shift.reshape(channel)
        if self.act is not None:
            self.act(y)
        return [y]


@register("Gelu", since=1, domain=DOMAIN)
class Gelu(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        pass

    def compute(self, inputs: list) -> list:
        return [gelu(inputs[0])]


@register("LayerNormalization", since=1, domain=DOMAIN)
class LayerNormalization(Kernel):
    """ONNX LayerNormalization (opset 17 contract, ``normalization.layer_norm``) for models whose
    opset predates the ONNX op, any float input type computed in ``stash_type``."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", -1)
        self.epsilon = node.attr("epsilon", 1e-5)
        self.stash = onnx.helper.tensor_dtype_to_np_dtype(node.attr("stash_type", onnx.TensorProto.FLOAT))
        self.n_outputs = len(node.outputs)

    def compute(self, inputs: list) -> list:
        bias = inputs[2] if len(inputs) > 2 else None
        return list(layer_norm(inputs[0], inputs[1], bias, self.axis, self.epsilon, self.stash,
                               self.n_outputs > 1)[: self.n_outputs])


@register("ReplaceNaN", since=1, domain=DOMAIN)
class ReplaceNaN(Kernel):
    """Where(IsNaN(x), value, x) in one pass (runtime/opt_fusions.fuse_replace_nan)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.value = float(node.attr("value", 0.0))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [np.where(np.isnan(x), np.asarray(self.value, x.dtype), x)]
