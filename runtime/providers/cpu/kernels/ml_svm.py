"""SVMClassifier and SVMRegressor as onnxruntime computes them (``svmclassifier.cc``): the kernel
of every row with every support vector as one product, the pairwise (one-vs-one) scores, votes for
the label, and with prob_a/prob_b Platt's sigmoid and the pairwise coupling of libsvm
(``multiclass_probability``) run on all rows at once. onnx.reference's version gave probabilities
up to 0.13 off onnxruntime's (and sklearn's) for a StandardScaler + SVC pipeline.

The coupling's routes (``COUPLING_PATHS``): ``_Coupling`` in numpy is the canonical one; where the
optional C extension was built, libsvm's loop runs there row by row (``_NativeCoupling``)."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.ml_common import (
    ML,
    as_float_rows,
    attr_floats,
    logistic_into,
    post_transform_name,
    transform_scores,
)
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register

try:  # the C entries: np.einsum's and np.count_nonzero's Python layers cost more than their work here
    from numpy._core._multiarray_umath import c_einsum as _einsum
    from numpy._core._multiarray_umath import count_nonzero as _count_nonzero
except ImportError:  # numpy 1.x
    _einsum = np.einsum
    _count_nonzero = np.count_nonzero

# 0-d constants: a ufunc converts a Python scalar operand anew on every call
_ONE = np.ones(())
_ZERO = np.zeros(())
_F32_ZERO = np.zeros((), np.float32)
_F32_ONE = np.ones((), np.float32)
_F32_ONE = np.ones((), np.float32)
_F32_MINUS_ONE = np.array(-1, np.float32)
_F32_LOW = np.array(1e-7, np.float32)  # libsvm's clip of the pairwise probabilities
_F32_HIGH = np.array(1 - 1e-7, np.float32)
_HALF = np.array(0.5)
_EPS_TWO = np.array(0.005 / 2)  # libsvm's stopping threshold for two classes
_EPS_TWO_START = np.array(0.005)  # the same at p = (0.5, 0.5): |d| / 2 >= eps


class _SvmKernel:
    """The kernel of every row with every support vector, as one [N, vectors] float32 matrix."""

    def __init__(self, node: Node, vectors: np.ndarray | None) -> None:
        self.kind = node.attr("kernel_type", "LINEAR")
        params = list(node.attr("kernel_params", [])) + [0.0, 0.0, 0.0]
        self.gamma, self.coef0, self.degree = np.float32(params[0]), np.float32(params[1]), np.float32(params[2])
        if self.kind not in ("LINEAR", "POLY", "RBF", "SIGMOID"):
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: kernel_type {self.kind!r} is none of "
                                  "LINEAR, POLY, RBF, SIGMOID.")
        self.op = f"{node.op_type} node {node.name!r}"
        if vectors is None:
            return
        self.vectors_t = vectors.T.copy()
        # RBF as exp([x, x*x, 1] @ [2 gamma v; -gamma; -gamma |v|^2]) = exp(-gamma |x - v|^2): one
        # matmul on the row built from x. The exponent is not clipped at 0: where x is a support
        # vector it comes out within float32 rounding of 0, the error every entry carries (the sum
        # of squares of x - v, onnxruntime's form, has none)
        gamma = self.gamma
        self.rbf = np.concatenate([vectors.T * (2 * gamma), np.full(vectors.shape[::-1], -gamma),
                                   -gamma * (vectors * vectors).sum(axis=1, dtype=np.float32)[None]]).astype(np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        f = self.vectors_t.shape[0]
        if x.shape[1] != f:
            raise InvalidArgument(f"{self.op}: input has {x.shape[1]} features, the support vectors {f}. "
                                  "Feed rows of the features the model was trained on.")
        if self.kind == "RBF":
            row = np.empty((x.shape[0], 2 * f + 1), np.float32)
            row[:, :f] = x
            np.multiply(x, x, out=row[:, f:2 * f])
            row[:, 2 * f] = 1
            e = np.matmul(row, self.rbf)
            return np.exp(e, out=e)
        dot = x @ self.vectors_t
        if self.kind == "LINEAR":
            return dot
        if self.kind == "POLY":
            return np.power(self.gamma * dot + self.coef0, self.degree).astype(np.float32)
        return np.tanh(self.gamma * dot + self.coef0)


class _Coupling:
    """libsvm's multiclass_probability for k >= 3 classes on every row at once, in float64 (onnxruntime
    sums in float32: about 1e-7 apart). Each row runs libsvm's iterations until its own stopping rule
    (max_t |(Qp)_t - pQp| < 0.005 / k, at most 100 iterations) holds: onnxruntime returns that
    iterate, not the exact solution, so the iterations themselves are kept; only how each is computed
    differs, with a numpy call costing about a microsecond on these small arrays:

    - Q's entries are linear in the features (1, r_c, r_c^2) of the pairwise probabilities r_c, so
      one matmul with a table built here gives every per-row matrix used below;
    - with sum(p) = 1, pQp - (Qp)_t = p' N_t p where N_t[i, j] = Q[i, j] - Q[t, j]: one einsum gives
      the stopping rule's k values at the start of an iteration, and class t's step is
      p' M_t p with M_t = N_t / Q[t, t] (one einsum); at the uniform start both come from the table;
    - within an iteration p is kept unnormalized (u, sum s): class t's step adds diff * s to u_t only,
      and u is divided by s once per iteration, in place of libsvm's division of p per class;
    - a row that stops takes steps of 0 from then on: rows are never gathered or scattered.
    """

    def __init__(self, pair_i: np.ndarray, pair_j: np.ndarray, k: int) -> None:
        pairs = len(pair_i)
        feats = 2 * pairs + 1  # 1, r_c (c < pairs), r_c^2
        q = np.zeros((k, k, feats))  # Q[a, b] as coefficients of the features
        for c, (i, j) in enumerate(zip(pair_i.tolist(), pair_j.tolist())):
            lin, sq = 1 + c, 1 + pairs + c
            q[j, j, sq] += 1  # r[i, j]^2 = r_c^2
            q[i, i, 0] += 1  # r[j, i]^2 = (1 - r_c)^2
            q[i, i, lin] -= 2
            q[i, i, sq] += 1
            q[i, j, lin] = q[j, i, lin] = -1  # -r[j, i] r[i, j] = r_c^2 - r_c
            q[i, j, sq] = q[j, i, sq] = 1
        n_t = q[None, :, :, :] - q[:, None, :, :]  # [t, a, b]: Q[a, b] - Q[t, b]
        start = np.zeros((k, feats))
        start[:, 0] = 1.0 / k
        # rows of the table: N (k^3), Q[t, t] (k), p' N_t p at p uniform (k), p uniform (k); it holds
        # about k^5 values: above 6 classes N comes from Q, built from r pair by pair
        self.table = None if k > 6 else np.concatenate([n_t.reshape(k ** 3, feats), q[np.arange(k), np.arange(k)],
                                                        n_t.sum(axis=(1, 2)) / (k * k), start])
        self.pair_i, self.pair_j = pair_i, pair_j
        self.k, self.pairs, self.feats = k, pairs, feats
        self.eps = np.array(0.005 / k)
        self.chunk = max(1, (1 << 21) // k ** 3)  # rows a call: N and M at most 16 MB each

    def _start(self, v: np.ndarray) -> tuple:
        """N [k, k, k, rows], Q[t, t] [k, rows], the rule's values at p uniform [k, rows] and p uniform
        [k, rows], all fresh arrays or views of one."""
        k, pairs, n = self.k, self.pairs, v.shape[0]
        if self.table is not None:
            feat = np.empty((self.feats, n))
            feat[0] = 1
            lin = feat[1:pairs + 1]
            lin[...] = v.T
            np.multiply(lin, lin, out=feat[pairs + 1:])
            g = np.matmul(self.table, feat)
            cube = k ** 3
            return g[:cube].reshape(k, k, k, n), g[cube:cube + k], g[cube + k:cube + 2 * k], g[cube + 2 * k:]
        r = np.zeros((k, k, n))
        r[self.pair_i, self.pair_j] = v.T
        r[self.pair_j, self.pair_i] = 1 - v.T.astype(np.float64)
        q = np.multiply(r.transpose(1, 0, 2), r)  # -r[j, i] r[i, j] off the diagonal
        np.negative(q, out=q)
        q_tt = np.add.reduce(r * r, axis=0)  # sum over j of r[j, t]^2
        q.reshape(k * k, n)[::k + 1] = q_tt
        n_t = np.subtract(q[None], q[:, None])
        return n_t, q_tt, np.add.reduce(n_t, axis=(1, 2)) / (k * k), np.full((k, n), 1.0 / k)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        """v [N, pairs] the clipped pairwise probabilities r[i, j] of the pairs (i, j); returns p [N, k]
        float32."""
        k = self.k
        n = v.shape[0]
        if not n:
            return np.empty((0, k), np.float32)
        if n > self.chunk:  # N and M hold k^3 values a row: bounded by rows taken a chunk at a time
            return np.concatenate([self(v[i:i + self.chunk]) for i in range(0, n, self.chunk)])
        check_terminate()
        n_t, q_tt, e, u = self._start(v)
        m = np.divide(n_t.reshape(k, k * k, n), q_tt.reshape(k, 1, n)).reshape(k, k, k, n)
        m_t = list(m)
        u_t = list(u)
        q_00 = q_tt[0]
        eps = self.eps
        s = _ONE  # the sum of u after an iteration's steps
        for iteration in range(100):
            check_terminate()
            if iteration:
                np.divide(u, s, out=u)
                e = _einsum("in,tijn,jn->tn", u, n_t, u)
            step = np.divide(e[0], q_00)  # class 0's step, from the stopping rule's values
            np.abs(e, out=e)
            err = np.maximum(e[0], e[1])
            for t in range(2, k):
                np.maximum(err, e[t], out=err)
            active = np.greater_equal(err, eps)  # a NaN error stops the row, as libsvm's max does
            live = _count_nonzero(active)
            if not live:
                if not iteration:  # p = 1/k (a row of NaNs has NaN in u, from the table)
                    u.fill(1.0 / k)
                break
            # a row that stopped keeps its p, so its rule keeps holding: only its steps are zeroed
            partial = live < n
            if partial:
                stopped = np.logical_not(active)
                if not iteration:
                    u[:, stopped] = 1.0 / k
                np.copyto(step, _ZERO, where=stopped)
            u_t[0] += step
            s = np.add(step, _ONE)
            for t in range(1, k):
                step = _einsum("in,ijn,jn->n", u, m_t[t], u)
                step /= s
                if partial:
                    np.copyto(step, _ZERO, where=stopped)
                u_t[t] += step
                s += step
        else:
            np.divide(u, s, out=u)
        return u.T.astype(np.float32)


#: The coupling's routes, by name (two classes take ``_coupling_two``'s closed form on every route).
COUPLING_PATHS = path_table("SVMClassifier.coupling", "_Coupling: libsvm's iterations as numpy calls")
COUPLING_PATHS.add("numpy", "canonical (_Coupling): every row at once, libsvm's iterations as numpy calls; two "
                            "classes: the same iterations in closed form (_coupling_two)")
COUPLING_PATHS.add("native", "the C extension _native is built and ONNXHAL_NATIVE_KERNELS is not 0, k >= 2 classes "
                           "of k (k - 1) / 2 pairs: libsvm's loop row by row in double (_native.coupling), and with "
                           "prob_a and prob_b one per pair, Platt's sigmoid before it in C too (_native.platt, "
                           "against _platt_pairs)")


class _NativeCoupling:
    """libsvm's multiclass_probability in C, row by row in double, its Q, Qp and pQp updated as
    libsvm (svm.cpp) updates them; ``_Coupling`` computes the same iterations in another order, so
    the two agree within libsvm's own rounding (tests/test_tree_native.py bounds it)."""

    #: rows a call: the terminate flag is read between two
    CHUNK = 1 << 14

    def __init__(self, native: ModuleType, pair_i: np.ndarray, pair_j: np.ndarray, k: int) -> None:
        self.fn = native.coupling
        self.platt = native.platt
        self.pair_i, self.pair_j = np.asarray(pair_i, np.int64), np.asarray(pair_j, np.int64)
        self.k = k

    @classmethod
    def build(cls, pair_i: np.ndarray, pair_j: np.ndarray, k: int) -> _NativeCoupling | None:
        """The C route where ``COUPLING_PATHS["native"]``'s condition holds, else None."""
        native = native_module()
        if native is None or k < 2 or len(pair_i) != k * (k - 1) // 2:
            return None
        return cls(native, pair_i, pair_j, k)

    def from_scores(self, scores: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray) -> np.ndarray:
        """p [N, k] float32 from the pairwise scores [N, pairs] float32: Platt's sigmoid in C
        (``_native.platt``, ``_platt_pairs``'s rounding but for numpy's and C's exp), then the
        coupling."""
        v = np.empty(scores.shape, np.float32)
        self.platt(np.ascontiguousarray(scores, np.float32), prob_a, prob_b, v)
        return self(v)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        """v [N, pairs] the clipped pairwise probabilities r[i, j] of the pairs (i, j); p [N, k] float32."""
        v = np.ascontiguousarray(v, np.float32)
        p = np.empty((v.shape[0], self.k), np.float32)
        step = self.CHUNK
        for i in range(0, v.shape[0], step):
            check_terminate()
            self.fn(v[i:i + step], self.pair_i, self.pair_j, self.k, p[i:i + step])
        return p


def _coupling_two(v: np.ndarray) -> np.ndarray:
    """``_Coupling`` for two classes, solved in closed form: with a = r[0, 1], b = 1 - a and
    p = (a + d, b - d), Qp = (b d, -a d) and pQp = d^2, so the state is d alone; the stopping rule
    is |d| max(|b - d|, |a + d|) < eps, the step for class 0 maps d to b d^2 / (b^2 - b d + d^2)
    and the step for class 1 maps it to -a d^2 / (a^2 + a d + d^2). The same iterations as the
    general loop, in float64 with a few operations a step (the float32 loop rounds differently, by
    about 1e-7). v: [N] the pair's probabilities; returns p [N, 2] float32."""
    a = v.astype(np.float64)
    b = np.subtract(_ONE, a)
    a_half = np.subtract(a, _HALF)
    aa, bb, minus_a = np.multiply(a, a), np.multiply(b, b), np.negative(a)
    d = np.negative(a_half)
    n = len(a)
    first_stop = None
    # libsvm allows 100 iterations; for r in [1e-7, 1 - 1e-7] (the clipped range) the rule holds
    # after two: |d| max(p) < 0.06 eps then, at most, on 4M values of r spread over the range and
    # its two ends (a smooth function of r), so the third check is not run
    for iteration in range(2):
        check_terminate()
        # p0 = a + d and p1 = b - d stay in (0, 1) (both steps keep them positive, summing to 1):
        # max(|p0|, |p1|) = 0.5 + |p0 - 0.5|; at the start (d = 0.5 - a) the rule is |a - 0.5| / 2
        if iteration:
            err = np.add(d, a_half)
            np.abs(err, out=err)
            err += _HALF
            err *= np.abs(d)
            active = np.greater_equal(err, _EPS_TWO)
        else:
            active = np.greater_equal(np.abs(a_half), _EPS_TWO_START)
        live = _count_nonzero(active)
        if not iteration and live < n:  # these rows keep libsvm's start, p = (0.5, 0.5): NaN rows too
            first_stop = np.logical_not(active)
        if not live:
            break
        dd = np.multiply(d, d)
        e = np.multiply(dd, b)
        den = np.subtract(d, b)
        den *= d
        den += bb
        e /= den  # class 0's step: b d^2 / (b^2 - b d + d^2)
        f = np.multiply(e, e)
        den = np.add(e, a)
        den *= e
        den += aa
        f *= minus_a
        f /= den  # class 1's step: -a e^2 / (a^2 + a e + e^2)
        if live == n:
            d = f
        else:  # a row that stopped keeps its d, so its rule keeps holding
            np.copyto(d, f, where=active)
    p = np.empty((n, 2), np.float32)
    np.add(a, d, out=p[:, 0])
    np.subtract(b, d, out=p[:, 1])
    if first_stop is not None:
        p[first_stop] = 0.5
    return p


def _platt_pairs(scores: np.ndarray, prob_a: np.ndarray, prob_b: np.ndarray) -> np.ndarray:
    """The pairwise probabilities r[i, j] = 1 - logistic(a s + b) clipped to [1e-7, 1 - 1e-7], in
    place on the float32 scores, rounded as onnxruntime's ``sigmoid_probability`` rounds them: with
    w = 1 / (1 + exp(-|x|)) in [0.5, 1], 1 - w where x >= 0, and where x < 0 its 1 - (1 - w), which
    is w exactly (1 - w is exact for w in [0.5, 1], and so is 1 minus that)."""
    np.multiply(scores, prob_a, out=scores)
    np.add(scores, prob_b, out=scores)
    upper = np.greater_equal(scores, _F32_ZERO)
    np.copysign(scores, _F32_MINUS_ONE, out=scores)
    np.exp(scores, out=scores)
    np.add(scores, _F32_ONE, out=scores)
    np.divide(_F32_ONE, scores, out=scores)
    np.subtract(_F32_ONE, scores, out=scores, where=upper)
    np.maximum(scores, _F32_LOW, out=scores)
    return np.minimum(scores, _F32_HIGH, out=scores)


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
        coef = attr_floats(node, "coefficients")
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
        self.vectors = attr_floats(node, "support_vectors").reshape(count, -1)
        self.coef = coef.reshape(self.k - 1, count)
        self.kernel = _SvmKernel(node, self.vectors)
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
        # up to 8 pairs (4 classes), the label of each of the 2^pairs patterns of wins, found by the
        # rule above: a row's label is one lookup of its wins as the bits of a byte
        self.vote_bits = self.vote_labels = None
        if 2 < self.k and len(self.pairs) <= 8:
            self.vote_bits = (1 << np.arange(len(self.pairs))).astype(np.uint8)
            wins = (np.arange(1 << len(self.pairs))[:, None] & self.vote_bits) > 0
            self.vote_labels = self.labels[(wins @ self.vote_swing + self.vote_base).argmax(axis=1)]
        # two classes without the C route: ``_coupling_two``, the closed form of the same iterations
        # (a few dozen numpy calls however few the rows; the C loop is one call)
        self.coupling = _NativeCoupling.build(self.pair_i, self.pair_j, self.k) or (
            None if self.k <= 2 else _Coupling(self.pair_i, self.pair_j, self.k))

    def compute(self, inputs: list) -> list:
        x = as_float_rows(inputs[0], "SVMClassifier")
        if self.linear:
            return self._linear(x)
        kern = self.kernel(x)
        check_terminate()
        scores = np.matmul(kern.astype(np.float64), self.pair_coef)
        np.add(scores, self.rho64, out=scores)
        scores = scores.astype(np.float32)
        if self.k == 2:  # one pair: its vote goes to class 0 where its score is positive, else to class 1
            label = self.labels[::-1].take(np.greater(scores[:, 0], _F32_ZERO).view(np.int8))
        elif self.vote_labels is not None:
            label = self.vote_labels[np.matmul(np.greater(scores, _F32_ZERO).view(np.uint8), self.vote_bits)]
        else:
            votes = np.matmul(scores > 0, self.vote_swing)
            np.add(votes, self.vote_base, out=votes)
            label = self.labels[votes.argmax(axis=1)]
        if self.prob_a.size:
            if isinstance(self.coupling, _NativeCoupling) and self.prob_a.size == self.prob_b.size == scores.shape[1]:
                p = self.coupling.from_scores(scores, self.prob_a, self.prob_b)
            else:
                v = _platt_pairs(scores, self.prob_a, self.prob_b)
                p = _coupling_two(v[:, 0]) if self.coupling is None else self.coupling(v)
            return [label, transform_scores(p, self.transform)]
        if self.k == 2:  # one pairwise score as two columns: [-s, s], or [1 - p, p] (p the logistic of s)
            s = scores[:, 0]
            if self.transform == "PROBIT":
                return [label, np.stack([transform_scores(scores, "PROBIT")[:, 0], np.zeros_like(s)], axis=1)]
            if self.transform == "LOGISTIC":
                s = logistic_into(s)  # the scores are this call's own float32 array
            # [first, s] written into one array (np.stack's Python wrapper costs more than the rows)
            out = np.empty((s.shape[0], 2), np.float32)
            if self.transform == "NONE":
                np.negative(s, out=out[:, 0])
            else:
                np.subtract(_F32_ONE, s, out=out[:, 0])
            out[:, 1] = s
            return [label, out]
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
    inline_fn = INLINE_APPLY

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.n_supports = int(node.attr("n_supports", 0))
        coef = attr_floats(node, "coefficients")
        self.rho = np.float32(node.attr("rho", [0.0])[0])
        self.one_class = bool(node.attr("one_class", 0))
        self.transform = post_transform_name(node)
        if self.n_supports > 0:
            self.vectors = attr_floats(node, "support_vectors").reshape(self.n_supports, -1)
            self.coef = coef.reshape(self.n_supports)
        else:  # linear: the coefficients are the weights of the features
            self.vectors = None
            self.coef = coef
        self.kernel = _SvmKernel(node, self.vectors)

    def compute(self, inputs: list) -> list:
        return [self.apply(inputs[0])]

    def apply(self, x: np.ndarray) -> np.ndarray:
        x = as_float_rows(x, "SVMRegressor")
        if self.vectors is not None:
            s = self.kernel(x).astype(np.float64) @ self.coef + self.rho
        else:
            s = x.astype(np.float64) @ self.coef + self.rho
        s = s.astype(np.float32).reshape(-1, 1)
        if self.one_class:
            s = np.where(s > 0, np.float32(1), np.float32(-1))
        return transform_scores(s, self.transform)
