"""Session options a model carries in its metadata (onnxruntime's ``ort_config``).

With the environment variable ``ORT_LOAD_CONFIG_FROM_MODEL=1``, onnxruntime reads the metadata
entry ``ort_config``, a JSON object whose ``session_options`` override the application's:
``intra_op_num_threads``, ``inter_op_num_threads``, ``execution_mode`` (0, 1),
``graph_optimization_level`` (0, 1, 2, 99) and ``enable_profiling`` (0, 1), all integers. Other keys
are ignored; a value of another type, or JSON that does not parse, fails the session.
"""

from __future__ import annotations

import json
import logging
import os

import onnx

from onnxhal.hal import ExecutionMode, GraphOptimizationLevel
from onnxhal.hal.errors import RuntimeInvalidArgument

ENV_VAR = "ORT_LOAD_CONFIG_FROM_MODEL"
ORT_CONFIG_KEY = "ort_config"
logger = logging.getLogger("onnxhal.session")


def load_config_from_model_enabled() -> bool:
    return os.environ.get(ENV_VAR, "") == "1"


def apply_model_config(proto: onnx.ModelProto, so: object) -> None:
    """Set ``so``'s attributes from the model's ``ort_config`` (a session's own copy of the options)."""
    text = next((p.value for p in proto.metadata_props if p.key == ORT_CONFIG_KEY), None)
    if text is None:
        return
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise RuntimeInvalidArgument(f"Json stored in the `ort_config` key cannot be parsed. Error message: {e}. Fix "
                                     f"the model's metadata, or unset {ENV_VAR}.") from None
    options = config.get("session_options") if isinstance(config, dict) else None
    if not isinstance(options, dict):
        return
    for key, value in options.items():
        if key not in _SETTERS:
            logger.info("Ignoring unsupported session option in ORT config: %s", key)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise RuntimeInvalidArgument(f"{key} option in the model file must be an integer, got {value!r} (in the "
                                         "model's ort_config metadata)")
        _SETTERS[key](so, value)


def _threads(attr: str):
    def set_(so: object, value: int) -> None:
        if value < 0:
            raise RuntimeInvalidArgument(f"Unsupported value for {attr}: {value} (in the model's ort_config)")
        setattr(so, attr, value)
    return set_


def _execution_mode(so: object, value: int) -> None:
    if value not in (0, 1):
        raise RuntimeInvalidArgument(f"Unsupported execution_mode value in ORT config: {value} (0 sequential, 1 "
                                     "parallel)")
    so.execution_mode = ExecutionMode(value)


def _optimization_level(so: object, value: int) -> None:
    if value not in (0, 1, 2, 99):  # onnxruntime's switch has no case for ORT_ENABLE_LAYOUT (3)
        raise RuntimeInvalidArgument(f"Unsupported graph_optimization_level value in ORT config: {value} (0, 1, 2 "
                                     "or 99)")
    so.graph_optimization_level = GraphOptimizationLevel(value)


def _profiling(so: object, value: int) -> None:
    if value not in (0, 1):
        raise RuntimeInvalidArgument(f"Unsupported value for enable_profiling option: {value} (0 or 1)")
    so.enable_profiling = bool(value)


_SETTERS = {"intra_op_num_threads": _threads("intra_op_num_threads"),
            "inter_op_num_threads": _threads("inter_op_num_threads"),
            "execution_mode": _execution_mode, "graph_optimization_level": _optimization_level,
            "enable_profiling": _profiling}
