"""SessionOptions and RunOptions, with onnxruntime's Python names and behaviour."""

from __future__ import annotations

import numbers
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxhal.hal import GraphOptimizationLevel, OrtEpDevice, OrtExecutionProviderDevicePolicy
from onnxhal.hal.enums import ExecutionMode, ExecutionOrder
from onnxhal.hal.errors import InvalidArgument, RuntimeInvalidArgument

DISABLE_CPU_EP_FALLBACK = "session.disable_cpu_ep_fallback"
RECORD_EP_GRAPH_ASSIGNMENT = "session.record_ep_graph_assignment_info"
EP_FAILOVER = "session.ep_failover"


def provider_option_prefix(ep_name: str) -> str:
    """ORT stores provider options as session config entries ``ep.<lowercase ep name>.<key>``."""
    return f"ep.{ep_name.lower()}."


def provider_options_dict(options: Mapping | None, what: str) -> dict[str, str]:
    """Provider options as ``{str: str}``; anything but a mapping is an InvalidArgument naming ``what``."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgument(f"{what}: provider options must be a dict of option name -> value, got "
                              f"{type(options).__name__} {options!r}")
    return {str(k): str(v) for k, v in options.items()}


def _checked_entry(kind: str, key: str, value: str) -> str:
    """A session or run config entry's value, once its key and value are checked to be strings."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{kind} config key must be a non-empty string, got {key!r}")
    if not isinstance(value, str):  # str(True) would be 'True', which no entry accepts
        raise InvalidArgument(f"{kind} config entry {key!r}: the value must be a string, got "
                              f"{type(value).__name__} {value!r}; pass e.g. '1' or '0'")
    return value


def check_session_options(so: SessionOptions) -> None:
    """The numeric options a session reads, checked before anything is built (ORT's bindings
    refuse wrong types at assignment; these attributes are plain Python ones)."""
    for name, enum in (("graph_optimization_level", GraphOptimizationLevel), ("execution_mode", ExecutionMode),
                       ("execution_order", ExecutionOrder)):
        value = getattr(so, name)
        try:
            enum(value)
        except (ValueError, TypeError):
            raise InvalidArgument(f"SessionOptions.{name} {value!r} is not one of "
                                  + ", ".join(f"{e.name} ({int(e)})" for e in enum)) from None
    for name in ("intra_op_num_threads", "inter_op_num_threads"):
        value = getattr(so, name)
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:  # numpy ints too
            raise InvalidArgument(f"SessionOptions.{name} {value!r} must be an int >= 0 (0: the default, one "
                                  "thread per physical core)")


def _dim_key(method: str, key: str) -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"{method}: the dimension name must be a non-empty string, got {key!r}")
    return key


def _dim_value(key: str, value: int) -> int:
    # onnxruntime takes a negative value and reports the dimension as that number; refuse it.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise InvalidArgument(f"free dimension override {key!r}: the value must be an int >= 0, got {value!r}")
    return int(value)


@dataclass
class ExplicitProvider:
    """One ``add_provider_for_devices`` call: devices of one EP, in append order."""

    devices: list[OrtEpDevice]
    options: dict[str, str] = field(default_factory=dict)


class SessionOptions:
    def __init__(self) -> None:
        self.graph_optimization_level = GraphOptimizationLevel.ORT_ENABLE_ALL
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = ExecutionMode.ORT_SEQUENTIAL
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxhal_profile"
        self.optimized_model_filepath = ""
        self.enable_mem_pattern = True
        self.enable_mem_reuse = True
        self.enable_cpu_mem_arena = True
        self.use_deterministic_compute = False  # every onnxhal kernel is deterministic already
        self.use_per_session_threads = True
        self.execution_order = ExecutionOrder.DEFAULT
        self._config: dict[str, str] = {}
        self._dims_by_name: dict[str, int] = {}
        self._dims_by_denotation: dict[str, int] = {}
        self._initializers: dict[str, Any] = {}
        self._external_initializers: dict[str, np.ndarray] = {}
        self._external_files: dict[str, memoryview] = {}
        # Shared with the copy a session keeps, so another thread can cancel a creation under way.
        self._cancel = threading.Event()
        self._explicit: list[ExplicitProvider] = []
        self._policy: OrtExecutionProviderDevicePolicy | None = None
        self._delegate: Callable | None = None
        self._ep_context_read: tuple[Callable, int] | None = None
        #: (domain, op type) -> hal.CustomOp from the session's EP libraries (set by the session)
        self.custom_ops: dict = {}

    # -- config entries --------------------------------------------------------------------
    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[key] = _checked_entry("session", key, value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            # onnxruntime's words (a RuntimeError there), and the remedy
            raise RuntimeInvalidArgument(f"SessionOptions does not have configuration with key: {key}. Set it "
                                         "with add_session_config_entry first.")
        return self._config[key]

    def config_entries(self) -> dict[str, str]:
        return dict(self._config)

    def config(self, key: str, default: str = "") -> str:
        return self._config.get(key, default)

    # -- EPContext data kept outside a compiled model ---------------------------------------
    def set_ep_context_data_read_func(self, read_func: Callable, max_data_size: int) -> None:
        """``read_func(name, buffer)`` supplies the data an EPContext node of a compiled model names
        (``embed_mode`` 0; what a ``ModelCompiler`` write callback received) when a session loads it:
        ``buffer.allocate(size)`` once, at most ``max_data_size``, then ``buffer.write(data, offset)``."""
        if not callable(read_func):
            raise TypeError(f"set_ep_context_data_read_func: read_func must be callable as read_func(name, buffer), "
                            f"got {read_func!r}")
        if isinstance(max_data_size, bool) or not isinstance(max_data_size, int) or max_data_size < 0:
            raise InvalidArgument(f"set_ep_context_data_read_func: max_data_size must be a byte count >= 0, got "
                                  f"{max_data_size!r}")
        self._ep_context_read = (read_func, max_data_size)

    def clear_ep_context_data_read_func(self) -> None:
        self._ep_context_read = None

    @property
    def ep_context_read(self) -> tuple[Callable, int] | None:
        return self._ep_context_read

    # -- model overrides --------------------------------------------------------------------
    def add_free_dimension_override_by_name(self, dim_name: str, dim_value: int) -> None:
        """Fix the model inputs' symbolic dimension ``dim_name`` (case-sensitive) to ``dim_value``
        at session creation: ``get_inputs`` shows the number and feeds must match it. The first
        override of a name wins, as in onnxruntime."""
        self._dims_by_name.setdefault(_dim_key("add_free_dimension_override_by_name", dim_name),
                                      _dim_value(dim_name, dim_value))

    def add_free_dimension_override_by_denotation(self, dim_denotation: str, dim_value: int) -> None:
        """As ``add_free_dimension_override_by_name``, for free dimensions whose denotation (e.g.
        ``DATA_BATCH``; compared case-insensitively, as onnxruntime) is ``dim_denotation``."""
        key = _dim_key("add_free_dimension_override_by_denotation", dim_denotation).lower()
        self._dims_by_denotation.setdefault(key, _dim_value(dim_denotation, dim_value))

    @property
    def free_dimension_overrides(self) -> tuple[dict[str, int], dict[str, int]]:
        """({dim name: value}, {lower-case denotation: value})."""
        return dict(self._dims_by_name), dict(self._dims_by_denotation)

    def add_initializer(self, name: str, val: Any) -> None:
        """Replace the model's initializer ``name`` with the host OrtValue ``val`` at session
        creation, without a copy (keep the array unchanged while sessions use it). Its dtype and
        shape must be the initializer's; a name the model lacks is ignored with a warning, so one
        set of initializers can serve several models (onnxruntime ignores it silently)."""
        from onnxhal.runtime.values.ortvalue import OrtValue

        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"add_initializer: name must be a non-empty string, got {name!r}")
        if not isinstance(val, OrtValue):
            raise TypeError(f"add_initializer({name!r}): expected an OrtValue, got {type(val).__name__}; wrap the "
                            "array with onnxhal.OrtValue.ortvalue_from_numpy(array)")
        if not isinstance(val.contents, np.ndarray):  # a device tensor, a sequence, None
            raise InvalidArgument(f"add_initializer({name!r}): the OrtValue must be a tensor in host memory, got "
                                  f"{val!r}; create it with OrtValue.ortvalue_from_numpy(array)")
        self._initializers[name] = val

    @property
    def initializer_overrides(self) -> dict[str, np.ndarray]:
        return {k: v.contents for k, v in self._initializers.items()}

    def add_external_initializers(self, names: Sequence[str], ortvalues: Sequence[Any]) -> None:
        """Initializers from memory, for a model whose data is stored outside it (onnxruntime's
        ``AddExternalInitializers``): each named initializer of the main graph takes the value's
        data at session creation, whether the model keeps it in an external file (which is then
        not read, and need not exist) or inline. A name the model lacks, or another dtype or shape,
        fails session creation with ``InvalidArgument``. The data is copied at session creation."""
        from onnxhal.runtime.values.ortvalue import OrtValue

        names, values = _paired("add_external_initializers", names, ortvalues)
        arrays = {}
        for name, val in zip(names, values):
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"add_external_initializers: names must be non-empty strings, got {name!r}")
            if not isinstance(val, OrtValue) or not isinstance(val.contents, np.ndarray):
                raise InvalidArgument(f"add_external_initializers({name!r}): expected an OrtValue holding a host "
                                      f"tensor, got {val!r}; wrap the array with OrtValue.ortvalue_from_numpy(array)")
            arrays[name] = val.contents
        self._external_initializers.update(arrays)

    def add_external_initializers_from_files_in_memory(self, names: Sequence[str], buffers: Sequence[Any],
                                                       lengths: Sequence[int]) -> None:
        """The contents of a model's external data files, from memory (onnxruntime's
        ``AddExternalInitializersFromFilesInMemory``): a tensor whose external ``location`` is one of
        ``names`` reads its ``offset``/``length`` from that buffer instead of the file. Keep the
        buffers unchanged until session creation ends; the data is copied then."""
        names, buffers = _paired("add_external_initializers_from_files_in_memory", names, buffers)
        lengths = list(lengths)
        if len(lengths) != len(names):
            raise InvalidArgument(f"add_external_initializers_from_files_in_memory: {len(names)} names and buffers "
                                  f"but {len(lengths)} lengths; give one length per buffer")
        files = {}
        for name, buf, n in zip(names, buffers, lengths):
            if not isinstance(name, str) or not name:
                raise InvalidArgument(f"add_external_initializers_from_files_in_memory: file names must be non-empty "
                                      f"strings, got {name!r}")
            try:
                view = memoryview(buf).cast("B")
            except TypeError as e:
                raise InvalidArgument(f"add_external_initializers_from_files_in_memory({name!r}): the buffer must "
                                      f"support the buffer protocol (bytes, bytearray, a uint8 array): {e}") from None
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= int(n) <= view.nbytes:
                raise InvalidArgument(f"add_external_initializers_from_files_in_memory({name!r}): length {n!r} for a "
                                      f"buffer of {view.nbytes} bytes; give 0 <= length <= the buffer's size")
            files[name] = view[:int(n)]
        self._external_files.update(files)

    @property
    def external_data(self) -> tuple[dict[str, np.ndarray], dict[str, memoryview]]:
        """({initializer name: array}, {external file name: its bytes}) for the model loader."""
        return dict(self._external_initializers), dict(self._external_files)

    def set_load_cancellation_flag(self, value: bool) -> None:
        """Ask a session creation using these options (running in another thread) to stop: it
        raises ``ModelLoadCanceled`` at its next stage and releases what it built. ``False``
        clears the request."""
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidArgument(f"set_load_cancellation_flag: expected a bool, got {value!r}")
        (self._cancel.set if value else self._cancel.clear)()

    @property
    def load_canceled(self) -> bool:
        return self._cancel.is_set()

    # -- providers --------------------------------------------------------------------------
    def add_provider_for_devices(self, ep_devices: Sequence[OrtEpDevice],
                                 provider_options: Mapping[str, str] | None = None) -> None:
        """ORT's ``SessionOptionsAppendExecutionProvider_V2``: devices of exactly one EP."""
        if ep_devices is None or isinstance(ep_devices, (str, bytes)) or not hasattr(ep_devices, "__iter__"):
            raise TypeError(f"add_provider_for_devices: ep_devices must be a list of OrtEpDevice, got {ep_devices!r}")
        devices = list(ep_devices)
        for d in devices:
            if not isinstance(d, OrtEpDevice):
                raise TypeError(f"add_provider_for_devices: {d!r} is not an OrtEpDevice (get them from "
                                "onnxhal.get_ep_devices())")
        if not devices:
            raise InvalidArgument("Must provide one or more OrtEpDevice instances.")
        names = {(d.ep_name, id(d.factory)) for d in devices}
        if len(names) > 1:
            raise InvalidArgument(
                "All OrtEpDevice values in ep_devices must have the same execution provider. Got "
                f"{sorted({d.ep_name for d in devices})}; call add_provider_for_devices once per EP.")
        options = provider_options_dict(provider_options, f"add_provider_for_devices ({devices[0].ep_name})")
        # Options become config entries at once; the EP device's own ep_options are applied at
        # session creation and the user's win (ORT's V2 order).
        prefix = provider_option_prefix(devices[0].ep_name)
        for k, v in options.items():
            self._config[prefix + k] = v
        self._explicit.append(ExplicitProvider(devices, options))

    def add_provider(self, provider_name: str, provider_options: Mapping[str, str] | None = None) -> None:
        """ORT's append-by-name (``SessionOptionsAppendExecutionProvider``): the EP's device that the
        ``device_id`` option names (its ordinal among the EP's devices), else its first, as a provider
        name given to ``InferenceSession`` takes it, with ``provider_options``."""
        from onnxhal.runtime.env.environment import get_available_providers, get_ep_devices

        devices = [d for d in get_ep_devices() if d.ep_name == provider_name]
        if not devices:
            raise InvalidArgument(f"add_provider: execution provider {provider_name!r} is unknown or has no EP device "
                                  f"here. Available providers: {get_available_providers()}. Register its library "
                                  "with onnxhal.register_execution_provider_library(), or check the spelling.")
        from onnxhal.runtime.env.provider_resolution import device_by_id

        options = provider_options_dict(provider_options, f"add_provider({provider_name!r})")
        self.add_provider_for_devices([device_by_id(provider_name, devices, options)], provider_options)

    def set_provider_selection_policy(self, policy: OrtExecutionProviderDevicePolicy) -> None:
        if not isinstance(policy, OrtExecutionProviderDevicePolicy):
            raise TypeError(f"set_provider_selection_policy expects an OrtExecutionProviderDevicePolicy, got "
                            f"{type(policy).__name__} {policy!r}")
        self._policy = policy
        self._delegate = None

    def set_provider_selection_policy_delegate(self, delegate: Callable) -> None:
        if not callable(delegate):
            raise TypeError(f"set_provider_selection_policy_delegate expects a callable, got {delegate!r}")
        self._delegate = delegate
        self._policy = None

    def has_providers(self) -> bool:
        return bool(self._explicit) or self._policy is not None or self._delegate is not None

    @property
    def explicit_providers(self) -> list[ExplicitProvider]:
        return list(self._explicit)

    @property
    def selection_policy(self) -> OrtExecutionProviderDevicePolicy | None:
        return self._policy

    @property
    def selection_delegate(self) -> Callable | None:
        return self._delegate

    def set_provider_option(self, ep_name: str, key: str, value: str, *, keep_existing: bool = False) -> None:
        """Set the ``ep.<ep_name>.<key>`` config entry an EP reads in ``create_ep``;
        ``keep_existing``: only when the entry is not set yet (an EP device's own defaults, which
        the user's options override)."""
        entry = provider_option_prefix(ep_name) + key
        if keep_existing:
            self._config.setdefault(entry, value)
        else:
            self._config[entry] = value

    def provider_options_for(self, ep_name: str) -> dict[str, str]:
        """The ``ep.<ep>.*`` entries without the prefix: what an EP reads in ``create_ep``."""
        prefix = provider_option_prefix(ep_name)
        return {k[len(prefix):]: v for k, v in self._config.items() if k.startswith(prefix)}

    def copy(self) -> SessionOptions:
        """An independent copy (config entries, providers and dimension overrides copied): a
        session works on its own, so later changes to these options do not reach it."""
        other = SessionOptions.__new__(SessionOptions)
        other.__dict__.update(self.__dict__)
        other._config = dict(self._config)
        other._explicit = list(self._explicit)
        other._dims_by_name = dict(self._dims_by_name)
        other._dims_by_denotation = dict(self._dims_by_denotation)
        other._initializers = dict(self._initializers)
        other._external_initializers = dict(self._external_initializers)
        other._external_files = dict(self._external_files)
        return other


def _paired(what: str, names: Sequence[str], values: Sequence[Any]) -> tuple[list, list]:
    if isinstance(names, (str, bytes)) or not hasattr(names, "__iter__"):
        raise InvalidArgument(f"{what}: names must be a list of strings, got {names!r}")
    names, values = list(names), list(values)
    if len(names) != len(values):
        raise InvalidArgument(f"{what}: {len(names)} names and {len(values)} values; give one value per name")
    return names, values


class RunOptions:
    def __init__(self) -> None:
        self.run_tag = ""
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.terminate = False
        self.only_execute_path_to_fetches = False
        self.logid = ""
        self._config: dict[str, str] = {}
        self._adapters: list = []

    def add_run_config_entry(self, key: str, value: str) -> None:
        self._config[key] = _checked_entry("run", key, value)

    def get_run_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeInvalidArgument(f"RunOptions does not have configuration with key: {key}. Set it with "
                                         "add_run_config_entry first.")
        return self._config[key]

    def add_active_adapter(self, adapter: Any) -> None:
        """Activate a ``LoraAdapter`` for the runs with these options: its parameters replace the
        model inputs or overridable initializers of the same names (see values/lora_adapters.py)."""
        from onnxhal.runtime.values.lora_adapters import LoraAdapter

        if not isinstance(adapter, LoraAdapter):
            raise InvalidArgument(f"add_active_adapter expects an onnxhal.LoraAdapter, got {type(adapter).__name__}; "
                                  "load one with adapter = onnxhal.LoraAdapter(); adapter.Load(path)")
        self._adapters.append(adapter)

    @property
    def active_adapters(self) -> tuple:
        """The ``LoraAdapter``s activated with ``add_active_adapter``, in order."""
        return tuple(self._adapters)

    def config(self, key: str, default: str = "") -> str:
        """A run config entry, or ``default`` when it is not set."""
        return self._config.get(key, default)
