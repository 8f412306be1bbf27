"""ai.onnx.ml's linear models and row transforms, as onnxruntime computes them: LinearClassifier,
LinearRegressor, Scaler, Normalizer, Binarizer, and ZipMap (a sequence of maps, one per row, as
onnxruntime returns it)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.clamp import constant
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    attr_floats,
    logistic_into,
    post_transform_name,
    score_transform,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.numerics import row_sums, softmax_rows_by_dot, softmax_rows_into
from onnxhal.runtime.providers.cpu.kernels.registry import register

# Small inputs (skl2onnx pipelines run 16 rows of a few columns): a numpy ufunc whose operands all
# have the output's shape, or are 0-d arrays, costs two to three times less than one that
# broadcasts a row or a column or converts a Python scalar. So the kernels below keep per-shape
# full-size copies of their per-column constants, 0-d arrays for their scalars, and take row sums
# as a product with a k x k matrix of ones (each row's sum in each of its k columns: the division
# by it needs no broadcast). Above SMALL elements the broadcast forms run: they cost no memory.
FUSED_DOMAIN = "com.onnxhal"  # the optimizer's fused ops (FusedLinearClassifier)
SMALL = 4096  # elements of an input that takes the small path
_SQUARE_MAX = 32  # columns up to which row sums are a product with a square of ones
_F32 = np.dtype(np.float32)
_ZERO, _ONE = np.array(0.0, np.float32), np.array(1.0, np.float32)  # 0-d operands: no scalar conversion a call


def _ones_square(k: int, dtype: np.dtype) -> np.ndarray:
    """A read-only k x k matrix of ones (``clamp.constant``'s cached row, viewed square)."""
    return constant(1.0, dtype, k * k).reshape(k, k)


class _Tiled:
    """A row of per-column constants repeated to [n, k], kept per row count n (a few counts: a
    process runs a model on a few batch sizes; past 8 a new count is built and not kept)."""

    def __init__(self, row: np.ndarray) -> None:
        self.row = row
        self.cache: dict[int, np.ndarray] = {}

    def __call__(self, n: int) -> np.ndarray:
        t = self.cache.get(n)
        if t is None:
            t = np.tile(self.row, (n, 1))
            t.flags.writeable = False
            if len(self.cache) < 8:
                self.cache[n] = t
        return t


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
        coef = attr_floats(node, "coefficients", [])
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
        self.bias = _Tiled(self.intercepts)
        self.biases = self.bias.cache
        # the small path's transform: softmax written for it (_softmax)
        few = 2 <= n <= _SQUARE_MAX
        self.ones = _ones_square(n, _F32) if few else None
        # functions of the ones square, not bound methods: one kept on the kernel is a reference cycle
        self.small_post = {"SOFTMAX": functools.partial(_small_softmax, self.ones),
                           "LOGISTIC": logistic_into}.get(self.transform, self.post) if few else self.post
        # labels 0..k-1 (int64): the label is the argmax itself (np.intp is int64 here)
        self.labels_are_index = labels.dtype == np.int64 and np.dtype(np.intp) == np.int64 and \
            np.array_equal(labels, np.arange(len(labels)))
        if self.binary:  # onnxruntime: the two labels, or 1 / 0 ("1" / "0") without two of them
            text = labels.dtype == object
            self.positive = labels[1] if len(labels) == 2 else ("1" if text else np.int64(1))
            self.negative = labels[0] if len(labels) == 2 else ("0" if text else np.int64(0))
        self.label_pair = None if not self.binary or self.labels.dtype == object else \
            np.array([self.negative, self.positive], np.int64)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        if x.__class__ is not np.ndarray or x.dtype != _F32 or x.ndim != 2:
            x = as_float_rows(x, "LinearClassifier")
        scores = np.dot(x, self.coef)  # float32 as x and the coefficients; dot: matmul's BLAS call, less overhead
        small = scores.size <= SMALL
        if small:
            bias = self.biases.get(scores.shape[0])
            np.add(scores, self.bias(scores.shape[0]) if bias is None else bias, out=scores)
        else:
            np.add(scores, self.intercepts, out=scores)
        if not self.binary:
            top = scores.argmax(axis=1)
            post = self.small_post if small else self.post
            return [top if self.labels_are_index else self.labels[top], post(scores)]
        s = scores[:, 0]
        if self.label_pair is not None:  # integer labels: [negative, positive] taken by the sign
            label = self.label_pair.take(np.greater(s, _ZERO))
        else:
            label = np.where(s > 0, self.positive, self.negative)
        if self.transform == "PROBIT":
            s = transform_scores(scores, "PROBIT")[:, 0]
            out = np.stack([s, np.zeros_like(s)], axis=1) if self.second_class else s[:, None]
            return [label, self.finish(out.astype(np.float32, copy=False))]
        if self.transform == "LOGISTIC":
            s = logistic_into(s)  # the scores are this call's own float32 array
        if not self.second_class:
            return [label, self.finish(s[:, None])]
        # [1 - s, s] written into one array (np.stack's Python wrapper costs more than the rows)
        out = np.empty((s.shape[0], 2), np.float32)
        np.subtract(_ONE, s, out=out[:, 0])
        out[:, 1] = s
        return [label, self.finish(out)]

    @staticmethod
    def finish(scores: np.ndarray) -> np.ndarray:
        """The binary form's scores as returned (FusedLinearClassifier normalizes them)."""
        return scores


def _small_softmax(ones: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """SOFTMAX of a few rows in place: numerics' ``softmax_rows_by_dot`` (``ones``: the square of
    ones of the row width) where every score is within +-60, else ``softmax_rows_into``."""
    y = softmax_rows_by_dot(scores, ones)
    return softmax_rows_into(scores) if y is None else y


@register("LinearRegressor", since=1, domain=ML)
class LinearRegressor(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        targets = int(node.attr("targets", 1))
        self.coef = attr_floats(node, "coefficients").reshape(targets, -1).T.copy()
        self.intercepts = np.asarray(node.attr("intercepts", [0.0] * targets), np.float32)
        self.transform = post_transform_name(node)
        self.post = score_transform(self.transform, targets)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        scores = np.matmul(as_float_rows(x, "LinearRegressor"), self.coef)
        return self.post(np.add(scores, self.intercepts, out=scores))


@register("Scaler", since=1, domain=ML)
class Scaler(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.offset = np.asarray(node.attr("offset", [0.0]), np.float32)
        self.scale = np.asarray(node.attr("scale", [1.0]), np.float32)
        self.width = -1  # the last input width the attributes were checked for
        self.full: dict[tuple, tuple] = {}  # small float32 [N, C] shape -> offset and scale at that shape

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        full = self.full.get(x.shape) if x.__class__ is np.ndarray and x.dtype == _F32 else None
        if full is not None:
            out = np.subtract(x, full[0])
            return np.multiply(out, full[1], out=out)
        width = x.shape[-1] if x.ndim else 1
        if width != self.width:
            for name, v in (("offset", self.offset), ("scale", self.scale)):
                if v.size not in (1, width):
                    raise InvalidArgument(f"Scaler: attribute {name!r} has {v.size} values for an input of {width} "
                                          "columns; give one value or one per column.")
            self.width = width
        if x.__class__ is np.ndarray and x.dtype == _F32 and x.ndim == 2 and x.size <= SMALL and len(self.full) < 8:
            self.full[x.shape] = tuple(np.ascontiguousarray(np.broadcast_to(v, x.shape)) for v in (self.offset, self.scale))
        out = np.subtract(x.astype(np.float32, copy=False), self.offset)
        return np.multiply(out, self.scale, out=out)


@register("Normalizer", since=1, domain=ML)
class Normalizer(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.norm = node.attr("norm", "MAX")
        if self.norm not in ("MAX", "L1", "L2"):
            raise InvalidArgument(f"Normalizer node {node.name!r}: norm {self.norm!r} is none of MAX, L1, L2.")
        self.l1 = self.norm == "L1"
        self.squares: dict[int, np.ndarray] = {}  # L1, L2: row width -> a square of ones (small rows' sums)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        if x.__class__ is np.ndarray and x.dtype == _F32 and x.ndim == 2 and x.size <= SMALL:
            ones = self.squares.get(x.shape[1])  # rows of a width seen before: no other checks
            if ones is not None:
                return self._small(x, ones)
        x = x.astype(np.float32, copy=False)
        rows = x.reshape(1, -1) if x.ndim == 1 else x
        ones = self.squares.get(rows.shape[1]) if rows.size <= SMALL else None
        if ones is None and rows.size <= SMALL and self.norm != "MAX" and 0 < rows.shape[1] <= _SQUARE_MAX:
            ones = self.squares[rows.shape[1]] = _ones_square(rows.shape[1], _F32)
        if ones is not None:
            out = self._small(rows, ones)
            return out if x.ndim == 2 else out.reshape(x.shape)
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

    def _small(self, rows: np.ndarray, ones: np.ndarray) -> np.ndarray:
        """L1 or L2 of float32 rows [N, C], C <= _SQUARE_MAX: the norms by a product with the
        square of ones (each row's norm in each of its columns: the division needs no broadcast)."""
        if self.l1:
            d = np.dot(np.abs(rows), ones)
        else:
            d = np.dot(np.multiply(rows, rows), ones)
            np.sqrt(d, out=d)
        if np.count_nonzero(d) != d.size:
            np.add(d, np.equal(d, 0), out=d)
        return np.divide(rows, d, out=d)


@register("Binarizer", since=1, domain=ML)
class Binarizer(Kernel):
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.threshold = float(node.attr("threshold", 0.0))
        self.thresholds: dict[np.dtype, np.ndarray] = {}  # per input dtype, as a 0-d array (a cheap operand)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        # a small input counts its NaNs (count_nonzero is no ufunc reduction: cheaper than a sum on
        # a few elements); a large one sums: a NaN makes the sum NaN (inf - inf too: then the exact test decides)
        if x.dtype.kind != "f":
            nan = False
        elif x.size <= SMALL:
            nan = np.count_nonzero(np.isnan(x)) != 0
        else:
            total = float(np.add.reduce(x, axis=None))
            nan = total != total and np.isnan(x).any()
        if nan:
            raise InvalidArgument(f"Binarizer: input element {int(np.argmax(np.isnan(x).reshape(-1)))} is NaN (as "
                                  "onnxruntime, a NaN is refused); impute it first (Imputer).")
        t = self.thresholds.get(x.dtype)
        if t is None:
            t = self.thresholds[x.dtype] = np.array(x.dtype.type(self.threshold))
        return np.greater(x, t).astype(x.dtype)  # a bool result cast: half the time of a float out= on small inputs


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
    return _row_maps_factory(len(keys))(*keys)


@functools.cache
def _row_maps_factory(n: int) -> Callable:
    """For ``n`` keys, a function of the keys that returns ``_row_maps``'s function: the source
    depends on the key count alone, so it is compiled once a process (compiling it is most of a
    small classifier's session creation), and each session binds its own keys."""
    names = [f"v{i}" for i in range(n)]
    keys = ", ".join(f"k{i}" for i in range(n))
    params = ", ".join(f"k{i}=k{i}" for i in range(n))
    literal = ", ".join(f"k{i}: {v}" for i, v in enumerate(names))
    source = f"lambda {keys}: lambda rows, {params}: [{{{literal}}} for {', '.join(names)}, in rows]"
    return eval(source, {})  # noqa: S307 (source built above from the key count)


@register("FusedLinearClassifier", since=1, domain=FUSED_DOMAIN)
class FusedLinearClassifier(LinearClassifier):
    """LinearClassifier with its scores through Normalizer(``norm``): the optimizer's fusion of
    the pair skl2onnx ends every linear classifier with (``opt_ml_fusions``). After the small
    path's softmax (rows of non-negative scores summing to about 1: no zero row) the L1 norm is
    the product with the square of ones and one division, the Normalizer's result to the bit."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        normalize = Normalizer(node, ctx).apply
        post, small_post = self.post, self.small_post
        self.post = lambda scores: normalize(post(scores))
        self.finish = normalize
        small_softmax = isinstance(small_post, functools.partial) and small_post.func is _small_softmax
        if small_softmax and normalize.__self__.l1:
            self.small_post = functools.partial(_small_softmax_l1, self.ones, self.post)
        else:
            self.small_post = lambda scores: normalize(small_post(scores))


def _small_softmax_l1(ones: np.ndarray, post: Callable, scores: np.ndarray) -> np.ndarray:
    """``FusedLinearClassifier``'s small path for SOFTMAX then the L1 norm (``post``: the whole
    transform, where a score lies beyond ``softmax_rows_by_dot``'s range)."""
    y = softmax_rows_by_dot(scores, ones)
    if y is None:
        return post(scores)
    return np.divide(y, np.dot(y, ones), out=y)
