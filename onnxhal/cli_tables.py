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


def print_outputs(names: Sequence[str], outs: Sequence) -> None:
    t = Table(title="Outputs")
    for c in ("name", "dtype", "shape", "min", "max", "mean"):
        t.add_column(c)
    for n, o in zip(names, outs):
        if isinstance(o, np.ndarray) and o.dtype.kind in "fiub" and o.size:
            f = o.astype(np.float64)
            t.add_row(n, str(o.dtype), str(list(o.shape)), f"{f.min():.4g}", f"{f.max():.4g}", f"{f.mean():.4g}")
        else:
            t.add_row(n, str(getattr(o, "dtype", type(o).__name__)), str(list(getattr(o, "shape", []))), "", "", "")
    console.print(t)
