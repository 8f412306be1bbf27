"""The rule language of device profiles: one small model per rule kind, where the rule alone decides
whether the simulated device claims the node; the decline names the rule and its source. Each
claimed case is also checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxhal
from onnxhal.simulators.profiles import ProfileError, load_profile
from tests.conftest import simulated_or_skip

BASE = """
[device]
name = "rules-npu"
type = "npu"
vendor = "onnxhal"
vendor_id = 0x4F48
device_id = 0x4EF0

[memory]
capacity_mib = 256

[compute]
ops = ["Conv", "Add", "Mul", "Relu", "Gather", "Resize", "Reshape", "MatMul", "DequantizeLinear", "QuantizeLinear"]
dtypes = {dtypes}
float32_as = "{f32}"
{compute}

[performance]
peak_tops = {peak}
memory_bandwidth_gbps = 50.0
host_link_bandwidth_gbps = 50.0

[power]
idle_w = 0.1
active_w = 1.0

[numerics]
rtol = 1e-2
atol = 1e-2

[sources.doc]
url = "https://example.org/ep-operators.md"
version = "commit 0123abcd"
read = "2026-12-06"
{extra}
"""


def profile_file(tmp_path, extra: str = "", compute: str = "", f32: str = "float32",
                 dtypes: str = '["float32", "float16", "int8", "int32"]',
                 peak: str = "{ float32 = 1.0, float16 = 2.0, int8 = 4.0, int32 = 1.0 }") -> str:
    path = tmp_path / "rules-npu.toml"
    path.write_text(BASE.format(extra=extra, compute=compute, f32=f32, dtypes=dtypes, peak=peak))
    return str(path)


def conv_model(group: int = 1, dynamic_w: bool = False, batch: int | str = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 4 // group, 3, 3)).astype(np.float32), "w")
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 4, 8, 8])]
    inits = [w]
    if dynamic_w:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [4, 4 // group, 3, 3]))
        inits = []
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", group=group, pads=[1, 1, 1, 1])
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return _model(g)


def _model(g: onnx.GraphProto) -> onnx.ModelProto:
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def add_model(shape_b: list[int]) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"], name="add")], "g",
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3, 4]),
                           helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return _model(g)


def gather_model(axis: int, indices_dtype: int = TensorProto.INT64) -> onnx.ModelProto:
    idx = helper.make_tensor("i", indices_dtype, [2], [0, 2])
    g = helper.make_graph([helper.make_node("Gather", ["x", "i"], ["y"], name="gather", axis=axis)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [idx])
    return _model(g)


def feeds_for(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    out = {}
    inits = {i.name for i in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        shape = [d.dim_value or 1 for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def run(profile_path: str, model: onnx.ModelProto, options: dict | None = None):
    """(claimed node count, decline reasons, outputs) of ``model`` on the profile's device, with
    onnxruntime's outputs checked against them."""
    feeds = feeds_for(model)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    with simulated_or_skip(profile_path, by="profile") as sims:
        device = sims["rules-npu"]
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], options)
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        got = sess.run(None, feeds)
        ep = sess.eps[device.ep_name]
        claimed = sess.partition_summary.get(device.ep_name, 0)
        declined = dict(ep.declined)
        profile = ep.profile
    for g, w in zip(got, want):
        scale = float(np.max(np.abs(w)))
        assert float(np.max(np.abs(g - w))) <= profile.atol * max(1.0, scale) + profile.rtol * scale
    return claimed, declined, profile


def declined_for(declined: dict, rule_words: str) -> str:
    hits = [r for r in declined.values() if rule_words in r]
    assert hits, declined
    assert "source doc: https://example.org/ep-operators.md @ commit 0123abcd, read 2026-12-06" in hits[0], hits[0]
    return hits[0]


def test_attribute_rule_decides_claim(tmp_path):
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nattributes = { group = { max = 1 } }\n')
    claimed, _, _ = run(path, conv_model(group=1))
    assert claimed == 1
    claimed, declined, _ = run(path, conv_model(group=2))
    assert claimed == 0
    reason = declined_for(declined, "rule for Conv: attribute group=2")
    assert "group <= 1" in reason


def test_attribute_rule_uses_the_schema_default(tmp_path):
    """A Gather without an axis attribute has ONNX's default axis 0."""
    model = gather_model(0)
    del model.graph.node[0].attribute[:]
    assert run(profile_file(tmp_path, '[op.Gather]\nsource = "doc"\nattributes = { axis = [0] }\n'), model)[0] == 1
    claimed, declined, _ = run(profile_file(tmp_path, '[op.Gather]\nsource = "doc"\nattributes = { axis = [1] }\n'),
                               model)
    assert claimed == 0
    declined_for(declined, "attribute axis=0")


def test_gather_axis_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Gather]\nsource = "doc"\nattributes = { axis = [0] }\n')
    assert run(path, gather_model(0))[0] == 1
    claimed, declined, _ = run(path, gather_model(1))
    assert claimed == 0
    declined_for(declined, "attribute axis=1")


def test_constant_input_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nconstant_inputs = [1]\n')
    assert run(path, conv_model())[0] == 1
    claimed, declined, _ = run(path, conv_model(dynamic_w=True))
    assert claimed == 0
    declined_for(declined, "input 1 ('w') must be a constant initializer")


def test_input_dtype_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Gather]\nsource = "doc"\ninput_dtypes = ["*", ["int32"]]\n')
    assert run(path, gather_model(0, TensorProto.INT32))[0] == 1
    claimed, declined, _ = run(path, gather_model(0, TensorProto.INT64))
    assert claimed == 0
    declined_for(declined, "input 1 ('i') is int64, allowed: int32")


def test_output_dtype_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\noutput_dtypes = [["float16"]]\n')
    claimed, declined, _ = run(path, conv_model())
    assert claimed == 0
    declined_for(declined, "output 0 ('y') is float32, allowed: float16")
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\noutput_dtypes = [["float16", "float32"]]\n')
    assert run(path, conv_model())[0] == 1


def test_rank_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Add]\nsource = "doc"\nmax_rank = 2\n')
    claimed, declined, _ = run(path, add_model([2, 3, 4]))
    assert claimed == 0
    declined_for(declined, "input 0 ('a') has rank 3, allowed 0..2")
    path = profile_file(tmp_path, '[op.Add]\nsource = "doc"\nmin_rank = 3\nmax_rank = 3\n')
    assert run(path, add_model([2, 3, 4]))[0] == 1


def test_broadcast_rule(tmp_path):
    path = profile_file(tmp_path, '[op.Add]\nsource = "doc"\nbroadcast = "none"\n')
    assert run(path, add_model([2, 3, 4]))[0] == 1
    claimed, declined, _ = run(path, add_model([1, 3, 1]))
    assert claimed == 0
    declined_for(declined, "this op does not broadcast")
    path = profile_file(tmp_path, '[op.Add]\nsource = "doc"\nbroadcast = "same_rank"\n')
    assert run(path, add_model([1, 3, 1]))[0] == 1
    claimed, declined, _ = run(path, add_model([4]))
    assert claimed == 0
    declined_for(declined, "broadcasts only at equal rank")


def test_static_shape_rule_per_op(tmp_path):
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nstatic_shapes = true\n')
    assert run(path, conv_model())[0] == 1
    claimed, declined, _ = run(path, conv_model(batch="n"))
    assert claimed == 0
    declined_for(declined, "has a dynamic shape; this op needs static shapes")
    # The reverse: a static-shape device whose rule for one op allows dynamic shapes.
    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nstatic_shapes = false\n',
                        compute="static_shapes_only = true")
    assert run(path, conv_model(batch="n"))[0] == 1


def test_partition_limit(tmp_path):
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"relu{i}") for i in range(5)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("v5", TensorProto.FLOAT, None)])
    model = _model(g)
    path = profile_file(tmp_path)
    feeds = feeds_for(model)
    with simulated_or_skip(path, by="profile") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["rules-npu"]])
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        assert len(sess.eps[sims["rules-npu"].ep_name].partition_costs) == 1
    path = profile_file(tmp_path, '[partitions]\nmax_nodes = 2\nsource = "doc"\n')
    with simulated_or_skip(path, by="profile") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["rules-npu"]])
        sess = onnxhal.InferenceSession(model.SerializeToString(), so)
        ep = sess.eps[sims["rules-npu"].ep_name]
        assert sess.partition_summary[sims["rules-npu"].ep_name] == 5
        assert len(ep.partition_costs) == 3  # 2 + 2 + 1
        np.testing.assert_allclose(sess.run(None, feeds)[0], np.maximum(feeds["v0"], 0))


def test_float32_refused_and_opt_in_fp16(tmp_path):
    option = 'float32_option = { name = "enable_fp16", values = { "1" = "float16", "0" = "none" } }'
    path = profile_file(tmp_path, compute=option + '\nsource = "doc"', f32="none", dtypes='["float16", "int8"]',
                        peak="{ float16 = 2.0, int8 = 4.0 }")
    claimed, declined, _ = run(path, conv_model())
    assert claimed == 0
    reason = declined_for(declined, "rules-npu computes float only inside int8 QDQ groups")
    assert "Conv computes on 'x' in float32" in reason
    claimed, _, profile = run(path, conv_model(), {"enable_fp16": "1"})
    assert claimed == 1 and profile.float32_as == "float16"
    with pytest.raises(ProfileError, match="enable_fp16='2' is not one of 0, 1"):
        run(path, conv_model(), {"enable_fp16": "2"})


def qdq_conv_model() -> onnx.ModelProto:
    """DequantizeLinear -> Conv -> QuantizeLinear -> DequantizeLinear, int8 weights: a QDQ group."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array(rng.integers(-50, 50, (4, 4, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0.02, np.float32), "ws"),
             numpy_helper.from_array(np.array(0, np.int8), "wz"),
             numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], name="dqw"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"], name="qc"),
             helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["y"], name="dqy")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return _model(g)


def test_int8_qdq_only_device_takes_qdq_groups_and_refuses_float(tmp_path):
    path = profile_file(tmp_path, f32="none", dtypes='["int8", "int32"]', peak="{ int8 = 4.0, int32 = 1.0 }")
    claimed, declined, _ = run(path, qdq_conv_model())
    assert claimed == 1, declined  # the Conv between DequantizeLinear and QuantizeLinear
    claimed, declined, _ = run(path, conv_model())
    assert claimed == 0
    assert any("computes float only inside int8 QDQ groups" in r for r in declined.values()), declined


def test_rules_name_their_sources_and_are_checked(tmp_path):
    p = load_profile(profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nattributes = { group = [1] }\n'))
    assert p.op_rules["Conv"][0].source.url == "https://example.org/ep-operators.md"
    bad = [('[op.Conv]\nattributes = { group = [1] }\n', "op.Conv.source", "every rule names its"),
           ('[op.Conv]\nsource = "nowhere"\n', "op.Conv.source", "is not a [sources.ID]"),
           ('[op.Conv]\nsource = "doc"\nattributes = { group = { maximum = 1 } }\n', "op.Conv.attributes.group.maximum",
            "unknown key"),
           ('[op.Conv]\nsource = "doc"\ninput_dtypes = [["float33"]]\n', "op.Conv.input_dtypes[0]", "unknown dtype"),
           ('[op.Conv]\nsource = "doc"\nbroadcast = "some"\n', "op.Conv.broadcast", "is not one of"),
           ('[op.NotAnOp]\nsource = "doc"\n', "op.NotAnOp", "not an ONNX op type"),
           ('[sources.x]\nurl = "https://a"\n', "sources.x", "needs url and read"),
           ('[partitions]\nmax_nodes = -1\n', "partitions.max_nodes", ">= 0")]
    for extra, key, words in bad:
        with pytest.raises(ProfileError) as exc:
            load_profile(profile_file(tmp_path, extra))
        assert exc.value.key == key and words in str(exc.value), (extra, str(exc.value))


def test_profiles_show_prints_rules_with_sources(tmp_path, capsys):
    from onnxhal.cli import main

    path = profile_file(tmp_path, '[op.Conv]\nsource = "doc"\nattributes = { group = [1] }\nconstant_inputs = [1]\n',
                        compute='source = "doc"')
    assert main(["profiles", "show", path]) == 0
    out = capsys.readouterr().out
    assert "Conv  [doc]" in out and "- attribute group in [1]" in out
    assert "- inputs [1] must be constant initializers" in out
    assert "compute: dtypes float16, float32, int32, int8; float32 computed in fp32  [doc]" in out
    assert "doc: https://example.org/ep-operators.md @ commit 0123abcd, read 2026-12-06" in out
    assert main(["profiles", "list"]) == 0
    assert "generic-npu" in capsys.readouterr().out


REAL_DEVICES = ["qualcomm-htp", "intel-npu", "intel-gpu", "apple-ane", "webnn-gpu"]


def test_real_device_profiles_cite_a_source_for_every_rule_and_table():
    from onnxhal.simulators.profiles import parse_profile_list, shipped_profiles

    assert set(REAL_DEVICES) <= set(shipped_profiles())
    parse_profile_list(",".join(shipped_profiles()))  # names and (vendor_id, device_id) pairs all distinct
    for name in REAL_DEVICES:
        p = load_profile(name)
        assert set(p.table_sources) >= {"device", "memory", "compute", "performance", "power", "numerics"}, name
        read = [s for s in p.sources.values() if not s.estimate]
        assert read and all(s.read == "2026-12-06" and s.url.startswith("https://github.com/") for s in read), name
        assert all(not r.source.estimate for rules in p.op_rules.values() for r in rules), name


def test_qualcomm_htp_conv_rules_and_fp16_switch():
    """QNN's Conv builder refuses auto_pad VALID; enable_htp_fp16_precision=0 computes in fp32."""
    model = conv_model()
    conv = model.graph.node[0]
    del conv.attribute[:]
    conv.attribute.extend([helper.make_attribute("auto_pad", "VALID")])
    feeds = feeds_for(model)
    with simulated_or_skip("qualcomm-htp", by="profile") as sims:
        device = sims["qualcomm-htp"]
        for options, claimed in (({}, 0), ({"enable_htp_fp16_precision": "0"}, 0)):
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([device], options)
            sess = onnxhal.InferenceSession(model.SerializeToString(), so)
            ep = sess.eps[device.ep_name]
            assert sess.partition_summary.get(device.ep_name, 0) == claimed
            (reason,) = ep.declined.values()
            assert "rule for Conv: attribute auto_pad='VALID'" in reason and "conv_op_builder.cc" in reason
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {"enable_htp_fp16_precision": "0"})
        sess = onnxhal.InferenceSession(conv_model().SerializeToString(), so)
        assert sess.eps[device.ep_name].profile.float32_as == "float32"
        got = sess.run(None, feeds)[0]
        want = ort.InferenceSession(conv_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # fp32: no fp16 rounding
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device])
        sess = onnxhal.InferenceSession(conv_model().SerializeToString(), so)
        half = sess.run(None, feeds)[0]
        err, scale = float(np.max(np.abs(half - want))), float(np.max(np.abs(want)))
        assert 1e-4 * scale < err <= 2e-2 * scale  # the default, fp16: fp16 rounding, within the profile's rtol
        from onnxhal.simulators.fp16 import round_bf16

        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([device], {"htp_bf16_enable": "1"})
        sess = onnxhal.InferenceSession(conv_model().SerializeToString(), so)
        assert sess.eps[device.ep_name].profile.float32_as == "bfloat16"
        bf16 = sess.run(None, feeds)[0]
        np.testing.assert_array_equal(round_bf16(bf16), bf16)
        assert err < float(np.max(np.abs(bf16 - want))) <= 2e-2 * scale  # bf16 has 3 bits fewer than fp16


def test_decline_summary_groups_cited_reasons():
    from onnxhal.decline_summary import decline_kinds

    reasons = ["qualcomm-htp runs static shapes only; 'x' has shape ('batch', 3) (source qnn-doc: https://a @ c, read d)",
               "qualcomm-htp has no Shape (source qnn-doc: https://a @ c, read d)",
               "qualcomm-htp rule for Conv: attribute auto_pad='VALID', allowed: auto_pad in ['NOTSET'] "
               "(source qnn-conv: https://b @ c, read d)"]
    kinds = {k.kind: k for k in decline_kinds(reasons)}
    assert kinds["dynamic shapes"].dims == ["batch"]
    assert kinds["operators qualcomm-htp lacks"].parts == {"Shape": 1}
    assert kinds["qualcomm-htp rule for Conv: attribute auto_pad (source qnn-conv)"].nodes == 1


def test_partition_minimum(tmp_path):
    """Relu -> Erf -> Relu -> Relu, Erf not on the device: a one-node and a two-node partition,
    both under a three-node minimum; the whole graph would be taken at any size."""
    names = ["Relu", "Erf", "Relu", "Relu"]
    nodes = [helper.make_node(op, [f"v{i}"], [f"v{i + 1}"], name=f"n{i}") for i, op in enumerate(names)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                          [helper.make_tensor_value_info("v4", TensorProto.FLOAT, None)])
    model = _model(g)
    for extra, claimed in (("", 3), ('[partitions]\nmin_nodes = 3\nsource = "doc"\n', 0),
                           ('[partitions]\nmin_nodes = 2\nsource = "doc"\n', 2)):
        path = profile_file(tmp_path, extra)
        with simulated_or_skip(path, by="profile") as sims:
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([sims["rules-npu"]])
            sess = onnxhal.InferenceSession(model.SerializeToString(), so)
            ep = sess.eps[sims["rules-npu"].ep_name]
            assert sess.partition_summary.get(sims["rules-npu"].ep_name, 0) == claimed, (extra, ep.declined)
            if extra:
                assert any("takes no partition of fewer than" in r and "source doc: https://example.org" in r
                           for r in ep.declined.values()), ep.declined
    whole = _model(helper.make_graph(nodes[:1], "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                                     [helper.make_tensor_value_info("v1", TensorProto.FLOAT, None)]))
    with simulated_or_skip(profile_file(tmp_path, '[partitions]\nmin_nodes = 3\nsource = "doc"\n'), by="profile") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["rules-npu"]])
        sess = onnxhal.InferenceSession(whole.SerializeToString(), so)
        assert sess.partition_summary.get(sims["rules-npu"].ep_name, 0) == 1


def test_bf16_compute_stores_float32_as_bf16():
    """float32_as = "bfloat16": the partition's inputs, weights and outputs are bf16 values, and the
    output is the onnxruntime convolution of the bf16-rounded input and weights, rounded to bf16."""
    from onnxhal.simulators.fp16 import round_bf16

    model = conv_model()
    feeds = feeds_for(model)
    ref_model = onnx.ModelProto()
    ref_model.CopyFrom(model)
    w = numpy_helper.to_array(model.graph.initializer[0])
    ref_model.graph.initializer[0].CopyFrom(numpy_helper.from_array(round_bf16(w), "w"))
    cpu = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = round_bf16(cpu.run(None, {"x": round_bf16(feeds["x"])})[0])
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        path = profile_file(Path(d), f32="bfloat16", dtypes='["float32", "bfloat16", "int32"]',
                            peak="{ float32 = 1.0, bfloat16 = 2.0, int32 = 1.0 }")
        assert load_profile(path).compute_dtype == "bfloat16"
        with simulated_or_skip(path, by="profile") as sims:
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([sims["rules-npu"]])
            sess = onnxhal.InferenceSession(model.SerializeToString(), so)
            assert sess.partition_summary[sims["rules-npu"].ep_name] == 1
            got = sess.run(None, feeds)[0]
    np.testing.assert_array_equal(round_bf16(got), got)  # bf16 values, not fp16 ones
    scale = float(np.max(np.abs(want)))
    assert float(np.max(np.abs(got - want))) <= 2**-8 * scale  # at most one bf16 step off (summation order)
    exact = cpu.run(None, {"x": feeds["x"]})[0]
    assert float(np.max(np.abs(got - exact))) > 1e-3 * scale  # bf16's 8 bits show against float32


def test_round_bf16_rounds_to_nearest_even():
    from onnxhal.simulators.fp16 import overflows, round_bf16

    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-9, -2.5, np.inf, 3.4e38, np.nan], np.float32)
    got = round_bf16(x)
    np.testing.assert_array_equal(got[:6], np.array([1.0, 1.0, 1 + 2**-6, 1.0, -2.5, np.inf], np.float32))
    assert np.isinf(got[6]) and np.isnan(got[7])  # 3.4e38 is past bf16's largest finite value
    assert overflows(x[6:7], "bfloat16") and not overflows(x[:5], "bfloat16")
