"""``onnxhal fix-shapes``: a real export's symbolic dims fixed so a static-shape NPU profile takes it,
and the fixed model still runs the same in onnxruntime."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import onnxhal
from onnxhal.cli import main
from onnxhal.cli_fix_shapes import symbolic_dims
from tests.conftest import simulated_or_skip

BERT = os.path.join(os.path.dirname(__file__), "real_models", "bert_ts.onnx")
FEEDS = {"input_ids": (np.arange(16, dtype=np.int64).reshape(1, 16) * 7) % 128, "attention_mask": np.ones((1, 16), np.int64)}


def test_fixed_bert_is_all_static_runs_the_same_and_the_static_npu_takes_it(tmp_path, capsys):
    out = tmp_path / "bert_fixed.onnx"
    assert main(["fix-shapes", BERT, "--dim", "batch=1", "--dim", "sequence=16", "-o", str(out)]) == 0
    assert "every value of the main graph has a static shape" in capsys.readouterr().out
    fixed = onnx.load(out)
    assert symbolic_dims(fixed) == {} and symbolic_dims(onnx.load(BERT))
    ort = pytest.importorskip("onnxruntime")
    fixed.ir_version = min(fixed.ir_version, 10)
    want = ort.InferenceSession(BERT, providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    got = ort.InferenceSession(fixed.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, FEEDS)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with simulated_or_skip("generic-npu") as sims:
        taken = []
        for path in (BERT, str(out)):
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([sims["VirtualNpuExecutionProvider"]])
            sess = onnxhal.InferenceSession(path, so)
            taken.append(sess.partition_summary.get("VirtualNpuExecutionProvider", 0))
            np.testing.assert_allclose(sess.run(None, FEEDS)[0], want, rtol=2e-2, atol=2e-2)
        assert taken[0] == 0 and taken[1] >= 40, taken  # static shapes only: nothing before, most after


def test_mistakes_are_one_line_errors(tmp_path, capsys):
    out = str(tmp_path / "x.onnx")
    assert main(["fix-shapes", BERT, "--dim", "bat=1", "-o", out]) == 2
    err = capsys.readouterr().err
    assert "no input dimension named bat" in err and "['batch', 'sequence']" in err
    assert main(["fix-shapes", BERT, "--dim", "batch=0", "-o", out]) == 2
    assert "NAME=SIZE with a size of at least 1" in capsys.readouterr().err
    assert main(["fix-shapes", BERT, "--dim", "batch=1"]) == 2
    assert "give -o OUT" in capsys.readouterr().err
    assert main(["fix-shapes", str(tmp_path / "missing.onnx"), "--dim", "batch=1", "-o", out]) == 2
    assert "NoSuchFile" in capsys.readouterr().err
    assert main(["fix-shapes", BERT, "--list"]) == 0
    listed = capsys.readouterr().out
    assert "input input_ids: ['batch', 'sequence']" in listed
    assert "output " in listed and "'batch'" in listed.split("output ", 1)[1]
