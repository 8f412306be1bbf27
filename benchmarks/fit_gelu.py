"""Refit the fused Gelu's polynomial (``GELU_Q`` in runtime/providers/cpu/kernels/numerics.py).

    python benchmarks/fit_gelu.py [--degree 7] [--squarings 4]

gelu(x) = relu(x) - c(|x|) with c(a) = a/2 erfc(a / sqrt 2) = a / q(a)^(2^squarings). The fit is
least squares of q against (2 / erfc(a / sqrt 2))^(1/2^squarings) on a in [0, 10], weighted by
dc/dq and reweighted towards the minimax error of c (Lawson's iteration). Prints the
coefficients, the error of c in exact arithmetic and the error of the float32 kernel against
math.erf on [-20, 20].
"""

from __future__ import annotations

import argparse
import math

import numpy as np


def fit(degree: int, squarings: int, iterations: int = 80) -> tuple[np.ndarray, float]:
    a = np.linspace(0.0, 10.0, 40001)
    g = np.array([math.erfc(v / math.sqrt(2.0)) for v in a])
    keep = g > 1e-37
    a, g = a[keep], g[keep]
    n = 2 ** squarings
    c = 0.5 * a * g
    target = (2.0 / g) ** (1.0 / n)
    vander = np.vander(a, degree + 1, increasing=True)
    weights = np.ones_like(a)
    best = (math.inf, None)
    for _ in range(iterations):
        w = weights * c * n / target  # dc/dq: an error in q moves c by this much
        coef, *_ = np.linalg.lstsq(vander * w[:, None], target * w, rcond=None)
        err = np.abs(c - a / (vander @ coef) ** n)
        if err.max() < best[0]:
            best = (float(err.max()), coef)
        weights = weights * np.sqrt(err / err.max()) + 1e-12
        weights /= weights.mean()
    return best[1], best[0]


def float32_error(coef: np.ndarray, squarings: int) -> float:
    x = np.linspace(-20, 20, 400_001).astype(np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    q32 = coef.astype(np.float32)
    a = np.minimum(np.abs(x), np.float32(15.0))
    q = a * q32[-1]
    for c in q32[-2:0:-1]:
        q += c
        q *= a
    q += q32[0]
    with np.errstate(over="ignore"):
        for _ in range(squarings):
            q *= q
    y = np.maximum(x, 0) - a / q
    return float(np.abs(y - exact).max())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--degree", type=int, default=7)
    p.add_argument("--squarings", type=int, default=4)
    args = p.parse_args(argv)
    coef, err = fit(args.degree, args.squarings)
    print("GELU_Q =", tuple(float(c) for c in coef))
    print(f"error of c, exact arithmetic: {err:.2e}; float32 kernel on [-20, 20]: "
          f"{float32_error(coef, args.squarings):.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
