"""The loader's passes share one Python message per node (``node_checks.flat_model_walks``): a
pass reading ``node.attribute`` of a node without attributes on a message of its own made
protobuf (upb) free an arena block per node per pass, and upb calls ``malloc_trim(0)`` at every
10,000th free (docs/cpu-ep.md, "Session creation")."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxhal

NODES = 300


def _free_counter() -> ctypes.c_int | None:
    """upb's count of frees toward its next trim, read from its shared object's symbol table (a
    measuring aid: no code of onnxhal reads it); None where it cannot be found."""
    try:
        from google._upb import _message
    except ImportError:
        return None
    path = _message.__file__
    if shutil.which("nm") is None:
        return None
    lines = subprocess.run(["nm", path], capture_output=True, text=True).stdout.splitlines()
    offsets = [int(line.split()[0], 16) for line in lines if line.endswith("upb_trim_allocfunc.count")]
    with open("/proc/self/maps") as maps:
        bases = [int(line.split("-")[0], 16) for line in maps if line.rstrip().endswith(path)]
    if len(offsets) != 1 or not bases:
        return None
    return ctypes.c_int.from_address(min(bases) + offsets[0])


def _chain() -> bytes:
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(NODES)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(f"v{NODES}", TensorProto.FLOAT, [4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_a_session_frees_about_one_block_per_attributeless_node() -> None:
    counter = _free_counter()
    if counter is None:
        pytest.skip("protobuf's upb free counter is not readable here (no nm, no symbol table or not upb)")
    model = _chain()
    x = np.arange(4, dtype=np.float32) - 2

    def session_frees() -> int:
        before = counter.value
        out = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"v0": x})[0]
        np.testing.assert_array_equal(out, np.maximum(x, 0))
        return (counter.value - before) % 10_000  # the counter restarts at each trim

    session_frees()
    frees = min(session_frees() for _ in range(2))
    # one per node for the load, a few dozen besides; the loader's four walks made 4 x NODES
    assert frees < 2 * NODES, f"{frees} protobuf frees for a session of {NODES} attribute-less nodes"
