#!/usr/bin/env bash
# Builds the libFuzzer harnesses (clang, ASan + UBSan, build-san/) and runs each for SECONDS
# (default 60) on a copy of its seed corpus (tests/fuzz/corpus/<name>); fails on any crash, leak,
# timeout or out-of-memory. Prints executions per target.
#   tools/fuzz/run_fuzzers.sh [SECONDS] [JOBS] [names...]
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
jobs=${2:-1}
shift $(( $# > 2 ? 2 : $# ))
names=("$@")
[ ${#names[@]} -eq 0 ] && names=(fuzz_safetensors fuzz_weights_json fuzz_config fuzz_idx fuzz_image)
tools/configure_sanitized.sh  # build-san/, shared with tools/asan_check.sh
cmake --build build-san -j"$(nproc)" --target "${names[@]}" >/dev/null
out=build-san/fuzz-runs
mkdir -p "$out"
status=0
run_one() {
  local name=$1 corpus="$out/$1-corpus"
  rm -rf "$corpus" && mkdir -p "$corpus" && cp tests/fuzz/corpus/"$name"/* "$corpus"/
  if ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     OMP_NUM_THREADS=1 build-san/tests/fuzz/"$name" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 \
     -max_len=65536 -print_final_stats=1 -artifact_prefix="$out/$name-" "$corpus" > "$out/$name.log" 2>&1; then
    echo "$name: $(grep -m1 stat::number_of_executed_units "$out/$name.log" | awk '{print $2}') execs in ${seconds} s, no failure"
  else
    echo "$name: FAILED (log: $out/$name.log)"; grep -m5 -E "ERROR|SUMMARY|runtime error|==[0-9]+==" "$out/$name.log" || true
    return 1
  fi
}
pids=()
for name in "${names[@]}"; do
  run_one "$name" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
