"""``onnxhal.capi``: onnxruntime's ``onnxruntime.capi`` module paths, so code that imports from them
(``from onnxruntime.capi import _pybind_state as C``, ``onnxruntime.capi.onnxruntime_inference_collection``)
runs with ``onnxhal`` in their place. There is no C layer here: every name is onnxhal's own object."""
