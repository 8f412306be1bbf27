"""The dead-tap rule (``dead_taps.TRIMMED``: "trimmed_taps"): a convolution whose first or last
taps read only padding runs with the weight cut to its live taps. Held to the plain kernel (the
rule switched off) and to onnxruntime, for Conv (1-D to 3-D) and FusedConv (bias, residual,
activation), over cases where no tap dies, all but the centre die (DeepLabV3's ASPP), taps die
on one axis only, pads are uneven or from auto_pad, strides are longer than the input, grouped and
depthwise ones, and random geometries."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from onnxhal.hal import KernelCreateContext, Node
from onnxhal.runtime.providers.cpu.kernels import conv, dead_taps
from onnxhal.runtime.providers.cpu.kernels.fused import DOMAIN
from onnxhal.runtime.providers.cpu.kernels.fused_conv import FusedConv
from onnxhal.runtime.providers.op_geometry import ConvGeometry, output_sizes
from tests.models import make, vi

#: (x shape, w shape, attributes, the trimmed kernel shape or None where nothing is cut)
CASES = [
    ("aspp_d36", (2, 24, 8, 8), (8, 24, 3, 3), {"dilations": [36, 36], "pads": [36] * 4}, (1, 1)),
    ("aspp_d12", (2, 24, 8, 8), (8, 24, 3, 3), {"dilations": [12, 12], "pads": [12] * 4}, (1, 1)),
    ("none_dies", (1, 4, 8, 8), (6, 4, 3, 3), {"pads": [1] * 4}, None),
    ("one_axis", (1, 3, 2, 9), (4, 3, 5, 3), {"pads": [2, 1, 2, 1]}, (3, 3)),
    ("uneven_pads", (1, 3, 3, 5), (4, 3, 3, 3), {"dilations": [3, 1], "pads": [4, 1, 1, 1]}, (2, 3)),
    ("strided", (1, 2, 5, 5), (3, 2, 7, 7), {"strides": [2, 2], "dilations": [3, 3], "pads": [9] * 4}, (3, 3)),
    # a stride longer than the input: tap 1 is dead but kept, as cutting it would need a negative pad
    ("stride_past_input", (1, 2, 2, 2), (3, 2, 3, 3), {"strides": [5, 5], "dilations": [2, 2], "pads": [3, 3, 5, 5]},
     (2, 2)),
    # auto_pad without dilation (onnxruntime refuses the two together)
    ("same_upper", (1, 4, 2, 2), (5, 4, 7, 7), {"auto_pad": "SAME_UPPER"}, (3, 3)),
    ("same_lower", (1, 4, 2, 2), (5, 4, 6, 6), {"auto_pad": "SAME_LOWER"}, (3, 3)),
    ("depthwise", (2, 6, 6, 6), (6, 1, 3, 3), {"dilations": [6, 6], "pads": [6] * 4, "group": 6}, (1, 1)),
    ("grouped", (1, 8, 5, 5), (6, 4, 5, 5), {"dilations": [3, 3], "pads": [6] * 4, "group": 2}, (3, 3)),
    ("large_kernel_small_plane", (1, 5, 2, 2), (7, 5, 7, 7), {"pads": [3] * 4}, (3, 3)),
    ("1d", (2, 3, 6), (4, 3, 5), {"dilations": [4], "pads": [8, 8]}, (3,)),
    ("3d", (1, 2, 3, 4, 4), (3, 2, 3, 3, 3), {"dilations": [2, 4, 4], "pads": [2, 4, 4, 2, 4, 4]}, (3, 1, 1)),
    # every tap of an axis dead (the output is the bias there): left to the plain kernel
    ("all_dead", (1, 2, 1, 3), (3, 2, 1, 3), {"strides": [2, 1], "pads": [1, 1, 1, 1]}, None),
]


class _Initializers(KernelCreateContext):
    """The weight and bias are constant initializers: the rule keeps the cut weight."""

    def is_constant_initializer(self, name: str) -> bool:
        return name in ("w", "b")


def _conv(attrs: dict, ctx: KernelCreateContext | None = None) -> conv.Conv:
    node = Node("Conv", ["x", "w", "b"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    node.since_version = 11
    return conv.Conv(node, ctx or KernelCreateContext())


def _fused(attrs: dict, act: str, residual: bool, ctx: KernelCreateContext | None) -> FusedConv:
    protos = [helper.make_attribute(k, v) for k, v in attrs.items()]
    if act:
        protos.append(helper.make_attribute("activation", act))
    node = Node("FusedConv", ["x", "w", "b", "z" if residual else ""], ["y"], domain=DOMAIN, attribute_protos=protos)
    node.since_version = 1
    return FusedConv(node, ctx)


def _out_shape(xs: tuple, ws: tuple, attrs: dict) -> tuple:
    node = Node("Conv", ["x", "w"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    *_, out = ConvGeometry(node).resolve(xs[2:], ws[2:])
    return (xs[0], ws[0]) + tuple(out)


def _onnxruntime(x, w, b, z, attrs: dict, relu: bool) -> np.ndarray:
    y_shape = list(_out_shape(x.shape, w.shape, attrs))
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs)]
    inputs, feeds, last = [vi("x", list(x.shape))], {"x": x}, "c"
    if z is not None:
        nodes.append(helper.make_node("Add", ["c", "z"], ["s"]))
        inputs.append(vi("z", y_shape))
        feeds["z"] = z
        last = "s"
    nodes.append(helper.make_node("Relu" if relu else "Identity", [last], ["y"]))
    model = make(nodes, inputs, [vi("y", y_shape)], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
                 opset=17)
    model.ir_version = 10
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _inputs(xs: tuple, ws: tuple, seed: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype),
            rng.standard_normal(ws[0]).astype(dtype))


def _close(got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _brute_live(size: int, out: int, stride: int, pad_begin: int, kernel: int, dilation: int) -> list[bool]:
    return [any(0 <= o * stride - pad_begin + k * dilation < size for o in range(out)) for k in range(kernel)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_trim_of_case(case):
    _, xs, ws, attrs, kernel = case
    node = Node("Conv", ["x", "w"], ["y"], attribute_protos=[helper.make_attribute(k, v) for k, v in attrs.items()])
    cut = dead_taps.trim(xs[2:], *ConvGeometry(node).resolve(xs[2:], ws[2:]))
    assert (cut and cut.kernel) == kernel


def test_trim_against_brute_force():
    """Over every small geometry (one axis): the cut taps are dead, every live tap is kept, an end tap
    is kept only when live or when cutting it would need a negative pad, the pads stay pads, and
    the output size is the same; None exactly where nothing is cut."""
    seen_cut = seen_none = 0
    for size, k, s, d, pb, pe in itertools.product(range(1, 6), range(1, 6), range(1, 4), range(1, 5), range(0, 9),
                                                   range(0, 9)):
        if size + pb + pe < (k - 1) * d + 1:
            continue
        (out,) = output_sizes("Conv", [size], [k], [s], [d], [pb], [pe])
        live = _brute_live(size, out, s, pb, k, d)
        assert dead_taps.live_taps(size, out, s, pb, k, d) == live
        cut = dead_taps.trim([size], [k], [s], [d], [pb], [pe], [out])
        if not any(live):
            assert cut is None
            continue
        # an end tap is cut when dead, unless that would make its pad negative
        k0 = next(t for t in range(k) if live[t] or pb - (t + 1) * d < 0)
        k1 = next(t for t in range(k, 0, -1) if live[t - 1] or pe - (k - t + 1) * d < 0)
        if (k0, k1) == (0, k):
            assert cut is None
            seen_none += 1
            continue
        assert cut is not None and (cut.first, cut.stop) == ((k0,), (k1,))
        seen_cut += 1
        assert all(not live[t] for t in range(k) if t < k0 or t >= k1)
        assert cut.pads[0] >= 0 and cut.pads[1] >= 0 and cut.kernel == (k1 - k0,)
        assert output_sizes("Conv", [size], cut.kernel, [s], [d], cut.pads[:1], cut.pads[1:]) == [out]
        # the first kept tap reads, for every output, the cell tap k0 of the full kernel read
        assert all(o * s - cut.pads[0] == o * s - pb + k0 * d for o in range(out))
    assert seen_cut > 1000 and seen_none > 1000


@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_conv_matches_plain_and_onnxruntime(monkeypatch, case, constant):
    _, xs, ws, attrs, kernel = case
    x, w, b = _inputs(xs, ws, len(xs) + sum(ws))
    k = _conv(attrs, _Initializers() if constant else None)
    got = k.compute([x, w, b])[0]
    assert (k.taps.last and k.taps.last.kernel) == kernel
    monkeypatch.setattr(dead_taps, "ENABLED", False)
    plain = _conv(attrs)
    want = plain.compute([x, w, b])[0]
    assert plain.taps.last is None
    _close(got, want)
    _close(got, _onnxruntime(x, w, b, None, attrs, False))
    w2 = w * 2  # new weight values: the cut follows them (a graph input), or a new constant array
    _close(k.compute([x, w2, b])[0], plain.compute([x, w2, b])[0])
    if not constant:  # the same array, new values written into it
        w[...] = w2 * -1.5
        _close(k.compute([x, w, b])[0], plain.compute([x, w, b])[0])


@pytest.mark.parametrize("act", ["", "Relu"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_fused_conv_matches_plain_and_onnxruntime(monkeypatch, case, residual, act):
    _, xs, ws, attrs, kernel = case
    x, w, b = _inputs(xs, ws, 7 + sum(xs))
    z = (np.random.default_rng(3).standard_normal(_out_shape(xs, ws, attrs)).astype(np.float32)
         if residual else None)
    k = _fused(attrs, act, residual, _Initializers())
    for _ in range(2):  # the second run takes what the twin kept per shape
        got = k.compute([x, w, b, z])[0]
    if len(xs) == 4:  # 1-D runs as its 2-D twin, 3-D through the CPU EP's Conv: each applies the rule itself
        assert (k.taps.last and k.taps.last.kernel) == kernel
        assert k.last_path is not None
    monkeypatch.setattr(dead_taps, "ENABLED", False)
    plain = _fused(attrs, act, residual, _Initializers())
    want = plain.compute([x, w, b, z])[0]
    _close(got, want)
    _close(got, _onnxruntime(x, w, b, z, attrs, act == "Relu"))
    w2 = w * -2  # another constant array: what was kept for the first is not taken for it
    _close(k.compute([x, w2, b, z])[0], plain.compute([x, w2, b, z])[0])


def test_aspp_runs_as_pointwise():
    """DeepLabV3's ASPP layer (a 3x3 at dilation 36 over 8x8) becomes a 1x1 without padding, which
    FusedConv runs as a product with the input in place."""
    x, w, b = _inputs((2, 240, 8, 8), (16, 240, 3, 3), 1)
    attrs = {"dilations": [36, 36], "pads": [36] * 4, "kernel_shape": [3, 3]}
    k = _fused(attrs, "Relu", False, _Initializers())
    k.compute([x, w, b, None])
    assert k.taps.last == dead_taps.Trim((1, 1), (2, 2), (1, 1), (0, 0, 0, 0))
    assert k.last_path == "pointwise"


def test_float64_and_float16(monkeypatch):
    xs, ws, attrs = (1, 3, 4, 4), (2, 3, 3, 3), {"dilations": [4, 4], "pads": [4] * 4}
    for dtype, tol in ((np.float64, 1e-12), (np.float16, 2e-2)):
        x, w, b = _inputs(xs, ws, 2, dtype)
        got = _conv(attrs).compute([x, w, b])[0]
        monkeypatch.setattr(dead_taps, "ENABLED", False)
        want = _conv(attrs).compute([x, w, b])[0]
        monkeypatch.setattr(dead_taps, "ENABLED", True)
        _close(got, want, tol)


def _random_case(rng) -> tuple[tuple, tuple, dict]:
    nd = int(rng.integers(1, 4))
    group = int(rng.choice([1, 1, 2]))
    depthwise = rng.random() < 0.2
    c = int(rng.integers(1, 4)) * group
    m = int(rng.integers(1, 4)) * group
    if depthwise:
        group, c = c, c
        m = c
    while True:
        sizes = [int(rng.integers(1, 7)) for _ in range(nd)]
        kernel = [int(rng.integers(1, 6)) for _ in range(nd)]
        strides = [int(rng.integers(1, 4)) for _ in range(nd)]
        dil = [int(rng.integers(1, 7)) for _ in range(nd)]
        pads = [int(rng.integers(0, 2 * d * (k - 1) // 2 + 2)) for k, d in zip(kernel * 2, dil * 2)]
        if all(s + pads[i] + pads[i + nd] >= (k - 1) * d + 1 for i, (s, k, d) in enumerate(zip(sizes, kernel, dil))):
            break
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil, "pads": pads, "group": group}
    return (int(rng.integers(1, 3)), c, *sizes), (m, c // group, *kernel), attrs


def test_random_geometries(monkeypatch):
    """Random 1-D to 3-D geometries (grouped, depthwise, strided, dilated, uneven pads): Conv with
    the rule against the plain kernel and onnxruntime, FusedConv with Relu (2-D) against both."""
    rng = np.random.default_rng(44)
    cut = 0
    for i in range(80):
        xs, ws, attrs = _random_case(rng)
        x, w, b = _inputs(xs, ws, i)
        k = _conv(attrs)
        got = k.compute([x, w, b])[0]
        cut += k.taps.last is not None
        monkeypatch.setattr(dead_taps, "ENABLED", False)
        want = _conv(attrs).compute([x, w, b])[0]
        fused_plain = _fused(attrs, "Relu", False, None).compute([x, w, b, None])[0] if len(xs) == 4 else None
        monkeypatch.setattr(dead_taps, "ENABLED", True)
        _close(got, want)
        _close(got, _onnxruntime(x, w, b, None, attrs, False))
        if fused_plain is not None:
            _close(_fused(attrs, "Relu", False, None).compute([x, w, b, None])[0], fused_plain)
    assert cut >= 20, cut  # the random geometries reach the rule often
