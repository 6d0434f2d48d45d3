#include "train/lr_plan.hpp"

#include <algorithm>
#include <cmath>

#include "relpos/error.hpp"

namespace relpos::detail {

float LrPlan::at(long step) const {
  for (auto s = segments.rbegin(); s != segments.rend(); ++s) {
    if (step < s->start) continue;
    if (s->constant) return s->lr;
    const double t = std::min(1.0, static_cast<double>(step - s->start) / static_cast<double>(std::max(1L, s->end - s->start)));
    return static_cast<float>(base.min_lr + 0.5 * (s->lr - base.min_lr) * (1.0 + std::cos(M_PI * t)));
  }
  return base.at(step);
}

void LrPlan::extend(long step, long end_step, const std::string& mode, float lr) {
  RELPOS_CHECK(mode == "cosine" || mode == "constant",
               "the schedule of an extended run continues as 'cosine' or 'constant', not '" << mode << "'");
  LrSegment s;
  s.start = step;
  s.end = std::max(step + 1, end_step);
  s.lr = lr > 0.0f ? lr : at(step);
  s.constant = mode == "constant";
  // a segment replaces those that would have started at or after it
  segments.erase(std::remove_if(segments.begin(), segments.end(), [&](const LrSegment& o) { return o.start >= step; }),
                 segments.end());
  segments.push_back(s);
}

nlohmann::json lr_segments_json(const std::vector<LrSegment>& segments) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : segments) a.push_back({{"start", s.start}, {"end", s.end}, {"lr", s.lr}, {"constant", s.constant}});
  return a;
}

std::vector<LrSegment> lr_segments_from(const nlohmann::json& j) {
  std::vector<LrSegment> out;
  if (!j.is_array()) return out;
  for (const auto& e : j) {
    LrSegment s;
    s.start = e.value("start", 0L);
    s.end = e.value("end", s.start + 1);
    s.lr = e.value("lr", 0.0f);
    s.constant = e.value("constant", false);
    out.push_back(s);
  }
  return out;
}

}  // namespace relpos::detail
