#!/usr/bin/env bash
# One prepared run on a machine with a real NVIDIA GPU (the lent device machine; never CI):
# discovery through OpenCL and sysfs, the probe's verdict, the OpenCL EP's tests and benchmarks on
# the GPU. Wheels it needs travel in .whl (pyopencl and its pure-Python needs, setuptools >= 77; that machine reaches
# no package index); onnx, numpy, psutil, rich, tqdm and onnxruntime are already there.
# Writes logs under $OUT (or ./gpu-check-out) and prints a short summary last.
set -uo pipefail
OUT="${OUT:-$PWD/gpu-check-out}"; mkdir -p "$OUT"
log() { echo "== $*"; }

log "GPU, driver and host CPU"
grep -m1 "model name" /proc/cpuinfo; nproc
nvidia-smi --query-gpu=name,pci.bus_id,pci.device_id,driver_version,memory.total --format=csv 2>&1
log "PCI functions of vendor 0x10de in sysfs"
for d in /sys/bus/pci/devices/*; do
    [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] || continue
    echo "$(basename "$d") device=$(cat "$d/device") class=$(cat "$d/class") driver=$(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
done
ls /sys/bus/pci/devices 2>&1 | head -3

log "OpenCL ICDs"
ls -la /etc/OpenCL/vendors 2>&1
lib="$(find /usr/local/nvidia /usr/lib /usr/lib64 /lib /usr/local/cuda* -name 'libnvidia-opencl.so*' 2>/dev/null | sort | head -1)"
echo "libnvidia-opencl: ${lib:-none}"
if [ ! -e /etc/OpenCL/vendors/nvidia.icd ] && [ -n "$lib" ]; then
    mkdir -p /tmp/vendors && echo "$lib" >/tmp/vendors/nvidia.icd && export OCL_ICD_VENDORS=/tmp/vendors
    echo "wrote /tmp/vendors/nvidia.icd -> $lib"
fi

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
# onnxhal itself, for the pytest plugin's entry point (the tests' subprocesses load it by name);
# its build needs setuptools >= 77, which travels in .whl too
PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/site . \
    || echo "onnxhal not installed: the pytest plugin's tests will fail"
# The package as pyproject.toml's package-dir maps it, without a build (this is a throw-away copy).
for p in hal devices runtime simulators; do cp -r "$p" "onnxhal/$p"; done
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 ONNXHAL_CACHE_DIR=/tmp/onnxhal-cache
python3 - <<'EOF'
import pyopencl as cl
for p in cl.get_platforms():
    for d in p.get_devices():
        cmdbuf = " ".join(e for e in d.extensions.split() if "command_buffer" in e) or "none"
        print(f"{p.name} {p.version} | {d.name} | {d.version} | driver {d.driver_version} | CUs {d.max_compute_units} | fp16 {'cl_khr_fp16' in d.extensions} | command buffers: {cmdbuf}")
EOF

log "onnxhal devices"
python3 -m onnxhal devices 2>&1 | tee "$OUT/devices.txt"
python3 -m onnxhal devices --json >"$OUT/devices.json" 2>&1

log "GEMM on the GPU against numpy"
timeout 60 python3 benchmarks/opencl_gemm.py 1024 2048 4096 2>&1 | tee "$OUT/gemm.txt"

log "models: OpenCL EP on the GPU against onnxruntime CPU (8 threads)"
timeout 90 python3 benchmarks/bench.py --ep opencl --threads 8 --repeat 20 --models mlp,cnn,encoder 2>&1 | tee "$OUT/bench.txt"

if [ -d .gpucorpus ]; then
    log "real exports (benchmark size) on the GPU against onnxruntime CPU (8 threads)"
    timeout 80 python3 benchmarks/real_models.py --corpus .gpucorpus --ep opencl --threads 8 --repeat 10 2>&1 | tee "$OUT/real_models.txt"
fi

log "host cost per run: launches, copies, waits, set_arg calls, host CPU us; creation + first run (8 threads)"
timeout 60 python3 benchmarks/opencl_host_cost.py --threads 8 --repeat 8 2>&1 | tee "$OUT/host_cost.txt"
# the cost rule on (weighs partitions of static shape: the corpus with its dims fixed)
timeout 60 python3 benchmarks/opencl_host_cost.py --threads 8 --repeat 8 --cost-rule on --fixed-dims \
    --models mlp,cnn,encoder,bert_ts,gpt2_ts,resnet_ts,vit_ts,sk_kbins,sk_logreg 2>&1 | tee "$OUT/host_cost_rule.txt"
if [ -d .gpucorpus ]; then
    timeout 60 python3 benchmarks/opencl_host_cost.py --corpus .gpucorpus --models bert_ts,gpt2_ts,vit_ts,resnet_ts \
        --threads 8 --repeat 6 2>&1 | tee "$OUT/host_cost_medium.txt"
fi

log "the committed tiny corpus: OpenCL EP on the GPU, then the CPU EP on this host's CPU (2 threads each side)"
timeout 60 python3 benchmarks/real_models.py --ep opencl --repeat 20 >"$OUT/tiny_opencl.txt" 2>&1
timeout 90 python3 benchmarks/real_models.py --ep cpu --repeat 100 >"$OUT/tiny_cpu.txt" 2>&1

log "OpenCL test files on the GPU"
timeout 170 python3 -m pytest -q -p no:cacheprovider -n 12 tests/test_opencl_probe.py tests/test_devices_opencl.py \
    tests/test_opencl_ep.py tests/test_opencl_kernels.py tests/test_opencl_memory.py tests/test_opencl_session.py \
    tests/test_opencl_dynamic.py tests/test_opencl_models.py tests/test_node_conformance_opencl.py tests/test_opencl_replay.py tests/test_opencl_cost_rule.py \
    >"$OUT/pytest.txt" 2>&1
echo "pytest exit $?"; tail -25 "$OUT/pytest.txt"

log "summary"
grep -i -E "GF/s|gflop" "$OUT/gemm.txt" | tail -4
tail -8 "$OUT/bench.txt"
tail -9 "$OUT/host_cost.txt"; tail -11 "$OUT/host_cost_rule.txt"; [ -f "$OUT/host_cost_medium.txt" ] && tail -6 "$OUT/host_cost_medium.txt"
[ -f "$OUT/real_models.txt" ] && tail -12 "$OUT/real_models.txt"
tail -3 "$OUT/pytest.txt"
tail -2 "$OUT/tiny_opencl.txt"; tail -2 "$OUT/tiny_cpu.txt"
