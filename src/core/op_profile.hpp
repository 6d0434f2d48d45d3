// Internal: per-op wall time, on when the environment sets RELPOS_PROFILE=1. Each dispatched op
// waits for the device before and after (so GPU times are real, and the run is slower); the table
// (calls, total and mean milliseconds per op, inclusive of nested ops) goes to stderr at exit.
#pragma once

#include <chrono>

namespace relpos::detail {

class OpTimer {
 public:
  OpTimer(const char* op, bool cuda);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  const char* op_ = nullptr;  // null when profiling is off
  bool cuda_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace relpos::detail
