#include "train_progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

#include "duration_text.hpp"

namespace relpos::cli {

TrainProgress::TrainProgress(bool quiet) : quiet_(quiet), tty_(isatty(STDERR_FILENO) != 0) {}

void TrainProgress::operator()(const TrainEvent& e) {
  switch (e.kind) {
    case TrainEvent::Kind::Step:
      if (!quiet_) step(e);
      break;
    case TrainEvent::Kind::EpochEnd: {
      end_line();
      if (quiet_) break;
      const EpochLog& l = e.log;
      std::ostringstream os;
      os << std::fixed << "epoch " << l.epoch << "/" << e.epochs << ": train loss " << std::setprecision(4)
         << l.train_loss << ", acc " << std::setprecision(2) << 100 * l.train_acc << "%";
      if (l.val_acc >= 0)
        os << ", val loss " << std::setprecision(4) << l.val_loss << ", val acc " << std::setprecision(2) << 100 * l.val_acc
           << "%";
      if (l.test_acc >= 0)
        os << ", test loss " << std::setprecision(4) << l.test_loss << ", test acc " << std::setprecision(2)
           << 100 * l.test_acc << "%";
      os << "; " << std::setprecision(0) << l.img_per_s << " img/s, " << duration_text(l.seconds);
      std::cerr << os.str() << "\n";
      break;
    }
    case TrainEvent::Kind::Message:
      end_line();
      std::cerr << (e.warning ? "relpos: warning: " : "relpos: ") << e.message << "\n";
      break;
  }
}

void TrainProgress::step(const TrainEvent& e) {
  const double frac = static_cast<double>(e.batch) / static_cast<double>(std::max<std::size_t>(1, e.batches));
  if (tty_) {
    if (std::chrono::duration<double>(Clock::now() - last_).count() < 0.25 && e.batch < e.batches) return;
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_ || e.batch == e.batches) return;
    last_decile_ = decile;
  }
  last_ = Clock::now();
  const int width = 24, filled = static_cast<int>(frac * width);
  std::ostringstream os;
  os << "epoch " << e.epoch << "/" << e.epochs << " [" << std::string(static_cast<std::size_t>(filled), '#')
     << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << std::setw(3) << static_cast<int>(frac * 100)
     << "% " << e.batch << "/" << e.batches << "  " << std::fixed << std::setprecision(0) << e.img_per_s
     << " img/s  loss " << std::setprecision(4) << e.loss << "  acc " << std::setprecision(2) << 100 * e.acc
     << "%  lr " << std::setprecision(4) << e.lr << "  ETA " << duration_text(e.eta_epoch) << " (run "
     << duration_text(e.eta_run) << ")";
  if (tty_) std::cerr << "\r" << os.str() << "\033[K" << std::flush;
  else std::cerr << os.str() << "\n";
}

void TrainProgress::end_line() {
  if (tty_ && !quiet_) std::cerr << "\r\033[K";
  last_decile_ = -1;
}

}  // namespace relpos::cli
