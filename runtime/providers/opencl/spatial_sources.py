"""OpenCL C of Pad and Resize: one work-item per output element, its source coordinates computed
per axis from a small constant buffer of geometry (``meta``), up to rank 6."""

#: The attribute values the kernels compute, with their codes; others are declined (op_support).
PAD_MODES = {"constant": 0, "edge": 1, "reflect": 2}
RESIZE_MODES = {"nearest": 0, "linear": 1}
RESIZE_COORDS = {"half_pixel": 0, "asymmetric": 1, "align_corners": 2, "pytorch_half_pixel": 3}
NEAREST_MODES = {"round_prefer_floor": 0, "round_prefer_ceil": 1, "floor": 2, "ceil": 3}

#: Pad: meta = rank, out dims[6], in dims[6], begin pads[6] (negative: cropped). mode 0 constant
#: (``value`` outside the input), 1 edge (the nearest element), 2 reflect (mirrored about the edge
#: element; the plan builder takes only pads shorter than the axis, as onnxruntime).
PAD_SOURCE = """
__kernel void pad_nd(__global float* Y, __global const float* X, __constant int* meta, const float value,
                     const int mode, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int rank = meta[0];
  int rem = gid, src = 0, stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int n = meta[7 + d];
    int i = rem % meta[1 + d] - meta[13 + d];
    rem /= meta[1 + d];
    if (i < 0 || i >= n) {
      if (mode == 0) { Y[gid] = value; return; }
      if (mode == 1) i = i < 0 ? 0 : n - 1;
      else i = i < 0 ? -i : 2 * (n - 1) - i;
    }
    src += i * stride;
    stride *= n;
  }
  Y[gid] = X[src];
}
"""

#: Resize of the last two axes (H, W) of rows of an input [outer, H, W] to [outer, OH, OW], by
#: tables the plan builder computes once (``pad_resize_lowering.resize_axis``): ``t`` the source
#: rows y1[OH], y2[OH] and columns x1[OW], x2[OW], ``w`` the weights dy1[OH], dy2[OH], dx1[OW],
#: dx2[OW]; bilinear as onnxruntime's (dx2 * dy2 * X[y1][x1] + dx1 * dy2 * X[y1][x2] + ...), or
#: nearest (X[y1][x1]).
RESIZE_SOURCE = """
__kernel void resize2d(__global float* Y, __global const float* X, __global const int* t, __global const float* w,
                       const int H, const int W, const int OH, const int OW, const int linear, const int total) {
  const int gid = get_global_id(0);
  if (gid >= total) return;
  const int ox = gid % OW, oy = (gid / OW) % OH, o = gid / (OW * OH);
  __global const float* xp = X + (size_t)o * H * W;
  const int y1 = t[oy], x1 = t[2 * OH + ox];
  if (!linear) { Y[gid] = xp[y1 * W + x1]; return; }
  const int y2 = t[OH + oy], x2 = t[2 * OH + OW + ox];
  const float dy1 = w[oy], dy2 = w[OH + oy], dx1 = w[2 * OH + ox], dx2 = w[2 * OH + OW + ox];
  Y[gid] = dx2 * dy2 * xp[y1 * W + x1] + dx1 * dy2 * xp[y1 * W + x2] + dx2 * dy1 * xp[y2 * W + x1]
           + dx1 * dy1 * xp[y2 * W + x2];
}
"""
