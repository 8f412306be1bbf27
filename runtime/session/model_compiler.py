"""ModelCompiler: compile a model for the selected EPs once, save it, and load it later without compiling.

onnxruntime's ``ModelCompiler`` (compile API): a session is created with the given options and
``ep.context_enable`` = "1"; each partition for which the EP's ``compile`` returned an EPContext node
(``hal.Ep.compile``'s ``ep_context_nodes``, as ``OrtEp::Compile``) is replaced by that node, the EP's compatibility string goes into the model metadata
(``ep_compatibility_info.<EP>``), and the model is written to a file, bytes or a stream. The EP's
data is embedded in the node (``embed_compiled_data_into_model=True``) or, as onnxruntime's
default, kept beside the model: a ``<model>_<EP>_<n>.bin`` file, or handed to
``set_ep_context_data_write_func``'s callback. Initializers left in the model can go to an external
file (``external_initializers_file_path``, above ``external_initializers_size_threshold`` bytes) or
wherever ``get_initializer_location_func`` puts them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import onnx
from onnx import helper, numpy_helper

from onnxhal.hal import GraphOptimizationLevel, OrtCompileApiFlags
from onnxhal.hal.ep_context import EP_CONTEXT_DOMAIN, EP_CONTEXT_ENABLE, EP_CONTEXT_OP, context_blob
from onnxhal.hal.errors import Fail, InvalidArgument
from onnxhal.hal.graph import Node
from onnxhal.runtime.env.compatibility import COMPAT_KEY_PREFIX
from onnxhal.runtime.optimizer.optimized_model import make_external, write_external_initializers
from onnxhal.runtime.session.ep_context_model import OrtEpContextData


class OrtExternalInitializerInfo:
    """Where an initializer's bytes live: ``filepath`` (relative to the model), ``file_offset``,
    ``byte_size`` (onnxruntime's ``OrtExternalInitializerInfo``)."""

    __slots__ = ("_filepath", "_file_offset", "_byte_size")

    def __init__(self, filepath: str, file_offset: int, byte_size: int) -> None:
        if not isinstance(filepath, str) or not filepath:
            raise InvalidArgument(f"OrtExternalInitializerInfo: filepath must be a non-empty str, got {filepath!r}")
        if int(file_offset) < 0 or int(byte_size) < 0:
            raise InvalidArgument(f"OrtExternalInitializerInfo({filepath!r}, {file_offset}, {byte_size}): offset and "
                                  "size must be >= 0")
        self._filepath, self._file_offset, self._byte_size = filepath, int(file_offset), int(byte_size)

    @property
    def filepath(self) -> str:
        return self._filepath

    @property
    def file_offset(self) -> int:
        return self._file_offset

    @property
    def byte_size(self) -> int:
        return self._byte_size

    def __repr__(self) -> str:
        return f"OrtExternalInitializerInfo({self._filepath!r}, {self._file_offset}, {self._byte_size})"


GetInitializerLocationFunc = Callable[[str, Any, "OrtExternalInitializerInfo | None"],
                                      "OrtExternalInitializerInfo | None"]


class ModelCompiler:
    """``ModelCompiler(sess_options, input_model_path_or_bytes, ...)`` with onnxruntime's parameters
    and defaults; ``compile_to_file``, ``compile_to_bytes`` or ``compile_to_stream`` runs it."""

    def __init__(self, sess_options: Any, input_model_path_or_bytes: str | os.PathLike | bytes | onnx.ModelProto,
                 embed_compiled_data_into_model: bool = False,
                 external_initializers_file_path: str | os.PathLike | None = None,
                 external_initializers_size_threshold: int = 1024,
                 flags: int = OrtCompileApiFlags.NONE,
                 graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_DISABLE_ALL,
                 get_initializer_location_func: GetInitializerLocationFunc | None = None) -> None:
        model = input_model_path_or_bytes
        self._input_path: str | None = None
        if isinstance(model, (str, os.PathLike)):
            if not model:
                raise ValueError("Input model path is empty")
            self._input_path = os.fspath(model)
        elif isinstance(model, (bytes, bytearray)):
            if len(model) == 0:
                raise ValueError("Input model bytes array is empty")
            model = bytes(model)
        elif not isinstance(model, onnx.ModelProto):  # a ModelProto is onnxhal's addition
            raise TypeError(f"Unable to load from type '{type(model)}'")
        if external_initializers_file_path:
            if not isinstance(external_initializers_file_path, (str, os.PathLike)):
                raise TypeError("Output external initializer filepath is of unexpected type "
                                f"'{type(external_initializers_file_path)}'")
            external_initializers_file_path = os.fspath(external_initializers_file_path)
            if get_initializer_location_func is not None:
                raise ValueError("Cannot initialize ModelCompiler with both `external_initializers_file_path` "
                                 "and `get_initializer_location_func`")
        self.sess_options = sess_options
        self.model = model
        self.embed = bool(embed_compiled_data_into_model)
        self.external_path = external_initializers_file_path or ""
        self.external_threshold = int(external_initializers_size_threshold)
        self.flags = OrtCompileApiFlags(int(flags))
        self.graph_optimization_level = GraphOptimizationLevel(graph_optimization_level)
        self.get_initializer_location_func = get_initializer_location_func
        self._write_func: Callable[[str, OrtEpContextData], None] | None = None
        self._binary_info: tuple[str, str] | None = None

    # -- onnxruntime's methods ------------------------------------------------------------------
    def compile_to_file(self, output_model_path: str | os.PathLike | None = None) -> None:
        """Write the compiled model to ``output_model_path``; None: the input path with ``.onnx``
        replaced by ``_ctx.onnx``, as onnxruntime documents it."""
        if output_model_path:
            if not isinstance(output_model_path, (str, os.PathLike)):
                raise TypeError(f"Output model's filepath is of unexpected type '{type(output_model_path)}'")
            path = os.fspath(output_model_path)
        elif self._input_path is not None:
            stem = self._input_path[:-5] if self._input_path.endswith(".onnx") else self._input_path
            path = stem + "_ctx.onnx"
        else:
            raise InvalidArgument("compile_to_file: the input model was given as bytes, so there is no path to derive "
                                  "the output's from; pass output_model_path")
        if self.flags & OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS and os.path.exists(path):
            raise Fail(f"Failed to generate EP context model since the file '\"{path}\"' exists already. Please "
                       "remove the EP context model if you want to re-generate it.")
        data = self._compile(path)
        with open(path, "wb") as f:
            f.write(data)

    def compile_to_bytes(self) -> bytes:
        return self._compile(None)

    def compile_to_stream(self, write_function: Callable[[bytes], None]) -> None:
        """Hand the serialized model to ``write_function(bytes)``."""
        if not callable(write_function):
            raise TypeError(f"compile_to_stream: write_function must be callable, got {write_function!r}")
        write_function(self._compile(None))

    def set_ep_context_data_write_func(self, write_func: Callable[[str, OrtEpContextData], None]) -> None:
        """``write_func(name, data)`` receives each EP's context data instead of a ``.bin`` file (when
        it is not embedded); the model's EPContext node keeps ``name``. ``data.read(offset, length)``
        is valid only during the call."""
        if not callable(write_func):
            raise TypeError(f"set_ep_context_data_write_func: write_func must be callable, got {write_func!r}")
        self._write_func = write_func

    def clear_ep_context_data_write_func(self) -> None:
        self._write_func = None

    def set_ep_context_binary_information(self, output_directory: str | os.PathLike, model_name: str) -> None:
        """Where the EPs' ``.bin`` files go (a directory) and the model name they are named after."""
        directory = os.fspath(output_directory)
        if not directory or not model_name:
            raise InvalidArgument(f"set_ep_context_binary_information({directory!r}, {model_name!r}): give a "
                                  "directory and a model name, both non-empty")
        if os.path.exists(directory) and not os.path.isdir(directory):
            raise InvalidArgument(f"set_ep_context_binary_information: {directory!r} is a file, not a directory")
        self._binary_info = (directory, model_name)

    # -- compiling ------------------------------------------------------------------------------
    def _session(self) -> Any:
        from onnxhal.runtime.session.inference_session import InferenceSession
        from onnxhal.runtime.session.options import SessionOptions

        if self._input_path is not None and not os.path.isfile(self._input_path):
            raise InvalidArgument(f'Input model path does not exist: "{self._input_path}"')
        so = self.sess_options.copy() if self.sess_options is not None else SessionOptions()
        so.graph_optimization_level = self.graph_optimization_level
        so.add_session_config_entry(EP_CONTEXT_ENABLE, "1")  # each EP's compile returns its EPContext nodes
        return InferenceSession(self._input_path or self.model, so)

    def _compile(self, output_path: str | None) -> bytes:
        from onnxhal.hal.graph import Graph
        from onnxhal.runtime.loader.model_loader import toposort

        sess = self._session()
        try:
            graph = sess.graph
            nodes = list(graph.nodes)
            compat: dict[str, str] = {}
            exported: dict[int, Node] = {}  # id(fused node) -> the EPContext node replacing it
            for k, group in enumerate(sess.fused_groups):
                if group.owner is not graph:
                    continue  # partitions inside subgraphs stay as they are
                if group.context_node is None:  # the EP cannot save it: its nodes stay in the model
                    nodes = toposort([n for n in nodes if n is not group.fused_node] + group.nodes, graph.name)
                    continue
                name = f"EPContext_{k}_{group.ep_name}"
                blob = context_blob(group.context_node)
                context, embed_mode = self._place_context(name, group.ep_name, blob, output_path)
                exported[id(group.fused_node)] = _placed(group.context_node, name, context, embed_mode)
                compat[group.ep_name] = sess.eps[group.ep_name].get_compiled_model_compatibility_info(graph)
            if not exported and self.flags & OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED:
                raise Fail("Unable to compile any nodes. Check that the session EPs support compilation and can "
                           "execute at least one subgraph in the model.")
            nodes = [exported.get(id(n), n) for n in nodes]
            used = {i for n in nodes for i in (*n.inputs, *n.implicit_inputs) if i}
            out = Graph(graph.name, nodes, graph.inputs, graph.outputs,
                        {k: v for k, v in graph.initializers.items() if k in used}, graph.value_infos, graph.opset,
                        doc_string=graph.doc_string)
            out.overridable = list(graph.overridable)
            proto = sess.model_proto
            gp = out.to_proto()
            self._place_initializers(gp, output_path)
            opsets = {o.domain: o.version for o in proto.opset_import}
            opsets.setdefault(EP_CONTEXT_DOMAIN, 1)
            for n in nodes:
                opsets.setdefault(n.domain, 1)
            model = helper.make_model(gp, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
                                      ir_version=proto.ir_version, producer_name="onnxhal.ModelCompiler")
            meta = {e.key: e.value for e in proto.metadata_props}
            meta.update({COMPAT_KEY_PREFIX + name: info for name, info in compat.items()})
            helper.set_model_props(model, meta)
            return model.SerializeToString()
        finally:
            sess.close()

    def _model_name(self, output_path: str | None) -> str:
        if self._binary_info is not None:
            return self._binary_info[1]
        source = output_path or self._input_path or "model.onnx"
        stem = os.path.basename(source)
        return stem[:-5] if stem.endswith(".onnx") else stem

    def _place_context(self, node_name: str, ep_name: str, blob: bytes, output_path: str | None
                       ) -> tuple[bytes | str, int]:
        """(ep_cache_context, embed_mode) of an EPContext node: the blob itself, or the name of the
        file beside the model (or of the write callback's data) that holds it."""
        if self.embed:
            return blob, 1
        name = f"{self._model_name(output_path)}_{ep_name}_{node_name}.bin"
        if self._write_func is not None:
            data = OrtEpContextData(blob)
            try:
                self._write_func(name, data)
            finally:
                data.release()  # the view is the callback's only
            return name, 0
        directory = (self._binary_info[0] if self._binary_info is not None else
                     os.path.dirname(os.path.abspath(output_path)) if output_path is not None else None)
        if directory is None:
            raise InvalidArgument(
                "ModelCompiler: embed_compiled_data_into_model=False keeps each EP's compiled data beside the "
                "model, but compile_to_bytes/compile_to_stream has no model file to put it beside. Call "
                "set_ep_context_binary_information(directory, model_name) or set_ep_context_data_write_func(fn), "
                "or pass embed_compiled_data_into_model=True.")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "wb") as f:
            f.write(blob)
        return name, 0

    def _place_initializers(self, gp: onnx.GraphProto, output_path: str | None) -> None:
        """Move initializers out of the model as ``external_initializers_file_path`` (those larger
        than the threshold) or ``get_initializer_location_func`` says (strings always stay inline)."""
        if self.external_path:
            folder = os.path.dirname(os.path.abspath(output_path)) if output_path else os.getcwd()
            write_external_initializers(gp, os.path.join(folder, self.external_path), self.external_path,
                                        lambda size: size > self.external_threshold)
        if self.get_initializer_location_func is None:
            return
        from onnxhal.runtime.values.ortvalue import OrtValue

        sources = self._input_external_infos()
        for tensor in gp.initializer:
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            arr = numpy_helper.to_array(tensor)
            where = self.get_initializer_location_func(tensor.name, OrtValue(arr), sources.get(tensor.name))
            if where is None:
                continue
            if not isinstance(where, OrtExternalInitializerInfo):
                raise InvalidArgument(f"get_initializer_location_func returned {where!r} for {tensor.name!r}: return "
                                      "None (keep it in the model) or an OrtExternalInitializerInfo")
            make_external(tensor, where.filepath, where.file_offset, where.byte_size)

    def _input_external_infos(self) -> dict[str, OrtExternalInitializerInfo]:
        """The external-data locations the input model's initializers had, as the callback's third
        argument."""
        if self._input_path is None:
            return {}
        proto = onnx.load(self._input_path, load_external_data=False)
        out = {}
        for t in proto.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                kv = {e.key: e.value for e in t.external_data}
                out[t.name] = OrtExternalInitializerInfo(kv.get("location", ""), int(kv.get("offset", 0)),
                                                         int(kv.get("length", 0)))
        return out


def _placed(node: Node, name: str, context: bytes | str, embed_mode: int) -> Node:
    """The EP's EPContext ``node`` as written into the model: named ``name``, its data embedded or
    named (``_place_context``); the EP's other attributes as it set them."""
    attrs = [a for key, a in node.attribute_protos.items() if key not in ("ep_cache_context", "embed_mode")]
    attrs += [helper.make_attribute("embed_mode", embed_mode), helper.make_attribute("ep_cache_context", context)]
    order = list(node.attribute_protos)
    attrs.sort(key=lambda a: order.index(a.name) if a.name in order else len(order))
    return Node(EP_CONTEXT_OP, list(node.inputs), list(node.outputs), name=name, domain=EP_CONTEXT_DOMAIN,
                attribute_protos=attrs)
