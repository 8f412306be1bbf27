"""A hal factory's custom operators inside onnxruntime: ``EpFactory.get_custom_op_domains`` as the
``OrtCustomOpDomain``s of ``OrtEpFactory::GetNumCustomOpDomains`` / ``GetCustomOpDomains`` (API 24).

Each ``hal.CustomOp`` becomes an ``OrtCustomOp`` (onnxruntime_c_api.h) whose members point at
bridge.c's ``o_*`` / ``k_*`` trampolines. A hal op declares no types or arities, so the schema
onnxruntime builds from the struct takes any number (at least one) of inputs and outputs of any
tensor type: one variadic, heterogeneous input and output of type UNDEFINED. onnxruntime's custom-op
type inference then gives an output the element type of the node's inputs (custom_ops.cc,
``InferOutputTypes``); an op whose outputs have another type needs them declared in the model.

The node handed to ``CustomOp.create_kernel`` carries onnxruntime's name, op type, domain, input and
output names; its ``attributes`` are read from onnxruntime's ``OrtKernelInfo`` by name, as the
kernel asks for them (onnxruntime lists no attribute names), while ``create_kernel`` runs.
onnxruntime releases the domains only with the factory's library; the bridge keeps them (and each
op's struct) for the process, as the factory must keep them valid while any session uses them.

onnxruntime asks the factories for their domains for sessions given their EP devices
(``add_provider_for_devices``); with a selection policy only its C API's session creation asks
(``CreateSessionAndLoadModelImpl`` in onnxruntime/core/session/utils.cc: every EP device's domains
when no provider was appended and a policy is set), not its Python ``InferenceSession``. For those,
the bridge library is also a custom-op library: ``SessionOptions.register_custom_ops_library(
plugin.library_path())`` calls its ``RegisterCustomOps``, which adds the domains of every factory
onnxruntime has registered to that session's options (``OrtApi::AddCustomOpDomain``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from ctypes import POINTER, Structure, c_float, c_int64, c_size_t, c_uint32, c_void_p
from typing import Any

import numpy as np

from onnxhal.hal.custom_op import CustomOp, CustomOpDomain
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.graph import Node
from onnxhal.ort_plugin import dispatch as d
from onnxhal.ort_plugin import tensors
from onnxhal.ort_plugin.ort_api import OrtApi
from onnxhal.ort_plugin.structs import Strings, write_out

#: OrtCustomOp's ``version``: CreateKernelV2 / KernelComputeV2 (which return a status) are read from
#: 16 on; the members after them (shape inference, opset range, in-place and alias maps) stay unread.
CUSTOM_OP_VERSION = 16
UNDEFINED = 0  # ONNXTensorElementDataType: any type
VARIADIC = 2  # OrtCustomOpInputOutputCharacteristic INPUT_OUTPUT_VARIADIC

# OrtCustomOp's members after ``version``, in onnxruntime_c_api.h's order, with bridge.c's trampoline.
_MEMBERS = [
    ("CreateKernel", "o_create_kernel_v1"), ("GetName", "o_get_name"), ("GetExecutionProviderType", "o_get_ep_type"),
    ("GetInputType", "o_get_input_type"), ("GetInputTypeCount", "o_get_input_type_count"),
    ("GetOutputType", "o_get_output_type"), ("GetOutputTypeCount", "o_get_output_type_count"),
    ("KernelCompute", "k_compute_v1"), ("KernelDestroy", "k_destroy"),
    ("GetInputCharacteristic", "o_get_input_characteristic"),
    ("GetOutputCharacteristic", "o_get_output_characteristic"), ("GetInputMemoryType", "o_get_input_memory_type"),
    ("GetVariadicInputMinArity", "o_get_variadic_min_arity"),
    ("GetVariadicInputHomogeneity", "o_get_variadic_homogeneity"),
    ("GetVariadicOutputMinArity", "o_get_variadic_min_arity"),
    ("GetVariadicOutputHomogeneity", "o_get_variadic_homogeneity"),
    ("CreateKernelV2", "o_create_kernel"), ("KernelComputeV2", "k_compute"),
    ("InferOutputShapeFn", None), ("GetStartVersion", None), ("GetEndVersion", None), ("GetMayInplace", None),
    ("ReleaseMayInplace", None), ("GetAliasMap", None), ("ReleaseAliasMap", None),
]


class CustomOpStruct(Structure):
    _fields_ = [("version", c_uint32)] + [(name, c_void_p) for name, _ in _MEMBERS]


#: Everything handed to onnxruntime, for the process: OrtCustomOpDomain pointers and op adapters.
_kept: list[Any] = []


class CustomOpAdapter:
    """One ``hal.CustomOp`` as an OrtCustomOp."""

    def __init__(self, api: OrtApi, op: CustomOp, domain: str) -> None:
        self.api = api
        self.op = op
        self.domain = domain
        self.strings = Strings()
        self.struct = CustomOpStruct(CUSTOM_OP_VERSION)
        for name, tramp in _MEMBERS:
            setattr(self.struct, name, d.trampoline(tramp) if tramp else None)
        self.address = ctypes.addressof(self.struct)
        d.objects[self.address] = self

    def ep_type(self) -> int:
        """NULL (onnxruntime's CPU EP runs the op) unless the op names an EP."""
        return self.strings(self.op.execution_provider) if self.op.execution_provider else 0

    def create_kernel(self, args: Any) -> None:
        info, out = args[1], args[2]
        node = Node(self.op.op_type, _names(self.api, info, "Input"), _names(self.api, info, "Output"),
                    name=_string(self.api, "KernelInfo_GetNodeName", info), domain=self.domain)
        attributes = KernelInfoAttributes(self.api, info, node)
        node.attributes = attributes
        try:
            kernel = self.op.create_kernel(node)
        finally:
            attributes.close()  # onnxruntime's OrtKernelInfo is valid during this call only
        write_out(out, KernelAdapter(self.api, kernel, node).address)


class KernelAdapter:
    """A hal ``Kernel`` behind the ``void*`` onnxruntime hands KernelComputeV2 / KernelDestroy."""

    def __init__(self, api: OrtApi, kernel: Any, node: Node) -> None:
        self.api = api
        self.kernel = kernel
        self.node = node
        self.handle = c_void_p()
        self.address = ctypes.addressof(self.handle)
        d.objects[self.address] = self

    def compute(self, args: Any) -> None:
        api, ctx = self.api, args[0]
        n = c_size_t()
        api.call("KernelContext_GetInputCount", ctx, ctypes.byref(n))
        inputs: list = []
        for i in range(n.value):
            value = c_void_p()
            api.call("KernelContext_GetInput", ctx, i, ctypes.byref(value))
            if not value.value:
                inputs.append(None)  # an omitted optional input
                continue
            arr = tensors.view(api, value.value)
            arr.flags.writeable = False  # onnxruntime's buffer: the kernel reads it only
            inputs.append(arr)
        results = self.kernel.compute(inputs)
        api.call("KernelContext_GetOutputCount", ctx, ctypes.byref(n))
        if results is None or len(results) != n.value:
            raise InvalidArgument(f"custom op {self.node.op_type!r} (node {self.node.name!r}): its kernel returned "
                                  f"{'no list' if results is None else f'{len(results)} output(s)'} where the node has "
                                  f"{n.value}; return one array per output")
        for i, result in enumerate(results):
            if result is None:
                continue
            arr = np.asarray(result, order="C")  # not ascontiguousarray, which makes a 0-d result 1-d
            dims = (c_int64 * max(arr.ndim, 1))(*arr.shape)
            value = c_void_p()
            api.call("KernelContext_GetOutput", ctx, i, dims, arr.ndim, ctypes.byref(value))
            target = tensors.view(api, value.value)
            if target.dtype != arr.dtype:
                raise InvalidArgument(
                    f"custom op {self.node.op_type!r} (node {self.node.name!r}): output {i} "
                    f"({self.node.outputs[i] if i < len(self.node.outputs) else ''!r}) is {arr.dtype} but onnxruntime "
                    f"typed it {target.dtype} (custom-op outputs take their inputs' type unless the model declares "
                    "another); return that type or declare the output's type in the model")
            target[...] = arr

    def destroy(self) -> None:
        d.objects.pop(self.address, None)


class KernelInfoAttributes(dict):
    """A node's attributes read from onnxruntime's ``OrtKernelInfo`` by name, on first use: int,
    float, string, ints, floats, and a tensor as a numpy array (a copy), as onnxhal's own nodes hold
    them. Graph attributes read as absent: ``OrtKernelInfo`` has no getter for them (onnxruntime's
    ``OrtApi`` has ``KernelInfoGetAttribute_`` float, int64, string, their arrays and tensor only).
    Open only while the kernel is created; a name read then stays readable after."""

    # the tensor reader before the array readers: onnxruntime's float-array getter also reads a
    # float tensor attribute, flattened
    _READERS = ("int", "float", "string", "tensor", "ints", "floats")

    def __init__(self, api: OrtApi, info: int, node: Node) -> None:
        super().__init__()
        self._api, self._info, self._node = api, info, node
        self._absent: set[str] = set()

    def close(self) -> None:
        self._info = 0

    def _fetch(self, name: str) -> bool:
        if dict.__contains__(self, name):
            return True
        if name in self._absent:
            return False
        if not self._info:
            raise InvalidArgument(f"custom op {self._node.op_type!r} (node {self._node.name!r}): attribute {name!r} "
                                  "was first read after create_kernel returned, when onnxruntime's kernel info is "
                                  "gone; read the attributes the kernel needs in create_kernel")
        for kind in self._READERS:
            found, value = _attribute(self._api, self._info, name, kind)
            if found:
                dict.__setitem__(self, name, value)
                return True
        self._absent.add(name)
        return False

    def __getitem__(self, name: str) -> Any:
        if not self._fetch(name):
            raise KeyError(name)
        return dict.__getitem__(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return dict.__getitem__(self, name) if self._fetch(name) else default

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._fetch(name)


def _attribute(api: OrtApi, info: int, name: str, kind: str) -> tuple[bool, Any]:
    """(found, value) of attribute ``name`` read as ``kind``; onnxruntime refuses another type."""
    key = name.encode()
    size = c_size_t()
    if kind == "tensor":
        # onnxruntime makes an OrtValue with the allocator given (the default CPU one) and hands it over
        allocator, value = c_void_p(), c_void_p()
        api.call("GetAllocatorWithDefaultOptions", ctypes.byref(allocator))
        if not _ok(api, api.ort["KernelInfoGetAttribute_tensor"](info, key, allocator, ctypes.byref(value))):
            return False, None
        try:
            return True, np.array(tensors.view(api, value.value))
        finally:
            api.ort["ReleaseValue"](value)
    if kind in ("int", "float"):
        out = c_int64() if kind == "int" else c_float()
        fn = api.ort["KernelInfoGetAttribute_int64" if kind == "int" else "KernelInfoGetAttribute_float"]
        return (True, out.value) if _ok(api, fn(info, key, ctypes.byref(out))) else (False, None)
    fn = {"string": api.ort["KernelInfoGetAttribute_string"], "ints": api.ort["KernelInfoGetAttributeArray_int64"],
          "floats": api.ort["KernelInfoGetAttributeArray_float"]}[kind]
    if not _ok(api, fn(info, key, None, ctypes.byref(size))):
        return False, None
    if kind == "string":
        buf = ctypes.create_string_buffer(max(size.value, 1))
        api.check(fn(info, key, buf, ctypes.byref(size)), "KernelInfoGetAttribute_string")
        return True, buf.value.decode()
    arr = ((c_int64 if kind == "ints" else c_float) * max(size.value, 1))()
    api.check(fn(info, key, arr, ctypes.byref(size)), f"KernelInfoGetAttributeArray ({name})")
    return True, list(arr)[:size.value]


def _ok(api: OrtApi, status: int | None) -> bool:
    if status:
        api.ort["ReleaseStatus"](status)
        return False
    return True


def _string(api: OrtApi, function: str, info: int, *index: int) -> str:
    """A string onnxruntime writes into a caller's buffer (size asked first)."""
    size = c_size_t()
    api.call(function, info, *index, None, ctypes.byref(size))
    buf = ctypes.create_string_buffer(max(size.value, 1))
    api.call(function, info, *index, buf, ctypes.byref(size))
    return buf.value.decode()


def _names(api: OrtApi, info: int, kind: str) -> list[str]:
    n = c_size_t()
    api.call(f"KernelInfo_Get{kind}Count", info, ctypes.byref(n))
    return [_string(api, f"KernelInfo_Get{kind}Name", info, i) for i in range(n.value)]


def domains_for(api: OrtApi, factory_name: str, domains: Sequence[CustomOpDomain]) -> list[int]:
    """OrtCustomOpDomain pointers for ``domains`` (a factory's ``get_custom_op_domains()``), made once
    per factory adapter and kept for the process."""
    out = []
    for domain in domains:
        if not isinstance(domain, CustomOpDomain):
            raise Fail(f"{factory_name}.get_custom_op_domains returned {domain!r}, not a hal.CustomOpDomain")
        handle = c_void_p()
        api.call("CreateCustomOpDomain", domain.domain.encode(), ctypes.byref(handle))
        _kept.append(handle.value)
        for op in domain.ops:
            adapter = CustomOpAdapter(api, op, domain.domain)
            _kept.append(adapter)
            api.call("CustomOpDomain_Add", handle.value, adapter.address)
        out.append(handle.value)
    return out


def write_domains(domains: list[int], out: int, count: int) -> None:
    """GetCustomOpDomains: the first ``count`` domains into onnxruntime's array."""
    array = ctypes.cast(out, POINTER(c_void_p))
    for i, handle in enumerate(domains[:count]):
        array[i] = handle


def register_custom_ops(_: Any, args: Any) -> None:
    """``RegisterCustomOps(options, api_base)``: the custom-op domains of every factory of the
    registered library into ``options`` (onnxruntime's custom-op library entry point)."""
    from onnxhal.ort_plugin.library import bound_api

    bound_api(args[1])  # errors become onnxruntime statuses even before the first registration
    factories = [f for f in list(d.objects.values()) if hasattr(f, "ort_custom_op_domains")]
    if not factories:
        raise InvalidArgument(
            "onnxhal's EP library is not registered with onnxruntime, so it has no factory whose "
            "custom operators it could add; call onnxruntime.register_execution_provider_library(name, "
            "onnxhal.ort_plugin.library_path()) before SessionOptions.register_custom_ops_library")
    for factory in factories:
        for handle in factory.ort_custom_op_domains():
            factory.api.call("AddCustomOpDomain", args[0], handle)


d.HANDLERS.update({
    d.REGISTER_CUSTOM_OPS: register_custom_ops,
    d.O_CREATE_KERNEL: lambda o, a: o.create_kernel(a),
    d.O_GET_NAME: lambda o, a: o.strings(o.op.op_type),
    d.O_GET_EP_TYPE: lambda o, a: o.ep_type(),
    d.O_GET_INPUT_TYPE: lambda o, a: UNDEFINED,
    d.O_GET_OUTPUT_TYPE: lambda o, a: UNDEFINED,
    d.O_GET_INPUT_TYPE_COUNT: lambda o, a: 1,
    d.O_GET_OUTPUT_TYPE_COUNT: lambda o, a: 1,
    d.O_GET_INPUT_CHARACTERISTIC: lambda o, a: VARIADIC,
    d.O_GET_OUTPUT_CHARACTERISTIC: lambda o, a: VARIADIC,
    d.O_GET_VARIADIC_MIN_ARITY: lambda o, a: 1,
    d.O_GET_VARIADIC_HOMOGENEITY: lambda o, a: 1,
    d.K_COMPUTE: lambda k, a: k.compute(a),
    d.K_DESTROY: lambda k, a: k.destroy(),
})
