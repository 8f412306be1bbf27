"""Where the time goes: per-operator totals of onnxhal and onnxruntime on one model, side by side.

    python benchmarks/op_breakdown.py MODEL [--repeat 10] [--top 15] [--threads 2]

MODEL is a ``bench.py`` name (mlp, cnn, encoder, chain, resnet50, shufflenet, ...) or a corpus
``.onnx`` file beside its ``.npz`` (tests/real_models, or make_corpus.py --size medium), run on its
stored signature ``a``. Both sessions
run with profiling on, alternating; the Chrome traces (kept in ``--out``, default a temporary
folder) give each node's median time over the runs, summed per op type. Fused nodes are reported
under the op type each runtime gave them (a Conv+Relu may be ``FusedConv`` on one side and ``Conv``
+ ``Relu`` on the other): compare the totals and the slowest nodes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

if __name__ == "__main__":  # as bench.py: numpy's BLAS configured before numpy is imported
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import models  # noqa: E402


def summarize(path: str) -> tuple[dict[str, float], dict[str, list]]:
    """({op type: ms per run}, {node: [ms per run, op type, output shapes]}) of one trace: each
    node's median over the runs (a shared 2-vCPU machine stalls single runs by tens of ms)."""
    with open(path) as f:
        events = json.load(f)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    per_node: dict[str, list] = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        node = e["name"][: -len("_kernel_time")]
        durations[node].append(e["dur"] / 1e3)
        per_node.setdefault(node, [0.0, e["args"].get("op_name", "?"),
                                   json.dumps(e["args"].get("output_type_shape", []))])
    per_op: dict[str, float] = collections.defaultdict(float)
    for node, entry in per_node.items():
        entry[0] = statistics.median(durations[node])
        per_op[entry[1]] += entry[0]
    return dict(per_op), per_node


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--repeat", type=int, default=10, help="profiled runs per runtime (default 10)")
    p.add_argument("--top", type=int, default=15, help="slowest onnxhal nodes to list (default 15)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="folder for the two Chrome traces")
    args = p.parse_args(argv)

    import onnxruntime as ort

    import onnxhal

    if args.model.endswith(".onnx"):
        from real_models import signatures

        name = os.path.basename(args.model)[:-5]
        feeds = signatures(args.model)["a"][0]
        with open(args.model, "rb") as f:
            data = f.read()
    else:
        name = bench.expand([args.model])[0]
        model = bench.build(name)
        feeds = models.feeds(model)
        data = model.SerializeToString()
    out = args.out or tempfile.mkdtemp(prefix="onnxhal-breakdown-")
    os.makedirs(out, exist_ok=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.enable_profiling = True
    so.profile_file_prefix = os.path.join(out, "ort")
    hso = onnxhal.SessionOptions()
    hso.intra_op_num_threads = args.threads
    hso.enable_profiling = True
    hso.profile_file_prefix = os.path.join(out, "onnxhal")
    ort_sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    hal_sess = onnxhal.InferenceSession(data, hso, providers=["CPUExecutionProvider"])
    warm = 3  # warm-up runs are profiled too; subtracting them would need per-run event grouping
    for _ in range(warm + args.repeat):
        ort_sess.run(None, feeds)
        hal_sess.run(None, feeds)
    (ort_ops, ort_nodes), (hal_ops, hal_nodes) = summarize(ort_sess.end_profiling()), summarize(hal_sess.end_profiling())
    ops = sorted(set(ort_ops) | set(hal_ops), key=lambda o: -(hal_ops.get(o, 0.0) + ort_ops.get(o, 0.0)))
    print(f"{name}: kernel time per op type, sum of node medians in ms (traces in {out})")
    print(f"{'op':28s} {'onnxhal':>9s} {'ort':>9s}")
    for op in ops:
        print(f"{op:28s} {hal_ops.get(op, 0.0):9.2f} {ort_ops.get(op, 0.0):9.2f}")
    print(f"{'total':28s} {sum(hal_ops.values()):9.2f} {sum(ort_ops.values()):9.2f}")
    print(f"\nslowest {args.top} onnxhal nodes: ms, ORT's node of the same name (nan: fused away or renamed)")
    for node, (ms, op, shapes) in sorted(hal_nodes.items(), key=lambda kv: -kv[1][0])[: args.top]:
        other = ort_nodes.get(node)
        print(f"{ms:7.2f} {other[0] if other else float('nan'):7.2f}  {op:16s} {node[:36]:36s} {shapes[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
