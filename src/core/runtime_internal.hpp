// Internal: the library side of relpos/runtime.hpp.
#pragma once

#include <string>

namespace relpos::detail {

// While it lives, the calling thread computes with the thread setting (every op and Model call
// starts with one); then the thread gets back the OpenMP thread count it had, so that an
// application's own OpenMP regions keep theirs. It also checks the environment (check_environment).
class ThreadScope {
 public:
  ThreadScope();
  ~ThreadScope();
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  int saved_;
};
// While one lives (a training run), the adaptive default gives way to a fixed count: OpenMP's own
// default (OMP_NUM_THREADS, else every core). oneDNN's reductions (weight gradients, batch norm
// statistics) depend on the thread count, and a training run must give the same weights for the
// same seed, and a resumed run the same weights as an uninterrupted one, whatever the load on the
// machine did meanwhile. set_num_threads(n > 0) still wins.
class FixedThreadCount {
 public:
  FixedThreadCount();
  ~FixedThreadCount();
  // While it lives, n threads (n > 0) instead of OpenMP's default, unless set_num_threads says
  // otherwise: a resumed training run computes with the thread count it started with.
  void use(int n);
  FixedThreadCount(const FixedThreadCount&) = delete;
  FixedThreadCount& operator=(const FixedThreadCount&) = delete;
};
// A message for the application's log handler (stderr by default).
void log(const std::string& message);

}  // namespace relpos::detail
