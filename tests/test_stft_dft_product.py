"""STFT's path ``dft_product`` (``signal.STFT_PATHS``): the frames of a real signal gathered once
and multiplied by the window times the DFT's cosine and sine columns, one float64 product. Held to
the canonical ``fft`` path (numpy's FFT of the windowed frames) within float32 rounding of the
spectrum's scale, and to onnxruntime; complex signals and large products stay on the FFT."""

from __future__ import annotations

import numpy as np
import pytest

from onnxhal.runtime.providers.cpu.kernel_factory import create_cpu_kernel
from onnxhal.runtime.providers.cpu.kernels import signal
from tests.test_cpu_kernels_nn import make_node, run_onnxruntime

RNG = np.random.default_rng(4407)
# (batch, samples, step, frame length, window)
CASES = [(2, 464, 16, 64, "hann"), (1, 67, 5, 16, None), (3, 50, 7, 9, "rect"), (2, 33, 1, 1, None),
         (1, 128, 128, 128, "hann"), (2, 40, 3, 40, "hann")]


def both_paths(kernel, inputs: list) -> tuple[np.ndarray, str, np.ndarray, str]:
    try:
        signal.DFT_PRODUCT_ENABLED = False
        (plain,) = kernel.compute(list(inputs))
        plain_path = kernel.last_path
        signal.DFT_PRODUCT_ENABLED = True
        (fast,) = kernel.compute(list(inputs))
    finally:
        signal.DFT_PRODUCT_ENABLED = True
    return plain, plain_path, fast, kernel.last_path


def inputs_of(batch: int, samples: int, step: int, length: int, window: str | None, dtype=np.float32) -> list:
    x = RNG.standard_normal((batch, samples, 1)).astype(dtype)
    w = {"hann": np.hanning(length), "rect": np.ones(length), None: None}[window]
    return [x, np.array(step, np.int64), None if w is None else w.astype(dtype), np.array(length, np.int64)]


@pytest.mark.parametrize("onesided", [1, 0])
def test_dft_product_matches_fft_and_onnxruntime(onesided):
    for case in CASES:
        inputs = inputs_of(*case)
        kernel = create_cpu_kernel(make_node("STFT", 4, 17, onesided=onesided), None)
        for _ in range(2):  # the second run reads the kept basis and positions
            plain, plain_path, fast, fast_path = both_paths(kernel, inputs)
            assert (plain_path, fast_path) == (signal.FFT, signal.DFT_PRODUCT), case
            assert fast.shape == plain.shape and fast.dtype == plain.dtype, case
            scale = max(1.0, float(np.abs(plain).max()))
            np.testing.assert_allclose(fast, plain, rtol=0, atol=4e-7 * scale * np.sqrt(case[3]), err_msg=str(case))
        ort_inputs = [inputs[0], inputs[1], inputs[2] if inputs[2] is not None else np.ones(case[3], np.float32),
                      inputs[3]]
        (want,) = run_onnxruntime("STFT", ort_inputs, 17, onesided=onesided)
        np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5 * scale, err_msg=str(case))


def test_dft_product_of_float64_and_a_constant_signal():
    x = np.full((1, 32, 1), 0.25)
    kernel = create_cpu_kernel(make_node("STFT", 4, 17), None)
    plain, _, fast, path = both_paths(kernel, [x, np.array(8, np.int64), None, np.array(16, np.int64)])
    assert path == signal.DFT_PRODUCT and fast.dtype == np.float64
    np.testing.assert_allclose(fast, plain, rtol=0, atol=1e-14)
    assert np.all(fast[..., 0, 1] == 0)  # the DC bin's sine column is exactly 0


def test_complex_signals_and_large_products_take_the_fft(monkeypatch):
    kernel = create_cpu_kernel(make_node("STFT", 4, 17, onesided=0), None)
    x = RNG.standard_normal((1, 40, 2)).astype(np.float32)
    kernel.compute([x, np.array(4, np.int64), None, np.array(8, np.int64)])
    assert kernel.last_path == signal.FFT
    monkeypatch.setattr(signal, "DFT_PRODUCT_MAX_WORK", 100)
    kernel.compute(inputs_of(1, 40, 4, 8, None))
    assert kernel.last_path == signal.FFT


def test_dft_basis_columns_are_the_transform():
    basis = signal.dft_basis(8, True, None)
    x = RNG.standard_normal(8)
    spec = (x @ basis).reshape(-1, 2)
    np.testing.assert_allclose(spec[:, 0] + 1j * spec[:, 1], np.fft.rfft(x), atol=1e-12)
