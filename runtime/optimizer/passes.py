"""Graph optimizer: ``optimize(graph, level)`` runs the passes of a level until nothing changes.

Levels, as ORT's ``GraphOptimizationLevel``:

- ``ORT_DISABLE_ALL``: nothing but float16 regions computed in float32 (``opt_float16_regions``,
  CPU-only sessions): onnxruntime inserts those Casts at every level, because its CPU EP lacks the
  float16 kernels, so this is how its kernels compute rather than an optimization.
- ``ORT_ENABLE_BASIC``: constant folding, dead-node removal, identity/no-op elimination
  (Identity, inference Dropout, same-type Cast), CastLike with a known target type -> Cast (as
  onnxruntime's function inlining), a zero constant-mode Pad of the spatial axes into
  the Conv reading it (``opt_pad_fusion``), Conv+BatchNormalization, Conv+Mul and Conv+Add
  folding into the Conv's weights, a Conv's bias carried through a following 1x1 Conv when no
  activation lies between, BatchNormalization+Mul/Add folding into its scale and bias,
  MatMul+Add -> Gemm (2-D A, constant B and bias), a Slice that keeps everything removed,
  a Shape of a computed value reading the graph input whose dims it is proven to read
  (``opt_shape_sources``: a device partition is then not cut by the host's mask chain),
  outer-scope constants folded into subgraphs and loop-invariant nodes hoisted out of Loop/Scan
  bodies (``opt_loop_invariants``). Recursive into subgraphs.
- ``ORT_ENABLE_EXTENDED`` adds QDQ groups (DequantizeLinear -> MatMul / Softmax / Add / Mul /
  Concat -> QuantizeLinear) -> QLinearMatMul and com.microsoft QLinearSoftmax / QLinearAdd /
  QLinearMul / QLinearConcat, as onnxruntime's QDQ transformer (``opt_qdq_fusions``), the
  QuantizeLinear -> DequantizeLinear pairs left (``opt_qdq_pairs``: dropped where their input is
  already on their grid, else one com.onnxhal QuantizeDequantize; CPU-only sessions), element-wise
  chains over 8-bit quantized values -> a com.onnxhal GridTable lookup (``opt_qdq_tables``), and fusions
  into ``com.onnxhal`` ops run by the CPU EP (kernels in ``providers/cpu/kernels/fused*.py``): Conv[+Add/Sum residual][+activation] -> FusedConv,
  Conv + x * Sigmoid(x) / x * HardSigmoid(x) / HardSwish(x) -> FusedConv with a Swish or
  HardSwish epilogue (CPU-only sessions), Gemm+activation -> FusedGemm,
  MatMul+Add(bias)[+Relu/Gelu] -> FusedMatMul, inference BatchNormalization[+activation] -> FusedBatchNormalization (a precomputed per-channel affine),
  MatMulInteger+Cast+Mul(scale)[+Add(bias)] -> com.microsoft MatMulIntegerToFloat (onnxruntime's
  quantizer output; onnxruntime makes the same fusion for its CPU EP), and with the
  DynamicQuantizeLinear it alone reads -> com.microsoft DynamicQuantizeMatMul (``opt_dynamic_quant``,
  as onnxruntime's DynamicQuantizeMatMulFusion; CPU-only sessions),
  the decomposed LayerNormalization pattern -> LayerNormalization, the Erf Gelu pattern -> Gelu,
  LinearClassifier + Normalizer of its scores -> FusedLinearClassifier (``opt_ml_fusions``),
  a Concat of keepdims ReduceProd/Sum/Max/Min nodes of gathered pieces of one value -> com.onnxhal
  GatherReduce where the results stay bit for bit (``opt_horizontal``; CPU-only sessions);
  Relu(Concat) -> Concat of Relus the Convs absorb; MatMul(A, B) / scalar -> MatMul with the
  factor folded into the constant weights A or B comes from (attention's 1 / sqrt(d)); in
  CPU-only sessions MaxPool(Relu(x)) -> Relu(MaxPool(x)) (also through a Concat of Relus), so the
  Relu runs over the pooled output.
  Main graph only.
- ``ORT_ENABLE_LAYOUT`` and ``ORT_ENABLE_ALL`` add: remaining Conv, Gemm and MatMul-by-constant
  nodes -> their fused forms with no epilogue (as ORT's level-3 NCHWc transformer takes every
  Conv for its CPU kernels), so all heavy products run on the fused kernels' threads; a channel
  shuffle after a FusedConv -> the FusedConv's ``channel_shuffle`` attribute; FusedGemm weights
  read transposed (transB = 1) -> stored transposed once.

``fuse_cpu_ops=False`` keeps every ``com.onnxhal`` rewrite out (only the LayerNormalization fusion
to the standard op, at opset >= 17, stays): for sessions where other EPs should see plain ops.
``cpu_ep_only=False`` keeps out the rewrites only the CPU EP's kernels run (``CPU_EP_PASSES``: the
channel-shuffle fold and the Swish / HardSwish Conv epilogues, which the OpenCL EP's FusedConv
lacks, the Gemm weight transpose, measured only against numpy's BLAS, the Relu moved after a MaxPool, which would split an NHWC EP's
chain of converted ops, and the QDQ pair, table and DynamicQuantizeMatMul rewrites, which would hide
from a quantizing device the QuantizeLinear -> DequantizeLinear pairs it reads its integer groups
from, or the DynamicQuantizeLinear it claims).

The graph is optimized in place and returned. Graph inputs and outputs keep their names; results
stay within float tolerance of the unoptimized graph. A pass that meets something it cannot handle
leaves the nodes as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from onnxhal.hal.enums import GraphOptimizationLevel
from onnxhal.hal.errors import InvalidArgument
from onnxhal.hal.graph import Graph
from onnxhal.runtime.optimizer import cleanup as opt_cleanup
from onnxhal.runtime.optimizer import dynamic_quant_fusions as opt_dynamic_quant
from onnxhal.runtime.optimizer import elementwise_chains as opt_elementwise_chains
from onnxhal.runtime.optimizer import float16_regions as opt_float16_regions
from onnxhal.runtime.optimizer import fusions as opt_fusions
from onnxhal.runtime.optimizer import horizontal as opt_horizontal
from onnxhal.runtime.optimizer import loop_invariants as opt_loop_invariants
from onnxhal.runtime.optimizer import ml_fusions as opt_ml_fusions
from onnxhal.runtime.optimizer import pad_fusion as opt_pad_fusion
from onnxhal.runtime.optimizer import qdq_fusions as opt_qdq_fusions
from onnxhal.runtime.optimizer import qdq_pairs as opt_qdq_pairs
from onnxhal.runtime.optimizer import qdq_tables as opt_qdq_tables
from onnxhal.runtime.optimizer import shape_sources as opt_shape_sources
from onnxhal.runtime.optimizer import weight_folding as opt_weight_folding
from onnxhal.runtime.optimizer.rewrite import remove_unused_value_infos

logger = logging.getLogger("onnxhal.optimizer")
_BASIC = GraphOptimizationLevel.ORT_ENABLE_BASIC
_EXTENDED = GraphOptimizationLevel.ORT_ENABLE_EXTENDED
_LAYOUT = GraphOptimizationLevel.ORT_ENABLE_LAYOUT
_ALWAYS = GraphOptimizationLevel.ORT_DISABLE_ALL

#: A pass rewrites one graph in place and returns True if it changed anything.
GraphPass = Callable[[Graph], bool]

#: (name, minimum level, pass, recurse into subgraphs, emits com.onnxhal ops). Order matters:
#: folding before fusions, Gelu before FusedMatMul (which absorbs it).
PASSES: list[tuple[str, GraphOptimizationLevel, GraphPass, bool, bool]] = [
    ("castlike_to_cast", _BASIC, opt_cleanup.castlike_to_cast, True, False),
    ("eliminate_no_ops", _BASIC, opt_cleanup.eliminate_no_ops, True, False),
    ("fold_constants", _BASIC, opt_cleanup.fold_constants, True, False),
    ("hoist_loop_invariants", _BASIC, opt_loop_invariants.hoist_loop_invariants, True, False),
    ("refresh_shapes", _BASIC, opt_cleanup.refresh_shapes, False, False),
    ("redirect_shape_reads", _BASIC, opt_shape_sources.redirect_shape_reads, True, False),
    # every level: onnxruntime runs InsertCastTransformer after partitioning whatever the level
    # (inference_session.cc, TransformGraph), since its CPU EP has no float16 kernels for these ops
    ("run_float16_regions", _ALWAYS, opt_float16_regions.run_float16_regions, True, False),
    ("remove_dead_nodes", _BASIC, opt_cleanup.remove_dead_nodes, True, False),
    ("fuse_pad_into_conv", _BASIC, opt_pad_fusion.fuse_pad_into_conv, True, False),
    ("fold_conv_batchnorm", _BASIC, opt_weight_folding.fold_conv_batchnorm, True, False),
    ("fold_conv_mul_add", _BASIC, opt_weight_folding.fold_conv_mul_add, True, False),
    ("fold_conv_bias_forward", _BASIC, opt_weight_folding.fold_conv_bias_forward, True, False),
    ("fold_batchnorm_mul_add", _BASIC, opt_weight_folding.fold_batchnorm_mul_add, True, False),
    ("matmul_add_to_gemm", _BASIC, opt_weight_folding.matmul_add_to_gemm, True, False),
    ("fuse_qdq_groups", _EXTENDED, opt_qdq_fusions.fuse_qdq_groups, False, True),
    ("drop_requantize", _EXTENDED, opt_qdq_pairs.drop_requantize, False, False),
    ("collapse_qdq_pairs", _EXTENDED, opt_qdq_pairs.collapse_qdq_pairs, False, True),
    ("tabulate_grid_chains", _EXTENDED, opt_qdq_tables.tabulate_grid_chains, False, True),
    ("fuse_layer_norm", _EXTENDED, opt_fusions.fuse_layer_norm, False, False),
    ("fuse_gelu", _EXTENDED, opt_fusions.fuse_gelu, False, True),
    ("fuse_replace_nan", _EXTENDED, opt_fusions.fuse_replace_nan, False, True),
    ("fuse_matmul_bias", _EXTENDED, opt_fusions.fuse_matmul_bias, False, True),
    ("fuse_matmul_integer_to_float", _EXTENDED, opt_fusions.fuse_matmul_integer_to_float, False, True),
    ("fuse_dynamic_quantize_matmul", _EXTENDED, opt_dynamic_quant.fuse_dynamic_quantize_matmul, False, True),
    ("fold_matmul_scale", _EXTENDED, opt_weight_folding.fold_matmul_scale, False, False),
    ("push_relu_into_concat", _EXTENDED, opt_fusions.push_relu_into_concat, False, False),
    ("pull_relu_after_maxpool", _EXTENDED, opt_fusions.pull_relu_after_maxpool, False, False),
    ("fuse_conv_activation", _EXTENDED, opt_fusions.fuse_conv_activation, False, True),
    ("fuse_conv_gated_activation", _EXTENDED, opt_fusions.fuse_conv_gated_activation, False, True),
    ("fuse_gemm_activation", _EXTENDED, opt_fusions.fuse_gemm_activation, False, True),
    ("fuse_batchnorm_activation", _EXTENDED, opt_fusions.fuse_batchnorm_activation, False, True),
    ("fuse_classifier_normalizer", _EXTENDED, opt_ml_fusions.fuse_classifier_normalizer, False, True),
    ("fuse_gather_reduce", _EXTENDED, opt_horizontal.fuse_gather_reduce, False, True),
    # last of its level: every pattern fusion above has taken its elementwise nodes first
    ("fuse_elementwise_chains", _EXTENDED, opt_elementwise_chains.fuse_elementwise_chains, True, True),
    ("adopt_fused_kernels", _LAYOUT, opt_fusions.adopt_fused_kernels, False, True),
    ("fuse_channel_shuffle", _LAYOUT, opt_fusions.fuse_channel_shuffle, False, True),
    ("pretranspose_gemm_weights", _LAYOUT, opt_weight_folding.pretranspose_gemm_weights, False, True),
]

#: Passes whose result only the CPU EP runs: skipped unless every EP of the session is the CPU EP.
#: ``pull_relu_after_maxpool`` emits standard ops, but a Relu between a MaxPool and a Conv would
#: keep the layout transformer's Transposes of an NHWC EP from cancelling (it converts
#: layout-sensitive ops only, and does not carry NHWC through elementwise ones). GatherReduce
#: (``fuse_gather_reduce``) has a CPU kernel only.
CPU_EP_PASSES = frozenset({"collapse_qdq_pairs", "drop_requantize", "fuse_channel_shuffle",
                           "fuse_conv_gated_activation", "fuse_dynamic_quantize_matmul", "fuse_elementwise_chains",
                           "fuse_gather_reduce",
                           "pretranspose_gemm_weights", "pull_relu_after_maxpool", "run_float16_regions",
                           "tabulate_grid_chains"})

#: Session config key: the names of passes (``PASSES``) a session skips, separated by commas; for
#: A/B measurements and as a way around a pass that hurts a model.
DISABLE_PASSES_KEY = "optimization.disable_passes"

#: Rounds of the whole pass list before giving up on reaching a fixed point.
MAX_ROUNDS = 4

#: Whether a pass that found nothing is skipped until another pass changes the graph (see
#: ``_run_to_fixed_point``); False calls every pass in every round, for A/B measurements and tests.
SKIP_CLEAN_PASSES = True

#: Passes one call of which leaves nothing for a second call to find: each sweeps the graph once
#: in topological order (the dead-node pass in reverse), seeing its own rewrites as it goes. After
#: such a pass changed the graph, the next round does not call it again only to confirm its own
#: change (over the corpus none of their 220 changing calls left work for a second call at once).
SELF_SETTLING = frozenset({"eliminate_no_ops", "fold_constants", "redirect_shape_reads", "remove_dead_nodes"})

#: Whether ``SELF_SETTLING`` passes skip their confirming call, and a dead-node pass that dropped
#: only constants no node reads counts as no change (no pass reads such a constant, so the passes
#: that found nothing before would find nothing again); False for A/B measurements and tests.
SKIP_SELF_CONFIRMATION = True

#: Per pass, op types one of which a graph must hold for the pass to find anything: the ones it
#: starts a rewrite from (asks ``live_nodes`` for), or where those are common (the element-wise
#: ops a grid chain is made of) the ones its match cannot do without (a chain starts from an 8-bit
#: grid, which only a DequantizeLinear or a collapsed pair makes: ``qdq_pairs.grid_of``). A graph
#: with none of them gives the pass nothing to do, so the driver skips it without a call, and
#: without the walk of the nodes that call would make. A pass not named here always runs.
TRIGGERS: dict[str, frozenset[str]] = {name: frozenset(ops) for name, ops in {
    "castlike_to_cast": ("CastLike",),
    "eliminate_no_ops": ("Identity", "Dropout", "Cast", "Slice"),
    "fuse_pad_into_conv": ("Pad",),
    "redirect_shape_reads": ("Shape",),
    "fold_conv_batchnorm": ("Conv",),
    "fold_conv_mul_add": ("Conv",),
    "fold_conv_bias_forward": ("Conv",),
    "fold_batchnorm_mul_add": ("BatchNormalization",),
    "matmul_add_to_gemm": ("MatMul",),
    "fuse_qdq_groups": ("QuantizeLinear",),
    "drop_requantize": ("QuantizeLinear",),
    "collapse_qdq_pairs": ("QuantizeLinear",),
    "tabulate_grid_chains": opt_qdq_tables.GRID_MAKERS,
    "fuse_layer_norm": ("ReduceMean",),
    "fuse_gelu": ("Erf",),
    "fuse_replace_nan": ("Where",),
    "fuse_matmul_bias": ("MatMul",),
    "fuse_matmul_integer_to_float": ("MatMulInteger",),
    "fuse_dynamic_quantize_matmul": ("MatMulIntegerToFloat",),
    "fold_matmul_scale": ("MatMul",),
    "push_relu_into_concat": ("Relu",),
    "pull_relu_after_maxpool": ("MaxPool",),
    "fuse_conv_activation": ("Conv",),
    "fuse_conv_gated_activation": ("Conv", "FusedConv"),
    "fuse_gemm_activation": ("Gemm",),
    "fuse_batchnorm_activation": ("BatchNormalization",),
    "fuse_classifier_normalizer": ("LinearClassifier",),
    "fuse_gather_reduce": ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"),
    "fuse_elementwise_chains": tuple(opt_elementwise_chains.CHAIN_OPS),
    "adopt_fused_kernels": ("Conv", "Gemm", "MatMul"),
    "fuse_channel_shuffle": ("FusedConv",),
    "pretranspose_gemm_weights": ("FusedGemm",),
}.items()}

#: Per pass, further op-type sets the graph must hold one of each, besides its ``TRIGGERS``: the
#: ops its match cannot do without after the one it starts from (a Conv's BatchNormalization, a
#: MatMul's Add, a FusedConv's Reshape and Transpose). A CNN holds Convs in every round, and each
#: Conv pass walked them all to find no follower of the kind it folds. Skipped as ``TRIGGERS``.
PARTNERS: dict[str, tuple[frozenset[str], ...]] = {name: tuple(map(frozenset, sets)) for name, sets in {
    "fold_conv_batchnorm": (("BatchNormalization",),),
    "fold_conv_mul_add": (("Mul", "Add"),),
    "fold_batchnorm_mul_add": (("Mul", "Add"),),
    "matmul_add_to_gemm": (("Add",),),
    "fuse_replace_nan": (("IsNaN",),),
    "fuse_matmul_bias": (("Add",),),
    "fold_matmul_scale": (("Div", "Mul"),),
    "push_relu_into_concat": (("Concat",),),
    "pull_relu_after_maxpool": (("Relu",),),
    "fuse_conv_activation": (("Add", "Sum", *opt_fusions.ACTIVATION_OPS),),
    "fuse_conv_gated_activation": (("Sigmoid", "HardSigmoid", "HardSwish"),),
    "fuse_gemm_activation": (opt_fusions.ACTIVATION_OPS,),
    "fuse_channel_shuffle": (("Reshape",), ("Transpose",)),
}.items()}


def optimize(graph: Graph, level: GraphOptimizationLevel | int, *, fuse_cpu_ops: bool = True,
             cpu_ep_only: bool = True, disabled: Collection[str] = ()) -> Graph:
    """Optimize ``graph`` in place at ``level`` and return it (the same object).

    ``fuse_cpu_ops=False`` skips the fusions into ``com.onnxhal`` ops, which only the CPU EP runs:
    pass it when another EP should be able to claim the Conv/Gemm/MatMul nodes (ORT likewise runs
    such fusions only for the EPs that implement them). LayerNormalization fusion still runs at
    opset >= 17, where it yields the standard ONNX op. ``cpu_ep_only=False`` (a session with an
    EP besides the CPU EP) also skips ``CPU_EP_PASSES``. ``disabled``: names of ``PASSES`` not to
    run (the session config key ``DISABLE_PASSES_KEY``; onnxruntime's ``disabled_optimizers``).
    """
    passes = _selected(level, fuse_cpu_ops, cpu_ep_only, frozenset(disabled))
    if passes:
        _run(graph, passes)
    return graph


#: ``_selected``'s answers, with the ``PASSES`` and ``CPU_EP_PASSES`` they were read from: a
#: session's selection (about 50 passes, each tested on four conditions) cost 15-20 us of a small
#: model's 1.5 ms creation, the same each time; a change of what it reads (tests replace the lists) empties it
_SELECTIONS: dict[tuple, list[tuple[str, GraphPass, bool, GraphOptimizationLevel]]] = {}
_SELECTED_FROM: tuple = ()


def _selected(level: GraphOptimizationLevel | int, fuse_cpu_ops: bool, cpu_ep_only: bool,
              disabled: frozenset[str]) -> list[tuple[str, GraphPass, bool, GraphOptimizationLevel]]:
    """The passes ``optimize`` runs, with the level each runs at (a bad level or pass name raises)."""
    global _SELECTED_FROM
    # compared item by item, the same tuple objects compare by identity: about 1 us
    source = (tuple(PASSES), CPU_EP_PASSES, opt_fusions.fuse_layer_norm_standard)
    if source != _SELECTED_FROM:
        _SELECTIONS.clear()
        _SELECTED_FROM = source
    key = (level, fuse_cpu_ops, cpu_ep_only, disabled)
    try:
        found = _SELECTIONS.get(key)
    except TypeError:  # an unhashable level: the checks below report it
        found = None
    if found is not None:
        return found
    unknown = set(disabled) - {p[0] for p in PASSES}
    if unknown:
        raise InvalidArgument(f"{DISABLE_PASSES_KEY}: no optimizer pass is named {sorted(unknown)}; the passes are "
                              + ", ".join(p[0] for p in PASSES))
    try:
        level = GraphOptimizationLevel(int(level))
    except ValueError:
        raise InvalidArgument(f"graph optimization level {level!r} is not one of "
                              f"{[lv.name for lv in GraphOptimizationLevel]}") from None
    # a pass of every level runs with the basic ones, in its place in PASSES, when there are any
    passes = [(name, fn, recurse, max(min_level, min(level, _BASIC)))
              for name, min_level, fn, recurse, cpu_only in PASSES
              if level >= min_level and (fuse_cpu_ops or not cpu_only)
              and (cpu_ep_only or name not in CPU_EP_PASSES) and name not in disabled]
    if not fuse_cpu_ops:
        passes = [(n, opt_fusions.fuse_layer_norm_standard if n == "fuse_layer_norm" else fn, r, lv)
                  for n, fn, r, lv in passes]
    if len(_SELECTIONS) < 64:  # a handful of option sets in practice
        try:
            _SELECTIONS[key] = passes
        except TypeError:
            pass
    return passes


def _run(graph: Graph, passes: list[tuple[str, GraphPass, bool, GraphOptimizationLevel]]) -> None:
    loaded = list(graph.nodes)  # kept alive, so their ids stay theirs
    for node in graph.nodes:
        for sub in node.subgraph_list():
            _run(sub, [p for p in passes if p[2]])
    if any(n.subgraphs for n in graph.nodes):
        graph.reindex()  # subgraphs may now read other values of this scope
    # Each level reaches its fixed point before the next starts: fusions must see folded graphs.
    dead = True  # whether the graph may hold dead nodes or constants: not looked for yet
    for level in sorted({p[3] for p in passes}):
        dead = _run_to_fixed_point(graph, [p for p in passes if p[3] == level], dead)
    # The dead-node pass runs at the basic level; the weights a later level's rewrite replaced
    # (scaled, transposed) are dropped here, once, rather than by each pass: where no pass changed
    # the graph since the dead-node pass last found nothing, this one would find nothing either.
    if dead and any(p[0] == "remove_dead_nodes" for p in passes):
        opt_cleanup.remove_dead_nodes(graph)
    remove_unused_value_infos(graph)
    _unique_new_node_names(graph, loaded)


def _unique_new_node_names(graph: Graph, loaded: list) -> None:
    """Give each node a rewrite made a name no other node of the graph has. Rewrites name a node
    after the one it replaces (``conv_fused``, ``pool_relu``), and a node rewritten twice in one
    way gave two nodes one name, which profiles and assignment info then cannot tell apart (two
    Relus moved across one MaxPool in turn: two ``n_MaxPool_33_relu``). The model's own names are
    left as they are, duplicates included, as onnxruntime leaves them."""
    original = {id(n) for n in loaded}
    taken = {n.name for n in graph.nodes if id(n) in original}
    for n in graph.nodes:
        if id(n) in original:
            continue
        name, i = n.name, 0
        while name in taken:
            i += 1
            name = f"{n.name}_{i}"
        n.name = name
        taken.add(name)


def _run_to_fixed_point(graph: Graph, passes: list[tuple[str, GraphPass, bool, GraphOptimizationLevel]],
                        dead: bool) -> bool:
    """Run ``passes`` in rounds until one changes nothing. ``dead``: whether the graph may hold dead
    nodes or constants as it comes; returns the same for the graph as it leaves: False where the
    dead-node pass found nothing to remove and no pass changed the graph after that.

    A pass that found nothing is not called again until some pass has changed the graph since
    (``clean``): a pass is a function of the graph, so it would find nothing again. The round that
    confirms the fixed point then calls only the passes that ran before the last change."""
    changes = 0  # how many pass calls have changed the graph so far
    clean: dict[str, int] = {}  # pass -> ``changes`` when it last found nothing
    for _ in range(MAX_ROUNDS):
        changed = False
        present = {n.op_type for n in graph.nodes}  # the op-type index, rebuilt after each change
        for name, fn, _recurse, _level in passes:
            if SKIP_CLEAN_PASSES and clean.get(name) == changes:
                continue
            triggers = TRIGGERS.get(name)
            if triggers is not None and triggers.isdisjoint(present):
                continue
            if any(ops.isdisjoint(present) for ops in PARTNERS.get(name, ())):
                continue
            before = len(graph.nodes)
            if fn(graph):
                logger.debug("pass %s on graph %r: %d -> %d nodes", name, graph.name, before, len(graph.nodes))
                dead = True
                if SKIP_SELF_CONFIRMATION and name == "remove_dead_nodes":
                    dead = False
                    if len(graph.nodes) == before:  # unread constants only: the graph the passes read is as it was
                        clean[name] = changes
                        continue
                changed = True
                changes += 1
                present = {n.op_type for n in graph.nodes}
                if SKIP_SELF_CONFIRMATION and name in SELF_SETTLING:
                    clean[name] = changes
            else:
                clean[name] = changes
                if name == "remove_dead_nodes":
                    dead = False
        if not changed:
            break
    return dead
