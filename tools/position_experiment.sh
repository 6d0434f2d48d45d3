#!/usr/bin/env bash
# The position experiment (issue 16): does the attention's position encoding matter when it should?
# Fashion-MNIST items (28x28) placed at random positions on a black 40x40 canvas (train --canvas 40:
# a new position per epoch and image; test images at a position fixed per image), with attention in
# the last two stages (3 BoTNet blocks: one over the 10x10 map, two over the 5x5 map), for five
# variants of models/exp_*.json that differ only in those blocks:
#   exp_rel_clip  relative positions clipped to [-4, 4] (runs at any size)
#   exp_rel       relative positions, unclipped (tables of 2H-1 rows, resampled at another size)
#   exp_abs       absolute positions (an H*W table per layer, resampled bilinearly at another size)
#   exp_nopos     no position term
#   exp_conv      the attention blocks replaced by 3x3-convolution bottlenecks (a plain ResNet)
# Each is trained with the same recipe for every seed in SEEDS (the seed draws the initial weights,
# the data order and the canvas positions), then scored on the test set at the training resolution
# (40x40 canvas) and at other ones (48x48 and 56x56 canvases: the items keep their 28x28 size, so the
# attention maps grow to 12x12 and 6x6, or 14x14 and 7x7; clipped tables run as they are, unclipped
# and absolute ones are resampled by `relpos eval --canvas N`, docs/attention.md). Prints a table:
# parameters, test accuracy at each size as mean +- sample standard deviation over the seeds (and
# min..max), training throughput.
#
# Budget: about 60 minutes on 2 shared vCPUs for 5 variants x 3 seeds = 15 runs, so about 4 minutes
# a run with its evaluations. Measured on this machine with other jobs running: these models train
# at about 160 img/s with 1 thread and at under 40 img/s with 2 (2 OpenMP threads on 2 busy cores
# wait on each other), hence THREADS=1 (plus the data loader's thread). 3 minutes of training is then
# about 30k images: the first TRAIN_IMAGES=8000 training images for EPOCHS=4 epochs (one run on the
# full 60k images for 20 epochs would take over 2 hours alone). Scoring the 10k test images at
# 40x40, 48x48 and 56x56 takes about a minute a run. The measured run (README) took about 80
# minutes, the training about 55 of them. Accuracies are far below full-data ones; the comparison between variants is
# the point. Runs already done are skipped (a killed run resumes from its
# checkpoint), so the script can be stopped and started again.
#   tools/position_experiment.sh [runs/position]
#   SEEDS="0 1 2 3 4" EPOCHS=4 TRAIN_IMAGES=8000 THREADS=1 tools/position_experiment.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/position}
seeds=${SEEDS:-0 1 2}
epochs=${EPOCHS:-4}
train_images=${TRAIN_IMAGES:-8000}
threads=${THREADS:-1}
canvas=40
others=(48 56)
variants=(exp_rel_clip exp_rel exp_abs exp_nopos exp_conv)
relpos=${RELPOS:-build/relpos}
[ -x "$relpos" ] || tools/setup.sh >/dev/null

# seed by seed, so that a stopped experiment has every variant for the seeds it finished
for s in $seeds; do
  for v in "${variants[@]}"; do
    dir="$out/$v/seed$s"
    if [ ! -f "$dir/model.json" ]; then
      if [ -f "$dir/checkpoint.safetensors" ]; then
        echo "position experiment: resuming $v seed $s" >&2
        nice -n 5 "$relpos" train --resume "$dir/checkpoint.safetensors" --threads "$threads" -q
      else
        echo "position experiment: training $v seed $s" >&2
        nice -n 5 "$relpos" train --config "models/$v.json" --data fashion-mnist --canvas "$canvas" \
          --train-images "$train_images" --epochs "$epochs" --batch 128 --lr 0.1 --wd 5e-4 --pad 0 --erase 0 \
          --seed "$s" --init-seed "$s" --no-eval --threads "$threads" --workers 1 --out "$dir" -q
      fi
    fi
    for size in "$canvas" "${others[@]}"; do
      [ -s "$dir/eval$size.json" ] && continue
      nice -n 5 "$relpos" eval -m "$dir/model.json" --data fashion-mnist --canvas "$size" --threads "$threads" \
        --json -q >"$dir/eval$size.json.tmp"
      mv "$dir/eval$size.json.tmp" "$dir/eval$size.json"
    done
  done
done

# mean +- sample standard deviation (n - 1) [min..max] of the numbers on stdin, in percent
stats() {
  awk '{ x[NR] = 100 * $1; s += x[NR] } END {
    m = s / NR; v = 0; lo = x[1]; hi = x[1]
    for (i = 1; i <= NR; i++) { v += (x[i] - m)^2; if (x[i] < lo) lo = x[i]; if (x[i] > hi) hi = x[i] }
    sd = NR > 1 ? sqrt(v / (NR - 1)) : 0
    printf "%.2f +- %.2f [%.2f..%.2f]", m, sd, lo, hi }'
}
top1() { grep -o '"top1":[0-9.e-]*' "$1" | cut -d: -f2; }
params() {  # trainable parameters: the sum of the layer rows of `relpos info`
  "$relpos" info "models/$1.json" | awk '$1 ~ /^(stem|stages|head)/ && $(NF-1) ~ /^[0-9]+$/ { n += $(NF-1) } END { printf "%.3f M", n / 1e6 }'
}

n=$(echo $seeds | wc -w)
printf '\n%d seeds (%s); %s training images x %s epochs on a %dx%d canvas; test accuracy (%%): mean +- std [min..max]\n' \
  "$n" "$seeds" "$train_images" "$epochs" "$canvas" "$canvas"
printf '%-14s %9s' variant params
for size in "$canvas" "${others[@]}"; do printf ' %30s' "test ${size}x${size}"; done
printf ' %12s\n' "train img/s"
for v in "${variants[@]}"; do
  printf '%-14s %9s' "$v" "$(params "$v")"
  for size in "$canvas" "${others[@]}"; do
    printf ' %30s' "$(for s in $seeds; do top1 "$out/$v/seed$s/eval$size.json"; done | stats)"
  done
  # img/s of the training steps, the mean over the epochs of every seed (log.csv's last column)
  printf ' %12s\n' "$(for s in $seeds; do awk -F, 'NR > 1 { print $NF }' "$out/$v/seed$s/log.csv"; done |
    awk '{ s += $1 } END { printf "%.0f", s / NR }')"
done
