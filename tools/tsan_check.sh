#!/usr/bin/env bash
# ThreadSanitizer on the C++ API's concurrency test (many application threads classifying on one
# shared Model) and on the data loader restarting epochs while its workers are busy. Builds build-tsan (CPU backend, -fsanitize=thread) and fails on any report.
# OpenMP runs one thread per call here (OMP_NUM_THREADS=1): libgomp is not instrumented, so its
# barriers look like races to TSan inside every parallel region; what this checks is relpos's own
# sharing between application threads. tests/tsan.supp names the libraries that are not ours.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRELPOS_CUDA=OFF -DRELPOS_TSAN=ON >/dev/null
cmake --build build-tsan -j"$(nproc)" --target test_api test_training >/dev/null
export OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 exitcode=66 suppressions=$PWD/tests/tsan.supp"
build-tsan/tests/test_api -tc="concurrent*"
build-tsan/tests/test_training -tc="the data loader restarts*"  # epochs restarted under busy workers
echo "tsan_check: no ThreadSanitizer report"
