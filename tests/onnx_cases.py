"""Loading ONNX's own test material: backend node cases and the model folders in the onnx package,
and comparing outputs the way onnx's backend test runner does."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


@dataclass
class ModelCase:
    name: str
    model: onnx.ModelProto
    data_sets: list[tuple[dict[str, Any], list[Any]]] = field(default_factory=list)
    rtol: float = 1e-3
    atol: float = 1e-7


def _load_value(path: str, type_proto: onnx.TypeProto) -> Any:
    data = open(path, "rb").read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(data)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(data)
        return numpy_helper.to_optional(opt)
    t = onnx.TensorProto()
    t.ParseFromString(data)
    return numpy_helper.to_array(t)


def _real_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def folder_cases(kind: str) -> list[ModelCase]:
    """The model folders (simple, pytorch-converted, pytorch-operator): model.onnx + test_data_set_N."""
    cases = []
    for model_dir in sorted(glob.glob(os.path.join(DATA, kind, "test_*"))):
        model = onnx.load(os.path.join(model_dir, "model.onnx"))
        case = ModelCase(os.path.basename(model_dir), model)
        inputs = _real_inputs(model)
        for ds in sorted(glob.glob(os.path.join(model_dir, "test_data_set_*"))):
            n_in = len(glob.glob(os.path.join(ds, "input_*.pb")))
            n_out = len(glob.glob(os.path.join(ds, "output_*.pb")))
            feeds = {inputs[i].name: _load_value(os.path.join(ds, f"input_{i}.pb"), inputs[i].type) for i in range(n_in)}
            outs = [_load_value(os.path.join(ds, f"output_{i}.pb"), model.graph.output[i].type) for i in range(n_out)]
            case.data_sets.append((feeds, outs))
        cases.append(case)
    return cases


def light_cases() -> list[ModelCase]:
    """The `light` model zoo: inputs generated as onnx's runner does, outputs stored beside the model."""
    from onnx.backend.test.runner import Runner

    cases = []
    for path in sorted(glob.glob(os.path.join(DATA, "light", "light_*.onnx"))):
        model = onnx.load(path)
        name = os.path.basename(path)[len("light_"):-len(".onnx")]
        feeds = {x.name: Runner.generate_dummy_data(x, seed=0, name=f"test_{name}", random=False)
                 for x in _real_inputs(model)}
        prefix = os.path.splitext(path)[0]
        outs = [_load_value(f"{prefix}_output_{i}.pb", o.type) for i, o in enumerate(model.graph.output)]
        cases.append(ModelCase(name, model, [(feeds, outs)]))
    return cases


def node_cases() -> list[ModelCase]:
    """ONNX's backend node cases, generated in memory."""
    from onnx.backend.test.case.node import collect_testcases

    out = []
    for tc in collect_testcases(None):
        case = ModelCase(tc.name, tc.model, rtol=tc.rtol, atol=tc.atol)
        inputs = _real_inputs(tc.model)
        for ins, outs in tc.data_sets or []:
            ins = [numpy_helper.to_array(i) if isinstance(i, onnx.TensorProto) else i for i in ins]
            outs = [numpy_helper.to_array(o) if isinstance(o, onnx.TensorProto) else o for o in outs]
            case.data_sets.append(({inputs[k].name: v for k, v in enumerate(ins)}, outs))
        out.append(case)
    return out


def assert_similar(ref: Any, out: Any, rtol: float, atol: float, where: str = "") -> None:
    """As onnx's backend runner: exact for non-floats and strings, allclose for floats, recursive
    for sequences, NaNs equal."""
    if isinstance(ref, list):
        assert isinstance(out, list) and len(out) == len(ref), f"{where}: sequence length {len(out) if isinstance(out, list) else type(out)} != {len(ref)}"
        for k, (r, o) in enumerate(zip(ref, out)):
            assert_similar(r, o, rtol, atol, f"{where}[{k}]")
        return
    if ref is None:
        assert out is None, f"{where}: expected an empty optional, got {type(out).__name__}"
        return
    ref = np.asarray(ref)
    assert isinstance(out, np.ndarray), f"{where}: expected an ndarray, got {type(out).__name__}"
    assert out.shape == ref.shape, f"{where}: shape {out.shape} != {ref.shape}"
    if ref.dtype == object or ref.dtype.kind in "USO":
        np.testing.assert_array_equal(out.astype(object), ref.astype(object), err_msg=where)
        return
    assert out.dtype == ref.dtype, f"{where}: dtype {out.dtype} != {ref.dtype}"
    if ref.dtype.kind in "fc" or str(ref.dtype) in ("bfloat16",) or "float8" in str(ref.dtype):
        np.testing.assert_allclose(out.astype(np.float64) if out.dtype.kind not in "c" else out,
                                   ref.astype(np.float64) if ref.dtype.kind not in "c" else ref,
                                   rtol=rtol, atol=atol, equal_nan=True, err_msg=where)
    else:
        np.testing.assert_array_equal(out, ref, err_msg=where)
