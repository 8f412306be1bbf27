"""Control flow: If, Loop, Scan (opset 8 batched form and opset 9+ form).

Subgraphs run through ``ctx.create_subgraph_runner(graph)`` (built once, in ``__init__``). Each
runner is fed its formal inputs plus the outer-scope values it reads, which arrive after the
node's explicit inputs, in ``node.implicit_inputs`` order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from onnxhal.hal import Graph, Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import Fail
from onnxhal.runtime.providers.cpu.kernels.registry import register

logger = logging.getLogger("onnxhal.cpu")
_INT64 = np.dtype(np.int64)


class _SubgraphCall:
    """A runner plus the positions of the outer-scope values its graph reads."""

    def __init__(self, node: Node, graph: Graph, ctx: KernelCreateContext) -> None:
        self.graph = graph
        self.runner = ctx.create_subgraph_runner(graph)
        self.input_names = graph.input_names
        n_explicit = len(node.inputs)
        reads = set(graph.outer_scope_reads())
        self.outer = [(name, n_explicit + i) for i, name in enumerate(node.implicit_inputs) if name in reads]
        # The body's inputs whose shape it declares: checked at each call, as onnxruntime checks them
        # (a Scan fed rows of 2 into a body declared for 3 ran before and returned rows of 2).
        # Each with the whole shape where every dimension is fixed: one tuple comparison per call.
        self.declared = [(k, v.name, tuple(v.shape), tuple((a, d) for a, d in enumerate(v.shape) if isinstance(d, int)),
                          tuple(v.shape) if all(isinstance(d, int) for d in v.shape) else None)
                         for k, v in enumerate(graph.inputs) if v.shape is not None and v.is_tensor]
        self.label = f"{node.op_type} node {node.name!r}"
        # Where each of the runner's feeds comes from, once: ("outer", index into the node's
        # inputs) or ("formal", index into the body's formal inputs); the dict of names is built
        # only for a runner without run_values.
        self._run_values = getattr(self.runner, "run_values", None)
        if self._run_values is not None:
            outer = dict(self.outer)
            formal_at = {}
            for k, name in enumerate(self.input_names):
                formal_at.setdefault(name, k)
            self._sources = [(True, outer[n]) if n in outer else (False, formal_at.get(n, -1))
                             for n in self.runner.feed_names]

    def check_shapes(self, formal: list) -> bool:
        """Whether the formal inputs pass the declared-shape checks of ``run`` (no error raised)."""
        for k, _, dims, fixed, _ in self.declared:
            if k < len(formal):
                shape = formal[k].shape
                if len(shape) != len(dims) or any(shape[a] != d for a, d in fixed):
                    return False
        return True

    def run(self, formal: list, inputs: list, check: bool = True) -> list:
        """The body's outputs. ``check``: refuse formal inputs of other shapes than the body declares
        (a Scan, as onnxruntime refuses them); a Loop runs its body unchecked, as onnxruntime does."""
        n = len(formal)
        if check:
            self._check(formal)
        if self._run_values is not None:
            return self._run_values([inputs[i] if is_outer else (formal[i] if 0 <= i < n else None)
                                     for is_outer, i in self._sources])
        feeds = dict(zip(self.input_names, formal))
        for name, i in self.outer:
            feeds[name] = inputs[i]
        return self.runner.run(feeds)


    def bind(self, inputs: list, check: bool = True) -> Callable[[list], list]:
        """``run`` as a function of the formal inputs alone, for the iterations of one loop: the
        outer-scope values in ``inputs`` are placed once (``SubgraphRunner.bind_values``)."""
        bind = getattr(self.runner, "bind_values", None)
        if bind is None or self._run_values is None:
            return lambda formal: self.run(formal, inputs, check)
        run = bind([inputs[i] if is_outer else None for is_outer, i in self._sources],
                   [(p, i) for p, (is_outer, i) in enumerate(self._sources) if not is_outer and i >= 0])
        if not check or not self.declared:
            return run

        def checked(formal: list) -> list:
            self._check(formal)
            return run(formal)
        return checked

    def _check(self, formal: list) -> None:
        n = len(formal)
        for k, name, dims, fixed, whole in self.declared:
            if k < n:
                v = formal[k]
                shape = v.shape if v.__class__ is np.ndarray else np.shape(v)
                if shape == whole:
                    continue
                if len(shape) != len(dims):
                    self._refuse(name, dims, shape)
                for a, d in fixed:
                    if shape[a] != d:
                        self._refuse(name, dims, shape)

    def _refuse(self, name: str, dims: tuple, shape: tuple) -> None:
        raise Fail(f"{self.label}: its body's input {name!r} is declared "
                   f"[{', '.join('?' if not isinstance(d, int) else str(d) for d in dims)}] but is given "
                   f"shape {list(shape)}; make the body's declared shapes match what the node gives it.")


def _empty_like_output(graph: Graph, index: int) -> np.ndarray:
    """Zero-iteration scan output: shape (0, *element shape) from the body's output type."""
    vi = graph.outputs[index]
    dtype = vi.dtype or np.dtype(np.float32)
    shape = vi.shape or ()
    return np.zeros((0,) + tuple(d if isinstance(d, int) else 0 for d in shape), dtype=dtype)


@register("If", since=1)
class If(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.then_branch = _SubgraphCall(node, node.attr("then_branch"), ctx)
        self.else_branch = _SubgraphCall(node, node.attr("else_branch"), ctx)

    def compute(self, inputs: list) -> list:
        branch = self.then_branch if bool(np.asarray(inputs[0]).reshape(-1)[0]) else self.else_branch
        return list(branch.run([], inputs))


@register("Loop", since=1)
class Loop(Kernel):
    """Loop: body(iter_num, cond, carried...) -> (cond, carried..., scan outputs...)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.body = _SubgraphCall(node, node.attr("body"), ctx)
        self.n_carried = len(node.inputs) - 2
        self.n_scan = len(self.body.graph.outputs) - 1 - self.n_carried
        self.warned = False

    def compute(self, inputs: list) -> list:
        max_trip = inputs[0]
        cond = inputs[1]
        n_explicit = 2 + self.n_carried
        carried = list(inputs[2:n_explicit])
        for name, value in (("M", max_trip), ("cond", cond)):
            if value is not None and np.size(value) != 1:  # as onnxruntime: not the first of many
                raise Fail(f"'Loop' input {name!r} should be a scalar tensor. Got shape {list(np.shape(value))}.")
        trips = int(max_trip.reshape(-1)[0]) if max_trip is not None else None
        keep_going = bool(cond.reshape(-1)[0]) if cond is not None else True
        scans: list[list] = [[] for _ in range(self.n_scan)]
        i = 0
        run = self.body.bind(inputs, False)
        end_carried = 1 + self.n_carried
        true = np.array(True)  # the condition a body is given is true: it runs only while so
        n_scan = self.n_scan
        last_cond, last_going = None, True
        while keep_going and (trips is None or i < trips):
            formal = [np.array(i, _INT64), true, *carried]
            if i == 0 and not self.warned and not self.body.check_shapes(formal):
                # onnxruntime runs a Loop body whose inputs disagree with their declared shapes (a
                # scalar iteration number declared [1], a carried value that grows): so does onnxhal,
                # with a warning, where a Scan is refused as onnxruntime refuses it.
                self.warned = True
                logger.warning("%s: its body's inputs do not have the shapes the body declares; running it as "
                               "onnxruntime does, with the shapes given", self.body.label)
            outs = run(formal)
            if cond is not None:
                c = outs[0]
                if c is not last_cond:  # a body returning one constant condition: read it once
                    last_cond = c
                    last_going = bool((c if c.__class__ is np.ndarray else np.asarray(c)).reshape(-1)[0])
                keep_going = last_going
            carried = outs[1:end_carried]
            if n_scan:
                for k in range(n_scan):
                    scans[k].append(outs[end_carried + k])
            i += 1
        results = list(carried)
        for k in range(self.n_scan):
            if scans[k]:
                results.append(np.stack(scans[k]))
            else:
                results.append(_empty_like_output(self.body.graph, 1 + self.n_carried + k))
        return results


def _scan_core(body: _SubgraphCall, inputs: list, states: list, scan_in: list, in_axes, in_dirs,
               out_axes, out_dirs, n_scan_out: int) -> list:
    """Runs the body over axis slices of ``scan_in``; returns final states + stacked outputs."""
    seq_len = scan_in[0].shape[in_axes[0]] if scan_in else 0
    collected: list[list] = [[] for _ in range(n_scan_out)]
    n_state = len(states)
    run = body.bind(inputs) if seq_len else None
    for t in range(seq_len):
        slices = []
        for x, ax, d in zip(scan_in, in_axes, in_dirs):
            slices.append(x.take(seq_len - 1 - t if d else t, axis=ax))
        outs = run(states + slices)
        states = list(outs[:n_state])
        for k in range(n_scan_out):
            collected[k].append(outs[n_state + k])
    results = list(states)
    for k in range(n_scan_out):
        items = collected[k][::-1] if out_dirs[k] else collected[k]
        if items:
            results.append(np.stack(items, axis=out_axes[k]))
        else:
            results.append(_empty_like_output(body.graph, n_state + k))
    return results


#: (scan step, row, column) cells a pairwise-distance Scan computes in one numpy pass.
_DISTANCE_CELLS = 1 << 20


class _PairwiseDistanceBody:
    """A Scan body that is skl2onnx's pairwise distance (``onnx_cdist``: k-NN, Gaussian processes):
    one state X [N, D] passed through unchanged, one scan input C [T, D], and per step the squared
    Euclidean distances of X's rows to C[t] (``ReduceSumSquare(Sub(X, C[t]), axes=[1])``) as the scan
    output. Run step by step it is one subgraph call per row of C; here it is the same subtraction,
    squares and sums for all steps at once."""

    def __init__(self, graph: Graph) -> None:
        self.ok = False
        if len(graph.inputs) != 2 or len(graph.outputs) != 2 or graph.initializers:
            return
        state, step = graph.input_names
        alias = {state: state, step: step}  # body value -> the body input or node it stands for
        sub = reduce = None
        for node in graph.nodes:
            if node.domain or any(name not in alias and name != sub and name != reduce for name in node.inputs):
                return
            if node.op_type == "Identity":
                alias[node.outputs[0]] = alias.get(node.inputs[0], node.inputs[0])
                continue
            inputs = [alias.get(name, name) for name in node.inputs]
            if node.op_type == "Sub" and sub is None and sorted(inputs) == sorted((state, step)):
                sub = node.outputs[0]
                alias[sub] = sub
            elif node.op_type == "ReduceSumSquare" and reduce is None and inputs == [sub] and \
                    list(node.attr("axes") or []) in ([1], [-1]) and node.attr("keepdims", 1) == 0:
                reduce = node.outputs[0]
                alias[reduce] = reduce
            else:
                return
        self.ok = reduce is not None and [alias.get(name) for name in graph.output_names] == [state, reduce]

    @staticmethod
    def applies(x: np.ndarray, c: np.ndarray) -> bool:
        """Whether X and C have the forms the step-by-step run takes without an error: 2-D, the same
        float type and width, at least one step."""
        return x.__class__ is np.ndarray and c.__class__ is np.ndarray and x.ndim == 2 and c.ndim == 2 and \
            x.shape[1] == c.shape[1] and x.dtype == c.dtype and x.dtype.kind == "f" and c.shape[0] > 0

    @staticmethod
    def run(x: np.ndarray, c: np.ndarray) -> list:
        """[X, distances [T, N]]: the differences laid out [D, steps, N], so that the squares and
        the sum over D run on long contiguous rows (a [T, N, D] layout sums D-wide rows, one short
        loop each); in chunks of steps, so that the differences stay small."""
        xt, ct = np.ascontiguousarray(x.T), np.ascontiguousarray(c.T)
        steps = max(1, _DISTANCE_CELLS // max(1, x.size))
        out = np.empty((c.shape[0], x.shape[0]), x.dtype)
        for t in range(0, c.shape[0], steps):
            diff = np.subtract(xt[:, None, :], ct[:, t:t + steps, None])
            np.multiply(diff, diff, out=diff)
            np.add.reduce(diff, axis=0, out=out[t:t + steps])
        return [x, out]


@register("Scan", since=9)
class Scan(Kernel):
    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.body = _SubgraphCall(node, node.attr("body"), ctx)
        self.n_scan_in = node.attr("num_scan_inputs")
        self.n_explicit = len(node.inputs)
        self.n_state = self.n_explicit - self.n_scan_in
        self.n_scan_out = len(self.body.graph.outputs) - self.n_state
        self.in_axes = node.attr("scan_input_axes") or [0] * self.n_scan_in
        self.in_dirs = node.attr("scan_input_directions") or [0] * self.n_scan_in
        self.out_axes = node.attr("scan_output_axes") or [0] * self.n_scan_out
        self.out_dirs = node.attr("scan_output_directions") or [0] * self.n_scan_out
        self.distance = None
        if self.n_state == 1 and self.n_scan_in == 1 and self.n_scan_out == 1 and not any(self.in_dirs) and \
                not any(self.out_dirs) and list(self.in_axes) == [0] and list(self.out_axes) == [0]:
            body = _PairwiseDistanceBody(self.body.graph)
            self.distance = body if body.ok else None

    def compute(self, inputs: list) -> list:
        distance = self.distance
        if distance is not None and distance.applies(inputs[0], inputs[1]) and \
                self.body.check_shapes([inputs[0], inputs[1][0]]):
            return distance.run(inputs[0], inputs[1])
        states = list(inputs[: self.n_state])
        scan_in = list(inputs[self.n_state: self.n_explicit])
        in_axes = [a + x.ndim if a < 0 else a for a, x in zip(self.in_axes, scan_in)]
        # A negative output axis counts from the end of the stacked output, as np.stack's does.
        return _scan_core(self.body, inputs, states, scan_in, in_axes, self.in_dirs, self.out_axes,
                          self.out_dirs, self.n_scan_out)


@register("Scan", since=8)
class Scan8(Kernel):
    """Opset 8 Scan: axis 0 is a batch axis, axis 1 the sequence; ``sequence_lens`` optional."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.body = _SubgraphCall(node, node.attr("body"), ctx)
        self.n_scan_in = node.attr("num_scan_inputs")
        self.n_explicit = len(node.inputs)
        self.n_state = self.n_explicit - 1 - self.n_scan_in
        self.n_scan_out = len(self.body.graph.outputs) - self.n_state
        self.dirs = node.attr("directions") or [0] * self.n_scan_in

    def compute(self, inputs: list) -> list:
        lens = inputs[0]
        states = list(inputs[1: 1 + self.n_state])
        scan_in = list(inputs[1 + self.n_state: self.n_explicit])
        batch = scan_in[0].shape[0] if scan_in else (states[0].shape[0] if states else 1)
        per_batch = []
        for b in range(batch):
            seq = int(lens[b]) if lens is not None else scan_in[0].shape[1]
            res = _scan_core(self.body, inputs, [s[b] for s in states], [x[b, :seq] for x in scan_in],
                             [0] * self.n_scan_in, self.dirs, [0] * self.n_scan_out, [0] * self.n_scan_out,
                             self.n_scan_out)
            per_batch.append(res)
        return [np.stack([r[k] for r in per_batch]) for k in range(self.n_state + self.n_scan_out)]
