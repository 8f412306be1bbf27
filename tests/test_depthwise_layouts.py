"""Every layout of ``conv.depthwise_rows`` (``conv.DEPTHWISE_LAYOUTS``) reached directly: each case
is built for one layout, ``depthwise_layout`` must pick it, and the rows cut to outputs must match
a float64 depthwise convolution and onnxruntime's Conv. The padded-phase layout holds for every
convolution, so it is also run on the cases the flat-plane layouts take. A layout that diverges
fails here."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels import conv
from tests.models import make, vi
from tests.test_fused_conv_paths import _attrs, _out_shape, reference_conv

# (layout, x shape, kernel, Conv attributes): unit and stride 2, dilated, asymmetric pads, odd sizes
CASES = [
    ("same_width", (2, 8, 12, 12), (3, 3), {"pads": [1, 1, 1, 1]}),
    ("same_width", (1, 6, 9, 7), (5, 5), {"pads": [2, 2, 2, 2]}),
    ("same_width", (1, 5, 10, 11), (3, 3), {"pads": [0, 2, 4, 2], "dilations": [2, 2]}),
    ("same_width", (2, 4, 2, 2), (5, 5), {"pads": [2, 2, 2, 2]}),  # more taps than cells: most read padding
    ("same_width", (1, 3, 7, 8), (3, 1), {"pads": [1, 0, 1, 0]}),
    ("half_width", (2, 8, 16, 16), (3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    ("half_width", (1, 6, 12, 10), (5, 5), {"pads": [2, 2, 1, 1], "strides": [2, 2]}),
    ("half_width", (1, 4, 8, 8), (3, 3), {"pads": [0, 0, 1, 1], "strides": [2, 2]}),  # TF's SAME_UPPER
    ("half_width", (1, 4, 4, 6), (3, 3), {"pads": [2, 2, 2, 2], "strides": [2, 2], "dilations": [2, 2]}),
    ("phases", (1, 8, 13, 11), (3, 3), {"pads": [0, 0, 1, 1], "strides": [2, 2]}),
    ("phases", (2, 6, 15, 13), (5, 3), {"pads": [4, 1, 3, 2], "dilations": [2, 1]}),
    ("phases", (1, 5, 17, 16), (3, 3), {"pads": [1, 1, 1, 1], "strides": [3, 3]}),
    ("phases", (1, 4, 9, 9), (3, 3), {}),  # no padding: the output narrower than the input
]


def _case(case, edge: bool, seed: int = 0):
    layout, x_shape, kernel, attrs = case
    c = x_shape[1]
    a = _attrs({"group": c, **attrs}, (c, 1) + kernel)
    rng = np.random.default_rng(seed * 2 + edge)
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal((c, 1) + kernel).astype(np.float32)
    if edge:  # zeros, large and tiny magnitudes side by side
        x.reshape(-1)[::7] = 0.0
        x.reshape(-1)[1::11] = 3.0e4
        x.reshape(-1)[2::13] = -3.0e4
        x.reshape(-1)[3::5] = 1.0e-30
        w.reshape(-1)[::3] = 0.0
    p = a["pads"]
    geometry = ((p[0], p[1], p[2], p[3]), _out_shape(x_shape, w.shape, a)[2:], kernel, tuple(a["strides"]),
                tuple(a["dilations"]))
    return layout, x, w, a, geometry


def _outputs(x, w, geometry, layout):
    pads, out_hw = geometry[:2]
    acc, wq = conv.depthwise_rows(x, w, *geometry, layout=layout)
    assert acc.shape[:2] == x.shape[:2] and acc.shape[2] >= (out_hw[0] - 1) * wq + out_hw[1]
    return conv.rows_to_output(acc, out_hw, wq)


def _ort_depthwise(x, w, a):
    y_shape = list(_out_shape(x.shape, w.shape, a))
    model = make([helper.make_node("Conv", ["x", "w"], ["y"], **a)], [vi("x", list(x.shape))], [vi("y", y_shape)],
                 [numpy_helper.from_array(w, "w")], opset=17)
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def test_every_layout_has_a_case():
    assert {c[0] for c in CASES} == set(conv.DEPTHWISE_LAYOUTS)
    assert all(layout.condition for layout in conv.DEPTHWISE_LAYOUTS.values())


@pytest.mark.parametrize("edge", [False, True], ids=["random", "edge"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-{c[2][0]}x{c[2][1]}")
def test_layout_matches_float64_and_onnxruntime(case, edge):
    layout, x, w, a, geometry = _case(case, edge, CASES.index(case))
    assert conv.depthwise_layout(x.shape, *geometry) == layout, "the case is built for another layout"
    want = reference_conv(x, w, a)
    mag = reference_conv(np.abs(x), np.abs(w), a)
    bound = 1e-5 * mag + 1e-6
    # the layout chosen, then the padded phases (which hold for every case) on the same inputs
    for taken in dict.fromkeys((layout, conv.PHASES)):
        y = _outputs(x, w, geometry, taken)
        assert y.shape == want.shape and y.dtype == np.float32
        err = np.abs(y.astype(np.float64) - want)
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        assert np.all(err <= bound), f"layout {taken} diverges at {worst}: {y[worst]} against {want[worst]}"
        ref = _ort_depthwise(x, w, a)
        assert np.all(np.abs(y.astype(np.float64) - ref) <= 2 * bound), f"layout {taken} differs from onnxruntime"


def test_plain_conv_takes_the_layouts():
    """The CPU EP's Conv kernel runs a depthwise convolution above the gather limit through
    ``depthwise_rows`` too: each layout's large case against the float64 convolution."""
    for layout, x_shape, kernel, attrs in [("same_width", (2, 32, 24, 24), (3, 3), {"pads": [1, 1, 1, 1]}),
                                           ("half_width", (2, 32, 24, 24), (3, 3),
                                            {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                                           ("phases", (2, 32, 25, 25), (3, 3),
                                            {"pads": [1, 1, 1, 1], "strides": [2, 2]})]:
        _, x, w, a, geometry = _case((layout, x_shape, kernel, attrs), False)
        assert conv.depthwise_layout(x.shape, *geometry) == layout
        assert conv.gather_plan(x.shape, w.shape, *geometry[:2], *geometry[3:], True, False) is None
        node = Node("Conv", ["x", "w"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in a.items()])
        y = conv.Conv(node, None).compute([x, w])[0]
        want, mag = reference_conv(x, w, a), reference_conv(np.abs(x), np.abs(w), a)
        assert np.all(np.abs(y.astype(np.float64) - want) <= 1e-5 * mag + 1e-6), layout


@pytest.mark.parametrize("layout, case", [("same_width", CASES[9]), ("half_width", CASES[0]),
                                          ("half_width", CASES[9]), ("unknown", CASES[0])])
def test_a_layout_that_does_not_hold_is_refused(layout, case):
    _, x, w, _, geometry = _case(case, False)
    with pytest.raises(InvalidArgument, match=f"depthwise layout '{layout}' does not hold"):
        conv.depthwise_rows(x, w, *geometry, layout=layout)
