// Process-wide settings (relpos/runtime.hpp).
#include "relpos/runtime.hpp"

#include <algorithm>
#include <omp.h>

#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/environment.hpp"
#include "core/runtime_internal.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<int> g_num_threads{0};
std::atomic<int> g_fixed_runs{0};  // live FixedThreadCount objects
std::atomic<int> g_fixed_count{0};  // their thread count (0: OpenMP's default)

using LogHandler = std::function<void(const std::string&)>;
std::mutex g_log_mutex;
std::shared_ptr<const LogHandler> g_log_handler;  // null: the default (stderr)
}  // namespace

void set_num_threads(int n) {
  RELPOS_CHECK(n >= 0 && n <= 1024, "set_num_threads: " << n << " threads (0 to 1024)");
  g_num_threads = n;
}
int num_threads() { return g_num_threads; }
int threads_in_use() {
  const detail::ThreadScope threads;
  return omp_get_max_threads();
}

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

void set_log_handler(std::function<void(const std::string&)> handler) {
  auto h = std::make_shared<const LogHandler>(std::move(handler));
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_handler = std::move(h);
}

namespace {

// Runnable threads of other processes right now: the system's runnable count (/proc/loadavg's
// "running/total") minus this process's own running threads (its OpenMP workers may be spinning).
// -1 when /proc cannot tell.
int others_running() {
  std::ifstream la("/proc/loadavg");
  double l1, l5, l15;
  int running = 0, total = 0;
  char slash = 0;
  if (!(la >> l1 >> l5 >> l15 >> running >> slash >> total) || slash != '/') return -1;
  int own = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream st(std::string("/proc/self/task/") + e->d_name + "/stat");
      std::string line;
      if (!std::getline(st, line)) continue;
      const auto paren = line.rfind(')');  // "tid (name) S ...": the state follows the name
      if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'R') ++own;
    }
    closedir(dir);
  }
  return std::max(0, running - own);
}

// What OpenMP itself would use (OMP_NUM_THREADS, else every core), read when the library loads,
// before relpos changes it; at most 1024, as set_num_threads takes (OMP_NUM_THREADS=100000 made
// libgomp fail to start its threads, or crash).
const int g_openmp_default = std::min(1024, omp_get_max_threads());

// The adaptive default (no set_num_threads, no OMP_NUM_THREADS): the cores OpenMP would use, less
// one for each other process's thread that is running, at least 1; re-read every 200 ms.
int adaptive_threads() {
  static const int all = g_openmp_default;
  static const bool enabled = [] {
    const char* off = detail::setting("RELPOS_ADAPTIVE_THREADS");
    // /proc/loadavg counts the runnable threads of every CPU: it says how busy our cores are only
    // when this process may use all of them (not inside a cpuset of fewer CPUs)
    return detail::setting("OMP_NUM_THREADS") == nullptr && !(off && std::strcmp(off, "0") == 0) &&
           sysconf(_SC_NPROCESSORS_ONLN) == omp_get_num_procs();
  }();
  if (!enabled || all <= 1) return all;
  using Clock = std::chrono::steady_clock;
  static std::atomic<long long> next_check{0};
  static std::atomic<int> chosen{all};
  const long long now = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
  long long due = next_check.load(std::memory_order_relaxed);
  if (now >= due && next_check.compare_exchange_strong(due, now + 200)) {
    const int others = others_running();
    chosen = others < 0 ? all : std::max(1, std::min(all, all - others));
  }
  return chosen;
}

}  // namespace

detail::ThreadScope::ThreadScope() : saved_(omp_get_max_threads()) {
  check_environment();
  const int set = g_num_threads;
  const int fixed = g_fixed_count > 0 ? g_fixed_count.load() : std::max(1, g_openmp_default);
  const int n = set > 0 ? set : g_fixed_runs > 0 ? fixed : adaptive_threads();
  if (saved_ != n) omp_set_num_threads(n);
}
detail::ThreadScope::~ThreadScope() {
  if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
}

int training_threads() {
  const int set = g_num_threads;
  return set > 0 ? set : std::max(1, g_openmp_default);
}

detail::FixedThreadCount::FixedThreadCount() {
  ++g_fixed_runs;
}
detail::FixedThreadCount::~FixedThreadCount() {
  if (--g_fixed_runs == 0) g_fixed_count = 0;
}
void detail::FixedThreadCount::use(int n) {
  g_fixed_count = n;
}

void detail::log(const std::string& message) {
  std::shared_ptr<const LogHandler> h;
  {
    std::lock_guard<std::mutex> lock(g_log_mutex);
    h = g_log_handler;
  }
  if (!h) {
    std::fprintf(stderr, "relpos: %s\n", message.c_str());
  } else if (*h) {
    (*h)(message);
  }
}

}  // namespace relpos
