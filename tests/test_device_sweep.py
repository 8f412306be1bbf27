"""A quick subset of the device sweep (benchmarks/device_sweep.py, run whole before a release): real
models of each family on an NPU and a GPU profile, in onnxhal's sessions and inside onnxruntime, as
exported and with dims fixed. Every cell matches within the profile's tolerance or declines with a
reason: never an error, a crash, or a silent mismatch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
import onnxruntime  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
#: A CNN, a 1-D conv net (NHWC on the NPU inside onnxruntime), fixed-shape transformers on the GPU,
#: dynamic and static quantization, a classifier with ZipMap, tree GEMMs whose output is declared with a
#: wrong batch.
MODELS = ["resnet_ts", "gpt2_ts", "bert_ts", "whisper_encoder_ts", "vad_if_loop_ts", "bert_ts_qdyn", "cnn_ts_qstatic", "resnet_ts_qdq",
          "sk_logreg_zipmap", "hb_gemm"]
RUNTIMES = "onnxhal,onnxruntime" if tuple(int(x) for x in onnxruntime.__version__.split(".")[:2]) >= (1, 24) \
    else "onnxhal"  # virtual devices inside onnxruntime need 1.24


def test_quick_sweep_has_no_failed_cell(tmp_path):
    out = tmp_path / "cells.json"
    done = subprocess.run([sys.executable, "benchmarks/device_sweep.py", "--models", ",".join(MODELS),
                           "--profiles", "generic-npu,integrated-gpu", "--runtimes", RUNTIMES, "--timeout", "120",
                           "--json", str(out), "--junit", str(tmp_path / "sweep.xml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    cells = json.loads(out.read_text())
    assert len(cells) == len(MODELS) * 2 * 2 * len(RUNTIMES.split(",")), done.stdout[-3000:]
    failed = [c for c in cells if c["status"] not in ("match", "declined")]
    assert not failed, "\n".join(f"{c['runtime']} {c['profile']} {c['model']} {c['shapes']}: {c['status']}: "
                                 f"{c.get('detail', '')[:300]}" for c in failed)
    assert done.returncode == 0, done.stdout[-3000:]
    assert any(c["status"] == "match" and c["device_nodes"] > 0 for c in cells)
    for c in cells:
        if c["status"] == "declined":
            assert c["detail"], c  # a decline names its reason
    assert (tmp_path / "sweep.xml").read_text().count("<testcase") == len(cells)
