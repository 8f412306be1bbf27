"""The OpenCL EP's Conv rules (runtime/providers/opencl/fusion_rules.py): ``conv_pad`` (the implicit-GEMM
Conv reads its input in place with bounds checks instead of a ``pad_planes`` copy) and ``conv_wide_tile``
(32 output positions a work-item), ``conv_row_pairs`` (rows of 7 or 8 outputs, two a vector, in place of
im2col + GEMM), and the pooling rule ``pool_rows`` (a MaxPool work-item per output row). Each is
compared with the rule off (the plain kernel) and with
onnxruntime's CPU EP, on random inputs and on the edges: asymmetric and wide pads, strides, dilations,
groups, batches, inputs smaller than one load, NaN and infinities next to the padding."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("pyopencl")

import onnxhal  # noqa: E402
from tests.opencl_support import require_opencl  # noqa: E402

OPENCL_INDEX = require_opencl(module_level=True)
RNG = np.random.default_rng(4747)


def _conv_model(x_shape, w_shape, *, residual: bool = False, relu: bool = False, chain: int = 1,
                **attrs) -> tuple[onnx.ModelProto, dict]:
    """``chain`` Convs of one weight shape (Cout == Cin for chain > 1), optionally + residual, Relu."""
    nodes, weights, x = [], {}, "x"
    for i in range(chain):
        w = (RNG.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
        weights[f"w{i}"], weights[f"b{i}"] = w, RNG.standard_normal(w_shape[0]).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], **attrs))
        x = f"c{i}"
    if residual:
        nodes.append(helper.make_node("Add", [x, "z"], ["s"]))
        x = "s"
    if relu:
        nodes.append(helper.make_node("Relu", [x], ["r"]))
        x = "r"
    nodes.append(helper.make_node("Identity", [x], ["y"]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    feeds = {"x": RNG.standard_normal(x_shape).astype(np.float32)}
    if residual:
        y_shape = onnx.shape_inference.infer_shapes(helper.make_model(helper.make_graph(
            nodes[:chain], "g", inputs, [helper.make_tensor_value_info(f"c{chain - 1}", TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, k) for k, v in weights.items()]))).graph.output[0]
        dims = [d.dim_value for d in y_shape.type.tensor_type.shape.dim]
        inputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, dims))
        feeds["z"] = RNG.standard_normal(dims).astype(np.float32)
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, feeds


def _run(model: onnx.ModelProto, feeds: dict, disabled: str) -> tuple[np.ndarray, list[str]]:
    sess = onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                               "CPUExecutionProvider"])
    assert set(sess.partition_summary) == {"OpenCLExecutionProvider"}, sess.partition_summary
    (y,) = sess.run(None, feeds)
    kernels = [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
               if hasattr(s, "kernel_name")]
    return y, kernels


def _check(model, feeds, rule: str, rtol: float = 1e-4, atol: float = 1e-4):
    """Outputs with every rule and with ``rule`` off, each against onnxruntime and against each other;
    returns the kernels of both plans."""
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    on, k_on = _run(model, feeds, "")
    off, k_off = _run(model, feeds, rule)
    np.testing.assert_allclose(on, want, rtol=rtol, atol=atol, err_msg="rules on")
    np.testing.assert_allclose(off, want, rtol=rtol, atol=atol, err_msg=f"{rule} off")
    np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5, err_msg="rule on against the plain kernel")
    return k_on, k_off


CASES = [  # x shape, w shape, attributes
    ((1, 8, 12, 56), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                      # ResNet 3x3, 2 wide tiles a row
    ((2, 5, 6, 28), (24, 5, 3, 3), dict(pads=[1, 1, 1, 1])),                       # batch 2, one wide tile a row
    ((1, 4, 7, 16), (9, 4, 3, 3), dict(pads=[1, 1, 1, 1])),                        # one 16-wide panel (OW 16)
    ((1, 3, 16, 64), (32, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),      # 7x7 stride-2 stem
    ((1, 6, 16, 58), (40, 6, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),      # 3x3 stride 2
    ((1, 6, 8, 64), (64, 6, 1, 1), dict(strides=[2, 2])),                          # 1x1 stride 2 downsample
    ((1, 8, 6, 30), (12, 4, 3, 3), dict(pads=[0, 2, 1, 0], group=2, dilations=[2, 2])),  # groups, dilation; 6 items
    ((1, 4, 5, 46), (16, 4, 3, 5), dict(pads=[5, 9, 4, 7])),                       # pads wider than the kernel
    ((1, 1, 1, 14), (8, 1, 3, 3), dict(pads=[1, 1, 1, 1])),                        # input smaller than a load
    ((1, 2, 3, 30), (8, 2, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),        # stride 2, 15 outputs a row
    ((1, 4, 1, 16), (8, 4, 1, 3), dict(pads=[0, 1, 0, 1])),                        # one input row
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_pad_reads_in_place_as_the_padded_copy(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_pad")
    assert "pad_planes" in k_off and "pad_planes" not in k_on
    assert len(k_on) == len(k_off) - 1
    assert all(k.startswith("conv_unpadded_s") for k in k_on), k_on


@pytest.mark.parametrize("x_shape,w_shape,attrs", CASES)
def test_conv_wide_tile_against_the_16_wide_kernel(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_wide_tile")
    assert not any(k.endswith("_x2") for k in k_off)
    pads, dil, st = attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1]), attrs.get("strides", [1, 1])
    y_h, y_w = ((x_shape[2 + d] + pads[d] + pads[d + 2] - ((w_shape[2 + d] - 1) * dil[d] + 1)) // st[d] + 1
                for d in (0, 1))
    groups = attrs.get("group", 1)
    items = y_h * -(-y_w // 32) * -(-w_shape[0] // groups // 8) * x_shape[0] * groups
    wide = 8 * y_w >= 7 * 32 * -(-y_w // 32) and items >= 32  # kernel_sources.WIDE_TILE_MIN_ITEMS
    assert any(k.endswith("_x2") for k in k_on) == wide, (y_w, items, k_on)


def test_conv_pad_keeps_nan_and_infinity_out_of_the_padding(opencl):
    # Non-finite values on every edge of the input: a masked-out lane must read zero, not 0 * inf.
    model, feeds = _conv_model((1, 4, 6, 32), (8, 4, 3, 3), pads=[1, 1, 1, 1])
    x = feeds["x"]
    x[0, :, :, 0] = np.inf
    x[0, :, :, -1] = -np.inf
    x[0, 1, 0, 5] = np.nan
    x[0, 2, -1, 20] = np.nan
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for disabled in ("", "conv_pad"):
        got, _ = _run(model, feeds, disabled)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_resnet_block_drops_every_pad_launch(opencl):
    # Conv-Relu-Conv + residual + Relu (the optimizer's FusedConv takes the Add and Relu): two
    # implicit convs, no pad copy, the residual and Relu in the second conv's epilogue.
    model, feeds = _conv_model((1, 8, 16, 56), (8, 8, 3, 3), chain=2, residual=True, relu=True, pads=[1, 1, 1, 1])
    k_on, k_off = _check(model, feeds, "conv_pad")
    assert k_on == ["conv_unpadded_s1_x2"] * 2, k_on
    assert k_off == ["pad_planes", "conv_implicit_s1"] * 2, k_off


PAIR_CASES = [  # output rows of 7 or 8: two rows a vector (conv_row_pairs) against im2col + GEMM
    ((1, 16, 7, 7), (24, 16, 3, 3), dict(pads=[1, 1, 1, 1])),                      # ResNet's last stage
    ((2, 8, 14, 14), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),      # its stride-2 entry: im2col
    ((1, 8, 14, 14), (16, 8, 1, 1), dict(strides=[2, 2])),                         # its 1x1 downsample
    ((1, 4, 8, 8), (8, 4, 3, 3), dict(pads=[1, 1, 1, 1])),                         # rows of 8
    ((1, 4, 5, 7), (12, 4, 3, 3), dict(pads=[1, 1, 1, 1])),                        # an odd row count: half a pair
    ((1, 2, 1, 7), (8, 2, 1, 3), dict(pads=[0, 1, 0, 1])),                         # one row, input under a load
    ((1, 4, 7, 7), (8, 4, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),       # dilation
    ((1, 8, 9, 9), (8, 4, 3, 3), dict(group=2, pads=[0, 0, 0, 0])),                # groups, no padding
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", PAIR_CASES)
def test_conv_row_pairs_against_im2col(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    # off: conv_flat too, which would take these small Convs from im2col + GEMM (test_opencl_conv_flat.py)
    k_on, k_off = _check(model, feeds, "conv_row_pairs,conv_flat")
    sw = attrs.get("strides", [1, 1])[1]
    if sw == 2 and w_shape[2] * w_shape[3] > 1:  # stride 2 with several taps: not rows2 (slower there)
        assert k_on in (k_off, ["conv_flat"]), k_on
    else:
        assert k_on == [f"conv_rows2_s{sw}"], k_on
    assert k_off in (["im2col_packed", "gemm_packed"], ["im2col_packed", "gemm_packed_x2"]), k_off


def test_conv_row_pairs_with_residual_relu_and_non_finite_edges(opencl):
    model, feeds = _conv_model((1, 8, 7, 7), (8, 8, 3, 3), chain=2, residual=True, relu=True, pads=[1, 1, 1, 1])
    x = feeds["x"]
    x[0, :, :, 0] = np.inf
    x[0, 3, 6, 6] = np.nan
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for disabled in ("", "conv_row_pairs,conv_flat"):
        got, kernels = _run(model, feeds, disabled)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert kernels == ["im2col_packed", "gemm_packed"] * 2
    assert _run(model, feeds, "")[1] == ["conv_rows2_s1"] * 2


LANE_CASES = [  # 32-channel blocks and rows of 14 to 112 (conv_lanes) against the other forms
    ((1, 8, 28, 28), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                      # ResNet 3x3 at 28
    ((2, 10, 14, 14), (64, 10, 3, 3), dict(pads=[1, 1, 1, 1])),                    # batch 2, two channel blocks
    ((1, 9, 56, 56), (32, 9, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),      # 3x3 stride 2 into 28
    ((1, 8, 28, 28), (32, 8, 1, 1), dict(strides=[2, 2])),                         # 1x1 stride-2 downsample
    ((1, 8, 56, 56), (32, 8, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),      # 7x7 stride 2 into 28
    ((1, 3, 56, 56), (32, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),      # an RGB stem: not for the rule
    ((1, 16, 10, 30), (64, 8, 3, 3), dict(pads=[0, 1, 1, 1], group=2, dilations=[2, 2])),  # groups, dilation
    ((1, 8, 5, 14), (32, 8, 3, 5), dict(pads=[5, 9, 4, 9])),                       # pads wider than the kernel
    ((1, 8, 6, 14), (32, 8, 3, 3), dict(pads=[0, 1, 2, 1], strides=[1, 1])),       # asymmetric rows of padding
    ((1, 8, 14, 14), (48, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                      # 48 channels: not for the rule
    ((1, 8, 8, 56), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                       # rows of 56, 4 tiles
    ((1, 8, 12, 224), (32, 8, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),     # rows of 112
    ((1, 8, 4, 126), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                      # rows of 126: not for the rule
    ((1, 8, 5, 30), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                       # rows of 30: not for the rule
    ((1, 8, 7, 7), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                        # rows of 7: two a work-item
]

PAIR_LANE_CASES = [  # rows of 7 (conv_lanes_row_pairs) against conv_rows2 or im2col + GEMM
    ((1, 16, 7, 7), (64, 16, 3, 3), dict(pads=[1, 1, 1, 1])),                      # ResNet's last stage, 7 rows
    ((2, 8, 14, 14), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),      # its stride-2 entry, batch 2
    ((1, 8, 14, 14), (32, 8, 1, 1), dict(strides=[2, 2])),                         # its 1x1 downsample
    ((1, 8, 8, 7), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                        # an even row count
    ((1, 8, 1, 7), (32, 8, 1, 3), dict(pads=[0, 1, 0, 1])),                        # one row: half a tile
    ((1, 8, 11, 11), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1], dilations=[3, 3])),    # dilation
    ((1, 16, 9, 9), (64, 8, 3, 3), dict(group=2)),                                 # groups, no padding
    ((1, 8, 13, 13), (32, 8, 3, 3), dict(pads=[0, 1, 2, 1], strides=[1, 2])),      # asymmetric pads, strides
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", PAIR_LANE_CASES)
def test_conv_lanes_row_pairs_against_the_other_forms(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_lanes_row_pairs")
    assert _output_width(x_shape, w_shape, attrs) == 7
    pad = ["pad_planes"] if any(attrs.get("pads", [0])) else []
    assert k_on == [*pad, f"conv_lanes_r7x2_s{attrs.get('strides', [1, 1])[1]}"], k_on
    assert not any(k.startswith("conv_lanes") for k in k_off), k_off


ORDER_CASES = [  # conv_lanes_weight_order: weights (KH * KW * Mg) against the padded planes (Hp * Wp)
    ((1, 32, 14, 14), (64, 32, 3, 3), dict(pads=[1, 1, 1, 1]), True),             # ResNet's 14x14 stage
    ((2, 16, 7, 7), (96, 16, 3, 3), dict(pads=[1, 1, 1, 1]), True),               # rows of 7, batch 2, 3 blocks
    ((1, 16, 14, 14), (256, 16, 1, 1), dict(strides=[2, 2]), True),               # a 1x1 downsample into 7
    ((1, 16, 28, 28), (256, 8, 3, 3), dict(pads=[1, 1, 1, 1], group=2), True),    # groups: 1152 against 900
    ((1, 8, 56, 56), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), False),              # planes outweigh the weights
]


def _last_int_args(model: onnx.ModelProto, disabled: str) -> list[int]:
    sess = onnxhal.InferenceSession(model.SerializeToString(),
                                    providers=[("OpenCLExecutionProvider", {"disable_fusions": disabled}),
                                               "CPUExecutionProvider"])
    # wmajor: the argument before the output's and the residual's layouts (three each).
    return [int(s.args[-7]) for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
            if getattr(s, "kernel_name", "").startswith("conv_lanes")]


@pytest.mark.parametrize("x_shape,w_shape,attrs,applies", ORDER_CASES)
def test_conv_lanes_weight_order_against_the_tile_order(opencl, x_shape, w_shape, attrs, applies):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_lanes_weight_order")
    assert k_on == k_off and any(k.startswith("conv_lanes") for k in k_on), (k_on, k_off)
    # The kernel's last argument (wmajor) selects the walk (of the kernels that take a tile a work-item).
    assert _last_int_args(model, "conv_lanes_weight_chunks") == [1 if applies else 0]
    assert _last_int_args(model, "conv_lanes_weight_order,conv_lanes_weight_chunks") == [0]


UNPADDED_CASES = [  # conv_lanes without padding: the input read in place (conv_lanes_unpadded)
    ((1, 8, 28, 28), (32, 8, 1, 1), dict(strides=[2, 2])),                         # 1x1 downsample into 14
    ((2, 8, 16, 16), (64, 8, 3, 3), {}),                                           # 3x3, batch 2, into 14
    ((1, 16, 30, 30), (64, 8, 3, 3), dict(group=2, strides=[2, 2])),               # groups, stride 2, into 14
    ((1, 8, 16, 31), (32, 8, 3, 3), dict(dilations=[1, 2], strides=[1, 2])),       # dilation, odd width
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", UNPADDED_CASES)
def test_conv_lanes_unpadded_reads_in_place_as_the_copy(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_lanes_unpadded")
    kernel = _lanes_kernel("r14", attrs.get("strides", [1, 1])[1], w_shape[3])
    assert (k_on, k_off) == ([kernel], ["pad_planes", kernel]), (k_on, k_off)


def _lanes_kernel(tile: str, sw: int, kw: int) -> str:
    """The conv_lanes kernel of a tile: rows of 14 and up with kernel rows of 3 unrolled (conv_lanes_k3)."""
    return f"conv_lanes_{tile}_s{sw}" + ("_k3" if kw == 3 and tile == "r14" else "")


def _output_width(x_shape, w_shape, attrs) -> int:
    pads, dil, st = attrs.get("pads", [0] * 4), attrs.get("dilations", [1, 1]), attrs.get("strides", [1, 1])
    return (x_shape[3] + pads[1] + pads[3] - ((w_shape[3] - 1) * dil[1] + 1)) // st[1] + 1


@pytest.mark.parametrize("x_shape,w_shape,attrs", LANE_CASES)
def test_conv_lanes_against_the_row_vector_kernels(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    k_on, k_off = _check(model, feeds, "conv_lanes")
    assert not any(k.startswith("conv_lanes") for k in k_off), k_off
    ow = _output_width(x_shape, w_shape, attrs)
    lanes = w_shape[0] // attrs.get("group", 1) % 32 == 0 and w_shape[1] >= 8 and (ow % 14 == 0 and ow <= 112
                                                                                  or ow == 7)
    if lanes:
        tile = "r14" if ow != 7 else "r7x2"
        pad = ["pad_planes"] if any(attrs.get("pads", [0])) else []
        assert k_on == [*pad, _lanes_kernel(tile, attrs.get("strides", [1, 1])[1], w_shape[3])], k_on
    else:
        assert k_on == k_off, k_on


@pytest.mark.parametrize("hw", [14, 7])
@pytest.mark.parametrize("act,attrs", [("Relu", {}), ("LeakyRelu", dict(alpha=0.1)), ("Clip", {}),
                                       ("Sigmoid", {})])
def test_conv_lanes_with_residual_activation_and_non_finite_edges(opencl, act, attrs, hw):
    # Two Convs of 32 channels (the optimizer's FusedConv takes the residual Add and the activation
    # into the second one's epilogue), non-finite values on the input's edges; rows of 7 two a work-item.
    model, feeds = _conv_model((1, 32, hw, hw), (32, 32, 3, 3), chain=2, residual=True, pads=[1, 1, 1, 1])
    graph = model.graph
    graph.node[-1].input[0] = "a"
    extra = [helper.make_node(act, ["s"] + (["lo", "hi"] if act == "Clip" else []), ["a"], **attrs)]
    graph.node.insert(len(graph.node) - 1, extra[0])
    if act == "Clip":
        graph.initializer.extend([numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
                                  numpy_helper.from_array(np.array(0.7, np.float32), "hi")])
    x = feeds["x"]
    x[0, :, :, 0] = np.inf
    x[0, :, 0, :] = -np.inf
    x[0, 3, hw - 1, hw - 1] = np.nan
    x[0, 5, hw // 2, hw // 2] = np.nan
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for disabled in ("", "conv_lanes"):
        got, kernels = _run(model, feeds, disabled)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert not any(k.startswith("conv_lanes") for k in kernels), kernels
    tile = "r14" if hw == 14 else "r7x2"
    kernel = _lanes_kernel(tile, 1, 3)
    # The first Conv writes the second's padded planes (conv_lanes_padded_output; rows of 7:
    # conv_lanes_padded_pairs), which also reads them as its residual.
    assert _run(model, feeds, "")[1] == ["pad_planes", kernel, kernel]
    assert _run(model, feeds, "conv_lanes_padded_pairs")[1] == (["pad_planes", kernel, kernel] if hw == 14
                                                                else ["pad_planes", kernel] * 2)


K3_CASES = [  # conv_lanes with kernel rows of 3 (conv_lanes_k3: the tap loop unrolled) against the loop
    ((1, 8, 28, 28), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1])),                      # ResNet 3x3 at 28
    ((2, 10, 14, 14), (64, 10, 3, 3), dict(pads=[1, 1, 1, 1])),                    # batch 2, two channel blocks
    ((1, 9, 56, 56), (32, 9, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),      # stride 2 into 28
    ((1, 16, 10, 30), (64, 8, 3, 3), dict(pads=[0, 1, 1, 1], group=2, dilations=[2, 2])),  # groups, dilation
    ((1, 8, 16, 31), (32, 8, 3, 3), dict(dilations=[1, 2], strides=[1, 2])),       # no padding, odd width
    ((1, 8, 6, 14), (32, 8, 5, 3), dict(pads=[0, 1, 4, 1])),                       # 5 rows of 3, asymmetric pads
]


@pytest.mark.parametrize("x_shape,w_shape,attrs", K3_CASES)
def test_conv_lanes_k3_against_the_tap_loop(opencl, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    feeds["x"][0, :, :, 0] = np.inf  # non-finite values next to the padding
    feeds["x"][0, 1, -1, -1] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_k3")
    assert k_on[-1] == k_off[-1] + "_k3" and k_on[:-1] == k_off[:-1], (k_on, k_off)
    assert k_off[-1] == _lanes_kernel("r14", attrs.get("strides", [1, 1])[1], 0), k_off


CHUNK_CASES = [  # rows of 7 with 8 channel blocks or more (conv_lanes_weight_chunks) against a tile a work-item
    ((1, 16, 7, 7), (256, 16, 3, 3), dict(pads=[1, 1, 1, 1]), True),             # last stage: 4 tiles, 2 chunks
    ((2, 8, 14, 14), (128, 8, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]), True),  # stride-2 entry, batch 2
    ((1, 40, 14, 14), (256, 40, 1, 1), dict(strides=[2, 2]), True),               # 1x1 downsample, one chunk
    ((1, 64, 9, 7), (256, 64, 3, 3), dict(pads=[1, 1, 1, 1]), True),              # 5 chunks, an odd last tile
    ((1, 32, 7, 7), (256, 16, 3, 3), dict(pads=[1, 1, 1, 1], group=2), True),     # groups: 4 blocks x 2
    ((1, 16, 7, 7), (224, 16, 3, 3), dict(pads=[1, 1, 1, 1]), False),             # 7 blocks: too few work-items
    ((1, 16, 2, 7), (256, 16, 3, 3), dict(pads=[1, 1, 1, 1]), False),             # one tile: nothing to share
]


@pytest.mark.parametrize("x_shape,w_shape,attrs,applies", CHUNK_CASES)
def test_conv_lanes_weight_chunks_against_a_tile_a_work_item(opencl, x_shape, w_shape, attrs, applies):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    feeds["x"][0, :, :, 0] = np.inf  # non-finite values next to the padding
    feeds["x"][0, 1, -1, -1] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_weight_chunks")
    plain = f"conv_lanes_r7x2_s{attrs.get('strides', [1, 1])[1]}"
    assert k_off[-1] == plain and k_on[:-1] == k_off[:-1], (k_on, k_off)
    assert k_on[-1] == plain + ("_wc" if applies else ""), k_on
    # Each accumulator sums the same products in the same order, a chunk at a time.
    np.testing.assert_array_equal(_run(model, feeds, "")[0], _run(model, feeds, "conv_lanes_weight_chunks")[0])


def test_conv_lanes_weight_chunks_with_residual_and_relu(opencl):
    # Two Convs of 256 channels at 7x7, the second with the residual Add and Relu in its epilogue.
    model, feeds = _conv_model((1, 256, 7, 7), (256, 256, 3, 3), chain=2, residual=True, relu=True,
                               pads=[1, 1, 1, 1])
    feeds["x"][0, 3, 6, 6] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_weight_chunks")
    # the first writes the second's padded planes (conv_lanes_padded_pairs), chunked or not
    assert k_on == ["pad_planes"] + ["conv_lanes_r7x2_s1_wc"] * 2, k_on
    assert k_off == ["pad_planes"] + ["conv_lanes_r7x2_s1"] * 2, k_off


def _two_convs(x_shape, w1, attrs1: dict, w2, attrs2: dict, *, relu: bool = True, share: str = "") -> tuple:
    """Conv (+ Relu) -> Conv, the first Conv's output also read by a residual Add after the second
    (``share`` "residual"), as a plan output (``share`` "output") or by a 1x1 Conv whose output is one
    (``share`` "conv")."""
    weights = {f"w{i}": (RNG.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32)
               for i, s in enumerate((w1, w2))}
    weights.update({f"b{i}": RNG.standard_normal(s[0]).astype(np.float32) for i, s in enumerate((w1, w2))})
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], **attrs1)]
    a = "c0"
    if relu:
        nodes.append(helper.make_node("Relu", ["c0"], ["a0"]))
        a = "a0"
    nodes.append(helper.make_node("Conv", [a, "w1", "b1"], ["c1"], **attrs2))
    outputs = ["c1"]
    if share == "residual":
        nodes.append(helper.make_node("Add", ["c1", a], ["s"]))
        outputs = ["s"]
    elif share == "output":
        outputs.append(a)
    elif share == "conv":
        weights["w2"] = RNG.standard_normal((32, w1[0], 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("Conv", [a, "w2"], ["c2"]))
        outputs.append("c2")
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, {"x": RNG.standard_normal(x_shape).astype(np.float32)}


PADDED_OUTPUT_CASES = [  # conv_lanes_padded_output: producer (x, w, attrs), consumer (w, attrs), its kernel
    ((1, 8, 14, 14), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), (32, 32, 3, 3), dict(pads=[1, 1, 1, 1]),
     "conv_lanes_r14_s1_k3"),                                                       # a ResNet block's two 3x3
    ((2, 8, 28, 28), (32, 8, 1, 1), {}, (32, 32, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2]),
     "conv_lanes_r14_s2_k3"),                                                       # batch 2, stride 2 reader
    ((1, 16, 14, 28), (64, 8, 3, 3), dict(pads=[1, 1, 1, 1], group=2), (32, 64, 3, 5),
     dict(pads=[2, 4, 0, 4], dilations=[1, 2]), "conv_lanes_r14_s1"),              # groups; asymmetric pads
]


@pytest.mark.parametrize("x_shape,w1,attrs1,w2,attrs2,kernel", PADDED_OUTPUT_CASES)
def test_conv_lanes_padded_output_against_the_pad_copy(opencl, x_shape, w1, attrs1, w2, attrs2, kernel):
    model, feeds = _two_convs(x_shape, w1, attrs1, w2, attrs2)
    feeds["x"][0, 0, 0, :] = np.inf  # non-finite values in the first Conv's outputs next to the padding
    feeds["x"][-1, 1, :, -1] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_padded_output")
    assert k_off.count("pad_planes") == k_on.count("pad_planes") + 1 and k_on[-1] == k_off[-1] == kernel, (k_on,
                                                                                                        k_off)
    # The second Conv reads the same padded planes either way: the same sums, bit for bit, every run.
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["OpenCLExecutionProvider",
                                                                          "CPUExecutionProvider"])
    first, second = sess.run(None, feeds)[0], sess.run(None, feeds)[0]
    off = _run(model, feeds, "conv_lanes_padded_output")[0]
    np.testing.assert_array_equal(first, off)
    np.testing.assert_array_equal(second, off)


def test_conv_lanes_padded_output_with_a_residual_reader(opencl):
    # A ResNet block's output: read by the next block's first Conv (padded) and, as its residual, by
    # the second, which then reads it from the padded planes.
    model, feeds = _two_convs((1, 8, 14, 14), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), (32, 32, 3, 3),
                              dict(pads=[1, 1, 1, 1]), share="residual")
    feeds["x"][0, 2, :, 0] = -np.inf
    k_on, k_off = _check(model, feeds, "conv_lanes_padded_output")
    assert (k_on, k_off) == (["pad_planes"] + ["conv_lanes_r14_s1_k3"] * 2,
                             ["pad_planes", "conv_lanes_r14_s1_k3"] * 2), (k_on, k_off)
    np.testing.assert_array_equal(_run(model, feeds, "")[0], _run(model, feeds, "conv_lanes_padded_output")[0])


@pytest.mark.parametrize("share,base", [("output", ""), ("conv", "conv_lanes_padded_input")])
def test_conv_lanes_padded_output_keeps_a_shared_value_plain(opencl, share, base):
    # The first Conv's output has another reader that expects the plain layout (a plan output, a
    # Conv reading it in place without rule conv_lanes_padded_input): the copy stays.
    model, feeds = _two_convs((1, 8, 14, 14), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), (32, 32, 3, 3),
                              dict(pads=[1, 1, 1, 1]), share=share)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    kernels = []
    for disabled in (base, f"{base},conv_lanes_padded_output".lstrip(",")):
        sess = onnxhal.InferenceSession(model.SerializeToString(), providers=[
            ("OpenCLExecutionProvider", {"disable_fusions": disabled}), "CPUExecutionProvider"])
        for got, ref in zip(sess.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        kernels.append([s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
                        if hasattr(s, "kernel_name")])
    assert kernels[0] == kernels[1] and kernels[0].count("pad_planes") == 2, kernels


PAIR_PADDED_CASES = [  # conv_lanes_padded_pairs: rows of 7, a row-pair producer and residual reader
    ((1, 16, 7, 7), (256, 16, 3, 3), "conv_lanes_r7x2_s1_wc"),   # a ResNet's 7x7 stage: chunked
    ((1, 8, 9, 7), (32, 8, 3, 3), "conv_lanes_r7x2_s1"),         # one channel block; 9 rows: a last tile of one
    ((2, 8, 7, 7), (64, 8, 3, 3), "conv_lanes_r7x2_s1"),         # batch 2
]


@pytest.mark.parametrize("x_shape,w1,kernel", PAIR_PADDED_CASES)
def test_conv_lanes_padded_pairs_against_the_pad_copy(opencl, x_shape, w1, kernel):
    # Block output -> padded 3x3 Conv, also its residual: both in row-pair tiles.
    model, feeds = _two_convs(x_shape, w1, dict(pads=[1, 1, 1, 1]), (w1[0], w1[0], 3, 3), dict(pads=[1, 1, 1, 1]),
                              share="residual")
    feeds["x"][0, 0, 0, :] = np.inf  # non-finite values next to the padding
    feeds["x"][-1, 1, :, -1] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_padded_pairs")
    assert k_off == ["pad_planes", kernel, "pad_planes", kernel] and k_on == ["pad_planes", kernel, kernel], (k_on,
                                                                                                              k_off)
    # The same sums from the same values either way, bit for bit, every run.
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["OpenCLExecutionProvider",
                                                                          "CPUExecutionProvider"])
    off = _run(model, feeds, "conv_lanes_padded_pairs")[0]
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, feeds)[0], off)
    # and with a store a lane (rule conv_lanes_row_stores off): each position at its row's place
    lanes, k_lanes = _run(model, feeds, "conv_lanes_row_stores")
    assert k_lanes == k_on, k_lanes
    np.testing.assert_array_equal(lanes, off)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv_lanes_padded_input_reads_the_padded_planes(opencl, stride):
    # A ResNet stage's entry: the block output feeds a padded 3x3 Conv and a 1x1 downsample; the 1x1
    # reads the interior of the padded planes the producer writes, and the pad copy between goes.
    model, feeds = _two_convs((1, 8, 28, 28), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), (32, 32, 3, 3),
                              dict(pads=[1, 1, 1, 1], strides=[stride, stride]), share="conv")
    if stride == 2:  # the 1x1 of stride 2 as the 3x3
        conv = next(n for n in model.graph.node if n.output[0] == "c2")
        conv.attribute.append(helper.make_attribute("strides", [2, 2]))
    feeds["x"][0, 0, 0, :] = np.inf  # non-finite values next to the padding
    feeds["x"][0, 3, :, -1] = np.nan
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got, kernels = [], []
    for disabled in ("", "conv_lanes_padded_input"):
        sess = onnxhal.InferenceSession(model.SerializeToString(), providers=[
            ("OpenCLExecutionProvider", {"disable_fusions": disabled}), "CPUExecutionProvider"])
        got.append(sess.run(None, feeds))
        for y, ref in zip(got[-1], want, strict=True):
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4, err_msg=f"off: {disabled!r}")
        kernels.append([s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
                        if hasattr(s, "kernel_name")])
    for on, off in zip(*got, strict=True):  # the same sums from the same values, bit for bit
        np.testing.assert_array_equal(on, off)
    k_on, k_off = kernels
    # one pad copy left: the first Conv's, of the partition's input
    assert k_off == k_on[:2] + ["pad_planes"] + k_on[2:] and k_on.count("pad_planes") == 1, (k_on, k_off)


@pytest.mark.parametrize("pool_out_is_output", [False, True])
def test_pool_padded_output_writes_the_padded_planes(opencl, pool_out_is_output):
    # A ResNet stem's pool: its output feeds a padded 3x3 conv_lanes Conv and that Conv's residual.
    w = (RNG.standard_normal((32, 32, 3, 3)) / 17).astype(np.float32)
    nodes = [helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "p"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    outputs = ["y", "p"] if pool_out_is_output else ["y"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 28, 28])],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    x = RNG.standard_normal((1, 32, 28, 28)).astype(np.float32)
    x[0, 0, :, 0], x[0, 5, -1, :] = np.inf, np.nan  # non-finite values next to the padding
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got, kernels = [], []
    for disabled in ("", "pool_padded_output"):
        sess = onnxhal.InferenceSession(model.SerializeToString(), providers=[
            ("OpenCLExecutionProvider", {"disable_fusions": disabled}), "CPUExecutionProvider"])
        got.append(sess.run(None, {"x": x}))
        for y, ref in zip(got[-1], want, strict=True):
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
            np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4, err_msg=f"off: {disabled!r}")
        kernels.append([s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
                        if hasattr(s, "kernel_name")])
    for on, off in zip(*got, strict=True):  # the same sums from the same values, bit for bit
        np.testing.assert_array_equal(on, off)
    k_on, k_off = kernels
    assert k_off == ["maxpool2d_rows_v2", "pad_planes", "conv_lanes_r14_s1_k3"], k_off
    # a pool output that is also the partition's output keeps its plain layout and the copy
    assert k_on == (k_off if pool_out_is_output else ["maxpool2d_rows_v2", "conv_lanes_r14_s1_k3"]), k_on


def test_conv_lanes_padded_output_zeroes_the_border_once(opencl, monkeypatch):
    # Buffers that come with NaN in them (OpenCL leaves a new buffer's contents undefined): the padded
    # planes' border must be zeroed by the plan, as no launch writes it.
    from onnxhal.runtime.providers.opencl import memory

    def dirty(self, size):
        n = max(int(size), 4)
        return memory.cl.Buffer(self.device.context, memory.cl.mem_flags.READ_WRITE
                                | memory.cl.mem_flags.COPY_HOST_PTR, hostbuf=np.full(n // 4, np.nan, np.float32))

    monkeypatch.setattr(memory.OpenCLAllocator, "_alloc", dirty)
    model, feeds = _two_convs((1, 8, 14, 14), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), (32, 32, 3, 3),
                              dict(pads=[1, 1, 1, 1]))
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got, kernels = _run(model, feeds, "")
    assert kernels.count("pad_planes") == 1, kernels
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


ROW_STORE_CASES = [  # conv_lanes_row_stores: each channel's run of a tile stored as vectors, per tile form
    ((1, 8, 14, 28), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), "conv_lanes_r14_s1_k3"),          # rows of 14 x 2
    ((1, 8, 28, 28), (64, 8, 1, 1), dict(strides=[2, 2]), "conv_lanes_r14_s2"),                # 1x1 downsample
    ((1, 8, 7, 7), (32, 8, 3, 3), dict(pads=[1, 1, 1, 1]), "conv_lanes_r7x2_s1"),              # odd last tile
    ((1, 16, 8, 7), (256, 16, 3, 3), dict(pads=[1, 1, 1, 1]), "conv_lanes_r7x2_s1_wc"),       # chunked, 4 tiles
]


@pytest.mark.parametrize("x_shape,w_shape,attrs,kernel", ROW_STORE_CASES)
@pytest.mark.parametrize("residual", [False, True])
def test_conv_lanes_row_stores_against_a_store_a_lane(opencl, x_shape, w_shape, attrs, kernel, residual):
    model, feeds = _conv_model(x_shape, w_shape, residual=residual, relu=residual, **attrs)
    feeds["x"][0, 0, 0, -1] = np.inf  # non-finite values next to the padding, a few outputs each
    feeds["x"][0, 1, -1, 0] = np.nan
    k_on, k_off = _check(model, feeds, "conv_lanes_row_stores")
    assert k_on == k_off and k_on[-1] == kernel, (k_on, k_off)
    # The argument after p1 (the 23rd) selects the stores; the sums are the same, so are the outputs.
    rows = [int(s.args[22]) for d in ("", "conv_lanes_row_stores") for p in onnxhal.InferenceSession(
        model.SerializeToString(), providers=[("OpenCLExecutionProvider", {"disable_fusions": d}),
                                              "CPUExecutionProvider"]).eps["OpenCLExecutionProvider"].compiled_plans
            for s in p.steps if getattr(s, "kernel_name", "") == kernel]
    assert rows == [1, 0], rows
    np.testing.assert_array_equal(_run(model, feeds, "")[0], _run(model, feeds, "conv_lanes_row_stores")[0])


def _pool_model(x_shape, **attrs) -> tuple[onnx.ModelProto, dict]:
    graph = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, {"x": RNG.standard_normal(x_shape).astype(np.float32)}


POOL_CASES = [  # x shape, attributes, whether the rows reach POOL_ROWS_MIN_OW
    ((1, 8, 20, 20), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), True),   # ResNet's stem pool
    ((2, 3, 9, 13), dict(kernel_shape=[3, 2], strides=[1, 2], pads=[0, 1, 2, 0]), True),     # asymmetric pads
    ((1, 4, 11, 12), dict(kernel_shape=[2, 3], dilations=[2, 3], pads=[1, 2, 1, 2]), True),  # dilations
    ((1, 2, 7, 9), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1), True),            # ceil_mode
    ((1, 3, 1, 16), dict(kernel_shape=[1, 3], strides=[1, 1], pads=[0, 1, 0, 1]), True),     # one input row
    ((1, 5, 6, 6), dict(kernel_shape=[3, 3], strides=[2, 2]), False),                        # rows of 2 outputs
]


def _row_kernel(model: onnx.ModelProto, feeds: dict, attrs: dict) -> str:
    """The row kernel rule pool_row_vectors picks: vectors for strides 1 and 2 and rows of 8 outputs up."""
    (y,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    sw = attrs.get("strides", [1, 1])[-1]
    return f"maxpool2d_rows_v{sw}" if sw in (1, 2) and y.shape[-1] >= 8 else "maxpool2d_rows"


@pytest.mark.parametrize("x_shape,attrs,rows", POOL_CASES)
def test_pool_rows_against_one_work_item_per_output(opencl, x_shape, attrs, rows):
    model, feeds = _pool_model(x_shape, **attrs)
    k_on, k_off = _check(model, feeds, "pool_rows", rtol=0, atol=0)
    assert k_off == ["maxpool2d"]
    assert k_on == ([_row_kernel(model, feeds, attrs)] if rows else ["maxpool2d"])


POOL_VECTOR_CASES = [  # rows of 8 outputs and more: pool_row_vectors against the scalar row kernel
    ((1, 8, 40, 40), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),   # ResNet's stem pool
    ((2, 3, 9, 30), dict(kernel_shape=[3, 2], strides=[1, 2], pads=[0, 1, 2, 0])),     # asymmetric pads
    ((1, 4, 11, 40), dict(kernel_shape=[2, 3], dilations=[2, 3], pads=[1, 2, 1, 2])),  # dilations, stride 1
    ((1, 2, 7, 33), dict(kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1)),           # ceil_mode: a window past W
    ((1, 3, 1, 40), dict(kernel_shape=[1, 3], pads=[0, 1, 0, 1])),                     # one input row
    ((1, 3, 3, 17), dict(kernel_shape=[2, 2], pads=[1, 1, 1, 1], dilations=[4, 1])),   # padding-alone windows
    ((1, 5, 6, 30), dict(kernel_shape=[3, 3], strides=[3, 3])),                        # stride 3: not for the rule
    ((1, 2, 6, 12), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),     # rows of 6: not for it
]


@pytest.mark.parametrize("x_shape,attrs", POOL_VECTOR_CASES)
def test_pool_row_vectors_against_the_scalar_row_kernel(opencl, x_shape, attrs):
    model, feeds = _pool_model(x_shape, **attrs)
    k_on, k_off = _check(model, feeds, "pool_row_vectors", rtol=0, atol=0)
    assert k_off == ["maxpool2d_rows"]
    assert k_on == [_row_kernel(model, feeds, attrs)]
    sw = attrs.get("strides", [1, 1])[-1]
    assert (k_on != k_off) == (sw in (1, 2) and x_shape[-1] > 12)


def test_pool_rows_keeps_nan_and_gives_padding_alone_the_lowest_finite(opencl):
    # Dilation 4 over 3 rows with a pad of 1: the one output row's taps (-1 and 3) both lie outside,
    # so every window is padding alone (onnxruntime: the lowest finite float); NaN on the edges.
    model, feeds = _pool_model((1, 2, 3, 9), kernel_shape=[2, 2], pads=[1, 1, 1, 1], dilations=[4, 1])
    _, k_on = _run(model, feeds, "")
    assert k_on == ["maxpool2d_rows_v1"]  # rows of 10: the vector kernel, its padding-alone rows scalar
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert (want == np.finfo(np.float32).min).all()
    np.testing.assert_array_equal(_run(model, feeds, "")[0], want)
    model, feeds = _pool_model((1, 2, 6, 40), kernel_shape=[3, 3], strides=[1, 2], pads=[1, 1, 1, 1])
    feeds["x"][0, 0, :, 0] = np.nan
    feeds["x"][0, 1, 5, 4] = np.nan
    feeds["x"][0, 1, 2, 17] = np.nan  # inside a vector's windows (pool_row_vectors)
    feeds["x"][0, 0, 3, 9] = -np.inf
    feeds["x"][0, 1, 0, -1] = np.inf
    # onnxruntime's MaxPool keeps a NaN at some window positions and skips it at others
    # (docs/opencl.md, "What it claims"): the CPU EP, which keeps it as numpy, is the reference here.
    (want,) = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.isnan(want).any()
    expected = {"": "maxpool2d_rows_v2", "pool_row_vectors": "maxpool2d_rows", "pool_rows": "maxpool2d"}
    for disabled, kernel in expected.items():
        got, kernels = _run(model, feeds, disabled)
        assert kernels == [kernel]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(got, want)


PHASE_CASES = [  # stride-2 Convs of kernel rows of 5+ (conv_phases) against conv_unpadded_s2 and onnxruntime
    ((1, 3, 20, 64), (32, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),      # a 7x7 RGB stem, rows of 32
    ((2, 3, 9, 59), (8, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),        # batch 2, odd width: rows of 30
    ((1, 4, 6, 60), (16, 4, 5, 5), dict(pads=[2, 0, 1, 3], strides=[1, 2])),       # asymmetric pads, 5x5, sh 1
    ((1, 8, 7, 47), (12, 4, 3, 7), dict(pads=[1, 9, 1, 8], strides=[2, 2], group=2)),  # pads wider than the kernel
    ((1, 2, 9, 60), (8, 2, 3, 5), dict(pads=[2, 2, 2, 2], strides=[2, 2], dilations=[2, 1])),  # dilation in h
    ((1, 2, 3, 31), (8, 2, 1, 5), dict(pads=[0, 0, 0, 0], strides=[2, 2])),        # no padding, rows of 14
]


@pytest.fixture
def any_size_phases(monkeypatch):
    """conv_phases for Convs of any work, so that small inputs reach its edges."""
    from onnxhal.runtime.providers.opencl import kernel_sources as ks

    monkeypatch.setattr(ks, "CONV_PHASES_MIN_MACS", 0)


@pytest.mark.parametrize("x_shape,w_shape,attrs", PHASE_CASES)
def test_conv_phases_against_the_row_vector_kernel(opencl, any_size_phases, x_shape, w_shape, attrs):
    model, feeds = _conv_model(x_shape, w_shape, **attrs)
    x = feeds["x"]
    x[0, :, :, 0] = np.inf  # non-finite values next to the padding must not reach a padded lane
    x[0, -1, -1, -1] = -np.inf
    x[-1, 0, 0, 1] = np.nan
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for base in ("", "conv_wide_tile"):  # 32 positions a work-item, then 16
        on, k_on = _run(model, feeds, base)
        off, k_off = _run(model, feeds, ",".join(filter(None, (base, "conv_phases"))))
        for got in (on, off):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(on, off, rtol=1e-5, atol=1e-5)
        assert k_on[0] == "pad_phases" and k_on[1].startswith("conv_phases_s2") and len(k_on) == 2, k_on
        assert k_off[0].startswith("conv_unpadded_s2"), k_off
        assert k_on[1].removeprefix("conv_phases_s2") == k_off[0].removeprefix("conv_unpadded_s2"), (k_on, k_off)


def test_conv_phases_takes_wide_kernels_of_enough_work_only(opencl):
    # ResNet's stem on a quarter of its rows (7x7 stride 2, 29.5 M multiply-adds) takes it; less work,
    # 3x3 kernels and horizontal dilation do not.
    stem, feeds = _conv_model((1, 3, 56, 224), (64, 3, 7, 7), pads=[3, 3, 3, 3], strides=[2, 2])
    assert _run(stem, feeds, "")[1] == ["pad_phases", "conv_phases_s2_x2"]
    for x_shape, w_shape, attrs in [
        ((1, 3, 14, 224), (64, 3, 7, 7), dict(pads=[3, 3, 3, 3], strides=[2, 2])),   # 7.4 M: too little work
        ((1, 3, 64, 224), (64, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),   # 3x3: not for the rule
        ((1, 3, 64, 224), (64, 3, 7, 7), dict(pads=[6, 6, 6, 6], strides=[2, 2], dilations=[2, 2])),  # dw 2
    ]:
        model, feeds = _conv_model(x_shape, w_shape, **attrs)
        assert not any("phases" in k for k in _run(model, feeds, "")[1])


def _downsample_block(x_shape, c_out: int, stride: int, *, bias: bool = True, shared: bool = False) -> tuple:
    """A ResNet basic block with a downsample: Relu(Conv3x3(Relu(Conv3x3/stride(x))) + Conv1x1/stride(x)),
    the 1x1's output also a model output with ``shared``."""
    c_in = x_shape[1]
    shapes = {"w0": (c_out, c_in, 3, 3), "w1": (c_out, c_out, 3, 3), "w2": (c_out, c_in, 1, 1)}
    weights = {k: (RNG.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32) for k, s in shapes.items()}
    weights.update({f"b{i}": RNG.standard_normal(c_out).astype(np.float32) for i in range(3)})
    s, p = [stride, stride], [1, 1, 1, 1]
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], strides=s, pads=p),
             helper.make_node("Relu", ["c0"], ["a0"]),
             helper.make_node("Conv", ["a0", "w1", "b1"], ["c1"], pads=p),
             helper.make_node("Conv", ["x", "w2", "b2"] if bias else ["x", "w2"], ["d"], strides=s),
             helper.make_node("Add", ["c1", "d"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["y"])]
    if not bias:
        del weights["b2"]
    outputs = ["y", "d"] if shared else ["y"]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              [numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model, {"x": RNG.standard_normal(x_shape).astype(np.float32)}


DOWNSAMPLE_CASES = [  # x shape, output channels, stride, bias of the 1x1, the reader's kernel
    ((1, 8, 56, 56), 32, 2, True, "conv_lanes_r14_s1_k3_ds2"),         # a ResNet stage's entry, rows of 28
    ((2, 16, 28, 28), 64, 2, False, "conv_lanes_r14_s1_k3_ds2"),       # batch 2, a 1x1 without bias
    ((1, 8, 14, 28), 32, 1, True, "conv_lanes_r14_s1_k3_ds1"),         # stride 1 (channels change only)
    ((1, 16, 14, 14), 32, 2, True, "conv_lanes_r7x2_s1_ds2"),          # rows of 7: row pairs
    ((1, 16, 14, 14), 256, 2, True, "conv_lanes_r7x2_s1_wc_ds2"),      # rows of 7, weight chunks
]


@pytest.mark.parametrize("x_shape,c_out,stride,bias,kernel", DOWNSAMPLE_CASES)
def test_conv_lanes_downsample_against_its_own_launch(opencl, x_shape, c_out, stride, bias, kernel):
    model, feeds = _downsample_block(x_shape, c_out, stride, bias=bias)
    feeds["x"][0, 1, 2, :] = np.nan  # a non-finite value read by both Convs
    k_on, k_off = _check(model, feeds, "conv_lanes_downsample")
    assert kernel in k_on and len(k_on) == len(k_off) - 1, (k_on, k_off)
    assert not any("_ds" in k for k in k_off), k_off


def test_conv_lanes_downsample_leaves_a_shared_output_its_launch(opencl):
    # the 1x1's output is also a model output: it must be written, so it keeps its launch
    model, feeds = _downsample_block((1, 8, 28, 28), 32, 2, shared=True)
    (want_y, want_d) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds)
    sess = onnxhal.InferenceSession(model.SerializeToString(), providers=["OpenCLExecutionProvider"])
    y, d = sess.run(None, feeds)
    np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(d, want_d, rtol=1e-4, atol=1e-4)
    kernels = [s.kernel_name for p in sess.eps["OpenCLExecutionProvider"].compiled_plans for s in p.steps
               if hasattr(s, "kernel_name")]
    assert not any("_ds" in k for k in kernels), kernels
