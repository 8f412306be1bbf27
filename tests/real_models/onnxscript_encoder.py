"""The onnxscript source of the corpus's ``osc_encoder`` (make_corpus.py's ``onnxscript`` group):
two pre-norm transformer blocks over token vectors, each block, its layer norm, its tanh GELU and
its single-head attention a model-local function of domain ``corpus.local``. A module of its own
because onnxscript reads a function's type annotations from its module's globals."""

from onnxscript import FLOAT, script
from onnxscript import opset18 as op
from onnxscript.values import Opset

local = Opset("corpus.local", 1)


@script(local)
def gelu_tanh(x):
    return 0.5 * x * (1.0 + op.Tanh(0.7978846 * (x + 0.044715 * x * x * x)))


@script(local)
def layer_norm(x, scale, bias):
    d = x - op.ReduceMean(x, [-1], keepdims=1)
    return d / op.Sqrt(op.ReduceMean(d * d, [-1], keepdims=1) + 1e-5) * scale + bias


@script(local)
def attention(x, wq, wk, wv, wo):
    q, k, v = op.MatMul(x, wq), op.MatMul(x, wk), op.MatMul(x, wv)
    scores = op.MatMul(q, op.Transpose(k, perm=[0, 2, 1])) * 0.25  # 1 / sqrt(16)
    return op.MatMul(op.MatMul(op.Softmax(scores, axis=-1), v), wo)


@script(local)
def block(x, s1, b1, wq, wk, wv, wo, s2, b2, w1, c1, w2, c2):
    h = x + attention(layer_norm(x, s1, b1), wq, wk, wv, wo)
    return h + op.MatMul(gelu_tanh(op.MatMul(layer_norm(h, s2, b2), w1) + c1), w2) + c2


@script()
def osc_encoder(tokens: FLOAT["batch", "sequence", 16],  # noqa: F821 - onnxscript's symbolic dimensions
                s1a: FLOAT[16], b1a: FLOAT[16], wqa: FLOAT[16, 16], wka: FLOAT[16, 16], wva: FLOAT[16, 16],
                woa: FLOAT[16, 16], s2a: FLOAT[16], b2a: FLOAT[16], w1a: FLOAT[16, 32], c1a: FLOAT[32],
                w2a: FLOAT[32, 16], c2a: FLOAT[16],
                s1b: FLOAT[16], b1b: FLOAT[16], wqb: FLOAT[16, 16], wkb: FLOAT[16, 16], wvb: FLOAT[16, 16],
                wob: FLOAT[16, 16], s2b: FLOAT[16], b2b: FLOAT[16], w1b: FLOAT[16, 32], c1b: FLOAT[32],
                w2b: FLOAT[32, 16], c2b: FLOAT[16]) -> FLOAT["batch", "sequence", 16]:  # noqa: F821
    h = block(tokens, s1a, b1a, wqa, wka, wva, woa, s2a, b2a, w1a, c1a, w2a, c2a)
    return block(h, s1b, b1b, wqb, wkb, wvb, wob, s2b, b2b, w1b, c1b, w2b, c2b)
