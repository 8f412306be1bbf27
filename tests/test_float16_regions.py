"""float16 regions computed in float32 (``optimizer/float16_regions.py``): the CPU EP rounds to
float16 where onnxruntime's CPU EP rounds and nowhere else, so its values are onnxruntime's; on
random inputs and on overflow past 65504, float16 subnormals and NaN, against onnxruntime and
against the plain float16 kernels (the pass left out)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.hal.enums import GraphOptimizationLevel
from onnxhal.hal.graph import Graph
from onnxhal.runtime.optimizer import passes
from onnxhal.runtime.optimizer.float16_regions import run_float16_regions

H, F = TensorProto.FLOAT16, TensorProto.FLOAT


def _model(rng: np.random.Generator) -> bytes:
    """As onnxconverter-common writes a float16 model with keep_io_types: a float32 input cast to
    float16, float16 nodes of both kinds (with and without an onnxruntime float16 kernel), a
    Reshape between two MatMuls (forced to float32), a Reshape -> Transpose pair between them
    (kept in float16: rounded), LayerNormalization (a float16 kernel), a float32 output through a
    model Cast and a float16 output."""
    def w(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float16), name)

    inits = [w("w1", 16, 16), w("w2", 16, 16), w("w3", 16, 16), w("g", 16), w("b", 16),
             numpy_helper.from_array(np.array([2, 4, 16], np.int64), "s3"),
             numpy_helper.from_array(np.array([8, 16], np.int64), "s2"),
             numpy_helper.from_array(np.array(3.0, np.float16), "three"),
             numpy_helper.from_array(np.array(40000.0, np.float16), "big")]
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=H),
        helper.make_node("Mul", ["x16", "three"], ["m"]),
        helper.make_node("MatMul", ["m", "w1"], ["mm1"]),
        helper.make_node("Reshape", ["mm1", "s2"], ["r1"]),          # isolated: float32
        helper.make_node("Erf", ["r1"], ["e"]),
        helper.make_node("Reshape", ["e", "s3"], ["r2"]),            # Reshape -> Transpose: float16
        helper.make_node("Transpose", ["r2"], ["t"], perm=[1, 0, 2]),
        helper.make_node("MatMul", ["t", "w2"], ["mm2"]),
        helper.make_node("Add", ["mm2", "big"], ["a"]),              # past 65504 in float16
        helper.make_node("Sub", ["a", "big"], ["d"]),
        helper.make_node("LayerNormalization", ["d", "g", "b"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "w3"], ["mm3"]),
        helper.make_node("Softmax", ["mm3"], ["sm"], axis=-1),
        helper.make_node("Cast", ["sm"], ["y"], to=F),
        helper.make_node("Sigmoid", ["d"], ["z"]),
    ]
    graph = helper.make_graph(nodes, "regions", [helper.make_tensor_value_info("x", F, [4, 2, 16])],
                              [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", H, None),
                               helper.make_tensor_value_info("d", H, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def _onnxhal(data: bytes, feeds: dict, level: str = "ORT_ENABLE_ALL") -> list[np.ndarray]:
    so = onnxhal.SessionOptions()
    so.graph_optimization_level = getattr(onnxhal.GraphOptimizationLevel, level)
    return onnxhal.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _onnxruntime(data: bytes, feeds: dict, level: str = "ORT_ENABLE_ALL") -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ulps(got: np.ndarray, want: np.ndarray) -> float:
    """Largest difference in units of float16's last place at the value (inf and NaN must match)."""
    got, want = got.astype(np.float32), want.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(want)), "NaN in different places"
    assert np.array_equal(np.isinf(got), np.isinf(want)) and np.array_equal(got[np.isinf(got)], want[np.isinf(want)]), \
        "inf in different places"
    ok = np.isfinite(want)
    step = np.spacing(np.abs(want[ok]).astype(np.float16)).astype(np.float32)
    return float((np.abs(got[ok] - want[ok]) / step).max()) if ok.any() else 0.0


_INPUTS = {
    "random": lambda rng: rng.standard_normal((4, 2, 16)),
    "overflow": lambda rng: rng.standard_normal((4, 2, 16)) * 3000,     # products past 65504
    "subnormal": lambda rng: rng.standard_normal((4, 2, 16)) * 1e-6,    # below float16's 6.1e-5
    "nan": lambda rng: np.where(rng.random((4, 2, 16)) < 0.05, np.nan, rng.standard_normal((4, 2, 16))),
}


# every level: onnxruntime inserts its Casts with optimizations off too (InsertCastTransformer
# runs after partitioning whatever the level), so ORT_DISABLE_ALL computes the regions in float32
@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
@pytest.mark.parametrize("kind", list(_INPUTS))
def test_float16_regions_give_onnxruntime_values(kind, level):
    rng = np.random.default_rng(3)
    data = _model(rng)
    feeds = {"x": _INPUTS[kind](rng).astype(np.float32)}
    theirs = _onnxruntime(data, feeds, level)
    ours = _onnxhal(data, feeds, level)
    for name, got, want in zip(("y", "z", "d"), ours, theirs):
        assert got.dtype == want.dtype and got.shape == want.shape, name
        # float32 between nodes where onnxruntime keeps float32: a float16 value at most one
        # rounding step off (float32 kernels summing in another order), a float32 one 1e-5
        limit = 1.0 if got.dtype == np.float16 else None
        if limit is None:
            assert np.array_equal(np.isnan(got), np.isnan(want))
            ok = ~np.isnan(want)
            err = float(np.abs(got[ok] - want[ok]).max()) if ok.any() else 0.0
            assert err < 1e-5, f"{kind}: output {name} {err:.2e} off onnxruntime"
        else:
            err = _ulps(got, want)
            assert err <= limit, f"{kind}: output {name} {err:.1f} float16 steps off onnxruntime"


def test_the_plain_float16_kernels_round_where_onnxruntime_does_not(monkeypatch):
    # the reason for the pass: rounding each node's output to float16 moves values off onnxruntime's
    # (and 40000 + x - 40000 overflows to inf in float16, which onnxruntime's float32 Add/Sub do not)
    rng = np.random.default_rng(3)
    data = _model(rng)
    feeds = {"x": _INPUTS["overflow"](rng).astype(np.float32)}
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = _onnxhal(data, feeds)
    assert _ulps(ours[2], theirs[2]) <= 1.0
    monkeypatch.setattr(passes, "PASSES", [p for p in passes.PASSES if p[0] != "run_float16_regions"])
    plain = _onnxhal(data, feeds)
    with pytest.raises(AssertionError):
        _ulps(plain[2], theirs[2])  # inf where onnxruntime has finite values (or further off)
        assert float(np.abs(plain[0] - theirs[0]).max()) < 1e-5


def _graph(data: bytes) -> Graph:
    model = onnx.load_from_string(data)
    return Graph.from_proto(model.graph, {o.domain: o.version for o in model.opset_import})


def test_casts_stand_only_at_the_region_edges():
    g = _graph(_model(np.random.default_rng(0)))
    assert run_float16_regions(g)
    by_out = {o: n for n in g.nodes for o in n.outputs}
    casts = [n for n in g.nodes if n.op_type == "Cast"]
    to16 = sorted(n.outputs[0] for n in casts if n.attr("to") == H)
    to32 = sorted(n.inputs[0] for n in casts if n.attr("to") == F)
    # rounded: before the Reshape -> Transpose pair (float16 kernels) and the float16 graph
    # outputs d and z; the model's own Cast x -> x16 stays for nobody
    # (Mul reads x itself, as RemoveDuplicateCastTransformer wires it)
    assert to16 == sorted(["x16", "e", "d", "z"]), to16
    # widened: the Transpose's float16 output and the float16 weights; the model's output Cast
    # reads Softmax's float32 value
    assert {"t", "w1", "w2", "w3", "three", "big", "g", "b"} <= set(to32), to32
    assert by_out["y"].inputs[0] != "sm" and by_out["y"].attr("to") == F
    # isolated float16-kernel nodes run in float32: the Reshape between MatMul and Erf, the
    # LayerNormalization between Sub and MatMul; the Reshape -> Transpose pair stays float16
    norm = next(n for n in g.nodes if n.op_type == "LayerNormalization")
    assert norm.inputs[0] == by_out["d"].inputs[0] and norm.outputs[0].endswith("_float32")
    reshape1 = next(n for n in g.nodes if n.op_type == "Reshape" and n.inputs[1] == "s2")
    assert reshape1.inputs[0].endswith("_float32") and reshape1.outputs[0].endswith("_float32")
    transpose = next(n for n in g.nodes if n.op_type == "Transpose")
    assert transpose.inputs[0] == "r2" and transpose.outputs[0] == "t"
    assert not run_float16_regions(g), "a second run found more to convert"


def test_sessions_with_other_eps_keep_float16_nodes():
    g = _graph(_model(np.random.default_rng(0)))
    passes.optimize(g, GraphOptimizationLevel.ORT_ENABLE_BASIC, cpu_ep_only=False)
    assert any(n.op_type == "Erf" for n in g.nodes)
    assert sum(n.op_type == "Cast" for n in g.nodes) == 2  # the model's own


def _if_model() -> bytes:
    """float16 nodes inside both branches of an If, reading a float16 value of the outer graph."""
    def branch(name: str, k: float) -> onnx.GraphProto:
        nodes = [helper.make_node("Constant", [], [f"{name}_c"], value=numpy_helper.from_array(np.array(k, np.float16))),
                 helper.make_node("Mul", ["xs", f"{name}_c"], [f"{name}_m"]),
                 helper.make_node("Erf", [f"{name}_m"], [f"{name}_e"]),
                 helper.make_node("Reshape", [f"{name}_e", "shape"], [f"{name}_r"]),
                 helper.make_node("Sub", [f"{name}_r", f"{name}_c"], [f"{name}_y"])]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}_y", H, None)])

    nodes = [helper.make_node("Cast", ["x"], ["x16"], to=H), helper.make_node("Exp", ["x16"], ["xs"]),
             helper.make_node("If", ["cond"], ["yi"], then_branch=branch("then", 3.0), else_branch=branch("else", 0.5)),
             helper.make_node("Tanh", ["yi"], ["y16"]), helper.make_node("Cast", ["y16"], ["y"], to=F)]
    graph = helper.make_graph(nodes, "if16", [helper.make_tensor_value_info("x", F, [4, 8]),
                                              helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.array([8, 4], np.int64), "shape")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


@pytest.mark.parametrize("cond", [True, False])
def test_float16_regions_inside_subgraphs_give_onnxruntime_values(cond):
    # onnxruntime casts inside If / Loop bodies too (InsertCastTransformer recurses); the If node
    # itself stays float16 (its outputs come from the body)
    data = _if_model()
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32) * 2, "cond": np.array(cond)}
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    ours = _onnxhal(data, feeds)[0]
    err = float(np.abs(ours - theirs).max())
    assert err < 1e-6, f"{err:.2e} off onnxruntime"


def _casts_in_onnxruntime(op: str, inputs: list[str], inits: list, tmp_path, out_type: int = H, **attrs) -> bool:
    """Whether onnxruntime's optimized model of one float16 ``op`` node holds a Cast it inserted."""
    graph = helper.make_graph([helper.make_node(op, ["x", *inputs], ["y"], **attrs)], op,
                              [helper.make_tensor_value_info("x", H, [2, 3, 4])],
                              [helper.make_tensor_value_info("y", out_type, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / f"{op}.onnx")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return any(n.op_type == "Cast" for n in onnx.load(so.optimized_model_filepath).graph.node)


def test_the_float16_op_list_is_onnxruntimes(tmp_path):
    from onnxhal.runtime.optimizer.float16_regions import ORT_FLOAT16_OPS

    i64 = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    half = lambda name, v: numpy_helper.from_array(np.array(v, np.float16), name)  # noqa: E731
    cases = {"Relu": ([], []), "Erf": ([], []), "Sigmoid": ([], []), "Softmax": ([], []), "Add": (["h"], [half("h", 1)]),
             "Mul": (["x"], []),
             "ReduceMean": ([], []), "Pad": (["p"], [i64("p", [0, 0, 1, 0, 0, 1])]), "Tile": (["r"], [i64("r", [1, 1, 2])]),
             "Transpose": ([], []), "Reshape": (["s"], [i64("s", [6, 4])]), "Gather": (["i"], [i64("i", [0])]),
             "Concat": (["x"], []), "Expand": (["s"], [i64("s", [2, 2, 3, 4])]), "Clip": ([], []), "Max": (["x"], []),
             "Round": ([], []), "LayerNormalization": (["g"], [half("g", [1, 1, 1, 1])])}
    attrs = {"Concat": {"axis": 0}, "LayerNormalization": {"axis": -1}}
    for op, (inputs, inits) in cases.items():
        cast = _casts_in_onnxruntime(op, inputs, inits, tmp_path, **attrs.get(op, {}))
        assert cast == (("", op) not in ORT_FLOAT16_OPS), \
            f"onnxruntime {ort.__version__} {'casts' if cast else 'has a float16 kernel for'} {op}"


def test_bit_level_ops_keep_their_float16_input():
    # BitCast reinterprets the float16 encoding: widened, it would read float32 bits (and fail)
    graph = helper.make_graph([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("BitCast", ["e"], ["y"], to=TensorProto.UINT16)],
                              "bits", [helper.make_tensor_value_info("x", H, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT16, None)])
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)], ir_version=10).SerializeToString()
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 4)).astype(np.float16)}
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(_onnxhal(data, feeds)[0], theirs)
