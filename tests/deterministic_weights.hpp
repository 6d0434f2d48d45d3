// Test helper: weights computed from each tensor's timm name and element index, the C++ twin of
// deterministic_tensor() in tools/make_timm_preprocess_golden.py. Both sides produce the same
// float32 values bit for bit (integer hashing, then exact float arithmetic), so a golden file can
// hold timm's logits for botnet26t_256 without the 50 MB checkpoint.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "relpos/network.hpp"

namespace relpos::test {

inline std::uint64_t fnv1a64(const std::string& s) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

inline bool ends_with(const std::string& s, const std::string& t) {
  return s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
}

// Fills every parameter and buffer of the network (on the CPU) and prepares it for inference.
inline void set_deterministic_weights(Network& net) {
  for (const ParamRef& p : net.params()) {
    Tensor& t = *p.value;
    const Shape& shape = t.shape();
    const std::uint64_t seed = fnv1a64(p.name);
    const std::string leaf = p.name.substr(p.name.rfind('.') + 1);
    std::int64_t fan_in = shape.empty() ? 1 : shape[0];
    if (shape.size() > 1) {
      fan_in = 1;
      for (std::size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    }
    const float bound = static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in)));
    Tensor host = Tensor::zeros(shape);  // contiguous (N, C, H, W) like timm's state_dict
    float* v = host.data();
    for (std::int64_t i = 0; i < host.numel(); ++i) {
      const std::uint64_t h = splitmix64(seed ^ (static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull));
      const float u = static_cast<float>(h >> 40) * 0x1p-24f;
      const float s = 2.0f * u - 1.0f;
      if (ends_with(p.name, "running_var")) v[i] = 0.5f + u;
      else if (ends_with(p.name, "running_mean") || leaf == "bias") v[i] = s * 0.1f;
      else if (p.name.find(".bn.") != std::string::npos || ends_with(p.name, "norm.weight") ||
               (leaf == "weight" && shape.size() == 1))
        v[i] = 1.0f + s * 0.25f;
      else v[i] = s * bound;
    }
    t = host.to_layout(t.layout()).to(t.device());
  }
  net.prepare_inference();
}

}  // namespace relpos::test
