"""ModelCompiler side by side with onnxruntime: outputs (file, bytes, stream), flags and their
errors, constructor checks, external initializers (a file over a threshold, or a callback), and
EPContext data kept beside the model (embed_compiled_data_into_model=False, onnxruntime's default)
with the write and read callbacks, on the simulated NPU."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal import errors
from tests.conftest import simulated_or_skip
from tests.test_sim_ep_context import X as NPU_X
from tests.test_sim_ep_context import model_bytes as npu_model_bytes
from tests.test_sim_ep_context import options

ort = pytest.importorskip("onnxruntime")
C = pytest.importorskip("onnxruntime.capi._pybind_state")

W = np.arange(600, dtype=np.float32).reshape(20, 30) / 100
B = np.ones(30, np.float32)
X = np.linspace(-1, 1, 40, dtype=np.float32).reshape(2, 20)


def matmul_add() -> onnx.ModelProto:
    """y = x @ w + b, w 2,400 bytes and b 120 bytes."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
                           helper.make_node("Add", ["h", "b"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 30])],
                          [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


@pytest.fixture
def model_path(tmp_path):
    onnx.save(matmul_add(), tmp_path / "in.onnx")
    return str(tmp_path / "in.onnx")


LIBS = [pytest.param(onnxhal, id="onnxhal"), pytest.param(ort, id="onnxruntime")]


def run(lib, model) -> np.ndarray:
    sess = lib.InferenceSession(model, providers=["CPUExecutionProvider"]) if lib is ort else lib.InferenceSession(model)
    return sess.run(None, {"x": X})[0]


def externals(path: str) -> list:
    model = onnx.load(path, load_external_data=False)
    return [(t.name, t.data_location, {e.key: e.value for e in t.external_data}) for t in model.graph.initializer]


# -- outputs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_compile_to_file_by_keyword_keeps_a_model_no_ep_compiles(lib, model_path, tmp_path):
    out = str(tmp_path / f"{lib.__name__}_ctx.onnx")
    lib.ModelCompiler(lib.SessionOptions(), model_path).compile_to_file(output_model_path=out)
    saved = onnx.load(out)
    assert [n.op_type for n in saved.graph.node] == ["MatMul", "Add"]
    assert sorted(i.name for i in saved.graph.initializer) == ["b", "w"]
    np.testing.assert_allclose(run(lib, out), X @ W + B, rtol=1e-5)


def test_compile_to_file_without_a_path_writes_beside_the_input(model_path):
    # onnxruntime 1.32 documents this but raises TypeError (its binding takes no None).
    with pytest.raises(TypeError):
        ort.ModelCompiler(ort.SessionOptions(), model_path).compile_to_file()
    onnxhal.ModelCompiler(onnxhal.SessionOptions(), model_path).compile_to_file()
    assert os.path.exists(model_path[:-5] + "_ctx.onnx")
    with pytest.raises(errors.InvalidArgument, match="pass output_model_path"):
        onnxhal.ModelCompiler(onnxhal.SessionOptions(), matmul_add().SerializeToString()).compile_to_file()


@pytest.mark.parametrize("lib", LIBS)
def test_bytes_and_stream_as_onnxruntime(lib):
    data = matmul_add().SerializeToString()
    as_bytes = lib.ModelCompiler(lib.SessionOptions(), data).compile_to_bytes()
    chunks = []
    lib.ModelCompiler(lib.SessionOptions(), data).compile_to_stream(chunks.append)
    assert isinstance(as_bytes, bytes) and len(chunks) == 1 and chunks[0] == as_bytes
    np.testing.assert_allclose(run(lib, as_bytes), X @ W + B, rtol=1e-5)


# -- flags and errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("lib", LIBS)
def test_flags_fail_as_onnxruntime(lib, model_path, tmp_path):
    out = tmp_path / "exists.onnx"
    out.write_bytes(b"keep me")
    flags = lib.OrtCompileApiFlags
    with pytest.raises(Exception, match="Failed to generate EP context model since the file .* exists already") as e:
        lib.ModelCompiler(lib.SessionOptions(), model_path, flags=flags.ERROR_IF_OUTPUT_FILE_EXISTS).compile_to_file(
            str(out))
    assert type(e.value).__name__ == "Fail" and out.read_bytes() == b"keep me"
    fresh = tmp_path / "fresh.onnx"
    with pytest.raises(Exception, match="Unable to compile any nodes. Check that the session EPs support") as e:
        lib.ModelCompiler(lib.SessionOptions(), model_path, flags=flags.ERROR_IF_NO_NODES_COMPILED).compile_to_file(
            str(fresh))
    assert type(e.value).__name__ == "Fail" and not fresh.exists()


@pytest.mark.parametrize("lib", LIBS)
def test_constructor_checks_as_onnxruntime(lib, model_path):
    so = lib.SessionOptions()
    with pytest.raises(ValueError, match="Input model bytes array is empty"):
        lib.ModelCompiler(so, b"")
    with pytest.raises(ValueError, match="Input model path is empty"):
        lib.ModelCompiler(so, "")
    with pytest.raises(TypeError, match="Unable to load from type"):
        lib.ModelCompiler(so, 3)
    with pytest.raises(TypeError, match="external initializer filepath is of unexpected type"):
        lib.ModelCompiler(so, model_path, external_initializers_file_path=3)
    with pytest.raises(ValueError, match="both `external_initializers_file_path` and `get_initializer_location_func`"):
        lib.ModelCompiler(so, model_path, external_initializers_file_path="x.bin",
                          get_initializer_location_func=lambda *a: None)


@pytest.mark.parametrize("lib", LIBS)
def test_bad_inputs_fail_at_compile_as_onnxruntime(lib, tmp_path):
    with pytest.raises(Exception, match="Input model path does not exist") as e:
        lib.ModelCompiler(lib.SessionOptions(), str(tmp_path / "missing.onnx")).compile_to_bytes()
    assert type(e.value).__name__ == "InvalidArgument"
    with pytest.raises(Exception) as e:
        lib.ModelCompiler(lib.SessionOptions(), b"garbage").compile_to_bytes()
    assert type(e.value).__name__ == "InvalidProtobuf"


def test_embed_defaults_to_false_as_onnxruntime():
    import inspect

    for cls in (onnxhal.ModelCompiler, ort.ModelCompiler):
        params = inspect.signature(cls).parameters
        assert params["embed_compiled_data_into_model"].default is False
        assert params["external_initializers_size_threshold"].default == 1024
    assert list(inspect.signature(onnxhal.ModelCompiler).parameters) == list(inspect.signature(ort.ModelCompiler).parameters)


# -- initializers outside the model ---------------------------------------------------------------
@pytest.mark.parametrize("threshold", [100, 1000, 5000])
def test_external_initializers_file_as_onnxruntime(model_path, tmp_path, threshold):
    layouts = {}
    for lib in (onnxhal, ort):
        folder = tmp_path / lib.__name__
        folder.mkdir()
        out = str(folder / "out.onnx")
        lib.ModelCompiler(lib.SessionOptions(), model_path, external_initializers_file_path="weights.bin",
                          external_initializers_size_threshold=threshold).compile_to_file(out)
        layouts[lib.__name__] = externals(out)
        data = (folder / "weights.bin").read_bytes() if (folder / "weights.bin").exists() else b""
        layouts[lib.__name__].append(data)
        np.testing.assert_allclose(run(lib, out), X @ W + B, rtol=1e-5)
    assert layouts["onnxhal"] == layouts["onnxruntime"]


def test_initializer_location_func_as_onnxruntime(model_path, tmp_path):
    calls = {}
    for lib in (onnxhal, ort):
        folder = tmp_path / lib.__name__
        folder.mkdir()
        seen = calls.setdefault(lib.__name__, set())

        def where(name, value, info, folder=folder, lib=lib, seen=seen):
            seen.add((name, tuple(value.shape()), value.tensor_size_in_bytes(), info))
            if value.tensor_size_in_bytes() < 1000:
                return None  # keep small ones in the model
            (folder / f"{name}.bin").write_bytes(value.numpy().tobytes())
            return lib.OrtExternalInitializerInfo(f"{name}.bin", 0, value.tensor_size_in_bytes())

        out = str(folder / "out.onnx")
        lib.ModelCompiler(lib.SessionOptions(), model_path, get_initializer_location_func=where).compile_to_file(out)
        assert sorted(externals(out), key=str) == sorted(
            [("w", 1, {"location": "w.bin", "offset": "0", "length": "2400"}), ("b", 0, {})], key=str)
        np.testing.assert_allclose(run(lib, out), X @ W + B, rtol=1e-5)
    assert calls["onnxhal"] == calls["onnxruntime"] == {("w", (20, 30), 2400, None), ("b", (30,), 120, None)}


def test_external_initializer_info_as_onnxruntime():
    for lib in (onnxhal, C):
        info = lib.OrtExternalInitializerInfo("a.bin", 5, 10)
        assert (info.filepath, info.file_offset, info.byte_size) == ("a.bin", 5, 10)


# -- EPContext data beside the model (the simulated NPU compiles) ----------------------------------
@pytest.fixture(scope="module")
def npu():
    with simulated_or_skip("generic-npu") as devices:
        yield devices["VirtualNpuExecutionProvider"]


def _contexts(model: onnx.ModelProto) -> list[dict]:
    return [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in model.graph.node
            if n.op_type == "EPContext"]


def test_not_embedded_data_goes_beside_the_model_and_loads_from_there(npu, tmp_path):
    out = tmp_path / "npu_ctx.onnx"
    onnxhal.ModelCompiler(options(npu), npu_model_bytes()).compile_to_file(str(out))
    contexts = _contexts(onnx.load(out))
    assert len(contexts) == 2 and {c["embed_mode"] for c in contexts} == {0}
    for c in contexts:
        name = c["ep_cache_context"].decode()
        assert name.startswith("npu_ctx_VirtualNpuExecutionProvider_") and (tmp_path / name).stat().st_size > 0
    loaded = onnxhal.InferenceSession(str(out), options(npu))
    assert loaded.eps["VirtualNpuExecutionProvider"].contexts_loaded == 2
    direct = options(npu)
    direct.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
    np.testing.assert_array_equal(loaded.run(None, {"x": NPU_X})[0],
                                  onnxhal.InferenceSession(npu_model_bytes(), direct).run(None, {"x": NPU_X})[0])
    with pytest.raises(errors.InvalidArgument, match="given as bytes.*set_ep_context_data_read_func"):
        onnxhal.InferenceSession(out.read_bytes(), options(npu))
    os.remove(tmp_path / contexts[0]["ep_cache_context"].decode())
    with pytest.raises(errors.NoSuchFile, match="does not exist"):
        onnxhal.InferenceSession(str(out), options(npu))


def test_bytes_output_needs_a_place_for_the_data(npu, tmp_path):
    compiler = onnxhal.ModelCompiler(options(npu), npu_model_bytes())
    with pytest.raises(errors.InvalidArgument, match="set_ep_context_binary_information"):
        compiler.compile_to_bytes()
    compiler.set_ep_context_binary_information(str(tmp_path / "bins"), "mymodel")
    data = compiler.compile_to_bytes()
    names = sorted(c["ep_cache_context"].decode() for c in _contexts(onnx.load_from_string(data)))
    assert names == sorted(os.listdir(tmp_path / "bins")) and all(n.startswith("mymodel_") for n in names)
    with pytest.raises(errors.InvalidArgument, match="non-empty"):
        compiler.set_ep_context_binary_information("", "m")


def test_write_and_read_callbacks_carry_the_data(npu):
    store: dict[str, bytes] = {}

    def write(name, data):
        store[name] = data.read(0, 4) + data.read(4)  # two chunks
        assert data.size == len(store[name])

    compiler = onnxhal.ModelCompiler(options(npu), npu_model_bytes())
    compiler.set_ep_context_data_write_func(write)
    data = compiler.compile_to_bytes()
    assert sorted(store) == sorted(c["ep_cache_context"].decode() for c in _contexts(onnx.load_from_string(data)))

    asked = []

    def read(name, buffer):
        asked.append(name)
        buffer.allocate(len(store[name]))
        buffer.write(store[name][:10])
        buffer.write(store[name][10:], 10)

    so = options(npu)
    so.set_ep_context_data_read_func(read, 1 << 24)
    loaded = onnxhal.InferenceSession(data, so)
    assert sorted(asked) == sorted(store) and loaded.eps["VirtualNpuExecutionProvider"].contexts_loaded == 2
    so.set_ep_context_data_read_func(read, 10)  # too small for the data
    with pytest.raises(errors.Fail, match="max_data_size 10"):
        onnxhal.InferenceSession(data, so)
    so.set_ep_context_data_read_func(lambda name, buffer: None, 1 << 24)
    with pytest.raises(errors.Fail, match="did not allocate"):
        onnxhal.InferenceSession(data, so)
    so.clear_ep_context_data_read_func()
    with pytest.raises(errors.InvalidArgument, match="given as bytes"):
        onnxhal.InferenceSession(data, so)
    compiler.clear_ep_context_data_write_func()
    with pytest.raises(errors.InvalidArgument, match="set_ep_context_data_write_func"):
        compiler.compile_to_bytes()


# -- EPContext nodes through the hal contract ------------------------------------------------------
SAVING_EP = '''
import numpy as np
from onnxhal import hal
from onnxhal.hal.ep_context import ep_context_node


class _Add(hal.NodeComputeInfo):
    def __init__(self, graph):
        self.consts = dict(graph.initializers)
        self.inputs = graph.input_names
        self.nodes = [(list(n.inputs), n.outputs[0]) for n in graph.nodes]

    def compute(self, state, ctx):
        env = dict(self.consts)
        env.update(zip(self.inputs, ctx.inputs))
        for ins, out in self.nodes:
            env[out] = env[ins[0]] + env[ins[1]]
        return [env[out]]


class SavingEp(hal.Ep):
    name = "SavingExecutionProvider"

    def get_capability(self, graph, support_info):
        adds = [n for n in graph.nodes if n.op_type == "Add"]
        for group in support_info.convex_groups(adds):
            support_info.add_nodes_to_fuse(group)

    def compile(self, graphs, fused_nodes, ep_context_nodes=None):
        if ep_context_nodes is not None:
            for k, (g, node) in enumerate(zip(graphs, fused_nodes)):
                blob = ";".join(n.op_type for n in g.nodes).encode()
                ep_context_nodes[k] = ep_context_node(node, blob, self.name, "toy-arch", "saving/1")
        return [_Add(g) for g in graphs]


class SavingFactory(hal.EpFactory):
    name = "SavingExecutionProvider"
    vendor = "Toy"

    def __init__(self, api):
        self.api = api
        self.hw = api.create_hardware_device(hal.OrtHardwareDeviceType.NPU, 0x7071, 0, "Toy", {})

    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, self.hw)]

    def create_ep(self, devices, ep_metadata, session_options, logger):
        return SavingEp()


def create_ep_factories(registration_name, api, logger):
    return [SavingFactory(api)]


def release_ep_factory(factory):
    pass
'''


def _add_add_model() -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["a"], name="add1"),
                           helper.make_node("Relu", ["a"], ["r"], name="relu"),
                           helper.make_node("Add", ["r", "x"], ["y"], name="add2")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 20])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def test_an_eps_compile_returns_the_epcontext_nodes_the_compiled_model_holds(register, plugin_file):
    register(plugin_file(SAVING_EP, "saving_ep"))
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "SavingExecutionProvider"], {})
    model = onnx.load_from_string(onnxhal.ModelCompiler(so, _add_add_model(), embed_compiled_data_into_model=True)
                                  .compile_to_bytes())
    contexts = [n for n in model.graph.node if n.op_type == "EPContext"]
    assert [n.op_type for n in model.graph.node] == ["EPContext", "Relu", "EPContext"]
    attrs = [{a.name: helper.get_attribute_value(a) for a in n.attribute} for n in contexts]
    assert [a["ep_cache_context"] for a in attrs] == [b"Add", b"Add"]
    assert {(a["source"], a["hardware_architecture"], a["notes"], a["embed_mode"]) for a in attrs} == {
        (b"SavingExecutionProvider", b"toy-arch", b"saving/1", 1)}


def test_an_ep_without_the_ep_context_nodes_parameter_keeps_its_nodes(register):
    from tests.conftest import PLUGINS

    register(os.path.join(PLUGINS, "toy_fusing_ep.py"), "toy_fusing")
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([next(d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyA")], {"ops": "Add"})
    model = onnx.load_from_string(onnxhal.ModelCompiler(so, _add_add_model()).compile_to_bytes())
    assert [n.op_type for n in model.graph.node] == ["Add", "Relu", "Add"]
    with pytest.raises(errors.Fail, match="Unable to compile any nodes"):
        onnxhal.ModelCompiler(so, _add_add_model(), flags=onnxhal.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED
                              ).compile_to_bytes()
