// Internal: a run's learning rate over its steps: the warmup + cosine schedule it started with,
// then one segment for each time the run was extended (or shortened) on resume. A segment starts
// at the step where the change was made, from the learning rate the run had there (or one the user
// gave), so the rate never jumps back up by itself: "cosine" decays to min_lr at the segment's end,
// "constant" holds the rate. The segments are part of the checkpoint, so resuming is exact.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "relpos/optim.hpp"

namespace relpos::detail {

struct LrSegment {
  long start = 0, end = 1;  // steps
  float lr = 0.0f;          // at `start`
  bool constant = false;    // else cosine from lr to the plan's min_lr at `end`
};

struct LrPlan {
  LrSchedule base;
  std::vector<LrSegment> segments;  // in order of their start steps
  float at(long step) const;
  // From `step` on, the run ends at end_step: mode "cosine" or "constant" (else an error); lr <= 0
  // continues from at(step).
  void extend(long step, long end_step, const std::string& mode, float lr);
};

nlohmann::json lr_segments_json(const std::vector<LrSegment>& segments);
std::vector<LrSegment> lr_segments_from(const nlohmann::json& j);  // lenient, as checkpoints are

}  // namespace relpos::detail
