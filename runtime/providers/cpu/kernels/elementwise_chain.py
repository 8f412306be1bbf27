"""``com.onnxhal`` ElementwiseChain: a DAG fragment of elementwise nodes run as one kernel
(made by ``optimizer/elementwise_chains.py``).

On the small tensors of a GRU cell in a Loop body or a transformer's normalization tail, each
elementwise node cost a numpy call and an executor step (a few us) for tens of ns of arithmetic.
The fused node holds the nodes as a program over registers: attribute ``ops`` (op types),
``operands`` (each op's register numbers, flattened, as many as the op's arity), ``results`` (the
register each node output is read from), ``to`` (each Cast's target, an onnx TensorProto type,
float or double, in the order of the Casts). Registers 0..n-1 are the node's inputs, register n + k
the k-th op's result.

Paths (``CHAIN_PATHS``): ``numpy`` runs the ops one numpy call each, the CPU kernels' own formulas
(the canonical form); ``native`` runs the program in one C call (``_native.elementwise_chain``),
a block of the last axis at a time, where the float inputs have one dtype, float32 or float64 (T),
an input of bool or an integer type is read only by a Cast to T or as a Where's condition
(converted to T as it is loaded), the inputs broadcast, and every output has the full broadcast
shape (the C call checks, and declines to the numpy form).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.activation import sigmoid_float
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.native_kernels import native_module
from onnxhal.runtime.providers.cpu.kernels.registry import register

DOMAIN = "com.onnxhal"

CHAIN_PATHS = path_table("ElementwiseChain", "numpy: one numpy call per op, the elementwise kernels' formulas")
NUMPY = CHAIN_PATHS.add("numpy", "canonical: every other case (no C module, float inputs of mixed dtypes or none, "
                                 "an integer input read otherwise than by a Cast or as a Where's condition, shapes "
                                 "that do not broadcast, an output of a smaller shape than the broadcast one)")
NATIVE = CHAIN_PATHS.add("native", "every float input float32, or every one float64, bool and integer inputs (not "
                                   "uint64) read by a Cast to that type or as a Where's condition alone, the shapes "
                                   "broadcast, every output of the full broadcast shape, at most 16 axes: the "
                                   "program in one C call, libm's exp / log / tanh (an ulp from numpy's at most)")
#: the switch of ``native`` (read when the kernel is made); off, every chain runs its numpy form
NATIVE_CHAIN_ENABLED = True

_ZEROS = {np.dtype(np.float32): np.zeros((), np.float32), np.dtype(np.float64): np.zeros((), np.float64)}


def _relu(x: np.ndarray) -> np.ndarray:
    zero = _ZEROS.get(x.dtype)
    return np.maximum(x, zero if zero is not None else x.dtype.type(0))


#: op type -> (C opcode, arity, numpy form). The C opcodes are _native.c's EC_* enum, in order;
#: Cast's are per target (``CAST_TARGETS``), its numpy form made per node.
OPS: dict[str, tuple[int, int, object]] = {
    "Add": (0, 2, np.add), "Sub": (1, 2, np.subtract), "Mul": (2, 2, np.multiply), "Div": (3, 2, np.divide),
    "Max": (4, 2, np.maximum), "Min": (5, 2, np.minimum), "Neg": (6, 1, np.negative), "Abs": (7, 1, np.abs),
    "Sqrt": (8, 1, np.sqrt), "Exp": (9, 1, np.exp), "Log": (10, 1, np.log), "Tanh": (11, 1, np.tanh),
    "Sigmoid": (12, 1, sigmoid_float), "Relu": (13, 1, _relu), "Reciprocal": (14, 1, np.reciprocal),
    "Cast": (15, 1, None), "Where": (17, 3, np.where),
}
#: a Cast's target (onnx TensorProto FLOAT, DOUBLE) -> (its C opcode, its dtype)
CAST_TARGETS: dict[int, tuple[int, np.dtype]] = {1: (15, np.dtype(np.float32)), 11: (16, np.dtype(np.float64))}


def _cast_to(dtype: np.dtype) -> Callable:
    def cast(x: np.ndarray) -> np.ndarray:  # the Cast kernel's astype (a bool or an integer to a float)
        return np.asarray(x.astype(dtype, copy=False))
    return cast
_empty = np.empty


@register("ElementwiseChain", since=1, domain=DOMAIN)
class ElementwiseChain(Kernel):
    """The nodes of an elementwise chain in one kernel (see the module's docstring)."""

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        ops = list(node.attr("ops", []))
        operands = list(node.attr("operands", []))
        results = list(node.attr("results", []))
        targets = list(node.attr("to", []))
        n_in = len(node.inputs)
        label = f"ElementwiseChain node {node.name!r}"
        program, quads, k = [], [], 0
        if len(targets) != ops.count("Cast") or any(t not in CAST_TARGETS for t in targets):
            raise InvalidArgument(f"{label}: its targets 'to' ({targets}) are not one float or double per Cast of its "
                                  f"{ops.count('Cast')}; re-create the model from the original")
        targets.reverse()
        for j, op in enumerate(ops):
            if op not in OPS:
                raise InvalidArgument(f"{label}: op {op!r} is not one it runs ({', '.join(OPS)}); re-create the "
                                      "model from the original, or disable the pass fuse_elementwise_chains")
            code, arity, fn = OPS[op]
            if op == "Cast":
                code, dtype = CAST_TARGETS[targets.pop()]
                fn = _cast_to(dtype)
            srcs = operands[k:k + arity]
            k += arity
            if len(srcs) != arity or any(not 0 <= s < n_in + j for s in srcs):
                raise InvalidArgument(f"{label}: op {j} ({op}) reads registers {srcs}, but only 0..{n_in + j - 1} "
                                      "are written before it; re-create the model from the original")
            program.append((fn, n_in + j, srcs))
            # (op, dst, a, b, c): a unary op's b and c are its a, a binary op's c its b
            quads += [code, n_in + j, srcs[0], srcs[min(1, arity - 1)], srcs[-1]]
        n_regs = n_in + len(ops)
        if k != len(operands) or len(results) != len(node.outputs) or any(not n_in <= r < n_regs for r in results):
            raise InvalidArgument(f"{label}: its operands ({len(operands)}) or results ({results}) do not match its "
                                  f"{len(ops)} ops and {len(node.outputs)} outputs; re-create the model from the "
                                  "original")
        self.program = program
        self.results = results
        self.n_regs = n_regs
        self.native = native_module() if NATIVE_CHAIN_ENABLED and n_regs <= 128 and n_in <= 64 else None
        self.code = np.array(quads, np.int32).tobytes()
        self.out_regs = np.array(results, np.int32).tobytes()

    @property
    def inline_fn(self) -> Callable | None:
        """``run_one`` for a chain with one output: the executor calls it with the inputs as
        arguments and takes an array. A property, not an attribute: a kernel keeping its own bound
        method is a reference cycle that keeps a dropped session alive until the collector runs."""
        return self.run_one if len(self.results) == 1 else None

    def compute(self, inputs: list) -> list:
        if self.native is not None:
            # path native: None where it declines (dtypes, shapes), whose checks the C call makes
            outs = self.native.elementwise_chain(self.code, inputs, self.out_regs, self.n_regs, _empty)
            if outs is not None:
                return outs
        return self.compute_numpy(inputs)

    def run_one(self, *inputs: np.ndarray) -> np.ndarray:
        """``compute`` of a chain with one output, for the plan's direct call."""
        if self.native is not None:
            outs = self.native.elementwise_chain(self.code, inputs, self.out_regs, self.n_regs, _empty)
            if outs is not None:
                return outs[0]
        return self.compute_numpy(list(inputs))[0]

    def compute_numpy(self, inputs: list) -> list:
        """Path ``numpy``: the ops one numpy call each (the canonical form)."""
        regs = list(inputs) + [None] * len(self.program)
        for fn, dst, srcs in self.program:
            regs[dst] = fn(*[regs[s] for s in srcs])
        return [np.asarray(regs[r]) for r in self.results]
