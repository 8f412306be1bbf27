"""Lowering of one fused partition (a filtered graph) to a ``PartitionPlan``.

Order of decisions: view ops (Reshape, Flatten, Squeeze, Unsqueeze) become aliases; an activation
that is the only consumer of a Gemm/MatMul/Conv is folded into that kernel's epilogue (as are the
activation and residual of the optimizer's ``com.onnxhal`` FusedConv/FusedGemm/FusedMatMul); trees
of elementwise nodes whose intermediates have no other consumer become one generated kernel; every
other node lowers to launches of the fixed kernel families in ``kernel_sources`` (the GEMM family in
``gemm_lowering``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.errors import NotImplemented as OrtNotImplemented
from onnxhal.hal.graph import Graph, Node
from onnxhal.runtime.providers.opencl import kernel_sources as ks
from onnxhal.runtime.providers.opencl.attention_lowering import AttentionLowering, AttentionMatch
from onnxhal.runtime.providers.opencl.elementwise_codegen import (
    C_TYPES,
    ELEMENTWISE_OPS,
    POW_AS_PRODUCT,
    FusedInput,
    FusedTypes,
    broadcast_strides,
    float_literal,
    generate_fused_kernel,
)
from onnxhal.runtime.providers.opencl.fusion_rules import FUSION_RULES
from onnxhal.runtime.providers.opencl.gemm_lowering import (
    Epilogue,
    GemmLowering,
    collapse_batch,
    contiguous_strides,
    prod,
    transpose_output_strides,
    transposed_view,
)
from onnxhal.runtime.providers.opencl.gemm_norm_fusion import norms_into_gemms
from onnxhal.runtime.providers.opencl.norm_lowering import NormLowering
from onnxhal.runtime.providers.opencl.onnx_attention_lowering import OnnxAttentionLowering
from onnxhal.runtime.providers.opencl.op_support import (
    F32,
    FUSED_DOMAIN,
    MAX_ELEMENTS,
    MS_DOMAIN,
    REDUCE_OPS,
    VIEW_OPS,
    GraphLookup,
    activation_spec,
    fused_activation_spec,
    reduce_axes,
    reduce_layout,
)
from onnxhal.runtime.providers.opencl.opset23_lowering import Opset23Lowering
from onnxhal.runtime.providers.opencl.pad_resize_lowering import PadResizeLowering
from onnxhal.runtime.providers.opencl.partition_plan import Buf, CopyStep, Launch, PartitionPlan
from onnxhal.runtime.providers.opencl.quant_codegen import CODE_C_TYPES, QUANT_ELEMENTWISE_OPS
from onnxhal.runtime.providers.opencl.quant_decompose import decompose_quantized
from onnxhal.runtime.providers.opencl.quant_lowering import fold_constant_dequantize, lower_dynamic_quantize, quant_args

if TYPE_CHECKING:
    from collections.abc import Callable

I32, F = np.int32, np.float32


@dataclass
class RmsNormMatch:
    """Rule ``rms_norm``: ``members`` (square, ReduceMean, Add, Sqrt, reciprocal, Mul[, weight Mul],
    in graph order) compute ``x * (1 / sqrt(mean(x^2) + eps))`` over the last axis (``divide``:
    ``x / sqrt(...)``, no reciprocal member), times ``weight`` (a constant of the row's length) when set."""

    members: list[Node]
    x: str
    eps: float
    divide: bool
    weight: np.ndarray | None


class PartitionPlanBuilder(GemmLowering, AttentionLowering, NormLowering, Opset23Lowering, OnnxAttentionLowering,
                           PadResizeLowering):
    """Builds the plan of one filtered graph. ``lookup`` gives shapes, dtypes and constants."""

    def __init__(self, graph: Graph, lookup: GraphLookup, disabled: frozenset[str] = frozenset(),
                 shape_only: frozenset[str] = frozenset()) -> None:
        self.graph = graph
        self.lookup = lookup
        #: Fusion rules (fusion_rules.FUSION_RULES) this plan leaves out.
        self.disabled = disabled
        #: Outputs whose data no reader reads (``shape_only_outputs``; rule ``shape_only_outputs``):
        #: allocated with their shape, written by no launch, so their producers fuse as intermediates.
        self.shape_only = shape_only if self.rule("shape_only_outputs") else frozenset()
        #: id(LayerNormalization) -> the elementwise tree computed in its kernel (rule layernorm_prologue)
        self.layernorm_prologues: dict[int, list[Node]] = {}
        #: the LayerNorms (ids) whose prologue's values are also stored for other readers
        self.stored_prologues: set[int] = set()
        #: Parts of a Split that attention reads in place through their head-split view (rule
        #: ``attention``): a Split lowered for its other parts writes no copy of these.
        self.in_place_parts: set[str] = set()
        #: id(Transpose) -> (head split, buffer, offset, strides of the split's dims in it): rule
        #: ``head_split_in_place``, a Transpose that reads one part of a Split or merged projection in place.
        self.parts_in_place: dict[int, tuple[Node, str, int, list[int]]] = {}
        #: id(Transpose or Expand) -> (Concat output, element offset, its strides): rule
        #: ``concat_in_place``, a copy whose only reader is a Concat writes its slot of the Concat's output.
        self.concat_targets: dict[int, tuple[str, int, list[int]]] = {}
        #: Transpose result -> (its input, strides reading it in the result's order): rule
        #: ``transpose_elementwise``, read by a fused elementwise tree in place of the Transpose's copy.
        self.transposed_inputs: dict[str, tuple[str, tuple[int, ...]]] = {}
        #: rule take_elementwise: a Gather's result (by constant indices) that fused trees read through
        #: its table -> (the Gather's source, the table constant)
        self.taken_inputs: dict[str, tuple[str, str]] = {}
        #: ... and, where only that Gather read its source, the fused tree computing the source
        #: (members in order), which the reading trees compute at the table's index instead
        self.taken_trees: dict[str, list[Node]] = {}
        #: rule gather_elementwise: a float Gather's result (axis 0, indices read at run time) that
        #: fused trees read through its indices -> (its source, the indices' buffer, FusedInput.rows)
        self.gathered_inputs: dict[str, tuple[str, str, tuple[int, int, str]]] = {}
        inputs = [v.name for v in graph.inputs]
        outputs = [v.name for v in graph.outputs]
        self.plan = PartitionPlan(inputs, outputs, {}, {})
        self.operand_views: dict = {}
        self.output_views: dict = {}
        self.lanes_outputs: dict = {}
        #: rule pool_padded_output: a value written by a pool_rows MaxPool launch -> that launch
        self.pool_outputs: dict = {}
        #: rule conv_siblings: Convs (ids) lowered in an earlier Conv's launch
        self.merged_convs: set[int] = set()
        self.node_epilogues: dict[int, Epilogue] = {}
        self.node_positions: dict[int, int] = {}
        self.skipped_nodes: set[int] = set()
        self._consumers: dict[str, list[Node]] = {}
        self._counter = 0
        for name in inputs + outputs:
            self._record(name)

    # -- helpers ---------------------------------------------------------------------------
    def _record(self, name: str) -> tuple[int, ...]:
        shape = self.lookup.shape(name)
        if shape is None:
            raise OrtNotImplemented(f"OpenCL EP: value {name!r} has no static shape")
        self.plan.shapes[name] = tuple(shape)
        self.plan.dtypes[name] = np.dtype(self.lookup.dtype(name) or F32)
        return self.plan.shapes[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.plan.shapes[name] if name in self.plan.shapes else self._record(name)

    def _fresh(self, stem: str) -> str:
        self._counter += 1
        return f"::{stem}{self._counter}"

    def constant(self, stem: str, arr: np.ndarray) -> str:
        name = self._fresh(stem)
        self.plan.constants[name] = np.ascontiguousarray(arr)
        return name

    def data(self, name: str) -> str:
        """A buffer name for value ``name``: a fed input, an intermediate, or an uploaded constant."""
        if name in self.plan.input_names or name in self.plan.constants:
            return name
        const = self.lookup.const(name)
        if const is not None and self.graph.producer(name) is None:
            arr = const.astype(np.float32) if const.dtype == np.float64 else const
            self.plan.constants[name] = np.ascontiguousarray(arr)
            self.plan.shapes[name] = tuple(const.shape)
            self.plan.dtypes[name] = np.dtype(arr.dtype)
            return name
        self.shape(name)
        return name

    def output(self, name: str) -> str:
        """Declare ``name`` as produced here: an output of the plan, or a per-run intermediate."""
        self.shape(name)
        if name not in self.plan.output_names:
            self.plan.temps[name] = self.plan.nbytes(name)
        return name

    def temp(self, stem: str, nbytes: int) -> str:
        if nbytes // 4 >= MAX_ELEMENTS:  # e.g. an im2col workspace of a huge convolution
            raise OrtNotImplemented(f"OpenCL EP: a {nbytes}-byte {stem} workspace exceeds 32-bit indexing")
        name = self._fresh(stem)
        self.plan.temps[name] = nbytes
        return name

    def rule(self, name: str) -> bool:
        """Whether fusion rule ``name`` (fusion_rules.FUSION_RULES) applies to this plan."""
        assert name in FUSION_RULES, name
        return name not in self.disabled

    # -- driver ----------------------------------------------------------------------------
    def build(self) -> PartitionPlan:
        nodes = self.graph.nodes
        consumers: dict[str, list[Node]] = {}
        for n in nodes:
            for i in n.inputs:
                if i:
                    consumers.setdefault(i, []).append(n)
        self._consumers = consumers
        outputs = set(self.plan.output_names) - self.shape_only
        epilogues: dict[int, Epilogue] = {}
        skip: set[int] = set()
        position = {id(n): k for k, n in enumerate(nodes)}

        def sole_user(value: str) -> Node | None:
            users = consumers.get(value, [])
            return users[0] if len(users) == 1 and value not in outputs else None

        fold_constant_dequantize(self, nodes, outputs, skip)  # QDQ weights: float32 constants of the plan
        self.projection_parts, self.projection_width = {}, {}
        projections = self.find_projections(nodes, sole_user, outputs) if self.rule("qkv_projection") else {}
        for group in projections.values():
            skip.update(id(m) for m in group)
        attention: dict[int, AttentionMatch] = {}
        for n in nodes:
            if n.op_type == "Softmax" and self.rule("attention") and id(n) not in skip:
                match = self.match_attention(n, sole_user)
                if match is not None and not any(id(m) in skip for m in match.members):
                    attention[id(match.members[-1])] = match
                    skip.update(id(m) for m in match.members)
                    split_ids = {id(split) for split in match.splits}
                    self.in_place_parts.update(
                        m.inputs[0] for m in match.members if m.op_type == "Reshape"
                        and id(self.graph.producer(m.inputs[0])) in split_ids)
                    for split in match.splits:  # every part read in place: the Split itself is not run
                        if all(o not in outputs and all(id(u) in skip for u in consumers.get(o, []))
                               for o in split.outputs if o):
                            skip.add(id(split))
        #: rule attention_select_mask: the Wheres attention took, which read their Expand through
        #: broadcast strides of its input as a fused tree does (rule expand_elementwise)
        self.mask_wheres: set[int] = set()
        for match in attention.values():
            if match.mask_expands:
                self.mask_wheres.update(id(m) for m in match.members if m.op_type == "Where")
        for match in attention.values():  # an Expand read only through is not run
            for expand in match.mask_expands or ():
                if (expand.outputs[0] not in outputs
                        and all(id(u) in self.mask_wheres for u in consumers[expand.outputs[0]])):
                    skip.add(id(expand))
        for key, group in list(projections.items()):
            if not any(id(consumers[m.outputs[0]][0]) in skip for m in group):  # attention took no part
                del projections[key]
                skip.difference_update(id(m) for m in group)
                self.drop_projections(group)
        self.parts_in_place = {}
        if self.rule("head_split_in_place") and self.rule("attention"):
            for n in nodes:
                readers = consumers.get(n.outputs[0], [])
                if (n.op_type != "Transpose" or n.domain or id(n) in skip
                        or readers and all(u.op_type == "MatMul" for u in readers)):  # transpose_operand's
                    continue
                part = (self._split_part(n.inputs[0], n, sole_user)
                        or self._projection_part(n.inputs[0], n, sole_user))
                if part is not None and id(part[0]) not in skip:
                    self.parts_in_place[id(n)] = part
                    skip.add(id(part[0]))  # the head split is read through: its part gets no copy
                    self.in_place_parts.add(part[0].inputs[0])
        self.concat_targets = {}
        if self.rule("concat_in_place"):
            for n in nodes:
                if n.op_type != "Concat" or n.domain or id(n) in skip:
                    continue
                ys = self.shape(n.outputs[0])
                axis, ost, offset = n.attr("axis") % len(ys), contiguous_strides(ys), 0
                for i in n.inputs:
                    p = self.graph.producer(i)
                    if (p is not None and p.op_type in ("Transpose", "Expand") and not p.domain
                            and id(p) not in skip and sole_user(i) is n):
                        self.concat_targets[id(p)] = (n.outputs[0], offset * ost[axis], ost)
                    offset += self.shape(i)[axis]
        for n in nodes:
            if n.op_type not in ("Gemm", "MatMul", "Conv", "FusedGemm", "FusedMatMul") or id(n) in skip:
                continue
            fused_op = n.op_type.startswith("Fused")
            if fused_op and n.domain != FUSED_DOMAIN or not fused_op and n.domain:
                continue
            epi = Epilogue(n.outputs[0], *fused_activation_spec(n)) if fused_op else Epilogue(n.outputs[0])
            last = n
            bias = None if fused_op or not self.rule("gemm_bias") else self._bias_follower(n, sole_user(n.outputs[0]))
            if bias is not None:  # MatMul/Gemm + Add(constant row vector): the epilogue adds it
                epi.bias, last = bias
                epi.out = last.outputs[0]
                skip.add(id(last))
            elif ((not fused_op or n.op_type == "FusedMatMul" and not epi.act and not (len(n.inputs) > 2 and n.inputs[2]))
                  and self.rule("gemm_bias") and self.rule("gemm_activation")):
                bias_gelu = self._bias_follower(n, sole_user(n.outputs[0]), "BiasGelu")
                if bias_gelu is not None:  # com.microsoft BiasGelu: the bias, then the erf GELU
                    (epi.bias, last), epi.act = bias_gelu, ks.ACTIVATION_CODES["Gelu"]
                    epi.out = last.outputs[0]
                    skip.add(id(last))
            user = sole_user(last.outputs[0])
            if (not fused_op and not epi.act and user is not None and user.inputs[0] == last.outputs[0]
                    and self.rule("gemm_activation")):
                spec = activation_spec(user, self.lookup)
                if spec is not None:
                    epi.act, epi.p0, epi.p1 = spec
                    epi.out = user.outputs[0]
                    skip.add(id(user))
                    last = user
            user, view = sole_user(last.outputs[0]), None
            if user is not None and user.op_type in VIEW_OPS and not user.domain:  # e.g. GPT-2's Reshape
                view, user = user, sole_user(user.outputs[0])
            residual = self._residual_follower(n, view or last, epi, user, position)
            if residual is not None:  # ... [view] + Add(value of the output's shape): the epilogue adds it
                epi.residual, add = residual
                epi.out = add.outputs[0]
                skip.update(id(m) for m in (add, view) if m is not None)
            epilogues[id(n)] = epi
        self.node_epilogues, self.node_positions, self.skipped_nodes = epilogues, position, skip  # for rule conv_siblings
        rms_norms: dict[int, RmsNormMatch] = {}
        if self.rule("rms_norm"):
            for n in nodes:
                match = None if id(n) in skip else self._match_rms_norm(n, sole_user)
                if match is not None and not any(id(m) in skip for m in match.members):
                    rms_norms[id(match.members[-1])] = match
                    skip.update(id(m) for m in match.members[:-1])
        self._fold_transposes(nodes, consumers, outputs, skip)
        clusters = self._elementwise_clusters(nodes, consumers, outputs, skip | set(rms_norms))
        self.layernorm_prologues = {}
        self.stored_prologues = set()
        for n in nodes:  # rule layernorm_prologue: a fused tree read only by a LayerNormalization
            if n.op_type != "LayerNormalization" or n.domain not in ("", FUSED_DOMAIN) or id(n) in skip:
                continue
            members = clusters.get(id(self.graph.producer(n.inputs[0])))
            if not (self.rule("layernorm_prologue") and members and not any(id(m) in skip for m in members)
                    and self._float_tree(members)):
                continue
            if sole_user(n.inputs[0]) is not n:
                if not (self.rule("layernorm_prologue_stored")
                        and self._read_after(n, n.inputs[0], consumers, position)):
                    continue
                self.stored_prologues.add(id(n))
            self.layernorm_prologues[id(n)] = members
            skip.update(id(m) for m in members)
        if self.rule("gemm_elementwise"):
            for n in nodes:
                if id(n) in epilogues and id(n) not in skip:
                    self._fold_chain(n, epilogues[id(n)], clusters, consumers, outputs, skip)
        if self.rule("transpose_elementwise"):
            self._transposed_inputs(clusters, consumers, outputs, skip)
        if self.rule("expand_elementwise"):
            self._expanded_inputs(clusters, consumers, outputs, skip)
        if self.rule("take_elementwise"):
            self._taken_inputs(clusters, consumers, outputs, skip)
        if self.rule("gather_elementwise"):
            self._gathered_inputs(clusters, consumers, outputs, skip)
        for n in nodes:
            self.plan.op_types.append(n.op_type)
            if id(n) in attention:
                self.lower_attention(attention[id(n)])
                continue
            if id(n) in projections:
                self.lower_projections(projections[id(n)], skip)
                continue
            if id(n) in rms_norms:
                self._lower_rms_norm(rms_norms[id(n)])
                continue
            if id(n) in skip or id(n) in self.merged_convs:
                continue
            if id(n) in clusters:
                members = clusters[id(n)]
                if members:
                    self._lower_fused(members)
                continue
            self._lower(n, epilogues.get(id(n)))
        if self.rule("conv_lanes_padded_output"):
            self.pads_into_producers()
        if self.rule("conv_lanes_downsample"):
            self.downsamples_into_readers()
        if self.rule("gemm_norm"):
            norms_into_gemms(self.plan)
        return self.plan

    def _read_after(self, ln: Node, value: str, consumers: dict[str, list[Node]], position: dict[int, int]) -> bool:
        """Rule ``layernorm_prologue_stored``: whether every reader of ``value`` other than LayerNorm
        ``ln`` is lowered after it, so the LayerNorm's launch can write ``value`` for them: each reader
        and the producers of its other inputs descend from ``ln`` (a launch is emitted at the place of
        one of its nodes, and a node descending from ``ln`` comes after it: a residual Add folded into
        a GEMM is emitted with the GEMM's MatMul)."""
        below, todo = {id(ln)}, [ln]
        while todo:
            for o in todo.pop().outputs:
                for c in consumers.get(o, []):
                    if id(c) not in below:
                        below.add(id(c))
                        todo.append(c)
        for reader in consumers.get(value, []):
            if reader is ln:
                continue
            if id(reader) not in below or position[id(reader)] < position[id(ln)]:
                return False
            for i in reader.inputs:
                producer = self.graph.producer(i) if i and i != value else None
                if producer is not None and id(producer) not in below:
                    return False
        return True

    def _bias_follower(self, n: Node, user: Node | None, op: str = "Add") -> tuple[str, Node] | None:
        """(bias value, the Add) when ``n`` is a MatMul with a 2-D right operand or a Gemm without C
        and its only reader adds a constant [N] / [1, N] vector (``op`` "BiasGelu": onnxruntime's
        com.microsoft BiasGelu of the result and such a bias)."""
        domain = MS_DOMAIN if op == "BiasGelu" else ""
        if user is None or user.op_type != op or user.domain != domain or len(user.inputs) != 2:
            return None
        if op == "BiasGelu" and user.inputs[0] != n.outputs[0]:
            return None
        if n.op_type == "Gemm" and (len(n.inputs) > 2 and n.inputs[2]):
            return None
        matmuls = ("MatMul", "FusedMatMul") if op == "BiasGelu" else ("MatMul",)  # (a FusedMatMul without bias)
        if n.op_type not in ("Gemm", *matmuls) or n.op_type in matmuls and len(self.shape(n.inputs[1])) != 2:
            return None
        other = user.inputs[1] if user.inputs[0] == n.outputs[0] else user.inputs[0]
        const = self.lookup.const(other)
        out_shape = self.shape(n.outputs[0])
        if (other == n.outputs[0] or const is None or const.dtype != np.float32
                or tuple(const.shape) not in ((out_shape[-1],), (1, out_shape[-1]))
                or self.shape(user.outputs[0]) != out_shape):
            return None
        return other, user

    def _fold_chain(self, n: Node, epi: Epilogue, clusters: dict, consumers: dict, outputs: set, skip: set) -> None:
        """Rule ``gemm_elementwise``: a fused elementwise tree (``_elementwise_clusters``) that reads
        the result of MatMul (2-D weight) or Gemm ``n`` with no activation, directly or through a
        view, as its only varying input (every other input a scalar constant), and is that result's
        only reader, becomes the GEMM's epilogue (GPT-2's tanh-Gelu, x * Sigmoid(x))."""
        if (epi.act or epi.residual or n.op_type not in ("Gemm", "FusedGemm", "MatMul", "FusedMatMul")
                or n.op_type in ("MatMul", "FusedMatMul") and len(self.shape(n.inputs[1])) != 2):
            return
        x, view = epi.out, None
        readers = consumers.get(x, [])
        if x in outputs or not readers:
            return
        if len(readers) == 1 and readers[0].op_type in VIEW_OPS and not readers[0].domain:
            view = readers[0]
            x = view.outputs[0]
            readers = consumers.get(x, [])
            if x in outputs or not readers:
                return
        members = next((c for c in clusters.values() if c and readers[0] in c), None)
        if members is None or any(r not in members for r in readers) or any(id(m) in skip for m in members):
            return  # (a tree a LayerNorm computes in its own kernel reads the GEMM's result)
        if not self._float_tree(members):
            return  # the epilogue computes float32 values only
        internal = {m.outputs[0] for m in members[:-1]}
        exprs: dict[str, str] = {x: "x"}
        statements: list[tuple[str, str]] = []
        for k, m in enumerate(members):
            if m.op_type in ("BatchNormalization", "FusedBatchNormalization"):
                return  # their lowering makes per-channel constants
            args, extra = self._elementwise_args(m)
            refs = []
            for a in args:
                if a in internal or a == x:
                    refs.append(exprs[a])
                    continue
                c = self.lookup.const(a)
                if c is None or c.size != 1 or c.dtype != np.float32:
                    return
                refs.append(float_literal(float(c.reshape(-1)[0])))
            statements.append((f"v{k}", ELEMENTWISE_OPS[m.op_type](m, refs, extra)))
            exprs[m.outputs[0]] = f"v{k}"
        root = members[-1]
        if self.shape(root.outputs[0]) != self.shape(x):
            return
        epi.source = ks.gemm_epilogue_source(statements, exprs[root.outputs[0]])
        epi.act = ks.EPILOGUE_EXPR_CODE
        epi.out = root.outputs[0]
        skip.update(id(m) for m in (*members, view) if m is not None)

    def _residual_follower(self, n: Node, last: Node, epi: Epilogue, user: Node | None,
                           position: dict[int, int]) -> tuple[str, Node] | None:
        """Rule ``gemm_residual``: (residual value, the Add) when ``user``, the only reader of the
        GEMM's result ``last`` (or of a view of it: same elements, same order), adds a float32 value of the same shape computed before the GEMM
        (a partition input, a constant, or an earlier node's output). The kernel adds it before
        the activation, so only an epilogue without one takes it; a batched MatMul (whose residual
        would need a batch stride) and a Transpose-folded store keep the Add."""
        if (user is None or user.op_type != "Add" or user.domain or len(user.inputs) != 2 or epi.act
                or not self.rule("gemm_residual") or n.op_type not in ("Gemm", "FusedGemm", "MatMul", "FusedMatMul")):
            return None
        if n.op_type in ("MatMul", "FusedMatMul") and len(self.shape(n.inputs[1])) != 2:
            return None
        if n.op_type in ("Gemm", "FusedGemm") and len(n.inputs) > 2 and n.inputs[2] and n.attr("beta", 1.0) != 1.0:
            return None
        result = last.outputs[0]
        other = user.inputs[1] if user.inputs[0] == result else user.inputs[0]
        if other == result or self.shape(other) != self.shape(result) or self.shape(user.outputs[0]) != self.shape(result):
            return None
        if np.dtype(self.lookup.dtype(other) or F32) != np.float32:
            return None
        producer = self.graph.producer(other)
        if producer is not None and position.get(id(producer), len(position)) >= position[id(n)]:
            return None  # computed after the GEMM's launch: not there yet when the epilogue reads it
        return self.data(other), user

    def _fold_transposes(self, nodes, consumers, outputs, skip: set[int]) -> None:
        """Transposes next to batched MatMuls cost no copy: a Transpose read only by MatMuls becomes
        strides of their operand (packing or in-place reads take any strides), and a Transpose that
        is the only reader of a MatMul result becomes the MatMul's store pattern (as in attention:
        heads split before Q@K^T and merged after probs@V)."""
        self.operand_views, self.output_views = {}, {}

        def batched(mm: Node) -> bool:
            return (mm.op_type == "MatMul" and not mm.domain and len(self.shape(mm.inputs[1])) > 2
                    and len(self.shape(mm.inputs[0])) > 2)

        for n in nodes:
            if (n.op_type != "Transpose" or n.domain or id(n) in skip or id(n) in self.parts_in_place
                    or id(n) in self.concat_targets):
                continue
            if not self.rule("transpose_operand") and not self.rule("transpose_store"):
                continue
            x, y = n.inputs[0], n.outputs[0]
            perm = list(n.attr("perm") or range(len(self.shape(x)))[::-1])
            users = consumers.get(y, [])
            if len(perm) < 3 or y in outputs or not users or not self.rule("transpose_operand") or not all(
                    batched(u) and y in u.inputs[:2] for u in users):
                producer = self.graph.producer(x)
                if (self.rule("transpose_store") and len(perm) >= 3 and perm[-1] == len(perm) - 1
                        and producer is not None and batched(producer)
                        and id(producer) not in self.output_views and x not in outputs
                        and consumers.get(x, []) == [n]):
                    zs = transpose_output_strides(self.shape(y), perm)
                    c_bstride = collapse_batch(self.shape(x)[:-2], zs[:-2])
                    if zs[-1] == 1 and c_bstride is not None:
                        self.output_views[id(producer)] = (y, zs[-2], c_bstride)
                        skip.add(id(n))
                continue
            dims, strides = transposed_view(self.shape(x), perm)
            if collapse_batch(dims[:-2], strides[:-2]) is None:
                continue
            self.operand_views[y] = (self.data(x), dims, strides)
            self.shape(y)
            skip.add(id(n))

    def _constant_scalar(self, name: str) -> float | None:
        const = self.lookup.const(name) if name else None
        return float(const.reshape(-1)[0]) if const is not None and const.size == 1 else None

    def _match_rms_norm(self, sq: Node, sole_user: Callable[[str], Node | None]) -> RmsNormMatch | None:
        """Rule ``rms_norm`` from its first node, the square of x (``Pow(x, 2)`` or ``Mul(x, x)``):
        each following step the sole reader of the one before, of the reduced shape, up to the Mul
        by x (or Div of x) of x's shape, then a Mul by a constant of the row's length if one reads it."""
        if sq.domain or len(sq.inputs) != 2 or not all(sq.inputs):
            return None
        if not (sq.op_type == "Pow" and self._constant_scalar(sq.inputs[1]) == 2.0
                or sq.op_type == "Mul" and sq.inputs[0] == sq.inputs[1]):
            return None
        x = sq.inputs[0]
        xs = self.shape(x)
        if not xs or self.lookup.dtype(x) != F32 or self.shape(sq.outputs[0]) != xs:
            return None
        reduced = (*xs[:-1], 1)

        def step(prev: Node, op: str) -> Node | None:
            n = sole_user(prev.outputs[0])
            if n is None or n.domain or n.op_type != op or self.shape(n.outputs[0]) != reduced:
                return None
            return n

        red = step(sq, "ReduceMean")
        if (red is None or red.inputs[0] != sq.outputs[0] or not red.attr("keepdims", 1)
                or reduce_axes(red, self.lookup) != [len(xs) - 1]):
            return None
        add = step(red, "Add")
        if add is None or len(add.inputs) != 2:
            return None
        eps = self._constant_scalar(add.inputs[1] if add.inputs[0] == red.outputs[0] else add.inputs[0])
        sqrt = step(add, "Sqrt") if eps is not None else None
        if sqrt is None:
            return None
        last = sole_user(sqrt.outputs[0])
        divide = last is not None and last.op_type == "Div" and list(last.inputs) == [x, sqrt.outputs[0]]
        members = [sq, red, add, sqrt]
        if not divide:
            inv = step(sqrt, "Reciprocal") or step(sqrt, "Div")
            if inv is None or (inv.op_type == "Div" and (inv.inputs[1] != sqrt.outputs[0]
                                                         or self._constant_scalar(inv.inputs[0]) != 1.0)):
                return None
            members.append(inv)
            last = sole_user(inv.outputs[0])
            if last is None or last.op_type != "Mul" or sorted(last.inputs) != sorted([x, inv.outputs[0]]):
                return None
        if last.domain or self.shape(last.outputs[0]) != xs:
            return None
        members.append(last)
        weight = None
        scale = sole_user(last.outputs[0])
        if scale is not None and scale.op_type == "Mul" and not scale.domain and len(scale.inputs) == 2:
            other = scale.inputs[1] if scale.inputs[0] == last.outputs[0] else scale.inputs[0]
            w = self.lookup.const(other)
            if (w is not None and w.dtype == F32 and w.size == xs[-1] and w.shape[-1:] == (xs[-1],)
                    and len(w.shape) <= len(xs) and self.shape(scale.outputs[0]) == xs):
                weight = w.reshape(-1)
                members.append(scale)
        return RmsNormMatch(members, x, eps, divide, weight)

    def _lower_rms_norm(self, match: RmsNormMatch) -> None:
        xs = self.shape(match.x)
        x = self.data(match.x)
        out = self.output(match.members[-1].outputs[0])
        w = x if match.weight is None else self.constant("rms_weight", match.weight)
        if match.weight is not None:
            self.plan.shapes[w], self.plan.dtypes[w] = match.weight.shape, F32
        self.plan.add_launch_1d(ks.RMSNORM_SOURCE, "rmsnorm_rows", prod(xs[:-1]), [
            Buf(out), Buf(x), Buf(w), I32(match.weight is not None), I32(xs[-1]), F(match.eps), I32(match.divide)])

    def _elementwise_clusters(self, nodes, consumers, outputs, skip) -> dict[int, list[Node]]:
        """id(root node) -> member nodes in order; id(non-root member) -> [] (emitted with its root)."""
        cluster_of: dict[int, list[Node]] = {}
        result: dict[int, list[Node]] = {}
        if not self.rule("elementwise"):
            return result
        for n in nodes:
            if n.op_type not in ELEMENTWISE_OPS or id(n) in skip:
                continue
            out_shape = self.shape(n.outputs[0])
            members = [n]
            for i in n.inputs:
                prod = self.graph.producer(i) if i else None
                if prod is None or id(prod) not in cluster_of or i in outputs:
                    continue
                if len(consumers.get(i, [])) != 1 or self.shape(i) != out_shape:
                    continue
                sub = cluster_of[id(prod)]
                if sub[-1] is not prod:
                    continue
                members = [m for m in sub if m not in members] + members
            for m in members:
                cluster_of[id(m)] = members
        for members in {id(m): m for m in cluster_of.values()}.values():
            root = members[-1]
            if cluster_of.get(id(root)) is not members:
                continue
            result[id(root)] = members
            for m in members[:-1]:
                result[id(m)] = []
        return result

    # -- fused elementwise -----------------------------------------------------------------
    def _ctype(self, name: str) -> str:
        """The C type of value ``name``'s elements (rule ``typed_values``, quantization codes; float32 otherwise)."""
        dtype = np.dtype(self.plan.dtypes.get(name) or self.lookup.dtype(name) or F32)
        if dtype not in C_TYPES and dtype not in CODE_C_TYPES:
            raise OrtNotImplemented(f"OpenCL EP: value {name!r} is {dtype}, which no kernel computes")
        return C_TYPES.get(dtype) or CODE_C_TYPES[dtype]

    def _float_tree(self, members: list[Node]) -> bool:
        """Whether every value a fused tree reads and computes is float32 (the GEMM epilogue and the
        LayerNorm prologue compute float32 only)."""
        return all(np.dtype(self.lookup.dtype(v) or F32) == F32
                   for m in members for v in (*m.inputs, *m.outputs) if v)

    def _elementwise_args(self, n: Node) -> tuple[list[str], dict]:
        """The node's data inputs as value names (constants synthesized where the op needs them)."""
        if n.op_type == "Cast":
            return [n.inputs[0]], {"to": self._ctype(n.outputs[0])}
        if n.op_type in QUANT_ELEMENTWISE_OPS:
            return quant_args(self, n)
        if n.op_type == "BatchNormalization":
            x = n.inputs[0]
            c = [self.lookup.const(i).astype(np.float64) for i in n.inputs[1:5]]
            scale = c[0] / np.sqrt(c[3] + float(n.attr("epsilon", 1e-5)))
            shift = c[1] - c[2] * scale
            tail = (1,) * (len(self.shape(x)) - 2)
            s_name = self.constant("bn_scale", scale.astype(np.float32).reshape((-1, *tail)))
            b_name = self.constant("bn_shift", shift.astype(np.float32).reshape((-1, *tail)))
            for name in (s_name, b_name):
                self.plan.shapes[name] = self.plan.constants[name].shape
                self.plan.dtypes[name] = F32
            return [x, s_name, b_name], {}
        if n.op_type == "FusedBatchNormalization":
            x = n.inputs[0]
            tail = (1,) * (len(self.shape(x)) - 2)
            names = []
            for i in n.inputs[1:3]:
                name = self.constant("fbn", self.lookup.const(i).astype(np.float32).reshape((-1, *tail)))
                self.plan.shapes[name] = self.plan.constants[name].shape
                self.plan.dtypes[name] = F32
                names.append(name)
            return [x, *names], {"act": fused_activation_spec(n)}
        if n.op_type == "Pow" and len(n.inputs) > 1:
            e = self.lookup.const(n.inputs[1])
            if e is not None and e.size == 1 and float(e.reshape(-1)[0]) in POW_AS_PRODUCT:
                return [n.inputs[0]], {"exponent": float(e.reshape(-1)[0])}
        if n.op_type == "Clip":
            extra = {"min": n.attr("min"), "max": n.attr("max")}
            for key, idx in (("min", 1), ("max", 2)):
                if len(n.inputs) > idx and n.inputs[idx]:
                    extra[key] = float(self.lookup.const(n.inputs[idx]).reshape(-1)[0])
            return [n.inputs[0]], extra
        return [i for i in n.inputs if i], {}

    def _lower_fused(self, members: list[Node], function: bool = False):
        """One fused elementwise launch of ``members``; ``function``: (its source as ``fused_at``, the
        buffers it reads, its meta constant) for a kernel reading the tree's result instead."""
        root = members[-1]
        out = root.outputs[0]
        out_shape = self.shape(out)
        internal = {m.outputs[0] for m in members[:-1]}
        #: value names, or (input of an inlined tree, the taken value it is read for) pairs
        ext: list = []
        exprs: dict[str, str] = {}
        statements: list[tuple[str, str]] = []
        local_types: list[str] = []

        def ref(key) -> str:
            if key not in ext:
                ext.append(key)
            return f"in{ext.index(key)}"

        for k, m in enumerate(members):
            args, extra = self._elementwise_args(m)
            refs = []
            for a in args:
                if a in internal:
                    refs.append(exprs[a])
                elif a in self.taken_trees:
                    if a not in exprs:  # rule take_elementwise: the Gather's source tree at the table's index
                        tree = self.taken_trees[a]
                        inner = {t.outputs[0] for t in tree[:-1]}
                        for t in tree:
                            targs, textra = self._elementwise_args(t)
                            trefs = [exprs[b] if b in inner else ref((b, a)) for b in targs]
                            local = f"w{len(statements)}"
                            statements.append((local, ELEMENTWISE_OPS[t.op_type](t, trefs, textra)))
                            local_types.append(self._ctype(t.outputs[0]))
                            exprs[t.outputs[0]] = local
                        exprs[a] = exprs[tree[-1].outputs[0]]
                    refs.append(exprs[a])
                else:
                    refs.append(ref(a))
            local = f"v{k}"
            statements.append((local, ELEMENTWISE_OPS[m.op_type](m, refs, extra)))
            local_types.append(self._ctype(m.outputs[0]))
            exprs[m.outputs[0]] = local
        inputs: list[FusedInput] = []
        sources: list[str] = []
        reads = []
        for key in ext:
            if isinstance(key, tuple):  # an inlined tree's input, read where the Gather read its result
                b, a = key
                name = self.data(b)
                if prod(self.shape(name)) == 1:
                    inputs.append(FusedInput("scalar"))
                    reads.append(Buf(name))
                else:
                    inputs.append(replace(broadcast_strides(self.shape(a), out_shape), table=True))
                    reads += [Buf(name), Buf(self.taken_inputs[a][1])]
                sources.append(name)
                continue
            a = key
            fi = (FusedInput("bcast", self.transposed_inputs[a][1]) if a in self.transposed_inputs
                  else broadcast_strides(self.shape(self.data(a)), out_shape))
            name = self.data(self.transposed_inputs[a][0] if a in self.transposed_inputs else a)
            taken = self.taken_inputs.get(name)
            gathered = self.gathered_inputs.get(name)
            if taken is not None:  # rule take_elementwise: the Gather's source through its table
                name, table = taken
                fi = replace(fi, table=True)
                reads += [Buf(name), Buf(table)]
            elif gathered is not None:  # rule gather_elementwise: rows of the Gather's source by its indices
                name, idx, rows = gathered
                fi = replace(fi, rows=rows)
                reads += [Buf(name), Buf(idx)]
            else:
                reads.append(Buf(name))
            inputs.append(fi)
            sources.append(name)
        types = FusedTypes(tuple(self._ctype(name) for name in sources), tuple(local_types), self._ctype(out))
        fused = generate_fused_kernel(statements, exprs[out], inputs, out_shape, function, types)
        meta = self.constant("meta", fused.meta)
        if function:
            return fused.source, reads, Buf(meta)
        self.plan.add_launch_1d(fused.source, "fused_elementwise", prod(out_shape),
                                [Buf(self.output(out)), *reads, Buf(meta)])

    def _transposed_inputs(self, clusters: dict[int, list[Node]], consumers: dict[str, list[Node]],
                           outputs: set[str], skip: set[int]) -> None:
        """Rule ``transpose_elementwise``: a Transpose whose result only a fused elementwise tree reads,
        with the tree's shape, is read by the tree through the permuted strides of its input."""
        for members in clusters.values():
            if not members or id(members[-1]) in skip:  # a tree another kernel computes (or none)
                continue
            out_shape = self.shape(members[-1].outputs[0])
            inside = {id(m) for m in members}
            for m in members:
                for a in m.inputs:
                    p = self.graph.producer(a) if a else None
                    if (p is None or p.op_type != "Transpose" or p.domain or id(p) in skip or a in outputs
                            or id(p) in self.parts_in_place or a in self.transposed_inputs
                            or self.shape(a) != out_shape
                            or not all(id(u) in inside for u in consumers.get(a, []))):
                        continue
                    xs = self.shape(p.inputs[0])
                    perm = p.attr("perm") or list(range(len(xs)))[::-1]
                    st = contiguous_strides(xs)
                    self.transposed_inputs[a] = (p.inputs[0], tuple(st[q] for q in perm))
                    skip.add(id(p))

    def _expanded_inputs(self, clusters: dict[int, list[Node]], consumers: dict[str, list[Node]],
                         outputs: set[str], skip: set[int]) -> None:
        """Rule ``expand_elementwise``: an Expand whose every reader is a member of a fused elementwise
        tree of the Expand's shape is read by those trees through broadcast strides of its input, and
        gets no launch (the attention mask an export expands once and each layer's Where reads)."""
        tree_shape: dict[int, tuple[int, ...]] = {}
        for members in clusters.values():
            if members and id(members[-1]) not in skip:
                for m in members:
                    tree_shape[id(m)] = self.shape(members[-1].outputs[0])
        for p in self.graph.nodes:
            if p.op_type != "Expand" or p.domain or id(p) in skip or id(p) in self.concat_targets:
                continue
            a = p.outputs[0]
            readers = consumers.get(a, [])
            if (a in outputs or a in self.transposed_inputs or not readers
                    or any(tree_shape.get(id(u)) != self.shape(a) and id(u) not in self.mask_wheres for u in readers)):
                continue
            self.transposed_inputs[a] = (p.inputs[0], tuple(_expand_strides(self.shape(p.inputs[0]), self.shape(a))))
            skip.add(id(p))

    def _taken_inputs(self, clusters: dict[int, list[Node]], consumers: dict[str, list[Node]],
                      outputs: set[str], skip: set[int]) -> None:
        """Rule ``take_elementwise``: a Gather or GatherND by constant indices of integer or bool
        elements (a ``take_flat``) whose every reader, directly or through views, is a member of a
        fused elementwise tree, is read by those trees through its table of flat source indices and
        gets no launch (the attention mask's Gather by position ids, read by the And with the causal
        mask)."""
        in_tree = {id(m) for members in clusters.values() if members and id(members[-1]) not in skip
                   for m in members}
        for n in self.graph.nodes:
            if n.op_type not in ("Gather", "GatherND") or n.domain or id(n) in skip:
                continue
            taken = self._take_table(n)
            if taken is None:
                continue
            readers, views = self._readers_through_views(n, consumers, outputs, skip)
            if not readers or any(id(u) not in in_tree for u in readers):
                continue
            x, table = taken
            t = self.constant("take_table", table.reshape(-1))
            self.plan.shapes[t], self.plan.dtypes[t] = (table.size,), np.dtype(np.int32)
            tree = self._inlined_source(n, clusters, consumers, outputs, skip)
            for m in (n, *views):  # no buffer of their own, so no alias of one either
                self.taken_inputs[m.outputs[0]] = (x, t)
                skip.add(id(m))
                if tree:
                    self.taken_trees[m.outputs[0]] = tree
            skip.update(id(m) for m in tree)

    def _readers_through_views(self, n: Node, consumers: dict[str, list[Node]], outputs: set[str],
                               skip: set[int]) -> tuple[list[Node], list[Node]]:
        """The nodes reading ``n``'s output directly or through views (a view holds the same
        elements in the same order), and those views; no readers when the value or a view of it is
        a plan output or read with strides (``transposed_inputs``), where it needs a buffer."""
        readers: list[Node] = []
        views: list[Node] = []
        values = [n.outputs[0]]
        while values:
            v = values.pop()
            if v in outputs or v in self.transposed_inputs:
                return [], views
            for u in consumers.get(v, []):
                if u.op_type in VIEW_OPS and not u.domain and id(u) not in skip:
                    views.append(u)
                    values.append(u.outputs[0])
                else:
                    readers.append(u)
        return readers, views

    def _gathered_inputs(self, clusters: dict[int, list[Node]], consumers: dict[str, list[Node]],
                         outputs: set[str], skip: set[int]) -> None:
        """Rule ``gather_elementwise``: a Gather along axis 0 of float32 rows by indices read at run
        time whose every reader, directly or through views, is a member of a fused elementwise tree
        (a LayerNorm's prologue among them) is read by those trees as rows of its source and gets no
        launch (the token embeddings, summed with the position embeddings before the first
        LayerNorm); its indices are range-checked on the host as ``gather_rows``' are."""
        readable = {id(m) for members in clusters.values() if members and id(members[-1]) not in skip
                    for m in members}
        readable.update(id(m) for members in self.layernorm_prologues.values() for m in members)
        for n in self.graph.nodes:
            if n.op_type != "Gather" or n.domain or id(n) in skip or self.lookup.const(n.inputs[1]) is not None:
                continue
            x, idx_name = self.data(n.inputs[0]), n.inputs[1]
            xs = self.shape(x)
            idx = self.data(idx_name)
            if (not xs or n.attr("axis", 0) % len(xs) != 0 or self._ctype(x) != "float"
                    or self._ctype(idx) not in ("long", "int")):
                continue
            readers, views = self._readers_through_views(n, consumers, outputs, skip)
            if not readers or any(id(u) not in readable for u in readers):
                continue
            # Indices read by two Gathers must fit the shorter axis.
            self.plan.host_indices[idx_name] = min(int(xs[0]), self.plan.host_indices.get(idx_name, xs[0]))
            for m in (n, *views):  # no buffer of their own, so no alias of one either
                self.gathered_inputs[m.outputs[0]] = (x, idx, (int(xs[0]), prod(xs[1:]), self._ctype(idx)))
                skip.add(id(m))

    def _inlined_source(self, n: Node, clusters: dict[int, list[Node]], consumers: dict[str, list[Node]],
                        outputs: set[str], skip: set[int]) -> list[Node]:
        """Rule ``take_elementwise``: the members of the fused tree that computes Gather ``n``'s
        source when only ``n`` reads it and each of the tree's inputs has the source's shape or one
        element: the trees reading ``n`` compute it at the table's index (the Cast of
        ``attention_mask`` to bool), and it gets no launch; else []."""
        x = n.inputs[0]
        p = self.graph.producer(x)
        views = []
        while (p is not None and p.op_type in VIEW_OPS and not p.domain and id(p) not in skip
               and x not in outputs and len(consumers.get(x, [])) == 1):  # the same elements in order
            views.append(p)
            x = p.inputs[0]
            p = self.graph.producer(x)
        members = clusters.get(id(p)) if p is not None else None
        if (not members or id(p) in skip or x in outputs or len(consumers.get(x, [])) != 1
                or any(id(m) in skip for m in members)):
            return []
        inner = {m.outputs[0] for m in members[:-1]}
        for m in members:
            for b in self._elementwise_args(m)[0]:
                if b in inner:
                    continue
                if (b in self.transposed_inputs or self.data(b) in self.taken_inputs
                        or self.shape(self.data(b)) != self.shape(x) and prod(self.shape(self.data(b))) != 1):
                    return []
        skip.update(id(v) for v in views)
        return members

    def _take_table(self, n: Node) -> tuple[str, np.ndarray] | None:
        """(the source, the flat index into it of every output element) of a Gather or GatherND that
        ``_take_flat`` lowers, with its indices in range; else None."""
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        const = self.lookup.const(n.inputs[1])
        if self._ctype(x) == "float" or const is None or not xs:
            return None
        flat = np.arange(prod(xs), dtype=np.int32).reshape(xs)
        if n.op_type == "Gather":
            axis = n.attr("axis", 0) % len(xs)
            if const.size and (const.min() < -xs[axis] or const.max() >= xs[axis]):
                return None
            table = np.take(flat, const.astype(np.int64), axis=axis)
        else:
            idx = const.astype(np.int64)
            k = idx.shape[-1] if idx.ndim else 0
            if not idx.ndim or k > len(xs) or n.attr("batch_dims", 0) or any(
                    idx[..., j].size and (idx[..., j].min() < -xs[j] or idx[..., j].max() >= xs[j]) for j in range(k)):
                return None
            table = flat[tuple(idx[..., j] for j in range(k))]
        if tuple(table.shape) != self.shape(n.outputs[0]):
            return None
        return x, table

    # -- single nodes ----------------------------------------------------------------------
    def _lower(self, n: Node, epi: Epilogue | None) -> None:
        op = n.op_type
        if op in VIEW_OPS:
            return self._view(n.outputs[0], n.inputs[0], n)
        if op in ELEMENTWISE_OPS:
            return self._lower_fused([n])
        method = getattr(self, f"_lower_{op}", None)
        if op in REDUCE_OPS:
            method = self._lower_reduce
        if method is None:
            raise OrtNotImplemented(f"OpenCL EP has no lowering for {op}")
        if op in ("Gemm", "MatMul", "Conv", "FusedGemm", "FusedMatMul", "FusedConv"):
            if epi is None:  # the optimizer's fused ops carry their activation as attributes
                epi = Epilogue(n.outputs[0], *fused_activation_spec(n))
                if op == "FusedConv" and len(n.inputs) > 3 and n.inputs[3]:
                    epi.residual = self.data(n.inputs[3])
            return method(n, epi)
        return method(n)

    _lower_DynamicQuantizeLinear = lower_dynamic_quantize  # quant_lowering.py

    def _view(self, out: str, src: str, node: Node | None = None) -> None:
        # A view only renames the buffer: shapes whose sizes differ (a Reshape to fewer elements)
        # would read past or short of it, where the CPU EP refuses them.
        out_shape, src_shape = self.shape(out), self.shape(src)
        if prod(out_shape) != prod(src_shape):
            what = f"{node.op_type} node {node.name!r}" if node is not None else f"view {out!r}"
            raise InvalidArgument(f"{what}: cannot view {src!r} of shape {list(src_shape)} ({prod(src_shape)} "
                                  f"elements) as {out!r} of shape {list(out_shape)} ({prod(out_shape)} elements); "
                                  "the sizes must match")
        src = self.data(src)
        if out in self.shape_only and not self._consumers.get(out):
            return  # an output read for its shape only, and by no node here: no copy into it
        if out not in self.plan.output_names:
            self.plan.aliases[out] = src
        elif src in self.plan.temps and len(self._consumers.get(src, [])) == 1 and src not in self.plan.aliases:
            # an intermediate only this view reads: its producer writes straight into the output
            del self.plan.temps[src]
            self.plan.aliases[src] = out
        else:  # an output viewing an input, a constant or a shared value owns a copy
            self.plan.steps.append(CopyStep(out, src, self.plan.nbytes(out)))

    def _strided_copy(self, dst: str, src: str, dims, src_strides, dst_strides, src_off=0, dst_off=0) -> None:
        rank = len(dims)
        pad = 6 - rank
        meta = [rank, *dims, *([1] * pad), *src_strides, *([0] * pad), *dst_strides, *([0] * pad), src_off, dst_off]
        m = self.constant("copymeta", np.array(meta, dtype=np.int32))
        last = dims[-1] if rank else 1
        work = (prod(dims) // last if last else 0) * -(-last // 64)  # rows x 64-element chunks
        self.plan.add_launch_1d(ks.MOVEMENT_SOURCE, "strided_copy", work, [Buf(dst), Buf(src), Buf(m)])

    # GEMM family ---------------------------------------------------------------------------
    # Other families ------------------------------------------------------------------------

    def _pool(self, n: Node, kernel: str, extra=lambda g: (), rows: bool = False) -> None:
        """One launch of POOL_SOURCE's ``kernel`` over ``n``'s output (``rows``: a work-item per
        output row): the window geometry, then the arguments ``extra`` derives from it."""
        x = self.data(n.inputs[0])
        xs, ys = self.shape(x), self.shape(n.outputs[0])
        g = self._conv_geometry(n, xs, (0, 0, *n.attr("kernel_shape")), ys)
        out = self.output(n.outputs[0])
        geometry = (I32(g[key]) for key in ("H", "W", "OH", "OW", "KH", "KW", "sh", "sw", "ph", "pw", "dh", "dw"))
        total = prod(ys[:-1]) if rows else prod(ys)
        self.plan.add_launch_1d(ks.POOL_SOURCE, kernel, total, [Buf(out), Buf(x), *geometry, *extra(g)])

    def _lower_MaxPool(self, n: Node) -> None:
        # Rule pool_rows: a row of outputs per work-item where rows hold enough outputs to share it.
        if self.rule("pool_rows") and self.shape(n.outputs[0])[-1] >= ks.POOL_ROWS_MIN_OW:
            # Rule pool_row_vectors: horizontal strides 1 and 2 take the row a vector at a time.
            sw = list(n.attr("strides", [1, 1]))[-1]
            ow = self.shape(n.outputs[0])[-1]
            vector = sw in (1, 2) and ow >= ks.POOL_VECTOR and self.rule("pool_row_vectors")
            # The output's layout (plane stride, row stride, offset): plain unless rule
            # pool_padded_output redirects it (pads_into_producers).
            self._pool(n, f"maxpool2d_rows_v{sw}" if vector else "maxpool2d_rows",
                       lambda g: (I32(g["OH"] * g["OW"]), I32(g["OW"]), I32(0)), rows=True)
            last = self.plan.steps[-1] if self.plan.steps else None
            if isinstance(last, Launch) and last.args[0] == Buf(n.outputs[0]):  # an empty output runs none
                self.pool_outputs[n.outputs[0]] = last
        else:
            self._pool(n, "maxpool2d")

    def _lower_AveragePool(self, n: Node) -> None:
        # count_include_pad counts pad positions inside the padded input only (as ORT)
        self._pool(n, "avgpool2d", lambda g: (I32(n.attr("count_include_pad", 0)), I32(g["H"] + g["ph_end"]),
                                              I32(g["W"] + g["pw_end"])))

    def _rows(self, kernel: str, n: Node, outer: int, r: int, inner: int, extra: list) -> None:
        x = self.data(n.inputs[0])
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.ROWWISE_SOURCE, kernel, outer * inner, [Buf(out), Buf(x), I32(r), I32(inner),
                                                                           *extra])

    def _lower_GlobalAveragePool(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        self._rows("reduce_rows", n, xs[0] * xs[1], prod(xs[2:]), 1, [I32(1)])

    def _lower_GlobalMaxPool(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        self._rows("reduce_rows", n, xs[0] * xs[1], prod(xs[2:]), 1, [I32(2)])

    def _lower_reduce(self, n: Node) -> None:
        outer, r, inner = reduce_layout(n, self.lookup)
        self._rows("reduce_rows", n, outer, r, inner, [I32(REDUCE_OPS[n.op_type])])

    def _softmax(self, n: Node, log: int) -> None:
        xs = self.shape(n.inputs[0])
        rank = len(xs)
        opset = self.graph.opset_version("") or 13
        axis = n.attr("axis", -1 if opset >= 13 else 1) % max(rank, 1)
        if opset >= 13:
            outer, r, inner = prod(xs[:axis]), xs[axis], prod(xs[axis + 1:])
        else:
            outer, r, inner = prod(xs[:axis]), prod(xs[axis:]), 1
        self._rows("softmax_rows", n, outer, r, inner, [I32(log)])

    def _lower_Softmax(self, n: Node) -> None:
        self._softmax(n, 0)

    def _lower_LogSoftmax(self, n: Node) -> None:
        self._softmax(n, 1)

    def _lower_LayerNormalization(self, n: Node) -> None:
        xs = self.shape(n.inputs[0])
        axis = n.attr("axis", -1) % len(xs)
        r = prod(xs[axis:])
        gamma = self.data(n.inputs[1])
        beta = self.data(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] else None
        out = self.output(n.outputs[0])
        tail = [Buf(gamma), Buf(beta or gamma), I32(1 if beta else 0), I32(r), F(n.attr("epsilon", 1e-5))]
        prologue = self.layernorm_prologues.get(id(n))
        if prologue is not None:  # rule layernorm_prologue: the elementwise tree computed in here
            source, reads, meta = self._lower_fused(prologue, function=True)
            stored = id(n) in self.stored_prologues  # rule layernorm_prologue_stored: X for its other readers
            x = self.output(n.inputs[0]) if stored else out
            self.plan.add_launch_1d(source, "layernorm_prologue", prod(xs[:axis]),
                                    [Buf(out), *reads, meta, *tail, Buf(x), I32(1 if stored else 0)])
            return
        self.plan.add_launch_1d(ks.ROWWISE_SOURCE, "layernorm_rows", prod(xs[:axis]), [
            Buf(out), Buf(self.data(n.inputs[0])), *tail])

    def _lower_LRN(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.POOL_SOURCE, "lrn", prod(xs), [
            Buf(out), Buf(x), I32(xs[1]), I32(prod(xs[2:])), I32(n.attr("size")), F(n.attr("alpha", 1e-4)),
            F(n.attr("beta", 0.75)), F(n.attr("bias", 1.0))])

    def _lower_Transpose(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        perm = n.attr("perm") or list(range(len(xs)))[::-1]
        ys = self.shape(n.outputs[0])
        st, offset = contiguous_strides(xs), 0
        if id(n) in self.parts_in_place:  # rule head_split_in_place: read the part where it was computed
            _, x, offset, st = self.parts_in_place[id(n)]
        dst, dst_off, dst_strides = self._copy_target(n)
        self._strided_copy(dst, x, ys, [st[p] for p in perm], dst_strides, offset, dst_off)

    def _copy_target(self, n: Node) -> tuple[str, int, list[int]]:
        """Where a copying node writes: its own output, or (rule ``concat_in_place``) its slot of the
        Concat that alone reads it."""
        target = self.concat_targets.get(id(n))
        if target is not None:
            return self.output(target[0]), target[1], target[2]
        return self.output(n.outputs[0]), 0, contiguous_strides(self.shape(n.outputs[0]))

    def _lower_Expand(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        ys = self.shape(n.outputs[0])
        if self._ctype(x) != "float" and id(n) not in self.concat_targets:
            # Rule typed_values: strided_copy moves floats; other elements are broadcast by a
            # generated kernel of their type, as a fused tree reads a broadcast input.
            ctype = self._ctype(x)
            fused = generate_fused_kernel([], "in0", [broadcast_strides(self.shape(x), ys)], ys,
                                          types=FusedTypes((ctype,), (), ctype))
            meta = self.constant("meta", fused.meta)
            self.plan.add_launch_1d(fused.source, "fused_elementwise", prod(ys),
                                    [Buf(self.output(n.outputs[0])), Buf(x), Buf(meta)])
            return
        src = _expand_strides(self.shape(x), ys)
        dst, dst_off, dst_strides = self._copy_target(n)
        self._strided_copy(dst, x, ys, src, dst_strides, 0, dst_off)

    def _lower_Concat(self, n: Node) -> None:
        out = self.output(n.outputs[0])
        ys = self.shape(out)
        axis = n.attr("axis") % len(ys)
        ost = contiguous_strides(ys)
        offset = 0
        for i in n.inputs:
            xs = self.shape(self.data(i))
            producer = self.graph.producer(i)
            if producer is None or id(producer) not in self.concat_targets:  # else written in place
                self._strided_copy(out, self.data(i), xs, contiguous_strides(xs), ost, 0, offset * ost[axis])
            offset += xs[axis]

    def _lower_Split(self, n: Node) -> None:
        """Each output a contiguous run along the axis: its size is its inferred (static) shape's,
        whether the sizes came from the ``split`` input, ``num_outputs`` or an even split."""
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        axis = n.attr("axis", 0) % len(xs)
        st = contiguous_strides(xs)
        offset = 0
        for o in n.outputs:
            if not o:
                continue
            ys = self.shape(o)
            if o not in self.in_place_parts:
                self._strided_copy(self.output(o), x, ys, st, contiguous_strides(ys), offset * st[axis], 0)
            offset += ys[axis]

    def _lower_Slice(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        rank = len(xs)

        def param(idx, attr):
            if len(n.inputs) > idx and n.inputs[idx]:
                return [int(v) for v in self.lookup.const(n.inputs[idx]).reshape(-1)]
            return n.attr(attr)
        starts = param(1, "starts")  # the ends are in the inferred output shape
        axes = param(3, "axes") or list(range(len(starts)))
        steps = param(4, "steps") or [1] * len(starts)
        st = contiguous_strides(xs)
        src_st, off = list(st), 0
        for s, a, step in zip(starts, axes, steps):
            a %= rank
            # ONNX's start: clamped into [0, dim] (or [0, dim - 1] stepping back). Python's
            # slice.indices differs when a backward slice starts before 0: it gives -1 (an empty
            # range), where ONNX starts at 0 and the inferred shape holds one element.
            begin = s + xs[a] if s < 0 else s
            begin = min(max(begin, 0), xs[a] if step > 0 else xs[a] - 1)
            off += max(begin, 0) * st[a]
            src_st[a] = st[a] * step
        ys = self.shape(n.outputs[0])
        self._strided_copy(self.output(n.outputs[0]), x, ys, src_st, contiguous_strides(ys), off, 0)

    def _lower_Gather(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        axis = n.attr("axis", 0) % len(xs)
        idx_name = n.inputs[1]
        const = self.lookup.const(idx_name)
        if self._ctype(x) != "float":
            if const is None:
                raise OrtNotImplemented(f"Gather {n.name!r} of {self.plan.dtypes[x]} elements needs constant indices")
            self._check_range(n, const, xs[axis])
            table = np.take(np.arange(prod(xs), dtype=np.int32).reshape(xs), const.astype(np.int64), axis=axis)
            return self._take_flat(n, x, table)
        if const is not None:
            idx = self.constant("gather_idx", const.astype(np.int64).reshape(-1))
            nidx = int(const.size)
        else:
            idx = self.data(idx_name)
            nidx = prod(self.shape(idx))
            # Indices read by two Gathers must fit the shorter axis.
            self.plan.host_indices[idx_name] = min(int(xs[axis]), self.plan.host_indices.get(idx_name, xs[axis]))
        out = self.output(n.outputs[0])
        self.plan.add_launch_1d(ks.MOVEMENT_SOURCE, "gather_rows", prod(self.shape(out)), [
            Buf(out), Buf(x), Buf(idx), I32(xs[axis]), I32(nidx), I32(prod(xs[axis + 1:]))])

    def _lower_GatherND(self, n: Node) -> None:
        x = self.data(n.inputs[0])
        xs = self.shape(x)
        const = self.lookup.const(n.inputs[1])
        if const is None:
            raise OrtNotImplemented(f"GatherND {n.name!r} needs constant indices")
        idx = const.astype(np.int64)
        k = idx.shape[-1] if idx.ndim else 0
        if not idx.ndim or k > len(xs):
            raise OrtNotImplemented(f"GatherND {n.name!r}: indices of shape {list(idx.shape)} for data of rank {len(xs)}")
        for j in range(k):
            self._check_range(n, idx[..., j], xs[j])
        flat = np.arange(prod(xs), dtype=np.int32).reshape(xs)
        self._take_flat(n, x, flat[tuple(idx[..., j] for j in range(k))])

    def _check_range(self, n: Node, idx: np.ndarray, length: int) -> None:
        if idx.size and (idx.min() < -length or idx.max() >= length):
            raise OrtNotImplemented(f"{n.op_type} {n.name!r}: indices out of range for an axis of length {length} "
                                    "(the CPU EP reports it)")

    def _take_flat(self, n: Node, x: str, table: np.ndarray) -> None:
        """Rule ``typed_values``: a Gather or GatherND by constant indices (op_support claims no
        other) as one ``take_flat`` launch, given ``table``: the flat index into ``x`` of every output
        element, computed from the indices at planning."""
        out = self.output(n.outputs[0])
        if tuple(table.shape) != self.shape(out):
            raise OrtNotImplemented(f"{n.op_type} {n.name!r}: output shape {list(self.shape(out))} is not "
                                    f"{list(table.shape)}")
        t = self.constant("take_table", table.reshape(-1))
        self.plan.shapes[t], self.plan.dtypes[t] = (table.size,), np.dtype(np.int32)
        self.plan.add_launch_1d(ks.take_flat_source(self._ctype(x)), "take_flat", table.size,
                                [Buf(out), Buf(x), Buf(t)])


def _expand_strides(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> list[int]:
    """The element strides by which an Expand's output of ``out_shape`` reads its input of
    ``in_shape`` (0 along the broadcast axes)."""
    fi = broadcast_strides(in_shape, out_shape)
    return list(fi.strides) if fi.mode == "bcast" else contiguous_strides(out_shape) if fi.mode == "same" \
        else [0] * len(out_shape)


def build_plan(graph: Graph, lookup: GraphLookup, disabled: frozenset[str] = frozenset(),
               shape_only: frozenset[str] = frozenset()) -> PartitionPlan:
    """The launches of one fused partition, without the fusion rules named in ``disabled``; the
    outputs in ``shape_only`` (``shape_only_outputs``) get no data."""
    graph, lookup = decompose_quantized(graph, lookup)  # QLinearMatMul, MatMulIntegerToFloat (quant_decompose.py)
    return PartitionPlanBuilder(graph, lookup, disabled, shape_only).build()


#: Ops that read only the shape of their input (the executor hands them device tensors as they are).
SHAPE_READERS = ("Shape", "Size")


def shape_only_outputs(graph: Graph, part: Graph) -> frozenset[str]:
    """Outputs of partition ``part`` (a filtered graph of ``graph``) that are not outputs of ``graph``
    and whose every reader outside the partition reads only their shape (Shape, Size; not a node
    whose subgraphs read them): the partition need not write their data. TorchScript exports read
    the head-split Q and V of attention with a Shape (the scale, the merge's Reshape target) on the
    host, which would otherwise keep each head split as a copy."""
    members = {id(n) for n in part.nodes}
    final = set(graph.output_names)
    captured = {v for n in graph.nodes if id(n) not in members for v in n.implicit_inputs}
    found = []
    for name in part.output_names:
        readers = [c for c in graph.consumers(name) if id(c) not in members]
        if (name not in final and name not in captured and readers
                and all(c.op_type in SHAPE_READERS and not c.domain for c in readers)):
            found.append(name)
    return frozenset(found)
