// Process-wide settings (relpos/runtime.hpp).
#include "relpos/runtime.hpp"

#include <omp.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>

#include "core/runtime_internal.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {
std::atomic<bool> g_allow_tf32{false};
std::atomic<int> g_num_threads{0};

using LogHandler = std::function<void(const std::string&)>;
std::mutex g_log_mutex;
std::shared_ptr<const LogHandler> g_log_handler;  // null: the default (stderr)
}  // namespace

void set_num_threads(int n) {
  RELPOS_CHECK(n >= 0 && n <= 1024, "set_num_threads: " << n << " threads (0 to 1024)");
  g_num_threads = n;
  detail::apply_thread_setting();
}
int num_threads() { return g_num_threads; }
int threads_in_use() {
  detail::apply_thread_setting();
  return omp_get_max_threads();
}

void set_allow_tf32(bool allow) { g_allow_tf32 = allow; }
bool allow_tf32() { return g_allow_tf32; }

void set_log_handler(std::function<void(const std::string&)> handler) {
  auto h = std::make_shared<const LogHandler>(std::move(handler));
  std::lock_guard<std::mutex> lock(g_log_mutex);
  g_log_handler = std::move(h);
}

void detail::apply_thread_setting() {
  const int n = g_num_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
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
