#include <cmath>

#include "layers/module.hpp"

namespace relpos {

void Init::normal(Tensor& t, float std) {
  std::normal_distribution<float> dist(0.0f, std);
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (auto& x : v) x = dist(rng);
  t.copy_from(Tensor::from_vector(t.shape(), v));
}

void Init::trunc_normal(Tensor& t, float std) {
  std::normal_distribution<float> dist(0.0f, std);
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (auto& x : v) {
    do x = dist(rng);
    while (std::fabs(x) > 2.0f);
  }
  t.copy_from(Tensor::from_vector(t.shape(), v));
}

}  // namespace relpos
