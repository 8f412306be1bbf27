"""OpenCL C of the normalisation kernels beyond LayerNormalization: onnxruntime's com.microsoft
SkipLayerNormalization and ONNX InstanceNormalization. Both are one work-item per row, with the
arithmetic of ``kernel_sources``' ``layernorm_rows`` (the mean, then the variance of the
differences, ``rsqrt(var / R + eps)``), so their rounding is that of the LayerNorm kernel."""

#: SkipLayerNormalization: row ``row`` of X plus row ``row % skip_rows`` of S (skip repeats over the
#: batch where it has fewer rows), plus ``bias`` where ``has_bias``, written to ``Sum`` (the optional
#: output ``input_skip_bias_sum``, or Y itself as scratch), then normalised into Y.
SKIP_LAYERNORM_SOURCE = """
__kernel void skip_layernorm_rows(__global float* Y, __global const float* X, __global const float* S,
                                  __global const float* gamma, __global const float* beta,
                                  __global const float* bias, __global float* Sum, const int skip_rows,
                                  const int has_beta, const int has_bias, const int R, const float eps,
                                  const int total) {
  const int row = get_global_id(0);
  if (row >= total) return;
  __global const float* xp = X + (size_t)row * R;
  __global const float* sp = S + (size_t)(row % skip_rows) * R;
  __global float* tp = Sum + (size_t)row * R;
  __global float* yp = Y + (size_t)row * R;
  float mean = 0.0f;
  for (int r = 0; r < R; ++r) {
    float v = xp[r] + sp[r];
    if (has_bias) v += bias[r];
    tp[r] = v;
    mean += v;
  }
  mean /= (float)R;
  float var = 0.0f;
  for (int r = 0; r < R; ++r) { const float d = tp[r] - mean; var += d * d; }
  const float inv = rsqrt(var / (float)R + eps);
  for (int r = 0; r < R; ++r) {
    const float v = (tp[r] - mean) * inv * gamma[r];
    yp[r] = has_beta ? v + beta[r] : v;
  }
}
"""

#: InstanceNormalization: rows of R spatial values, row ``row`` of channel ``row % C``, scaled and
#: shifted by that channel's ``scale`` and ``B``.
INSTANCE_NORM_SOURCE = """
__kernel void instance_norm_rows(__global float* Y, __global const float* X, __global const float* scale,
                                 __global const float* B, const int C, const int R, const float eps,
                                 const int total) {
  const int row = get_global_id(0);
  if (row >= total) return;
  __global const float* xp = X + (size_t)row * R;
  __global float* yp = Y + (size_t)row * R;
  const int c = row % C;
  float mean = 0.0f;
  for (int r = 0; r < R; ++r) mean += xp[r];
  mean /= (float)R;
  float var = 0.0f;
  for (int r = 0; r < R; ++r) { const float d = xp[r] - mean; var += d * d; }
  const float k = rsqrt(var / (float)R + eps) * scale[c], b = B[c];
  for (int r = 0; r < R; ++r) yp[r] = (xp[r] - mean) * k + b;
}
"""
