"""numpy's floating-point error state set to "ignore" for the span of a run.

NaN and inf from IEEE arithmetic (Sqrt or Log of a negative, 0/0, overflow) are results, as in
onnxruntime, not numpy RuntimeWarnings from inside the runtime. ``np.errstate(all="ignore")``
costs about 1 us a run, a fifth of a one-node model's whole run; numpy 2 keeps the state in a
context variable, which ``ignore_fp_errors`` sets directly (0.2 us) to the current state with every
error ignored (the application's buffer size and error callback stay). numpy 1 takes errstate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:
    from numpy._core.umath import _extobj_contextvar, _make_extobj
except ImportError:  # numpy 1.x: no context variable
    _extobj_contextvar = _make_extobj = None

#: current state -> the same with every error ignored; bounded, the key keeps its state alive
_IGNORING: dict[Any, Any] = {}

#: numpy 2's floating-point error state: a context variable, which a generated run sets and resets
#: itself (``FP_STATE.set(ignoring(FP_STATE.get()))``) instead of calling the two functions below;
#: None on numpy 1
FP_STATE = _extobj_contextvar


def ignoring(state: Any) -> Any:
    """numpy 2's error state ``state`` with every error ignored (its buffer size and error
    callback kept)."""
    result = _IGNORING.get(state)
    if result is None:
        token = _extobj_contextvar.set(state)
        try:  # _make_extobj starts from the context's current state
            result = _make_extobj(all="ignore")
        finally:
            _extobj_contextvar.reset(token)
        if len(_IGNORING) >= 16:
            _IGNORING.clear()
        _IGNORING[state] = result
    return result


def ignore_fp_errors() -> Any:
    """Ignore floating-point errors until ``restore_fp_errors(token)``; returns the token."""
    if _extobj_contextvar is None:
        state = np.errstate(all="ignore")
        state.__enter__()
        return state
    return _extobj_contextvar.set(ignoring(_extobj_contextvar.get()))


def restore_fp_errors(token: Any) -> None:
    if _extobj_contextvar is None:
        token.__exit__(None, None, None)
    else:
        _extobj_contextvar.reset(token)
