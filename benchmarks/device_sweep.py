"""The device sweep over the committed corpus: every model of tests/real_models x every shipped
profile x {onnxhal, onnxruntime via the plugin} x {as exported, dims fixed} (``onnxhal sweep`` does the
work; docs/device-sweep.md has the rule, the verdicts and the latest figures).

    python benchmarks/device_sweep.py [--models a,b] [--profiles p,q] [--runtimes onnxhal,onnxruntime]
                                      [-j N] [--shard I/N] [--junit FILE] [--json FILE] [--report FILE.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "real_models"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(ROOT))
    from onnxhal.errors import OrtError
    from onnxhal.sweep import add_arguments, run

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--corpus", default=str(CORPUS), help="folder of MODEL.onnx + MODEL.npz (default: the test corpus)")
    p.add_argument("--names", "--models", dest="names", default="",
                   help="comma-separated model names in the corpus (default: every model with a MODEL.npz)")
    args = p.parse_args(argv)
    corpus = Path(args.corpus)
    names = [n for n in args.names.split(",") if n] or sorted(
        x.stem for x in corpus.glob("*.onnx") if x.with_suffix(".npz").exists())
    args.models = [str(corpus / f"{n}.onnx") for n in names]
    try:
        return run(args)
    except OrtError as e:
        print(f"device_sweep: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
