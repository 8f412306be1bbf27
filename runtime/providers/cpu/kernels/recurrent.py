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

The canonical loop is ``RecurrentKernel.plain_loop``. Fast paths, each with its switch and condition,
tested against it in tests/test_recurrent_fast_paths.py:
- GRU and RNN's default form (default activations, no clip, float types; a batch of sequences of
  several lengths masks each step's ended rows, ``masked_step``): ``RecurrentKernel._run_transposed``, states [hidden, batch] and preallocated gates
  (``TRANSPOSED_ENABLED``; GRU twelve calls a step, RNN three).
- GRU and RNN in that form where the C extension is built and hidden^2 x batch and the batch are
  small (``native_gru_applies``, ``native_rnn_applies``): ``RecurrentKernel._run_native``, one C call
  a block of steps of one direction, shorter rows skipped as ``masked_step`` (tested in
  tests/test_gru_native.py).
- LSTM's default form: ``LSTM._run_default``, nine calls a step per direction (with sequences of
  several lengths masked, float weights: the C and paired loops below have no mask); where the C
  extension is built and the step's R product is small (``native_lstm_applies``), ``LSTM._run_native``,
  one C call a block of steps (tested in tests/test_lstm_native.py).
- A bidirectional layer with small hidden x batch (``both_directions_apply``): both directions in
  one step (``PAIR_ENABLED``), LSTM's and DynamicQuantizeLSTM's ``_run_both_directions``, GRU and
  RNN's ``_run_transposed_pair``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.run_control import RUN_OPTIONS, check_terminate
from onnxhal.runtime.providers.cpu.kernels import half_via_float as half
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
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


class RecurrentKernel(Kernel):
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
        self.widen = half.WidenedInputs(node, ctx)
        defaults = tuple(_ACTIVATIONS[n.lower()][0] for n in self.default_activations)
        # the form ``_run_transposed`` takes: default activations, no clip (what exporters write)
        self.default_form = self.clip is None and all(tuple(a[0] for a in acts) == defaults for acts in self.acts)
        names = list(node.inputs) + [""] * 4
        self.constant_weights = ctx is not None and all(
            not names[i] or ctx.is_constant_initializer(names[i]) for i in (1, 2, 3))
        self._prepared: tuple | None = None  # (input dtype, per-direction weights)
        self._paired: tuple | None = None  # (the per-direction weights, both directions' in pair order)
        self._fast_ok = False  # whether this kernel has a ``_run_transposed`` form (GRU, RNN)

    def _via_float32(self, inputs: list) -> bool:
        """The float16 fast path's condition: X and W float16 (numpy's float16 products have no
        BLAS; onnxruntime computes these ops in float32 between Casts, as half_via_float says)."""
        x = inputs[0]
        return isinstance(x, np.ndarray) and x.dtype is half.F16 and len(inputs) > 1 and isinstance(
            inputs[1], np.ndarray) and half.applies(x, inputs[1])

    def _apply(self, act, x: np.ndarray) -> np.ndarray:
        fn, a, b = act
        if self.clip is not None:
            x = np.clip(x, -self.clip, self.clip)
        return np.asarray(fn(x, a, b), dtype=x.dtype)

    def compute(self, inputs: list) -> list:
        return empty_sequences_zeroed(self.compute_paths(inputs), inputs, self.layout)

    def compute_paths(self, inputs: list) -> list:
        """The outputs by the first path whose condition holds (``RECURRENT_PATHS``)."""
        if self._via_float32(inputs):
            return half.via_float32(self.compute, inputs, self.widen)
        if self._fast_ok and self.default_form and TRANSPOSED_ENABLED:
            weights = self._fast_weights(inputs)
            if weights is not None:
                x = inputs[0]
                if self._native is not None and self._native_applies(weights[0][1].shape[1],
                                                                     x.shape[0 if self.layout else 1]):
                    return self._run_native(x, inputs, weights, self._native_weights(weights))
                return self._run_transposed(x, inputs, weights)
        return self.plain_loop(inputs)

    #: the C steps' module where this kernel has them (``GRU._run_native``), else None
    _native = None

    def _native_applies(self, hidden: int, batch: int) -> bool:
        """The condition of ``_run_native`` (``_native`` built and switched on, checked by the caller)."""
        return False

    def _native_weights(self, weights: list) -> list:
        """Per direction (R^T [hidden, gates * hidden] contiguous, of ``_prepare_direction``'s R (GRU's
        z and r rows halved); GRU's step bias of h, contiguous, or None) for the C steps."""
        kept = self._native_rt
        if kept is not None and kept[0] is weights:
            return kept[1]
        native = [(np.ascontiguousarray(wd[1].T), None if wd[3] is None else np.ascontiguousarray(wd[3]))
                  for wd in weights]
        self._native_rt = (weights, native)  # one swap: a concurrent run sees the old entry or this one
        return native

    def _run_native(self, x: np.ndarray, args: list, weights: list, native: list) -> list:
        """``_run_transposed``'s recurrence with the steps in C (``_native_steps``: GRU's
        ``_native.gru_steps``, RNN's ``rnn_steps``; ``native`` is ``_native_weights``'s): per direction (a bidirectional layer's one after the other) and
        block of ``_BLOCK`` steps, the block's input projections in one product, then its steps
        (the bias added there) in one C call where numpy takes twelve a step. The terminate flag is read
        between two blocks. Sequences of several lengths (``ragged_lengths``): the C steps skip
        a row at and past its length, as ``masked_step``."""
        x, h0, lens = self._time_major_run(x, args)
        seq, batch, k = x.shape
        dt = x.dtype
        nd = len(self.directions)
        h = weights[0][1].shape[1]
        y = np.empty((seq, nd, batch, h), dt)
        y_h = np.zeros((nd, batch, h), dt) if h0 is None else np.array(h0, dt, order="C")  # in and out of the C steps
        x2 = x.reshape(seq * batch, k)
        steps = self._native_steps
        for d in range(nd):
            wt, _, bias, _ = weights[d]
            rt, rbh = native[d]
            reverse = self.reverse[d]
            for b0 in range(0, seq, _BLOCK):
                check_terminate()
                count = min(_BLOCK, seq - b0)
                lo = seq - b0 - count if reverse else b0  # the block's steps lo .. lo + count - 1
                # (the bias is added in the C steps, as numpy would before the R product's sum: a
                # numpy add here costs half the product)
                xw = np.dot(x2[lo * batch:(lo + count) * batch], wt)
                steps(xw, rt, y_h[d], y[lo:lo + count], d, count - 1 if reverse else 0, count, -1 if reverse else 1,
                      rbh, None if lens is None else lens - lo, bias)
        if self.layout:  # [batch, seq, directions, hidden]
            return [np.ascontiguousarray(y.transpose(2, 0, 1, 3)),
                    np.ascontiguousarray(np.swapaxes(y_h, 0, 1))][: self.n_out]
        return [y, y_h][: self.n_out]

    def _native_steps(self, *args) -> None:
        """One C call: (xw, rt, h, y, d, first, count, step, step bias, lens, bias)."""
        raise NotImplementedError

    def _fast_weights(self, inputs: list) -> list | None:
        """``_prepare``'s per-direction weights where ``_run_transposed`` takes the run (a float
        type throughout, sequence_lens absent or one length per batch row within [0, seq] (shorter
        rows are masked: ``ragged_lengths``), initial_h of X's type and shape), else None. Kept
        while W, R and B are constant initializers."""
        x = inputs[0]
        n = len(inputs)
        lens = inputs[4] if n > 4 else None
        h0 = inputs[5] if n > 5 else None
        if not (isinstance(x, np.ndarray) and x.dtype in _FAST_TYPES and x.ndim == 3 and x.shape[0] and x.shape[1]):
            return None
        batch_axis = 0 if self.layout else 1
        if lens is not None and not ragged_lengths_apply(lens, x.shape[1 - batch_axis], x.shape[batch_axis]):
            return None
        if h0 is not None and (h0.dtype != x.dtype or h0.ndim != 3 or h0.shape[batch_axis] != x.shape[batch_axis]
                               or h0.shape[1 - batch_axis] != len(self.directions)):
            return None
        prepared = self._prepared  # the same arrays every run while they are constant initializers
        weights = prepared[1] if prepared is not None and prepared[0] == x.dtype else self._prepare_all(inputs, x)
        if weights is None or (h0 is not None and h0.shape[2] != weights[0][1].shape[1]):
            return None
        return weights

    def _prepare_all(self, inputs: list, x: np.ndarray) -> list | None:
        """``_prepare_direction`` of every direction, or None where the types or shapes are not
        the fast form's (the plain loop then promotes them or names the problem)."""
        n = len(inputs)
        w, r, b = inputs[1], inputs[2], inputs[3] if n > 3 else None
        g, nd = self.gates, len(self.directions)
        if (w.dtype != x.dtype or r.dtype != x.dtype or (b is not None and b.dtype != x.dtype) or w.ndim != 3
                or r.ndim != 3):
            return None
        h = r.shape[2]
        if (w.shape[0] != nd or w.shape[1] != g * h or w.shape[2] != x.shape[2] or r.shape != (nd, g * h, h)
                or (self.hidden is not None and h != self.hidden) or (b is not None and b.shape != (nd, 2 * g * h))):
            return None
        weights = [self._prepare_direction(w[d], r[d], None if b is None else b[d], h) for d in range(nd)]
        if self.constant_weights:
            self._prepared = (x.dtype, weights)  # one swap: a concurrent run sees either
        return weights

    def _prepare_direction(self, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, h: int) -> tuple:
        """(W^T [input, gates * hidden], R, the bias row of the input projections or None, the
        bias the step adds itself or None) of one direction, for ``_step_transposed``."""
        raise NotImplementedError

    def _time_major_run(self, x: np.ndarray, args: list) -> tuple:
        """X and initial_h (input 5, or None) with time first (``layout`` 1 gives them batch
        first), and ``ragged_lengths`` of sequence_lens (input 4)."""
        h0 = args[5] if len(args) > 5 else None
        if self.layout:
            x = np.swapaxes(x, 0, 1)
            h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
        return x, h0, ragged_lengths(args[4] if len(args) > 4 else None, x.shape[0])

    def _run_transposed(self, x: np.ndarray, args: list, weights: list) -> list:
        """The recurrence on transposed states, [gates or hidden, batch] (each gate's block of
        rows one contiguous piece), with preallocated gates: all steps' input projections and
        their bias in one product per direction, then ``_step_transposed`` per step."""
        x, h0, lens = self._time_major_run(x, args)
        seq, batch, k = x.shape
        dt = x.dtype
        nd = len(self.directions)
        h = weights[0][1].shape[1]
        x2 = x.reshape(seq * batch, k)
        run_options = RUN_OPTIONS.get()
        if nd == 2 and both_directions_apply(h, batch):
            return self._run_transposed_pair(x2, seq, batch, h0, weights, run_options, lens)
        yt = np.empty((seq, nd, h, batch), dt)  # Y with each step's hidden state transposed
        y_h = np.empty((nd, batch, h), dt)
        shortest = seq if lens is None else int(lens.min())
        for d in range(nd):
            wt, r, bias, step_bias = weights[d]
            xw = np.dot(x2, wt)
            if bias is not None:
                np.add(xw, bias, xw)
            ws = self._step_workspace(h, batch, dt, step_bias)
            hd = np.zeros((h, batch), dt) if h0 is None else h0[d].T
            for t, xt in projection_steps(xw.reshape(seq, batch, -1), self.reverse[d], run_options):
                out = yt[t, d]
                self._step_transposed(xt, hd, r, ws, out)
                hd = out if t < shortest else masked_step(out, hd, t >= lens)
            y_h[d] = hd.T
        if self.layout:  # [batch, seq, directions, hidden]
            return [np.ascontiguousarray(yt.transpose(3, 0, 1, 2)),
                    np.ascontiguousarray(np.swapaxes(y_h, 0, 1))][: self.n_out]
        return [np.ascontiguousarray(yt.transpose(0, 1, 3, 2)), y_h][: self.n_out]

    def _run_transposed_pair(self, x2: np.ndarray, seq: int, batch: int, h0: np.ndarray | None, weights: list,
                             run_options, lens: np.ndarray | None = None) -> list:
        """``_run_transposed`` of a bidirectional layer with both directions in one step
        (``both_directions_apply``), as LSTM's ``_run_both_directions``: step t runs the forward's
        time t and the backward's seq - 1 - t on one state [2 * hidden, batch], each gate's rows
        of both directions side by side (``pair_rows``), R one block-diagonal product; the step is
        ``_step_transposed``'s with hidden 2 * hidden. ``lens`` (``ragged_lengths``): each
        direction's rows of a batch column past its sequence are masked (``masked_step``)."""
        dt = x2.dtype
        wt, r, bias, step_bias = self._pair_transposed(weights)
        h = r.shape[1] // 2
        xw = np.dot(x2, wt)
        if bias is not None:
            np.add(xw, bias, xw)
        ys = np.empty((seq, 2 * h, batch), dt)
        ws = self._step_workspace(2 * h, batch, dt, step_bias)
        hd = np.zeros((2 * h, batch), dt) if h0 is None else h0.transpose(0, 2, 1).reshape(2 * h, batch)
        step = self._step_transposed
        shortest = seq if lens is None else int(lens.min())
        if shortest < seq:
            # per step [2, 1, batch]: the batch columns whose sequence has ended, the forward's at time t
            # and the backward's at seq - 1 - t, made for every step at once and broadcast over each
            # direction's rows (a [2 * hidden, batch] mask a step cost more numpy calls than the step)
            steps = np.arange(seq)
            dead = np.stack([steps[:, None] >= lens, steps[::-1, None] >= lens], axis=1)[:, :, None, :]
        t = 0
        for xs, outs in pair_blocks(xw.reshape(seq, batch, self.gates, 2, h), ys):
            for xt, out in zip(xs, outs):
                if run_options is not None and run_options.terminate:  # a long sequence stops in bounded time
                    check_terminate()
                step(xt, hd, r, ws, out)
                if t < shortest and seq - 1 - t < shortest:
                    hd = out
                else:  # forward rows at time t, backward rows at seq - 1 - t (``out`` is zeroed in place)
                    hd = masked_step(out.reshape(2, h, batch), hd.reshape(2, h, batch), dead[t]).reshape(2 * h, batch)
                t += 1
        return paired_outputs(ys, [], self.layout, self.n_out, last=hd)

    def _pair_transposed(self, weights: list) -> tuple:
        """Both directions' ``_prepare_direction`` weights in ``pair_rows`` order: W^T
        [input, 2 * gates * hidden], block-diagonal R [2 * gates * hidden, 2 * hidden], the bias
        rows; kept while the per-direction weights are the same (constant initializers)."""
        kept = self._paired
        if kept is not None and kept[0] is weights:
            return kept[1]
        (wf, rf, bf, sf), (wb, rb, bb, sb) = weights
        h, g = rf.shape[1], self.gates
        rows = pair_rows(h, g)
        r2 = np.zeros((2 * g * h, 2 * h), rf.dtype)
        r2[:g * h, :h] = rf
        r2[g * h:, h:] = rb
        paired = (np.ascontiguousarray(np.concatenate([wf, wb], axis=1)[:, rows]), np.ascontiguousarray(r2[rows]),
                  None if bf is None else np.concatenate([bf, bb])[rows],
                  None if sf is None else np.concatenate([sf, sb]))  # (the step's bias: one gate's rows)
        self._paired = (weights, paired)  # one swap: a concurrent run sees the old entry or this one
        return paired

    def _step_workspace(self, h: int, batch: int, dt: np.dtype, step_bias: np.ndarray | None) -> tuple:
        return ()

    def plain_loop(self, inputs: list) -> list:
        """The canonical loop: every form, step by step over the whole batch."""
        if self._via_float32(inputs):
            return half.via_float32(self.compute, inputs, self.widen)
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
        # Steps at or past the longest sequence change nothing; onnxruntime leaves them out, and
        # so out of the range DynamicQuantizeLSTM quantizes the inputs on.
        live_seq = seq if all_live else min(seq, int(lens.max(initial=0)))
        steps = np.arange(live_seq)
        for d, direction in enumerate(self.directions):
            wb = b[d, : self.gates * h] if b is not None else 0
            rb = b[d, self.gates * h:] if b is not None else np.zeros(self.gates * h, dt)
            xw = self._input_product(x[:live_seq].reshape(-1, x.shape[2]), w, d, inputs).reshape(
                live_seq, batch, self.gates * h) + wb
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
class RNN(RecurrentKernel):
    """The default form (Tanh, no clip, every sequence the full length) runs
    ``_run_transposed``: three calls a step (R product, input projection, tanh in place)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self._fast_ok = True
        self.reverse = [d == "reverse" for d in self.directions]
        self._native = native_module() if NATIVE_RNN_ENABLED else None  # as GRU's
        self._native_rt: tuple | None = None

    def _native_applies(self, hidden: int, batch: int) -> bool:
        return native_rnn_applies(hidden, batch)

    def _native_steps(self, *args) -> None:
        self._native.rnn_steps(*args[:8], *args[9:])  # (no step bias)

    def _step(self, xw, st, r, rb, d, inputs):
        return [self._apply(self.acts[d][0], xw + st[0] @ r.T + rb)]

    def _prepare_direction(self, w, r, b, h):
        bias = None if b is None else b[:h] + b[h:]
        return np.ascontiguousarray(w.T), np.ascontiguousarray(r), bias, None

    def _step_transposed(self, xt, hd, r, ws, out):
        np.dot(r, hd, out)
        np.add(out, xt, out)
        np.tanh(out, out)


@register("GRU", since=7)
class GRU(RecurrentKernel):
    gates = 3
    default_activations = ["Sigmoid", "Tanh"]

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.linear_before_reset = bool(node.attr("linear_before_reset", 0))
        self._fast_ok = True
        self.reverse = [d == "reverse" for d in self.directions]
        # the C steps (``_run_native``), None where not built or switched off; the switch read here
        # too, so that a session made with it off keeps the numpy loop (benchmarks/switch_ab.py)
        self._native = native_module() if NATIVE_GRU_ENABLED else None
        self._native_rt: tuple | None = None  # (the per-direction weights, ``_native_weights`` of them)

    def _prepare_direction(self, w, r, b, h):
        """z and r rows (and their bias) halved, so that one tanh gives both sigmoids
        (sigmoid(x) = 0.5 + 0.5 * tanh(x / 2), exact: a power of two); the bias of the input
        projections takes W's and R's bias of z and r, and of h W's (R's too without
        linear_before_reset); with it, R's bias of h is the step's own (it is inside r's product)."""
        scale = np.concatenate([np.full(2 * h, 0.5, w.dtype), np.ones(h, w.dtype)])
        wt = np.ascontiguousarray((w * scale[:, None]).T)
        rs = np.ascontiguousarray(r * scale[:, None])
        if b is None:
            return wt, rs, None, None
        bias = b[:3 * h] + np.concatenate([b[3 * h:5 * h], np.zeros(h, b.dtype)])
        if not self.linear_before_reset:
            bias[2 * h:] += b[5 * h:]
        return wt, rs, bias * scale, (b[5 * h:] if self.linear_before_reset else None)

    def _native_applies(self, hidden: int, batch: int) -> bool:
        return native_gru_applies(hidden, batch)

    def _native_steps(self, *args) -> None:
        self._native.gru_steps(*args[:8], self.linear_before_reset, *args[8:])

    def _step_workspace(self, h, batch, dt, step_bias):
        g = np.empty((3 * h, batch), dt)
        rbh = None if step_bias is None else np.ascontiguousarray(np.broadcast_to(step_bias[:, None], (h, batch)))
        return g, g[:2 * h], g[:h], g[h:2 * h], g[2 * h:], np.empty((h, batch), dt), rbh, _HALVES[dt]

    def _step_transposed(self, xt, hd, r, ws, out):
        """out = the next hidden state [hidden, batch], from hd, step t's projections xt
        [3 * hidden, batch] and R: H = n + z * (H - n), n the candidate, z the update gate."""
        g, zr, z, rg, gh, n, rbh, half = ws
        h = gh.shape[0]
        multiply, add, tanh = np.multiply, np.add, np.tanh
        if self.linear_before_reset:
            np.dot(r, hd, g)
            add(zr, xt[:2 * h], zr)
            if rbh is not None:
                add(gh, rbh, gh)
        else:
            np.dot(r[:2 * h], hd, zr)
            add(zr, xt[:2 * h], zr)
        tanh(zr, zr)
        multiply(zr, half, zr)  # sigmoid of z and r from tanh of their halves
        add(zr, half, zr)
        if self.linear_before_reset:
            multiply(rg, gh, n)
        else:
            multiply(rg, hd, n)
            np.dot(r[2 * h:], n, gh)
            n, gh = gh, n
        add(n, xt[2 * h:], n)
        tanh(n, n)
        np.subtract(hd, n, out)
        multiply(z, out, out)
        add(out, n, out)

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


def gate_order(h: int) -> np.ndarray:
    """Row indices that put ONNX's LSTM gates i, o, f, c in the order i, f, o, c: then i and f
    sit next to c and the cell state (one product for both terms of the cell update)."""
    return np.concatenate([np.arange(0, h), np.arange(2 * h, 3 * h), np.arange(h, 2 * h), np.arange(3 * h, 4 * h)])


def gate_scale(h: int, dtype: np.dtype) -> np.ndarray:
    """0.5 on the i, f and o gates (of ``gate_order``), 1 on c: with these folded into the weights,
    sigmoid(x) = 0.5 + 0.5 * tanh(x / 2) takes the one tanh call of all four gates (exact: a
    power of two)."""
    return np.concatenate([np.full(3 * h, 0.5, dtype), np.ones(h, dtype)])


def projection_steps(xw: np.ndarray, reverse: bool, run_options) -> Iterator[tuple[int, np.ndarray]]:
    """(t, step t's input projection as [4 * hidden, batch]) in the direction's order, checking
    ``RunOptions.terminate`` before each step. The projections are transposed a block of
    ``_BLOCK`` steps at a time: a long sequence's whole copy would delay a terminate request
    (600,000 steps: 150 MB)."""
    seq = xw.shape[0]
    for b0 in (range((seq - 1) // _BLOCK * _BLOCK, -1, -_BLOCK) if reverse else range(0, seq, _BLOCK)):
        b1 = min(seq, b0 + _BLOCK)
        xwt = transposed_steps(xw, b0, b1)
        for t in (range(b1 - 1, b0 - 1, -1) if reverse else range(b0, b1)):
            if run_options is not None and run_options.terminate:  # a long sequence stops in bounded time
                check_terminate()
            yield t, xwt[t - b0]


def transposed_steps(xw: np.ndarray, b0: int, b1: int) -> np.ndarray:
    """Steps b0 to b1 of the input projections xw [seq, batch, 4 * hidden] as a contiguous
    [steps, 4 * hidden, batch]. A small batch is copied one batch row at a time: numpy copies
    [steps, 4 * hidden] into a strided destination at full speed, where the whole transposed
    copy iterates over the batch innermost (1.7 us against 0.6 for [5, 2, 128])."""
    n, batch, h4 = b1 - b0, xw.shape[1], xw.shape[2]
    if batch == 1:
        return xw[b0:b1].reshape(n, h4, 1)
    out = np.empty((n, h4, batch), xw.dtype)
    if batch <= 4:
        for b in range(batch):
            out[:, :, b] = xw[b0:b1, b]
    else:
        out[...] = xw[b0:b1].transpose(0, 2, 1)
    return out


def cell_update(tail: tuple, half: np.ndarray, h_out: np.ndarray) -> None:
    """The LSTM step once the gates' pre-activations are in the workspace (``gate_workspace``;
    ``tail`` its arrays after the first: s, o, c, pair_a, pair_b, prod, p0, p1, th): the sigmoid of
    i, f and o from the tanh of their halves, c = i * g + f * c, h = o * tanh(c) into ``h_out``.
    Every numpy step loop of LSTM and DynamicQuantizeLSTM ends with it (the C steps are their own)."""
    s, o, c, pair_a, pair_b, prod, p0, p1, th = tail
    np.multiply(s, half, s)
    np.add(s, half, s)
    np.multiply(pair_a, pair_b, prod)
    np.add(p0, p1, c)
    np.tanh(c, th)
    np.multiply(o, th, h_out)


def gate_workspace(h: int, batch: int, dt: np.dtype) -> tuple:
    """An LSTM step's scratch arrays, [gates or hidden, batch], and their views: g4 (the gates
    i, f, o, c of ``gate_order``), s3 (i, f, o), o, c (the cell state: g's rows after the gates),
    pair_a ([i, f]), pair_b ([c gate, cell state]), prod (pair_a * pair_b) and its halves, th."""
    g = np.empty((5 * h, batch), dt)
    prod = np.empty((2 * h, batch), dt)
    return (g[:4 * h], g[:3 * h], g[2 * h:3 * h], g[4 * h:], g[:2 * h], g[3 * h:], prod, prod[:h], prod[h:],
            np.empty((h, batch), dt))


def pair_rows(h: int, gates: int = 4) -> np.ndarray:
    """Row indices that interleave two directions' gates (the backward's rows after the
    forward's) gate by gate: for LSTM's ``gate_order`` i, i', f, f', o, o', c, c'. Each gate's
    block of both directions is then one contiguous piece, as one direction's is alone."""
    g = np.arange(gates * h).reshape(gates, 1, h)
    return np.concatenate([g, g + gates * h], axis=1).reshape(-1)


def ragged_lengths_apply(lens: np.ndarray, seq: int, batch: int) -> bool:
    """Whether the transposed loops take ``sequence_lens``: one integer length per batch row, each
    within [0, seq]. Anything else goes to the plain loop, which names the problem."""
    if not (isinstance(lens, np.ndarray) and lens.dtype.kind in "iu" and lens.shape == (batch,)):
        return False
    if batch <= _FEW_ROWS:  # (a few Python ints compare in 1 us, two numpy reductions take 6)
        values = lens.tolist()
        return min(values, default=0) >= 0 and max(values, default=0) <= seq
    return bool((lens >= 0).all()) and bool((lens <= seq).all())


def ragged_lengths(lens: np.ndarray | None, seq: int) -> np.ndarray | None:
    """``sequence_lens`` as int64 where some row is shorter than ``seq``; None where every row runs
    the whole length (the loops then mask nothing)."""
    if lens is None or (min(lens.tolist(), default=seq) >= seq if len(lens) <= _FEW_ROWS else bool((lens >= seq).all())):
        return None
    return lens.astype(np.int64)


_FEW_ROWS = 64  # batches whose sequence_lens the helpers above read as Python ints


def empty_sequences_zeroed(outs: list, inputs: list, layout: int) -> list:
    """``outs`` with the final states (Y_h, LSTM's Y_c) of the batch rows whose sequence_lens is 0
    set to zero, as onnxruntime returns them, where every path (and the spec's loop) leaves such a
    row at its initial state. Y's rows are zero already."""
    lens = inputs[4] if len(inputs) > 4 else None
    if lens is None or not lens.size or bool((lens > 0).all()) or len(outs) < 2:
        return outs
    empty = np.asarray(lens).reshape(-1) == 0
    zeroed = list(outs)
    for i in range(1, len(outs)):
        state = outs[i].copy()  # [directions, batch, hidden] (layout 1: [batch, directions, hidden])
        if layout:
            state[empty] = 0
        else:
            state[:, empty] = 0
        zeroed[i] = state
    return zeroed


def masked_step(out: np.ndarray, previous: np.ndarray, dead: np.ndarray) -> np.ndarray:
    """A step of a batch with sequences of several lengths, as the spec says: where ``dead`` (per
    batch column [batch], or per state element [hidden, batch]) the sequence has ended, the state
    stays ``previous`` (a forward row's final state is its last step's; a reverse row waits at its
    initial state until its own last step) and the step's output ``out`` (Y's row) is zero. Returns
    the state the next step reads; ``out`` is zeroed in place."""
    state = np.where(dead, previous, out)
    np.copyto(out, 0, where=dead)
    return state


def both_directions_apply(hidden: int, batch: int) -> bool:
    """The condition of the paired loops (a bidirectional layer's two directions stepped
    together, R a block-diagonal [2 * gates * hidden, 2 * hidden] product: LSTM's
    ``_run_both_directions``, GRU and RNN's ``_run_transposed_pair``): while the per-step calls
    outweigh the work, hidden at most ``PAIR_MAX_HIDDEN`` and hidden x batch at most
    ``PAIR_MAX_CELLS``. Beyond them the block product's doubled work (its zero blocks) costs more
    than the calls it saves (measured, 20 steps: LSTM slower at hidden 96 with batch 1, 64 with 16,
    48 with 32; GRU at 64 with 16; faster at 64 with 4, 32 with 8, 24 with 16, for LSTM, GRU, RNN
    and DynamicQuantizeLSTM)."""
    return PAIR_ENABLED and hidden <= PAIR_MAX_HIDDEN and hidden * batch <= PAIR_MAX_CELLS


#: The switch of ``RecurrentKernel._run_transposed`` (GRU and RNN's default form): False runs
#: every form in the plain loop (the tests compare the two).
TRANSPOSED_ENABLED = True
#: the largest difference of ``_run_transposed`` from the plain loop on float32 inputs and
#: weights of unit scale (its bias sums and H = n + z * (H - n) round in another order; 4.8e-7
#: the largest over 280 random tests/test_recurrent_fast_paths.py cases)
TRANSPOSED_ATOL = 1e-5

#: The switch of the paired loops (``both_directions_apply``): False steps a bidirectional layer's
#: directions one after the other (the tests compare the two).
PAIR_ENABLED = True
PAIR_MAX_HIDDEN = 64
PAIR_MAX_CELLS = 512
#: the largest difference of ``LSTM._run_both_directions`` from the directions run one after the
#: other, on float32 inputs and weights of unit scale: the block product sums R's rows in BLAS's
#: order for its shape, not the [4 * hidden, hidden] product's (a few ulps per step; 4.8e-7 the
#: largest over 300 random tests/test_recurrent_fast_paths.py cases)
PAIR_ATOL = 1e-5

#: The switch of ``LSTM._run_default`` (and the paired loop built on it): False runs every LSTM in
#: the plain loop (the tests compare the two).
LSTM_DEFAULT_ENABLED = True

#: The switch of ``LSTM._run_native``: False keeps every LSTM on its numpy paths (the tests compare
#: the two; ONNXHAL_NATIVE_KERNELS=0 does the same for kernels built after it is set).
NATIVE_LSTM_ENABLED = True
#: The C steps' bound (``native_lstm_applies``): hidden^2 x batch, a quarter of the R product's
#: multiply-adds a step. Beyond it BLAS's product (OpenBLAS: threads, FMA) outruns the C loop's
#: by more than the nine numpy calls a step cost (measured, 20 steps, one direction, C against
#: numpy: 0.35-0.5 at 16-64K multiply-adds a step with hidden 16-64, 0.82-0.96 at 64K: hidden 32
#: batch 16, 64 with 4, 128 with 1; 1.0-1.3 at 128K-256K).
NATIVE_MAX_WORK = 16384


def native_lstm_applies(hidden: int, batch: int) -> bool:
    """The condition of ``LSTM._run_native`` (the kernel's ``_native`` module is built and switched
    on, checked by the caller): hidden^2 x batch at most ``NATIVE_MAX_WORK``, where the nine numpy
    calls a step cost more than the C loop's slower product."""
    return NATIVE_LSTM_ENABLED and LSTM_DEFAULT_ENABLED and 0 < hidden and hidden * hidden * batch <= NATIVE_MAX_WORK


#: The switch of ``GRU._run_native``: False keeps every GRU on its numpy paths (the tests compare the
#: two), read when a kernel is made and at each run; ONNXHAL_NATIVE_KERNELS=0 does the same for
#: kernels made after it is set.
NATIVE_GRU_ENABLED = True
#: The GRU C steps' bounds (``native_gru_applies``): hidden^2 x batch (a third of the R product's
#: multiply-adds a step), where BLAS's product outruns the C loop's by more than the twelve numpy
#: calls a step cost, and the batch, the C loop's rows one at a time against numpy's [hidden, batch]
#: calls (measured, 20 steps, linear_before_reset, one direction, C against the transposed loop,
#: load 6: 0.16-0.6 up to 32K with batch <= 64; 0.56-1.0 at 64K; 0.9-1.08 at 128K; small hidden
#: with batch 128: 1.0-1.1, 256: 1.8, 512: 3.3).
NATIVE_GRU_MAX_WORK = 32768
NATIVE_GRU_MAX_BATCH = 64


def native_gru_applies(hidden: int, batch: int) -> bool:
    """The condition of ``GRU._run_native`` (the kernel's ``_native`` module is built and switched
    on, checked by the caller): hidden^2 x batch at most ``NATIVE_GRU_MAX_WORK`` and batch at most
    ``NATIVE_GRU_MAX_BATCH``, where the twelve numpy calls a step cost more than the C loop."""
    return (NATIVE_GRU_ENABLED and TRANSPOSED_ENABLED and 0 < hidden and batch <= NATIVE_GRU_MAX_BATCH
            and hidden * hidden * batch <= NATIVE_GRU_MAX_WORK)


#: The switch of ``RNN._run_native`` (GRU's C steps with one gate), as ``NATIVE_GRU_ENABLED``.
NATIVE_RNN_ENABLED = True
#: Its bounds, hidden^2 x batch and the batch, as GRU's (``native_rnn_applies``; measured, 20 steps,
#: one direction, C against the transposed loop's three calls a step, load 6: 0.28-0.49 up to 32K,
#: 0.67-0.76 at batch 64-128 with hidden 8-16, 0.57-1.0 at 64K).
NATIVE_RNN_MAX_WORK = 32768
NATIVE_RNN_MAX_BATCH = 64


def native_rnn_applies(hidden: int, batch: int) -> bool:
    """The condition of ``RNN._run_native``, as ``native_gru_applies``."""
    return (NATIVE_RNN_ENABLED and TRANSPOSED_ENABLED and 0 < hidden and batch <= NATIVE_RNN_MAX_BATCH
            and hidden * hidden * batch <= NATIVE_RNN_MAX_WORK)


#: The recurrent kernels' paths (each switch above turns its path off for the tests' comparison).
RECURRENT_PATHS = path_table("RNN/GRU/LSTM", "RecurrentKernel.plain_loop: the spec's step loop, every form")
RECURRENT_PATHS.add("plain", "canonical: any activations, clip, sequence_lens with shorter rows, input_forget")
RECURRENT_PATHS.add("transposed", "GRU and RNN with default activations, no clip, float types, sequence_lens "
                                  "absent or within [0, seq] (ragged_lengths_apply: shorter rows masked, "
                                  "masked_step) (TRANSPOSED_ENABLED): states [hidden, batch], gates preallocated")
RECURRENT_PATHS.add("lstm_default", "LSTM with default activations, no clip, no peepholes, no input_forget, float "
                                    "types, sequence_lens absent or within [0, seq] (shorter rows masked, float weights) "
                                    "(LSTM._run_default, LSTM_DEFAULT_ENABLED): nine calls a step per direction")
RECURRENT_PATHS.add("lstm_native", "the C extension _native is built and ONNXHAL_NATIVE_KERNELS is not 0, an LSTM "
                                   "(or a DynamicQuantizeLSTM whose R products are exact in float32) in "
                                   "lstm_default's form with hidden^2 x batch <= NATIVE_MAX_WORK (native_lstm_applies, "
                                   "NATIVE_LSTM_ENABLED): LSTM._run_native, a block of each direction's steps in one "
                                   "C call (_native.lstm_steps)")
RECURRENT_PATHS.add("gru_native", "the C extension _native is built and ONNXHAL_NATIVE_KERNELS is not 0, a GRU in "
                                  "transposed's form with hidden^2 x batch <= NATIVE_GRU_MAX_WORK and batch <= "
                                  "NATIVE_GRU_MAX_BATCH (native_gru_applies, NATIVE_GRU_ENABLED): GRU._run_native, a "
                                  "block of each direction's steps in one C call (_native.gru_steps), both "
                                  "linear_before_reset forms, shorter rows skipped as masked_step")
RECURRENT_PATHS.add("rnn_native", "as gru_native, an RNN in transposed's form with hidden^2 x batch <= "
                                  "NATIVE_RNN_MAX_WORK and batch <= NATIVE_RNN_MAX_BATCH (native_rnn_applies, "
                                  "NATIVE_RNN_ENABLED): RNN._run_native, _native.rnn_steps")
RECURRENT_PATHS.add("both_directions", "a bidirectional layer in a default form with hidden <= PAIR_MAX_HIDDEN and "
                                       "hidden x batch <= PAIR_MAX_CELLS (both_directions_apply): both directions "
                                       "in one step, R block-diagonal")


def pair_blocks(xw: np.ndarray, ys: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per block of ``_BLOCK`` steps (a long sequence's whole copy would delay a terminate
    request): the steps' [2 * gates * hidden, batch] inputs (the forward direction's projection
    at t and the backward's at seq - 1 - t, gate by gate as ``pair_rows``) from xw [seq, batch,
    gates, 2, hidden] (directions second), and the steps' outputs, ys's rows for them. The loops
    iterate the two with zip: numpy hands out the rows, cheaper than indexing each step."""
    seq, batch, gates, _, h = xw.shape
    for b0 in range(0, seq, _BLOCK):
        b1 = min(seq, b0 + _BLOCK)
        xs = np.empty((b1 - b0, gates, 2, h, batch), xw.dtype)
        forward, backward = xw[b0:b1, :, :, 0], xw[seq - b0 - 1::-1][:b1 - b0, :, :, 1]
        if batch <= 4:  # a batch row at a time: [steps, 4, hidden] pieces copy at full speed (``transposed_steps``)
            for b in range(batch):
                xs[:, :, 0, :, b] = forward[:, b]
                xs[:, :, 1, :, b] = backward[:, b]
        else:
            xs[:, :, 0] = forward.transpose(0, 2, 3, 1)
            xs[:, :, 1] = backward.transpose(0, 2, 3, 1)
        yield xs.reshape(b1 - b0, 2 * gates * h, batch), ys[b0:b1]


def paired_outputs(ys: np.ndarray, finals: list[np.ndarray], layout: int, n_out: int,
                   last: np.ndarray | None = None) -> list[np.ndarray]:
    """A paired loop's outputs: Y from ys [seq, 2 * hidden, batch] (step t: the forward hidden
    state at t, the backward's at seq - 1 - t), Y_h from ``last`` (default: its last step; a
    masked loop's final state is not its last output) and the other final states
    ([2 * hidden, batch], both directions' rows), in the op's layout."""
    seq, h2, batch = ys.shape
    h = h2 // 2
    y = np.empty((seq, 2, batch, h), ys.dtype)
    y[:, 0] = ys[:, :h].transpose(0, 2, 1)
    y[:, 1] = ys[::-1, h:].transpose(0, 2, 1)
    states = [s.reshape(2, h, batch).transpose(0, 2, 1) for s in [ys[-1] if last is None else last] + finals]
    if layout:  # [batch, seq, directions, hidden]
        outs = [y.transpose(2, 0, 1, 3)] + [np.swapaxes(s, 0, 1) for s in states]
    else:
        outs = [y] + states
    return [np.ascontiguousarray(v) for v in outs[:n_out]]


_count_nonzero = np.count_nonzero
WORKSPACES = 16  # scratch-array sets an LSTM kernel keeps (one per hidden size, batch and type)
_HALVES = {np.dtype(t): np.array(0.5, t) for t in (np.float32, np.float64)}
_DEFAULT_LSTM = ("sigmoid", "tanh", "tanh")
_FAST_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
_BLOCK = 4096  # time steps whose input projections ``_run_default`` lays out at once


@register("LSTM", since=7)
class LSTM(RecurrentKernel):
    """The common form (default activations, no clip, peepholes or input_forget, every sequence
    the full length: what exporters write) runs ``_run_default``: per direction the gate weights
    reordered and prepared once (kept while W, R and B are constant initializers), all time steps'
    input projections and the bias in one product, and nine numpy calls per step into
    preallocated buffers. Every other form runs the general ``RecurrentKernel`` loop."""

    gates = 4
    default_activations = ["Sigmoid", "Tanh", "Tanh"]
    #: inputs the prepared weights derive from
    weight_inputs: tuple[int, ...] = (1, 2, 3)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.input_forget = bool(node.attr("input_forget", 0))
        names = list(node.inputs) + [""] * 12
        defaults = tuple(_ACTIVATIONS[n][0] for n in _DEFAULT_LSTM)
        self.default_form = (not self.input_forget and self.clip is None and not names[7]
                             and all(tuple(a[0] for a in acts) == defaults for acts in self.acts))
        self.constant_weights = ctx is not None and all(
            not names[i] or ctx.is_constant_initializer(names[i]) for i in self.weight_inputs)
        self._prepared: tuple | None = None  # (input dtype, per-direction weights)
        self._paired: tuple | None = None  # (the per-direction weights, ``_pair_weights`` of them)
        self._workspaces: dict[tuple, tuple] = {}  # (hidden, batch, dtype) -> ``gate_workspace`` (and more)
        self.reverse = [d == "reverse" for d in self.directions]
        self._native = native_module()  # the C steps (``_run_native``), None where not built or switched off
        self._native_rt: tuple | None = None  # (the per-direction weights, each direction's R^T)

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

    def compute_paths(self, inputs: list) -> list:
        if self._via_float32(inputs):
            return half.via_float32(self.compute, inputs, self.widen)
        if self.default_form and LSTM_DEFAULT_ENABLED:
            x = inputs[0]
            n = len(inputs)
            lens = inputs[4] if n > 4 else None
            seq_axis = 1 if self.layout else 0
            if (x.dtype in _FAST_TYPES and x.ndim == 3 and x.shape[0] and x.shape[1]
                    and (lens is None or ragged_lengths_apply(lens, x.shape[seq_axis], x.shape[1 - seq_axis]))
                    and self._states_fit(inputs, n, x)):
                prepared = self._prepared  # kept only for constant initializers: the same arrays every run
                if prepared is not None and prepared[0] == x.dtype:
                    weights = prepared[1]
                else:
                    weights = self._prepare(list(inputs) + [None] * (12 - n), x.dtype)
                    if weights is not None and self.constant_weights:
                        self._prepared = (x.dtype, weights)  # one swap: a concurrent run sees either
                ragged = None if lens is None else ragged_lengths(lens, x.shape[seq_axis])
                if weights is not None and ragged is not None:
                    # sequences of several lengths: the numpy loop masks the ended rows; the C
                    # steps, the paired loop and the quantized recurrences have no mask
                    if all(wd[3] is None for wd in weights):
                        return self._run_default(x, inputs, weights, ragged)
                elif weights is not None:
                    batch = x.shape[0 if self.layout else 1]
                    if self._native is not None and native_lstm_applies(weights[0][1].shape[1], batch):
                        native = self._native_weights(weights, inputs)
                        if native is not None:
                            return self._run_native(x, inputs, weights, native)
                    if (len(weights) == 2
                            and both_directions_apply(weights[0][1].shape[1], batch)):
                        return self._run_both_directions(x, inputs, weights)
                    return self._run_default(x, inputs, weights)
        return self._general(inputs)

    def _general(self, inputs: list) -> list:
        return self.plain_loop(inputs)

    def _states_fit(self, inputs: list, n: int, x: np.ndarray) -> bool:
        """Whether initial_h and initial_c (where given) are x's type and [directions, batch, ...]
        ([batch, directions, ...] with layout 1); the general loop takes (or names) anything else."""
        batch_axis = 0 if self.layout else 1
        for i in (5, 6):
            s = inputs[i] if n > i else None
            if s is not None and (s.dtype != x.dtype or s.ndim != 3 or s.shape[batch_axis] != x.shape[batch_axis]
                                  or s.shape[1 - batch_axis] != len(self.directions)):
                return False
        return True

    def _prepare(self, args: list, dt: np.dtype) -> list | None:
        """Per direction (W^T, R, bias row, None, whether R is finite) in ``gate_order`` with
        ``gate_scale`` folded in, or None where the run's types are not one float type (the general
        loop then promotes them) or the shapes are wrong (the general loop names the problem)."""
        w, r, b = args[1], args[2], args[3]
        if w.dtype != dt or r.dtype != dt or (b is not None and b.dtype != dt) or w.ndim != 3 or r.ndim != 3:
            return None
        h = r.shape[2]
        if w.shape[0] != len(self.directions) or w.shape[1] != 4 * h or r.shape[1] != 4 * h or (
                self.hidden is not None and h != self.hidden) or (b is not None and b.shape != (w.shape[0], 8 * h)):
            return None
        order, scale = gate_order(h), gate_scale(h, dt)
        out = []
        for d in range(w.shape[0]):
            bias = None if b is None else (b[d, :4 * h] + b[d, 4 * h:])[order] * scale
            out.append((np.ascontiguousarray((w[d][order] * scale[:, None]).T),
                        np.ascontiguousarray(r[d][order] * scale[:, None]), bias, None, bool(np.isfinite(r[d]).all())))
        return out

    def _input_projection(self, x2: np.ndarray, weights: tuple) -> np.ndarray:
        """Every time step's input times W (x2: [seq * batch, input]) as [seq * batch, 4 * hidden]."""
        return np.dot(x2, weights[0])

    def _time_major(self, x: np.ndarray, args: list) -> tuple:
        """X and the initial states (inputs 5 and 6, or None) with time first: ``layout`` 1 gives
        them batch first."""
        h0 = args[5] if len(args) > 5 else None
        c0 = args[6] if len(args) > 6 else None
        if self.layout:
            x = np.swapaxes(x, 0, 1)
            h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
            c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
        return x, h0, c0

    def _run_default(self, x: np.ndarray, args: list, weights: list, lens: np.ndarray | None = None) -> list:
        """The recurrence on transposed states, [gates or hidden, batch]: each gate's block of rows
        is one contiguous piece (numpy's strided 2-D loops cost twice the contiguous ones), so
        every step is nine calls on contiguous arrays. ``lens`` (``ragged_lengths``, float weights
        only): the rows whose sequence ended keep their hidden and cell states, their Y is zero."""
        x, h0, c0 = self._time_major(x, args)
        seq, batch, k = x.shape
        dt = x.dtype
        h = weights[0][0].shape[1] // 4  # (W^T, or W less its zero point: [input, 4 * hidden])
        h4 = 4 * h
        nd = len(self.directions)
        yt = np.empty((seq, nd, h, batch), dt)  # Y with each step's hidden state transposed
        y_h = np.empty((nd, batch, h), dt)
        y_c = np.empty((nd, batch, h), dt)
        x2 = x.reshape(seq * batch, k)
        run_options = RUN_OPTIONS.get()  # (its terminate flag is read every step, as check_terminate does)
        dot, tanh, add = np.dot, np.tanh, np.add
        half = _HALVES[dt]  # (a 0-d array operand is the ufuncs' fastest path)
        for d in range(nd):
            wd = weights[d]
            r, bias, rq = wd[1], wd[2], wd[3]
            xw = self._input_projection(x2, wd)  # [seq * batch, 4 * hidden], this run's own
            if bias is not None:
                add(xw, bias, xw)  # (along rows: a third of the time the transposed copy's add takes)
            xw = xw.reshape(seq, batch, h4)
            if rq is not None:
                self._quantized_direction(rq, xw, None if h0 is None else h0[d], None if c0 is None else c0[d], yt,
                                          y_h, y_c, d, run_options)
                continue
            # (scratch arrays and their views made once per shape: a run takes them out of the dict
            # and puts them back, so runs at once on other threads make their own)
            key = (h, batch, dt)
            ws = self._workspaces.pop(key, None) or gate_workspace(h, batch, dt)
            g4, c, tail = ws[0], ws[3], ws[1:10]
            c[...] = 0 if c0 is None else c0[d].T
            hd = np.zeros((h, batch), dt) if h0 is None else h0[d].T
            # an all-zero initial state (exporters feed zeros): the first step's R product is 0,
            # exactly while R is finite, and left out
            zero_state = wd[4] and (h0 is None or not _count_nonzero(hd))
            reverse = self.reverse[d]
            shortest = seq if lens is None else int(lens.min())
            for t, xt in projection_steps(xw, reverse, run_options):
                # (out= given positionally: a keyword costs more per call, in every step)
                if zero_state:
                    zero_state = False
                    tanh(xt, g4)
                else:
                    dot(r, hd, g4)  # (np.dot: numpy's matmul takes 3x as long on a 2-column product)
                    add(g4, xt, g4)
                    tanh(g4, g4)
                if t < shortest:
                    hd = yt[t, d]
                    cell_update(tail, half, hd)
                    continue
                dead, kept_c, kept_h = t >= lens, c.copy(), hd
                hd = yt[t, d]
                cell_update(tail, half, hd)
                np.copyto(c, kept_c, where=dead)
                hd = masked_step(hd, kept_h, dead)
            y_h[d] = hd.T
            y_c[d] = c.T
            if len(self._workspaces) < WORKSPACES:  # a few shapes per model; a stream of new ones is not kept
                self._workspaces[key] = ws
        if self.layout:  # [batch, seq, directions, hidden]
            return [np.ascontiguousarray(yt.transpose(3, 0, 1, 2)), np.ascontiguousarray(np.swapaxes(y_h, 0, 1)),
                    np.ascontiguousarray(np.swapaxes(y_c, 0, 1))][: self.n_out]
        return [np.ascontiguousarray(yt.transpose(0, 1, 3, 2)), y_h, y_c][: self.n_out]

    def _run_native(self, x: np.ndarray, args: list, weights: list, native: list) -> list:
        """``_run_default``'s recurrence with the steps in C (``_native.lstm_steps``; ``native``
        is ``_native_weights``'s): per direction and block of ``_BLOCK`` steps, the block's input
        projections and the bias in one product, then its steps in one C call where numpy takes
        nine a step. The terminate flag is read between two blocks (a long sequence's whole
        projection first would delay it), except where ``project_whole`` (the projection's
        quantization range spans every step)."""
        x, h0, c0 = self._time_major(x, args)
        seq, batch, k = x.shape
        dt = x.dtype
        h = weights[0][1].shape[1]
        nd = len(self.directions)
        y = np.empty((seq, nd, batch, h), dt)
        y_h = np.zeros((nd, batch, h), dt) if h0 is None else np.array(h0, dt, order="C")  # in and out of the C steps
        y_c = np.zeros((nd, batch, h), dt) if c0 is None else np.array(c0, dt, order="C")
        x2 = x.reshape(seq * batch, k)
        steps = self._native.lstm_steps
        for d in range(nd):
            wd = weights[d]
            rt, mult = native[d]
            reverse = self.reverse[d]
            whole = None
            if self.project_whole:
                whole = self._input_projection(x2, wd)
                if wd[2] is not None:
                    np.add(whole, wd[2], whole)
            for b0 in range(0, seq, _BLOCK):
                check_terminate()
                count = min(_BLOCK, seq - b0)
                lo = seq - b0 - count if reverse else b0  # the block's steps lo .. lo + count - 1
                if whole is not None:
                    xw = whole[lo * batch:(lo + count) * batch]
                else:
                    xw = self._input_projection(x2[lo * batch:(lo + count) * batch], wd)
                    if wd[2] is not None:
                        np.add(xw, wd[2], xw)
                steps(xw, rt, y_h[d], y_c[d], y[lo:lo + count], d, count - 1 if reverse else 0, count,
                      -1 if reverse else 1, mult)
        if self.layout:  # [batch, seq, directions, hidden]
            return [np.ascontiguousarray(y.transpose(2, 0, 1, 3)), np.ascontiguousarray(np.swapaxes(y_h, 0, 1)),
                    np.ascontiguousarray(np.swapaxes(y_c, 0, 1))][: self.n_out]
        return [y, y_h, y_c][: self.n_out]

    #: whether ``_run_native`` projects every step's input at once (a quantization range over them all)
    project_whole = False

    def _native_weights(self, weights: list, inputs: list) -> list[tuple] | None:
        """Per direction (R^T, None) for ``_run_native``: the prepared R (gate order, halves
        folded in) transposed, [hidden, 4 * hidden] contiguous, which the C steps read a row per
        hidden unit; None where the C steps do not take these weights. Kept while the
        per-direction weights are the same (constant initializers)."""
        kept = self._native_rt
        if kept is not None and kept[0] is weights:
            return kept[1]
        native = self._make_native_weights(weights, inputs)
        self._native_rt = (weights, native)  # one swap: a concurrent run sees the old entry or this one
        return native

    def _make_native_weights(self, weights: list, inputs: list) -> list[tuple] | None:
        if weights[0][3] is not None:  # another kind of weights (a subclass's)
            return None
        return [(np.ascontiguousarray(wd[1].T), None) for wd in weights]

    def _pair_weights(self, weights: list) -> tuple:
        """``_make_pair_weights`` of the per-direction weights of ``_prepare``, kept while those
        are the same (constant initializers)."""
        kept = self._paired
        if kept is not None and kept[0] is weights:
            return kept[1]
        paired = self._make_pair_weights(weights)
        self._paired = (weights, paired)  # one swap: a concurrent run sees the old entry or this one
        return paired

    def _make_pair_weights(self, weights: list) -> tuple:
        """(``_input_projection``'s weights of both directions, W^T [input, 8 * hidden]; the
        block-diagonal R [8 * hidden, 2 * hidden]; bias row or None; whether R is finite; None
        (a float LSTM)), rows in ``pair_rows`` order."""
        (wf, rf, bf, _, ff), (wb, rb, bb, _, fb) = weights
        h = rf.shape[1]
        rows = pair_rows(h)
        r2 = np.zeros((8 * h, 2 * h), rf.dtype)
        r2[:4 * h, :h] = rf
        r2[4 * h:, h:] = rb
        bias = None if bf is None else np.concatenate([bf, bb])[rows]
        return ((np.ascontiguousarray(np.concatenate([wf, wb], axis=1)[:, rows]),), np.ascontiguousarray(r2[rows]),
                bias, ff and fb, None)

    def _run_both_directions(self, x: np.ndarray, args: list, weights: list) -> list:
        """A bidirectional LSTM's two directions stepped together (``both_directions_apply``):
        step t runs the forward direction's time t and the backward's time seq - 1 - t on one
        state [2 * hidden, batch] (both hidden states stacked), one block-diagonal R product and
        the nine calls of ``_run_default`` on arrays of both directions' gates (``pair_rows``):
        nine calls a step where one direction after the other takes eighteen."""
        if self.layout:
            x = np.swapaxes(x, 0, 1)
        seq, batch, k = x.shape
        dt = x.dtype
        proj, r2, bias, finite, rq = self._pair_weights(weights)
        h = r2.shape[1] // 2
        n = len(args)
        h0 = args[5] if n > 5 else None
        c0 = args[6] if n > 6 else None
        if self.layout:
            h0 = None if h0 is None else np.swapaxes(h0, 0, 1)
            c0 = None if c0 is None else np.swapaxes(c0, 0, 1)
        # [forward; backward] rows of the initial states, [2 * hidden, batch]
        h0 = None if h0 is None else h0.transpose(0, 2, 1).reshape(2 * h, batch)
        c0 = None if c0 is None else c0.transpose(0, 2, 1).reshape(2 * h, batch)
        xw = self._input_projection(x.reshape(seq * batch, k), proj)  # [seq * batch, 8 * hidden]
        if bias is not None:
            np.add(xw, bias, xw)
        ys = np.empty((seq, 2 * h, batch), dt)  # step t: [forward hidden at t; backward at seq - 1 - t]
        blocks = pair_blocks(xw.reshape(seq, batch, 4, 2, h), ys)
        if rq is not None:
            c = self._quantized_pair(rq, blocks, h0, c0, ys)
        else:
            c = self._float_pair(r2, finite, blocks, h0, c0, ys)
        return paired_outputs(ys, [c], self.layout, self.n_out)

    def _float_pair(self, r2: np.ndarray, finite: bool, blocks: Iterator, h0: np.ndarray | None,
                    c0: np.ndarray | None, ys: np.ndarray) -> np.ndarray:
        """The paired recurrence (``_run_both_directions``) of float weights; returns the final
        cell state [2 * hidden, batch] (a copy: the scratch arrays are kept for the next run)."""
        batch, dt = ys.shape[2], ys.dtype
        h = r2.shape[1] // 2
        key = ("pair", h, batch, dt)
        ws = self._workspaces.pop(key, None) or gate_workspace(2 * h, batch, dt)
        g8, c, tail = ws[0], ws[3], ws[1:10]
        c[...] = 0 if c0 is None else c0
        hd = np.zeros((2 * h, batch), dt) if h0 is None else h0
        # an all-zero initial state: the R product is 0 while R is finite, and left out
        zero_state = finite and (h0 is None or not _count_nonzero(hd))
        dot, tanh, add = np.dot, np.tanh, np.add
        half = _HALVES[dt]
        run_options = RUN_OPTIONS.get()  # (its terminate flag is read every step, as check_terminate does)
        for xs, outs in blocks:
            for xt, out in zip(xs, outs):
                if run_options is not None and run_options.terminate:  # a long sequence stops in bounded time
                    check_terminate()
                if zero_state:
                    zero_state = False
                    tanh(xt, g8)
                else:
                    dot(r2, hd, g8)
                    add(g8, xt, g8)
                    tanh(g8, g8)
                cell_update(tail, half, out)
                hd = out
        final = c.copy()
        if len(self._workspaces) < WORKSPACES:
            self._workspaces[key] = ws
        return final

    def _quantized_pair(self, rq: tuple, blocks: Iterator, h0: np.ndarray | None, c0: np.ndarray | None,
                        ys: np.ndarray) -> np.ndarray:
        """The paired recurrence of weights that are not float (DynamicQuantizeLSTM; ``rq`` is
        what its ``_make_pair_weights`` made), as ``_float_pair``."""
        raise NotImplementedError

    def _quantized_direction(self, rq: tuple, xw: np.ndarray, h0: np.ndarray | None, c0: np.ndarray | None,
                             yt: np.ndarray, y_h: np.ndarray, y_c: np.ndarray, d: int, run_options) -> None:
        """Direction d's recurrence for weights that are not float (DynamicQuantizeLSTM; ``rq`` is
        what its ``_prepare`` made): xw [seq, batch, 4 * hidden] the input projections with the
        bias, h0 and c0 [batch, hidden] or None; writes yt[:, d], y_h[d] and y_c[d]."""
        raise NotImplementedError
