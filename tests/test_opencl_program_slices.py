"""Program slices (runtime/providers/opencl/program_slices.py): a kernel of a large source is built
from the part of the source it needs. The text checks run anywhere; the launch checks compare a
sliced program's result with the whole program's on the real driver."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.program_slices import SLICE_MIN_CHARS, kernel_slice

_KERNEL = re.compile(r"__kernel\s+void\s+(\w+)\s*\(")
_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_DEFINED = re.compile(r"^(?:inline\s+)?(?:__kernel\s+)?[A-Za-z_][\w ]*?\b([A-Za-z_]\w*)\s*\([^;{]*\)\s*\{", re.M)

EPILOGUE = ks.gemm_epilogue_source([("t0", "x * 0.5f"), ("t1", "onnxhal_tanh(t0)")], "t1 + 1.0f")


def _functions(source: str) -> set[str]:
    return set(_DEFINED.findall(re.sub(r"//[^\n]*", "", source)))


@pytest.mark.parametrize("source", [ks.GEMM_SOURCE, EPILOGUE], ids=["gemm", "gemm_epilogue"])
def test_each_kernel_slice_holds_it_and_every_function_it_calls(source):
    kernels = _KERNEL.findall(source)
    assert len(source) >= SLICE_MIN_CHARS and len(kernels) > 10
    defined = _functions(source)
    for name in kernels:
        piece = kernel_slice(source, name)
        assert _KERNEL.findall(piece) == [name], name
        assert len(piece) < len(source) / 4, (name, len(piece))
        # Every function of the whole source that the slice calls is defined in the slice.
        calls = set(_CALL.findall(re.sub(r"//[^\n]*", "", piece))) & defined
        assert calls <= _functions(piece), (name, calls - _functions(piece))
        # Directives are all kept (macros are cheap; a slice must not lose one a kept item uses).
        assert piece.count("#define") == source.count("#define")


def test_epilogue_slice_keeps_the_epilogue_function():
    piece = kernel_slice(EPILOGUE, "gemm_packed")
    assert "float onnxhal_epilogue_expr(float x) {" in piece and "onnxhal_tanh(t0)" in piece
    assert "onnxhal_tanh" in _functions(piece)


def test_small_or_unknown_sources_are_built_whole():
    assert kernel_slice(ks.CONV_SOURCE, "im2col_packed") == ks.CONV_SOURCE  # below SLICE_MIN_CHARS
    assert kernel_slice(ks.GEMM_SOURCE, "no_such_kernel") == ks.GEMM_SOURCE
    # A name that is only a macro is not a kernel: the whole source
    assert kernel_slice(ks.GEMM_SOURCE, "RM") == ks.GEMM_SOURCE


def test_sliced_gemm_matches_the_whole_program():
    """gemm_packed with an epilogue, from its slice and from the whole source: the same bits."""
    from tests.opencl_support import require_opencl

    index = require_opencl()
    import pyopencl as cl

    from onnxhal.runtime.providers.opencl.device_context import device_context, opencl_device

    ctx = device_context(opencl_device(*map(int, index.split(":"))))
    rng = np.random.default_rng(0)
    M, N, K = 8, 16, 24
    a = rng.standard_normal((K, M)).astype(np.float32)  # packed A: [Mb=1][K][RM=8]
    b = rng.standard_normal((K, 16)).astype(np.float32)  # packed B: [Nb=1][K][16]
    bias = rng.standard_normal(N).astype(np.float32)
    mf = cl.mem_flags
    bufs = [cl.Buffer(ctx.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=v) for v in (a, b, bias)]
    results = []
    for program in (ctx.program(EPILOGUE), ctx.program(EPILOGUE, kernel="gemm_packed")):
        out = cl.Buffer(ctx.context, mf.READ_WRITE, M * N * 4)
        knl = cl.Kernel(program, "gemm_packed")
        act = ks.EPILOGUE_EXPR_CODE
        knl.set_args(bufs[0], bufs[1], out, bufs[2], out, np.int32(M), np.int32(N), np.int32(K), np.int32(1),
                     np.int32(0), np.int32(0), np.int32(1), np.float32(1), np.float32(1), np.int32(act),
                     np.float32(0), np.float32(0), np.int32(N))
        cl.enqueue_nd_range_kernel(ctx.queue, knl, (ks.GEMM_JT, 1), (1, 1))
        host = np.empty((M, N), np.float32)
        cl.enqueue_copy(ctx.queue, host, out, is_blocking=True)
        results.append(host)
    assert len(kernel_slice(EPILOGUE, "gemm_packed")) < len(EPILOGUE) / 4
    want = np.tanh((a.T @ b + bias) * 0.5) + 1.0
    np.testing.assert_allclose(results[1], want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(results[0], results[1])
