#!/usr/bin/env bash
# relpos as an outside project uses it (run by .ci/run after the tests):
#  1. cmake --install of build/ into a fresh prefix; examples/ built against it with
#     find_package(relpos); the examples classify the bundled samples with the installed model
#     (found under the prefix, not in this source tree);
#  2. the relpos CLI's own sources (tools/relpos) built against the installed headers and library
#     only, with no path into src/ or include/ of this tree: the CLI is a client of the public API;
#  3. examples/add_subdirectory: relpos built from source inside a parent project (CPU-only);
#  4. the version: relpos::version() (the library's), RELPOS_VERSION_STRING (relpos/version.hpp) and
#     the CMake and pkg-config package versions agree; a program compiled with another nlohmann/json
#     ABI (-DJSON_DIAGNOSTICS=1) fails to compile with relpos/json_abi.hpp's message, not to link;
#  5. only with RELPOS_CONSUMER_STATIC=1 (or --static): a static librelpos (-DRELPOS_SHARED=OFF, no
#     tests, no CLI, in $RELPOS_STATIC_BUILD_DIR, default build-static/) installed to its configured
#     prefix, a consumer linked through find_package and through `pkg-config --static`, run from
#     another folder, finding the installed models. Its first run builds the library (about 6
#     minutes on CI's 2 cores); later runs recompile one file.
# Prints what a consumer links and the size of the installed files.
# RELPOS_BUILD_DIR: the (shared) build to install, default build/.
set -euo pipefail
cd "$(dirname "$0")/.."
static=${RELPOS_CONSUMER_STATIC:-0}
[ "${1:-}" = "--static" ] && static=1
build=${RELPOS_BUILD_DIR:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" >/dev/null
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

# The README's C++ example and CMake lines, as a reader copies them: the first cpp block after
# "## C++ API" and the cmake block after "### Using relpos from your project", built against the
# prefix with -Wall -Wextra -Werror -pedantic and run from this tree (its paths are the tree's).
mkdir -p "$work/readme"
awk '/^## C\+\+ API/ {f = 1} f && /^```cpp/ {p = 1; next} p && /^```/ {exit} p' README.md > "$work/readme/app.cpp"
{
  echo "cmake_minimum_required(VERSION 3.25)"
  echo "project(readme_app CXX)"
  echo "set(CMAKE_CXX_STANDARD 17)"
  echo "set(CMAKE_CXX_EXTENSIONS OFF)"
  echo "add_compile_options(-Wall -Wextra -Werror -pedantic)"
  awk '/^### Using relpos from your project/ {f = 1} f && /^```cmake/ {p = 1; next} p && /^```/ {exit} p' README.md
} > "$work/readme/CMakeLists.txt"
if [ "$(grep -c . "$work/readme/app.cpp")" -lt 5 ] || ! grep -q relpos::relpos "$work/readme/CMakeLists.txt"; then
  echo "consumer check: the README's C++ or CMake block was not found" >&2
  exit 1
fi
cmake -S "$work/readme" -B "$work/readme/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$work/readme/build" >/dev/null
"$work/readme/build/app" | tail -2
echo "the README's C++ example builds as written and runs"

# The CLI as an outside client: only the installed headers on its include path.
mkdir -p "$work/cli"
cat > "$work/cli/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(relpos_cli_outside CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(relpos REQUIRED)
find_package(CLI11 REQUIRED)
find_package(nlohmann_json REQUIRED)
find_package(OpenCV REQUIRED COMPONENTS core imgcodecs)
file(GLOB cli_sources "$PWD/tools/relpos/*.cpp")
add_executable(relpos_outside \${cli_sources})
target_compile_options(relpos_outside PRIVATE -Wall -Wextra -Werror)
target_link_libraries(relpos_outside PRIVATE relpos::relpos CLI11::CLI11 nlohmann_json::nlohmann_json \${OpenCV_LIBS})
CMAKE
# Debug (-O0) here and for add_subdirectory below: these check that the code builds and links and
# the programs run; unoptimised compiles take half the time on CI's 2 cores
cmake -S "$work/cli" -B "$work/cli/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$work/cli/build" -j"$(nproc)" >/dev/null
if grep -Eq -- "-I$PWD/(src|include)" "$work/cli/build/CMakeFiles/relpos_outside.dir/flags.make"; then
  echo "consumer check: the outside CLI build saw this tree's headers" >&2
  exit 1
fi
(cd "$work" && "$work/cli/build/relpos_outside" classify -m "$model" "$OLDPWD/samples/bag_00018.png" --topk 1) | tail -1
echo "the CLI builds and runs against the installed public headers only"

cmake -S examples/add_subdirectory -B "$work/subdir" -DRELPOS_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug >/dev/null
cmake --build "$work/subdir" -j"$(nproc)" >/dev/null
"$work/subdir/worker_threads" models/botnet-fmnist.json samples 2 | tail -1

# A probe: the library's version against the headers' and the package's, and the models folder
# a program outside the prefix finds, with a shipped model opened by name.
cat > "$work/probe.cpp" <<'CPP'
#include <cstdio>
#include <string>

#include "relpos/model.hpp"
#include "relpos/model_config.hpp"
#include "relpos/version.hpp"

int main() {
  const std::string lib = relpos::version();
  std::printf("version: library %s, headers %s, package %s\n", lib.c_str(), RELPOS_VERSION_STRING, RELPOS_PACKAGE_VERSION);
  if (lib != RELPOS_VERSION_STRING || lib != RELPOS_PACKAGE_VERSION) return 1;
  std::printf("models: %s\n", relpos::models_dir().c_str());
  const relpos::Model m = relpos::Model::open("botnet-fmnist");
  std::printf("botnet-fmnist by name: %zu labels\n", m.labels().size());
  return m.labels().size() == 10 ? 0 : 1;
}
CPP
mkdir -p "$work/probe"
cat > "$work/probe/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.25)
project(relpos_probe CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(relpos REQUIRED)
add_executable(probe "$work/probe.cpp")
target_compile_options(probe PRIVATE -Wall -Wextra -Werror)
target_compile_definitions(probe PRIVATE RELPOS_PACKAGE_VERSION="\${relpos_VERSION}")
target_link_libraries(probe PRIVATE relpos::relpos)
CMAKE
# probe_with PREFIX NAME [pkg-config options]: the probe built with CMake (NAME-cmake) and with
# pkg-config (NAME-pc), each run from $work and made to report PREFIX's models
probe_with() {
  local pfx=$1 name=$2
  shift 2
  cmake -S "$work/probe" -B "$work/$name-cmake" -DCMAKE_PREFIX_PATH="$pfx" -DCMAKE_BUILD_TYPE=Debug >/dev/null
  cmake --build "$work/$name-cmake" >/dev/null
  local pc="env PKG_CONFIG_PATH=$pfx/lib/pkgconfig pkg-config"
  # shellcheck disable=SC2046  # pkg-config's output is a list of flags
  g++ -std=c++17 -O0 -Wall -Wextra -Werror "$work/probe.cpp" -o "$work/$name-pc" \
    -DRELPOS_PACKAGE_VERSION="\"$($pc --modversion relpos)\"" $($pc "$@" --cflags --libs relpos) -Wl,-rpath,"$pfx/lib"
  for p in "$work/$name-cmake/probe" "$work/$name-pc"; do
    out=$(cd "$work" && env -u RELPOS_MODELS "$p")
    echo "$out" | sed "s|^|  ${p#"$work/"}: |"
    got=$(sed -n 's/^models: //p' <<<"$out")
    if [ "$(realpath -m "$got")" != "$(realpath -m "$pfx/share/relpos/models")" ]; then
      echo "consumer check: $p did not find the models installed in $pfx" >&2
      exit 1
    fi
  done
}
probe_with "$prefix" shared
cli_version=$("$prefix/bin/relpos" --version)
if [ "$cli_version" != "relpos $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --modversion relpos)" ]; then
  echo "consumer check: relpos --version says '$cli_version', not the package's version" >&2
  exit 1
fi
echo "relpos::version(), RELPOS_VERSION_STRING, the CMake and pkg-config package versions and relpos --version agree"

# Another nlohmann/json ABI than librelpos's: a compile error naming it (it used to be undefined
# references at link time).
echo '#include "relpos/model.hpp"' > "$work/json_abi.cpp"
pc_cflags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags relpos)
# shellcheck disable=SC2086
g++ -std=c++17 -fsyntax-only $pc_cflags "$work/json_abi.cpp"
# shellcheck disable=SC2086
if g++ -std=c++17 -fsyntax-only -DJSON_DIAGNOSTICS=1 $pc_cflags "$work/json_abi.cpp" 2> "$work/json_abi.err"; then
  echo "consumer check: a program with -DJSON_DIAGNOSTICS=1 compiled against relpos's headers" >&2
  exit 1
fi
if ! grep -q "relpos: JSON_DIAGNOSTICS differs from librelpos's build" "$work/json_abi.err"; then
  echo "consumer check: -DJSON_DIAGNOSTICS=1 failed without relpos's message:" >&2
  head -20 "$work/json_abi.err" >&2
  exit 1
fi
echo "a program with -DJSON_DIAGNOSTICS=1 fails to compile with: $(grep -o "relpos: JSON_DIAGNOSTICS[^\"]*" "$work/json_abi.err" | head -1)"

if [ "$static" = 1 ]; then
  # Installed to the prefix it was configured with, as a static library's models are found there.
  static_build=${RELPOS_STATIC_BUILD_DIR:-build-static}
  static_prefix="$work/static-prefix"
  # shellcheck disable=SC2086  # extra configure arguments, e.g. -DRELPOS_MPI=OFF
  cmake -S . -B "$static_build" -DCMAKE_BUILD_TYPE=Release -DRELPOS_SHARED=OFF -DRELPOS_BUILD_TESTS=OFF \
    -DRELPOS_BUILD_CLI=OFF -DRELPOS_CUDA=OFF -DCMAKE_INSTALL_PREFIX="$static_prefix" ${RELPOS_STATIC_CMAKE_ARGS:-} >/dev/null
  cmake --build "$static_build" -j"$(nproc)" >/dev/null
  cmake --install "$static_build" >/dev/null
  echo "static librelpos installed in $static_prefix; pkg-config --static --libs relpos:"
  echo "  $(PKG_CONFIG_PATH="$static_prefix/lib/pkgconfig" pkg-config --static --libs relpos)"
  probe_with "$static_prefix" static --static
  if readelf -d "$work/static-pc" | grep -q "librelpos"; then
    echo "consumer check: the static probe loads a shared librelpos" >&2
    exit 1
  fi
  echo "a static librelpos's consumers link (CMake and pkg-config --static) and find the installed models"
fi
echo "consumer check: OK"
