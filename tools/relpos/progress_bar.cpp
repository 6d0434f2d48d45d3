#include "progress_bar.hpp"

#include "duration_text.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace relpos::cli {

namespace {
// Seconds of work before the bar appears; RELPOS_PROGRESS_AFTER overrides it (tests use 0).
double show_after() {
  static const double s = [] {
    // (checked with the library's other variables: a number of seconds, 0 or more)
    const char* env = std::getenv("RELPOS_PROGRESS_AFTER");
    return env && *env ? std::strtod(env, nullptr) : 2.0;
  }();
  return s;
}
}  // namespace

ProgressBar::ProgressBar(std::string what, bool quiet)
    : what_(std::move(what)), enabled_(!quiet && isatty(STDERR_FILENO) != 0) {}

void ProgressBar::update(std::size_t done, std::size_t total) {
  if (!enabled_ || total == 0) return;
  const auto now = Clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (elapsed < show_after() || (drawn_ && std::chrono::duration<double>(now - last_).count() < 0.2)) return;
  last_ = now;
  drawn_ = true;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int width = 30, filled = static_cast<int>(frac * width);
  const double eta = done > 0 ? elapsed * (static_cast<double>(total) / static_cast<double>(done) - 1.0) : 0.0;
  std::cerr << "\r" << what_ << " [" << std::string(static_cast<std::size_t>(filled), '#')
            << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << done << "/" << total << "  "
            << std::fixed << std::setprecision(1) << static_cast<double>(done) / elapsed << " img/s  ETA "
            << duration_text(eta) << "\033[K" << std::flush;
}

void ProgressBar::finish() {
  if (drawn_) std::cerr << "\r\033[K" << std::flush;
  drawn_ = false;
}

}  // namespace relpos::cli
