"""ai.onnx.ml's linear models and row transforms, as onnxruntime computes them: LinearClassifier,
LinearRegressor, Scaler, Normalizer, Binarizer, and ZipMap (a sequence of maps, one per row, as
onnxruntime returns it)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    post_transform_name,
    reference_kernel,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _labels(node: Node) -> np.ndarray | None:
    ints, strings = node.attr("classlabels_ints"), node.attr("classlabels_strings")
    if strings:
        return np.array(strings, dtype=object)
    return np.asarray(ints, np.int64) if ints else None


@register("LinearClassifier", since=1, domain=ML)
class LinearClassifier(Kernel):
    """Scores X @ coefficients.T + intercepts, the label of the first highest score. The binary
    form (one row of coefficients) keeps onnx.reference's kernel."""

    def __new__(cls, node: Node, ctx: KernelCreateContext) -> Kernel:
        labels = _labels(node)
        if labels is None or len(node.attr("coefficients", [])) // max(1, len(labels)) * len(labels) != \
                len(node.attr("coefficients", [])) or len(labels) <= 2:
            return reference_kernel(node, ctx)
        return super().__new__(cls)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.labels = _labels(node)
        n = len(self.labels)
        self.coef = np.asarray(node.attr("coefficients"), np.float32).reshape(n, -1).T.copy()
        self.intercepts = np.asarray(node.attr("intercepts", [0.0] * n), np.float32)
        self.transform = post_transform_name(node)

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "LinearClassifier")
        scores = x @ self.coef + self.intercepts
        label = self.labels[np.argmax(scores, axis=1)]
        return [label, transform_scores(scores, self.transform)]


@register("LinearRegressor", since=1, domain=ML)
class LinearRegressor(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        targets = int(node.attr("targets", 1))
        self.coef = np.asarray(node.attr("coefficients"), np.float32).reshape(targets, -1).T.copy()
        self.intercepts = np.asarray(node.attr("intercepts", [0.0] * targets), np.float32)
        self.transform = post_transform_name(node)

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "LinearRegressor")
        return [transform_scores(x @ self.coef + self.intercepts, self.transform)]


@register("Scaler", since=1, domain=ML)
class Scaler(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.offset = np.asarray(node.attr("offset", [0.0]), np.float32)
        self.scale = np.asarray(node.attr("scale", [1.0]), np.float32)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        width = x.shape[-1] if x.ndim else 1
        for name, v in (("offset", self.offset), ("scale", self.scale)):
            if v.size not in (1, width):
                raise InvalidArgument(f"Scaler: attribute {name!r} has {v.size} values for an input of {width} "
                                      "columns; give one value or one per column.")
        return [((x.astype(np.float32, copy=False) - self.offset) * self.scale).astype(np.float32, copy=False)]


@register("Normalizer", since=1, domain=ML)
class Normalizer(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.norm = node.attr("norm", "MAX")
        if self.norm not in ("MAX", "L1", "L2"):
            raise InvalidArgument(f"Normalizer node {node.name!r}: norm {self.norm!r} is none of MAX, L1, L2.")

    def compute(self, inputs: list) -> list:
        x = inputs[0].astype(np.float32, copy=False)
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if self.norm == "MAX":
            d = rows.max(axis=1, keepdims=True)
        elif self.norm == "L1":
            d = np.abs(rows).sum(axis=1, keepdims=True)
        else:
            d = np.sqrt((rows * rows).sum(axis=1, keepdims=True))
        return [(rows / d).reshape(x.shape).astype(np.float32, copy=False)]


@register("Binarizer", since=1, domain=ML)
class Binarizer(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.threshold = float(node.attr("threshold", 0.0))

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        return [(x > x.dtype.type(self.threshold)).astype(x.dtype)]


@register("ZipMap", since=1, domain=ML)
class ZipMap(Kernel):
    """Each row of scores as a map from the class labels to Python floats, in label order: the
    sequence of maps onnxruntime returns."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        ints, strings = node.attr("classlabels_int64s"), node.attr("classlabels_strings")
        if bool(ints) == bool(strings):
            raise InvalidArgument(f"ZipMap node {node.name!r}: exactly one of classlabels_int64s and "
                                  "classlabels_strings must be given.")
        self.keys = [int(k) for k in ints] if ints else list(strings)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if rows.ndim != 2 or rows.shape[1] != len(self.keys):
            raise InvalidArgument(f"ZipMap: input of shape {list(x.shape)} for {len(self.keys)} labels; it must "
                                  f"be [N, {len(self.keys)}].")
        keys = self.keys
        return [[dict(zip(keys, row)) for row in rows.astype(np.float64).tolist()]]
