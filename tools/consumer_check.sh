#!/usr/bin/env bash
# relpos as an outside project uses it (run by .ci/run after the tests):
#  1. cmake --install of build/ into a fresh prefix; examples/ built against it with
#     find_package(relpos); the examples classify the bundled samples with the installed model
#     (found under the prefix, not in this source tree);
#  2. examples/add_subdirectory: relpos built from source inside a parent project (CPU-only).
# Prints what a consumer links and the size of the installed files.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install build --prefix "$prefix" >/dev/null
echo "installed: $(du -sh "$prefix" | cut -f1) in $prefix"
(cd "$prefix" && find . -type f | sort | sed 's/^/  /' | grep -v "share/relpos/models/" ; \
  echo "  share/relpos/models/: $(ls share/relpos/models | wc -l) files")

cmake -S examples -B "$work/examples" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/examples" -j"$(nproc)" >/dev/null
echo "a consumer links (worker_threads, direct needs):"
readelf -d "$work/examples/worker_threads" | awk '/NEEDED/ {print "  " $5}' | tr -d '[]'

# Run from elsewhere, the source tree hidden: the library must find its installed models.
model="$prefix/share/relpos/models/botnet-fmnist.json"
mkdir -p "$work/frames"
i=0
for f in samples/*.png; do cp "$f" "$work/frames/f_$(printf %02d $i).png"; i=$((i + 1)); done
(cd "$work" && env -u RELPOS_MODELS "$work/examples/worker_threads" "$model" "$OLDPWD/samples" 2) | tail -2
(cd "$work" && "$work/examples/classify_video" "$model" "$work/frames/f_%02d.png" 5) | tail -2
(cd "$work" && "$work/examples/extract_features" "$model" "$OLDPWD/samples" "$work/features.safetensors") | tail -1
# a shipped config by name, resolved through the installed models folder
"$prefix/bin/relpos" info botnet26t_256 --no-layers | head -1

# pkg-config, for builds without CMake
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" g++ -std=c++17 -O1 examples/worker_threads.cpp -o "$work/worker_pc" \
  $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs relpos opencv4) -Wl,-rpath,"$prefix/lib"
"$work/worker_pc" "$model" samples 1 | tail -1

cmake -S examples/add_subdirectory -B "$work/subdir" -DRELPOS_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/subdir" -j"$(nproc)" >/dev/null
"$work/subdir/worker_threads" models/botnet-fmnist.json samples 2 | tail -1
echo "consumer check: OK"
