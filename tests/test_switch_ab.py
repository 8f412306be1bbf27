"""benchmarks/switch_ab.py: which corpus models its patterns pick, and its refusal of a switch that
does not exist (before any session is built). The A/B itself is a benchmark, not a test."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import benchmark_script

pytest.importorskip("onnxruntime", reason="the benchmark compares with onnxruntime (a test extra)")


@pytest.fixture(scope="module")
def switch_ab():
    with benchmark_script("switch_ab") as module:
        yield module


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
