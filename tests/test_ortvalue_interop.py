"""OrtValue and memory, side by side with onnxruntime: numpy's ``__array__``, DLPack both ways,
OrtDevice and OrtDeviceVendorId, OrtMemoryInfo's legacy names, OrtArenaCfg, environment allocators,
``run_with_ortvaluevector`` / OrtValueVector and ``create_ortvalue_from_shape_and_type``."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal
from onnxhal import errors
from onnxhal.runtime.env.shared_memory import registered_allocator, shared_allocator, unregister_shared_allocator
from tests.models import make, vi

ort = pytest.importorskip("onnxruntime")
C = pytest.importorskip("onnxruntime.capi._pybind_state")

DEFAULT = onnxhal.OrtDeviceMemoryType.DEFAULT


def relu_neg_model():
    """y = Relu(x), z = -x on [2] floats."""
    return make([helper.make_node("Relu", ["x"], ["y"], name="r"), helper.make_node("Neg", ["x"], ["z"], name="n")],
                [vi("x", [2])], [vi("y", [2]), vi("z", [2])])


@pytest.fixture(scope="module")
def sessions():
    data = relu_neg_model().SerializeToString()
    return onnxhal.InferenceSession(data), ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def both_values(arr: np.ndarray):
    return onnxhal.OrtValue.ortvalue_from_numpy(arr), ort.OrtValue.ortvalue_from_numpy(arr)


# -- numpy's __array__ ---------------------------------------------------------------------------
def test_asarray_gives_the_data_without_a_copy_as_onnxruntime():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    for v in both_values(arr):
        a = np.asarray(v)
        assert a.dtype == np.float32 and a.shape == (2, 3) and np.shares_memory(a, arr)
        np.testing.assert_array_equal(a, arr)
        cast = np.asarray(v, dtype=np.float64)
        assert cast.dtype == np.float64 and not np.shares_memory(cast, arr)
        assert not np.shares_memory(np.array(v, copy=True), arr)
        assert np.shares_memory(np.asarray(v, dtype=np.float32), arr)


def test_asarray_of_int_and_bool_values_matches_onnxruntime():
    for arr in (np.array([[1, -2]], np.int64), np.array([True, False])):
        hal, ref = both_values(arr)
        np.testing.assert_array_equal(np.asarray(hal), np.asarray(ref))
        assert np.asarray(hal).dtype == np.asarray(ref).dtype


# -- DLPack --------------------------------------------------------------------------------------
def test_numpy_from_dlpack_shares_the_ortvalues_memory_as_onnxruntime():
    arr = np.arange(4, dtype=np.float32)
    for v in both_values(arr):
        assert v.__dlpack_device__() == (1, 0)
        shared = np.from_dlpack(v)
        np.testing.assert_array_equal(shared, arr)
        arr[0] = 42.0
        assert shared[0] == 42.0
        arr[0] = 0.0


@pytest.mark.parametrize("arr", [np.arange(6, dtype=np.int64).reshape(2, 3), np.array([True, False, True]),
                                 np.linspace(0, 1, 5, dtype=np.float16)], ids=["int64", "bool", "float16"])
def test_from_dlpack_wraps_a_host_tensor_without_a_copy_as_onnxruntime(arr):
    hal, ref = onnxhal.OrtValue.from_dlpack(arr), ort.OrtValue.from_dlpack(arr)
    assert hal.data_type() == ref.data_type() and hal.shape() == ref.shape() == list(arr.shape)
    assert hal.device_name() == ref.device_name() == "cpu"
    np.testing.assert_array_equal(hal.numpy(), ref.numpy())
    assert hal.data_ptr() == ref.data_ptr() == arr.ctypes.data  # both share the source's memory


def test_a_capsule_round_trips_as_onnxruntime():
    arr = np.arange(3, dtype=np.int32)
    hal, ref = both_values(arr)
    back_hal = onnxhal.OrtValue.from_dlpack(hal.to_dlpack())
    back_ref = ort.OrtValue.from_dlpack(ref._get_c_value().to_dlpack())
    np.testing.assert_array_equal(back_hal.numpy(), back_ref.numpy())
    assert back_hal.data_ptr() == back_ref.data_ptr() == arr.ctypes.data
    # onnxhal's OrtValueVector hands out capsules as onnxruntime's does
    vec = onnxhal.OrtValueVector()
    vec.push_back(hal._ortvalue)
    ref_vec = C.OrtValueVector()
    ref_vec.push_back(ref._ortvalue)
    assert vec.element_type_at(0) == ref_vec.element_type_at(0) == TensorProto.INT32
    assert [np.from_dlpack(_capsule_holder(c)).tolist() for c in vec.to_dlpacks()] == \
        [np.from_dlpack(_capsule_holder(c)).tolist() for c in ref_vec.to_dlpacks(None)]


def _capsule_holder(capsule):
    class Holder:
        def __dlpack__(self, **_):
            return capsule

        def __dlpack_device__(self):
            return (1, 0)
    return Holder()


def test_from_dlpack_errors_as_onnxruntime():
    for cls in (onnxhal.OrtValue, ort.OrtValue):
        with pytest.raises(TypeError, match="valid DLPack capsule named 'dltensor'"):
            cls.from_dlpack(3)
        with pytest.raises(RuntimeError, match="ORT only supports contiguous tensor"):
            cls.from_dlpack(np.arange(6).reshape(2, 3)[:, ::2])


def test_dlpack_of_a_string_tensor_names_the_remedy():
    # onnxruntime cannot even make this OrtValue ("only supported from non-string numpy arrays").
    with pytest.raises(RuntimeError, match="non-string"):
        ort.OrtValue.ortvalue_from_numpy(np.array(["a", "bc"], dtype=object))
    v = onnxhal.OrtValue.ortvalue_from_numpy(np.array(["a", "bc"], dtype=object))
    with pytest.raises(errors.InvalidArgument, match="no string type.*numpy"):
        v.__dlpack__()


def test_device_memory_is_refused_with_the_remedy(opencl_devices):
    mem = opencl_devices[0].memory_info(DEFAULT)
    v = onnxhal.OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info=mem)
    v.update_inplace(np.array([1, 2], np.float32))
    with pytest.raises(errors.InvalidArgument, match="device memory.*Copy it to the host"):
        v.__dlpack__()
    with pytest.raises(errors.InvalidArgument, match="device memory"):
        np.from_dlpack(v)
    np.testing.assert_array_equal(np.asarray(v), [1, 2])  # __array__ copies out, as numpy() does


# -- OrtDevice, OrtDeviceVendorId, OrtMemoryInfo ---------------------------------------------------
def test_ort_device_vendor_ids_are_onnxruntimes():
    assert {m.name: int(m) for m in onnxhal.OrtDeviceVendorId} == {m.name: int(m) for m in ort.OrtDeviceVendorId}


@pytest.mark.parametrize("name, vendor", [("cpu", -1), ("gpu", -1), ("npu", -1), ("cuda", -1), ("dml", -1),
                                          ("cann", -1), ("webgpu", -1), ("gpu", 0x1002), ("npu", 0x8086),
                                          ("cuda", 0x1234)])
def test_ort_device_make_matches_onnxruntime(name, vendor):
    for device_id in (0, 1):
        hal = onnxhal.OrtDevice.make(name, device_id, vendor)
        ref = ort.OrtDevice.make(name, device_id, vendor)
        assert (hal.device_type(), hal.device_id(), hal.device_vendor_id(), hal.device_mem_type()) == \
            (ref.device_type(), ref.device_id(), ref.device_vendor_id(), ref.device_mem_type())


def test_ort_device_type_numbers_and_errors_match_onnxruntime():
    for name in ("cpu", "gpu", "fpga", "npu", "cuda", "dml", "cann", "webgpu", "default_memory"):
        assert getattr(onnxhal.OrtDevice, name)() == getattr(C.OrtDevice, name)()
    for make_ in (onnxhal.OrtDevice.make, ort.OrtDevice.make):
        with pytest.raises(Exception, match="Unsupported device type"):
            make_("tpu", 0)
    assert onnxhal.OrtDevice.make("cpu", 0).memory_device.is_host
    assert not onnxhal.OrtDevice.make("cpu", 0, 0x1022).memory_device.is_host  # a device memory on the CPU


@pytest.mark.parametrize("name", ["Cpu", "Cuda", "CudaPinned", "OpenVINO_GPU"])
def test_legacy_memory_info_names_match_onnxruntime(name):
    args = (onnxhal.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, onnxhal.OrtMemType.DEFAULT)
    ref_args = (ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    hal, ref = onnxhal.OrtMemoryInfo(name, *args), ort.OrtMemoryInfo(name, *ref_args)
    for attr in ("name", "device_id", "mem_type", "allocator_type", "device_mem_type", "device_vendor_id"):
        assert int(getattr(hal, attr)) == int(getattr(ref, attr)) if attr != "name" else hal.name == ref.name, attr


def test_cuda_pinned_memory_is_the_gpus_host_accessible_memory():
    pinned = onnxhal.OrtMemoryInfo("CudaPinned", onnxhal.OrtAllocatorType.ORT_DEVICE_ALLOCATOR, 0,
                                   onnxhal.OrtMemType.DEFAULT)
    cuda = onnxhal.OrtMemoryInfo("Cuda", onnxhal.OrtAllocatorType.ORT_DEVICE_ALLOCATOR, 0, onnxhal.OrtMemType.DEFAULT)
    assert pinned.device_mem_type == onnxhal.OrtDeviceMemoryType.HOST_ACCESSIBLE
    assert pinned.device_type == onnxhal.OrtMemoryInfoDeviceType.GPU and pinned.device_vendor_id == 0x10DE
    assert pinned.memory_device != cuda.memory_device and not pinned.is_host


# -- OrtArenaCfg and environment allocators -------------------------------------------------------
ARENA_KEYS = ("arena_extend_strategy", "initial_chunk_size_bytes", "initial_growth_chunk_size_bytes",
              "max_dead_bytes_per_chunk", "max_mem", "max_power_of_two_extend_bytes")


@pytest.mark.parametrize("args", [(0, -1, -1, -1), (1 << 20, 1, 256, 128),
                                  ({"max_mem": 1024, "arena_extend_strategy": 1},),
                                  ({"initial_growth_chunk_size_bytes": 5, "max_power_of_two_extend_bytes": 7},)])
def test_arena_cfg_matches_onnxruntime(args):
    hal, ref = onnxhal.OrtArenaCfg(*args), ort.OrtArenaCfg(*args)
    assert {k: getattr(hal, k) for k in ARENA_KEYS} == {k: getattr(ref, k) for k in ARENA_KEYS}
    hal.max_mem = ref.max_mem = 77
    assert hal.max_mem == ref.max_mem == 77


def test_arena_cfg_errors_as_onnxruntime():
    for cls in (onnxhal.OrtArenaCfg, ort.OrtArenaCfg):
        with pytest.raises(RuntimeError, match="Invalid OrtArenaCfg option: foo"):
            cls({"foo": 1})
        with pytest.raises(TypeError):
            cls()
    with pytest.raises(errors.InvalidArgument, match="max_mem"):
        onnxhal.OrtArenaCfg({"max_mem": -5})  # onnxruntime: an "Unable to cast" RuntimeError


def _cpu_info(alloc_type):
    return onnxhal.OrtMemoryInfo("Cpu", alloc_type, 0, onnxhal.OrtMemType.DEFAULT)


def test_create_and_register_allocator_as_onnxruntime():
    cfg, ref_cfg = onnxhal.OrtArenaCfg(0, -1, -1, -1), ort.OrtArenaCfg(0, -1, -1, -1)
    cuda = onnxhal.OrtMemoryInfo("Cuda", onnxhal.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, onnxhal.OrtMemType.DEFAULT)
    ref_cuda = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        ort.create_and_register_allocator(ref_cuda, ref_cfg)
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        onnxhal.create_and_register_allocator(cuda, cfg)
    ref_cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    cpu = _cpu_info(onnxhal.OrtAllocatorType.ORT_ARENA_ALLOCATOR)
    for _ in range(2):  # registering again replaces the allocator, in both
        ort.create_and_register_allocator(ref_cpu, ref_cfg)
        onnxhal.create_and_register_allocator(cpu, cfg)
    assert isinstance(registered_allocator(cpu.memory_device), onnxhal.hal.ArenaAllocator)
    ort.create_and_register_allocator_v2("CPUExecutionProvider", ref_cpu, {}, ref_cfg)
    onnxhal.create_and_register_allocator_v2("CPUExecutionProvider", cpu, {}, cfg)
    for fn, info, c in ((ort.create_and_register_allocator_v2, ref_cpu, ref_cfg),
                        (onnxhal.create_and_register_allocator_v2, cpu, cfg)):
        with pytest.raises(RuntimeError, match="FooExecutionProvider is not implemented in CreateAndRegisterAllocatorV2"):
            fn("FooExecutionProvider", info, {}, c)
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        ort.create_and_register_allocator_v2("CPUExecutionProvider", ref_cuda, {}, ref_cfg)
    with pytest.raises(RuntimeError, match="Only CPU devices are supported"):
        onnxhal.create_and_register_allocator_v2("CPUExecutionProvider", cuda, {}, cfg)


@pytest.fixture
def forget_registered(opencl_devices):
    """The environment keeps a registered allocator for the process: forget it after the test, so
    later tests get the factory's own shared allocator again."""
    dev = opencl_devices[0].memory_info(DEFAULT).memory_device
    yield
    unregister_shared_allocator(dev)
    assert registered_allocator(dev) is None


def test_a_registered_device_allocator_serves_ortvalues_and_sessions_that_ask(opencl_devices, forget_registered):
    declared = opencl_devices[0].memory_info(DEFAULT)
    arena_info = onnxhal.OrtMemoryInfo.create_v2(declared.name, declared.device_type, declared.device_vendor_id,
                                                 declared.device_id, DEFAULT, 0,
                                                 onnxhal.OrtAllocatorType.ORT_ARENA_ALLOCATOR)
    onnxhal.create_and_register_allocator_v2("OpenCLExecutionProvider", arena_info, {},
                                             onnxhal.OrtArenaCfg({"max_mem": 1 << 20, "arena_extend_strategy": 1}))
    arena = registered_allocator(declared.memory_device)
    assert isinstance(arena, onnxhal.hal.ArenaAllocator) and arena.arena_limit == 1 << 20
    assert shared_allocator(declared) is arena
    before = arena.stats()["InUse"]
    v = onnxhal.OrtValue.ortvalue_from_shape_and_type([4], np.float32, memory_info=declared)
    assert arena.stats()["InUse"] == before + 16  # kSameAsRequested: exactly the bytes asked for
    del v
    with pytest.raises(errors.OutOfMemory, match="arena limit"):
        onnxhal.OrtValue.ortvalue_from_shape_and_type([1 << 20], np.float32, memory_info=declared)

    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(opencl_devices[:1], {})
    so.add_session_config_entry("session.use_env_allocators", "1")
    model = make([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    with_env = onnxhal.InferenceSession(model.SerializeToString(), so)
    assert with_env.memory.allocator(declared.memory_device) is arena
    so2 = onnxhal.SessionOptions()
    so2.add_provider_for_devices(opencl_devices[:1], {})
    without = onnxhal.InferenceSession(model.SerializeToString(), so2)
    assert without.memory.allocator(declared.memory_device) is not arena
    with pytest.raises(RuntimeError, match="declares no memory"):
        onnxhal.create_and_register_allocator_v2("OpenCLExecutionProvider", _cpu_info(
            onnxhal.OrtAllocatorType.ORT_DEVICE_ALLOCATOR), {}, None)


# -- run_with_ortvaluevector and OrtValueVector ---------------------------------------------------
X = np.array([-1, 2], np.float32)


def test_run_with_ortvaluevector_appends_the_outputs_as_onnxruntime(sessions):
    hal, ref = sessions
    feeds, ref_feeds = onnxhal.OrtValueVector(), C.OrtValueVector()
    feeds.push_back(onnxhal.OrtValue.ortvalue_from_numpy(X)._ortvalue)
    ref_feeds.push_back(ort.OrtValue.ortvalue_from_numpy(X)._ortvalue)
    fetches, ref_fetches = onnxhal.OrtValueVector(), C.OrtValueVector()
    cpu, ref_cpu = onnxhal.OrtDevice.make("cpu", 0), C.OrtDevice(0, 0, 0)
    hal.run_with_ortvaluevector(onnxhal.RunOptions(), ["x"], feeds, ["z", "y"], fetches, [cpu, cpu])
    ref.run_with_ortvaluevector(ort.RunOptions(), ["x"], ref_feeds, ["z", "y"], ref_fetches, [ref_cpu, ref_cpu])
    assert len(fetches) == len(ref_fetches) == 2
    for a, b in zip(fetches, ref_fetches):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    np.testing.assert_array_equal(fetches[0].numpy(), -X)


def test_run_with_ortvaluevector_writes_into_given_outputs_as_onnxruntime(sessions):
    hal, ref = sessions
    out, ref_out = both_values(np.zeros(2, np.float32))
    fetches, ref_fetches = onnxhal.OrtValueVector([out]), C.OrtValueVector()
    ref_fetches.push_back(ref_out._ortvalue)
    feeds, ref_feeds = [onnxhal.OrtValue.ortvalue_from_numpy(X)], C.OrtValueVector()
    ref_feeds.push_back(ort.OrtValue.ortvalue_from_numpy(X)._ortvalue)
    hal.run_with_ortvaluevector(onnxhal.RunOptions(), ["x"], feeds, ["y"], fetches, [onnxhal.OrtDevice.make("cpu", 0)])
    ref.run_with_ortvaluevector(ort.RunOptions(), ["x"], ref_feeds, ["y"], ref_fetches, [C.OrtDevice(0, 0, 0)])
    assert len(fetches) == len(ref_fetches) == 1
    np.testing.assert_array_equal(out.numpy(), ref_out.numpy())
    np.testing.assert_array_equal(out.numpy(), [0, 2])


@pytest.mark.parametrize("case, message", [
    ("bad input", "Invalid input name: '?q"),
    ("bad output", "Invalid output name"),
    ("wrong type", "expects float32 \\[2\\], got int64|Actual: \\(tensor\\(int64\\)\\) , expected: \\(tensor\\(float\\)\\)"),
    ("missing feed", "feed names has 1 elements, but feed has 0 elements."),
    ("no outputs", "At least one output should be requested."),
    ("short fetches", "fetch names has 2 elements, but fetch has 1 elements."),
])
def test_run_with_ortvaluevector_errors_as_onnxruntime(sessions, case, message):
    hal, ref = sessions
    for lib, sess, vector, device in ((onnxhal, hal, onnxhal.OrtValueVector, onnxhal.OrtDevice.make("cpu", 0)),
                                      (ort, ref, C.OrtValueVector, C.OrtDevice(0, 0, 0))):
        x = lib.OrtValue.ortvalue_from_numpy(X)._ortvalue
        xi = lib.OrtValue.ortvalue_from_numpy(X.astype(np.int64))._ortvalue
        feeds, fetches = vector(), vector()
        feed_names, fetch_names = ["x"], ["y"]
        if case == "bad input":
            feed_names = ["q"]
        if case == "bad output":
            fetch_names = ["q"]
        if case == "no outputs":
            fetch_names = []
        if case == "short fetches":
            fetch_names = ["y", "z"]
            fetches.push_back(lib.OrtValue.ortvalue_from_numpy(np.zeros(2, np.float32))._ortvalue)
        if case != "missing feed":
            feeds.push_back(xi if case == "wrong type" else x)
        devices = [device] * len(fetch_names)
        with pytest.raises(Exception, match=message) as info:
            sess.run_with_ortvaluevector(lib.RunOptions(), feed_names, feeds, fetch_names, fetches, devices)
        if lib is onnxhal:
            assert isinstance(info.value, errors.InvalidArgument)
        else:
            assert type(info.value).__name__ == "InvalidArgument"


def test_run_with_ortvaluevector_refuses_missing_fetch_devices(sessions):
    hal, _ = sessions  # onnxruntime aborts the process here (reads past the end of fetch_devices)
    with pytest.raises(errors.InvalidArgument, match="one OrtDevice per output"):
        hal.run_with_ortvaluevector(None, ["x"], [onnxhal.OrtValue.ortvalue_from_numpy(X)], ["y"], [], [])


# -- InferenceSession.create_ortvalue_from_shape_and_type -----------------------------------------
@pytest.mark.parametrize("element_type", [np.float32, np.int64, TensorProto.FLOAT16, TensorProto.INT8])
def test_session_ortvalue_on_the_host_matches_onnxruntime(sessions, element_type):
    hal, ref = sessions
    a = hal.create_ortvalue_from_shape_and_type([2, 3], element_type, "cpu")
    b = ref.create_ortvalue_from_shape_and_type([2, 3], element_type, "cpu")
    assert (a.shape(), a.device_name(), a.data_type(), a.element_type()) == \
        (b.shape(), b.device_name(), b.data_type(), b.element_type())


@pytest.mark.parametrize("args, exc, message", [
    (([2], np.float32, "cuda"), RuntimeError, "No session allocator found"),
    (([2], np.float32, "gpu", 0, 0x1002), RuntimeError, "No session allocator found"),
    (([2], object, "cpu"), RuntimeError, "only supported for numeric tensor types"),
    (([-1], np.float32, "cpu"), RuntimeError, "shape.Size\\(\\) must be >= 0"),
    (([2], np.float32, "foo"), Exception, "Unsupported device type"),
])
def test_session_ortvalue_errors_as_onnxruntime(sessions, args, exc, message):
    for sess in sessions:
        with pytest.raises(exc, match=message):
            sess.create_ortvalue_from_shape_and_type(*args)


def test_session_ortvalue_in_device_memory_comes_from_the_sessions_allocator(opencl_devices):
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(opencl_devices[:1], {})
    model = make([helper.make_node("Identity", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    sess = onnxhal.InferenceSession(model.SerializeToString(), so)
    info = opencl_devices[0].memory_info(DEFAULT)
    alloc = sess.memory.allocator(info.memory_device)
    before = alloc.stats()["NumAllocs"]
    v = sess.create_ortvalue_from_shape_and_type([2, 2], np.float32, "cpu", 0, info.device_vendor_id)
    assert v.device_name() == info.name.lower() and v.shape() == [2, 2]
    assert alloc.stats()["NumAllocs"] == before + 1
    v.update_inplace(np.eye(2, dtype=np.float32))
    np.testing.assert_array_equal(np.asarray(v), np.eye(2))


# -- SparseTensor and OrtSparseFormat --------------------------------------------------------------
VALUES = np.array([1.0, 2.0, 3.0], np.float32)


def test_sparse_format_members_are_onnxruntimes():
    assert [(m.name, int(m), str(m)) for m in onnxhal.OrtSparseFormat] == \
        [(k, int(v), str(v)) for k, v in C.OrtSparseFormat.__members__.items()]


@pytest.mark.parametrize("indices", [np.array([1, 5, 7], np.int64), np.array([[0, 1], [1, 1], [1, 3]], np.int64)],
                         ids=["flat", "coordinates"])
def test_coo_sparse_tensor_as_onnxruntime(indices):
    ours = onnxhal.SparseTensor.sparse_coo_from_numpy([2, 4], VALUES, indices, onnxhal.OrtDevice.make("cpu", 0))
    theirs = ort.SparseTensor.sparse_coo_from_numpy([2, 4], VALUES, indices, ort.OrtDevice.make("cpu", 0))
    assert str(ours.format()) == str(theirs.format()) and ours.dense_shape() == theirs.dense_shape() == [2, 4]
    assert ours.data_type() == theirs.data_type() == "sparse_tensor(float)"
    assert ours.device_name() == theirs.device_name() == "cpu"
    np.testing.assert_array_equal(ours.values(), theirs.values())
    np.testing.assert_array_equal(ours.as_coo_view().indices(), theirs.as_coo_view().indices())
    assert np.shares_memory(ours.values(), VALUES) and np.shares_memory(theirs.values(), VALUES)  # no copy
    np.testing.assert_array_equal(ours.to_dense(), [[0, 1, 0, 0], [0, 2, 0, 3]])
    for st in (ours, theirs):
        with pytest.raises(RuntimeError, match="does not contain"):
            st.as_csrc_view()
    hal_value, ref_value = (onnxhal.OrtValue.ort_value_from_sparse_tensor(ours),
                            ort.OrtValue.ort_value_from_sparse_tensor(theirs))
    for v in (hal_value, ref_value):
        assert v.is_sparse_tensor() and not v.is_tensor() and v.data_type() == "sparse_tensor(float)"
        assert v.shape() == [2, 4] and v.element_type() == TensorProto.FLOAT
        with pytest.raises(RuntimeError):
            v.numpy()
    np.testing.assert_array_equal(hal_value.as_sparse_tensor().values(), ref_value.as_sparse_tensor().values())
    for lib in (onnxhal, ort):
        with pytest.raises(RuntimeError, match="does not contain SparseTensor"):
            lib.OrtValue.ortvalue_from_numpy(VALUES).as_sparse_tensor()


def test_csr_sparse_tensor_as_onnxruntime():
    args = ([2, 4], VALUES, np.array([1, 1, 3], np.int64), np.array([0, 1, 3], np.int64))
    ours = onnxhal.SparseTensor.sparse_csr_from_numpy(*args, onnxhal.OrtDevice.make("cpu", 0))
    theirs = ort.SparseTensor.sparse_csr_from_numpy(*args, ort.OrtDevice.make("cpu", 0))
    assert str(ours.format()) == str(theirs.format()) == "OrtSparseFormat.ORT_SPARSE_CSRC"
    np.testing.assert_array_equal(ours.as_csrc_view().inner(), theirs.as_csrc_view().inner())
    np.testing.assert_array_equal(ours.as_csrc_view().outer(), theirs.as_csrc_view().outer())
    np.testing.assert_array_equal(ours.to_dense(), [[0, 1, 0, 0], [0, 2, 0, 3]])
    for st in (ours, theirs):
        with pytest.raises(RuntimeError, match="does not contain"):
            st.as_coo_view()


@pytest.mark.parametrize("make_, args, message", [
    ("coo", ([2, 4], VALUES, np.array([1, 5], np.int64)), "Index size: 2 must be equal to or twice the values size: 3"),
    ("coo", ([2, 4], VALUES, np.array([[0, 1], [1, 1]], np.int64)), "Index size: 4 must be equal to or twice"),
    ("csr", ([2, 4], VALUES, np.array([0, 1, 3], np.int64), np.array([0, 1], np.int64)),
     "Outer index count must be rows \\+ 1 or zero. Got: 2 rows: 2"),
    ("csr", ([2, 4, 1], VALUES, np.array([1, 1, 3], np.int64), np.array([0, 1, 3], np.int64)),
     "dense shape must 2-D. Got: 3"),
    ("csr", ([2, 4], VALUES, np.array([1, 1], np.int64), np.array([0, 1, 3], np.int64)),
     "Expecting inner index size: 2 the same as values size: 3"),
])
def test_sparse_tensor_errors_as_onnxruntime(make_, args, message):
    for lib in (onnxhal, ort):
        fn = lib.SparseTensor.sparse_coo_from_numpy if make_ == "coo" else lib.SparseTensor.sparse_csr_from_numpy
        with pytest.raises(RuntimeError, match=message):
            fn(*args, lib.OrtDevice.make("cpu", 0))
    for lib in (onnxhal, ort):
        with pytest.raises(RuntimeError, match="Unsupported OrtDevice type"):
            lib.SparseTensor.sparse_coo_from_numpy([2, 4], VALUES, np.array([1, 5, 7]), lib.OrtDevice.make("cuda", 0))


def test_update_inplace_from_another_ortvalue_as_onnxruntime():
    for lib in (onnxhal, ort):
        dst = lib.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32))
        address = dst.data_ptr()
        dst.update_inplace(lib.OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.float32)))
        assert dst.numpy().tolist() == [0, 1, 2] and dst.data_ptr() == address
        with pytest.raises(TypeError, match="data must be a numpy.ndarray or an OrtValue"):
            dst.update_inplace([1, 2, 3])
        with pytest.raises(RuntimeError, match="The input size of numpy arrays does not match the size of the OrtValue"):
            dst.update_inplace(np.zeros(4, np.float32))


def test_update_inplace_of_a_scalar_as_onnxruntime():
    for lib in (onnxhal, ort):
        dst = lib.OrtValue.ortvalue_from_numpy(np.array(3.0, np.float32))
        dst.update_inplace(np.array(4.0, np.float32))  # a 0-d array stays 0-d
        assert dst.numpy().shape == () and float(dst.numpy()) == 4.0


def test_update_inplace_between_device_and_host_values(opencl_devices):
    mem = opencl_devices[0].memory_info(DEFAULT)
    device = onnxhal.OrtValue.ortvalue_from_shape_and_type([3], np.float32, memory_info=mem)
    device.update_inplace(onnxhal.OrtValue.ortvalue_from_numpy(np.arange(3, dtype=np.float32)))
    host = onnxhal.OrtValue.ortvalue_from_numpy(np.zeros(3, np.float32))
    host.update_inplace(device)
    assert host.numpy().tolist() == [0, 1, 2]


def test_memory_info_makes_the_device_arguments_ignored_with_a_warning(opencl_devices):
    mem = opencl_devices[0].memory_info(DEFAULT)
    with pytest.warns(UserWarning, match="device_type, device_id, and vendor_id are ignored when memory_info is provided"):
        v = onnxhal.OrtValue.ortvalue_from_shape_and_type([2], np.float32, "cuda", memory_info=mem)
    assert v.device_name() == mem.name.lower()
