#!/usr/bin/env bash
# Builds relpos for a lent GPU machine on this Debian machine and gathers what the binaries need
# there (docs/gpu.md): build-gpu/ (CUDA for sm_90, no image-file decoding, so no GDAL chain) and
# .devdeps/lib (the Debian runtime libraries: oneDNN, OpenCV core/imgproc and their needs; not
# glibc, libstdc++, CUDA or NCCL, which the GPU machine has). Both are ignored by git and carried.
set -euo pipefail
cd "$(dirname "$0")/../.."
cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DRELPOS_IMAGE_CODECS=OFF -DRELPOS_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build build-gpu -j"$(nproc)" --target test_cuda relpos_cli test_attention_golden test_attention_options test_golden_files test_gradients test_model_golden
rm -rf .devdeps/lib && mkdir -p .devdeps/lib
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libresolv\.so|libstdc\+\+|libgcc_s|libcud|libcublas|libnvrtc|libnccl)'
ldd build-gpu/relpos build-gpu/tests/test_cuda | awk '/=>/ {print $1, $3}' | sort -u | while read -r name path; do
  if [[ ! "$name" =~ $skip ]]; then cp -L "$path" ".devdeps/lib/$name"; fi
done
rm -rf .devdeps/bin && mkdir -p .devdeps/bin
cp build-gpu/relpos build-gpu/tests/test_cuda build-gpu/tests/test_attention_golden build-gpu/tests/test_attention_options \
  build-gpu/tests/test_golden_files build-gpu/tests/test_gradients build-gpu/tests/test_model_golden .devdeps/bin/
strip --strip-unneeded .devdeps/bin/*
# oneDNN alone is 40 MB: the carry (64 MiB with the working tree) takes them compressed.
tar -C .devdeps -cJf .devdeps/lib.tar.xz lib
rm -rf .devdeps/lib
# Fashion-MNIST (Debian's dataset-fashion-mnist) for the training step
mkdir -p .devdeps/fmnist && cp /usr/share/datasets/fashion-mnist/*.gz .devdeps/fmnist/
du -sh .devdeps/lib.tar.xz .devdeps/bin .devdeps/fmnist
