"""Extended-level fusions into ``com.onnxhal`` operators (CPU kernels in cpu/kernels/fused.py).

- ``fuse_layer_norm``: ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] -> LayerNormalization
  (the ONNX op at opset >= 17, else ``com.onnxhal`` LayerNormalization with the same contract).
- ``fuse_gelu``: x * 0.5 * (1 + Erf(x / sqrt 2)) in its exporter orderings -> ``com.onnxhal`` Gelu.
- ``fuse_replace_nan``: Where(IsNaN(x), c, x) -> ``com.onnxhal`` ReplaceNaN (after exported attention).
- ``fuse_matmul_bias``: MatMul(x, constant W) + Add(constant bias)[+ Relu/Gelu] -> FusedMatMul.
- ``push_relu_into_concat``: Relu(Concat(...)) -> Concat of the inputs, each already
  non-negative or given a Relu of its own that its Conv then absorbs (ShuffleNet's stride-2 units).
- ``pull_relu_after_maxpool``: MaxPool(Relu(x)) -> Relu(MaxPool(x)), also through a Concat of
  Relu outputs: the Relu runs over the pooled output and the Conv before drops its epilogue.
- ``fuse_conv_activation``: Conv [+ Add(residual)] [+ activation] -> FusedConv(X, W, B, Z).
- ``fuse_conv_gated_activation``: Conv or bare FusedConv + x * sigmoid(x) (SiLU), x *
  HardSigmoid(x) or HardSwish(x) -> FusedConv with a ``Swish`` or ``HardSwish`` epilogue (CPU EP only).
- ``fuse_gemm_activation``: Gemm + activation -> FusedGemm.
- ``fuse_batchnorm_activation``: inference BatchNormalization [+ activation] ->
  FusedBatchNormalization(X, multiplier, shift): the statistics precomputed into one affine.

At ORT_ENABLE_LAYOUT and above (ORT's level 3, where its CPU-only NCHWc transformer rewrites
every Conv), ``adopt_fused_kernels`` also turns the remaining Conv, Gemm and MatMul-by-constant
nodes into their fused forms without an epilogue, so every heavy product runs on the fused
kernels' threads, and ``fuse_channel_shuffle`` folds a ShuffleNet channel shuffle
(Reshape (N, G, C/G, ...) -> Transpose(0, 2, 1, ...) -> Reshape (N, C, ...)) after a FusedConv
into its ``channel_shuffle`` attribute: a grouped convolution writes its groups' outputs straight
to their shuffled channels, so the shuffle's copy goes away.

Fused ops carry ``activation`` (op name, "" for none) and ``activation_params`` (floats).
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    FUSED_DOMAIN,
    add_initializer,
    constant,
    graph_output_names,
    live_nodes,
    make_node,
    rank,
    replace_nodes,
    rewired,
    scalar_constant,
    sole_consumer,
    static_shape,
    value_like,
)
from onnxhal.runtime.optimizer.weight_folding import batchnorm_stats


def _name(node: Node, suffix: str) -> str:
    """Name of a node replacing ``node``: its name (or, if unnamed, its unique output) + suffix."""
    return f"{node.name or node.outputs[0]}_{suffix}"


def _follower(graph: Graph, node: Node, op_types: tuple[str, ...]) -> Node | None:
    """The sole consumer of ``node``'s output if it is a standard op of ``op_types``."""
    nxt = sole_consumer(graph, node.outputs[0])
    if nxt is None or nxt.op_type not in op_types or nxt.domain not in ("", FUSED_DOMAIN):
        return None
    return nxt


def _other_input(node: Node, name: str) -> str | None:
    """The input of a binary node that is not ``name`` (None if both are ``name``)."""
    others = [i for i in node.inputs if i != name]
    return others[0] if len(others) == 1 else None


#: The op types ``activation_of`` may take as an epilogue (the optimizer skips the passes that fuse
#: one where the graph holds none of them).
ACTIVATION_OPS = frozenset({"Relu", "Sigmoid", "Tanh", "Gelu", "LeakyRelu", "HardSigmoid", "Clip"})


def activation_of(graph: Graph, node: Node) -> tuple[str, list[float]] | None:
    """(activation, params) if ``node`` is an activation a fused kernel can apply, else None."""
    op = node.op_type
    if op not in ACTIVATION_OPS:
        return None
    if node.domain == FUSED_DOMAIN:
        return ("Gelu", []) if op == "Gelu" else None
    if node.domain != "":
        return None
    if op in ("Relu", "Sigmoid", "Tanh"):
        return op, []
    if op == "Gelu" and node.attr("approximate", "none") == "none":  # opset 20's, as dynamo exports it
        return "Gelu", []
    if op == "LeakyRelu":
        return op, [node.attr("alpha", 0.01)]
    if op == "HardSigmoid":
        return op, [node.attr("alpha", 0.2), node.attr("beta", 0.5)]
    if op == "Clip":
        if len(node.inputs) > 1 or "min" not in node.attributes and "max" not in node.attributes:
            bounds = []
            # an absent bound is the type's numeric_limits lowest() / max() (the spec's words), so
            # an inf is clamped to the largest finite value, as the Clip kernel does
            dtype = graph.value_info(node.inputs[0]).dtype
            big = float(np.finfo(dtype).max) if dtype is not None and dtype.kind == "f" else math.inf
            for i, default in ((1, -big), (2, big)):
                name = node.inputs[i] if len(node.inputs) > i else ""
                value = scalar_constant(graph, name) if name else default
                if value is None:
                    return None
                bounds.append(value)
            return op, bounds
        return op, [node.attr("min", -3.4028234663852886e38), node.attr("max", 3.4028234663852886e38)]
    return None


def _activation_follower(graph: Graph, node: Node) -> tuple[Node, str, list[float]] | None:
    nxt = sole_consumer(graph, node.outputs[0])
    if nxt is None or nxt.inputs[0] != node.outputs[0]:
        return None
    act = activation_of(graph, nxt)
    return (nxt, act[0], [float(p) for p in act[1]]) if act else None


#: Ops whose first output is non-negative when all their data inputs are (pools take a max or a
#: mean of input values; see ``non_negative`` for MaxPool's padding).
_SIGN_KEEPING = {"MaxPool": 1, "AveragePool": 1, "GlobalMaxPool": 1, "GlobalAveragePool": 1, "Concat": None}


def _windows_hold_input(pool: Node) -> bool:
    """Whether every window of a MaxPool covers at least one input element: its pads are below
    its kernel on every axis, with no dilation (SAME pads stay below the kernel then too). A
    window of padding alone gives -inf (onnxruntime rejects such pads), which a Relu before the
    pool would not have turned into 0; a dilated window can skip every input element of a short
    axis (rows -1 and 2 of a 2-row input), so dilated pools qualify only without padding."""
    kernel = list(pool.attr("kernel_shape") or [])
    pads = list(pool.attr("pads") or [])
    auto_pad = pool.attr("auto_pad", "NOTSET")
    if any(d != 1 for d in pool.attr("dilations") or []):
        return bool(kernel) and not any(pads) and auto_pad in ("NOTSET", "VALID")
    return bool(kernel) and all(p < kernel[i % len(kernel)] for i, p in enumerate(pads))


def non_negative(graph: Graph, name: str, depth: int = 6) -> bool:
    """Whether every element of value ``name`` is provably >= 0 (or NaN): the output of a Relu
    (alone or as a fused activation), or of a max/mean pool or Concat of such values."""
    node = graph.producer(name)
    if node is None or depth == 0 or name != node.outputs[0]:
        return False
    if node.domain == "" and node.op_type == "Relu":
        return True
    if node.domain == FUSED_DOMAIN and node.attr("activation", "") == "Relu":
        return True
    if node.domain != "" or node.op_type not in _SIGN_KEEPING:
        return False
    if node.op_type == "MaxPool" and not _windows_hold_input(node):
        return False
    data = node.inputs[:_SIGN_KEEPING[node.op_type]]
    return bool(data) and all(non_negative(graph, i, depth - 1) for i in data)


def push_relu_into_concat(graph: Graph) -> bool:
    """Relu(Concat(x1, ..., xn)) -> Concat(x1', ..., xn'), where xi' is xi when it is already
    non-negative (a Relu of it changes nothing) and Relu(xi) when xi comes from a Conv read only
    by the Concat (``fuse_conv_activation`` then applies that Relu inside the Conv's epilogue).
    Relu is elementwise, so it commutes with Concat; the rewrite saves the pass over the whole
    concatenation (ShuffleNet's stride-2 units concatenate an AveragePool of a Relu output with
    a Conv branch, then apply Relu). Left alone when some input is neither."""
    changed = False
    for relu in live_nodes(graph, "Relu"):
        if relu.op_type != "Relu" or relu.domain != "":
            continue
        concat = graph.producer(relu.inputs[0])
        if concat is None or concat.op_type != "Concat" or concat.domain != "" \
                or sole_consumer(graph, concat.outputs[0]) is not relu:
            continue
        convs = []
        for x in concat.inputs:
            if non_negative(graph, x):
                continue
            conv = graph.producer(x)
            if (conv is None or conv.op_type != "Conv" or conv.domain != ""
                    or sole_consumer(graph, x) is not concat or concat.inputs.count(x) != 1):
                break
            convs.append(x)
        else:
            new_nodes, inputs = [], list(concat.inputs)
            for x in convs:
                y = value_like(graph, x, f"{x}_relu")
                new_nodes.append(make_node(graph, "Relu", [x], [y], name=_name(relu, x)))
                inputs[inputs.index(x)] = y
            joined = make_node(graph, "Concat", inputs, relu.outputs, name=concat.name or relu.name,
                               axis=concat.attr("axis"))
            replace_nodes(graph, [concat, relu], [*new_nodes, joined])
            changed = True
    return changed


def _relu_input(graph: Graph, name: str, reader: Node) -> str | None:
    """The input of the Relu producing ``name`` when ``reader`` is its only reader, else None."""
    relu = graph.producer(name)
    if (relu is None or relu.op_type != "Relu" or relu.domain != "" or sole_consumer(graph, name) is not reader
            or reader.inputs.count(name) != 1):
        return None
    return relu.inputs[0]


def pull_relu_after_maxpool(graph: Graph) -> bool:
    """MaxPool(Relu(x)) -> Relu(MaxPool(x)), and MaxPool(Concat(Relu(x1), ..., Relu(xn))) ->
    Relu(MaxPool(Concat(x1, ..., xn))), for a strided MaxPool (no Indices output) whose windows
    all hold an input element. Relu is monotonic, so it commutes with a window's max (NaN
    propagates either way); after the pool it runs over the pooled output, a quarter of the
    elements for 2x2 strides, and the Conv before the pool drops its Relu epilogue: the pass over
    SqueezeNet's 64x111x111 stem output, over its fire3/fire5 expand outputs, and over the
    ResNet/AlexNet/Inception stem outputs."""
    changed = False
    for pool in live_nodes(graph, "MaxPool"):
        if (pool.op_type != "MaxPool" or pool.domain != "" or any(pool.outputs[1:]) or not _windows_hold_input(pool)
                or all(s == 1 for s in (pool.attr("strides") or [1]))):
            continue
        x = pool.inputs[0]
        src = graph.producer(x)
        if src is None:
            continue
        pooled_input = _relu_input(graph, x, pool)
        if pooled_input is not None:
            removed, joined = [src], []
        elif src.op_type == "Concat" and src.domain == "" and sole_consumer(graph, x) is pool:
            inner = [_relu_input(graph, i, src) for i in src.inputs]
            if not inner or any(i is None for i in inner):
                continue
            pooled_input = value_like(graph, x, f"{x}_pre_relu")
            joined = [make_node(graph, "Concat", inner, [pooled_input], name=src.name or x, axis=src.attr("axis"))]
            removed = [graph.producer(i) for i in src.inputs] + [src]
        else:
            continue
        out = pool.outputs[0]
        pooled = value_like(graph, out, f"{out}_pre_relu")
        new_pool = rewired(graph, pool, [pooled_input], [pooled], pool.name or out)
        relu = make_node(graph, "Relu", [pooled], [out], name=_name(pool, "relu"))
        replace_nodes(graph, [*removed, pool], [*joined, new_pool, relu])
        changed = True
    return changed


def _same_shape(graph: Graph, a: str, b: str) -> bool:
    """Whether values ``a`` and ``b`` have one shape on every run: both fully static and equal, or
    equal dim by dim where a symbolic dim is the same named one (a model's batch dim: ResNet's
    residual Adds, exported with a dynamic batch)."""
    if a in graph.initializers or b in graph.initializers:
        sa, sb = static_shape(graph, a), static_shape(graph, b)
        return sa is not None and sa == sb
    sa, sb = graph.value_info(a).shape, graph.value_info(b).shape
    return sa is not None and sa == sb and all(d is not None and d != "" for d in sa)


def fuse_conv_activation(graph: Graph) -> bool:
    """Conv, then optionally Add (or 2-input Sum) of a same-shaped residual, then optionally an activation."""
    changed = False
    for conv in live_nodes(graph, "Conv"):
        if conv.op_type != "Conv" or conv.domain != "":
            continue
        pattern, last, residual = [conv], conv, ""
        add = _follower(graph, conv, ("Add", "Sum"))
        if add is not None and add.domain == "" and len(add.inputs) == 2:
            other = _other_input(add, conv.outputs[0])
            if other and _same_shape(graph, conv.outputs[0], other):
                pattern.append(add)
                last, residual = add, other
        act = _activation_follower(graph, last)
        if act is not None:
            pattern.append(act[0])
            last = act[0]
        if len(pattern) == 1:
            continue
        inputs = list(conv.inputs) + [""] * (3 - len(conv.inputs))
        if residual:
            inputs.append(residual)
        fused = make_node(graph, "FusedConv", inputs, [last.outputs[0]], name=_name(conv, "fused"),
                          domain=FUSED_DOMAIN, activation=act[1] if act else "",
                          activation_params=act[2] if act else [])
        fused.attribute_protos.update(conv.attribute_protos)
        fused.attributes.update(conv.attributes)
        replace_nodes(graph, pattern, [fused])
        changed = True
    return changed


def _gated_activation(graph: Graph, name: str) -> tuple[list[Node], str, list[float]] | None:
    """The nodes computing x * f(x) from value ``name`` = x alone, with the fused activation they
    make: Mul(x, Sigmoid(x)) -> Swish [1] (SiLU, YOLO's and EfficientNet's), Mul(x,
    HardSigmoid(x)) -> HardSwish [alpha, beta] (paddle's hard-swish before opset 14), a HardSwish
    node -> HardSwish [1/6, 1/2]. Either operand order of the Mul."""
    if name in graph_output_names(graph):
        return None
    readers = graph.consumers(name)
    if any(name in r.implicit_inputs or r.domain != "" for r in readers):
        return None
    if len(readers) == 1 and readers[0].op_type == "HardSwish":
        return [readers[0]], "HardSwish", [1.0 / 6.0, 0.5]
    if len(readers) != 2:
        return None
    gate = next((r for r in readers if r.op_type in ("Sigmoid", "HardSigmoid")), None)
    mul = next((r for r in readers if r.op_type == "Mul"), None)
    if gate is None or mul is None or gate.inputs[0] != name or sorted(mul.inputs) != sorted([name, gate.outputs[0]]):
        return None
    if sole_consumer(graph, gate.outputs[0]) is not mul:
        return None
    if gate.op_type == "Sigmoid":
        return [gate, mul], "Swish", [1.0]
    return [gate, mul], "HardSwish", [float(gate.attr("alpha", 0.2)), float(gate.attr("beta", 0.5))]


def fuse_conv_gated_activation(graph: Graph) -> bool:
    """A Conv, or a FusedConv without an activation or a channel shuffle, whose output x feeds
    only x * sigmoid(x) or a hard-swish (``_gated_activation``): that activation becomes the
    convolution's epilogue, where the separate nodes took two more passes and two more outputs
    (onnxruntime runs these as one kernel too: MLAS's fused Conv activation, and its
    QuickGelu fusion for x * sigmoid(alpha x))."""
    changed = False
    for conv in live_nodes(graph, "Conv", "FusedConv"):
        plain = conv.op_type == "Conv" and conv.domain == ""
        bare = (conv.op_type == "FusedConv" and conv.domain == FUSED_DOMAIN and not conv.attr("activation", "")
                and not conv.attr("channel_shuffle", 0))
        if not (plain or bare):
            continue
        dtype = graph.value_info(conv.outputs[0]).dtype
        if dtype is None or dtype.kind != "f":
            continue
        gated = _gated_activation(graph, conv.outputs[0])
        if gated is None:
            continue
        nodes, act, params = gated
        inputs = list(conv.inputs) + ([""] * (3 - len(conv.inputs)) if plain else [])
        attrs = {k: a for k, a in conv.attribute_protos.items() if k not in ("activation", "activation_params")}
        fused = make_node(graph, "FusedConv", inputs, [nodes[-1].outputs[0]], name=_name(conv, "fused"),
                          domain=FUSED_DOMAIN, activation=act, activation_params=params)
        fused.attribute_protos.update(attrs)
        fused.attributes.update({k: v for k, v in conv.attributes.items() if k in attrs})
        replace_nodes(graph, [conv, *nodes], [fused])
        changed = True
    return changed


def fuse_gemm_activation(graph: Graph) -> bool:
    """Gemm followed by an activation."""
    changed = False
    for gemm in live_nodes(graph, "Gemm"):
        if gemm.op_type != "Gemm" or gemm.domain != "":
            continue
        act = _activation_follower(graph, gemm)
        if act is None:
            continue
        fused = make_node(graph, "FusedGemm", gemm.inputs, [act[0].outputs[0]], name=_name(gemm, "fused"),
                          domain=FUSED_DOMAIN, activation=act[1], activation_params=act[2])
        fused.attribute_protos.update(gemm.attribute_protos)
        fused.attributes.update(gemm.attributes)
        replace_nodes(graph, [gemm, act[0]], [fused])
        changed = True
    return changed


def fuse_batchnorm_activation(graph: Graph) -> bool:
    """BatchNormalization with constant statistics, then optionally an activation."""
    changed = False
    for bn in live_nodes(graph, "BatchNormalization"):
        stats = batchnorm_stats(graph, bn)
        if stats is None:
            continue
        scale, bias, mean, var = (s.astype(np.float64).reshape(-1) for s in stats)
        multiplier = scale / np.sqrt(var + bn.attr("epsilon", 1e-5))
        dtype = stats[0].dtype
        names = [add_initializer(graph, f"{bn.name or bn.outputs[0]}_multiplier", multiplier.astype(dtype)),
                 add_initializer(graph, f"{bn.name or bn.outputs[0]}_shift", (bias - mean * multiplier).astype(dtype))]
        act = _activation_follower(graph, bn)
        pattern = [bn, act[0]] if act else [bn]
        fused = make_node(graph, "FusedBatchNormalization", [bn.inputs[0], *names], [pattern[-1].outputs[0]],
                          name=_name(bn, "fused"), domain=FUSED_DOMAIN, activation=act[1] if act else "",
                          activation_params=act[2] if act else [])
        replace_nodes(graph, pattern, [fused])
        changed = True
    return changed


def fuse_matmul_bias(graph: Graph) -> bool:
    """MatMul(x, constant 2-D W) + Add(constant [N] bias), then optionally Relu or Gelu."""
    changed = False
    for mm in live_nodes(graph, "MatMul"):
        if mm.op_type != "MatMul" or mm.domain != "":
            continue
        weights = constant(graph, mm.inputs[1])
        add = _follower(graph, mm, ("Add",))
        if weights is None or weights.ndim != 2 or weights.dtype.kind != "f" or add is None or add.domain:
            continue
        bias_name = _other_input(add, mm.outputs[0])
        bias = constant(graph, bias_name) if bias_name else None
        if bias is None or bias.dtype != weights.dtype or bias.shape not in ((weights.shape[1],), (1, weights.shape[1])):
            continue
        if bias.ndim == 2 and (rank(graph, mm.inputs[0]) or 0) < 2:  # a (1, N) bias lifts a 1-D product to 2-D
            continue
        pattern, last, act = [mm, add], add, None
        follower = _activation_follower(graph, add)
        if follower is not None and follower[1] in ("Relu", "Gelu"):
            act = follower
            pattern.append(act[0])
            last = act[0]
        if bias.ndim != 1:
            bias_name = add_initializer(graph, f"{bias_name}_1d", bias.reshape(-1))
        fused = make_node(graph, "FusedMatMul", [mm.inputs[0], mm.inputs[1], bias_name], [last.outputs[0]],
                          name=_name(mm, "fused"), domain=FUSED_DOMAIN, activation=act[1] if act else "",
                          activation_params=[])
        replace_nodes(graph, pattern, [fused])
        changed = True
    return changed


MS_DOMAIN = "com.microsoft"


def _float_of_shape(graph: Graph, name: str, shapes: tuple[tuple[int, ...], ...]) -> bool:
    return bool(name) and graph.value_info(name).elem_type == TensorProto.FLOAT and static_shape(graph, name) in shapes


def fuse_matmul_integer_to_float(graph: Graph) -> bool:
    """MatMulInteger -> Cast(float) -> Mul(scale) [-> Add(constant [N] bias)] as onnxruntime's
    quantizer writes each dynamically quantized MatMul -> com.microsoft MatMulIntegerToFloat (the
    fusion onnxruntime makes for its CPU EP). The scale is split into the two factors of the Mul
    that made it (a_scale * b_scale, the same float32 product the kernel forms), or taken as
    a_scale with b_scale 1. A's zero point and the scale must be per tensor; the result is the
    same float32 arithmetic in the same order: one kernel instead of four."""
    changed = False
    for mmi in live_nodes(graph, "MatMulInteger"):
        if mmi.op_type != "MatMulInteger" or mmi.domain != "" or len(mmi.outputs) != 1:
            continue
        ins = list(mmi.inputs) + ["", ""]
        a_zp, b_zp = ins[2], ins[3]
        b_shape = static_shape(graph, ins[1])
        if b_shape is None or len(b_shape) < 2 or (a_zp and static_shape(graph, a_zp) not in ((), (1,))):
            continue
        n = b_shape[-1]
        per_tensor_or_column = ((), (1,), (n,))
        cast = _follower(graph, mmi, ("Cast",))
        if cast is None or cast.domain or cast.attr("to", 0) != TensorProto.FLOAT:
            continue
        mul = _follower(graph, cast, ("Mul",))
        scale = _other_input(mul, cast.outputs[0]) if mul is not None and not mul.domain else None
        if scale is None or not _float_of_shape(graph, scale, per_tensor_or_column):
            continue
        pattern, last = [mmi, cast, mul], mul
        maker = graph.producer(scale)
        if (maker is not None and maker.op_type == "Mul" and not maker.domain and sole_consumer(graph, scale) is mul
                and all(_float_of_shape(graph, f, per_tensor_or_column) for f in maker.inputs)):
            a_scale, b_scale = maker.inputs
            pattern.append(maker)
        else:
            a_scale, b_scale = scale, add_initializer(graph, f"{scale}_one", np.ones((), np.float32))
        add = _follower(graph, mul, ("Add",))
        bias = _other_input(add, mul.outputs[0]) if add is not None and not add.domain else None
        bias_value = constant(graph, bias) if bias else None
        if bias_value is not None and bias_value.dtype == np.float32 and bias_value.shape == (n,):
            pattern.append(add)
            last = add
        else:
            bias = ""
        graph.opset.setdefault(MS_DOMAIN, 1)
        fused = make_node(graph, "MatMulIntegerToFloat", [ins[0], ins[1], a_scale, b_scale, a_zp, b_zp, bias],
                          [last.outputs[0]], name=_name(mmi, "to_float"), domain=MS_DOMAIN)
        replace_nodes(graph, pattern, [fused])
        changed = True
    return changed


def _close(value: float | None, target: float, rtol: float = 1e-4) -> bool:
    return value is not None and abs(value - target) <= rtol * abs(target)


def fuse_gelu(graph: Graph) -> bool:
    """Erf-based Gelu: Div(x, sqrt2) or Mul(x, 1/sqrt2) -> Erf -> Add 1 -> Mul x -> Mul 0.5,
    or with the 0.5 applied to x first."""
    changed = False
    for erf in live_nodes(graph, "Erf"):
        if erf.op_type != "Erf" or erf.domain != "":
            continue
        scale = graph.producer(erf.inputs[0])
        if scale is None or scale.domain or sole_consumer(graph, scale.outputs[0]) is not erf:
            continue
        if scale.op_type == "Div" and _close(scalar_constant(graph, scale.inputs[1], scale.inputs[0]), math.sqrt(2.0)):
            x = scale.inputs[0]
        elif scale.op_type == "Mul":
            x = next((a for a, b in (scale.inputs, scale.inputs[::-1])
                      if _close(scalar_constant(graph, b, a), 1 / math.sqrt(2.0))), None)
        else:
            continue
        add = _follower(graph, erf, ("Add",))
        if x is None or add is None or not _close(scalar_constant(graph, _other_input(add, erf.outputs[0]) or "", x), 1.0):
            continue
        mul1 = _follower(graph, add, ("Mul",))
        if mul1 is None:
            continue
        other = _other_input(mul1, add.outputs[0])
        half = graph.producer(other) if other else None
        if other == x:  # (x * (1 + erf)) * 0.5
            mul2 = _follower(graph, mul1, ("Mul",))
            if mul2 is None or not _close(scalar_constant(graph, _other_input(mul2, mul1.outputs[0]) or "", x), 0.5):
                continue
            pattern = [scale, erf, add, mul1, mul2]
        elif (half is not None and half.op_type == "Mul" and sole_consumer(graph, other) is mul1
              and x in half.inputs and _close(scalar_constant(graph, _other_input(half, x) or "", x), 0.5)):
            pattern = [half, scale, erf, add, mul1]  # (x * 0.5) * (1 + erf)
        elif other and _close(scalar_constant(graph, other, x), 0.5):  # x * (0.5 * (1 + erf)): the dynamo exporter's
            mul2 = _follower(graph, mul1, ("Mul",))
            if mul2 is None or _other_input(mul2, mul1.outputs[0]) != x:
                continue
            pattern = [scale, erf, add, mul1, mul2]
        else:
            continue
        gelu = make_node(graph, "Gelu", [x], [pattern[-1].outputs[0]],
                         name=_name(erf, "gelu"), domain=FUSED_DOMAIN)
        replace_nodes(graph, pattern, [gelu])
        changed = True
    return changed


def _reduce_mean_last_axis(graph: Graph, node: Node, x: str) -> bool:
    """True if ``node`` is ReduceMean(x) over the last axis only, keeping dims."""
    if node.op_type != "ReduceMean" or node.domain or node.inputs[0] != x or node.attr("keepdims", 1) != 1:
        return False
    axes = node.attr("axes")
    if len(node.inputs) > 1 and node.inputs[1]:
        value = constant(graph, node.inputs[1])
        axes = None if value is None else value.reshape(-1).tolist()
    r = rank(graph, x)
    return axes is not None and len(axes) == 1 and (axes[0] == -1 or (r is not None and axes[0] == r - 1))


def fuse_layer_norm_standard(graph: Graph) -> bool:
    """``fuse_layer_norm`` only where the result is the standard ONNX op (opset >= 17)."""
    return fuse_layer_norm(graph) if graph.opset_version("") >= 17 else False


def fuse_layer_norm(graph: Graph) -> bool:
    """The decomposed LayerNormalization PyTorch exports, normalizing over the last axis."""
    changed = False
    for mean in live_nodes(graph, "ReduceMean"):
        if mean.op_type != "ReduceMean" or not _reduce_mean_last_axis(graph, mean, mean.inputs[0]):
            continue
        x = mean.inputs[0]
        sub = _follower(graph, mean, ("Sub",))
        if sub is None or sub.inputs != (x, mean.outputs[0]):
            continue
        readers = list({id(n): n for n in graph.consumers(sub.outputs[0])}.values())  # Mul(d, d) reads twice
        if len(readers) != 2 or sub.outputs[0] in {v.name for v in graph.outputs}:
            continue
        square = next((n for n in readers if n.op_type in ("Pow", "Mul")), None)
        div = next((n for n in readers if n.op_type == "Div"), None)
        if square is None or div is None or div.inputs[0] != sub.outputs[0]:
            continue
        if square.op_type == "Pow" and not (square.inputs[0] == sub.outputs[0]
                                            and scalar_constant(graph, square.inputs[1], x) == 2.0):
            continue
        if square.op_type == "Mul" and square.inputs != (sub.outputs[0], sub.outputs[0]):
            continue
        var = _follower(graph, square, ("ReduceMean",))
        if var is None or not _reduce_mean_last_axis(graph, var, square.outputs[0]):
            continue
        add_eps = _follower(graph, var, ("Add",))
        eps = scalar_constant(graph, _other_input(add_eps, var.outputs[0]) or "", x) if add_eps else None
        sqrt = _follower(graph, add_eps, ("Sqrt",)) if eps is not None else None
        if sqrt is None or sole_consumer(graph, sqrt.outputs[0]) is not div or div.inputs[1] != sqrt.outputs[0]:
            continue
        pattern, last = [mean, sub, square, var, add_eps, sqrt, div], div
        dim = (static_shape(graph, x) or (None,))[-1]
        gamma = beta = ""
        mul = _follower(graph, div, ("Mul",))
        gamma_name = _other_input(mul, div.outputs[0]) if mul else None
        gamma_value = constant(graph, gamma_name) if gamma_name else None
        if gamma_value is not None and gamma_value.ndim == 1 and (dim is None or gamma_value.shape[0] == dim):
            pattern.append(mul)
            last, gamma, dim = mul, gamma_name, gamma_value.shape[0]
            add = _follower(graph, mul, ("Add",))
            beta_name = _other_input(add, mul.outputs[0]) if add else None
            beta_value = constant(graph, beta_name) if beta_name else None
            if beta_value is not None and beta_value.shape == gamma_value.shape:
                pattern.append(add)
                last, beta = add, beta_name
        if not gamma:
            if dim is None:
                continue
            dtype = graph.value_info(x).dtype or np.dtype(np.float32)
            gamma = add_initializer(graph, f"{mean.name or x}_ln_scale", np.ones(dim, dtype=dtype))
        standard = graph.opset_version("") >= 17
        ln = make_node(graph, "LayerNormalization", [x, gamma] + ([beta] if beta else []), [last.outputs[0]],
                       name=_name(mean, "layernorm"), domain="" if standard else FUSED_DOMAIN,
                       axis=-1, epsilon=float(eps))
        replace_nodes(graph, pattern, [ln])
        changed = True
    return changed


def adopt_fused_kernels(graph: Graph) -> bool:
    """Conv -> FusedConv, Gemm -> FusedGemm, MatMul(x, constant 2-D float W) -> FusedMatMul,
    each with no activation."""
    changed = False
    for node in live_nodes(graph, "Conv", "Gemm", "MatMul"):
        if node.domain != "":
            continue
        if node.op_type == "Conv":
            inputs = list(node.inputs)
            fused = make_node(graph, "FusedConv", inputs, node.outputs, name=_name(node, "fused"),
                              domain=FUSED_DOMAIN, activation="")
        elif node.op_type == "Gemm":
            fused = make_node(graph, "FusedGemm", node.inputs, node.outputs, name=_name(node, "fused"),
                              domain=FUSED_DOMAIN, activation="")
        elif node.op_type == "MatMul":
            w = constant(graph, node.inputs[1])
            if w is None or w.ndim != 2 or w.dtype.kind != "f":
                continue
            fused = make_node(graph, "FusedMatMul", [*node.inputs, ""], node.outputs, name=_name(node, "fused"),
                              domain=FUSED_DOMAIN, activation="")
        else:
            continue
        if node.op_type != "MatMul":
            fused.attribute_protos.update(node.attribute_protos)
            fused.attributes.update(node.attributes)
        replace_nodes(graph, [node], [fused])
        changed = True
    return changed


def fuse_channel_shuffle(graph: Graph) -> bool:
    """FusedConv (no residual) -> Reshape (N, G, C/G, *S) -> Transpose (0, 2, 1, ...) -> Reshape
    (N, C, *S) becomes the FusedConv with ``channel_shuffle`` = G."""
    changed = False
    for conv in live_nodes(graph, "FusedConv"):
        if (conv.op_type != "FusedConv" or conv.domain != FUSED_DOMAIN or conv.attr("channel_shuffle", 0)
                or (len(conv.inputs) > 3 and conv.inputs[3])):
            continue
        shape = static_shape(graph, conv.outputs[0])
        first = _follower(graph, conv, ("Reshape",))
        if shape is None or len(shape) < 3 or first is None or first.domain != "" \
                or first.inputs[0] != conv.outputs[0]:
            continue
        split = static_shape(graph, first.outputs[0])
        if split is None or len(split) != len(shape) + 1 or split[0] != shape[0] or split[3:] != shape[2:] \
                or split[1] < 2 or split[1] * split[2] != shape[1]:
            continue
        transpose = _follower(graph, first, ("Transpose",))
        perm = [0, 2, 1] + list(range(3, len(split)))
        if transpose is None or transpose.domain != "" or list(transpose.attr("perm") or []) != perm:
            continue
        last = _follower(graph, transpose, ("Reshape",))
        if last is None or last.domain != "" or last.inputs[0] != transpose.outputs[0] \
                or static_shape(graph, last.outputs[0]) != shape:
            continue
        fused = make_node(graph, "FusedConv", conv.inputs, [last.outputs[0]], name=_name(conv, "shuffled"),
                          domain=FUSED_DOMAIN, channel_shuffle=int(split[1]))
        fused.attribute_protos.update(conv.attribute_protos)
        fused.attributes.update(conv.attributes)
        replace_nodes(graph, [conv, first, transpose, last], [fused])
        changed = True
    return changed


def fuse_replace_nan(graph: Graph) -> bool:
    """Where(IsNaN(x), c, x) with a scalar constant c -> ``com.onnxhal`` ReplaceNaN(x, value=c).
    PyTorch's scaled-dot-product attention exports it after every Softmax (a fully masked row's
    NaNs become 0): one elementwise op a device EP can run next to the Softmax, instead of a bool
    tensor and a Where that leave the attention scores to the host."""
    changed = False
    for where in live_nodes(graph, "Where"):
        if where.op_type != "Where" or where.domain != "" or len(where.inputs) != 3:
            continue
        isnan = graph.producer(where.inputs[0])
        if isnan is None or isnan.op_type != "IsNaN" or isnan.domain or isnan.inputs[0] != where.inputs[2]:
            continue
        x = where.inputs[2]
        value = scalar_constant(graph, where.inputs[1], x, kinds="f")
        if value is None or static_shape(graph, where.inputs[1]) not in ((), (1,)):
            continue
        keep_isnan = sole_consumer(graph, isnan.outputs[0]) is not where
        node = make_node(graph, "ReplaceNaN", [x], [where.outputs[0]], name=_name(where, "replace_nan"),
                         domain=FUSED_DOMAIN, value=float(value))
        replace_nodes(graph, [where] if keep_isnan else [isnan, where], [node])
        changed = True
    return changed
