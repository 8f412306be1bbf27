"""The onnxhal command line: devices (tables and JSON), run, partition (SVG), demo, --version."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

import onnxhal
from onnxhal.cli import main
from tests.models import add_mul_model


def test_devices_json_matches_the_api(capsys):
    assert main(["devices", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == {"hardware_devices", "ep_devices", "opencl"}
    hw = data["hardware_devices"]
    assert hw[0]["type"] == "CPU"
    assert set(hw[0]) == {"type", "vendor", "vendor_id", "device_id", "metadata"}
    api_hw = onnxhal.get_hardware_devices()[0]
    assert (hw[0]["vendor"], hw[0]["vendor_id"], hw[0]["device_id"]) == (api_hw.vendor, api_hw.vendor_id, api_hw.device_id)
    ep = data["ep_devices"][0]
    assert {"ep_name", "ep_vendor", "ep_metadata", "ep_options", "device"} <= set(ep)
    assert ep["ep_name"] == "CPUExecutionProvider" and ep["device"]["type"] == "CPU"
    assert ep["ep_metadata"]["version"] == "0.1.0"


def test_devices_tables(capsys):
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "Hardware devices" in out and "EP devices" in out and "CPUExecutionProvider" in out


def test_devices_show_each_opencl_device_state_and_the_remedy(capsys):
    from onnxhal.devices.opencl import enumerate_opencl_devices

    assert main(["devices", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["opencl"]
    records = enumerate_opencl_devices()
    assert [d["index"] for d in report["devices"]] == [f"{r.platform_index}:{r.device_index}" for r in records]
    for d, r in zip(report["devices"], records):
        assert d["state"] == ("usable" if r.probe.usable else "failed probe") and d["reason"] == r.probe.reason
    assert report["usable"] == any(r.probe.usable for r in records)
    assert bool(report["remedy"]) == (not report["usable"])
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    for r in records:
        assert r.device_name in out and ("usable" if r.probe.usable else r.probe.reason[:30]) in out
    if not report["usable"]:
        assert "Optional: without one, the simulated devices run on the host backend" in out.replace("\n", " ")


def test_run_prints_partition_outputs_and_latency(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    np.savez(tmp_path / "in.npz", x=np.ones((2, 3), np.float32))
    assert main(["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--repeat", "3"]) == 0
    out = capsys.readouterr().out
    assert "CPUExecutionProvider" in out and "latency over 3 runs" in out
    assert "5" in out  # ((1 + 1) * 2) + 1 = 5 everywhere: min = max = mean = 5


def test_partition_svg(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    svg = tmp_path / "p.svg"
    assert main(["partition", str(path), "--policy", "prefer_npu", "--svg", str(svg)]) == 0
    text = svg.read_text()
    assert text.startswith("<svg") and text.count("<rect") >= 3 and "CPUExecutionProvider" in text


def test_errors_are_reported_not_raised(tmp_path, capsys):
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "NoSuchFile" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["run", "x.onnx", "--policy", "fastest"])


def test_demo_and_version_as_a_user_runs_them():
    demo = subprocess.run([sys.executable, "-m", "onnxhal", "demo"], capture_output=True, text=True, timeout=120)
    assert demo.returncode == 0, demo.stderr
    assert "PREFER_NPU selected providers" in demo.stdout and "OK" in demo.stdout
    version = subprocess.run([sys.executable, "-m", "onnxhal", "--version"], capture_output=True, text=True)
    assert version.stdout.strip() == f"onnxhal {onnxhal.__version__}"


def _embedding_model(tmp_path) -> str:
    """BERT's inputs in small: token ids (through a Cast) into a 50-row table, token-type ids into a
    2-row table, a mask that indexes nothing; every dimension symbolic."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    words = numpy_helper.from_array(rng.standard_normal((50, 4)).astype(np.float32), "word_embeddings")
    types = numpy_helper.from_array(rng.standard_normal((2, 4)).astype(np.float32), "token_type_embeddings")
    nodes = [helper.make_node("Cast", ["input_ids"], ["ids32"], to=TensorProto.INT32),
             helper.make_node("Gather", ["word_embeddings", "ids32"], ["w"]),
             helper.make_node("Gather", ["token_type_embeddings", "token_type_ids"], ["t"]),
             helper.make_node("Add", ["w", "t"], ["e"]),
             helper.make_node("Cast", ["attention_mask"], ["m"], to=TensorProto.FLOAT),
             helper.make_node("Unsqueeze", ["m", "axis"], ["m3"]),
             helper.make_node("Mul", ["e", "m3"], ["y"])]
    ids = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
           for n in ("input_ids", "token_type_ids", "attention_mask")]
    graph = helper.make_graph(nodes, "embed", ids,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 4])],
                              [words, types, numpy_helper.from_array(np.array([2], np.int64), "axis")])
    path = tmp_path / "embed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return str(path)


def test_random_inputs_respect_tables_and_dims_and_are_printed(tmp_path, capsys):
    """Token-type ids were drawn from [0, 4) for a 2-row table (the run failed), every symbolic
    dimension became 1, and nothing said what was fed."""
    import onnxruntime

    path = _embedding_model(tmp_path)
    assert main(["run", path, "--repeat", "0", "--dim", "batch=3", "--dim", "sequence=7"]) == 0
    out = capsys.readouterr().out
    assert "Inputs (random, seed 0)" in out and "[3, 7]" in out and "[3, 7, 4]" in out
    assert "indexes 'token_type_embeddings' (2 rows)" in out and "indexes 'word_embeddings' (50 rows)" in out
    assert "set to 1" not in out
    assert main(["run", path, "--repeat", "0"]) == 0
    assert "symbolic dimension(s) set to 1: batch, sequence (choose sizes with --dim NAME=SIZE)" in \
        capsys.readouterr().out.replace("\n", " ")
    # The feeds stay in range, and onnxruntime takes them and agrees.
    from onnxhal.random_feeds import index_tables, random_feeds

    model = onnx.load(path)
    assert {k: v.rows for k, v in index_tables(model).items()} == {"input_ids": 50, "token_type_ids": 2}
    sess = onnxhal.InferenceSession(path)
    feeds, rows, defaulted = random_feeds(sess.get_inputs(), model, {"batch": 16, "sequence": 32})
    assert feeds["token_type_ids"].max() == 1 and feeds["input_ids"].max() >= 40 and feeds["input_ids"].max() < 50
    assert defaulted == [] and [r.shape for r in rows] == [[16, 32]] * 3
    # every row says where its range came from, an input no table indexes too
    assert all(r.why for r in rows), rows
    ort = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], ort, rtol=1e-6, atol=1e-6)
    # A size for a dimension the model does not have is a user's mistake, named with the ones it has.
    assert main(["run", path, "--dim", "seq=7"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("onnxhal:")]
    assert "--dim seq" in line and "batch, sequence" in line


def test_run_summarises_a_sequence_of_maps(capsys):
    import os

    path = os.path.join(os.path.dirname(__file__), "real_models", "sk_logreg_zipmap.onnx")
    assert main(["run", path, "--repeat", "0"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if "output_probability" in x)
    assert "seq(map)" in row and "[1]" in row  # was "list []"


def test_random_inputs_are_not_invented_for_strings_or_maps(tmp_path, capsys):
    """A string input got float32 noise (and a wrong-type error from the session)."""
    import os

    corpus = os.path.join(os.path.dirname(__file__), "real_models")
    assert main(["run", os.path.join(corpus, "sk_onehot.onnx"), "--repeat", "0"]) == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("onnxhal:")]
    assert "input 'X' is tensor(string): random inputs are drawn for numeric and bool tensors only" in line
    assert "--inputs FILE.npz" in line
    np.savez(tmp_path / "in.npz", X=np.array([["a", "b"]]))
    assert main(["run", os.path.join(corpus, "sk_onehot.onnx"), "--inputs", str(tmp_path / "in.npz"),
                 "--repeat", "0"]) == 0
    assert main(["run", os.path.join(corpus, "sk_dictvec.onnx"), "--repeat", "0"]) == 2
    assert "is map(string,tensor(float))" in capsys.readouterr().err


def test_run_says_where_every_input_range_came_from_and_reads_cpu_partitions(tmp_path, capsys):
    """A float input's "range from" cell was empty; the CPU EP's "5 partitions" for 5 nodes read as a split."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["b", "n"], ["s"]), helper.make_node("Softmax", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
                                       helper.make_tensor_value_info("n", TensorProto.INT64, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    g.node[2].input[1] = "nf"
    g.node.insert(2, helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT))
    path = str(tmp_path / "m.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["run", path, "--repeat", "0", "--json"]) == 0
    import json

    report = json.loads(capsys.readouterr().out)
    why = {r["name"]: r["range_from"] for r in report["inputs"]["inputs"]}
    assert why["x"].startswith("standard normal") and why["n"].startswith("integers in [0,"), why
    assert main(["run", path, "--repeat", "0"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if "CPUExecutionProvider" in x and "×" in x)
    # 5 nodes, or 2 where the elementwise chain pass fuses Relu, Neg, Cast and Add into one (the
    # Softmax stays out of a chain, so the CPU EP always has more than one node to say this of)
    assert "2 (one node each)" in row or "5 (one node each)" in row, row
