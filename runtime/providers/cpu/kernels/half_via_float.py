"""float16 computed in float32: the fast path of MatMul, Gemm, Conv, their fused forms and RNN,
GRU and LSTM when their inputs are float16, and float16 tables for elementwise kernels of one input
(``float16_table``: the activations).

numpy has no BLAS for float16: its matmul runs a plain C loop, and a float16 model (as
onnxconverter-common writes it) spent nearly all its time there. onnxruntime's CPU EP has no
float16 kernels for these ops on x86 either; it inserts Casts to float32 around them
(``InsertCastTransformer``), so each product is computed in float32 and rounded to float16 once.
This does the same inside the kernel: float16 inputs widened to float32 (a constant weight once,
kept per kernel), the float32 kernel run, its outputs rounded to float16.

An elementwise kernel of one input needs no product: every float16 input is one of 65536 values,
so its float32 result for each, rounded once, is a table, and a float16 run is one gather.

``ENABLED`` False keeps the plain float16 kernels (the tests compare the two).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from onnxhal.hal import KernelCreateContext, Node

F16 = np.dtype(np.float16)
_F32 = np.dtype(np.float32)

#: The fast path's switch: False runs float16 products in numpy's float16 arithmetic.
ENABLED = True


def applies(a: np.ndarray, b: np.ndarray) -> bool:
    """The condition that selects the fast path: both operands of the product float16 (kernels
    test ``a.dtype is F16`` first, so that the float32 path pays one identity test)."""
    return ENABLED and a.dtype is F16 and b.dtype is F16


class WidenedInputs:
    """Widens a kernel's float16 inputs to float32, keeping the copy of each constant initializer
    (the same array every run) so that weights are widened once, not per run."""

    def __init__(self, node: Node, ctx: KernelCreateContext | None) -> None:
        self.constant = frozenset(i for i, name in enumerate(node.inputs)
                                  if name and ctx is not None and ctx.is_constant_initializer(name))
        # input index -> (the float16 array, its float32 copy); a race only widens one twice
        self._copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __call__(self, inputs: list) -> list:
        out = []
        for i, v in enumerate(inputs):
            if not isinstance(v, np.ndarray) or v.dtype is not F16:
                out.append(v)
            elif i in self.constant:
                kept = self._copies.get(i)
                if kept is None or kept[0] is not v:
                    kept = (v, v.astype(_F32))
                    self._copies[i] = kept
                out.append(kept[1])
            else:
                out.append(v.astype(_F32))
        return out


def via_float32(compute: Callable[[list], list], inputs: list, widen: WidenedInputs) -> list:
    """``compute`` on the widened inputs, its float32 outputs rounded to float16."""
    return [y.astype(F16) if isinstance(y, np.ndarray) and y.dtype is _F32 else y for y in compute(widen(inputs))]


# -- elementwise ops of one float16 input: a table of the float32 kernel's results -----------------

_U16 = np.dtype(np.uint16)
#: Every float16 value (NaNs, infinities and subnormals included) in bit-pattern order, as float32.
_EVERY_HALF = np.arange(1 << 16, dtype=np.uint32).astype(_U16).view(F16).astype(_F32)
#: (kernel class, op, attributes) -> that kernel's float32 results over ``_EVERY_HALF``, rounded to float16.
TABLES: dict[tuple, np.ndarray] = {}


def table_applies(inputs: list) -> bool:
    """The condition that selects a float16 table: one float16 input."""
    return ENABLED and len(inputs) == 1 and inputs[0].dtype is F16


def float16_table(cls: type) -> type:
    """Class decorator for an elementwise kernel of one input: float16 inputs are looked up in a
    table of 65536 entries, the kernel's float32 result for each float16 value rounded once.

    That is what onnxruntime computes for such a node (its CPU EP casts the input to float32 and
    the output back, ``InsertCastTransformer``), exactly, for every input; and one gather replaces
    a formula of many numpy calls, each of which widens and rounds float16 operands. The table is
    built at the first float16 run and kept per op and attribute values (for all kernels of the
    process)."""
    compute = cls.compute
    init = cls.__init__

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        init(self, node, ctx)
        self.float16_table_key = (cls.__qualname__, node.op_type, repr(sorted(node.attributes.items())))

    def compute_with_table(self, inputs: list) -> list:
        if not table_applies(inputs):
            return compute(self, inputs)
        table = TABLES.get(self.float16_table_key)
        if table is None:
            with np.errstate(all="ignore"):  # NaN and infinity entries
                table = compute(self, [_EVERY_HALF])[0].astype(F16)
            table = TABLES.setdefault(self.float16_table_key, table)
        r = table.take(inputs[0].view(_U16))
        return [r if r.__class__ is np.ndarray else np.asarray(r)]

    cls.__init__ = __init__
    cls.compute = compute_with_table
    return cls
