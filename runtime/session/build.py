"""Building a session, as named stages: load, select, then (``SessionCore``) create the EPs,
optimize, partition + layout, compile, plan.

``InferenceSession`` runs ``load`` and ``select`` once; ``SessionCore`` holds everything built from
one choice of EPs and is replaced whole when the recovery policy (``runtime/session/recovery.py``) or
``set_providers`` chooses other EPs. Each stage is one function here, or a module of its own
(``partitioner``, ``layout_transform``, ``compile_partitions``, ``executor``) that this calls.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from onnxhal.hal import Ep, Graph, GraphOptimizationLevel, Node
from onnxhal.hal.ep_context import EP_CONTEXT_ENABLE
from onnxhal.hal.errors import Fail, ModelLoadCanceled, OrtError, RuntimeException
from onnxhal.runtime.env.compatibility import validate_compatibility_info
from onnxhal.runtime.env.custom_ops import custom_ops, session_factories
from onnxhal.runtime.env.environment import CPU_EP_NAME, get_environment
from onnxhal.runtime.env.process_settings import global_thread_pool_sizes
from onnxhal.runtime.env.provider_resolution import ProviderChoice, resolve_providers
from onnxhal.runtime.loader.model_config import apply_model_config, load_config_from_model_enabled
from onnxhal.runtime.loader.model_loader import LOAD_CONTRIB_ONE_PASS_KEY, LoadedModel, load_model
from onnxhal.runtime.loader.model_overrides import override_initializers
from onnxhal.runtime.optimizer.layout_transform import transform_layout
from onnxhal.runtime.optimizer.optimized_model import save_optimized_model
from onnxhal.runtime.session.compile_partitions import compile_groups
from onnxhal.runtime.session.config_switches import switch
from onnxhal.runtime.session.executor import ExecutionPlan, ExecutionPlanBuilder
from onnxhal.runtime.session.graph_capture import CaptureBindings, capturing_ep, run_until_captured
from onnxhal.runtime.session.memory_context import HELD_COPIES, PAIR_COPIERS, MemoryContext
from onnxhal.runtime.session.options import SessionOptions, check_session_options
from onnxhal.runtime.session.partitioner import PartitionResult, graphs_postorder, partition
from onnxhal.runtime.session.recovery import RecoveryPolicy

logger = logging.getLogger("onnxhal.session")

#: Run config key: "1" skips the EPs' ``sync`` at the end of the run (onnxruntime's name).
DISABLE_SYNC_KEY = "disable_synchronize_execution_providers"


def check_canceled(so: SessionOptions) -> None:
    """Between stages: ``SessionOptions.set_load_cancellation_flag(True)`` stops the creation."""
    if so.load_canceled:
        raise ModelLoadCanceled("Session initialization canceled due to user request "
                                "(SessionOptions.set_load_cancellation_flag(True)); clear the flag to create sessions "
                                "with these options again.")


# -- load ------------------------------------------------------------------------------------------
def load(path_or_bytes: str | bytes | onnx.ModelProto, so: SessionOptions) -> tuple[LoadedModel, dict]:
    """The model, its config applied to ``so`` (thread pools, the model's ``ort_config``) and the
    session's initializer overrides applied: (loaded model, the overrides the model has)."""
    check_canceled(so)
    pools = global_thread_pool_sizes()
    if pools is not None and so.use_per_session_threads:
        # onnxruntime's words and type (a plain RuntimeError): its pybind session constructor checks this
        raise RuntimeException("use_per_session_threads must be false when using a global thread pool: "
                               "set_global_thread_pool_sizes was called, so set SessionOptions."
                               "use_per_session_threads = False (it defaults to True).")
    loaded = load_model(path_or_bytes, so.free_dimension_overrides, so.external_data, so.ep_context_read,
                        contrib_one_pass=so.config(LOAD_CONTRIB_ONE_PASS_KEY, "1") != "0")
    if pools is not None and not so.use_per_session_threads and not so.intra_op_num_threads:
        so.intra_op_num_threads = pools[0]  # the global pool's size, as onnxruntime's shared pool
    if load_config_from_model_enabled():
        apply_model_config(loaded.proto, so)  # the model's ort_config wins, as in onnxruntime
        check_session_options(so)
    check_canceled(so)
    # Only the names the model has, so that a failover's reload does not warn again.
    return loaded, override_initializers(loaded.graph, so.initializer_overrides)


def model_metadata(proto: onnx.ModelProto) -> dict[str, str]:
    """The model's metadata as the selection policies and delegates see it."""
    md = {"producer_name": proto.producer_name, "producer_version": proto.producer_version, "domain": proto.domain,
          "model_version": str(proto.model_version if proto.HasField("model_version") else 2**63 - 1),
          "doc_string": proto.doc_string, "graph_name": proto.graph.name, "graph_description": proto.graph.doc_string}
    md.update({e.key: e.value for e in proto.metadata_props})
    return md


# -- select ----------------------------------------------------------------------------------------
def select(proto: onnx.ModelProto, so: SessionOptions, providers: Sequence[Any] | None,
           provider_options: Sequence[Mapping] | None) -> list[ProviderChoice]:
    """The EPs and devices of the session (explicit devices, legacy names, or the selection policy),
    a compiled model's compatibility checked against them, and the custom ops their libraries bring
    set on ``so``."""
    env = get_environment()
    choices = resolve_providers(env, so, providers, provider_options, lambda: model_metadata(proto))
    validate_compatibility_info(proto, choices, so)
    # onnxruntime's rule: the chosen EPs' factories, or every registered one when a policy chose
    auto = providers is None and not so.explicit_providers and (
        so.selection_policy is not None or so.selection_delegate is not None)
    so.custom_ops = custom_ops(session_factories(env, [c.factory for c in choices], auto))
    return choices


# -- the stages of one choice of EPs -----------------------------------------------------------------
def create_eps(choices: Sequence[ProviderChoice], so: SessionOptions, eps: dict[str, Ep]) -> MemoryContext:
    """One ``Ep`` per chosen EP (``EpFactory.create_ep``), put in ``eps`` as it is made (so that the
    caller releases those made before a failure), and the memory context of their devices."""
    ep_logger = logging.getLogger("onnxhal.ep")
    held = switch(so.config, HELD_COPIES, "a run's feed uploads are waited for once, at its end", "each upload waits")
    pair = switch(so.config, PAIR_COPIERS,
                  "a prepared run's copies are made by the data transfer's copier for their pair of devices",
                  "by copy_tensors_held at each copy")
    memory = MemoryContext(so.config("session.use_env_allocators") == "1", held, pair)
    for c in choices:
        try:
            ep = c.factory.create_ep([d.device for d in c.devices], [d.ep_metadata for d in c.devices], so, ep_logger)
        except OrtError:
            raise
        except Exception as e:
            raise Fail(f"{c.ep_name}: create_ep failed: {type(e).__name__}: {e}") from e
        if not isinstance(ep, Ep):
            raise Fail(f"{c.ep_name}: create_ep returned {type(ep).__name__}, not a hal.Ep")
        if not ep.name:
            ep.name = c.ep_name
        eps[c.ep_name] = ep
        memory.add_ep(c.ep_name, ep, c.factory, c.devices, so.provider_options_for(c.ep_name))
    return memory


def optimize(graph: Graph, level: int, eps: Mapping[str, Ep], config: Callable[[str], str] | None = None) -> Graph:
    """The graph optimized at ``level``; ops fused into com.onnxhal only if every EP claims them.
    At ``ORT_DISABLE_ALL`` a CPU-only session still gets its float16 regions (passes.py).
    ``config``: the session's config getter, for the passes it disables (``DISABLE_PASSES_KEY``)."""
    cpu_only = all(name == CPU_EP_NAME for name in eps)
    if level == GraphOptimizationLevel.ORT_DISABLE_ALL and not cpu_only:
        return graph
    from onnxhal.runtime.optimizer.passes import DISABLE_PASSES_KEY
    from onnxhal.runtime.optimizer.passes import optimize as run_optimizer

    fuse = all(ep.runs_onnxhal_fused_ops for ep in eps.values())
    skip = {n.strip() for n in (config(DISABLE_PASSES_KEY) if config else "").split(",") if n.strip()}
    return run_optimizer(graph, GraphOptimizationLevel(level), fuse_cpu_ops=fuse, cpu_ep_only=cpu_only, disabled=skip)


def partition_and_layout(graph: Graph, eps: Mapping[str, Ep]) -> PartitionResult:
    """Every node assigned to an EP. The layout pass needs to know which EP took which node (it
    converts the nodes of EPs that prefer NHWC), and the nodes it makes must be claimed: so the
    graph is partitioned again only when it converted something. An EP answers ``get_capability``
    from rules and builds at compile (``Ep.compile``), so the first pass costs only the rules."""
    ordered = list(eps.values())
    result = partition(graph, ordered)
    if transform_layout(graph, eps):
        result = partition(graph, ordered)
    return result


def cpu_took_all(graph: Graph, eps: Mapping[str, Ep], result: PartitionResult) -> bool:
    """Whether a session with EPs besides the CPU EP gave the CPU EP every node (the others
    claimed none: no kernels, or their cost rules declined their share), subgraphs included."""
    if CPU_EP_NAME not in eps or len(eps) == 1 or result.groups:
        return False
    return all(n.ep_name == CPU_EP_NAME for g in (*graphs_postorder(graph), graph) for n in g.nodes)


def plan(graph: Graph, eps: Mapping[str, Ep], compiled: Mapping[Node, tuple[Any, Any]],
         memory: MemoryContext) -> tuple[ExecutionPlan, dict]:
    """The run plan: a kernel per single node (``Ep.create_kernel``), compute infos for fused nodes,
    copies where values cross memory devices, memory reuse."""
    builder = ExecutionPlanBuilder(eps, {id(n): i for n, i in compiled.items()}, memory)
    # Overridable initializers are feeds too: a run may replace them (a LoRA adapter does).
    overridable = [v.name for v in graph.overridable if v.name not in graph.input_names]
    built = builder.build(graph, graph.input_names + overridable)
    return built, builder.take_kernels()


@dataclass(frozen=True)
class RunHooks:
    """The EPs of a session core whose per-run hooks do something (the base ``Ep``'s are no-ops):
    a run calls only these."""

    starts: tuple
    syncs: tuple
    ends: tuple
    plain: bool  # no sync or end hooks, no run lock, no capture: a run is the start hooks and the plan's run


class SessionCore:
    """Everything built from one choice of EPs: the EPs, the graph as compiled, the partition, the
    compute infos and the plan. Replaced whole when the session changes EPs."""

    def __init__(self, loaded: LoadedModel, so: SessionOptions, choices: list[ProviderChoice],
                 recovery: RecoveryPolicy) -> None:
        self.choices = choices
        self.eps: dict[str, Ep] = {}
        self.fused_infos: dict[Node, tuple[Any, Any]] = {}
        self.released = False
        # the library objects themselves (one each), released by object: see Environment.release
        self.libraries = list({id(c.library): c.library for c in choices}.values())
        get_environment().acquire(self.libraries)
        try:
            self.memory = create_eps(choices, so, self.eps)
            self.graph = optimize(loaded.graph, so.graph_optimization_level, self.eps, so.config)
            self.partition = partition_and_layout(self.graph, self.eps)
            if cpu_took_all(self.graph, self.eps, self.partition):
                # the graph runs as a CPU-only session's, with the passes skipped for the other
                # EPs (fusions into ops only the CPU EP runs), as they claimed nothing
                logging.getLogger("onnxhal.session").info(
                    "%s took no node: the graph gets the CPU EP's own optimizer passes",
                    ", ".join(n for n in self.eps if n != CPU_EP_NAME))
                cpu = {CPU_EP_NAME: self.eps[CPU_EP_NAME]}
                self.graph = optimize(self.graph, so.graph_optimization_level, cpu, so.config)
                self.partition = partition_and_layout(self.graph, cpu)
            if so.optimized_model_filepath:
                save_optimized_model(self.graph, loaded.proto, os.fspath(so.optimized_model_filepath), so.config,
                                     has_compiled_nodes=bool(self.partition.groups))
            self.fused_infos = compile_groups(self.eps, self.partition, self.graph, recovery,
                                              so.config(EP_CONTEXT_ENABLE) == "1")
            self.plan, self.kernels = plan(self.graph, self.eps, self.fused_infos, self.memory)
            # onnxruntime serializes runs under a session lock when an EP cannot run concurrently
            self.run_lock = (threading.Lock() if any(not ep.is_concurrent_run_supported()
                                                     for ep in self.eps.values()) else None)
            self.capture_ep = capturing_ep(self.eps, self.partition.assigned, CPU_EP_NAME, self.graph,
                                           any(step.node is None for step in self.plan.steps))
            #: the bound values of each captured graph's capture run (onnxhal's IOBinding runs)
            self.capture_bindings = CaptureBindings()
            for ep in self.eps.values():
                ep.on_session_initialization_end()
        except BaseException:
            self.release()
            raise

    @functools.cached_property
    def run_hooks(self) -> RunHooks:
        """The EPs whose ``on_run_start``, ``sync`` or ``on_run_end`` override the base ``Ep``'s,
        found at the first run."""
        eps = list(self.eps.values())

        def overriding(name: str) -> tuple:
            base = getattr(Ep, name)
            return tuple(ep for ep in eps
                         if name in getattr(ep, "__dict__", ()) or getattr(type(ep), name, None) is not base)

        starts, syncs, ends = overriding("on_run_start"), overriding("sync"), overriding("on_run_end")
        plain = not (syncs or ends) and self.run_lock is None and self.capture_ep is None
        return RunHooks(starts, syncs, ends, plain)

    def run(self, feeds: dict, run_options: Any = None, fetch: Sequence[int] | None = None,
            output_devices: Sequence[Any] | None = None, profiler: Any = None) -> list:
        """One run on this core: the EPs' run hooks around the plan's run, as onnxruntime's
        session calls them (``OnRunStart``, the run, ``Sync`` unless the run disables it,
        ``OnRunEnd``); serialized when an EP cannot take concurrent runs; repeated until a
        graph-capturing EP has captured. With none of those (the CPU EP's case) it is the start
        hooks and the plan's run."""
        hooks = self.run_hooks
        if hooks.plain and profiler is None:
            for ep in hooks.starts:
                ep.on_run_start(run_options)
            return self.plan.run(feeds, run_options, None, fetch, output_devices)

        def once() -> list:
            return self._run_with_hooks(hooks, feeds, run_options, fetch, output_devices, profiler)

        if self.run_lock is None:
            return once() if self.capture_ep is None else run_until_captured(self.capture_ep, run_options, once)
        with self.run_lock:
            return run_until_captured(self.capture_ep, run_options, once)

    def _run_with_hooks(self, hooks: RunHooks, feeds: dict, run_options: Any, fetch: Sequence[int] | None,
                        output_devices: Sequence[Any] | None, profiler: Any) -> list:
        for ep in hooks.starts:
            ep.on_run_start(run_options)
        t0 = time.perf_counter_ns() if profiler is not None else 0
        try:
            outputs = self.plan.run(feeds, run_options, profiler, fetch, output_devices)
            if hooks.syncs and (run_options is None or run_options.config(DISABLE_SYNC_KEY) != "1"):
                for ep in hooks.syncs:
                    ep.sync()
            return outputs
        finally:
            for ep in hooks.ends:
                ep.on_run_end(run_options, True)
            if profiler is not None:
                profiler.event("model_run", "Session", t0, time.perf_counter_ns())

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for info, state in self.fused_infos.values():
            try:
                info.release_state(state)
            except Exception:
                logger.exception("release_state failed")
        for c in self.choices:
            ep = self.eps.get(c.ep_name)
            if ep is not None:
                try:
                    c.factory.release_ep(ep)
                except Exception:
                    logger.exception("%s: release_ep failed", c.ep_name)
        get_environment().release(self.libraries)
