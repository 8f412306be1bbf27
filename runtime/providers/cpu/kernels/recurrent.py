"""RNN, GRU and LSTM (opsets 7 and 14): the input projections of every time step as one BLAS
product, then the recurrence step by step over the whole batch.

Replaces onnx.reference's versions, which ignore ``clip``, know only the default activations and
mishandled ``sequence_lens``. Semantics as the spec and onnxruntime:
- ``clip`` bounds every gate's pre-activation to [-clip, clip].
- ``sequence_lens``: a sequence shorter than the batch's longest stops there. Its later outputs are
  zero and its final state is the one at its last step. In reverse it starts at its own last step.
- ``activation_alpha``/``activation_beta`` are consumed in the order of the activations, by those
  that take them (LeakyRelu, ThresholdedRelu, Elu, Affine, ScaledTanh, HardSigmoid), as
  onnxruntime. An activation left without one takes the default of the ONNX operator of that name,
  as the spec says (LeakyRelu 0.01, ThresholdedRelu 1, Elu 1, HardSigmoid 0.2 and 0.5, Affine 1
  and 0, ScaledTanh 1 and 1). onnxruntime defaults Affine, ScaledTanh and ThresholdedRelu to 0.
"""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import check_terminate
from onnxhal.runtime.providers.cpu.kernels.registry import register


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # no overflow for large |x|


#: name -> (function of (x, alpha, beta), uses alpha, uses beta, default alpha, default beta)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), False, False, 0.0, 0.0),
    "tanh": (lambda x, a, b: np.tanh(x), False, False, 0.0, 0.0),
    "sigmoid": (lambda x, a, b: _sigmoid(x), False, False, 0.0, 0.0),
    "affine": (lambda x, a, b: a * x + b, True, True, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), True, False, 0.01, 0.0),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0), True, False, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), True, True, 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), True, True, 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1)), True, False, 1.0, 0.0),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), False, False, 0.0, 0.0),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), False, False, 0.0, 0.0),
}


def _activations(node: Node, defaults: list[str], directions: int) -> list[list]:
    """Per direction, the list of (fn, alpha, beta) for the op's activation slots."""
    names = list(node.attr("activations", []) or [])
    k = len(defaults)
    if not names:
        names = defaults * directions
    elif len(names) == k and directions == 2:
        names = names * 2  # one set given for both directions
    if len(names) != k * directions:
        raise InvalidArgument(f"{node.op_type} node {node.name!r}: {len(names)} activations {names}; it needs "
                              f"{k * directions} ({k} per direction).")
    alphas = list(node.attr("activation_alpha", []) or [])
    betas = list(node.attr("activation_beta", []) or [])
    out = []
    for name in names:
        entry = _ACTIVATIONS.get(str(name).lower())
        if entry is None:
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: unknown activation {name!r}; the spec's are "
                                  f"{sorted(_ACTIVATIONS)} (any case).")
        fn, uses_a, uses_b, da, db = entry
        a = alphas.pop(0) if uses_a and alphas else da
        b = betas.pop(0) if uses_b and betas else db
        out.append((fn, a, b))
    return [out[d * k:(d + 1) * k] for d in range(directions)]


class _Recurrent(Kernel):
    gates = 1
    default_activations = ["Tanh"]

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.hidden = node.attr("hidden_size")
        direction = node.attr("direction", "forward")
        if direction not in ("forward", "reverse", "bidirectional"):
            raise InvalidArgument(f"{node.op_type} node {node.name!r}: direction {direction!r}; use forward, "
                                  "reverse or bidirectional.")
        self.directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        self.clip = node.attr("clip")
        self.layout = node.attr("layout", 0)
        self.acts = _activations(node, self.default_activations, len(self.directions))
        self.n_out = len(node.outputs)
        self.op = node.op_type
        self.node = node

    def _apply(self, act, x: np.ndarray) -> np.ndarray:
        fn, a, b = act
        if self.clip is not None:
            x = np.clip(x, -self.clip, self.clip)
        return np.asarray(fn(x, a, b), dtype=x.dtype)

    def compute(self, inputs: list) -> list:
        inputs = list(inputs) + [None] * (8 - len(inputs))
        x, w, r, b, lens = inputs[:5]
        if self.layout:
            x = np.swapaxes(x, 0, 1)
        seq, batch, _ = x.shape
        nd, h = len(self.directions), w.shape[1] // self.gates
        if self.hidden is not None and h != self.hidden:
            raise InvalidArgument(f"{self.op}: W has {w.shape[1]} rows, {self.gates} gates x {h}, but hidden_size "
                                  f"is {self.hidden}.")
        if w.shape[0] != nd:
            raise InvalidArgument(f"{self.op}: W's first dimension is {w.shape[0]}; direction needs {nd}.")
        dt = x.dtype
        lens = np.full(batch, seq, np.int64) if lens is None else lens.astype(np.int64)
        all_live = bool((lens >= seq).all())
        states = self._initial_states(inputs, nd, batch, h, dt)
        y = np.zeros((seq, nd, batch, h), dt)
        finals: list[list[np.ndarray]] = [[] for _ in states]
        steps = np.arange(seq)
        for d, direction in enumerate(self.directions):
            wb = b[d, : self.gates * h] if b is not None else 0
            rb = b[d, self.gates * h:] if b is not None else np.zeros(self.gates * h, dt)
            xw = self._input_product(x.reshape(-1, x.shape[2]), w, d, inputs).reshape(seq, batch, -1) + wb
            st = [s[d] for s in states]
            order = steps if direction == "forward" else steps[::-1]
            for t in order:
                check_terminate()  # a long sequence must stop in bounded time when the run is terminated
                new = self._step(xw[t], st, r[d], rb, d, inputs)
                if all_live:  # every sequence runs the whole length: no masking
                    st = new
                    y[t, d] = new[0]
                    continue
                live = (t < lens)[:, None]
                st = [np.where(live, n, o) for n, o in zip(new, st)]
                y[t, d] = np.where(live, new[0], 0)
            for f, s in zip(finals, st):
                f.append(s)
        outs = [y] + [np.stack(f) for f in finals]
        if self.layout:
            outs = [np.transpose(y, (2, 0, 1, 3))] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
        return [np.ascontiguousarray(o, dtype=dt) for o in outs[: self.n_out]]

    def _input_product(self, x: np.ndarray, w: np.ndarray, d: int, inputs: list) -> np.ndarray:
        """Every time step's input times W of direction d (DynamicQuantizeLSTM quantizes it, with
        the scales it finds in ``inputs``)."""
        return x @ w[d].T

    def _hidden_product(self, h: np.ndarray, r: np.ndarray, d: int, inputs: list) -> np.ndarray:
        return h @ r.T

    def _initial_states(self, inputs, nd, batch, h, dt) -> list[np.ndarray]:
        h0 = inputs[5]
        if h0 is None:
            return [np.zeros((nd, batch, h), dt)]
        return [np.swapaxes(h0, 0, 1) if self.layout else h0]


@register("RNN", since=7)
class RNN(_Recurrent):
    def _step(self, xw, st, r, rb, d, inputs):
        return [self._apply(self.acts[d][0], xw + st[0] @ r.T + rb)]


@register("GRU", since=7)
class GRU(_Recurrent):
    gates = 3
    default_activations = ["Sigmoid", "Tanh"]

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.linear_before_reset = bool(node.attr("linear_before_reset", 0))

    def _step(self, xw, st, r, rb, d, inputs):
        hprev = st[0]
        h = hprev.shape[1]
        f, g = self.acts[d]
        hr = hprev @ r[: 2 * h].T + rb[: 2 * h]
        z = self._apply(f, xw[:, :h] + hr[:, :h])
        rt = self._apply(f, xw[:, h:2 * h] + hr[:, h:])
        if self.linear_before_reset:
            cand = xw[:, 2 * h:] + rt * (hprev @ r[2 * h:].T + rb[2 * h:])
        else:
            cand = xw[:, 2 * h:] + (rt * hprev) @ r[2 * h:].T + rb[2 * h:]
        hh = self._apply(g, cand)
        return [(1 - z) * hh + z * hprev]


@register("LSTM", since=7)
class LSTM(_Recurrent):
    gates = 4
    default_activations = ["Sigmoid", "Tanh", "Tanh"]

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.input_forget = bool(node.attr("input_forget", 0))

    def _initial_states(self, inputs, nd, batch, h, dt) -> list[np.ndarray]:
        states = super()._initial_states(inputs, nd, batch, h, dt)
        c0 = inputs[6]
        if c0 is None:
            return states + [np.zeros((nd, batch, h), dt)]
        return states + [np.swapaxes(c0, 0, 1) if self.layout else c0]

    def _step(self, xw, st, r, rb, d, inputs):
        hprev, cprev = st
        h = hprev.shape[1]
        f, g, act_h = self.acts[d]
        p = inputs[7]
        pre = xw + self._hidden_product(hprev, r, d, inputs) + rb  # gates i, o, f, c
        if p is None:  # no peepholes (what exporters write): the gates read their pre-activations alone
            # i, o and f are adjacent and take the same activation, elementwise: one call for the three
            gates = self._apply(f, pre[:, :3 * h])
            i, o = gates[:, :h], gates[:, h:2 * h]
            fg = 1 - i if self.input_forget else gates[:, 2 * h:]
            c = fg * cprev + i * self._apply(g, pre[:, 3 * h:])
        else:
            pi, po, pf = p[d, :h], p[d, h:2 * h], p[d, 2 * h:]
            i = self._apply(f, pre[:, :h] + pi * cprev)
            fg = 1 - i if self.input_forget else self._apply(f, pre[:, 2 * h:3 * h] + pf * cprev)
            c = fg * cprev + i * self._apply(g, pre[:, 3 * h:])
            o = self._apply(f, pre[:, h:2 * h] + po * c)
        # h(Ct) reads the cell state, not a gate's pre-activation: not clipped (onnxruntime neither)
        return [o * np.asarray(act_h[0](c, act_h[1], act_h[2]), dtype=c.dtype), c]
