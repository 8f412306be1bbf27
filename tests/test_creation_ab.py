"""benchmarks/creation_ab.py: one round on a small corpus model prints its row and the summary with
the load average, and a switch that does not exist is refused by name before any session is built.
The A/B itself is a benchmark, not a test."""

from __future__ import annotations

import pytest

from tests.benchmark_scripts import benchmark_script

pytest.importorskip("onnxruntime", reason="the benchmark compares with onnxruntime (a test extra)")


@pytest.fixture(scope="module")
def creation_ab():
    with benchmark_script("creation_ab") as module:
        yield module


def test_one_round_prints_the_model_and_the_summary(creation_ab, capsys):
    from onnxhal.runtime.providers.cpu.kernels import ml_trees

    assert creation_ab.main(["--switch", "ml_trees.NATIVE_BUILD", "--models", "sk_tree", "--rounds", "1"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("sk_tree "))
    assert len(row.split()) == 6 and all(float(v) > 0 for v in row.split()[1:])
    assert "over 1 models" in out and "load average" in out
    assert ml_trees.NATIVE_BUILD is True  # restored


def test_an_unknown_switch_is_refused_by_name(creation_ab, capsys):
    with pytest.raises(SystemExit):
        creation_ab.main(["--switch", "ml_trees.NO_SUCH_SWITCH", "--models", "sk_tree"])
    assert "NO_SUCH_SWITCH" in capsys.readouterr().err


def test_a_full_onnxhal_path_names_a_switch_outside_the_kernels(creation_ab, capsys):
    from onnxhal.runtime.loader import ml_shapes

    assert creation_ab.main(["--switch", "onnxhal.runtime.loader.ml_shapes.INFER_DOWNSTREAM",
                             "--models", "sk_onehot", "--rounds", "1"]) == 0
    assert any(line.startswith("sk_onehot ") for line in capsys.readouterr().out.splitlines())
    assert ml_shapes.INFER_DOWNSTREAM is True  # restored
    with pytest.raises(SystemExit):
        creation_ab.main(["--switch", "onnxhal.runtime.loader.ml_shapes.NO_SUCH_SWITCH", "--models", "sk_onehot"])
    assert "NO_SUCH_SWITCH" in capsys.readouterr().err
