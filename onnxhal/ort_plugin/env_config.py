"""onnxruntime's environment config, as onnxhal's factories read it inside onnxruntime.

An application sets it once per process, in the ``config_entries`` of ``CreateEnvWithOptions``
(onnxruntime 1.24 on; the Python module creates its environment itself and exposes no config).
A factory reads it with ``OrtEpApi::GetEnvConfigEntries`` (1.24 on). Two kinds of key matter here
(onnxruntime's ``onnxruntime_env_config_keys.h``):

- ``allow_virtual_devices`` = "1": factories may create virtual hardware devices. onnxruntime also
  sets it for a library registered under a name ending in ``.virtual``; onnxhal's simulated devices
  are virtual, so they need one or the other.
- ``ep_factory.<EP name>.<option>``: an option of one EP factory, by its case-sensitive name. onnxhal
  reads each as a default provider option of that EP (``ep_factory.VirtualNpuExecutionProvider.
  fault_seed`` = "3"): every session on the EP gets it unless its own provider options set the key.
"""

from __future__ import annotations

from collections.abc import Mapping

ALLOW_VIRTUAL_DEVICES = "allow_virtual_devices"
FACTORY_PREFIX = "ep_factory."
VIRTUAL_SUFFIX = ".virtual"


def virtual_devices_allowed(registration_name: str, env: Mapping[str, str]) -> bool:
    return registration_name.endswith(VIRTUAL_SUFFIX) or env.get(ALLOW_VIRTUAL_DEVICES) == "1"


def factory_options(env: Mapping[str, str], ep_name: str) -> dict[str, str]:
    """The ``ep_factory.<ep_name>.*`` entries of ``env``, by option name."""
    prefix = f"{FACTORY_PREFIX}{ep_name}."
    return {k[len(prefix):]: v for k, v in env.items() if k.startswith(prefix) and len(k) > len(prefix)}


def with_factory_defaults(session_config: Mapping[str, str], env: Mapping[str, str], ep_name: str) -> dict[str, str]:
    """``session_config`` (onnxruntime's session config entries, where provider options arrive as
    ``ep.<lowercase EP name>.<key>``) with the EP's factory options added where the session does not
    set them."""
    out = dict(session_config)
    for key, value in factory_options(env, ep_name).items():
        out.setdefault(f"ep.{ep_name.lower()}.{key}", value)
    return out
