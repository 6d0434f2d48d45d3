#!/usr/bin/env bash
# relpos vs timm/PyTorch training on Fashion-MNIST: builds relpos, prepares Python, runs bench_train.py.
#   tools/bench/bench_train.sh [--steps 150] [--epochs 0] [--threads 2] [--batch 128]
#   RELPOS_TORCH=pypi tools/bench/bench_train.sh    # against the newest torch instead of Debian's 1.13
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/setup.sh >/dev/null
python=$(tools/bench/python_env.sh)
exec "$python" tools/bench/bench_train.py --relpos build/relpos "$@"
