// libFuzzer: the model config reader, then a network built from what it accepts when the
// estimate is small (the limit users get is larger; the fuzzer keeps to 256 MiB).
#include <cstdint>
#include <nlohmann/json.hpp>

#include "relpos/error.hpp"
#include "relpos/model_config.hpp"
#include "relpos/network.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const relpos::ModelConfig c = relpos::ModelConfig::from_json(j);
    (void)relpos::ModelConfig::from_json(c.to_json());
    if (c.estimate().total_bytes() < 256.0 * (1 << 20)) relpos::Network net(c, 1, /*initialize=*/false);
  } catch (const relpos::Error&) {
  }
  return 0;
}
