"""onnxruntime's environment config reaching onnxhal's factories, through onnxruntime's C API.

onnxruntime's Python module makes its environment itself and offers no way to give it config entries
(``CreateEnvWithOptions``, onnxruntime 1.24 on), so this check drives the C library shipped in the
wheel (``onnxruntime/capi/libonnxruntime.so.*``) with ctypes, as a C or C# application would: an
environment with config entries, onnxhal's library registered in it, a session created on one of its
devices. The Python module is not imported (the shared library is a second copy of onnxruntime).
``python -m tests.ort_bridge_env NAME`` prints a JSON line last.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import json
import os
import sys
from ctypes import POINTER, c_char_p, c_size_t, c_uint32, c_void_p
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from onnxhal.ort_plugin.api_table import ORT_API  # noqa: E402

P, PP, S = c_void_p, POINTER(c_void_p), c_void_p
SIGNATURES = {
    "GetErrorMessage": (c_char_p, (P,)),
    "ReleaseStatus": (None, (P,)),
    "CreateKeyValuePairs": (None, (PP,)),
    "AddKeyValuePair": (None, (P, c_char_p, c_char_p)),
    "ReleaseKeyValuePairs": (None, (P,)),
    "CreateEnvWithOptions": (S, (P, PP)),
    "ReleaseEnv": (None, (P,)),
    "RegisterExecutionProviderLibrary": (S, (P, c_char_p, c_char_p)),
    "UnregisterExecutionProviderLibrary": (S, (P, c_char_p)),
    "GetEpDevices": (S, (P, POINTER(POINTER(c_void_p)), POINTER(c_size_t))),
    "EpDevice_EpName": (c_char_p, (P,)),
    "CreateSessionOptions": (S, (PP,)),
    "ReleaseSessionOptions": (None, (P,)),
    "SessionOptionsAppendExecutionProvider_V2": (S, (P, P, PP, c_size_t, POINTER(c_char_p), POINTER(c_char_p),
                                                     c_size_t)),
    "CreateSessionFromArray": (S, (P, c_void_p, c_size_t, P, PP)),
    "ReleaseSession": (None, (P,)),
}


#: CreateEnvWithOptions is slot 406 in onnxruntime 1.24.4 to 1.32.0 (GetCompatibilityInfoFromModel and
#: GetCompatibilityInfoFromModelBytes hold 404 and 405): a NULL options argument gets "Invalid
#: argument provided to GetCompatibilityInfoFromModel" at 404 and CreateEnvWithOptions's own message
#: at 406. CApi checks that message before using the slot, so a table that drifts is caught here.


class EnvCreationOptions(ctypes.Structure):
    # onnxruntime_c_api.h, OrtEnvCreationOptions (since 1.24)
    _fields_ = [("version", c_uint32), ("logging_severity_level", ctypes.c_int32), ("log_id", c_char_p),
                ("custom_logging_function", c_void_p), ("custom_logging_param", c_void_p),
                ("threading_options", c_void_p), ("config_entries", c_void_p)]


def _library() -> tuple[ctypes.CDLL, str]:
    spec = importlib.util.find_spec("onnxruntime")
    folder = os.path.join(list(spec.submodule_search_locations)[0], "capi")
    path = sorted(glob.glob(os.path.join(folder, "libonnxruntime.so.*")))[0]
    return ctypes.CDLL(path), path.rsplit(".so.", 1)[1]


class CApi:
    def __init__(self) -> None:
        lib, version = _library()
        self.version = version
        self.api_version = int(version.split(".")[1])
        lib.OrtGetApiBase.restype = POINTER(c_void_p * 2)
        base = lib.OrtGetApiBase().contents
        table = ctypes.cast(ctypes.CFUNCTYPE(c_void_p, c_uint32)(base[0])(self.api_version), POINTER(c_void_p))
        slots = {name: ORT_API[name][0] for name in SIGNATURES}
        self.fn = {name: ctypes.CFUNCTYPE(res, *args)(table[slots[name]]) for name, (res, args) in SIGNATURES.items()}
        probe = self.call("CreateEnvWithOptions", None, ctypes.byref(c_void_p()))
        assert probe is not None and probe.startswith("CreateEnvWithOptions"), \
            f"OrtApi slot {slots['CreateEnvWithOptions']} is not CreateEnvWithOptions in onnxruntime {version}: {probe}"

    def call(self, name: str, *args) -> str | None:
        """The error message of a status-returning call, or None."""
        status = self.fn[name](*args)
        if not status:
            return None
        message = self.fn["GetErrorMessage"](status).decode()
        self.fn["ReleaseStatus"](status)
        return message

    def env(self, entries: dict[str, str]) -> int:
        kvp = c_void_p()
        self.fn["CreateKeyValuePairs"](ctypes.byref(kvp))
        for k, v in entries.items():
            self.fn["AddKeyValuePair"](kvp, k.encode(), v.encode())
        options = EnvCreationOptions(self.api_version, 3, b"onnxhal-env-check", None, None, None, kvp.value)
        env = c_void_p()
        error = self.call("CreateEnvWithOptions", ctypes.byref(options), ctypes.byref(env))
        self.fn["ReleaseKeyValuePairs"](kvp)
        assert error is None, error
        return env.value

    def ep_devices(self, env: int) -> dict[str, int]:
        devices, n = POINTER(c_void_p)(), c_size_t()
        assert self.call("GetEpDevices", env, ctypes.byref(devices), ctypes.byref(n)) is None
        return {self.fn["EpDevice_EpName"](devices[i]).decode(): devices[i] for i in range(n.value)}

    def session_error(self, env: int, device: int, model: bytes, options: dict[str, str] | None = None) -> str | None:
        """Create (and release) a session with ``device``'s EP and provider ``options``; its error, or None."""
        so = c_void_p()
        assert self.call("CreateSessionOptions", ctypes.byref(so)) is None
        try:
            devices = (c_void_p * 1)(device)
            items = list((options or {}).items())
            keys = (c_char_p * max(len(items), 1))(*[k.encode() for k, _ in items])
            values = (c_char_p * max(len(items), 1))(*[v.encode() for _, v in items])
            error = self.call("SessionOptionsAppendExecutionProvider_V2", so, env, devices, 1, keys, values, len(items))
            if error is not None:
                return error
            sess = c_void_p()
            buf = ctypes.create_string_buffer(model, len(model))
            error = self.call("CreateSessionFromArray", env, buf, len(model), so, ctypes.byref(sess))
            if sess.value:
                self.fn["ReleaseSession"](sess)
            return error
        finally:
            self.fn["ReleaseSessionOptions"](so)


def _model() -> bytes:
    from tests.models import add_mul_model

    return add_mul_model().SerializeToString()


def env_config() -> dict:
    """Three environments, one process each would be cleaner; onnxruntime allows one environment per
    process, so the caller runs each case in its own subprocess (``case`` below)."""
    raise SystemExit("run a case: python -m tests.ort_bridge_env case NAME")


CASES = {
    # registration name, env config entries
    "plain_name_no_config": ("onnxhal", {}),
    "plain_name_allow_virtual": ("onnxhal", {"allow_virtual_devices": "1"}),
    "factory_option": ("onnxhal.virtual",
                       {"ep_factory.VirtualGpuExecutionProvider.fault_no_such_thing": "1"}),
    "factory_default": ("onnxhal.virtual", {"ep_factory.VirtualGpuExecutionProvider.fault_compile_fail": "1"}),
}


def case(name: str) -> dict:
    import onnxhal.ort_plugin as plugin

    api = CApi()
    registration, entries = CASES[name]
    plugin.configure(profiles=["generic-npu", "generic-gpu"])
    env = api.env(entries)
    out: dict = {"ort_version": api.version,
                 "register": api.call("RegisterExecutionProviderLibrary", env, registration.encode(),
                                      plugin.library_path().encode())}
    if out["register"] is None:
        devices = api.ep_devices(env)
        out["ep_devices"] = sorted(devices)
        model = _model()
        out["sessions"] = {ep: api.session_error(env, devices[ep], model)
                           for ep in ("VirtualNpuExecutionProvider", "VirtualGpuExecutionProvider")}
        # The session's own provider option wins over the factory's default.
        out["session_overrides"] = api.session_error(env, devices["VirtualGpuExecutionProvider"], model,
                                                     {"fault_compile_fail": "0", "fault_seed": "1"})
        from onnxhal.ort_plugin.library import bound_api

        out["env_config_seen"] = bound_api(0).env_config()
        api.call("UnregisterExecutionProviderLibrary", env, registration.encode())
    api.fn["ReleaseEnv"](env)
    return out


if __name__ == "__main__":
    result = case(sys.argv[2]) if sys.argv[1] == "case" else globals()[sys.argv[1]]()
    print(json.dumps(result))
    sys.stdout.flush()
