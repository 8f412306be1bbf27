"""``onnxhal matrix MODEL``: the model on every EP device, checked against the CPU EP; and the
simulated-cost explanation of ``onnxhal run --explain``.

The matrix registers the simulated devices of ``--profiles`` (default: those already registered
through ``ONNXHAL_SIMULATE``, else generic-npu,generic-gpu), runs the model once on the CPU EP as the
reference and once on every other EP device (with the CPU EP as fallback for what the device does
not take), and prints, per device: EP, device, nodes on the device, nodes on the CPU, transfers,
the largest absolute error, simulated device time and energy. The exit code is 1 when any device's
result is beyond its profile's tolerance (``max|out - ref| <= atol + rtol * max|ref|`` per output, relative to
the output's scale: see ``onnxhal/output_compare.py``), 3 (``cli.DEVICE_FAILED``) when a device failed: it
raised, or its compile failed and the CPU EP ran what it had claimed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from rich import box
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

import onnxhal
from onnxhal.hal.errors import OrtError
from onnxhal.output_compare import EXACT_RULE, SCALE_RULE, OutputCheck, compare_output

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
    checks: list[OutputCheck] = field(default_factory=list)  # one per output, in order
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL
    fp16: str = ""  # the profile, when it stores float32 as fp16
    failed: bool = False  # the device raised, or did not run what it claimed (not only a result off)
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
        from onnxhal.simulators.testing import unregister_quietly

        for name in simulated_library_names():
            unregister_quietly(name)
        register_simulators(profiles)
    elif not simulated_library_names():
        register_simulators(None)


def _session(model: str | bytes, device: onnxhal.OrtEpDevice | None,
             dims: dict[str, int] | None = None) -> onnxhal.InferenceSession:
    so = onnxhal.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for name, size in (dims or {}).items():
        so.add_free_dimension_override_by_name(name, size)
    if device is None:
        return onnxhal.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    so.add_provider_for_devices([device])
    return onnxhal.InferenceSession(model, so)


def run_device(model: str | bytes, device: onnxhal.OrtEpDevice, feeds: dict, ref: list,
               dims: dict[str, int] | None = None) -> MatrixRow:
    """One row: the model on ``device`` against the reference outputs ``ref``."""
    from onnxhal.simulators.cost import virtual_eps

    row = MatrixRow(device.ep_name, device_label(device), backend=backend_label(device))
    try:
        sess = _session(model, device, dims)
        sess.disable_fallback()  # a failing device must show as failing, not as a CPU result
        outs = sess.run(None, feeds)
    except OrtError as e:
        row.failed, row.error = True, f"device failed: {type(e).__name__}: {e}"
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
        row.declined = declined_reasons(sess, device.ep_name, model if isinstance(model, str) else "MODEL")
    names = [o.name for o in sess.get_outputs()]
    row.rtol, row.atol = rtol, atol
    row.fp16 = ep.profile.name if ep is not None and ep.profile.compute_dtype == "float16" else ""
    row.checks = [compare_output(n, o, r, rtol, atol) for n, o, r in zip(names, outs, ref)]
    row.max_error = max((c.max_error for c in row.checks if not np.isnan(c.max_error)), default=0.0)
    bad = [c for c in row.checks if not c.ok]
    row.ok = not bad
    if bad:
        row.error = bad[0].problem + fp16_cause(bad[0], row.fp16)
    failures = [f for f in sess.ep_failures if f.ep_name == device.ep_name]
    if failures:  # its compile failed and the CPU EP ran its nodes: the result is not the device's
        f = failures[0]
        row.ok, row.failed = False, True
        row.error = (f"device failed: {device.ep_name} did not run what it claimed: its {f.stage} failed ({f.error}); "
                     f"{', '.join(f.taken_over_by)} ran its nodes instead")
    return row


def fp16_cause(check: OutputCheck, profile: str) -> str:
    """The likely cause of ``check``'s failure when ``profile`` stores float32 as fp16, else ""."""
    if not profile or check.exact:
        return ""
    if check.nonfinite:
        return f"; likely cause: values beyond 65504 overflow float16 on {profile}"
    if check.problem.startswith("beyond tolerance"):
        return (f"; likely cause: fp16 precision ({profile} stores float32 as fp16, about 3 significant digits; "
                "a profile with float32_as = \"float32\" computes in float32)")
    return ""


def verdict(r: MatrixRow) -> str:
    """The row's result with the rule it was judged by: "ok: ...", "FAIL ...", "declined ..."."""
    if not r.ok:
        return f"FAIL {r.error}"
    floats = [c for c in r.checks if not c.exact and not np.isnan(c.bound)]
    exact = [c for c in r.checks if c.exact]
    parts = []
    if floats:
        c = max(floats, key=lambda c: c.max_error / c.bound if c.bound > 0 else c.max_error)
        parts.append(f"max|diff| {c.max_error:.3g} <= atol {r.atol:g} + rtol {r.rtol:g} x max|CPU| {c.scale:.3g} = "
                     f"{c.bound:.3g} (output {c.name!r}, relative to the output's scale"
                     + (f"; {r.fp16} stores float32 as fp16" if r.fp16 else "") + ")")
    if exact:
        parts.append(f"{len(exact)} integer/string output(s) equal")
    text = "ok: " + "; ".join(parts) if parts else "ok"
    return text + (f"; {declined_text(r.declined)}" if r.declined else "")


def declined_reasons(sess: onnxhal.InferenceSession, ep_name: str, model: str = "MODEL") -> str:
    """Why ``ep_name`` took no node: one line per kind of reason, with counts and the remedy."""
    from onnxhal.decline_summary import decline_lines
    from onnxhal.random_feeds import input_dim_hints

    lines = decline_lines(getattr(sess.eps.get(ep_name), "declined", {}).values(), model,
                          *input_dim_hints(sess.get_inputs()))
    return "\n".join(lines) or "it claimed no node of the model"


def declined_text(declined: str) -> str:
    """``declined (0 nodes): ...``: one reason inline, several one per line."""
    return "declined (0 nodes): " + (declined if "\n" not in declined else "\n  " + declined.replace("\n", "\n  "))


def row_result(r: MatrixRow) -> str:
    if not r.ok:
        return f"FAIL {r.error}"
    if r.declined:
        return declined_text(r.declined)
    return verdict(r)


def reference_session(model: str | bytes, dims: dict[str, int] | None = None) -> onnxhal.InferenceSession:
    """The CPU EP's session the matrix holds every device to."""
    return _session(model, None, dims)


def matrix(model: str | bytes, feeds: dict | None = None, show_progress: bool = True,
           dims: dict[str, int] | None = None) -> list[MatrixRow]:
    """Rows for every EP device other than the CPU EP's (the reference); ``dims`` sizes symbolic
    dimensions (free dimension overrides on every session, and the random feeds)."""
    from onnxhal.cli import random_inputs
    from onnxhal.runtime.env.environment import is_default_cpu_ep

    ref_sess = reference_session(model, dims)
    feeds = feeds if feeds is not None else random_inputs(ref_sess, dims=dims)
    ref = ref_sess.run(None, feeds)
    devices = [d for d in onnxhal.get_ep_devices() if not is_default_cpu_ep(d)]
    rows = []
    from onnxhal.cli_tables import console

    with Progress(console=console, transient=True, disable=not show_progress) as progress:
        task = progress.add_task("devices", total=len(devices))
        for d in devices:
            progress.update(task, description=f"{d.ep_name} on {device_label(d)}")
            rows.append(run_device(model, d, feeds, ref, dims))
            progress.advance(task)
    return rows


def row_report(r: MatrixRow) -> dict:
    """One row as data (``matrix --json``): the table's figures, ``result`` (ok, FAIL, declined) and
    the verdict as ``print_matrix`` words it."""
    return {"ep": r.ep, "device": r.device, "backend": r.backend, "nodes_on_device": r.nodes_on_device,
            "nodes_on_cpu": r.nodes_on_cpu, "transfers": r.transfers,
            "max_error": None if np.isnan(r.max_error) else float(r.max_error), "sim_ms": r.sim_ms,
            "sim_mj": r.sim_mj, "rtol": r.rtol, "atol": r.atol,
            "result": "FAIL" if not r.ok else "declined" if r.declined else "ok", "failed": r.failed,
            "verdict": row_result(r),
            "outputs": [{"name": c.name, "ok": c.ok, "max_error": None if np.isnan(c.max_error) else float(c.max_error),
                         "problem": c.problem} for c in r.checks]}


def print_matrix(rows: list[MatrixRow], title: str) -> None:
    from onnxhal.cli_tables import console

    # EP, device and backend share a column, headers wrap at spaces and the padding is one space
    # between columns, so that every figure fits whole in 80 columns; a long EP name folds onto a
    # second line rather than being cut. The reasons for FAIL and declined follow the table, whole.
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1), collapse_padding=True)
    t.add_column("EP / device (backend)", overflow="fold", min_width=20)
    for c in ("nodes\ndevice", "nodes\nCPU", "trans-\nfers", "max\nerror", "sim\nms", "sim\nmJ"):
        t.add_column(c, justify="right", overflow="fold")
    t.add_column("result", overflow="fold")
    for r in rows:
        where = f"{r.ep}\n{r.device}" + (f" ({r.backend})" if r.backend else "")
        t.add_row(escape(where), str(r.nodes_on_device), str(r.nodes_on_cpu), str(r.transfers),
                  f"{r.max_error:.3g}", "-" if r.sim_ms is None else f"{r.sim_ms:.3f}",
                  "-" if r.sim_mj is None else f"{r.sim_mj:.3f}",
                  "FAIL" if not r.ok else "declined" if r.declined else "ok")
    console.print(t)
    console.print(f"rule: {SCALE_RULE}, atol and rtol from each device's profile; {EXACT_RULE}", soft_wrap=True,
                  markup=False)
    for r in rows:  # the whole of each verdict is worth reading
        console.print(f"{r.ep} on {r.device}: {row_result(r)}", soft_wrap=True, markup=False)
    idle = [f"{r.ep} on {r.device}" for r in rows if r.ok and r.declined]
    if idle:
        console.print(f"{len(idle)} device(s) ran no node of this model: {', '.join(idle)} (their result is the "
                      "CPU EP's)", soft_wrap=True, markup=False)


def cmd_matrix(args: argparse.Namespace) -> int:
    ensure_simulators(args.profiles)
    from onnxhal.cli import DEVICE_FAILED, check_dims, dim_sizes, feeds_for

    dims = dim_sizes(args)
    ref_sess = reference_session(args.model, dims)
    check_dims(dims, args.model)
    feeds, fed = feeds_for(ref_sess, args, dims)
    rows = matrix(args.model, feeds, show_progress=not (args.no_progress or args.json), dims=dims)
    if args.json:
        print(json.dumps({"model": args.model, "inputs": fed, "rule": f"{SCALE_RULE}; {EXACT_RULE}",
                          "rows": [row_report(r) for r in rows]}, indent=2))
    else:
        print_matrix(rows, f"{args.model} on every EP device vs the CPU EP")
    if any(r.failed for r in rows):
        return DEVICE_FAILED
    return 0 if rows and all(r.ok for r in rows) else 1


def add_matrix_parser(sub: Any) -> None:
    from onnxhal.cli import environment_help

    text = "run a model on every EP device (simulated ones included) against the CPU EP"
    m = sub.add_parser("matrix", help=text, description=text, epilog=environment_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    m.add_argument("model")
    m.add_argument("--profiles", help="simulated devices: comma-separated profile names or TOML paths "
                                      "(default: $ONNXHAL_SIMULATE, else generic-npu,generic-gpu)")
    m.add_argument("--inputs", help=".npz file of inputs (default: random; integer inputs that index a table stay "
                                    "within its rows)")
    m.add_argument("--dim", action="append", metavar="NAME=SIZE",
                   help="size of a symbolic input dimension, for every session and random inputs (repeatable; "
                        "default 1)")
    m.add_argument("--no-progress", action="store_true", help="no progress bar")
    m.add_argument("--json", action="store_true",
                   help="print one JSON object instead of the tables: model, inputs fed, rule, and a row per EP "
                        "device with its nodes, transfers, max_error, sim_ms, sim_mj, result (ok, FAIL, declined) "
                        "and verdict")
    m.set_defaults(fn=cmd_matrix)


def print_explain(sess: onnxhal.InferenceSession, failures: Sequence[str] = ()) -> None:
    """``onnxhal run --explain``: per simulated EP, the nodes it ran and the last run's simulated cost;
    ``failures`` (``cli.device_failures``) say why a requested device has none."""
    from onnxhal.cli_tables import console
    from onnxhal.simulators.cost import explain_rows

    rows = explain_rows(sess)
    if not rows and failures:
        console.print("explain: no simulated cost to show: the requested device did not run the model (below)",
                      soft_wrap=True, markup=False)
        return
    if not rows:
        console.print("explain: this session uses no simulated device (set ONNXHAL_SIMULATE and pick one with "
                      "--policy or --ep)")
        return
    # One column per simulated EP (a session has one or two), one row per figure: as many figures
    # as there are fit any width, where a column per figure cut them at 80 columns.
    t = Table(title="Simulated device cost of the last run")
    t.add_column("", overflow="fold")
    for r in rows:
        t.add_column(escape(f"{r['ep']} ({r['device']})"), justify="right", overflow="fold")
    figures = (("nodes", lambda r: f"{r['nodes_on_device']}/{r['nodes_total']}"),
               ("partitions", lambda r: str(r["partitions"])), ("kernels", lambda r: str(r["kernels"])),
               ("kernel ms", lambda r: f"{r['kernel_ms']:.3f}"), ("transfers", lambda r: str(r["transfers"])),
               ("transfer KiB", lambda r: f"{r['transfer_bytes'] / 1024:.1f}"),
               ("transfer ms", lambda r: f"{r['transfer_ms']:.3f}"), ("device ms", lambda r: f"{r['device_ms']:.3f}"),
               ("energy mJ", lambda r: f"{r['energy_mj']:.3f}"))
    for label, cell in figures:
        t.add_row(label, *(cell(r) for r in rows))
    console.print(t)
    if failures:
        console.print("explain: the requested device did not run all it claimed (below): the table counts what it "
                      "ran", soft_wrap=True, markup=False)
