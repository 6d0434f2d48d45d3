#include "core/op_profile.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>
#include <algorithm>

#include "core/device_memory.hpp"

namespace relpos::detail {

namespace {

struct Totals {
  long calls = 0;
  double ms = 0.0;
};

class Profile {
 public:
  static Profile* get() {
    static Profile* p = std::getenv("RELPOS_PROFILE") && std::getenv("RELPOS_PROFILE")[0] != '0' ? new Profile() : nullptr;
    return p;
  }
  void add(const char* op, bool cuda, double ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    Totals& t = totals_[std::string(op) + (cuda ? " (cuda)" : " (cpu)")];
    ++t.calls;
    t.ms += ms;
  }
  ~Profile() = default;

 private:
  Profile() { std::atexit([] { get()->print(); }); }
  void print() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, Totals>> rows(totals_.begin(), totals_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::fprintf(stderr, "relpos profile (RELPOS_PROFILE): op, calls, total ms, mean ms\n");
    for (const auto& [name, t] : rows)
      std::fprintf(stderr, "  %-36s %8ld %10.2f %9.4f\n", name.c_str(), t.calls, t.ms, t.ms / static_cast<double>(t.calls));
  }
  std::mutex mutex_;
  std::map<std::string, Totals> totals_;
};

}  // namespace

OpTimer::OpTimer(const char* op, bool cuda) {
  if (!Profile::get()) return;
  op_ = op;
  cuda_ = cuda;
  if (cuda_) cuda_synchronize();
  start_ = std::chrono::steady_clock::now();
}

OpTimer::~OpTimer() {
  if (!op_) return;
  if (cuda_) cuda_synchronize();
  Profile::get()->add(op_, cuda_,
                      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count());
}

}  // namespace relpos::detail
