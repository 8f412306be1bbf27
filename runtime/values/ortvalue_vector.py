"""OrtValueVector and ``InferenceSession.run_with_ortvaluevector``: runs with lists of OrtValues.

onnxruntime's ``OrtValueVector`` is its C++ ``std::vector<OrtValue>`` (from
``onnxruntime.capi._pybind_state``); training code fills one with ``push_back`` and runs with
``run_with_ortvaluevector``, which skips the dict of ``run``. Here it is a list with the vector's
methods, and the run goes through the session's ordinary run path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from onnxhal.hal import DeviceTensor
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.ort_device import OrtDevice
from onnxhal.runtime.env.shared_memory import copy_value
from onnxhal.runtime.values.ortvalue import OrtValue


class OrtValueVector(list):
    """A list of OrtValues with the methods of onnxruntime's ``OrtValueVector``."""

    def push_back(self, value: Any) -> None:
        """Append an OrtValue, or take a DLPack capsule (or an object with ``__dlpack__``) without a copy."""
        self.append(value if isinstance(value, OrtValue) else OrtValue.from_dlpack(value))

    def push_back_batch(self, tensors: Sequence[Any], data_ptrs: Sequence[int], element_types: Sequence[Any],
                        shapes: Sequence[Sequence[int]], devices: Sequence[OrtDevice]) -> None:
        """onnxruntime wraps PyTorch tensors by address here. Host memory is shared through DLPack
        instead (the addresses and types are checked against each tensor)."""
        if not len(tensors) == len(data_ptrs) == len(element_types) == len(shapes) == len(devices):
            raise InvalidArgument("push_back_batch: tensors, data_ptrs, element_types, shapes and devices must have "
                                  f"one entry each, got {len(tensors)}, {len(data_ptrs)}, {len(element_types)}, "
                                  f"{len(shapes)}, {len(devices)}")
        for i, tensor in enumerate(tensors):
            value = OrtValue.from_dlpack(tensor)
            if value.data_ptr() != int(data_ptrs[i]) or value.shape() != [int(d) for d in shapes[i]]:
                raise InvalidArgument(f"push_back_batch: tensor {i} is at 0x{value.data_ptr():x} with shape "
                                      f"{value.shape()}, but data_ptrs/shapes say 0x{int(data_ptrs[i]):x} "
                                      f"{list(shapes[i])}")
            self.append(value)

    def reserve(self, n: int) -> None:
        pass  # a Python list grows by itself

    def shrink_to_fit(self) -> None:
        pass

    def element_type_at(self, index: int) -> int:
        return self[index].element_type()

    def dlpack_at(self, index: int) -> Any:
        return self[index].to_dlpack()

    def to_dlpacks(self, to_tensor: Callable[[Any], Any] | None = None) -> list:
        """One DLPack capsule per value, or ``to_tensor(capsule)`` of each (``torch.from_dlpack``)."""
        capsules = [v.to_dlpack() for v in self]
        return capsules if to_tensor is None else [to_tensor(c) for c in capsules]


def run_with_ortvaluevector(session: Any, run_to_memory: Callable[[dict, dict, Any], list], run_options: Any, feed_names: Sequence[str], feeds: Sequence[OrtValue],
                            fetch_names: Sequence[str], fetches: list, fetch_devices: Sequence[OrtDevice]) -> None:
    """Run ``session`` (``run_to_memory(feeds, bound outputs, run_options)`` is its run that leaves
    outputs where they are bound); the outputs ``fetch_names`` go into ``fetches``: appended when it is empty,
    written into its OrtValues when it holds one per name. ``fetch_devices[i]`` says where output
    ``i`` is left (an ``OrtDevice``: the host, or a device memory of the session)."""
    if len(feed_names) != len(feeds):
        raise InvalidArgument(f"feed names has {len(feed_names)} elements, but feed has {len(feeds)} elements.")
    if not fetch_names:
        raise InvalidArgument("At least one output should be requested.")
    if fetches and len(fetches) != len(fetch_names):
        raise InvalidArgument(f"fetch names has {len(fetch_names)} elements, but fetch has {len(fetches)} elements.")
    if len(fetch_devices) != len(fetch_names):
        # onnxruntime reads past the end of fetch_devices here and aborts the process.
        raise InvalidArgument(f"fetch_devices has {len(fetch_devices)} elements for {len(fetch_names)} fetch names: "
                              "give one OrtDevice per output (OrtDevice.make('cpu', 0) for the host)")
    for name, value in zip(feed_names, feeds):
        if not isinstance(value, OrtValue):
            raise InvalidArgument(f"run_with_ortvaluevector: feed {name!r} is a {type(value).__name__}, not an "
                                  "OrtValue; wrap it with OrtValue.ortvalue_from_numpy")
    for i, d in enumerate(fetch_devices):
        if not isinstance(d, OrtDevice):
            raise InvalidArgument(f"run_with_ortvaluevector: fetch_devices[{i}] is a {type(d).__name__}, not an "
                                  "OrtDevice; use OrtDevice.make('cpu', 0)")
    feed = dict(zip(feed_names, feeds))
    if all(d.memory_device.is_host for d in fetch_devices):
        results = session.run(list(fetch_names), feed, run_options)
    else:
        results = _run_to_devices(session, run_to_memory, feed, list(fetch_names), list(fetch_devices), run_options)
    if not fetches:
        fetches.extend(OrtValue(r) for r in results)
        return
    for name, target, result in zip(fetch_names, fetches, results):
        _write_into(name, target, result)


def _run_to_devices(session: Any, run_to_memory: Callable[[dict, dict, Any], list], feed: dict, fetch_names: list[str], devices: list[OrtDevice],
                    run_options: Any) -> list:
    memory = session.memory
    bound: dict[str, Any] = {}
    for name, device in zip(fetch_names, devices):
        dev = device.memory_device
        if dev.is_host:
            continue
        if memory.allocator(dev) is None:
            raise InvalidArgument(f"run_with_ortvaluevector: output {name!r} is to be left on {device}, which no EP "
                                  "of this session allocates; use a device of get_output_memory_infos(), or "
                                  "OrtDevice.make('cpu', 0)")
        bound[name] = memory.memory_info_of_device(dev)
    names = [o.name for o in session.get_outputs()]
    for n in fetch_names:
        if n not in names:
            raise InvalidArgument(f"Invalid output name: {n!r}. The model's outputs are {names}.")
    by_name = dict(zip(names, run_to_memory(feed, bound, run_options)))
    return [by_name[n] for n in fetch_names]


def _write_into(name: str, target: Any, result: Any) -> None:
    if not isinstance(target, OrtValue) or not target.is_tensor():
        raise InvalidArgument(f"run_with_ortvaluevector: fetches entry for {name!r} is {target!r}, not a tensor "
                              "OrtValue to write into")
    src = result.contents if isinstance(result, OrtValue) else result
    dst = target.contents
    if list(np.shape(src) if not isinstance(src, DeviceTensor) else src.shape) != target.shape():
        raise InvalidArgument(f"run_with_ortvaluevector: output {name!r} has shape {list(src.shape)}, but the "
                              f"OrtValue given for it in fetches has {target.shape()}")
    if np.dtype(src.dtype) != np.dtype(dst.dtype):
        raise InvalidArgument(f"run_with_ortvaluevector: output {name!r} is {src.dtype}, but the OrtValue given for "
                              f"it in fetches holds {dst.dtype}")
    copy_value(src, dst)
