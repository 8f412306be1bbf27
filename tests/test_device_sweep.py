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
#: wrong batch, an audio front end whose STFT onnx's inference leaves without a shape (spox).
MODELS = ["resnet_ts", "gpt2_ts", "bert_ts", "whisper_encoder_ts", "vad_if_loop_ts", "bert_ts_qdyn", "cnn_ts_qstatic", "resnet_ts_qdq",
          "sk_logreg_zipmap", "hb_gemm", "spx_logmel"]
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


def test_the_host_backend_runs_the_untuned_models_that_broke_it(tmp_path):
    """Without an OpenCL driver (ONNXHAL_OPENCL=off: the simulators' host backend), ShuffleNetV2 on
    the NPU profiles reduced every axis of its head's ReduceMean (a remade node lost its schema
    version) and Swin on intel-gpu fed a scalar shape value as a 1-element tensor; both failed.
    MobileViT (its patch-size chain: Div, Ceil and Mul of a scalar on the device) failed as exported
    on every profile: the host backend's partitions gave a 0-d output back as a 1-element tensor,
    and the Unsqueeze/Concat after it made a shape of the wrong rank."""
    import os

    out = tmp_path / "cells.json"
    done = subprocess.run([sys.executable, "benchmarks/device_sweep.py", "--models", "tv_shufflenet,tv_swin,hf_mobilevit",
                           "--profiles", "generic-npu,intel-gpu", "--runtimes", "onnxhal", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "ONNXHAL_OPENCL": "off"})
    cells = json.loads(out.read_text())
    assert len(cells) == 12, done.stdout[-3000:]
    failed = [f"{c['profile']} {c['model']} {c['shapes']}: {c.get('detail', '')[:300]}" for c in cells
              if c["status"] not in ("match", "declined")]
    assert not failed, failed
    assert sum(c["status"] == "match" for c in cells) >= 8, cells


def _demo_model(tmp_path) -> Path:
    import onnx

    from onnxhal.demo_models import demo_model

    path = tmp_path / "model.onnx"
    onnx.save(demo_model(), path)
    return path


def test_onnxhal_sweep_runs_any_model_against_onnxruntime_and_writes_a_report(tmp_path):
    """A model with no stored outputs: random inputs, onnxruntime's CPU EP as the judge, a report."""
    model = _demo_model(tmp_path)
    done = subprocess.run([sys.executable, "-m", "onnxhal", "sweep", str(model), "--profiles", "generic-npu",
                           "--runtimes", RUNTIMES, "-j", "2", "--json", str(tmp_path / "cells.json"),
                           "--report", str(tmp_path / "report.md"), "--pictures", str(tmp_path / "pictures")],
                          cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    cells = json.loads((tmp_path / "cells.json").read_text())
    assert len(cells) == 2 * len(RUNTIMES.split(",")) and {c["status"] for c in cells} == {"match"}
    report = (tmp_path / "report.md").read_text()
    assert "## model" in report and "| onnxhal | generic-npu | fixed | match |" in report
    assert all(c["sim_ms"] > 0 and c["sim_mj"] > 0 for c in cells if c["runtime"] == "onnxhal")  # simulated cost
    drawn = sorted(p.name for p in (tmp_path / "pictures").glob("*.svg"))
    assert drawn == ["model-generic-npu-exported.svg", "model-generic-npu-fixed.svg"]
    assert "(pictures/model-generic-npu-fixed.svg)" in report and "<svg" in (tmp_path / "pictures" / drawn[1]).read_text()


def test_a_failing_device_fails_its_cells_and_the_exit_code(tmp_path):
    """A profile whose compiles fail: the CPU EP takes over, which the sweep counts as the device's
    failure (the application asked for the device), and exits 1 naming the cells."""
    from onnxhal.simulators.profiles import resolve_profile_path

    text = resolve_profile_path("generic-gpu").read_text().replace('name = "generic-gpu"', 'name = "broken-gpu"')
    profile = tmp_path / "broken-gpu.toml"
    profile.write_text(text + "\n[faults]\ncompile_fail = true\n")
    done = subprocess.run([sys.executable, "-m", "onnxhal", "sweep", str(_demo_model(tmp_path)), "--profiles",
                           str(profile), "--runtimes", "onnxhal", "--json", str(tmp_path / "cells.json")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    cells = json.loads((tmp_path / "cells.json").read_text())
    assert [c["status"] for c in cells] == ["error", "error"], cells
    assert "cells failed" in done.stderr


def test_the_report_gives_each_kind_of_decline_with_its_remedy(tmp_path):
    """A model with a symbolic batch on a static-shape NPU: declined, and the report says how to fix it."""
    import onnx

    model = onnx.load(_demo_model(tmp_path))
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, tmp_path / "dynamic.onnx")
    done = subprocess.run([sys.executable, "-m", "onnxhal", "sweep", str(tmp_path / "dynamic.onnx"), "--profiles",
                           "generic-npu", "--runtimes", "onnxhal", "--shapes", "exported", "--report",
                           str(tmp_path / "report.md"), "--quiet"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    row = next(x for x in (tmp_path / "report.md").read_text().splitlines()
               if x.startswith("| onnxhal | generic-npu | exported"))
    assert "| declined |" in row and "onnxhal fix-shapes dynamic.onnx --dim batch=N" in row, row


def test_an_if_a_device_claims_inside_onnxruntime_stays_with_onnxruntime(tmp_path):
    """intel-gpu claims SSDlite's If (NonMaxSuppression in its else branch) in onnxhal's sessions;
    inside onnxruntime the If's subgraphs do not cross the bridge, and the claim made onnxruntime's
    compile fail ('NoneType' has no 'input_names'). The bridge leaves such nodes to onnxruntime."""
    if "onnxruntime" not in RUNTIMES:
        pytest.skip("virtual devices inside onnxruntime need 1.24")
    out = tmp_path / "cells.json"
    done = subprocess.run([sys.executable, "benchmarks/device_sweep.py", "--models", "tv_ssdlite", "--profiles",
                           "intel-gpu", "--runtimes", "onnxruntime", "--shapes", "fixed", "--json", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    (cell,) = json.loads(out.read_text())
    assert cell["status"] == "match" and cell["device_nodes"] > 0, (cell, done.stdout[-2000:])


def test_a_dim_name_fed_two_sizes_is_left_free_when_dims_are_fixed(tmp_path):
    """optimum's merged decoder names the encoder's length in its cross-attention pasts too, fed
    empty on the first step beside the encoder's states of length 12: fixed to either size, one
    input contradicted the model and onnxruntime refused it (10 sweep cells failed)."""
    from onnxhal.stored_outputs import read_signatures
    from onnxhal.sweep import fed_dim_sizes

    path = ROOT / "tests" / "real_models" / "opt_marian_decoder.onnx"
    feeds = read_signatures(str(path))["a"][0]
    dims = fed_dim_sizes(str(path), feeds)
    assert "encoder_sequence_length" not in dims and dims["batch_size"] == 2, dims
    out = tmp_path / "cells.json"
    done = subprocess.run([sys.executable, "benchmarks/device_sweep.py", "--models", "opt_marian_decoder",
                           "--profiles", "integrated-gpu", "--runtimes", RUNTIMES, "--shapes", "fixed",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    cells = json.loads(out.read_text())
    assert [c["status"] for c in cells] == ["match"] * len(RUNTIMES.split(",")), done.stdout[-3000:]
