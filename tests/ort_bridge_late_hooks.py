"""Checks of the OrtEpFactory / OrtEp members that arrived after onnxruntime 1.23 and reach a hal
library's hooks: the factory's custom-op domains (``GetNumCustomOpDomains`` / ``GetCustomOpDomains``,
1.24) and the EP's free device memory (``GetAvailableResource``, 1.26). One check per subprocess
(``python -m tests.ort_bridge_late_hooks NAME`` prints a JSON line last), run by
tests/test_ort_plugin_late_hooks.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import onnxruntime as ort  # noqa: E402

import onnxhal.ort_plugin as plugin  # noqa: E402

PLUGINS = Path(__file__).resolve().parent / "plugins"
X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def _load(file: str, registration: str):
    path = PLUGINS / file
    plugin.configure(library=str(path))
    ort.register_execution_provider_library(registration, plugin.library_path())
    return next(m for m in list(sys.modules.values())
                if getattr(m, "__file__", None) and Path(m.__file__).resolve() == path)


def _model(nodes, inits=(), custom=True):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], list(inits))
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.example", 1)] if custom else [])
    return helper.make_model(g, opset_imports=opsets, ir_version=10).SerializeToString()


def _assignment(sess) -> dict[str, list[str]]:
    if not hasattr(sess, "get_provider_graph_assignment_info"):  # not in 1.23's Python API
        return {}
    out: dict[str, list[str]] = {}
    for sub in sess.get_provider_graph_assignment_info():
        out.setdefault(sub.ep_name, []).extend(n.name for n in sub.get_nodes())
    return {k: sorted(v) for k, v in out.items()}


def _session(model: bytes, ep_name: str | None, config: dict | None = None, policy=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    if policy is not None:
        so.set_provider_selection_policy(policy)
    if ep_name is not None:
        so.add_provider_for_devices([d for d in ort.get_ep_devices() if d.ep_name == ep_name], {})
    return ort.InferenceSession(model, so)


def custom_ops() -> dict:
    """A model using the factory's custom ops (tests/plugins/custom_op_ep.py) in onnxruntime, next to
    the same computation in standard ops on onnxruntime's CPU EP."""
    mod = _load("custom_op_ep.py", "custom")
    custom = _model([
        helper.make_node("Triple", ["x"], ["t"], name="triple", domain="com.example"),
        helper.make_node("Relu", ["t"], ["r"], name="relu"),
        helper.make_node("ScaleShift", ["r"], ["y"], name="scale_shift", domain="com.example", alpha=0.5, beta=1.25,
                         tag="hi", axes=[1, 2])])
    standard = _model([
        helper.make_node("Mul", ["x", "three"], ["t"]), helper.make_node("Relu", ["t"], ["r"]),
        helper.make_node("Mul", ["r", "alpha"], ["s"]), helper.make_node("Add", ["s", "beta"], ["y"])],
        [numpy_helper.from_array(np.float32(v), n) for n, v in (("three", 3), ("alpha", 0.5), ("beta", 1.25))],
        custom=False)
    reference = ort.InferenceSession(standard).run(None, {"x": X})[0]
    out: dict = {"api": int(ort.__version__.split(".")[1])}
    for how in ("explicit", "policy"):
        mod.CREATED.clear()
        try:
            sess = (_session(custom, "CustomOpsExecutionProvider") if how == "explicit"
                    else _session(custom, None, policy=ort.OrtExecutionProviderDevicePolicy.PREFER_CPU))
            y = sess.run(None, {"x": X})[0]
            out[how] = {"error": None, "max_abs_err": float(np.max(np.abs(y - reference))),
                        "assignment": _assignment(sess),
                        "created": [list(c[:4]) + [c[4]] for c in mod.CREATED]}
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[how] = {"error": f"{type(e).__name__}: {e}"}
    mod.CREATED.clear()
    try:  # an op naming the library's EP: that EP claims it and runs it, the CPU EP the other
        both = _model([helper.make_node("EpTriple", ["x"], ["t"], name="ep_triple", domain="com.example"),
                       helper.make_node("Triple", ["t"], ["y"], name="triple", domain="com.example")])
        sess = _session(both, "CustomOpsExecutionProvider")
        y = sess.run(None, {"x": X})[0]
        out["on_ep"] = {"error": None, "max_abs_err": float(np.max(np.abs(y - X * 9))),
                        "assignment": _assignment(sess), "created": [c[0] for c in mod.CREATED]}
    except Exception as e:  # noqa: BLE001
        out["on_ep"] = {"error": f"{type(e).__name__}: {e}"}
    try:  # without the library's EP in the session: onnxruntime knows no such op
        ort.InferenceSession(custom, providers=["CPUExecutionProvider"])
        out["cpu_only"] = None
    except Exception as e:  # noqa: BLE001
        out["cpu_only"] = str(e)
    # typed errors, as onnxruntime's errors: a kernel's own, an attribute first read at run time, an
    # output of another type than onnxruntime gave it
    for op, attrs in (("Fails", {}), ("LateAttribute", {"alpha": 2.0}), ("AsDouble", {})):
        try:
            model = _model([helper.make_node(op, ["x"], ["y"], name=op.lower(), domain="com.example", **attrs)])
            _session(model, "CustomOpsExecutionProvider").run(None, {"x": X})
            out[op] = None
        except Exception as e:  # noqa: BLE001
            out[op] = str(e)
    return out


def available_resource() -> dict:
    """Four Adds, each claimed alone by tests/plugins/budget_ep.py's EP, under resource-aware
    partitioning with no budget in the session config: onnxruntime asks the EP for its free memory
    and assigns nodes to it while their estimated cost fits."""
    mod = _load("budget_ep.py", "budget")
    n = 4
    inits = [numpy_helper.from_array(np.full([256], i + 1, np.float32), f"w{i}") for i in range(n)]
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"h{i - 1}", f"w{i}"], [f"h{i}" if i < n - 1 else "y"],
                              name=f"add{i}") for i in range(n)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [256])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    reference = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    out: dict = {"api": int(ort.__version__.split(".")[1]), "budgets": {}}
    for budget in (None, 0, 3072, 6144, 9216, 12288, 10**9):
        mod.BUDGET["bytes"] = budget
        mod.ASKED.clear()
        try:
            sess = _session(model, "CUDAExecutionProvider", {"session.resource_cuda_partitioning_settings": ","})
            y = sess.run(None, {"x": x})[0]
            out["budgets"][str(budget)] = {"asked": list(mod.ASKED), "assignment": _assignment(sess),
                                           "max_abs_err": float(np.max(np.abs(y - reference))), "error": None}
        except Exception as e:  # noqa: BLE001
            out["budgets"][str(budget)] = {"asked": list(mod.ASKED), "error": f"{type(e).__name__}: {e}"}
    mod.BUDGET["bytes"] = -5  # not a byte count: onnxhal's typed error, logged by onnxruntime
    mod.ASKED.clear()
    try:
        sess = _session(model, "CUDAExecutionProvider", {"session.resource_cuda_partitioning_settings": ","})
        out["negative"] = {"asked": list(mod.ASKED), "assignment": _assignment(sess), "error": None}
    except Exception as e:  # noqa: BLE001
        out["negative"] = {"asked": list(mod.ASKED), "error": f"{type(e).__name__}: {e}"}
    return out


if __name__ == "__main__":
    result = globals()[sys.argv[1]]()
    print(json.dumps(result))
    sys.stdout.flush()
