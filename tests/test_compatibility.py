"""Compiled models and devices, side by side with onnxruntime: get_model_compatibility_for_ep_devices,
get_compatibility_info_from_model(_bytes), get_hardware_device_ep_incompatibility_details, the
OrtCompiledModelCompatibility / OrtDeviceEpIncompatibilityReason enums, and a factory's verdict
deciding at session creation."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

import onnxhal
from onnxhal import errors
from tests.models import make, vi

ort = pytest.importorskip("onnxruntime")
C = pytest.importorskip("onnxruntime.capi._pybind_state")

# A factory that accepts "ok", asks for recompilation on "old" and refuses the rest, and says the
# CPU is DRIVER_INCOMPATIBLE with an error code: what a real EP's hooks would answer.
JUDGE_EP = '''
from onnxhal import hal

class JudgeEp(hal.Ep):
    name = "JudgeExecutionProvider"

class JudgeFactory(hal.EpFactory):
    name = "JudgeExecutionProvider"; vendor = "Judge"; version = "1.0.0"
    def __init__(self, api):
        self.api = api
        self.asked = []
    def get_supported_devices(self, hardware_devices):
        return [self.api.create_ep_device(self, d) for d in hardware_devices
                if d.type == hal.OrtHardwareDeviceType.CPU]
    def create_ep(self, devices, ep_metadata, session_options, logger):
        return JudgeEp()
    def validate_compiled_model_compatibility_info(self, devices, info):
        self.asked.append((len(devices), info))
        C = hal.OrtCompiledModelCompatibility
        return {"ok": C.EP_SUPPORTED_OPTIMAL, "old": C.EP_SUPPORTED_PREFER_RECOMPILATION}.get(info, C.EP_UNSUPPORTED)
    def get_hardware_device_incompatibility_details(self, device):
        R = hal.OrtDeviceEpIncompatibilityReason
        return int(R.DRIVER_INCOMPATIBLE | R.MISSING_DEPENDENCY), "needs driver 2.0", 17

def create_ep_factories(registration_name, api, logger):
    return [JudgeFactory(api)]

def release_ep_factory(factory):
    pass
'''


@pytest.fixture
def judge(register, plugin_file):
    register(plugin_file(JUDGE_EP, "judge_ep"))
    return [d for d in onnxhal.get_ep_devices() if d.ep_name == "JudgeExecutionProvider"]


def compiled_model(**props) -> onnx.ModelProto:
    model = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])])
    helper.set_model_props(model, {"other": "x", **props})
    return model


def test_enum_members_are_onnxruntimes():
    for name in ("OrtCompiledModelCompatibility", "OrtDeviceEpIncompatibilityReason"):
        ours, theirs = getattr(onnxhal, name), getattr(C, name)
        assert [(m.name, int(m)) for m in ours] == [(k, int(v)) for k, v in theirs.__members__.items()], name
        for m in ours:
            assert str(m) == str(getattr(theirs, m.name))


def test_old_member_names_are_aliases():
    C_ = onnxhal.OrtCompiledModelCompatibility
    assert C_.OPTIMAL is C_.EP_SUPPORTED_OPTIMAL and C_.UNSUPPORTED is C_.EP_UNSUPPORTED
    assert C_.NOT_APPLICABLE is C_.EP_NOT_APPLICABLE
    assert C_.PREFER_RECOMPILATION is C_.EP_SUPPORTED_PREFER_RECOMPILATION
    assert len(list(C_)) == 4


@pytest.mark.parametrize("info", ["abc", "", "ok"])
def test_the_cpu_ep_finds_any_info_not_applicable_as_onnxruntime(info):
    ours = onnxhal.get_model_compatibility_for_ep_devices(onnxhal.get_ep_devices()[:1], info)
    theirs = C.get_model_compatibility_for_ep_devices(C.get_ep_devices()[:1], info)
    assert ours.name == theirs.name == "EP_NOT_APPLICABLE" and int(ours) == int(theirs)


def test_model_compatibility_errors_as_onnxruntime(judge):
    for get, devices in ((onnxhal.get_model_compatibility_for_ep_devices, onnxhal.get_ep_devices()),
                         (C.get_model_compatibility_for_ep_devices, C.get_ep_devices())):
        with pytest.raises(RuntimeError, match="Invalid argument provided to GetModelCompatibilityForEpDevices"):
            get([], "abc")
        with pytest.raises(TypeError):
            get(devices, None)
        with pytest.raises(TypeError):
            get([1], "abc")
    with pytest.raises(RuntimeError, match="different EPs"):  # onnxruntime: needs two EPs, which it lacks here
        onnxhal.get_model_compatibility_for_ep_devices([onnxhal.get_ep_devices()[0], judge[0]], "ok")


def test_the_factory_gives_the_verdict(judge):
    factory = judge[0].factory
    V = onnxhal.OrtCompiledModelCompatibility
    assert onnxhal.get_model_compatibility_for_ep_devices(judge, "ok") is V.EP_SUPPORTED_OPTIMAL
    assert onnxhal.get_model_compatibility_for_ep_devices(judge * 2, "old") is V.EP_SUPPORTED_PREFER_RECOMPILATION
    assert onnxhal.get_model_compatibility_for_ep_devices(judge, "new") is V.EP_UNSUPPORTED
    assert factory.asked == [(1, "ok"), (2, "old"), (1, "new")]


def test_compatibility_info_from_a_model_as_onnxruntime(tmp_path):
    model = compiled_model(**{"ep_compatibility_info.CPUExecutionProvider": "v=1"})
    path = tmp_path / "compiled.onnx"
    onnx.save(model, path)
    data = model.SerializeToString()
    for lib in (onnxhal, C):
        assert lib.get_compatibility_info_from_model(str(path), "CPUExecutionProvider") == "v=1"
        assert lib.get_compatibility_info_from_model(str(path), "FooExecutionProvider") is None
        for buffer in (data, bytearray(data), memoryview(data)):
            assert lib.get_compatibility_info_from_model_bytes(buffer, "CPUExecutionProvider") == "v=1"
    assert onnxhal.get_compatibility_info_from_model(path, "CPUExecutionProvider") == "v=1"  # a PathLike too


@pytest.mark.parametrize("call, exc, message", [
    (lambda lib, p: lib.get_compatibility_info_from_model(p + "/nope.onnx", "CPUExecutionProvider"),
     RuntimeError, "nope.onnx failed. File doesn't exist"),
    (lambda lib, p: lib.get_compatibility_info_from_model(p + "/m.onnx", ""),
     RuntimeError, "Invalid argument provided to GetCompatibilityInfoFromModel"),
    (lambda lib, p: lib.get_compatibility_info_from_model_bytes(b"garbage", "CPUExecutionProvider"),
     RuntimeError, "Protobuf parsing failed"),
    (lambda lib, p: lib.get_compatibility_info_from_model_bytes(b"", "CPUExecutionProvider"),
     RuntimeError, "Invalid argument provided to GetCompatibilityInfoFromModelBytes"),
    (lambda lib, p: lib.get_compatibility_info_from_model_bytes(open(p + "/m.onnx", "rb").read(), ""),
     RuntimeError, "Invalid argument provided to GetCompatibilityInfoFromModelBytes"),
    (lambda lib, p: lib.get_compatibility_info_from_model_bytes("str", "X"), TypeError, None),
], ids=["missing-file", "empty-ep", "garbage", "empty-bytes", "empty-ep-bytes", "str"])
def test_compatibility_info_errors_as_onnxruntime(tmp_path, call, exc, message):
    onnx.save(compiled_model(), tmp_path / "m.onnx")
    for lib in (onnxhal, C):
        with pytest.raises(exc, match=message):
            call(lib, str(tmp_path))


def test_hardware_device_incompatibility_details_as_onnxruntime():
    ours = onnxhal.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider",
                                                                  onnxhal.get_hardware_devices()[0])
    theirs = C.get_hardware_device_ep_incompatibility_details("CPUExecutionProvider", C.get_hardware_devices()[0])
    assert ours == theirs == {"reasons_bitmask": 0, "notes": None, "error_code": 0}
    for lib in (onnxhal, C):
        for name in ("FooEP", ""):
            with pytest.raises(Exception, match=f"No valid factory found for execution provider '{name}'") as info:
                lib.get_hardware_device_ep_incompatibility_details(name, lib.get_hardware_devices()[0])
            assert type(info.value).__name__ == "InvalidArgument"


def test_hardware_device_incompatibility_details_come_from_the_factory(judge):
    R = onnxhal.OrtDeviceEpIncompatibilityReason
    details = onnxhal.get_hardware_device_ep_incompatibility_details("JudgeExecutionProvider", judge[0].device)
    assert details == {"reasons_bitmask": int(R.DRIVER_INCOMPATIBLE | R.MISSING_DEPENDENCY),
                       "notes": "needs driver 2.0", "error_code": 17}


@pytest.mark.parametrize("info, outcome", [("ok", "runs"), ("old", "runs"), ("old+strict", "fails"),
                                           ("new", "fails")])
def test_the_verdict_decides_at_session_creation(judge, info, outcome):
    strict = info.endswith("+strict")
    model = compiled_model(**{"ep_compatibility_info.JudgeExecutionProvider": info.removesuffix("+strict")})
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(judge, {})
    if strict:
        so.add_session_config_entry("session.fail_on_suboptimal_compiled_model", "1")
    if outcome == "runs":
        onnxhal.InferenceSession(model.SerializeToString(), so)
    else:
        with pytest.raises(errors.Fail, match="JudgeExecutionProvider"):
            onnxhal.InferenceSession(model.SerializeToString(), so)


ENUMS = ["ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel", "OrtAllocatorType", "OrtMemType",
         "OrtDeviceMemoryType", "OrtExecutionProviderDevicePolicy", "OrtHardwareDeviceType", "OrtMemoryInfoDeviceType",
         "OrtCompileApiFlags", "OrtCompiledModelCompatibility", "OrtDeviceEpIncompatibilityReason", "OrtDeviceVendorId"]


@pytest.mark.parametrize("name", ENUMS)
def test_enums_print_and_number_as_onnxruntimes(name):
    theirs = getattr(ort, name, None) or getattr(C, name)
    ours = getattr(onnxhal, name)
    for key, value in theirs.__members__.items():
        member = ours.__members__[key]
        assert (str(member), int(member)) == (str(value), int(value))
        assert f"{member}" == f"{value}"
