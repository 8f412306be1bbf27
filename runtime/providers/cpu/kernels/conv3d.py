"""3-D convolutions that are 2-D ones: the separable video networks' (S3D, R(2+1)D) layers run
as the 2-D FusedConv of a view or a transpose of their input, so they take the 2-D paths (a
kept run per shape with the weights bound, gathered windows for small planes, the native
direct and packed products, the fused epilogue) instead of the N-d Conv's im2col followed by a
separate epilogue.

- ``frames_in_rows``: a kernel k x 1 x 1 (1 x 1 x 1 included) with unit row and column strides
  and no row or column padding reads each position's own row and column only, so over
  (N, C, T, H*W), the frames as rows and a plane as one row, it is the 2-D convolution with
  kernel k x 1 and the frame axis's stride, dilation and pads. A view both ways: no copy.
- ``frames_as_batch``: a kernel 1 x kh x kw with unit frame stride and no frame padding is the
  same 2-D convolution on every frame, so over the frames as images (N*T, C, H, W) it is one
  2-D convolution; a transpose copies the input in and the output out.
- ``pointwise_strided``: a strided 1 x 1 x 1 kernel without padding (ResNet-3D's downsampling
  shortcut) reads the strided positions alone: they are copied out in one slice, then it is
  the unit-stride 1 x 1 convolution of ``frames_in_rows``.

onnxruntime runs 3-D Conv through MLAS's N-d convolution (im2col and SGEMM,
onnxruntime/core/providers/cpu/nn/conv.cc), so there is no onnxruntime form to follow; the
results are held to the N-d Conv (``conv.Conv``) and to onnxruntime by
tests/test_conv3d_as_2d.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import AttributeProto

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table

AS_2D_PATHS = path_table("FusedConv.3d", "the N-d Conv (conv.Conv's paths), then the epilogue")
FRAMES_IN_ROWS = AS_2D_PATHS.add("frames_in_rows", "float 3-D, kernel_shape k x 1 x 1 given, unit row and "
                                                   "column strides, no row or column padding: the 2-D "
                                                   "FusedConv of the (N, C, T, H*W) view with kernel k x 1")
FRAMES_AS_BATCH = AS_2D_PATHS.add("frames_as_batch", "float 3-D, kernel_shape 1 x kh x kw given, unit frame "
                                                     "stride, no frame padding: the 2-D FusedConv of the frames "
                                                     "as images (N*T, C, H, W), transposed in and out")
POINTWISE_STRIDED = AS_2D_PATHS.add("pointwise_strided", "float 3-D, kernel_shape 1 x 1 x 1 given, no padding, "
                                                         "a stride above 1: the strided positions copied out, "
                                                         "then the 2-D 1 x 1 FusedConv of (N, C, T', H'*W')")
#: Whether FusedConv takes the paths here (tests turn it off to reach the N-d Conv)
ENABLED = True

#: the attributes rewritten for the 2-D twin; the others (group, activation, channel_shuffle) carry over
_GEOMETRY = ("kernel_shape", "strides", "dilations", "pads", "auto_pad")


def _layout(node: Node) -> tuple[str, dict[str, list[int]]] | None:
    """Which path takes ``node`` and its twin's 2-D attributes, or None."""
    kernel = node.attr("kernel_shape")
    if not kernel or len(kernel) != 3:
        return None  # no kernel_shape: the weights' shape alone says, at run time
    strides = list(node.attr("strides") or (1, 1, 1))
    dil = list(node.attr("dilations") or (1, 1, 1))
    auto_pad = node.attr("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad not in ("NOTSET", "VALID"):
        return None  # SAME pads depend on the input's shape
    pads = list(node.attr("pads") or (0,) * 6) if auto_pad == "NOTSET" else [0] * 6
    if len(strides) != 3 or len(dil) != 3 or len(pads) != 6:
        return None  # attributes of mixed ranks: the N-d kernel reports them
    if tuple(kernel) == (1, 1, 1) and not any(pads) and strides != [1, 1, 1]:
        return POINTWISE_STRIDED, {"kernel_shape": [1, 1], "strides": [1, 1], "dilations": [1, 1], "pads": [0] * 4}
    if tuple(kernel[1:]) == (1, 1) and strides[1:] == [1, 1] and not any(pads[1:3] + pads[4:6]):
        return FRAMES_IN_ROWS, {"kernel_shape": [kernel[0], 1], "strides": [strides[0], 1],
                                "dilations": [dil[0], 1], "pads": [pads[0], 0, pads[3], 0]}
    if kernel[0] == 1 and strides[0] == 1 and pads[0] == 0 and pads[3] == 0:
        return FRAMES_AS_BATCH, {"kernel_shape": list(kernel[1:]), "strides": strides[1:],
                                 "dilations": dil[1:], "pads": pads[1:3] + pads[4:6]}
    return None


class FramesAs2d:
    """A 3-D FusedConv's 2-D twin and the reshapes around it (``frames_in_rows``,
    ``frames_as_batch`` or ``pointwise_strided``, chosen from the attributes once)."""

    def __init__(self, path: str, twin: Kernel, kernel: tuple, step: tuple | None = None) -> None:
        self.path = path  #: the ``AS_2D_PATHS`` name this node takes
        self.kernel = kernel  #: the 3-D kernel shape the attributes give
        self.twin = twin  #: the 2-D FusedConv
        #: ``pointwise_strided``'s strides, the slice that picks the positions it reads
        self.step = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in step) if step else None
        self._w: tuple | None = None  # (w, its 2-D view): the twin keeps what it derives for the same object

    @staticmethod
    def for_node(node: Node, ctx: KernelCreateContext, make: Callable[[Node], Kernel]) -> FramesAs2d | None:
        """The twin of a 3-D FusedConv whose attributes make it a 2-D one, made by ``make`` (the
        FusedConv class, which imports this module); None for the others."""
        if not ENABLED:
            return None
        layout = _layout(node)
        if layout is None:
            return None
        path, geometry = layout
        step = tuple(node.attr("strides") or (1, 1, 1)) if path == POINTWISE_STRIDED else None
        protos = [a for k, a in node.attribute_protos.items() if k not in _GEOMETRY]
        # made directly: onnx.helper.make_attribute works out the type from the values, on every
        # 3-D node of every session, where it is known here
        protos += [AttributeProto(name=k, type=AttributeProto.INTS, ints=v) for k, v in geometry.items()]
        twin = Node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain,
                    attribute_protos=protos)
        twin.since_version = node.since_version
        return FramesAs2d(path, make(twin), tuple(node.attr("kernel_shape")), step)

    def applies(self, x: np.ndarray, w: np.ndarray) -> bool:
        """A float input of rank 5 with weights of its dtype whose kernel is the attributes'."""
        return x.ndim == 5 and x.dtype.kind == "f" and w.dtype == x.dtype and w.shape[2:] == self.kernel

    def _weights(self, w: np.ndarray) -> np.ndarray:
        cached = self._w
        if cached is not None and cached[0] is w:
            return cached[1]
        w4 = w[:, :, 0] if self.path == FRAMES_AS_BATCH else w[:, :, :, :, 0]
        self._w = (w, w4)
        return w4

    def _out_spatial(self, x_shape: tuple) -> tuple:
        """The output's rows and columns (the kernel is one row and one column)."""
        h, wd = x_shape[3:]
        if self.step is None:
            return h, wd
        return (h - 1) // self.step[3].step + 1, (wd - 1) // self.step[4].step + 1

    def shape_2d(self, x_shape: tuple) -> tuple:
        """The twin's input shape for a 3-D input of ``x_shape``."""
        n, c, t, h, wd = x_shape
        if self.path == FRAMES_AS_BATCH:
            return (n * t, c, h, wd)
        if self.step is not None:
            t = (t - 1) // self.step[2].step + 1
        oh, ow = self._out_spatial(x_shape)
        return (n, c, t, oh * ow)

    def _to_2d(self, x: np.ndarray, residual: bool = False) -> np.ndarray:
        """The twin's input (or, ``residual``, its residual: already the output's shape)."""
        if self.path == FRAMES_AS_BATCH:
            n, c, t, h, wd = x.shape
            return np.ascontiguousarray(x.transpose(0, 2, 1, 3, 4)).reshape(n * t, c, h, wd)
        if self.step is not None and not residual:
            x = np.ascontiguousarray(x[self.step])
        return x.reshape(x.shape[:3] + (-1,))

    def _to_3d(self, y: np.ndarray, x_shape: tuple) -> np.ndarray:
        if self.path != FRAMES_AS_BATCH:
            return y.reshape(y.shape[:3] + self._out_spatial(x_shape))
        n, t = x_shape[0], x_shape[2]
        return np.ascontiguousarray(y.reshape((n, t) + y.shape[1:]).transpose(0, 2, 1, 3, 4))

    def run(self, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, z: np.ndarray | None) -> np.ndarray:
        """The 3-D convolution (with the node's epilogue) through the 2-D twin."""
        y = self.twin.compute([self._to_2d(x), self._weights(w), b, None if z is None else self._to_2d(z, True)])[0]
        return self._to_3d(y, x.shape)

    def bound(self, x_shape: tuple, run_2d: Callable) -> Callable:
        """The twin's kept run for ``shape_2d(x_shape)`` (a function of the 2-D input and
        residual, the weights bound in it) as a function of the 3-D ones."""
        to_2d, to_3d = self._to_2d, self._to_3d

        def run(x: np.ndarray, z: np.ndarray | None) -> np.ndarray:
            return to_3d(run_2d(to_2d(x), None if z is None else to_2d(z, True)), x_shape)
        return run
