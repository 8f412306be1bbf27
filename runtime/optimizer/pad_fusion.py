"""Pad + Conv -> Conv with the padding in its ``pads`` attribute (onnxruntime's PadFusion).

TorchScript exports of models with "same" padding (timm's MobileNets, TF-ported weights) put an
explicit Pad before every convolution, often an all-zero one before the 1x1 layers. A Conv pads
with zeros, so a Pad in constant mode with value 0, constant non-negative pads and no padding of
the batch or channel axis is the same as adding its pads to the Conv's: the Pad node, and the
copy of the whole input it makes, go away. Anything else (reflect/edge/wrap modes, a nonzero
value, negative pads, which crop, pads on N or C, pads or values computed at run time, a Pad
output read elsewhere, a Conv with ``auto_pad`` SAME_*) is left as it is.
"""

from __future__ import annotations

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.optimizer.rewrite import (
    constant,
    live_nodes,
    make_attribute,
    rank,
    replace_nodes,
    rewired,
    sole_consumer,
)


def _pad_amounts(graph: Graph, pad: Node) -> list[int] | None:
    """The Pad's pads over all of its input's axes, [x0_begin, x1_begin, ..., x0_end, ...], when
    it pads with zeros in constant mode and the pads are known; else None."""
    mode = pad.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode != "constant":
        return None
    if (pad.since_version or 0) < 11:  # pads and value as attributes ("paddings" at opset 1)
        pads = pad.attr("pads", pad.attr("paddings"))
        if pad.attr("value", 0.0) != 0.0 or pads is None:
            return None
        return [int(p) for p in pads]
    if len(pad.inputs) < 2 or not pad.inputs[1]:
        return None
    pads = constant(graph, pad.inputs[1])
    if pads is None or pads.dtype.kind not in "iu":
        return None
    if len(pad.inputs) > 2 and pad.inputs[2]:
        value = constant(graph, pad.inputs[2])
        if value is None or value.size > 1 or (value.size == 1 and value.reshape(-1)[0] != 0):
            return None
    pads = [int(p) for p in pads.reshape(-1)]
    if len(pad.inputs) > 3 and pad.inputs[3]:  # opset 18: pads for the listed axes only
        axes = constant(graph, pad.inputs[3])
        r = rank(graph, pad.inputs[0])
        if axes is None or r is None or axes.dtype.kind not in "iu" or 2 * axes.size != len(pads):
            return None
        full = [0] * (2 * r)
        for k, a in enumerate(int(a) for a in axes.reshape(-1)):
            a = a + r if a < 0 else a
            if not 0 <= a < r:
                return None
            full[a], full[a + r] = pads[k], pads[k + axes.size]
        pads = full
    return pads


def _conv_pads(conv: Node, spatial: int) -> list[int] | None:
    """The Conv's explicit pads over its ``spatial`` axes (zeros when absent or VALID), or None
    when ``auto_pad`` SAME_* sizes them from the input."""
    auto_pad = conv.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in ("NOTSET", "VALID"):
        return None
    pads = conv.attr("pads") if auto_pad == "NOTSET" else None
    pads = [0] * (2 * spatial) if not pads else [int(p) for p in pads]
    return pads if len(pads) == 2 * spatial else None


def fuse_pad_into_conv(graph: Graph) -> bool:
    """Fold a zero-valued constant-mode Pad of the spatial axes into the Conv that alone reads it."""
    changed = False
    for pad in live_nodes(graph, "Pad"):
        if pad.op_type != "Pad" or pad.domain != "" or not pad.inputs or not pad.inputs[0]:
            continue
        conv = sole_consumer(graph, pad.outputs[0])
        if (conv is None or conv.op_type != "Conv" or conv.domain != "" or conv.inputs[0] != pad.outputs[0]
                or pad.outputs[0] in conv.inputs[1:]):
            continue
        amounts = _pad_amounts(graph, pad)
        if amounts is None or len(amounts) < 6 or len(amounts) % 2:
            continue
        r = len(amounts) // 2
        begin, end = amounts[:r], amounts[r:]
        if any(p < 0 for p in amounts) or begin[0] or begin[1] or end[0] or end[1]:
            continue
        pads = _conv_pads(conv, r - 2)
        if pads is None:
            continue
        s = r - 2
        merged = [pads[i] + begin[2 + i] for i in range(s)] + [pads[s + i] + end[2 + i] for i in range(s)]
        new = rewired(graph, conv, [pad.inputs[0], *conv.inputs[1:]], conv.outputs, conv.name)
        new.attribute_protos.pop("auto_pad", None)
        new.attributes.pop("auto_pad", None)
        new.attribute_protos["pads"] = make_attribute("pads", merged)
        new.attributes["pads"] = merged
        replace_nodes(graph, [pad, conv], [new])
        changed = True
    return changed

