"""Reductions (ReduceSum/Mean/Max/Min/Prod/L1/L2/LogSum/LogSumExp/SumSquare) and ArgMax/ArgMin.

``axes`` is an attribute before the opset where it became an input (13 for ReduceSum, 18 for the
others). Reductions over an empty set follow onnx.reference (delegated to it).
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register

LOGSUMEXP_PATHS = path_table("ReduceLogSumExp", "numpy_shifted: _logsumexp, the maximum, exp of the shifted "
                                                "values, their sum and log in numpy (about 9 calls)")
NUMPY_SHIFTED = LOGSUMEXP_PATHS.add("numpy_shifted", "canonical: other types, axes other than the last alone, "
                                                     "a row with NaN or +inf or of -inf alone, no C module")
NATIVE_ROWS = LOGSUMEXP_PATHS.add(
    "native_rows", "the C extension _native is built, ONNXHAL_NATIVE_KERNELS is not 0 and NATIVE_LOGSUMEXP_ENABLED "
                   "at kernel build and at the run, a C-contiguous float32 input reduced over its last axis alone "
                   "(rank >= 1, rows of at least 1): one C pass (_native.logsumexp_rows: the shifted exp as "
                   "softmax_native's polynomial, sum, log and shift in float64); declines where a row holds a NaN "
                   "or +inf or is -inf throughout")
#: switch of ``native_rows`` (read when the kernel is made and at each run)
NATIVE_LOGSUMEXP_ENABLED = True
_F32 = np.dtype(np.float32)

_asarray = np.asarray
# np.sum/max/min/prod of an ndarray call these reductions after a Python wrapper (as much as a
# Scan body's whole node on small inputs); called directly, the same loops give the same results.
_sum = np.add.reduce


def _mean(x, axis, keepdims):
    """np.mean's result (float32 sums for float32, float64 for integers) without its Python
    wrapper: 4.5 against 1.5 us on a T5 RMS norm's 24 rows of 32."""
    s = _sum(x, axis=axis, keepdims=keepdims, dtype=np.float64 if x.dtype.kind in "iub" else None)
    n = x.size // s.size
    if type(s) is np.ndarray:
        return np.true_divide(s, n, out=s)
    return s / n


def _sumsq(x, axis, keepdims):
    return _sum(x * x, axis=axis, keepdims=keepdims)


def _l1(x, axis, keepdims):
    return _sum(np.abs(x), axis=axis, keepdims=keepdims)


def _l2(x, axis, keepdims):
    return np.sqrt(_sum(x * x, axis=axis, keepdims=keepdims))


def _logsum(x, axis, keepdims):
    return np.log(_sum(x, axis=axis, keepdims=keepdims))


def _logsumexp(x, axis, keepdims):
    """log(sum(exp(x - m))) + m, m the maximum (0 where it is not finite): the reductions called
    directly and the steps in place (np.max and np.sum add a Python wrapper each, which costs
    more than the arithmetic on a few rows: GaussianNB's [16, 3] log-likelihoods)."""
    m = np.maximum.reduce(x, axis=axis, keepdims=True)
    finite = np.isfinite(m)
    if np.count_nonzero(finite) != m.size:  # a row of infinities or with a NaN: no shift
        m = np.where(finite, m, 0)
    e = np.asarray(np.subtract(x, m))  # a 0-d input's difference is a scalar, which out= cannot take
    if e.dtype.kind == "f":
        np.exp(e, out=e)
    else:  # integers: exp gives floats
        e = np.exp(e)
    r = np.asarray(_sum(e, axis=axis, keepdims=True))
    np.log(r, out=r)
    np.add(r, m, out=r)
    return r if keepdims else np.squeeze(r, axis=axis)


_FUNCS = {"ReduceSum": _sum, "ReduceMean": _mean, "ReduceMax": np.maximum.reduce, "ReduceMin": np.minimum.reduce,
          "ReduceProd": np.multiply.reduce, "ReduceSumSquare": _sumsq, "ReduceL1": _l1, "ReduceL2": _l2,
          "ReduceLogSum": _logsum, "ReduceLogSumExp": _logsumexp}
_AXES_INPUT_SINCE = {"ReduceSum": 13}


class Reduce(Kernel):
    """One reduction; ``axes_from_input`` selects the opset signature."""

    fn = None
    axes_from_input = False

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        # Only 1 keeps the reduced axes (onnx's shape inference and onnxruntime: keepdims == 1).
        self.keepdims = node.attr("keepdims", 1) == 1
        self.native = native_module() if node.op_type == "ReduceLogSumExp" and NATIVE_LOGSUMEXP_ENABLED else None
        self.last_path = ""  #: ReduceLogSumExp: the LOGSUMEXP_PATHS path of the last run (tests read it)
        self.noop = bool(node.attr("noop_with_empty_axes", 0))
        axes = node.attr("axes")
        self.axes = tuple(axes) if axes else None
        self.node = node
        self.ctx = ctx
        self._ref = None

    def _reference(self):
        if self._ref is None:  # built at most once; a race builds two equal objects, harmless
            from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

            self._ref = ReferenceKernel(self.node, self.ctx, self.node.since_version or 18)
        return self._ref

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        axes = self.axes
        if self.axes_from_input:
            a = inputs[1] if len(inputs) > 1 else None
            axes = tuple(a.tolist()) if a is not None and a.size else None
            if axes is None and self.noop:
                # No reduction, but the elementwise part stays (ReduceSumSquare gives x * x, ReduceL1
                # |x|), as onnx.reference and onnxruntime compute it: numpy reduces over no axis.
                axes = ()
        if x.size == 0 or x.dtype.kind not in "fiub":
            return self._reference().compute(inputs)
        if self.native is not None:
            r = self._native_rows(x, axes)
            if r is not None:
                return [r]
            self.last_path = NUMPY_SHIFTED
        if x.dtype == np.float16:  # accumulate in float32, as onnxruntime: a float16 sum or product
            x = x.astype(np.float32)  # overflows or loses its low terms long before the result does
        r = self.fn(x, axis=axes, keepdims=self.keepdims)
        if r.dtype != inputs[0].dtype:
            r = r.astype(inputs[0].dtype)
        return [r if type(r) is np.ndarray else _asarray(r)]


    def _native_rows(self, x: np.ndarray, axes: tuple | None) -> np.ndarray | None:
        """ReduceLogSumExp's path ``native_rows``: the result, or None where it does not apply or declines."""
        nd = x.ndim
        if (not NATIVE_LOGSUMEXP_ENABLED or x.dtype != _F32 or nd == 0 or not x.flags.c_contiguous
                or axes is None and nd != 1 or axes is not None and (len(axes) != 1 or axes[0] % nd != nd - 1)):
            return None
        y = np.empty(x.shape[:-1] + ((1,) if self.keepdims else ()), _F32)
        if not self.native.logsumexp_rows(x, y, x.shape[-1]):
            return None
        self.last_path = NATIVE_ROWS
        return y


for _op, _fn in _FUNCS.items():
    _attr_cls = type(_op, (Reduce,), {"fn": staticmethod(_fn), "__doc__": f"ONNX {_op} (axes attribute)."})
    register(_op, since=1)(_attr_cls)
    _in_cls = type(_op, (Reduce,), {"fn": staticmethod(_fn), "axes_from_input": True,
                                    "__doc__": f"ONNX {_op} (axes input)."})
    register(_op, since=_AXES_INPUT_SINCE.get(_op, 18))(_in_cls)


class _Arg(Kernel):
    fn = None

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.op = node.op_type
        self.axis = node.attr("axis", 0)
        # Only 1 keeps the reduced axes (onnx's shape inference and onnxruntime: keepdims == 1).
        self.keepdims = node.attr("keepdims", 1) == 1
        self.last = bool(node.attr("select_last_index", 0))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.__class__ is not np.ndarray:  # fn is an ndarray method
            x = np.asarray(x)
        axis = self.axis
        if x.ndim and x.shape[axis] == 0:
            rest = x.shape[:axis % x.ndim] + ((1,) if self.keepdims else ()) + x.shape[axis % x.ndim + 1:]
            if 0 in rest:  # no output element needs an index
                return [np.empty(rest, np.int64)]
            # onnxruntime refuses it too; numpy's message names no axis
            raise InvalidArgument(f"{self.op} over axis {axis} of input shape {list(x.shape)}: the axis is empty, so "
                                  "there is no index to return. Feed an input whose dimension on that axis is at least 1.")
        if self.last:
            n = x.shape[axis]
            r = n - 1 - self.fn(np.flip(x, axis), axis=axis)
        elif x.ndim:
            r = self.fn(x, axis=axis, keepdims=self.keepdims)
            return [r if r.dtype == np.int64 else r.astype(np.int64)]
        else:
            r = self.fn(x, axis=axis)
        r = np.asarray(r, dtype=np.int64)
        if self.keepdims:
            r = np.expand_dims(r, axis)
        return [r]


# ndarray's methods: np.argmax / np.argmin are Python wrappers of them, costly on a few rows
register("ArgMax", since=1)(type("ArgMax", (_Arg,), {"fn": staticmethod(np.ndarray.argmax)}))
register("ArgMin", since=1)(type("ArgMin", (_Arg,), {"fn": staticmethod(np.ndarray.argmin)}))
