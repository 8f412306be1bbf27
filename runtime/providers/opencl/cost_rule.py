"""The OpenCL EP's cost rule: a partition whose work is smaller than what the device charges to run
it (its launches plus a copy for every value crossing between host and device) stays on the host.

Both sides are measured, not guessed, once per process: the device's cost of a launch and of a
small copy (``OpenCLDeviceContext.launch_costs``), and the host's rates, arithmetic and memory,
with numpy as the CPU EP computes (``host_rates``). A partition's work is its nodes' arithmetic
(2 flops per multiply-add of the GEMM family; one per output element elsewhere) and the bytes they
read and write, timed at the host's rates. The rule is on by default (provider option
``cost_rule=off`` claims every partition); a declined partition's nodes say why in
``OpenCLEp.declined``.

A partition with symbolic dims (``batch``, ``sequence``) is weighed with each of them at
``cost_rule_dim`` (default ``DEFAULT_COST_DIM``: 64 rows of a tabular model, 64 x 64 tokens of a
transformer): its work grows with them and its launches and copies do not, so one declined there
loses on the device at every smaller size. One claimed there is weighed again at run time, per
concrete input signature, when ``dynamic_partition`` specialises it (``host_worth_trying``,
``SignatureTrial``): a CNN claimed at a batch of 64 and fed 2 images runs that signature on the
host where the host runs it faster. A static partition the formula claims by less than
``CLAIM_UNTRIED_FACTOR`` is timed on both sides at claim instead (``worth_a_trial``, rule
``claim_trial``, ``claim_trial.py``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl.elementwise_codegen import ELEMENTWISE_OPS
from onnxhal.runtime.providers.opencl.op_support import VIEW_OPS

#: The provider option that turns the rule on ("on", the default) or off ("off").
COST_RULE_OPTION = "cost_rule"
#: The provider option: the size the rule weighs each symbolic dim at (a positive integer).
COST_DIM_OPTION = "cost_rule_dim"
#: What one latency-bound request feeds: tens of rows, a few thousand tokens.
DEFAULT_COST_DIM = 64
_GEMM_OPS = {"MatMul", "Gemm", "FusedMatMul", "FusedGemm"}
_CONV_OPS = {"Conv", "FusedConv"}


@dataclass(frozen=True)
class HostRates:
    """What the host computes per second: float32 multiply-add flops (BLAS) and bytes an
    elementwise numpy op reads and writes."""

    flops_per_s: float
    bytes_per_s: float


def _best_of(fn, repeat: int = 20) -> float:
    for _ in range(3):  # BLAS wakes its threads over the first calls
        fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return max(best, 1e-9)


@functools.lru_cache(maxsize=1)
def host_rates() -> HostRates:
    """The host's rates, measured once per process (a few ms): a 64^3 float32 matmul and an add
    over 1 MiB operands, best of 20 each (the best: a loaded machine slows a run, never speeds
    it up). 64^3 is the largest product OpenBLAS computes on the calling thread (its
    GEMM_MULTITHREAD_THRESHOLD, 4 x 65536 multiply-adds): a larger one wakes its thread pool, which
    on a loaded machine took 10-20 ms a call whoever had set its size, and made the host look
    1000 times slower than it is (0.1 against 90 GFLOP/s on 2 loaded Zen 4 cores)."""
    a = np.full((64, 64), 0.5, np.float32)
    out = np.empty_like(a)
    flops = 2.0 * 64 ** 3 / _best_of(lambda: np.matmul(a, a, out=out))
    x = np.ones(1 << 18, np.float32)
    y = np.empty_like(x)
    moved = 3.0 * x.nbytes / _best_of(lambda: np.add(x, x, out=y))
    return HostRates(flops, moved)


class SizedShapes:
    """Shapes to weigh a partition at: static ones as they are, each symbolic (or unnamed) dim at
    ``dim``; None where even the rank is unknown. ``lookup``: a ``GraphLookup`` allowing dynamic
    dims."""

    def __init__(self, lookup, dim: int) -> None:
        self.lookup = lookup
        self.dim = dim

    def shape(self, name: str) -> tuple[int, ...] | None:
        dims = self.lookup.dims(name)
        return None if dims is None else tuple(d if isinstance(d, int) else self.dim for d in dims)

    def dtype(self, name: str):
        return self.lookup.dtype(name)


def weighable(nodes: Sequence[Node], sizes) -> bool:
    """Whether every value ``nodes`` read or write has a known rank (at worst symbolic dims): else
    its work cannot be weighed and the partition is claimed, as without the rule."""
    return all(sizes.shape(v) is not None for n in nodes for v in (*n.inputs, *n.outputs) if v)


def least_launches(nodes: Sequence[Node], shape_values: frozenset[str] = frozenset()) -> int:
    """The launches a partition planned per shape needs at least: one per node that is neither
    elementwise (a chain or a producer's epilogue takes those), nor a view, nor a shape value
    computed on the host; at least one."""
    launching = [n for n in nodes if n.op_type not in ELEMENTWISE_OPS and n.op_type not in VIEW_OPS
                 and not all(o in shape_values for o in n.outputs if o)]
    return max(1, len(launching))


def _size(lookup, name: str) -> int:
    shape = lookup.shape(name) if name else None
    return math.prod(shape) if shape is not None else 0


def node_work(node: Node, lookup) -> tuple[float, float]:
    """(flops, bytes) of one node with static shapes: bytes of every float tensor it reads and
    writes; flops of its multiply-adds (GEMM family, Conv) or one per output element."""
    out = _size(lookup, node.outputs[0]) if node.outputs else 0
    moved = 4.0 * (sum(_size(lookup, v) for v in node.inputs if v) + sum(_size(lookup, v) for v in node.outputs if v))
    if node.op_type in _GEMM_OPS:
        a = lookup.shape(node.inputs[0]) or (1,)
        k = a[0] if node.op_type in ("Gemm", "FusedGemm") and node.attr("transA", 0) else a[-1]
        return 2.0 * out * k, moved
    if node.op_type in _CONV_OPS:
        w = lookup.shape(node.inputs[1]) or (1, 1)
        return 2.0 * out * int(np.prod(w[1:], dtype=np.int64)), moved
    return float(out), moved


def host_seconds(nodes: Sequence[Node], lookup, rates: HostRates) -> float:
    """The time the host would take for ``nodes`` at its measured rates."""
    flops = moved = 0.0
    for n in nodes:
        f, b = node_work(n, lookup)
        flops += f
        moved += b
    return flops / rates.flops_per_s + moved / rates.bytes_per_s


def crossings(graph: Graph, part: Sequence[Node], on_device: set[int]) -> int:
    """How many values would be copied between host and device for ``part`` (``crossing_values``)."""
    return len(crossing_values(graph, part, on_device))


def crossing_values(graph: Graph, part: Sequence[Node], on_device: set[int]) -> list[str]:
    """Values that would be copied between host and device for ``part``: inputs made on the host
    (graph inputs, other EPs' outputs; not constants, which stay resident) and outputs read on the
    host (graph outputs, other EPs' nodes). ``on_device``: ids of every node this EP claims."""
    inside = {id(n) for n in part}
    made = {o for n in part for o in n.outputs if o}
    found: list[str] = []
    seen: set[str] = set()
    for n in part:
        for v in n.inputs:
            if not v or v in made or v in seen or graph.is_constant_initializer(v):
                continue
            seen.add(v)
            producer = graph.producer(v)
            if producer is None or id(producer) not in on_device:
                found.append(v)
    outputs = set(graph.output_names)
    for v in sorted(made):
        readers = graph.consumers(v)
        if v in outputs or any(id(c) not in on_device and id(c) not in inside for c in readers):
            found.append(v)
    return found


def copy_seconds(values: Sequence[str], sizes, rates: HostRates) -> float:
    """What copying ``values`` moves beyond a small copy's fixed cost: their bytes at the host's
    memory rate (a copy reads and writes each byte once)."""
    moved = 0.0
    for v in values:
        dtype = sizes.dtype(v)
        moved += 2.0 * _size(sizes, v) * (np.dtype(dtype).itemsize if dtype is not None else 4)
    return moved / rates.bytes_per_s


def host_island(graph: Graph, part: Sequence[Node], on_device: set[int]) -> bool:
    """Rule ``host_islands``: whether ``part`` is a piece of a host chain, memory-bound work the
    device cannot do for less than its copies: no node of the GEMM family or Conv (the
    compute-bound ops), every non-constant input made by a node on another EP (not a graph input)
    and every output read only by nodes on other EPs (not a graph output). On the device it would
    copy each input in and each output out, and the host would wait for it between its own nodes;
    its elementwise and data-movement work reads and writes no more bytes than those copies move.
    It holds with symbolic dims, where the cost rule has no sizes to weigh (T5's relative position
    buckets: Div, Log, Div, Mul between integer nodes on the host)."""
    if any(n.op_type in _GEMM_OPS or n.op_type in _CONV_OPS for n in part):
        return False
    inside = {id(n) for n in part}
    made = {o for n in part for o in n.outputs if o}
    inputs = {v for n in part for v in n.inputs if v and v not in made and not graph.is_constant_initializer(v)}
    if not inputs:
        return False
    for v in inputs:
        producer = graph.producer(v)
        if producer is None or id(producer) in on_device:
            return False
    outputs = set(graph.output_names)
    for v in made:
        if v in outputs or any(id(c) in on_device and id(c) not in inside for c in graph.consumers(v)):
            return False
    return True


def host_reason(work_s: float, launches: int, copies: int, launch_s: float, copy_s: float,
                moved_s: float = 0.0, symbolic_dim: int | None = None) -> str | None:
    """Why the partition stays on the host, or None when the device is worth its cost: its launches,
    a fixed cost per copy and ``moved_s`` for the copies' bytes. ``symbolic_dim``: the size its
    symbolic dims were weighed at (None: all static)."""
    cost = launches * launch_s + copies * copy_s + moved_s
    if work_s >= cost:
        return None
    at = "" if symbolic_dim is None else (f" with each symbolic dim at {symbolic_dim} "
                                          f"(provider option {COST_DIM_OPTION})")
    least = "at least " if symbolic_dim is not None else ""
    return (f"kept on the host by the cost rule: its work takes about {work_s * 1e6:.3g} us on the host{at}, "
            f"less than the device's {least}{launches} launch(es) and {copies} copy(ies) "
            f"({launch_s * 1e6:.3g} and {copy_s * 1e6:.3g} us each, measured on this device, "
            f"+{moved_s * 1e6:.3g} us for their bytes); "
            f"provider option {COST_RULE_OPTION}=off claims it anyway")


#: A signature whose host run took more than this many times its plan's launches (at the measured
#: launch cost) runs on the device untried: the host cannot win it (a lone launch's cost overstates a
#: replayed plan's 2-4 times, and the device's arithmetic is not in it). A trial's host runs cost at
#: most this.
HOST_TIMING_FACTOR = 10.0
#: The host runs a signature only where it ran in less than this fraction of the device's time.
HOST_MARGIN = 0.8
#: Runs of each side a signature's trial times before it settles.
TRIAL_RUNS = 6


def host_worth_trying(host_s: float, launches: int, launch_s: float) -> bool:
    """Whether a concrete signature, whose first host run took ``host_s``, is worth a trial
    (``SignatureTrial``). The rule's figures alone mislead at run time: the host plan's dispatch,
    1.6 us a node, is in neither rate (a transformer at 2 x 12 tokens computes 14 us at the host's
    rates and its host plan took 279), and a replayed plan's launches cost about 9 us each where a
    lone launch with its wait measured 10-27 us (a loaded PoCL)."""
    return host_s < HOST_TIMING_FACTOR * launches * launch_s


def signature_reason(host_s: float, device_s: float, launches: int, alone: bool = False) -> str | None:
    """Why one concrete signature of a claimed partition runs on the host, or None when the device
    is faster: ``host_s``, a host run, and ``device_s``, a run of its plan to its end, both timed.
    ``alone``: timed as the session's only partition, whose feeds settled on the host run on the
    CPU-only plan (runtime/session/host_settled.py): the host run without copies, the device run
    with the session's uploads and downloads. Else the host run with its copies of values in device
    memory, the device run without the session's copies at the partition's boundary, the same both
    ways then. The host must win by ``HOST_MARGIN``: runs on a loaded machine differ by more than
    that near the line, and there either choice costs about the same."""
    if host_s >= HOST_MARGIN * device_s:
        return None
    return (f"run on the host by the cost rule: at these shapes {_signature_figures(host_s, device_s, launches, alone)}; "
            f"provider option {COST_RULE_OPTION}=off runs it on the device anyway")


def _signature_figures(host_s: float, device_s: float, launches: int, alone: bool) -> str:
    if alone:
        return (f"its host runs took {host_s * 1e6:.3g} us (the session's CPU-only plan would run them, with no "
                f"copy) and its device runs of {launches} launch(es) {device_s * 1e6:.3g} us (the session's copies "
                f"of its inputs and outputs included; the fastest of {TRIAL_RUNS} each, its first runs alternating)")
    return (f"its host runs took {host_s * 1e6:.3g} us (their copies of device values included) and its device "
            f"runs of {launches} launch(es) {device_s * 1e6:.3g} us (the fastest of {TRIAL_RUNS} each, its first "
            "runs alternating)")


#: A static partition whose work at the host's rates is at least this many times the device's price
#: (``host_reason``'s launches and copies) is claimed untried; under it, and over the price, the
#: claim times it on both sides (``claim_trial``): the formula misses the host plan's dispatch and
#: PoCL's per-kernel cost by 2-20x either way near its line.
CLAIM_UNTRIED_FACTOR = 10.0


def worth_a_trial(work_s: float, launches: int, copies: int, launch_s: float, copy_s: float,
                  moved_s: float = 0.0) -> bool:
    """Whether a static partition the formula claims is near enough its line for a timed trial."""
    return work_s < CLAIM_UNTRIED_FACTOR * (launches * launch_s + copies * copy_s + moved_s)


def claim_trial_text(host_s: float, device_s: float, launches: int, copies: int) -> str:
    """A claim-time trial's figures: the fastest run of each side, with the copies each side makes."""
    return (f"timed at claim by the cost rule (rule claim_trial): {_trial_figures(host_s, device_s, launches, copies)}")


def _trial_figures(host_s: float, device_s: float, launches: int, copies: int) -> str:
    return (f"its host runs took {host_s * 1e6:.3g} us and its device runs of {launches} launch(es) and "
            f"{copies} copy(ies) {device_s * 1e6:.3g} us (the fastest of {TRIAL_RUNS} each, alternating, each "
            "with the copies it makes)")


def claim_trial_reason(host_s: float, device_s: float, launches: int, copies: int) -> str | None:
    """Why a static partition stays on the host after its trial, or None when the device wins; the
    host must win by ``HOST_MARGIN``, as a signature's trial."""
    if host_s >= HOST_MARGIN * device_s:
        return None
    return (f"kept on the host by the cost rule, timed at claim (rule claim_trial): "
            f"{_trial_figures(host_s, device_s, launches, copies)}; provider option {COST_RULE_OPTION}=off claims it "
            "anyway")


class SignatureTrial:
    """A signature's first runs, alternating between the host and the device (host first), timed
    as the session runs them; settled once each side ran ``TRIAL_RUNS`` times. Real runs, not
    extra ones at specialisation: a fresh plan's first device runs took 2-6 times its steady one
    (t5 at 2 x 10 tokens: 2366, 1852, 1000, 741 ... 411 us), and the fastest of each side's runs
    drops that ramp and a loaded machine's descheduling."""

    def __init__(self) -> None:
        self.host: list[float] = []
        self.device: list[float] = []
        #: whether every run was timed as the session's only partition (``signature_reason``'s ``alone``)
        self.alone = True

    def next_side(self) -> str:
        """"host" or "device": where the next run of the signature goes."""
        return "host" if len(self.host) <= len(self.device) else "device"

    def record(self, side: str, seconds: float, alone: bool = False) -> None:
        """One run of ``side`` took ``seconds``; ``alone``: timed as the session's only partition."""
        (self.host if side == "host" else self.device).append(seconds)
        self.alone = self.alone and alone

    @property
    def settled(self) -> bool:
        return len(self.host) >= TRIAL_RUNS and len(self.device) >= TRIAL_RUNS

    def reason(self, launches: int) -> str | None:
        """Once settled: ``signature_reason`` of the fastest run of each side."""
        return signature_reason(min(self.host), min(self.device), launches, self.alone)

    def figures(self, launches: int) -> str:
        """Once settled: where it settled and the fastest run of each side, as ``reason`` words them."""
        side = "device" if self.reason(launches) is None else "host"
        return f"settled on the {side}: {_signature_figures(min(self.host), min(self.device), launches, self.alone)}"
