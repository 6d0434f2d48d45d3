#!/usr/bin/env bash
# The position-encoding ablation on Fashion-MNIST: the shipped model's architecture and recipe with
# relative, absolute and no position encodings, and with the attention block replaced by a plain
# 3x3-convolution bottleneck. About 28 minutes per model on 2 cores. Prints a table at the end: test
# accuracy of a single view and with mirror averaging (--tta hflip), and the training minutes.
#   tools/train_ablation.sh [runs/ablation]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/ablation}
tools/setup.sh >/dev/null
configs=(fmnist_botnet fmnist_botnet_abs fmnist_botnet_nopos fmnist_conv)
for cfg in "${configs[@]}"; do
  [ -f "$out/$cfg/model.json" ] && continue
  if [ -f "$out/$cfg/checkpoint.safetensors" ]; then  # a stopped run goes on where it stood
    build/relpos train --resume "$out/$cfg/checkpoint.safetensors" -q
    continue
  fi
  build/relpos train --config "models/$cfg.json" --data fashion-mnist --epochs 20 --batch 128 --lr 0.1 --wd 5e-4 \
    --erase 0.5 --seed 0 --out "$out/$cfg" -q
done
top1() {  # test accuracy (%) of a trained model, with the given --tta
  build/relpos eval -m "$1" --data fashion-mnist --tta "$2" --json | grep -o '"top1":[0-9.e-]*' | cut -d: -f2 |
    awk '{ printf "%.2f", 100 * $1 }'
}
printf '\n%-22s %-12s %12s %14s %10s\n' model positions "single view" "mirror-avg" "train min"
for cfg in "${configs[@]}"; do
  if grep -q '"bottle", "self_attn"' "models/$cfg.json"; then
    pos=$(grep -o '"pos": "[a-z]*"' "models/$cfg.json" | head -1 | cut -d'"' -f4)
  else
    pos="(3x3 conv)"
  fi
  minutes=$(awk -F, 'NR > 1 { t += $7 } END { printf "%.1f", t / 60 }' "$out/$cfg/log.csv")
  printf '%-22s %-12s %11s%% %13s%% %10s\n' "$cfg" "$pos" "$(top1 "$out/$cfg/model.json" none)" \
    "$(top1 "$out/$cfg/model.json" hflip)" "$minutes"
done
