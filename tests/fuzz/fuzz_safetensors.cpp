// libFuzzer: safetensors parsing, then reading every tensor it declares.
#include <cstdint>
#include <vector>

#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const relpos::SafetensorsFile f = relpos::SafetensorsFile::parse(std::vector<char>(data, data + size), "fuzz");
    for (const auto& e : f.entries()) (void)f.tensor(e.name).numel();
  } catch (const relpos::Error&) {
  }
  return 0;
}
