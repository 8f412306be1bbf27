"""Comparing float outputs with onnxruntime's, as the random differential tests do."""

from __future__ import annotations

import numpy as np


def float_difference(w: np.ndarray, g: np.ndarray, tol: float) -> str | None:
    """None if ``g`` matches ``w`` (same shapes and dtypes already checked): inf and NaN at the same
    places, finite values within ``tol`` relative to the output's largest magnitude (at least 1)
    plus the value's own. -FLT_MAX and -inf count as one (onnxruntime's max pools give -FLT_MAX
    where the max is -inf)."""
    wf, gf = w.astype(np.float64), g.astype(np.float64)
    if w.dtype == np.float32:
        lowest = float(np.finfo(np.float32).max)
        wf[wf <= -lowest] = -np.inf
        gf[gf <= -lowest] = -np.inf
    finite = np.isfinite(wf)
    if not np.array_equal(finite, np.isfinite(gf)) or not np.array_equal(wf[~finite], gf[~finite], equal_nan=True):
        return "inf/NaN at other positions"
    if finite.any():
        scale = max(1.0, float(np.abs(wf[finite]).max()))
        diff = np.abs(wf[finite] - gf[finite])
        if (diff > tol * (scale + np.abs(wf[finite]))).any():
            return f"max diff {diff.max():.3g} at scale {scale:.3g}"
    return None
