#include "core/op_profile.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/device_memory.hpp"
#include "core/environment.hpp"
#include "core/runtime_internal.hpp"
#include "relpos/runtime.hpp"

namespace relpos {
namespace detail {

namespace {

struct Totals {
  long calls = 0;
  double ms = 0.0;
};

std::atomic<bool> g_layer_profiling{false};
thread_local const std::string* t_layer = nullptr;
thread_local int t_depth = 0;
thread_local const char* t_op = nullptr;  // the outermost op running on this thread
thread_local bool t_op_cuda = false;

class Profile {
 public:
  static Profile& get() {
    static Profile* p = new Profile();  // never destroyed: ops may run during exit
    return *p;
  }
  static bool env() {
    static const bool on = setting("RELPOS_PROFILE") && std::strcmp(setting("RELPOS_PROFILE"), "0") != 0;
    return on;
  }
  // One op's time (part null), or a part of the outermost op's (profile_parts()).
  void add(const char* op, bool cuda, const char* part, double ms, const std::string* layer, bool outermost) {
    const std::string name = std::string(op) + (cuda ? " (cuda)" : " (cpu)");
    std::lock_guard<std::mutex> lock(mutex_);
    if (env()) {
      Totals& t = by_op_[part ? name + " / " + part : name];
      ++t.calls;
      t.ms += ms;
    }
    if (g_layer_profiling && outermost) {
      const std::string l = layer ? *layer : std::string();
      auto it = layer_order_.find(l);
      if (it == layer_order_.end()) it = layer_order_.emplace(l, layer_order_.size()).first;
      Totals& t = part ? parts_[{it->second, name, part}] : by_layer_[{it->second, name}];
      ++t.calls;
      t.ms += ms;
    }
  }
  std::vector<ProfilePart> parts() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<std::string> names = layer_names();
    std::vector<ProfilePart> out;
    for (const auto& [key, t] : parts_)
      out.push_back({names[std::get<0>(key)], std::get<1>(key), std::get<2>(key), t.calls, t.ms});
    sort_by_layer(out);
    return out;
  }
  std::vector<ProfileRow> rows() {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<std::string> names = layer_names();
    std::vector<ProfileRow> out;
    for (const auto& [key, t] : by_layer_) out.push_back({names[key.first], key.second, t.calls, t.ms});
    sort_by_layer(out);
    return out;
  }
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    by_layer_.clear();
    parts_.clear();
    layer_order_.clear();
  }

 private:
  // (mutex_ held) the layers by index, in the order they first ran
  std::vector<std::string> layer_names() const {
    std::vector<std::string> names(layer_order_.size());
    for (const auto& [l, i] : layer_order_) names[i] = l;
    return names;
  }
  // (mutex_ held) rows or parts in the order their layers first ran, the slowest first within each
  template <typename Row>
  void sort_by_layer(std::vector<Row>& rows) const {
    std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
      const std::size_t ia = layer_order_.at(a.layer), ib = layer_order_.at(b.layer);
      return ia != ib ? ia < ib : a.ms > b.ms;
    });
  }
  Profile() {
    if (env()) std::atexit([] { get().print(); });
  }
  void print() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<std::string, Totals>> rows(by_op_.begin(), by_op_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    std::ostringstream out;
    out << "profile (RELPOS_PROFILE): op, calls, total ms, mean ms";
    for (const auto& [name, t] : rows) {
      char line[160];
      std::snprintf(line, sizeof line, "\n  %-36s %8ld %10.2f %9.4f", name.c_str(), t.calls, t.ms,
                    t.ms / static_cast<double>(t.calls));
      out << line;
    }
    log(out.str());
  }
  std::mutex mutex_;
  std::map<std::string, Totals> by_op_;
  std::map<std::string, std::size_t> layer_order_;
  std::map<std::pair<std::size_t, std::string>, Totals> by_layer_;
  std::map<std::tuple<std::size_t, std::string, std::string>, Totals> parts_;  // (layer, op, part)
};

bool timing() { return g_layer_profiling.load(std::memory_order_relaxed) || Profile::env(); }

}  // namespace

ScopedLayer::ScopedLayer(const std::string& name) {
  if (!g_layer_profiling.load(std::memory_order_relaxed)) return;
  on_ = true;
  outer_ = t_layer;
  t_layer = &name;
}

ScopedLayer::~ScopedLayer() {
  if (on_) t_layer = outer_;
}

OpTimer::OpTimer(const char* op, bool cuda) {
  if (!timing()) return;
  op_ = op;
  cuda_ = cuda;
  outermost_ = t_depth++ == 0;
  if (outermost_) {
    t_op = op;
    t_op_cuda = cuda;
  }
  if (cuda_) cuda_synchronize();
  start_ = std::chrono::steady_clock::now();
}

OpTimer::~OpTimer() {
  if (!op_) return;
  if (cuda_) cuda_synchronize();
  --t_depth;
  if (outermost_) t_op = nullptr;
  Profile::get().add(op_, cuda_, nullptr,
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count(),
                     t_layer, outermost_);
}

bool op_parts_wanted() { return t_op != nullptr; }

void add_op_part(const char* part, double ms) {
  if (t_op) Profile::get().add(t_op, t_op_cuda, part, ms, t_layer, /*outermost=*/true);
}

}  // namespace detail

void set_profiling(bool on) {
  if (on) detail::Profile::get();
  detail::g_layer_profiling = on;
}

std::vector<ProfileRow> profile_rows() { return detail::Profile::get().rows(); }

std::vector<ProfilePart> profile_parts() { return detail::Profile::get().parts(); }

void reset_profile() { detail::Profile::get().reset(); }

}  // namespace relpos
