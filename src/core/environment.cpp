#include "core/environment.hpp"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "relpos/error.hpp"

namespace relpos::detail {

namespace {

bool one_of(const char* value, const char* const* choices) {
  for (; *choices; ++choices)
    if (std::strcmp(value, *choices) == 0) return true;
  return false;
}

constexpr const char* kSwitch[] = {"0", "1", nullptr};
constexpr const char* kSimd[] = {"generic", "avx2", "avx512", nullptr};

// A non-negative integer of MiB that still fits in bytes.
bool mebibytes(const char* value) {
  if (*value < '0' || *value > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(value, &end, 10);
  return errno == 0 && *end == '\0' && v <= (1ULL << 40);
}

// A positive whole number (of pixels, ...).
bool positive_integer(const char* value) {
  if (*value < '1' || *value > '9') return false;
  errno = 0;
  char* end = nullptr;
  std::strtoll(value, &end, 10);
  return errno == 0 && *end == '\0';
}

// OpenMP's thread counts: a positive number, or a comma-separated list of them (one per nesting level).
bool thread_counts(const char* value) {
  // (spaces around the numbers, as OpenMP takes them: "4 ", " 4, 2")
  const auto skip_spaces = [&] {
    while (*value == ' ' || *value == '\t') ++value;
  };
  for (;;) {
    skip_spaces();
    const char* start = value;
    while (*value >= '0' && *value <= '9') ++value;
    if (value == start || *start == '0') return false;
    skip_spaces();
    if (*value == '\0') return true;
    if (*value++ != ',') return false;
  }
}

// A number of seconds: finite, not negative.
bool seconds(const char* value) {
  char* end = nullptr;
  const double v = std::strtod(value, &end);
  return end != value && *end == '\0' && std::isfinite(v) && v >= 0.0;
}

struct Variable {
  const char* name;
  const char* const* choices;  // or, when null, `number` says what passes
  bool (*number)(const char*);
  const char* expected;
};

constexpr Variable kVariables[] = {
    {"RELPOS_SIMD", kSimd, nullptr, "generic, avx2 or avx512"},
    {"RELPOS_WINOGRAD", kSwitch, nullptr, "0 or 1"},
    {"RELPOS_HUGE_PAGES", kSwitch, nullptr, "0 or 1"},
    {"RELPOS_ADAPTIVE_THREADS", kSwitch, nullptr, "0 or 1"},
    {"RELPOS_MERGE_SHORTCUT", kSwitch, nullptr, "0 or 1"},
    {"RELPOS_PROFILE", kSwitch, nullptr, "0 or 1"},
    {"RELPOS_HOST_CACHE_MB", nullptr, mebibytes, "a whole number of MiB, 0 to 2^40"},
    {"RELPOS_CUDA_CACHE_MB", nullptr, mebibytes, "a whole number of MiB, 0 to 2^40"},
    {"RELPOS_MAX_IMAGE_PIXELS", nullptr, positive_integer, "a positive whole number of pixels"},
    {"RELPOS_PROGRESS_AFTER", nullptr, seconds, "a number of seconds, 0 or more"},
    // (OpenMP reads it too, and runs its own default for a value it does not take, without a word)
    {"OMP_NUM_THREADS", nullptr, thread_counts, "a positive number of threads, or a comma-separated list of them"},
};

std::atomic<bool> g_checked{false};

}  // namespace

const char* setting(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

void check_environment() {
  if (g_checked.load(std::memory_order_acquire)) return;
  for (const Variable& var : kVariables) {
    const char* v = setting(var.name);
    if (!v) continue;
    const bool ok = var.choices ? one_of(v, var.choices) : var.number(v);
    RELPOS_CHECK(ok, "environment variable " << var.name << "='" << v << "': expected " << var.expected
                                             << " (or unset for the default)");
  }
  g_checked.store(true, std::memory_order_release);
}

std::size_t setting_mib(const char* name, std::size_t fallback) {
  const char* v = setting(name);
  if (!v || !mebibytes(v)) return fallback << 20;
  return static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) << 20;
}

}  // namespace relpos::detail
