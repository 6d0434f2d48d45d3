// Internal: a view of some samples of a dataset, and the seeded split of a training set into the
// samples trained on and those held out for validation.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "relpos/data.hpp"

namespace relpos::detail {

class DatasetSubset : public Dataset {
 public:
  // `base` must outlive the subset.
  DatasetSubset(const Dataset& base, std::vector<std::size_t> indices);
  std::size_t size() const override { return indices_.size(); }
  int label(std::size_t i) const override { return base_.label(indices_[i]); }
  cv::Mat image(std::size_t i) const override { return base_.image(indices_[i]); }
  std::string name(std::size_t i) const override { return base_.name(indices_[i]); }
  const std::vector<std::string>& classes() const override { return base_.classes(); }
  const std::vector<std::size_t>& indices() const { return indices_; }

 private:
  const Dataset& base_;
  std::vector<std::size_t> indices_;
};

// (train, val) sample indices of `data`: of each class, round(fraction * its count) samples (at
// least one when fraction > 0 and the class has two or more) chosen by `seed` go to val. Both
// lists are sorted and together hold every index exactly once; the same inputs give the same split.
std::pair<std::vector<std::size_t>, std::vector<std::size_t>> split_for_validation(const Dataset& data, float fraction,
                                                                                   std::uint64_t seed);

}  // namespace relpos::detail
