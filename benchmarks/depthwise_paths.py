"""A fast path of the CPU EP's FusedConv against the path it replaces, per model and per node, on
one thread, CPU time, in one process, alternating (a loaded machine: wall time would measure the
other processes), onnxruntime's single-thread time beside them.

    python benchmarks/depthwise_paths.py [--models tv_mnasnet,...] [--switch NATIVE_DEPTHWISE_CHANNELS_ENABLED]
        [--path depthwise_native_channels] [--rounds 15]

Per model: four onnxhal sessions, resolved with the switch (a ``fused_conv`` module constant read
when a layer's path is chosen) on, off, off, on (creation order biased the timings), and
onnxruntime's, each run in turn, the means of each setting's two medians of CPU time. Per node that takes ``--path`` (its input shape, kernel, strides,
pads, dilations and activation recorded during the model's run): a FusedConv kernel with the
switch on and one with it off, alternating, and onnxruntime's single-node model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

if __name__ == "__main__":  # one thread each: the per-core comparison
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ[var] = "1"

import numpy as np

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "real_models")
MODELS = ("tv_mnasnet,tv_mobilenetv3,tv_efficientnet,tv_efficientnetv2,mobilenet_ts,mobilenet_dynamo,"
          "tv_shufflenet,tv_regnety,hf_mobilevit,paddle_lcnet,yolov8_tiny,tv_resnext")


def cpu_us(fn, reps: int) -> float:
    t = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - t) / reps * 1e6


def alternate(fns: list, rounds: int, reps: int) -> list[float]:
    """Medians of each function's CPU time over ``rounds`` rounds, the functions in turn, the order
    rotated each round: whichever runs right after onnxruntime finds its data out of cache (two
    sessions with the same paths measured 7-14% apart in a fixed order)."""
    times = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (j + r) % len(fns)
            times[i].append(cpu_us(fns[i], reps))
    return [statistics.median(t) for t in times]


def model_ab(name: str, switch: str, path: str, rounds: int, seen: dict) -> tuple[float, float, float]:
    import onnxruntime as ort

    import onnxhal
    from onnxhal.runtime.providers.cpu.kernels import fused_conv
    from onnxhal.stored_outputs import read_signatures

    file = os.path.join(CORPUS, name + ".onnx")
    feeds, _ = read_signatures(file)["a"]
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    ref = ort.InferenceSession(file, so, providers=["CPUExecutionProvider"])
    sessions = []
    original = fused_conv.FusedConv._native_direct

    def record(self, x, w, b, z, pads, out_hw, *flags):
        y = original(self, x, w, b, z, pads, out_hw, *flags)
        if self.last_path == path:
            key = (x.shape, w.shape, self.strides, pads, self.dilations, self._node.attr("activation", ""),
                   tuple(self._node.attr("activation_params") or ()), b is not None)
            seen[key] = seen.get(key, 0) + 1
        return y
    fused_conv.FusedConv._native_direct = record
    try:
        for on in (True, False, False, True):  # ABBA: the first session created ran 1-10% slower than the next
            setattr(fused_conv, switch, on)
            hso = onnxhal.SessionOptions()
            hso.intra_op_num_threads = 1
            s = onnxhal.InferenceSession(file, hso, providers=["CPUExecutionProvider"])
            s.run(None, feeds)  # paths resolved here, with the switch as set
            sessions.append(s)
    finally:
        fused_conv.FusedConv._native_direct = original
        setattr(fused_conv, switch, True)
    runs = [lambda s=s: s.run(None, feeds) for s in sessions] + [lambda: ref.run(None, feeds)]
    times = alternate(runs, rounds, 3)
    return (times[0] + times[3]) / 2, (times[1] + times[2]) / 2, times[4]


def node_ab(key: tuple, switch: str, rounds: int) -> tuple[float, float, float]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from onnxhal.hal import Node
    from onnxhal.runtime.providers.cpu.kernels import fused_conv
    from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN

    x_shape, w_shape, strides, pads, dil, act, params, bias = key
    rng = np.random.default_rng(0)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    b = rng.standard_normal(w_shape[0]).astype(np.float32) if bias else None
    attrs = {"kernel_shape": list(w_shape[2:]), "group": w_shape[0], "strides": list(strides),
             "pads": list(pads), "dilations": list(dil)}
    protos = [helper.make_attribute(k, v) for k, v in attrs.items()]
    if act:
        protos.append(helper.make_attribute("activation", act))
        if params:
            protos.append(helper.make_attribute("activation_params", [float(v) for v in params]))
    kernels = []
    for on in (True, False):
        setattr(fused_conv, switch, on)
        node = Node("FusedConv", ["x", "w", "b" if bias else ""], ["y"], domain=DOMAIN, attribute_protos=protos)
        node.since_version = 1
        k = fused_conv.FusedConv(node, None)
        k.compute([x, w, b])
        kernels.append(k)
    setattr(fused_conv, switch, True)
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if bias else []), ["c"], **attrs)
    nodes = [conv]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    elif act == "Clip":
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif act == "HardSwish":
        nodes.append(helper.make_node("HardSwish", ["c"], ["y"]))
    elif act:
        nodes.append(helper.make_node("Identity", ["c"], ["y"]))  # the node's activation left out of onnxruntime's
    else:
        conv.output[0] = "y"
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if bias else [])
    if act == "Clip":
        inits += [numpy_helper.from_array(np.float32(params[0]), "lo"), numpy_helper.from_array(np.float32(params[1]), "hi")]
    graph = helper.make_graph(nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    inputs = [x, w, b]
    on, off = kernels
    return tuple(alternate([lambda: on.compute(inputs), lambda: off.compute(inputs),
                            lambda: ref.run(None, {"x": x})], rounds, 50))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=MODELS)
    p.add_argument("--switch", default="NATIVE_DEPTHWISE_CHANNELS_ENABLED")
    p.add_argument("--path", default="depthwise_native_channels")
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}")
    seen: dict = {}
    print(f"{'model':22} {'on us':>9} {'off us':>9} {'on/off':>7} {'ort us':>9} {'on/ort':>7}")
    for name in a.models.split(","):
        on, off, ref = model_ab(name, a.switch, a.path, a.rounds, seen)
        print(f"{name:22} {on:9.0f} {off:9.0f} {on / off:7.3f} {ref:9.0f} {on / ref:7.2f}", flush=True)
    print(f"\nnodes on {a.path} (count in the models' runs)")
    print(f"{'x shape':20} {'kernel/stride':14} {'n':>3} {'on us':>7} {'off us':>7} {'on/off':>6} {'ort us':>7} {'on/ort':>6}")
    for key, count in sorted(seen.items(), key=lambda kv: -kv[1]):
        on, off, ref = node_ab(key, a.switch, a.rounds)
        kern = f"{key[1][2]}x{key[1][3]}/{key[2][0]}" + (f" d{key[4][0]}" if key[4] != (1, 1) else "")
        print(f"{str(key[0]):20} {kern:14} {count:3} {on:7.1f} {off:7.1f} {on / off:6.2f} {ref:7.1f} {on / ref:6.2f}",
              flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
