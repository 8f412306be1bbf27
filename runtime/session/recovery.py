"""What a session does when an EP fails: one policy for compile failures and failures at run time.

- **An EP's compile fails** (or its compute infos cannot create their states): its fused groups
  go to the CPU EP, never a wrong answer; without the CPU EP in the session that is an ``EPFail``.
- **An EP fails at run time** (``EPFail``, e.g. a lost device):
  - with ``session.ep_failover`` = "1", the session is built again without that EP (the CPU EP
    added unless ``session.disable_cpu_ep_fallback`` = "1"), for good, and the run repeated;
  - else with fallback enabled (onnxruntime's ``enable_fallback``, the default), the session is
    built again on the CPU EP alone, once, and the run repeated;
  - else the error is raised and the session stays as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from onnxhal.hal.errors import EPFail
from onnxhal.runtime.env.environment import CPU_EP_NAME, get_environment
from onnxhal.runtime.env.provider_resolution import ProviderChoice, cpu_choice
from onnxhal.runtime.session.options import DISABLE_CPU_EP_FALLBACK, EP_FAILOVER, SessionOptions

logger = logging.getLogger("onnxhal.session")


@dataclass(frozen=True)
class EpFailure:
    """An EP failure the session recovered from: which EP, at which stage ("compile" or "run"),
    the error, and the EPs that took its work over. A caller that asked for a device (a CLI run, a
    device matrix) reads these to say the device failed instead of showing another EP's result."""

    ep_name: str
    stage: str
    error: str
    taken_over_by: tuple[str, ...]


class RecoveryPolicy:
    """The session's recovery decisions (module docstring); ``fallback_enabled`` is what
    ``InferenceSession.enable_fallback``/``disable_fallback`` set."""

    def __init__(self, so: SessionOptions) -> None:
        self.so = so
        self.fallback_enabled = True
        self.failures: list[EpFailure] = []  # in order; kept across the session's rebuilds

    def compile_failed(self, ep_name: str, error: BaseException, n_groups: int, eps: Sequence[str]) -> None:
        """Called when ``ep_name``'s compile failed: returns if its groups may go to the CPU EP
        (the caller reassigns them), raises ``EPFail`` if the session has no CPU EP."""
        if CPU_EP_NAME not in eps:
            raise EPFail(f"{ep_name}: compile failed ({type(error).__name__}: {error}) and CPU fallback is "
                         "disabled") from error
        self.failures.append(EpFailure(ep_name, "compile", f"{type(error).__name__}: {error}", (CPU_EP_NAME,)))
        # Log text, not the exception: its traceback would keep the session alive.
        logger.warning("%s: compile failed (%s: %s); its %d fused group(s) fall back to the CPU EP",
                       ep_name, type(error).__name__, str(error), n_groups)

    def after_run_failure(self, error: EPFail, choices: Sequence[ProviderChoice]) -> tuple[list[ProviderChoice], str]:
        """The EPs to build the session on again after ``error`` at run time, and the failed EP's name
        ("" for a fallback onto the CPU EP); re-raises ``error`` when the session cannot recover."""
        failed = getattr(error, "ep_name", "")
        names = [c.ep_name for c in choices]
        if self.so.config(EP_FAILOVER) == "1" and failed and failed != CPU_EP_NAME:
            left = [c for c in choices if c.ep_name != failed]
            if not any(c.ep_name == CPU_EP_NAME for c in left) and self.so.config(DISABLE_CPU_EP_FALLBACK) != "1":
                left.append(cpu_choice(get_environment()))
            if not left:
                raise EPFail(f"{failed} failed ({error}) and no other EP is left to fail over to") from error
            logger.warning("EP failover: %s failed (%s); re-partitioning onto %s", failed, error,
                           [c.ep_name for c in left])
            self.failures.append(EpFailure(failed, "run", f"{type(error).__name__}: {error}",
                                           tuple(c.ep_name for c in left)))
            return left, failed
        if not self.fallback_enabled or names == [CPU_EP_NAME]:
            raise error
        logger.warning("EP Error: %s using %s. Falling back to ['CPUExecutionProvider'] and retrying.", error, names)
        # The error names its EP where it knows it; else every EP but the CPU EP lost its nodes.
        for name in [failed] if failed else [n for n in names if n != CPU_EP_NAME]:
            self.failures.append(EpFailure(name, "run", f"{type(error).__name__}: {error}", (CPU_EP_NAME,)))
        self.fallback_enabled = False  # fall back only once, as onnxruntime
        return [cpu_choice(get_environment())], ""
