"""The process-wide environment: discovered hardware, registered EP libraries and their EP devices.

ORT's ``Env``: discovery runs once (``rediscover`` re-runs it, for tests), the CPU EP library is
registered implicitly and first, and each registered library contributes its factories' EP devices
in registration order. Sessions take a reference on the libraries they use, so a library cannot be
unregistered under a live session (ORT unregisters it and crashes later; we refuse).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

from onnxhal.hal import EpApi, EpFactory, OrtEpDevice, OrtHardwareDevice, OrtHardwareDeviceType
from onnxhal.hal.errors import Fail, InvalidArgument, NoSuchFile

logger = logging.getLogger("onnxhal")

CPU_EP_NAME = "CPUExecutionProvider"
CPU_EP_VENDOR = "onnxhal"
CPU_LIBRARY_NAME = "CPUExecutionProvider"
CPU_LIBRARY_MODULE = "onnxhal.runtime.providers.cpu"
SIMULATE_ENV = "ONNXHAL_SIMULATE"
SIMULATORS_LIBRARY_NAME = "simulators"
SIMULATORS_LIBRARY_MODULE = "onnxhal.simulators"
#: Built-in EP libraries besides the CPU EP, by the EP name they provide: (registration name,
#: module). Registered on first use of that name (``providers=[name]``, ``onnxhal run --ep name``),
#: as onnxruntime's built-in EPs need no registration; not at start-up, because registering the
#: OpenCL EP loads the OpenCL drivers and probes every device.
BUILTIN_EP_LIBRARIES: dict[str, tuple[str, str]] = {
    "OpenCLExecutionProvider": ("OpenCLExecutionProvider", "onnxhal.runtime.providers.opencl"),
}
MAX_FACTORIES_PER_LIBRARY = 4
MAX_DEVICES_PER_FACTORY = 8

_TYPE_ORDER = {OrtHardwareDeviceType.NPU: 0, OrtHardwareDeviceType.GPU: 1, OrtHardwareDeviceType.CPU: 2}


@dataclass
class EpLibrary:
    """One registered library: its module, factories and the EP devices they offered."""

    name: str
    module: ModuleType
    library_path: str
    factories: list[EpFactory]
    ep_devices: list[OrtEpDevice]
    loaded_from_path: bool
    sessions: int = 0
    on_first_use: bool = False  # a built-in library registered because its EP name was asked for
    api: EpApi = field(default_factory=EpApi)


def is_default_cpu_ep(d: OrtEpDevice) -> bool:
    return d.device.type == OrtHardwareDeviceType.CPU and d.ep_name == CPU_EP_NAME and d.ep_vendor == CPU_EP_VENDOR


class Environment:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._hardware: list[OrtHardwareDevice] | None = None
        self._discovery_args: dict = {}
        self._libraries: dict[str, EpLibrary] = {}
        self._cpu_registered = False
        self._env_simulators_done = False  # ONNXHAL_SIMULATE's devices registered (or none asked for)
        self.config: dict[str, str] = {}

    # -- hardware ---------------------------------------------------------------------------
    def discovered_devices(self) -> list[OrtHardwareDevice]:
        with self._lock:
            if self._hardware is None:
                from onnxhal.devices import discover_hardware_devices

                self._hardware = discover_hardware_devices(**self._discovery_args)
            return list(self._hardware)

    def hardware_devices(self) -> list[OrtHardwareDevice]:
        """Discovered devices, then the virtual devices registered libraries created (beyond ORT,
        which hides virtual devices here; documented in docs/devices.md)."""
        out = self.discovered_devices()
        seen = {id(d) for d in out}
        for d in self.ep_devices():
            if d.device.is_virtual and id(d.device) not in seen:
                seen.add(id(d.device))
                out.append(d.device)
        return out

    def rediscover(self, **discovery_args) -> None:
        """Re-run discovery (e.g. with a fake ``sysfs_root``). Libraries already registered keep
        their EP devices; register them again to see new hardware."""
        with self._lock:
            self._discovery_args = dict(discovery_args)
            self._hardware = None

    # -- libraries --------------------------------------------------------------------------
    def _ensure_cpu(self) -> None:
        if not self._cpu_registered or not self._env_simulators_done:
            with self._lock:
                if not self._cpu_registered:
                    self._cpu_registered = True
                    self._register(CPU_LIBRARY_NAME, CPU_LIBRARY_MODULE)
                if not self._env_simulators_done:
                    # Marked done only once it succeeded: a bad ONNXHAL_SIMULATE fails every call, not
                    # only the first (the registry is left as it was, so trying again is safe).
                    self._register_simulators()
                    self._env_simulators_done = True

    def _register_simulators(self) -> None:
        """``ONNXHAL_SIMULATE=generic-npu,...``: register the simulated devices' library right after
        the CPU EP. By module name: the runtime never imports ``onnxhal.simulators`` itself."""
        value = os.environ.get(SIMULATE_ENV, "").strip()
        if not value:
            return
        try:
            self._register(SIMULATORS_LIBRARY_NAME, SIMULATORS_LIBRARY_MODULE)
        except Fail as e:
            # A user's typo (an unknown profile, a bad TOML key) is reported as what the user wrote,
            # not as a failure inside the library that read it.
            if isinstance(e.__cause__, InvalidArgument):
                raise InvalidArgument(f"{SIMULATE_ENV}={value!r}: {e.__cause__}; fix or unset {SIMULATE_ENV}") \
                    from e.__cause__
            raise

    def register_library(self, name: str, library: str | os.PathLike) -> None:
        self._ensure_cpu()
        with self._lock:
            self._register(name, library)

    def _register(self, name: str, library: str | os.PathLike) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"EP library registration name must be a non-empty string, got {name!r}")
        if name in self._libraries:
            raise InvalidArgument(
                f"EP library is already registered under {name!r} "
                f"(from {self._libraries[name].library_path}). Unregister it first or choose another name.")
        module, path, from_path = load_library_module(name, library)
        factories: list[EpFactory] = []
        api = EpApi(self.config)
        try:
            factories = create_library_factories(name, module, api)
            self._drop_on_first_use(factories)
            taken = {d.ep_name: lib.name for lib in self._libraries.values() for d in lib.ep_devices}
            taken.update({f.name: lib.name for lib in self._libraries.values() for f in lib.factories})
            for f in factories:
                if f.name in taken:
                    raise InvalidArgument(
                        f"EP library {name!r}: EP name {f.name!r} is already provided by library "
                        f"{taken[f.name]!r}. Unregister that library first.")
            hardware = sorted(self.discovered_devices(), key=lambda d: _TYPE_ORDER[d.type])
            devices: list[OrtEpDevice] = []
            for f in factories:
                devices.extend(_supported_devices(name, f, hardware, path))
        except BaseException:
            _release_all(module, factories)
            if from_path:
                sys.modules.pop(module.__name__, None)
            raise
        for d in devices:
            d.library_name = name
        self._libraries[name] = EpLibrary(name, module, path, factories, devices, from_path, api=api)
        logger.info("registered EP library %r (%s): %d EP device(s)", name, path, len(devices))

    def register_builtin(self, ep_name: str) -> bool:
        """Register the built-in library providing ``ep_name`` unless a library already provides it.
        Returns whether one provides it now (False: ``ep_name`` is not a built-in EP)."""
        entry = BUILTIN_EP_LIBRARIES.get(ep_name)
        if entry is None:
            return False
        self._ensure_cpu()
        with self._lock:
            if self.factory_for(ep_name) is None:
                name, module = entry
                self._register(name, module)
                self._libraries[name].on_first_use = True
        return True

    def no_device_reason(self, ep_name: str) -> str:
        """Why the library providing ``ep_name`` offers no EP device ("" when it gives no reason):
        its module's optional ``no_device_reason()`` (the OpenCL EP names the probe's verdict)."""
        found = self.factory_for(ep_name)
        reason = getattr(found[1].module, "no_device_reason", None) if found is not None else None
        return str(reason()) if callable(reason) else ""

    def _drop_on_first_use(self, factories: list[EpFactory]) -> None:
        """An explicit registration of a built-in EP takes over from the registration its first use
        by name made, if no session uses that one."""
        names = {f.name for f in factories}
        for lib in list(self._libraries.values()):
            if lib.on_first_use and lib.sessions == 0 and names & {f.name for f in lib.factories}:
                del self._libraries[lib.name]
                _release_all(lib.module, lib.factories)

    def unregister_library(self, name: str) -> None:
        self._ensure_cpu()
        with self._lock:
            lib = self._libraries.get(name)
            if lib is None:
                raise InvalidArgument(
                    f"EP library {name!r} was not registered. Registered: {sorted(self._libraries)}")
            if name == CPU_LIBRARY_NAME:
                raise InvalidArgument("the built-in CPU EP library cannot be unregistered")
            if lib.sessions > 0:
                raise Fail(
                    f"EP library {name!r} is used by {lib.sessions} live session(s): unregistering it now "
                    "would pull the EP out from under them. Release those sessions first "
                    "(del session / session.close()), then unregister.")
            del self._libraries[name]
            _release_all(lib.module, lib.factories)
            if lib.loaded_from_path:
                sys.modules.pop(lib.module.__name__, None)

    def force_unregister(self, name: str) -> None:
        """Test teardown only: drop a library even if sessions still reference it."""
        with self._lock:
            lib = self._libraries.pop(name, None)
            if lib is not None:
                _release_all(lib.module, lib.factories)

    def ep_devices(self) -> list[OrtEpDevice]:
        self._ensure_cpu()
        with self._lock:
            return [d for lib in self._libraries.values() for d in lib.ep_devices]

    def libraries(self) -> list[EpLibrary]:
        self._ensure_cpu()
        with self._lock:
            return list(self._libraries.values())

    def factory_for(self, ep_name: str) -> tuple[EpFactory, EpLibrary] | None:
        for lib in self.libraries():
            for f in lib.factories:
                if f.name == ep_name:
                    return f, lib
        return None

    def acquire(self, libraries: Iterable[EpLibrary]) -> None:
        """Count a session on each of ``libraries`` (the library objects its EPs came from)."""
        with self._lock:
            for lib in libraries:
                lib.sessions += 1

    def release(self, libraries: Iterable[EpLibrary]) -> None:
        """Uncount a session on the same library objects ``acquire`` counted it on. By object, not
        by name: a session outliving a forced unregister must not uncount a library registered
        later under the same name (that one could then be unregistered under its live sessions)."""
        with self._lock:
            for lib in libraries:
                lib.sessions = max(0, lib.sessions - 1)


def load_library_module(name: str, library: str | os.PathLike) -> tuple[ModuleType, str, bool]:
    """Import an EP library registered as ``name``: a dotted module name, or a ``.py`` path loaded
    under a private module name. Returns (module, its file or name, whether it came from a path).
    Raises ``NoSuchFile`` when there is no such module or file, ``Fail`` when importing it fails.
    ``ort_plugin`` loads libraries for onnxruntime with it, so they load the same in both."""
    text = os.fspath(library) if isinstance(library, os.PathLike) else library
    if not isinstance(text, str) or not text:
        raise InvalidArgument(f"EP library {name!r}: library must be a dotted module name or a .py path, got {library!r}")
    looks_like_path = text.endswith(".py") or os.sep in text or isinstance(library, os.PathLike)
    if looks_like_path:
        path = os.path.abspath(text)
        if not os.path.isfile(path):
            raise NoSuchFile(f"EP library {name!r}: no such file {path!r}. Pass the path of a .py file "
                             "or a dotted module name.")
        mod_name = f"onnxhal_ep_library_{abs(hash((name, path))):x}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise Fail(f"EP library {name!r}: cannot load {path!r} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as e:
            sys.modules.pop(mod_name, None)
            raise Fail(f"EP library {name!r}: importing {path!r} failed: {type(e).__name__}: {e}") from e
        return module, path, True
    try:
        module = importlib.import_module(text)
    except ModuleNotFoundError as e:
        raise NoSuchFile(f"EP library {name!r}: no module named {text!r} ({e}). Install the package that "
                         "provides it or pass the path of a .py file.") from e
    except BaseException as e:
        raise Fail(f"EP library {name!r}: importing module {text!r} failed: {type(e).__name__}: {e}") from e
    return module, getattr(module, "__file__", None) or text, False


def create_library_factories(name: str, module: ModuleType, api: EpApi) -> list[EpFactory]:
    """Call an EP library module's ``create_ep_factories(name, api, logger)`` and check what it
    returns: 1 to ``MAX_FACTORIES_PER_LIBRARY`` named ``hal.EpFactory`` instances (released
    through the module's ``release_ep_factory`` when not). Raises ``Fail`` naming the library."""
    create = getattr(module, "create_ep_factories", None)
    if not callable(create):
        raise Fail(f"EP library {name!r} ({getattr(module, '__file__', module.__name__)}): Failed to get symbol "
                   "create_ep_factories. An EP library must define create_ep_factories(registration_name, api, "
                   "logger) and release_ep_factory(factory).")
    try:
        result = create(name, api, logging.getLogger(f"onnxhal.ep.{name}"))
    except Exception as e:
        raise Fail(f"EP library {name!r}: create_ep_factories raised {type(e).__name__}: {e}") from e
    if isinstance(result, EpFactory):
        result = [result]
    if not isinstance(result, (list, tuple)):
        raise Fail(f"EP library {name!r}: create_ep_factories must return a list of hal.EpFactory, "
                   f"got {type(result).__name__}")
    factories = list(result)
    bad = [f for f in factories if not isinstance(f, EpFactory)]
    if bad:
        _release_all(module, [f for f in factories if isinstance(f, EpFactory)])
        raise Fail(f"EP library {name!r}: create_ep_factories returned {type(bad[0]).__name__} where a "
                   "hal.EpFactory subclass instance is required")
    if not factories or len(factories) > MAX_FACTORIES_PER_LIBRARY:
        _release_all(module, factories)
        raise Fail(f"EP library {name!r}: create_ep_factories returned {len(factories)} factories; "
                   f"1 to {MAX_FACTORIES_PER_LIBRARY} are allowed")
    for f in factories:
        if not isinstance(f.name, str) or not f.name:
            _release_all(module, factories)
            raise Fail(f"EP library {name!r}: factory {type(f).__name__} has no EP name (set the class attribute "
                       "`name`)")
    return factories


def _supported_devices(lib_name: str, factory: EpFactory, hardware: list[OrtHardwareDevice],
                       path: str) -> list[OrtEpDevice]:
    try:
        devices = factory.get_supported_devices(list(hardware))
    except Exception as e:
        raise Fail(f"EP library {lib_name!r}: {factory.name}.get_supported_devices raised "
                   f"{type(e).__name__}: {e}") from e
    devices = list(devices or [])
    if len(devices) > MAX_DEVICES_PER_FACTORY:
        raise Fail(f"EP library {lib_name!r}: {factory.name} offered {len(devices)} EP devices; at most "
                   f"{MAX_DEVICES_PER_FACTORY} are allowed")
    for d in devices:
        if not isinstance(d, OrtEpDevice) or d.factory is not factory:
            raise Fail(f"EP library {lib_name!r}: {factory.name}.get_supported_devices must return OrtEpDevices "
                       "made with api.create_ep_device(self, ...)")
        # ORT adds these two keys to every EP device's metadata.
        d.add_ep_metadata({"version": str(factory.version), "library_path": path})
    return devices


def _release_all(module: ModuleType, factories: list[EpFactory]) -> None:
    release = getattr(module, "release_ep_factory", None)
    if not callable(release):
        return
    for f in factories:
        try:
            release(f)
        except Exception:  # releasing must not hide the error being reported
            logger.exception("release_ep_factory(%s) raised", getattr(f, "name", f))


_ENV = Environment()


def get_environment() -> Environment:
    return _ENV


def get_ep_devices() -> list[OrtEpDevice]:
    return _ENV.ep_devices()


def get_hardware_devices() -> list[OrtHardwareDevice]:
    return _ENV.hardware_devices()


def register_execution_provider_library(name: str, library: str | os.PathLike) -> None:
    _ENV.register_library(name, library)


def unregister_execution_provider_library(name: str) -> None:
    _ENV.unregister_library(name)


def get_available_providers() -> list[str]:
    """EP names with at least one EP device, in selection priority order, CPU last (as ORT)."""
    names: list[str] = []
    for d in _ENV.ep_devices():
        if d.ep_name not in names:
            names.append(d.ep_name)
    names.sort(key=lambda n: n == CPU_EP_NAME)
    return names


def get_device() -> str:
    """What this build computes on, as onnxruntime's ``get_device()``: "CPU" (other devices come as
    EP libraries, found with ``get_ep_devices()``)."""
    return "CPU"


def get_version_string() -> str:
    """onnxhal's version: the installed distribution's (pyproject.toml), as ``onnxhal.__version__``;
    "unknown" for a source tree used without installing it (the CLI's tables and --version still work)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onnxhal")
    except PackageNotFoundError:
        return "unknown"


def get_all_providers() -> list[str]:
    """Every EP name of every registered library, whether or not it found a device, and the built-in
    EPs registered on first use (as onnxruntime lists every EP it was built with)."""
    names: list[str] = []
    for lib in _ENV.libraries():
        for f in lib.factories:
            if f.name not in names:
                names.append(f.name)
    names.extend(n for n in BUILTIN_EP_LIBRARIES if n not in names)
    names.sort(key=lambda n: n == CPU_EP_NAME)
    return names


def env_config() -> Mapping[str, str]:
    return dict(_ENV.config)
