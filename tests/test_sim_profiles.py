"""Hardware profiles: every shipped profile loads with its figures; invalid ones fail naming the
file, the key and the reason."""

from __future__ import annotations

import pytest

from onnxhal.hal import OrtHardwareDeviceType
from onnxhal.hal.errors import InvalidArgument
from onnxhal.simulators.profiles import (
    PROFILE_DIR,
    ProfileError,
    load_profile,
    parse_profile_list,
    shipped_profiles,
)

VALID = """
[device]
name = "tiny-npu"
type = "npu"
vendor = "Test"
vendor_id = 0x1234
device_id = 7

[memory]
capacity_mib = 1.5

[compute]
ops = ["Relu", "Add"]
dtypes = ["float16"]
float32_as = "float16"

[performance]
peak_tops = { float16 = 1.0 }
memory_bandwidth_gbps = 10
host_link_bandwidth_gbps = 5

[power]
idle_w = 0.1
active_w = 1
"""


def write(tmp_path, text: str, name: str = "p.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_shipped_profiles_load_with_their_figures():
    names = shipped_profiles()
    assert {"generic-npu", "generic-gpu", "mobile-npu", "integrated-gpu", "discrete-gpu"} <= set(names)
    for name in names:
        p = load_profile(name)
        assert p.name == name and p.path == str(PROFILE_DIR / f"{name}.toml")
        assert p.capacity_bytes > 0 and p.memory_bandwidth_gbps > 0 and p.active_w > p.idle_w
        assert all(d in p.peak_tops for d in p.dtypes)
        assert not p.faults.any
    npu = load_profile("generic-npu")
    assert npu.type == OrtHardwareDeviceType.NPU and npu.float32_as == "float16" and npu.static_shapes_only
    assert npu.preferred_layout == "NHWC" and npu.capacity_bytes == 1024 * 2**20
    gpu = load_profile("generic-gpu")
    assert gpu.type == OrtHardwareDeviceType.GPU and gpu.discrete and not gpu.static_shapes_only
    assert gpu.hardware_metadata()["Discrete"] == "1"
    igpu = load_profile("integrated-gpu")
    assert igpu.host_shared and not igpu.discrete and igpu.hardware_metadata()["Discrete"] == "0"
    assert (igpu.vendor_id, igpu.device_id) == (0x8086, 0x9A49)
    assert load_profile("discrete-gpu").peak_tops["float32"] == pytest.approx(15.11)
    assert load_profile("mobile-npu").peak_tops["int8"] == 45.0


def test_a_profile_by_path_and_its_defaults(tmp_path):
    p = load_profile(write(tmp_path, VALID))
    assert p.name == "tiny-npu" and p.capacity_bytes == int(1.5 * 2**20)
    assert (p.max_rank, p.preferred_layout, p.static_shapes_only, p.host_shared) == (6, "NCHW", False, False)
    assert p.peak_ops_per_s("float16") == 1e12
    assert p.supports_op("Relu") and not p.supports_op("Conv")
    md = p.hardware_metadata()
    assert md["simulator_profile"] == "tiny-npu" and md["memory_bytes"] == str(p.capacity_bytes)
    assert "Discrete" not in md  # an NPU has no Discrete key


def test_fused_ops_count_as_supported_when_their_parts_are(tmp_path):
    p = load_profile(write(tmp_path, VALID.replace('["Relu", "Add"]', '["Conv", "MatMul", "Add"]')))
    assert p.supports_op("FusedConv") and p.supports_op("FusedMatMul")
    assert not p.supports_op("FusedGemm") and not p.supports_op("Gelu")


@pytest.mark.parametrize("change, key, reason", [
    (("[memory]\ncapacity_mib = 1.5\n", "[memory]\n"), "memory.capacity_mib", "missing required key"),
    (('type = "npu"', 'type = "tpu"'), "device.type", "'tpu' is not one of npu, gpu"),
    (("vendor_id = 0x1234", 'vendor_id = "intel"'), "device.vendor_id", "must be int"),
    (("vendor_id = 0x1234", "vendor_id = 0"), "device.vendor_id", "must be >= 1"),
    (('["Relu", "Add"]', '["Relu", "Convolution"]'), "compute.ops", "'Convolution' is not an ONNX op type"),
    (('dtypes = ["float16"]', 'dtypes = ["fp16"]'), "compute.dtypes", "unknown dtype"),
    (('float32_as = "float16"', 'float32_as = "int8"'), "compute.float32_as", "is not one of"),
    (("peak_tops = { float16 = 1.0 }", "peak_tops = { int8 = 1.0 }"), "performance.peak_tops",
     "no figure for compute dtype"),
    (("peak_tops = { float16 = 1.0 }", "peak_tops = { float16 = -1.0 }"), "performance.peak_tops.float16",
     "positive"),
    (("active_w = 1", "active_w = 0.05"), "power.active_w", "below power.idle_w"),
    (("idle_w = 0.1", "idle_w = 0.1\nturbo_w = 3"), "power.turbo_w", "unknown key"),
    (("[power]", "[powr]\nx = 1\n[power]"), "powr", "unknown table"),
    (('type = "npu"', 'type = "npu"\ndiscrete = true'), "device.discrete", "only a GPU can be discrete"),
    (("active_w = 1", "active_w = 1\n[faults]\nslowdown = nan"), "faults.slowdown", "must be a finite number"),
    (("active_w = 1", "active_w = 1\n[faults]\nslowdown = inf"), "faults.slowdown", "must be a finite number"),
    (("active_w = 1", "active_w = 1\n[faults]\nslowdown = 0.5"), "faults.slowdown", "must be >= 1.0"),
    (("active_w = 1", "active_w = 1\n[faults]\nseed = -1"), "faults.seed", "must be >= 0"),
    (("active_w = 1", "active_w = 1\n[faults]\ndevice_lost_after_runs = -2"), "faults.device_lost_after_runs",
     "must be >= -1"),
    (("active_w = 1", "active_w = 1\n[faults]\ntransient_error_rate = nan"), "faults.transient_error_rate",
     "must be a finite number"),
])
def test_invalid_profiles_name_file_key_and_reason(tmp_path, change, key, reason):
    path = write(tmp_path, VALID.replace(*change))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    err = info.value
    assert isinstance(err, InvalidArgument)  # typed: callers may catch ValueError too
    assert (err.path, err.key) == (path, key)
    assert reason in err.reason and path in str(err) and key in str(err)


def test_unreadable_profiles(tmp_path):
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(write(tmp_path, "[device\nname = 1"))
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(str(tmp_path / "missing.toml"))
    with pytest.raises(ProfileError, match="no shipped profile of that name.*generic-npu"):
        load_profile("quantum-npu")
    with pytest.raises(ProfileError, match="missing table"):
        load_profile(write(tmp_path, VALID.split('[memory]')[0]))


def test_profile_lists_need_distinct_devices(tmp_path):
    assert [p.name for p in parse_profile_list(" generic-npu, generic-gpu ,")] == ["generic-npu", "generic-gpu"]
    twin = write(tmp_path, VALID.replace("tiny-npu", "twin").replace("device_id = 7", "device_id = 0x4E01")
                 .replace("0x1234", "0x4F48"))
    with pytest.raises(ProfileError, match="distinct") as info:
        parse_profile_list(f"generic-npu,{twin}")
    assert info.value.key == "device.device_id"
    with pytest.raises(ProfileError, match="distinct"):
        parse_profile_list("generic-npu,generic-npu")
