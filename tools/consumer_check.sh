#!/usr/bin/env bash
# relpos as an outside project uses it (run by .ci/run after the tests):
#  1. cmake --install of build/ into a fresh prefix; examples/ built against it with
#     find_package(relpos); the examples classify the bundled samples with the installed model
#     (found under the prefix, not in this source tree);
#  2. the relpos CLI's own sources (tools/relpos) built against the installed headers and library
#     only, with no path into src/ or include/ of this tree: the CLI is a client of the public API;
#  3. examples/add_subdirectory: relpos built from source inside a parent project (CPU-only).
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
echo "consumer check: OK"
