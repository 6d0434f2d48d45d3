#!/usr/bin/env bash
# Prepares the Python used by the benchmark and parity scripts and prints its path.
#   default: Debian's python3-torch (1.13, CPU) + timm 0.9.16 from the package registry, in
#            .venv-bench (a venv that sees Debian's site packages)
#   RELPOS_TORCH=pypi: the newest torch (2.x) and timm 0.9.16 from the package registry, in
#            .venv-bench-pypi
#   RELPOS_BENCH_ENGINES=1: also onnx, onnxruntime and openvino (for bench_cpu.py), keeping the numpy
#            that torch was built against; if they cannot be installed, bench_cpu.py skips them
set -euo pipefail
cd "$(dirname "$0")/../.."
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
need=()
for p in python3-venv python3-pip python3-numpy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ "${RELPOS_TORCH:-debian}" = "pypi" ]; then
  venv=.venv-bench-pypi
  if [ ${#need[@]} -gt 0 ]; then $sudo apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2; fi
  [ -x $venv/bin/python ] || /usr/bin/python3 -m venv $venv >&2
  $venv/bin/python -c "import torch, timm" 2>/dev/null ||
    $venv/bin/pip install -q torch timm==0.9.16 safetensors numpy >&2
else
  venv=.venv-bench
  for p in python3-torch python3-torchvision; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then $sudo apt-get update -qq >&2; DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >&2; fi
  [ -x $venv/bin/python ] || /usr/bin/python3 -m venv --system-site-packages $venv >&2
  $venv/bin/python -c "import timm, safetensors" 2>/dev/null || $venv/bin/pip install -q timm==0.9.16 safetensors >&2
fi
if [ "${RELPOS_BENCH_ENGINES:-0}" = 1 ] && ! $venv/bin/python -c "import onnx, onnxruntime, openvino" 2>/dev/null; then
  np=$($venv/bin/python -c "import numpy; print(numpy.__version__)")
  $venv/bin/pip install -q "numpy==$np" onnx onnxruntime openvino >&2 ||
    echo "python_env: could not install onnx, onnxruntime and openvino; bench_cpu.py will skip what is missing" >&2
fi
echo "$PWD/$venv/bin/python"
