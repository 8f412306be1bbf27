"""OpenCL C sources of the OpenCL EP's fixed kernels, one program per op family.

Shapes are kernel arguments, never baked into the source, so each family builds once per device
(and once per machine, through the disk cache). Fused elementwise kernels are generated instead, in
``elementwise_codegen``.

PoCL notes that shaped this code: ``vload8``/``vstore8`` are out-of-line calls on PoCL (they clobber
every vector register), so the GEMM loads packed panels through ``float16`` pointers; ``a * b + c``
with ``-cl-mad-enable`` becomes an FMA instruction while ``fma()`` is a slow call; ``native_exp``
is accurate to ~1e-7 relative here and much faster than ``exp``.
"""

from __future__ import annotations

import functools
import re

#: NaN-propagating max/min/clamp, for every program that compares values.
NAN_HELPERS = """
// As numpy, the CPU EP and onnxruntime's elementwise ops: OpenCL's fmax/fmin return the other
// operand for a NaN (and are out-of-line calls on PoCL). `a != a` needs the build without
// -cl-finite-math-only (device_context.DEFAULT_BUILD_OPTIONS).
inline float onnxhal_max(float a, float b) { return (a > b || a != a) ? a : b; }
inline float onnxhal_min(float a, float b) { return (a < b || a != a) ? a : b; }
// min(max(v, lo), hi) as ORT's Clip: hi wins when lo > hi
inline float onnxhal_clamp(float v, float lo, float hi) { const float t = v < lo ? lo : v; return t > hi ? hi : t; }
"""

#: Helpers shared by generated and fixed kernels: the NaN helpers, erf and tanh on native_exp
#: (erf() and exp() are slow calls on PoCL), and the activations a GEMM/Conv epilogue can apply.
ACTIVATION_HELPERS = NAN_HELPERS + """
// erf(|x|) by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), for a float or a float vector: ax = |x|,
// t = 1 / (1 + 0.3275911 ax), computed by the caller in its own type.
#define ONNXHAL_ERF_ABS(ax, t) (1.0f - (((((1.061405429f * (t) - 1.453152027f) * (t)) + 1.421413741f) * (t) \
    - 0.284496736f) * (t) + 0.254829592f) * (t) * ONNXHAL_EXP(-(ax) * (ax)))
inline float onnxhal_erf(float x) {
  const float ax = fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * ax);
  return copysign(ONNXHAL_ERF_ABS(ax, t), x);
}
inline float onnxhal_tanh(float x) {
  const float ax = fabs(x) > 20.0f ? 20.0f : fabs(x);  // NaN stays NaN
  if (ax < 0.25f) {  // (1-e)/(1+e) cancels near 0: use the odd series there (error < 1e-8 relative)
    const float x2 = x * x;
    return x * (1.0f + x2 * (-0.33333333f + x2 * (0.13333333f + x2 * (-0.05396825f + x2 * 0.02186949f))));
  }
  const float e = ONNXHAL_EXP(-2.0f * ax);
  return copysign((1.0f - e) / (1.0f + e), x);
}
// GELU (erf form, as apply_act's case 7) on 8 lanes at once: the GEMM epilogue's vector path. fabs
// and copysign as bit masks (vector builtins can be out-of-line calls on PoCL).
inline float8 onnxhal_gelu8(float8 v) {
  const float8 x = v * 0.70710678118f;
  const int8 sign = as_int8(x) & (int8)(0x80000000);
  const float8 ax = as_float8(as_int8(x) & (int8)(0x7fffffff));
  const float8 t = 1.0f / (1.0f + 0.3275911f * ax);
  const float8 y = ONNXHAL_ERF_ABS(ax, t);
  return 0.5f * v * (1.0f + as_float8(as_int8(y) | sign));
}
// act: 0 none, 1 Relu, 2 Sigmoid, 3 Tanh, 4 LeakyRelu(p0), 5 HardSigmoid(p0, p1), 6 Clip(p0, p1), 7 Gelu
#ifdef ONNXHAL_EPILOGUE_EXPR
float onnxhal_epilogue_expr(float x);  // an elementwise chain folded into a GEMM, defined after
#endif
inline float apply_act(float v, int act, float p0, float p1) {
  switch (act) {
    case 1: return v < 0.0f ? 0.0f : v;
    case 2: return 1.0f / (1.0f + ONNXHAL_EXP(-v));
    case 3: return onnxhal_tanh(v);
    case 4: return v >= 0.0f ? v : p0 * v;
    case 5: return onnxhal_clamp(p0 * v + p1, 0.0f, 1.0f);
    case 6: return onnxhal_clamp(v, p0, p1);
    case 7: return 0.5f * v * (1.0f + onnxhal_erf(v * 0.70710678118f));
#ifdef ONNXHAL_EPILOGUE_EXPR
    case 15: return onnxhal_epilogue_expr(v);
#endif
    default: return v;
  }
}
"""

#: Epilogue code of a generated elementwise chain (``gemm_epilogue_source``).
EPILOGUE_EXPR_CODE = 15

#: Activation name -> epilogue code of ``apply_act``.
ACTIVATION_CODES = {"": 0, "Relu": 1, "Sigmoid": 2, "Tanh": 3, "LeakyRelu": 4, "HardSigmoid": 5, "Clip": 6,
                    "Gelu": 7}

#: Rows of C computed by one GEMM work-item (register block RM x 16: 8 float16 accumulators, one
#: 512-bit register each where the CPU has AVX-512: faster than 12 float8 ones on PoCL,
#: which splits float8 code into 256-bit halves; 8 rows also tile the usual 64/128/768 dims exactly).
GEMM_RM = 8
#: Columns of C computed by one GEMM work-item.
GEMM_RN = 16
#: Column panels a GEMM launch walks together (see the work-group order in ``gemm_packed``).
GEMM_JT = 16


#: Which register block (ib, jb) of which batch b a GEMM-family work-item computes, from Mb row
#: blocks and Nb column panels (see ``_gemm_source``'s walk).
_TILE_WALK = """  const int jt = min(GEMM_JT, Nb);
  const int gid = get_global_id(0);
  const int group = gid / (Mb * jt), within = gid % (Mb * jt);
  const int ib = within / jt, jb = group * jt + within % jt;
  if (jb >= Nb) return;
  const int b = get_global_id(1);"""


def _gemm_source() -> str:
    rm = GEMM_RM
    decl = "\n".join(f"  float16 c{r} = (float16)(0.0f);" for r in range(rm))
    body = "\n".join(f"    c{r} += (float16)(ap[{r}]) * bv;" for r in range(rm))
    store = "\n".join(f"  store_row(C, R, c{r}.lo, c{r}.hi, i0 + {r}, j0, M, N, ldc, bias, bias_mode, alpha, beta, act, p0, p1);"
                      for r in range(rm))
    rows = "\n".join(f"  __global const float* a{r} = A + (size_t)min(i0 + {r}, M - 1) * lda;" for r in range(rm))
    row_body = "\n".join(f"    c{r} += (float16)(a{r}[k]) * bv;" for r in range(rm))
    # The tile walk both GEMM kernels share (interpolated as text, so its braces stay single).
    walk = """  // Work-groups walk C in column groups of GEMM_JT panels: for each row block, JT consecutive
  // work-groups reuse its A rows from cache while the group's B panels stay in L2 (2x less memory
  // traffic than row-block order at N = 2048).
  const int Mb = (M + RM - 1) / RM, Nb = (N + 15) / 16;
""" + _TILE_WALK + """
  const int i0 = ib * RM, j0 = jb * 16;
  __global const float16* bp = (__global const float16*)(Bp + ((size_t)b * Nb + jb) * K * 16);"""
    conv = "\n".join(_conv_implicit_source(sw, decl, body, store) for sw in (1, 2))
    conv += "\n".join(_conv_unpadded_source(sw, nv) for sw in (1, 2) for nv in (1, 2))
    conv += _gemm_x2_source()
    conv += "\n".join(_conv_phases_source(nv) for nv in (1, 2))
    conv += "\n".join(_conv_row_pairs_source(sw) for sw in (1, 2))
    conv += _conv_flat_source()
    conv += "\n".join(_conv_lanes_source(r, sw) for r in CONV_LANES_POSITIONS for sw in (1, 2))
    conv += "\n".join(_conv_lanes_source(CONV_LANES_PAIR_OW, sw, CONV_LANES_POSITIONS[0] // CONV_LANES_PAIR_OW)
                       for sw in (1, 2))
    conv += "\n".join(_conv_lanes_source(CONV_LANES_POSITIONS[0], sw, 1, CONV_LANES_UNROLLED_KW) for sw in (1, 2))
    conv += "\n".join(_conv_lanes_source(CONV_LANES_PAIR_OW, sw, CONV_LANES_POSITIONS[0] // CONV_LANES_PAIR_OW,
                                          chunked=True) for sw in (1, 2))
    return ACTIVATION_HELPERS + f"""
#define RM {rm}
// An unaligned 16-float load: vload16 is an out-of-line call on PoCL; a pointer to this type gives
// one unaligned vector load (the alignment attribute lowers the type's alignment to a float's).
typedef float16 __attribute__((aligned(4))) float16u;
typedef float8 __attribute__((aligned(4))) float8u;
typedef float4 __attribute__((aligned(4))) float4u;
typedef float2 __attribute__((aligned(4))) float2u;
#define GEMM_JT {GEMM_JT}
// Packed panels: Ap[batch][M/RM][K][RM], Bp[batch][N/16][K][16], zero padded. One work-item packs
// one k of one panel (RM or 16 values), so index arithmetic is paid once per panel row.
__kernel void pack_a(__global float* Ap, __global const float* A, const int M, const int K, const int Mb,
                     const int rs, const int cs, const int src_bstride, const int total) {{
  const int g = get_global_id(0);
  if (g >= total) return;
  const int k = g % K; const int t = g / K;
  const int ib = t % Mb; const int b = t / Mb;
  __global const float* src = A + (size_t)b * src_bstride + (size_t)k * cs;
  __global float* dst = Ap + (size_t)g * RM;
  for (int r = 0; r < RM; ++r) {{
    const int i = ib * RM + r;
    dst[r] = i < M ? src[(size_t)i * rs] : 0.0f;
  }}
}}

__kernel void pack_b(__global float* Bp, __global const float* B, const int N, const int K, const int Nb,
                     const int rs, const int cs, const int src_bstride, const int total) {{
  const int g = get_global_id(0);
  if (g >= total) return;
  const int k = g % K; const int t = g / K;
  const int jb = t % Nb; const int b = t / Nb;
  __global const float* src = B + (size_t)b * src_bstride + (size_t)k * rs;
  __global float* dst = Bp + (size_t)g * 16;
  for (int c = 0; c < 16; ++c) {{
    const int j = jb * 16 + c;
    dst[c] = j < N ? src[(size_t)j * cs] : 0.0f;
  }}
}}

// bias_mode: 0 none, 1 per column, 2 per row, 3 full [M,N], 4 scalar. R: residual added (or NULL-like
// when has_res is 0, passed as a negative act). act/p0/p1: see apply_act.
inline float epilogue(float acc, int i, int j, int N, __global const float* bias, int bias_mode,
                      float alpha, float beta) {{
  float v = alpha * acc;
  if (bias_mode == 1) v += beta * bias[j];
  else if (bias_mode == 2) v += beta * bias[i];
  else if (bias_mode == 3) v += beta * bias[i * N + j];
  else if (bias_mode == 4) v += beta * bias[0];
  return v;
}}

// C and R rows are ldc apart (N, or more when C is a strided view such as a folded Transpose).
inline void store_row(__global float* C, __global const float* R, float8 a, float8 b, int i, int j0, int M,
                      int N, int ldc, __global const float* bias, int bias_mode, float alpha, float beta, int act,
                      float p0, float p1) {{
  if (i >= M) return;
  const int a_code0 = act & 15;
  if (j0 + 16 <= N && bias_mode != 3 && (a_code0 <= 1 || a_code0 == 7)) {{
    // Common case (full 16 columns, row/column/scalar bias, residual or not, none, Relu or Gelu):
    // whole float8 vectors; the per-element path below costs more than the dot products for small K.
    float8 va = alpha * a, vb = alpha * b;
    if (bias_mode == 1) {{ va += beta * vload8(0, bias + j0); vb += beta * vload8(1, bias + j0); }}
    else if (bias_mode == 2) {{ const float t = beta * bias[i]; va += t; vb += t; }}
    else if (bias_mode == 4) {{ const float t = beta * bias[0]; va += t; vb += t; }}
    if (act >= 16) {{
      __global const float* res = R + (size_t)i * ldc + j0;
      va += vload8(0, res);
      vb += vload8(1, res);
    }}
    if (a_code0 == 1) {{  // Relu as a mask (fmax is an out-of-line call on PoCL); NaN is kept
      va = as_float8(as_int8(va) & ~(va < (float8)(0.0f)));
      vb = as_float8(as_int8(vb) & ~(vb < (float8)(0.0f)));
    }} else if (a_code0 == 7) {{
      va = onnxhal_gelu8(va);
      vb = onnxhal_gelu8(vb);
    }}
    __global float* out = C + (size_t)i * ldc + j0;
    vstore8(va, 0, out);
    vstore8(vb, 1, out);
    return;
  }}
  float vals[16];
  vals[0] = a.s0; vals[1] = a.s1; vals[2] = a.s2; vals[3] = a.s3;
  vals[4] = a.s4; vals[5] = a.s5; vals[6] = a.s6; vals[7] = a.s7;
  vals[8] = b.s0; vals[9] = b.s1; vals[10] = b.s2; vals[11] = b.s3;
  vals[12] = b.s4; vals[13] = b.s5; vals[14] = b.s6; vals[15] = b.s7;
  const int n = min(16, N - j0);
  __global float* row = C + (size_t)i * ldc + j0;
  const int has_res = act >= 16;
  const int a_code = act & 15;
  for (int c = 0; c < n; ++c) {{
    float v = epilogue(vals[c], i, j0 + c, N, bias, bias_mode, alpha, beta);
    if (has_res) v += R[(size_t)i * ldc + j0 + c];
    row[c] = apply_act(v, a_code, p0, p1);
  }}
}}

// C[b] = alpha * A[b % a_mod] @ B[b] + beta * bias. One work-item: RM rows x 16 columns.
// act: activation code, plus 16 when the residual R (same layout as C) is added before it.
__kernel void gemm_packed(__global const float* Ap, __global const float* Bp, __global float* C,
                          __global const float* bias, __global const float* R, const int M, const int N,
                          const int K, const int a_mod, const int c_bstride, const int bias_bstride,
                          const int bias_mode, const float alpha, const float beta, const int act,
                          const float p0, const float p1, const int ldc) {{
{walk}
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  C += (size_t)b * c_bstride;
  R += (size_t)b * c_bstride;
  bias += (b % a_mod) * bias_bstride;
{decl}
  for (int k = 0; k < K; ++k) {{
    const float16 bv = bp[k];
{body}
    ap += RM;
  }}
{store}
}}

// The same with A read in place (rows lda apart, batch stride a_bstride, unit column stride): no pack_a
// pass for activations. Rows past M are clamped to row M-1 (computed, never stored).
__kernel void gemm_rowmajor_a(__global const float* A, __global const float* Bp, __global float* C,
                              __global const float* bias, __global const float* R, const int M, const int N,
                              const int K, const int a_mod, const int c_bstride, const int bias_bstride,
                              const int bias_mode, const float alpha, const float beta, const int act,
                              const float p0, const float p1, const int ldc, const int a_bstride,
                              const int lda) {{
{walk}
  A += (size_t)(b % a_mod) * a_bstride;
  C += (size_t)b * c_bstride;
  R += (size_t)b * c_bstride;
  bias += (b % a_mod) * bias_bstride;
{rows}
{decl}
  for (int k = 0; k < K; ++k) {{
    const float16 bv = bp[k];
{row_body}
  }}
{store}
}}

// Rule gemm_norm: gemm_rowmajor_a of one batch (C rows N apart) over whole rows, a work-item an RM-row
// block walking every column panel (as a work-group of gemm_rowmajor_a walks up to GEMM_JT), then a
// normalisation of each of its rows, read back from C as this work-item stored them (bias, residual and
// activation applied), into Y: norm 0 layernorm_rows' arithmetic (weight w, bias nb where has_nb), 1 and
// 2 rmsnorm_rows' (divide 0 and 1; weight w where has_w). The norm's launch folded into the GEMM's.
__kernel void gemm_rowmajor_a_norm(__global const float* A, __global const float* Bp, __global float* C,
                                   __global const float* bias, __global const float* R, const int M,
                                   const int N, const int K, const int bias_mode, const float alpha,
                                   const float beta, const int act, const float p0, const float p1, const int lda,
                                   __global float* Y, __global const float* w, __global const float* nb,
                                   const int has_nb, const float eps, const int norm, const int has_w) {{
  const int Mb = (M + RM - 1) / RM, Nb = (N + 15) / 16;
  const int ib = get_global_id(0);
  if (ib >= Mb) return;
  const int i0 = ib * RM, ldc = N;
{rows}
  for (int jb = 0; jb < Nb; ++jb) {{
    const int j0 = jb * 16;
    __global const float16* bp = (__global const float16*)(Bp + (size_t)jb * K * 16);
{decl}
    for (int k = 0; k < K; ++k) {{
      const float16 bv = bp[k];
{row_body}
    }}
{store}
  }}
  for (int r = 0; r < RM && i0 + r < M; ++r) {{
    __global const float* xp = C + (size_t)(i0 + r) * N;
    __global float* yp = Y + (size_t)(i0 + r) * N;
    if (norm == 0) {{
      float mean = 0.0f;
      for (int c = 0; c < N; ++c) mean += xp[c];
      mean /= (float)N;
      float var = 0.0f;
      for (int c = 0; c < N; ++c) {{ const float d = xp[c] - mean; var += d * d; }}
      const float inv = rsqrt(var / (float)N + eps);
      for (int c = 0; c < N; ++c) {{
        const float v = (xp[c] - mean) * inv * w[c];
        yp[c] = has_nb ? v + nb[c] : v;
      }}
    }} else {{
      float ss = 0.0f;
      for (int c = 0; c < N; ++c) {{ const float v = xp[c]; ss += v * v; }}
      const float s = sqrt(ss / (float)N + eps);
      const float inv = 1.0f / s;
      for (int c = 0; c < N; ++c) {{
        const float v = norm == 2 ? xp[c] / s : xp[c] * inv;
        yp[c] = has_w ? v * w[c] : v;
      }}
    }}
  }}
}}
{conv}
"""


def _conv_implicit_source(sw: int, decl: str, body: str, store: str) -> str:
    """``conv_implicit_s{sw}``: a convolution as the GEMM above with B read straight from the
    zero-padded input (no im2col workspace, 9x the input's bytes for a 3x3 kernel). One work-item
    computes RM output channels x 16 positions of one output row (a row's last panel is partly
    padding, computed and not stored). A holds the weights packed per (kh, kw, ci), so for each
    kernel tap the input pointer walks the channels with a fixed stride and no bounds checks: the
    padded input is wide enough for every lane (``gemm_lowering``). Stride 2 reads 32 floats and keeps
    the even ones."""
    if sw == 1:
        load = "const float16 bv = *(__global const float16u*)xp;"
    else:
        load = ("const float16 t0 = *(__global const float16u*)xp, t1 = *(__global const float16u*)(xp + 16); "
                "const float16 bv = (float16)(t0.even, t1.even);")
    store = store.replace("store_row(C, R,", "store_row(Crow, Rrow,").replace(", j0, M, N, ldc,", ", ow0, M, OW, P,")
    store = store.replace(", alpha, beta,", ", 1.0f, 1.0f,")
    return f"""
// Y[b] (b = image * G + group; M output channels per group, P = OH * OW) = A[b % a_mod] (*) Xp[b].
// Xp: Cg channels of Hp x Wp per b. bias: per output channel (bias_mode 2 or 0); act as gemm_packed.
__kernel void conv_implicit_s{sw}(__global const float* Ap, __global const float* Xp, __global float* C,
                               __global const float* bias, __global const float* R, const int M,
                               const int OH, const int OW, const int NPB, const int Cg, const int KH,
                               const int KW, const int sh, const int dh, const int dw, const int Hp,
                               const int Wp, const int a_mod, const int bias_mode, const int act,
                               const float p0, const float p1) {{
  const int K = Cg * KH * KW, P = OH * OW, HpWp = Hp * Wp;
  const int Mb = (M + RM - 1) / RM, Nb = OH * NPB;
{_TILE_WALK}
  const int i0 = ib * RM, oh = jb / NPB, ow0 = (jb % NPB) * 16;
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  __global const float* xb = Xp + (size_t)b * Cg * HpWp + (size_t)oh * sh * Wp + ow0 * {sw};
  __global float* Crow = C + (size_t)b * M * P + oh * OW;
  __global const float* Rrow = R + (size_t)b * M * P + oh * OW;
  bias += (b % a_mod) * M;
{decl}
  for (int kh = 0; kh < KH; ++kh) {{
    for (int kw = 0; kw < KW; ++kw) {{
      __global const float* xp = xb + kh * dh * Wp + kw * dw;
      for (int ci = 0; ci < Cg; ++ci, xp += HpWp) {{
        {load}
{body}
        ap += RM;
      }}
    }}
  }}
{store}
}}
"""


#: Fewest work-items a two-panel (GEMM) or 32-position (Conv) launch must keep: the wide tiles halve
#: the work-items, and below this a CPU device's threads get uneven shares or none (the corpus
#: models' 24 x 32 GEMMs would run 3 work-items instead of 6, and be slower).
WIDE_TILE_MIN_ITEMS = 32
#: Rule pool_rows: the shortest output row a MaxPool work-item computes whole. On PoCL the row kernel
#: ran at least as fast as one work-item per output from rows of 4 outputs up (benchmarks/opencl_pool.py).
POOL_ROWS_MIN_OW = 4
#: Column panels a two-panel GEMM work-item's launch walks together (``_gemm_x2_source``): the same
#: B footprint in cache as GEMM_JT single panels.
GEMM_JT_X2 = GEMM_JT // 2


def _gemm_x2_source() -> str:
    """``gemm_packed_x2`` and ``gemm_rowmajor_a_x2`` (rule ``gemm_wide_tile``): the GEMM kernels with a
    work-item computing RM rows x 32 columns, two adjacent 16-column B panels of the same packed layout
    sharing each broadcast of A (16 FMAs per 10 loads where one panel takes 8 per 9). A pair's second
    panel past the last one reads the last panel again (computed, never stored)."""
    rm = GEMM_RM
    decl = "\n".join(f"  float16 c{r}_{v} = (float16)(0.0f);" for r in range(rm) for v in range(2))
    store = "\n".join(f"  store_row(C, R, c{r}_{v}.lo, c{r}_{v}.hi, i0 + {r}, j0 + {16 * v}, M, N, ldc, bias, bias_mode, "
                      "alpha, beta, act, p0, p1);" for r in range(rm) for v in range(2))

    def body(a: str) -> str:
        return "\n".join(f"    {{ const float ar = {a.format(r=r)}; c{r}_0 += (float16)(ar) * b0; "
                         f"c{r}_1 += (float16)(ar) * b1; }}" for r in range(rm))

    rows = "\n".join(f"  __global const float* a{r} = A + (size_t)min(i0 + {r}, M - 1) * lda;" for r in range(rm))
    walk = """  const int Mb = (M + RM - 1) / RM, NbP = (N + 15) / 16, Nb = (NbP + 1) / 2;
""" + _TILE_WALK.replace("GEMM_JT", "GEMM_JT_X2") + """
  const int i0 = ib * RM, j0 = jb * 32;
  __global const float16* bp0 = (__global const float16*)(Bp + ((size_t)b * NbP + 2 * jb) * K * 16);
  __global const float16* bp1 = (__global const float16*)(Bp + ((size_t)b * NbP + min(2 * jb + 1, NbP - 1)) * K * 16);"""
    args = """__global const float* bias, __global const float* R, const int M, const int N,
                             const int K, const int a_mod, const int c_bstride, const int bias_bstride,
                             const int bias_mode, const float alpha, const float beta, const int act,
                             const float p0, const float p1, const int ldc"""
    return f"""
#define GEMM_JT_X2 {GEMM_JT_X2}
// gemm_packed with RM x 32 blocks (two B panels a work-item).
__kernel void gemm_packed_x2(__global const float* Ap, __global const float* Bp, __global float* C,
                             {args}) {{
{walk}
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  C += (size_t)b * c_bstride;
  R += (size_t)b * c_bstride;
  bias += (b % a_mod) * bias_bstride;
{decl}
  for (int k = 0; k < K; ++k) {{
    const float16 b0 = bp0[k], b1 = bp1[k];
{body("ap[{r}]")}
    ap += RM;
  }}
{store}
}}

// gemm_rowmajor_a with RM x 32 blocks.
__kernel void gemm_rowmajor_a_x2(__global const float* A, __global const float* Bp, __global float* C,
                                 {args}, const int a_bstride, const int lda) {{
{walk}
  A += (size_t)(b % a_mod) * a_bstride;
  C += (size_t)b * c_bstride;
  R += (size_t)b * c_bstride;
  bias += (b % a_mod) * bias_bstride;
{rows}
{decl}
  for (int k = 0; k < K; ++k) {{
    const float16 b0 = bp0[k], b1 = bp1[k];
{body("a{r}[k]")}
  }}
{store}
}}
"""


def _conv_row_pairs_source(sw: int) -> str:
    """``conv_rows2_s{sw}`` (rule ``conv_row_pairs``): the unpadded implicit-GEMM Conv for output rows
    of at most 8 (a ResNet's 7x7 last stage), two output rows a 16-lane vector (lanes 0-7 row oh,
    8-15 row oh + 1, each half one 8-lane load), where one row a vector would leave more than half
    the lanes idle and im2col would cost a launch and a workspace. Lanes outside the input read zero
    as in ``conv_unpadded``; a half whose row lies outside the input loads nothing."""
    rm = GEMM_RM
    decl = "\n".join(f"  float16 c{r} = (float16)(0.0f);" for r in range(rm))
    body = "\n".join(f"        c{r} += (float16)(ap[{r}]) * bv;" for r in range(rm))
    if sw == 1:
        def half(at: str) -> str:
            return f"*(__global const float8u*)({at})"
    else:
        def half(at: str) -> str:
            return f"(*(__global const float16u*)({at})).even"
    store = "\n".join(
        f"  store_row(Crow, Rrow, c{r}.lo, c{r}.lo, i0 + {r}, 0, M, OW, P, bias, bias_mode, 1.0f, 1.0f, act, p0, p1);\n"
        f"  if (two) store_row(Crow + OW, Rrow + OW, c{r}.hi, c{r}.hi, i0 + {r}, 0, M, OW, P, bias, bias_mode, 1.0f, "
        f"1.0f, act, p0, p1);" for r in range(rm))
    return f"""
// As conv_unpadded_s{sw} for OW <= 8, two output rows a work-item (see _conv_row_pairs_source).
__kernel void conv_rows2_s{sw}(__global const float* Ap, __global const float* X, __global float* C,
                            __global const float* bias, __global const float* R, const int M,
                            const int OH, const int OW, const int NPB, const int Cg, const int KH,
                            const int KW, const int sh, const int dh, const int dw, const int H,
                            const int W, const int ph, const int pw, const int a_mod, const int bias_mode,
                            const int act, const float p0, const float p1, const int xlen) {{
  const int K = Cg * KH * KW, P = OH * OW, HW = H * W;
  const int Mb = (M + RM - 1) / RM, Nb = (OH + 1) / 2;
{_TILE_WALK}
  const int i0 = ib * RM, oh = jb * 2, two = oh + 1 < OH;
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  const int xb = b * Cg * HW;
  __global float* Crow = C + (size_t)b * M * P + oh * OW;
  __global const float* Rrow = R + (size_t)b * M * P + oh * OW;
  bias += (b % a_mod) * M;
  const int8 lane = (int8)(0, 1, 2, 3, 4, 5, 6, 7) * {sw};
  const int lim = xlen - {8 * sw};  // a half's load starting at off stays inside X iff 0 <= off <= lim
{decl}
  for (int kh = 0; kh < KH; ++kh) {{
    const int y0 = oh * sh - ph + kh * dh, y1 = y0 + sh;
    const int in0 = y0 >= 0 && y0 < H, in1 = two && y1 >= 0 && y1 < H;
    if (!in0 && !in1) {{ ap += KW * Cg * RM; continue; }}
    for (int kw = 0; kw < KW; ++kw) {{
      const int x0 = kw * dw - pw;
      const int8 xs = lane + x0;
      const int8 mx = (xs >= 0) & (xs < W);
      const int8 m0 = in0 ? mx : (int8)(0), m1 = in1 ? mx : (int8)(0);
      int off0 = xb + y0 * W + x0, off1 = off0 + sh * W;
      // A row outside the input loads the other row's values (masked to zero): one branch-free loop
      // where every load of every channel stays inside X.
      const int l0 = in0 ? off0 : off1, l1 = in1 ? off1 : off0;
      if (min(l0, l1) >= 0 && max(l0, l1) + (Cg - 1) * HW <= lim) {{
        const int16 m = (int16)(m0, m1);
        __global const float* x0p = X + l0;
        __global const float* x1p = X + l1;
        for (int ci = 0; ci < Cg; ++ci, x0p += HW, x1p += HW) {{
          const float16 bv = as_float16(as_int16((float16)({half("x0p")}, {half("x1p")})) & m);
{body}
          ap += RM;
        }}
        continue;
      }}
      for (int ci = 0; ci < Cg; ++ci, off0 += HW, off1 += HW) {{
        float8 h0 = (float8)(0.0f), h1 = (float8)(0.0f);
        if (in0) {{
          if (off0 >= 0 && off0 <= lim) h0 = as_float8(as_int8({half("X + off0")}) & m0);
          else for (int j = 0; j < 8; ++j) if (x0 + j * {sw} >= 0 && x0 + j * {sw} < W) ((float*)&h0)[j] = X[off0 + j * {sw}];
        }}
        if (in1) {{
          if (off1 >= 0 && off1 <= lim) h1 = as_float8(as_int8({half("X + off1")}) & m1);
          else for (int j = 0; j < 8; ++j) if (x0 + j * {sw} >= 0 && x0 + j * {sw} < W) ((float*)&h1)[j] = X[off1 + j * {sw}];
        }}
        const float16 bv = (float16)(h0, h1);
{body}
        ap += RM;
      }}
    }}
  }}
{store}
}}
"""


#: Rule conv_flat: the most multiply-adds a Conv may take to run as ``conv_flat`` in place of
#: im2col + GEMM (two launches; with rule conv_siblings, both Convs' together). Its lanes gather their inputs one by one, once per 8-channel block,
#: where im2col gathers each once and the GEMM loads whole vectors: it pays where a launch costs more
#: than the gathers (PoCL: 10-15 us a launch on 2 cores; docs/opencl-internals.md has the figures).
CONV_FLAT_MAX_MACS = 4_000_000


def _conv_flat_source() -> str:
    """``conv_flat`` (rule ``conv_flat``): an implicit-GEMM Conv whose 16 lanes are 16 consecutive
    positions of the flattened output plane (oh * OW + ow), so rows of any width (a small plane's rows
    of 4) fill the vector, at any stride and dilation. Each lane gathers its input per (tap, channel)
    with its own offset, masked to zero outside the input (a masked lane's offset is 0, so no read
    leaves the image). Rule ``conv_siblings``: the packed weights may hold a second Conv of the same
    input after the first's ``Mb1`` channel blocks (its taps placed in the first's kernel grid); the
    work-items of those blocks store to ``C2`` with the second's bias and activation."""
    rm = GEMM_RM
    decl = "\n".join(f"  float16 c{r} = (float16)(0.0f);" for r in range(rm))
    gather = "(float16)(" + ", ".join(f"xp[off.s{i:x}]" for i in range(16)) + ")"
    body = "\n".join(f"          c{r} += (float16)(ap[{r}]) * bv;" for r in range(rm))
    store = "\n".join(f"  store_row(C, R, c{r}.lo, c{r}.hi, i0 + {r}, j0, M, P, P, bias, bias_mode, 1.0f, 1.0f, act, p0, "
                      "p1);" for r in range(rm))
    return f"""
// A Conv with 16 consecutive flattened output positions a work-item (see _conv_flat_source). The
// channel blocks from Mb1 on are a sibling Conv's M2 channels (C2, bias2, act2, q0, q1); M2 0: none.
__kernel void conv_flat(__global const float* Ap, __global const float* X, __global float* C,
                        __global const float* bias, __global const float* R, const int M1, const int OH,
                        const int OW, const int Cg, const int KH, const int KW, const int sh, const int sw,
                        const int dh, const int dw, const int H, const int W, const int ph, const int pw,
                        const int a_mod, const int bias_mode1, const int act1, const float p01, const float p11,
                        __global float* C2, __global const float* bias2, const int M2, const int bias_mode2,
                        const int act2, const float q0, const float q1) {{
  const int K = Cg * KH * KW, P = OH * OW, HW = H * W;
  const int Mb1 = (M1 + RM - 1) / RM, Mb = Mb1 + (M2 + RM - 1) / RM, Nb = (P + 15) / 16;
{_TILE_WALK}
  const int second = ib >= Mb1;
  const int i0 = (second ? ib - Mb1 : ib) * RM, j0 = jb * 16;
  const int M = second ? M2 : M1, bias_mode = second ? bias_mode2 : bias_mode1, act = second ? act2 : act1;
  const float p0 = second ? q0 : p01, p1 = second ? q1 : p11;
  if (second) {{ C = C2; bias = bias2; }}
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  __global const float* xb = X + (size_t)b * Cg * HW;
  C += (size_t)b * M * P;
  R += (size_t)b * M * P;
  bias += (b % a_mod) * M;
  const int16 p = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) + j0;
  const int16 oy = p / OW, ox = p - oy * OW;
  const int16 iy = oy * sh - ph, ix = ox * sw - pw, live = p < P;
{decl}
  for (int kh = 0; kh < KH; ++kh) {{
    const int16 y = iy + kh * dh;
    const int16 my = live & (y >= 0) & (y < H);
    if (!any(my)) {{ ap += KW * Cg * RM; continue; }}
    for (int kw = 0; kw < KW; ++kw) {{
      const int16 x = ix + kw * dw;
      const int16 m = my & (x >= 0) & (x < W);
      const int16 off = select((int16)(0), y * W + x, m);
      __global const float* xp = xb;
      for (int ci = 0; ci < Cg; ++ci, xp += HW) {{
        const float16 bv = as_float16(as_int16({gather}) & m);
{body}
        ap += RM;
      }}
    }}
  }}
{store}
}}
"""


#: Rule conv_lanes: output channels a work-item computes, as CONV_LANES_NV 16-lane vectors.
CONV_LANES_NV = 2
CONV_LANES_CHANNELS = 16 * CONV_LANES_NV
#: Rule conv_lanes: output positions (of one output row) a work-item computes: 14 positions x 2
#: vectors (28 accumulators) is the most AVX-512's 32 registers hold with the two weight vectors and
#: one broadcast. Seven positions (rows of 7) ran slower than conv_rows2 on PoCL (14 FMAs per 9 loads).
CONV_LANES_POSITIONS = (14,)
#: Rule conv_lanes_row_pairs: output rows this short take CONV_LANES_POSITIONS[0] // OW rows a
#: work-item (a ResNet's 7x7 last stage: two rows of 7, the same 28 FMAs per 16 loads as rows of 14).
CONV_LANES_PAIR_OW = 7
#: Rule conv_lanes: the widest output rows it takes (multiples of CONV_LANES_POSITIONS up to this,
#: a 224-pixel ResNet's 112 to 14; wider rows were not measured). On PoCL
#: (benchmarks/opencl_conv_layers.py) it ran the Convs of ResNet-18 from 56 down to 14 faster than
#: the row-vector kernels, its zero-padded copy of the input included.
CONV_LANES_MAX_OW = 112
#: Rule conv_lanes_k3: the kernel-row width whose conv_lanes kernels have their tap loop unrolled at
#: compile time (``_k3``). On PoCL a 3x3 layer of 64 channels at 56x56 (process CPU time, best of 60
#: runs, three sessions, load 7.2) took 1.38-1.51 ms unrolled against 1.58-1.69 with KW an argument.
#: Rows of 7 (conv_lanes_row_pairs, two loops of 28 and 14 accumulators) keep the loop: unrolled,
#: the 7x7 stage's 3x3 Convs ran 2-4x as long in the CNN in one session (PoCL profiling events; not
#: investigated further).
CONV_LANES_UNROLLED_KW = 3
#: Rule conv_lanes_weight_chunks: the most weight bytes of one channel block a chunk of input channels
#: holds (for 3x3 taps 14 input channels of 1152 bytes): a third of a 48 KiB L1 data cache, so that the
#: chunk's weights, its input rows and the tiles' accumulators stay in L1 while the work-item runs
#: the chunk over every row tile. In the CNN on PoCL the 7x7 stage's Convs took about as long with
#: 8, 16, 32 and 64 KiB chunks.
CONV_LANES_CHUNK_BYTES = 16384
#: Rule conv_lanes_weight_chunks: the fewest work-items (channel blocks x images x groups) a layer keeps
#: with it (a work-item takes a whole channel block): 512 channels give 16.
CONV_LANES_CHUNK_MIN_ITEMS = 8
#: Rule conv_lanes: the fewest input channels per group it takes. ResNet-18's 7x7 stem (3 channels)
#: ran slower in the whole model with the rule than with the row-vector kernel (PoCL profiling
#: events: 3.5-3.6 ms against 3.0-3.3), where its other Convs (64 channels and up) ran faster.
CONV_LANES_MIN_CG = 8


#: The conv_lanes kernels' inline helpers: in the fixed GEMM program once (with conv_lanes_r14_s1), and
#: in each rule conv_lanes_downsample program.
_LANES_HELPERS = """
// The epilogue of store_row for 16 output channels (lanes) of one position: bias per channel, the
// residual r (conv_lanes_residual: 16 lanes a plane apart), the activation (Relu as a mask, others
// lane by lane), then one store a lane, the channels a plane (P floats) apart. Crow/Rrow point at
// the position in channel co0's plane; the launch guarantees 16 channels from co0. Lanes are named
// one by one: vstore16 into a private array would be an out-of-line call on PoCL.
inline float16 conv_lanes_residual(__global const float* Rrow, const int P, const int act) {
  if (act < 16) return (float16)(0.0f);
  return (float16)(Rrow[0 * P], Rrow[1 * P], Rrow[2 * P], Rrow[3 * P], Rrow[4 * P], Rrow[5 * P], Rrow[6 * P], Rrow[7 * P], Rrow[8 * P], Rrow[9 * P], Rrow[10 * P], Rrow[11 * P], Rrow[12 * P], Rrow[13 * P], Rrow[14 * P], Rrow[15 * P]);
}

// The activation of 16 lanes: Relu as a mask, the others lane by lane (the conv_lanes epilogues').
inline float16 conv_lanes_act(float16 v, const int a, const float p0, const float p1) {
  if (a == 1) return as_float16(as_int16(v) & ~(v < (float16)(0.0f)));
  if (a != 0) {
    float* lanes = (float*)&v;
    for (int l = 0; l < 16; ++l) lanes[l] = apply_act(lanes[l], a, p0, p1);
  }
  return v;
}

// Rule conv_lanes_row_stores: the epilogue of conv_lanes_store for one output channel's run of n (14 or
// 7) consecutive positions (lanes 0..n-1 of v, the tile transposed): bias, residual, activation as
// there, the run read and written as 8 + 4 + 2 (or 4 + 2 + 1) floats where the lanes took one store each.
inline void conv_lanes_store_run(float16 v, __global float* Crow, __global const float* Rrow,
                                 __global const float* bias, const int co, const int bias_mode,
                                 const int act, const float p0, const float p1, const int n) {
  if (bias_mode == 2) v += (float16)(bias[co]);
  if (act >= 16) {
    if (n == 14) {
      v += (float16)(*(__global const float8u*)Rrow, *(__global const float4u*)(Rrow + 8),
                     *(__global const float2u*)(Rrow + 12), 0.0f, 0.0f);
    } else {
      v += (float16)(*(__global const float4u*)Rrow, *(__global const float2u*)(Rrow + 4), Rrow[6], 0.0f,
                     (float8)(0.0f));
    }
  }
  v = conv_lanes_act(v, act & 15, p0, p1);
  if (n == 14) {
    *(__global float8u*)Crow = v.lo;
    *(__global float4u*)(Crow + 8) = v.s89ab;
    *(__global float2u*)(Crow + 12) = v.scd;
  } else {
    *(__global float4u*)Crow = v.s0123;
    *(__global float2u*)(Crow + 4) = v.s45;
    Crow[6] = v.s6;
  }
}

// Two-source lane shuffle with constant indices: clang's builtin (one permute instruction on PoCL),
// OpenCL's shuffle2 elsewhere.
#ifdef __clang__
#define LANES_SHUFFLE2(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define LANES_SHUFFLE2(a, b, ...) shuffle2(a, b, (uint16)(__VA_ARGS__))
#endif

// A prefetch of the line at p (a hint: no fault, no effect on results) where the device is the host
// CPU (PoCL and other clang-based CPU drivers: global memory is the process's, so the address is
// one); nothing elsewhere.
#if defined(__clang__) && (defined(__x86_64__) || defined(__aarch64__))
#define LANES_PREFETCH(p) __builtin_prefetch((const void*)(size_t)(p), 0, 3)
#else
#define LANES_PREFETCH(p)
#endif

inline void conv_lanes_store(float16 v, const float16 r, __global float* Crow,
                             __global const float* bias, const int co0, const int P, const int bias_mode,
                             const int act, const float p0, const float p1) {
  if (bias_mode == 2) v += *(__global const float16u*)(bias + co0);
  if (act >= 16) v += r;
  v = conv_lanes_act(v, act & 15, p0, p1);
  Crow[0 * P] = v.s0;
  Crow[1 * P] = v.s1;
  Crow[2 * P] = v.s2;
  Crow[3 * P] = v.s3;
  Crow[4 * P] = v.s4;
  Crow[5 * P] = v.s5;
  Crow[6 * P] = v.s6;
  Crow[7 * P] = v.s7;
  Crow[8 * P] = v.s8;
  Crow[9 * P] = v.s9;
  Crow[10 * P] = v.sa;
  Crow[11 * P] = v.sb;
  Crow[12 * P] = v.sc;
  Crow[13 * P] = v.sd;
  Crow[14 * P] = v.se;
  Crow[15 * P] = v.sf;
}
"""


def _conv_lanes_source(rp: int, sw: int, nr: int = 1, kw: int = 0, chunked: bool = False, ds: int = 0) -> str:
    """``conv_lanes_r{rp}_s{sw}`` (rule ``conv_lanes``): a Conv with the output channels in the vector lanes.
    One work-item computes CONV_LANES_CHANNELS output channels (CONV_LANES_NV 16-lane accumulators a
    position) x ``rp`` consecutive positions of one output row, reading the zero-padded input planes
    of ``pad_planes`` (no bounds checks: reading the input in place with a check per position ran
    1.5x slower, a row of 14 or 28 being edge tiles only). Per (channel, tap) it loads the weight
    vectors (packed at specialisation as [group][channel block][ci][kh][kw][CONV_LANES_CHANNELS], so
    the loads are aligned and walk memory in order) and broadcasts each of the ``rp`` input values
    once to all of them: 2 x ``rp`` FMAs per 2 + ``rp`` loads, every input value read as a scalar, so
    stride 2 takes the same code as stride 1. The horizontal stride ``sw`` is a constant of the kernel:
    as an argument, each position's load needed its own address arithmetic and the kernel ran about a
    quarter slower. The row-vector kernels (``conv_unpadded``) instead load a
    16-position input vector per (channel, tap) and broadcast 8 weights (8 FMAs per 9 loads), with
    two loads and a shuffle a vector at stride 2 and lanes idle or masked in rows of 14. Each
    position's accumulators are stored lane by lane (output channels are a plane apart) with the
    epilogue of ``store_row``.

    ``nr`` > 1 (``conv_lanes_r{rp}x{nr}_s{sw}``, rule ``conv_lanes_row_pairs``, rows of ``rp`` == OW):
    a work-item computes ``nr`` whole output rows, ``rp`` positions each, so rows of 7 keep the
    14-position tile; each row reads its own input row through a pointer set once, and the last tile
    of an odd row count runs a loop over its first row alone (its second row's accumulators stay
    zero and are not stored).

    ``kw`` > 0 (``..._k{kw}``, rule ``conv_lanes_k3``): the same kernel for kernel rows of exactly
    ``kw`` taps, its tap loop unrolled at compile time (the KW argument is then that number).

    ``chunked`` (``conv_lanes_r7x2_s{sw}_wc``, rule ``conv_lanes_weight_chunks``, row pairs only): a
    work-item computes one channel block over every row tile, input channels ``chunk`` at a time
    (an argument: as many as keep a chunk's weights within CONV_LANES_CHUNK_BYTES). For each chunk it
    runs every tile, taking the tile's accumulators from its slice of the scratch buffer ``S``
    (28 vectors a tile, 64-byte aligned) and putting them back there, or through the epilogue after
    the last chunk: the chunk's weights are read from memory once and from L1 for the other tiles,
    where the one-tile kernel streams a block's weights (590 KB at 512 channels) once per tile. Each
    accumulator sums the same products in the same order as the one-tile kernel.

    The output's and the residual's layouts are arguments of every form (``PC``, ``OWC``, ``coff`` and
    ``RP``, ``ROW``, ``roff``: plane stride, row stride, offset): rule ``conv_lanes_padded_output`` has
    a Conv write the interior of a later Conv's zero-padded planes in place of that Conv's
    ``pad_planes`` copy, and the value's residual readers read it there. A row-pair tile stores its
    two rows as one run of 14 where they are consecutive (the plain layout), else as a run of 7 each.

    ``ds`` > 0 (``..._ds{ds}``, rule ``conv_lanes_downsample``; programs of their own,
    ``conv_lanes_downsample_source``): the launch also computes a 1x1 Conv of horizontal stride ``ds``
    (arguments W2, X2, Cg2, sh2, Hp2, Wp2, x2off: its packed weights, input planes and their geometry)
    into the same accumulators after the tap loops, in place of reading that Conv's output as the
    residual (a ResNet stage's downsample)."""
    nv = CONV_LANES_NV
    decl = "\n".join(f"  float16 c{p}_{v} = (float16)(0.0f);" for p in range(rp * nr) for v in range(nv))
    loads = "\n".join(f"        const float16 w{v} = wp[{v}];" for v in range(nv))
    rows = "".join(f"        __global const float* xr{r} = xr + roff{r};\n" for r in range(1, nr))

    def src(p: int) -> str:
        r, q = divmod(p, rp)
        return f"xr{r if r else ''}[{q * sw}]"

    unroll, taps = ('_Pragma("unroll") ', str(kw)) if kw else ("", "KW")

    cis = ("c0", "c1") if chunked else ("0", "Cg")
    # A chunk's first tile reads its weights from memory: ask for them 2 KB (16 taps) ahead.
    pf = "        LANES_PREFETCH(wp + 32);\n" if chunked else ""

    def loop(positions: int, rows: str) -> str:
        body = "\n".join(f"        {{ const float xv = {src(p)}; "
                         + " ".join(f"c{p}_{v} += (float16)(xv) * w{v};" for v in range(nv)) + " }"
                         for p in range(positions))
        return f"""  for (int ci = {cis[0]}; ci < {cis[1]}; ++ci) {{
    for (int kh = 0; kh < KH; ++kh) {{
      __global const float* xrow = xb + ((size_t)ci * Hp + kh * dh) * Wp;
      {unroll}for (int kw = 0; kw < {taps}; ++kw) {{
        __global const float* xr = xrow + kw * dw;
{rows}{loads}
{pf}{body}
        wp += {nv};
      }}
    }}
  }}"""

    def ds_loop(positions: int) -> str:
        # Rule conv_lanes_downsample: the 1x1 Conv's channels, one weight load a channel (no taps).
        body = "\n".join(f"      {{ const float xv = xq{p // rp if p >= rp else ''}[{(p % rp) * ds}]; "
                         + " ".join(f"c{p}_{v} += (float16)(xv) * w{v};" for v in range(nv)) + " }"
                         for p in range(positions))
        second = "".join(f"    __global const float* xq{r} = xq + {r} * sh2 * Wp2;\n" for r in range(1, nr))
        return f"""  for (int ci = {cis[0]}; ci < {cis[1]}; ++ci) {{
    __global const float* xq = x2b + (size_t)ci * Hp2 * Wp2;
{second}""" + "\n".join(f"    const float16 w{v} = wq[{v}];" for v in range(nv)) + f"""
{body}
    wq += {nv};
  }}"""

    if nr == 1:
        loops = loop(rp, "")
    else:
        # The last tile of an odd row count computes its one row only (an eighth of a 7x7 stage's work).
        assert nr == 2, nr
        loops = (f"  if (oh + 1 < OH) {{\n{loop(rp * nr, rows)}\n  }} else {{\n{loop(rp, '')}\n  }}")
    if ds:
        cis = ("0", "Cg2")
        ds_pointers = (f"  __global const float16* wq = (__global const float16*)(W2 + (size_t)ib * Cg2 * {16 * nv});\n"
                       f"  __global const float* x2b = X2 + x2off + (size_t)b * Cg2 * Hp2 * Wp2 + (size_t)oh * sh2 * Wp2"
                       f" + ow0 * {ds};\n")
        # A chunked kernel adds the 1x1 Conv with its last chunk of input channels.
        loops += ("\n  if (c1 >= Cg) {\n" if chunked else "\n  {\n") + ds_pointers
        loops += (ds_loop(rp) if nr == 1 else
                  f"  if (oh + 1 < OH) {{\n{ds_loop(rp * nr)}\n  }} else {{\n{ds_loop(rp)}\n  }}") + "\n  }"
    # With nr > 1 the tile is whole rows of OW == rp, so position p of the tile is p floats after Crow.
    # A position's residual lanes are all read before its stores: at 56x56 the output and residual
    # planes 16 channels apart lie a multiple of 4 KiB apart, and a load issued after a store to an
    # address with the same low 12 bits waits on it (4K aliasing).
    def store_position(p: int) -> str:
        r, q = divmod(p, rp)  # row r of the tile (rows OWC apart in C, ROW in R), position q
        at_c, at_r = (f"{r} * OWC + {q}", f"{r} * ROW + {q}") if r else (str(q), str(q))
        res = " ".join(f"const float16 r{v} = conv_lanes_residual(Rrow + {at_r} + {16 * v} * RP, RP, act);"
                       for v in range(nv))
        stores = " ".join(f"conv_lanes_store(c{p}_{v}, r{v}, Crow + {at_c} + {16 * v} * PC, bias, co0 + {16 * v}, "
                          f"PC, bias_mode, act, p0, p1);" for v in range(nv))
        return "  " + ("" if p < rp else f"if (oh + {p // rp} < OH) ") + f"{{ {res}\n    {stores} }}"

    store = ("  if (rows) {\n" + _lanes_row_stores(rp, nr, nv) + "\n  } else {\n"
             + "\n".join(store_position(p) for p in range(rp * nr)) + "\n  }")
    name = ((f"conv_lanes_r{rp}_s{sw}" if nr == 1 else f"conv_lanes_r{rp}x{nr}_s{sw}") + (f"_k{kw}" if kw else "")
            + ("_wc" if chunked else "") + (f"_ds{ds}" if ds else ""))
    if nr == 1:
        tile = f"""  const int nt = OW / {rp};
  const int ib = wmajor ? gid / (OH * nt) : gid % Mb, t = wmajor ? gid % (OH * nt) : gid / Mb;
  const int oh = t / nt, ow0 = (t % nt) * {rp};
  if (oh >= OH) return;"""
    else:
        tile = f"""  const int nt = (OH + {nr - 1}) / {nr};
  const int ib = wmajor ? gid / nt : gid % Mb, t = wmajor ? gid % nt : gid / Mb;
  const int oh = t * {nr}, ow0 = 0;
  if (oh >= OH) return;
""" + "".join(f"  const int roff{r} = {r} * sh * Wp;\n" for r in range(1, nr))
    helper = _LANES_HELPERS if (rp, sw, kw, ds) == (CONV_LANES_POSITIONS[0], 1, 0, 0) else ""
    ds_args = (",\n                             __global const float* W2, __global const float* X2, const int Cg2, "
               "const int sh2, const int Hp2, const int Wp2, const int x2off" if ds else "")
    if chunked:
        return helper + _conv_lanes_chunked_kernel(name, rp, sw, nr, nv, decl, loops, store, ds_args)
    return helper + f"""
// Y[b] (b = image * G + group; M output channels per group, P = OH * OW) = A[b % a_mod] (*) Xp[b], the
// output channels in the lanes (see _conv_lanes_source). Xp: Cg zero-padded planes of Hp x Wp per b,
// from offset xoff (a 1x1 Conv reading the interior of another Conv's padded planes);
// OW a multiple of {rp}, M of {16 * nv}. bias: per output channel (bias_mode 2 or 0); act as gemm_packed.
// C's planes are PC floats apart, its rows OWC, from offset coff, R's RP, ROW, roff (P, OW, 0 for the
// plain layout; rule conv_lanes_padded_output: the interior of a later Conv's zero-padded planes).
__kernel void {name}(__global const float* Wt, __global const float* Xp, __global float* C,
                                __global const float* bias, __global const float* R, const int M,
                                const int OH, const int OW, const int Cg, const int KH, const int KW,
                                const int sh, const int dh, const int dw, const int Hp,
                             const int Wp, const int xoff, const int a_mod, const int bias_mode, const int act,
                             const float p0, const float p1, const int rows, const int wmajor,
                             const int PC, const int OWC, const int coff, const int RP, const int ROW,
                             const int roff{ds_args}) {{
  const int P = OH * OW, Mb = M / {16 * nv};
  const int gid = get_global_id(0), b = get_global_id(1);
  // Consecutive work-items take the channel blocks of one row tile (its input rows stay in cache),
  // or with wmajor (rule conv_lanes_weight_order) the row tiles of one channel block (its weights do).
{tile}
  const int co0 = ib * {16 * nv};
  __global const float16* wp = (__global const float16*)(Wt + ((size_t)(b % a_mod) * Mb + ib) * Cg * KH * KW
                                                         * {16 * nv});
  __global const float* xb = Xp + xoff + (size_t)b * Cg * Hp * Wp + (size_t)oh * sh * Wp + ow0 * {sw};
  __global float* Crow = C + coff + ((size_t)b * M + co0) * PC + oh * OWC + ow0;
  __global const float* Rrow = R + roff + ((size_t)b * M + co0) * RP + oh * ROW + ow0;
  bias += (b % a_mod) * M;
{decl}
{loops}
{store}
}}
"""


@functools.cache
def conv_lanes_downsample_source(kernel: str, ds: int) -> str:
    """Rule conv_lanes_downsample: the program of ``{kernel}_ds{ds}``, the conv_lanes kernel ``kernel``
    (``conv_lanes_r14_s1_k3``, ``conv_lanes_r7x2_s1_wc``, ...) that also computes a 1x1 Conv of
    horizontal stride ``ds`` (``_conv_lanes_source``). A program of its own, built only for plans
    that use it, so the fixed GEMM program (every plan's) takes no longer to build."""
    m = re.fullmatch(r"conv_lanes_r(\d+)(?:x(\d+))?_s([12])(?:_k(\d+))?(_wc)?", kernel)
    if m is None or ds not in (1, 2):
        raise ValueError(f"conv_lanes_downsample_source: no conv_lanes kernel {kernel!r} with a 1x1 of stride {ds}")
    rp, nr, sw, kw, wc = int(m[1]), int(m[2] or 1), int(m[3]), int(m[4] or 0), bool(m[5])
    return (ACTIVATION_HELPERS + """
typedef float16 __attribute__((aligned(4))) float16u;
typedef float8 __attribute__((aligned(4))) float8u;
typedef float4 __attribute__((aligned(4))) float4u;
typedef float2 __attribute__((aligned(4))) float2u;
""" + _LANES_HELPERS + _conv_lanes_source(rp, sw, nr, kw, wc, ds))


def _lanes_row_stores(rp: int, nr: int, nv: int) -> str:
    """Rule ``conv_lanes_row_stores``: the stores of a conv_lanes tile (``rp * nr`` positions, 14, x
    ``nv`` 16-channel accumulators) with each 16-channel group transposed in registers (4 rounds of 16
    two-source shuffles swapping off-diagonal blocks of 8, 4, 2, 1 lanes; positions 14 and 15 zero), so
    each channel's 14 positions, consecutive in its output plane (a row of 14, or two rows of 7), go out
    through ``conv_lanes_store_run``: 3 vector stores a channel where the lanes took 14 scalar ones."""
    n = rp * nr
    assert n <= 16, n
    count = "14" if nr == 1 else "(oh + 1 < OH ? 14 : 7)"
    out = [f"    const int run = {count};"]
    if nr > 1:  # the two rows one run where they are consecutive (the plain layout), else a run each
        out.append(f"    const int whole = OWC == {rp} && ROW == {rp};")
    for v in range(nv):
        t = [f"c{p}_{v}" if p < n else "(float16)(0.0f)" for p in range(16)]
        lines = ["    { float16 " + ", ".join(f"t{i} = {t[i]}" for i in range(16)) + ";"]
        for h in (8, 4, 2, 1):
            for i in range(16):
                if i & h:
                    continue
                lo = ", ".join(str(k if not k & h else 16 + k - h) for k in range(16))
                hi = ", ".join(str(k + h if not k & h else 16 + k) for k in range(16))
                lines.append(f"      {{ const float16 a = LANES_SHUFFLE2(t{i}, t{i + h}, {lo}), "
                             f"b = LANES_SHUFFLE2(t{i}, t{i + h}, {hi}); t{i} = a; t{i + h} = b; }}")
        if nr == 1:
            lines += [f"      conv_lanes_store_run(t{c}, Crow + {16 * v + c} * PC, Rrow + {16 * v + c} * RP, bias, "
                      f"co0 + {16 * v + c}, bias_mode, act, p0, p1, run);" for c in range(16)]
        else:
            second = ", ".join(str(min(rp + k, 15)) for k in range(16))  # lanes rp.. down to 0..
            for c in range(16):
                ch = 16 * v + c
                lines.append(
                    f"      if (whole) conv_lanes_store_run(t{c}, Crow + {ch} * PC, Rrow + {ch} * RP, bias, co0 + {ch}, "
                    f"bias_mode, act, p0, p1, run);\n"
                    f"      else {{ conv_lanes_store_run(t{c}, Crow + {ch} * PC, Rrow + {ch} * RP, bias, co0 + {ch}, "
                    f"bias_mode, act, p0, p1, {rp}); if (run > {rp}) conv_lanes_store_run(LANES_SHUFFLE2(t{c}, t{c}, "
                    f"{second}), Crow + {ch} * PC + OWC, Rrow + {ch} * RP + ROW, bias, co0 + {ch}, bias_mode, act, p0, "
                    f"p1, {rp}); }}")
        out.append("\n".join(lines) + " }")
    return "\n".join(out)


def _conv_lanes_chunked_kernel(name: str, rp: int, sw: int, nr: int, nv: int, decl: str, loops: str,
                               store: str, ds_args: str = "") -> str:
    """The kernel text of ``_conv_lanes_source(..., chunked=True)`` from its parts (the tile's
    declarations, tap loops over ``ci`` in [c0, c1) and epilogue stores)."""
    acc = [f"c{p}_{v}" for p in range(rp * nr) for v in range(nv)]
    load = "\n".join(f"      {a} = st[{i}];" for i, a in enumerate(acc))
    keep = "\n".join(f"      st[{i}] = {a};" for i, a in enumerate(acc))
    return f"""
// As conv_lanes_r{rp}x{nr}_s{sw} (see _conv_lanes_source, chunked): a work-item computes channel block
// get_global_id(0) over every row tile, input channels chunk at a time, the tiles' accumulators kept in S
// between chunks ({len(acc)} float16 a tile, per work-item).
__kernel void {name}(__global const float* Wt, __global const float* Xp, __global float* C,
                                __global const float* bias, __global const float* R, const int M,
                                const int OH, const int OW, const int Cg, const int KH, const int KW,
                                const int sh, const int dh, const int dw, const int Hp,
                             const int Wp, const int xoff, const int a_mod, const int bias_mode, const int act,
                             const float p0, const float p1, const int rows, const int chunk,
                             __global float* S, const int PC, const int OWC, const int coff, const int RP,
                             const int ROW, const int roff{ds_args}) {{
  const int P = OH * OW, Mb = M / {16 * nv};
  const int ib = get_global_id(0), b = get_global_id(1);
  const int nt = (OH + {nr - 1}) / {nr}, ow0 = 0;
  const int co0 = ib * {16 * nv};
""" + "".join(f"  const int roff{r} = {r} * sh * Wp;\n" for r in range(1, nr)) + f"""  __global const float16* w0 = (__global const float16*)(Wt + ((size_t)(b % a_mod) * Mb + ib) * Cg * KH * KW
                                                         * {16 * nv});
  __global float16* S0 = (__global float16*)S + ((size_t)b * Mb + ib) * nt * {len(acc)};
  bias += (b % a_mod) * M;
  for (int c0 = 0; c0 < Cg; c0 += chunk) {{
    const int c1 = min(c0 + chunk, Cg);
    for (int t = 0; t < nt; ++t) {{
      const int oh = t * {nr};
      __global float16* st = S0 + t * {len(acc)};
      __global const float16* wp = w0 + (size_t)c0 * KH * KW * {nv};
      __global const float* xb = Xp + xoff + (size_t)b * Cg * Hp * Wp + (size_t)oh * sh * Wp + ow0 * {sw};
{decl}
      if (c0 > 0) {{
{load}
      }}
{loops}
      if (c1 < Cg) {{
{keep}
      }} else {{
      __global float* Crow = C + coff + ((size_t)b * M + co0) * PC + oh * OWC + ow0;
      __global const float* Rrow = R + roff + ((size_t)b * M + co0) * RP + oh * ROW + ow0;
{store}
      }}
    }}
  }}
}}
"""


def _conv_unpadded_source(sw: int, nv: int) -> str:
    """``conv_unpadded_s{sw}`` (``nv`` 1) and ``conv_unpadded_s{sw}_x2`` (``nv`` 2): ``conv_implicit``
    reading the unpadded input in place (rule ``conv_pad``: no ``pad_planes`` copy, no launch for it).
    A work-item computes RM output channels x 16 * nv positions of one output row (``nv`` 2, rule
    ``conv_wide_tile``: two 16-lane vectors share each weight broadcast, 16 FMAs per 10 loads where one
    vector takes 8 per 9). Per kernel tap, a row outside the input is skipped; a tap whose lanes all lie
    inside the input row loads whole vectors; at the edges each load keeps the lanes inside the row
    with a mask (lanes outside read zero), and a load that would leave the buffer (first and last
    rows of X only) gathers the lanes one by one."""
    width = 16 * nv
    kernel = f"conv_unpadded_s{sw}" + ("_x2" if nv == 2 else "")

    def load(v: int, masked: bool) -> str:
        at = f"X + off + {16 * sw * v}"
        if sw == 1:
            text = f"float16 bv{v} = *(__global const float16u*)({at});"
        else:
            text = (f"const float16 t{v}a = *(__global const float16u*)({at}), "
                    f"t{v}b = *(__global const float16u*)({at} + 16); float16 bv{v} = (float16)(t{v}a.even, t{v}b.even);")
        if masked:
            text += f" bv{v} = as_float16(as_int16(bv{v}) & m{v});"
        return text

    decl = "\n".join(f"  float16 c{r}_{v} = (float16)(0.0f);" for r in range(GEMM_RM) for v in range(nv))
    body = "\n".join(f"        {{ const float ar = ap[{r}]; " + " ".join(f"c{r}_{v} += (float16)(ar) * bv{v};"
                                                                 for v in range(nv)) + " }" for r in range(GEMM_RM))
    full = "\n".join("          " + load(v, False) for v in range(nv))
    masked = "\n".join("            " + load(v, True) for v in range(nv))
    masks = "\n".join(f"      const int16 xs{v} = lane + (x0 + {16 * sw * v}); const int16 m{v} = (xs{v} >= 0) & (xs{v} < W);"
                      for v in range(nv))
    gather = "\n".join(f"            float16 bv{v} = vload16({v}, vals);" for v in range(nv))
    store = "\n".join(f"  store_row(Crow, Rrow, c{r}_{v}.lo, c{r}_{v}.hi, i0 + {r}, ow0 + {16 * v}, M, OW, P, bias, "
                      "bias_mode, 1.0f, 1.0f, act, p0, p1);" for r in range(GEMM_RM) for v in range(nv))
    return f"""
// As conv_implicit_s{sw}, reading X (Cg channels of H x W per b) in place: zero padding by bounds checks.
// xlen: the floats of X, so that no load leaves its buffer.
__kernel void {kernel}(__global const float* Ap, __global const float* X, __global float* C,
                               __global const float* bias, __global const float* R, const int M,
                               const int OH, const int OW, const int NPB, const int Cg, const int KH,
                               const int KW, const int sh, const int dh, const int dw, const int H,
                               const int W, const int ph, const int pw, const int a_mod, const int bias_mode,
                               const int act, const float p0, const float p1, const int xlen) {{
  const int K = Cg * KH * KW, P = OH * OW, HW = H * W;
  const int Mb = (M + RM - 1) / RM, Nb = OH * NPB;
{_TILE_WALK}
  const int i0 = ib * RM, oh = jb / NPB, ow0 = (jb % NPB) * {width};
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  const int xb = b * Cg * HW;
  __global float* Crow = C + (size_t)b * M * P + oh * OW;
  __global const float* Rrow = R + (size_t)b * M * P + oh * OW;
  bias += (b % a_mod) * M;
  const int16 lane = (int16)(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15) * {sw};
  const int span = {width * sw};  // floats one tap's loads read from their start
  const int lim = xlen - span;    // a load starting at off stays inside X iff 0 <= off <= lim
{decl}
  for (int kh = 0; kh < KH; ++kh) {{
    const int y = oh * sh - ph + kh * dh;
    if (y < 0 || y >= H) {{ ap += KW * Cg * RM; continue; }}
    for (int kw = 0; kw < KW; ++kw) {{
      const int x0 = ow0 * {sw} - pw + kw * dw;
      int off = xb + y * W + x0;
      if (x0 >= 0 && x0 + {(width - 1) * sw} < W && off + (Cg - 1) * HW <= lim) {{
        for (int ci = 0; ci < Cg; ++ci, off += HW) {{
{full}
{body}
          ap += RM;
        }}
        continue;
      }}
{masks}
      for (int ci = 0; ci < Cg; ++ci, off += HW) {{
        if (off >= 0 && off <= lim) {{
{masked}
{body}
        }} else {{
          float vals[{width}];
          for (int j = 0; j < {width}; ++j) {{
            const int x = x0 + j * {sw};
            vals[j] = (x >= 0 && x < W) ? X[off + j * {sw}] : 0.0f;
          }}
{gather}
{body}
        }}
        ap += RM;
      }}
    }}
  }}
{store}
}}
"""



#: Rule conv_phases: the narrowest kernel rows it takes. On PoCL (per layer, process CPU time, rule on
#: against off) 3x3 stride-2 layers ran 2-19% slower with the extra copy up to 10.8 M multiply-adds,
#: where 5x5 and 7x7 ones of 10 M and up ran 2-18% faster.
CONV_PHASES_MIN_KW = 5
#: Rule conv_phases: the fewest multiply-adds (images x output channels x input channels per group x
#: taps x outputs) of a Conv it takes: below about 5 M the pad_phases launch costs more than the
#: shuffles it saves (7x7 RGB stems of 0.6-4.8 M ran up to 10% slower with it, one run 2% faster; of
#: 10.8 M and up 2-7% faster).
CONV_PHASES_MIN_MACS = 8_000_000


def _conv_phases_source(nv: int) -> str:
    """``conv_phases_s2`` (``nv`` 1) and ``conv_phases_s2_x2`` (``nv`` 2, rule ``conv_wide_tile``'s 32
    positions), rule ``conv_phases``: a stride-2 Conv (horizontal dilation 1) as ``conv_implicit`` over
    the planes of ``pad_phases``, each zero-padded row stored as its even columns then its odd ones
    (``Wh`` floats each). The 16 inputs of 16 consecutive outputs at tap ``kw`` are then 16
    consecutive floats of phase ``kw & 1`` from column ``ow0 + (kw >> 1)``: one unaligned vector load,
    where ``conv_unpadded_s2`` loads 32 floats and keeps the even ones (two loads and a shuffle a
    vector, with bounds checks on the edge taps). No checks: ``Wh`` covers every lane of the last
    panel (its lanes past OW read padding, computed and not stored)."""
    width = 16 * nv
    decl = "\n".join(f"  float16 c{r}_{v} = (float16)(0.0f);" for r in range(GEMM_RM) for v in range(nv))
    loads = " ".join(f"const float16 bv{v} = *(__global const float16u*)(xp + {16 * v});" for v in range(nv))
    body = "\n".join(f"        {{ const float ar = ap[{r}]; " + " ".join(f"c{r}_{v} += (float16)(ar) * bv{v};"
                                                                 for v in range(nv)) + " }" for r in range(GEMM_RM))
    store = "\n".join(f"  store_row(Crow, Rrow, c{r}_{v}.lo, c{r}_{v}.hi, i0 + {r}, ow0 + {16 * v}, M, OW, P, bias, "
                      "bias_mode, 1.0f, 1.0f, act, p0, p1);" for r in range(GEMM_RM) for v in range(nv))
    kernel = "conv_phases_s2" + ("_x2" if nv == 2 else "")
    return f"""
// As conv_implicit_s2, reading Xd (Cg planes of Hp rows x [even columns | odd columns], Wh floats each,
// per b: pad_phases), so that every tap loads its {width} inputs as whole vectors.
__kernel void {kernel}(__global const float* Ap, __global const float* Xd, __global float* C,
                               __global const float* bias, __global const float* R, const int M,
                               const int OH, const int OW, const int NPB, const int Cg, const int KH,
                               const int KW, const int sh, const int dh, const int Hp, const int Wh,
                               const int a_mod, const int bias_mode, const int act, const float p0,
                               const float p1) {{
  const int K = Cg * KH * KW, P = OH * OW, plane = Hp * 2 * Wh;
  const int Mb = (M + RM - 1) / RM, Nb = OH * NPB;
{_TILE_WALK}
  const int i0 = ib * RM, oh = jb / NPB, ow0 = (jb % NPB) * {width};
  __global const float* ap = Ap + ((size_t)(b % a_mod) * Mb + ib) * K * RM;
  __global const float* xb = Xd + (size_t)b * Cg * plane + (size_t)oh * sh * 2 * Wh + ow0;
  __global float* Crow = C + (size_t)b * M * P + oh * OW;
  __global const float* Rrow = R + (size_t)b * M * P + oh * OW;
  bias += (b % a_mod) * M;
{decl}
  for (int kh = 0; kh < KH; ++kh) {{
    for (int kw = 0; kw < KW; ++kw) {{
      __global const float* xp = xb + kh * dh * 2 * Wh + (kw & 1) * Wh + (kw >> 1);
      for (int ci = 0; ci < Cg; ++ci, xp += plane) {{
        {loads}
{body}
        ap += RM;
      }}
    }}
  }}
{store}
}}
"""


GEMM_SOURCE = _gemm_source()

#: im2col straight into the packed B layout of ``gemm_packed``, and a direct convolution for
#: depthwise and other thin groups (where an 8-row register block would be mostly padding).
CONV_SOURCE = ACTIVATION_HELPERS + """
// Bp[b][jb][k][c], b = n * G + g, k = (ci, kh, kw), column p = jb * 16 + c = (oh, ow). One work-item
// handles one (b, k): it walks the output positions in order (reading input rows sequentially) and
// fills column k of every panel; a panel inside one output row and the input is a plain copy.
__kernel void im2col_packed(__global float* Bp, __global const float* X, const int Cin, const int H, const int W,
                            const int Cg, const int KH, const int KW, const int OH, const int OW,
                            const int sh, const int sw, const int ph, const int pw, const int dh, const int dw,
                            const int G, const int Kdim, const int Nb, const int total) {
  const int g0 = get_global_id(0);
  if (g0 >= total) return;
  const int k = g0 % Kdim; const int b = g0 / Kdim;
  const int kw = k % KW, kh = (k / KW) % KH, ci = k / (KW * KH);
  const int n = b / G, g = b % G;
  __global const float* xp = X + ((size_t)n * Cin + g * Cg + ci) * H * W;
  __global float* dst = Bp + ((size_t)b * Nb * Kdim + k) * 16;
  const size_t panel = (size_t)Kdim * 16;
  const int P = OH * OW;
  int oh = 0, ow = 0;
  for (int jb = 0; jb < Nb; ++jb, dst += panel) {
    const int x0 = ow * sw - pw + kw * dw;
    const int y0 = oh * sh - ph + kh * dh;
    if (sw == 1 && ow + 16 <= OW && y0 >= 0 && y0 < H && x0 >= 0 && x0 + 16 <= W) {
      // the 16 columns lie in one output row and inside the input: a straight 16-float copy
      __global const float* src = xp + y0 * W + x0;
      for (int c = 0; c < 16; ++c) dst[c] = src[c];
      ow += 16;
      if (ow == OW) { ow = 0; ++oh; }
      continue;
    }
    for (int c = 0; c < 16; ++c) {
      float v = 0.0f;
      if (jb * 16 + c < P) {
        const int y = oh * sh - ph + kh * dh, x = ow * sw - pw + kw * dw;
        if (y >= 0 && y < H && x >= 0 && x < W) v = xp[y * W + x];
      }
      dst[c] = v;  // columns past P are the last panel's zero padding
      if (++ow == OW) { ow = 0; ++oh; }
    }
  }
}

// Xp[plane][Hp][Wp] = X[plane][H][W] placed at (ph, pw), zeros around it: the input of conv_implicit.
// One work-item writes one padded row.
__kernel void pad_planes(__global float* Xp, __global const float* X, const int H, const int W, const int Hp,
                         const int Wp, const int ph, const int pw, const int total) {
  const int g = get_global_id(0);
  if (g >= total) return;
  const int sy = g % Hp - ph;
  __global float* dst = Xp + (size_t)g * Wp;
  if (sy < 0 || sy >= H) {
    for (int x = 0; x < Wp; ++x) dst[x] = 0.0f;
    return;
  }
  __global const float* src = X + ((size_t)(g / Hp) * H + sy) * W - pw;
  for (int x = 0; x < Wp; ++x) dst[x] = (x >= pw && x < pw + W) ? src[x] : 0.0f;
}

// Rule conv_phases: Xd[plane][Hp][2][Wh], each zero-padded row (X at (ph, pw)) as its even columns
// then its odd ones, Wh floats each (zeros past the padded row): the input of conv_phases_s2. One
// work-item writes one padded row.
typedef float16 __attribute__((aligned(4))) pad_float16u;  // an unaligned vector (vload16 is a call on PoCL)
__kernel void pad_phases(__global float* Xd, __global const float* X, const int H, const int W, const int Hp,
                         const int Wh, const int ph, const int pw, const int total) {
  const int g = get_global_id(0);
  if (g >= total) return;
  const int sy = g % Hp - ph;
  __global float* dst = Xd + (size_t)g * 2 * Wh;
  if (sy < 0 || sy >= H) {
    for (int x = 0; x < 2 * Wh; ++x) dst[x] = 0.0f;
    return;
  }
  __global const float* src = X + ((size_t)(g / Hp) * H + sy) * W;
  // Columns x whose even and odd inputs both lie in the row, 16 at a time: two 16-float loads split
  // into their even and odd lanes (a scalar loop with a check a value ran at about a float a ns).
  const int lo = (pw + 1) / 2, hi = (W + pw) / 2;  // 2x - pw >= 0 and 2x - pw + 1 < W for lo <= x < hi
  int x = 0;
  for (; x < lo && x < Wh; ++x) {
    const int e = 2 * x - pw, o = e + 1;
    dst[x] = (e >= 0 && e < W) ? src[e] : 0.0f;
    dst[Wh + x] = (o >= 0 && o < W) ? src[o] : 0.0f;
  }
  for (; x + 16 <= hi && x + 16 <= Wh; x += 16) {
    const float16 t0 = *(__global const pad_float16u*)(src + 2 * x - pw);
    const float16 t1 = *(__global const pad_float16u*)(src + 2 * x - pw + 16);
    *(__global pad_float16u*)(dst + x) = (float16)(t0.even, t1.even);
    *(__global pad_float16u*)(dst + Wh + x) = (float16)(t0.odd, t1.odd);
  }
  for (; x < Wh; ++x) {
    const int e = 2 * x - pw, o = e + 1;
    dst[x] = (e >= 0 && e < W) ? src[e] : 0.0f;
    dst[Wh + x] = (o >= 0 && o < W) ? src[o] : 0.0f;
  }
}

__kernel void conv_direct(__global float* Y, __global const float* X, __global const float* Wt,
                          __global const float* bias, const int has_bias, __global const float* R,
                          const int act, const float p0, const float p1, const int Cin, const int H, const int W,
                          const int Cout, const int Cg, const int Mg, const int KH, const int KW,
                          const int OH, const int OW, const int sh, const int sw, const int ph, const int pw,
                          const int dh, const int dw, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int ow = gid % OW; int t = gid / OW;
  const int oh = t % OH; t /= OH;
  const int co = t % Cout; const int n = t / Cout;
  const int g = co / Mg;
  float acc = has_bias ? bias[co] : 0.0f;
  for (int ci = 0; ci < Cg; ++ci) {
    __global const float* xp = X + ((size_t)n * Cin + g * Cg + ci) * H * W;
    __global const float* wp = Wt + ((size_t)co * Cg + ci) * KH * KW;
    for (int kh = 0; kh < KH; ++kh) {
      const int y = oh * sh - ph + kh * dh;
      if (y < 0 || y >= H) continue;
      for (int kw = 0; kw < KW; ++kw) {
        const int x = ow * sw - pw + kw * dw;
        if (x >= 0 && x < W) acc += xp[y * W + x] * wp[kh * KW + kw];
      }
    }
  }
  if (act >= 16) acc += R[gid];
  Y[gid] = apply_act(acc, act & 15, p0, p1);
}
"""

#: Average and max pooling, and LRN (2-D, NCHW; 1-D runs with H = 1).
POOL_SOURCE = NAN_HELPERS + """
__kernel void avgpool2d(__global float* Y, __global const float* X, const int H, const int W, const int OH,
                        const int OW, const int KH, const int KW, const int sh, const int sw, const int ph,
                        const int pw, const int dh, const int dw, const int count_include_pad,
                        const int hlim, const int wlim, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int ow = gid % OW; int t = gid / OW;
  const int oh = t % OH; const int nc = t / OH;
  __global const float* xp = X + (size_t)nc * H * W;
  float acc = 0.0f;
  int count = 0;
  for (int kh = 0; kh < KH; ++kh) {
    const int y = oh * sh - ph + kh * dh;
    for (int kw = 0; kw < KW; ++kw) {
      const int x = ow * sw - pw + kw * dw;
      const int inside = y >= 0 && y < H && x >= 0 && x < W;
      if (inside) {
        acc += xp[y * W + x];
        ++count;
      } else if (count_include_pad && y < hlim && x < wlim) {
        ++count;  // a pad position inside the padded input (not beyond it, as ORT)
      }
    }
  }
  Y[gid] = acc / (float)max(count, 1);
}

// MaxPool: a compare-select that keeps a NaN (fmax is an out-of-line call on PoCL and drops it),
// rows skipped whole when outside the input (2-3x faster than a per-tap bounds test).
__kernel void maxpool2d(__global float* Y, __global const float* X, const int H, const int W, const int OH,
                        const int OW, const int KH, const int KW, const int sh, const int sw, const int ph,
                        const int pw, const int dh, const int dw, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int ow = gid % OW; int t = gid / OW;
  const int oh = t % OH; const int nc = t / OH;
  __global const float* xp = X + (size_t)nc * H * W;
  const int y0 = oh * sh - ph, x0 = ow * sw - pw;
  float acc = -INFINITY;
  int seen = 0;
  for (int kh = 0; kh < KH; ++kh) {
    const int y = y0 + kh * dh;
    if (y < 0 || y >= H) continue;
    __global const float* row = xp + y * W;
    for (int kw = 0; kw < KW; ++kw) {
      const int x = x0 + kw * dw;
      if (x >= 0 && x < W) { acc = onnxhal_max(row[x], acc); seen = 1; }  // keeps a NaN
    }
  }
  Y[gid] = seen ? acc : -FLT_MAX;  // a window of padding alone: onnxruntime's lowest finite value
}

// MaxPool, rule pool_rows: a work-item per output row, so the (n, c, oh) of a work-item is
// divided out once per row, not per output, and a window inside the row needs no per-tap checks.
// Y's planes are YP floats apart, its rows YW, from offset yoff (OH * OW, OW, 0 for the plain layout;
// rule pool_padded_output: the interior of a Conv's zero-padded planes).
__kernel void maxpool2d_rows(__global float* Y, __global const float* X, const int H, const int W, const int OH,
                             const int OW, const int KH, const int KW, const int sh, const int sw, const int ph,
                             const int pw, const int dh, const int dw, const int YP, const int YW, const int yoff,
                             const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int oh = gid % OH; const int nc = gid / OH;
  __global const float* xp = X + (size_t)nc * H * W;
  __global float* yp = Y + yoff + (size_t)nc * YP + (size_t)oh * YW;
  const int y0 = oh * sh - ph;
  int kh0 = 0, kh1 = KH;  // the taps whose input row lies inside
  while (kh0 < KH && y0 + kh0 * dh < 0) ++kh0;
  while (kh1 > kh0 && y0 + (kh1 - 1) * dh >= H) --kh1;
  for (int ow = 0; ow < OW; ++ow) {
    const int x0 = ow * sw - pw;
    float acc = -INFINITY;
    int seen = 0;
    if (x0 >= 0 && x0 + (KW - 1) * dw < W) {
      for (int kh = kh0; kh < kh1; ++kh) {
        __global const float* row = xp + (y0 + kh * dh) * W + x0;
        for (int kw = 0; kw < KW; ++kw) acc = onnxhal_max(row[kw * dw], acc);  // keeps a NaN
      }
      seen = kh1 > kh0;
    } else {
      for (int kh = kh0; kh < kh1; ++kh) {
        __global const float* row = xp + (y0 + kh * dh) * W;
        for (int kw = 0; kw < KW; ++kw) {
          const int x = x0 + kw * dw;
          if (x >= 0 && x < W) { acc = onnxhal_max(row[x], acc); seen = 1; }
        }
      }
    }
    yp[ow] = seen ? acc : -FLT_MAX;  // a window of padding alone: onnxruntime's lowest finite value
  }
}

// LRN across channels: y = x / (bias + alpha / size * sum of x^2 over the channel window)^beta
__kernel void lrn(__global float* Y, __global const float* X, const int C, const int HW, const int size,
                  const float alpha, const float beta, const float bias, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int hw = gid % HW; const int c = (gid / HW) % C; const int n = gid / (HW * C);
  const int lo = max(0, c - (size - 1) / 2), hi = min(C - 1, c + size / 2);
  __global const float* xp = X + (size_t)n * C * HW + hw;
  float sq = 0.0f;
  for (int i = lo; i <= hi; ++i) { const float v = xp[i * HW]; sq += v * v; }
  Y[gid] = X[gid] / pow(bias + alpha / (float)size * sq, beta);
}
"""


#: Rule pool_row_vectors: output positions a MaxPool row work-item computes a vector at a time.
POOL_VECTOR = 8


def _pool_row_vectors_source(sw: int) -> str:
    """``maxpool2d_rows_v{sw}`` (rule ``pool_row_vectors``): ``maxpool2d_rows`` for horizontal stride
    ``sw`` (1 or 2, a constant of the kernel), POOL_VECTOR outputs at a time where their windows and
    the vector loads lie inside the input row: per tap one load (stride 2: 16 floats, the even ones
    kept) and one lane-wise max that keeps a NaN as ``onnxhal_max`` does, in the same tap order, so
    the result is the scalar kernel's. Other outputs (the row's edges) take the scalar loop."""
    nv = POOL_VECTOR
    load = "*(__global const float8u*)(r + kw * dw)" if sw == 1 else "(*(__global const float16u*)(r + kw * dw)).even"
    typedefs = ""
    if sw == 1:
        typedefs = """
// Unaligned vector loads and stores: vload/vstore are out-of-line calls on PoCL.
typedef float8 __attribute__((aligned(4))) float8u;
typedef float16 __attribute__((aligned(4))) float16u;
"""
    return typedefs + f"""
__kernel void maxpool2d_rows_v{sw}(__global float* Y, __global const float* X, const int H, const int W,
                                const int OH, const int OW, const int KH, const int KW, const int sh,
                                const int sw, const int ph, const int pw, const int dh, const int dw,
                                const int YP, const int YW, const int yoff, const int total) {{
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int oh = gid % OH; const int nc = gid / OH;
  __global const float* xp = X + (size_t)nc * H * W;
  __global float* yp = Y + yoff + (size_t)nc * YP + (size_t)oh * YW;  // layout as maxpool2d_rows
  const int y0 = oh * sh - ph;
  int kh0 = 0, kh1 = KH;  // the taps whose input row lies inside
  while (kh0 < KH && y0 + kh0 * dh < 0) ++kh0;
  while (kh1 > kh0 && y0 + (kh1 - 1) * dh >= H) --kh1;
  // The vector loads of outputs ow..ow + {nv - 1} read x0 .. x0 + (KW - 1) * dw + {nv * sw - 1}.
  const int span = (KW - 1) * dw + {nv * sw - 1};
  for (int ow = 0; ow < OW;) {{
    const int x0 = ow * {sw} - pw;
    if (kh1 > kh0 && ow + {nv} <= OW && x0 >= 0 && x0 + span < W) {{
      float8 acc = (float8)(-INFINITY);
      for (int kh = kh0; kh < kh1; ++kh) {{
        __global const float* r = xp + (y0 + kh * dh) * W + x0;
        for (int kw = 0; kw < KW; ++kw) {{
          const float8 v = {load};
          acc = select(acc, v, (v > acc) | (v != v));  // onnxhal_max(v, acc) lane by lane
        }}
      }}
      *(__global float8u*)(yp + ow) = acc;
      ow += {nv};
      continue;
    }}
    float acc = -INFINITY;
    int seen = 0;
    for (int kh = kh0; kh < kh1; ++kh) {{
      __global const float* row = xp + (y0 + kh * dh) * W;
      for (int kw = 0; kw < KW; ++kw) {{
        const int x = x0 + kw * dw;
        if (x >= 0 && x < W) {{ acc = onnxhal_max(row[x], acc); seen = 1; }}
      }}
    }}
    yp[ow] = seen ? acc : -FLT_MAX;  // a window of padding alone: onnxruntime's lowest finite value
    ++ow;
  }}
}}
"""


POOL_SOURCE += _pool_row_vectors_source(1) + _pool_row_vectors_source(2)

#: Row-wise kernels on an (outer, R, inner) view: reductions, Softmax/LogSoftmax, LayerNormalization.
ROWWISE_SOURCE = NAN_HELPERS + """
// mode: 0 sum, 1 mean, 2 max, 3 min, 4 prod, 5 sum of squares, 6 L2, 7 L1, 8 log-sum-exp, 9 log-sum
__kernel void reduce_rows(__global float* Y, __global const float* X, const int R, const int inner,
                          const int mode, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int i = gid % inner, o = gid / inner;
  __global const float* xp = X + (size_t)o * R * inner + i;
  float acc = (mode == 2) ? -INFINITY : (mode == 3) ? INFINITY : (mode == 4) ? 1.0f : 0.0f;
  float m = -INFINITY;
  if (mode == 8) {
    for (int r = 0; r < R; ++r) m = onnxhal_max(xp[r * inner], m);
    if (!isfinite(m)) m = 0.0f;  // shifting by an infinite max gives inf - inf = NaN; log(sum exp) is
  }                              // then exact (-inf for a row of -inf), as the CPU EP
  for (int r = 0; r < R; ++r) {
    const float v = xp[r * inner];
    if (mode == 0 || mode == 1 || mode == 9) acc += v;
    else if (mode == 2) acc = onnxhal_max(v, acc);  // fmax/fmin are calls on PoCL and drop NaN
    else if (mode == 3) acc = onnxhal_min(v, acc);
    else if (mode == 4) acc *= v;
    else if (mode == 5 || mode == 6) acc += v * v;
    else if (mode == 7) acc += fabs(v);
    else acc += ONNXHAL_EXP(v - m);
  }
  if (mode == 1) acc /= (float)R;
  else if (mode == 6) acc = sqrt(acc);
  else if (mode == 8) acc = m + log(acc);
  else if (mode == 9) acc = log(acc);
  Y[gid] = acc;
}

__kernel void softmax_rows(__global float* Y, __global const float* X, const int R, const int inner,
                           const int log_softmax, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int i = gid % inner, o = gid / inner;
  const size_t base = (size_t)o * R * inner + i;
  float m = -INFINITY;
  for (int r = 0; r < R; ++r) { const float v = X[base + r * inner]; m = v > m ? v : m; }  // fmax is a call
  float s = 0.0f;
  if (log_softmax) {
    for (int r = 0; r < R; ++r) s += ONNXHAL_EXP(X[base + r * inner] - m);
    const float ls = log(s);
    for (int r = 0; r < R; ++r) Y[base + r * inner] = X[base + r * inner] - m - ls;
  } else {  // exp once per element: keep it in Y, then scale
    for (int r = 0; r < R; ++r) { const float e = ONNXHAL_EXP(X[base + r * inner] - m); Y[base + r * inner] = e; s += e; }
    const float inv = 1.0f / s;
    for (int r = 0; r < R; ++r) Y[base + r * inner] *= inv;
  }
}

__kernel void layernorm_rows(__global float* Y, __global const float* X, __global const float* gamma,
                             __global const float* beta, const int has_beta, const int R, const float eps,
                             const int total) {
  const int row = get_global_id(0);
  if (row >= total) return;
  __global const float* xp = X + (size_t)row * R;
  __global float* yp = Y + (size_t)row * R;
  float mean = 0.0f;
  for (int r = 0; r < R; ++r) mean += xp[r];
  mean /= (float)R;
  float var = 0.0f;
  for (int r = 0; r < R; ++r) { const float d = xp[r] - mean; var += d * d; }
  const float inv = rsqrt(var / (float)R + eps);
  for (int r = 0; r < R; ++r) {
    const float v = (xp[r] - mean) * inv * gamma[r];
    yp[r] = has_beta ? v + beta[r] : v;
  }
}
"""

#: Rule ``rms_norm`` (plan_builder): T5's LayerNorm as its export writes it, x * (1 / sqrt(mean(x^2) + eps))
#: (``divide``: x / sqrt(...)), optionally times a weight, over rows of R values: one work-item per row,
#: each step rounded as the separate ops round it (the square, the mean as a sum divided by R, the
#: reciprocal, then the products).
RMSNORM_SOURCE = """
__kernel void rmsnorm_rows(__global float* Y, __global const float* X, __global const float* w, const int has_w,
                           const int R, const float eps, const int divide, const int total) {
  const int row = get_global_id(0);
  if (row >= total) return;
  __global const float* xp = X + (size_t)row * R;
  __global float* yp = Y + (size_t)row * R;
  float ss = 0.0f;
  for (int r = 0; r < R; ++r) { const float v = xp[r]; ss += v * v; }
  const float s = sqrt(ss / (float)R + eps);
  const float inv = 1.0f / s;
  for (int r = 0; r < R; ++r) {
    const float v = divide ? xp[r] / s : xp[r] * inv;
    yp[r] = has_w ? v * w[r] : v;
  }
}
"""

#: Data movement: a strided copy over up to 6 dimensions (Transpose, Slice, Concat, Expand and
#: copies of views) and Gather.
MOVEMENT_SOURCE = """
// meta: rank, dims[6], src_strides[6], dst_strides[6], src_offset, dst_offset (dims outer first).
// One work-item copies up to 64 elements along the innermost dimension, so the index decoding
// (a division per dimension) is paid once per run of elements, not per element.
__kernel void strided_copy(__global float* dst, __global const float* src, __constant int* meta,
                           const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int rank = meta[0];
  const int last = rank > 0 ? meta[rank] : 1;
  const int chunks = (last + 63) / 64;
  int rem = gid / chunks;
  const int j0 = (gid % chunks) * 64;
  int s = meta[19], d = meta[20];
  for (int k = rank - 2; k >= 0; --k) {
    const int dim = meta[1 + k];
    const int idx = rem % dim;
    rem /= dim;
    s += idx * meta[7 + k];
    d += idx * meta[13 + k];
  }
  const int ss = rank > 0 ? meta[6 + rank] : 0, ds = rank > 0 ? meta[12 + rank] : 0;
  const int j1 = min(last, j0 + 64);
  for (int j = j0; j < j1; ++j) dst[d + j * ds] = src[s + j * ss];
}

// out[o][j][i] = data[o][idx[j]][i]; negative indices count from the end.
__kernel void gather_rows(__global float* Y, __global const float* X, __global const long* idx,
                          const int axis_dim, const int nidx, const int inner, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int i = gid % inner; int t = gid / inner;
  const int j = t % nidx; const int o = t / nidx;
  long k = idx[j];
  if (k < 0) k += axis_dim;
  Y[gid] = (k >= 0 && k < axis_dim) ? X[((size_t)o * axis_dim + k) * inner + i] : 0.0f;
}
"""


def gemm_epilogue_source(statements: list[tuple[str, str]], result: str) -> str:
    """The GEMM program with epilogue code ``EPILOGUE_EXPR_CODE`` computing ``result`` after
    ``statements`` (``(local, C expression)``) of the accumulated value ``x``."""
    body = "".join(f"  const float {name} = {expr};\n" for name, expr in statements)
    return ("#define ONNXHAL_EPILOGUE_EXPR\n" + GEMM_SOURCE
            + f"\nfloat onnxhal_epilogue_expr(float x) {{\n{body}  return {result};\n}}\n")


def take_flat_source(ctype: str) -> str:
    """``take_flat``: ``out[i] = src[table[i]]`` for elements of C type ``ctype`` (rule
    ``typed_values``: a Gather of int64/int32/bool elements by constant indices, the table of flat
    source indices made at planning)."""
    return (f"__kernel void take_flat(__global {ctype}* restrict out, __global const {ctype}* restrict src,\n"
            "                        __global const int* restrict table, const int total) {\n"
            "  const int gid = get_global_id(0);\n"
            "  if (gid >= total) return;\n"
            "  out[gid] = src[table[gid]];\n"
            "}\n")
