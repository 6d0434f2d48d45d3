#include "data/dataset_subset.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "relpos/error.hpp"

namespace relpos::detail {

DatasetSubset::DatasetSubset(const Dataset& base, std::vector<std::size_t> indices)
    : base_(base), indices_(std::move(indices)) {
  for (std::size_t i : indices_) RELPOS_CHECK(i < base_.size(), "subset index " << i << " beyond " << base_.size() << " samples");
}

std::pair<std::vector<std::size_t>, std::vector<std::size_t>> split_for_validation(const Dataset& data, float fraction,
                                                                                   std::uint64_t seed) {
  RELPOS_CHECK(fraction > 0.0f && fraction < 1.0f, "the validation fraction must be between 0 and 1, got " << fraction);
  std::vector<std::vector<std::size_t>> by_class(data.classes().size());
  for (std::size_t i = 0; i < data.size(); ++i) by_class.at(static_cast<std::size_t>(data.label(i))).push_back(i);
  std::vector<std::size_t> train, val;
  for (std::size_t c = 0; c < by_class.size(); ++c) {
    auto& idx = by_class[c];
    // the generator depends on the seed and the class only, not on other classes' sizes
    std::mt19937_64 rng(mix_seed(seed, 0x76616c, c));  // "val"
    for (std::size_t i = idx.size(); i > 1; --i) std::swap(idx[i - 1], idx[rng() % i]);
    std::size_t k = static_cast<std::size_t>(std::lround(static_cast<double>(fraction) * static_cast<double>(idx.size())));
    if (k == 0 && idx.size() >= 2) k = 1;
    if (k >= idx.size() && !idx.empty()) k = idx.size() - 1;  // keep one to train on
    val.insert(val.end(), idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(k));
    train.insert(train.end(), idx.begin() + static_cast<std::ptrdiff_t>(k), idx.end());
  }
  std::sort(train.begin(), train.end());
  std::sort(val.begin(), val.end());
  RELPOS_CHECK(!val.empty(), "--val-split " << fraction << " holds out no images of " << data.size());
  return {train, val};
}

}  // namespace relpos::detail
