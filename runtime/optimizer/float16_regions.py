"""float16 regions run in float32, as onnxruntime's CPU EP runs them (CPU-only sessions).

onnxruntime's CPU EP has float16 kernels for few ops (data movement, LayerNormalization, Clip,
Max/Min and a handful more: ``ORT_FLOAT16_OPS``). Every other node with a float16 input it computes
in float32 between Casts (``InsertCastTransformer``, onnxruntime/core/optimizer/
insert_cast_transformer.cc: ``NeedInsertCast`` / ``AddCastNode``), forces an isolated float16-capable
node between such nodes to float32 as well (``ForceSingleNodeCPUFloat16ToFloat32``), and then
removes each Cast pair that meets between two converted nodes (``RemoveDuplicateCastTransformer``),
so a chain of converted nodes passes float32 values with no rounding between them. Rounding to
float16 happens only where a value reaches a float16 kernel, a model Cast that is kept or a graph
output.

``run_float16_regions`` makes the same rewrite here, so the float32 kernels and fusions run those
regions and the values match onnxruntime's (numpy computes float16 one ufunc at a time, widening
and rounding each operand, which was both slower and rounded where onnxruntime does not).
Nodes holding subgraphs stay as they are (onnxruntime does not cast them either); the pass runs
inside their bodies, as onnxruntime's recurses.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from onnxhal.hal.graph import Graph, Node, ValueInfo
from onnxhal.runtime.optimizer.rewrite import graph_output_names, make_node, unique_name

_F16 = TensorProto.FLOAT16
_F32 = TensorProto.FLOAT

#: Ops (domain, op type) onnxruntime's CPU EP runs in float16 on x86-64 (its ``MLFloat16`` kernel
#: registrations, onnxruntime/core/providers/cpu/cpu_execution_provider.cc and
#: contrib_ops/cpu/cpu_contrib_kernels.cc), found one op at a time on onnxruntime 1.32.0: a one-node
#: float16 model whose optimized model holds no inserted Cast (tests/test_float16_regions.py
#: checks a sample against the installed onnxruntime). Every other op with a float16 input is cast.
ORT_FLOAT16_OPS = frozenset({
    ("", "Cast"), ("", "Identity"), ("", "Shape"), ("", "Reshape"), ("", "Flatten"), ("", "Squeeze"),
    ("", "Unsqueeze"), ("", "Transpose"), ("", "Concat"), ("", "Split"), ("", "Slice"), ("", "Gather"),
    ("", "GatherElements"), ("", "GatherND"), ("", "ScatterND"), ("", "ScatterElements"), ("", "Expand"),
    ("", "Compress"), ("", "ReverseSequence"),
    ("", "ConstantOfShape"), ("", "IsNaN"), ("", "IsInf"), ("", "Sign"), ("", "Round"), ("", "Max"),
    ("", "Min"), ("", "Mod"), ("", "Clip"), ("", "LayerNormalization"), ("", "SimplifiedLayerNormalization"),
    ("com.microsoft", "SkipLayerNormalization"), ("com.microsoft", "SkipSimplifiedLayerNormalization"),
})

#: Ops whose meaning depends on the float16 encoding itself: never widened.
_BIT_LEVEL_OPS = frozenset({("", "BitCast")})

_CAST_DOC = "float16 region computed in float32 (as onnxruntime's InsertCastTransformer)"


def _elem_type(graph: Graph, name: str) -> int:
    et = graph.value_info(name).elem_type
    if not et:
        arr = graph.initializer(name)
        if arr is not None:
            et = helper.np_dtype_to_tensor_dtype(arr.dtype)
    return et


def _is_f16(graph: Graph, name: str) -> bool:
    return bool(name) and _elem_type(graph, name) == _F16


def _has_f16_kernel(node: Node) -> bool:
    return (node.domain, node.op_type) in ORT_FLOAT16_OPS


def _needs_cast(graph: Graph, node: Node) -> bool:
    """A node onnxruntime would cast: a float16 input, no float16 kernel, no subgraph."""
    return (not node.subgraphs and not _has_f16_kernel(node) and node.domain in ("", "com.microsoft")
            and (node.domain, node.op_type) not in _BIT_LEVEL_OPS and any(_is_f16(graph, i) for i in node.inputs))


def _isolated(graph: Graph, node: Node, converted: set[int], outputs: set[str]) -> bool:
    """A float16-kernel node all of whose float16 inputs from nodes come from converted nodes and
    all of whose float16 outputs go only to converted nodes (``IsIsolatedFp16NodeOnCpu``)."""
    if node.subgraphs or not _has_f16_kernel(node) or node.op_type == "Cast" or any(o in outputs for o in node.outputs):
        return False
    produced = [i for i in node.inputs if i and graph.producer(i) is not None]
    if not produced:
        return False
    f16_in = [i for i in produced if _is_f16(graph, i)]
    if not f16_in or any(id(graph.producer(i)) not in converted for i in f16_in):
        return False
    f16_out = [o for o in node.outputs if _is_f16(graph, o)]
    if not f16_out:
        return False
    return all(id(c) in converted for o in f16_out for c in graph.consumers(o))


def run_float16_regions(graph: Graph) -> bool:
    """Compute the float16 nodes onnxruntime's CPU EP has no float16 kernel for in float32, with
    Casts only where a value leaves the region (see the module docstring)."""
    if not graph.holds_elem_type(_F16):  # no float16 value: no node to cast, without a look at each
        return False
    candidates = [n for n in graph.nodes if _needs_cast(graph, n)]
    if not candidates:
        return False
    outputs = graph_output_names(graph)
    converted = {id(n) for n in candidates}
    for node in graph.nodes:  # in node order, each forced node counting for the next, as onnxruntime
        if id(node) not in converted and _isolated(graph, node, converted, outputs):
            converted.add(id(node))

    wide: dict[str, str] = {}    # float16 value -> the float32 value converted nodes read instead
    before: dict[int, list[Node]] = {}  # id(node) -> Casts to insert before it
    after: dict[int, list[Node]] = {}   # id(node) -> Casts to insert after it
    renamed_outputs: dict[int, dict[str, str]] = {}

    def f32_info(src: str, name: str) -> None:
        tp = graph.value_info(src).type_proto
        shape = None
        if tp is not None and tp.tensor_type.HasField("shape"):
            shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tp.tensor_type.shape.dim]
        graph.set_value_info(ValueInfo(name, helper.make_tensor_type_proto(_F32, shape)))

    # Values converted nodes produce: they produce float32; a Cast back to float16 only where some
    # reader still needs float16 (RemoveDuplicateCastTransformer drops the rest).
    for node in graph.nodes:
        if id(node) not in converted:
            continue
        names = {}
        for o in node.outputs:
            if not _is_f16(graph, o):
                continue
            o32 = unique_name(graph, f"{o}_float32")
            f32_info(o, o32)
            names[o] = o32
            wide[o] = o32
            readers = [c for c in graph.consumers(o) if id(c) not in converted and o not in c.implicit_inputs]
            casts = [c for c in readers if c.op_type == "Cast" and c.domain == ""]
            implicit = [c for c in graph.consumers(o) if o in c.implicit_inputs]
            keep_down = o in outputs or implicit or len(casts) < len(readers)
            for c in casts:
                # a model Cast to float reads the float32 value unless it gives a graph output
                # and the rounded value is kept for other readers anyway
                to_float = int(c.attr("to", 0)) == _F32 and c.outputs[0] not in outputs
                if to_float or not keep_down:
                    c.inputs = tuple(o32 if i == o else i for i in c.inputs)
            if keep_down:
                after.setdefault(id(node), []).append(
                    make_node(graph, "Cast", [o32], [o], name=unique_name(graph, f"{o}_to_float16"), to=_F16))
        renamed_outputs[id(node)] = names

    # Float16 values converted nodes read from elsewhere: one Cast to float32 each, or the float32
    # value a model Cast rounded from (RemoveDuplicateCastTransformer removes that pair too).
    for node in graph.nodes:
        if id(node) not in converted:
            continue
        for i in node.inputs:
            if not _is_f16(graph, i) or i in wide:
                continue
            src = graph.producer(i)
            others = [c for c in graph.consumers(i) if c.op_type == "Cast" and id(c) not in converted]
            if (src is not None and src.op_type == "Cast" and src.domain == "" and not others
                    and _elem_type(graph, src.inputs[0]) == _F32):
                wide[i] = src.inputs[0]
                continue
            i32 = unique_name(graph, f"{i}_float32")
            f32_info(i, i32)
            wide[i] = i32
            before.setdefault(id(node), []).append(
                make_node(graph, "Cast", [i], [i32], name=unique_name(graph, f"{i}_to_float32"), to=_F32))

    nodes: list[Node] = []
    for node in graph.nodes:
        nodes.extend(before.get(id(node), ()))
        if id(node) in converted:
            node.inputs = tuple(wide.get(i, i) for i in node.inputs)
            names = renamed_outputs[id(node)]
            node.outputs = tuple(names.get(o, o) for o in node.outputs)
            if node.attr("dtype") == _F16:  # generator-like ops name their output type
                node.attribute_protos["dtype"] = helper.make_attribute("dtype", _F32)
                node.attributes["dtype"] = _F32
            node.doc_string = node.doc_string or _CAST_DOC
        nodes.append(node)
        nodes.extend(after.get(id(node), ()))
    graph.nodes = nodes
    graph.reindex()
    return True
