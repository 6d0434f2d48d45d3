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

// A phase of the outermost op running on this thread (profile_parts()): `ms` of its time went to
// `part` (a string literal). Nothing outside an op or while profiling is off.
void add_op_part(const char* part, double ms);
// Whether add_op_part would record anything: skip the clock reads when not.
bool op_parts_wanted();

}  // namespace relpos::detail
