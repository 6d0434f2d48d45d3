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
# Compile time is what CI's 2 cores run short of: the library at -O1 (as the sanitizers' manuals
# advise), the CLI and the test programs at -O0 (RELPOS_CLIENT_FLAGS; their time goes into the
# library's calls); -gline-tables-only gives file and line in the reports cheaply. (-O2 for the
# library made no difference to the suite's time here: test_cli_user_path took 241 s at -O1 and
# 253 s at -O2.)
CC=clang CXX=clang++ cmake -S . -B build-san -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS=-gline-tables-only -DRELPOS_CLIENT_FLAGS=-O0 -DRELPOS_FUZZ=ON -DRELPOS_CUDA=OFF -DRELPOS_SHARED=OFF > /dev/null
