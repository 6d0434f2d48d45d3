// libFuzzer: the relpos weights JSON loader (config, labels, preprocessing, base64 tensors) and,
// when it loads, building the network (within the memory limit the loader checks).
#include <cstdint>

#include "fuzz_common.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const relpos::fuzz::TempFile f(data, size, ".json");
  try {
    (void)relpos::Model::load(f.path());
  } catch (const relpos::Error&) {
  }
  return 0;
}
