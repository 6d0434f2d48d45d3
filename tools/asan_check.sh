#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (clang, build-san/, shared
# with the fuzzers: see tools/configure_sanitized.sh): any report fails the run. Open MPI's own
# leaks in test_data_parallel are suppressed by tests/lsan_mpi.supp (set by tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/configure_sanitized.sh
cmake --build build-san -j"$(nproc)" > /dev/null
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-san --output-on-failure
