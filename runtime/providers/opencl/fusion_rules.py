"""The plan builder's fusion rules, by name, and the provider option that turns them off.

Each rule is a pattern ``plan_builder`` folds into fewer launches, with the condition that selects
it in the builder's code under the same name. Turning a rule off (provider option
``disable_fusions="attention,gemm_residual"``) lowers the same nodes one launch (or family) each,
which is what the tests compare a fused plan against.
"""

from __future__ import annotations

from onnxhal.hal.errors import InvalidArgument

DISABLE_FUSIONS_OPTION = "disable_fusions"

#: name -> what it folds (and into what).
FUSION_RULES: dict[str, str] = {
    "gemm_bias": "an Add of a constant row vector, sole reader of a MatMul/Gemm, into its epilogue",
    "gemm_activation": "an activation, sole reader of a MatMul/Gemm/Conv (after its bias), into its epilogue",
    "gemm_residual": "an Add of a same-shape value computed earlier, sole reader of a MatMul/Gemm without "
                     "activation, into its epilogue",
    "gemm_elementwise": "an elementwise tree whose only varying input is a MatMul/Gemm result without activation "
                        "(scalar constants otherwise), sole reader of it, into its epilogue",
    "gemm_norm": "a LayerNormalization over the last axis of a row-major GEMM's result (bias, residual and "
                 "activation applied), or rule rms_norm's kernel, right after the GEMM, into the GEMM's launch: a "
                 "work-item computes whole rows (at most 16 column panels) and normalises them (gemm_norm_fusion)",
    "conv_pad": "a Conv's zero padding (the pad_planes copy before an implicit-GEMM Conv) into the Conv's "
                "reads, as bounds checks",
    "conv_row_pairs": "an im2col + GEMM Conv whose output rows hold 7 or 8 values into one implicit-GEMM launch "
                      "computing two rows a vector (needs conv_pad)",
    "conv_wide_tile": "two 16-position panels of an implicit-GEMM Conv into one work-item sharing each weight "
                      "load (a kernel choice rather than a fusion, switchable as the rules are)",
    "conv_phases": "a row-vector implicit-GEMM Conv of horizontal stride 2 (dilation 1, kernel rows of 5 or more, "
                   "8 M multiply-adds or more: a 7x7 stem) reading a copy of its zero-padded input with each row "
                   "split into even and odd columns (pad_phases), one vector load a tap where it took two and a "
                   "shuffle (a kernel choice, needs conv_pad)",
    "conv_lanes": "a Conv with constant weights, output channels a multiple of 32 and at least 8 input channels per "
                  "group and output rows a "
                  "multiple of 14 up to 112 computed with the output channels in the vector lanes (32 channels x 14 "
                  "positions a work-item) where the other forms put positions there (a "
                  "kernel choice, switchable as the rules are)",
    "conv_dead_taps": "a Conv with constant weights whose first or last taps on a spatial axis read only padding "
                      "for every output (cpu.kernels.dead_taps.trim: a dilated or large kernel over a small plane) "
                      "computed with the weight cut to its live taps and the pads moved with them (a kernel "
                      "choice, switchable as the rules are)",
    "conv_lanes_row_pairs": "conv_lanes for output rows of 7 (a ResNet's last stage), two whole rows a work-item, "
                            "in place of conv_rows2 or im2col + GEMM (a kernel choice, needs conv_lanes)",
    "conv_lanes_weight_chunks": "a conv_lanes_row_pairs Conv of several row tiles and at least 8 channel blocks: a "
                                "work-item runs one channel block over every row tile, a chunk of input channels "
                                "at a time (its weights read once for all the tiles; a kernel choice)",
    "conv_lanes_row_stores": "a conv_lanes Conv stores each output channel's positions of a tile as a run of "
                             "vectors (the tile transposed in registers) where it stored a scalar a lane, and "
                             "reads its residual the same way (a kernel choice)",
    "conv_lanes_unpadded": "a conv_lanes Conv without padding reads its input in place, without the pad_planes "
                           "copy",
    "conv_lanes_padded_output": "a conv_lanes Conv (one row tile a work-item) whose output only a padded "
                                "conv_lanes Conv reads writes the interior of that Conv's zero-padded planes "
                                "(zeroed once), which it reads without the pad_planes copy",
    "conv_lanes_padded_pairs": "conv_lanes_padded_output for row-pair conv_lanes Convs (conv_lanes_r7x2_*, chunked "
                               "or not: a ResNet's 7x7 stage) as producers and residual readers: a tile's two rows "
                               "stored as a run of 7 each (needs conv_lanes_padded_output)",
    "conv_lanes_padded_input": "conv_lanes_padded_output where the value is also read as the input of an "
                               "unpadded 1x1 conv_lanes Conv (a ResNet stage's downsample), which reads the "
                               "interior of the padded planes from an offset (needs conv_lanes_padded_output)",
    "conv_lanes_k3": "a conv_lanes Conv with kernel rows of 3 taps and output rows of 14 or more runs the kernel "
                     "with its tap loop unrolled at compile time (a kernel choice, needs conv_lanes)",
    "conv_lanes_weight_order": "a conv_lanes Conv whose weights outweigh its input planes walks the row tiles of "
                               "one channel block on consecutive work-items (its weights stay in cache) rather "
                               "than the channel blocks of one row tile (a kernel choice)",
    "conv_lanes_downsample": "a 1x1 conv_lanes Conv (one group, no activation) whose output only a later "
                             "conv_lanes Conv reads, as its residual, with the same output channels and plane (a "
                             "ResNet stage's downsample) computed in that Conv's launch, into its accumulators after "
                             "its taps (the biases summed): no launch, buffer or residual read of its own",
    "conv_flat": "a Conv with constant weights that would run as im2col + GEMM (rows that fill no 16-wide panel, "
                 "strides above 2) and takes at most CONV_FLAT_MAX_MACS multiply-adds, as one implicit-GEMM launch "
                 "whose 16 lanes are consecutive positions of the flattened output plane, each gathering its input "
                 "(conv_flat; a small plane's rows of 4 fill the vector)",
    "conv_siblings": "a later Conv of a conv_flat Conv's input (constant weights, one group, no residual) with its "
                     "output plane and strides whose taps all read where the first's do (a 1x1 downsample beside "
                     "a 3x3 Conv), in the same conv_flat launch: its weights placed in the first's kernel grid, "
                     "its channel blocks storing its own output (needs conv_flat)",
    "gemm_wide_tile": "two 16-column panels of a GEMM into one work-item sharing each load of A (a kernel choice, "
                      "switchable as the rules are)",
    "pool_rows": "a MaxPool computed a row of outputs per work-item (a kernel choice, switchable as the rules "
                 "are)",
    "pool_padded_output": "conv_lanes_padded_output for a value a pool_rows MaxPool writes (a ResNet's stem pool): "
                          "the pool writes the interior of the padded planes its conv_lanes readers read (needs "
                          "conv_lanes_padded_output)",
    "pool_row_vectors": "a pool_rows MaxPool of horizontal stride 1 or 2 computed 8 outputs a vector where the "
                        "windows lie inside the row (a kernel choice, switchable as the rules are)",
    "host_islands": "a partition without GEMM-family nodes whose inputs all come from nodes on another EP and whose "
                    "outputs only they read (a piece of a host chain) left to the host: no copies in and out, no "
                    "wait (the OpenCL EP only; cost_rule.host_island)",
    "claim_trial": "a static partition the cost rule's formula claims by less than 10x timed at claim on the host "
                   "and the device, alternating, and left to the host where the host wins by 20% (the OpenCL EP "
                   "only; claim_trial.py)",
    "shape_only_outputs": "a partition output read outside only by Shape/Size: written by no launch, so its "
                          "producer fuses as an intermediate (a head-split Transpose into attention)",
    "shape_values": "small integer computations on tensor shapes (Shape, Size, Gather, Concat, ... of shapes and "
                    "constants) claimed with the partition and computed on the host at its specialisation, so they "
                    "cut no partition and a Reshape's target is a constant of the plan",
    "shape_tensors": "values of any size computed from tensor shapes and constants alone (position ids: Range, "
                     "Expand, GatherElements of a constant table; causal masks) claimed with the partition and "
                     "computed on the host at its specialisation, as rule shape_values does (needs shape_values)",
    "norm_gelu_ops": "SkipLayerNormalization, BiasGelu, FastGelu, Gelu (com.microsoft) and InstanceNormalization "
                     "claimed (a claiming rule; norm_lowering.py): off, they run on the next EP, as before they had "
                     "kernels",
    "pad_resize_ops": "Pad (constant, edge, reflect) and Resize (nearest, linear; the last two axes) claimed (a "
                      "claiming rule; pad_resize_lowering.py): off, they run on the next EP",
    "opset23_ops": "Sin, Cos, RMSNormalization and RotaryEmbedding (opset 23, no position_ids) claimed (a claiming "
                   "rule; opset23_lowering.py): off, they run on the next EP, as before they had kernels",
    "typed_values": "int64, int32 and bool values claimed where their op has a kernel for them (a claiming rule): "
                    "Cast, comparisons, And/Or/Xor/Not, Where and integer Add/Sub/Mul/Neg in the fused elementwise "
                    "kernels, their views, Expand, and Gather by indices that are constants of the plan, so an "
                    "attention mask built from attention_mask's values joins the partition (needs a device with "
                    "64-bit integers)",
    "transpose_operand": "a Transpose read only by batched MatMuls into their operand strides",
    "transpose_store": "a Transpose, sole reader of a batched MatMul, into its store pattern",
    "layernorm_prologue": "a fused elementwise tree read only by a LayerNormalization into the LayerNorm's kernel",
    "layernorm_prologue_stored": "layernorm_prologue for a tree that nodes lowered after the LayerNorm also read "
                                 "(pre-norm embeddings: the sum is the first residual): the LayerNorm's kernel stores "
                                 "the tree's values for them too (needs layernorm_prologue)",
    "elementwise": "trees of elementwise nodes into one generated kernel",
    "qkv_projection": "MatMuls of one input by constant weights, each read by a head split, into one GEMM by the "
                      "concatenated weights (attention reads the parts in place)",
    "rms_norm": "T5's LayerNorm as exported, x * (1 / sqrt(ReduceMean(x^2 over the last axis) + eps)) (Pow or "
                "Mul, ReduceMean, Add, Sqrt, Div or Reciprocal, Mul; or x / Sqrt(...)) and an optional constant "
                "weight Mul, into one row kernel",
    "head_split_in_place": "a Transpose of a head split (Reshape) of one part of a Split or of a merged projection "
                           "(qkv_projection) that attention does not read: the Transpose reads the part where it "
                           "was computed, which gets no copy of its own",
    "concat_in_place": "a Transpose or Expand whose only reader is a Concat writes its slot of the Concat's "
                       "output, where the Concat would copy it there",
    "transpose_elementwise": "a Transpose read only by a fused elementwise tree of its shape into that tree's "
                             "reads (strides of the Transpose's input)",
    "expand_elementwise": "an Expand read only by fused elementwise trees of its shape into those trees' reads "
                          "(broadcast strides of its input): no launch of its own",
    "attention_view_chain": "Reshapes and Transposes (at least one Transpose) between attention and a contiguous "
                            "value, a Split's part or a merged projection's part, each read only by the next, "
                            "into the attention kernel's strides where each Reshape keeps a strided view (dynamo "
                            "exports' K head split transposed, reshaped to 3-D and transposed again; needs "
                            "attention)",
    "attention_select_mask": "a Where between two scalar constants by a bool condition, read only as attention's "
                             "additive mask, into the attention kernel, which reads the condition and selects "
                             "the constant per score (needs attention)",
    "gather_elementwise": "a Gather along axis 0 of float32 rows by indices read at run time, read only by fused "
                          "elementwise trees (a LayerNorm's prologue among them, directly or through views), into "
                          "those trees' reads as rows of its source: no launch of its own",
    "take_elementwise": "a Gather or GatherND by constant indices of integer or bool elements read only by fused "
                        "elementwise trees (directly or through views) into those trees' reads, through its table of "
                        "flat source indices: no launch of its own (needs typed_values)",
    "attention": "scaled dot-product attention (MatMul, optional scale/mask Add, Softmax, optional ReplaceNaN, "
                 "MatMul, with the Transposes around it) into one kernel",
}


def parse_disabled(text: str | None) -> frozenset[str]:
    """The rule names of a ``disable_fusions`` option value (comma-separated; "" for none)."""
    names = frozenset(filter(None, (s.strip() for s in (text or "").split(","))))
    unknown = sorted(names - FUSION_RULES.keys())
    if unknown:
        raise InvalidArgument(f"OpenCLExecutionProvider provider option {DISABLE_FUSIONS_OPTION}={text!r}: unknown "
                              f"rule(s) {unknown}; expected names among {sorted(FUSION_RULES)}")
    return names
