#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (CPU-only build in
# build-asan/): any report fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
RELPOS_BUILD_DIR=build-asan RELPOS_CMAKE_ARGS="-DRELPOS_SANITIZE=ON -DRELPOS_CUDA=OFF" tools/setup.sh >/dev/null
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure
