"""CPU EP kernel factory (native vs onnx.reference fallback, opset resolution, errors), coverage
of every default-domain schema, control flow through a real session, thread safety and the
per-call cost of the hot elementwise kernels."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxhal
from onnxhal.hal import Node, errors
from onnxhal.runtime.providers.cpu.kernel_factory import (
    ReferenceKernel,
    create_cpu_kernel,
    node_opset,
    supports_node,
)
from onnxhal.runtime.providers.cpu.kernels.registry import lookup
from tests.test_cpu_kernels_nn import make_node, randn, run_native

F = TensorProto.FLOAT


def test_native_kernel_preferred_and_reference_fallback():
    assert not isinstance(create_cpu_kernel(make_node("Relu", 1, 14), None), ReferenceKernel)
    node = make_node("Det", 1, 11)  # an op with no native kernel: onnx.reference's
    kernel = create_cpu_kernel(node, None)
    assert isinstance(kernel, ReferenceKernel)
    x = randn(3, 4, 4)
    (y,) = kernel.compute([x])
    np.testing.assert_allclose(y, np.linalg.det(x), rtol=1e-5)


def test_registry_picks_highest_since_not_above_opset():
    assert lookup("", "Clip", 6).__name__ == "ClipAttr"
    assert lookup("", "Clip", 12).__name__ == "Clip"
    assert lookup("ai.onnx", "Relu", 14) is lookup("", "Relu", 14)
    assert lookup("", "NoSuchOp", 20) is None


def test_opset_resolution():
    node = Node("Split", ["x"], ["a", "b"])
    assert node_opset(node, {"": 11}) == 11
    assert node_opset(node, 17) == 17
    node.since_version = 13
    assert node_opset(node, {"": 11}) == 13  # the runtime-resolved schema version wins


def test_unknown_op_raises_not_implemented_naming_it():
    node = Node("Frobnicate", ["x"], ["y"], domain="com.example")
    assert not supports_node(node, 1)
    with pytest.raises(errors.NotImplemented, match=r"Frobnicate.*com\.example.*opset 1"):
        create_cpu_kernel(node, None, {"com.example": 1})
    unknown = Node("Frobnicate", ["x"], ["y"])
    with pytest.raises(errors.NotImplemented, match="Frobnicate"):
        create_cpu_kernel(unknown, None, {"": 20})


def test_every_default_domain_schema_version_is_supported():
    missing = []
    for schema in onnx.defs.get_all_schemas_with_history():
        if schema.domain == "":
            node = Node(schema.name, [], [])
            node.since_version = schema.since_version
            if not supports_node(node):
                missing.append((schema.name, schema.since_version))
    assert missing == []


def test_the_documented_onnx_reference_operators_are_those_without_a_native_kernel():
    # docs/cpu-ep-operators.md lists them with the reason; a new kernel (or a new onnx) must update it
    import re
    from pathlib import Path

    from onnxhal.runtime.providers.cpu.kernels.registry import registered_ops

    doc = (Path(__file__).resolve().parents[1] / "docs" / "cpu-ep-operators.md").read_text()
    section = doc.split("## Default-domain operators on onnx.reference", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[2] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    documented = {op.strip() for row in rows[1:] for op in row.split(",")}
    native = {op for domain, op in registered_ops() if domain in ("", "ai.onnx")}
    schemas = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == "" and not s.deprecated}
    assert documented == schemas - native
    assert re.search(rf"These {len(documented)} operators", section)


def test_old_versions_onnx_reference_lacks_use_its_oldest():
    # onnx.reference implements DequantizeLinear from opset 19 only; opset 10 is a subset.
    node = make_node("DequantizeLinear", 3, 10)
    x = np.array([0, 3, 128, 255], dtype=np.uint8)
    (y,) = create_cpu_kernel(node, None).compute([x, np.array(2.0, np.float32), np.array(128, np.uint8)])
    np.testing.assert_array_equal(y, [-256.0, -250.0, 0.0, 254.0])


def test_ml_domain_falls_back_to_reference():
    node = Node.from_proto(helper.make_node("Normalizer", ["x"], ["y"], domain="ai.onnx.ml", norm="L1"))
    kernel = create_cpu_kernel(node, None, {"ai.onnx.ml": 1})
    (y,) = kernel.compute([np.array([[1.0, 3.0]], dtype=np.float32)])
    np.testing.assert_allclose(y, [[0.25, 0.75]])


def test_dropout_inference_is_identity():
    x = randn(3, 4)
    y, mask = run_native("Dropout", [x, np.array(0.5, np.float32)], 13, n_outputs=2)
    np.testing.assert_array_equal(y, x)
    assert mask.dtype == np.bool_ and mask.all()


# -- control flow, through the real session ----------------------------------------------------------

def _session_vs_reference(model: onnx.ModelProto, feeds: dict) -> list:
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
        assert g.dtype == w.dtype
    return got


def _model(nodes, inputs, outputs, opset=17, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_if_reads_outer_scope_values():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "y"], ["r"])], "then", [],
                               [helper.make_tensor_value_info("r", F, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "y"], ["r2"])], "else", [],
                               [helper.make_tensor_value_info("r2", F, [3])])
    model = _model([helper.make_node("If", ["c"], ["out"], then_branch=then_g, else_branch=else_g)],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", F, [3]), helper.make_tensor_value_info("y", F, [3])],
                   [helper.make_tensor_value_info("out", F, [3])])
    x, y = randn(3), randn(3)
    for c in (True, False):
        (out,) = _session_vs_reference(model, {"c": np.array(c), "x": x, "y": y})
        np.testing.assert_allclose(out, x + y if c else x - y)


def _loop_model():
    body = helper.make_graph(
        [helper.make_node("Add", ["acc_in", "step"], ["acc_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Mul", ["acc_out", "acc_out"], ["sq"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_in", F, [2])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("acc_out", F, [2]),
         helper.make_tensor_value_info("sq", F, [2])])
    return _model([helper.make_node("Loop", ["n", "", "init"], ["final", "squares"], body=body)],
                  [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                   helper.make_tensor_value_info("init", F, [2]),
                   helper.make_tensor_value_info("step", F, [2])],
                  [helper.make_tensor_value_info("final", F, [2]),
                   helper.make_tensor_value_info("squares", F, [None, 2])])


def _session(model: onnx.ModelProto):
    return onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_loop_carried_and_scan_outputs():
    # onnx.reference's Loop fails without a cond input: compare with the closed form.
    init, step = randn(2), randn(2)
    final, squares = _session(_loop_model()).run(None, {"n": np.array(4, np.int64), "init": init, "step": step})
    accs = np.stack([init + k * step for k in range(1, 5)])
    np.testing.assert_allclose(final, accs[-1], rtol=1e-5)
    np.testing.assert_allclose(squares, accs * accs, rtol=1e-5)
    assert squares.shape == (4, 2) and squares.dtype == np.float32


def test_loop_zero_trips_gives_empty_scan_output():
    init = randn(2)
    final, squares = _session(_loop_model()).run(None, {"n": np.array(0, np.int64), "init": init, "step": randn(2)})
    np.testing.assert_array_equal(final, init)
    assert squares.shape == (0, 2) and squares.dtype == np.float32


@pytest.mark.parametrize("out_axis", [1, -1])
def test_scan9_axes_and_directions(out_axis):
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Identity", ["s_out"], ["y_t"])],
        "body",
        [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
        [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s_final", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[out_axis])
    model = _model([node], [helper.make_tensor_value_info("s0", F, [2]), helper.make_tensor_value_info("xs", F, [2, 5])],
                   [helper.make_tensor_value_info("s_final", F, [2]), helper.make_tensor_value_info("ys", F, [2, 5])])
    # onnx.reference's Scan supports forward directions only: compare with the closed form.
    xs = randn(2, 5)
    s_final, ys = _session(model).run(None, {"s0": np.zeros(2, np.float32), "xs": xs})
    np.testing.assert_allclose(s_final, xs.sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(ys, np.cumsum(xs[:, ::-1], axis=1), rtol=1e-5)  # reverse scan


# -- concurrency and cost ------------------------------------------------------------------------

def test_kernels_are_thread_safe():
    kernels = [create_cpu_kernel(make_node(op, n, 17, **attrs), None)
               for op, n, attrs in [("Conv", 2, {"pads": [1, 1, 1, 1]}), ("Softmax", 1, {}),
                                    ("ReduceMean", 1, {"axes": [1]}), ("Add", 2, {})]]
    x, w = randn(1, 3, 6, 6), randn(4, 3, 3, 3)
    inputs = [[x, w], [x], [x], [x, x]]
    expected = [k.compute(i)[0] for k, i in zip(kernels, inputs)]
    errors_seen: list = []

    def worker():
        try:
            for _ in range(50):
                for k, i, e in zip(kernels, inputs, expected):
                    np.testing.assert_array_equal(k.compute(i)[0], e)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors_seen == []


@pytest.mark.parametrize("op,inline", [("Add", True), ("Mul", True), ("Tanh", True), ("Relu", False)])
def test_elementwise_kernel_is_one_numpy_call(op, inline):
    """A tiny elementwise compute is numpy calls with no Python function under it, and the ufunc
    kernels offer their call as ``inline_fn`` so the generated run plan calls numpy directly (the
    chain benchmark's per-node cost rests on this; measured there, not in a timed test)."""
    import sys

    n_in = 2 if op in ("Add", "Mul") else 1
    kernel = create_cpu_kernel(make_node(op, n_in, 14), None)
    inputs = [randn(4), randn(4)][:n_in]
    if inline:
        np.testing.assert_array_equal(kernel.inline_fn(*inputs), kernel.compute(inputs)[0])
    python_calls: list[str] = []

    def profiler(frame, event, arg):
        if event == "call":
            python_calls.append(frame.f_code.co_name)

    sys.setprofile(profiler)
    try:
        kernel.compute(inputs)
    finally:
        sys.setprofile(None)
    assert python_calls == ["compute"], python_calls


def test_blas_thread_control_roundtrip():
    from onnxhal.runtime.providers.cpu.kernels.blas_threads import get_blas_threads, set_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy is not linked against OpenBLAS here")
    try:
        assert set_blas_threads(1) and get_blas_threads() == 1
        with pytest.raises(errors.InvalidArgument):
            set_blas_threads(0)
    finally:
        set_blas_threads(before)
    assert get_blas_threads() == before
