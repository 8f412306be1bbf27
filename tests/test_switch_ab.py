"""benchmarks/switch_ab.py: which corpus models its patterns pick, and its refusal of a switch that
does not exist (before any session is built). The A/B itself is a benchmark, not a test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="the benchmark compares with onnxruntime (a test extra)")

_BENCH_DIR = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def switch_ab():
    sys.path.insert(0, str(_BENCH_DIR))  # it imports its sibling real_models.py
    try:
        spec = importlib.util.spec_from_file_location("onnxhal_switch_ab", _BENCH_DIR / "switch_ab.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(_BENCH_DIR))


def test_patterns_pick_corpus_models(switch_ab, tmp_path):
    for name in ("tv_vgg", "tv_swin", "resnet_ts", "bert_ts"):
        (tmp_path / f"{name}.onnx").write_bytes(b"")
    (tmp_path / "tv_vgg.npz").write_bytes(b"")
    assert switch_ab.corpus_models("tv_*, resnet_ts", str(tmp_path)) == ["resnet_ts", "tv_swin", "tv_vgg"]
    assert switch_ab.corpus_models("gpt*", str(tmp_path)) == []


def test_an_unknown_switch_is_refused_by_name(switch_ab, capsys):
    with pytest.raises(SystemExit):
        switch_ab.main(["--switch", "fused_conv.NO_SUCH_SWITCH", "--models", "tv_vgg"])
    assert "NO_SUCH_SWITCH" in capsys.readouterr().err
