"""Tables the CLI prints (rich)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import onnxhal

#: Width of tables written to a pipe or a file (CI logs), where there is no terminal to measure.
PIPED_WIDTH = 100


def console_width() -> int | None:
    """The terminal's width (None: rich measures it), else $COLUMNS, else ``PIPED_WIDTH``."""
    if sys.stdout.isatty():
        return None
    columns = os.environ.get("COLUMNS", "")
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPED_WIDTH


class CliConsole(Console):
    """rich's Console, except that a closed pipe (``| head -1``) raises ``BrokenPipeError`` for
    ``cli.main`` to end with 141, as every other command does; rich's own handler exits 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


console = CliConsole(width=console_width())


def print_devices(hw: Sequence[onnxhal.OrtHardwareDevice], eps: Sequence[onnxhal.OrtEpDevice]) -> None:
    t = Table(title="Hardware devices")
    for c in ("#", "type", "vendor", "vendor_id", "device_id", "metadata"):
        t.add_column(c, overflow="fold")  # fold, not cut: a path in the metadata stays whole
    for k, d in enumerate(hw):
        md = ", ".join(f"{a}={b}" for a, b in d.metadata.items())
        t.add_row(str(k), d.type.name, escape(d.vendor), f"0x{d.vendor_id:04x}", f"0x{d.device_id:04x}", escape(md))
    console.print(t)
    t = Table(title="EP devices")
    for c in ("#", "ep_name", "ep_vendor", "device", "memory", "ep_metadata", "ep_options"):
        t.add_column(c, no_wrap=c in ("ep_name", "ep_vendor"), overflow="fold")
    for k, d in enumerate(eps):
        mems = [f"{m.name} ({m.device_type.name}, {m.device_mem_type.name}, vendor 0x{m.device_vendor_id:x})"
                for m in d.memory_infos()] or ["host (CPU memory)"]
        t.add_row(str(k), escape(d.ep_name), escape(d.ep_vendor), escape(f"{d.device.type.name} {d.device.vendor}"),
                  escape("\n".join(mems)), escape("\n".join(f"{a}={b}" for a, b in d.ep_metadata.items())),
                  escape("\n".join(f"{a}={b}" for a, b in d.ep_options.items())))
    console.print(t)


def print_ep_devices_brief(eps: Sequence[onnxhal.OrtEpDevice]) -> None:
    """One line per EP device: EP, device, and for a simulated one its profile and backend."""
    t = Table(title="EP devices")
    for c in ("#", "EP", "device", "simulated as", "runs on"):
        t.add_column(c, overflow="fold")  # fold, not cut: an EP name stays whole across lines
    for k, d in enumerate(eps):
        md, ep_md = d.device.metadata, d.ep_metadata
        backend = ep_md.get("backend", "")
        runs_on = (f"OpenCL ({ep_md.get('opencl_device', '?')})" if backend == "opencl"
                   else f"host backend ({ep_md.get('backend_reason', '')})" if backend == "host"
                   else f"OpenCL ({ep_md['opencl_device']})" if "opencl_device" in ep_md else "host")
        t.add_row(str(k), escape(d.ep_name), escape(f"{d.device.type.name} {d.device.vendor}"),
                  escape(md.get("simulator_profile", "-")), escape(runs_on))
    console.print(t)


def partition_report(sess: onnxhal.InferenceSession, model: str = "MODEL") -> dict:
    """What ``print_partition`` shows, as data (``run --json``): per EP its nodes, partitions and op
    types; the transfers per run, by route; why each EP declined nodes."""
    from onnxhal.partition_view import session_view

    view = session_view(sess)
    parts = view.partitions_per_ep()
    eps = []
    for ep, count in view.nodes_per_ep().items():
        ops: dict[str, int] = {}
        for p in view.partitions:
            for n in p.nodes if p.ep_name == ep else ():
                ops[n.op_type] = ops.get(n.op_type, 0) + 1
        eps.append({"ep": ep, "nodes": count, "partitions": parts[ep],
                    "op_types": dict(sorted(ops.items(), key=lambda x: -x[1]))})
    values, nbytes = view.transfer_totals()
    by_route: dict[tuple[str, str], list[int]] = {}
    for tr in view.transfers:
        route = by_route.setdefault((view.ep_of(tr.src), view.ep_of(tr.dst)), [0, 0])
        route[0] += len(tr.values)
        route[1] += tr.nbytes
    declined = {}
    for ep_name in sess.get_providers():
        lines = declined_summary(sess, ep_name, model)
        if lines:
            declined[ep_name] = {"nodes": len(getattr(sess.eps.get(ep_name), "declined", {})), "reasons": lines}
    return {"providers": sess.get_providers(), "eps": eps,
            "transfers": {"values": values, "bytes": nbytes, "of_unknown_size": view.unknown_sizes(),
                          "routes": [{"from": a, "to": b, "values": n, "bytes": size}
                                     for (a, b), (n, size) in by_route.items()]},
            "declined": declined}


def print_partition(sess: onnxhal.InferenceSession, model: str = "MODEL") -> None:
    """Nodes and partitions per EP, the transfers between them, why an EP declined nodes (with the
    remedy, naming ``model``), and where simulated devices run."""
    from onnxhal.partition_view import format_bytes

    report = partition_report(sess, model)
    t = Table(title=f"Partition ({', '.join(report['providers'])})")
    # fold, not cut: a name or count too wide for its column goes on across lines
    t.add_column("EP", overflow="fold")
    t.add_column("nodes", justify="right", overflow="fold")
    t.add_column("partitions", justify="right", overflow="fold")
    t.add_column("op types", overflow="fold")
    for ep in report["eps"]:
        top = list(ep["op_types"].items())
        parts = str(ep["partitions"])
        if ep["partitions"] == ep["nodes"] > 1:  # e.g. the CPU EP, which takes nodes one kernel each
            parts += " (one node each)"
        t.add_row(escape(ep["ep"]), str(ep["nodes"]), parts,
                  escape(", ".join(f"{o}×{c}" for o, c in top[:8]) + (f", {len(top) - 8} more" if len(top) > 8 else "")))
    console.print(t)
    tr = report["transfers"]
    unknown = tr["of_unknown_size"]
    console.print(f"transfers per run: {tr['values']} value(s), {format_bytes(tr['bytes'])}"
                  + (f" (+{unknown} of a size known only at run time)" if unknown else "")
                  + (":" if tr["routes"] else ""), markup=False)
    for r in tr["routes"]:
        console.print(f"  {r['from']} -> {r['to']}: {r['values']} value(s), {format_bytes(r['bytes'])}",
                      soft_wrap=True, markup=False)
    for ep_name, d in report["declined"].items():  # why an EP left nodes to the next one
        console.print(f"{ep_name} declined {d['nodes']} node(s):", soft_wrap=True, markup=False)
        for line in d["reasons"]:
            console.print(f"  {line}", soft_wrap=True, markup=False)
    from onnxhal.simulators import describe_backend

    for d in onnxhal.get_ep_devices():  # which backend runs the session's simulated devices
        line = describe_backend(d) if d.ep_name in sess.get_providers() else ""
        if line:
            console.print(f"{line}", soft_wrap=True, markup=False)


def declined_summary(sess: onnxhal.InferenceSession, ep_name: str, model: str = "MODEL") -> list[str]:
    """Why ``ep_name`` did not take the nodes it left: one line per kind of reason, with its node
    count and remedy (``onnxhal/decline_summary.py``); [] if it declined none."""
    from onnxhal.decline_summary import decline_lines
    from onnxhal.random_feeds import input_dim_hints

    return decline_lines(getattr(sess.eps.get(ep_name), "declined", {}).values(), model,
                         *input_dim_hints(sess.get_inputs()))


def feeds_report(rows: Sequence, source: str, defaulted: Sequence[str]) -> dict:
    """What ``print_feeds`` shows, as data (``--json``)."""
    return {"source": source, "inputs": [{"name": r.name, "dtype": r.dtype, "shape": list(r.shape),
                                          "min": float(r.low), "max": float(r.high), "range_from": r.why}
                                         for r in rows],
            "symbolic_dims_set_to_1": list(defaulted)}


def print_feeds(rows: Sequence, source: str, defaulted: Sequence[str]) -> None:
    """What the model was fed (``random_feeds.FeedRow``s): name, dtype, shape, value range, why."""
    t = Table(title=f"Inputs ({source})")
    for c in ("name", "dtype", "shape", "min", "max", "range from"):
        t.add_column(c, overflow="fold")  # fold, not cut: a long input name or figure stays whole
    for r in rows:
        t.add_row(escape(r.name), r.dtype, str(r.shape), f"{r.low:.4g}", f"{r.high:.4g}", escape(r.why))
    console.print(t)
    if defaulted:
        console.print(f"symbolic dimension(s) set to 1: {', '.join(defaulted)} (choose sizes with --dim NAME=SIZE)",
                      soft_wrap=True, markup=False)


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


def output_summary(name: str, out: object) -> dict:
    """One output's dtype, shape and value range (min, max, mean; None where it holds no numbers)."""
    stats: tuple = (None, None, None)
    if isinstance(out, np.ndarray) and out.dtype.kind in "fiub" and out.size:
        f = out.astype(np.float64)
        dtype, shape, stats = str(out.dtype), list(out.shape), (float(f.min()), float(f.max()), float(f.mean()))
    elif isinstance(out, list):  # a sequence: of maps (ZipMap) or of tensors; its values summarised
        kind = "map" if out and all(isinstance(m, dict) for m in out) else "tensor"
        values = [float(v) for m in out for v in np.ravel(list(m.values()) if kind == "map" else m)
                  if np.asarray(v).dtype.kind in "fiub"]
        dtype, shape = f"seq({kind})", [len(out)]
        if values:
            stats = (min(values), max(values), float(np.mean(values)))
    else:
        dtype, shape = str(getattr(out, "dtype", type(out).__name__)), list(getattr(out, "shape", []))
    return {"name": name, "dtype": dtype, "shape": shape, "min": stats[0], "max": stats[1], "mean": stats[2]}


def print_outputs(names: Sequence[str], outs: Sequence, sess: onnxhal.InferenceSession | None = None) -> None:
    t = Table(title="Outputs")
    for c in ("name", "dtype", "shape", "min", "max", "mean"):
        t.add_column(c, overflow="fold")  # fold, not cut: a long output name or figure stays whole
    notes = []
    for n, o in zip(names, outs):
        s = output_summary(n, o)
        shape = f"[{s['shape'][0]}]" if s["dtype"].startswith("seq(") else str(s["shape"])
        t.add_row(escape(n), s["dtype"], shape, *("" if s[k] is None else f"{s[k]:.4g}" for k in ("min", "max", "mean")))
        note = nonfinite_note(n, o, sess)
        if note:
            notes.append(note)
    console.print(t)
    for note in notes:
        console.print(f"[yellow]warning:[/yellow] {escape(note)}", soft_wrap=True)


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
        # Names are searched for and copied: never broken; the platform wraps at spaces first.
        t.add_column(c, no_wrap=c in ("index", "device", "driver"), overflow="fold")
    for d in report["devices"]:
        state = "[green]usable[/green]" if d["state"] == "usable" else "[red]failed probe[/red] (below)"
        t.add_row(d["index"], escape(d["platform"]), escape(d["device"]), escape(d["driver_version"]), state)
    if report["devices"]:
        console.print(t)
        for d in report["devices"]:  # a compiler's message is read whole, not cut into a narrow column
            if d["state"] != "usable":
                console.print(f"{d['index']} {d['device']}: failed probe: {d['reason']}", soft_wrap=True, markup=False)
        if any(d["state"] == "usable" for d in report["devices"]):
            # The OpenCL EP is built in but not an EP device until used: say how to use it.
            hint = "" if os.environ.get("ONNXHAL_SIMULATE") else \
                " (ONNXHAL_SIMULATE=generic-npu,generic-gpu adds simulated devices)"
            console.print("The OpenCL EP runs on the first usable one with no registration: onnxhal run MODEL --ep "
                          f"OpenCLExecutionProvider{hint}", soft_wrap=True, markup=False)
    elif report["switch"]:
        console.print(f"OpenCL devices: none listed ({report['switch']})")
    else:
        console.print("OpenCL devices: none found")
    if report["remedy"]:
        console.print(report["remedy"], soft_wrap=True, markup=False)  # it names an extra: [intel-opencl]
