"""A dropped session is freed by reference counting: nothing of it is left in a reference cycle
for Python's garbage collector, which would otherwise walk and free it during some later
allocation (another session's creation, in a long process), keeping its weights alive until then.

The cycles that were there: kernels keeping their bound ``apply`` as ``inline_fn`` (``INLINE_APPLY``),
or another bound method; the generated plan and run functions in their own globals; kernels keeping
their creation context, which reached the plan builder, which kept the kernels (``take_kernels``);
subgraphs and their parent graphs (If/Loop/Scan): a subgraph now refers to its parent weakly."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import onnxhal
from onnxhal.hal.ep import INLINE_APPLY
from onnxhal.runtime.providers.cpu.kernels.shape_ops import Gather, Unsqueeze
from onnxhal.stored_outputs import read_signatures

CORPUS = os.path.join(os.path.dirname(__file__), "real_models")
#: Models whose sessions held each kind of cycle: Unsqueeze/Gather/Slice and LayerNormalization
#: (hf_mpnet), FusedConv's creation context (resnet_dynamo), the ML kernels' bound methods
#: (sk_binarized: FusedLinearClassifier's softmax + L1, Normalizer, Binarizer; sk_forest_binary:
#: the tree classifier's signed leaf bits; sk_kbins: ArrayFeatureExtractor, OneHotEncoder;
#: sk_ordinal: LabelEncoder; sk_imputer: Scaler), a subgraph's parent graph and node (vad_if_loop_ts:
#: If and Loop; tv_ssdlite: NonMaxSuppression in an If).
MODELS = ["hf_mpnet", "resnet_dynamo", "sk_binarized", "sk_forest_binary", "sk_kbins", "sk_ordinal", "sk_imputer",
          "vad_if_loop_ts", "tv_ssdlite"]


def _left_in_cycles(path: str, feeds: dict) -> list[str]:
    """The onnxhal objects the collector finds after a session of ``path`` is dropped."""
    session = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    gc.collect()  # what earlier code left, so that only the session's own count
    del session
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        return sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                       if type(o).__module__.startswith("onnxhal")
                       or getattr(o, "__module__", "") and str(getattr(o, "__module__", "")).startswith("onnxhal")})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


@pytest.mark.parametrize("name", MODELS)
def test_a_dropped_session_leaves_no_cycle(name):
    path = os.path.join(CORPUS, f"{name}.onnx")
    feeds = read_signatures(path)["a"][0]
    assert _left_in_cycles(path, feeds) == []


def test_the_collector_would_find_a_cycle():
    """The check above can fail: a kernel keeping its bound method is found."""
    class Holder:
        def __init__(self) -> None:
            self.fn = self.apply

        def apply(self) -> None:
            pass

    Holder.__module__ = "onnxhal.test_double"
    gc.collect()
    Holder()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        assert any(type(o) is Holder for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_inline_apply_is_the_bound_apply_not_kept():
    node = onnxhal.hal.Node("Gather", ["x", "i"], ["y"])
    kernel = Gather(node, None)
    assert Gather.inline_fn is INLINE_APPLY and "inline_fn" not in vars(kernel)
    fn = kernel.inline_fn
    assert fn.__self__ is kernel and fn.__func__ is Gather.apply
    x, i = np.arange(12.0).reshape(3, 4), np.array([2, 0])
    np.testing.assert_array_equal(fn(x, i), kernel.compute([x, i])[0])
    assert Unsqueeze.inline_fn is INLINE_APPLY


def _created_cycles(path: str, feeds: dict) -> list[str]:
    """What the collector finds of a session's creation and first run (any type: protobuf classes
    too), the session itself kept."""
    onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)  # process caches
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        session = onnxhal.InferenceSession(path, providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        gc.collect()
        return sorted({f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


#: a single-graph model (shape inference's values read by ``guarded_inference._graph_values``), a
#: tree ensemble, model-local functions (``_check_no_recursion``), If and Loop subgraphs
CREATED = ["sk_tree", "skh_adaboost", "hf_mpnet", "osc_encoder", "vad_if_loop_ts"]


@pytest.mark.parametrize("name", CREATED)
def test_creating_a_session_leaves_no_cycle(name):
    """A session's creation makes no reference cycle for the collector to walk and free during a
    later allocation: each session's inference parse made six protobuf message classes again and
    dropped them as cycles (now held for the process), and recursive closures were cycles too."""
    path = os.path.join(CORPUS, f"{name}.onnx")
    feeds = read_signatures(path)["a"][0]
    assert _created_cycles(path, feeds) == []
