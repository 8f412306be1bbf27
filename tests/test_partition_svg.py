"""The partition picture reads at a glance: constants folded, one box per partition, every transfer
labelled (their counts add up to the session's), a legend, a page-sized picture, a PNG beside it."""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

import onnx
import pytest

import onnxhal
from onnxhal.cli import main
from onnxhal.partition_svg import fold_constants, partition_svg, svg_to_png
from onnxhal.partition_view import session_view
from onnxhal.simulators.testing import simulated_devices

LIGHT_RESNET50 = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light",
                              "light_resnet50.onnx")
NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def resnet_view():
    """The onnx package's light ResNet-50 as a user passes it (weights are ConstantOfShape nodes)."""
    if not os.path.isfile(LIGHT_RESNET50):
        pytest.skip("this onnx package ships no light_resnet50.onnx")
    with simulated_devices("generic-npu"):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
        sess = onnxhal.InferenceSession(LIGHT_RESNET50, so)
        yield session_view(sess)


def _texts(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{NS}text")]


def test_constants_are_folded_into_their_readers(resnet_view):
    svg = partition_svg(resnet_view, "resnet50")
    folded, host = fold_constants(resnet_view)
    constant_ops = {n.op_type for n in resnet_view.nodes if id(n) in folded}
    assert "ConstantOfShape" in constant_ops and len(folded) >= 39
    assert not any("ConstantOfShape" in t for t in _texts(svg))  # no box, no line for them
    shown = sum(int(m) for t in _texts(svg) for m in re.findall(r"\+(\d+) const", t))
    assert shown == len(folded)


def test_one_box_per_partition_with_its_node_count(resnet_view):
    svg = partition_svg(resnet_view, "resnet50")
    folded, _ = fold_constants(resnet_view)
    expected = [p for p in resnet_view.partitions if any(id(n) not in folded for n in p.nodes)]
    heads = [t for t in _texts(svg) if re.fullmatch(r"\S+ · \d+ nodes?", t)]
    assert len(heads) == len(expected)
    assert sum(int(h.split("· ")[1].split()[0]) for h in heads) == len(resnet_view.nodes) - len(folded)


def test_every_transfer_is_labelled_and_they_add_up(resnet_view):
    svg = partition_svg(resnet_view, "resnet50")
    texts = _texts(svg)
    on_edges = sum(int(m) for t in texts for m in re.findall(r"^(\d+) · [\d.]+ [KMG]?i?B$", t))
    in_boxes = sum(int(m) for t in texts for m in re.findall(r"^(?:in from host|out to host|constants in): (\d+),", t))
    assert on_edges > 50 and on_edges + in_boxes == resnet_view.transfer_totals()[0]


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_legend_and_page_size(resnet_view):
    svg = partition_svg(resnet_view, "resnet50")
    root = ET.fromstring(svg)
    width, height = float(root.get("width")), float(root.get("height"))
    assert width <= 3000 and height <= 2200  # was 5,880 x 2,736, one box per node
    texts = _texts(svg)
    for ep, n in resnet_view.nodes_per_ep().items():
        assert any(t.startswith(f"{ep}: {n} nodes") for t in texts)
    assert any(t.startswith("transfer between memories") for t in texts)


def test_cli_writes_a_png_beside_the_svg_or_says_why_not(tmp_path, capsys):
    """A converter found on PATH may still write nothing (a stand-in, a broken install): the test
    asks it for a real file first, then holds the CLI to the same truth either way."""
    from tests.models import add_mul_model

    probe_svg, probe_png = tmp_path / "probe.svg", tmp_path / "probe.png"
    probe_svg.write_text('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>')
    why = svg_to_png(str(probe_svg), str(probe_png))
    converts = not why and probe_png.is_file() and probe_png.read_bytes()[:8] == PNG_MAGIC
    path = tmp_path / "m.onnx"
    onnx.save(add_mul_model(), path)
    assert main(["partition", str(path), "--svg", str(tmp_path / "p.svg")]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    if converts:
        assert (tmp_path / "p.png").read_bytes()[:8] == PNG_MAGIC
        assert f"and {tmp_path / 'p.png'}" in out
    else:  # no PNG, and the CLI says so with the converter's reason instead of claiming one
        assert not (tmp_path / "p.png").exists() and "(no PNG: " in out
        assert (why or "no SVG converter found")[:40] in out, (why, out)


def test_single_nodes_around_another_ep_make_two_partitions_not_a_cycle():
    """CPU Erf -> NPU Relu -> CPU Max(erf, relu): the CPU EP's two single nodes touch directly, but one
    partition of both would need the NPU's result in its middle. They are two partitions, in order."""
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Erf", ["x"], ["a"], name="erf"), helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Max", ["a", "b"], ["y"], name="max")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with simulated_devices("generic-npu"):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
        view = session_view(onnxhal.InferenceSession(model.SerializeToString(), so))
    assert [(p.ep_name, [n.op_type for n in p.nodes]) for p in view.partitions] == [
        ("CPUExecutionProvider", ["Erf"]), ("VirtualNpuExecutionProvider", ["Relu"]), ("CPUExecutionProvider", ["Max"])]
    assert all(t.src == "host" or t.dst == "host" or t.src < t.dst for t in view.transfers)
