"""Dead kernel taps: the taps of a convolution that no output position ever reads inside the input.

Along a spatial axis of input size ``size``, tap k of output o reads x = o * stride - pad_begin + k
* dilation. A tap whose reads fall outside [0, size) for every o reads only padding, and a zero
pad contributes nothing to any output. Dilated convolutions on small planes are mostly such taps:
DeepLabV3's ASPP 3x3 layers at dilation 12, 24 and 36 over an 8x8 map, padded as much, read the
input with their centre tap alone, and an im2col over the 80x80 padded plane then copies and
multiplies nine taps of which eight are zeros. Large kernels over small planes (a 7x7 over 2x2)
are the same.

Once per input shape (``TrimmedTaps.kernel_for``) the live taps are found per axis; where some die
at either end of an axis, the convolution runs as the same one with the weight cut to the live
range of taps and the pads moved with it (pad_begin' = pad_begin - k0 * dilation, pad_end' =
pad_end - (kernel - k1) * dilation, so the output size is the same), by a twin kernel of the same
op whose attributes say so. The twin is an ordinary kernel: a 3x3 at dilation 36 whose centre alone lives becomes a 1x1 without padding,
and takes the 1x1 routes (a product with the input in place); bias, residual, activation and
shuffle (FusedConv) are the twin's, unchanged. A dead tap between live ones (strides longer than
the input) is kept: cutting a range keeps the geometry a convolution's.

The canonical form is the convolution with every tap (the kernel's own paths):
tests/test_dead_taps.py holds the trimmed one to it and to onnxruntime."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from onnx import helper

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.op_geometry import ConvGeometry, Trim, trim
from onnxhal.runtime.providers.op_geometry import live_taps as live_taps  # noqa: F401 - the tests' entry

DEAD_TAP_PATHS = path_table("conv.dead_taps", "the same convolution with every tap of its kernel (the kernel's "
                                              "own paths)")
TRIMMED = DEAD_TAP_PATHS.add("trimmed_taps", "Conv or FusedConv whose input's spatial size leaves, on some axis, "
                                             "the first or last taps of the kernel reading only padding for every "
                                             "output (dead_taps.live_taps): the weight cut to the live taps, the "
                                             "pads moved with them, run by a twin kernel of the same op")

#: The switch of ``TRIMMED`` (read when a kernel is built): False keeps every tap (the tests compare).
ENABLED = True


def trimmed_node(node: Node, cut: Trim) -> Node:
    """``node`` with the kernel shape and explicit pads of ``cut`` (auto_pad resolved away); its
    other attributes, inputs and outputs unchanged."""
    protos = {k: a for k, a in node.attribute_protos.items() if k not in ("kernel_shape", "pads", "auto_pad")}
    protos["kernel_shape"] = helper.make_attribute("kernel_shape", list(cut.kernel))
    protos["pads"] = helper.make_attribute("pads", list(cut.pads))
    twin = Node(node.op_type, node.inputs, node.outputs, name=node.name, domain=node.domain,
                attribute_protos=list(protos.values()))
    twin.since_version = node.since_version
    return twin


#: ``trim``'s answer per (geometry attributes, input and weight spatial shapes), for every kernel
_TRIMS: dict[tuple, Trim | None] = {}


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


class TrimmedTaps:
    """A Conv or FusedConv kernel's dead-tap rule: per (input, weight) shape, None where every tap
    lives, else the ``Trim`` and the twin kernel that runs it (made once per trimmed geometry by
    ``make``). The cut weight is kept while the same constant weight comes back."""

    def __init__(self, node: Node, ctx: KernelCreateContext | None, make: Callable[[Node], Kernel]) -> None:
        self._node, self._make = node, make
        self._geometry: ConvGeometry | None = None  # made at the first look that misses ``_TRIMS``
        #: what the geometry depends on besides the shapes: ``_TRIMS``'s key
        self._attrs = tuple(_hashable(node.attr(a)) for a in ("kernel_shape", "strides", "dilations", "pads",
                                                               "auto_pad"))
        constant = getattr(ctx, "is_constant_initializer", lambda name: False)  # ctx None: constant folding
        self._constant_weight = len(node.inputs) > 1 and bool(constant(node.inputs[1]))
        self._plans: dict[tuple, tuple[Trim, Kernel] | None] = {}
        # Without padding no end tap dies (tap 0 reads cell 0 for output 0, and the last tap of the
        # last output reads at most cell size - 1): such a node never looks at its shapes.
        self._enabled = ENABLED and (node.attr("auto_pad", "NOTSET") in ("SAME_UPPER", "SAME_LOWER")
                                     or any(node.attr("pads") or ()))
        self._twins: dict[Trim, Kernel] = {}
        self._cut: tuple[np.ndarray, Trim, np.ndarray] | None = None
        self.last: Trim | None = None  #: the ``Trim`` of the last run this rule took (tests read it)

    def kernel_for(self, x_shape: tuple, w_shape: tuple) -> tuple[Trim, Kernel] | None:
        """The ``Trim`` and twin for these shapes, or None (looked at once per shape)."""
        key = (x_shape, w_shape)
        plan = self._plans.get(key, False)
        if plan is False:
            if len(self._plans) > 64:  # dynamic axes: as conv.per_shape
                self._plans.clear()
            plan = self._plans[key] = self._plan(x_shape, w_shape)
        return plan

    def _plan(self, x_shape: tuple, w_shape: tuple) -> tuple[Trim, Kernel] | None:
        if not self._enabled or len(x_shape) < 3 or len(w_shape) != len(x_shape):
            return None
        # The cut depends on the geometry alone, which repeats across a model's layers and across
        # sessions of one model: resolved once per process (most padded layers cut nothing).
        key = (self._attrs, x_shape[2:], w_shape[2:])
        cut = _TRIMS.get(key, False)
        if cut is False:
            cut = self._trim(x_shape, w_shape)
            if len(_TRIMS) > 4096:
                _TRIMS.clear()
            _TRIMS[key] = cut
        if cut is None:
            return None
        twin = self._twins.get(cut)
        if twin is None:
            if len(self._twins) > 64:
                self._twins.clear()
            twin = self._twins[cut] = self._make(trimmed_node(self._node, cut))
        return cut, twin

    def _trim(self, x_shape: tuple, w_shape: tuple) -> Trim | None:
        if self._geometry is None:
            self._geometry = ConvGeometry(self._node)
        kernel, strides, dil, pb, pe, out = self._geometry.resolve(x_shape[2:], w_shape[2:])
        if list(kernel) != list(w_shape[2:]):
            return None  # a kernel_shape the weight does not have: the kernel reports it
        return trim(x_shape[2:], kernel, strides, dil, pb, pe, out)

    def run(self, inputs: list) -> tuple[list, Kernel] | None:
        """The outputs of the trimmed convolution of ``inputs`` and the twin that ran it, or None
        where no tap dies."""
        if not self._enabled:
            return None
        x, w = inputs[0], inputs[1]
        plan = self._plans.get((x.shape, w.shape), False)  # ``kernel_for``'s lookup inline: every run pays it
        if plan is False:
            plan = self.kernel_for(x.shape, w.shape)
        if plan is None:
            return None
        cut, twin = plan
        cached = self._cut
        if cached is not None and cached[0] is w and cached[1] == cut:
            wc = cached[2]
        else:
            wc = np.ascontiguousarray(w[cut.weight_index()])
            if self._constant_weight:
                self._cut = (w, cut, wc)  # one swap: concurrent runs see an old or a new entry, both valid
        self.last = cut
        return twin.compute([x, wc] + list(inputs[2:])), twin
