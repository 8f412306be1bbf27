"""The EP library registry: the plugin contract, metadata ORT adds, and every registration error."""

from __future__ import annotations

import gc
import os

import pytest

import onnxhal
from onnxhal import errors, hal
from tests.conftest import PLUGINS

TOY = os.path.join(PLUGINS, "toy_ep.py")


def test_cpu_ep_is_registered_implicitly_and_first():
    devices = onnxhal.get_ep_devices()
    assert devices[0].ep_name == "CPUExecutionProvider"
    assert devices[0].ep_vendor == "onnxhal"
    assert devices[0].device.type == hal.OrtHardwareDeviceType.CPU
    assert devices[0].ep_metadata["version"] == "0.1.0"
    assert devices[0].ep_metadata["library_path"].endswith(os.path.join("cpu", "__init__.py"))
    assert onnxhal.get_available_providers()[-1] == "CPUExecutionProvider"


def test_plugin_contract_from_a_py_file(register):
    before = len(onnxhal.get_ep_devices())
    register(TOY, "toy")
    devices = onnxhal.get_ep_devices()
    toy = [d for d in devices if d.ep_name == "ToyExecutionProvider"]
    assert len(devices) == before + len(toy) and len(toy) == 1
    assert devices[:before][0].ep_name == "CPUExecutionProvider"  # appended in registration order
    d = toy[0]
    assert d.ep_vendor == "Toy"
    assert d.ep_metadata == {"k": "v", "version": "0.1.0", "library_path": TOY}
    assert d.ep_options == {"opt": "1"}
    assert d.device.type == hal.OrtHardwareDeviceType.CPU
    assert d.memory_info(hal.OrtDeviceMemoryType.DEFAULT) is None  # CPU memory
    md = d.ep_metadata
    md["k"] = "changed"
    assert d.ep_metadata["k"] == "v"  # a copy, as ORT
    assert "ToyExecutionProvider" in onnxhal.get_available_providers()
    assert "ToyExecutionProvider" in onnxhal.get_all_providers()


def test_plugin_contract_from_a_dotted_module(register):
    register("tests.plugins.toy_ep", "toy_module")
    d = [d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyExecutionProvider"][0]
    assert d.ep_metadata["library_path"].endswith("toy_ep.py")


def test_plugin_session_runs_on_the_toy_ep_with_cpu_fallback(register):
    register(TOY, "toy_session")
    from tests.models import add_mul_model

    dev = [d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyExecutionProvider"]
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices(dev, {"run_fast": "1"})
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    assert sess.get_providers() == ["ToyExecutionProvider", "CPUExecutionProvider"]
    assert sess.get_provider_options()["ToyExecutionProvider"] == {"run_fast": "1", "opt": "1"}


def test_hardware_device_is_immutable():
    d = onnxhal.get_hardware_devices()[0]
    with pytest.raises(AttributeError):
        d.vendor = "x"
    with pytest.raises(TypeError):
        d.metadata["x"] = "y"


@pytest.mark.parametrize("library, error, words", [
    ("/nonexistent/dir/ep.py", errors.NoSuchFile, "no such file"),
    ("onnxhal_no_such_module_xyz", errors.NoSuchFile, "no module named"),
])
def test_missing_library(library, error, words):
    with pytest.raises(error, match=words) as e:
        onnxhal.register_execution_provider_library("missing", library)
    assert "missing" in str(e.value)
    assert "missing" not in {lib.name for lib in onnxhal.runtime.env.environment.get_environment().libraries()}


BAD_LIBRARIES = {
    "no_entry": ("x = 1\n", errors.Fail, "create_ep_factories"),
    "raises": ("def create_ep_factories(n, api, log):\n    raise RuntimeError('boom')\n", errors.Fail, "boom"),
    "not_a_factory": ("def create_ep_factories(n, api, log):\n    return [object()]\n", errors.Fail,
                      "hal.EpFactory"),
    "not_a_list": ("def create_ep_factories(n, api, log):\n    return 42\n", errors.Fail, "list"),
    "import_error": ("raise ImportError('needs libfoo')\n", errors.Fail, "needs libfoo"),
    "bad_devices": ("""
from onnxhal import hal
class F(hal.EpFactory):
    name = 'BadDevicesEP'
    def get_supported_devices(self, hw):
        return ['not a device']
def create_ep_factories(n, api, log):
    return [F()]
""", errors.Fail, "create_ep_device"),
}


@pytest.mark.parametrize("case", sorted(BAD_LIBRARIES))
def test_bad_library_is_refused_and_leaves_nothing(case, plugin_file):
    source, error, words = BAD_LIBRARIES[case]
    path = plugin_file(source, case)
    before_devices = len(onnxhal.get_ep_devices())
    before_libs = [lib.name for lib in onnxhal.runtime.env.environment.get_environment().libraries()]
    with pytest.raises(error, match=words) as e:
        onnxhal.register_execution_provider_library(case, path)
    assert case in str(e.value)  # names the library
    assert len(onnxhal.get_ep_devices()) == before_devices
    assert [lib.name for lib in onnxhal.runtime.env.environment.get_environment().libraries()] == before_libs
    # The name is free again: a good library registers under it.
    onnxhal.register_execution_provider_library(case, TOY)
    onnxhal.unregister_execution_provider_library(case)


def test_failed_registration_releases_its_factories(plugin_file):
    path = plugin_file("""
from onnxhal import hal
RELEASED = []
class F(hal.EpFactory):
    name = 'ReleasedEP'
    def get_supported_devices(self, hw):
        raise RuntimeError('device probe failed')
def create_ep_factories(n, api, log):
    return [F()]
def release_ep_factory(f):
    import builtins
    builtins._onnxhal_released = getattr(builtins, '_onnxhal_released', 0) + 1
""")
    import builtins

    builtins._onnxhal_released = 0
    with pytest.raises(errors.Fail, match="device probe failed"):
        onnxhal.register_execution_provider_library("released", path)
    assert builtins._onnxhal_released == 1


def test_duplicate_registration_name(register):
    register(TOY, "dup")
    with pytest.raises(errors.InvalidArgument, match="already registered under 'dup'"):
        onnxhal.register_execution_provider_library("dup", TOY)


def test_unregister_unknown_name():
    with pytest.raises(errors.InvalidArgument, match="was not registered"):
        onnxhal.unregister_execution_provider_library("never_registered")


def test_unregister_refused_while_a_session_uses_it(register):
    from tests.models import add_mul_model

    name = register(TOY, "in_use")
    so = onnxhal.SessionOptions()
    so.add_provider_for_devices([d for d in onnxhal.get_ep_devices() if d.ep_name == "ToyExecutionProvider"], {})
    sess = onnxhal.InferenceSession(add_mul_model(), so)
    with pytest.raises(errors.Fail, match="live session"):
        onnxhal.unregister_execution_provider_library(name)
    assert any(d.ep_name == "ToyExecutionProvider" for d in onnxhal.get_ep_devices())
    del sess
    gc.collect()
    onnxhal.unregister_execution_provider_library(name)
    assert not any(d.ep_name == "ToyExecutionProvider" for d in onnxhal.get_ep_devices())


def test_a_session_outliving_a_forced_unregister_does_not_uncount_the_next_library(register):
    """A failed test's traceback keeps its sessions alive, so its fixture force-unregisters the
    library; the next test registers one under the same name. The old session, dropped later, must
    not uncount the new library's sessions (counted by name, it did: the new library could then be
    unregistered under a live session)."""
    from tests.models import add_mul_model

    name = register(TOY, "reused")
    old = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    onnxhal.runtime.env.environment.get_environment().force_unregister(name)
    register(TOY, name)
    new = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    old.close()
    with pytest.raises(errors.Fail, match="1 live session"):
        onnxhal.unregister_execution_provider_library(name)
    new.close()
    onnxhal.unregister_execution_provider_library(name)


def test_session_close_releases_the_library(register):
    from tests.models import add_mul_model

    name = register(TOY, "closed")
    sess = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    sess.close()
    onnxhal.unregister_execution_provider_library(name)


def test_virtual_hardware_devices_through_the_api(register, plugin_file):
    path = plugin_file("""
from onnxhal import hal
class F(hal.EpFactory):
    name = 'VirtNpuEP'; vendor = 'Virt'; vendor_id = 0xABCD
    def __init__(self, api):
        self.api = api
        self.hw = api.create_hardware_device(hal.OrtHardwareDeviceType.NPU, 0xABCD, 7, 'Virt', {'k': 'v'})
    def get_supported_devices(self, hw):
        return [self.api.create_ep_device(self, self.hw)]
def create_ep_factories(n, api, log):
    return [F(api)]
def release_ep_factory(f):
    pass
""")
    register(path, "virt")
    d = [d for d in onnxhal.get_ep_devices() if d.ep_name == "VirtNpuEP"][0]
    assert d.device.type == hal.OrtHardwareDeviceType.NPU
    assert d.device.metadata == {"k": "v", "is_virtual": "1"}
    assert d.device in onnxhal.get_hardware_devices()


def test_teardown_after_a_failed_test_drops_a_library_its_sessions_still_hold(register):
    """pytest keeps a failed test's traceback, and with it the test's sessions: the module fixtures
    (tests/test_real_models.py's ``opencl``) then drop the library anyway instead of adding a
    teardown ERROR that leaves it registered ("used by 2 live sessions"); the next registration of
    the name works and counts its own sessions only."""
    from tests.conftest import unregister_after_scope
    from tests.models import add_mul_model

    name = register(TOY, "held_by_a_failure")
    held = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    unregister_after_scope(name, failed_in_scope=True)
    assert name not in {lib.name for lib in onnxhal.runtime.env.environment.get_environment().libraries()}
    register(TOY, name)
    fresh = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    held.close()
    fresh.close()
    unregister_after_scope(name, failed_in_scope=False)


def test_teardown_with_no_failure_reports_a_session_still_alive(register):
    """With every test passed, a session alive at teardown is a leak (a cycle, a thread, a cache):
    the fixture's Fail stands, naming the library, raised after the library is dropped, so the
    next registration of the name (the next test's) works."""
    from tests.conftest import unregister_after_scope
    from tests.models import add_mul_model

    name = register(TOY, "leaked")
    leaked = onnxhal.InferenceSession(add_mul_model(), providers=["ToyExecutionProvider"])
    with pytest.raises(errors.Fail, match="'leaked' is used by 1 live session"):
        unregister_after_scope(name, failed_in_scope=False)
    assert name not in {lib.name for lib in onnxhal.runtime.env.environment.get_environment().libraries()}
    leaked.close()
    register(TOY, name)
