// relpos bench: time inference on a batch (random, or read from a safetensors file), and
// optionally save the logits, so that scripts can compare relpos with other frameworks on the
// same weights and input.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.hpp"
#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

namespace relpos::cli {

namespace {
struct BenchArgs {
  ModelOptions model;
  int batch = 1;
  int warmup = 3;
  int iters = 10;
  double min_seconds = 0.0;
  std::string input, save_logits;
  bool json = false;
};

using Clock = std::chrono::steady_clock;

void run(const BenchArgs& a) {
  Model model = a.model.load();
  const ModelConfig& c = model.network().config();
  Tensor x;
  if (!a.input.empty()) {
    x = SafetensorsFile::read(a.input).tensor("input");
    RELPOS_CHECK(x.ndim() == 4, a.input << ": tensor 'input' must be (N, C, H, W)");
  } else {
    std::mt19937 rng(0);
    std::normal_distribution<float> dist;
    std::vector<float> v(static_cast<std::size_t>(a.batch) * c.in_chans * c.input_size[0] * c.input_size[1]);
    for (auto& f : v) f = dist(rng);
    x = Tensor::from_vector({a.batch, c.in_chans, c.input_size[0], c.input_size[1]}, v);
  }
  x = x.channels_last().to(model.device());
  Tensor logits;
  for (int i = 0; i < a.warmup; ++i) logits = model.logits(x);
  std::vector<double> ms;
  const auto start = Clock::now();
  while (static_cast<int>(ms.size()) < a.iters ||
         std::chrono::duration<double>(Clock::now() - start).count() < a.min_seconds) {
    const auto t0 = Clock::now();
    logits = model.logits(x);  // returns a host tensor, so device work is finished
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double n = static_cast<double>(x.dim(0));
  if (!a.save_logits.empty()) write_safetensors(a.save_logits, {{"logits", logits}});
  if (a.json) {
    std::cout << nlohmann::json{{"model", c.name},           {"batch", x.dim(0)},
                                {"threads", threads_in_use()}, {"device", to_string(model.device())},
                                {"iters", ms.size()},          {"median_ms", median},
                                {"min_ms", sorted.front()},    {"img_per_s", n * 1000.0 / median}}
                     .dump()
              << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(2) << c.name << " batch " << x.dim(0) << ", " << threads_in_use()
              << " threads, " << to_string(model.device()) << ": median " << median << " ms, min " << sorted.front()
              << " ms over " << ms.size() << " runs = " << n * 1000.0 / median << " img/s\n";
  }
}
}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Time inference on a batch (random or from a safetensors file)");
  args->model.add(sub);
  sub->add_option("--batch", args->batch, "Batch size of the random input")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--input", args->input, "safetensors file with an 'input' tensor (N, C, H, W)");
  sub->add_option("--warmup", args->warmup, "Untimed runs first")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--iters", args->iters, "Timed runs (at least)")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("--min-seconds", args->min_seconds, "Keep timing for at least this long");
  sub->add_option("--save-logits", args->save_logits, "Write the logits as safetensors ('logits')");
  sub->add_flag("--json", args->json, "Print one JSON object");
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
