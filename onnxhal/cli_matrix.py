"""``onnxhal matrix MODEL``: the model on every EP device, checked against the CPU EP; and the
simulated-cost explanation of ``onnxhal run --explain``.

The matrix registers the simulated devices of ``--profiles`` (default: those already registered
through ``ONNXHAL_SIMULATE``, else generic-npu,generic-gpu), runs the model once on the CPU EP as the
reference and once on every other EP device (with the CPU EP as fallback for what the device does
not take), and prints, per device: EP, device, nodes on the device, nodes on the CPU, transfers,
the largest absolute error, simulated device time and energy. The exit code is 1 when any device's
result is beyond its profile's tolerance (``|out - ref| <= atol + rtol * |ref|``) or a device fails.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

import onnxhal
from onnxhal.hal.errors import OrtError

#: Tolerance for EP devices that have no simulator profile (e.g. the OpenCL EP).
DEFAULT_RTOL, DEFAULT_ATOL = 1e-4, 1e-4


@dataclass
class MatrixRow:
    ep: str
    device: str
    nodes_on_device: int = 0
    nodes_on_cpu: int = 0
    transfers: int = 0
    max_error: float = float("nan")
    sim_ms: float | None = None
    sim_mj: float | None = None
    ok: bool = False
    error: str = ""
    backend: str = ""  # opencl / host (simulated devices), the OpenCL device (OpenCL EP)
    declined: str = ""  # why the device ran no node of the model (then ``ok`` only says the CPU result matched)
    extra: dict[str, Any] = field(default_factory=dict)


def device_label(d: onnxhal.OrtEpDevice) -> str:
    return d.device.metadata.get("simulator_profile") or f"{d.device.type.name} {d.device.vendor}"


def backend_label(d: onnxhal.OrtEpDevice) -> str:
    """``opencl`` or ``host`` for a simulated device, the OpenCL device for the OpenCL EP, else ""."""
    md = d.ep_metadata
    return md.get("backend") or (md.get("opencl_device", "") and f"opencl {md['opencl_device']}")


def ensure_simulators(profiles: str | None) -> None:
    """Register the simulated devices of ``profiles`` (replacing any), or the default ones if none are."""
    from onnxhal.simulators import register_simulators, simulated_library_names

    if profiles:
        from onnxhal.simulators.testing import _unregister

        for name in simulated_library_names():
            _unregister(name)
        register_simulators(profiles)
    elif not simulated_library_names():
        register_simulators(None)


def _session(model: str | bytes, device: onnxhal.OrtEpDevice | None) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if device is None:
        return onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    so.add_provider_for_devices([device])
    return onnxhal.InferenceSession(model, so)


def run_device(model: str | bytes, device: onnxhal.OrtEpDevice, feeds: dict, ref: list) -> MatrixRow:
    """One row: the model on ``device`` against the reference outputs ``ref``."""
    from onnxhal.simulators.cost import virtual_eps

    row = MatrixRow(device.ep_name, device_label(device), backend=backend_label(device))
    try:
        sess = _session(model, device)
        sess.disable_fallback()  # a failing device must show as failing, not as a CPU result
        outs = sess.run(None, feeds)
    except OrtError as e:
        row.error = f"{type(e).__name__}: {e}"
        return row
    summary = sess.partition_summary
    row.nodes_on_device = summary.get(device.ep_name, 0)
    row.nodes_on_cpu = summary.get("CPUExecutionProvider", 0)
    sims = virtual_eps(sess)
    ep = sims.get(device.ep_name)
    rtol, atol = (ep.profile.rtol, ep.profile.atol) if ep is not None else (DEFAULT_RTOL, DEFAULT_ATOL)
    if ep is not None:
        run = ep.meter.last_run
        row.transfers = run.transfers
        row.sim_ms = run.device_seconds * 1e3
        row.sim_mj = run.energy_joules * 1e3
    else:
        row.transfers = sum(1 for s in sess.plan.steps if s.node is None)
    if row.nodes_on_device == 0:
        row.declined = declined_reasons(sess, device.ep_name)
    row.ok = True
    errors = []
    for o, r in zip(outs, ref):
        o, r = np.asarray(o, np.float64), np.asarray(r, np.float64)
        if o.shape != r.shape:
            row.ok, row.error = False, f"output shape {list(o.shape)} != reference {list(r.shape)}"
            continue
        bad = int(np.sum(~np.isfinite(o) & np.isfinite(r)))
        if bad:
            row.ok = False
            cause = (f"; likely cause: values beyond 65504 overflow float16 on {ep.profile.name}"
                     if ep is not None and ep.profile.compute_dtype == "float16" else "")
            row.error = row.error or f"{bad} NaN/inf value(s) where the CPU EP's are finite{cause}"
        if o.size:
            errors.append(float(np.max(np.abs(o - r))))
            if not np.all(np.abs(o - r) <= atol + rtol * np.abs(r)):
                row.ok = False
                row.error = row.error or f"beyond tolerance (rtol {rtol:g}, atol {atol:g})"
    row.max_error = max(errors) if errors else 0.0
    return row


_QUOTED = re.compile(r"'[^']*'")
_SHAPE = re.compile(r"\s*(\([^()]*\)|\[[^\]]*\])")


def declined_reasons(sess: onnxhal.InferenceSession, ep_name: str, most: int = 3) -> str:
    """Why ``ep_name`` took no node: its most frequent reasons, with counts."""
    ep = sess.eps.get(ep_name)
    reasons = list(getattr(ep, "declined", {}).values())
    if not reasons:
        return "it claimed no node of the model"
    counts: dict[str, int] = {}
    for r in reasons:
        # The same reason about different values counts as one: "'x' has shape ('batch', 8)" -> "a value ..."
        kind = _SHAPE.sub("", _QUOTED.sub("a value", r)).strip()
        counts[kind] = counts.get(kind, 0) + 1
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:most]
    more = len(counts) - len(top)
    return "; ".join(f"{n} x {r}" for r, n in top) + (f"; {more} other reason(s)" if more > 0 else "")


def row_result(r: MatrixRow) -> str:
    if not r.ok:
        return f"FAIL {r.error}"
    if r.declined:
        return f"declined (0 nodes): {r.declined}"
    return "ok"


def matrix(model: str | bytes, feeds: dict | None = None, show_progress: bool = True) -> list[MatrixRow]:
    """Rows for every EP device other than the CPU EP's (the reference)."""
    from onnxhal.cli import random_inputs
    from onnxhal.runtime.environment import is_default_cpu_ep

    ref_sess = _session(model, None)
    feeds = feeds if feeds is not None else random_inputs(ref_sess)
    ref = ref_sess.run(None, feeds)
    devices = [d for d in onnxhal.get_ep_devices() if not is_default_cpu_ep(d)]
    rows = []
    with Progress(transient=True, disable=not show_progress) as progress:
        task = progress.add_task("devices", total=len(devices))
        for d in devices:
            progress.update(task, description=f"{d.ep_name} on {device_label(d)}")
            rows.append(run_device(model, d, feeds, ref))
            progress.advance(task)
    return rows


def print_matrix(rows: list[MatrixRow], title: str) -> None:
    from onnxhal.cli_tables import console

    # EP, device and backend share a column, numbers never wrap and the box has no inner rules, so
    # the table fits 100 columns; the reasons for FAIL and declined follow it, whole.
    t = Table(title=title, box=box.SIMPLE_HEAD)
    t.add_column("EP / device (backend)", no_wrap=True)
    for c in ("nodes on\ndevice", "nodes on\nCPU", "trans-\nfers", "max\nerror", "sim\nms", "sim\nmJ"):
        t.add_column(c, justify="right", no_wrap=True)
    t.add_column("result", no_wrap=True)
    for r in rows:
        where = f"{r.ep}\n{r.device}" + (f" ({r.backend})" if r.backend else "")
        t.add_row(escape(where), str(r.nodes_on_device), str(r.nodes_on_cpu), str(r.transfers),
                  f"{r.max_error:.3g}", "-" if r.sim_ms is None else f"{r.sim_ms:.3f}",
                  "-" if r.sim_mj is None else f"{r.sim_mj:.3f}",
                  "FAIL" if not r.ok else "declined" if r.declined else "ok")
    console.print(t)
    for r in rows:  # the whole of each reason is worth reading
        if not r.ok or r.declined:
            console.print(f"{r.ep} on {r.device}: {row_result(r)}", soft_wrap=True, markup=False)
    idle = [f"{r.ep} on {r.device}" for r in rows if r.ok and r.declined]
    if idle:
        console.print(f"{len(idle)} device(s) ran no node of this model: {', '.join(idle)} (their result is the "
                      "CPU EP's)", soft_wrap=True, markup=False)


def cmd_matrix(args: argparse.Namespace) -> int:
    ensure_simulators(args.profiles)
    from onnxhal.cli import load_inputs

    feeds = load_inputs(args.inputs) if args.inputs else None
    rows = matrix(args.model, feeds, show_progress=not args.no_progress)
    print_matrix(rows, f"{args.model} on every EP device vs the CPU EP")
    return 0 if rows and all(r.ok for r in rows) else 1


def add_matrix_parser(sub: Any) -> None:
    from onnxhal.cli import environment_help

    text = "run a model on every EP device (simulated ones included) against the CPU EP"
    m = sub.add_parser("matrix", help=text, description=text, epilog=environment_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("model")
    m.add_argument("--profiles", help="simulated devices: comma-separated profile names or TOML paths "
                                      "(default: $ONNXHAL_SIMULATE, else generic-npu,generic-gpu)")
    m.add_argument("--inputs", help=".npz file of inputs (default: random)")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    m.set_defaults(fn=cmd_matrix)


def print_explain(sess: onnxhal.InferenceSession) -> None:
    """``onnxhal run --explain``: per simulated EP, the nodes it ran and the last run's simulated cost."""
    from onnxhal.cli_tables import console
    from onnxhal.simulators.cost import explain_rows

    rows = explain_rows(sess)
    if not rows:
        console.print("explain: this session uses no simulated device (set ONNXHAL_SIMULATE and pick one with "
                      "--policy or --ep)")
        return
    t = Table(title="Simulated device cost of the last run")
    for c in ("EP", "device", "nodes", "partitions", "kernels", "kernel ms", "transfers", "transfer KiB",
              "transfer ms", "device ms", "energy mJ"):
        t.add_column(c, justify="left" if c in ("EP", "device") else "right")
    for r in rows:
        t.add_row(r["ep"], r["device"], f"{r['nodes_on_device']}/{r['nodes_total']}", str(r["partitions"]),
                  str(r["kernels"]), f"{r['kernel_ms']:.3f}", str(r["transfers"]), f"{r['transfer_bytes'] / 1024:.1f}",
                  f"{r['transfer_ms']:.3f}", f"{r['device_ms']:.3f}", f"{r['energy_mj']:.3f}")
    console.print(t)
