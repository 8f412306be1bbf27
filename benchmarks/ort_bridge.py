"""The onnxruntime bridge's cost: onnxhal's simulated devices inside real onnxruntime.

    python benchmarks/ort_bridge.py [--profile generic-gpu] [--repeat 200] [--models identity,cnn,encoder]

For each model, in one process and alternating run by run, medians of:

- ``ort cpu``: onnxruntime's own CPU EP (the baseline);
- ``ort + bridge``: onnxruntime with the model on the simulated device through onnxhal's plugin EP
  library (``onnxhal.ort_plugin``): every run crosses into Python once per partition;
- ``onnxhal``: onnxhal's own session on the same simulated device.

``identity`` (a single Identity on a float32 [1, 16]) measures the per-call overhead of the bridge:
``ort + bridge`` minus ``ort cpu``. The simulated devices run on the host backend or OpenCL, as the
machine allows (the table's title says which); both sides use the same profile.

Threads as in bench.py: onnxruntime's sessions get ``--threads`` intra-op threads without spinning
(spinning threads take the cores from the Python side that follows on a 2-core VM), onnxhal's
session the same number (its BLAS threads), and OpenBLAS's idle threads stop spinning after
2^22 cycles (``OPENBLAS_THREAD_TIMEOUT``, set before numpy is imported unless already set).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402


def identity() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def build(name: str) -> onnx.ModelProto:
    from benchmarks import models

    if name == "identity":
        return identity()
    if name == "cnn":
        return models.cnn(image=64, classes=10)
    if name == "encoder":
        return models.encoder(seq=32, hidden=128, heads=4, ffn=256)
    raise SystemExit(f"unknown model {name!r}: identity, cnn, encoder")


def feeds_for(name: str, model: onnx.ModelProto) -> dict[str, np.ndarray]:
    from benchmarks import models

    if name == "identity":
        return {"x": np.arange(16, dtype=np.float32).reshape(1, 16)}
    return models.feeds(model)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="generic-gpu",
                   help="simulated device profile (default generic-gpu: generic-npu does not run Identity)")
    p.add_argument("--models", default="identity,cnn,encoder")
    p.add_argument("--repeat", type=int, default=200, help="timed runs per side (default 200)")
    p.add_argument("--threads", type=int, default=2, help="intra-op threads on every side (default 2)")
    p.add_argument("--host-memory", action="store_true",
                   help="configure(device_memory=False): onnxruntime sees host memory, the bridge copies")
    args = p.parse_args(argv)

    os.environ["ONNXHAL_SIMULATE"] = args.profile
    import onnxruntime as ort

    import onnxhal
    import onnxhal.ort_plugin as plugin
    from onnxhal.simulators import EP_NAMES

    plugin.configure(profiles=[args.profile], device_memory=not args.host_memory)
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name in EP_NAMES)
    hal_device = next(d for d in onnxhal.get_ep_devices() if d.ep_name in EP_NAMES)
    backend = device.ep_metadata.get("backend", "?")
    memory = "host memory only" if args.host_memory else "device memory declared to onnxruntime"
    print(f"onnxruntime {ort.__version__}, {device.ep_name} ({args.profile}) on the {backend} backend, {memory}; "
          f"medians of {args.repeat} runs, alternating; times in microseconds")
    print(f"{'model':10} {'ort cpu':>10} {'ort + bridge':>13} {'onnxhal':>10} {'bridge - cpu':>13} {'nodes on device':>16}")
    for name in args.models.split(","):
        model = build(name)
        data = model.SerializeToString()
        feeds = feeds_for(name, model)
        # onnxruntime's and onnxhal's optimizers both remove an Identity: keep it, to time one partition.
        keep = name == "identity"
        cso = ort.SessionOptions()
        so = ort.SessionOptions()
        hso = onnxhal.SessionOptions()
        for o in (cso, so):
            o.intra_op_num_threads = args.threads
            o.add_session_config_entry("session.intra_op.allow_spinning", "0")
        hso.intra_op_num_threads = args.threads
        if keep:
            cso.graph_optimization_level = so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            hso.graph_optimization_level = onnxhal.GraphOptimizationLevel.ORT_DISABLE_ALL
        cpu = ort.InferenceSession(data, cso, providers=["CPUExecutionProvider"])
        so.add_provider_for_devices([device], {})
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        bridged = ort.InferenceSession(data, so)
        on_device = sum(len(s.get_nodes()) for s in bridged.get_provider_graph_assignment_info()
                        if s.ep_name == device.ep_name)
        hso.add_provider_for_devices([hal_device], {})
        own = onnxhal.InferenceSession(data, hso)
        times: dict[str, list[float]] = {"cpu": [], "bridge": [], "own": []}
        for _ in range(5):
            for s in (cpu, bridged, own):
                s.run(None, feeds)
        for _ in range(args.repeat):
            for key, s in (("cpu", cpu), ("bridge", bridged), ("own", own)):
                t = time.perf_counter()
                s.run(None, feeds)
                times[key].append(time.perf_counter() - t)
        med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
        print(f"{name:10} {med['cpu']:10.1f} {med['bridge']:13.1f} {med['own']:10.1f} "
              f"{med['bridge'] - med['cpu']:13.1f} {on_device:16d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
