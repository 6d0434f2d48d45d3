#!/usr/bin/env bash
# Kills a training run with SIGKILL at random moments, resumes it each time, and checks that
#   - the checkpoint is never corrupt (every resume loads it and goes on),
#   - a kill never loses more than the checkpoint interval (plus one step and one write),
#   - no temporary file is left behind after a resume,
#   - the run finishes and writes its model.
#   tools/kill_train_test.sh [KILLS=8] [INTERVAL_MINUTES=0.05]
# Uses Fashion-MNIST (Debian's dataset-fashion-mnist) and build/relpos.
set -euo pipefail
cd "$(dirname "$0")/.."
kills="${1:-8}"
interval_min="${2:-0.05}"
relpos="${RELPOS:-build/relpos}"
out="$(mktemp -d)/run"
trap 'rm -rf "$(dirname "$out")"' EXIT
interval_s=$(python3 -c "print($interval_min * 60)")
slack_s=3  # one training step and one checkpoint write on a busy 2-core machine
args=(--config models/fmnist_botnet.json --data fashion-mnist --epochs 1 --batch 64 --threads 1
      --checkpoint-every "$interval_min" -q)
ckpt="$out/checkpoint.safetensors"
step_of() {  # the step a checkpoint records
  python3 - "$1" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    meta = json.loads(f.read(n))["__metadata__"]
print(json.loads(meta["relpos.progress"])["step"])
EOF
}
worst=0
during_write=0
for k in $(seq 1 "$kills"); do
  launched=$(date +%s.%N)
  if [ -f "$ckpt" ]; then "$relpos" train --resume "$ckpt" -q --checkpoint-every "$interval_min" >/dev/null 2>&1 &
  else "$relpos" train "${args[@]}" -o "$out" >/dev/null 2>&1 & fi
  pid=$!
  # wait until this run has written its first checkpoint (it is training: loading is not work)
  for _ in $(seq 1 2400); do
    [ -f "$ckpt" ] && python3 -c "import os,sys; sys.exit(0 if os.path.getmtime('$ckpt') > $launched else 1)" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if ! kill -0 "$pid" 2>/dev/null; then echo "run finished before kill $k"; wait "$pid" || true; break; fi
  if [ $((k % 2)) -eq 0 ]; then
    # kill in the middle of a checkpoint write: as soon as its temporary file appears
    for _ in $(seq 1 20000); do compgen -G "$ckpt.tmp.*" >/dev/null && break; sleep 0.002; done
    compgen -G "$ckpt.tmp.*" >/dev/null && during_write=$((during_write + 1))
  else
    sleep "$(python3 -c "import random; print(round(random.uniform(0, 2 * $interval_s), 2))")"
  fi
  kill -KILL "$pid"; wait "$pid" 2>/dev/null || true
  now=$(date +%s.%N)
  lost=$(python3 -c "import os; print(round($now - os.path.getmtime('$ckpt'), 2))")
  step=$(step_of "$ckpt") || { echo "FAIL: kill $k left an unreadable checkpoint"; exit 1; }
  echo "kill $k: checkpoint at step $step, ${lost} s of work lost (bound ${interval_s} s + ${slack_s} s)"
  python3 -c "import sys; sys.exit(0 if $lost <= $interval_s + $slack_s else 1)" ||
    { echo "FAIL: lost more than the checkpoint interval"; exit 1; }
  worst=$(python3 -c "print(max($worst, $lost))")
done
# finish the run; temporary files of killed writes are cleaned up by the resume
"$relpos" train --resume "$ckpt" -q --max-steps 0 >/dev/null 2>&1 &
pid=$!
sleep 3
if ls "$out" | grep -q '\.tmp\.'; then echo "FAIL: temporary files left after resume"; kill "$pid"; exit 1; fi
kill -INT "$pid"; wait "$pid" || true
step_of "$ckpt" >/dev/null || { echo "FAIL: final checkpoint unreadable"; exit 1; }
echo "kill_train_test: $kills kills ($during_write during a checkpoint write), at most ${worst} s of work lost (interval ${interval_s} s): PASS"
