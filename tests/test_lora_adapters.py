"""LoRA adapters side by side with onnxruntime: adapter files written by one and read by the other,
and runs with an active adapter (RunOptions.add_active_adapter) on the same model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.errors import Fail, InvalidArgument, NoSuchFile

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(48)
PARAMS = {
    "w_f32": RNG.standard_normal((4, 3)).astype(np.float32),
    "w_f16": RNG.standard_normal((2, 5)).astype(np.float16),
    "w_f64": RNG.standard_normal(3),
    "ids": np.arange(-3, 4, dtype=np.int64).reshape(7, 1),
    "small": np.array([-128, 0, 127], dtype=np.int8),
    "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
    "one": np.array([2.5], dtype=np.float32),
    "empty": np.zeros((0, 4), dtype=np.float32),
}


def _export(module, path, params, adapter_version=7, model_version=11) -> None:
    fmt = module.AdapterFormat()
    fmt.set_adapter_version(adapter_version)
    fmt.set_model_version(model_version)
    fmt.set_parameters({k: module.OrtValue.ortvalue_from_numpy(v) for k, v in params.items()})
    fmt.export_adapter(str(path))


def _read(module, path):
    fmt = module.AdapterFormat.read_adapter(str(path))
    params = {k: v.numpy().copy() for k, v in fmt.get_parameters().items()}  # the views die with fmt
    return fmt.get_format_version(), fmt.get_adapter_version(), fmt.get_model_version(), params


@pytest.mark.parametrize("writer,reader", [(onnxhal, ort), (ort, onnxhal), (onnxhal, onnxhal)],
                         ids=["onnxhal-to-ort", "ort-to-onnxhal", "onnxhal-to-onnxhal"])
def test_adapter_files_round_trip_with_onnxruntime(tmp_path, writer, reader):
    path = tmp_path / "a.onnx_adapter"
    _export(writer, path, PARAMS)
    fmt_version, adapter_version, model_version, params = _read(reader, path)
    assert (fmt_version, adapter_version, model_version) == (1, 7, 11)
    assert set(params) == set(PARAMS)
    for name, want in PARAMS.items():
        got = params[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_empty_adapter_round_trips(tmp_path):
    for writer, reader in ((onnxhal, ort), (ort, onnxhal)):
        path = tmp_path / f"{writer.__name__}.onnx_adapter"
        _export(writer, path, {}, 0, 0)
        assert _read(reader, path) == (1, 0, 0, {})


def test_read_parameters_view_the_file_bytes(tmp_path):
    path = tmp_path / "a.onnx_adapter"
    _export(ort, path, {"w": PARAMS["w_f32"]})
    fmt = onnxhal.AdapterFormat.read_adapter(path)
    first = fmt.get_parameters()["w"].numpy()
    assert np.shares_memory(first, fmt.get_parameters()["w"].numpy())  # no copy per call, as onnxruntime's views


W = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)


def _lora_model() -> bytes:
    """y = x @ W + (x @ A) @ B: W a plain initializer, A and B overridable (graph inputs with zero
    defaults), the layout onnxruntime's LoRA adapters are made for."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [4, 2])
    b = helper.make_tensor_value_info("B", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("MatMul", ["x", "W"], ["base"]), helper.make_node("MatMul", ["x", "A"], ["xa"]),
             helper.make_node("MatMul", ["xa", "B"], ["delta"]), helper.make_node("Add", ["base", "delta"], ["y"])]
    inits = [numpy_helper.from_array(W, "W"),
             numpy_helper.from_array(np.zeros((4, 2), np.float32), "A"),
             numpy_helper.from_array(np.zeros((2, 3), np.float32), "B")]
    model = helper.make_model(helper.make_graph(nodes, "lora", [x, a, b], [y], inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    return model.SerializeToString()


@pytest.mark.parametrize("level", ["ORT_DISABLE_ALL", "ORT_ENABLE_ALL"])
def test_feeding_an_overridable_initializer_replaces_it(level):
    """A and B are initializers listed as graph inputs: a feed replaces them for that run only."""
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    over = {"x": x, "A": RNG.standard_normal((4, 2)).astype(np.float32),
            "B": RNG.standard_normal((2, 3)).astype(np.float32)}
    got = []
    for module in (ort, onnxhal):
        so = module.SessionOptions()
        so.graph_optimization_level = getattr(module.GraphOptimizationLevel, level)
        sess = module.InferenceSession(_lora_model(), so, providers=["CPUExecutionProvider"])
        got.append([sess.run(None, {"x": x})[0], sess.run(None, over)[0], sess.run(None, {"x": x})[0]])
    for theirs, ours in zip(*got):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert not np.allclose(got[1][0], got[1][1])


def _adapter(module, path):
    adapter = module.LoraAdapter()
    adapter.Load(str(path))
    return adapter


def _run_both(model, feeds, adapter_paths):
    out = []
    for module in (ort, onnxhal):
        sess = module.InferenceSession(model, providers=["CPUExecutionProvider"])
        opts = module.RunOptions()
        adapters = [_adapter(module, path) for path in adapter_paths]  # onnxruntime's RunOptions does not keep them
        for adapter in adapters:
            opts.add_active_adapter(adapter)
        out.append((sess.run(None, feeds, opts)[0], sess.run(None, feeds)[0]))
    return out


def test_run_with_active_adapter_matches_onnxruntime(tmp_path):
    model = _lora_model()
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    path = tmp_path / "a.onnx_adapter"
    _export(ort, path, {"A": RNG.standard_normal((4, 2)).astype(np.float32),
                        "B": RNG.standard_normal((2, 3)).astype(np.float32)})
    (theirs, theirs_plain), (ours, ours_plain) = _run_both(model, {"x": x}, [path])
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours_plain, theirs_plain, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours, ours_plain)  # the adapter changed the result, and only for its run


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_adapter_wins_over_feed_and_earlier_adapter_over_later(tmp_path, order):
    model = _lora_model()
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    first, second = tmp_path / "1.onnx_adapter", tmp_path / "2.onnx_adapter"
    _export(onnxhal, first, {"A": RNG.standard_normal((4, 2)).astype(np.float32),
                             "B": RNG.standard_normal((2, 3)).astype(np.float32)})
    _export(onnxhal, second, {"B": RNG.standard_normal((2, 3)).astype(np.float32)})
    feeds = {"x": x, "B": np.ones((2, 3), np.float32)}
    paths = [(first, second)[i] for i in order]
    (theirs, _), (ours, _) = _run_both(model, feeds, paths)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_adapter_parameter_that_is_not_an_input_is_refused(tmp_path):
    path = tmp_path / "w.onnx_adapter"
    _export(onnxhal, path, {"W": np.zeros((4, 3), np.float32)})  # W is a plain initializer: not overridable
    x = np.zeros((2, 4), np.float32)
    sess = ort.InferenceSession(_lora_model(), providers=["CPUExecutionProvider"])
    opts = ort.RunOptions()
    adapter = _adapter(ort, path)
    opts.add_active_adapter(adapter)
    with pytest.raises(Exception, match="Invalid input name: W"):
        sess.run(None, {"x": x}, opts)
    sess = onnxhal.InferenceSession(_lora_model())
    opts = onnxhal.RunOptions()
    opts.add_active_adapter(_adapter(onnxhal, path))
    with pytest.raises(InvalidArgument, match="Invalid input name: W.*overridable initializer"):
        sess.run(None, {"x": x}, opts)


def test_adapter_with_wrong_shape_is_refused(tmp_path):
    path = tmp_path / "a.onnx_adapter"
    _export(onnxhal, path, {"A": np.zeros((2, 2), np.float32)})
    sess = onnxhal.InferenceSession(_lora_model())
    opts = onnxhal.RunOptions()
    opts.add_active_adapter(_adapter(onnxhal, path))
    with pytest.raises(InvalidArgument, match="'A'"):
        sess.run(None, {"x": np.zeros((2, 4), np.float32)}, opts)


def test_bad_adapter_files_raise_typed_errors(tmp_path):
    path = tmp_path / "a.onnx_adapter"
    _export(ort, path, {"w": PARAMS["w_f32"]})
    data = path.read_bytes()
    with pytest.raises(NoSuchFile, match="missing.onnx_adapter"):
        onnxhal.AdapterFormat.read_adapter(tmp_path / "missing.onnx_adapter")
    (tmp_path / "junk").write_bytes(b"x" * 40)
    with pytest.raises(Fail, match="does not appear to be a valid lora parameter format"):
        onnxhal.LoraAdapter().Load(tmp_path / "junk")
    (tmp_path / "cut").write_bytes(data[:len(data) // 2])
    with pytest.raises(Fail, match="verification"):
        onnxhal.AdapterFormat.read_adapter(tmp_path / "cut")
    # format_version is the Adapter table's first int32; bump it
    fmt = onnxhal.AdapterFormat.read_adapter(path)
    assert fmt.get_format_version() == 1
    patched = bytearray(data)
    root = int.from_bytes(data[:4], "little")
    vtable = root - int.from_bytes(data[root:root + 4], "little", signed=True)
    slot = root + int.from_bytes(data[vtable + 4:vtable + 6], "little")
    patched[slot:slot + 4] = (2).to_bytes(4, "little")
    (tmp_path / "v2").write_bytes(bytes(patched))
    with pytest.raises(Fail, match="Unsupported lora format version 2"):
        onnxhal.AdapterFormat.read_adapter(tmp_path / "v2")
    with pytest.raises(RuntimeError, match="Unsupported lora format version"):
        ort.AdapterFormat.read_adapter(str(tmp_path / "v2"))


def test_bad_arguments_are_typed_errors():
    with pytest.raises(InvalidArgument, match="LoraAdapter"):
        onnxhal.RunOptions().add_active_adapter("a.onnx_adapter")
    fmt = onnxhal.AdapterFormat()
    with pytest.raises(InvalidArgument, match="'w' must be an OrtValue"):
        fmt.set_parameters({"w": np.zeros(2)})
    with pytest.raises(InvalidArgument, match="tensor.string.*cannot hold"):
        fmt.set_parameters({"s": onnxhal.OrtValue.ortvalue_from_numpy(np.array(["a"], dtype=object))})
    with pytest.raises(InvalidArgument, match="tensor.bool.*cannot hold"):
        fmt.set_parameters({"m": onnxhal.OrtValue.ortvalue_from_numpy(np.array([True]))})
    with pytest.raises(InvalidArgument, match="scalar"):
        fmt.set_parameters({"c": onnxhal.OrtValue.ortvalue_from_numpy(np.array(1.0, np.float32))})
    with pytest.raises(InvalidArgument, match="32-bit"):
        fmt.set_adapter_version(2**40)


def test_run_with_iobinding_and_ort_values_apply_the_adapter(tmp_path):
    """onnxhal applies an active adapter on every run path; onnxruntime 1.32 ignores it in
    run_with_iobinding (measured: the plain result comes back), a difference docs/api-parity.md notes."""
    path = tmp_path / "a.onnx_adapter"
    _export(onnxhal, path, {"A": RNG.standard_normal((4, 2)).astype(np.float32),
                            "B": RNG.standard_normal((2, 3)).astype(np.float32)})
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    sess = onnxhal.InferenceSession(_lora_model())
    opts = onnxhal.RunOptions()
    opts.add_active_adapter(_adapter(onnxhal, path))
    want = sess.run(None, {"x": x}, opts)[0]
    assert not np.allclose(want, sess.run(None, {"x": x})[0])
    binding = sess.io_binding()
    binding.bind_cpu_input("x", x)
    binding.bind_output("y")
    sess.run_with_iobinding(binding, opts)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], want)
    got = sess.run_with_ort_values(None, {"x": onnxhal.OrtValue.ortvalue_from_numpy(x)}, opts)[0].numpy()
    np.testing.assert_array_equal(got, want)


def test_active_adapter_on_simulated_devices_matches_the_cpu_ep(tmp_path):
    """The adapter's parameters reach the partitions of an NPU (fp16) and a GPU as feeds."""
    from onnxhal.simulators.testing import simulated_devices

    path = tmp_path / "a.onnx_adapter"
    a, b = RNG.standard_normal((4, 2)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    _export(onnxhal, path, {"A": a, "B": b})
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    opts = onnxhal.RunOptions()
    opts.add_active_adapter(_adapter(onnxhal, path))
    want = onnxhal.InferenceSession(_lora_model()).run(None, {"x": x}, opts)[0]
    np.testing.assert_allclose(want, x @ W + x @ a @ b, rtol=1e-5, atol=1e-5)  # y = x W + x A B
    with simulated_devices("generic-npu,generic-gpu") as devices:
        for device in devices:
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([device], {})
            sess = onnxhal.InferenceSession(_lora_model(), so)
            assert sess.partition_summary == {device.ep_name: 4}
            got = sess.run(None, {"x": x}, opts)[0]
            np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max(), err_msg=device.ep_name)


@pytest.mark.parametrize("elem", [TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2])
def test_low_precision_parameters_round_trip(tmp_path, elem):
    path = tmp_path / "a.onnx_adapter"
    values = np.array([[1.5, -2.0, 0.25]], np.float32).astype(helper.tensor_dtype_to_np_dtype(elem))
    _export(onnxhal, path, {"p": values})
    theirs = ort.AdapterFormat.read_adapter(str(path)).get_parameters()["p"]
    assert theirs.element_type() == elem and theirs.shape() == [1, 3]
    ours = onnxhal.AdapterFormat.read_adapter(path).get_parameters()["p"].numpy()
    assert ours.dtype == values.dtype
    np.testing.assert_array_equal(ours.astype(np.float32), values.astype(np.float32))
