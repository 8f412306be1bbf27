"""Models that crashed, hung or fooled onnxhal (issue 34), and a child-process runner for them.

Each builder returns a ModelProto at IR version 10, so that onnxruntime can be asked too. The ones
that crashed or hung the process are only ever loaded in a child (``load_in_child``), so that a
regression fails a test instead of killing or hanging the test run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.models import make, vi

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def layer_norm(axis: int, n_outputs: int = 3) -> onnx.ModelProto:
    outs = ["y", "mean", "inv_std"][:n_outputs]
    node = helper.make_node("LayerNormalization", ["x", "s", "b"], outs, name="ln", axis=axis)
    inits = [numpy_helper.from_array(np.ones(3, np.float32), "s"), numpy_helper.from_array(np.zeros(3, np.float32), "b")]
    return make([node], [vi("x", [2, 3])], [vi(o, None) for o in outs], inits)


def einsum(equation: str) -> onnx.ModelProto:
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="es", equation=equation)
    return make([node], [vi("a", [2, 3, 4]), vi("b", [2, 4, 5])], [vi("y", None)])


def gather_nd(batch_dims: int) -> onnx.ModelProto:
    node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd", batch_dims=batch_dims)
    return make([node], [vi("x", [2, 3]), vi("i", [2, 1], TensorProto.INT64)], [vi("y", None)])


def split(num_outputs: int, n_outputs: int) -> onnx.ModelProto:
    outs = [f"y{k}" for k in range(n_outputs)]
    node = helper.make_node("Split", ["x"], outs, name="sp", axis=1, num_outputs=num_outputs)
    return make([node], [vi("x", [2, 2], TensorProto.INT64)], [vi(o, None, TensorProto.INT64) for o in outs], opset=18)


def long_vector(length: int) -> onnx.ModelProto:
    """y = x * x on a 1-D input of ``length`` elements (onnx's data propagation is linear in it)."""
    return make([helper.make_node("Mul", ["x", "x"], ["y"], name="mul")], [vi("x", [length])], [vi("y", None)])


def constant_of_long_shape(length: int) -> onnx.ModelProto:
    """A 1-D value of ``length`` elements that only inference finds (from a constant shape)."""
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["c"], name="cos"),
             helper.make_node("Add", ["c", "c"], ["y"], name="add")]
    return make(nodes, [], [vi("y", None)], [numpy_helper.from_array(np.array([length], np.int64), "s")])


def local_function(recursive: bool = False) -> onnx.ModelProto:
    """y = twice(x) with a model-local function ``twice`` (which calls itself if ``recursive``)."""
    body = [helper.make_node("Add", ["a", "a"], ["b"])] if not recursive else [
        helper.make_node("twice", ["a"], ["b"], domain="local")]
    fn = helper.make_function("local", "twice", ["a"], ["b"], body, [helper.make_opsetid("", 17)])
    model = make([helper.make_node("twice", ["x"], ["y"], domain="local", name="call")], [vi("x", [2])],
                 [vi("y", [2])])
    model.opset_import.append(helper.make_opsetid("local", 1))
    model.functions.append(fn)
    return model


#: name -> builder of the models that crashed (SIGSEGV, SIGABRT) or hung onnx's C++ at load.
NATIVE_HAZARDS = {
    "layer_norm_axis_2**31": lambda: layer_norm(2**31),
    "layer_norm_axis_2**63-1": lambda: layer_norm(2**63 - 1, 2),
    "einsum_control_character": lambda: einsum("bij,bjk\x18->bik"),
    "einsum_lone_dot": lambda: einsum("bij.,bjk->bik"),
    "gather_nd_negative_batch_dims": lambda: gather_nd(-7),
    "split_num_outputs_mismatch": lambda: split(1, 2),
    "long_declared_vector": lambda: long_vector(2**40),
    "long_inferred_vector": lambda: constant_of_long_shape(2**40),
    "recursive_local_function": lambda: local_function(recursive=True),
}

#: What a child process can load: the hazards, and a model with a local function (which failed in a
#: fresh process until ``onnx.inliner`` was imported by the loader itself).
CHILD_MODELS = {"local_function": local_function, **NATIVE_HAZARDS}

_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
import onnxhal
from tests import hostile_models
for name in {names!r}:
    print("START", name, flush=True)
    model = hostile_models.CHILD_MODELS[name]()
    try:
        onnxhal.InferenceSession(model.SerializeToString())
        result = ["loaded", ""]
    except Exception as e:
        result = [type(e).__name__ if isinstance(e, onnxhal.errors.OrtError) else "untyped " + type(e).__name__, str(e)]
    print("RESULT", json.dumps([name] + result), flush=True)
"""


def load_in_child(names: list[str], timeout: float = 60.0) -> dict[str, tuple[str, str]]:
    """Create a session of each named model in one fresh child process: name -> (outcome, message),
    outcome the OrtError's class name, "loaded", or "untyped X". A crash or a hang is reported as the
    outcome of the model the child was loading ("crash -11", "hang")."""
    code = _CHILD.format(root=ROOT, names=names)
    results: dict[str, tuple[str, str]] = {}
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        out, rc = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        out, rc = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), None
    current = None
    for line in out.splitlines():
        if line.startswith("START "):
            current = line[6:]
        elif line.startswith("RESULT "):
            name, outcome, message = json.loads(line[7:])
            results[name] = (outcome, message)
            current = None
    if current is not None:
        results[current] = ("hang" if rc is None else f"crash {rc}", "")
    return results
