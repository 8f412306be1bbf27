"""Tables the CLI prints (rich)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

import onnxhal

# Piped output (CI logs, files) gets a wide console so device and EP names are never cut.
console = Console(width=None if sys.stdout.isatty() else 200)


def print_devices(hw: Sequence[onnxhal.OrtHardwareDevice], eps: Sequence[onnxhal.OrtEpDevice]) -> None:
    t = Table(title="Hardware devices")
    for c in ("#", "type", "vendor", "vendor_id", "device_id", "metadata"):
        t.add_column(c)
    for k, d in enumerate(hw):
        md = ", ".join(f"{a}={b}" for a, b in d.metadata.items())
        t.add_row(str(k), d.type.name, d.vendor, f"0x{d.vendor_id:04x}", f"0x{d.device_id:04x}", md)
    console.print(t)
    t = Table(title="EP devices")
    for c in ("#", "ep_name", "ep_vendor", "device", "memory", "ep_metadata", "ep_options"):
        t.add_column(c, no_wrap=c in ("ep_name", "ep_vendor"))
    for k, d in enumerate(eps):
        mems = [f"{m.name} ({m.device_type.name}, {m.device_mem_type.name}, vendor 0x{m.device_vendor_id:x})"
                for m in d.memory_infos()] or ["host (CPU memory)"]
        t.add_row(str(k), d.ep_name, d.ep_vendor, f"{d.device.type.name} {d.device.vendor}", "\n".join(mems),
                  "\n".join(f"{a}={b}" for a, b in d.ep_metadata.items()),
                  "\n".join(f"{a}={b}" for a, b in d.ep_options.items()))
    console.print(t)


def print_partition(sess: onnxhal.InferenceSession) -> None:
    t = Table(title=f"Partition ({', '.join(sess.get_providers())})")
    t.add_column("EP")
    t.add_column("nodes", justify="right")
    t.add_column("op types")
    per_ep: dict[str, list] = {}
    for sub in sess.get_provider_graph_assignment_info():
        per_ep.setdefault(sub.ep_name, []).extend(sub.get_nodes())
    for ep, nodes in per_ep.items():
        ops: dict[str, int] = {}
        for n in nodes:
            ops[n.op_type] = ops.get(n.op_type, 0) + 1
        t.add_row(ep, str(len(nodes)), ", ".join(f"{o}x{c}" for o, c in sorted(ops.items(), key=lambda x: -x[1])[:8]))
    console.print(t)
    from onnxhal.simulators import describe_backend

    for d in onnxhal.get_ep_devices():  # which backend runs the session's simulated devices
        line = describe_backend(d) if d.ep_name in sess.get_providers() else ""
        if line:
            console.print(f"{line}", soft_wrap=True, markup=False)


def fp16_devices(sess: onnxhal.InferenceSession | None) -> list[str]:
    """Profiles of the session's simulated devices that store float32 values as fp16."""
    if sess is None:
        return []
    from onnxhal.simulators.cost import virtual_eps

    return [ep.profile.name for ep in virtual_eps(sess).values() if ep.profile.compute_dtype == "float16"]


def nonfinite_note(name: str, out: object, sess: onnxhal.InferenceSession | None = None) -> str:
    """A warning for an output holding NaN or inf, naming the likely cause; "" when it holds none."""
    if not (isinstance(out, np.ndarray) and out.dtype.kind in "fc" and out.size):
        return ""
    nan, inf = int(np.isnan(out).sum()), int(np.isinf(out).sum())
    if not nan and not inf:
        return ""
    note = f"output {name!r} holds {nan} NaN and {inf} inf value(s) of {out.size}"
    fp16 = fp16_devices(sess)
    if fp16:
        note += (f"; likely cause: values beyond 65504 overflow float16 on {', '.join(fp16)} (it stores float32 as "
                 "fp16): compare with the CPU EP, or use a profile with float32_as = \"float32\"")
    return note


def print_outputs(names: Sequence[str], outs: Sequence, sess: onnxhal.InferenceSession | None = None) -> None:
    t = Table(title="Outputs")
    for c in ("name", "dtype", "shape", "min", "max", "mean"):
        t.add_column(c)
    notes = []
    for n, o in zip(names, outs):
        if isinstance(o, np.ndarray) and o.dtype.kind in "fiub" and o.size:
            f = o.astype(np.float64)
            t.add_row(n, str(o.dtype), str(list(o.shape)), f"{f.min():.4g}", f"{f.max():.4g}", f"{f.mean():.4g}")
        else:
            t.add_row(n, str(getattr(o, "dtype", type(o).__name__)), str(list(getattr(o, "shape", []))), "", "", "")
        note = nonfinite_note(n, o, sess)
        if note:
            notes.append(note)
    console.print(t)
    for note in notes:
        console.print(f"[yellow]warning:[/yellow] {note}", soft_wrap=True)


def opencl_report() -> dict:
    """Every OpenCL device with its probe verdict, and the remedy when none is usable (also --json)."""
    from onnxhal.devices.opencl import enumerate_opencl_devices
    from onnxhal.devices.opencl_env import OPENCL_SWITCH_ENV, opencl_disabled
    from onnxhal.devices.opencl_remedy import opencl_remedy

    devices = [{"index": f"{r.platform_index}:{r.device_index}", "platform": r.platform_name,
                "device": r.device_name, "driver_version": r.driver_version, "version": r.version,
                "state": "usable" if r.probe.usable else "failed probe", "reason": r.probe.reason}
               for r in enumerate_opencl_devices()]
    usable = any(d["state"] == "usable" for d in devices)
    return {"switch": f"{OPENCL_SWITCH_ENV}=off" if opencl_disabled() else "", "devices": devices,
            "usable": usable, "remedy": "" if usable else opencl_remedy()}


def print_opencl(report: dict) -> None:
    t = Table(title="OpenCL devices")
    for c in ("index", "platform", "device", "driver", "state"):
        t.add_column(c, no_wrap=c == "index")
    for d in report["devices"]:
        state = "[green]usable[/green]" if d["state"] == "usable" else f"[red]failed probe[/red]: {d['reason']}"
        t.add_row(d["index"], d["platform"], d["device"], d["driver_version"], state)
    if report["devices"]:
        console.print(t)
    elif report["switch"]:
        console.print(f"OpenCL devices: none listed ({report['switch']})")
    else:
        console.print("OpenCL devices: none found")
    if report["remedy"]:
        console.print(report["remedy"], soft_wrap=True)
