// relpos CLI: what `relpos train` shows while it runs, drawn from the trainer's events: a one-line
// progress bar on a terminal (a line every 10% of an epoch on a pipe), and a line per epoch.
#pragma once

#include <chrono>

#include "relpos/trainer.hpp"

namespace relpos::cli {

class TrainProgress {
 public:
  explicit TrainProgress(bool quiet);
  void operator()(const TrainEvent& e);

 private:
  void step(const TrainEvent& e);
  void end_line();
  using Clock = std::chrono::steady_clock;
  bool quiet_, tty_;
  Clock::time_point last_ = Clock::now() - std::chrono::seconds(1);
  int last_decile_ = -1;
};

}  // namespace relpos::cli
