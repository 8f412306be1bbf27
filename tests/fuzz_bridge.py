"""The fuzz campaign of tests/fuzz_models.py through the bridge: each mutant loaded and run by real
onnxruntime with onnxhal's plugin EP library registered and a simulated device preferred (even
mutants PREFER_NPU on generic-npu, odd ones PREFER_GPU on generic-gpu), and by onnxruntime's CPU EP
alone for comparison, in a child process with a time limit (``fuzz_models.campaign``).

An outcome's ``onnxhal`` slot is the bridged session's: [phase, kind, class, message] where kind is

- ``ok``: ran; its outputs agree with onnxruntime's CPU EP within the profile's tolerance (or the
  CPU EP refused the mutant: ``ran where onnxruntime's CPU EP refuses`` in the figures, a finding);
- ``typed``: refused, either with onnxhal's message (``onnxhal <hook>: <OrtError subclass>: ...``)
  or, where onnxhal's message is absent, onnxruntime alone refuses the mutant too (its own check);
- ``untyped``: refused with onnxhal's message naming an exception that is not an onnxhal error, or
  refused without onnxhal's message where onnxruntime's CPU EP runs the mutant, or an onnxhal error
  the bridge only logged (a call whose C signature carries no status);
- ``refused``: refused with onnxhal's typed message where onnxruntime's CPU EP runs the mutant (a
  simulated device declines what it cannot run; it does not fail the run);
- ``wrong``: ran, and an output differs from the CPU EP's beyond the profile's tolerance;
- ``crash`` / ``hang``: as in fuzz_models;
- ``skipped``: onnxruntime's CPU EP alone crashed or hung on the mutant (run first, in the same
  child), so the bridged session was not tried.

Used by ``benchmarks/fuzz_campaign.py --bridge`` and ``tests/test_ort_plugin_fuzz.py``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading

import numpy as np

from tests import fuzz_models as fm

PROFILES = {"generic-npu": "PREFER_NPU", "generic-gpu": "PREFER_GPU"}
#: onnxhal's part of an onnxruntime error message: ``onnxhal <C API call>: <exception type>: ...``
#: (onnxhal/ort_plugin/ort_api.py, OrtApi.status_for).
ONNXHAL_MESSAGE = re.compile(r"onnxhal (\w+(?:::\w+)?): (\w+): ")


#: The bridged outcome of a mutant on which onnxruntime's CPU EP alone crashed or hung.
SKIPPED = ["load", "skipped", "", "not run: onnxruntime's CPU EP alone crashed or hung on this mutant"]


def profile_for(index: int) -> str:
    return list(PROFILES)[index % len(PROFILES)]


class _Logged(logging.Handler):
    """Errors the bridge logged instead of returning (calls whose C signature has no status)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record.getMessage()[:300])


def _session(ort, model, policy):
    so = ort.SessionOptions()
    so.log_severity_level = 4
    if policy is None:
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    so.set_provider_selection_policy(getattr(ort.OrtExecutionProviderDevicePolicy, policy))
    return ort.InferenceSession(model, so)


def _run(ort, model, feeds, policy) -> tuple[list[str], list | None]:
    """([phase, kind, class, message], outputs or None); kind ok or error (classified later)."""
    phase = "load"
    run_options = ort.RunOptions()
    stop = threading.Timer(fm.RUN_SECONDS, lambda: setattr(run_options, "terminate", True))
    try:
        sess = _session(ort, model, policy)
        phase = "run"
        stop.start()
        outputs = sess.run(None, feeds, run_options)
        return ["done", "ok", "", ""], outputs
    except Exception as e:  # the point: what escapes, and with which message
        return [phase, "error", type(e).__name__, str(e)[:600]], None
    finally:
        stop.cancel()


def classify_error(message: str, onnxruntime_alone_refused: bool) -> str:
    """``typed`` or ``untyped`` for the bridged session's error ``message`` (see the module's doc)."""
    import onnxhal.errors as errors

    found = ONNXHAL_MESSAGE.search(message)
    if found is None:
        return "typed" if onnxruntime_alone_refused else "untyped"
    kind = getattr(errors, found.group(2), None)
    typed = isinstance(kind, type) and issubclass(kind, errors.OrtError)
    if not typed or any(w in message for w in fm.INTERNAL_WORDS):
        return "untyped"
    return "typed" if onnxruntime_alone_refused else "refused"


def _disagreement(ours: list, theirs: list, profile: str) -> str | None:
    from onnxhal.simulators.profiles import load_profile

    p = load_profile(profile)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"output {i}: {a.dtype}{list(a.shape)} where onnxruntime's CPU EP gives {b.dtype}{list(b.shape)}"
        if a.dtype.kind in "fc":
            bad = ~np.isclose(a, b, rtol=p.rtol, atol=p.atol, equal_nan=True)
            if bad.any():
                return (f"output {i}: max error {float(np.nanmax(np.abs(a - b))):.3g} "
                        f"beyond {profile}'s atol {p.atol} + rtol {p.rtol} x |ref|")
        elif a.dtype != object and not np.array_equal(a, b):
            return f"output {i}: {int((a != b).sum())} of {a.size} values differ from onnxruntime's CPU EP"
    return None


def _worker(seed: int, start: int, count: int, with_ort: bool, external_folder: str | None) -> None:
    import resource

    # RLIMIT_DATA, not RLIMIT_AS: the bridge reserves (never backs) address space for device buffers.
    resource.setrlimit(resource.RLIMIT_DATA, (6 << 30, 6 << 30))
    import onnxruntime as ort

    import onnxhal.ort_plugin as plugin

    ort.set_default_logger_severity(4)
    plugin.configure(profiles=list(PROFILES))
    ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
    logged = _Logged()
    logging.getLogger("onnxhal").addHandler(logged)
    for k in range(start, start + count):
        if external_folder is not None:
            base, mutation, model = "external", "external_data", fm.external_mutant(external_folder, k)
            feeds = {"x": np.ones(6, np.float32)}
        else:
            base, mutation, data = fm.mutant(seed, k)
            model, feeds = data, fm._feeds_for(data)
        profile = profile_for(k)
        logged.records.clear()
        # onnxruntime alone first: a mutant that crashes or hangs it (its own defects) is recorded as
        # such, and the bridged run is not tried.
        print("OURS", json.dumps(SKIPPED), flush=True)
        print("START", k, "onnxruntime", flush=True)
        theirs, their_outputs = _run(ort, model, feeds, None)
        theirs[1] = "typed" if theirs[1] == "error" else theirs[1]
        print("START", k, "onnxhal", flush=True)
        ours, our_outputs = _run(ort, model, feeds, PROFILES[profile])
        if ours[1] == "error":
            ours[1] = classify_error(ours[3], theirs[1] != "ok")
        elif their_outputs is not None:
            wrong = _disagreement(our_outputs, their_outputs, profile)
            if wrong is not None:
                ours = ["done", "wrong", profile, wrong]
        if logged.records and ours[1] != "untyped":
            ours = [ours[0], "untyped", "logged", "; ".join(logged.records)[:600]]
        print("RESULT", json.dumps([k, base, f"{mutation}@{profile}", ours, theirs]), flush=True)


def campaign(seed: int, count: int, hang_seconds: float = 60.0, external: bool = False,
             progress=None) -> list[fm.Outcome]:
    return fm.campaign(seed, count, hang_seconds=hang_seconds, external=external, progress=progress,
                       worker="tests.fuzz_bridge")


def summary(results: list[fm.Outcome]) -> dict[str, int]:
    ours = [r.onnxhal[1] for r in results]
    return {
        "mutants": len(results),
        "ran, agreeing with onnxruntime's CPU EP": sum(r.onnxhal[1] == "ok" and not fm.ort_refused(r) for r in results),
        "ran where onnxruntime's CPU EP refuses": sum(r.onnxhal[1] == "ok" and fm.ort_refused(r) for r in results),
        "refused with onnxhal's message (an onnxhal error)": sum(
            r.onnxhal[1] == "typed" and ONNXHAL_MESSAGE.search(r.onnxhal[3]) is not None for r in results),
        "refused by onnxruntime's own checks (its CPU EP alone refuses too)": sum(
            r.onnxhal[1] == "typed" and ONNXHAL_MESSAGE.search(r.onnxhal[3]) is None for r in results),
        "untyped errors": ours.count("untyped"),
        "refused by onnxhal where onnxruntime's CPU EP runs": ours.count("refused"),
        "wrong outputs": ours.count("wrong"),
        "crashes": ours.count("crash"),
        "hangs": ours.count("hang"),
        "onnxruntime's CPU EP alone crashed or hung (bridge not tried)": ours.count("skipped"),
    }


#: Words of onnxruntime's refusal of a mutant the bridged session may run: its CPU EP has no kernel
#: for the operator's version (an opset mutated to 1) where the simulated device claims the node,
#: as onnxhal's own session runs it (docs/hostile-models.md lists the same difference).
RUNS_WHAT_THE_CPU_EP_LACKS = "Could not find an implementation"


def findings(results: list[fm.Outcome]) -> list[fm.Outcome]:
    """Crashes, hangs, untyped errors, refusals and wrong outputs, and runs to completion where
    onnxruntime's CPU EP refuses the mutant (each seen so far but those of
    RUNS_WHAT_THE_CPU_EP_LACKS was a device running what it should have refused)."""
    return [r for r in results if r.onnxhal[1] not in ("ok", "typed", "skipped")
            or (r.onnxhal[1] == "ok" and fm.ort_refused(r) and RUNS_WHAT_THE_CPU_EP_LACKS not in r.onnxruntime[3])]


if __name__ == "__main__":
    import sys

    res = campaign(int(sys.argv[1]), int(sys.argv[2]))
    print(json.dumps(summary(res), indent=1))
    for r in findings(res):
        print(r)
    os._exit(0)
