"""onnxruntime's ``onnxruntime.capi.onnxruntime_pybind11_state``: the same names as ``_pybind_state``."""

from onnxhal.capi._pybind_state import __dir__, __getattr__  # noqa: F401
