// relpos classify: top-k classes of images and folders of images.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <iomanip>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "progress_bar.hpp"
#include "relpos/error.hpp"

namespace relpos::cli {

namespace {

struct ClassifyArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::vector<std::string> inputs;
  int topk = 5;
  int batch = 8;
  bool json = false, quiet = false;
  std::optional<std::string> shard;  // "K/N"
};

// "K/N" with 1 <= K <= N: this run takes the images whose position among the inputs (in the order
// given, a folder's images sorted) is K-1 mod N.
std::pair<std::size_t, std::size_t> parse_shard(const std::string& text) {
  std::size_t k = 0, n = 0;
  char slash = 0, extra = 0;
  std::istringstream in(text);
  const bool ok = static_cast<bool>(in >> k >> slash >> n) && slash == '/' && !(in >> extra) &&
                  text.find('-') == std::string::npos;
  RELPOS_USAGE_CHECK(ok && n >= 1 && k >= 1 && k <= n && n <= 1000000,
                     "--shard takes K/N with 1 <= K <= N (e.g. --shard 2/4 for the second of four parts), got '" << text
                                                                                                             << "'");
  return {k, n};
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// {"image": name} for a JSON line; a name that is not valid UTF-8 gets U+FFFD for its bad bytes and
// its raw bytes in hex as "image_bytes".
nlohmann::json image_json(const std::string& image) {
  std::string hex;
  nlohmann::json j = {{"image", json_safe_name(image, &hex)}};
  if (!hex.empty()) j["image_bytes"] = hex;
  return j;
}

void report_error(const ClassifyArgs& a, const std::string& image, const std::string& message) {
  const std::string text = detail::naming(image, message);
  if (a.json) {
    nlohmann::json j = image_json(image);
    j["error"] = json_safe_name(text, nullptr);
    std::cout << json_text(j) << std::endl;
  }
  std::cerr << "relpos: skipped " << terminal_safe(text) << "\n";
}

void print_result(const ClassifyArgs& a, const std::string& image, const std::vector<Prediction>& preds) {
  if (a.json) {
    nlohmann::json top = nlohmann::json::array();
    for (std::size_t r = 0; r < preds.size(); ++r)
      top.push_back({{"rank", r + 1}, {"index", preds[r].index}, {"label", preds[r].label},
                     {"probability", preds[r].probability}, {"logit", preds[r].logit}});
    nlohmann::json j = image_json(image);
    j["predictions"] = top;
    std::cout << json_text(j) << "\n";
    return;
  }
  std::cout << terminal_safe(image) << "\n";  // (a name's newline made two lines of it)
  for (const Prediction& p : preds)
    std::cout << "  " << std::fixed << std::setprecision(2) << std::setw(6) << 100.0f * p.probability << "%  "
              << terminal_safe(p.label) << "\n";
}

void run(const ClassifyArgs& a) {
  RELPOS_CHECK(a.batch >= 1, "--batch must be at least 1");
  if (a.shard) parse_shard(*a.shard);  // a usage error before the model loads
  // stdout to a file or pipe: a buffer that holds a batch's lines, written by the flush after each
  // batch in one piece (stdio's 4 KiB one would write a batch's lines in pieces, cut anywhere)
  if (!isatty(STDOUT_FILENO)) std::setvbuf(stdout, nullptr, _IOFBF, std::size_t{1} << 20);
  auto t_load = Clock::now();
  Model model = a.model.load();
  a.pre.apply(model);
  const double load_ms = ms_since(t_load);
  std::vector<std::pair<std::string, std::string>> errors;
  std::vector<std::string> files = expand_inputs(a.inputs, errors);
  // A shard past the number of images (30 images over 40 jobs) has nothing to do: it says so and
  // succeeds, as it would have had the images been split otherwise.
  bool empty_shard = false;
  if (a.shard) {
    const auto [k, n] = parse_shard(*a.shard);
    std::vector<std::string> mine;
    for (std::size_t i = k - 1; i < files.size(); i += n) mine.push_back(files[i]);
    // inputs that do not exist are reported once, by shard 1; another shard with no images then
    // has nothing to do, not a failure of its own to report
    empty_shard = mine.empty() && (!files.empty() || (k != 1 && !errors.empty()));
    if (empty_shard)
      std::cerr << "relpos: shard " << k << "/" << n << " has no images: " << files.size() << " dealt in turn over " << n
                << " shards" << (errors.empty() || k == 1 ? "" : " (shard 1 reports the inputs that cannot be read)")
                << "\n";
    files = std::move(mine);
    if (k != 1) errors.clear();
  }
  for (const auto& [name, message] : errors) report_error(a, name, message);
  ProgressBar bar("classify", a.quiet);
  const Preprocess& pre = model.preprocess();
  const std::size_t per_image = static_cast<std::size_t>(pre.height) * pre.width * pre.in_chans();
  std::size_t done = 0, failed = errors.size();
  double prep_ms = 0.0, infer_ms = 0.0;
  for (std::size_t start = 0; start < files.size(); start += static_cast<std::size_t>(a.batch)) {
    const std::size_t end = std::min(files.size(), start + static_cast<std::size_t>(a.batch));
    auto t0 = Clock::now();
    std::vector<Tensor> inputs;
    std::vector<std::optional<std::string>> why(end - start);  // an unreadable image's error, by its place
    for (std::size_t i = start; i < end; ++i) {
      try {
        inputs.push_back(make_batch({read_image(files[i])}, pre));
      } catch (const std::exception& e) {
        why[i - start] = e.what();
        ++failed;
      }
    }
    // the lines in the inputs' order (an unreadable image's where it stands), flushed per batch so
    // that a run stopped by a signal leaves only whole lines
    std::vector<std::vector<Prediction>> preds;
    if (!inputs.empty()) {
      Tensor batch({static_cast<std::int64_t>(inputs.size()), pre.in_chans(), pre.height, pre.width}, Device::CPU,
                   Layout::ChannelsLast);
      for (std::size_t i = 0; i < inputs.size(); ++i)
        std::memcpy(batch.data() + i * per_image, inputs[i].data(), per_image * sizeof(float));
      prep_ms += ms_since(t0);
      auto t1 = Clock::now();
      const Tensor logits = model.logits(batch);
      infer_ms += ms_since(t1);
      preds = model.top_k(logits, a.topk);
    }
    bar.finish();
    for (std::size_t i = start, r = 0; i < end; ++i) {
      if (!why[i - start]) print_result(a, files[i], preds[r++]);
      else report_error(a, files[i], *why[i - start]);
    }
    std::cout.flush();
    if (!std::cout) {  // a full disk, a closed pipe: the rest would be classified for nothing
      output_error() = errno;
      exit_status() = kExitFailure;
      return;
    }
    done += inputs.size();
    bar.update(end, files.size());
  }
  bar.finish();
  if (a.quiet) {
    if (failed > 0 || (done == 0 && !empty_shard)) exit_status() = kExitFailure;
    return;
  }
  std::cerr << std::fixed << std::setprecision(1) << "relpos: " << done << " image" << (done == 1 ? "" : "s")
            << " classified";
  if (done > 0)
    std::cerr << " in " << (prep_ms + infer_ms) << " ms (" << done * 1000.0 / (prep_ms + infer_ms)
              << " img/s): decode+preprocess " << prep_ms << " ms, inference " << infer_ms << " ms = "
              << infer_ms / static_cast<double>(done) << " ms/img";
  std::cerr << "; model load " << load_ms << " ms; batch " << a.batch << ", " << count_text(threads_in_use(), "thread") << ", "
            << to_string(model.device());
  if (failed) std::cerr << "; " << failed << " failed";
  std::cerr << "\n";
  if (failed > 0 || (done == 0 && !empty_shard)) exit_status() = kExitFailure;
}

}  // namespace

void register_classify(CLI::App& app) {
  auto args = std::make_shared<ClassifyArgs>();
  CLI::App* sub = app.add_subcommand("classify", "Print the top-k classes of images (files or folders)");
  args->model.add(sub);
  sub->add_option("inputs", args->inputs, "Image files or folders of images")->required();
  sub->add_option("-k,--topk", args->topk, "How many classes to print per image (at least 1)")
      ->check(at_least_one("--topk", "the number of classes printed per image"))
      ->capture_default_str();
  sub->add_option("-b,--batch", args->batch, "Images per forward pass")
      ->check(at_least_one("--batch", "images per forward pass"))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "One JSON object per image on stdout");
  sub->add_option("--shard", args->shard,
                  "Classify only part K of N of the inputs (every N-th image from the K-th, in the order given, "
                  "a folder's images in sorted order), so that N machines or jobs split a folder; inputs that do "
                  "not exist are reported by part 1")
      ->type_name("K/N");
  sub->add_flag("-q,--quiet", args->quiet, "No progress bar and no timing summary on stderr");
  args->pre.add(sub);
  sub->callback([args] { run(*args); });
}

}  // namespace relpos::cli
