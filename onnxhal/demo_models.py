"""The two small models ``onnxhal demo`` runs, built with onnx.helper from seeded weights.

- ``demo_cnn()``: Conv+BatchNorm+Relu twice, MaxPool, GlobalAveragePool, Flatten, Gemm, Softmax on
  a 1x3x32x32 image: everything a generic NPU takes.
- ``demo_transformer_block()``: one encoder block (hidden 64, 4 heads, sequence 16) as PyTorch exports
  it: attention with Softmax, LayerNorm decomposed, Gelu through Erf. An NPU without Erf leaves the
  Gelu to the CPU EP, so the demo shows the fallback and the transfers it costs.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_OPSET = 17
_IR_VERSION = 10


class _Builder:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, base: str, value: np.ndarray) -> str:
        name = f"{base}_{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def randn(self, base: str, shape: tuple[int, ...], std: float) -> str:
        return self.const(base, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def model(self, name: str, inputs: list, outputs: list) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION,
                                  producer_name="onnxhal-demo")
        return onnx.shape_inference.infer_shapes(model)


def demo_model() -> onnx.ModelProto:
    """The smallest demo model (kept for tests that pin its partition): Conv -> Relu -> GlobalAveragePool -> Flatten -> Gemm -> Softmax, seeded weights."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.2, "conv_w"),
        numpy_helper.from_array(np.zeros(8, np.float32), "conv_b"),
        numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32) * 0.3, "fc_w"),
        numpy_helper.from_array(np.zeros(10, np.float32), "fc_b"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["logits"], name="fc"),
        helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(nodes, "demo", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10,
                             producer_name="onnxhal-demo")


def demo_cnn(seed: int = 0) -> onnx.ModelProto:
    """A small image classifier: input ``image`` [1,3,32,32] -> ``probs`` [1,10]."""
    b = _Builder(seed)
    x = "image"
    for k, (c_in, c_out) in enumerate(((3, 16), (16, 32))):
        w = b.randn("conv_w", (c_out, c_in, 3, 3), math.sqrt(2.0 / (c_in * 9)))
        x = b.op("Conv", [x, w, b.const("conv_b", np.zeros(c_out, np.float32))], f"conv{k}", pads=[1, 1, 1, 1])
        x = b.op("BatchNormalization", [x, b.const("bn_scale", b.rng.uniform(0.8, 1.2, c_out).astype(np.float32)),
                                        b.randn("bn_bias", (c_out,), 0.1), b.randn("bn_mean", (c_out,), 0.1),
                                        b.const("bn_var", b.rng.uniform(0.8, 1.2, c_out).astype(np.float32))],
                 f"bn{k}")
        x = b.op("Relu", [x], f"relu{k}")
        if k == 0:
            x = b.op("MaxPool", [x], "maxpool", kernel_shape=[2, 2], strides=[2, 2])
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x], "avgpool")], "flatten")
    x = b.op("Gemm", [x, b.randn("fc_w", (10, 32), 0.3), b.const("fc_b", np.zeros(10, np.float32))], "fc", transB=1)
    b.op("Softmax", [x], "probs", axis=1)
    return b.model("demo_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, 32, 32])],
                   [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])])


def demo_transformer_block(seed: int = 0, seq: int = 16, hidden: int = 64, heads: int = 4) -> onnx.ModelProto:
    """One encoder block: input ``hidden`` [1,seq,hidden] -> ``output`` [1,seq,hidden]."""
    b = _Builder(seed)
    head = hidden // heads

    def linear(x: str, n_in: int, n_out: int, name: str) -> str:
        y = b.op("MatMul", [x, b.randn("w", (n_in, n_out), math.sqrt(1.0 / n_in))], f"{name}_matmul")
        return b.op("Add", [y, b.randn("b", (n_out,), 0.02)], name)

    def layer_norm(x: str, name: str) -> str:
        mean = b.op("ReduceMean", [x], f"{name}_mean", axes=[-1])
        d = b.op("Sub", [x, mean], f"{name}_sub")
        var = b.op("ReduceMean", [b.op("Pow", [d, b.const("two", np.array(2.0, np.float32))], f"{name}_pow")],
                   f"{name}_var", axes=[-1])
        std = b.op("Sqrt", [b.op("Add", [var, b.const("eps", np.array(1e-5, np.float32))], f"{name}_add")],
                   f"{name}_sqrt")
        y = b.op("Mul", [b.op("Div", [d, std], f"{name}_div"), b.const("gamma", np.ones(hidden, np.float32))],
                 f"{name}_mul")
        return b.op("Add", [y, b.const("beta", np.zeros(hidden, np.float32))], name)

    split = b.const("heads_shape", np.array([1, seq, heads, head], np.int64))

    def to_heads(x: str, perm: list[int], name: str) -> str:
        return b.op("Transpose", [b.op("Reshape", [x, split], f"{name}_split")], name, perm=perm)

    q = to_heads(linear("hidden", hidden, hidden, "q"), [0, 2, 1, 3], "q_heads")
    k = to_heads(linear("hidden", hidden, hidden, "k"), [0, 2, 3, 1], "k_heads")
    v = to_heads(linear("hidden", hidden, hidden, "v"), [0, 2, 1, 3], "v_heads")
    scores = b.op("Div", [b.op("MatMul", [q, k], "scores"), b.const("scale", np.array(math.sqrt(head), np.float32))],
                  "scaled")
    probs = b.op("Softmax", [scores], "attention", axis=-1)
    ctx = b.op("Transpose", [b.op("MatMul", [probs, v], "context")], "context_t", perm=[0, 2, 1, 3])
    ctx = b.op("Reshape", [ctx, b.const("merge_shape", np.array([1, seq, hidden], np.int64))], "merged")
    x = layer_norm(b.op("Add", [linear(ctx, hidden, hidden, "proj"), "hidden"], "residual1"), "ln1")
    h = linear(x, hidden, 4 * hidden, "ffn_in")
    erf = b.op("Erf", [b.op("Div", [h, b.const("sqrt2", np.array(math.sqrt(2.0), np.float32))], "gelu_div")], "erf")
    g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [erf, b.const("one", np.array(1.0, np.float32))], "gelu_add")],
                          "gelu_mul"), b.const("half", np.array(0.5, np.float32))], "gelu")
    layer_norm(b.op("Add", [linear(g, 4 * hidden, hidden, "ffn_out"), x], "residual2"), "output")
    return b.model("demo_transformer_block",
                   [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, seq, hidden])],
                   [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, seq, hidden])])
