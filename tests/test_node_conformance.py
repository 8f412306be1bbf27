"""ONNX backend node conformance: every case of ``onnx.backend.test.case.node`` through an
``InferenceSession`` on the CPU EP, compared as onnx's backend runner compares (same shape, same
dtype, ``assert_allclose`` with the case's rtol/atol, exact for strings, sequences element-wise).

Known failures are listed in ``EXPECTED_FAILURES`` with their reason; they are strict xfails, so a
case that starts passing shows up (except the random-output cases, which can match by chance). ``python tests/test_node_conformance.py`` prints the pass count.
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxhal

NONDETERMINISTIC = "random output: the expected values come from numpy's generator at export time"
_CODEC = "needs a JPEG 2000 / WebP codec (Pillow is not a dependency)"
_ORT_ALIGN_CORNERS = ("onnxruntime's reading, kept: align_corners divides by the integer output length less 1; the "
                      "case's values divide by scale * length less 1, fractional here (test_cpu_kernels_nn.py checks "
                      "the kernel against onnxruntime)")

EXPECTED_FAILURES: dict[str, str] = {
    "test_bernoulli": NONDETERMINISTIC,
    "test_bernoulli_double": NONDETERMINISTIC,
    "test_bernoulli_seed": NONDETERMINISTIC,
    "test_bernoulli_expanded": NONDETERMINISTIC,
    "test_bernoulli_double_expanded": NONDETERMINISTIC,
    "test_bernoulli_seed_expanded": NONDETERMINISTIC,
    "test_resize_downsample_scales_linear_align_corners": _ORT_ALIGN_CORNERS,
    "test_resize_downsample_scales_cubic_align_corners": _ORT_ALIGN_CORNERS,
}


def _has_codec(feature: str) -> bool:
    """Whether Pillow, which ImageDecoder uses where it is installed, decodes this format here."""
    try:
        from PIL import features
    except ImportError:
        return False
    return bool(features.check(feature))


# These cases pass wherever Pillow with the codec is installed, and fail (expectedly) elsewhere.
for _case, _feature in (("test_image_decoder_decode_jpeg2k_rgb", "jpg_2000"), ("test_image_decoder_decode_webp_rgb", "webp")):
    if not _has_codec(_feature):
        EXPECTED_FAILURES[_case] = _CODEC


def _collect():
    with warnings.catch_warnings():  # the case generators warn about their own overflow tests
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        return collect_testcases()


CASES = _collect()


def _to_value(v):
    """A case's stored input/output as the session's value representation."""
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, onnx.SequenceProto):
        return numpy_helper.to_list(v)
    if isinstance(v, onnx.OptionalProto):
        return numpy_helper.to_optional(v)
    if isinstance(v, list):
        return [_to_value(x) for x in v]
    if isinstance(v, np.generic):  # the backend runner stores these as 0-d tensors
        return np.asarray(v)
    return v


def assert_similar(ref, out, rtol: float, atol: float) -> None:
    """onnx.backend.test.runner's comparison, plus None for empty optionals."""
    if isinstance(ref, (list, tuple)):
        assert isinstance(out, (list, tuple)), f"expected a sequence, got {type(out).__name__}"
        assert len(out) == len(ref), f"sequence length {len(out)} != {len(ref)}"
        for r, o in zip(ref, out):
            assert_similar(r, o, rtol, atol)
        return
    if ref is None:
        assert out is None, f"expected an empty optional, got {type(out).__name__}"
        return
    assert isinstance(out, np.ndarray), f"expected an ndarray, got {type(out).__name__}"
    np.testing.assert_array_equal(out.shape, ref.shape, err_msg="output has the wrong shape")
    if ref.dtype == object:
        np.testing.assert_array_equal(out, ref)
        return
    np.testing.assert_equal(out.dtype, ref.dtype)
    if out.dtype.name == "bfloat16":
        rtol = max(rtol, 2**-6)  # two bfloat16 ULPs, as the runner allows
        out, ref = out.astype(np.float32), ref.astype(np.float32)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


def run_case(case) -> None:
    """Build a session for the case's model and check every data set."""
    sess = onnxhal.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in case.model.graph.input]
    for inputs, outputs in case.data_sets:
        feeds = dict(zip(names, (_to_value(x) for x in inputs)))
        got = sess.run(None, feeds)
        expected = [_to_value(x) for x in outputs]
        assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
        for r, o in zip(expected, got):
            assert_similar(r, o, case.rtol, case.atol)


_RESULTS: dict[str, bool] = {}


def _params() -> list:
    params = []
    for case in CASES:
        marks = ()
        if case.name in EXPECTED_FAILURES:
            # Random outputs can match the stored ones by chance (10 coin flips): not strict.
            strict = EXPECTED_FAILURES[case.name] != NONDETERMINISTIC
            marks = (pytest.mark.xfail(strict=strict, reason=EXPECTED_FAILURES[case.name]),)
        params.append(pytest.param(case, id=case.name, marks=marks))
    return params


@pytest.mark.parametrize("case", _params())
def test_node_case(case) -> None:
    _RESULTS[case.name] = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # cases deliberately divide by zero etc.
        run_case(case)
    _RESULTS[case.name] = True


def _passes(case) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            run_case(case)
        return True
    except Exception:  # noqa: BLE001 - any failure counts as a failed case
        return False


def test_conformance_summary() -> None:
    """Pass count over all cases (reuses the per-case results of this run where there are some)."""
    passed = sum(_RESULTS[c.name] if c.name in _RESULTS else _passes(c) for c in CASES)
    print(f"\nnode conformance: {passed} / {len(CASES)} cases pass on the CPU EP")
    assert passed >= len(CASES) - len(EXPECTED_FAILURES)


if __name__ == "__main__":
    failed = [c.name for c in CASES if not _passes(c)]
    for name in failed:
        print("FAIL", name, "-", EXPECTED_FAILURES.get(name, "unexpected"))
    print(f"node conformance: {len(CASES) - len(failed)} / {len(CASES)} cases pass on the CPU EP")
    sys.exit(1 if set(failed) - set(EXPECTED_FAILURES) else 0)
