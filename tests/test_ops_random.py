"""Random single-operator models (``tests/random_ops.py``) against onnxruntime.

Each case runs in onnxruntime with its optimizer off and in onnxhal with its optimizer off and at
ORT_ENABLE_ALL (where constant inputs fold). Both must agree: the same dtypes, shapes and values
(float tolerance scaled to the output), or both refuse the case. onnxhal refusing a case
onnxruntime runs is a failure; onnxruntime refusing one onnxhal runs is not (it has no kernel for
some dtypes the spec allows). A refusal must be one of onnxhal's typed errors and must not carry a
raw Python or numpy exception. In the few cases where onnxruntime reads the spec otherwise
(``KNOWN_DIVERGENCES``, docs/cpu-ep.md) onnxhal must give onnx.reference's values instead. The second
test runs the cases with the OpenCL EP first. ``python -m tests.test_ops_random [seeds]
[--opencl] [op ...]`` runs more seeds and prints the counts and every difference.
"""

from __future__ import annotations

import sys
import warnings
import zlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator

import onnxhal
from onnxhal.hal import GraphOptimizationLevel as Level
from onnxhal.hal.errors import OrtError
from onnxhal.runtime.providers.opencl.op_support import SUPPORTED_OPS, VIEW_OPS
from tests.compare import float_difference
from tests.random_ops import all_generators, build

SEEDS = 100  # per operator
#: Exceptions that no refusal should carry: a clear refusal names the input and the remedy.
_RAW = ("AttributeError", "TypeError", "IndexError", "KeyError", "ValueError", "ZeroDivisionError",
        "UnboundLocalError", "NameError", "AssertionError", "OverflowError", "RecursionError")
GENERATORS = all_generators()
ort.set_default_logger_severity(3)  # RoiAlign's and old opsets' warnings, once per session


def _tolerance(dtype) -> float:
    # float64: onnxruntime computes some float64 ops with float32 constants (Gelu, Shrink: 1e-8)
    return {np.dtype(np.float16): 4e-3, np.dtype(np.float32): 1e-4}.get(np.dtype(dtype), 3e-8)


def _mismatch(want: list, got: list) -> str | None:
    if len(want) != len(got):
        return f"{len(got)} outputs, onnxruntime {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, list) or isinstance(g, list):  # sequence outputs: element by element
            if not (isinstance(w, list) and isinstance(g, list)):
                return f"output {i}: {type(g).__name__}, onnxruntime {type(w).__name__}"
            problem = _mismatch(w, g)
            if problem:
                return f"output {i} (a sequence): {problem}"
            continue
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"output {i}: {g.dtype}{list(g.shape)}, onnxruntime {w.dtype}{list(w.shape)}"
        if w.dtype.kind in "OUSb" or w.dtype.kind in "iu":
            if not np.array_equal(w, g):
                return f"output {i}: values differ at {np.argwhere(w != g)[:3].tolist()}"
            continue
        problem = float_difference(w, g, _tolerance(w.dtype))
        if problem:
            return f"output {i}: {problem}"
    return None


def _resize_divergence(case) -> str | None:
    a = case.attrs
    if a.get("antialias"):
        return "antialias filter support"
    if a.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        return "length_resized is scale * length in the spec's backend cases, the integer length in onnxruntime"
    return None


def _int_max_backwards(case) -> bool:
    ends = case.inputs[2]
    steps = case.inputs[4] if len(case.inputs) > 4 and case.inputs[4] is not None else np.ones_like(ends)
    return bool(((ends == np.iinfo(np.int64).max) & (steps < 0)).any())


#: Cases where onnxruntime reads the spec otherwise, each checked by hand against the spec and its
#: backend cases (docs/cpu-ep-random-cases.md): there, onnxhal must give onnx.reference's values. Anywhere else a
#: difference from onnxruntime fails, also where onnx.reference agrees with onnxhal: onnx.reference
#: has bugs of its own (LpNormalization p=1 without |x|, RNN ignoring clip), and a kernel that
#: delegates to it would copy them.
KNOWN_DIVERGENCES = {
    "Resize": _resize_divergence,
    "MeanVarianceNormalization": lambda c: "onnxruntime leaves out the function body's epsilon",
    "MaxUnpool": lambda c: ("onnxruntime reads the indices as flat in output_shape, the spec's backend case in the "
                            "implied shape") if len(c.inputs) > 2 else None,
    "Slice": lambda c: ("an end of INT64_MAX with a negative step is clamped to dim - 1 (the spec: an empty slice), "
                        "read as 'to the start' by onnxruntime") if _int_max_backwards(c) else None,
    "Squeeze": lambda c: ("an empty axes input squeezes nothing (onnx's shape inference and reference), every "
                          "1-dimension in onnxruntime") if len(c.inputs) > 1 and c.inputs[1] is not None
    and c.inputs[1].size == 0 else None,
    "NonZero": lambda c: ("a 0-d input gives (0, nnz) as onnx's shape inference (rank 0), (1, nnz) in onnxruntime "
                          "(numpy 1's 0-d nonzero)") if c.inputs[0].ndim == 0 else None,
    "StringSplit": lambda c: ("an empty string split by a delimiter is one empty substring (Python's str.split), "
                              "none in onnxruntime") if c.attrs.get("delimiter") and (c.inputs[0] == "").any() else None,
}


def _scan_zero_length_off_axis0(case) -> str | None:
    n = case.attrs["num_scan_inputs"]
    axes = case.attrs.get("scan_input_axes", [0] * n)
    xs = case.inputs[len(case.inputs) - n:]
    if any(x.shape[a % x.ndim] == 0 and a % x.ndim != 0 for a, x in zip(axes, xs)):
        return "a scan input of length 0 on an axis other than 0: onnxruntime 1.32 dies of SIGFPE (seen in CI)"
    return None


#: Cases that kill onnxruntime's process (undefined behaviour there: the same case passes or dies
#: depending on what ran before it), so onnx.reference judges them instead of onnxruntime.
ORT_CRASHES = {
    "Scan": _scan_zero_length_off_axis0,
}

OPENCL = ["OpenCLExecutionProvider", "CPUExecutionProvider"]
OPENCL_SEEDS = 30
#: Nodes the OpenCL EP ran per operator, over every case checked with it.
OPENCL_NODES: dict[str, int] = {}


def check(op: str, seed: int, opencl: bool = False) -> tuple[str, str | None]:
    """('agree' | 'both-refuse' | 'ort-refuses' | 'ort-differs' | 'fail', detail). 'ort-differs':
    a case of ``KNOWN_DIVERGENCES`` where onnxruntime's values differ from onnxhal's and
    onnx.reference's, which agree (and, with the OpenCL EP, onnxhal's CPU EP too)."""
    rng = np.random.default_rng([zlib.crc32(op.encode()), seed])
    with np.errstate(all="ignore"):  # generators cast and clip random values freely
        case = GENERATORS[op](rng)
    try:
        model, feeds = build(case)
    except Exception as e:  # noqa: BLE001 - onnx's shape inference refuses the case: not ours to run
        return "both-refuse", f"shape inference: {e}"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    so.log_severity_level = 4
    crash = ORT_CRASHES.get(op, lambda c: None)(case)
    try:
        if crash:
            want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, {k: _copy(v) for k, v in feeds.items()})
        else:
            want = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as e:  # noqa: BLE001
        want, ort_error = None, str(e).splitlines()[0][:200]
    where = f"{case.describe()} [seed {seed}]"
    runs = [(Level.ORT_DISABLE_ALL, None), (Level.ORT_ENABLE_ALL, None)]
    if opencl:  # what the OpenCL EP claims, the rest on the CPU EP
        runs = [(Level.ORT_DISABLE_ALL, OPENCL), (Level.ORT_ENABLE_ALL, OPENCL)]
    for level, providers in runs:
        hso = onnxhal.SessionOptions()
        hso.graph_optimization_level = level
        hso.log_severity_level = 4
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sess = onnxhal.InferenceSession(model, hso, providers=providers)
                got = sess.run(None, {k: _copy(v) for k, v in feeds.items()})
                if providers:
                    OPENCL_NODES[op] = OPENCL_NODES.get(op, 0) + sess.partition_summary.get(OPENCL[0], 0)
        except OrtError as e:
            raw = next((n for n in _RAW if f": {n}:" in str(e)), None)
            if raw:  # a kernel's Python or numpy error, wrapped: a bug, or an input left unchecked
                return "fail", f"{where} at {level.name}: a raw {raw} inside {type(e).__name__}: {str(e)[:300]}"
            if want is None:
                return "both-refuse", f"{where}: {type(e).__name__}: {str(e)[:200]}"
            return "fail", f"{where} at {level.name}: onnxhal refuses ({type(e).__name__}: {str(e)[:300]})"
        except Exception as e:  # noqa: BLE001 - an untyped error is a failure whatever onnxruntime does
            return "fail", f"{where} at {level.name}: untyped {type(e).__name__}: {str(e)[:300]}"
        if want is None:
            return "ort-refuses", f"{where}: {ort_error}"
        problem = _mismatch(want, got)
        if problem:
            # onnxruntime's own reading of the spec, where onnx.reference and (for the OpenCL EP)
            # onnxhal's CPU EP give what onnxhal gave
            known = KNOWN_DIVERGENCES.get(op, lambda c: None)(case)
            if known and _mismatch(_reference(model, feeds), got) is None and (
                    not providers or _mismatch(_onnxhal_cpu(model, feeds), got) is None):
                return "ort-differs", f"{where}: {problem} ({known})"
            return "fail", f"{where} at {level.name}: {problem}"
    return "agree", None


def _copy(v):
    return [t.copy() for t in v] if isinstance(v, list) else v.copy()


def _onnxhal_cpu(model: bytes, feeds: dict) -> list:
    try:
        return onnxhal.InferenceSession(model).run(None, {k: _copy(v) for k, v in feeds.items()})
    except Exception:  # noqa: BLE001
        return []


def _reference(model: bytes, feeds: dict) -> list:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ReferenceEvaluator(onnx.load_from_string(model)).run(None, feeds)
    except Exception:  # noqa: BLE001 - no third opinion
        return []


@pytest.mark.parametrize("op", sorted(GENERATORS))
def test_random_cases_agree_with_onnxruntime(op):
    results = [check(op, seed) for seed in range(SEEDS)]
    failures = [d for kind, d in results if kind == "fail"]
    assert not failures, "\n".join(failures)
    # a generator whose cases onnxruntime always refuses tests nothing
    assert any(kind == "agree" for kind, _ in results), f"{op}: no case ran on both runtimes"


# A lone view (Reshape, Flatten, Squeeze, Unsqueeze) computes nothing, so the OpenCL EP never claims
# one in a one-node model; tests/test_opencl_kernels.py runs views inside fused groups.
@pytest.mark.parametrize("op", sorted(set(GENERATORS) & (SUPPORTED_OPS - VIEW_OPS)))
def test_random_cases_on_opencl_agree_with_onnxruntime(op, opencl_devices):
    """The same cases with the OpenCL EP first (PoCL): what it claims must match onnxruntime, and
    what it declines must fall back to the CPU EP cleanly."""
    results = [check(op, seed, opencl=True) for seed in range(OPENCL_SEEDS)]
    failures = [d for kind, d in results if kind == "fail"]
    assert not failures, "\n".join(failures)
    assert OPENCL_NODES.get(op, 0) > 0, f"{op}: the OpenCL EP claimed no node in {OPENCL_SEEDS} cases"


def main(argv: list[str]) -> int:
    opencl = "--opencl" in argv
    argv = [a for a in argv if a != "--opencl"]
    if opencl:
        onnxhal.register_execution_provider_library("opencl_tests", "onnxhal.runtime.providers.opencl")
    seeds = int(argv[0]) if argv else 200
    ops = argv[1:] or sorted(GENERATORS)
    total: dict[str, int] = {}
    failures, differs = [], []
    for op in ops:
        counts: dict[str, int] = {}
        for seed in range(seeds):
            kind, detail = check(op, seed, opencl)
            counts[kind] = counts.get(kind, 0) + 1
            if kind == "fail":
                failures.append(detail)
            elif kind == "ort-differs":
                differs.append(detail)
        for k, v in counts.items():
            total[k] = total.get(k, 0) + v
        print(f"{op:24s} " + " ".join(f"{k}={v}" for k, v in sorted(counts.items())), flush=True)
    print("total", total)
    for f in differs:
        print("ORT-DIFFERS", f)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
