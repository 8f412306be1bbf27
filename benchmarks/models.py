"""Benchmark models, built with onnx.helper from seeded random weights (ir_version 10, opset 17).

- ``mlp()``: Gemm+Relu 784-2048-2048-10, batch 64.
- ``cnn()``: ResNet-18 at 1x3x224x224 with BatchNormalization nodes kept (so Conv+BN folding counts).
- ``encoder()``: one BERT-base encoder layer (hidden 768, 12 heads, seq 128), LayerNorm and Gelu in
  the decomposed form PyTorch exports (so the fusions count).
- ``chain(n)``: ``n`` tiny elementwise nodes on a [16] tensor (per-node overhead).
- ``light_models()`` / ``light_model(name)``: the onnx package's ``light`` model zoo. Those files
  hold no weights: every weight is a ``ConstantOfShape`` of a constant (all 0.02, ...) fed by an
  IR-3 overridable shape input. ``light_model`` replaces each such node by a seeded random
  initializer of that shape (He-scaled Conv weights, 1/sqrt(fan-in) Gemm weights, near-one
  BatchNormalization scales and variances, 0.1-0.2 scales on the BatchNormalization closing a
  residual branch so the logits stay moderate and the softmax outputs are not one-hot), drops the initializers from the graph inputs and sets ir_version 10, so
  both runtimes see real constant weights, as with a downloaded model.

``feeds(model)`` makes seeded random inputs for any of them.
"""

from __future__ import annotations

import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 10


class _Builder:
    """Collects nodes and initializers with unique names."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def const(self, base: str, value: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def randn(self, base: str, shape: tuple[int, ...], std: float) -> str:
        return self.const(base, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], base: str | None = None, **attrs) -> str:
        out = self.name(base or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=self.name(op_type), **attrs))
        return out

    def model(self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                                  producer_name="onnxhal-benchmarks")
        return onnx.shape_inference.infer_shapes(model)


def _rename_last_output(b: _Builder, new: str) -> None:
    b.nodes[-1].output[0] = new


def mlp(batch: int = 64, sizes: tuple[int, ...] = (784, 2048, 2048, 10), seed: int = 0) -> onnx.ModelProto:
    """Gemm (transB, as PyTorch exports Linear) + Relu layers."""
    b = _Builder(seed)
    x = "input"
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        w = b.randn("fc_w", (n_out, n_in), math.sqrt(2.0 / n_in))
        bias = b.randn("fc_b", (n_out,), 0.01)
        x = b.op("Gemm", [x, w, bias], "fc", transB=1)
        if i < len(sizes) - 2:
            x = b.op("Relu", [x])
    _rename_last_output(b, "output")
    return b.model("mlp", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, sizes[0]])],
                   [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, sizes[-1]])])


def _conv_bn(b: _Builder, x: str, c_in: int, c_out: int, k: int, stride: int, relu: bool, gamma: float = 1.0) -> str:
    w = b.randn("conv_w", (c_out, c_in, k, k), math.sqrt(2.0 / (c_in * k * k)))
    y = b.op("Conv", [x, w], "conv", kernel_shape=[k, k], strides=[stride, stride], pads=[k // 2] * 4)
    scale = b.const("bn_scale", (gamma * b.rng.uniform(0.8, 1.2, c_out)).astype(np.float32))
    shift = b.randn("bn_bias", (c_out,), 0.05)
    mean = b.randn("bn_mean", (c_out,), 0.05)
    var = b.const("bn_var", b.rng.uniform(0.5, 1.5, c_out).astype(np.float32))
    y = b.op("BatchNormalization", [y, scale, shift, mean, var], "bn", epsilon=1e-5)
    return b.op("Relu", [y]) if relu else y


def cnn(seed: int = 0, image: int = 224, classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18: conv7x7/2+BN+Relu, maxpool, 4 stages of 2 basic blocks, avgpool, Flatten, Gemm."""
    b = _Builder(seed)
    x = _conv_bn(b, "input", 3, 64, 7, 2, relu=True)
    x = b.op("MaxPool", [x], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c_in = 64
    for stage, c_out in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if stage > 0 and block == 0 else 1
            y = _conv_bn(b, x, c_in, c_out, 3, stride, relu=True)
            y = _conv_bn(b, y, c_out, c_out, 3, 1, relu=False, gamma=0.5)
            skip = _conv_bn(b, x, c_in, c_out, 1, stride, relu=False) if stride != 1 or c_in != c_out else x
            x = b.op("Relu", [b.op("Add", [y, skip], "residual")])
            c_in = c_out
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x], "gap")], "flat", axis=1)
    w = b.randn("fc_w", (classes, c_in), math.sqrt(1.0 / c_in))
    b.op("Gemm", [x, w, b.randn("fc_b", (classes,), 0.01)], "fc", transB=1)
    _rename_last_output(b, "output")
    return b.model("cnn", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, image, image])],
                   [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, classes])])


def _linear(b: _Builder, x: str, n_in: int, n_out: int) -> str:
    """MatMul + Add, as PyTorch exports nn.Linear on 3-D activations."""
    y = b.op("MatMul", [x, b.randn("w", (n_in, n_out), math.sqrt(1.0 / n_in))], "matmul")
    return b.op("Add", [y, b.randn("b", (n_out,), 0.02)], "linear")


def _layer_norm(b: _Builder, x: str, hidden: int) -> str:
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add, as PyTorch exports LayerNorm."""
    mean = b.op("ReduceMean", [x], "ln_mean", axes=[-1])
    d = b.op("Sub", [x, mean], "ln_sub")
    var = b.op("ReduceMean", [b.op("Pow", [d, b.const("two", np.array(2.0, np.float32))], "ln_pow")], "ln_var",
               axes=[-1])
    std = b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.array(1e-12, np.float32))], "ln_add")], "ln_sqrt")
    y = b.op("Div", [d, std], "ln_div")
    y = b.op("Mul", [y, b.const("ln_gamma", b.rng.uniform(0.8, 1.2, hidden).astype(np.float32))], "ln_mul")
    return b.op("Add", [y, b.randn("ln_beta", (hidden,), 0.05)], "ln_out")


def _gelu(b: _Builder, x: str) -> str:
    """x * 0.5 * (1 + erf(x / sqrt 2)) in the order PyTorch exports it."""
    e = b.op("Erf", [b.op("Div", [x, b.const("sqrt2", np.array(math.sqrt(2.0), np.float32))], "gelu_div")], "erf")
    y = b.op("Mul", [x, b.op("Add", [e, b.const("one", np.array(1.0, np.float32))], "gelu_add")], "gelu_mul")
    return b.op("Mul", [y, b.const("half", np.array(0.5, np.float32))], "gelu")


def encoder(batch: int = 1, seq: int = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072,
            seed: int = 0) -> onnx.ModelProto:
    """One BERT-base encoder layer: self-attention with an additive mask, FFN with Gelu, 2 LayerNorms."""
    b = _Builder(seed)
    head = hidden // heads
    split = b.const("heads_shape", np.array([batch, seq, heads, head], np.int64))

    def to_heads(x: str, perm: list[int]) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, split], "split_heads")], "heads", perm=perm)

    q = to_heads(_linear(b, "hidden", hidden, hidden), [0, 2, 1, 3])
    k = to_heads(_linear(b, "hidden", hidden, hidden), [0, 2, 3, 1])
    v = to_heads(_linear(b, "hidden", hidden, hidden), [0, 2, 1, 3])
    scores = b.op("Div", [b.op("MatMul", [q, k], "scores"), b.const("scale", np.array(math.sqrt(head), np.float32))],
                  "scaled")
    probs = b.op("Softmax", [b.op("Add", [scores, "mask"], "masked")], "probs", axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v], "context")], "context_t", perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const("merge_shape", np.array([batch, seq, hidden], np.int64))], "merged")
    x = _layer_norm(b, b.op("Add", [_linear(b, ctx, hidden, hidden), "hidden"], "residual1"), hidden)
    y = _linear(b, _gelu(b, _linear(b, x, hidden, ffn)), ffn, hidden)
    _layer_norm(b, b.op("Add", [y, x], "residual2"), hidden)
    _rename_last_output(b, "output")
    return b.model("encoder", [
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [batch, seq, hidden]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [batch, 1, 1, seq]),
    ], [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch, seq, hidden])])


def chain(n: int = 2000, size: int = 16, seed: int = 0) -> onnx.ModelProto:
    """``n`` elementwise nodes cycling Add, Mul, Relu on a [size] tensor."""
    b = _Builder(seed)
    add = b.const("add_c", b.rng.uniform(-0.1, 0.1, size).astype(np.float32))
    mul = b.const("mul_c", b.rng.uniform(0.998, 1.002, size).astype(np.float32))
    x = "input"
    for i in range(n):
        kind = i % 3
        x = b.op("Add", [x, add]) if kind == 0 else b.op("Mul", [x, mul]) if kind == 1 else b.op("Relu", [x])
    _rename_last_output(b, "output")
    return b.model("chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [size])],
                   [helper.make_tensor_value_info("output", TensorProto.FLOAT, [size])])


#: Bumped whenever ``light_model``'s weights change, so cached copies are rebuilt.
LIGHT_WEIGHTS_VERSION = 2

LIGHT_NAMES = ("resnet50", "vgg19", "densenet121", "inception_v1", "inception_v2", "squeezenet", "shufflenet",
               "bvlc_alexnet", "zfnet512")


def light_models() -> dict[str, str]:
    """Paths of the ``light`` model-zoo files shipped in the onnx package, by short name."""
    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return {n: os.path.join(folder, f"light_{n}.onnx") for n in LIGHT_NAMES
            if os.path.isfile(os.path.join(folder, f"light_{n}.onnx"))}


def _weight_for(b: _Builder, node: onnx.NodeProto, shape: tuple[int, ...], fill: float,
                readers: list[tuple[onnx.NodeProto, int]], residual_end: bool) -> np.ndarray:
    """Random weight for a ConstantOfShape output, scaled for the role its first reader gives it.
    ``residual_end``: the reader is a BatchNormalization whose output feeds a residual Sum/Add."""
    rng = b.rng
    reader, index = readers[0] if readers else (None, -1)
    op = reader.op_type if reader is not None else ""
    if op == "Conv" and index == 1:
        w = rng.standard_normal(shape, np.float32)
        w *= np.float32(math.sqrt(2.0 / max(1, math.prod(shape[1:]))))
        return w
    if op in ("Gemm", "MatMul") and index == 1:
        trans_b = any(a.name == "transB" and a.i for a in reader.attribute)
        fan_in = shape[-1] if trans_b else shape[0]
        w = rng.standard_normal(shape, np.float32)
        w *= np.float32(math.sqrt(1.0 / max(1, fan_in)))
        return w
    if op == "BatchNormalization" and index == 1 and residual_end:
        return rng.uniform(0.1, 0.2, shape).astype(np.float32)  # keeps residual sums bounded
    if op == "BatchNormalization" and index in (1, 4):
        return rng.uniform(0.8, 1.2, shape).astype(np.float32)
    return (fill + rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(np.float32)


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light model ``name`` with its ConstantOfShape weights materialized as random initializers."""
    model = onnx.load(light_models()[name])
    graph = model.graph
    b = _Builder(seed)
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in graph.node:
        for i, inp in enumerate(n.input):
            readers.setdefault(inp, []).append((n, i))
    kept, weights = [], []
    for n in graph.node:
        if n.op_type == "ConstantOfShape" and n.input[0] in consts:
            shape = tuple(int(d) for d in consts[n.input[0]])
            value = next((numpy_helper.to_array(a.t) for a in n.attribute if a.name == "value"), np.zeros(1))
            first = readers.get(n.output[0], [])
            next_ops = {r.op_type for r, _ in readers.get(first[0][0].output[0], [])} if first else set()
            residual_end = bool(next_ops & {"Sum", "Add"})
            classifier = "Softmax" in next_ops
            arr = _weight_for(b, n, shape, float(value.reshape(-1)[0]), first, residual_end)
            if classifier and first[0][1] == 1:  # small logits: softmax outputs that are not one-hot
                arr *= np.float32(0.1)
            weights.append(numpy_helper.from_array(arr.astype(value.dtype, copy=False), n.output[0]))
        else:
            kept.append(n)
    used = {i for n in kept for i in n.input}
    inits = [t for t in graph.initializer if t.name in used] + weights
    init_names = {t.name for t in inits}
    inputs = [i for i in graph.input if i.name not in consts and i.name not in init_names]
    new_graph = helper.make_graph(kept, graph.name, inputs, list(graph.output), inits)
    out = helper.make_model(new_graph, opset_imports=list(model.opset_import), ir_version=IR_VERSION,
                            producer_name="onnxhal-benchmarks")
    # inference reads only the weights' types and shapes: run it on a copy that declares the large
    # ones as inputs, so the hundreds of megabytes of VGG's weights are not serialized for it (the
    # small ones stay: a Reshape's shape is one, and inference reads its values)
    small = [t for t in inits if math.prod(t.dims) <= 1024]
    large = [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in inits if math.prod(t.dims) > 1024]
    skeleton = helper.make_model(helper.make_graph(kept, graph.name, inputs + large, list(graph.output), small),
                                 opset_imports=list(model.opset_import), ir_version=IR_VERSION)
    out.graph.value_info.extend(onnx.shape_inference.infer_shapes(skeleton).graph.value_info)
    return out


def feeds(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded random float inputs for every graph input (an additive attention mask gets zeros and
    large negatives, as a padding mask would)."""
    rng = np.random.default_rng(seed)
    init = {t.name for t in model.graph.initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if vi.name == "mask":
            value = np.where(rng.random(shape) < 0.1, -10000.0, 0.0)
        else:
            value = rng.standard_normal(shape)
        out[vi.name] = value.astype(dtype)
    return out


BUILDERS = {"mlp": mlp, "cnn": cnn, "encoder": encoder, "chain": chain}
