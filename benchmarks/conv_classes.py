"""Where convolution nets spend their time, by op family and convolution class, over many models:
each node's median kernel time from onnxhal's profiler and onnxruntime's (SessionOptions
enable_profiling, the same model and feeds, 2 threads each, alternating runs), summed per class.

    python benchmarks/conv_classes.py [--models 'tv_*,resnet*,...'] [--repeat 10] [--per-model]

A convolution's class comes from the shapes both profilers record (input_type_shape: the input and
the weights; output_type_shape): 1-D, 3-D, 1x1 (strided or not), kxk dense (strided or not),
depthwise, grouped; ConvTranspose is ``transposed``. onnxruntime runs many convolutions in its
NCHWc layout (com.microsoft.nchwc Conv, channels padded to its block, classified alike) and adds
ReorderInput/ReorderOutput nodes, shown as themselves; its Conv may carry a fused activation where
onnxhal's FusedConv carries bias, residual and activation, so compare the classes' totals, not
single nodes. Other ops are summed per op type.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import os
import statistics
import sys
import tempfile

if __name__ == "__main__":  # as bench.py: numpy's BLAS configured before numpy is imported
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "real_models")
#: The corpus's convolution nets (issue 44's list).
CNN_MODELS = ("tv_*,resnet*,mobilenet*,pt_unet,jx_cnn,yolov8_tiny,paddle_*,tf2onnx_*,hf_convnextv2,"
              "hf_mobilevit,cnn_ts_*")
CONV_OPS = ("Conv", "FusedConv", "QLinearConv", "ConvInteger")


def conv_class(op: str, shapes: list) -> str:
    """The class of one node from its recorded input and output shapes (its op type otherwise)."""
    if op == "ConvTranspose":
        return "conv transposed"
    if op not in CONV_OPS or len(shapes) < 2:
        return op
    x, w = shapes[0], shapes[1]
    if len(x) == 3:
        return "conv 1-D"
    if len(x) == 5:
        return "conv 3-D"
    if len(x) != 4 or len(w) != 4 or not w[1]:
        return "conv other"
    group = x[1] // w[1]
    if group > 1 and w[1] == 1:
        return "conv depthwise"
    if group > 1:
        return "conv grouped"
    k = "1x1" if w[2] == w[3] == 1 else f"{w[2]}x{w[3]}" if w[2] == w[3] else "kxl"
    return f"conv {k} dense"


def node_times(path: str) -> dict[str, tuple[float, str]]:
    """{node: (median ms over the runs, class)} of one Chrome trace."""
    with open(path) as f:
        events = json.load(f)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    classes: dict[str, str] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        durations[node].append(e["dur"] / 1e3)
        if node not in classes:
            args = e.get("args", {})
            shapes = [list(d.values())[0] for d in args.get("input_type_shape", []) if d]
            outs = [list(d.values())[0] for d in args.get("output_type_shape", []) if d]
            cls = conv_class(args.get("op_name", "?"), shapes)
            if cls.startswith("conv ") and "dense" in cls and outs and len(outs[0]) == 4 and shapes[0][2] > outs[0][2]:
                cls += " strided"
            classes[node] = cls
    return {node: (statistics.median(v), classes[node]) for node, v in durations.items()}


def profile(path: str, repeat: int, threads: int, out: str) -> tuple[dict, dict]:
    """(onnxhal's, onnxruntime's) node times on a corpus model's signature ``a``."""
    import onnxruntime as ort
    from real_models import signatures

    import onnxhal

    feeds = signatures(path)["a"][0]
    name = os.path.basename(path)[:-5]
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(out, f"ort_{name}")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = threads
    hso.enable_profiling = True
    hso.profile_file_prefix = os.path.join(out, f"onnxhal_{name}")
    ort_sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    hal_sess = onnxhal.InferenceSession(path, hso, providers=["CPUExecutionProvider"])
    for _ in range(3 + repeat):  # the warm-up runs are in the traces too; medians over runs
        ort_sess.run(None, feeds)
        hal_sess.run(None, feeds)
    return node_times(hal_sess.end_profiling()), node_times(ort_sess.end_profiling())


def per_class(nodes: dict) -> dict[str, list]:
    """{class: [ms, nodes]}."""
    sums: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for ms, cls in nodes.values():
        sums[cls][0] += ms
        sums[cls][1] += 1
    return sums


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=CNN_MODELS, help="comma-separated corpus names or patterns")
    p.add_argument("--corpus", default=CORPUS)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--per-model", action="store_true", help="also each model's classes")
    p.add_argument("--top", type=int, default=25, help="classes listed (largest onnxhal - onnxruntime first)")
    args = p.parse_args(argv)
    names = sorted(f[:-5] for f in os.listdir(args.corpus) if f.endswith(".onnx"))
    chosen = [n for n in names if any(fnmatch.fnmatch(n, pat) for pat in args.models.split(","))]
    out = tempfile.mkdtemp(prefix="onnxhal-classes-")
    print(f"{len(chosen)} models, load average {open('/proc/loadavg').read().split()[:3]}", flush=True)
    total_hal: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    total_ort: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for name in chosen:
        hal, ort_ = profile(os.path.join(args.corpus, name + ".onnx"), args.repeat, args.threads, out)
        hc, oc = per_class(hal), per_class(ort_)
        hs, os_ = sum(v[0] for v in hc.values()), sum(v[0] for v in oc.values())
        print(f"{name:24s} kernel ms onnxhal {hs:7.2f} ort {os_:7.2f} ({hs / max(os_, 1e-9):4.2f})", flush=True)
        for cls, (ms, k) in hc.items():
            total_hal[cls][0] += ms
            total_hal[cls][1] += k
        for cls, (ms, k) in oc.items():
            total_ort[cls][0] += ms
            total_ort[cls][1] += k
        if args.per_model:
            for cls in sorted(set(hc) | set(oc), key=lambda c: -(hc.get(c, [0])[0] - oc.get(c, [0])[0]))[:8]:
                print(f"    {cls:26s} {hc.get(cls, [0.0])[0]:7.2f} {oc.get(cls, [0.0])[0]:7.2f}")
    classes = sorted(set(total_hal) | set(total_ort), key=lambda c: -(total_hal[c][0] - total_ort[c][0]))
    print(f"\nsum over the models, ms per run (nodes): class, onnxhal, onnxruntime, difference; "
          f"load average {open('/proc/loadavg').read().split()[:3]}")
    for cls in classes[: args.top]:
        (h, hn), (o, on) = total_hal[cls], total_ort[cls]
        print(f"{cls:28s} {h:8.2f} ({hn:4d}) {o:8.2f} ({on:4d}) {h - o:+8.2f}")
    h, o = (sum(v[0] for v in t.values()) for t in (total_hal, total_ort))
    print(f"{'total':28s} {h:8.2f}        {o:8.2f}        {h - o:+8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
