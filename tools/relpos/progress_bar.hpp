// relpos CLI: a one-line progress bar with ETA on stderr, for classify and eval. It draws only
// when stderr is a terminal, the command is not quiet, and the work has already taken more than
// two seconds (short runs and pipes stay clean); finish() clears the line.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace relpos::cli {

class ProgressBar {
 public:
  ProgressBar(std::string what, bool quiet);
  void update(std::size_t done, std::size_t total);
  void finish();
  ~ProgressBar() { finish(); }

 private:
  using Clock = std::chrono::steady_clock;
  std::string what_;
  bool enabled_;
  bool drawn_ = false;
  Clock::time_point start_ = Clock::now(), last_ = Clock::now();
};

}  // namespace relpos::cli
