"""Extended-level fusions of ai.onnx.ml nodes into ``com.onnxhal`` operators (CPU kernels in
cpu/kernels/ml_linear.py).

- ``fuse_classifier_normalizer``: LinearClassifier whose probabilities only a Normalizer reads ->
  ``com.onnxhal`` FusedLinearClassifier (the classifier's attributes and the Normalizer's
  ``norm``). skl2onnx ends every linear classifier so (an L1 Normalizer after the SOFTMAX
  scores); on its 16-row exports the two kernels cost 5-6 us a run against onnxruntime's whole run
  of 4-8 us, and one kernel skips a call and, after a softmax, the Normalizer's abs and zero test.
"""

from __future__ import annotations

from onnxhal.hal.graph import Graph
from onnxhal.runtime.optimizer.rewrite import FUSED_DOMAIN, live_nodes, make_node, replace_nodes, sole_consumer

ML = "ai.onnx.ml"


def fuse_classifier_normalizer(graph: Graph) -> bool:
    """LinearClassifier -> Normalizer of its scores (read by nothing else) as one node."""
    changed = False
    for clf in live_nodes(graph, "LinearClassifier"):
        if clf.op_type != "LinearClassifier" or clf.domain != ML or len(clf.outputs) != 2 or not clf.outputs[1]:
            continue
        norm = sole_consumer(graph, clf.outputs[1])
        if norm is None or norm.op_type != "Normalizer" or norm.domain != ML or norm.inputs[0] != clf.outputs[1] \
                or norm.attr("norm", "MAX") not in ("MAX", "L1", "L2"):
            continue
        fused = make_node(graph, "FusedLinearClassifier", clf.inputs, [clf.outputs[0], norm.outputs[0]],
                          name=f"{clf.name or clf.outputs[0]}_normalized", domain=FUSED_DOMAIN,
                          norm=norm.attr("norm", "MAX"))
        fused.attribute_protos.update(clf.attribute_protos)
        fused.attributes.update(clf.attributes)
        replace_nodes(graph, [clf, norm], [fused])
        changed = True
    return changed
