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
    logistic,
    post_transform_name,
    score_transform,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.normalization import row_sums
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _labels(node: Node) -> np.ndarray | None:
    ints, strings = node.attr("classlabels_ints"), node.attr("classlabels_strings")
    if strings:
        return np.array(strings, dtype=object)
    return np.asarray(ints, np.int64) if ints else None


@register("LinearClassifier", since=1, domain=ML)
class LinearClassifier(Kernel):
    """Scores X @ coefficients.T + intercepts (one score column per intercept), the label of the
    first highest score. One score column with two labels is onnxruntime's binary form: the label
    from the score's sign, the scores written as [1 - s, s] (s through the logistic for LOGISTIC;
    no other transform but PROBIT, as onnxruntime 1.32 does)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        labels = _labels(node)
        coef = np.asarray(node.attr("coefficients", []), np.float32)
        intercepts = node.attr("intercepts")
        n = len(intercepts) if intercepts else (len(labels) if labels is not None else 0)
        if labels is None or n == 0 or coef.size % n:
            raise InvalidArgument(f"LinearClassifier node {node.name!r}: {coef.size} coefficients for {n} classes "
                                  f"and {0 if labels is None else len(labels)} labels; give class labels and one "
                                  "row of coefficients per intercept.")
        self.labels = labels
        self.coef = coef.reshape(n, -1).T.copy()
        self.intercepts = np.asarray(intercepts if intercepts else [0.0] * n, np.float32)
        self.transform = post_transform_name(node)
        self.binary = n == 1
        self.second_class = self.binary and len(labels) == 2
        self.post = score_transform(self.transform, n)
        # labels 0..k-1 (int64): the label is the argmax itself (np.intp is int64 here)
        self.labels_are_index = labels.dtype == np.int64 and np.dtype(np.intp) == np.int64 and \
            np.array_equal(labels, np.arange(len(labels)))
        if self.binary:  # onnxruntime: the two labels, or 1 / 0 ("1" / "0") without two of them
            text = labels.dtype == object
            self.positive = labels[1] if len(labels) == 2 else ("1" if text else np.int64(1))
            self.negative = labels[0] if len(labels) == 2 else ("0" if text else np.int64(0))

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "LinearClassifier")
        scores = np.matmul(x, self.coef)  # float32: x and the coefficients are
        np.add(scores, self.intercepts, out=scores)
        if not self.binary:
            top = scores.argmax(axis=1)
            return [top if self.labels_are_index else self.labels[top], self.post(scores)]
        s = scores[:, 0]
        label = np.where(s > 0, self.positive, self.negative)
        if self.labels.dtype != object:
            label = label.astype(np.int64)
        if self.transform == "PROBIT":
            s = transform_scores(scores, "PROBIT")[:, 0]
            out = np.stack([s, np.zeros_like(s)], axis=1) if self.second_class else s[:, None]
        else:
            if self.transform == "LOGISTIC":
                s = logistic(s)
            out = np.stack([1 - s, s], axis=1) if self.second_class else s[:, None]
        return [label, out.astype(np.float32, copy=False)]


@register("LinearRegressor", since=1, domain=ML)
class LinearRegressor(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        targets = int(node.attr("targets", 1))
        self.coef = np.asarray(node.attr("coefficients"), np.float32).reshape(targets, -1).T.copy()
        self.intercepts = np.asarray(node.attr("intercepts", [0.0] * targets), np.float32)
        self.transform = post_transform_name(node)
        self.post = score_transform(self.transform, targets)
        self.inline_fn = self.apply

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        scores = np.matmul(as_float_rows(x, "LinearRegressor"), self.coef)
        return self.post(np.add(scores, self.intercepts, out=scores))


@register("Scaler", since=1, domain=ML)
class Scaler(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.offset = np.asarray(node.attr("offset", [0.0]), np.float32)
        self.scale = np.asarray(node.attr("scale", [1.0]), np.float32)
        self.width = -1  # the last input width the attributes were checked for
        self.inline_fn = self.apply

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        width = x.shape[-1] if x.ndim else 1
        if width != self.width:
            for name, v in (("offset", self.offset), ("scale", self.scale)):
                if v.size not in (1, width):
                    raise InvalidArgument(f"Scaler: attribute {name!r} has {v.size} values for an input of {width} "
                                          "columns; give one value or one per column.")
            self.width = width
        out = np.subtract(x.astype(np.float32, copy=False), self.offset)
        return np.multiply(out, self.scale, out=out)


@register("Normalizer", since=1, domain=ML)
class Normalizer(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.norm = node.attr("norm", "MAX")
        if self.norm not in ("MAX", "L1", "L2"):
            raise InvalidArgument(f"Normalizer node {node.name!r}: norm {self.norm!r} is none of MAX, L1, L2.")
        self.inline_fn = self.apply

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32, copy=False)
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if self.norm == "MAX":
            d = np.maximum.reduce(rows, axis=1, keepdims=True)
        elif self.norm == "L1":  # row sums as BLAS products: add.reduce loops once a row
            d = row_sums(np.abs(rows))[:, None]
        else:
            d = np.sqrt(row_sums(np.multiply(rows, rows)))[:, None]
        # onnxruntime leaves a row whose norm is 0 as it is: divide it by 1 (d + 0 is d, NaN stays NaN)
        if np.count_nonzero(d) != d.size:
            np.add(d, np.equal(d, 0), out=d)
        out = np.divide(rows, d)
        return out if x.ndim == 2 else out.reshape(x.shape)


@register("Binarizer", since=1, domain=ML)
class Binarizer(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.threshold = float(node.attr("threshold", 0.0))
        self.inline_fn = self.apply

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        # any NaN makes the sum NaN (which inf - inf also gives: then the exact test decides)
        if x.dtype.kind == "f" and np.isnan(np.add.reduce(x, axis=None)) and np.isnan(x).any():
            raise InvalidArgument(f"Binarizer: input element {int(np.argmax(np.isnan(x).reshape(-1)))} is NaN (as "
                                  "onnxruntime, a NaN is refused); impute it first (Imputer).")
        return np.greater(x, x.dtype.type(self.threshold), out=np.empty(x.shape, x.dtype))


@register("ZipMap", since=1, domain=ML)
class ZipMap(Kernel):
    """Each row of scores as a map from the class labels to Python floats, in label order: the
    sequence of maps onnxruntime returns."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        ints, strings = node.attr("classlabels_int64s"), node.attr("classlabels_strings")
        if bool(ints) == bool(strings):
            raise InvalidArgument(f"ZipMap node {node.name!r}: exactly one of classlabels_int64s and "
                                  "classlabels_strings must be given.")
        self.keys = [int(k) for k in ints] if ints else [_text(k) for k in strings]
        self.maps = _row_maps(self.keys)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        if rows.ndim != 2 or rows.shape[1] != len(self.keys):
            raise InvalidArgument(f"ZipMap: input of shape {list(x.shape)} for {len(self.keys)} labels; it must "
                                  f"be [N, {len(self.keys)}].")
        # tolist gives Python floats: a float32 widened to a double exactly, as astype(float64) would
        return [self.maps(rows.tolist())]


def _text(k) -> str:
    return k.decode("utf-8", errors="surrogateescape") if isinstance(k, bytes) else str(k)


def _row_maps(keys: list):
    """A function from rows (lists of len(keys) floats) to one dict per row, in key order. For a
    few keys a comprehension that builds each dict as a literal (about half the time of
    dict(zip(keys, row)) a row); the keys are bound as default arguments, not in the source."""
    if not 0 < len(keys) <= 32 or len(set(keys)) != len(keys):
        return lambda rows: [dict(zip(keys, row)) for row in rows]
    names = [f"v{i}" for i in range(len(keys))]
    params = ", ".join(f"k{i}=k{i}" for i in range(len(keys)))
    literal = ", ".join(f"k{i}: {v}" for i, v in enumerate(names))
    source = f"lambda rows, {params}: [{{{literal}}} for {', '.join(names)}, in rows]"
    return eval(source, {}, {f"k{i}": k for i, k in enumerate(keys)})  # noqa: S307 (source built above)
