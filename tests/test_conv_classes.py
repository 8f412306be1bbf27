"""benchmarks/conv_classes.py: the class a trace's node gets from its recorded shapes (both
profilers' forms: onnxhal's FusedConv and onnxruntime's NCHWc Conv), and the per-node medians and
per-class sums it reads from a Chrome trace. The profiling itself is a benchmark, not a test."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "conv_classes.py"


@pytest.fixture(scope="module")
def conv_classes():
    spec = importlib.util.spec_from_file_location("onnxhal_conv_classes", _BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("op, shapes, want", [
    ("FusedConv", [[2, 64, 16, 16], [64, 1, 3, 3], [64]], "conv depthwise"),
    ("Conv", [[1, 64, 8, 8], [64, 8, 3, 3]], "conv grouped"),
    ("Conv", [[1, 32, 8, 8], [64, 32, 1, 1]], "conv 1x1 dense"),
    ("Conv", [[1, 32, 8, 8], [64, 32, 3, 3], [64]], "conv 3x3 dense"),
    ("Conv", [[1, 32, 8, 8], [64, 32, 1, 3]], "conv kxl dense"),
    ("Conv", [[2, 64, 4, 8, 8], [64, 64, 3, 3, 3]], "conv 3-D"),
    ("FusedConv", [[2, 16, 100], [16, 16, 3]], "conv 1-D"),
    ("ConvTranspose", [[1, 8, 4, 4], [8, 4, 2, 2]], "conv transposed"),
    ("MaxPool", [[1, 8, 4, 4]], "MaxPool"),
    ("Conv", [[1, 8, 4, 4]], "Conv"),  # no weight shape recorded: its op type
])
def test_conv_class(conv_classes, op, shapes, want):
    assert conv_classes.conv_class(op, shapes) == want


def _event(node: str, op: str, dur_us: float, ins: list, outs: list) -> dict:
    return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur_us,
            "args": {"op_name": op, "input_type_shape": [{"float": s} for s in ins],
                     "output_type_shape": [{"float": s} for s in outs]}}


def test_node_times_and_classes(conv_classes, tmp_path):
    x, w, y = [1, 32, 16, 16], [64, 32, 3, 3], [1, 64, 8, 8]
    events = [_event("c", "Conv", d, [x, w], [y]) for d in (100.0, 300.0, 200.0)]
    events += [_event("r", "Relu", d, [y], [y]) for d in (10.0, 30.0)]
    events.append({"cat": "Session", "name": "model_run", "dur": 5000.0})  # not a node: left out
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(events))
    nodes = conv_classes.node_times(str(path))
    assert nodes == {"c": (0.2, "conv 3x3 dense strided"), "r": (0.02, "Relu")}
    sums = conv_classes.per_class(nodes)
    assert sums["conv 3x3 dense strided"] == [0.2, 1] and sums["Relu"] == [0.02, 1]
