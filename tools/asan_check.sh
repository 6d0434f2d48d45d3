#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer (clang, build-san/, shared
# with the fuzzers: see tools/configure_sanitized.sh): any report fails the run. Open MPI's own
# leaks in test_data_parallel are suppressed by tests/lsan_mpi.supp (set by tests/CMakeLists.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/configure_sanitized.sh
cmake --build build-san -j"$(nproc)" > /dev/null
# Two suites at a time (CI's 2 cores; the longest first, by the COST in tests/CMakeLists.txt), each
# with its two OpenMP threads waiting passively: a spinning idle thread would take the core from
# the other suite. On a 2-vCPU Xeon, back to back: 860 s one at a time, 440 s two at a time
# (528 s, in another hour, with spinning threads).
OMP_WAIT_POLICY=passive ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-san --output-on-failure -j"$(nproc)"
