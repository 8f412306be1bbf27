"""``onnxhal fix-shapes MODEL --dim batch=1 --dim sequence=128 -o OUT``: a copy of a model with its
symbolic dimensions fixed, for NPUs that run static shapes only (as onnxruntime's
``python -m onnxruntime.tools.make_dynamic_shape_fixed``).

Every ``dim_param`` named by ``--dim`` (or whose denotation ``--denotation`` names) becomes that
size wherever the main graph declares it (inputs, outputs, value_info); ``--shape INPUT=1,8`` sets
one input's whole shape, for dimensions with no name to give (scikit-learn's converters leave the
batch dimension unnamed; onnxruntime's tool has ``--input_name``/``--input_shape`` for the same).
Shape inference then fills in the rest. Dimensions still symbolic afterwards are listed: a static-only profile declines the
nodes that touch them. The same at session creation, without a new file:
``SessionOptions.add_free_dimension_override_by_name``.
"""

from __future__ import annotations

import argparse
from typing import Any

import onnx

from onnxhal.hal.errors import InvalidArgument


def dim_pairs(items: list[str] | None, flag: str) -> dict[str, int]:
    """``NAME=SIZE`` options (``--dim``, ``--denotation``) as {name: size}."""
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().isdigit() or int(value) < 1:
            raise InvalidArgument(f"{flag} {item!r}: write NAME=SIZE with a size of at least 1, e.g. {flag} batch=1")
        out[name.strip()] = int(value)
    return out


def shape_pairs(items: list[str] | None) -> dict[str, list[int]]:
    """``--shape INPUT=D0,D1,...`` options as {input: dims}."""
    out: dict[str, list[int]] = {}
    for item in items or []:
        name, sep, value = item.rpartition("=")
        dims = [d.strip() for d in value.split(",")]
        if not sep or not name or not all(d.isdigit() and int(d) >= 1 for d in dims):
            raise InvalidArgument(f"--shape {item!r}: write INPUT=D0,D1,... with sizes of at least 1, e.g. "
                                  "--shape X=1,8")
        out[name.strip()] = [int(d) for d in dims]
    return out


def check_input_shapes(model: onnx.ModelProto, by_input: dict[str, list[int]], what: str) -> None:
    """Each ``--shape`` names an input of ``model``, with its rank and its fixed sizes."""
    inputs = {vi.name: vi for vi in model.graph.input}
    for name, dims in by_input.items():
        vi = inputs.get(name)
        if vi is None:
            raise InvalidArgument(f"fix-shapes: {what} has no input named {name!r}; its inputs are {sorted(inputs)}")
        if not vi.type.tensor_type.HasField("shape"):
            continue  # no declared rank: any shape may be given
        declared = _shape(vi)
        if len(declared) != len(dims) or any(isinstance(d, int) and d != n for d, n in zip(declared, dims)):
            raise InvalidArgument(f"fix-shapes: --shape {name}={','.join(map(str, dims))} does not fit input {name!r}, "
                                  f"declared {declared}: give {len(declared)} sizes, keeping the fixed ones")


def fix_shapes(model: onnx.ModelProto, by_name: dict[str, int], by_denotation: dict[str, int],
               by_input: dict[str, list[int]] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` with those dimensions (and the whole shapes of the inputs ``by_input``
    names) fixed and shapes inferred again."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    denotations = {k.lower(): v for k, v in by_denotation.items()}
    g = out.graph
    for vi in g.input:
        if vi.name in (by_input or {}):
            tensor = vi.type.tensor_type
            tensor.ClearField("shape")
            for n in by_input[vi.name]:
                tensor.shape.dim.add().dim_value = n
    for vi in (*g.input, *g.output, *g.value_info):
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                continue
            value = by_name.get(dim.dim_param) if dim.dim_param else None
            if value is None and dim.denotation:
                value = denotations.get(dim.denotation.lower())
            if value is not None:
                dim.dim_value = value  # clears dim_param (a oneof)
    # Intermediate shapes derived from the fixed ones are inferred again (stale symbolic ones dropped).
    del g.value_info[:]
    out = onnx.shape_inference.infer_shapes(out, data_prop=True)
    values = _placeholder_run(out)
    if values:
        # Shape and Size of values whose shapes are now known become constants, so that any loader
        # (onnxruntime's, ours) infers the static shapes downstream itself: loaders recompute the
        # shapes of standard operators' outputs and do not take value_info's word for them.
        _fold_shape_nodes(out, values)
        del out.graph.value_info[:]
        out = onnx.shape_inference.infer_shapes(out, data_prop=True)
        _fill_value_info(out, values)
    return out


#: Inputs (positions) whose values set an op's output shape; ``None``: all of them.
SHAPE_PARAMS: dict[str, set[int] | None] = {
    "Reshape": {1}, "Expand": {1}, "Tile": {1}, "Slice": {1, 2, 3, 4}, "Pad": {1}, "Resize": {1, 2, 3},
    "Upsample": {1}, "OneHot": {1}, "TopK": {1}, "Range": {0, 1, 2}, "ConstantOfShape": {0}, "Split": {1},
    "Squeeze": {1}, "Unsqueeze": {1}, "NonZero": None, "Unique": None, "Compress": None,
    "NonMaxSuppression": None, "Loop": None, "If": None, "Scan": None, "StringSplit": None}


def _placeholder_run(model: onnx.ModelProto) -> dict:
    """{value: array} from one CPU EP run on placeholder inputs (zeros) of the fixed sizes, for the
    values whose shapes depend only on the inputs' shapes: a value is left out when an op upstream
    takes a shape parameter computed from the inputs' values (placeholders say nothing about those).
    {} when an input is still symbolic or the run fails."""
    import numpy as np

    from onnxhal.hal.graph import Graph, elem_type_to_dtype
    from onnxhal.runtime.providers.cpu.graph_plan import cpu_graph_plan

    g = model.graph
    initializers = {t.name for t in g.initializer}
    feeds = {}
    for vi in g.input:
        if vi.name in initializers:
            continue
        shape = _shape(vi)
        if any(not isinstance(d, int) for d in shape):
            return {}
        feeds[vi.name] = np.zeros(shape, elem_type_to_dtype(vi.type.tensor_type.elem_type))
    from_values = set(feeds)  # values computed from the inputs' values (not only their shapes)
    unreliable: set[str] = set()  # values whose shape a placeholder run cannot tell
    for n in g.node:
        params = SHAPE_PARAMS.get(n.op_type, set())
        uses = [i for k, i in enumerate(n.input) if i and (params is None or k in params)]
        if any(i in unreliable for i in n.input) or any(i in from_values for i in uses):
            unreliable.update(n.output)
        if n.op_type not in ("Shape", "Size") and any(i in from_values for i in n.input):
            from_values.update(n.output)
    wanted = [o for n in g.node for o in n.output if o and o not in unreliable]
    opset = {o.domain: o.version for o in model.opset_import}
    try:
        results = cpu_graph_plan(Graph.from_proto(g, opset), wanted).run(feeds)
    except Exception:  # noqa: BLE001 - placeholder zeros may be invalid input: keep onnx's shapes
        return {}
    return {name: np.asarray(v) for name, v in zip(wanted, results) if np.asarray(v).dtype != object}


def _fold_shape_nodes(model: onnx.ModelProto, values: dict) -> None:
    g = model.graph
    keep = []
    for n in g.node:
        if n.domain in ("", "ai.onnx") and n.op_type in ("Shape", "Size") and n.output[0] in values:
            g.initializer.append(onnx.numpy_helper.from_array(values[n.output[0]], n.output[0]))
        else:
            keep.append(n)
    del g.node[:]
    g.node.extend(keep)


def _fill_value_info(model: onnx.ModelProto, values: dict) -> None:
    """Shapes onnx's inference still leaves symbolic, from the placeholder run (a hint for readers;
    loaders recompute them)."""
    g = model.graph
    known = {vi.name: vi for vi in g.value_info}
    produced = {o for n in g.node for o in n.output}
    for name, a in values.items():
        if name not in produced:
            continue
        vi = known.get(name)
        if vi is None:
            vi = g.value_info.add()
            vi.name = name
        elif vi.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim):
            continue
        vi.type.CopyFrom(onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape))


def symbolic_dims(model: onnx.ModelProto) -> dict[str, list[str]]:
    """Values of the main graph (inputs, outputs, inferred values) with dimensions still not fixed."""
    out: dict[str, list[str]] = {}
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            free = [d.dim_param or "?" for d in vi.type.tensor_type.shape.dim if not d.HasField("dim_value")]
            if free:
                out[vi.name] = free
    return out


def _load(path: str) -> onnx.ModelProto:
    from onnxhal.hal.errors import InvalidProtobuf, NoSuchFile

    try:
        return onnx.load(path)
    except FileNotFoundError as exc:
        raise NoSuchFile(f"fix-shapes: no model at {path!r}") from exc
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and onnx's own errors alike
        raise InvalidProtobuf(f"fix-shapes: {path!r} is not an ONNX model: {exc}") from exc


def _shape(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]


def cmd_fix_shapes(args: argparse.Namespace) -> int:
    from onnxhal.cli_tables import console

    by_name, by_denotation = dim_pairs(args.dim, "--dim"), dim_pairs(args.denotation, "--denotation")
    by_input = shape_pairs(args.shape)
    if not by_name and not by_denotation and not by_input:
        raise InvalidArgument("fix-shapes: give at least one --dim NAME=SIZE (or --denotation NAME=SIZE, "
                              "--shape INPUT=D0,D1,...); the model's symbolic dimensions are listed by "
                              "'onnxhal fix-shapes MODEL --list'")
    model = _load(args.model)
    check_input_shapes(model, by_input, args.model)
    known = {d.dim_param for vi in model.graph.input for d in vi.type.tensor_type.shape.dim if d.dim_param}
    unknown = sorted(set(by_name) - known)
    if unknown:
        raise InvalidArgument(f"fix-shapes: {args.model} has no input dimension named {', '.join(unknown)}; "
                              f"its symbolic input dimensions are {sorted(known) or 'none'}")
    fixed = fix_shapes(model, by_name, by_denotation, by_input)
    onnx.save(fixed, args.output)
    for vi in fixed.graph.input:
        console.print(f"input {vi.name}: {_shape(vi)}")
    for vi in fixed.graph.output:
        console.print(f"output {vi.name}: {_shape(vi)}")
    left = symbolic_dims(fixed)
    if left:
        console.print(f"{len(left)} value(s) keep symbolic dimensions (a static-only profile declines their nodes), "
                      f"e.g. {', '.join(f'{k} {v}' for k, v in list(left.items())[:3])}", soft_wrap=True)
    else:
        console.print("every value of the main graph has a static shape")
    console.print(f"written to {args.output}")
    return 0


def cmd_list_dims(args: argparse.Namespace) -> int:
    from onnxhal.cli_tables import console

    model = _load(args.model)
    for vi in model.graph.input:
        console.print(f"input {vi.name}: {_shape(vi)}")
    for vi in model.graph.output:  # an output's free dims show what fixing the inputs leaves open
        console.print(f"output {vi.name}: {_shape(vi)}")
    return 0


def add_fix_shapes_parser(sub: Any) -> None:
    p = sub.add_parser("fix-shapes", help="write a copy of a model with its symbolic dimensions fixed "
                                          "(for static-shape NPU profiles)")
    p.add_argument("model")
    p.add_argument("--dim", action="append", metavar="NAME=SIZE", help="fix dimension NAME (repeatable)")
    p.add_argument("--denotation", action="append", metavar="DENOTATION=SIZE",
                   help="fix dimensions with this denotation, e.g. DATA_BATCH=1 (repeatable)")
    p.add_argument("--shape", action="append", metavar="INPUT=D0,D1,...",
                   help="set input INPUT's whole shape, e.g. X=1,8: for dimensions without a name (repeatable)")
    p.add_argument("-o", "--output", help="the fixed model's path")
    p.add_argument("--list", action="store_true", help="list the inputs' and outputs' dimensions and exit")
    p.set_defaults(fn=lambda a: cmd_list_dims(a) if a.list else _with_output(a))


def _with_output(args: argparse.Namespace) -> int:
    if not args.output:
        raise InvalidArgument("fix-shapes: give -o OUT, the path of the fixed model")
    return cmd_fix_shapes(args)
