// relpos bench: time inference (or a training step) on a batch, random or read from a
// safetensors file, optionally saving the logits; or time the BoTNet attention op alone; or time
// two models in turn (--paired-with) and compare their multiply-adds per second pair by pair.
// Scripts use it to compare relpos with other frameworks on the same weights and input.
#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.hpp"
#include "relpos/attention_ops.hpp"
#include "relpos/error.hpp"
#include "relpos/optim.hpp"
#include "relpos/runtime.hpp"
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
  bool json = false, train = false, tf32 = false, backward = false, profile = false;
  std::vector<int> attention;  // h w: time the attention op alone
  int dim = 64, heads = 4;
  int sasa = 0;  // with --attention: the SASA local attention with this window instead of BoTNet's
  // --paired-with: a second model (and its --config and --input) timed in turn with the first
  std::string paired_with, paired_config, paired_input;
};

using Clock = std::chrono::steady_clock;

Tensor random_tensor(const Shape& s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist;
  std::vector<float> v(static_cast<std::size_t>(numel_of(s)));
  for (auto& f : v) f = dist(rng);
  return Tensor::from_vector(s, v);
}

// Times fn() (which must leave no device work pending); returns per-run milliseconds. With
// --profile the timed runs (not the warm-up) are also profiled layer by layer.
template <typename F>
std::vector<double> time_runs(const BenchArgs& a, F&& fn) {
  for (int i = 0; i < a.warmup; ++i) fn();
  if (a.profile) {
    reset_profile();
    set_profiling(true);
  }
  std::vector<double> ms;
  const auto start = Clock::now();
  while (static_cast<int>(ms.size()) < a.iters ||
         std::chrono::duration<double>(Clock::now() - start).count() < a.min_seconds) {
    const auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  set_profiling(false);
  std::sort(ms.begin(), ms.end());
  return ms;
}

// One timing as JSON (ms: the runs' milliseconds, sorted). macs_per_item: a model's forward
// multiply-adds per image (0 for the attention op alone), given as forward_gmacs_per_image and
// forward_gmac_per_s (over the median run).
nlohmann::json report_json(const BenchArgs& a, const std::string& what, std::int64_t items,
                           const std::string& device, const std::vector<double>& ms, double macs_per_item) {
  const double median = ms[ms.size() / 2];
  const double n = static_cast<double>(items);
  nlohmann::json j{{"what", what},          {"batch", items},        {"threads", threads_in_use()},
                   {"device", device},      {"iters", ms.size()},    {"median_ms", median},
                   {"min_ms", ms.front()},  {"img_per_s", n * 1000.0 / median}, {"tf32", a.tf32}};
  if (macs_per_item > 0) {
    j["forward_gmacs_per_image"] = macs_per_item / 1e9;
    j["forward_gmac_per_s"] = macs_per_item * n / median / 1e6;
  }
  return j;
}

// report_json's object printed, or with --json off the same timing as a line of text.
void report(const BenchArgs& a, const std::string& what, std::int64_t items, const std::string& device,
            const std::vector<double>& ms, double macs_per_item = 0.0) {
  const double median = ms[ms.size() / 2];
  const double n = static_cast<double>(items);
  if (a.json) {
    std::cout << json_text(report_json(a, what, items, device, ms, macs_per_item)) << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(3) << what << " batch " << items << ", " << count_text(threads_in_use(), "thread")
              << ", " << device << (a.tf32 && device.rfind("cuda", 0) == 0 ? " (TF32)" : "") << ": median " << median << " ms, min "
              << ms.front() << " ms over " << ms.size() << " runs = " << std::setprecision(2) << n * 1000.0 / median
              << " img/s\n";
  }
}

// An attention op's runs: forward (probabilities only for the backward), or with --backward
// forward and backward.
template <typename Forward, typename Backward>
std::vector<double> time_attention(const BenchArgs& a, const Forward& forward, const Backward& backward) {
  if (!a.backward)
    return time_runs(a, [&] {
      (void)forward(nullptr);
      synchronize();
    });
  return time_runs(a, [&] {
    Tensor probs;
    (void)forward(&probs);
    backward(probs);
    synchronize();
  });
}

// The SASA local attention op alone: qkv of a batch on an h x w map, the position tables random.
void run_sasa_attention(const BenchArgs& a, Device dev, int h, int w) {
  SasaSpec spec;
  spec.heads = a.heads, spec.dqk = a.dim, spec.dv = a.dim, spec.kernel = a.sasa;
  RELPOS_USAGE_CHECK(a.dim % 2 == 0, "--dim must be even for SASA (its row and column tables take half each)");
  RELPOS_USAGE_CHECK(a.sasa % 2 == 1, "--sasa takes an odd window size, got " << a.sasa);
  const Tensor qkv = random_tensor({a.batch, spec.channels_qkv(), h, w}, 1).channels_last().to(dev);
  const Tensor rr = random_tensor({a.sasa, a.dim / 2}, 2).to(dev), rc = random_tensor({a.sasa, a.dim / 2}, 3).to(dev);
  const Tensor dout = random_tensor({a.batch, spec.channels_out(), h, w}, 4).channels_last().to(dev);
  const std::vector<double> ms = time_attention(
      a, [&](Tensor* probs) { return ops::sasa_attention(qkv, rr, rc, spec, probs); },
      [&](const Tensor& probs) { (void)ops::sasa_attention_backward(qkv, rr, rc, spec, probs, dout); });
  report(a, std::string("sasa_attention") + (a.backward ? " fwd+bwd " : " ") + std::to_string(a.sasa) + "x" +
                std::to_string(a.sasa) + " " + std::to_string(h) + "x" + std::to_string(w) + " d" +
                std::to_string(a.dim) + " heads" + std::to_string(a.heads),
         a.batch, to_string(dev), ms);
}

void run_attention(const BenchArgs& a) {
  RELPOS_USAGE_CHECK(a.attention.size() == 2, "--attention takes the map height and width");
  const Device dev = a.model.run.apply();
  const int h = a.attention[0], w = a.attention[1];
  RELPOS_USAGE_CHECK(h > 0 && w > 0 && a.heads > 0 && a.dim > 0, "--attention, --heads and --dim must be positive");
  // as a config allows (a window of 999999 threw bad_alloc where it could not be caught: exit 134)
  RELPOS_USAGE_CHECK(a.sasa == 0 || (a.sasa <= 15 && a.sasa % 2 == 1),
                     "--sasa takes an odd window of 1 to 15, as a config's sasa.kernel, got " << a.sasa);
  RELPOS_USAGE_CHECK(h <= 4096 && w <= 4096 && a.heads <= 256 && a.dim <= 4096,
                     "--attention takes a map of at most 4096 x 4096, --heads at most 256 and --dim at most 4096");
  // the maps, and BoTNet's global attention's logits, (h w)^2 per head
  const double floats = static_cast<double>(a.batch) * a.heads *
                        (static_cast<double>(a.dim) * h * w + (a.sasa > 0 ? 0.0 : static_cast<double>(h) * w * h * w));
  RELPOS_USAGE_CHECK(floats * 4.0 * 8.0 <= 16.0 * (1 << 30),
                     "--attention " << h << " " << w << " with --heads " << a.heads << ", --dim " << a.dim << " and --batch "
                                    << a.batch << " would need more than 16 GiB; give a smaller size");
  if (a.sasa > 0) return run_sasa_attention(a, dev, h, w);
  BotAttnSpec spec;
  spec.heads = a.heads, spec.dqk = a.dim, spec.dv = a.dim;
  const Tensor qkv = random_tensor({a.batch, spec.channels_qkv(), h, w}, 1).channels_last().to(dev);
  const Tensor rh = random_tensor({2 * h - 1, a.dim}, 2).to(dev), rw = random_tensor({2 * w - 1, a.dim}, 3).to(dev);
  const Tensor dout = random_tensor({a.batch, a.heads * a.dim, h, w}, 4).channels_last().to(dev);
  const std::vector<double> ms = time_attention(
      a, [&](Tensor* probs) { return ops::bot_attention(qkv, rh, rw, spec, probs); },
      [&](const Tensor& probs) { (void)ops::bot_attention_backward(qkv, rh, rw, spec, probs, dout); });
  report(a, std::string("bot_attention") + (a.backward ? " fwd+bwd " : " ") + std::to_string(h) + "x" +
                std::to_string(w) + " d" + std::to_string(a.dim) + " heads" + std::to_string(a.heads),
         a.batch, to_string(dev), ms);
}

// The multiply-adds of a network's layers (Network::summarize's rows) summed.
double total_macs(const std::vector<LayerRow>& layers) {
  double m = 0.0;
  for (const auto& l : layers) m += static_cast<double>(l.macs);
  return m;
}

// One image's layers at the input's size.
std::vector<LayerRow> macs_per_image(const Model& m, const Tensor& x) {
  return m.network().summarize(1, static_cast<int>(x.dim(2)), static_cast<int>(x.dim(3)));
}

// The --profile table: per layer (stem, each block, head) its ops' milliseconds per run, the
// share of all profiled time, and the layer's multiply-adds (relpos info) per millisecond; an op
// that times its parts (profile_parts()) has them indented under it, counted once, in its row.
void print_profile(const BenchArgs& a, const Network& net, const Shape& input, std::size_t runs) {
  const std::int64_t batch = input[0];
  const auto rows = profile_rows();
  const auto parts = profile_parts();  // inside their op's row: never added to a total
  const auto layers = net.summarize(static_cast<int>(batch), static_cast<int>(input[2]), static_cast<int>(input[3]));
  double total = 0.0;
  for (const auto& r : rows) total += r.ms;
  const auto macs_of = [&](const std::string& layer) {
    double m = 0.0;
    for (const auto& l : layers)
      if (l.name.rfind(layer + ".", 0) == 0) m += static_cast<double>(l.macs);
    return m;
  };
  const double n = static_cast<double>(runs);
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& r : rows)
      j.push_back({{"layer", r.layer}, {"op", r.op}, {"calls", r.calls}, {"ms_per_run", r.ms / n}});
    nlohmann::json jp = nlohmann::json::array();
    for (const auto& p : parts)
      jp.push_back({{"layer", p.layer}, {"op", p.op}, {"part", p.part}, {"calls", p.calls}, {"ms_per_run", p.ms / n}});
    std::cout << json_text(nlohmann::json{{"profile", j}, {"parts", jp}, {"runs", runs}}) << "\n";
    return;
  }
  std::cout << "profile of " << runs << " runs (each op waits for the device; ms per run):\n"
            << std::left << std::setw(14) << "layer" << std::setw(34) << "op" << std::right << std::setw(10) << "ms"
            << std::setw(8) << "share" << std::setw(10) << "MMACs" << std::setw(10) << "GMAC/s" << "\n";
  std::map<std::string, double> by_op;
  for (std::size_t i = 0; i < rows.size();) {
    const std::string layer = rows[i].layer;
    double layer_ms = 0.0;
    std::size_t k = i;
    for (; k < rows.size() && rows[k].layer == layer; ++k) {
      const auto& r = rows[k];
      layer_ms += r.ms;
      by_op[r.op] += r.ms;
      std::cout << std::left << std::setw(14) << (k == i ? (layer.empty() ? "(outside)" : layer) : "") << std::setw(34)
                << r.op << std::right << std::fixed << std::setprecision(3) << std::setw(10) << r.ms / n
                << std::setprecision(1) << std::setw(7) << 100.0 * r.ms / total << "%\n";
      for (const auto& p : parts)  // the op's phases, indented under it
        if (p.layer == layer && p.op == r.op)
          std::cout << std::left << std::setw(14) << "" << std::setw(34) << ("  of which " + p.part) << std::right
                    << std::fixed << std::setprecision(3) << std::setw(10) << p.ms / n << std::setprecision(1)
                    << std::setw(7) << 100.0 * p.ms / total << "%\n";
    }
    const double macs = layer.empty() ? 0.0 : macs_of(layer);
    if (k - i > 1 || macs > 0) {
      std::cout << std::left << std::setw(14) << "" << std::setw(34) << "= layer" << std::right << std::fixed
                << std::setprecision(3) << std::setw(10) << layer_ms / n << std::setprecision(1) << std::setw(7)
                << 100.0 * layer_ms / total << "%";
      if (macs > 0)
        std::cout << std::setw(10) << macs / 1e6 << std::setw(10) << macs / (layer_ms / n) / 1e6;
      std::cout << "\n";
    }
    i = k;
  }
  std::cout << "by op:\n";
  std::vector<std::pair<std::string, double>> ops(by_op.begin(), by_op.end());
  std::sort(ops.begin(), ops.end(), [](const auto& x, const auto& y) { return x.second > y.second; });
  std::map<std::pair<std::string, std::string>, double> by_part;  // (op, part)
  for (const auto& p : parts) by_part[{p.op, p.part}] += p.ms;
  for (const auto& [op, ms] : ops) {
    std::cout << "  " << std::left << std::setw(46) << op << std::right << std::fixed << std::setprecision(3)
              << std::setw(10) << ms / n << std::setprecision(1) << std::setw(7) << 100.0 * ms / total << "%\n";
    for (const auto& [key, pms] : by_part)
      if (key.first == op)
        std::cout << "  " << std::left << std::setw(46) << ("  of which " + key.second) << std::right << std::fixed
                  << std::setprecision(3) << std::setw(10) << pms / n << std::setprecision(1) << std::setw(7)
                  << 100.0 * pms / total << "%\n";
  }
  const double all_macs = total_macs(layers);
  std::cout << std::setprecision(1) << "total " << std::setprecision(3) << total / n << " ms per run in ops, "
            << std::setprecision(2) << all_macs / 1e9 << " GMACs: " << std::setprecision(1)
            << all_macs / (total / n) / 1e6 << " GMAC/s" << (a.train ? " (forward multiply-adds only)" : "") << "\n";
}

// A model's input: the 'input' tensor of `file`, or a random batch at the size the model runs on
// (its preprocessing's); channels-last on the model's device.
Tensor bench_input(const std::string& file, const Model& model, int batch, std::uint32_t seed) {
  const Preprocess& p = model.preprocess();
  Tensor x = file.empty() ? random_tensor({batch, model.network().config().in_chans, p.height, p.width}, seed)
                          : SafetensorsFile::read(file).tensor("input");
  RELPOS_CHECK(x.ndim() == 4, "the input must be (N, C, H, W)" << (file.empty() ? "" : ": " + file) << " holds "
                                                                << x.describe());
  return x.channels_last().to(model.device());
}

// --paired-with: the first model and the second run in turn, one inference each per pair, the order
// swapped from pair to pair. On a shared host whose speed changes from second to second, the two
// runs of a pair meet the same speed, so the median over the pairs of the second model's
// multiply-adds per second over the first's is steadier than two models timed apart (seconds or
// minutes apart, each at whatever speed the host had then). Warm-up and the count of pairs follow
// --warmup, --iters and --min-seconds.
void run_paired(const BenchArgs& a, const Model& first, const Tensor& x1) {
  ModelOptions o = a.model;
  o.model = a.paired_with;
  o.config = a.paired_config;
  const Model second = o.load();
  const Tensor x2 = bench_input(a.paired_input, second, a.batch, 1);
  RELPOS_USAGE_CHECK(x1.dim(0) == x2.dim(0), "--paired-with: both inputs need the same batch, got "
                                                 << x1.dim(0) << " and " << x2.dim(0));
  const double macs1 = total_macs(macs_per_image(first, x1)), macs2 = total_macs(macs_per_image(second, x2));
  const auto once = [](const Model& m, const Tensor& x) {
    const auto t0 = Clock::now();
    const Tensor logits = m.logits(x);
    synchronize();
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  };
  for (int i = 0; i < a.warmup; ++i) {
    once(first, x1);
    once(second, x2);
  }
  std::vector<double> ms1, ms2, ratio;
  nlohmann::json pair_ms = nlohmann::json::array();  // (first's ms, second's ms), pair by pair
  const auto start = Clock::now();
  while (static_cast<int>(ratio.size()) < a.iters ||
         std::chrono::duration<double>(Clock::now() - start).count() < a.min_seconds) {
    double t1 = 0.0, t2 = 0.0;
    if (ratio.size() % 2 == 0) {
      t1 = once(first, x1);
      t2 = once(second, x2);
    } else {
      t2 = once(second, x2);
      t1 = once(first, x1);
    }
    ms1.push_back(t1);
    ms2.push_back(t2);
    pair_ms.push_back({t1, t2});
    ratio.push_back((macs2 / t2) / (macs1 / t1));
  }
  std::sort(ms1.begin(), ms1.end());
  std::sort(ms2.begin(), ms2.end());
  std::sort(ratio.begin(), ratio.end());
  const std::size_t n = ratio.size();
  const double median = ratio[n / 2], q1 = ratio[n / 4], q3 = ratio[(3 * n) / 4];
  const std::string device = to_string(first.device());
  const std::string name1 = first.network().config().name, name2 = second.network().config().name;
  if (a.json) {
    std::cout << json_text(nlohmann::json{{"paired", {report_json(a, name1 + " inference", x1.dim(0), device, ms1, macs1),
                                            report_json(a, name2 + " inference", x2.dim(0), device, ms2, macs2)}},
                                {"pairs", n},
                                {"per_mac_ratio", median},
                                {"per_mac_ratio_q1", q1},
                                {"per_mac_ratio_q3", q3},
                                {"pair_ms", pair_ms}})
              << "\n";
    return;
  }
  report(a, name1 + " inference", x1.dim(0), device, ms1, macs1);
  report(a, name2 + " inference", x2.dim(0), device, ms2, macs2);
  std::cout << std::fixed << std::setprecision(3) << "per multiply-add, " << name2 << " against " << name1 << ": "
            << median << "x (median of " << n << " pairs; quartiles " << q1 << "x to " << q3 << "x)\n";
}

void run(const BenchArgs& a) {
  set_allow_tf32(a.tf32);
  RELPOS_USAGE_CHECK(a.attention.empty() || a.model.model.empty(),
                     "--attention times the attention op alone, on random inputs: it takes no --model");
  if (!a.attention.empty()) return run_attention(a);
  RELPOS_USAGE_CHECK(!a.model.model.empty(), "--model is required (or --attention H W)");
  RELPOS_USAGE_CHECK(a.sasa == 0, "--sasa times the SASA op alone: give it with --attention H W");
  RELPOS_USAGE_CHECK(a.paired_with.empty() || (!a.train && !a.profile && a.save_logits.empty()),
                     "--paired-with times inference only: it takes no --train, --profile or --save-logits");
  RELPOS_USAGE_CHECK(!a.paired_with.empty() || (a.paired_config.empty() && a.paired_input.empty()),
                     "--paired-config and --paired-input need --paired-with");
  Model model = a.model.load();
  const Tensor x = bench_input(a.input, model, a.batch, 0);
  if (!a.paired_with.empty()) return run_paired(a, model, x);
  const ModelConfig& c = model.network().config();
  Tensor logits;
  std::vector<double> ms;
  if (a.train) {
    // forward, cross-entropy, backward and an SGD step on fixed random labels
    std::vector<int> labels;
    for (std::int64_t i = 0; i < x.dim(0); ++i) labels.push_back(static_cast<int>(i % c.num_classes));
    Optimizer opt(OptimizerConfig{}, model.network().params());
    ms = time_runs(a, [&] {
      logits = model.network().forward(x);
      const auto ce = ops::cross_entropy(logits, labels);
      model.network().backward(ce.dlogits);
      opt.step(0.01f);
      synchronize();
    });
  } else {
    ms = time_runs(a, [&] {
      logits = model.logits(x);
      synchronize();
    });
  }
  if (!a.save_logits.empty()) write_safetensors(a.save_logits, {{"logits", logits.to(Device::CPU)}});
  report(a, c.name + (a.train ? " training step" : " inference"), x.dim(0), to_string(model.device()), ms,
         total_macs(macs_per_image(model, x)));
  if (a.profile) print_profile(a, model.network(), x.shape(), ms.size());
}
}  // namespace

void register_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand("bench", "Time inference, a training step, or the attention op alone");
  args->model.add(sub, /*model_required=*/false);
  sub->add_option("--batch", args->batch, "Batch size of the random input")->check(at_least_one("--batch", "images per run"))->capture_default_str();
  sub->add_option("--input", args->input, "safetensors file with an 'input' tensor (N, C, H, W)");
  sub->add_option("--warmup", args->warmup, "Untimed runs first")->check(kNonNegative)->capture_default_str();
  sub->add_option("--iters", args->iters, "Timed runs (at least)")->check(at_least_one("--iters", "timed runs"))->capture_default_str();
  sub->add_option("--min-seconds", args->min_seconds, "Keep timing for at least this long")->check(kNonNegative);
  sub->add_option("--save-logits", args->save_logits, "Write the logits as safetensors ('logits')");
  sub->add_flag("--train", args->train, "Time a training step (forward, backward, SGD) instead of inference");
  sub->add_flag("--tf32", args->tf32, "Let the GPU use TF32 tensor cores for float32 (no effect on the CPU)");
  sub->add_flag("--backward", args->backward, "Attention: time forward and backward");
  sub->add_option("--attention", args->attention, "Time the attention op alone on an H W map")->expected(2);
  sub->add_flag("--profile", args->profile,
                "Also print where the time goes: each layer's ops (ms per run, share, multiply-adds per second), "
                "a SASA op split into its projection and its attention kernels");
  sub->add_option("--dim", args->dim, "Attention: dqk = dv per head")->capture_default_str();
  sub->add_option("--heads", args->heads, "Attention: heads")->capture_default_str();
  sub->add_option("--sasa", args->sasa, "Attention: time SASA local attention with this (odd) window instead of BoTNet's")
      ->check(at_least_one("--sasa", "the window's side"));
  sub->add_option("--paired-with", args->paired_with,
                  "A second model (as --model) timed in turn with the first, one inference each per pair; prints "
                  "both and the median over the pairs of its multiply-adds per second over the first's");
  sub->add_option("--paired-config", args->paired_config, "Architecture for a --paired-with .safetensors file");
  sub->add_option("--paired-input", args->paired_input,
                  "safetensors file with the --paired-with model's 'input' tensor (same batch as the first's)");
  sub->add_flag("--json", args->json, "Print one JSON object per line (with --profile, a second one with the profile)");
  // each mode's options are refused in the other, not silently ignored (a --save-logits that wrote nothing)
  CLI::Option* attention = sub->get_option("--attention");
  for (const char* name : {"--config", "--input", "--save-logits", "--train", "--profile", "--paired-with", "--paired-config",
                           "--paired-input"})
    attention->excludes(sub->get_option(name));
  CLI::Option* model = sub->get_option("--model");
  for (const char* name : {"--backward", "--dim", "--heads"}) sub->get_option(name)->excludes(model);
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
