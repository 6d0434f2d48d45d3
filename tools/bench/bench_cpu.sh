#!/usr/bin/env bash
# relpos vs PyTorch (timm eager, or the SASA twin), ONNX Runtime and OpenVINO inference on the CPU:
# builds relpos, prepares Python (with onnxruntime and openvino), runs bench_cpu.py.
#   tools/bench/bench_cpu.sh [--models botnet26t_256 sasa_resnet26] [--batches 1 8] [--threads 2]
#                            [--seconds 10] [--rounds 2] [--engines relpos torch onnxruntime openvino]
#   RELPOS_TORCH=pypi tools/bench/bench_cpu.sh    # against the newest torch instead of Debian's 1.13
#   RELPOS_BENCH_ENGINES=0 tools/bench/bench_cpu.sh  # do not install onnxruntime/openvino
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/setup.sh >/dev/null
python=$(RELPOS_BENCH_ENGINES="${RELPOS_BENCH_ENGINES:-1}" tools/bench/python_env.sh)
exec "$python" tools/bench/bench_cpu.py --relpos build/relpos "$@"
