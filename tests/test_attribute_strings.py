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
