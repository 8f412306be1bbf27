"""How closely a profile's partition follows a real EP's: onnxruntime's OpenVINO EP
(``onnxruntime-ep-openvino``, a plugin EP library; it offers a device only on Intel hardware) against
the intel-npu / intel-gpu profiles through onnxhal's plugin, on the corpus models with dims fixed.

    pip install onnxruntime-ep-openvino
    python benchmarks/openvino_fidelity.py [--profile intel-npu] [--models a,b] [--device CPU]

Both run inside one onnxruntime at its basic optimization level (constant folding and the rewrites that
run before partitioning, the same for every EP), so they see the same nodes; for
each model the script records which nodes onnxruntime assigned to each EP and prints, per model and
in total, the share of nodes both put on the same side (device or CPU EP) and the nodes only one of
them took. The OpenVINO EP here runs on the machine's own device (an Intel CPU offers ``CPU``): the
intel-npu profile follows OpenVINO's CPU/NPU operator list, so that is the comparison it supports;
an Intel GPU or NPU would compare intel-gpu or intel-npu with the real device.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "real_models"


def assignment(ort, path: str, devices: list, dims: dict[str, int]) -> dict[str, str]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.log_severity_level = 3
    for name, size in dims.items():
        so.add_free_dimension_override_by_name(name, size)
    so.add_provider_for_devices(devices, {})
    sess = ort.InferenceSession(path, so)
    return {n.name: sub.ep_name for sub in sess.get_provider_graph_assignment_info() for n in sub.get_nodes()}


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="intel-npu")
    p.add_argument("--device", default="CPU", help="the OpenVINO device to compare with (ep_metadata ov_device)")
    p.add_argument("--models", default="", help="comma-separated corpus names (default: the float exports)")
    args = p.parse_args(argv)
    try:
        import onnxruntime as ort
        import onnxruntime_ep_openvino as ov
    except ImportError as e:
        print(f"openvino_fidelity: {e}; pip install onnxruntime onnxruntime-ep-openvino", file=sys.stderr)
        return 2
    import onnxhal.ort_plugin as plugin
    from onnxhal.sweep import _load, fed_dim_sizes

    ort.register_execution_provider_library("openvino", ov.get_library_path())
    plugin.configure(profiles=[args.profile])
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    real = [d for d in ort.get_ep_devices() if d.ep_name == "OpenVINOExecutionProvider"
            and d.ep_metadata.get("ov_device") == args.device]
    sim = [d for d in ort.get_ep_devices() if d.ep_name.startswith("Virtual")]
    if not real:
        print(f"openvino_fidelity: the OpenVINO EP offers no {args.device} device on this machine "
              f"({[dict(d.ep_metadata).get('ov_device') for d in ort.get_ep_devices()]})", file=sys.stderr)
        return 2
    names = [n for n in args.models.split(",") if n] or sorted(
        x.stem for x in CORPUS.glob("*.onnx") if x.stem.endswith(("_ts", "_dynamo")) and x.with_suffix(".npz").exists())
    same_total = nodes_total = 0
    print(f"{'model':<28}{'nodes':>6}{'same side':>11}{'only OpenVINO':>15}{'only profile':>14}")
    for name in names:
        path, feeds, _ = _load(str(CORPUS / f"{name}.onnx"), {})
        dims = fed_dim_sizes(path, feeds)
        try:
            a = assignment(ort, path, real[:1], dims)
            b = assignment(ort, path, sim[:1], dims)
        except Exception as e:  # a model one side cannot take: reported, not counted
            print(f"{name:<28} skipped: {type(e).__name__}: {str(e)[:120]}")
            continue
        common = set(a) & set(b)
        on_a = {n for n in common if a[n] != "CPUExecutionProvider"}
        on_b = {n for n in common if b[n] != "CPUExecutionProvider"}
        same = len(common) - len(on_a ^ on_b)
        same_total += same
        nodes_total += len(common)
        print(f"{name:<28}{len(common):>6}{same / max(len(common), 1):>11.0%}{len(on_a - on_b):>15}{len(on_b - on_a):>14}")
    print(f"{'all':<28}{nodes_total:>6}{same_total / max(nodes_total, 1):>11.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
