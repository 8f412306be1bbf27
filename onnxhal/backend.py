"""ONNX's backend API (``onnx.backend.base``) over onnxhal sessions: the counterpart of
``onnxruntime.backend``, so onnx's backend test runner and tools written for that API run onnxhal.

    import onnxhal.backend as backend
    rep = backend.prepare(model, "NPU")          # or "CPU", "GPU"; model: ModelProto, path or bytes
    outputs = rep.run([x])                       # a list (one array per input), a dict, or one array

A device string names a hardware type, optionally with an index (``"GPU:1"``): ``"CPU"`` runs on the
CPU EP alone; ``"GPU"`` and ``"NPU"`` put the session on the EP devices of that type (simulated
ones included, e.g. with ``ONNXHAL_SIMULATE``), with the CPU EP taking the nodes they decline, as a
session with ``add_provider_for_devices`` does. As onnxruntime's backend does, the session's run-time
fallback is disabled, so a device that fails at run is an error, never a silent CPU result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

from onnxhal.errors import InvalidArgument
from onnxhal.hal import OrtHardwareDeviceType
from onnxhal.runtime.env.environment import get_ep_devices
from onnxhal.runtime.session.inference_session import InferenceSession
from onnxhal.runtime.session.options import RunOptions, SessionOptions

_DEVICE_TYPES = {"CPU": OrtHardwareDeviceType.CPU, "GPU": OrtHardwareDeviceType.GPU, "NPU": OrtHardwareDeviceType.NPU,
                 "CUDA": OrtHardwareDeviceType.GPU}


def _parse_device(device: str | None) -> tuple[OrtHardwareDeviceType, int]:
    text = (device or "CPU").strip().upper()
    kind, _, index = text.partition(":")
    if kind not in _DEVICE_TYPES or (index and not index.isdigit()):
        raise InvalidArgument(f"backend device {device!r} is not one onnxhal knows; use 'CPU', 'GPU' or 'NPU', "
                              "optionally with an index ('GPU:1')")
    return _DEVICE_TYPES[kind], int(index or 0)


def _devices_of(kind: OrtHardwareDeviceType) -> list[list[Any]]:
    """The EP devices on hardware of ``kind``, grouped by hardware device in discovery order (one
    group per physical or simulated device; several EPs may serve one device)."""
    groups: dict[int, list[Any]] = {}
    order: list[int] = []
    for ep_device in get_ep_devices():
        if ep_device.device.type != kind or ep_device.ep_name == "CPUExecutionProvider":
            continue
        key = id(ep_device.device)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(ep_device)
    return [groups[k] for k in order]


def _split_options(kwargs: Mapping[str, Any], target: object, other: object) -> dict[str, Any]:
    """The kwargs that are attributes of ``target``; a key that is an attribute of neither options
    object is an error (onnxruntime's backend ignores it, which hides a misspelt option)."""
    mine: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key.startswith("_") or not (hasattr(target, key) or hasattr(other, key)):
            raise InvalidArgument(f"backend option {key!r} is neither a SessionOptions nor a RunOptions attribute; "
                                  "pass session settings (e.g. graph_optimization_level) or run settings (e.g. run_tag)")
        if hasattr(target, key) and not callable(getattr(target, key)):
            mine[key] = value
    return mine


class OnnxhalBackendRep(BackendRep):
    """A prepared model: one ``InferenceSession``, run as many times as wanted."""

    def __init__(self, session: InferenceSession) -> None:
        self.session = session

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Run with ``inputs``: a list or tuple (one value per model input, in order), a dict by
        name, or one array when the model has one input. Returns the outputs as a tuple that can
        also be indexed by output name."""
        options = RunOptions()
        for key, value in _split_options(kwargs, options, SessionOptions()).items():
            setattr(options, key, value)
        names = [i.name for i in self.session.get_inputs()]
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        elif isinstance(inputs, (list, tuple)):
            if len(inputs) > len(names):
                raise InvalidArgument(f"backend run: {len(inputs)} inputs given, the model takes {len(names)} "
                                      f"({', '.join(names)}); pass one value per model input, in order")
            feeds = dict(zip(names, inputs))
        else:
            if len(names) != 1:
                raise InvalidArgument(f"backend run: one value given, the model takes {len(names)} inputs "
                                      f"({', '.join(names)}); pass a list or a dict")
            feeds = {names[0]: inputs}
        # onnx's runner stores 0-d inputs as numpy scalars; a session takes arrays.
        feeds = {k: np.asarray(v) if isinstance(v, np.generic) else v for k, v in feeds.items()}
        outputs = self.session.run(None, feeds, options)
        out_names = [o.name for o in self.session.get_outputs()]
        return namedtupledict("Outputs", out_names)(*outputs)


class OnnxhalBackend(Backend):
    """ONNX's ``Backend`` over onnxhal: ``prepare``, ``run_model``, ``run_node``, ``supports_device``."""

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """True for "CPU", and for "GPU"/"NPU" (with an optional index) while such an EP device
        exists. An unknown device string is False here (the runner asks about "CUDA" and others)."""
        try:
            kind, index = _parse_device(device)
        except InvalidArgument:
            return False
        return kind == OrtHardwareDeviceType.CPU or index < len(_devices_of(kind))

    @classmethod
    def is_compatible(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: onnx.ModelProto | str | bytes | os.PathLike | InferenceSession | OnnxhalBackendRep,
                device: str = "CPU", **kwargs: Any) -> OnnxhalBackendRep:
        """A session for ``model`` on ``device``; ``kwargs`` set ``SessionOptions`` attributes."""
        if isinstance(model, OnnxhalBackendRep):
            return model
        if isinstance(model, InferenceSession):
            return OnnxhalBackendRep(model)
        kind, index = _parse_device(device)
        options = SessionOptions()
        for key, value in _split_options(kwargs, options, RunOptions()).items():
            setattr(options, key, value)
        if isinstance(model, onnx.ModelProto):
            onnx.checker.check_model(model)
            model = model.SerializeToString()
        if kind == OrtHardwareDeviceType.CPU:
            session = InferenceSession(model, options, providers=["CPUExecutionProvider"])
        else:
            groups = _devices_of(kind)
            if index >= len(groups):
                raise InvalidArgument(f"backend device {device!r}: {len(groups)} {kind.name} device(s) found; "
                                      "register an EP library for one, or simulate one with ONNXHAL_SIMULATE=generic-npu")
            options.add_provider_for_devices(groups[index], {})
            session = InferenceSession(model, options)
        # The backend API serves testing: a device that fails at run must fail the call, not be
        # replaced by the CPU EP's answer (onnxruntime's backend disables the fallback too).
        session.disable_fallback()
        return OnnxhalBackendRep(session)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        session_kwargs = {k: v for k, v in kwargs.items() if hasattr(SessionOptions(), k)}
        run_kwargs = {k: v for k, v in kwargs.items() if k not in session_kwargs}
        return cls.prepare(model, device, **session_kwargs).run(inputs, **run_kwargs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (a list in the node's input order, or a dict by name). The
        model around it takes its inputs' types from the arrays; ``opset_version`` in kwargs picks
        the default domain's opset (else onnx's newest)."""
        opset = kwargs.pop("opset_version", None)
        super().run_node(node, inputs, device=device, outputs_info=outputs_info,
                         **({"opset_version": opset} if opset is not None else {}))
        names = [n for n in node.input if n]
        values = [inputs[n] for n in names] if isinstance(inputs, Mapping) else list(inputs)
        if len(values) != len(names):
            raise InvalidArgument(f"run_node: node {node.op_type} takes {len(names)} inputs ({', '.join(names)}), "
                                  f"{len(values)} given")
        graph_inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(np.asarray(v).dtype),
                                                          np.asarray(v).shape) for n, v in zip(names, values)]
        graph_outputs = []
        for i, name in enumerate(o for o in node.output if o):
            if outputs_info is not None and i < len(outputs_info):
                dtype, shape = outputs_info[i]
                graph_outputs.append(onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
            else:
                graph_outputs.append(onnx.ValueInfoProto(name=name))
        opsets = [onnx.helper.make_opsetid("", opset if opset is not None else onnx.defs.onnx_opset_version())]
        if node.domain not in ("", "ai.onnx"):
            opsets.append(onnx.helper.make_opsetid(node.domain, 1))
        model = onnx.helper.make_model(onnx.helper.make_graph([node], f"{node.op_type}_node", graph_inputs, graph_outputs),
                                       opset_imports=opsets)
        # Outputs with no outputs_info get their types from ONNX's inference (the checker needs one).
        model = onnx.shape_inference.infer_shapes(model)
        return cls.run_model(model, values, device, **kwargs)


prepare = OnnxhalBackend.prepare
run_model = OnnxhalBackend.run_model
run_node = OnnxhalBackend.run_node
supports_device = OnnxhalBackend.supports_device
is_compatible = OnnxhalBackend.is_compatible
run = OnnxhalBackend.run_model
