"""Make the real-model corpus: small Hugging Face architectures exported by torch.onnx.export with
dynamic batch and sequence axes, as exporters write them by default, plus their inputs and
onnxruntime's outputs.

Not run by the tests (torch and transformers are no test dependencies): run it by hand with
``pip install torch==2.13.0 transformers`` in a separate environment, then commit the files:

    python tests/real_models/make_corpus.py [--out tests/real_models]

Weights are random (seeded), configurations tiny (a few hundred KB a model), so the corpus is about
the exporters' graphs (op mix, dynamic axes, shape subgraphs), not about accuracy.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
import torch

SEQ, BATCH = 12, 2
#: --size medium: closer to what applications run (hidden 256, 4 layers, sequence 128, images 224),
#: for benchmarks only (benchmarks/real_models.py --corpus DIR); not committed.
MEDIUM = False


def _bert():
    from transformers import BertConfig, BertModel

    cfg = (BertConfig(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, max_position_embeddings=256) if MEDIUM else
           BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64))
    return BertModel(cfg), ("input_ids", "attention_mask"), "ids"


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    cfg = (GPT2Config(vocab_size=1024, n_embd=256, n_layer=4, n_head=4, n_positions=256, use_cache=False) if MEDIUM
           else GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False))
    return GPT2Model(cfg), ("input_ids", "attention_mask"), "ids"


def _vit():
    from transformers import ViTConfig, ViTModel

    cfg = (ViTConfig(image_size=224, patch_size=16, num_channels=3, hidden_size=256, num_hidden_layers=4,
                     num_attention_heads=4, intermediate_size=1024) if MEDIUM else
           ViTConfig(image_size=32, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=4, intermediate_size=64))
    return ViTModel(cfg), ("pixel_values",), "image"


def _resnet():
    from transformers import ResNetConfig, ResNetModel

    cfg = (ResNetConfig(num_channels=3, embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                        layer_type="basic") if MEDIUM else
           ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"))
    return ResNetModel(cfg), ("pixel_values",), "image"


def _t5_encoder():
    from transformers import T5Config, T5EncoderModel

    cfg = (T5Config(vocab_size=1024, d_model=256, d_kv=64, d_ff=1024, num_layers=4, num_heads=4) if MEDIUM
           else T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4))
    return T5EncoderModel(cfg), ("input_ids", "attention_mask"), "ids"


MODELS = {"bert": _bert, "gpt2": _gpt2, "vit": _vit, "resnet": _resnet, "t5_encoder": _t5_encoder}


def _inputs(kind: str, names: tuple, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if kind == "image":
        side = 224 if MEDIUM else 32
        return {names[0]: rng.standard_normal((batch, 3, side, side)).astype(np.float32)}
    ids = rng.integers(0, 128, size=(batch, seq)).astype(np.int64)
    mask = np.ones((batch, seq), np.int64)
    mask[0, seq - 3:] = 0  # padding in the first row
    return {"input_ids": ids, "attention_mask": mask}


class _Wrap(torch.nn.Module):
    """The model's first output alone (last_hidden_state), from positional inputs."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args)), return_dict=True)[0]


def export(name: str, out: str, dynamo: bool) -> str:
    import onnxruntime as ort

    torch.manual_seed(0)
    model, names, kind = MODELS[name]()
    model.eval()
    rng = np.random.default_rng(0)
    feeds = _inputs(kind, names, 1 if MEDIUM else BATCH, 128 if MEDIUM else SEQ, rng)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    axes = {n: ({0: "batch"} if kind == "image" else {0: "batch", 1: "sequence"}) for n in names}
    tag = "dynamo" if dynamo else "ts"
    path = os.path.join(out, f"{name}_{tag}.onnx")
    wrapped = _Wrap(model, names)
    if dynamo:
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("sequence", min=2, max=64)
        shapes = {"args": tuple({0: batch} if kind == "image" else {0: batch, 1: seq} for _ in names)}
        prog = torch.onnx.export(wrapped, args, dynamo=True, input_names=list(names), output_names=["output"],
                                 dynamic_shapes=shapes, opset_version=18)
        prog.save(path)
    else:
        torch.onnx.export(wrapped, args, path, dynamo=False, input_names=list(names), output_names=["output"],
                          dynamic_axes={**axes, "output": {0: "batch"}}, opset_version=17)
    proto = onnx.load(path)
    proto.ir_version = min(proto.ir_version, 10)  # onnxruntime 1.31-1.32 refuse IR 11+
    onnx.save(proto, path)
    # Two signatures: the export shape and another one, so dynamic axes are really exercised.
    other = _inputs(kind, names, 1, (64 if MEDIUM else SEQ + 5), np.random.default_rng(1))
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    np.savez(path[:-5] + ".npz", **{f"a.{k}": v for k, v in feeds.items()}, **{f"b.{k}": v for k, v in other.items()},
             **{"a.__output": sess.run(None, feeds)[0], "b.__output": sess.run(None, other)[0]})
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--size", choices=("tiny", "medium"), default="tiny",
                   help="tiny (committed, for tests) or medium (for benchmarks; write it elsewhere with --out)")
    args = p.parse_args()
    global MEDIUM
    MEDIUM = args.size == "medium"
    os.makedirs(args.out, exist_ok=True)
    for name in args.models.split(","):
        for dynamo in (False, True):
            try:
                path = export(name, args.out, dynamo)
                print(f"{path}: {os.path.getsize(path) // 1024} KiB")
            except Exception as exc:  # noqa: BLE001 - one exporter failing must not stop the rest
                print(f"{name} dynamo={dynamo}: {type(exc).__name__}: {str(exc)[:300]}")


if __name__ == "__main__":
    main()
