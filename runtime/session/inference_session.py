"""InferenceSession: load, select EPs, optimize, partition, compile, plan; then run.

Names and behaviour follow onnxruntime's Python ``InferenceSession``. Everything expensive happens
in the constructor, as the stages of ``runtime/session/build.py``; what happens when an EP fails is
``runtime/session/recovery.py``'s. ``run`` validates the feeds and walks the prebuilt plan. Many threads may call
``run`` on one session at once; a failed run leaves the session usable.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from onnxhal.hal import CPU_MEMORY_INFO, DeviceTensor, Ep, Graph, Node, OrtEpDevice, OrtMemoryInfo, ValueInfo
from onnxhal.hal.errors import EPFail, Fail, InvalidArgument, OrtError
from onnxhal.runtime.env.environment import CPU_EP_NAME
from onnxhal.runtime.loader.model_overrides import override_initializers
from onnxhal.runtime.session.build import SessionCore, check_canceled, load, select
from onnxhal.runtime.session.collector_pause import collector_paused
from onnxhal.runtime.session.executor import ExecutionPlan, Terminated
from onnxhal.runtime.session.graph_capture import (
    BOUND_OUTPUTS,
    SKIP,
    check_run_api,
    graph_annotation_id,
    replay_if_captured,
)
from onnxhal.runtime.session.host_settled import SettledFeeds, can_settle, host_settled_option
from onnxhal.runtime.session.input_checks import FeedChecker
from onnxhal.runtime.session.log_scope import DEFAULT_SEVERITY, check_log_severity, log_scope
from onnxhal.runtime.session.memory_context import MemoryContext, memory_device_of
from onnxhal.runtime.session.options import (
    RECORD_EP_GRAPH_ASSIGNMENT,
    RunOptions,
    SessionOptions,
    check_session_options,
)
from onnxhal.runtime.session.partitioner import FusedGroup, PartitionResult
from onnxhal.runtime.session.profiler import Profiler
from onnxhal.runtime.session.recovery import EpFailure, RecoveryPolicy
from onnxhal.runtime.session.run_codegen import one_call_option, prepared_copies_option, prepared_run
from onnxhal.runtime.values.lora_adapters import feeds_with_adapters
from onnxhal.runtime.values.sparse_tensor import as_sparse

logger = logging.getLogger("onnxhal.session")


class NodeArg:
    """An input or output of the model: ``name``, ``type`` (e.g. ``tensor(float)``), ``shape``
    (ints, strs for symbolic dims, None for unknown ones; ``[]`` when the model gives no shape or
    the value is not a tensor, as onnxruntime)."""

    def __init__(self, name: str, type: str, shape: list | None) -> None:
        self.name, self.type, self.shape = name, type, shape

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


def node_arg(value: ValueInfo) -> NodeArg:
    """A model value as onnxruntime's NodeArg shows it: a tensor's or a sparse tensor's dims, and
    ``[]`` for no shape or a map/sequence/optional (onnxruntime's shape property is then empty,
    never None)."""
    shape = value.shape
    tp = value.type_proto
    if shape is None and tp is not None and tp.WhichOneof("value") == "sparse_tensor_type" \
            and tp.sparse_tensor_type.HasField("shape"):
        shape = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                      for d in tp.sparse_tensor_type.shape.dim)
    return NodeArg(value.name, value.type_string, list(shape) if shape is not None else [])


@dataclass
class ModelMetadata:
    producer_name: str
    graph_name: str
    domain: str
    description: str
    graph_description: str
    version: int
    custom_metadata_map: dict[str, str]


class OrtEpAssignedNode:
    def __init__(self, node: Node) -> None:
        self.name, self.domain, self.op_type = node.name, node.domain, node.op_type

    def __repr__(self) -> str:
        return f"OrtEpAssignedNode(name={self.name!r}, op_type={self.op_type!r})"


class OrtEpAssignedSubgraph:
    def __init__(self, ep_name: str, nodes: list[Node]) -> None:
        self.ep_name = ep_name
        self._nodes = [OrtEpAssignedNode(n) for n in nodes]

    def get_nodes(self) -> list[OrtEpAssignedNode]:
        return list(self._nodes)

    def __repr__(self) -> str:
        return f"OrtEpAssignedSubgraph(ep_name={self.ep_name!r}, {len(self._nodes)} nodes)"


_callback_thread = threading.local()  # .active: a run_async callback is running on this thread


def _check_run_options(run_options: Any) -> None:
    if run_options is not None and not isinstance(run_options, RunOptions):
        raise InvalidArgument(f"run_options must be an onnxhal.RunOptions or None, got {type(run_options).__name__}; "
                              "create one with onnxhal.RunOptions()")


@dataclass(frozen=True)
class _FastRun:
    """``InferenceSession._prepare_fast_run``'s answer for one core and profiler."""

    core: SessionCore | None
    profiler: Profiler | None
    run: Any  # (feed, fetch, None) -> outputs, or None when the feed needs _run; None: always _run
    unprepared: bool = False  # prepared at the next plain run
    #: ``run`` for a run given RunOptions (feed, fetch, options), made at the first such run
    with_options: Any = None


_LATER = object()  # _FastRun.with_options not made yet


_NO_FAST_RUN = _FastRun(None, None, None)  # before the first run: prepared then



def _plain_options(run_options: RunOptions | None) -> bool:
    """Whether ``run_options`` change nothing but the run's own flags (none, or plain RunOptions with
    no log severity of their own, no adapters, not set to terminate): such runs take the prepared
    run and, where feeds settled on the host, the CPU-only core."""
    return run_options is None or (run_options.__class__ is RunOptions and not run_options.terminate
                                   and run_options.log_severity_level == DEFAULT_SEVERITY
                                   and not run_options.active_adapters)

class InferenceSession:
    """A model loaded for running, as onnxruntime's ``InferenceSession``.

    ``InferenceSession(model, sess_options=None, providers=None, provider_options=None)``: ``model``
    is a path, the serialized bytes or an ``onnx.ModelProto``. The EPs come from ``providers``
    (names, or (name, options) pairs), else from ``sess_options.add_provider_for_devices(...)``,
    else from the selection policy (``sess_options.set_provider_selection_policy``); the CPU EP
    runs what the others decline. ``run(None, {"x": array})`` returns every output as numpy
    arrays. Many threads may call ``run`` on one session at once.
    """

    def __init__(self, path_or_bytes: str | bytes | onnx.ModelProto, sess_options: SessionOptions | None = None,
                 providers: Sequence[Any] | None = None, provider_options: Sequence[Mapping] | None = None,
                 **kwargs: Any) -> None:
        if sess_options is not None and not isinstance(sess_options, SessionOptions):
            raise InvalidArgument(f"sess_options must be an onnxhal.SessionOptions, got {type(sess_options).__name__}; "
                                  "create one with onnxhal.SessionOptions() and set its attributes")
        so = (sess_options if sess_options is not None else SessionOptions()).copy()
        check_log_severity(so.log_severity_level)
        self._log_severity = so.log_severity_level
        # this session's records only (runtime/session/log_scope.py); no garbage collection mid-build
        with log_scope(so.log_severity_level), collector_paused():
            self._create(path_or_bytes, so, providers, provider_options)

    def _create(self, path_or_bytes: str | bytes | onnx.ModelProto, so: SessionOptions,
                providers: Sequence[Any] | None, provider_options: Sequence[Mapping] | None) -> None:
        self._sess_options = so
        self._fast = _NO_FAST_RUN
        check_session_options(so)
        self._prepared_copies = prepared_copies_option(so.config)
        self._one_call = one_call_option(so.config)
        self._recovery = RecoveryPolicy(so)
        self._lock = threading.Lock()
        self.failovers: list[tuple[str, str]] = []  # (failed EP, reason), in order
        self._loaded, self._initializers = load(path_or_bytes, so)
        self._model_path = self._loaded.path
        self._profiler = Profiler(so.profile_file_prefix) if so.enable_profiling else None
        self._profiling_start_ns = self._profiler.start_time_ns if self._profiler is not None else 0
        self._async_pool: ThreadPoolExecutor | None = None
        t0 = time.perf_counter_ns()
        choices = select(self._loaded.proto, so, providers, provider_options)
        check_canceled(so)
        self._core = SessionCore(self._loaded, so, choices, self._recovery)
        self._finalizer = weakref.finalize(self, SessionCore.release, self._core)
        if so.load_canceled:
            self._finalizer()  # the EPs' states and device memory go back now, not at garbage collection
            check_canceled(so)
        self._attach_ep_profiling()
        if self._profiler is not None:
            self._profiler.event("session_initialization", "Session", t0, time.perf_counter_ns())
        proto_graph = self._loaded.graph
        self._inputs = [node_arg(v) for v in proto_graph.inputs]
        self._overridable = [node_arg(v) for v in proto_graph.overridable]
        self._outputs = [node_arg(v) for v in proto_graph.outputs]
        # Outputs the model declares sparse: computed dense, handed over as SparseTensors, as onnxruntime.
        self._sparse_outputs = {o.name for o in self._outputs if o.type.startswith("sparse_tensor(")}
        self._input_infos = {v.name: v for v in (*proto_graph.inputs, *proto_graph.overridable)}
        self._required_inputs = [v.name for v in proto_graph.inputs]
        self._settled = self._settled_feeds(self._core)

    # -- metadata ---------------------------------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_overridable_initializers(self) -> list[NodeArg]:
        return list(self._overridable)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_modelmeta(self) -> ModelMetadata:
        p = self._loaded.proto
        return ModelMetadata(p.producer_name, p.graph.name, p.domain, p.doc_string, p.graph.doc_string,
                             p.model_version, {e.key: e.value for e in p.metadata_props})

    def get_providers(self) -> list[str]:
        return [c.ep_name for c in self._core.choices]

    def get_provider_options(self) -> dict[str, dict[str, str]]:
        return {c.ep_name: self._sess_options.provider_options_for(c.ep_name) for c in self._core.choices}

    def get_session_options(self) -> SessionOptions:
        return self._sess_options

    def get_provider_graph_assignment_info(self) -> list[OrtEpAssignedSubgraph]:
        if self._sess_options.config(RECORD_EP_GRAPH_ASSIGNMENT) != "1":
            raise Fail(f"Session configuration entry '{RECORD_EP_GRAPH_ASSIGNMENT}' must be set to \"1\" to retrieve "
                       "EP graph assignment information. Set it with add_session_config_entry before creating the "
                       "session.")
        return [OrtEpAssignedSubgraph(a.ep_name, a.nodes) for a in self._core.partition.assigned]

    def get_profiling_start_time_ns(self) -> int:
        """When profiling started, in ns since the epoch (to line up traces of several sessions); 0
        without profiling."""
        return self._profiling_start_ns

    # -- where inputs and outputs live -------------------------------------------------------
    def _first_readers(self) -> dict[str, str]:
        """{model input: the EP of the first node (in run order) that reads it}."""
        core = self._core
        wanted = set(self._required_inputs)
        first: dict[str, str] = {}
        for node in core.plan.graph.nodes:
            for name in (*node.inputs, *node.implicit_inputs):
                if name in wanted and name not in first:
                    first[name] = node.ep_name
        return first

    def get_input_memory_infos(self) -> list[OrtMemoryInfo]:
        """Per model input, the memory the EP that reads it first works in (ORT's
        ``SessionGetMemoryInfoForInputs``): a feed already there is not copied. Host memory for an
        input no node reads."""
        memory = self._core.memory
        first = self._first_readers()
        return [memory.memory_info_of_ep(first.get(i.name, CPU_EP_NAME)) or CPU_MEMORY_INFO for i in self._inputs]

    def get_output_memory_infos(self) -> list[OrtMemoryInfo]:
        """Per model output, the memory it is produced in (ORT's ``SessionGetMemoryInfoForOutputs``);
        ``run`` copies it to the host, IOBinding can leave it there."""
        memory = self._core.memory
        return [memory.memory_info_of_device(d) for d in self._core.plan.output_homes]

    def get_input_epdevices(self) -> list[OrtEpDevice | None]:
        """Per model input, the EP device of the EP that reads it first (ORT's
        ``SessionGetEpDeviceForInputs``); None for an input no node reads."""
        first = self._first_readers()
        devices = {c.ep_name: (c.devices[0] if c.devices else None) for c in self._core.choices}
        return [devices.get(first[i.name]) if i.name in first else None for i in self._inputs]

    def disable_fallback(self) -> None:
        self._recovery.fallback_enabled = False

    def enable_fallback(self) -> None:
        self._recovery.fallback_enabled = True

    # -- introspection used by the CLI, docs and tests ---------------------------------------
    @property
    def ep_failures(self) -> list[EpFailure]:
        """The EP failures this session recovered from (a compile handed to the CPU EP, a run that
        fell back or failed over), in order: a session that still answers may not have run where it
        was asked to."""
        return list(self._recovery.failures)

    @property
    def partition_summary(self) -> dict[str, int]:
        """Nodes per EP in the main graph and its subgraphs (fused nodes counted by their members)."""
        counts: dict[str, int] = {}
        for a in self._core.partition.assigned:
            counts[a.ep_name] = counts.get(a.ep_name, 0) + len(a.nodes)
        return counts

    def assigned_nodes(self) -> list[Node]:
        """Every node as partitioned (after optimization, before fusion), with ``ep_name`` set."""
        return [n for a in self._core.partition.assigned for n in a.nodes]

    @property
    def plan(self) -> ExecutionPlan:
        return self._core.plan

    @property
    def eps(self) -> Mapping[str, Ep]:
        """The session's EPs by name, in priority order (a read-only view)."""
        return MappingProxyType(self._core.eps)

    @property
    def graph(self) -> Graph:
        """The main graph as compiled: optimized, partitioned, each compiled group a fused node."""
        return self._core.graph

    @property
    def ep_devices(self) -> dict[str, list[OrtEpDevice]]:
        """The EP devices each EP was created for, by EP name, in priority order."""
        return {c.ep_name: list(c.devices) for c in self._core.choices}

    @property
    def graph_capture_ep(self) -> Ep | None:
        """The EP that captures the run and replays it (graph capture on and every node its own or
        allowed by its policy), or None when runs are not captured."""
        return self._core.capture_ep

    @property
    def partition(self) -> PartitionResult:
        """The partition as made: every fused group an EP claimed (``fused_groups`` lists the ones
        compiled), the assigned subgraphs in assignment order, and the reasons groups were rejected.
        Read it; do not change it."""
        return self._core.partition

    @property
    def fused_groups(self) -> list[FusedGroup]:
        """The fused groups compiled (a group whose EP failed to compile it runs on the CPU EP and is
        not listed), each with its filtered graph, fused node and, when the session generates an
        EPContext model (``ep.context_enable``), the EP's EPContext node."""
        return [g for g in self._core.partition.groups if g.fused_node in self._core.fused_infos]

    @property
    def model_proto(self) -> onnx.ModelProto:
        """The model as loaded (before optimization); do not change it."""
        return self._loaded.proto

    @property
    def memory(self) -> MemoryContext:
        return self._core.memory

    @property
    def settled_feeds(self) -> SettledFeeds | None:
        """The feeds settled on the host that ``run`` takes to a CPU-only plan
        (runtime/session/host_settled.py); None where this session's runs cannot settle."""
        return self._settled

    # -- running ----------------------------------------------------------------------------
    def run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
            run_options: RunOptions | None = None) -> list:
        """Compute the outputs named in ``output_names`` (None or [] for all, in the model's order)
        from ``input_feed``, {input name: numpy array, OrtValue, or a (nested) list converted to the
        input's element type}. Raises ``InvalidArgument`` for a missing, unknown or mistyped input,
        and the EP's error (``EPFail``, ``Fail``, ...) when a node fails; the session stays usable."""
        settled = self._settled
        if settled is not None and settled.core is self._core and _plain_options(run_options):
            # feeds whose device partitions all settled on the host run on a CPU-only plan
            return settled.run(self._core_run, output_names, input_feed, run_options)
        return self._core_run(output_names, input_feed, run_options)

    def _core_run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  run_options: RunOptions | None) -> list:
        """``run`` on the session's core: prepared where it can be, else ``_run``."""
        # RunOptions that change nothing but the run's own flags (no log severity of their own, no
        # adapters, not set to terminate) take the prepared run too, the variant that honours them
        if _plain_options(run_options):
            fast = self._fast
            if fast.core is not self._core or fast.profiler is not self._profiler:
                # the first plain run on this core takes _run: a session run once prepares nothing
                fast = self._fast = _FastRun(self._core, self._profiler, None, True)
            elif fast.unprepared:
                fast = self._fast = self._prepare_fast_run()
            prepared = fast.run
            if prepared is not None and run_options is not None:
                prepared = fast.with_options
                if prepared is _LATER:
                    fast = self._fast = self._prepare_fast_run(fast)
                    prepared = fast.with_options
            if prepared is not None:
                fetch = None if output_names is None else self._fetch_indices(output_names)
                try:
                    result = prepared(input_feed, fetch, run_options)
                except EPFail as e:  # as _run: the run again, with the feeds as check makes them, on the
                    # core the recovery policy builds
                    feeds = self._feed_checker().check(input_feed)
                    result = _owned(self._recover(fast.core, e).run(feeds, run_options, fetch, None, self._profiler),
                                    feeds)
                if result is not None:
                    return result
        if self._core.capture_ep is not None:
            check_run_api(self._core.capture_ep, run_options)
        return self._run(output_names, input_feed, run_options, None)

    def _prepare_fast_run(self, prepared: _FastRun | None = None, core: SessionCore | None = None) -> _FastRun:
        """The session's run prepared for the commonest call, ``run(names or None, {input: array})``
        with no run options, on the current core (runtime/session/run_codegen.py), at its second
        such run: what ``_run`` decides per call (logging scope, profiler, sparse outputs, graph
        capture, EP hooks, where each feed goes) decided once. Its ``run`` is None when a run must
        take ``_run``'s way every time. Given ``prepared`` (this core's, with a ``run``): the same
        with its variant for runs given RunOptions made. ``core``: another core than the session's
        (the CPU-only one of ``host_settled``), without a profiler."""
        if prepared is not None:
            core, checker = prepared.core, self._feed_checker()
            entry = core.plan.host_entry(checker.required, check_terminate=True, copies=self._prepared_copies)
            return replace(prepared, with_options=None if entry is None else prepared_run(
                checker.ordered_specs, entry, core.run_hooks.starts, _owned, with_options=True))
        core, profiler = (self._core, self._profiler) if core is None else (core, None)
        hooks = core.run_hooks
        if (profiler is not None or self._log_severity != DEFAULT_SEVERITY or self._sparse_outputs
                or not self._outputs or not hooks.plain):
            return _FastRun(core, profiler, None)
        checker = self._feed_checker()
        specs = checker.ordered_specs
        entry = core.plan.host_entry(checker.required, copies=self._prepared_copies,
                                     one_call=self._one_call) if specs is not None else None
        if entry is None:
            return _FastRun(core, profiler, None)
        return _FastRun(core, profiler, prepared_run(specs, entry, hooks.starts, _owned), with_options=_LATER)

    def _run(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
             run_options: RunOptions | None, output_devices: Sequence[Any] | None) -> list:
        """The one run of a session (``run``, IOBinding, ``run_with_ortvaluevector``, ``run_async``):
        the run's checks, the core's run (``SessionCore.run``: hooks, plan), recovery after an EP
        failure, outputs the caller owns. ``output_devices``: where each output is left (IOBinding);
        None: on the host."""
        core = self._core
        if run_options is not None:
            _check_run_options(run_options)
            severity = self._log_severity
            if run_options is not None and run_options.log_severity_level != DEFAULT_SEVERITY:
                check_log_severity(run_options.log_severity_level, "RunOptions.log_severity_level")
                severity = run_options.log_severity_level
            if run_options is not None and run_options.terminate:
                raise Terminated("Exiting due to terminate flag being set to true: RunOptions.terminate is set. "
                                 "Clear it (run_options.terminate = False) to run.")
        else:
            severity = self._log_severity
        fetch = None if output_names is None else self._fetch_indices(output_names)
        if not self._outputs:  # as onnxruntime: a run computes outputs, and there are none to compute
            raise InvalidArgument("At least one output should be requested: the model's graph declares no outputs. "
                                  "Add the values you want to its graph outputs.")
        if run_options is not None and run_options.active_adapters:
            input_feed = feeds_with_adapters(input_feed, run_options.active_adapters, self._input_infos)
        checker = self.__dict__.get("_checker")
        if checker is None or checker.infos is not self._input_infos or checker.required is not self._required_inputs:
            checker = self._feed_checker()
        feeds = checker.check(input_feed)
        if severity == DEFAULT_SEVERITY:  # the common case, without a call of its own (a tiny run's cost counts)
            try:
                outputs = core.run(feeds, run_options, fetch, output_devices, self._profiler)
            except EPFail as e:
                outputs = self._recover(core, e).run(feeds, run_options, fetch, output_devices, self._profiler)
        else:
            with log_scope(severity):
                outputs = self._run_on_core(core, feeds, run_options, fetch, output_devices)
        result = _owned(outputs, feeds, output_devices is None)
        if self._sparse_outputs:
            names = [self._outputs[i].name for i in fetch] if fetch is not None else [o.name for o in self._outputs]
            result = [as_sparse(v) if n in self._sparse_outputs else v for n, v in zip(names, result)]
        return result

    def _run_on_core(self, core: SessionCore, feeds: dict, run_options: RunOptions | None,
                     fetch: list[int] | None, output_devices: Sequence[Any] | None) -> list:
        """``core``'s run; after an EP failure, the run again on the core the recovery policy builds."""
        try:
            return core.run(feeds, run_options, fetch, output_devices, self._profiler)
        except EPFail as e:
            return self._recover(core, e).run(feeds, run_options, fetch, output_devices, self._profiler)

    def run_with_ort_values(self, output_names: Sequence[str] | None, input_dict_ort_values: Mapping[str, Any],
                            run_options: RunOptions | None = None) -> list:
        """``run`` with OrtValues in (host or device) and OrtValues out (on the host)."""
        from onnxhal.runtime.values.ortvalue import OrtValue

        if not isinstance(input_dict_ort_values, Mapping):
            raise InvalidArgument("run_with_ort_values: inputs must be a dict of input name -> OrtValue, got "
                                  f"{type(input_dict_ort_values).__name__}")
        for name, value in input_dict_ort_values.items():
            if not isinstance(value, OrtValue):
                raise InvalidArgument(f"run_with_ort_values: input {name!r} is a {type(value).__name__}, not an "
                                      "OrtValue. Wrap it with OrtValue.ortvalue_from_numpy(...), or call run().")
        return [OrtValue(v) for v in self.run(output_names, input_dict_ort_values, run_options)]

    def run_async(self, output_names: Sequence[str] | None, input_feed: Mapping[str, Any],
                  callback: Any, user_data: Any, run_options: RunOptions | None = None) -> None:
        """Run on a worker thread of the session and call ``callback(results, user_data, err)``
        there: the outputs and "" on success, ``[]`` and the error's message on failure. Wrong
        feeds and output names raise here, at the call; errors of the run itself (a kernel's, the
        ``terminate`` flag) go to the callback. An exception the callback raises is logged."""
        if not callable(callback):
            raise TypeError(f"run_async: callback must be callable as callback(results, user_data, err), got "
                            f"{callback!r}")
        _check_run_options(run_options)
        self._fetch_indices(output_names)
        self._feed_checker().check(input_feed)
        with self._lock:
            if self._async_pool is None:
                threads = self._sess_options.intra_op_num_threads or os.cpu_count() or 1
                self._async_pool = ThreadPoolExecutor(threads, thread_name_prefix="onnxhal-run-async")
                weakref.finalize(self, self._async_pool.shutdown, wait=False)
            pool = self._async_pool
        pool.submit(self._run_and_call, output_names, dict(input_feed), callback, user_data, run_options)

    def _run_and_call(self, output_names: Sequence[str] | None, feeds: dict, callback: Any, user_data: Any,
                      run_options: RunOptions | None) -> None:
        try:
            results, err = self.run(output_names, feeds, run_options), ""
        except Exception as e:
            results, err = [], str(e)
        _callback_thread.active = True
        try:
            callback(results, user_data, err)
        except Exception:
            logger.exception("run_async: the callback raised; the session is unaffected")
        finally:
            _callback_thread.active = False

    def _feed_checker(self) -> FeedChecker:
        """The session's feed checks, built at its first run from the model's inputs."""
        checker = self.__dict__.get("_checker")
        if checker is None or checker.infos is not self._input_infos or checker.required is not self._required_inputs:
            checker = self._checker = FeedChecker(self._input_infos, self._required_inputs)
        return checker

    def release_captured_graph(self, graph_annotation_id: int = 0) -> None:
        """Have the graph-capturing EP forget the capture of ``graph_annotation_id``; a no-op without
        one, as onnxruntime."""
        core = self._core
        if core.capture_ep is not None:
            core.capture_ep.release_captured_graph(int(graph_annotation_id))
            core.capture_bindings.release(int(graph_annotation_id))

    def _replay(self, run_options: RunOptions | None, inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> bool:
        """Replay the run's captured graph, if it is captured (for ``run_with_iobinding``), once the
        binding (``inputs``: name -> bound value; ``outputs``: name -> bound OrtValue, memory info
        or None) holds the buffers of its capture run."""
        from onnxhal.runtime.values.ortvalue import OrtValue

        core = self._core
        ep = core.capture_ep
        if ep is None:
            return False
        gid = graph_annotation_id(run_options)
        if gid == SKIP or not ep.is_graph_captured(gid):
            return False
        wanted = outputs or dict.fromkeys(o.name for o in self._outputs)
        bound = {name: (v.contents if isinstance(v, OrtValue) else None) for name, v in wanted.items()}
        core.capture_bindings.check(ep.name, gid, inputs, bound)
        return replay_if_captured(ep, run_options)

    def _recover(self, core: SessionCore, error: EPFail) -> SessionCore:
        """After ``error`` in a run on ``core``: the core to run again on, built on the EPs the
        recovery policy picks (runtime/session/recovery.py); raises when there is none."""
        with self._lock:
            if self._core is not core:
                return self._core  # another thread already recovered
            choices, failed = self._recovery.after_run_failure(error, core.choices)
            self._install(SessionCore(self._loaded_fresh(), self._sess_options, choices, self._recovery))
            if failed:
                self.failovers.append((failed, str(error)))
        core.release()
        return self._core

    def set_providers(self, providers: Sequence[Any] | None = None,
                      provider_options: Sequence[Mapping] | None = None) -> None:
        """Build the session again with ``providers`` (as the constructor takes them; None: the
        session options' devices or policy, else the CPU EP). If that fails, the error is raised and
        the session keeps its providers; onnxruntime is left without a session then."""
        so = self._sess_options
        choices = select(self._loaded.proto, so, providers, provider_options)
        core = SessionCore(self._loaded_fresh(), so, choices, self._recovery)
        with self._lock:
            old = self._install(core)
        old.release()

    def _install(self, core: SessionCore) -> SessionCore:
        """Make ``core`` the session's (the caller holds the lock); the old one is returned for the
        caller to release."""
        old = self._core
        self._core = core
        self._fast = _NO_FAST_RUN  # it holds the old core (its plan, its EPs) until the next run otherwise
        if self._settled is not None:
            self._settled.release()
        self._settled = self._settled_feeds(core)
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, SessionCore.release, core)
        self._attach_ep_profiling()
        return old

    def _settled_feeds(self, core: SessionCore) -> SettledFeeds | None:
        """``core``'s feeds settled on the host (runtime/session/host_settled.py), or None where no
        run of it can settle: session config off, no partition telling where it ran, or a run that
        takes ``_run``'s way anyway (profiling, a log severity of its own, sparse outputs)."""
        so = self._sess_options
        if (not host_settled_option(so.config) or not can_settle(core.fused_infos) or self._profiler is not None
                or self._log_severity != DEFAULT_SEVERITY or self._sparse_outputs or not self._outputs):
            return None
        # A weak reference: the session holds this, and a bound method would make the session a
        # cycle that only the garbage collector frees, keeping its device buffers and kernel objects
        # (which a released partition state gives back for the next session) until it runs.
        cpu_runner = weakref.WeakMethod(self._cpu_runner)

        def build() -> tuple[Any, SessionCore]:
            return _alive(cpu_runner)()

        return SettledFeeds(core, build, SessionCore.release)

    def _cpu_runner(self) -> tuple[Any, SessionCore]:
        """A CPU-only core of the session, from the same model and options (the CPU EP's passes), and
        its run (output names, feed, run options) -> outputs: prepared as ``run``'s, else checked."""
        so = self._sess_options.copy()
        so.optimized_model_filepath = ""  # the session's own saved model is the device core's
        core = SessionCore(self._loaded_fresh(), so, select(self._loaded.proto, so, [CPU_EP_NAME], None),
                           self._recovery)
        weakref.finalize(self, SessionCore.release, core)  # released earlier when the session's core changes
        fast = self._prepare_fast_run(core=core)
        checker = self._feed_checker()
        # weakly, as ``_settled_feeds``' builder: the session holds this runner
        fetch_indices = weakref.WeakMethod(self._fetch_indices)

        def run(output_names: Sequence[str] | None, feed: Mapping[str, Any], run_options: RunOptions | None) -> list:
            fetch = None if output_names is None else _alive(fetch_indices)(output_names)
            if run_options is None and fast.run is not None:
                result = fast.run(feed, fetch, None)
                if result is not None:
                    return result
            feeds = checker.check(feed)
            return _owned(core.run(feeds, run_options, fetch, None, None), feeds)

        return run, core

    def _attach_ep_profiling(self) -> None:
        if self._profiler is not None:
            self._profiler.ep_hooks = [ep.profiling_step_args for ep in self._core.eps.values()
                                       if type(ep).profiling_step_args is not Ep.profiling_step_args]
            self._profiler.attach_ep_profilers(self._core.eps.values())

    def _loaded_fresh(self) -> Any:
        # Partitioning rewrites the graph in place; start again from the model.
        loaded = self._loaded.fresh()
        override_initializers(loaded.graph, self._initializers)
        return loaded

    def _fetch_indices(self, output_names: Sequence[str] | None) -> list[int] | None:
        if output_names is None:
            return None
        if isinstance(output_names, (str, bytes)):  # iterating it would look up one name per character
            raise InvalidArgument(f"output_names must be a list of output names, got the string {output_names!r}; "
                                  f"use [{output_names!r}]")
        if len(output_names) == 0:
            return None
        outputs = self._outputs
        index = self.__dict__.get("_output_index")
        if index is None or index[0] is not outputs:
            positions: dict[str, int] = {}
            for i, o in enumerate(outputs):
                positions.setdefault(o.name, i)
            index = self._output_index = (outputs, positions)
        positions = index[1]
        idx = []
        for n in output_names:
            i = positions.get(n) if isinstance(n, str) else None
            if i is None:
                raise InvalidArgument(f"Invalid output name: {n!r}. The model's outputs are {[o.name for o in outputs]}.")
            idx.append(i)
        return idx

    def set_ep_dynamic_options(self, options: Mapping[str, str]) -> None:
        """Pass ``options`` (str to str) to every EP of the session (``Ep.set_dynamic_options``),
        e.g. ``{"ep.dynamic.workload_type": "Efficient"}``; an EP ignores keys it does not know."""
        if not isinstance(options, Mapping):
            raise TypeError(f"set_ep_dynamic_options: options must be a dict of str to str, got "
                            f"{type(options).__name__}")
        if not options:
            raise Fail("set_ep_dynamic_options: No options were provided. Give at least one key, e.g. "
                       "{'ep.dynamic.workload_type': 'Efficient'}.")
        # onnxruntime converts keys and values to strings
        opts = {str(k): str(v) for k, v in options.items()}
        for name, ep in self._core.eps.items():
            try:
                ep.set_dynamic_options(dict(opts))
            except OrtError:
                raise
            except Exception as e:
                raise Fail(f"{name}: set_dynamic_options({opts}) failed: {type(e).__name__}: {e}") from e

    def get_tuning_results(self) -> list[dict]:
        """onnxruntime's TunableOp results: none, since no onnxhal EP tunes its kernels."""
        return []

    def set_tuning_results(self, results: list, *, error_on_invalid: bool = False) -> None:
        """Checked as onnxruntime checks them; every entry is invalid here (no EP supports TunableOp):
        a warning, or with ``error_on_invalid`` a ``Fail``."""
        if not isinstance(results, list):
            raise TypeError(f"set_tuning_results: results must be a list of dicts, got {type(results).__name__}")
        for i, entry in enumerate(results):
            ep, _, _ = entry["ep"], entry["results"], entry["validators"]  # KeyError, as onnxruntime
            message = (f"Invalid TuningResults (index={i}). {ep} does not support TunableOp: no onnxhal EP tunes "
                       "its kernels, so tuning results have nothing to apply to.")
            if error_on_invalid:
                raise Fail(message)
            logger.warning("%s", message)

    def run_with_ortvaluevector(self, run_options: RunOptions | None, feed_names: Sequence[str], feeds: Sequence[Any],
                                fetch_names: Sequence[str], fetches: list, fetch_devices: Sequence[Any]) -> None:
        """Run with a list (or ``OrtValueVector``) of OrtValues; the outputs are appended to
        ``fetches``, or written into the OrtValues it holds, and left on ``fetch_devices``."""
        from onnxhal.runtime.values.ortvalue_vector import run_with_ortvaluevector

        run_with_ortvaluevector(self, self._run_to_memory, run_options, feed_names, feeds, fetch_names, fetches, fetch_devices)

    def create_ortvalue_from_shape_and_type(self, shape: Sequence[int], element_type: Any, device_type: str,
                                            device_id: int = 0, vendor_id: int = -1) -> Any:
        """A tensor allocated by this session's allocator for the device (``OrtDevice.make``'s names,
        or a declared memory's such as "opencl"); host memory for "cpu"."""
        from onnxhal.runtime.values.ortvalue import session_ortvalue

        return session_ortvalue(self._core.memory, shape, element_type, device_type, device_id, vendor_id)

    def run_with_iobinding(self, iobinding: Any, run_options: RunOptions | None = None) -> None:
        _check_run_options(run_options)
        iobinding.run_with(self._run_to_memory, self._replay, run_options)

    def _run_to_memory(self, feeds: Mapping[str, Any], bound: Mapping[str, Any], run_options: RunOptions | None) -> list:
        """Every output, each left on the memory ``bound`` gives it (a bound OrtValue's, a memory
        info; absent or None: the host): IOBinding's and ``run_with_ortvaluevector``'s run."""
        from onnxhal.hal.memory_info import HOST_MEMORY_DEVICE
        from onnxhal.runtime.values.ortvalue import OrtValue

        devices = []
        for o in self._outputs:
            b = bound.get(o.name)
            info = b.memory_info() if isinstance(b, OrtValue) else b
            devices.append(info.memory_device if info is not None else HOST_MEMORY_DEVICE)
        output_devices = None if all(d.is_host for d in devices) else devices
        core = self._core
        ep = core.capture_ep
        if ep is None:
            return self._run(None, feeds, run_options, output_devices)
        gid = graph_annotation_id(run_options)
        if gid == SKIP or ep.is_graph_captured(gid):
            return self._run(None, feeds, run_options, output_devices)
        # a capture run writes the outputs bound in the capturing EP's memory in place (graph_capture.py)
        ep_memory = core.memory.device_of_ep(ep.name)
        writes = {name: b.contents for name, b in bound.items() if isinstance(b, OrtValue)
                  and isinstance(b.contents, (np.ndarray, DeviceTensor)) and memory_device_of(b.contents) == ep_memory}
        # one capture run of a graph at a time: the graph the EP keeps and the binding kept for its
        # replays must be the same run's; a run that finds it captured meanwhile runs normally
        with core.capture_bindings.capture_lock(gid):
            if ep.is_graph_captured(gid):
                return self._run(None, feeds, run_options, output_devices)
            token = BOUND_OUTPUTS.set(writes)
            try:
                outputs = self._run(None, feeds, run_options, output_devices)
            finally:
                BOUND_OUTPUTS.reset(token)
            if ep.is_graph_captured(gid):
                core.capture_bindings.record(gid, feeds, writes)
        return outputs

    def bound_input(self, name: str, value: Any) -> Any:
        """What an IOBinding keeps of input ``name`` bound to ``value``. As onnxruntime's
        ``IOBinding::BindInput`` (io_binding.cc, through ``utils::CopyOneInputAcrossDevices``), a
        tensor bound in other memory than the device that reads it is copied there when it is
        bound: the run reads that copy, so writing into the bound buffer afterwards changes nothing
        until it is bound again. Read on the host, it is kept as it is and read at run time."""
        from onnxhal.hal import DeviceTensor
        from onnxhal.runtime.session.memory_context import memory_device_of

        core = self._core
        dev = core.plan.feed_device(name)
        if dev is None or not isinstance(value, (np.ndarray, DeviceTensor)) or memory_device_of(value) == dev:
            return value
        return core.memory.transfer(value, dev, None)

    def io_binding(self) -> Any:
        from onnxhal.runtime.values.ortvalue import IOBinding

        return IOBinding(self)

    def end_profiling(self) -> str:
        """Write the trace and stop profiling (as ORT: later runs are not recorded, and a second
        call returns ""). If the file cannot be written, profiling goes on and the call may be
        repeated."""
        profiler = self._profiler
        if profiler is None:
            return ""
        path = profiler.end()
        self._profiler = None
        return path

    def close(self) -> None:
        """Release the EPs and the library references now (otherwise when garbage-collected).
        Callbacks of ``run_async`` calls still queued run first."""
        if self._async_pool is not None:
            # From a callback, the worker cannot wait for itself.
            self._async_pool.shutdown(wait=not getattr(_callback_thread, "active", False))
        self._finalizer()
        if self._settled is not None:
            self._settled.release()


def _owned(outputs: list, feeds: Mapping[str, Any], to_host: bool = True) -> list:
    """The outputs as onnxruntime hands them over: arrays of the caller's own. A model constant
    passed through (read-only here, where kernels share the session's weights), a view of a feed
    (Identity, Reshape of an input) or an output sharing memory with an earlier one (Identity of an
    output, the same value listed twice) is copied; everything else is returned as computed, no copy.
    ``to_host``: a tensor left in device memory comes back as a host array. ``outputs`` is the
    caller's fresh list, changed in place."""
    fed = None
    roots: dict[int, list] = {}  # id of the array owning the memory -> the outputs using it
    for i, v in enumerate(outputs):
        if v.__class__ is not np.ndarray and not isinstance(v, np.ndarray):
            if to_host:
                outputs[i] = _to_host_output(v)
            continue
        if not v.flags.writeable:
            outputs[i] = v.copy()
            continue
        if fed is None:
            fed = [f for f in feeds.values() if isinstance(f, np.ndarray)]
        if v.base is None:  # owns its memory: shares it with no feed unless it is one
            for f in fed:
                if v is f:
                    v = outputs[i] = v.copy()
                    break
            if id(v) in roots:  # an earlier output is this array or a view of it
                v = outputs[i] = v.copy()
            roots[id(v)] = [v]
            continue
        if any(np.may_share_memory(v, f) for f in fed):
            v = outputs[i] = v.copy()
            roots[id(v)] = [v]
            continue
        root = v.base
        while isinstance(root.base, np.ndarray):
            root = root.base
        users = roots.get(id(root))
        if users is None:
            roots[id(root)] = [v]
        elif any(np.may_share_memory(v, u) for u in users):
            v = outputs[i] = v.copy()
            roots[id(v)] = [v]
        else:
            users.append(v)
    return outputs


def _to_host_output(v: Any) -> Any:
    if isinstance(v, np.ndarray) or v is None or isinstance(v, list):
        return v
    if hasattr(v, "numpy"):
        return v.numpy()
    return v


def _alive(method: weakref.WeakMethod) -> Callable:
    """The session's method ``method`` refers to; the session holds whatever calls this, so it is there."""
    bound = method()
    if bound is None:
        raise ReferenceError("the InferenceSession this belongs to was released")
    return bound
