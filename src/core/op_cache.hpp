// Internal: per-layer cache of backend plans (oneDNN primitives with their reordered weights,
// cuDNN descriptors and algorithms), keyed by input shape. Layers own one and pass it to
// ops::conv2d. Plans hold a copy of the weights: the cache empties itself when a different weight
// tensor comes (ops::conv2d tells it), but a change to the same tensor's values needs clear().
// Safe to share between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace relpos {

class OpCache {
 public:
  std::shared_ptr<void> find(const std::string& key) const;
  void put(const std::string& key, std::shared_ptr<void> plan);
  void clear();
  // Empties the cache if its plans were made for other weights than these.
  void use_weights(const void* data, std::int64_t numel);

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<void>> plans_;
  const void* weights_ = nullptr;
  std::int64_t weights_numel_ = 0;
};

}  // namespace relpos
