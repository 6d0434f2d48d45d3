#!/usr/bin/env bash
# relpos vs PyTorch eager on the GPU (for a machine with an NVIDIA GPU, nvcc, PyTorch 2 and timm).
#   tools/bench/bench_gpu.sh [--batches 1 32 256] [--train-batch 32]
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DRELPOS_CUDA=ON >/dev/null
cmake --build build -j"$(nproc)" --target relpos_cli >/dev/null
python3 -c "import torch, timm, safetensors" 2>/dev/null || python3 -m pip install -q timm==0.9.16 safetensors
exec python3 tools/bench/bench_gpu.py --relpos build/relpos "$@"
