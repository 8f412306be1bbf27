"""How one output of a device is held against the CPU EP's: the rule, the error and the verdict.

Float outputs match when ``max|device - CPU| <= atol + rtol * max|CPU|``: the error is measured
against the output's scale, not element by element. A device that stores float32 as fp16 rounds
every intermediate to about 3 significant digits of *its* magnitude, so an element near zero in an
output whose values reach 600 may be off by 0.3 while the output is as good as fp16 allows; an
element-wise rule (``|d - c| <= atol + rtol * |c|``) would call that a failure. Integer, bool and
string outputs (labels, indices) must be equal. Sequences of maps (scikit-learn's ZipMap) match
when every map has the same keys and the values, read as a matrix, match as a float output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: The rule, in words, for the lines that report a verdict.
SCALE_RULE = "max|device - CPU| <= atol + rtol * max|CPU|, per output (relative to the output's scale)"
EXACT_RULE = "integer, bool and string outputs must be equal"


@dataclass
class OutputCheck:
    """One output's verdict. ``max_error`` and ``scale`` are nan where the values cannot be compared
    (a shape or key mismatch); ``problem`` says why the output does not match ("" when it does)."""

    name: str
    ok: bool
    max_error: float = float("nan")
    scale: float = float("nan")
    bound: float = float("nan")
    exact: bool = False  # held to equality (integers, bools, strings)
    nonfinite: int = 0  # NaN/inf where the CPU EP's values are finite
    problem: str = ""


def compare_output(name: str, out: Any, ref: Any, rtol: float, atol: float, ref_name: str = "the CPU EP") -> OutputCheck:
    """``out`` (a device's) against ``ref`` (``ref_name``'s: the CPU EP's, or onnxruntime's in the
    sweep), under the module's rule."""
    if _is_map_sequence(ref) or _is_map_sequence(out):
        return _compare_map_sequences(name, out, ref, rtol, atol, ref_name)
    if isinstance(ref, dict) or isinstance(out, dict):
        return _compare_map_sequences(name, [out] if isinstance(out, dict) else out,
                                      [ref] if isinstance(ref, dict) else ref, rtol, atol, ref_name)
    if isinstance(ref, list) or isinstance(out, list):  # a sequence of tensors
        if not (isinstance(ref, list) and isinstance(out, list)) or len(out) != len(ref):
            return OutputCheck(name, False, problem=f"output {name!r}: a sequence of {_length(out)} value(s), "
                                                    f"{ref_name}'s has {_length(ref)}")
        parts = [compare_output(f"{name}[{k}]", o, r, rtol, atol, ref_name) for k, o, r in zip(out, ref)]
        bad = [p for p in parts if not p.ok]
        worst = max((p.max_error for p in parts if not np.isnan(p.max_error)), default=0.0)
        return OutputCheck(name, not bad, worst, max((p.scale for p in parts), default=0.0),
                           exact=all(p.exact for p in parts), problem=bad[0].problem if bad else "")
    o, r = np.asarray(out), np.asarray(ref)
    if o.shape != r.shape:
        return OutputCheck(name, False, problem=f"output {name!r} has shape {list(o.shape)}, {ref_name}'s "
                                                f"{list(r.shape)}")
    if r.dtype.kind not in "fc" or o.dtype.kind not in "fc":
        return _compare_exact(name, o, r, ref_name)
    return _compare_floats(name, o, r, rtol, atol, ref_name)


def _compare_exact(name: str, o: np.ndarray, r: np.ndarray, ref_name: str) -> OutputCheck:
    differ = int(np.sum(o != r)) if o.size else 0
    worst = 0.0
    if differ and o.dtype.kind in "iub" and r.dtype.kind in "iub":
        worst = float(np.max(np.abs(o.astype(np.float64) - r.astype(np.float64))))
    elif differ:
        worst = float("nan")
    problem = f"output {name!r}: {differ} of {o.size} value(s) differ from {ref_name}'s (must be equal)" if differ else ""
    return OutputCheck(name, not differ, worst, exact=True, problem=problem)


def _compare_floats(name: str, o: np.ndarray, r: np.ndarray, rtol: float, atol: float, ref_name: str) -> OutputCheck:
    o, r = o.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(r)
    same_special = (np.isnan(o) & np.isnan(r)) | (~finite & (o == r))
    nonfinite = int(np.sum(~np.isfinite(o) & finite))
    special_differ = int(np.sum(~finite & ~same_special))
    both = finite & np.isfinite(o)
    diff = np.abs(o[both] - r[both])
    worst = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(r[finite]).max()) if finite.any() else 0.0
    bound = atol + rtol * scale
    check = OutputCheck(name, True, worst, scale, bound, nonfinite=nonfinite)
    if nonfinite:
        check.ok, check.problem = False, (f"output {name!r}: {nonfinite} NaN/inf value(s) where {ref_name}'s are "
                                          "finite")
    elif special_differ:
        check.ok, check.problem = False, (f"output {name!r}: {special_differ} value(s) differ where {ref_name}'s "
                                          "are NaN or inf")
    elif worst > bound:
        check.ok, check.problem = False, (f"beyond tolerance relative to the output's scale: output {name!r} "
                                          f"max|diff| {worst:.3g} > atol {atol:g} + rtol {rtol:g} x max|reference| "
                                          f"{scale:.3g} = {bound:.3g}")
    return check


def _is_map_sequence(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(m, dict) for m in v)


def _length(v: Any) -> str:
    return str(len(v)) if isinstance(v, list) else f"no sequence ({type(v).__name__})"


def _compare_map_sequences(name: str, out: Any, ref: Any, rtol: float, atol: float, ref_name: str) -> OutputCheck:
    if not (isinstance(out, list) and isinstance(ref, list)) or len(out) != len(ref):
        return OutputCheck(name, False, problem=f"output {name!r}: a sequence of {_length(out)} map(s), the CPU "
                                                f"EP's has {_length(ref)}")
    for k, (o, r) in enumerate(zip(out, ref)):
        if not isinstance(o, dict) or set(o) != set(r):
            keys = sorted(o) if isinstance(o, dict) else type(o).__name__
            return OutputCheck(name, False, problem=f"output {name!r}: map {k} has keys {keys}, {ref_name}'s "
                                                    f"{sorted(r)}")
    # Each map's values in the order of its keys, all maps end to end (maps may differ in keys).
    check = compare_output(name, _map_values(out), _map_values(ref), rtol, atol, ref_name)
    check.name = name
    return check


def _map_values(maps: list[dict]) -> np.ndarray:
    return np.array([np.asarray(m[key]).item() if np.ndim(m[key]) == 0 else m[key]
                     for m in maps for key in sorted(m)])
