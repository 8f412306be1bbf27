"""Extended-level fusion of ``quantize_dynamic``'s DynamicQuantizeLinear -> MatMulIntegerToFloat
pairs into com.microsoft DynamicQuantizeMatMul, as onnxruntime's ``DynamicQuantizeMatMulFusion``
makes it for its CPU EP.

A DynamicQuantizeLinear whose three outputs (codes, scale, zero point) only one
MatMulIntegerToFloat reads, as its A, a_scale and a_zero_point, becomes part of it: the fused
kernel quantizes A itself and multiplies the codes less their zero point, never writing the uint8
codes and reading them back (one step and three array passes less per quantized MatMul). The
float32 steps are those of the pair, in its order (``kernels/ms_quantized.py``): same bits.
MatMulIntegerToFloat comes from ``fusions.fuse_matmul_integer_to_float``, which runs before.
"""

from __future__ import annotations

from onnxhal.hal.graph import Graph
from onnxhal.runtime.optimizer.rewrite import graph_output_names, live_nodes, make_node, replace_nodes

MS = "com.microsoft"


def fuse_dynamic_quantize_matmul(graph: Graph) -> bool:
    """Each DynamicQuantizeLinear read by one MatMulIntegerToFloat alone -> DynamicQuantizeMatMul."""
    changed = False
    outputs = graph_output_names(graph)
    for mm in live_nodes(graph, "MatMulIntegerToFloat"):
        if mm.domain != MS or len(mm.inputs) < 5:
            continue
        dq = graph.producer(mm.inputs[0])
        if dq is None or dq.op_type != "DynamicQuantizeLinear" or dq.domain not in ("", "ai.onnx") or \
                tuple(mm.inputs[0:1]) + (mm.inputs[2], mm.inputs[4]) != tuple(dq.outputs[:3]):
            continue
        if any(o in outputs or [id(n) for n in graph.consumers(o)] != [id(mm)] for o in dq.outputs[:3]):
            continue
        ins = list(mm.inputs) + [""] * (7 - len(mm.inputs))
        inputs = [dq.inputs[0], ins[1], ins[3], ins[5], ins[6]]
        while not inputs[-1]:  # (optional inputs left off at the end)
            inputs.pop()
        fused = make_node(graph, "DynamicQuantizeMatMul", inputs, list(mm.outputs),
                          name=f"{mm.name or mm.outputs[0]}_dynamic", domain=MS)
        replace_nodes(graph, [dq, mm], [fused])
        changed = True
    return changed
