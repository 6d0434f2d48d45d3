// The relpos command line: options shared by several commands.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "relpos/error.hpp"
#include "relpos/model.hpp"

namespace relpos::cli {

// Exit statuses: 0 success, 1 a failure the command reported (bad file, skipped images), 2 a
// usage error (unknown flag, bad value), 130 interrupted (train).
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;
// The largest --threads value accepted (libgomp crashes on absurd counts).
inline constexpr int kMaxThreads = 1024;

// A bad flag value found after parsing (e.g. --mean with the wrong number of values): exit 2 with
// the usage line, as a parse error.
class UsageError : public Error {
 public:
  using Error::Error;
};
#define RELPOS_USAGE_CHECK(cond, msg)                  \
  do {                                                 \
    if (!(cond)) {                                     \
      std::ostringstream relpos_usage_os_;             \
      relpos_usage_os_ << msg;                         \
      throw ::relpos::cli::UsageError(relpos_usage_os_.str()); \
    }                                                  \
  } while (0)

// Flag checks for numbers that say what they want ("must be positive, got 0"): CLI11's
// PositiveNumber and NonNegativeNumber print their range as 0.000000 to a 309-digit number. A whole
// number of at least 1 takes at_least_one (below).
extern const CLI::Validator kPositive, kNonNegative;
// 0 to 1 (a probability), and 0 to below 1 (label smoothing).
extern const CLI::Validator kProbability, kFraction;
// (0, 100]: above 0 and at most 100.
extern const CLI::Validator kPercentile;
// Text for a terminal or a line-based log: control bytes (a file name's newline, escape sequences
// that would clear the screen or fake a line) written as \n, \t, \r or \xHH. --json output keeps
// names exact instead.
std::string terminal_safe(const std::string& text);
// Where standard output failed (errno), for the error that says so at exit (0: not known).
int& output_error();
// A number from lo to hi (CLI::Range lets "nan" through).
CLI::Validator number_in(double lo, double hi);

// --device / --threads (every command that runs a model)
struct RunOptions {
  std::string device = "cpu";
  int threads = 0;
  double max_model_gb = 0;  // 0: the library's limit (RELPOS_MAX_MODEL_GB, else 16 GiB)
  void add(CLI::App* app);
  // Sets the thread count and checks that the device exists; returns it.
  Device apply() const;
};

// --model / --config, plus --device / --threads
struct ModelOptions {
  std::string model;
  std::string config;
  RunOptions run;
  void add(CLI::App* app, bool model_required = true);
  // Sets the thread count and loads the model (weights file, or a config for random weights).
  Model load() const;
};

// Overrides of the model file's preprocessing, named as in OpenCV's dnn samples. Each one is set
// only when given on the command line; the model file is the truth for everything else.
struct PreprocessOptions {
  std::optional<int> width, height;
  std::optional<std::string> mean, std;  // "X" or "X,Y,Z"
  std::optional<float> scale;
  std::optional<double> crop_pct;  // double, as timm's (a float 0.8 would floor 256 / 0.8 to 319, not 320)
  std::optional<bool> rgb, crop;
  std::optional<std::string> interpolation, crop_mode, tta;
  std::string labels;
  void add(CLI::App* app);
  void apply(Model& model) const;
};

// The same preprocessing as command-line flags (what `info` prints): applying these flags to any
// model gives it exactly this preprocessing.
std::string preprocess_flags(const Preprocess& p);

// A validator for counts that must be at least 1, with a message a person reads.
CLI::Validator at_least_one(const std::string& flag, const std::string& what);

// Whether s ends with suffix.
bool ends_with(const std::string& s, const std::string& suffix);
// The shortest decimal that reads back as the same float ("0.001", not "0.00").
std::string shortest(float v);
// The shortest decimal that reads back as the same double.
std::string shortest(double v);
// "1 epoch", "3 epochs".
std::string count_text(long n, const std::string& noun);
// s padded with spaces to `columns` characters (UTF-8 code points, not bytes: "café" as "cafe"); longer
// text is kept whole.
std::string padded(const std::string& s, std::size_t columns);

// Fails now, naming the file, where writing it after the work would fail: its folder is missing or
// not writable, or the name is a folder's. (flag: the option that named it; what: "the model", ...)
// JSON text for output: bytes of strings that are not UTF-8 (file names, paths) become U+FFFD
// instead of failing after the work. indent as nlohmann::json::dump's.
std::string json_text(const nlohmann::json& j, int indent = -1);

// With input given: writing over that file (the same file by any name) is a usage error too.
// With model: a file already at path is replaced only when it is a relpos model file.
void check_output_file(const std::string& path, const std::string& flag, const std::string& what,
                       const std::string& input = "", bool model = false);

void set_threads(int threads);
// The process exit status a command asks for (0 unless it reported failures).
int& exit_status();
// Files named on the command line, with folders expanded (recursively) to the image files they
// hold, in sorted order. Paths that do not exist, and folders without images, go to errors as
// (path, message) pairs.
std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs,
                                       std::vector<std::pair<std::string, std::string>>& errors);
// A file name as a JSON string: the name itself when it is valid UTF-8; otherwise each byte that is
// not part of valid UTF-8 becomes U+FFFD, and `bytes` (if given) receives the raw bytes as hex.
std::string json_safe_name(const std::string& name, std::string* hex_bytes);

void register_classify(CLI::App& app);
void register_info(CLI::App& app);
void register_convert(CLI::App& app);
void register_bench(CLI::App& app);
void register_train(CLI::App& app);
void register_eval(CLI::App& app);
void register_explain(CLI::App& app);
void register_quantize(CLI::App& app);

}  // namespace relpos::cli
