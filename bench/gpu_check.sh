#!/usr/bin/env bash
# What autotune measures on a real NVIDIA GPU: the real-NVML tests, NVML's peak beside torch's own
# counters for the example transformer's plans, a CUDA OOM, and a whole `autotune run` under an absolute
# budget with its reuse. Run from the repository root on a GPU machine with autotune installed:
#   bash bench/gpu_check.sh 2>&1 | tee bench/results/gpu-<device>.txt
set -u
cache=$(mktemp -d)
export AUTOTUNE_CACHE_DIR=$cache
repo=$(pwd)

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import sys, torch; print('python', sys.version.split()[0], '| torch', torch.__version__, '| CUDA', torch.version.cuda)"
autotune doctor

echo "== tests: devices and NVML, real NVML included (run from /tmp: the installed package, not the checkout)"
(cd /tmp && python3 -m pytest -q -p no:cacheprovider -o addopts="" "$repo/tests/hardware/test_devices_and_nvml.py" 2>&1 | tail -3)

echo "== autotune measure --device cuda examples/gpt.py -b 64: NVML peak (whole process, CUDA context included) vs torch's counters"
for plan in none all "Block:1/save=attention+matmul"; do
    autotune measure --device cuda -b 64 --plan "$plan" --steps 10 --json examples/gpt.py |
        python3 -c "
import json, sys
d = json.load(sys.stdin)
mib = lambda b: f'{b / 2**20:9.1f} MiB' if b is not None else '        -    '
print(f\"{d['plan']:32} {d['outcome']:9} nvml {mib(d['peak_bytes'])} | torch reserved {mib(d.get('torch_peak_reserved'))} allocated {mib(d.get('torch_peak_allocated'))} | {d['samples_per_sec']:9.1f} samples/s | {d['memory_method']}\")"
done

echo "== a batch that cannot fit: the outcome must be oom, not failed"
autotune measure --device cuda -b 200000 --steps 2 --warmup-steps 1 examples/gpt.py | head -4

echo "== autotune run --device cuda --budget 3GiB --trials 8 examples/gpt.py"
start=$(date +%s)
autotune run --device cuda --budget 3GiB --trials 8 examples/gpt.py 2>&1 | grep -v "^\s*$"
echo "took $(($(date +%s) - start)) s"
echo "== autotune best --budget 3GiB --json (time), then the same run again (zero trials)"
time autotune best --budget 3GiB --json examples/gpt.py
autotune run --device cuda --budget 3GiB --trials 8 examples/gpt.py 2>&1 | head -1
echo "== several plans in one process (run --sweep, on by default here) against one process per plan, NVML"
python3 bench/sweep.py --device cuda --rounds 2
echo "== autotune best's latency in fresh processes (NVML resolves the device here), beside its floors"
python3 bench/best_latency.py --repeat 5
rm -rf "$cache"
