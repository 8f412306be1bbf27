"""BatchNormalization (inference), LayerNormalization, Softmax, LogSoftmax.

Training-mode BatchNormalization from opset 14 runs here (the batch's statistics, the running
ones updated); before opset 14 (training told by the output count), the ``spatial=0`` form and
non-float32 LayerNormalization go to onnx.reference.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.clamp import constant
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.numerics import (
    log_softmax,
    row_sums,
    softmax,
    softmax_max_free,
    softmax_native,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register
from onnxhal.runtime.providers.path_tables import path_table


def _reference(node: Node, ctx: KernelCreateContext, default_version: int):
    from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

    return ReferenceKernel(node, ctx, node.since_version or default_version)


@register("BatchNormalization", since=1)
class BatchNormalization(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.eps = node.attr("epsilon", 1e-5)
        self.momentum = node.attr("momentum", 0.9)
        outputs = len([o for o in node.outputs if o])
        # opset 14+: training_mode says it (outputs Y, running mean, running var); before, the
        # output count did, with saved statistics besides (onnx.reference keeps that form)
        self.training = bool(node.attr("training_mode", 0)) and (node.since_version or 15) >= 14
        legacy = node.attr("spatial", 1) == 0 or (outputs > 1 and not self.training)
        self.ref = _reference(node, ctx, 15) if legacy else None

    def compute(self, inputs: list) -> list:
        if self.ref is not None:
            return self.ref.compute(inputs)
        x, scale, bias, mean, var = inputs[:5]
        if self.training:
            return self._train(x, scale, bias, mean, var)
        check_per_channel("BatchNormalization", x, zip(("scale", "B", "input_mean", "input_var"), inputs[1:5]))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        inv = scale / np.sqrt(var + var.dtype.type(self.eps))
        shift = bias - mean * inv
        y = x * inv.reshape(shape).astype(x.dtype, copy=False)
        y += shift.reshape(shape).astype(x.dtype, copy=False)
        return [y]

    def _train(self, x: np.ndarray, scale, bias, mean, var) -> list:
        """Normalized by the batch's own mean and (population) variance per channel, as the spec's
        function body; the running statistics blended with them by ``momentum``. Statistics in
        float64 (NFNet's weight standardisation runs this over each conv's weights), cast back."""
        if x.ndim < 2:
            raise InvalidArgument(f"BatchNormalization: X has shape {list(x.shape)}; training mode needs "
                                  "[N, C, ...] (rank 2 or more). Give the input its channel axis.")
        check_per_channel("BatchNormalization", x, zip(("scale", "B", "input_mean", "input_var"),
                                                       (scale, bias, mean, var)))
        axes = (0, *range(2, x.ndim))
        batch_mean = x.mean(axis=axes, dtype=np.float64)
        centered = x - batch_mean.reshape((1, -1) + (1,) * (x.ndim - 2)).astype(x.dtype)
        batch_var = np.square(centered, dtype=np.float64).mean(axis=axes)
        shape = (1, -1) + (1,) * (x.ndim - 2)
        inv = scale.astype(np.float64) / np.sqrt(batch_var + self.eps)
        y = centered * inv.reshape(shape).astype(x.dtype)
        y += bias.reshape(shape).astype(x.dtype, copy=False)
        running_mean = (mean * self.momentum + batch_mean * (1 - self.momentum)).astype(mean.dtype)
        running_var = (var * self.momentum + batch_var * (1 - self.momentum)).astype(var.dtype)
        return [y, running_mean, running_var]


def check_per_channel(op: str, x: np.ndarray, params) -> None:
    """Each (name, array) in ``params`` must hold one value per channel of ``x`` (axis 1): numpy
    would broadcast a length-1 array over every channel, or fail with a message naming nothing."""
    c = x.shape[1] if x.ndim > 1 else 1
    for name, a in params:
        if a is not None and a.shape != (c,):
            raise InvalidArgument(f"{op}: input {name!r} has shape {list(a.shape)}, expected [{c}]: one value per "
                                  f"channel of X {list(x.shape)}. Give it the channel count of the input.")


#: InstanceNormalization's other way to run, against its numpy form.
INSTANCE_NORM_PATHS = path_table("InstanceNormalization", "InstanceNormalization.compute's numpy passes (mean, "
                                                          "variance, scale and shift per sample and channel)")
INSTANCE_NORM_PATHS.add("native_channel_rows", "float32, C-contiguous, scale and B float32, at most "
                                               "NATIVE_INSTANCE_NORM_MAX values, the C extension _native built, "
                                               "ONNXHAL_NATIVE_KERNELS not 0 and NATIVE_INSTANCE_NORM_ENABLED (read "
                                               "at each call): each (sample, channel) plane a row of "
                                               "_native.layer_norm (float64 statistics, scale 1), then the "
                                               "channels' scale and shift: 3 calls where numpy makes about ten")
#: The switch of ``INSTANCE_NORM_PATHS["native_channel_rows"]``: False keeps the numpy form.
NATIVE_INSTANCE_NORM_ENABLED = True
#: The most values ``native_channel_rows`` takes: past it numpy's vectorized passes win over the
#: C loop's serial double sums (native against numpy, load 3.3: 2x4x1024 14 / 24 us, 1x16x64x64
#: 115 / 136, 1x32x64x64 163 / 146, 1x32x128x128 483 / 385).
NATIVE_INSTANCE_NORM_MAX = 1 << 16


@register("InstanceNormalization", since=1)
class InstanceNormalization(Kernel):
    """(x - mean) / sqrt(var + epsilon) * scale + B per sample and channel over the spatial axes;
    float16 computed in float32 (as onnxruntime). GroupNorm exports (pt_unet: 15 nodes of 1-16k
    values) spend their time in numpy's per-call cost, so float32 ones take ``native_channel_rows``."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.eps = node.attr("epsilon", 1e-5)
        self.last_path: str | None = None  #: "native_channel_rows" or None (the numpy form) for the last run

    def compute(self, inputs: list) -> list:
        x, scale, bias = inputs[:3]
        if x.ndim < 3:
            raise InvalidArgument(f"InstanceNormalization: X has shape {list(x.shape)}; it needs (N, C, D1, ...), "
                                  "at least one spatial axis.")
        check_per_channel("InstanceNormalization", x, (("scale", scale), ("B", bias)))
        if x.size == 0:
            return [np.empty_like(x)]
        native = native_module() if NATIVE_INSTANCE_NORM_ENABLED else None
        n, c = x.shape[:2]
        plane = x.size // (n * c)
        if native is not None and x.dtype == _F32 and x.flags.c_contiguous and scale.dtype == _F32 \
                and bias.dtype == _F32 and x.size <= NATIVE_INSTANCE_NORM_MAX:
            self.last_path = "native_channel_rows"
            y = np.empty(x.shape, _F32)
            mean, inv_std = np.empty(n * c), np.empty(n * c)  # written by the call, not read
            native.layer_norm(x, constant(1.0, _F32, plane), None, y, mean, inv_std, self.eps)
            rows = y.reshape(n, c, plane)
            rows *= scale.reshape(1, c, 1)
            rows += bias.reshape(1, c, 1)
            return [y]
        self.last_path = None
        work = np.promote_types(x.dtype, np.float32)
        xs = x.astype(work, copy=False)
        axes = tuple(range(2, x.ndim))
        shape = (1, -1) + (1,) * (x.ndim - 2)
        mean = xs.mean(axis=axes, keepdims=True)
        d = xs - mean
        var = np.square(d).mean(axis=axes, keepdims=True)
        d *= (1.0 / np.sqrt(var + work.type(self.eps))) * scale.astype(work).reshape(shape)
        d += bias.astype(work).reshape(shape)
        return [d.astype(x.dtype, copy=False)]


@register("LpNormalization", since=1)
class LpNormalization(Kernel):
    """x / ||x||_p along ``axis`` (p = 1: the sum of |x|; p = 2: the Euclidean norm); a zero norm
    gives 0, as onnxruntime. (onnx.reference's p = 1 divides by the plain sum: -1 came out 1.)"""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", -1)
        self.p = node.attr("p", 2)
        if self.p not in (1, 2):
            raise InvalidArgument(f"LpNormalization node {node.name!r}: p = {self.p}; the spec allows 1 or 2.")

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if self.p == 1:
            norm = np.abs(x).sum(axis=self.axis, keepdims=True)
        else:
            norm = np.sqrt(np.square(x).sum(axis=self.axis, keepdims=True))
        zero = norm == 0
        y = x / np.where(zero, 1, norm).astype(x.dtype, copy=False)
        if zero.any():
            y = np.where(zero, x.dtype.type(0), y)
        return [np.asarray(y, dtype=x.dtype)]


#: ``layer_norm``'s other ways to run, against its numpy forms.
LAYER_NORM_PATHS = path_table("normalization.layer_norm", "_layer_norm_small's float64 numpy passes (and the "
                                                          "float32 ones of larger inputs)")
LAYER_NORM_PATHS.add("native_small_rows", "fewer than 4096 float32 values, C-contiguous, stash type float32, scale "
                                          "(and bias) float32 of the normalized axes' shape, the C extension "
                                          "_native built, ONNXHAL_NATIVE_KERNELS not 0 and "
                                          "NATIVE_LAYER_NORM_ENABLED (read at each call): _native.layer_norm, the "
                                          "same float64 statistics (four partial sums a row) and float32 "
                                          "epilogue, one call where numpy makes about ten")
#: The switch of ``LAYER_NORM_PATHS["native_small_rows"]``: False keeps the numpy form.
NATIVE_LAYER_NORM_ENABLED = True


def layer_norm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int, epsilon: float,
               stash: np.dtype, stats: bool = True) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """ONNX LayerNormalization (the opset-17 contract) over axes [axis, rank): (Y, Mean,
    InvStdDev), the statistics computed and returned in ``stash``'s dtype, Y in x's (``stats``
    False: a caller that reads Y alone, the statistics may come back as None). Shared by the
    ONNX op and the ``com.onnxhal`` op the optimizer fuses for models older than opset 17.

    Those axes of a C-contiguous input are rows of one length n, so on inputs of 4096 elements or
    more the means come from BLAS row sums (``row_sums``): BERT's 128x768, 0.12 against 0.18 ms
    for numpy's mean, which runs one reduction loop per row."""
    axis = axis + x.ndim if axis < 0 else axis
    xs = x.astype(stash, copy=False)
    stat_shape = x.shape[:axis] + (1,) * (x.ndim - axis)
    if xs.size < 4096 and xs.dtype.char in "fd" and xs.size:
        return _layer_norm_small(x, xs, scale, bias, axis, epsilon, stat_shape, stats)
    if xs.flags.c_contiguous and xs.size >= 4096 and xs.dtype.char in "fd":
        n = math.prod(x.shape[axis:])
        scale_n = xs.dtype.type(1.0 / n)
        mean = (row_sums(xs.reshape(-1, n)) * scale_n).reshape(stat_shape)
        d = xs - mean
        var = (row_sums(np.square(d).reshape(-1, n)) * scale_n).reshape(stat_shape)
        if (np.square(mean) > var).any():  # |mean| > spread, without a square root per row
            # A row whose mean outweighs its spread loses digits in the BLAS sum (2e-4 after
            # normalizing 6,144 values near 100, onnxruntime 1.5e-5): correct it by the mean of
            # the differences, which that sum leaves exact enough (the two-pass corrected algorithm).
            corr = (row_sums(d.reshape(-1, n)) * scale_n).reshape(stat_shape)
            d -= corr
            mean += corr
            var -= corr * corr
    else:
        axes = tuple(range(axis, x.ndim))
        mean = xs.mean(axis=axes, keepdims=True)
        d = xs - mean
        var = np.square(d).mean(axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + xs.dtype.type(epsilon))
    d *= inv_std
    y = d.astype(x.dtype, copy=False)
    y *= scale
    if bias is not None:
        y += bias
    return y, mean, inv_std


def _layer_norm_small(x: np.ndarray, xs: np.ndarray, scale: np.ndarray, bias: np.ndarray | None, axis: int,
                      epsilon: float, stat_shape: tuple,
                      stats: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``layer_norm`` on fewer than 4096 elements: the statistics and the normalization in float64
    through BLAS products with a column of 1/n (``constant``), the fewest numpy calls (a tiny model's 24 rows of
    32: 7.7 against 9.9 us for float32 reductions, 11.6 for numpy's mean), exact to 6e-7 whatever
    the rows' offset from zero (float32 sums gave 2e-5 at an offset of 100 and 2e-3 at 1e4)."""
    native = native_module() if NATIVE_LAYER_NORM_ENABLED else None
    if native is not None and xs is x and x.dtype == _F32 and x.flags.c_contiguous and _rows_operand(scale, x, axis) \
            and (bias is None or _rows_operand(bias, x, axis)):
        y = np.empty(x.shape, _F32)
        rows = x.size // math.prod(x.shape[axis:])
        mean, inv_std = np.empty(rows), np.empty(rows)
        native.layer_norm(x, scale, bias, y, mean, inv_std, epsilon)  # LAYER_NORM_PATHS["native_small_rows"]
        if not stats:
            return y, None, None
        return y, mean.reshape(stat_shape).astype(_F32), inv_std.reshape(stat_shape).astype(_F32)
    n = math.prod(x.shape[axis:])
    rows = xs.reshape(-1, n).astype(np.float64)
    mean_col = constant(1.0 / n, _FLOAT64, n)[:, None]
    mean = np.dot(rows, mean_col)
    d = rows - mean
    inv_std = np.dot(d * d, mean_col)
    inv_std += epsilon
    np.sqrt(inv_std, out=inv_std)
    np.divide(1.0, inv_std, out=inv_std)
    d *= inv_std
    y = d.reshape(x.shape).astype(x.dtype)
    y *= scale
    if bias is not None:
        y += bias
    if not stats:
        return y, None, None
    stash = xs.dtype
    return y, mean.reshape(stat_shape).astype(stash, copy=False), inv_std.reshape(stat_shape).astype(stash, copy=False)


_FLOAT64 = np.dtype(np.float64)


def _rows_operand(v: np.ndarray, x: np.ndarray, axis: int) -> bool:
    """Whether scale or bias ``v`` is one C-contiguous float32 row of the normalized axes' shape
    (what broadcasting it over x's rows reads)."""
    return v.__class__ is np.ndarray and v.dtype == _F32 and v.shape == x.shape[axis:] and v.flags.c_contiguous


@register("LayerNormalization", since=17)
class LayerNormalization(Kernel):
    """Float inputs through ``layer_norm``; bfloat16 through onnx.reference."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", -1)
        self.eps = node.attr("epsilon", 1e-5)
        self.stash = onnx.helper.tensor_dtype_to_np_dtype(node.attr("stash_type", onnx.TensorProto.FLOAT))
        self.n_out = len(node.outputs)
        self.node, self.ctx = node, ctx
        self._ref = None

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.dtype.kind != "f":
            if self._ref is None:  # built once; a concurrent first build is harmless
                self._ref = _reference(self.node, self.ctx, 17)
            return self._ref.compute(inputs)
        bias = inputs[2] if len(inputs) > 2 else None
        # float64 is normalized in float64 and float16 in float32 (the stash type); Mean and
        # InvStdDev come out in the stash type whatever the input, as onnxruntime's
        work = x.dtype if x.dtype == self.stash else np.promote_types(x.dtype, self.stash)
        y, mean, inv_std = layer_norm(x, inputs[1], bias, self.axis, self.eps, work, self.n_out > 1)
        if self.n_out == 1:
            return [y]
        return [y, mean.astype(self.stash, copy=False), inv_std.astype(self.stash, copy=False)][: self.n_out]


_F32 = np.dtype(np.float32)


class _SoftmaxBase(Kernel):
    log = False

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = node.attr("axis", self.default_axis)

    def _along(self, x: np.ndarray, axis: int) -> np.ndarray:
        if self.log:
            return log_softmax(x, axis)
        if x.dtype == _F32 and x.ndim and axis in (-1, x.ndim - 1) and x.flags.c_contiguous and x.size:
            y = softmax_native(x)
            if y is None and x.shape[-1] >= 8:
                y = softmax_max_free(x)
            if y is not None:
                return y
        return softmax(x, axis)


class _Softmax13(_SoftmaxBase):
    default_axis = -1

    def compute(self, inputs: list) -> list:
        return [self._along(inputs[0], self.axis)]


class _SoftmaxCoerced(_SoftmaxBase):
    """Opset < 13: the input is coerced to 2-D at ``axis`` and normalized over the second axis."""

    default_axis = 1

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.size == 0:
            return [x.copy()]
        if x.ndim == 0:
            return [self._along(x.reshape(1, 1), 1).reshape(())]
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        outer = math.prod(x.shape[:axis])
        return [self._along(x.reshape(outer, -1), 1).reshape(x.shape)]


register("Softmax", since=1)(type("Softmax", (_SoftmaxCoerced,), {}))
register("Softmax", since=13)(type("Softmax", (_Softmax13,), {}))
register("LogSoftmax", since=1)(type("LogSoftmax", (_SoftmaxCoerced,), {"log": True}))
register("LogSoftmax", since=13)(type("LogSoftmax", (_Softmax13,), {"log": True}))


@register("LRN", since=1)
class LRN(Kernel):
    """Local response normalization across channels, as the ONNX spec (and onnxruntime) define it:
    square_sum[n, c] sums X[n, i]^2 for i in [c - floor((size-1)/2), c + ceil((size-1)/2)].
    (onnx.reference's LRN does not follow this for every shape, so it is not used as the fallback.)"""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.size = int(node.attr("size"))
        self.alpha = float(node.attr("alpha", 1e-4))
        self.beta = float(node.attr("beta", 0.75))
        self.bias = float(node.attr("bias", 1.0))
        self.before = (self.size - 1) // 2
        self.after = self.size - 1 - self.before

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        sq = np.square(x, dtype=np.float32 if x.dtype.itemsize < 4 else x.dtype)
        # A running sum over channels: window sums from one cumulative sum along axis 1.
        pad = [(0, 0)] * x.ndim
        pad[1] = (self.before + 1, self.after)
        cs = np.cumsum(np.pad(sq, pad), axis=1)
        c = x.shape[1]
        window = cs[:, self.size:self.size + c] - cs[:, 0:c]
        scale = (self.bias + (self.alpha / self.size) * window) ** self.beta
        return [(x / scale).astype(x.dtype, copy=False)]
