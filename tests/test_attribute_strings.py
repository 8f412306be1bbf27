"""A strings attribute is decoded in one call where no value holds a NUL
(``hal.graph.decode_strings``): the same strings as decoding each value, invalid UTF-8 kept as lone
surrogates, for random values of valid, truncated and invalid sequences and NULs."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import onnxhal
from onnxhal.hal.graph import Node, decode_strings

PIECES = [b"\x00", b"\xe2", b"\x82", b"\xac", b"a", b"\xff", b"\xc3", b"\xa9", "\U0001f600".encode(), b"LEAF",
          b"\xed\xa0\x80", b""]


def test_decode_strings_matches_each_value_decoded():
    rng = np.random.default_rng(0)
    for trial in range(5000):
        values = [b"".join(PIECES[int(i)] for i in rng.integers(0, len(PIECES), int(rng.integers(0, 6))))
                  for _ in range(int(rng.integers(0, 7)))]
        want = [v.decode("utf-8", errors="surrogateescape") for v in values]
        assert decode_strings(values) == want, (trial, values)


def test_a_strings_attribute_with_a_nul_and_a_label_encoder_against_onnxruntime():
    keys = ["a\0b", "ab", "", "é"]
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_strings=keys,
                            values_int64s=[1, 2, 3, 4], default_int64=-1)
    assert Node.from_proto(node).attr("keys_strings") == keys
    model = helper.make_model(helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.STRING,
                                                                                             [None])],
                                                [helper.make_tensor_value_info("y", TensorProto.INT64, [None])]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 2)])
    model.ir_version = 10
    x = np.array(["ab", "é", "zz", ""], dtype=object)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = onnxhal.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def test_attr_array_reads_numbers_from_the_proto_as_the_parsed_list_holds_them():
    """``Node.attr_array``: ints and floats from the attribute's proto, equal to the parsed list in
    value and dtype (int64 extremes, float32 values); the list's values where the proto is gone or
    holds another count (a node edited by hand); None for an absent or scalar attribute."""
    ints, floats = [0, -1, 2**63 - 1, -2**63, 7], [0.1, -2.5, 3e38, float("inf")]
    node = Node.from_proto(helper.make_node("X", ["a"], ["b"], ints=ints, floats=floats, one=3))
    got_i, got_f = node.attr_array("ints", np.int64), node.attr_array("floats", np.float32)
    assert got_i.dtype == np.int64 and got_i.tolist() == ints
    assert got_f.dtype == np.float32 and np.array_equal(got_f, np.asarray(node.attr("floats"), np.float32))
    assert node.attr_array("one", np.int64) is None and node.attr_array("absent", np.int64) is None
    node.attributes["ints"] = [4, 5]  # the proto still holds five: the list is read
    assert node.attr_array("ints", np.int64).tolist() == [4, 5]
    del node.attribute_protos["floats"]
    node.attributes["floats"] = [1.0] * 4
    assert node.attr_array("floats", np.float32).tolist() == [1.0] * 4
