"""The device sweep: models x simulated devices x {onnxhal's session, real onnxruntime through the
plugin library} x {as exported, dims fixed}, each cell in its own process with a time limit.

    onnxhal sweep MODEL.onnx [DIR ...] [--profiles p,q] [--runtimes onnxhal,onnxruntime] [-j N]
                  [--shard I/N] [--junit FILE] [--json FILE] [--report FILE.md] [--timeout S] [--dim NAME=SIZE]

A model with a ``MODEL.npz`` beside it (the layout of ``tests/real_models``: feeds per signature and
onnxruntime's outputs) runs its first stored signature against the stored outputs; any other model
runs random inputs that respect it (``onnxhal.random_feeds``; ``--dim`` sizes symbolic dims, else 1)
against onnxruntime's CPU EP where onnxruntime is installed, else onnxhal's. "Dims fixed" fixes every
symbolic input dim to the size fed (a name fed two sizes stays free). Each cell runs on the simulated device chosen by
``add_provider_for_devices`` (the CPU EP takes what the device declines; onnxhal's run-time fallback
is disabled, so a device that fails at run fails the cell) and compares every output relative to its
scale within the profile's tolerance: max|got - want| <= atol + rtol * s, s = max|want|;
integer and string outputs must be equal. A cell ends as one of:

- ``match``: the device ran nodes of the model and every output is within tolerance;
- ``declined``: the device took no node, and said why (the reasons are in the cell's record);
- ``mismatch``: an output beyond tolerance, with no decline: silently wrong (a failure);
- ``error``: session creation or the run raised, or the device failed and the CPU EP took over
  (a failure: the application asked for the device);
- ``crash`` / ``timeout``: the cell's process died or gave no answer in time (failures).

Cells run in one child process per (runtime, profile), ``-j`` of them at once; each cell has a time
limit (the child's alarm, and a deadline in the parent for a cell stuck in C), and a crash or a hang
restarts the child at the next cell, so one bad cell costs only itself. The exit code is 1 when any
cell failed, 2 for a usage error. ``--shard I/N`` runs every N-th (runtime, profile, model) group
starting at I (0-based), for CI matrices; ``--junit`` writes one test case per cell; ``--report``
a Markdown page per model and device (docs/device-sweep.md).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

FAILED = ("mismatch", "error", "crash", "timeout")


# -- inside a child: one (runtime, profile), cells read from stdin ------------------------------------
def _load(model: str, dims: dict[str, int]) -> tuple[str, dict, list]:
    """The model's path, its feeds (a map input rebuilt as a dict) and the reference outputs by
    index (an array, or (array, keys) for a sequence of maps): the first stored signature of
    ``MODEL.npz`` where there is one, else random feeds and onnxruntime's (or the CPU EP's) outputs."""
    from onnxhal.stored_outputs import read_signatures, stored_path

    if not os.path.exists(stored_path(model)):
        return _random_case(model, dims)
    signatures = read_signatures(model)
    feeds, want = signatures[sorted(signatures)[0]]
    return model, feeds, want


def _random_case(path: str, dims: dict[str, int]) -> tuple[str, dict, list]:
    """Random feeds that respect the model and the reference outputs for them: onnxruntime's CPU EP
    where onnxruntime is installed (the judge), else onnxhal's."""
    import numpy as np
    import onnx

    import onnxhal
    from onnxhal.random_feeds import random_feeds

    model = onnx.load(path, load_external_data=False)
    cpu = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds, _, _ = random_feeds(cpu.get_inputs(), model, dims)
    try:
        import onnxruntime

        outs = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    except ImportError:
        outs = cpu.run(None, feeds)
    want = []
    for value in outs:
        if isinstance(value, list) and value and isinstance(value[0], dict):  # a sequence of maps
            keys = list(value[0])
            want.append((np.array([[m[k] for k in keys] for m in value], np.float32), np.array(keys)))
        else:
            want.append((np.asarray(value), None))
    return path, feeds, want


def fed_dim_sizes(path: str, feeds: dict) -> dict[str, int]:
    """{dim name: size} of the model's symbolic input dims, the sizes read from the feeds. A name
    the feeds give two sizes is left free: optimum's merged decoders name the encoder's length in
    the cross-attention pasts too, fed empty (length 0) on the first step beside the encoder's
    states, and onnxruntime does not hold inputs to one size per name; fixed to either size, the
    other input contradicts the model."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    seen: dict[str, set[int]] = {}
    for vi in model.graph.input:
        value = feeds.get(vi.name)
        if value is None or not vi.type.HasField("tensor_type") or not hasattr(value, "shape"):
            continue
        for axis, dim in enumerate(vi.type.tensor_type.shape.dim):
            if dim.dim_param and axis < len(value.shape):
                seen.setdefault(dim.dim_param, set()).add(int(value.shape[axis]))
    return {name: next(iter(sizes)) for name, sizes in seen.items() if len(sizes) == 1}


def compare(got: list, want: list, rtol: float, atol: float) -> tuple[bool, float, str]:
    """(within tolerance, largest error relative to the output's scale, what differs), by
    ``onnxhal.output_compare``'s rule (the one ``matrix``, ``run`` and the profiles' docs state)."""
    import numpy as np

    from onnxhal.output_compare import compare_output

    worst = 0.0
    for i, (value, keys) in enumerate(want):
        out = got[i]
        if keys is not None:  # a sequence of maps (ZipMap): the values in the stored key order
            try:
                out = np.array([[m[k] for k in keys.tolist()] for m in out], np.float32)
            except (TypeError, KeyError) as e:
                return False, float("inf"), f"output {i}: not the sequence of maps onnxruntime gives ({e})"
        check = compare_output(str(i), np.asarray(out), value, rtol, atol, ref_name="onnxruntime")
        relative = check.max_error / max(check.scale, 1e-30) if not check.exact else 0.0
        if not check.ok:
            return False, relative if np.isfinite(relative) else float("inf"), check.problem
        worst = max(worst, relative)
    return True, worst, ""


def _declines(reasons: list[str], path: str, sess_inputs: list) -> dict[str, Any]:
    """The declined nodes by kind of reason (``onnxhal.decline_summary``): the counts, and the first
    kinds as lines with their remedies (naming the inputs' dimensions), for the report."""
    from onnxhal.decline_summary import decline_kinds
    from onnxhal.random_feeds import input_dim_hints

    kinds = decline_kinds(reasons)
    dims, unnamed = input_dim_hints(sess_inputs)
    return {"decline_kinds": {k.kind: k.nodes for k in kinds},
            "declines": [k.line(Path(path).name, dims, unnamed) for k in kinds[:4]]}


def _draw(sess: Any, path: str, profile: str, fixed: bool, folder: str) -> str:
    """The session's partition drawn to ``folder`` (``onnxhal partition --svg``'s picture); its file name."""
    from onnxhal.partition_svg import partition_svg
    from onnxhal.partition_view import session_view

    name = f"{Path(path).stem}-{profile}-{'fixed' if fixed else 'exported'}.svg"
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
        f.write(partition_svg(session_view(sess), f"{Path(path).name} on {profile}"
                              + (", dims fixed" if fixed else "")))
    return name


def _cell_onnxhal(profile_name: str, path: str, feeds: dict, want: list, fixed: bool,
                  pictures: str = "") -> dict:
    import logging

    import onnxhal
    from onnxhal.simulators.profiles import load_profile
    from onnxhal.simulators.testing import simulated_devices

    profile = load_profile(profile_name)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Keep()
    logging.getLogger("onnxhal").addHandler(handler)
    try:
        with simulated_devices(profile_name) as devices:
            device = devices[0]
            so = onnxhal.SessionOptions()
            so.add_provider_for_devices([device], {})
            if fixed:
                for name, size in fed_dim_sizes(path, feeds).items():
                    so.add_free_dimension_override_by_name(name, size)
            sess = onnxhal.InferenceSession(path, so)
            sess.disable_fallback()  # a device that fails at run must fail the cell
            taken = sess.partition_summary.get(device.ep_name, 0)
            total = sum(sess.partition_summary.values())
            ep = sess.eps.get(device.ep_name)
            declined = [str(r) for r in getattr(ep, "declined", {}).values()]
            inputs = sess.get_inputs()
            reasons = sorted(set(declined))[:5]
            picture = _draw(sess, path, profile_name, fixed, pictures) if pictures and taken else ""
            got = sess.run(None, feeds)
            meter = getattr(ep, "meter", None)  # the simulated device's time and energy of that run
            simulated = ({"sim_ms": round(meter.last_run.device_seconds * 1e3, 4),
                          "sim_mj": round(meter.last_run.energy_joules * 1e3, 4)} if meter is not None else {})
    finally:
        logging.getLogger("onnxhal").removeHandler(handler)
    failed_compiles = [r for r in records if "compile" in r.lower() and "fail" in r.lower()]
    return {**_verdict(got, want, profile.rtol, profile.atol, taken, total, reasons, failed_compiles),
            **_declines(declined, path, inputs), **simulated, **({"picture": picture} if picture else {})}


def _cell_onnxruntime(profile_name: str, path: str, feeds: dict, want: list, fixed: bool, state: dict) -> dict:
    import onnxruntime as ort

    import onnxhal.ort_plugin as plugin
    from onnxhal.simulators.profiles import load_profile

    if "registered" not in state:
        plugin.configure(profiles=[profile_name])
        ort.register_execution_provider_library(plugin.REGISTRATION_NAME, plugin.library_path())
        state["registered"] = True
    profile = load_profile(profile_name)
    devices = [d for d in ort.get_ep_devices() if d.ep_name != "CPUExecutionProvider"]
    so = ort.SessionOptions()
    so.add_provider_for_devices(devices[:1], {})
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.log_severity_level = 3
    if fixed:
        for name, size in fed_dim_sizes(path, feeds).items():
            so.add_free_dimension_override_by_name(name, size)
    sess = ort.InferenceSession(path, so)
    counts: dict[str, int] = {}
    for sub in sess.get_provider_graph_assignment_info():
        counts[sub.ep_name] = counts.get(sub.ep_name, 0) + len(sub.get_nodes())
    taken = counts.get(devices[0].ep_name, 0)
    got = sess.run(None, feeds)
    reasons = [] if taken else ["onnxruntime's GetCapability got no node (the plugin logs why)"]
    return _verdict(got, want, profile.rtol, profile.atol, taken, sum(counts.values()), reasons, [])


def _verdict(got: list, want: list, rtol: float, atol: float, taken: int, total: int, reasons: list,
             failed_compiles: list) -> dict:
    ok, err, why = compare(got, want, rtol, atol)
    record = {"device_nodes": taken, "nodes": total, "rel_error": err if err != float("inf") else None}
    if failed_compiles:
        return {**record, "status": "error", "detail": "device compile failed, the CPU EP took over: "
                + failed_compiles[0][:300]}
    if not ok:
        return {**record, "status": "mismatch", "detail": why}
    if taken == 0:
        return {**record, "status": "declined", "detail": "; ".join(reasons) or "no reason given"}
    return {**record, "status": "match", "detail": ""}


def child(runtime: str, profile: str, dims: dict[str, int], pictures: str = "") -> None:
    """Reads cells (JSON lines: model path, shapes, time limit) from stdin; prints a "start" line
    before each and a JSON record after, so the parent knows which cell a crash belongs to."""
    import signal

    state: dict = {}
    for line in sys.stdin:
        cell = json.loads(line)
        model, shapes, limit = cell["model"], cell["shapes"], int(cell["timeout"])
        print(json.dumps({"start": [model, shapes]}), flush=True)

        def expire(*_: Any) -> None:
            raise TimeoutError

        signal.signal(signal.SIGALRM, expire)
        signal.alarm(limit)
        t0 = time.perf_counter()
        try:
            path, feeds, want = _load(model, dims)
            fixed = shapes == "fixed"
            if runtime == "onnxhal":
                record = _cell_onnxhal(profile, path, feeds, want, fixed, pictures)
            else:
                record = _cell_onnxruntime(profile, path, feeds, want, fixed, state)
        except TimeoutError:
            record = {"status": "timeout", "detail": f"past {limit} s"}
        except Exception as e:  # the cell's failure, recorded; the next cell still runs
            record = {"status": "error", "detail": f"{type(e).__name__}: {str(e)[:400]}"}
        finally:
            signal.alarm(0)
        record["seconds"] = round(time.perf_counter() - t0, 2)
        print(json.dumps({"done": [model, shapes], **record}), flush=True)


# -- the parent ---------------------------------------------------------------------------------------
def _pump(stream: Any, lines: queue.Queue) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


def run_group(runtime: str, profile: str, cells: list[tuple[str, str]], timeout: int, on_cell: Any,
              dims: dict[str, int] | None = None, pictures: str = "") -> list[dict]:
    """The cells (model path, shapes) of one (runtime, profile) in child processes, restarted after
    a crash or a hang."""
    results: list[dict] = []
    pending = list(cells)
    while pending:
        env = dict(os.environ, ONNXHAL_SIMULATE="")
        argv = [sys.executable, "-m", "onnxhal.sweep", "--child", runtime, profile]
        for name, size in (dims or {}).items():
            argv += ["--dim", f"{name}={size}"]
        if pictures:
            argv += ["--pictures", pictures]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("".join(json.dumps({"model": m, "shapes": s, "timeout": timeout}) + "\n" for m, s in pending))
        proc.stdin.close()
        # The child's own alarm cannot interrupt a thread blocked in C (a lock after heap corruption,
        # a driver call): a reader thread and a deadline here end such a cell from the outside.
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        started: tuple[str, str] | None = None
        deadline = time.monotonic() + timeout + 30
        hung = False
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                hung = True
                proc.kill()
                break
            if line is None:
                break
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue  # a library printing to stdout
            if "start" in msg:
                started = tuple(msg["start"])
                deadline = time.monotonic() + timeout + 30
            elif "done" in msg:
                model, shapes = msg.pop("done")
                cell = {"runtime": runtime, "profile": profile, "model": Path(model).stem, "path": model, "shapes": shapes, **msg}
                results.append(cell)
                on_cell(cell)
                pending.remove((model, shapes))
                started = None
        code = proc.wait()
        if started is not None:  # the child died or hung inside this cell
            model, shapes = started
            cell = {"runtime": runtime, "profile": profile, "model": Path(model).stem, "path": model, "shapes": shapes,
                    "status": "timeout" if hung else "crash",
                    "detail": f"no answer {timeout + 30} s after the cell started: the process was killed" if hung
                    else f"the cell's process exited with {code}"}
            results.append(cell)
            on_cell(cell)
            pending.remove((model, shapes))
        elif pending and code != 0:
            for model, shapes in pending:
                cell = {"runtime": runtime, "profile": profile, "model": Path(model).stem, "path": model, "shapes": shapes,
                        "status": "crash", "detail": f"the process exited with {code} before the cell"}
                results.append(cell)
                on_cell(cell)
            pending = []
    return results


def write_junit(results: list[dict], path: str) -> None:
    from xml.sax.saxutils import escape, quoteattr

    failures = sum(r["status"] in FAILED for r in results)
    lines = ['<?xml version="1.0" encoding="utf-8"?>',
             f'<testsuite name="device_sweep" tests="{len(results)}" failures="{failures}">']
    for r in results:
        name = quoteattr(f"{r['model']}[{r['profile']}-{r['runtime']}-{r['shapes']}]")
        lines.append(f'  <testcase classname="device_sweep" name={name} time="{r.get("seconds", 0)}">')
        if r["status"] in FAILED:
            lines.append(f'    <failure message={quoteattr(r["status"])}>{escape(r.get("detail", ""))}</failure>')
        elif r["status"] == "declined":
            lines.append(f'    <system-out>declined: {escape(r.get("detail", ""))}</system-out>')
        lines.append("  </testcase>")
    lines.append("</testsuite>")
    Path(path).write_text("\n".join(lines) + "\n")


def summary(results: list[dict]) -> list[tuple]:
    """Rows (runtime, profile, cells, match, declined, failed, device nodes / nodes)."""
    rows = []
    for key in sorted({(r["runtime"], r["profile"]) for r in results}):
        cells = [r for r in results if (r["runtime"], r["profile"]) == key]
        rows.append((*key, len(cells), sum(r["status"] == "match" for r in cells),
                     sum(r["status"] == "declined" for r in cells), sum(r["status"] in FAILED for r in cells),
                     sum(r.get("device_nodes", 0) or 0 for r in cells), sum(r.get("nodes", 0) or 0 for r in cells)))
    return rows


def model_paths(items: list[str]) -> list[str]:
    """``items`` as model files: a folder stands for every ``*.onnx`` in it."""
    paths: list[str] = []
    for item in items:
        if os.path.isdir(item):
            paths += sorted(glob.glob(os.path.join(item, "*.onnx")))
        elif os.path.isfile(item):
            paths.append(item)
        else:
            from onnxhal.errors import NoSuchFile

            raise NoSuchFile(f"sweep: model {item!r} is neither a file nor a folder; give .onnx files or folders of them")
    return [os.path.abspath(x) for x in paths]


def write_report(results: list[dict], path: str, wall_s: float, jobs: int, pictures: str = "") -> None:
    """A Markdown page a person reads: the summary, then per model its cells (device nodes, linked to
    the partition's picture where ``pictures`` holds one; error against the reference; the simulated
    device time and energy of the run in onnxhal's sessions; why nodes stayed on the CPU, one line
    per kind of reason with its count and remedy)."""
    import platform

    pictures_rel = os.path.relpath(pictures, os.path.dirname(os.path.abspath(path))) if pictures else None
    lines = ["# Device sweep", "",
             f"{len(results)} cells in {wall_s:.0f} s with -j {jobs} on {platform.machine()} "
             f"({os.cpu_count()} CPUs), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
             "A cell matches when every output is within the profile's tolerance relative to the output's scale; "
             "declined means the device took no node and said why; anything else is a failure.", "",
             "| runtime | profile | cells | match | declined | failed | device nodes / all |",
             "|---|---|---|---|---|---|---|"]
    for runtime, profile, cells, match, declined, failed, dev, nodes in summary(results):
        lines.append(f"| {runtime} | {profile} | {cells} | {match} | {declined} | {failed} | {dev} / {nodes} |")
    for model in sorted({r["model"] for r in results}):
        lines += ["", f"## {model}", "", "| runtime | profile | shapes | verdict | device nodes | error / scale | "
                  "sim ms | sim mJ | why nodes stayed on the CPU |", "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted((r for r in results if r["model"] == model),
                        key=lambda r: (r["runtime"], r["profile"], r["shapes"])):
            why = "; ".join(r.get("declines", []))
            if r["status"] not in ("match", "declined"):
                why = r.get("detail", "")[:200]
            err = "" if r.get("rel_error") is None else f"{r['rel_error']:.2g}"
            nodes = f"{r.get('device_nodes', '')}/{r.get('nodes', '')}" if "nodes" in r else ""
            sim = f"| {r['sim_ms']:.3g} | {r['sim_mj']:.3g} " if "sim_ms" in r else "| | "
            if r.get("picture") and pictures_rel is not None:
                nodes = f"[{nodes}]({pictures_rel}/{r['picture']})"
            lines.append(f"| {r['runtime']} | {r['profile']} | {r['shapes']} | {r['status']} | {nodes} | {err} "
                         f"{sim}| {why.replace('|', '/')} |")
    Path(path).write_text("\n".join(lines) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("models", nargs="*", help=".onnx files or folders of them (a MODEL.npz beside a model gives its "
                                             "inputs and reference outputs)")
    p.add_argument("--profiles", default="", help="comma-separated profiles (default: every shipped profile)")
    p.add_argument("--runtimes", default="onnxhal,onnxruntime", help="onnxhal, onnxruntime (via the plugin) or both")
    p.add_argument("--shapes", default="exported,fixed", help="exported, fixed (symbolic dims fixed) or both")
    p.add_argument("-j", "--jobs", type=int, default=1, help="cell processes at once (default 1)")
    p.add_argument("--shard", default="0/1", help="I/N: this shard of the (runtime, profile, model) groups")
    p.add_argument("--timeout", type=int, default=120, help="seconds one cell may take (default 120)")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dim for models without a MODEL.npz (repeatable; default 1)")
    p.add_argument("--junit", default="", help="write JUnit XML here")
    p.add_argument("--json", default="", help="write every cell's record here")
    p.add_argument("--report", default="", help="write a Markdown report here")
    p.add_argument("--pictures", default="", metavar="DIR",
                   help="draw each onnxhal cell's partition to DIR (SVG, as onnxhal partition --svg); the report "
                        "links them")
    p.add_argument("--quiet", action="store_true", help="no line per cell, only the table")


def _dims(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, size = item.partition("=")
        if not name or not size.isdigit():
            from onnxhal.errors import InvalidArgument

            raise InvalidArgument(f"--dim {item!r}: write NAME=SIZE with a positive integer size, e.g. --dim batch=2")
        out[name] = int(size)
    return out


def run(args: argparse.Namespace) -> int:
    """The sweep of ``args`` (see ``add_arguments``); 0 when every cell matched or declined."""
    from concurrent.futures import ThreadPoolExecutor

    from onnxhal.errors import InvalidArgument
    from onnxhal.simulators.profiles import load_profile, shipped_profiles

    models = model_paths(args.models)
    if not models:
        raise InvalidArgument("sweep: no model given; name .onnx files or folders (tests/real_models holds a corpus)")
    profiles = [p for p in args.profiles.split(",") if p] or shipped_profiles()
    for name in profiles:
        load_profile(name)  # a misspelt profile is a usage error up front, not 2 x models failed cells
    runtimes = [r for r in args.runtimes.split(",") if r]
    shapes = [x for x in args.shapes.split(",") if x]
    bad = [r for r in runtimes if r not in ("onnxhal", "onnxruntime")] + [x for x in shapes if x not in ("exported", "fixed")]
    if bad:
        raise InvalidArgument(f"sweep: unknown runtime or shapes {bad}; runtimes are onnxhal and onnxruntime, shapes "
                              "exported and fixed")
    try:
        index, count = (int(x) for x in args.shard.split("/"))
        assert 0 <= index < count
    except (ValueError, AssertionError):
        raise InvalidArgument(f"sweep: --shard {args.shard!r}: write I/N with 0 <= I < N, e.g. 0/4") from None
    dims = _dims(args.dim)
    pictures = os.path.abspath(args.pictures) if args.pictures else ""
    groups = [(rt, pr, m) for rt in runtimes for pr in profiles for m in models][index::count]
    total = len(groups) * len(shapes)
    results: list[dict] = []
    t0 = time.perf_counter()
    lock = threading.Lock()

    # A bar on a terminal (failed cells printed above it as they come); a line per cell otherwise,
    # so that a CI log shows how far the sweep got.
    bar = None
    if not args.quiet and sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                       TimeElapsedColumn())
        task = bar.add_task("", total=total)

    def on_cell(cell: dict) -> None:
        with lock:
            results.append(cell)
            failed_now = sum(r["status"] in FAILED for r in results)
            flag = "" if cell["status"] in ("match", "declined") else "  <-- " + cell.get("detail", "")[:160]
            line = (f"[{len(results):>4}/{total}] {cell['runtime']:<11} {cell['profile']:<15} {cell['model']:<28} "
                    f"{cell['shapes']:<8} {cell['status']:<8} "
                    f"{cell.get('device_nodes', '')!s:>4}/{cell.get('nodes', '')!s:<4}{flag}")
            if bar is not None:
                bar.update(task, advance=1, description=f"{failed_now} failed" if failed_now else "")
                if flag:
                    bar.console.print(line, markup=False, highlight=False)
            elif not args.quiet:
                print(line, flush=True)

    work = []
    for runtime in runtimes:
        for profile in profiles:
            mine = [(m, x) for (rt, pr, m) in groups if (rt, pr) == (runtime, profile) for x in shapes]
            if mine:
                work.append((runtime, profile, mine))
    if bar is not None:
        bar.start()
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            list(pool.map(lambda w: run_group(w[0], w[1], w[2], args.timeout, on_cell, dims, pictures), work))
    finally:
        if bar is not None:
            bar.stop()
    wall = time.perf_counter() - t0
    print(f"\n{len(results)} cells in {wall:.0f} s")
    print(f"{'runtime':<12}{'profile':<16}{'cells':>6}{'match':>7}{'declined':>9}{'failed':>8}{'device nodes':>14}")
    for runtime, profile, cells, match, declined, failed, dev, nodes in summary(results):
        print(f"{runtime:<12}{profile:<16}{cells:>6}{match:>7}{declined:>9}{failed:>8}{dev:>8}/{nodes:<6}")
    failed = [r for r in results if r["status"] in FAILED]
    for r in failed:
        print(f"FAILED {r['runtime']} {r['profile']} {r['model']} {r['shapes']}: {r['status']}: {r.get('detail', '')}")
    if args.junit:
        write_junit(results, args.junit)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.report:
        write_report(results, args.report, wall, args.jobs, pictures)
    if failed:
        print(f"onnxhal sweep: {len(failed)} of {len(results)} cells failed", file=sys.stderr)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """``python -m onnxhal.sweep``: the sweep, or (``--child``) one (runtime, profile)'s cell process."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        p = argparse.ArgumentParser()
        p.add_argument("--child", nargs=2)
        p.add_argument("--dim", action="append", default=[])
        p.add_argument("--pictures", default="")
        a = p.parse_args(argv)
        child(a.child[0], a.child[1], _dims(a.dim), a.pictures)
        return 0
    p = argparse.ArgumentParser(prog="onnxhal sweep", description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
