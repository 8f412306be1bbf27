"""Control-flow bodies, unshaped values and constants inside real onnxruntime through onnxhal's
plugin library: small models run under PREFER_GPU and PREFER_NPU and compared with onnxruntime's
CPU EP, one check per subprocess (``python -m tests.ort_bridge_control_flow NAME``, as
``tests/ort_bridge_checks.py``)."""

from __future__ import annotations

import json
import logging
import sys
import traceback
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import onnxhal.ort_plugin as plugin  # noqa: E402
from tests.models import make, vi  # noqa: E402

PROFILES = ["generic-npu", "generic-gpu"]
POLICIES = ("PREFER_GPU", "PREFER_NPU")
X = np.arange(8, dtype=np.float32).reshape(2, 4) - 3


def constant(name: str, value) -> helper.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)), name=f"{name}_node")


# -- models ----------------------------------------------------------------------------------------
def outer_initializer():
    """An If whose branches read the main graph's initializer 'w', its value 'a' and a Constant of
    their own; the condition is computed, so onnxruntime keeps the If."""
    w = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32).reshape(2, 4), "w")
    zero = numpy_helper.from_array(np.array(0, np.float32), "zero")
    then_g = helper.make_graph([constant("tc", np.full((2, 4), 0.5, np.float32)),
                                helper.make_node("Add", ["a", "tc"], ["t1"], name="then_add"),
                                helper.make_node("Mul", ["t1", "w"], ["t"], name="then_mul")], "then", [], [vi("t", None)])
    else_g = helper.make_graph([constant("ec", np.full((2, 4), 2.0, np.float32)),
                                helper.make_node("Sub", ["a", "ec"], ["e1"], name="else_sub"),
                                helper.make_node("Mul", ["e1", "w"], ["e"], name="else_mul")], "else", [], [vi("e", None)])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0, name="sum"),
             helper.make_node("Greater", ["s", "zero"], ["c"], name="greater"),
             helper.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Mul", ["y0", "x"], ["y"], name="mul")]
    model = make(nodes, [vi("x", [2, 4])], [vi("y", [2, 4])], [w, zero])
    return model, [{"x": X}, {"x": -X - 2}]


def nested_constants():
    """An If inside an If branch whose nodes read Constants of the enclosing branch (onnxruntime makes
    them that branch's initializers), including a Reshape's shape."""
    inner_then = helper.make_graph([helper.make_node("Mul", ["x", "k"], ["it1"], name="inner_then_mul"),
                                    helper.make_node("Add", ["it1", "k"], ["it2"], name="inner_then_add"),
                                    helper.make_node("Reshape", ["it2", "kshape"], ["it3"], name="inner_then_reshape"),
                                    helper.make_node("Reshape", ["it3", "kback"], ["it"], name="inner_then_back")],
                                   "inner_then", [], [vi("it", [2, 4])])
    inner_else = helper.make_graph([helper.make_node("Sub", ["x", "k"], ["ie1"], name="inner_else_sub"),
                                    helper.make_node("Mul", ["ie1", "k"], ["ie"], name="inner_else_mul")],
                                   "inner_else", [], [vi("ie", [2, 4])])
    outer_else = helper.make_graph([constant("k", np.full((2, 4), 1.5, np.float32)),
                                    constant("kshape", np.array([4, 2], np.int64)),
                                    constant("kback", np.array([2, 4], np.int64)),
                                    helper.make_node("If", ["c2"], ["oe"], then_branch=inner_then,
                                                     else_branch=inner_else, name="inner_if")],
                                   "outer_else", [], [vi("oe", [2, 4])])
    outer_then = helper.make_graph([helper.make_node("Neg", ["x"], ["ot1"], name="outer_then_neg"),
                                    helper.make_node("Relu", ["ot1"], ["ot"], name="outer_then_relu")],
                                   "outer_then", [], [vi("ot", [2, 4])])
    nodes = [helper.make_node("If", ["c"], ["y0"], then_branch=outer_then, else_branch=outer_else, name="outer_if"),
             helper.make_node("Add", ["y0", "x"], ["y"], name="add")]
    model = make(nodes, [vi("x", [2, 4]), vi("c", [], TensorProto.BOOL), vi("c2", [], TensorProto.BOOL)],
                 [vi("y", [2, 4])])
    return model, [{"x": X, "c": np.array(c), "c2": np.array(c2)} for c, c2 in ((False, True), (False, False), (True, False))]


def unshaped_values():
    """A graph input and an If output declared with no shape (the branches disagree on the rank),
    read by device nodes: their shape is unknown, not rank 0."""
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"], name="then_relu")], "then", [], [vi("t", None)])
    else_g = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["e"], keepdims=0, name="else_sum")],
                               "else", [], [vi("e", None)])
    nodes = [helper.make_node("Neg", ["x"], ["n"], name="neg"),
             helper.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Add", ["y0", "n"], ["y"], name="add"),
             helper.make_node("Relu", ["z"], ["r"], name="shaped_relu")]  # shaped: the device keeps it
    model = make(nodes, [vi("x", None), vi("c", [], TensorProto.BOOL), vi("z", [2, 4])], [vi("y", None), vi("r", [2, 4])])
    return model, [{"x": X, "c": np.array(c), "z": X} for c in (True, False)]


def string_constants():
    """String constants in the main graph and in an If branch (a string initializer, a Constant node,
    a Constant's tensor attribute read by the EP) beside float nodes the device should take."""
    labels = numpy_helper.from_array(np.array([b"neg", b"pos"], dtype=object), "labels")
    then_g = helper.make_graph([constant("tag_then", np.array([b"yes"], dtype=object)),
                                helper.make_node("Identity", ["tag_then"], ["t"], name="then_identity")],
                               "then", [], [vi("t", [1], TensorProto.STRING)])
    else_g = helper.make_graph([constant("tag_else", np.array([b"no"], dtype=object)),
                                helper.make_node("Identity", ["tag_else"], ["e"], name="else_identity")],
                               "else", [], [vi("e", [1], TensorProto.STRING)])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["y"], name="relu"),
             helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0, name="max"),
             helper.make_node("Cast", ["m"], ["mi"], to=TensorProto.INT64, name="cast"),
             helper.make_node("Clip", ["mi", "lo", "hi"], ["idx0"], name="clip"),
             helper.make_node("Reshape", ["idx0", "one_dim"], ["idx"], name="reshape"),
             helper.make_node("Gather", ["labels", "idx"], ["label"], name="gather"),
             constant("sep", np.array([b"|"], dtype=object)),
             helper.make_node("Concat", ["label", "sep"], ["text0"], axis=0, name="concat"),
             helper.make_node("Greater", ["m", "zero"], ["c"], name="greater"),
             helper.make_node("If", ["c"], ["tag"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Concat", ["text0", "tag"], ["text"], axis=0, name="concat_tag")]
    inits = [labels, numpy_helper.from_array(np.array(0, np.int64), "lo"),
             numpy_helper.from_array(np.array(1, np.int64), "hi"), numpy_helper.from_array(np.array(0, np.float32), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one_dim")]
    model = make(nodes, [vi("x", [2, 4])], [vi("y", [2, 4]), vi("text", [3], TensorProto.STRING)], inits)
    return model, [{"x": X}, {"x": -X - 5}]


def unshaped_layer_norm():
    """A Transpose and a written-out layer normalisation (as torch exports it) on an input declared
    with no shape: both the nodes as written and onnxruntime's fused LayerNormalization."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.linspace(0.5, 1.5, 8).astype(np.float32), "gamma")]
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1], name="transpose"),
             helper.make_node("ReduceMean", ["xt"], ["mean"], axes=[-1], name="mean"),
             helper.make_node("Sub", ["xt", "mean"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["d2"], name="pow"),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1], name="var"),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="add_eps"),
             helper.make_node("Sqrt", ["ve"], ["sd"], name="sqrt"),
             helper.make_node("Div", ["d", "sd"], ["n"], name="div"),
             helper.make_node("Mul", ["n", "gamma"], ["y0"], name="scale"),
             helper.make_node("Add", ["y0", "gamma"], ["y"], name="shift")]
    model = make(nodes, [vi("x", None)], [vi("y", None)], inits)
    return model, [{"x": np.random.default_rng(0).standard_normal((2, 8, 4)).astype(np.float32)}]


# -- running ---------------------------------------------------------------------------------------
def register() -> None:
    plugin.configure(profiles=PROFILES)
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())


def run_case(model, feeds_list: list[dict], optimize: bool = True) -> dict:
    """Each policy's session against onnxruntime's CPU EP: the largest error and the reference's
    scale over all feeds, the nodes the simulated EP took, or the error that stopped it."""
    blob = model.SerializeToString()
    cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
    out: dict = {}
    for policy in POLICIES:
        so = ort.SessionOptions()
        so.set_provider_selection_policy(getattr(ort.OrtExecutionProviderDevicePolicy, policy))
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        if not optimize:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            sess = ort.InferenceSession(blob, so)
            err = scale = 0.0
            for feeds in feeds_list:
                for a, b in zip(sess.run(None, feeds), cpu.run(None, feeds)):
                    if b.dtype == object:  # strings: equal or not
                        err = max(err, 0.0 if a.tolist() == b.tolist() else float("inf"))
                        continue
                    err = max(err, float(np.abs(a - b).max()))
                    scale = max(scale, float(np.abs(b).max()))
            device = sorted(n.name for s in sess.get_provider_graph_assignment_info()
                            if s.ep_name != "CPUExecutionProvider" for n in s.get_nodes())
            out[policy] = {"err": err, "scale": scale, "device_nodes": device, "error": None}
        except Exception as e:  # onnxruntime's own error types
            out[policy] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
    return out


class Records(logging.Handler):
    """onnxhal's log records at WARNING and above, as text."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


def control_flow() -> dict:
    records = Records()
    logging.getLogger("onnxhal").addHandler(records)
    register()
    from onnxhal.simulators.profiles import load_profile

    cases = {"outer_initializer": outer_initializer(), "nested_constants": nested_constants(),
             "unshaped_values": unshaped_values(), "string_constants": string_constants()}
    result = {name: run_case(model, feeds) for name, (model, feeds) in cases.items()}
    result["unshaped_layer_norm"] = run_case(*unshaped_layer_norm())
    result["unshaped_layer_norm_as_written"] = run_case(*unshaped_layer_norm(), optimize=False)
    result["log"] = records.lines
    result["tolerance"] = {p: [load_profile(p).rtol, load_profile(p).atol] for p in PROFILES}
    return result


def explicit_devices() -> dict:
    """The control-flow models on each simulated EP picked with add_provider_for_devices (onnxruntime
    1.23 has no virtual devices, so no policy picks them there): claims in the main graph and in
    subgraphs of one session."""
    records = Records()
    logging.getLogger("onnxhal").addHandler(records)
    register()
    out: dict = {"ort_version": ort.__version__}
    for name, (model, feeds_list) in {"outer_initializer": outer_initializer(),
                                      "nested_constants": nested_constants()}.items():
        blob = model.SerializeToString()
        cpu = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        for ep in ("VirtualGpuExecutionProvider", "VirtualNpuExecutionProvider"):
            so = ort.SessionOptions()
            so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == ep], {})
            try:
                sess = ort.InferenceSession(blob, so)
                pairs = [(a, b) for f in feeds_list for a, b in zip(sess.run(None, f), cpu.run(None, f))]
                out[f"{name}/{ep}"] = {"err": max(float(np.abs(a - b).max()) for a, b in pairs),
                                       "scale": max(float(np.abs(b).max()) for _, b in pairs), "error": None}
            except Exception as e:
                out[f"{name}/{ep}"] = {"error": f"{type(e).__name__}: {e}"}
    from onnxhal.simulators.profiles import load_profile

    out["tolerance"] = {ep: [load_profile(p).rtol, load_profile(p).atol] for ep, p in
                        (("VirtualGpuExecutionProvider", "generic-gpu"), ("VirtualNpuExecutionProvider", "generic-npu"))}
    out["log"] = records.lines
    return out


#: Conv nodes that load (shape inference lets them through) but that onnxruntime's CPU EP refuses at
#: run time: (attributes, input shape, weight shape, bias length or None).
INVALID_CONVS = {
    "channels": ({}, (1, 4, 8, 8), (8, 3, 3, 3), None),
    "group_channels": ({"group": 2}, (1, 4, 8, 8), (8, 3, 3, 3), None),
    "group_outputs": ({"group": 2}, (1, 4, 8, 8), (3, 2, 3, 3), None),
    "kernel_shape": ({"kernel_shape": [2, 2]}, (1, 4, 8, 8), (8, 4, 3, 3), None),
    "bias": ({}, (1, 4, 8, 8), (8, 4, 3, 3), 5),
}


def invalid_convs() -> dict:
    """Each invalid Conv on onnxruntime's CPU EP and under each policy: what the run raised (None if
    it returned) and which EPs ran the node."""
    register()
    rng = np.random.default_rng(0)
    out: dict = {}
    for name, (attrs, xs, ws, bias) in INVALID_CONVS.items():
        inits = [numpy_helper.from_array(rng.standard_normal(ws).astype(np.float32), "w")]
        if bias is not None:
            inits.append(numpy_helper.from_array(np.ones(bias, np.float32), "b"))
        node = helper.make_node("Conv", ["x", "w"] + (["b"] if bias is not None else []), ["y"], name="conv", **attrs)
        blob = make([node], [vi("x", list(xs))], [vi("y", None)], inits).SerializeToString()
        feeds = {"x": rng.standard_normal(xs).astype(np.float32)}
        cells = {}
        for policy in (None, *POLICIES):
            so = ort.SessionOptions()
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            if policy is not None:
                so.set_provider_selection_policy(getattr(ort.OrtExecutionProviderDevicePolicy, policy))
            sess = ort.InferenceSession(blob, so, providers=None if policy else ["CPUExecutionProvider"])
            try:
                sess.run(None, feeds)
                raised = None
            except Exception as e:
                raised = str(e)
            cells[policy or "CPU"] = {"raised": raised,
                                      "eps": sorted({s.ep_name for s in sess.get_provider_graph_assignment_info()})}
        out[name] = cells
    return out


def crossing_groups():
    """Two groups each convex alone that feed each other: A = {a1, a2}, B = {b1, b2}, b1 reads a1
    and a2 reads b2. Fusing both would make a cycle."""
    nodes = [helper.make_node("Add", ["x", "x"], ["p"], name="a1"),
             helper.make_node("Relu", ["x"], ["r"], name="b2"),
             helper.make_node("Mul", ["p", "x"], ["q"], name="b1"),
             helper.make_node("Add", ["r", "x"], ["s"], name="a2"),
             helper.make_node("Sub", ["q", "s"], ["y"], name="join")]
    return make(nodes, [vi("x", [2, 4])], [vi("y", [2, 4])]), {"x": X}


def cyclic_claims() -> dict:
    """The toy EP (tests/plugins) claims both crossing groups, inside onnxruntime and in onnxhal."""
    import onnxhal

    records = Records()
    logging.getLogger("onnxhal").addHandler(records)
    toy = str(Path(__file__).resolve().parent / "plugins" / "toy_fusing_ep.py")
    options = {"mode": "script", "groups": "a1+a2;b1+b2"}
    model, feeds = crossing_groups()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    plugin.configure(library=toy)
    ort.register_execution_provider_library("toy.virtual", plugin.library_path())
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([next(d for d in ort.get_ep_devices() if d.ep_name == "ToyA")], options)
    out: dict = {}
    try:
        sess = ort.InferenceSession(model.SerializeToString(), so)
        out["bridge"] = {"err": float(np.abs(sess.run(None, feeds)[0] - ref).max()),
                         "groups": sorted(sorted(n.name for n in s.get_nodes()) for s in sess.get_provider_graph_assignment_info()
                                          if s.ep_name == "ToyA"), "error": None}
    except Exception as e:
        out["bridge"] = {"error": f"{type(e).__name__}: {e}"}
    onnxhal.register_execution_provider_library("toy", toy)
    hso = onnxhal.SessionOptions()
    hso.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    hso.add_provider_for_devices([next(d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyA")], options)
    own = onnxhal.InferenceSession(model, hso)
    out["onnxhal"] = {"err": float(np.abs(own.run(None, feeds)[0] - ref).max()),
                      "groups": sorted(sorted(n.name for n in s.get_nodes()) for s in own.get_provider_graph_assignment_info()
                                       if s.ep_name == "ToyA")}
    out["log"] = records.lines
    return out


def _long_running_session():
    """A session whose run spends most of its time in the simulated GPU's Compute callbacks."""
    n = 128
    w = numpy_helper.from_array((np.eye(n) * 0.999).astype(np.float32), "w")
    nodes, prev = [], "x"
    for i in range(40):
        nodes += [helper.make_node("MatMul", [prev, "w"], [f"m{i}"], name=f"matmul{i}"),
                  helper.make_node("Sin" if i % 2 else "Cos", [f"m{i}"], [f"s{i}"], name=f"act{i}")]
        prev = f"s{i}"
    model = make(nodes, [vi("x", [n, n])], [vi(prev, [n, n])], [w])
    register()
    so = ort.SessionOptions()
    so.set_provider_selection_policy(ort.OrtExecutionProviderDevicePolicy.PREFER_GPU)
    return ort.InferenceSession(model.SerializeToString(), so), {"x": np.ones((n, n), np.float32)}


def interrupted_runs() -> dict:
    """Runs until SIGINT (the test sends it once "READY" is printed): the KeyboardInterrupt must
    surface where ``run`` returns, as with onnxruntime alone."""
    import signal
    import time

    sess, feeds = _long_running_session()
    sess.run(None, feeds)
    print("READY", flush=True)
    start = time.time()
    runs = 0
    try:
        while time.time() - start < 60:
            sess.run(None, feeds)
            runs += 1
    except KeyboardInterrupt:
        return {"raised": "KeyboardInterrupt", "runs": runs,
                "handler_restored": signal.getsignal(signal.SIGINT) is signal.default_int_handler}
    except Exception as e:
        return {"raised": f"{type(e).__name__}: {e}", "runs": runs}
    return {"raised": None, "runs": runs}


def handler_after_failed_run() -> dict:
    """A run that fails on the device leaves Python's SIGINT handler as it was."""
    import signal

    register()
    model, feeds = outer_initializer()
    so = ort.SessionOptions()
    so.add_provider_for_devices([next(d for d in ort.get_ep_devices() if d.ep_name == "VirtualGpuExecutionProvider")],
                                {"fault_transient_error_rate": "1.0", "fault_seed": "3"})
    sess = ort.InferenceSession(model.SerializeToString(), so)
    sess.disable_fallback()
    try:
        sess.run(None, feeds[0])
        failed = None
    except Exception as e:
        failed = type(e).__name__
    return {"failed": failed, "handler_restored": signal.getsignal(signal.SIGINT) is signal.default_int_handler}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]]()))
    sys.stdout.flush()
