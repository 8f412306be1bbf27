"""com.microsoft MatMulNBits (the weight-only quantized MatMul of onnxruntime's 4-bit quantizer)
and MatMulBnb4 (bitsandbytes' FP4 / NF4) on the CPU EP against onnxruntime: 2-, 4- and 8-bit
codes, K not a multiple of the block, packed or float zero points (not with 8 bits: onnxruntime
refuses those) or none, bias, batched A; both code books."""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_ms_attention import check


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_matmul_nbits(seed, bits):
    rng = np.random.default_rng(seed)
    block = int(rng.choice([16, 32]))
    k, n = int(rng.integers(block // 2, 3 * block)), int(rng.integers(1, 9))
    blocks = -(-k // block)
    codes_per_byte = 8 // bits
    b = rng.integers(0, 256, (n, blocks, block // codes_per_byte)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, n * blocks).astype(np.float32)
    a = rng.standard_normal((2, int(rng.integers(1, 5)), k)).astype(np.float32)
    packed_zp = rng.integers(0, 256, (n, -(-blocks // codes_per_byte))).astype(np.uint8).reshape(-1)
    float_zp = rng.uniform(0, 2 ** bits - 1, n * blocks).astype(np.float32)
    forms = [("none", None), ("packed", packed_zp)] + ([("float", float_zp)] if bits != 8 else [])  # onnxruntime: no
    for label, zp in forms:  # float zero points with 8-bit codes
        feeds = {"a": a, "b": b, "scales": scales, "zp": zp, "g_idx": None,
                 "bias": rng.standard_normal(n).astype(np.float32)}
        check("MatMulNBits", feeds, 1, f"MatMulNBits bits={bits} K={k} N={n} zp={label} seed {seed}", K=k, N=n,
              bits=bits, block_size=block)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("quant_type", [0, 1])
def test_matmul_bnb4(seed, quant_type):
    rng = np.random.default_rng(seed)
    block = int(rng.choice([16, 32, 64]))
    k, n = int(rng.integers(8, 70)), int(rng.integers(1, 9))
    count = k * n
    feeds = {"a": rng.standard_normal((2, 3, k)).astype(np.float32),
             "b": rng.integers(0, 256, (count + 1) // 2).astype(np.uint8),
             "absmax": rng.uniform(0.1, 2.0, -(-count // block)).astype(np.float32)}
    check("MatMulBnb4", feeds, 1, f"MatMulBnb4 quant_type={quant_type} K={k} N={n} seed {seed}", K=k, N=n,
          block_size=block, quant_type=quant_type)
