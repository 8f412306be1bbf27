"""Compiled models and devices: does a model compiled for an EP still suit the devices here?

onnxruntime's application side of ``OrtEpFactory::ValidateCompiledModelCompatibilityInfo`` and
``GetHardwareDeviceIncompatibilityDetails`` (``onnxruntime.capi._pybind_state``): read the
``ep_compatibility_info.<EP>`` string a compiler wrote into a model's metadata, ask the EP's factory
what it makes of it for some EP devices, and ask a factory why a hardware device will not do.
The same factory hook decides at session creation (``validate_compatibility_info``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import onnx

from onnxhal.hal import OrtCompiledModelCompatibility, OrtEpDevice, OrtHardwareDevice
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.runtime.env.environment import get_environment

if TYPE_CHECKING:
    from onnxhal.runtime.env.provider_resolution import ProviderChoice
    from onnxhal.runtime.session.options import SessionOptions

logger = logging.getLogger("onnxhal.session")

COMPAT_KEY_PREFIX = "ep_compatibility_info."


def get_model_compatibility_for_ep_devices(ep_devices: Sequence[OrtEpDevice],
                                           compatibility_info: str) -> OrtCompiledModelCompatibility:
    """The EP's verdict on ``compatibility_info`` (a compiled model's ``ep_compatibility_info.<EP>``)
    for these devices, which must all belong to one EP."""
    if not isinstance(compatibility_info, str):
        raise TypeError(f"compatibility_info must be a str, got {type(compatibility_info).__name__}")
    devices = list(ep_devices)
    if any(not isinstance(d, OrtEpDevice) for d in devices):
        raise TypeError("get_model_compatibility_for_ep_devices: ep_devices must be OrtEpDevice values (from "
                        f"get_ep_devices()), got {[type(d).__name__ for d in devices]}")
    if not devices:
        raise Fail("Invalid argument provided to GetModelCompatibilityForEpDevices: ep_devices is empty; give the "
                   "EP devices of the EP the model was compiled for.")
    factories = {id(d.factory) for d in devices}
    if len(factories) > 1:
        raise Fail("Invalid argument provided to GetModelCompatibilityForEpDevices: the EP devices belong to "
                   f"different EPs ({sorted({d.ep_name for d in devices})}); ask once per EP.")
    verdict = devices[0].factory.validate_compiled_model_compatibility_info([d.device for d in devices],
                                                                          compatibility_info)
    return OrtCompiledModelCompatibility(verdict)


def _compatibility_info(proto: onnx.ModelProto, ep_type: str) -> str | None:
    key = COMPAT_KEY_PREFIX + ep_type
    return next((p.value for p in proto.metadata_props if p.key == key), None)


def _check_ep_type(ep_type: Any, what: str) -> None:
    if not isinstance(ep_type, str):
        raise TypeError(f"ep_type must be a str (an EP name), got {type(ep_type).__name__}")
    if not ep_type:
        raise Fail(f"Invalid argument provided to {what}: ep_type is empty; give an EP name such as "
                   "'CPUExecutionProvider'.")


def get_compatibility_info_from_model(model_path: str | os.PathLike, ep_type: str) -> str | None:
    """The ``ep_compatibility_info.<ep_type>`` entry of the model file's metadata, or None."""
    path = os.fspath(model_path)
    if not os.path.isfile(path):
        # a RuntimeError, as onnxruntime raises here (its sessions raise NoSuchFile)
        raise Fail(f"Load model {path} failed. File doesn't exist")
    _check_ep_type(ep_type, "GetCompatibilityInfoFromModel")
    with open(path, "rb") as f:
        return _compatibility_info(_parse(f.read(), path), ep_type)


def get_compatibility_info_from_model_bytes(model_data: bytes | bytearray | memoryview, ep_type: str) -> str | None:
    """As ``get_compatibility_info_from_model``, from the model's bytes (any buffer)."""
    try:
        data = bytes(memoryview(model_data))
    except TypeError:
        raise TypeError(f"model_data must be bytes, bytearray, memoryview or another buffer, got "
                        f"{type(model_data).__name__}") from None
    if not data:
        raise Fail("Invalid argument provided to GetCompatibilityInfoFromModelBytes: model_data is empty")
    _check_ep_type(ep_type, "GetCompatibilityInfoFromModelBytes")
    return _compatibility_info(_parse(data, "model bytes"), ep_type)


def _parse(data: bytes, what: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError
        raise Fail(f"Protobuf parsing failed: {what} is not an ONNX model ({e})") from e
    return proto


def get_hardware_device_ep_incompatibility_details(ep_name: str, hardware_device: OrtHardwareDevice) -> dict:
    """Why EP ``ep_name`` cannot use ``hardware_device``, from its factory:
    ``{"reasons_bitmask": OrtDeviceEpIncompatibilityReason bits, "notes": str or None,
    "error_code": int}``; a bitmask of 0 means no known incompatibility."""
    if not isinstance(hardware_device, OrtHardwareDevice):
        raise TypeError(f"hardware_device must be an OrtHardwareDevice (from get_hardware_devices()), got "
                        f"{type(hardware_device).__name__}")
    found = get_environment().factory_for(ep_name) if ep_name else None
    if found is None:
        raise InvalidArgument(f"No valid factory found for execution provider '{ep_name}'. Registered EPs: "
                              f"{sorted({d.ep_name for d in get_environment().ep_devices()})}")
    factory, _ = found
    details = tuple(factory.get_hardware_device_incompatibility_details(hardware_device))
    if len(details) not in (2, 3):
        raise Fail(f"{ep_name}: get_hardware_device_incompatibility_details returned {details!r}; expected "
                   "(reasons_bitmask, notes) or (reasons_bitmask, notes, error_code)")
    bitmask, notes = int(details[0]), details[1]
    return {"reasons_bitmask": bitmask, "notes": notes or None,
            "error_code": int(details[2]) if len(details) == 3 else 0}


FAIL_ON_SUBOPTIMAL = "session.fail_on_suboptimal_compiled_model"


def validate_compatibility_info(proto: onnx.ModelProto, choices: list[ProviderChoice], so: SessionOptions) -> None:
    """ORT's session step 6: a compiled model's ``ep_compatibility_info.<EP>`` metadata is checked by
    that EP's factory. EP_UNSUPPORTED fails; EP_SUPPORTED_PREFER_RECOMPILATION fails only with
    ``session.fail_on_suboptimal_compiled_model`` = "1"."""
    c_ = OrtCompiledModelCompatibility
    props = {p.key: p.value for p in proto.metadata_props}
    for c in choices:
        info = props.get(COMPAT_KEY_PREFIX + c.ep_name)
        if info is None:
            continue
        verdict = c.factory.validate_compiled_model_compatibility_info([d.device for d in c.devices], info)
        if verdict == c_.EP_UNSUPPORTED:
            raise Fail(f"{c.ep_name}: this compiled model is not compatible with the selected device(s) "
                       f"(compatibility info {info!r}). Recompile it for this device, or load the original model.")
        if verdict == c_.EP_SUPPORTED_PREFER_RECOMPILATION:
            if so.config(FAIL_ON_SUBOPTIMAL) == "1":
                raise Fail(f"{c.ep_name}: the compiled model is usable but suboptimal here (compatibility info "
                           f"{info!r}) and {FAIL_ON_SUBOPTIMAL}=1. Recompile it for this device.")
            logger.warning("%s: compiled model is suboptimal for this device; consider recompiling", c.ep_name)
