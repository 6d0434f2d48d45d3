#include "cli_common.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "relpos/error.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace relpos::cli {

namespace fs = std::filesystem;

namespace {
// The flag's text as a finite number, or an error message in `error`.
double number_of(const std::string& text, std::string& error) {
  double v = 0.0;
  std::size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // (a hexadecimal float, "0x10", would be read as 16: not what a user of these flags writes)
  if (used == 0 || used != text.size() || !std::isfinite(v) || text.find_first_of("xX") != std::string::npos)
    error = "must be a number, got '" + text + "'";
  return v;
}

CLI::Validator number_check(bool zero_ok) {
  return CLI::Validator(
      [zero_ok](std::string& text) -> std::string {
        std::string error;
        const double v = number_of(text, error);
        if (!error.empty()) return error;
        if (zero_ok ? v < 0.0 : v <= 0.0)
          return std::string(zero_ok ? "must not be negative" : "must be positive") + ", got " + text;
        return std::string();
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE");
}

CLI::Validator fraction_check(bool one_ok) {
  return CLI::Validator(
      [one_ok](std::string& text) -> std::string {
        std::string error;
        const double v = number_of(text, error);
        if (!error.empty()) return error;
        if (v < 0.0 || (one_ok ? v > 1.0 : v >= 1.0))
          return std::string("must be from 0 to ") + (one_ok ? "1" : "below 1") + ", got " + text;
        return std::string();
      },
      one_ok ? "0..1" : "0..<1");
}
// timm's crop_pct: 0.01 to 1 (CLI::Range lets "nan" through).
CLI::Validator crop_pct_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string error;
        const double v = number_of(text, error);
        if (!error.empty() || !(v >= 0.01 && v <= 1.0)) return "must be a number from 0.01 to 1, got " + text;
        return std::string();
      },
      "[0.01..1]");
}
// A percentile: above 0, at most 100.
CLI::Validator percent_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        std::string error;
        const double v = number_of(text, error);
        if (!error.empty() || !(v > 0.0 && v <= 100.0)) return "must be a number above 0 and at most 100, got " + text;
        return std::string();
      },
      "(0..100]");
}
}  // namespace

namespace {
void append_hex(std::string& out, unsigned char byte) {
  static const char kDigits[] = "0123456789abcdef";
  out += kDigits[byte >> 4];
  out += kDigits[byte & 15];
}
}  // namespace

std::string terminal_safe(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u >= 0x20 && u != 0x7f) {
      out += ch;
    } else if (ch == '\n') {
      out += "\\n";
    } else if (ch == '\t') {
      out += "\\t";
    } else if (ch == '\r') {
      out += "\\r";
    } else {
      out += "\\x";
      append_hex(out, u);
    }
  }
  return out;
}

int& output_error() {
  static int err = 0;
  return err;
}

CLI::Validator number_in(double lo, double hi) {
  std::ostringstream range;
  range << '[' << lo << ".." << hi << ']';
  return CLI::Validator(
      [lo, hi, range = range.str()](std::string& text) -> std::string {
        std::string error;
        const double v = number_of(text, error);
        if (!error.empty() || !(v >= lo && v <= hi)) return "must be a number in " + range + ", got " + text;
        return std::string();
      },
      range.str());
}

const CLI::Validator kPositive = number_check(false), kNonNegative = number_check(true);
const CLI::Validator kProbability = fraction_check(true), kFraction = fraction_check(false);
const CLI::Validator kPercentile = percent_check();

void RunOptions::add(CLI::App* app) {
  app->add_option("--device", device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda", "cuda:0", "gpu"}));
  app->add_option("--threads", threads, "CPU threads (default: all cores, less those other processes keep busy; 1 to " + std::to_string(kMaxThreads) + ")")
      ->check(CLI::Range(0, kMaxThreads));
  app->add_option("--max-model-gb", max_model_gb,
                  "Allow models whose estimated memory (relpos info shows it) is up to this many GiB (default 16)")
      ->check(kPositive);
}

Device RunOptions::apply() const {
  set_threads(threads);
  // (the flag's value itself: std::to_string wrote 1e-9 as "0.000000")
  if (max_model_gb > 0) setenv("RELPOS_MAX_MODEL_GB", shortest(max_model_gb).c_str(), 1);
  const Device d = parse_device(device);
  if (d == Device::CUDA && !cuda_available()) {
#ifdef RELPOS_WITH_CUDA
    RELPOS_FAIL("--device " << device << ": no CUDA GPU is visible on this machine; use --device cpu");
#else
    RELPOS_FAIL("--device " << device << ": this relpos was built without the CUDA backend; use --device cpu");
#endif
  }
  return d;
}

void ModelOptions::add(CLI::App* app, bool model_required) {
  auto* m = app->add_option("-m,--model", model,
                            "Model: relpos weights (.json), a .safetensors file, or a model config / shipped config name "
                            "(random weights)");
  if (model_required) m->required();
  app->add_option("--config", config, "Architecture for a timm .safetensors file (config path or shipped name)");
  run.add(app);
}

CLI::Validator at_least_one(const std::string& flag, const std::string& what) {
  return CLI::Validator(
      [flag, what](std::string& v) -> std::string {
        try {
          std::size_t used = 0;
          const long long n = std::stoll(v, &used);
          if (used == v.size() && n >= 1) return "";
        } catch (const std::exception&) {
        }
        return flag + " must be a whole number of at least 1 (" + what + "), got '" + v + "'";
      },
      "N>=1");
}

void set_threads(int threads) {
  if (threads > 0) relpos::set_num_threads(std::min(threads, kMaxThreads));
}


int& exit_status() {
  static int status = 0;
  return status;
}

Model ModelOptions::load() const {
  LoadOptions opt;
  opt.config = config;
  opt.device = run.apply();
  return Model::open(model, opt);
}

namespace {
// "X" or "X,Y,Z": one value for every channel, or one per channel.
std::vector<float> per_channel(const std::optional<std::string>& text, const char* flag, int channels) {
  std::vector<float> v;
  if (!text) return v;
  std::stringstream ss(*text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    std::size_t used = 0;
    double d = 0.0;
    try {
      d = std::stod(item, &used);  // (stof refused 1e-45 and 1e39 as "not numbers": out of float's range)
    } catch (const std::exception&) {
      used = 0;
    }
    RELPOS_USAGE_CHECK(used == 0 || std::fabs(d) <= 3.0e38, flag << " " << item << " is beyond float32's range");
    const float x = static_cast<float>(d);
    RELPOS_USAGE_CHECK(used > 0 && item.find_first_not_of(" ", used) == std::string::npos && std::isfinite(x),
                 flag << " takes numbers separated by commas (e.g. " << flag
                      << (std::string(flag) == "--mean" ? " 127.5 or --mean 123.675,116.28,103.53, in pixel units 0..255"
                                           : " 0.5 or --std 0.229,0.224,0.225, after scaling to 0..1")
                      << "), got '" << *text << "'");
    v.push_back(x);
  }
  RELPOS_USAGE_CHECK(!v.empty() && (v.size() == 1 || static_cast<int>(v.size()) == channels),
                     flag << " takes " << (channels == 1 ? "1 value (the model's input has one channel)" : "1 value or 3 (one per channel)")
                          << ", got " << v.size() << " in '" << *text << "'");
  return v;
}
}  // namespace

void PreprocessOptions::add(CLI::App* app) {
  const std::string g = "Preprocessing (each overrides the model file only when given)";
  app->add_option("--width", width, "Network input width")->group(g)->check(CLI::Range(1, 1 << 16));
  app->add_option("--height", height, "Network input height")->group(g)->check(CLI::Range(1, 1 << 16));
  app->add_option("--mean", mean, "Mean to subtract, in pixel units (0..255): one value, or one per channel in the "
                                  "model's channel order, comma-separated")
      ->group(g)
      ->type_name("X[,Y,Z]");
  app->add_option("--std", std, "Standard deviation to divide by, after scaling (0..1 units): one value or one per "
                                "channel, comma-separated")
      ->group(g)
      ->type_name("X[,Y,Z]");
  app->add_option("--scale", scale, "Pixel scale factor (e.g. 0.0039216 = 1/255)")->group(g)->check(kPositive);
  // Each flag of a pair sets the optional only when given: the model file stays the truth otherwise.
  CLI::Option* rgb_flag = app->add_flag_function("--rgb", [this](std::int64_t) { rgb = true; }, "Model takes RGB input")->group(g);
  app->add_flag_function("--bgr", [this](std::int64_t) { rgb = false; }, "Model takes BGR input")
      ->group(g)
      ->excludes(rgb_flag);  // both given: a usage error, not the last one silently winning
  CLI::Option* crop_flag = app->add_flag_function("--crop", [this](std::int64_t) { crop = true; },
                                                  "Resize as timm's eval transform, then crop (see --crop-mode, --crop-pct)")
                               ->group(g);
  app->add_flag_function("--no-crop", [this](std::int64_t) { crop = false; }, "Stretch to exactly width x height")
      ->group(g)
      ->excludes(crop_flag);
  app->add_option("--crop-pct", crop_pct, "timm's crop_pct: resize to size / crop_pct, then crop")
      ->group(g)
      ->check(crop_pct_check());
  app->add_option("--crop-mode", crop_mode, "timm's crop_mode: center, squash or border")
      ->group(g)
      ->check(CLI::IsMember({"center", "squash", "border"}));
  app->add_option("--interpolation", interpolation,
                  "Resampling as Pillow's: nearest, bilinear, bicubic, box (alias area), hamming or lanczos")
      ->group(g)
      ->check(CLI::IsMember({"nearest", "bilinear", "bicubic", "box", "area", "hamming", "lanczos"}));
  app->add_option("--tta", tta, "Test-time augmentation: none, or hflip (mean logits of the image and its mirror)")
      ->group(g)
      ->check(CLI::IsMember({"none", "hflip"}));
  app->add_option("--labels", labels, "Class labels file, one per line");
}

void PreprocessOptions::apply(Model& model) const {
  Preprocess p = model.preprocess();
  RELPOS_USAGE_CHECK(!rgb || p.channels != ChannelOrder::Gray,
                     (*rgb ? "--rgb" : "--bgr") << ": the model takes grayscale input (one channel), which has no "
                                                   "channel order");
  if (rgb) p.channels = *rgb ? ChannelOrder::RGB : ChannelOrder::BGR;
  const std::vector<float> mean_v = per_channel(mean, "--mean", p.in_chans());
  const std::vector<float> std_v = per_channel(std, "--std", p.in_chans());
  if (width) p.width = *width;
  if (height) p.height = *height;
  const ModelConfig& config = model.network().config();
  // A network whose position tables are sized for its input runs at that size only: refused here,
  // before any work (and before convert writes a file that could not run).
  RELPOS_USAGE_CHECK(!(width || height) || !config.fixed_input_size() ||
                         (p.height == config.input_size[0] && p.width == config.input_size[1]),
                     "--width/--height ask for " << p.height << "x" << p.width << " input (height x width), but "
                                                 << config.name << " takes " << config.input_size[0] << "x"
                                                 << config.input_size[1]
                                                 << " only: its position tables fix the feature size (relpos eval "
                                                    "--input-size resamples them for another size)");
  // The network's memory was checked at the size it was built for; a larger input needs more.
  if (width || height) {
    ModelConfig at = config;
    at.input_size = {p.height, p.width};
    try {
      at.check_memory();
    } catch (const Error& e) {
      RELPOS_FAIL("--width/--height ask for " << p.height << "x" << p.width << " input: " << e.what());
    }
  }
  if (scale) {
    RELPOS_USAGE_CHECK(std::isfinite(*scale) && *scale > 0.0f, "--scale must be a positive number");
    // The mean is stored after scaling: keep it in pixel units unless --mean gives a new one.
    for (auto& m : p.mean) m = m / p.scale * *scale;
    p.scale = *scale;
  }
  // OpenCV's (pixel - mean) * scale / std: our mean is after scaling.
  for (std::size_t c = 0; c < 3 && !mean_v.empty(); ++c) p.mean[c] = mean_v[mean_v.size() == 1 ? 0 : c] * p.scale;
  for (std::size_t c = 0; c < 3 && !std_v.empty(); ++c) p.std[c] = std_v[std_v.size() == 1 ? 0 : c];
  for (float s : p.std)
    RELPOS_USAGE_CHECK(std::isnormal(s), "--std must not be zero"
                                             << (s != 0.0f ? ", nor as small as " + shortest(s) + " (a subnormal float32)"
                                                           : std::string()));
  if (crop) p.crop = *crop;
  if (crop_pct) p.crop_pct = *crop_pct;
  if (crop_mode) p.crop_mode = parse_crop_mode(*crop_mode);
  if (interpolation) p.interpolation = parse_interpolation(*interpolation);
  if (tta) p.tta = parse_tta(*tta);
  // What the flags made of the model's preprocessing must still be valid: a usage error naming the
  // flags given (--std 1e-30 failed later, with exit 1 and only the model file's key named).
  std::string given;
  for (const auto& [flag, set] : {std::pair<const char*, bool>{"--mean", mean.has_value()}, {"--std", std.has_value()},
                                  {"--scale", scale.has_value()}, {"--crop-pct", crop_pct.has_value()},
                                  {"--width", width.has_value()}, {"--height", height.has_value()}})
    if (set) given += std::string(given.empty() ? "" : ", ") + flag;
  // (set_preprocess checks it: Preprocess::check, and an int8 model's u8 first layer against --mean)
  try {
    model.set_preprocess(p);
  } catch (const Error& e) {
    if (given.empty()) throw;
    RELPOS_USAGE_CHECK(false, "with " << given << ": " << e.what());
  }
  if (!labels.empty()) {
    const std::vector<std::string> read = read_labels(labels);  // its errors name the file
    try {
      model.set_labels(read);
    } catch (const Error& e) {
      RELPOS_FAIL(labels << ": " << e.what());
    }
  }
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The shortest decimal that reads back as the same float.
std::string shortest(float v) {
  for (int digits = 6; digits < 10; ++digits) {
    std::ostringstream os;
    os << std::setprecision(digits) << v;
    if (std::strtof(os.str().c_str(), nullptr) == v) return os.str();  // (stof throws on subnormals)
  }
  std::ostringstream os;
  os << std::setprecision(9) << v;
  return os.str();
}

std::string shortest(double v) {
  for (int digits = 6; digits < 17; ++digits) {
    std::ostringstream os;
    os << std::setprecision(digits) << v;
    if (std::stod(os.str()) == v) return os.str();
  }
  std::ostringstream os;
  os << std::setprecision(17) << v;
  return os.str();
}

std::string json_text(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

void check_output_file(const std::string& path, const std::string& flag, const std::string& what,
                       const std::string& input, bool model) {
  std::error_code ec;
  RELPOS_USAGE_CHECK(input.empty() || !fs::equivalent(input, path, ec),
                     path << ": " << flag << " is the input model; write " << what << " to another file");
  // a model is written over an earlier model only (a training checkpoint, a config, an image or a
  // timm checkpoint there was replaced without a word)
  RELPOS_CHECK(!model || !fs::exists(path, ec) || fs::is_directory(path, ec) || fs::file_size(path, ec) == 0 ||
                   is_relpos_model_file(path),  // (an empty file: mktemp's, say)
               path << ": is there and is not a relpos model file; " << flag
                    << " replaces only those (give another file name, or remove it first)");
  const fs::path folder = fs::path(path).parent_path().empty() ? fs::path(".") : fs::path(path).parent_path();
  RELPOS_CHECK(fs::is_directory(folder, ec), path << ": cannot write " << what << " there (no folder " << folder.string() << ")");
  RELPOS_CHECK(!fs::is_directory(path, ec), path << ": is a folder; " << flag << " takes a file name");
  // a probe file, removed whatever happened (a full disk left it behind), and the system's reason
  // (a full disk was reported as "not writable")
  const fs::path probe = folder / (".relpos-write-test." + std::to_string(::getpid()));
  int error = 0;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = errno;
  } else {
    if (::write(fd, "x", 1) != 1) error = errno != 0 ? errno : ENOSPC;
    ::close(fd);
    fs::remove(probe, ec);
  }
  RELPOS_CHECK(error == 0, path << ": cannot write " << what << " there (" << folder.string() << ": "
                                << std::strerror(error) << ")");
}

std::string count_text(long n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string padded(const std::string& s, std::size_t columns) {
  std::size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;  // a character's first byte
  return n >= columns ? s : s + std::string(columns - n, ' ');
}

std::string preprocess_flags(const Preprocess& p) {
  std::ostringstream os;
  const int c = p.in_chans();
  os << "--width " << p.width << " --height " << p.height;
  if (p.channels != ChannelOrder::Gray) os << (p.channels == ChannelOrder::RGB ? " --rgb" : " --bgr");
  if (p.crop) os << " --crop --crop-mode " << to_string(p.crop_mode) << " --crop-pct " << shortest(p.crop_pct);
  else os << " --no-crop";
  os << " --interpolation " << to_string(p.interpolation) << " --scale " << shortest(p.scale) << " --mean ";
  // pixel units, to 7 digits (the float mean times the float scale is the model's mean to within
  // float rounding)
  for (int i = 0; i < c; ++i)
    os << (i ? "," : "") << std::setprecision(7)
       << static_cast<double>(p.mean[static_cast<std::size_t>(i)]) / static_cast<double>(p.scale);
  os << " --std ";
  for (int i = 0; i < c; ++i) os << (i ? "," : "") << shortest(p.std[static_cast<std::size_t>(i)]);
  os << " --tta " << to_string(p.tta);
  return os.str();
}

std::vector<std::string> expand_inputs(const std::vector<std::string>& inputs,
                                       std::vector<std::pair<std::string, std::string>>& errors) {
  std::vector<std::string> files;
  for (const std::string& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      const std::size_t before = errors.size();
      const std::vector<std::string> found = find_images(in, &errors);  // a broken link is an error, the rest go on
      if (found.empty() && errors.size() == before) errors.emplace_back(in, "folder holds no images");
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::exists(in, ec)) {
      files.push_back(in);
    } else if (std::error_code le; fs::is_symlink(in, le)) {  // named as a folder's search names it
      const fs::path target = fs::read_symlink(in, le);
      errors.emplace_back(in, ec && ec != std::errc::no_such_file_or_directory
                                  ? "cannot open it: " + ec.message()
                                  : "broken symbolic link: its target '" + target.string() + "' does not exist");
    } else {
      errors.emplace_back(in.empty() ? "''" : in, "no such file or folder");
    }
  }
  return files;
}

namespace {
// Length of the valid UTF-8 sequence starting at s[i], or 0 if it is not one.
std::size_t utf8_sequence(const std::string& s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  std::size_t n;
  std::uint32_t cp;
  if ((c & 0xE0) == 0xC0) n = 2, cp = c & 0x1Fu;
  else if ((c & 0xF0) == 0xE0) n = 3, cp = c & 0x0Fu;
  else if ((c & 0xF8) == 0xF0) n = 4, cp = c & 0x07u;
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3Fu);
  }
  const std::uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}
}  // namespace

std::string json_safe_name(const std::string& name, std::string* hex_bytes) {
  std::string out;
  bool valid = true;
  for (std::size_t i = 0; i < name.size();) {
    const std::size_t n = utf8_sequence(name, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      valid = false;
      ++i;
    } else {
      out.append(name, i, n);
      i += n;
    }
  }
  if (hex_bytes) {
    hex_bytes->clear();
    if (!valid) {
      for (unsigned char ch : name) append_hex(*hex_bytes, ch);
    }
  }
  return out;
}

}  // namespace relpos::cli
