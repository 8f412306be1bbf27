"""SVMClassifier and SVMRegressor as onnxruntime computes them (``svmclassifier.cc``): the kernel
of every row with every support vector as one product, the pairwise (one-vs-one) scores, votes for
the label, and with prob_a/prob_b Platt's sigmoid and the pairwise coupling of libsvm
(``multiclass_probability``) run on all rows at once. onnx.reference's version gave probabilities
up to 0.13 off onnxruntime's (and sklearn's) for a StandardScaler + SVC pipeline."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    logistic,
    logistic_into,
    post_transform_name,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register

try:  # einsum's C entry: np.einsum's Python layer costs half a microsecond of the coupling's 1-us calls
    from numpy._core._multiarray_umath import c_einsum as _einsum
except ImportError:  # numpy 1.x
    _einsum = np.einsum


class _SvmKernel:
    def __init__(self, node: Node) -> None:
        self.kind = node.attr("kernel_type", "LINEAR")
        params = list(node.attr("kernel_params", [])) + [0.0, 0.0, 0.0]
        self.gamma, self.coef0, self.degree = np.float32(params[0]), np.float32(params[1]), np.float32(params[2])
        if self.kind not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: kernel_type {self.kind!r} is none of "
                                  "LINEAR, POLY, RBF, SIGMOID.")

    def __call__(self, x: np.ndarray, vectors: np.ndarray, vectors_sq: np.ndarray) -> np.ndarray:
        dot = x @ vectors.T
        if self.kind == "LINEAR":
            return dot
        if self.kind == "POLY":
            return np.power(self.gamma * dot + self.coef0, self.degree).astype(np.float32)
        if self.kind == "SIGMOID":
            return np.tanh(self.gamma * dot + self.coef0)
        # (|x|^2 + |v|^2) - 2 x.v, clipped at 0, times -gamma, exp: in place on fresh arrays
        sq = np.add(np.add.reduce(x * x, axis=1, keepdims=True), vectors_sq)
        np.subtract(sq, np.multiply(dot, 2, out=dot), out=sq)
        np.maximum(sq, 0, out=sq)
        np.multiply(sq, -self.gamma, out=sq)
        return np.exp(sq, out=sq)


def _coupling(v: np.ndarray, pair_i: np.ndarray, pair_j: np.ndarray, k: int) -> np.ndarray:
    """libsvm's multiclass_probability for every row at once, laid out [class, row] so that each
    class's values are one contiguous row: v [pairs, N] the pairwise probabilities r[i, j] of the
    pairs (i, j) (r[j, i] = 1 - v). libsvm updates Qp and pQp incrementally within an iteration;
    here they are recomputed from p before each class's step (the same values in exact
    arithmetic; in float64, about 1e-7 from onnxruntime's float32 sums): two einsum calls in place
    of ten array operations, and within an iteration only (Qp)_i and pQp for class i's step. Each row iterates until its own stopping rule holds; a row that stops gets zero steps
    from then on (a step of 0 leaves p exactly as it is), so rows are never gathered or
    scattered. Returns p [N, k] float32."""
    n = v.shape[1]
    check_terminate()
    r = np.zeros((k, k, n), np.float64)
    r[pair_i, pair_j] = v
    r[pair_j, pair_i] = 1 - v
    # q[i, j] = -r[j, i] * r[i, j] off the diagonal; q[i, i] the sum over j of r[j, i]^2
    q = np.multiply(r.transpose(1, 0, 2), r)
    np.negative(q, out=q)
    diagonal = np.add.reduce(r * r, axis=0)
    q.reshape(k * k, n)[::k + 1] = diagonal
    # 1 / q[i, i] of the rows still iterating, 0 for the stopped ones
    step = 1 / diagonal
    p = np.full((k, n), 1.0 / k)
    eps = 0.005 / k
    active = np.ones(n, bool)
    live = n
    for _ in range(100):
        check_terminate()
        qp = _einsum("ijn,jn->in", q, p)
        pqp = _einsum("in,in->n", p, qp)
        err = np.subtract(qp, pqp)
        np.abs(err, out=err)
        np.logical_and(active, np.maximum.reduce(err, axis=0) >= eps, out=active)
        now = np.count_nonzero(active)
        if now != live:
            if not now:
                break
            live = now
            step *= active
        for i in range(k):
            if i:  # class i's step needs (Qp)_i and pQp only, not the whole of Qp
                diff = _einsum("jn,jn->n", q[i], p)
                pqp = _einsum("in,ijn,jn->n", p, q, p)
                np.subtract(pqp, diff, out=diff)
            else:
                diff = pqp - qp[0]
            diff *= step[i]
            p[i] += diff
            diff += 1
            p /= diff
    return p.T.astype(np.float32)


def _coupling_two(v: np.ndarray) -> np.ndarray:
    """``_coupling`` for two classes, solved in closed form: with a = r[0, 1], b = 1 - a and
    p = (a + d, b - d), Qp = (b d, -a d) and pQp = d^2, so the state is d alone; the stopping rule
    is |d| max(|b - d|, |a + d|) < eps, the step for class 0 maps d to b d^2 / (b^2 - b d + d^2)
    and the step for class 1 maps it to -a d^2 / (a^2 + a d + d^2). The same iterations as the
    general loop, in float64 with a few operations a step (the float32 loop rounds differently, by
    about 1e-7). v: [N] the pair's probabilities; returns p [N, 2] float32."""
    a = v.astype(np.float64)
    b = 1 - a
    aa, bb, minus_a, a_half = a * a, b * b, -a, a - 0.5
    d = 0.5 - a
    n = len(a)
    active = np.ones(n, bool)
    eps = 0.005 / 2
    for _ in range(100):
        check_terminate()
        # p0 = a + d and p1 = b - d stay in (0, 1) (both steps keep them positive, summing to 1):
        # max(|p0|, |p1|) = 0.5 + |p0 - 0.5|
        err = d + a_half
        np.abs(err, out=err)
        err += 0.5
        err *= np.abs(d)
        np.logical_and(active, err >= eps, out=active)
        live = np.count_nonzero(active)
        if not live:
            break
        dd = d * d
        e = dd * b
        den = b * d
        np.subtract(bb, den, out=den)
        den += dd
        e /= den  # class 0's step
        ee = e * e
        f = ee * minus_a
        den = a * e
        den += aa
        den += ee
        f /= den  # class 1's step
        if live == n:
            d = f
        else:
            np.copyto(d, f, where=active)
    p = np.empty((len(a), 2), np.float32)
    p[:, 0] = a + d
    p[:, 1] = b - d
    return p


@register("SVMClassifier", since=1, domain=ML)
class SVMClassifier(Kernel):
    """SVC (one-vs-one over support vectors) with two or more classes, with or without Platt
    probabilities, and the liblinear form (no support vectors: one row of coefficients per class,
    rho[0] added), with onnxruntime's rules for two classes (``ChooseClass``)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        strings = node.attr("classlabels_strings")
        ints = node.attr("classlabels_ints")
        if not strings and not ints:
            raise InvalidArgument(f"SVMClassifier node {node.name!r}: one of classlabels_strings, classlabels_ints "
                                  "is required.")
        self.labels = np.array(strings, dtype=object) if strings else np.asarray(ints, np.int64)
        self.k = len(self.labels)
        self.per_class = [int(v) for v in node.attr("vectors_per_class", [])]
        count = sum(self.per_class)
        coef = np.asarray(node.attr("coefficients"), np.float32)
        self.rho = np.asarray(node.attr("rho"), np.float32)
        self.prob_a = np.asarray(node.attr("prob_a", []), np.float32)
        self.prob_b = np.asarray(node.attr("prob_b", []), np.float32)
        self.transform = post_transform_name(node)
        self.all_positive = bool((coef >= 0).all())
        self.linear = count == 0
        if self.linear:  # liblinear: scores = X @ coefficients[class].T + rho[0]
            if coef.size % self.k:
                raise InvalidArgument(f"SVMClassifier node {node.name!r}: {coef.size} coefficients for {self.k} "
                                      "classes; the linear form needs one row per class.")
            self.coef = coef.reshape(self.k, -1).T.copy()
            return
        if len(self.per_class) != self.k:
            raise InvalidArgument(f"SVMClassifier node {node.name!r}: vectors_per_class has {len(self.per_class)} "
                                  f"entries for {self.k} class labels.")
        self.vectors = np.asarray(node.attr("support_vectors"), np.float32).reshape(count, -1)
        self.vectors_sq = (self.vectors * self.vectors).sum(axis=1)
        self.coef = coef.reshape(self.k - 1, count)
        self.kernel = _SvmKernel(node)
        starts = np.concatenate([[0], np.cumsum(self.per_class)]).astype(int)
        # Pair (i, j): class i's vectors with coefficient row j-1, class j's with row i.
        self.pairs = [(i, j, slice(starts[i], starts[i + 1]), slice(starts[j], starts[j + 1]))
                      for i in range(self.k - 1) for j in range(i + 1, self.k)]
        # the pairs' coefficients as one float64 matrix [vectors, pairs] (the float64 products
        # promote them): column c holds pair c's two coefficient slices at its classes' vectors
        self.pair_coef = np.zeros((count, len(self.pairs)), np.float64)
        for c, (i, j, si, sj) in enumerate(self.pairs):
            self.pair_coef[si, c] = self.coef[j - 1, si]
            self.pair_coef[sj, c] = self.coef[i, sj]
        if self.rho.size < len(self.pairs):
            raise InvalidArgument(f"SVMClassifier node {node.name!r}: rho has {self.rho.size} values for "
                                  f"{len(self.pairs)} pairs of classes; give one per pair.")
        self.pair_i = np.array([i for i, _, _, _ in self.pairs], np.int64)
        self.pair_j = np.array([j for _, j, _, _ in self.pairs], np.int64)
        # votes = wins @ (vote_i - vote_j) + the votes every pair's j would get (small integers,
        # exact in float32): a pair's vote goes to i where its score is positive, else to j
        vote_i = np.zeros((len(self.pairs), self.k), np.float32)
        vote_j = np.zeros((len(self.pairs), self.k), np.float32)
        vote_i[np.arange(len(self.pairs)), self.pair_i] = 1
        vote_j[np.arange(len(self.pairs)), self.pair_j] = 1
        self.vote_swing = vote_i - vote_j
        self.vote_base = vote_j.sum(axis=0)
        self.rho64 = self.rho[:len(self.pairs)].astype(np.float64)

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "SVMClassifier")
        if self.linear:
            return self._linear(x)
        kern = self.kernel(x, self.vectors, self.vectors_sq)
        check_terminate()
        scores = np.matmul(kern.astype(np.float64), self.pair_coef)
        np.add(scores, self.rho64, out=scores)
        scores = scores.astype(np.float32)
        if self.k == 2:  # one pair: its vote goes to class 0 where its score is positive, else to class 1
            label = self.labels[::-1].take(np.greater(scores[:, 0], 0).view(np.int8))
        else:
            votes = np.matmul(scores > 0, self.vote_swing)
            np.add(votes, self.vote_base, out=votes)
            label = self.labels[votes.argmax(axis=1)]
        if self.prob_a.size:
            v = np.multiply(scores, self.prob_a)  # r[i, j] = 1 - logistic(a s + b), clipped
            np.add(v, self.prob_b, out=v)
            logistic_into(v)
            np.subtract(1, v, out=v)
            np.maximum(v, np.float32(1e-7), out=v)
            np.minimum(v, np.float32(1 - 1e-7), out=v)
            p = _coupling_two(v[:, 0]) if self.k == 2 else _coupling(v.T, self.pair_i, self.pair_j, self.k)
            return [label, transform_scores(p, self.transform)]
        if self.k == 2:  # one pairwise score as two columns: [-s, s], or [1 - p, p] (p the logistic of s)
            s = scores[:, 0]
            if self.transform == "PROBIT":
                return [label, np.stack([transform_scores(scores, "PROBIT")[:, 0], np.zeros_like(s)], axis=1)]
            if self.transform == "LOGISTIC":
                s = logistic(s)
            first = -s if self.transform == "NONE" else 1 - s
            return [label, np.stack([first, s], axis=1).astype(np.float32)]
        return [label, transform_scores(scores, self.transform)]

    def _linear(self, x: np.ndarray) -> list:
        scores = (x @ self.coef + self.rho[0]).astype(np.float32)
        top = np.argmax(scores, axis=1)
        label = self.labels[top]
        if self.k == 2 and not self.prob_a.size:  # onnxruntime's ChooseClass: one classifier, no probabilities
            best = scores[np.arange(len(top)), top]
            second = (best >= 0.5) if self.all_positive else (best > 0)
            label = np.where(second, self.labels[1], label)
            if self.labels.dtype != object:
                label = label.astype(np.int64)
        return [label, transform_scores(scores, self.transform)]


@register("SVMRegressor", since=1, domain=ML)
class SVMRegressor(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.n_supports = int(node.attr("n_supports", 0))
        coef = np.asarray(node.attr("coefficients"), np.float32)
        self.rho = np.float32(node.attr("rho", [0.0])[0])
        self.one_class = bool(node.attr("one_class", 0))
        self.transform = post_transform_name(node)
        self.kernel = _SvmKernel(node)
        if self.n_supports > 0:
            self.vectors = np.asarray(node.attr("support_vectors"), np.float32).reshape(self.n_supports, -1)
            self.vectors_sq = (self.vectors * self.vectors).sum(axis=1)
            self.coef = coef.reshape(self.n_supports)
        else:  # linear: the coefficients are the weights of the features
            self.vectors = None
            self.coef = coef
        self.inline_fn = self.apply

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = as_float_rows(x, "SVMRegressor")
        if self.vectors is not None:
            s = self.kernel(x, self.vectors, self.vectors_sq).astype(np.float64) @ self.coef + self.rho
        else:
            s = x.astype(np.float64) @ self.coef + self.rho
        s = s.astype(np.float32).reshape(-1, 1)
        if self.one_class:
            s = np.where(s > 0, np.float32(1), np.float32(-1))
        return transform_scores(s, self.transform)
