#!/usr/bin/env bash
# relpos vs timm/PyTorch inference on the CPU: builds relpos, prepares Python, runs bench_cpu.py.
#   tools/bench/bench_cpu.sh [--batches 1 8] [--threads 2] [--seconds 10]
#   RELPOS_TORCH=pypi tools/bench/bench_cpu.sh    # against the newest torch instead of Debian's 1.13
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/setup.sh >/dev/null
python=$(tools/bench/python_env.sh)
exec "$python" tools/bench/bench_cpu.py --relpos build/relpos "$@"
