"""Layout transformation for EPs that prefer NHWC (ORT's layout transformer, simplified).

After a first partitioning pass, every layout-sensitive node an NHWC EP took (Conv, FusedConv,
pooling, LRN on 4-D tensors with static shapes) becomes the same op in the
``com.ms.internal.nhwc`` domain (ORT's internal NHWC domain; weights keep their OIHW layout, as
in ORT), reading and writing NHWC tensors, with Transpose nodes converting at its edges. Adjacent
inverse Transposes then cancel, so a chain of NHWC ops exchanges NHWC tensors directly, and the
graph is partitioned again so the EP can claim the new nodes. An EP opts out per op with
``should_convert_data_layout_for_op`` returning 0 (> 0 forces, < 0 lets the runtime decide).
"""

from __future__ import annotations

from onnx import helper

from onnxhal.hal import Ep, Graph, Node, OrtEpDataLayout, ValueInfo
from onnxhal.runtime.loader.model_loader import toposort

NHWC_DOMAIN = "com.ms.internal.nhwc"
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

#: (domain, op type) -> (indices of NCHW data inputs, indices of NCHW outputs)
LAYOUT_SENSITIVE: dict[tuple[str, str], tuple[tuple[int, ...], tuple[int, ...]]] = {
    ("", "Conv"): ((0,), (0,)),
    ("com.onnxhal", "FusedConv"): ((0, 3), (0,)),
    ("", "MaxPool"): ((0,), (0,)),
    ("", "AveragePool"): ((0,), (0,)),
    ("", "GlobalAveragePool"): ((0,), (0,)),
    ("", "GlobalMaxPool"): ((0,), (0,)),
    ("", "LRN"): ((0,), (0,)),
}


def original_domain(node: Node) -> str:
    """The domain an NHWC node had before conversion."""
    return "com.onnxhal" if node.op_type.startswith("Fused") else ""


def _permute(shape: tuple, perm: tuple[int, ...]) -> tuple:
    return tuple(shape[p] for p in perm)


def channels_first_perm(rank: int) -> tuple[int, ...]:
    """The Transpose perm from channels-last to channels-first at ``rank`` (0, 3, 1, 2 at rank 4):
    onnxruntime's layout transformer also converts 1-D and 3-D convolutions and pools (rank 3, 5)."""
    return (0, rank - 1, *range(1, rank - 1))


def channels_last_perm(rank: int) -> tuple[int, ...]:
    """The Transpose perm from channels-first to channels-last at ``rank`` (0, 2, 3, 1 at rank 4)."""
    return (0, *range(2, rank), 1)


def _rank(graph: Graph, name: str) -> int:
    shape = graph.value_info(name).shape
    return len(shape) if shape is not None else 4


def _static4(graph: Graph, name: str) -> tuple | None:
    vi = graph.value_info(name)
    shape = vi.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
        return None
    return shape


def _set_vi(graph: Graph, name: str, elem_type: int, shape: tuple) -> None:
    graph.set_value_info(ValueInfo(name, helper.make_tensor_type_proto(elem_type, shape)))


def _wants(ep: Ep, node: Node) -> bool:
    decision = ep.should_convert_data_layout_for_op(node.domain, node.op_type, OrtEpDataLayout.NHWC)
    if decision == 0:
        return False
    if (node.domain, node.op_type) not in LAYOUT_SENSITIVE:
        return False
    if decision > 0:
        return True
    return not (node.op_type == "MaxPool" and len([o for o in node.outputs if o]) > 1)  # Indices stay NCHW


def transform_layout(graph: Graph, eps: dict[str, Ep]) -> int:
    """Convert the nodes of ``graph`` assigned to NHWC-preferring ``eps``; returns how many."""
    nhwc_eps = {name for name, ep in eps.items() if ep.get_preferred_data_layout() == OrtEpDataLayout.NHWC}
    if not nhwc_eps:
        return 0
    converted = 0
    new_nodes: list[Node] = []
    to_nhwc: dict[str, str] = {}  # NCHW value -> its NHWC copy (one Transpose per value)
    for node in graph.nodes:
        key = (node.domain, node.op_type)
        if node.ep_name not in nhwc_eps or key not in LAYOUT_SENSITIVE or not _wants(eps[node.ep_name], node):
            new_nodes.append(node)
            continue
        data_in, data_out = LAYOUT_SENSITIVE[key]
        names = [node.inputs[i] for i in data_in if i < len(node.inputs) and node.inputs[i]] + \
                [node.outputs[i] for i in data_out]
        if any(_static4(graph, n) is None for n in names):
            new_nodes.append(node)
            continue
        inputs = list(node.inputs)
        for i in data_in:
            if i >= len(inputs) or not inputs[i]:
                continue
            x = inputs[i]
            if x not in to_nhwc:
                t = f"{x}__nhwc"
                _set_vi(graph, t, graph.value_info(x).elem_type, _permute(_static4(graph, x), TO_NHWC))
                new_nodes.append(Node("Transpose", [x], [t], name=f"{t}__transpose",
                                      attribute_protos=[helper.make_attribute("perm", list(TO_NHWC))]))
                to_nhwc[x] = t
            inputs[i] = to_nhwc[x]
        outputs = list(node.outputs)
        after: list[Node] = []
        for i in data_out:
            y = outputs[i]
            t = f"{y}__nhwc"
            _set_vi(graph, t, graph.value_info(y).elem_type, _permute(_static4(graph, y), TO_NHWC))
            outputs[i] = t
            to_nhwc[y] = t  # later NHWC consumers read the NHWC value directly
            after.append(Node("Transpose", [t], [y], name=f"{y}__transpose",
                              attribute_protos=[helper.make_attribute("perm", list(TO_NCHW))]))
        nhwc = Node(node.op_type, inputs, outputs, name=node.name, domain=NHWC_DOMAIN,
                    attribute_protos=list(node.attribute_protos.values()), doc_string=node.doc_string)
        nhwc.since_version = node.since_version
        new_nodes.append(nhwc)
        new_nodes.extend(after)
        converted += 1
    if converted:
        graph.nodes = _drop_unused_transposes(graph, new_nodes)
        if NHWC_DOMAIN not in graph.opset:
            graph.opset[NHWC_DOMAIN] = 1
        graph.nodes = toposort(graph.nodes, graph.name)
        graph.reindex()
    return converted


def _drop_unused_transposes(graph: Graph, nodes: list[Node]) -> list[Node]:
    """Transposes back to NCHW that nothing reads any more (their NHWC value is read directly)."""
    outputs = set(graph.output_names)
    while True:
        read = {i for n in nodes for i in (*n.inputs, *n.implicit_inputs) if i}
        dead = [n for n in nodes if n.op_type == "Transpose" and n.name.endswith("__transpose")
                and n.outputs[0] not in read and n.outputs[0] not in outputs]
        if not dead:
            return nodes
        ids = {id(n) for n in dead}
        nodes = [n for n in nodes if id(n) not in ids]


def nchw_twin(node: Node, graph: Graph) -> tuple[list[Node], dict[str, ValueInfo]]:
    """An NHWC node as NCHW nodes: Transpose in, the original op, Transpose out (for EPs and kernels
    that compute NCHW internally). Returns the nodes and the value infos of the new values."""
    data_in, data_out = LAYOUT_SENSITIVE[(original_domain(node), node.op_type)]
    nodes: list[Node] = []
    infos: dict[str, ValueInfo] = {}
    inputs = list(node.inputs)
    for i in data_in:
        if i < len(inputs) and inputs[i]:
            x = inputs[i]
            t = f"{x}__nchw_{node.name}"
            to_nchw = channels_first_perm(_rank(graph, x))
            shape = graph.value_info(x).shape
            shape = _permute(shape, to_nchw) if shape is not None else None
            infos[t] = ValueInfo(t, helper.make_tensor_type_proto(graph.value_info(x).elem_type, shape))
            nodes.append(Node("Transpose", [x], [t], name=f"{t}__transpose",
                              attribute_protos=[helper.make_attribute("perm", list(to_nchw))]))
            inputs[i] = t
    outputs = list(node.outputs)
    tails = []
    for i in data_out:
        y = outputs[i]
        t = f"{y}__nchw"
        rank = _rank(graph, y)
        shape = graph.value_info(y).shape
        shape = _permute(shape, channels_first_perm(rank)) if shape is not None else None
        infos[t] = ValueInfo(t, helper.make_tensor_type_proto(graph.value_info(y).elem_type, shape))
        outputs[i] = t
        tails.append(Node("Transpose", [t], [y], name=f"{t}__transpose",
                          attribute_protos=[helper.make_attribute("perm", list(channels_last_perm(rank)))]))
    op = Node(node.op_type, inputs, outputs, name=node.name, domain=original_domain(node),
              attribute_protos=list(node.attribute_protos.values()))
    op.since_version = node.since_version
    return [*nodes, op, *tails], infos


__all__ = ["NHWC_DOMAIN", "LAYOUT_SENSITIVE", "transform_layout", "nchw_twin", "original_domain"]


#: Ops that compute each element from the same element of their one data input, so a Transpose
#: commutes with them (Clip's min/max are scalars).
ELEMENTWISE_UNARY = frozenset({"Relu", "LeakyRelu", "Elu", "Selu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh",
                               "Clip", "Abs", "Neg", "Exp", "Log", "Sqrt", "Erf", "Softplus", "Identity", "Cast",
                               "Gelu", "Mish", "Reciprocal", "Floor", "Ceil", "Round", "Sign"})


def _perm(node: Node) -> tuple[int, ...] | None:
    perm = node.attr("perm")
    return tuple(int(p) for p in perm) if perm is not None else None


def _inverse(p: tuple[int, ...], q: tuple[int, ...]) -> bool:
    return len(p) == len(q) and all(q[p[i]] == i for i in range(len(p)))


def cancel_transposes(nodes: list[Node], keep: set[str]) -> list[Node]:
    """``nodes`` (in order) without the Transpose pairs that undo each other: T(p) then T(p^-1),
    directly or around one elementwise unary op (Conv -> T -> Relu -> T -> MaxPool, as NCHW twins of
    consecutive NHWC nodes leave them). A pair goes only where its values have no other reader and
    none is in ``keep`` (the partition's outputs), so the graph computes the same values with two
    fewer launches."""
    nodes = list(nodes)
    changed = True
    while changed:
        changed = False
        producer = {o: n for n in nodes for o in n.outputs}
        readers: dict[str, int] = {}
        for n in nodes:
            for i in n.inputs:
                readers[i] = readers.get(i, 0) + 1

        def only_reader(name: str, readers: dict[str, int] = readers) -> bool:
            return readers.get(name, 0) == 1 and name not in keep

        for second in nodes:
            if second.op_type != "Transpose" or second.domain or _perm(second) is None:
                continue
            mid = producer.get(second.inputs[0])
            if mid is None or not only_reader(second.inputs[0]):
                continue
            if mid.op_type == "Transpose" and not mid.domain and _perm(mid) is not None:
                first, unary = mid, None
            elif mid.op_type in ELEMENTWISE_UNARY and not mid.domain and mid.inputs:
                first, unary = producer.get(mid.inputs[0]), mid
                if first is None or first.op_type != "Transpose" or first.domain or _perm(first) is None \
                        or not only_reader(mid.inputs[0]):
                    continue
            else:
                continue
            if not _inverse(_perm(first), _perm(second)):
                continue
            source = first.inputs[0]
            if unary is None and second.outputs[0] in keep:
                # A partition output keeps its name: the value's producer writes it instead, where
                # the value is made inside the partition and read by nothing else.
                made = producer.get(source)
                if made is None or not only_reader(source):
                    continue
                renamed = _with_outputs(made, [second.outputs[0] if o == source else o for o in made.outputs])
                nodes = [renamed if n is made else n for n in nodes if n is not first and n is not second]
            elif unary is None:
                rename = {second.outputs[0]: source}
                nodes = [n for n in nodes if n is not first and n is not second]
                nodes = [_with_inputs(n, [rename.get(i, i) for i in n.inputs])
                         if any(i in rename for i in n.inputs) else n for n in nodes]
            else:
                moved = Node(unary.op_type, [source, *unary.inputs[1:]], [second.outputs[0]], name=unary.name,
                             domain=unary.domain, attribute_protos=list(unary.attribute_protos.values()))
                moved.since_version = unary.since_version
                nodes = [moved if n is unary else n for n in nodes if n is not first and n is not second]
            changed = True
            break
    return nodes


def _with_inputs(node: Node, inputs: list[str]) -> Node:
    """``node`` reading ``inputs`` instead of its own; its schema version kept (a kernel of another
    opset reads its attributes otherwise: ReduceMean 18 takes its axes from an input, 17 from an
    attribute)."""
    out = Node(node.op_type, inputs, list(node.outputs), name=node.name, domain=node.domain,
               attribute_protos=list(node.attribute_protos.values()))
    out.since_version = node.since_version
    out.implicit_inputs = node.implicit_inputs
    return out


def _with_outputs(node: Node, outputs: list[str]) -> Node:
    """``node`` writing ``outputs`` instead of its own."""
    out = Node(node.op_type, list(node.inputs), outputs, name=node.name, domain=node.domain,
               attribute_protos=list(node.attribute_protos.values()))
    out.since_version = node.since_version
    out.implicit_inputs = node.implicit_inputs
    return out
