"""What the ai.onnx.ml kernels share, written as onnxruntime computes it (``ml_common.h``): the
post transforms of scores, the SVM kernels, and the fallback to onnx.reference for the forms the
native kernels leave to it."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.numerics import erf_inv_ort, softmax_rows_into

TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")

ML = "ai.onnx.ml"  # the domain of the classic-ML operators


def attr_floats(node: Node, name: str, default: list | None = None) -> np.ndarray:
    """A floats attribute as a float32 array (``default``'s values where the node has none; an
    attribute without a default is required). Read through ``Node.attr_array``: an SVM's support
    vectors or a linear model's coefficients (hundreds to thousands of values) come from the
    attribute's protobuf field in C, where ``np.asarray`` of the parsed list converts one Python
    float at a time (about 20 ns a value)."""
    values = node.attr_array(name, np.float32)
    if values is not None:
        return values
    value = node.attr(name, default)
    if value is None:
        raise InvalidArgument(f"{node.op_type} node {node.name!r}: attribute {name!r} is missing; the model "
                              f"must give it (re-export the model).")
    return np.asarray(value, np.float32).reshape(-1)


def post_transform_name(node: Node) -> str:
    name = node.attr("post_transform", "NONE")
    if name not in TRANSFORMS:
        raise InvalidArgument(f"{node.op_type} node {node.name!r}: post_transform {name!r} is none of {TRANSFORMS}. "
                              "Fix the attribute.")
    return name


def logistic(x: np.ndarray) -> np.ndarray:
    v = 1 / (1 + np.exp(-np.abs(x)))
    return np.where(x < 0, 1 - v, v).astype(np.float32)


def transform_scores(scores: np.ndarray, name: str) -> np.ndarray:
    """Rows of scores through the transform, as onnxruntime's ``write_scores`` with two or more
    scores a row; a single score a row only takes PROBIT (onnxruntime leaves it otherwise)."""
    scores = scores.astype(np.float32, copy=False)
    if name == "PROBIT":
        return (np.float32(np.sqrt(2)) * erf_inv_ort(2 * scores - 1)).astype(np.float32)
    if scores.shape[1] < 2 or name == "NONE":
        return scores
    if name == "LOGISTIC":
        return logistic(scores)
    if name == "SOFTMAX":
        return softmax_rows_into(scores.copy())
    # SOFTMAX_ZERO: zeros stay zero (scaled by exp(-max)), the rest as softmax
    top = scores.max(axis=1, keepdims=True)
    nonzero = np.abs(scores) > np.float32(1e-7)
    e = np.where(nonzero, np.exp(scores - top), scores * np.exp(-top))
    total = np.where(nonzero, e, 0).sum(axis=1, keepdims=True)
    return (e / total).astype(np.float32)


_F32 = np.dtype(np.float32)
# float32 operands as 0-d arrays: a ufunc converts a Python scalar on every call, which costs more
# than the arithmetic on the few rows a small model scores
_ZERO, _ONE, _MINUS_ONE = (np.array(v, np.float32) for v in (0.0, 1.0, -1.0))


def logistic_into(scores: np.ndarray) -> np.ndarray:
    """``logistic`` in place: 1 / (1 + exp(-|x|)), and 1 minus that where x < 0."""
    if scores.dtype != _F32:
        negative = scores < 0
        np.copysign(scores, -1, out=scores)  # -|x|
        np.exp(scores, out=scores)
        np.add(scores, 1, out=scores)
        np.divide(1, scores, out=scores)
        return np.subtract(1, scores, out=scores, where=negative)
    negative = np.less(scores, _ZERO)
    np.copysign(scores, _MINUS_ONE, out=scores)
    np.exp(scores, out=scores)
    np.add(scores, _ONE, out=scores)
    np.divide(_ONE, scores, out=scores)
    np.copyto(scores, np.subtract(_ONE, scores), where=negative)
    return scores


def _unchanged(scores: np.ndarray) -> np.ndarray:
    return scores


def score_transform(name: str, columns: int):
    """``transform_scores(scores, name)`` for float32 rows of ``columns`` scores, chosen once: the
    common transforms work in place on the scores array (which the caller owns and no longer
    needs), the others call ``transform_scores``."""
    if name == "NONE" or (columns < 2 and name != "PROBIT"):
        return _unchanged
    if name == "SOFTMAX":
        return softmax_rows_into
    if name == "LOGISTIC":
        return logistic_into
    return lambda scores: transform_scores(scores, name)


def as_float_rows(x: np.ndarray, op: str) -> np.ndarray:
    """The input as float32 rows [N, C], as onnxruntime casts it (a 1-D input is one row)."""
    if x.__class__ is np.ndarray and x.dtype == _F32 and x.ndim == 2:  # the usual feed, as it is
        return x
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "fiu":
        raise InvalidArgument(f"{op}: input must be a numeric tensor, got "
                              f"{getattr(x, 'dtype', type(x).__name__)}. Cast it to float32.")
    x = x.astype(np.float32, copy=False)
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)


def reference_kernel(node: Node, ctx: KernelCreateContext) -> Kernel:
    """onnx.reference's kernel for a form the native kernel does not cover."""
    from onnxhal.runtime.providers.cpu.kernel_factory import ReferenceKernel

    return ReferenceKernel(node, ctx, node.since_version or 1)
