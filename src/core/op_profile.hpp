// Internal: per-op wall time, on when the environment sets RELPOS_PROFILE=1 (the table of calls,
// total and mean milliseconds per op, inclusive of nested ops, goes to the log at exit) or while
// set_profiling(true) holds (relpos/runtime.hpp: rows per layer and op, outermost ops only). Each
// timed op waits for the device before and after, so GPU times are real and the run is slower.
#pragma once

#include <chrono>
#include <string>

namespace relpos::detail {

// The layer a network is running on this thread, for the per-layer rows ("" outside one). Costs
// a flag test when profiling is off.
class ScopedLayer {
 public:
  explicit ScopedLayer(const std::string& name);
  ~ScopedLayer();
  ScopedLayer(const ScopedLayer&) = delete;
  ScopedLayer& operator=(const ScopedLayer&) = delete;

 private:
  const std::string* outer_ = nullptr;
  bool on_ = false;
};

class OpTimer {
 public:
  OpTimer(const char* op, bool cuda);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  const char* op_ = nullptr;  // null when profiling is off
  bool cuda_ = false;
  bool outermost_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace relpos::detail
