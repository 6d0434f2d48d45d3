#include "train/weight_ema.hpp"

#include <map>

#include "relpos/error.hpp"

namespace relpos::detail {

WeightEma::WeightEma(const Network& net, float decay) : decay_(decay) {
  RELPOS_CHECK(decay > 0.0f && decay < 1.0f, "the EMA decay must be between 0 and 1, got " << decay);
  for (const ParamRef& p : net.params()) avg_.emplace_back(p.name, p.value->to(Device::CPU).clone());
}

void WeightEma::update(const Network& net) {
  const auto& params = net.params();
  RELPOS_CHECK(params.size() == avg_.size(), "EMA: the network changed");
  const float keep = decay_, take = 1.0f - decay_;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& value = *params[i].value;
    // the same layout as the average, so the two arrays line up element for element
    const Tensor host = value.to(Device::CPU).to_layout(avg_[i].second.layout());
    float* a = avg_[i].second.data();
    const float* v = host.data();
    const std::int64_t n = host.numel();
    for (std::int64_t k = 0; k < n; ++k) a[k] = keep * a[k] + take * v[k];
  }
}

void WeightEma::copy_to(Network& net) const {
  const auto& params = net.params();
  RELPOS_CHECK(params.size() == avg_.size(), "EMA: the network changed");
  for (std::size_t i = 0; i < params.size(); ++i) params[i].value->copy_from(avg_[i].second);
}

std::vector<Tensor*> WeightEma::statistics(const Network& net) {
  const auto& params = net.params();
  RELPOS_CHECK(params.size() == avg_.size(), "EMA: the network changed");
  std::vector<Tensor*> out;
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!params[i].grad) out.push_back(&avg_[i].second);
  return out;
}

void WeightEma::load_state(const std::vector<std::pair<std::string, Tensor>>& state, const std::string& source) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : state) by_name[name] = &t;
  for (auto& [name, avg] : avg_) {
    auto it = by_name.find(name);
    RELPOS_CHECK(it != by_name.end(), source << ": lacks the EMA tensor 'ema." << name << "'");
    RELPOS_CHECK(it->second->shape() == avg.shape(), source << ": EMA tensor 'ema." << name << "' has shape "
                                                            << it->second->describe() << ", expected " << avg.describe());
    avg.copy_from(*it->second);
  }
}

}  // namespace relpos::detail
