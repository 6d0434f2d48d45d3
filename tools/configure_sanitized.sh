#!/usr/bin/env bash
# Configures build-san/: relpos, its CLI, its tests and the libFuzzer harnesses, all built by clang
# with AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage instrumentation (CPU
# backend, static library). tools/asan_check.sh runs the test suite from it and
# tools/fuzz/run_fuzzers.sh the fuzzers, so CI compiles the sanitized library once.
# Needs clang: RELPOS_WITH_FUZZ=1 tools/setup.sh installs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang++ > /dev/null; then
  echo "configure_sanitized: clang++ not found; RELPOS_WITH_FUZZ=1 tools/setup.sh installs it" >&2
  exit 1
fi
# -gline-tables-only: file and line in the sanitizers' reports for little build time
CC=clang CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-gline-tables-only \
  -DRELPOS_FUZZ=ON -DRELPOS_CUDA=OFF -DRELPOS_SHARED=OFF > /dev/null
