"""The signal-processing ops of opset 17 and 20: DFT, STFT, the Hann, Hamming and Blackman windows
and MelWeightMatrix, as the ONNX specification and onnx.reference define them (which onnxruntime
follows), vectorized: frames as a strided view, one numpy FFT over all of them (onnx.reference
slices and concatenates frame by frame, and fills the mel matrix one cell at a time). Transforms
of float32 signals run in float32 (numpy 2 computes complex64 FFTs in single precision), as
onnxruntime's kernel and onnx.reference do: in float64 a value that is zero but for rounding came out
0 where both give float32 rounding noise (1.9e-7 in the backend's inverse-DFT case, over its 1e-7
tolerance); other types run in float64 and are cast back. A small STFT of a real signal is one
float64 product with the windowed DFT columns instead (path ``dft_product``, ``STFT_PATHS``)."""

from __future__ import annotations

import numpy as np

from onnxhal.hal import Kernel, KernelCreateContext, Node
from onnxhal.hal.errors import InvalidArgument
from onnxhal.runtime.providers.cpu.kernels.kernel_paths import path_table
from onnxhal.runtime.providers.cpu.kernels.registry import register

STFT_PATHS = path_table("STFT", "fft: the frames as a strided view, times the window, one numpy FFT")
FFT = STFT_PATHS.add("fft", "canonical: complex signals, products above DFT_PRODUCT_MAX_WORK, "
                            "DFT_PRODUCT_ENABLED off")
DFT_PRODUCT = STFT_PATHS.add(
    "dft_product", "DFT_PRODUCT_ENABLED at kernel build and at the run, a real float32 or float64 signal, at most "
                   "DFT_PRODUCT_MAX_WORK multiply-adds (batch x frames x length x 2 bins): the frames gathered by positions kept per (samples, "
                   "step, length), then one float64 product with the window times the DFT's cosine and sine "
                   "columns, kept per (length, window, onesided) and laid out as the output's (real, imaginary) "
                   "pairs (a float64 sum of float32 products: within float32 rounding of the FFT)")
#: switch of ``dft_product`` (read when the kernel is made and at each run)
DFT_PRODUCT_ENABLED = True
#: the most multiply-adds (batch x frames x length x 2 bins) ``dft_product`` takes: numpy's FFT
#: wrappers cost more than a small product, and above about a million BLAS's threads join in and a
#: product costs milliseconds on a loaded machine where the FFT costs a few hundred microseconds
DFT_PRODUCT_MAX_WORK = 1 << 20
_KEPT_MAX = 8  # bases and frame positions an STFT node keeps


def _scalar(v, what: str) -> int:
    a = np.asarray(v)
    if a.size != 1:
        raise InvalidArgument(f"{what} must be a scalar, got shape {list(a.shape)}; give one integer.")
    return int(a.reshape(-1)[0])


def _as_complex(x: np.ndarray, op: str) -> np.ndarray:
    """The signal of a [..., 1] (real) or [..., 2] (real, imaginary) tensor: float32/complex64 for
    float32, else float64/complex128."""
    if x.ndim < 2 or x.shape[-1] not in (1, 2):
        raise InvalidArgument(f"{op}: input of shape {list(x.shape)}; its last dim must be 1 (real) or 2 "
                              "(real and imaginary parts).")
    real = np.float32 if x.dtype == np.float32 else np.float64
    if x.shape[-1] == 1:
        return x[..., 0].astype(real)
    return x[..., 0].astype(real) + np.complex64(1j) * x[..., 1].astype(real)


def _as_pairs(spec: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty((*spec.shape, 2), dtype)
    out[..., 0], out[..., 1] = spec.real, spec.imag
    return out


def dft(x: np.ndarray, length: int | None, axis: int, inverse: bool, onesided: bool) -> np.ndarray:
    """DFT of ``x`` (last dim 1 or 2) along ``axis`` (an axis of ``x``, not its last), zero-padded
    or cut to ``length``; the inverse is normalized by 1/length; an inverse one-sided transform
    reads the first half of a Hermitian spectrum and writes a real signal (last dim 1)."""
    if not -x.ndim <= axis < x.ndim or axis % x.ndim == x.ndim - 1:
        raise InvalidArgument(f"DFT: axis {axis} for an input of rank {x.ndim}; give an axis of the signal dims, "
                              "not the last (real/imaginary) one.")
    axis %= x.ndim
    sig = _as_complex(x, "DFT")
    if length is None:
        length = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    if length < 1:
        raise InvalidArgument(f"DFT: dft_length {length}; give a positive length.")
    if inverse and onesided:
        real = np.fft.irfft(sig, n=length, axis=axis)
        return real[..., None].astype(x.dtype)
    spec = np.fft.ifft(sig, n=length, axis=axis) if inverse else np.fft.fft(sig, n=length, axis=axis)
    if onesided:
        spec = np.take(spec, np.arange(length // 2 + 1), axis=axis)
    return _as_pairs(spec, x.dtype)


@register("DFT", since=17)
class Dft17(Kernel):
    """DFT of opset 17: the axis an attribute (default 1)."""

    host_inputs = frozenset({1})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.axis = int(node.attr("axis", 1))
        self.inverse, self.onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))

    def compute(self, inputs: list) -> list:
        length = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        length = None if length is None else _scalar(length, "DFT's dft_length")
        return [dft(inputs[0], length, self.axis, self.inverse, self.onesided)]


@register("DFT", since=20)
class Dft20(Dft17):
    """DFT of opset 20: the axis an optional input (default -2)."""

    host_inputs = frozenset({1, 2})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        super().__init__(node, ctx)
        self.axis = -2

    def compute(self, inputs: list) -> list:
        length = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        length = None if length is None else _scalar(length, "DFT's dft_length")
        axis = _scalar(inputs[2], "DFT's axis") if len(inputs) > 2 and inputs[2] is not None else self.axis
        return [dft(inputs[0], length, axis, self.inverse, self.onesided)]


@register("STFT", since=17)
class Stft(Kernel):
    """Frames of ``frame_length`` samples every ``frame_step``, each times the window, transformed:
    [batch, frames, bins, 2], bins frame_length // 2 + 1 when ``onesided``. The frames are a
    strided view of the signal; one FFT call covers them all."""

    host_inputs = frozenset({1, 3})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.onesided = bool(node.attr("onesided", 1))
        self.name = node.name
        self.by_product = DFT_PRODUCT_ENABLED
        self.bases: dict = {}
        self.positions: dict = {}
        self.last_path = ""  #: the STFT_PATHS path of the last run (tests read it)

    def compute(self, inputs: list) -> list:
        x = inputs[0]
        step = _scalar(inputs[1], f"STFT {self.name!r}: frame_step")
        window = inputs[2] if len(inputs) > 2 and inputs[2] is not None and inputs[2].size else None
        length = (_scalar(inputs[3], f"STFT {self.name!r}: frame_length")
                  if len(inputs) > 3 and inputs[3] is not None else None)
        if x.ndim != 3:
            raise InvalidArgument(f"STFT {self.name!r}: signal of shape {list(x.shape)}; give [batch, samples, 1] "
                                  "or [batch, samples, 2].")
        if length is None:
            length = window.shape[0] if window is not None else x.shape[1]
        if window is not None and (window.ndim != 1 or window.shape[0] != length):
            raise InvalidArgument(f"STFT {self.name!r}: window of shape {list(window.shape)} for frame_length "
                                  f"{length}; give a 1-D window of frame_length values.")
        if step < 1 or length < 1 or length > x.shape[1]:
            raise InvalidArgument(f"STFT {self.name!r}: frame_step {step} and frame_length {length} over "
                                  f"{x.shape[1]} samples; give a positive step and a frame no longer than the signal.")
        count = 1 + (x.shape[1] - length) // step
        if (self.by_product and DFT_PRODUCT_ENABLED and x.shape[-1] == 1 and x.dtype in (np.float32, np.float64)
                and x.shape[0] * count * length * 2 * (length // 2 + 1 if self.onesided else length)
                <= DFT_PRODUCT_MAX_WORK):
            self.last_path = DFT_PRODUCT
            return [self._by_product(x, step, window, length, count)]
        self.last_path = FFT
        sig = _as_complex(x, f"STFT {self.name!r}")
        frames = np.lib.stride_tricks.sliding_window_view(sig, length, axis=1)[:, :(count - 1) * step + 1:step]
        if window is not None:
            frames = frames * window.astype(sig.real.dtype)
        if self.onesided and not np.iscomplexobj(frames):
            spec = np.fft.rfft(frames, axis=-1)
        else:
            spec = np.fft.fft(frames, axis=-1)
            if self.onesided:
                spec = spec[..., :length // 2 + 1]
        return [_as_pairs(spec, x.dtype)]

    def _by_product(self, x: np.ndarray, step: int, window: np.ndarray | None, length: int, count: int) -> np.ndarray:
        """Path ``dft_product``: [batch, frames, bins, 2] as one product of the gathered frames."""
        key = (x.shape[1], step, length)
        idx = self.positions.get(key)
        if idx is None:
            if len(self.positions) >= _KEPT_MAX:
                self.positions.clear()
            idx = self.positions[key] = np.arange(count)[:, None] * step + np.arange(length)
        wkey = (length, None if window is None else (window.dtype.str, window.tobytes()))
        basis = self.bases.get(wkey)
        if basis is None:
            if len(self.bases) >= _KEPT_MAX:
                self.bases.clear()
            basis = self.bases[wkey] = dft_basis(length, self.onesided, window)
        # [batch, frames, length], float64 (a float32 operand would take numpy's loop, not BLAS)
        frames = x[:, :, 0].astype(np.float64).take(idx, axis=1)
        y = np.matmul(frames, basis)
        return y.reshape(x.shape[0], count, -1, 2).astype(x.dtype)


def dft_basis(length: int, onesided: bool, window: np.ndarray | None) -> np.ndarray:
    """[length, 2 bins] float64: column 2k the window times cos(2 pi k n / length), column 2k + 1
    times -sin (bins length // 2 + 1 when ``onesided``, else length). The angle's k n is reduced
    modulo length first, and the analytic zeros (sin at 0 and pi, cos at pi / 2) are exact 0."""
    bins = length // 2 + 1 if onesided else length
    n = np.arange(length)
    phase = 2 * np.pi * ((n[:, None] * np.arange(bins)) % length) / length
    basis = np.empty((length, bins, 2))
    basis[..., 0], basis[..., 1] = np.cos(phase), -np.sin(phase)
    basis[np.abs(basis) < 1e-12] = 0.0
    if window is not None:
        basis *= window.astype(np.float64)[:, None, None]
    basis = basis.reshape(length, 2 * bins)
    basis.flags.writeable = False
    return basis


def _output_dtype(node: Node) -> np.dtype:
    from onnx.helper import tensor_dtype_to_np_dtype

    return np.dtype(tensor_dtype_to_np_dtype(int(node.attr("output_datatype", 1))))


class _Window(Kernel):
    """A cosine-sum window of ``size`` values, periodic (the DFT's period, default) or symmetric."""

    host_inputs = frozenset({0})
    #: the cosine terms' coefficients a0, a1, a2: a0 - a1 cos(2 pi n / N) + a2 cos(4 pi n / N)
    coefficients: tuple[float, float, float] = (0.5, 0.5, 0.0)

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.periodic, self.dtype = bool(node.attr("periodic", 1)), _output_dtype(node)

    def compute(self, inputs: list) -> list:
        size = _scalar(inputs[0], "a window's size")
        if size < 0:
            raise InvalidArgument(f"window size {size}; give a size of at least 0.")
        period = size if self.periodic else size - 1
        n = np.arange(size, dtype=np.float64)
        a0, a1, a2 = self.coefficients
        with np.errstate(invalid="ignore", divide="ignore"):  # a symmetric window of 1: 0/0, NaN as onnxruntime
            phase = 2 * np.pi * n / np.float64(period)
        return [(a0 - a1 * np.cos(phase) + a2 * np.cos(2 * phase)).astype(self.dtype)]


@register("HannWindow", since=17)
class HannWindow(_Window):
    coefficients = (0.5, 0.5, 0.0)


@register("HammingWindow", since=17)
class HammingWindow(_Window):
    coefficients = (25 / 46, 21 / 46, 0.0)


@register("BlackmanWindow", since=17)
class BlackmanWindow(_Window):
    coefficients = (0.42, 0.5, 0.08)


def mel_weight_matrix(mels: int, dft_length: int, rate: int, low: float, high: float) -> np.ndarray:
    """[dft_length // 2 + 1, mels] triangular filters between mel-spaced points, the points
    rounded down to spectrogram bins as the specification (and onnx.reference) do; float64."""
    bins = dft_length // 2 + 1
    to_mel = lambda hz: 2595 * np.log1p(hz / 700) / np.log(10)  # noqa: E731
    lo_mel, hi_mel = to_mel(low), to_mel(high)
    points = np.arange(mels + 2) * ((hi_mel - lo_mel) / (mels + 2)) + lo_mel
    points = (((dft_length + 1) * (700 * np.expm1(points / 2595 * np.log(10)))) // rate).astype(np.int64)
    if points.min() < 0 or points[1:-1].max() > bins - 1 or points[-1] > bins:  # onnx.reference's IndexError
        raise InvalidArgument(f"MelWeightMatrix: the edges {low} to {high} Hz at a sample rate of {rate} reach bin "
                              f"{int(points.max())} of a {bins}-bin spectrum; keep the upper edge at most half the "
                              "sample rate.")
    j = np.arange(bins)[:, None]
    left, center, right = points[None, :-2], points[None, 1:-1], points[None, 2:]
    rise = np.where(center > left, (j - left) / np.maximum(center - left, 1), (j == center).astype(np.float64))
    fall = (right - j) / np.maximum(right - center, 1)
    out = np.where((j >= left) & (j <= center), rise, 0.0)
    return np.where((right > center) & (j >= center) & (j < right), fall, out)


@register("MelWeightMatrix", since=17)
class MelWeightMatrix(Kernel):
    host_inputs = frozenset({0, 1, 2, 3, 4})

    def __init__(self, node: Node, ctx: KernelCreateContext) -> None:
        self.dtype = _output_dtype(node)

    def compute(self, inputs: list) -> list:
        mels, length, rate = (_scalar(v, f"MelWeightMatrix's {n}") for v, n in
                              zip(inputs[:3], ("num_mel_bins", "dft_length", "sample_rate")))
        if mels < 1 or length < 1 or rate < 1:
            raise InvalidArgument(f"MelWeightMatrix: num_mel_bins {mels}, dft_length {length}, sample_rate {rate}; "
                                  "give positive values.")
        low, high = (float(np.asarray(v).reshape(-1)[0]) for v in inputs[3:5])
        return [mel_weight_matrix(mels, length, rate, low, high).astype(self.dtype)]
