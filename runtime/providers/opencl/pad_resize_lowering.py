"""Lowering of Pad and Resize to one launch each (``spatial_sources``): the padding and the resize
tables are constants of the plan (a specialisation's, for models with symbolic dims), computed by
``spatial_geometry``. Their claim rules are ``op_support.check_pad`` and ``check_resize``; a mixin of
``PartitionPlanBuilder``."""

from __future__ import annotations

import numpy as np

from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Node
from onnxhal.runtime.providers.opencl.gemm_lowering import prod
from onnxhal.runtime.providers.opencl.partition_plan import Buf
from onnxhal.runtime.providers.opencl.spatial_geometry import check_pad_widths, pad_widths, resize_axis, resize_scales
from onnxhal.runtime.providers.opencl.spatial_sources import PAD_MODES, PAD_SOURCE, RESIZE_SOURCE

I32, F = np.int32, np.float32


class PadResizeLowering:
    """``_lower_Pad`` and ``_lower_Resize`` for the plan builder (which provides ``data``,
    ``output``, ``shape``, ``constant``, ``lookup`` and ``plan``)."""

    def _lower_Pad(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs, ys = self.shape(x), self.shape(n.outputs[0])
        mode = n.attr("mode", "constant")
        width = pad_widths(n, len(xs), self.lookup.const)
        check_pad_widths(n, xs, width)
        if tuple(d + b + e for d, (b, e) in zip(xs, width)) != tuple(ys):
            raise OrtNotImplemented(f"Pad {n.name!r}: pads {width} of {list(xs)} do not give {list(ys)}")
        value = 0.0
        if mode == "constant" and len(n.inputs) > 2 and n.inputs[2]:
            v = self.lookup.const(n.inputs[2])
            if v is None or v.size != 1:
                raise OrtNotImplemented(f"Pad {n.name!r}: constant_value is not a constant scalar of the plan")
            value = float(v.reshape(-1)[0])
        elif len(n.inputs) == 1:
            value = float(n.attr("value", 0.0))
        pad = 6 - len(xs)
        meta = [len(xs), *ys, *([1] * pad), *xs, *([1] * pad), *(b for b, _ in width), *([0] * pad)]
        m = self.constant("padmeta", np.array(meta, dtype=np.int32))
        self.plan.add_launch_1d(PAD_SOURCE, "pad_nd", prod(ys), [
            Buf(self.output(n.outputs[0])), Buf(x), Buf(m), F(value), I32(PAD_MODES[mode])])

    def _lower_Resize(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs, ys = self.shape(x), self.shape(n.outputs[0])
        sh, sw = resize_scales(n, xs, ys, self.lookup.const)
        linear = n.attr("mode", "nearest") == "linear"
        coord, nearest = n.attr("coordinate_transformation_mode", "half_pixel"), n.attr("nearest_mode", "round_prefer_floor")
        (y1, y2, dy1, dy2), (x1, x2, dx1, dx2) = (resize_axis(o, i, s, coord, linear, nearest)
                                                  for o, i, s in ((ys[-2], xs[-2], sh), (ys[-1], xs[-1], sw)))
        t = self.constant("resize_idx", np.concatenate([y1, y2, x1, x2]).astype(np.int32))
        w = self.constant("resize_w", np.concatenate([dy1, dy2, dx1, dx2]).astype(np.float32))
        self.plan.add_launch_1d(RESIZE_SOURCE, "resize2d", prod(ys), [
            Buf(self.output(n.outputs[0])), Buf(x), Buf(t), Buf(w), I32(xs[-2]), I32(xs[-1]), I32(ys[-2]), I32(ys[-1]),
            I32(linear)])
