"""onnxhal's plugin EP library inside real onnxruntime (``onnxhal.ort_plugin``).

Checks that load the library into onnxruntime run in a subprocess each (``tests/ort_bridge_checks.py``):
a crash there fails the test instead of killing pytest, and every check also asserts a clean exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

from onnxhal.errors import Fail, InvalidArgument  # noqa: E402
from onnxhal.ort_plugin import build, gen_api_table  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"
ORT_VERSION = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2])
needs_virtual = pytest.mark.skipif(ORT_VERSION < (1, 24), reason="virtual hardware devices need onnxruntime 1.24")


def run_check(name: str, timeout: float = 240, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-m", "tests.ort_bridge_checks", name], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, f"check {name} exited with {done.returncode}:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- in process: no onnxruntime load ---------------------------------------------------------------
def _fake_checkout(root: Path, ep_api_anchor: int = 1) -> Path:
    """A tiny onnxruntime-shaped source tree: the files and the forms gen_api_table.py reads."""
    session = root / "onnxruntime" / "core" / "session"
    (session / "plugin_ep").mkdir(parents=True)
    include = root / "include" / "onnxruntime" / "core" / "session"
    include.mkdir(parents=True)
    (session / "onnxruntime_c_api.cc").write_text(
        "static constexpr OrtApi ort_api_1_to_3 = {\n    &OrtApis::First,\n    &OrtApis::Second,\n"
        "    // End of Version 1 - DO NOT MODIFY ABOVE\n    &OrtApis::Third,\n};\n"
        "static_assert(offsetof(OrtApi, Second) / sizeof(void*) == 1, \"v1\");\n")
    (session / "plugin_ep" / "ep_api.cc").write_text(
        "static constexpr OrtEpApi ort_ep_api = {\n    &OrtExecutionProviderApi::MakeThing,\n"
        "    &OrtExecutionProviderApi::ReleaseThing,\n    // End of Version 2 - DO NOT MODIFY ABOVE\n"
        "    &OrtExecutionProviderApi::Thing_Query,\n};\n"
        f"static_assert(offsetof(OrtEpApi, ReleaseThing) / sizeof(void*) == {ep_api_anchor}, \"v2\");\n")
    (session / "model_editor_c_api.cc").write_text(
        "static constexpr OrtModelEditorApi ort_model_editor_api = {\n    &OrtModelEditorAPI::Edit,\n};\n"
        "static_assert(offsetof(OrtModelEditorApi, Edit) / sizeof(void*) == 0, \"v21\");\n")
    (include / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 3\n")
    (include / "onnxruntime_ep_c_api.h").write_text(
        "struct OrtEpApi {\n  /** \\brief Makes.\n   * \\since Version 1.2.\n   */\n"
        "  ORT_API2_STATUS(MakeThing, _In_ int x);\n\n  ORT_CLASS_RELEASE(Thing);\n\n"
        "  /** \\since Version 1.3. */\n  ORT_API_T(int, Thing_Query, _In_ const OrtThing* t);\n};\n\n"
        "struct OrtEp {\n  uint32_t ort_version_supported;\n\n  /** \\since Version 1.2. */\n"
        "  ORT_API_T(const char*, GetName, _In_ const OrtEp* this_ptr);\n\n  /** \\since Version 1.3. */\n"
        "  ORT_API2_STATUS(Sync, _In_ OrtEp* this_ptr);\n  ORT_API2_STATUS(Undocumented, _In_ OrtEp* this_ptr);\n};\n\n"
        "struct OrtEpFactory {\n  uint32_t ort_version_supported;\n\n  /** \\since Version 1.2. */\n"
        "  OrtStatus*(ORT_API_CALL* CreateEp)(_In_ OrtEpFactory* this_ptr, _Outptr_ OrtEp** ep);\n};\n")
    return root


def test_api_tables_are_generated_from_an_onnxruntime_checkout(tmp_path):
    api_table, struct_table = gen_api_table.generate(_fake_checkout(tmp_path))
    tables: dict = {}
    exec(api_table, tables)
    assert tables["ORT_API"] == {"First": (0, 1), "Second": (1, 1), "Third": (2, 2)}
    assert tables["EP_API"] == {"MakeThing": (0, 2), "ReleaseThing": (1, 2), "Thing_Query": (2, 3)}
    assert tables["MODEL_EDITOR_API"] == {"Edit": (0, 21)}
    structs: dict = {}
    exec(struct_table, structs)
    assert structs["NEWEST_VERSION"] == 3
    assert structs["ORT_EP"] == [("GetName", 2), ("Sync", 3), ("Undocumented", None)]
    assert structs["ORT_EP_FACTORY"] == [("CreateEp", 2)]
    assert structs["ORT_EP_API"] == [("MakeThing", 2), ("ReleaseThing", 2), ("Thing_Query", 3)]


def test_api_table_generator_refuses_a_miscounted_source(tmp_path):
    with pytest.raises(SystemExit, match="anchor ReleaseThing is slot 2 in onnxruntime, 1 by this count"):
        gen_api_table.generate(_fake_checkout(tmp_path, ep_api_anchor=2))


def test_committed_tables_agree_and_hold_the_slots_onnxruntime_was_seen_with():
    from onnxhal.ort_plugin import api_table, ep_struct_table

    assert api_table.ORT_API["GetEpApi"] == (317, 22)
    assert api_table.ORT_API["CreateExternalInitializerInfo"] == (389, 23)
    assert api_table.ORT_API["RunOptionsSetSyncStream"] == (413, 24)
    assert api_table.ORT_API["CreateEnvWithOptions"] == (406, 24)  # probed in the release libraries
    header = {name: (slot, since) for slot, (name, since) in enumerate(ep_struct_table.ORT_EP_API)}
    assert all(header[name] == entry for name, entry in api_table.EP_API.items())
    # onnxruntime 1.31.1's GetEnvConfigEntries is slot 49 (observed).
    assert header["GetEnvConfigEntries"] == (49, 24)
    assert header["DeviceEpIncompatibilityDetails_SetDetails"] == (44, 24)


def test_no_compiler_names_the_remedy(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    with pytest.raises(Fail, match="no C compiler was found.*apt-get install gcc.*pip install -e"):
        build.compiled_library()


@pytest.mark.skipif(build.compiler() is None, reason="no C compiler on this machine")
def test_bridge_compiles_when_the_install_did_not(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    path = build.compiled_library()
    assert path.is_file() and path.parent == tmp_path / "ort_bridge"
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True).stdout
    assert " T CreateEpFactories" in symbols and " T ReleaseEpFactory" in symbols
    assert build.compiled_library() == path  # cached by the source's hash


def test_configure_checks_profiles_and_library():
    import onnxhal.ort_plugin as plugin
    from onnxhal.ort_plugin.library import SIMULATORS, config

    with pytest.raises(InvalidArgument, match="no-such-profile"):
        plugin.configure(profiles=["no-such-profile"])
    with pytest.raises(InvalidArgument, match="module name or a .py path"):
        plugin.configure(library="")
    plugin.configure(profiles="generic-npu")
    assert config.profiles == ["generic-npu"] and config.library == SIMULATORS
    plugin.configure()
    assert config.profiles == []


# -- inside onnxruntime ----------------------------------------------------------------------------
@pytest.mark.skipif(ORT_VERSION >= (1, 24), reason="onnxruntime 1.24 has virtual devices; this is 1.23's fallback")
def test_before_1_24_the_simulated_eps_sit_on_the_cpu_device():
    r = run_check("before_virtual_devices")
    assert r["devices"][NPU] == ["CPU", "generic-npu"] and r["devices"][GPU] == ["CPU", "generic-gpu"]
    assert r["providers"] == [NPU, "CPUExecutionProvider"] and r["err"] <= 2e-2


@needs_virtual
def test_devices_policies_and_explicit_devices():
    r = run_check("devices_and_policies")
    devices = {d["ep_name"]: d for d in r["devices"]}
    assert r["devices"][0]["ep_name"] == "CPUExecutionProvider"
    npu, gpu = devices[NPU], devices[GPU]
    assert (npu["type"], gpu["type"]) == ("NPU", "GPU")
    assert npu["vendor"] == gpu["vendor"] == "onnxhal" and npu["ep_vendor"] == "onnxhal"
    for d in (npu, gpu):
        assert d["hw_metadata"]["IsVirtual"] == d["hw_metadata"]["is_virtual"] == "1"
        assert d["ep_metadata"]["version"] == "0.1.0" and d["ep_metadata"]["backend"] in ("opencl", "host")
    assert npu["hw_metadata"]["simulator_profile"] == "generic-npu" and gpu["hw_metadata"]["Discrete"] == "1"
    assert r["providers"] == {"PREFER_NPU": [NPU, "CPUExecutionProvider"], "PREFER_GPU": [GPU, "CPUExecutionProvider"],
                              "MAX_PERFORMANCE": [GPU, "CPUExecutionProvider"],
                              "MAX_EFFICIENCY": [NPU, "CPUExecutionProvider"],
                              "MIN_OVERALL_POWER": [NPU, "CPUExecutionProvider"], "PREFER_CPU": ["CPUExecutionProvider"]}
    assert r["explicit"] == [NPU, "CPUExecutionProvider"]
    assert r["explicit_assignment"] == {NPU: ["add1", "add2", "mul"]}
    assert r["errors"]["explicit_npu"] <= 2e-2 and r["errors"]["prefer_gpu"] <= 1e-5
    assert r["dynamic_assignment"] == {"CPUExecutionProvider": ["relu"]}


@needs_virtual
def test_models_partition_as_onnxhal_and_stay_within_tolerance():
    r = run_check("models_match_onnxhal")
    tolerance = {NPU: r["tolerance"]["generic-npu"], GPU: r["tolerance"]["generic-gpu"]}
    for name in ("cnn", "encoder", "torch_conv2d_depthwise", "squeezenet", "control_flow"):
        for ep in (NPU, GPU):
            case = r[f"{name}/{ep}"]
            assert case["providers"] == [ep, "CPUExecutionProvider"], name
            if (name, ep) == ("torch_conv2d_depthwise", NPU):
                # An opset-6 model: onnxruntime does not use an NHWC EP on it at all (its layout
                # rewrite needs opset 7); onnxhal's own session runs the Conv on the NPU.
                assert case["bridge"] == {"CPUExecutionProvider": [""]} and case["onnxhal"] == {NPU: [""]}
            else:
                assert case["bridge"] == case["onnxhal"], f"{name} on {ep}: onnxruntime and onnxhal partition differently"
            rtol, atol = tolerance[ep]
            for err in (case["err"], case["optimized_err"]):
                assert err <= atol + rtol * case["scale"], f"{name} on {ep}: error {err}"
    # The NPU profile has no Erf: the encoder's GELU stays on onnxruntime's CPU EP.
    assert len(r[f"encoder/{NPU}"]["bridge"]["CPUExecutionProvider"]) == 1
    assert "CPUExecutionProvider" not in r[f"encoder/{GPU}"]["bridge"]
    # The NPU prefers NHWC: onnxruntime rewrote its Conv and pooling nodes (BatchNormalization stays NCHW).
    assert r[f"cnn/{NPU}"]["nhwc_nodes"] == 22 and r[f"squeezenet/{NPU}"]["nhwc_nodes"] == 30
    assert r[f"cnn/{GPU}"]["nhwc_nodes"] == 0
    # Control flow: the If stays on the CPU EP, the nodes of its branches go to the devices.
    assert r[f"control_flow/{GPU}"]["bridge"] == {GPU: ["add", "else_neg", "mul", "then_relu"],
                                                  "CPUExecutionProvider": ["if"]}


@needs_virtual
def test_device_loss_and_errors_become_onnxruntime_errors():
    r = run_check("errors_and_faults")
    assert r["first_run_err"] <= 2e-2
    assert r["second_run"].startswith("EPFail") and "simulated device 'generic-npu' was lost" in r["second_run"]
    assert r["fresh_session_err"] <= 2e-2
    assert r["transient"].startswith("RuntimeException") and "transient error on simulated device" in r["transient"]
    oom = r["out_of_memory"]
    assert oom.startswith("RuntimeException") and "OutOfMemory" in oom and "simulated device 'generic-gpu'" in oom
    assert r["out_of_memory_errs"] == [0.0, 0.0]  # the runs before and after
    bad = r["bad_option"]
    assert "InvalidArgument: unknown provider option 'fault_no_such_thing'" in bad["message"]
    assert bad.get("raised") == "InvalidArgument" or bad.get("providers") == ["CPUExecutionProvider"]


@needs_virtual
def test_threads_unregister_and_exit_with_a_live_session():
    r = run_check("threads_and_lifecycle")
    assert r["failures"] == [] and r["runs"] == 200 and r["max_err"] <= 1e-5
    # In parallel execution mode onnxruntime's own threads call Compute: the GIL is taken for them.
    assert r["parallel_threads"] >= 1 and r["parallel_err"] == 0.0
    # The session's EP, its partition, and its allocator and data transfer come and go with it.
    assert r["objects_with_session"] > r["objects_before"] == r["objects_after"]
    assert r["after_unregister"] == ["CPUExecutionProvider"]
    assert r["run_after_live_unregister_err"] <= 2e-2  # and the process exited cleanly (run_check)


@needs_virtual
def test_compiled_models_carry_the_partitions_as_ep_context_nodes():
    r = run_check("ep_context")
    for ep in (NPU, GPU):
        case = r[ep]
        assert [(op, domain) for op, domain, _ in case["nodes"]] == [("EPContext", "com.microsoft")]
        assert case["nodes"][0][2].startswith(ep)  # named as onnxruntime's fused node
        assert case["source"] == [ep]
        assert case["metadata"][f"ep_compatibility_info.{ep}"].startswith(f"{ep};version=0.1.0;")
        assert case["assignment"] == [[ep, ["EPContext"]]]  # (JSON makes the pair a list)
        assert case["err"] <= 2e-2


def test_compiled_partition_values_are_matched_by_name():
    """An EPContext node listing its inputs and outputs in another order, or one whose middle output
    nobody reads: onnxruntime's fused node follows that order, and the results still match its CPU EP."""
    r = run_check("ep_context_reordered")
    for ep, tol in ((NPU, 2e-2), (GPU, 1e-5)):
        for case in ("reordered", "unread"):
            assert r[f"{ep}/{case}"]["assignment"][0] == ep
            assert r[f"{ep}/{case}"]["err"] <= tol, (ep, case, r[f"{ep}/{case}"])


def test_run_time_values_pick_the_plan_at_every_run():
    """onnx's test_loop11 inside onnxruntime: the simulated GPU's Slice gets new starts/ends from the
    Loop counter at every iteration (in its device memory), and six runs all match the CPU EP."""
    r = run_check("loop_runtime_values")
    assert r["on_gpu"] is None or "Slice" in r["on_gpu"], r  # None: onnxruntime 1.23 does not say
    assert r["errors"] == [0.0] * 6, r


def test_a_value_onnxruntime_could_not_allocate_is_out_of_memory_every_time():
    """A full simulated GPU (3 MiB profile): the OrtValue onnxruntime made without memory (NULL data)
    fails as OutOfMemory, naming the value and the remedy, on every run and copy; before, the bridge
    read it as an empty host array and the runs returned whatever that held."""
    r = run_check("full_device_memory")
    for text in r["oversized_runs"]:
        assert "OutOfMemory: the destination of copy 0 (float32 [1048576]" in text, text
    assert r["plain_err"] == 0.0  # memory that fits still works
    if "bound_runs" not in r:
        pytest.skip("this onnxruntime's Python API cannot make an OrtValue in a plugin EP's memory")
    assert len(r["bound_runs"]) == 3 and len(r["copies"]) == 2
    for text in r["bound_runs"]:
        assert "OutOfMemory: input 0 ('x')" in text and "has no memory behind it" in text, text
        assert "capacity_mib" in text
    for text in r["copies"]:
        assert "OutOfMemory: the destination of copy 0 (float32 [524288]" in text, text


def test_memory_info_and_device_outlive_the_unregister():
    """An OrtMemoryInfo from ``ep_device.memory_info()`` (and the virtual hardware device) used after
    ``unregister_execution_provider_library``: the bridge freed them there and the process crashed
    (SIGSEGV) or read garbage; they stay, one per profile however often the library is registered."""
    r = run_check("stale_handles")  # a crash fails here, on the exit status
    assert r["name"] == r["name_after"] == "VirtualGpu(generic-gpu)"
    virtual = ORT_VERSION >= (1, 24)  # before, the simulated EPs sit on onnxruntime's CPU device
    assert r["hw"][0] and (r["hw"] == ["onnxhal", "generic-gpu"] or not virtual)
    assert r["value_error"] == "unsupported" or "No shared allocator" in r["value_error"], r["value_error"]
    assert r["counts"] == [{"memory_infos": 2, "hardware_devices": 2 if virtual else 0}] * 5
    assert max(r["errs"]) <= 2e-2


@needs_virtual
def test_device_memory_is_onnxruntimes_to_use():
    r = run_check("device_memory")
    for ep, name in ((NPU, "VirtualNpu(generic-npu)"), (GPU, "VirtualGpu(generic-gpu)")):
        case = r[ep]
        assert case["memory_info"] == name
        # Inputs and outputs bound in device memory: one crossing per run, no copy, no allocation
        # (where onnxruntime's Python API can make an OrtValue in a plugin EP's memory: not 1.24).
        if ORT_VERSION >= (1, 32):
            assert case["iobinding_err"] == 0.0 and case["iobinding_calls"] == {"OrtNodeComputeInfo::Compute": 1}
        # Host feeds: onnxruntime allocates on the device and copies through the bridge's data transfer.
        assert case["plain_err"] == 0.0
        assert case["plain_calls"] == {"OrtAllocator::Alloc": 2, "OrtDataTransferImpl::CopyTensors": 2,
                                       "OrtNodeComputeInfo::Compute": 1}
        # no copy of the output on the device: onnxruntime's output tensor is the EP's own; the
        # run copies the 24-byte input up and the 24-byte output down, nothing else
        assert case["plain_transfers"] == [2, 48]
    # configure(device_memory=False): onnxruntime sees host memory; the bridge copies inside compute.
    assert r["host_only"] == {"memory_info": False, "err": 0.0, "calls": {"OrtNodeComputeInfo::Compute": 1}}


@needs_virtual
@pytest.mark.parametrize("driver", ["installed", "none"])
def test_simulated_devices_queue_is_onnxruntimes_sync_stream(driver, tmp_path):
    env = None if driver == "installed" else {"OCL_ICD_VENDORS": str(tmp_path), "POCL_DEVICES": "none"}
    r = run_check("sync_streams", env=env)
    # NPU, then Erf on onnxruntime's CPU EP, then NPU again: the same placement either way
    assert r["assignment"] == r["plain_assignment"] == {"VirtualNpuExecutionProvider": ["a1", "a2", "m1", "m2"],
                                                         "CPUExecutionProvider": ["erf"]}
    calls = r["calls"]
    if r["backend"] == "opencl":  # one in-order queue per stream: onnxruntime queues on it and notifies
        assert calls["OrtEpFactory::IsStreamAware"] >= 1 and calls["OrtEp::CreateSyncStreamForDevice"] >= 1
        assert calls["copies on a stream"] >= 20  # at least the feed's copy to the device, each run
        assert calls["OrtSyncNotificationImpl::Activate"] >= 20  # the NPU's output to the CPU EP's Erf
        assert calls["OrtSyncStreamImpl::Flush"] >= 20  # each run ends with the stream drained
    else:  # the host backend finishes each partition in compute: not stream aware, no stream made
        assert "OrtEp::CreateSyncStreamForDevice" not in calls and calls.get("copies on a stream", 0) == 0
    # 20 runs with streams equal the runs with host memory only (no stream), bit for bit, and
    # onnxruntime's CPU EP within generic-npu's fp16 tolerance
    assert r["without_repeat"] == 0.0 and r["streams_vs_without"] == 0.0 and r["streams_vs_cpu"] < 2e-2
    if ORT_VERSION >= (1, 32):  # an output bound in the NPU's memory stays there and matches
        assert r["iobinding"] == {"device": "npu", "memory": "npu", "vs_without": 0.0}


def test_only_outputs_nothing_else_holds_become_onnxruntimes_tensors():
    import numpy as np

    from onnxhal.hal.allocator import Allocator
    from onnxhal.hal.memory_info import CPU_MEMORY_INFO
    from onnxhal.hal.tensor import DeviceTensor
    from onnxhal.ort_plugin.compute import sole_reference

    class Host(Allocator):
        def _alloc(self, size):
            return bytearray(size)

    alloc = Host(CPU_MEMORY_INFO)
    outputs = [DeviceTensor.allocate((2, 3), np.float32, alloc)]
    out = outputs[0]
    assert sole_reference(out)  # a fresh output of the run: onnxruntime may take it over
    kept = out  # also held elsewhere (a constant, a buffer the EP reuses): stays the EP's
    assert not sole_reference(out)
    del kept
    outputs.append(out)  # the same tensor as two outputs
    assert not sole_reference(out)
    del outputs[1]
    outputs[0] = out.view((3, 2))
    out = outputs[0]
    assert sole_reference(out)  # a view of a buffer nothing else holds
    other = out.view((6,))  # a second view of the same buffer
    assert not sole_reference(out)
    del other
    assert not sole_reference(np.zeros(3))  # host outputs are copied into onnxruntime's buffer


@needs_virtual
def test_200_sessions_leave_no_growth():
    r = run_check("many_sessions")
    assert r["objects_after"] == r["objects_before"] and r["retired_growth"] == 0
    assert r["rss_growth_mib"] < 16


@needs_virtual
def test_loading_without_python_side_and_wrong_name_are_clear_errors():
    bare = run_check("not_attached")["error"]
    assert bare.startswith("Fail") and "onnxhal.ort_plugin.library_path()" in bare
    wrong = run_check("wrong_name")["error"]
    assert wrong.startswith("InvalidArgument") and "'onnxhal.virtual'" in wrong


@needs_virtual
def test_users_own_hal_eps_run_through_the_same_adapter():
    r = run_check("user_eps")
    chain = r["chain"]  # docs/writing-an-ep.md's EP, on onnxruntime's CPU hardware device
    assert chain["hw_type"] == "CPU" and chain["ep_metadata"]["kind"] == "example"
    assert chain["assignment"] == {"ChainExecutionProvider": ["add1", "add2", "mul"]} and chain["err"] == 0.0
    # add_single_node: each node is a partition of its own, run by the EP's kernel.
    assert r["toy_single"]["assignment"] == [["add1"], ["mul"], ["add2"]] and r["toy_single"]["err"] == 0.0
    assert r["toy_fuse"]["assignment"] == [["add1", "add2", "mul"]] and r["toy_fuse"]["err"] == 0.0
    # Compile gets onnxruntime's own graph; the bridge matches it to the group claimed in
    # get_capability, so the EP keeps what it built while claiming (the group is lowered once).
    assert r["toy_fuse"]["trials_kept"] == [1]
    # get_capability raising: onnxruntime logs it and gives the EP nothing.
    assert r["toy_capability_fails"]["assignment"] == {"CPUExecutionProvider": ["add1", "add2", "mul"]}
    # compile raising: onnxruntime fails the session with the EP's message (onnxhal's runtime falls back).
    assert r["toy_compile_fails"].startswith("Fail") and "program build failed" in r["toy_compile_fails"]
    if "opencl" in r:  # only where an OpenCL device passes the probe
        assert r["opencl"] == {"assignment": {"OpenCLExecutionProvider": ["add1", "add2", "mul"]}, "err": 0.0}


@needs_virtual
def test_docs_snippet_runs_as_written(tmp_path):
    import re

    text = (ROOT / "docs" / "onnxruntime-plugin.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    code += ("\nassert sess.get_providers() == ['VirtualNpuExecutionProvider', 'CPUExecutionProvider']\n"
             "assert np.abs(sess.run(None, {'x': x})[0] - (np.maximum(x, 0) + x)).max() <= 2e-2\n")
    (tmp_path / "snippet.py").write_text(code)
    done = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "('VirtualNpuExecutionProvider', <OrtHardwareDeviceType.NPU" in done.stdout


def test_device_address_space_maps_pointers_back_to_buffers():
    from onnxhal.ort_plugin.device_memory import AddressSpace

    space = AddressSpace(sizes=(1 << 32,))
    a = space.add(10, "a", None)
    b = space.add(300, "b", None)
    assert a % 256 == 0 and b % 256 == 0 and b > a
    assert space.find(a + 5) == ("a", 5, None) and space.find(b + 299) == ("b", 299, None)
    assert space.find(a + 256) is None and space.find(b + 512) is None and space.find(a - 1) is None  # gaps
    assert space.remove(a) == "a" and space.find(a) is None
    assert space.add(7, "c", None) == a  # a freed range of the same rounded size is reused


@needs_virtual
def test_cost_model_figures_of_sessions_inside_onnxruntime():
    r = run_check("costs")
    npu, gpu = r["costs"]
    assert (npu["ep"], npu["profile"], gpu["ep"], gpu["profile"]) == (NPU, "generic-npu", GPU, "generic-gpu")
    assert npu["total"]["runs"] == 3 and npu["last_run"]["runs"] == 1 and gpu["total"]["runs"] == 1
    assert npu["total"]["kernels"] == 3 * npu["last_run"]["kernels"] > 0
    for c in (npu, gpu):
        assert c["last_run"]["kernel_ms"] > 0 and c["last_run"]["energy_mj"] > 0
        # onnxruntime's copy of the 1x3x32x32 float input onto the device is the session's
        assert c["last_run"]["transfer_bytes"] >= 3 * 32 * 32 * 4 and c["last_run"]["transfer_ms"] > 0
    # 5 TOPS fp16 at 2 W against 8 TFLOPS fp32 at 100 W: the NPU is slower per run and uses less energy.
    assert npu["last_run"]["kernel_ms"] > gpu["last_run"]["kernel_ms"]
    assert npu["last_run"]["energy_mj"] < gpu["last_run"]["energy_mj"]
    assert r["after"] == []  # the sessions ended


def test_dispatcher_never_raises_and_never_returns_a_null_string(caplog):
    import ctypes

    import onnxhal.ort_plugin.library  # noqa: F401 - installs the handlers
    from onnxhal.ort_plugin import dispatch

    # No adapter behind the pointer: the handler fails inside the dispatcher, which logs it.
    name = dispatch._dispatch(dispatch.E_GET_COMPAT_INFO, None, None)
    assert name and ctypes.string_at(name) == b""  # onnxruntime reads the string: never NULL
    assert dispatch._dispatch(dispatch.F_IS_STREAM_AWARE, None, None) == 0
    assert "OrtEp::GetCompiledModelCompatibilityInfo failed" in caplog.text


# -- onnxruntime's API version: which OrtEp / OrtEpFactory members the bridge declares ------------------
def test_structs_follow_the_member_table_and_fill_up_to_the_declared_version():
    from onnxhal.ort_plugin import ep_struct_table, structs

    plugin_path = onnxhal_plugin_library()
    assert plugin_path
    # Member k of the table sits at word k after ort_version_supported (padded to a word).
    for struct, table in ((structs.EpStruct, ep_struct_table.ORT_EP), (structs.FactoryStruct, ep_struct_table.ORT_EP_FACTORY)):
        for k, (member, _) in enumerate(table):
            assert getattr(struct, member).offset == 8 + 8 * k, member
    assert structs.EpStruct.OnSessionInitializationEnd.offset == 176
    assert structs.negotiated_version(23) == 23
    assert structs.negotiated_version(99) == ep_struct_table.NEWEST_VERSION
    for version, expect_sync, expect_init_end in ((24, False, False), (25, True, False), (27, True, True)):
        ep = structs.fill(structs.EpStruct(), version)
        assert ep.ort_version_supported == version
        assert bool(ep.Sync) == expect_sync and bool(ep.OnSessionInitializationEnd) == expect_init_end
        assert ep.IsConcurrentRunSupported is None and ep.GetKernelRegistry is None
    factory = structs.fill(structs.FactoryStruct(), 23)
    assert factory.GetHardwareDeviceIncompatibilityDetails is None and factory.CreateSyncStreamForDevice
    assert structs.fill(structs.FactoryStruct(), 24).GetHardwareDeviceIncompatibilityDetails


def onnxhal_plugin_library() -> str:
    import onnxhal.ort_plugin as plugin

    return plugin.library_path()


def test_hal_hooks_reach_the_ep_on_every_onnxruntime_version():
    from onnxhal.ort_plugin.ep_struct_table import NEWEST_VERSION

    r = run_check("hooks")
    api = ORT_VERSION[1]
    assert r["declared_version"] == min(api, NEWEST_VERSION)
    no, yes = r["concurrent_0"], r["concurrent_1"]
    # Four threads, three runs each: an EP that cannot take concurrent runs gets one Compute at a
    # time (without the bridge's lock: 4 in flight before 1.24, a deadlock in onnxruntime's own lock
    # after); one that can overlaps.
    assert no["in_flight_max"] == 1 and yes["in_flight_max"] > 1
    assert no["runs"] == yes["runs"] == 12 and no["err"] == yes["err"] == 0.0
    by_ort = r["by_ort"]
    for s in (no, yes):
        assert s["init_ends"] == 1 and s["init_end_before_first_run"]
        if api >= 27:  # onnxruntime's OnSessionInitializationEnd: at session creation
            assert s["log_after_init"][-1] == "on_session_initialization_end"
        else:  # the bridge: at the first run
            assert "on_session_initialization_end" not in s["log_after_init"]
        if api >= 25:  # onnxruntime's Sync, from IOBinding's synchronize calls
            assert s["binding_events"] == ["sync", "on_run_start", "on_run_end", "sync"]
            assert s["syncs"] == 0
        else:  # the bridge: at the end of each run
            assert s["binding_events"] == ["on_run_start", "on_run_end", "sync"]
            assert s["syncs"] == 12
    assert by_ort.get("E_ON_SESSION_INITIALIZATION_END", 0) == (2 if api >= 27 else 0)
    assert by_ort.get("E_SYNC", 0) == (4 if api >= 25 else 0)
    # get_default_memory_device: host memory is answered as none; memory the EP device does not
    # declare fails the EP's session with onnxhal's error (onnxruntime's Python API then falls back
    # to the CPU EP) once onnxruntime asks (API 27); before, nothing asks and the EP runs.
    dm = r["default_memory"]  # providers: 1.23 lists the CPU EP too (no assignment info)
    assert dm["host"]["providers"][0] == "HooksExecutionProvider" and dm["host"]["err"] == 0.0
    assert dm["host"]["error"] == ""
    if api >= 27:
        assert dm["undeclared"]["providers"] == ["CPUExecutionProvider"]
        assert ("OrtEp::GetDefaultMemoryDevice: InvalidArgument: HooksExecutionProvider.get_default_memory_device() "
                "returned GPU:1(vendor 0x1234), which its EP devices do not declare") in dm["undeclared"]["error"]
    else:
        assert dm["undeclared"]["providers"][0] == "HooksExecutionProvider" and dm["undeclared"]["error"] == ""
    # The EP's own EpProfiler: asked for once by a profiled session, its events in onnxruntime's profile
    prof = r["profile"]
    assert prof["ort_kernel_events"] == 2
    if api >= 25:
        assert prof["created"] == 1 and prof["onnxhal_events"] == 2
        assert prof["ep_events"] == [["hooks_compute", "Kernel", "0"], ["hooks_compute", "Kernel", "1"]]
    else:
        assert prof == {"ep_events": [], "onnxhal_events": 0, "ort_kernel_events": 2, "created": 0}
    if api >= 26:  # the Python query exists from 1.26
        assert r["incompatibility"] == [{"reasons_bitmask": 0, "notes": None, "error_code": 0},
                                        {"reasons_bitmask": 1, "notes": "driver 1.0 is too old; install 2.0",
                                         "error_code": 7}]
        assert by_ort["F_GET_INCOMPATIBILITY_DETAILS"] == 2


@needs_virtual
@pytest.mark.parametrize("driver", ["installed", "none"])
def test_values_after_ml_operators_get_the_loaders_shapes_inside_onnxruntime(driver, tmp_path):
    # onnxruntime leaves the outputs of Normalizer/Scaler/FeatureVectorizer without a rank: with
    # ml_value_types.py the GPU takes the nodes after them as in onnxhal's own session; without
    # (its config key "0") it takes none of them.
    env = None if driver == "installed" else {"OCL_ICD_VENDORS": str(tmp_path), "POCL_DEVICES": "none"}
    r = run_check("ml_shapes", env=env)
    rtol, atol = r["tolerance"]
    for name in ("skh_countvec", "skh_mlp"):
        case = r[name]
        assert case["on"] == case["onnxhal"] and len(case["on"]) >= 6, name
        assert case["off"] == [], name
        assert case["on_err"] <= atol + rtol * case["scale"], name


@pytest.mark.parametrize("driver", ["installed", "none"])
def test_onnxruntime_profile_shows_onnxhals_partition_events(driver, tmp_path):
    # "none": an OpenCL loader with no driver, so the simulated NPU runs on the host backend, whose
    # partition runs are short enough that a clock misaligned by a few microseconds shows
    env = None if driver == "installed" else {"OCL_ICD_VENDORS": str(tmp_path), "POCL_DEVICES": "none"}
    r = run_check("profiling", env=env)
    runs = 20  # tests/ort_bridge_checks.py's PROFILED_RUNS
    assert r["ort_kernel_events"] == runs  # one per run of the one fused node, onnxruntime's own events
    if r["api"] < 25:  # no OrtEp::CreateProfiler: the profile holds onnxruntime's events alone
        assert r["onnxhal_events"] == 0
        return
    # one onnxhal event per partition run, inside onnxruntime's event for that run, carrying the
    # simulated device time onnxhal's own session gives the same partition on the same profile
    assert r["onnxhal_events"] == runs and all(r["nested"]) and r["categories"] == ["Kernel"]
    assert len(r["own_sim_device_us"]) == 1 and r["own_sim_device_us"][0] > 0
    for args in r["args"]:
        assert args["provider"] == "VirtualNpuExecutionProvider" and args["sim_device"] == "generic-npu"
        assert args["sim_dtype"] == "float16" and float(args["sim_device_us"]) == r["own_sim_device_us"][0]


def test_default_memory_device_is_the_simulated_devices_memory():
    r = run_check("default_memory_device")
    assert r["providers"][0] == "VirtualNpuExecutionProvider" and r["err"] < 2e-2
    if r["api"] >= 27:  # onnxruntime asks once per session, and gets the device's own memory
        assert r["answers"] == [{"answer": "NPU:0(vendor 0x4f48)", "ep_memory": "NPU:0(vendor 0x4f48)"}]
    else:
        assert r["answers"] == []


def test_call_ids_of_bridge_c_and_dispatch_agree():
    import re

    from onnxhal.ort_plugin import build, dispatch

    text = build.SOURCE.read_text()
    body = re.search(r"enum \{\n  CALL_CREATE_EP_FACTORIES(.*?)\};", text, re.S).group(0)
    ids: dict[str, int] = {}
    value = -1
    for name, explicit in re.findall(r"(\w+)(?: = (\d+))?[,\n]", body.split("{", 1)[1]):
        value = int(explicit) if explicit else value + 1
        ids[name] = value
    for entry in ("CREATE_EP_FACTORIES", "RELEASE_EP_FACTORY", "REGISTER_CUSTOM_OPS"):
        ids[entry] = ids.pop(f"CALL_{entry}")
    assert len(ids) == 76
    assert {name: getattr(dispatch, name, None) for name in ids} == ids
