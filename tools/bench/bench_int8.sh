#!/usr/bin/env bash
# relpos int8 vs NNCF + OpenVINO int8 (and both fp32) on the CPU: builds relpos, prepares Python
# (.venv-bench: Debian's torch, timm, openvino; .venv-nncf: nncf and openvino, apart, because NNCF 3
# needs a newer torch and numpy than Debian's torch 1.13), runs bench_int8.py.
#   tools/bench/bench_int8.sh [--model botnet26t_256] [--batches 1 8] [--threads 2] [--seconds 10]
#                             [--rounds 2] [--calib-images 64] [--check-images 64] [--method percentile]
set -euo pipefail
cd "$(dirname "$0")/../.."
tools/setup.sh >/dev/null
python=$(RELPOS_BENCH_ENGINES=1 tools/bench/python_env.sh)
if ! .venv-nncf/bin/python -c "import nncf, openvino" 2>/dev/null; then
  { [ -x .venv-nncf/bin/python ] || /usr/bin/python3 -m venv .venv-nncf; } >&2
  .venv-nncf/bin/pip install -q nncf openvino >&2 ||
    echo "bench_int8: could not install nncf; OpenVINO int8 is skipped" >&2
fi
exec "$python" tools/bench/bench_int8.py --relpos build/relpos --nncf-python .venv-nncf/bin/python "$@"
