#include "core/op_cache.hpp"

namespace relpos {

std::shared_ptr<void> OpCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = plans_.find(key);
  return it == plans_.end() ? nullptr : it->second;
}

void OpCache::put(const std::string& key, std::shared_ptr<void> plan) {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.emplace(key, std::move(plan));
}

void OpCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  plans_.clear();
}

void OpCache::use_weights(const void* data, std::int64_t numel) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (data == weights_ && numel == weights_numel_) return;
  plans_.clear();
  weights_ = data;
  weights_numel_ = numel;
}

}  // namespace relpos
