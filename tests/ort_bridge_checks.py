"""Checks that load onnxhal's plugin EP library into real onnxruntime, one per subprocess.

``tests/test_ort_plugin.py`` runs ``python -m tests.ort_bridge_checks NAME`` (a crash of the bridge
then fails a test instead of killing pytest) and asserts on the JSON the check prints last.
Profiles: generic-npu (fp16, NHWC, no Erf) and generic-gpu (fp32), as $ONNXHAL_SIMULATE would give.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import onnxhal.ort_plugin as plugin  # noqa: E402
from tests.models import ADD_MUL_X, add_mul_model, add_mul_reference  # noqa: E402

NPU, GPU = "VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider"
PROFILES = ["generic-npu", "generic-gpu"]


def register(name: str = plugin.REGISTRATION_NAME) -> None:
    plugin.configure(profiles=PROFILES)
    ort.register_execution_provider_library(name, plugin.library_path())


def device(ep_name: str):
    return next(d for d in ort.get_ep_devices() if d.ep_name == ep_name)


def session(model, policy=None, devices=None, options=None, optimize=True) -> ort.InferenceSession:
    so = ort.SessionOptions()
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if policy is not None:
        so.set_provider_selection_policy(policy)
    if devices is not None:
        so.add_provider_for_devices(devices, options or {})
    return ort.InferenceSession(model.SerializeToString(), so)


def assignment(sess) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for sub in sess.get_provider_graph_assignment_info():
        out.setdefault(sub.ep_name, []).extend(n.name for n in sub.get_nodes())
    return {k: sorted(v) for k, v in out.items()}


def add_mul_error(sess) -> float:
    return float(np.abs(sess.run(None, {"x": ADD_MUL_X})[0] - add_mul_reference(ADD_MUL_X)).max())


def providers_used(sess) -> list[str]:
    """The EPs that got nodes, in onnxruntime's order (1.23 has no assignment info: its providers)."""
    if not hasattr(sess, "get_provider_graph_assignment_info"):
        return sess.get_providers()
    return list(dict.fromkeys(s.ep_name for s in sess.get_provider_graph_assignment_info()))


# -- checks ---------------------------------------------------------------------------------------
def devices_and_policies() -> dict:
    register()
    P = ort.OrtExecutionProviderDevicePolicy
    model = add_mul_model()
    devices = [{"ep_name": d.ep_name, "ep_vendor": d.ep_vendor, "type": d.device.type.name,
                "vendor": d.device.vendor, "vendor_id": d.device.vendor_id, "device_id": d.device.device_id,
                "hw_metadata": dict(d.device.metadata), "ep_metadata": dict(d.ep_metadata)}
               for d in ort.get_ep_devices()]
    providers = {p: session(model, getattr(P, p)).get_providers()
                 for p in ("PREFER_NPU", "PREFER_GPU", "MAX_PERFORMANCE", "MAX_EFFICIENCY", "MIN_OVERALL_POWER", "PREFER_CPU")}
    explicit = session(model, devices=[device(NPU)])
    errors = {"explicit_npu": add_mul_error(explicit),
              "prefer_gpu": add_mul_error(session(model, P.PREFER_GPU))}
    # generic-npu runs static shapes only: with a symbolic batch every node stays on the CPU EP.
    from onnx import helper

    from tests.models import make, vi

    dynamic = make([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", ["N", 3])], [vi("y", ["N", 3])])
    dynamic_assignment = assignment(session(dynamic, devices=[device(NPU)]))
    return {"devices": devices, "providers": providers, "explicit": explicit.get_providers(),
            "dynamic_assignment": dynamic_assignment,
            "explicit_assignment": assignment(explicit), "errors": errors,
            "ort_version": ort.__version__}


def if_model():
    """add -> If(then: Relu, else: Neg, both reading the outer 'a') -> mul."""
    from onnx import TensorProto, helper

    from tests.models import make, vi

    then_g = helper.make_graph([helper.make_node("Relu", ["a"], ["t"], name="then_relu")], "then", [], [vi("t", [2, 3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["a"], ["e"], name="else_neg")], "else", [], [vi("e", [2, 3])])
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("If", ["c"], ["y0"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Mul", ["y0", "x"], ["y"], name="mul")]
    return make(nodes, [vi("x", [2, 3]), vi("c", [], TensorProto.BOOL)], [vi("y", [2, 3])])


def models_match_onnxhal() -> dict:
    """The benchmark CNN, the encoder layer and a PyTorch export: partitions (optimizers off in both,
    so both see the model's own nodes) and errors against onnxruntime's CPU EP."""
    os.environ["ONNXHAL_SIMULATE"] = ",".join(PROFILES)
    import re

    import onnx

    import onnxhal
    from benchmarks import models

    register()
    data = Path(onnx.__file__).parent / "backend/test/data/pytorch-converted/test_Conv2d_depthwise_padded"
    exported = onnx.load(str(data / "model.onnx"))
    cases = {"cnn": models.cnn(image=32, classes=10), "encoder": models.encoder(seq=16, hidden=64, heads=4, ffn=128),
             "torch_conv2d_depthwise": exported,  # opset 6: onnxruntime cannot rewrite it to NHWC
             "squeezenet": models.light_model("squeezenet"),  # onnx's light model zoo export, random weights
             "control_flow": if_model()}  # onnxruntime asks about each branch of the If separately
    result = {}
    for name, model in cases.items():
        feeds = models.feeds(model)
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        for ep, policy in ((NPU, "PREFER_NPU"), (GPU, "PREFER_GPU")):
            sess = session(model, getattr(ort.OrtExecutionProviderDevicePolicy, policy), optimize=False)
            out = sess.run(None, feeds)
            hso = onnxhal.SessionOptions()
            hso.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
            hso.set_provider_selection_policy(getattr(onnxhal.OrtExecutionProviderDevicePolicy, policy))
            hso.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            own = onnxhal.InferenceSession(model.SerializeToString(), hso)
            # Both NHWC rewrites add Transpose nodes of their own: compare the model's nodes.
            original = {n.name for n in model.graph.node}
            original |= {n.name for node in model.graph.node for a in node.attribute if a.g.node for n in a.g.node}

            def model_nodes(parts: dict, keep=original) -> dict:
                # onnxruntime names a node it rewrote to NHWC "<name>_token_<n>".
                kept = {k: sorted(m for m in (re.sub(r"_token_\d+$", "", n) for n in v) if m in keep)
                        for k, v in parts.items()}
                return {k: v for k, v in kept.items() if v}

            result[f"{name}/{ep}"] = {
                "providers": sess.get_providers(), "bridge": model_nodes(assignment(sess)),
                "onnxhal": model_nodes(assignment(own)),
                "nhwc_nodes": sum(1 for s in sess.get_provider_graph_assignment_info() for n in s.get_nodes()
                                  if n.domain == "com.ms.internal.nhwc"),
                "err": max(float(np.abs(a - b).max()) for a, b in zip(out, ref)),
                "scale": max(float(np.abs(b).max()) for b in ref),
                "optimized_err": max(float(np.abs(a - b).max()) for a, b in
                                     zip(session(model, getattr(ort.OrtExecutionProviderDevicePolicy, policy))
                                         .run(None, feeds), ref))}
    from onnxhal.simulators.profiles import load_profile

    result["tolerance"] = {p: [load_profile(p).rtol, load_profile(p).atol] for p in PROFILES}
    return result


def errors_and_faults() -> dict:
    register()
    model = add_mul_model()
    lost = session(model, devices=[device(NPU)], options={"fault_device_lost_after_runs": "1"})
    lost.disable_fallback()  # onnxruntime's Python session would otherwise retry on the CPU EP
    first = add_mul_error(lost)
    try:
        lost.run(None, {"x": ADD_MUL_X})
        second = None
    except Exception as e:  # onnxruntime's EPFail
        second = f"{type(e).__name__}: {e}"
    fresh = add_mul_error(session(model, devices=[device(NPU)]))
    transient = session(model, devices=[device(GPU)],
                        options={"fault_transient_error_rate": "1.0", "fault_seed": "3"})
    transient.disable_fallback()
    try:
        transient.run(None, {"x": ADD_MUL_X})
        transient_error = None
    except Exception as e:
        transient_error = f"{type(e).__name__}: {e}"
    # The device's memory: an allocation past the injected limit is onnxhal's OutOfMemory, which
    # reaches onnxruntime as RUNTIME_EXCEPTION; the count restarts, so a later run works. The
    # partition allocates its 24-byte output on the session's (fault-injecting) allocator each run
    # (onnxruntime's own tensors come from the device's shared allocator): runs 1 and 3 fit in 30, run
    # 2 does not.
    oom = session(model, devices=[device(GPU)], options={"fault_alloc_fail_after_bytes": "30"})
    oom.disable_fallback()
    before_oom = add_mul_error(oom)
    try:
        oom.run(None, {"x": ADD_MUL_X})
        out_of_memory = None
    except Exception as e:
        out_of_memory = f"{type(e).__name__}: {e}"
    after_oom = add_mul_error(oom)
    # onnxruntime 1.32 raises the EP's InvalidArgument; 1.24's Python session prints it and falls back
    # to the CPU EP alone.
    import contextlib
    import io

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            fallback = session(model, devices=[device(NPU)], options={"fault_no_such_thing": "1"})
        bad_option = {"providers": fallback.get_providers(), "message": printed.getvalue()}
    except Exception as e:
        bad_option = {"raised": type(e).__name__, "message": str(e)}
    return {"first_run_err": first, "second_run": second, "fresh_session_err": fresh,
            "transient": transient_error, "bad_option": bad_option, "out_of_memory": out_of_memory,
            "out_of_memory_errs": [before_oom, after_oom]}


def threads_and_lifecycle() -> dict:
    register()
    model = add_mul_model()
    from onnxhal.ort_plugin import dispatch

    objects_before = len(dispatch.objects)
    sess = session(model, devices=[device(GPU)])
    errs: list[float] = []
    failures: list[str] = []

    def work(s) -> None:
        try:
            for _ in range(50):
                errs.append(add_mul_error(s))
        except Exception as e:
            failures.append(repr(e))

    workers = [threading.Thread(target=work, args=(sess,)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    # Two independent branches in parallel execution mode: onnxruntime's own inter-op threads call
    # Compute (ctypes takes the GIL for them).
    from onnx import helper

    from tests.models import make, vi

    branches = make([helper.make_node("Relu", ["x"], ["a"], name="left"), helper.make_node("Neg", ["x"], ["b"], name="right"),
                     helper.make_node("Add", ["a", "b"], ["y"], name="join")], [vi("x", [2, 3])], [vi("y", [2, 3])])
    so = ort.SessionOptions()
    so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    so.inter_op_num_threads = 2
    so.add_provider_for_devices([device(GPU)], {})
    threads_seen: set = set()
    compute = dispatch.HANDLERS[dispatch.C_COMPUTE]

    def spy(target, args):
        threads_seen.add(threading.get_ident())
        return compute(target, args)

    dispatch.HANDLERS[dispatch.C_COMPUTE] = spy
    parallel = ort.InferenceSession(branches.SerializeToString(), so)
    parallel_err = max(float(np.abs(parallel.run(None, {"x": ADD_MUL_X})[0] - (np.maximum(ADD_MUL_X, 0) - ADD_MUL_X)).max())
                       for _ in range(20))
    dispatch.HANDLERS[dispatch.C_COMPUTE] = compute
    del parallel

    objects_with_session = len(dispatch.objects)
    del sess
    objects_after = len(dispatch.objects)
    ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)
    after_unregister = [d.ep_name for d in ort.get_ep_devices()]
    register()  # again, under the same name
    live = session(model, devices=[device(NPU)])
    ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)  # while a session lives
    live_err = add_mul_error(live)
    del live
    register()
    kept_alive_at_exit.append(session(model, devices=[device(NPU)]))  # still alive when the process exits
    return {"runs": len(errs), "max_err": max(errs), "failures": failures, "parallel_err": parallel_err,
            "parallel_threads": len(threads_seen - {threading.main_thread().ident}),
            "objects_before": objects_before, "objects_with_session": objects_with_session,
            "objects_after": objects_after,
            "after_unregister": after_unregister, "run_after_live_unregister_err": live_err}


kept_alive_at_exit: list = []


def costs() -> dict:
    """The cost model's figures of sessions inside onnxruntime (plugin.simulated_costs())."""
    from benchmarks import models

    register()
    model = models.cnn(image=32, classes=10)
    feeds = models.feeds(model)
    npu = session(model, devices=[device(NPU)])
    for _ in range(3):
        npu.run(None, feeds)
    gpu = session(model, devices=[device(GPU)])
    gpu.run(None, feeds)
    with_sessions = plugin.simulated_costs()
    del npu, gpu
    return {"costs": with_sessions, "after": plugin.simulated_costs()}


def many_sessions() -> dict:
    """200 sessions created, run and released: neither onnxhal's bridge objects nor the process grow."""
    import gc

    import psutil

    register()
    model = add_mul_model()
    dev = device(NPU)
    from onnxhal.ort_plugin import dispatch

    def cycle(n: int) -> None:
        for _ in range(n):
            s = session(model, devices=[dev])
            add_mul_error(s)
            del s
        gc.collect()

    cycle(20)  # warm: caches, arenas, the first program builds
    rss0, objects0, retired0 = psutil.Process().memory_info().rss, len(dispatch.objects), len(dispatch.retired)
    cycle(200)
    rss1, objects1, retired1 = psutil.Process().memory_info().rss, len(dispatch.objects), len(dispatch.retired)
    return {"rss_growth_mib": (rss1 - rss0) / 2**20, "objects_before": objects0, "objects_after": objects1,
            "retired_growth": retired1 - retired0}


def user_eps() -> dict:
    """EP libraries written against onnxhal.hal, through the same adapter: the docs' chain EP (on the
    CPU hardware device), the toy EP (virtual NPUs; single nodes, failures) and the OpenCL EP."""
    import re

    model = add_mul_model()
    out: dict = {}
    text = (Path(__file__).resolve().parent.parent / "docs" / "writing-an-ep.md").read_text()
    chain = Path(os.environ.get("TMPDIR", "/tmp")) / f"chain_ep_{os.getpid()}.py"
    chain.write_text(re.findall(r"```python\n(\"\"\"chain_ep.py.*?)```", text, re.S)[0])
    try:
        plugin.configure(library=str(chain))
        ort.register_execution_provider_library("chain", plugin.library_path())
    finally:
        chain.unlink()
    dev = device("ChainExecutionProvider")
    sess = session(model, devices=[dev], options={"min_chain": "2"})
    out["chain"] = {"hw_type": dev.device.type.name, "assignment": assignment(sess), "err": add_mul_error(sess),
                    "ep_metadata": dict(dev.ep_metadata)}
    toy_path = Path(__file__).resolve().parent / "plugins" / "toy_fusing_ep.py"
    plugin.configure(library=str(toy_path))
    ort.register_execution_provider_library("toy.virtual", plugin.library_path())
    # The library as the bridge loaded it (its LOG records what the EP did inside onnxruntime).
    toy_module = next(m for m in list(sys.modules.values())
                      if getattr(m, "__file__", None) and Path(m.__file__).resolve() == toy_path)
    toy = device("ToyA")
    for mode in ("single", "fuse"):
        toy_module.LOG.clear()
        sess = session(model, devices=[toy], options={"mode": mode})
        out[f"toy_{mode}"] = {"assignment": [sorted(n.name for n in s.get_nodes())
                                             for s in sess.get_provider_graph_assignment_info()],
                              "providers": sess.get_providers(), "err": add_mul_error(sess),
                              "trials_kept": [e[3] for e in toy_module.LOG if e[0] == "trials_kept"]}
    sess = session(model, devices=[toy], options={"fail": "capability"})
    out["toy_capability_fails"] = {"assignment": assignment(sess), "err": add_mul_error(sess)}
    try:
        session(model, devices=[toy], options={"fail": "compile"})
        out["toy_compile_fails"] = None
    except Exception as e:
        out["toy_compile_fails"] = f"{type(e).__name__}: {e}"
    from onnxhal.devices import discover_hardware_devices

    if any(hw.metadata.get("opencl_devices") for hw in discover_hardware_devices()):
        plugin.configure(library="onnxhal.runtime.providers.opencl")
        ort.register_execution_provider_library("opencl", plugin.library_path())
        sess = session(model, devices=[device("OpenCLExecutionProvider")])
        out["opencl"] = {"assignment": assignment(sess), "err": add_mul_error(sess)}
    return out


def ep_context() -> dict:
    """onnxruntime's ModelCompiler on the simulated devices: EPContext nodes carrying onnxhal's
    partition blobs, the compatibility string in the metadata, and a session that loads them."""
    import onnx

    register()
    model = add_mul_model()
    out = {}
    for ep in (NPU, GPU):
        so = ort.SessionOptions()
        so.add_provider_for_devices([device(ep)], {})
        compiled = ort.ModelCompiler(so, model.SerializeToString(), embed_compiled_data_into_model=True).compile_to_bytes()
        proto = onnx.load_from_string(compiled)
        sess = session(proto, devices=[device(ep)])
        out[ep] = {"nodes": [(n.op_type, n.domain, n.name) for n in proto.graph.node],
                   "source": [a.s.decode() for n in proto.graph.node for a in n.attribute if a.name == "source"],
                   "metadata": {p.key: p.value for p in proto.metadata_props},
                   "assignment": [(s.ep_name, [n.op_type for n in s.get_nodes()])
                                  for s in sess.get_provider_graph_assignment_info()],
                   "err": add_mul_error(sess)}
    return out


def ep_context_reordered() -> dict:
    """A compiled multi-input, multi-output partition whose EPContext node lists its values in another
    order (as another tool may write it), and one whose model no longer reads one output: onnxruntime
    builds the fused node in that order, and the partition must take and return its values by name."""
    import onnx

    from tests.models import multi_output_model, multi_output_reordered

    register()
    model, feeds = multi_output_model()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    out = {}
    for ep in (NPU, GPU):
        so = ort.SessionOptions()
        so.add_provider_for_devices([device(ep)], {})
        compiled = onnx.load_from_string(ort.ModelCompiler(so, model.SerializeToString(),
                                                           embed_compiled_data_into_model=True).compile_to_bytes())
        for case, proto in multi_output_reordered(compiled).items():
            sess = session(proto, devices=[device(ep)])
            try:
                got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
            except Exception as e:
                out[f"{ep}/{case}"] = {"error": f"{type(e).__name__}: {e}"}
                continue
            out[f"{ep}/{case}"] = {
                "assignment": providers_used(sess),
                "err": max(float(np.abs(got[o.name] - r).max()) for o, r in zip(model.graph.output, ref) if o.name in got)}
    return out


def loop_runtime_values() -> dict:
    """onnx's own test_loop11: the Loop body's Slice takes starts/ends from the iteration counter, so
    the simulated GPU's partition sees new values at every iteration; six runs of one session."""
    from tests.onnx_cases import node_cases

    register()
    case = next(c for c in node_cases() if c.name == "test_loop11")
    case.model.ir_version = min(case.model.ir_version, 10)
    feeds, _ = case.data_sets[0]
    model = case.model.SerializeToString()
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = session(case.model, devices=[device(GPU)])
    runs = [max(float(np.abs(np.asarray(a) - np.asarray(b)).max()) for a, b in zip(sess.run(None, feeds), ref))
            for _ in range(6)]
    if not hasattr(sess, "get_provider_graph_assignment_info"):  # onnxruntime 1.23
        return {"errors": runs, "on_gpu": None}
    on_gpu = sorted(n.op_type for s in sess.get_provider_graph_assignment_info() if s.ep_name == GPU
                    for n in s.get_nodes())
    return {"errors": runs, "on_gpu": on_gpu}


def full_device_memory() -> dict:
    """A simulated GPU with 3 MiB of memory. A 4 MiB feed: onnxruntime copies it into a value it could
    not allocate. A 2 MiB OrtValue made while another holds 2 MiB gets no memory (onnxruntime makes it
    with a NULL data pointer and raises nothing); bound as an input after the other is freed, and as
    the destination of a copy. Each must fail as out of memory, every time."""
    import tempfile

    from onnx import helper

    from tests.models import make, vi

    src = (Path(plugin.__file__).resolve().parents[2] / "simulators/profiles/generic-gpu.toml").read_text()
    profile = Path(tempfile.mkdtemp()) / "small-gpu.toml"
    profile.write_text(src.replace('name = "generic-gpu"', 'name = "small-gpu"')
                       .replace("capacity_mib = 4096", "capacity_mib = 3"))
    plugin.configure(profiles=[str(profile)])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    dev = device(GPU)
    info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    n = 1 << 19  # 2 MiB of float32
    model = make([helper.make_node("ReduceSum", ["x"], ["y"], name="sum", keepdims=1)], [vi("x", ["n"])], [vi("y", [1])])
    sess = session(model, devices=[dev])

    def outcome(fn) -> str:
        try:
            return f"value {fn()}"
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    # A feed larger than the device: onnxruntime's copy of it goes to a value with no memory.
    oversized = [outcome(lambda: sess.run(None, {"x": np.ones(2 * n, np.float32)})[0].tolist()) for _ in range(2)]
    plain_err = float(np.abs(sess.run(None, {"x": np.ones(n, np.float32)})[0] - n).max())
    try:  # OrtValues in a plugin EP's memory: onnxruntime's Python API has memory_info= from 1.26 or so
        holder = ort.OrtValue.ortvalue_from_shape_and_type([n], np.float32, memory_info=info)
    except TypeError:
        return {"oversized_runs": oversized, "plain_err": plain_err}
    starved = ort.OrtValue.ortvalue_from_shape_and_type([n], np.float32, memory_info=info)
    del holder

    def bound_run():
        binding = sess.io_binding()
        binding.bind_ortvalue_input("x", starved)
        binding.bind_output("y")
        sess.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0].tolist()

    ones = ort.OrtValue.ortvalue_from_numpy(np.ones(n, np.float32))
    return {"oversized_runs": oversized, "plain_err": plain_err, "bound_runs": [outcome(bound_run) for _ in range(3)],
            "copies": [outcome(lambda: ort.copy_tensors([ones], [starved], None)) for _ in range(2)]}


def stale_handles() -> dict:
    """``ep_device.memory_info()`` and ``ep_device.device`` used after the library is unregistered
    (onnxruntime's Python objects point at what the library made): readable, an OrtValue there is an
    error, and registering again and again reuses them (a fixed count) with sessions that work."""
    from onnxhal.ort_plugin import kept_handles

    register()
    dev = device(GPU)
    info, hw = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT), dev.device
    ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)
    out: dict = {}
    try:  # the SIGSEGV of onnxruntime 1.28 to 1.32, with the memory info freed
        ort.OrtValue.ortvalue_from_shape_and_type([2], np.float32, memory_info=info)
        out["value_error"] = None
    except TypeError:  # no memory_info= in this onnxruntime's Python API (before 1.26 or so)
        out["value_error"] = "unsupported"
    except Exception as e:
        out["value_error"] = f"{type(e).__name__}: {e}"
    out.update({"name": info.name, "hw": [hw.vendor, hw.metadata.get("simulator_profile")]})
    counts, errs = [], []
    for _ in range(5):
        register()
        errs.append(add_mul_error(session(add_mul_model(), devices=[device(NPU)])))
        ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)
        counts.append(kept_handles.counts())
    out.update({"counts": counts, "errs": errs, "name_after": info.name})
    return out


def device_memory() -> dict:
    """The simulated devices' memory declared to onnxruntime: its OrtValues live there, its copies
    go through the bridge's data transfer, IOBinding keeps inputs and outputs on the device."""
    import collections

    from onnxhal.ort_plugin import dispatch

    register()
    model = add_mul_model()
    out: dict = {}
    calls: collections.Counter = collections.Counter()
    for call in (dispatch.D_COPY_TENSORS, dispatch.A_ALLOC, dispatch.C_COMPUTE):
        def spy(target, args, _h=dispatch.HANDLERS[call], _c=call):
            calls[dispatch._CALL_NAMES[_c]] += 1
            return _h(target, args)

        dispatch.HANDLERS[call] = spy
    for ep in (NPU, GPU):
        dev = device(ep)
        info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
        sess = session(model, devices=[dev])
        out[ep] = {"memory_info": info.name}
        try:  # OrtValues in a plugin EP's memory: onnxruntime's Python API has memory_info= from 1.25 or so
            x_dev = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, memory_info=info)
        except TypeError:
            x_dev = None
        if x_dev is not None:
            ort.copy_tensors([ort.OrtValue.ortvalue_from_numpy(ADD_MUL_X)], [x_dev], None)
            y_dev = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32, memory_info=info)
            binding = sess.io_binding()
            binding.bind_ortvalue_input("x", x_dev)
            binding.bind_ortvalue_output("y", y_dev)
            calls.clear()
            sess.run_with_iobinding(binding)
            out[ep]["iobinding_calls"] = dict(calls)
            y_host = ort.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
            ort.copy_tensors([y_dev], [y_host], None)
            out[ep]["iobinding_err"] = float(np.abs(y_host.numpy() - add_mul_reference(ADD_MUL_X)).max())
        calls.clear()
        plain_err = add_mul_error(sess)
        # the run's copies as the EP's meter counts them (a copy on the device counts at both ends)
        last = next(c["last_run"] for c in plugin.simulated_costs() if c["ep"] == ep)
        out[ep].update({"plain_calls": dict(calls), "plain_err": plain_err,
                        "plain_transfers": [last["transfers"], last["transfer_bytes"]]})
    ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)
    plugin.configure(profiles=PROFILES, device_memory=False)
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    calls.clear()
    sess = session(model, devices=[device(NPU)])
    out["host_only"] = {"memory_info": device(NPU).memory_info(ort.OrtDeviceMemoryType.DEFAULT) is not None,
                        "err": add_mul_error(sess), "calls": dict(calls)}
    return out


def device_cpu_device_model():
    """x -> Add -> Mul (device) -> Erf (generic-npu has none: onnxruntime's CPU EP) -> Add -> Mul
    (device) -> y, on [64, 64]: values cross from the NPU's stream to the host and back."""
    from onnx import TensorProto, helper, numpy_helper

    c = [numpy_helper.from_array(np.full(64, v, np.float32), n) for n, v in (("c1", 0.5), ("c2", 0.25))]
    nodes = [helper.make_node("Add", ["x", "c1"], ["a"], name="a1"), helper.make_node("Mul", ["a", "c2"], ["m"], name="m1"),
             helper.make_node("Erf", ["m"], ["e"], name="erf"), helper.make_node("Add", ["e", "x"], ["b"], name="a2"),
             helper.make_node("Mul", ["b", "c2"], ["y"], name="m2")]
    graph = helper.make_graph(nodes, "streams", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])], c)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def sync_streams() -> dict:
    """The simulated NPU's streams inside onnxruntime: a model going device -> CPU EP -> device run
    with onnxruntime's streams and notifications, against the same profile with host memory only
    (no streams) and onnxruntime's CPU EP; an IOBinding output in the device's memory."""
    import collections

    from onnxhal.ort_plugin import dispatch, streams

    model = device_cpu_device_model()
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    plugin.configure(profiles=PROFILES, device_memory=False)
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    plain = session(model, devices=[device(NPU)])
    without = [plain.run(None, {"x": x})[0] for _ in range(3)]
    plain_assignment = assignment(plain)
    del plain
    ort.unregister_execution_provider_library(plugin.REGISTRATION_NAME)
    register()
    calls: collections.Counter = collections.Counter()
    # OrtEp::CreateSyncStreamForDevice is answered in bridge.c, without Python: counted when such a
    # stream gets its hal stream (streams.lazy_session_stream)
    make_adapter = streams.StreamAdapter.__init__

    def counted_adapter(self, api, stream, ep=None, address=0):
        calls["OrtEp::CreateSyncStreamForDevice"] += bool(address)
        make_adapter(self, api, stream, ep, address)

    streams.StreamAdapter.__init__ = counted_adapter
    for call in (dispatch.F_IS_STREAM_AWARE, dispatch.S_CREATE_NOTIFICATION,
                 dispatch.N_ACTIVATE, dispatch.N_WAIT_ON_DEVICE, dispatch.N_WAIT_ON_HOST, dispatch.S_FLUSH,
                 dispatch.D_COPY_TENSORS):
        def spy(target, args, _h=dispatch.HANDLERS[call], _c=call):
            calls[dispatch._CALL_NAMES[_c]] += 1
            if _c == dispatch.D_COPY_TENSORS:  # copies onnxruntime queues on a stream
                calls["copies on a stream"] += bool(args[2]) and any(w for w in _words(args[2], args[3]))
            return _h(target, args)

        dispatch.HANDLERS[call] = spy
    dev = device(NPU)
    sess = session(model, devices=[dev])
    runs = 20
    with_streams = [sess.run(None, {"x": x})[0] for _ in range(runs)]
    out = {"backend": dev.ep_metadata.get("backend"), "assignment": assignment(sess),
           "plain_assignment": plain_assignment, "calls": dict(calls),
           "streams_vs_without": max(float(np.abs(w - without[0]).max()) for w in with_streams),
           "without_repeat": max(float(np.abs(w - without[0]).max()) for w in without),
           "streams_vs_cpu": float(np.abs(with_streams[0] - ref).max())}
    info = dev.memory_info(ort.OrtDeviceMemoryType.DEFAULT)
    try:  # an OrtValue in a plugin EP's memory: onnxruntime's Python API has memory_info= from about 1.25
        y_dev = ort.OrtValue.ortvalue_from_shape_and_type([64, 64], np.float32, memory_info=info)
    except TypeError:
        y_dev = None
    if y_dev is not None:
        binding = sess.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_ortvalue_output("y", y_dev)
        sess.run_with_iobinding(binding)
        y_host = ort.OrtValue.ortvalue_from_shape_and_type([64, 64], np.float32)
        ort.copy_tensors([y_dev], [y_host], None)
        out["iobinding"] = {"device": y_dev.device_name(), "memory": binding.get_outputs()[0].device_name(),
                            "vs_without": float(np.abs(y_host.numpy() - without[0]).max())}
    return out


def _words(address: int, count: int) -> list[int]:
    from onnxhal.ort_plugin.structs import words

    return words(address, count)


def before_virtual_devices() -> dict:
    """onnxruntime 1.23: no virtual devices, so the simulated EPs sit on its CPU hardware device."""
    register()
    devices = {d.ep_name: (d.device.type.name, d.ep_metadata.get("simulator_profile")) for d in ort.get_ep_devices()}
    sess = session(add_mul_model(), devices=[device(NPU)])
    return {"devices": devices, "providers": sess.get_providers(), "err": add_mul_error(sess)}


def hooks() -> dict:
    """The hal hooks of onnxruntime 1.24 and later (tests/plugins/hooks_ep.py): which ones onnxruntime
    itself calls (counted at the bridge's dispatcher) and what the EP sees: concurrent runs on an EP
    that cannot take them, sync, session-initialization end, hardware-incompatibility details."""
    from onnxhal.ort_plugin import dispatch as d
    from onnxhal.ort_plugin import library
    from onnxhal.ort_plugin.structs import negotiated_version

    by_ort: dict[str, int] = {}
    for call in ("E_SYNC", "E_ON_SESSION_INITIALIZATION_END", "F_GET_INCOMPATIBILITY_DETAILS"):
        handler = d.HANDLERS[getattr(d, call)]

        def counted(target, args, call=call, handler=handler):
            by_ort[call] = by_ort.get(call, 0) + 1
            return handler(target, args)

        d.HANDLERS[getattr(d, call)] = counted
    path = Path(__file__).resolve().parent / "plugins" / "hooks_ep.py"
    plugin.configure(library=str(path))
    ort.register_execution_provider_library("hooks", plugin.library_path())
    hooks_module = next(m for m in list(sys.modules.values())
                        if getattr(m, "__file__", None) and Path(m.__file__).resolve() == path)
    out: dict = {"declared_version": negotiated_version(library.bound_api(0).api_version)}
    model = add_mul_model()
    for concurrent in ("0", "1"):
        hooks_module.LOG.clear()
        hooks_module.STATE["in_flight_max"] = 0
        sess = session(model, devices=[device("HooksExecutionProvider")], options={"concurrent": concurrent})
        log_after_init = [e[0] for e in hooks_module.LOG]
        errors: list[float] = []

        def run(sess=sess, errors=errors) -> None:
            for _ in range(3):
                errors.append(add_mul_error(sess))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        events = [e[0] for e in hooks_module.LOG]
        # IOBinding's synchronize calls reach the EP's sync (onnxruntime's Sync member, API 25).
        hooks_module.LOG.clear()
        binding = sess.io_binding()
        binding.bind_cpu_input("x", ADD_MUL_X)
        binding.bind_output(sess.get_outputs()[0].name)
        binding.synchronize_inputs()
        sess.run_with_iobinding(binding)
        binding.synchronize_outputs()
        binding_events = [e[0] for e in hooks_module.LOG]
        out[f"concurrent_{concurrent}"] = {
            "binding_events": binding_events,
            "in_flight_max": hooks_module.STATE["in_flight_max"], "err": max(errors), "runs": len(errors),
            "log_after_init": log_after_init, "syncs": events.count("sync"),
            "init_ends": events.count("on_session_initialization_end"),
            "init_end_before_first_run": (events.index("on_session_initialization_end")
                                          < events.index("on_run_start")) if "on_session_initialization_end" in events
            else None,
            "asked_concurrency": events.count("is_concurrent_run_supported")}
        del sess
    from onnxruntime.capi import onnxruntime_pybind11_state as C  # the query is not re-exported (1.26-1.32)

    query = getattr(C, "get_hardware_device_ep_incompatibility_details", None)
    if query is not None:
        cpu = next(hw for hw in C.get_hardware_devices() if hw.type == C.OrtHardwareDeviceType.CPU)
        compatible = query("HooksExecutionProvider", cpu)
        hooks_module.INCOMPATIBLE.update(reasons=1, notes="driver 1.0 is too old; install 2.0", code=7)
        incompatible = query("HooksExecutionProvider", cpu)
        out["incompatibility"] = [{k: int(v) if k != "notes" else v for k, v in dict(r).items()}
                                  for r in (compatible, incompatible)]
    out["by_ort"] = dict(by_ort)  # before the sessions below make calls of their own
    # get_default_memory_device (OrtEp::GetDefaultMemoryDevice, API 27): host memory is no device
    # memory (NULL), memory the EP device does not declare fails the session with onnxhal's error.
    out["default_memory"] = {}
    for choice in ("host", "undeclared"):
        printed = io.StringIO()
        try:  # onnxruntime's Python API prints an EP's session-creation error and falls back to the CPU EP
            with contextlib.redirect_stdout(printed):
                s = session(model, devices=[device("HooksExecutionProvider")], options={"memory_device": choice})
            out["default_memory"][choice] = {"providers": providers_used(s), "err": add_mul_error(s),
                                             "error": printed.getvalue()}
            del s
        except Exception as e:  # noqa: BLE001 - the check reports what onnxruntime raised
            out["default_memory"][choice] = {"error": f"{type(e).__name__}: {e}"}
    # The EP's own EpProfiler (hal.Ep.create_profiler): its events join onnxruntime's profile (API 25+).
    hooks_module.LOG.clear()
    events = profiled_runs(model, "HooksExecutionProvider", runs=2)
    out["profile"] = {"ep_events": [(e["name"], e["cat"], e["args"].get("run")) for e in events
                                    if e["name"] == "hooks_compute"],
                      "onnxhal_events": sum(e["name"].endswith("_onnxhal_compute") for e in events),
                      "ort_kernel_events": sum(e["name"].endswith("_kernel_time") for e in events),
                      "created": [e[0] for e in hooks_module.LOG].count("create_profiler")}
    return out


def profiled_runs(model, ep_name: str, runs: int = 3, options: dict | None = None) -> list[dict]:
    """The events of onnxruntime's JSON profile of ``runs`` runs of ``model`` on ``ep_name``'s device."""
    import tempfile

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort_profile")
    so.add_provider_for_devices([device(ep_name)], options or {})
    sess = ort.InferenceSession(model.SerializeToString(), so)
    for _ in range(runs):
        sess.run(None, {"x": ADD_MUL_X})
    with open(sess.end_profiling()) as f:
        return json.load(f)


#: Runs profiled by ``profiling``: enough that an event shifted against onnxruntime's clock shows.
PROFILED_RUNS = 20


def profiling() -> dict:
    """onnxruntime's profile of a session on the simulated NPU: onnxhal's partition events (API 25+)."""
    import tempfile

    import onnxhal
    from onnxhal.ort_plugin import library

    register()
    events = profiled_runs(add_mul_model(), NPU, runs=PROFILED_RUNS)
    # onnxhal's own session on the same profile: the simulated device time of its partition
    from onnxhal.simulators import register_simulators

    register_simulators(PROFILES)
    hso = onnxhal.SessionOptions()
    hso.enable_profiling = True
    hso.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "own")
    hso.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
    own = onnxhal.InferenceSession(add_mul_model().SerializeToString(), hso)
    own.run(None, {"x": ADD_MUL_X})
    with open(own.end_profiling()) as f:
        own_us = [e["args"]["sim_device_us"] for e in json.load(f)
                  if e["args"].get("provider") == NPU and "sim_device_us" in e["args"]]
    kernels = [e for e in events if e["name"].endswith("_kernel_time") and e["args"].get("provider") == NPU]
    mine = [e for e in events if e["name"].endswith("_onnxhal_compute")]
    # each onnxhal event lies inside onnxruntime's event for the same fused node's run (1 us of rounding)
    nested = [any(k["name"] == e["name"].replace("_onnxhal_compute", "_kernel_time")
                  and k["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= k["ts"] + k["dur"] + 1 for k in kernels)
              for e in mine]
    return {"api": library.bound_api(0).api_version, "ort_kernel_events": len(kernels), "onnxhal_events": len(mine),
            "nested": nested, "categories": sorted({e["cat"] for e in mine}), "own_sim_device_us": own_us,
            "args": [{k: e["args"].get(k) for k in ("provider", "sim_device", "sim_device_us", "sim_dtype")}
                     for e in mine]}


def default_memory_device() -> dict:
    """OrtEp::GetDefaultMemoryDevice (API 27) of the simulated NPU: what the bridge answers, and a run."""
    from onnxhal.ort_plugin import dispatch as d
    from onnxhal.ort_plugin import library
    from onnxhal.ort_plugin.device_memory import memory_device_of

    answers: list = []
    handler = d.HANDLERS[d.E_GET_DEFAULT_MEMORY_DEVICE]

    def recorded(ep, args):
        handler(ep, args)
        written = ctypes.cast(args[0], ctypes.POINTER(ctypes.c_void_p))[0]
        answers.append({"answer": str(memory_device_of(ep.api, written)) if written else None,
                        "ep_memory": str(ep.ep.memory_info.memory_device)})

    d.HANDLERS[d.E_GET_DEFAULT_MEMORY_DEVICE] = recorded
    register()
    sess = session(add_mul_model(), devices=[device(NPU)])
    return {"api": library.bound_api(0).api_version, "answers": answers, "err": add_mul_error(sess),
            "providers": providers_used(sess)}


def not_attached() -> dict:
    """onnxruntime loads the library without onnxhal's Python side attached: a clear error."""
    from onnxhal.ort_plugin.build import bridge_library

    try:
        ort.register_execution_provider_library("bare.virtual", str(bridge_library()))
        return {"error": None}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def wrong_name() -> dict:
    """Virtual devices need a registration name ending in '.virtual' (onnxruntime's rule)."""
    plugin.configure(profiles=PROFILES)
    try:
        ort.register_execution_provider_library("onnxhal", plugin.library_path())
        return {"error": None}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def ml_shapes() -> dict:
    """skl2onnx pipelines whose values after ai.onnx.ml operators onnxruntime leaves without a rank:
    the nodes the GPU takes through onnxruntime (ml_value_types.py on, and off by its config key)
    and in onnxhal's own session (optimizers off in all, so all see the model's own nodes), and the
    outputs' error against onnxruntime's CPU EP."""
    os.environ["ONNXHAL_SIMULATE"] = ",".join(PROFILES)
    import onnx

    import onnxhal
    from onnxhal.ort_plugin.ml_value_types import BRIDGE_ML_SHAPES_KEY
    from onnxhal.simulators.profiles import load_profile

    register()
    corpus = Path(__file__).resolve().parent / "real_models"
    policy = ort.OrtExecutionProviderDevicePolicy.PREFER_GPU
    result: dict = {"tolerance": [load_profile("generic-gpu").rtol, load_profile("generic-gpu").atol]}
    for name in ("skh_countvec", "skh_mlp"):
        model = onnx.load(str(corpus / f"{name}.onnx"))
        data = np.load(corpus / f"{name}.npz")
        feeds = {i.name: data[f"a.{i.name}"] for i in model.graph.input}  # the corpus's first feeds
        ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        case: dict = {}
        for mode, value in (("on", "1"), ("off", "0")):
            so = ort.SessionOptions()
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
            so.add_session_config_entry(BRIDGE_ML_SHAPES_KEY, value)
            so.set_provider_selection_policy(policy)
            sess = ort.InferenceSession(model.SerializeToString(), so)
            out = sess.run(None, feeds)
            case[mode] = assignment(sess).get(GPU, [])
            case[f"{mode}_err"] = max(float(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).max())
                                      for a, b in zip(out, ref) if np.asarray(b).dtype.kind in "fiu")
        hso = onnxhal.SessionOptions()
        hso.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
        hso.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_GPU)
        hso.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        case["onnxhal"] = assignment(onnxhal.InferenceSession(model.SerializeToString(), hso)).get(GPU, [])
        case["scale"] = max(float(np.abs(np.asarray(b, np.float64)).max()) for b in ref if np.asarray(b).dtype.kind in "fiu")
        result[name] = case
    return result


if __name__ == "__main__":
    result = globals()[sys.argv[1]]()
    print(json.dumps(result))
    sys.stdout.flush()
