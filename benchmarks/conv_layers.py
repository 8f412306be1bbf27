"""Each 2-D convolution of a model alone: the CPU EP's FusedConv (the path it takes, ``last_path``)
against onnxruntime's Conv of the same shape, weights and attributes, alternating in one process.

    python benchmarks/conv_layers.py MODEL [--batch 1,2] [--repeat 50] [--threads 1]

MODEL is a corpus ``.onnx`` file, ``cnn`` (``models.cnn()``: ResNet-18 at 224, the shape of the
medium corpus's ResNet) or ``aspp`` (``aspp_model()``: DeepLabV3's ASPP 3x3 layers at dilation 12,
24 and 36 over 8x8 and 16x16 maps, large kernels over small planes, and a dilated layer whose
taps all read the input) or ``classes[:NAME,...]`` (``CLASSES``: the layer shapes issue 44 names as
slowest against onnxruntime: 7x7/2 stems, 1x1 layers, stride-2 depthwise ones, 3x3 over small
planes). A layer whose dead taps the CPU EP cuts (``dead_taps``, "trimmed_taps")
is also timed with the rule off, alternating with the other two (``rule off``). The batch axis of the model's input is set to each ``--batch``; every
Conv with constant weights is timed with its bias (a Relu or residual the optimizer would fuse is
left out: both sides run the bare convolution). Times are medians of CPU time
(``time.process_time``, which other processes' load does not stretch) and of wall time; with
``--threads 1`` (the default) both runtimes use one thread, so the ratio compares the kernels'
work, not their threading.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def conv_layers(model: onnx.ModelProto, batch: int) -> list[tuple[onnx.NodeProto, tuple, np.ndarray, np.ndarray | None]]:
    """(node, input shape, weights, bias) of each Conv with constant weights and a known input shape."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for vi in list(model.graph.input) + list(model.graph.output):
        dims = vi.type.tensor_type.shape.dim
        if dims:
            dims[0].Clear()
            dims[0].dim_value = batch
    del model.graph.value_info[:]
    model = shape_inference.infer_shapes(model)
    shapes = {vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
              for vi in list(model.graph.value_info) + list(model.graph.input)}
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type != "Conv":  # Constant nodes and others may have no inputs
            continue
        shape = shapes.get(node.input[0], ())
        if node.input[1] not in inits or len(shape) != 4 or not all(shape):
            continue
        bias = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
        layers.append((node, shape, inits[node.input[1]].astype(np.float32), bias))
    return layers


def aspp_model() -> onnx.ModelProto:
    """Dilated and large-kernel convolutions whose kernels reach past small planes: DeepLabV3's ASPP
    (torchvision's deeplabv3 head: 3x3 at dilation 12, 24, 36 padded as much, here over a 240-channel
    8x8 map to 16 and 256 channels and a 960-channel 16x16 one), 7x7 and 5x5 over 4x4 and 2x2
    planes, and a 3x3 at dilation 2 over 32x32 that keeps every tap."""
    rng = np.random.default_rng(0)
    layers = [((1, 240, 8, 8), 16, 3, d) for d in (12, 24, 36)] + [((1, 240, 8, 8), 256, 3, 24),
                                                                  ((1, 960, 16, 16), 256, 3, 24),
                                                                  ((1, 64, 4, 4), 64, 7, 1), ((1, 128, 2, 2), 128, 5, 1),
                                                                  ((1, 32, 32, 32), 32, 3, 2)]
    nodes, inputs, outputs, inits = [], [], [], []
    for i, (shape, m, k, d) in enumerate(layers):
        pad = d * (k - 1) // 2
        nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}", f"b{i}"], [f"y{i}"], kernel_shape=[k, k],
                                      dilations=[d, d], pads=[pad] * 4))
        inputs.append(helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, ["N"] + list(shape[1:])))
        outputs.append(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None))
        inits += [numpy_helper.from_array((rng.standard_normal((m, shape[1], k, k)) * 0.05).astype(np.float32), f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), f"b{i}")]
    graph = helper.make_graph(nodes, "aspp", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


#: The layer classes issue 44 names as slowest against onnxruntime, per layer: (input shape, output
#: channels, kernel, stride, group); pads keep the plane (k // 2).
CLASSES = {
    "stem": [((1, 3, 224, 224), 64, 7, 2, 1), ((1, 3, 112, 112), 64, 7, 2, 1)],
    "pointwise": [((1, 64, 56, 56), 256, 1, 1, 1), ((1, 256, 56, 56), 64, 1, 1, 1), ((1, 256, 56, 56), 512, 1, 2, 1),
                  ((1, 512, 28, 28), 128, 1, 1, 1), ((1, 1024, 14, 14), 256, 1, 1, 1),
                  ((1, 1024, 14, 14), 2048, 1, 2, 1), ((1, 2048, 7, 7), 512, 1, 1, 1), ((1, 512, 7, 7), 2048, 1, 1, 1)],
    "depthwise2": [((1, 96, 112, 112), 96, 3, 2, 96), ((1, 144, 56, 56), 144, 3, 2, 144),
                   ((1, 192, 28, 28), 192, 3, 2, 192), ((1, 576, 14, 14), 576, 3, 2, 576),
                   ((1, 72, 56, 56), 72, 5, 2, 72), ((1, 240, 28, 28), 240, 5, 2, 240),
                   ((1, 672, 14, 14), 672, 5, 2, 672)],
    # VGG-style Conv, Relu, MaxPool stacks: few channels on large planes (unit stride, pads 1)
    "few": [((1, 3, 64, 64), 8, 3, 1, 1), ((1, 8, 32, 32), 16, 3, 1, 1), ((1, 16, 16, 16), 32, 3, 1, 1),
            ((1, 32, 16, 16), 32, 3, 1, 1), ((1, 32, 8, 8), 64, 3, 1, 1), ((1, 64, 8, 8), 64, 3, 1, 1),
            ((1, 64, 4, 4), 64, 3, 1, 1)],
    "vgg": [((1, 3, 224, 224), 64, 3, 1, 1), ((1, 64, 112, 112), 64, 3, 1, 1), ((1, 64, 56, 56), 64, 3, 1, 1)],
    "small3x3": [((1, 256, 14, 14), 256, 3, 1, 1), ((1, 512, 7, 7), 512, 3, 1, 1), ((1, 1024, 7, 7), 256, 3, 1, 1),
                 ((1, 256, 14, 14), 1024, 3, 1, 1)],
}


def classes_model(names: list[str]) -> onnx.ModelProto:
    """One Conv (with a bias) per layer of the ``CLASSES`` named, each on its own input."""
    rng = np.random.default_rng(0)
    nodes, inputs, outputs, inits = [], [], [], []
    layers = [layer for name in names for layer in CLASSES[name]]
    for i, (shape, m, k, s, g) in enumerate(layers):
        nodes.append(helper.make_node("Conv", [f"x{i}", f"w{i}", f"b{i}"], [f"y{i}"], kernel_shape=[k, k],
                                      strides=[s, s], pads=[k // 2] * 4, group=g))
        inputs.append(helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, ["N"] + list(shape[1:])))
        outputs.append(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, None))
        inits += [numpy_helper.from_array((rng.standard_normal((m, shape[1] // g, k, k)) * 0.05).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), f"b{i}")]
    graph = helper.make_graph(nodes, "classes", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _fused_kernel(node: onnx.NodeProto, has_bias: bool):
    from onnxhal.hal import KernelCreateContext, Node
    from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN
    from onnxhal.runtime.providers.cpu.kernels.fused_conv import FusedConv

    class Constant(KernelCreateContext):  # the weights are initializers: derived forms may be kept
        def is_constant_initializer(self, name: str) -> bool:
            return name in ("w", "b")

    fused = Node("FusedConv", ["x", "w", "b" if has_bias else ""], ["y"], domain=DOMAIN,
                 attribute_protos=list(node.attribute))
    fused.since_version = 1
    return FusedConv(fused, Constant())


def _ort_conv(node: onnx.NodeProto, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, threads: int):
    import onnxruntime as ort

    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    conv = helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["y"])
    conv.attribute.extend(node.attribute)
    graph = helper.make_graph([conv], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--batch", default="1,2")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    from onnxhal.runtime.providers.cpu.kernels import dead_taps
    from onnxhal.runtime.providers.cpu.kernels.blas_threads import set_blas_threads

    set_blas_threads(args.threads)
    if args.model == "cnn":
        import models

        model = models.cnn()
    elif args.model == "aspp":
        model = aspp_model()
    elif args.model.split(":")[0] == "classes":
        model = classes_model(args.model.split(":")[1].split(",") if ":" in args.model else list(CLASSES))
    else:
        model = onnx.load(args.model)
    rng = np.random.default_rng(0)
    print(f"load average at the start {open('/proc/loadavg').read().split()[:3]}")
    for batch in (int(v) for v in args.batch.split(",")):
        totals = [0.0, 0.0]
        for node, shape, w, b in conv_layers(model, batch):
            x = rng.standard_normal(shape).astype(np.float32)
            kernel = _fused_kernel(node, b is not None)
            sess = _ort_conv(node, x, w, b, args.threads)
            want = sess.run(None, {"x": x})[0]
            got = kernel.compute([x, w, b, None])[0]
            diff = float(np.max(np.abs(got.astype(np.float64) - want)))
            runs = [kernel.compute, lambda feeds, sess=sess: sess.run(*feeds)]
            feeds = [[x, w, b, None], (None, {"x": x})]
            if kernel.taps.last is not None:  # the dead-tap rule cut this layer: the plain kernel too
                dead_taps.ENABLED = False
                plain = _fused_kernel(node, b is not None)
                dead_taps.ENABLED = True
                plain.compute([x, w, b, None])
                runs.append(plain.compute)
                feeds.append(feeds[0])
            cpu, wall = [[] for _ in runs], [[] for _ in runs]
            for _ in range(args.repeat):
                for i, run in enumerate(runs):
                    c0, w0 = time.process_time(), time.perf_counter()
                    run(feeds[i])
                    wall[i].append(time.perf_counter() - w0)
                    cpu[i].append(time.process_time() - c0)
            ch, co, *off = (statistics.median(v) * 1e6 for v in cpu)
            wh, wo = (statistics.median(v) * 1e6 for v in wall[:2])
            totals[0] += ch
            totals[1] += co
            rule = f"  rule off cpu us {off[0]:8.1f} ({off[0] / co:5.2f})" if off else ""
            print(f"N={batch} x={str(shape):19s} w={str(w.shape):17s} {kernel.last_path:20s} cpu us {ch:8.1f} "
                  f"ort {co:8.1f} ({ch / co:4.2f})  wall {wh:8.1f} ort {wo:8.1f}  diff {diff:.1e}{rule}", flush=True)
        print(f"N={batch} total cpu us {totals[0]:.0f} against onnxruntime's {totals[1]:.0f} "
              f"({totals[0] / totals[1]:.2f})")
    print(f"load average at the end {open('/proc/loadavg').read().split()[:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
