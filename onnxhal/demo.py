"""``onnxhal demo``: what onnxhal is for, in a few seconds, on any machine.

Unless the user already set ``ONNXHAL_SIMULATE`` (or registered simulated devices), the demo
simulates a generic NPU and GPU itself, lists the EP devices (and which backend runs the simulated
ones: OpenCL, or the host when no OpenCL device passed the probe), runs a small CNN and a
transformer block under PREFER_NPU, shows which nodes ran where and the transfers between devices,
checks each result against the CPU EP within the simulated device's profile tolerance, and ends
with the lines a user copies into their own CI.
"""

from __future__ import annotations

import time

import numpy as np
import onnx

import onnxhal
from onnxhal.cli_tables import console, print_ep_devices_brief, print_partition
from onnxhal.demo_models import demo_cnn, demo_model, demo_transformer_block

__all__ = ["check_against_cpu", "ci_lines", "demo_model", "run_demo", "session_tolerance"]

#: Allowed error against the CPU EP when the session uses no simulated device (float32 everywhere).
FLOAT32_RTOL, FLOAT32_ATOL = 1e-4, 1e-4


def session_tolerance(sess: onnxhal.InferenceSession) -> tuple[float, float, str]:
    """(rtol, atol, where they come from): the loosest of the session's simulated profiles."""
    from onnxhal.simulators.cost import virtual_eps

    profiles = [ep.profile for ep in virtual_eps(sess).values()]
    if not profiles:
        return FLOAT32_RTOL, FLOAT32_ATOL, "float32"
    loosest = max(profiles, key=lambda p: (p.rtol, p.atol))
    return loosest.rtol, loosest.atol, f"profile {loosest.name}"


def check_against_cpu(model: onnx.ModelProto, sess: onnxhal.InferenceSession, feeds: dict[str, np.ndarray]) -> bool:
    """Run ``sess`` and the CPU EP on ``feeds``; print the largest error and the verdict."""
    from onnxhal.output_compare import compare_output

    outs = sess.run(None, feeds)
    refs = onnxhal.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    rtol, atol, source = session_tolerance(sess)
    checks = [compare_output(o.name, out, ref, rtol, atol) for o, out, ref in zip(sess.get_outputs(), outs, refs)]
    ok = all(c.ok for c in checks)
    worst = max((c.max_error for c in checks), default=0.0)
    scale = max((c.scale for c in checks), default=0.0)
    verdict = "[green]OK[/green]" if ok else "[red]MISMATCH[/red]"
    console.print(f"checked against the CPU EP: max |difference| {worst:.2e} {'<=' if ok else '>'} atol {atol:g} + rtol {rtol:g} x "
                  f"max|CPU| {scale:.3g}, relative to the output's scale ({source}): {verdict}", soft_wrap=True)
    return ok


def ci_lines(profiles: str) -> list[str]:
    """The three lines a user copies into CI: the variable, the pytest option, the fixture."""
    lines = [(f"export ONNXHAL_SIMULATE={profiles}", "your application sees these devices, unchanged"),
             (f"pytest --onnxhal-simulate={profiles}", "or choose them per pytest run"),
             ("def test_model(ep_device, ep_session_options): ...", "the fixture: one run per EP device")]
    width = max(len(code) for code, _ in lines)
    return [f"{code.ljust(width)}  # {why}" for code, why in lines]


def run_demo() -> int:
    from onnxhal.simulators import ENV_VAR, register_simulators, simulated_library_names

    start = time.perf_counter()
    onnxhal.get_ep_devices()  # registers ONNXHAL_SIMULATE's devices, if set
    if not simulated_library_names():
        register_simulators("generic-npu,generic-gpu")
        console.print(f"{ENV_VAR} is not set: the demo simulates generic-npu and generic-gpu itself", soft_wrap=True)
    devices = onnxhal.get_ep_devices()
    print_ep_devices_brief(devices)
    ok = True
    for title, model, name in (("a small CNN", demo_cnn(), "image"),
                               ("a transformer block", demo_transformer_block(), "hidden")):
        so = onnxhal.SessionOptions()
        so.set_provider_selection_policy(onnxhal.OrtExecutionProviderDevicePolicy.PREFER_NPU)
        so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
        sess = onnxhal.InferenceSession(model, so)
        console.print()
        console.rule(f"{title} ({len(model.graph.node)} nodes before the optimizer) under PREFER_NPU")
        console.print(f"PREFER_NPU selected providers: {sess.get_providers()}", markup=False)
        if not any(d.device.type == onnxhal.OrtHardwareDeviceType.NPU for d in devices):
            console.print(f"no NPU among the EP devices: PREFER_NPU takes the CPU EP, as onnxruntime does; "
                          f"{ENV_VAR}=generic-npu,... simulates one", soft_wrap=True, markup=False)
        print_partition(sess)
        shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
        ok = check_against_cpu(model, sess, {name: x}) and ok
    profiles = ",".join(d.device.metadata["simulator_profile"] for d in devices
                        if "simulator_profile" in d.device.metadata) or "generic-npu,generic-gpu"
    console.print()
    console.rule("run your own tests on these devices")
    for line in ci_lines(profiles):
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    console.print(f"(demo took {time.perf_counter() - start:.1f} s; docs/ci-simulation.md walks through a CI job)",
                  soft_wrap=True)
    return 0 if ok else 1
