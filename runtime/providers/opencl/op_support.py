"""Which nodes the OpenCL EP can run: dtype, shape and attribute constraints per op type.

``unsupported_reason(node, lookup)`` returns None when the node is claimable, else a short reason
(logged at debug level by ``get_capability``). Data tensors must be float32 of known rank;
parameters that steer indexing (Reshape's shape, Slice's starts, reduction axes, Clip bounds,
BatchNormalization statistics) must be constant initializers, because a plan is specialised to
them.

Shapes: with ``lookup.allow_dynamic`` (the EP's ``get_capability``), a tensor may have symbolic
dimensions (``batch``, ``sequence``): the node is claimed on its structure (op, dtype, rank, static
dims where a check needs them) and its partition is specialised per concrete input signature at run
time (``dynamic_partition.py``), where the same checks run again on concrete shapes. A parameter of
such a node may then also come from outside the partition at run time (a Reshape shape computed by
a Shape/Gather/Concat chain the CPU EP runs): it arrives in host memory and its value becomes part
of the signature. Without ``allow_dynamic`` (a plan being built) every shape must be static.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.errors import OrtError
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl.elementwise_codegen import (
    C_TYPES,
    CONTRIB_ELEMENTWISE,
    ELEMENTWISE_OPS,
    INTEGER_OPS,
    TYPED_OPS,
)
from onnxhal.runtime.providers.opencl.kernel_sources import ACTIVATION_CODES
from onnxhal.runtime.providers.opencl.quant_decompose import DECOMPOSED_OPS, integer_product_reason
from onnxhal.runtime.providers.opencl.quant_support import QUANT_OPS, quant_reason
from onnxhal.runtime.providers.opencl.spatial_geometry import check_pad_widths, pad_widths, resize_axis, resize_scales
from onnxhal.runtime.providers.opencl.spatial_sources import NEAREST_MODES, PAD_MODES, RESIZE_COORDS, RESIZE_MODES

#: What inspecting or lowering a node may raise. An OrtError is a limit of this EP (its message is
#: the decline reason); anything else is a bug in onnxhal, reported by ``decline_reason``.
INSPECTION_ERRORS = (OrtError, ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError)


def decline_reason(exc: BaseException, logger: logging.Logger, what: str) -> str:
    """The reason to record for declining what raised ``exc`` while ``what``: an OrtError's type and message;
    any other exception is an internal error, never passed off as a limit of the device: logged as an
    error with its traceback, and named as such in the reason."""
    if isinstance(exc, OrtError):
        return f"{type(exc).__name__}: {exc}"
    logger.error("OpenCL EP: internal error while %s: %s: %s", what, type(exc).__name__, exc, exc_info=exc)
    return f"internal error in onnxhal's OpenCL EP ({type(exc).__name__}: {exc}; traceback in the log)"


VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
REDUCE_OPS = {"ReduceSum": 0, "ReduceMean": 1, "ReduceMax": 2, "ReduceMin": 3, "ReduceProd": 4,
              "ReduceSumSquare": 5, "ReduceL2": 6, "ReduceL1": 7, "ReduceLogSumExp": 8, "ReduceLogSum": 9}
OTHER_OPS = frozenset({"Gemm", "MatMul", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                       "Softmax", "LogSoftmax", "LayerNormalization", "Transpose", "Concat", "Split", "Slice", "Gather",
                       "Expand", "LRN", "GatherND", "InstanceNormalization", "Pad", "Resize", "RMSNormalization",
                       "RotaryEmbedding", "Attention", *REDUCE_OPS})
SUPPORTED_OPS = frozenset(ELEMENTWISE_OPS) - frozenset(CONTRIB_ELEMENTWISE) | VIEW_OPS | OTHER_OPS | QUANT_OPS
#: Ops of the runtime optimizer's domain (runtime/optimizer/fusions.py) with the same kernels.
FUSED_DOMAIN = "com.onnxhal"
FUSED_DOMAIN_OPS = frozenset({"FusedConv", "FusedGemm", "FusedMatMul", "Gelu", "LayerNormalization",
                              "FusedBatchNormalization", "ReplaceNaN"})
#: onnxruntime's contrib ops (docs/ContribOperators.md) that onnxruntime-optimized exports hold.
MS_DOMAIN = "com.microsoft"
MS_DOMAIN_OPS = frozenset({"SkipLayerNormalization", "BiasGelu", "FastGelu", "Gelu"})
#: (domain, op) -> the claiming rule (fusion_rules.py) its kernel is claimed under, so that it can be
#: switched off and compared with the next EP computing it (issue 47's ops).
OP_RULES = {**{(MS_DOMAIN, op): "norm_gelu_ops" for op in MS_DOMAIN_OPS}, ("", "InstanceNormalization"): "norm_gelu_ops",
            ("", "Pad"): "pad_resize_ops", ("", "Resize"): "pad_resize_ops",
            **{("", op): "opset23_ops" for op in ("Sin", "Cos", "RMSNormalization", "RotaryEmbedding",
                                                          "Attention")}}
_EPILOGUE_CODES = ACTIVATION_CODES
MAX_RANK = 6
#: Kernels index with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1
F32 = np.dtype(np.float32)
#: Widest Attention head the OpenCL kernel's private arrays hold.
ONNX_ATTENTION_MAX_HEAD = 256


@dataclass
class GraphLookup:
    """Shapes, dtypes and constants of values, read from a graph (and remembered by the EP so a
    filtered graph missing some of them can still be compiled)."""

    graph: Graph
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, np.dtype]
    constants: dict[str, np.ndarray]
    allow_dynamic: bool = False
    #: Values the partition computes on the host at specialisation (rule ``shape_values``,
    #: ``shape_values.py``): their nodes are claimed without a kernel.
    shape_values: frozenset[str] = frozenset()
    #: Rule ``typed_values`` (``typed_reason``): int64, int32 and bool values are claimed where
    #: their op has a kernel for them (the backend sets it where the rule is on and the device
    #: computes 64-bit integers).
    typed: bool = False
    #: Whether ``typed_reason`` asks a typed node to read a value computed from the feeds (the claim
    #: does; a specialisation's static copy, whose shape values are constants, need not).
    typed_roots: bool = True
    #: Claiming rules of OP_RULES that are off: their ops are declined.
    rules_off: frozenset[str] = frozenset()
    #: value -> (static shape or None, dims as declared) of the graph's value info: parsed from the
    #: proto once per lookup (capability asks for each value's shape several times per node).
    _declared: dict[str, tuple[tuple[int, ...] | None, tuple | None]] = field(default_factory=dict, repr=False)
    _declared_dtype: dict[str, np.dtype | None] = field(default_factory=dict, repr=False)
    _data_rooted: frozenset[str] | None = field(default=None, repr=False)
    #: value -> its constant initializer's array, or whether it comes from outside the graph (no
    #: producer, not an input: ``constants`` may hold it): the graph does not change while a lookup
    #: lives, and capability and shape values ask this for each input of each node many times over.
    _const_source: dict[str, np.ndarray | bool] = field(default_factory=dict, repr=False)

    def data_rooted(self, name: str) -> bool:
        """Whether value ``name`` is computed from the values fed (a graph input that is not a
        constant), not from shapes and constants alone (rule ``typed_values``)."""
        if self._data_rooted is None:
            found = {i for i in self.graph.input_names if not self.graph.is_constant_initializer(i)}
            for n in self.graph.nodes:  # topological order
                if n.op_type not in ("Shape", "Size") and any(i in found for i in n.inputs if i):
                    found.update(o for o in n.outputs if o)
            self._data_rooted = frozenset(found)
        return name in self._data_rooted

    def _declared_shape(self, name: str) -> tuple[tuple[int, ...] | None, tuple | None]:
        entry = self._declared.get(name)
        if entry is None:
            dims = self.graph.value_info(name).shape
            static = tuple(int(d) for d in dims) if dims is not None and all(isinstance(d, int) for d in dims) \
                else None
            entry = self._declared[name] = (static, dims)
        return entry

    def dims(self, name: str) -> tuple | None:
        """The static shape, or with ``allow_dynamic`` the dims with symbols (str) or None where not
        fixed; None when even the rank is unknown."""
        static = self.shape(name)
        if static is not None or not self.allow_dynamic:
            return static
        return self._declared_shape(name)[1]

    def is_dynamic(self, name: str) -> bool:
        return bool(name) and self.shape(name) is None and self.dims(name) is not None

    def shape(self, name: str) -> tuple[int, ...] | None:
        # The graph first: an EP instance may see several graphs reusing value names.
        static = self._declared_shape(name)[0]
        if static is not None:
            self.shapes[name] = static
            return static
        const = self.const(name)
        if const is not None:
            return tuple(const.shape)
        return self.shapes.get(name)

    def dtype(self, name: str) -> np.dtype | None:
        const = self.const(name)
        if const is not None:
            dt = const.dtype
        elif name in self._declared_dtype:
            dt = self._declared_dtype[name]
        else:  # read from the proto once per lookup (capability asks several times per node)
            dt = self._declared_dtype[name] = self.graph.value_info(name).dtype
        if dt is not None:
            self.dtypes[name] = np.dtype(dt)
            return self.dtypes[name]
        return self.dtypes.get(name)

    def const(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        source = self._const_source.get(name)
        if source is None:
            source = self._const_source[name] = self._find_const_source(name)
        if source is True:
            return self.constants.get(name)
        if source is False:
            return None
        # written at each call as before: the EP's ``constants`` is shared by the lookups of the
        # graphs it sees, and the latest one to read a name leaves its array there
        self.constants[name] = source
        return source

    def _find_const_source(self, name: str) -> np.ndarray | bool:
        if self.graph.is_constant_initializer(name):
            return np.asarray(self.graph.initializer(name))
        return self.graph.producer(name) is None and name not in self.graph.input_names


def activation_spec(node: Node, lookup: GraphLookup) -> tuple[int, float, float] | None:
    """(epilogue code, p0, p1) when ``node`` is an activation a GEMM/Conv epilogue can apply."""
    op = node.op_type
    if node.domain not in ("", FUSED_DOMAIN) or (node.domain == FUSED_DOMAIN and op != "Gelu"):
        return None
    if op in ("Relu", "Sigmoid", "Tanh"):
        return _EPILOGUE_CODES[op], 0.0, 0.0
    if op == "LeakyRelu":
        return 4, float(node.attr("alpha", 0.01)), 0.0
    if op == "HardSigmoid":
        return 5, float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    if op == "Gelu" and node.attr("approximate", "none") == "none":
        return 7, 0.0, 0.0
    if op == "Clip":
        bounds = [node.attr("min", -np.inf), node.attr("max", np.inf)]
        for k, idx in enumerate((1, 2)):
            if len(node.inputs) > idx and node.inputs[idx]:
                const = lookup.const(node.inputs[idx])
                if const is None:
                    return None
                bounds[k] = float(const.reshape(-1)[0])
        return 6, float(bounds[0]), float(bounds[1])
    return None


def fused_activation_spec(node: Node) -> tuple[int, float, float]:
    """(epilogue code, p0, p1) of a ``com.onnxhal`` Fused* node's ``activation`` attributes."""
    act = node.attr("activation", "")
    params = [float(p) for p in node.attr("activation_params", [])] + [0.0, 0.0]
    if act not in _EPILOGUE_CODES:
        raise OrtNotImplemented(f"{node.op_type} activation {act!r} has no OpenCL epilogue")
    if act == "Clip" and len(params) == 2:
        params = [-np.inf, np.inf]
    return _EPILOGUE_CODES[act], params[0], params[1]


def _check_fused(node: Node, lookup: GraphLookup) -> str | None:
    if node.attr("activation", "") not in _EPILOGUE_CODES:
        return f"{node.op_type} activation {node.attr('activation')!r} has no OpenCL epilogue"
    if node.op_type == "FusedBatchNormalization":
        if _rank(lookup, node.inputs[0]) < 2:
            return "FusedBatchNormalization on rank < 2"
        return _need_const(lookup, node, 1, "multiplier") or _need_const(lookup, node, 2, "shift")
    if node.op_type == "FusedConv":
        if node.attr("channel_shuffle", 0):
            return "FusedConv with channel_shuffle has no OpenCL kernel (the CPU EP runs it)"
        return _check_conv(node, lookup)
    if node.op_type == "FusedMatMul":
        return _check_matmul(node, lookup)
    return None


def _shape_reason(lookup: GraphLookup, n: str) -> str | None:
    """Why the kernels cannot index value ``n`` (its rank or size), or None."""
    shape = lookup.dims(n)
    if shape is None:
        return f"{n!r} has no static shape" if not lookup.allow_dynamic else f"{n!r} has no known rank"
    if len(shape) > MAX_RANK:
        return f"{n!r} has rank {len(shape)} > {MAX_RANK}"
    if all(isinstance(d, int) for d in shape) and math.prod(shape) >= MAX_ELEMENTS:
        return f"{n!r} has {math.prod(shape)} elements; kernels index with 32-bit ints"
    return None


def _static_f32(lookup: GraphLookup, names) -> str | None:
    for n in names:
        if not n:
            continue
        reason = _shape_reason(lookup, n)
        if reason:
            return reason
        if lookup.dtype(n) != F32:
            return f"{n!r} is {lookup.dtype(n)}, not float32"
    return None


#: Rule ``typed_values``: ops computed on int64, int32 and bool values too, beside TYPED_OPS and
#: INTEGER_OPS (whose elements are copied, not computed: views, Expand, Gather by constant indices).
TYPED_MOVEMENT = VIEW_OPS | frozenset({"Expand", "Gather", "GatherND"})
_COMPARE = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"})
_LOGIC = frozenset({"And", "Or", "Xor", "Not"})
_NUMBERS = frozenset({np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.int32)})
BOOL = np.dtype(np.bool_)


def typed_reason(node: Node, lookup: GraphLookup, data: list[str]) -> str | None:
    """Rule ``typed_values``: why ``node`` cannot run with its int64/int32/bool values (``data``:
    its data inputs and outputs), or None. Exports build attention masks and position ids from
    ``attention_mask`` and ``input_ids`` with these (Cast, comparisons, And, Where, Expand, Gather);
    left to the host they would cut the partition or run on the CPU EP at every run."""
    op = node.op_type
    if op in TYPED_OPS and not lookup.typed:
        return f"{op} computes int64/int32/bool values (rule typed_values is off)"
    names = [n for n in data if n]
    for n in names:
        reason = _shape_reason(lookup, n)
        if reason:
            return reason
    dtypes = [lookup.dtype(n) for n in names]
    if all(d == F32 for d in dtypes) and op not in TYPED_OPS:
        return None
    if not lookup.typed:
        bad = next(n for n, d in zip(names, dtypes) if d != F32)
        return f"{bad!r} is {lookup.dtype(bad)}, not float32"
    if lookup.typed_roots and not any(lookup.data_rooted(i) for i in node.inputs if i):
        # Integers computed from shapes and constants alone are shape values (computed at
        # specialisation) or the host's: on the device they could steer a plan (a Reshape target,
        # Expand shape) from inside the partition, which its specialisation cannot read.
        return f"{op} computes from shapes and constants alone (rule typed_values takes values computed from the feeds)"
    unknown = next((n for n, d in zip(names, dtypes) if d not in C_TYPES), None)
    if unknown is not None:
        return f"{unknown!r} is {lookup.dtype(unknown)}, not float32, int64, int32 or bool"
    ins = [lookup.dtype(i) for i in node.inputs if i]
    out = lookup.dtype(node.outputs[0])
    if op in _COMPARE:
        ok = len(set(ins)) == 1 and (ins[0] in _NUMBERS or (op == "Equal" and ins[0] == BOOL)) and out == BOOL
    elif op in _LOGIC:
        ok = all(d == BOOL for d in (*ins, out))
    elif op == "Where":
        ok = ins[0] == BOOL and ins[1] == ins[2] == out
    elif op in INTEGER_OPS:
        ok = all(d in _NUMBERS and d == out for d in ins)
    elif op in TYPED_MOVEMENT or op == "Cast":
        ok = True
    else:
        return f"{op} on {sorted({str(d) for d in dtypes})}: only float32 has a kernel"
    return None if ok else f"{op} on {[str(d) for d in ins]} -> {out}: no kernel for these types"


def _need_const(lookup: GraphLookup, node: Node, index: int, what: str) -> str | None:
    if len(node.inputs) > index and node.inputs[index] and lookup.const(node.inputs[index]) is None:
        if runtime_param_ok(node, lookup, index):
            return None
        return f"{what} ({node.inputs[index]!r}) is not a constant initializer"
    return None


def runtime_param_ok(node: Node, lookup: GraphLookup, index: int) -> bool:
    """A parameter fed at run time is fine for a node with symbolic dimensions: its partition is
    specialised per signature, the parameter's value included (it must be a small int64 or float
    tensor of static shape, made outside the partition)."""
    if not lookup.allow_dynamic or not any(lookup.is_dynamic(v) for v in (*node.inputs, *node.outputs) if v):
        return False
    name = node.inputs[index]
    shape = lookup.shape(name)
    return (shape is not None and math.prod(shape) <= 64
            and lookup.dtype(name) in (np.dtype(np.int64), np.dtype(np.int32), F32))


def _check_view(node: Node, lookup: GraphLookup) -> str | None:
    """A view (Reshape, Flatten, Squeeze, Unsqueeze) renames its input's buffer, so both must hold
    as many elements; where both shapes are static and they do not, the node is left to the CPU EP,
    whose kernel refuses it at run with onnxruntime's error."""
    if node.op_type == "Reshape" and (reason := _need_const(lookup, node, 1, "Reshape shape")):
        return reason
    src, out = lookup.shape(node.inputs[0]), lookup.shape(node.outputs[0])
    if (src is not None and out is not None and all(isinstance(d, int) for d in (*src, *out))
            and int(np.prod(src)) != int(np.prod(out))):
        return (f"{node.op_type} of {list(src)} ({int(np.prod(src))} elements) to {list(out)} "
                f"({int(np.prod(out))} elements): the sizes differ")
    return None


def _rank(lookup: GraphLookup, name: str) -> int:
    dims = lookup.dims(name)
    if dims is None:
        raise OrtNotImplemented(f"{name!r} has no known rank")
    return len(dims)


def conv_shape_error(node: Node, x, w, bias) -> str | None:
    """Why onnxruntime's CPU EP refuses a Conv over input dims ``x``, weight dims ``w`` and bias
    dims ``bias`` (NCHW; None where unknown, symbolic dims skipped), or None. Its checks
    (core/providers/cpu/nn/conv_attributes.h ValidateInputShape and ComputeKernelShape, conv.cc's
    bias check) run at run time, after shape inference let the model load; a device that computed
    such a node would answer where onnxruntime fails."""
    group = node.attr("group", 1)
    if w is None or x is None or len(w) < 2:
        return None
    c, m, kc = x[1] if len(x) > 1 else None, w[0], w[1]
    if isinstance(c, int) and isinstance(kc, int) and c != kc * group:
        return f"input channels {c} are not kernel channels {kc} x group {group} (onnxruntime refuses the node)"
    if isinstance(m, int) and m % group:
        return f"output channels {m} are not divisible by group {group} (onnxruntime refuses the node)"
    kernel = node.attr("kernel_shape")
    if kernel is not None and list(kernel) != list(w[2:]) and all(isinstance(d, int) for d in w[2:]):
        return f"kernel_shape {list(kernel)} is not the weight's {list(w[2:])} (onnxruntime refuses the node)"
    if bias is not None and (len(bias) != 1 or (isinstance(m, int) and isinstance(bias[0], int) and bias[0] != m)):
        return f"bias of shape {list(bias)} is not [{m}] (onnxruntime refuses the node)"
    return None


def _check_conv(node: Node, lookup: GraphLookup) -> str | None:
    x = lookup.dims(node.inputs[0])
    if x is None or len(x) not in (3, 4):
        return f"Conv on rank {None if x is None else len(x)} input (only 1-D and 2-D)"
    w = lookup.shape(node.inputs[1])
    bias = lookup.dims(node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else None
    if (reason := conv_shape_error(node, x, None if w is None else list(w), bias)) is not None:
        return reason
    if w is not None and all(isinstance(d, int) for d in x[2:]):  # the CPU EP's geometry refuses a kernel longer than its padded input, as onnxruntime
        from onnxhal.runtime.providers.op_geometry import ConvGeometry

        try:
            ConvGeometry(node).resolve(x[2:], w[2:])
        except OrtError:
            return "the kernel is longer than the padded input (the CPU EP reports it)"
    return _static_f32(lookup, node.inputs[:3])


def _check_pool(node: Node, lookup: GraphLookup) -> str | None:
    if len([o for o in node.outputs if o]) > 1:
        return "MaxPool Indices output"
    if _rank(lookup, node.inputs[0]) not in (3, 4):
        return "pooling only on 1-D and 2-D inputs"
    return None


def _check_reduce(node: Node, lookup: GraphLookup) -> str | None:
    if len(node.inputs) > 1 and node.inputs[1]:
        if lookup.const(node.inputs[1]) is None:
            return "reduction axes are not constant"
    return None if reduce_layout(node, lookup) is not None else "reduction axes are not contiguous"


def reduce_axes(node: Node, lookup: GraphLookup) -> list[int] | None:
    """Sorted non-negative reduction axes; [] means none (noop) and None means all."""
    rank = _rank(lookup, node.inputs[0])
    if len(node.inputs) > 1 and node.inputs[1]:
        axes = [int(a) for a in lookup.const(node.inputs[1]).reshape(-1)]
    else:
        axes = node.attr("axes")
    if not axes:
        return [] if node.attr("noop_with_empty_axes", 0) else list(range(rank))
    return sorted(a % rank if rank else 0 for a in axes)


def reduce_layout(node: Node, lookup: GraphLookup) -> tuple[int, int, int] | None:
    """(outer, R, inner) when the reduced axes are contiguous once size-1 dimensions are ignored
    (with symbolic dimensions, taken as not 1: the layout then only says "contiguous", sizes are 0)."""
    shape = lookup.dims(node.inputs[0])
    axes = reduce_axes(node, lookup)
    if axes == []:
        return None
    if not all(isinstance(d, int) for d in shape):
        kept_axes = [a for a, d in enumerate(shape) if d != 1]
        idx = [i for i, a in enumerate(kept_axes) if a in axes]
        return (0, 0, 0) if not idx or idx == list(range(idx[0], idx[-1] + 1)) else None
    kept = [(d, a in axes) for a, d in enumerate(shape) if d != 1]
    idx = [i for i, (_, reduced) in enumerate(kept) if reduced]
    if not idx:
        return int(np.prod(shape, dtype=np.int64)), 1, 1
    if idx != list(range(idx[0], idx[-1] + 1)):
        return None

    def prod(part) -> int:
        return int(np.prod([d for d, _ in part], dtype=np.int64))
    return prod(kept[:idx[0]]), prod(kept[idx[0]:idx[-1] + 1]), prod(kept[idx[-1] + 1:])



def _check_gather(node: Node, lookup: GraphLookup) -> str | None:
    idx = node.inputs[1]
    if lookup.dtype(node.inputs[0]) != F32 and lookup.typed:
        # Rule typed_values: elements other than float32 are taken through an index table made from
        # the indices at planning (``take_flat``), so they must be constants of the plan: constant
        # initializers, or values of the specialisation (rule shape_tensors: a mask indexed by
        # positions); a token's data-dependent index would key a specialisation per value.
        if not _plan_constant(lookup, idx):
            return "Gather of int64/int32/bool data by indices that are not constants of the plan"
        return typed_reason(node, lookup, [node.inputs[0], *node.outputs])
    if lookup.const(idx) is None and lookup.dtype(idx) != np.dtype(np.int64):
        return "Gather indices must be int64 or constant"
    if lookup.dims(idx) is None:
        return "Gather indices have no static shape"
    const, xs = lookup.const(idx), lookup.dims(node.inputs[0])
    if const is not None and xs and const.size and isinstance(xs[node.attr("axis", 0) % len(xs)], int):
        n = xs[node.attr("axis", 0) % len(xs)]
        from onnxhal.runtime.providers.op_geometry import first_out_of_range

        if first_out_of_range(const, n) is not None:  # the CPU EP's kernel reports it
            return f"Gather indices out of range for an axis of length {n}"
    return _static_f32(lookup, [node.inputs[0], *node.outputs])


def _check_gather_nd(node: Node, lookup: GraphLookup) -> str | None:
    """Rule ``typed_values``: GatherND by indices that are constants of the plan (dynamo exports
    index the mask by position ids with it), through ``take_flat``'s index table."""
    if not lookup.typed:
        return "GatherND has a kernel with rule typed_values only (off)"
    if node.attr("batch_dims", 0):
        return "GatherND with batch_dims"
    if not _plan_constant(lookup, node.inputs[1]):
        return "GatherND by indices that are not constants of the plan"
    return None


def _plan_constant(lookup: GraphLookup, name: str) -> bool:
    """Whether value ``name`` is a constant of the plan: a constant initializer, or a value the
    specialisation computes (rule shape_values / shape_tensors)."""
    return lookup.const(name) is not None or name in lookup.shape_values


def _check_layernorm(node: Node, lookup: GraphLookup) -> str | None:
    if len([o for o in node.outputs if o]) > 1:
        return "LayerNormalization Mean/InvStdDev outputs"
    shape = lookup.dims(node.inputs[0])
    axis = node.attr("axis", -1) % len(shape)
    if not all(isinstance(d, int) for d in shape[axis:]):
        return "LayerNormalization over symbolic dimensions"
    r = int(np.prod(shape[axis:], dtype=np.int64))
    for i in node.inputs[1:]:
        if i and int(np.prod(lookup.shape(i), dtype=np.int64)) != r:
            return "LayerNormalization scale/bias not of the normalized size"
    return None


def check_rms_norm(node: Node, lookup: GraphLookup) -> str | None:
    """ONNX RMSNormalization (opset 23) over the axes from ``axis``, computed in float32: scale of
    the normalized shape (leading 1s allowed); other broadcasts and stash types are declined."""
    if node.attr("stash_type", 1) != 1:
        return f"RMSNormalization stash_type {node.attr('stash_type')} (only 1, float32, has an OpenCL kernel)"
    shape = lookup.dims(node.inputs[0])
    if not -len(shape) <= node.attr("axis", -1) < len(shape):
        return f"RMSNormalization axis {node.attr('axis')} outside rank {len(shape)}"
    axis = node.attr("axis", -1) % len(shape)
    normalized = tuple(shape[axis:])
    if not all(isinstance(d, int) for d in normalized):
        return "RMSNormalization over symbolic dimensions"
    scale = lookup.dims(node.inputs[1])
    if scale is None or not all(isinstance(d, int) for d in scale):
        return "RMSNormalization scale of no static shape"
    trimmed = tuple(scale)
    while len(trimmed) > len(normalized) and trimmed[0] == 1:
        trimmed = trimmed[1:]
    if (1,) * (len(normalized) - len(trimmed)) + trimmed != normalized:
        return (f"RMSNormalization scale {list(scale)} is not of the normalized shape {list(normalized)} "
                "(a broadcast scale has no OpenCL kernel; the next EP runs it)")
    return None


def check_rotary(node: Node, lookup: GraphLookup) -> str | None:
    """ONNX RotaryEmbedding (opset 23) without position_ids on [B, N, S, H] or [B, S, hidden]; the
    caches' shapes are checked on the concrete shapes at planning (InvalidArgument as the CPU EP)."""
    if len(node.inputs) > 3 and node.inputs[3]:
        return "RotaryEmbedding with position_ids has no OpenCL kernel (the next EP runs it)"
    rank = _rank(lookup, node.inputs[0])
    if rank == 3 and node.attr("num_heads", 0) <= 0:
        return "RotaryEmbedding of a 3-D input without num_heads"
    if rank not in (3, 4):
        return f"RotaryEmbedding of a rank-{rank} input"
    for i in (1, 2):
        if (r := _rank(lookup, node.inputs[i])) != 3:
            return f"RotaryEmbedding cache of rank {r} (an OpenCL kernel needs [B, S, rotary_dim / 2])"
    return None


def check_onnx_attention(node: Node, lookup: GraphLookup) -> str | None:
    """ai.onnx Attention (opset 23) in float32 with 3-D or 4-D Q/K/V, grouped heads, a bool or float32
    mask of at most 4 axes, is_causal, past and present keys and values (onnx_attention_lowering.py);
    the rest is declined with its reason, the next EP computing it."""
    if len(node.outputs) > 3 and node.outputs[3]:
        return "Attention's qk_matmul_output (the scores output) has no OpenCL kernel"
    if len(node.inputs) > 6 and node.inputs[6]:
        return "Attention with nonpad_kv_seqlen has no OpenCL kernel"
    if float(node.attr("softcap", 0.0)) != 0.0:
        return "Attention with softcap has no OpenCL kernel"
    if node.attr("softmax_precision", 1) != 1:
        return f"Attention softmax_precision {node.attr('softmax_precision')} (only 1, float32, has an OpenCL kernel)"
    if int(node.attr("left_window_size", -1)) >= 0 or int(node.attr("right_window_size", -1)) >= 0:
        return "Attention with a window has no OpenCL kernel"
    dims = [lookup.dims(node.inputs[i]) for i in range(3)]
    if any(d is None for d in dims):
        return "Attention Q, K or V of no known rank"
    ranks = [len(d) for d in dims]
    if len(set(ranks)) != 1 or ranks[0] not in (3, 4):
        return f"Attention Q, K, V of ranks {ranks} (an OpenCL kernel needs all 3-D or all 4-D)"
    if ranks[0] == 3 and (node.attr("q_num_heads", 0) <= 0 or node.attr("kv_num_heads", 0) <= 0):
        return "Attention of 3-D inputs without q_num_heads and kv_num_heads"
    past = [len(node.inputs) > i and bool(node.inputs[i]) for i in (4, 5)]
    if past[0] != past[1]:
        return "Attention with only one of past_key and past_value"
    if len(node.inputs) > 3 and node.inputs[3]:
        mask = node.inputs[3]
        if lookup.dtype(mask) not in (F32, np.dtype(np.bool_)):
            return f"Attention mask {mask!r} is {lookup.dtype(mask)} (an OpenCL kernel needs bool or float32)"
        if reason := _shape_reason(lookup, mask):
            return reason
        if not 1 <= (r := _rank(lookup, mask)) <= 4:
            return f"Attention mask of rank {r} (an OpenCL kernel needs 1 to 4 axes)"
    for i in (0, 2):  # the head sizes live in private arrays
        heads = node.attr("q_num_heads" if i == 0 else "kv_num_heads", 1) if ranks[0] == 3 else 1
        if isinstance(dims[i][-1], int) and dims[i][-1] // max(heads, 1) > ONNX_ATTENTION_MAX_HEAD:
            return f"Attention head size above {ONNX_ATTENTION_MAX_HEAD} (the OpenCL kernel's private arrays)"
    return None


def _check_bn(node: Node, lookup: GraphLookup) -> str | None:
    if node.attr("training_mode", 0) or len([o for o in node.outputs if o]) > 1:
        return "BatchNormalization in training mode"
    for i in range(1, 5):
        if reason := _need_const(lookup, node, i, "BatchNormalization parameter"):
            return reason
    return None if _rank(lookup, node.inputs[0]) >= 2 else "BatchNormalization on rank < 2"


def _check_clip(node: Node, lookup: GraphLookup) -> str | None:
    return _need_const(lookup, node, 1, "Clip min") or _need_const(lookup, node, 2, "Clip max")


def _check_matmul(node: Node, lookup: GraphLookup) -> str | None:
    a, b = lookup.dims(node.inputs[0]), lookup.dims(node.inputs[1])
    if len(a) < 1 or len(b) < 1:
        return "MatMul of scalars"
    if len(a) == 1 or len(b) == 1:
        return "MatMul with a 1-D operand"
    symbolic = not all(isinstance(d, int) for d in (*a[:-2], *b[:-2]))
    if len(b) > 2 and len(a) > 2 and a[:-2] != b[:-2] and not (symbolic and len(a) == len(b)):
        # (symbolic batch dims of equal rank are checked again on each concrete shape)
        return "MatMul with broadcast batch dimensions"
    if len(b) > 2 and len(a) not in (2, len(b)):
        return "MatMul with broadcast batch dimensions"
    return None


def check_skip_layernorm(node: Node, lookup: GraphLookup) -> str | None:
    """com.microsoft SkipLayerNormalization (onnxruntime docs/ContribOperators.md): LayerNorm over the
    last axis of input + skip (+ bias), outputs Y and optionally the sum (output 3). Skip may
    repeat over the leading rows ([S, H] or [1, S, H] for an input [B, S, H]), as onnxruntime allows."""
    outs = [bool(o) for o in node.outputs]
    if any(outs[1:3]):
        return "SkipLayerNormalization mean/inv_std_var outputs (training only) have no OpenCL kernel"
    x, skip = lookup.dims(node.inputs[0]), lookup.dims(node.inputs[1])
    if len(x) not in (2, 3) or len(skip) not in (2, 3):
        return f"SkipLayerNormalization on rank {len(x)} input / rank {len(skip)} skip (onnxruntime takes 2-D or 3-D)"
    h = x[-1]
    if not isinstance(h, int):
        return "SkipLayerNormalization over a symbolic hidden size"
    def differ(a, b) -> bool:  # symbolic dims are checked again on each concrete shape
        return isinstance(a, int) and isinstance(b, int) and a != b
    if (len(skip) > len(x) or differ(skip[-1], h) or differ(skip[-2], x[-2])
            or len(skip) == 3 and skip[0] != 1 and differ(skip[0], x[0])):
        return f"SkipLayerNormalization skip {list(skip)} does not repeat over input {list(x)}"
    for k in range(2, len(node.inputs)):
        if node.inputs[k] and (s := lookup.dims(node.inputs[k])) is not None and math.prod(
                d if isinstance(d, int) else -1 for d in s) != h:
            return f"SkipLayerNormalization input {k} of shape {list(s)} is not [{h}]"
    return None


def check_instance_norm(node: Node, lookup: GraphLookup) -> str | None:
    """InstanceNormalization (ONNX): per sample and channel over the spatial axes; scale and B [C]."""
    x = lookup.dims(node.inputs[0])
    if len(x) < 3:
        return f"InstanceNormalization on rank {len(x)} input (it needs N, C and a spatial axis)"
    for k in (1, 2):  # (symbolic dims are checked again on each concrete shape)
        s = lookup.dims(node.inputs[k])
        if s is None or len(s) != 1 or isinstance(x[1], int) and isinstance(s[0], int) and s[0] != x[1]:
            return f"InstanceNormalization input {k} of shape {s} is not [{x[1]}] (the CPU EP reports it)"
    return None


def _plan_param(node: Node, lookup: GraphLookup, index: int, what: str) -> str | None:
    """Why input ``index`` of ``node``, when given, cannot be a constant of the plan (a constant
    initializer, a shape value of the specialisation, or a small parameter fed at run time)."""
    if len(node.inputs) > index and node.inputs[index] and not _plan_constant(lookup, node.inputs[index]):
        return _need_const(lookup, node, index, what)
    return None


def check_pad(node: Node, lookup: GraphLookup) -> str | None:
    """Pad (ONNX): modes constant, edge and reflect, pads (and constant_value, axes) constants of the plan."""
    mode = node.attr("mode", "constant")
    if mode not in PAD_MODES:
        return f"Pad mode {mode!r} has no OpenCL kernel (constant, edge and reflect have)"
    reason = (_plan_param(node, lookup, 1, "Pad pads") or _plan_param(node, lookup, 2, "Pad constant_value")
              or _plan_param(node, lookup, 3, "Pad axes"))
    xs = lookup.dims(node.inputs[0])
    if reason is None and all(isinstance(d, int) for d in xs):  # else checked on each concrete shape
        try:
            check_pad_widths(node, xs, pad_widths(node, len(xs), lookup.const))
        except OrtNotImplemented as exc:
            if "not a constant" not in str(exc):  # a value the specialisation computes
                return str(exc)
    return reason


def check_resize(node: Node, lookup: GraphLookup) -> str | None:
    """Resize (ONNX, opset 11 on) of the last two axes: modes nearest and linear, the coordinate
    transformations of spatial_sources.RESIZE_COORDS; scales constants of the plan (sizes need not
    be: the output's shape gives them)."""
    if (lookup.graph.opset_version("") or 11) < 11:
        return "Resize before opset 11 has no OpenCL kernel"
    for attr, default, known in (("mode", "nearest", RESIZE_MODES),
                                 ("coordinate_transformation_mode", "half_pixel", RESIZE_COORDS),
                                 ("nearest_mode", "round_prefer_floor", NEAREST_MODES)):
        value = node.attr(attr, default)
        if value not in known:
            return f"Resize {attr} {value!r} has no OpenCL kernel ({', '.join(known)} have)"
    if node.attr("antialias", 0):
        return "Resize with antialias has no OpenCL kernel"
    if node.attr("axes") is not None or node.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "Resize with axes or a keep_aspect_ratio_policy has no OpenCL kernel"
    if _rank(lookup, node.inputs[0]) < 2:
        return "Resize of a rank < 2 input"
    if not (len(node.inputs) > 3 and node.inputs[3]) and (reason := _plan_param(node, lookup, 2, "Resize scales")):
        return reason
    xs, ys = lookup.dims(node.inputs[0]), lookup.dims(node.outputs[0])
    if ys is not None and all(isinstance(d, int) for d in (*xs, *ys)):  # else checked on each concrete shape
        try:
            sh, sw = resize_scales(node, xs, ys, lookup.const)
            for o, i, sc in ((ys[-2], xs[-2], sh), (ys[-1], xs[-1], sw)):
                resize_axis(o, i, sc, node.attr("coordinate_transformation_mode", "half_pixel"),
                            node.attr("mode", "nearest") == "linear", node.attr("nearest_mode", "round_prefer_floor"))
        except OrtNotImplemented as exc:
            if "not a constant" not in str(exc):  # a value the specialisation computes
                return str(exc)
    return None


_CHECKS: dict[str, Callable[[Node, GraphLookup], str | None]] = {
    "Conv": _check_conv, "MaxPool": _check_pool, "AveragePool": _check_pool, "Gather": _check_gather,
    "LayerNormalization": _check_layernorm, "GatherND": _check_gather_nd, "BatchNormalization": _check_bn, "Clip": _check_clip,
    "MatMul": _check_matmul, "FusedConv": _check_fused, "FusedGemm": _check_fused, "FusedMatMul": _check_fused,
    "FusedBatchNormalization": _check_fused,
    "SkipLayerNormalization": check_skip_layernorm, "InstanceNormalization": check_instance_norm,
    "Pad": check_pad, "Resize": check_resize, "RMSNormalization": check_rms_norm, "RotaryEmbedding": check_rotary,
    "Attention": check_onnx_attention,
    "LRN": lambda n, lk: None if _rank(lk, n.inputs[0]) >= 3 else "LRN on rank < 3",
    "Reshape": _check_view, "Flatten": _check_view,
    "Split": lambda n, lk: ("Split with an unnamed output" if not all(n.outputs) else
                            _need_const(lk, n, 1, "Split sizes")),
    "Unsqueeze": lambda n, lk: _need_const(lk, n, 1, "Unsqueeze axes") or _check_view(n, lk),
    "Squeeze": lambda n, lk: _need_const(lk, n, 1, "Squeeze axes") or _check_view(n, lk),
    "Expand": lambda n, lk: _need_const(lk, n, 1, "Expand shape"),
    "Slice": lambda n, lk: next((r for i in range(1, 5) if (r := _need_const(lk, n, i, "Slice parameter"))), None),
    **{op: _check_reduce for op in REDUCE_OPS},
}

# Inputs that are parameters, not float data (index sets), per op.
PARAM_INPUTS = {"FusedBatchNormalization": {1, 2}, "Reshape": {1}, "Split": {1}, "Unsqueeze": {1}, "Squeeze": {1}, "Expand": {1}, "Slice": {1, 2, 3, 4},
                 "Gather": {1}, "GatherND": {1}, "Clip": {1, 2}, "RotaryEmbedding": {3}, "Pad": {1, 2, 3}, "Resize": {1, 2, 3}, **{op: {1} for op in REDUCE_OPS}}


def unsupported_reason(node: Node, lookup: GraphLookup) -> str | None:
    """None if the OpenCL EP can run ``node``, else why not."""
    if lookup.shape_values and all(o in lookup.shape_values for o in node.outputs if o) and any(node.outputs):
        return None  # a shape value: computed on the host when the partition is specialised
    if (node.op_type, node.domain) in DECOMPOSED_OPS:  # quant_decompose.py: lowered as DQ, MatMul, Q
        return integer_product_reason(node, lookup)
    if node.domain == FUSED_DOMAIN:
        if node.op_type not in FUSED_DOMAIN_OPS:
            return f"no OpenCL kernel for {node.domain}.{node.op_type}"
    elif node.domain == MS_DOMAIN:
        if node.op_type not in MS_DOMAIN_OPS:
            return f"no OpenCL kernel for {node.domain}.{node.op_type}"
    elif node.domain not in ("", "ai.onnx") or node.op_type not in SUPPORTED_OPS:
        return f"no OpenCL kernel for {node.domain or 'ai.onnx'}.{node.op_type}"
    rule = OP_RULES.get((node.domain if node.domain == MS_DOMAIN else "", node.op_type))
    if rule in lookup.rules_off:
        return f"{node.domain or 'ai.onnx'}.{node.op_type} has a kernel with rule {rule} only (off)"
    if node.subgraphs:
        return "node has subgraphs"
    if node.op_type in QUANT_OPS:  # quant_support.py: their codes are int8/uint8
        return quant_reason(node, lookup)
    params = PARAM_INPUTS.get(node.op_type, set())
    if node.op_type == "Attention":
        # the forms without a kernel first (their reason, not an unshaped output's); the mask may be
        # bool, so check_onnx_attention checks it (a device buffer, not a parameter)
        if reason := check_onnx_attention(node, lookup):
            return reason
        params = {3}
    data = [n for i, n in enumerate(node.inputs) if i not in params]
    if node.op_type == "Gather":
        data = []
    outputs = [o for o in node.outputs if o]
    if node.op_type in TYPED_OPS or node.op_type in INTEGER_OPS or node.op_type in TYPED_MOVEMENT:
        reason = typed_reason(node, lookup, [*data, *outputs])
    else:
        reason = _static_f32(lookup, [*data, *outputs])
    if reason:
        return reason
    check = _CHECKS.get(node.op_type)
    return check(node, lookup) if check else None
