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
    post_transform_name,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.registry import register


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
        sq = (x * x).sum(axis=1, keepdims=True) + vectors_sq[None, :] - 2 * dot
        return np.exp(-self.gamma * np.maximum(sq, 0))


def _coupling(r: np.ndarray) -> np.ndarray:
    """libsvm's multiclass_probability for every row at once: r [N, K, K] pairwise probabilities,
    each row iterated until its own stopping rule holds (a row that stops gets zero steps, so the
    arrays are never gathered or scattered)."""
    n, k, _ = r.shape
    check_terminate()
    # q[i, j] = -r[j, i] * r[i, j] off the diagonal; q[i, i] the sum over j of r[j, i]^2 in j's order
    # (r's diagonal is 0, and adding it changes nothing)
    q = np.empty((n, k, k), np.float32)
    np.multiply(r.transpose(0, 2, 1), r, out=q)
    np.negative(q, out=q)
    sq = r * r
    d = sq[:, 0, :]
    for j in range(1, k):
        d = d + sq[:, j, :]
    q.reshape(n, k * k)[:, ::k + 1] = d
    p = np.full((n, k), np.float32(1.0 / k), np.float32)
    eps = np.float32(0.005 / k)
    active = np.ones(n, bool)
    diagonal = [q[:, i, i] for i in range(k)]
    for _ in range(100):
        check_terminate()
        qp = np.einsum("nij,nj->ni", q, p)  # float32 in, float32 out
        pqp = (p * qp).sum(axis=1)
        active &= np.abs(qp - pqp[:, None]).max(axis=1) >= eps
        if not active.all():
            if not active.any():
                break
            a = active
            pa, qpa, qa, pqpa = p[a], qp[a], q[a], pqp[a]
            qd = [qa[:, i, i] for i in range(k)]
        else:  # every row still iterates: work on the arrays themselves (pa updates p in place)
            pa, qpa, qa, pqpa, qd = p, qp, q, pqp, diagonal
        for i in range(k):
            diff = (pqpa - qpa[:, i]) / qd[i]  # b - a is b + (-a) in IEEE arithmetic
            pa[:, i] += diff
            grow = 1 + diff
            pqpa = (pqpa + diff * (diff * qd[i] + 2 * qpa[:, i])) / grow / grow
            column = grow[:, None]
            qpa = (qpa + diff[:, None] * qa[:, i, :]) / column
            pa /= column
        if pa is not p:
            p[a] = pa
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
        # per pair its two coefficient slices in float64 (as the float64 products promote them)
        self.pair_coef = [(self.coef[j - 1, si].astype(np.float64), self.coef[i, sj].astype(np.float64))
                          for i, j, si, sj in self.pairs]
        self.pair_i = np.array([i for i, _, _, _ in self.pairs], np.int64)
        self.pair_j = np.array([j for _, j, _, _ in self.pairs], np.int64)
        self.vote_i = np.zeros((len(self.pairs), self.k), np.int64)
        self.vote_j = np.zeros((len(self.pairs), self.k), np.int64)
        self.vote_i[np.arange(len(self.pairs)), self.pair_i] = 1
        self.vote_j[np.arange(len(self.pairs)), self.pair_j] = 1

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "SVMClassifier")
        if self.linear:
            return self._linear(x)
        kern = self.kernel(x, self.vectors, self.vectors_sq)
        n = x.shape[0]
        scores = np.empty((n, len(self.pairs)), np.float32)
        kern64 = kern.astype(np.float64)
        for c, (_, _, si, sj) in enumerate(self.pairs):  # k * (k - 1) / 2 pairs of classes
            check_terminate()
            a, b = self.pair_coef[c]
            scores[:, c] = np.ascontiguousarray(kern64[:, si]) @ a + np.ascontiguousarray(kern64[:, sj]) @ b + \
                self.rho[c]
        # a pair's vote goes to i where its score is positive, else to j: count both with one product each
        wins = scores > 0
        votes = wins.astype(np.int64) @ self.vote_i + (~wins).astype(np.int64) @ self.vote_j
        label = self.labels[np.argmax(votes, axis=1)]
        if self.prob_a.size:
            r = np.zeros((n, self.k, self.k), np.float32)
            v = 1 - logistic(scores * self.prob_a + self.prob_b)
            v = np.clip(v, np.float32(1e-7), np.float32(1 - 1e-7))
            r[:, self.pair_i, self.pair_j] = v
            r[:, self.pair_j, self.pair_i] = 1 - v
            return [label, transform_scores(_coupling(r), self.transform)]
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

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "SVMRegressor")
        if self.vectors is not None:
            s = self.kernel(x, self.vectors, self.vectors_sq).astype(np.float64) @ self.coef + self.rho
        else:
            s = x.astype(np.float64) @ self.coef + self.rho
        s = s.astype(np.float32).reshape(-1, 1)
        if self.one_class:
            s = np.where(s > 0, np.float32(1), np.float32(-1))
        return [transform_scores(s, self.transform)]
