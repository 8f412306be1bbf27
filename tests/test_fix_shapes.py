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
from onnxhal.decline_summary import decline_lines
from onnxhal.random_feeds import symbolic_input_dims, unnamed_input_shapes
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


SKLEARN_MLP = os.path.join(os.path.dirname(__file__), "real_models", "skh_mlp.onnx")


def test_an_unnamed_batch_dim_is_fixed_by_the_inputs_whole_shape_and_the_remedy_says_how(tmp_path, capsys):
    # skl2onnx leaves the batch dimension without a name: no --dim can reach it, --shape can. The
    # profile is a static-only float32 one: an fp16 NPU declines the MLP's layers whatever their
    # shapes, as the label's ArgMax picks from them (simulators/fp16.py, picked_values)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    assert main(["fix-shapes", SKLEARN_MLP, "--list"]) == 0
    assert "input X: ['?', 8]" in capsys.readouterr().out
    with simulated_or_skip("webnn-gpu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["VirtualGpuExecutionProvider"]])
        sess = onnxhal.InferenceSession(SKLEARN_MLP, so)
        assert sess.partition_summary.get("VirtualGpuExecutionProvider", 0) == 0
        lines = decline_lines(sess.eps["VirtualGpuExecutionProvider"].declined.values(), "skh_mlp.onnx",
                              symbolic_input_dims(sess.get_inputs()), unnamed_input_shapes(sess.get_inputs()))
    assert any("fix-shapes skh_mlp.onnx --shape X=N,8 -o" in line for line in lines), lines
    out = tmp_path / "mlp_fixed.onnx"
    assert main(["fix-shapes", SKLEARN_MLP, "--shape", "X=4,8", "-o", str(out)]) == 0
    assert [d.dim_value for d in onnx.load(out).graph.input[0].type.tensor_type.shape.dim] == [4, 8]
    want = onnxhal.InferenceSession(SKLEARN_MLP, providers=["CPUExecutionProvider"]).run(None, {"X": x})
    with simulated_or_skip("webnn-gpu") as sims:
        so = onnxhal.SessionOptions()
        so.add_provider_for_devices([sims["VirtualGpuExecutionProvider"]])
        sess = onnxhal.InferenceSession(str(out), so)
        assert sess.partition_summary.get("VirtualGpuExecutionProvider", 0) == 4  # the three Gemms and Softmax
        got = sess.run(None, {"X": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=2e-2, atol=2e-2)


def test_shape_mistakes_are_one_line_errors(tmp_path, capsys):
    out = str(tmp_path / "x.onnx")
    assert main(["fix-shapes", SKLEARN_MLP, "--shape", "X=4,9", "-o", out]) == 2
    assert "does not fit input 'X', declared ['?', 8]" in capsys.readouterr().err
    assert main(["fix-shapes", SKLEARN_MLP, "--shape", "X=4", "-o", out]) == 2
    assert "give 2 sizes" in capsys.readouterr().err
    assert main(["fix-shapes", SKLEARN_MLP, "--shape", "Y=4,8", "-o", out]) == 2
    assert "no input named 'Y'" in capsys.readouterr().err
    assert main(["fix-shapes", SKLEARN_MLP, "--shape", "X=4,0", "-o", out]) == 2
    assert "INPUT=D0,D1" in capsys.readouterr().err


def test_the_dynamic_shapes_remedy_gives_unnamed_inputs_whole_shape():
    reasons = ["generic-npu runs static shapes only; 'h' has shape ('unk__2', 32)"]
    named = decline_lines(reasons, "m.onnx", ["batch"])
    assert "--dim batch=N" in named[0] and "unk__2" not in named[0]
    unnamed = decline_lines(reasons, "m.onnx", [], [("X", [None, 8])])
    assert "`onnxhal fix-shapes m.onnx --shape X=N,8 -o fixed.onnx`" in unnamed[0] and "unk__2" not in unnamed[0]
    both = decline_lines(reasons, "m.onnx", ["seq"], [("X", [None, "seq"])])
    assert "--dim seq=N --shape X=N,N" in both[0]
    assert "--dim unk__2=N" in decline_lines(reasons, "m.onnx")[0]  # nothing known of the inputs: the reasons' names
