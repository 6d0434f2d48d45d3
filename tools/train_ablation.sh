#!/usr/bin/env bash
# The position-encoding ablation on Fashion-MNIST: the shipped model's architecture and recipe with
# relative, absolute and no position encodings, and with the attention block replaced by a plain
# 3x3-convolution bottleneck. About 25 minutes per model on 2 cores. Prints a table at the end.
#   tools/train_ablation.sh [runs/ablation]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/ablation}
tools/setup.sh >/dev/null
configs=(fmnist_botnet fmnist_botnet_abs fmnist_botnet_nopos fmnist_conv)
for cfg in "${configs[@]}"; do
  [ -f "$out/$cfg/model.json" ] && continue
  build/relpos train --config "models/$cfg.json" --data fashion-mnist --epochs 20 --batch 128 --lr 0.1 --wd 5e-4 \
    --erase 0.5 --seed 0 --out "$out/$cfg" -q
done
printf '\n%-22s %12s %10s %12s\n' model "positions" "test acc" "train min"
for cfg in "${configs[@]}"; do
  pos=$(grep -o '"pos": "[a-z]*"' "models/$cfg.json" | head -1 | cut -d'"' -f4)
  grep -q '"self_attn"\]' "models/$cfg.json" || grep -q '"bottle", "self_attn"' "models/$cfg.json" || pos="(3x3 conv)"
  awk -F, -v m="$cfg" -v p="$pos" 'NR > 1 { acc = $6; t += $7 } END { printf "%-22s %12s %9.2f%% %12.1f\n", m, p, 100 * acc, t / 60 }' \
    "$out/$cfg/log.csv"
done
