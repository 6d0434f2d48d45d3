#!/usr/bin/env bash
# One call on a lent GPU machine (docs/gpu.md): relpos binaries built on the Debian machine by
# tools/gpu/build_for_device.sh (.devdeps/bin) run here against the Debian runtime libraries
# carried in .devdeps/lib.tar.xz and the machine's own CUDA, cuBLAS and cuDNN (Python wheels).
#   tools/gpu/device_session.sh tests memcheck-ops cputests profile bench   (output under $OUT)
set -uo pipefail
here=$(pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The binaries carry this checkout's absolute path (models, goldens): make it valid here too.
if [ ! -e /work/main ]; then mkdir -p /work && ln -s "$here" /work/main; fi
libdirs=$(python3 - <<'PY'
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += glob.glob(os.path.join(sp, "nvidia", "*", "lib"))
    dirs += glob.glob(os.path.join(sp, "nvidia", "cu13", "lib"))
print(":".join(sorted(set(dirs))))
PY
)
tar -C /tmp -xJf .devdeps/lib.tar.xz
# Only relpos's own processes see the carried libraries (PyTorch keeps its own).
libpath="/tmp/lib:$libdirs:/usr/local/cuda/lib64"
cat > /tmp/relpos <<WRAP
#!/bin/sh
LD_LIBRARY_PATH="$libpath" exec "$here/.devdeps/bin/relpos" "\$@"
WRAP
chmod +x /tmp/relpos
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  lscpu | grep -m1 "Model name"
  python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__)"
  LD_LIBRARY_PATH="$libpath" ldd .devdeps/bin/relpos | grep -i "not found\|cudnn\|cublas\|cudart\|dnnl"
} 2>&1 | tee "$OUT/env.txt"
for step in "$@"; do
  case "$step" in
    tests)
      LD_LIBRARY_PATH="$libpath" timeout 200 .devdeps/bin/test_cuda 2>&1 | tee "$OUT/test_cuda.txt" | tail -40 ;;
    sanitize)
      # compute-sanitizer: out-of-bounds and misaligned accesses (memcheck), shared-memory races
      # (racecheck) in our kernels
      for tc in "layouts*" "convolution*" "batch norm*" "pooling*" "optimizer*" "BoTNet attention*" "SASA*" "golden*"; do
        echo "== compute-sanitizer --tool memcheck test_cuda -tc=\"$tc\""
        LD_LIBRARY_PATH="$libpath" timeout 100 compute-sanitizer --tool memcheck --print-limit 3 --error-exitcode 9 \
          .devdeps/bin/test_cuda -tc="$tc" 2>&1 | grep -v "^\[doctest\] \(doctest\|run with\)" | head -40
      done 2>&1 | tee "$OUT/sanitize.txt"
      echo "== compute-sanitizer --tool racecheck (attention, SASA, batch norm)"
      LD_LIBRARY_PATH="$libpath" timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 \
        .devdeps/bin/test_cuda -tc="*attention*,*SASA*,batch norm*" 2>&1 | tail -3 | tee -a "$OUT/sanitize.txt" ;;
    memcheck-ops)
      # compute-sanitizer memcheck over the whole table of op cases (every op of the backend contract)
      LD_LIBRARY_PATH="$libpath" timeout "${MEMCHECK_SECONDS:-180}" compute-sanitizer --tool memcheck --print-limit 5 \
        --error-exitcode 9 .devdeps/bin/test_cuda -tc="every case*" 2>&1 | tail -25 | tee "$OUT/memcheck_ops.txt" ;;
    cputests)
      for t in .devdeps/bin/test_*; do
        [ "$(basename "$t")" = test_cuda ] && continue
        echo "== $(basename "$t")"
        LD_LIBRARY_PATH="$libpath" OMP_NUM_THREADS=8 timeout 120 "$t" 2>&1 | tail -4
      done 2>&1 | tee "$OUT/cputests.txt" ;;
    profile)
      for args in "--batch 32 --train" "--batch 256"; do
        echo "== relpos bench -m botnet26t_256 $args --tf32 (RELPOS_PROFILE=1)"
        RELPOS_PROFILE=1 timeout 120 /tmp/relpos bench -m botnet26t_256 --device cuda $args --tf32 --iters 5 --warmup 2 2>&1 | head -30
      done 2>&1 | tee "$OUT/profile.txt" ;;
    bench)
      PYTHONUNBUFFERED=1 timeout 360 python3 tools/bench/bench_gpu.py --relpos /tmp/relpos 2>&1 | tee "$OUT/bench.txt" ;;
    train)
      # The shipped model on the GPU (same accuracy as on the CPU?), then its training recipe
      # (README) on the GPU: per-epoch test accuracy and time.
      export RELPOS_FASHION_MNIST="$here/.devdeps/fmnist"
      {
        echo "== eval shipped model on the GPU"
        timeout 60 /tmp/relpos eval -m models/botnet-fmnist.json --data fashion-mnist --device cuda
        echo "== train on the GPU (README recipe)"
        time timeout "${TRAIN_SECONDS:-300}" /tmp/relpos train --config models/fmnist_botnet.json --data fashion-mnist \
          --epochs "${TRAIN_EPOCHS:-20}" --batch 128 --lr 0.1 --wd 5e-4 --erase 0.5 --seed 0 --device cuda --out /tmp/run --overwrite
        cp /tmp/run/log.csv "$OUT/train_log.csv" 2>/dev/null
      } 2>&1 | tee "$OUT/train.txt" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
