#!/usr/bin/env bash
# Sets relpos up on Debian 12: installs the Debian packages the build, tests and data need (as
# root, or through sudo) and builds everything in build/. Safe to run again: it only installs
# what is missing and rebuilds what changed.
#   RELPOS_CMAKE_ARGS="-DRELPOS_SANITIZE=ON" tools/setup.sh   # extra CMake options
#   RELPOS_BUILD_DIR=build-debug tools/setup.sh                # another build folder
#   RELPOS_WITH_FUZZ=1 tools/setup.sh                          # also clang, for tools/asan_check.sh and tools/fuzz/run_fuzzers.sh
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config git
  libdnnl-dev            # oneDNN: CPU convolution, batch norm, pooling, matmul (forward and backward)
  libopencv-dev          # image decoding, resizing, drawing
  nlohmann-json3-dev libcli11-dev zlib1g-dev
  doctest-dev libbenchmark-dev
  libopenmpi-dev openmpi-bin  # data-parallel training (mpirun -np N relpos train); optional for the build
  dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist
)
[ "${RELPOS_WITH_FUZZ:-0}" = 1 ] && packages+=(clang)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "relpos setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

build="${RELPOS_BUILD_DIR:-build}"
# shellcheck disable=SC2086
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release ${RELPOS_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j"$(nproc)"
echo "relpos setup: built $build/relpos"
