// libFuzzer: the IDX (MNIST-format) reader. The first two bytes give the length of the images
// file that follows (big-endian); the rest is the labels file (each gzip or plain). The first
// images are then read.
#include <algorithm>
#include <cstdint>

#include "fuzz_common.hpp"
#include "relpos/data.hpp"
#include "relpos/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t cut = std::min<std::size_t>(size - 2, data[0] * 256u + data[1]);
  const relpos::fuzz::TempFile images(data + 2, cut, "-images.idx"), labels(data + 2 + cut, size - 2 - cut, "-labels.idx");
  try {
    const relpos::IdxDataset d(images.path(), labels.path(), {"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"});
    for (std::size_t i = 0; i < std::min<std::size_t>(d.size(), 64); ++i) {
      (void)d.image(i);
      (void)d.label(i);
    }
  } catch (const relpos::Error&) {
  }
  return 0;
}
