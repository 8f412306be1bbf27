"""Which OpenCL device the OpenCL tests run on, or why they skip: the probe's verdict.

Tests that need a real OpenCL device call ``require_opencl()``; it returns the ``"p:d"`` index of
the first device that passed discovery's probe (devices/opencl_probe.py), or skips with the
reason every device failed (e.g. ``error: unknown target CPU 'generic'``), so a skip always says why.
"""

from __future__ import annotations

import functools

import pytest

from onnxhal.devices.opencl import first_usable_opencl_device


@functools.lru_cache(maxsize=1)
def opencl_verdict() -> tuple[str | None, str]:
    """(index of the first usable OpenCL device or None, why none is usable), once per process."""
    return first_usable_opencl_device()


def require_opencl(module_level: bool = False) -> str:
    """The ``"p:d"`` index of a usable OpenCL device, else skip with the probe's verdict."""
    index, reason = opencl_verdict()
    if index is None:
        pytest.skip(f"needs a working OpenCL device: {reason}", allow_module_level=module_level)
    return index


def compute_on_device(alloc, dt, cinfo, state, x, stream):
    """One run of a compiled partition on device memory: ``x`` copied in on ``stream``, the output
    copied back to the host, both device buffers freed; the host output."""
    import numpy as np

    from onnxhal import hal

    xd = alloc.tensor(x.shape, np.float32)
    dt.copy_tensors([x], [xd], [stream])
    (out,) = cinfo.compute(state, hal.KernelContext([xd], 1, stream))
    y = np.empty(out.shape, np.float32)
    dt.copy_tensors([out], [y], [stream])
    stream.finish()
    alloc.free(out.buffer)
    alloc.free(xd.buffer)
    return y


def close_sessions(sessions: dict) -> None:
    """Close a fixture's sessions at its teardown: pytest keeps a fixture's value for the test's
    whole teardown, so sessions it returned would still hold the EP library when the ``register``
    fixture unregisters it."""
    for session in sessions.values():
        session.close()


def keyed_sessions(model: bytes | str, key: str, providers: list, entries: dict[str, str] | None = None,
                   cpu: bool = True) -> dict:
    """Sessions of ``model`` with session config ``key`` at "1" and at "0" (and ``entries`` in both),
    by that value, each with an OpenCL partition, and with ``cpu`` one on the CPU EP alone ("cpu"):
    the A/B of a run-path switch, held bit for bit to each other and to the CPU EP."""
    import onnxhal

    made = {}
    for value in ("1", "0"):
        so = onnxhal.SessionOptions()
        for k, v in {**(entries or {}), key: value}.items():
            so.add_session_config_entry(k, v)
        made[value] = onnxhal.InferenceSession(model, so, providers=providers)
        assert made[value].partition_summary.get("OpenCLExecutionProvider", 0) > 0
    if cpu:
        made["cpu"] = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"])
    return made
