"""The benchmark script (benchmarks/bench.py) as a user runs it: one small model timed against
onnxruntime, its JSON report, and the machine-noise figure (hypervisor steal) it reports."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime", reason="the benchmark compares with onnxruntime (a test extra)")

_BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


def _load_bench():
    sys.path.insert(0, str(_BENCH_DIR))  # bench.py imports its sibling models.py
    try:
        spec = importlib.util.spec_from_file_location("onnxhal_bench_script", _BENCH_DIR / "bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(_BENCH_DIR))


bench = _load_bench()


def test_steal_ticks_read_from_proc_stat():
    ticks = bench.cpu_steal_ticks()
    if not Path("/proc/stat").exists():
        assert ticks is None
        return
    steal, total = ticks
    assert 0 <= steal <= total and total > 0


def test_benchmark_reports_ratio_pairs_and_steal(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["--models", "mlp", "--repeat", "3", "--warmup", "1", "--json", str(out)])
    (row,) = json.loads(out.read_text())
    assert row["model"] == "mlp" and row["nodes"] > 0
    assert row["ort_ms"] > 0 and row["onnxhal_ms"] > 0
    assert row["ratio"] == pytest.approx(row["onnxhal_ms"] / row["ort_ms"])
    assert row["pair_q1"] <= row["pair_ratio"] <= row["pair_q3"]
    assert row["max_abs_diff"] < 1e-3  # both runtimes computed the same MLP
    if Path("/proc/stat").exists():
        assert 0.0 <= row["steal_pct"] <= 100.0
    else:
        assert math.isnan(row["steal_pct"])
