#!/usr/bin/env bash
# relpos on a CPU shared with another busy process (issue: graceful under load). For each model,
# with one competing busy-loop process running, times `relpos bench` with the default threads
# (adaptive), with 1 thread, and with all cores forced (what the default was before), in
# alternating rounds (default and 1 thread swap places every other round, so that neither is
# always the one timed right after an all-cores run), and prints img/s and the ratio default /
# 1 thread (>= 1 is the goal). Each
# measurement runs at least --iters runs and --seconds seconds (short runs of a small model mostly
# time the start, not the setting).
#   tools/bench/bench_load.sh [--rounds 3] [--iters 10] [--seconds 2] [--busy 1]
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=3 iters=10 seconds=2 busy=1
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --busy) busy=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--iters N] [--seconds S] [--busy N]" >&2; exit 2 ;;
  esac
done
relpos=${RELPOS:-build/relpos}
[ -x "$relpos" ] || tools/setup.sh >/dev/null
cores=$(nproc)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq "$busy"); do (while :; do :; done) & pids+=($!); done
sleep 1
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $cores cores; $busy busy competing process(es)"
printf '%-16s %-12s %10s %10s %10s %8s\n' model setting round img/s threads ""
declare -A sum
for model in botnet-fmnist botnet26t_256 sasa_resnet26; do
  m=models/$model.json
  for r in $(seq "$rounds"); do
    order="default 1 all"
    [ $((r % 2)) -eq 0 ] && order="1 default all"
    for setting in $order; do
      case $setting in
        default) args=(); env_args=(env -u OMP_NUM_THREADS) ;;
        1) args=(--threads 1); env_args=(env -u OMP_NUM_THREADS) ;;
        all) args=(--threads "$cores"); env_args=(env -u OMP_NUM_THREADS) ;;
      esac
      out=$("${env_args[@]}" "$relpos" bench -m "$m" --iters "$iters" --min-seconds "$seconds" --warmup 2 --json "${args[@]}" 2>/dev/null | tail -1)
      ips=$(python3 -c 'import json,sys; print("%.2f" % json.loads(sys.argv[1])["img_per_s"])' "$out")
      thr=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["threads"])' "$out")
      printf '%-16s %-12s %10s %10s %10s\n' "$model" "$setting" "$r" "$ips" "$thr"
      sum[$model,$setting]=$(python3 -c "print(${sum[$model,$setting]:-0} + $ips)")
    done
  done
done
echo
printf '%-16s %12s %12s %12s %18s\n' model "default" "1 thread" "$cores threads" "default/1 thread"
for model in botnet-fmnist botnet26t_256 sasa_resnet26; do
  d=${sum[$model,default]} o=${sum[$model,1]} a=${sum[$model,all]}
  python3 -c "r=$rounds; print('%-16s %12.2f %12.2f %12.2f %17.2fx' % ('$model', $d/r, $o/r, $a/r, $d/$o))"
done
