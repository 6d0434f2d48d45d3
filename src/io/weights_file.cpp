// The model file formats (docs/formats.md).
#include "io/weights_file.hpp"

#include <cmath>
#include <cctype>
#include <sstream>
#include <iomanip>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/ops_internal.hpp"
#include "io/atomic_file.hpp"
#include "io/base64.hpp"
#include "io/json_reader.hpp"
#include "model/config_file.hpp"
#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

namespace relpos::detail {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "relpos-weights";
constexpr int kVersion = 1;      // float models
constexpr int kVersionInt8 = 2;  // int8 tensors and "quantization" (read: 1 and 2)

// An array of strings, or the name of a labels list shipped in models_dir() ("imagenet-1k" reads
// models/imagenet-1k.txt, one label per line).
std::vector<std::string> labels_from(const json& j, const std::string& where) {
  if (j.is_string()) {
    const std::string name = j.get<std::string>();
    RELPOS_CHECK(!name.empty() && name.find('/') == std::string::npos && name.find("..") == std::string::npos,
                 where << ": labels '" << name << "' is not the name of a shipped labels list");
    return read_labels(models_dir() + "/" + name + ".txt");
  }
  RELPOS_CHECK(j.is_array(), where << ": labels must be an array of strings or a shipped list's name");
  std::vector<std::string> out;
  for (const auto& v : j) {
    RELPOS_CHECK(v.is_string(), where << ": labels must be an array of strings");
    out.push_back(v.get<std::string>());
  }
  return out;
}

Tensor tensor_from_json(const std::string& name, const json& t, int version, bool* is_int8) {
  RELPOS_CHECK(t.is_object() && t.contains("shape") && t.contains("data"),
               "tensor '" << name << "' needs \"shape\" and \"data\"");
  Shape shape;
  for (const auto& d : t.at("shape")) {
    RELPOS_CHECK(d.is_number_integer() && d.get<std::int64_t>() >= 0, "tensor '" << name << "' has a bad shape");
    shape.push_back(d.get<std::int64_t>());
  }
  RELPOS_CHECK(!t.contains("dtype") || t.at("dtype").is_string(),
               "tensor '" << name << "': \"dtype\" must be a string such as \"float32\", got " << t.at("dtype").dump());
  const std::string dtype = t.value("dtype", "float32");
  *is_int8 = dtype == "int8";
  RELPOS_CHECK(dtype == "float32" || (dtype == "int8" && version >= kVersionInt8),
               "tensor '" << name << "' has dtype '" << dtype << "' ("
                          << (dtype == "int8" ? "int8 tensors need format version 2" : "relpos stores float32 and int8")
                          << ")");
  std::int64_t numel = 0;  // checked against the data BEFORE allocating
  try {
    numel = numel_of(shape);  // throws on overflow
  } catch (const Error& e) {
    RELPOS_FAIL("tensor '" << name << "': " << e.what());
  }
  const json& data = t.at("data");
  // base64 text (the only encoding) to bytes, for int8 and float32 tensors alike
  const auto decoded_bytes = [&] {
    const std::string enc = t.value("encoding", "base64");
    RELPOS_CHECK(enc == "base64", "tensor '" << name << "' has unknown encoding '" << enc << "'");
    try {
      return base64_decode(data.get_ref<const std::string&>());
    } catch (const Error& e) {
      RELPOS_FAIL("tensor '" << name << "': " << e.what());
    }
  };
  if (*is_int8) {
    Tensor out(shape);
    float* p = out.data();
    if (data.is_string()) {
      const std::vector<unsigned char> bytes = decoded_bytes();
      RELPOS_CHECK(static_cast<std::int64_t>(bytes.size()) == numel,
                   "tensor '" << name << "' holds " << bytes.size() << " int8 values but shape " << to_string(shape)
                              << " needs " << numel);
      for (unsigned char b : bytes) *p++ = static_cast<float>(static_cast<std::int8_t>(b));
    } else {
      RELPOS_CHECK(data.is_array() && static_cast<std::int64_t>(data.size()) == numel,
                   "tensor '" << name << "': data must be base64 text or an array of " << numel << " integers");
      for (const auto& v : data) {
        RELPOS_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= -128 && v.get<std::int64_t>() <= 127,
                     "tensor '" << name << "' has a value that is not an int8 integer: " << v.dump());
        *p++ = static_cast<float>(v.get<std::int64_t>());
      }
    }
    return out;
  }
  if (data.is_string()) {
    const std::vector<unsigned char> bytes = decoded_bytes();
    RELPOS_CHECK(bytes.size() % 4 == 0, "tensor '" << name << "' holds " << bytes.size()
                                                     << " bytes, not a whole number of float32 values (shape "
                                                     << to_string(shape) << " needs " << numel * 4 << " bytes)");
    RELPOS_CHECK(static_cast<std::int64_t>(bytes.size() / 4) == numel,
                 "tensor '" << name << "' holds " << bytes.size() / 4 << " values but shape " << to_string(shape)
                            << " needs " << numel);
    Tensor out(shape);
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  } else {
    RELPOS_CHECK(data.is_array(), "tensor '" << name << "': data must be base64 text or an array of numbers");
    RELPOS_CHECK(static_cast<std::int64_t>(data.size()) == numel,
                 "tensor '" << name << "' holds " << data.size() << " values but shape " << to_string(shape) << " needs "
                            << numel);
    Tensor out(shape);
    float* p = out.data();
    for (const auto& v : data) {
      RELPOS_CHECK(v.is_number(), "tensor '" << name << "' has a value that is not a number");
      *p++ = static_cast<float>(v.get<double>());
    }
    return out;
  }
}

ModelFile read_json_weights(const std::string& path) {
  const json j = read_json_file(path);
  RELPOS_CHECK(j.is_object(), path << ": not a relpos weights file (not a JSON object)");
  if (!j.contains("format")) {
    RELPOS_CHECK(!j.contains("stages"), path << ": this is a model config without weights; create a model from it "
                                                "(relpos train --config, or Model::create) or pass weights");
    RELPOS_FAIL(path << ": neither a relpos weights file (no \"format\" key) nor a model config (no \"stages\")");
  }
  RELPOS_CHECK(j["format"].is_string() && j["format"] == kFormat,
               path << ": not a relpos weights file (format " << j["format"].dump() << ", expected \"" << kFormat << "\")");
  RELPOS_CHECK(j.contains("version"), path << ": missing \"version\"");
  RELPOS_CHECK(j["version"].is_number_integer(), path << ": \"version\" must be a whole number, got " << j["version"].dump());
  // (read as 64 bits: get<int>() wrapped 4294967297 to 1)
  const std::int64_t version = j["version"].get<std::int64_t>();
  RELPOS_CHECK(!j["version"].is_number_unsigned() || j["version"].get<std::uint64_t>() <= 1000000,
               path << ": weights format version " << j["version"].dump() << " is not supported (this relpos reads versions "
                    << kVersion << " and " << kVersionInt8 << ")");
  RELPOS_CHECK(version == kVersion || version == kVersionInt8,
               path << ": weights format version " << version << " is not supported (this relpos reads versions "
                    << kVersion << " and " << kVersionInt8 << ")");
  ModelFile fc;
  RELPOS_CHECK(j.contains("config"), path << ": missing \"config\"");
  try {
    fc.config = ModelConfig::from_json(j["config"]);
    if (j.contains("labels")) fc.labels = labels_from(j["labels"], "labels");
    if (j.contains("preprocess")) {
      fc.preprocess = Preprocess::from_json(j["preprocess"], default_preprocess(fc.config));
    }
    if (j.contains("quantization")) {
      RELPOS_CHECK(version >= kVersionInt8, "\"quantization\" needs format version " << kVersionInt8);
      fc.int8_layers = int8_layers_from_json(j["quantization"], "quantization");
    }
    RELPOS_CHECK(j.contains("tensors") && j["tensors"].is_object(), "missing \"tensors\" object");
    for (auto it = j["tensors"].begin(); it != j["tensors"].end(); ++it) {
      bool is_int8 = false;
      try {
        fc.tensors.emplace_back(it.key(), tensor_from_json(it.key(), it.value(), version, &is_int8));
      } catch (const json::exception& e) {  // ("encoding": 1): the tensor named
        RELPOS_FAIL("tensor '" << it.key() << "': unexpected JSON structure (" << detail::short_parse_error(e) << ")");
      }
      if (is_int8) fc.int8_tensors.insert(it.key());
    }
  } catch (const Error& e) {
    RELPOS_FAIL(path << ": " << e.what());
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": unexpected JSON structure (" << e.what() << ")");
  }
  return fc;
}

namespace {
// --config names the architecture of a file that has none (a timm checkpoint). A file that carries
// its own keeps it: another one given is an error, not silently ignored (or obeyed for one format).
void check_config_agrees(const ModelConfig& own, const ModelConfig& given, const std::string& config) {
  json a = own.to_json(), b = given.to_json();
  a.erase("name");
  b.erase("name");
  RELPOS_CHECK(a == b, "the file carries its own architecture ('" << own.name << "'), which differs from the config "
                                                                   << config << " ('" << given.name
                                                                   << "') given for it (--config, LoadOptions::config): "
                                                                      "that is for files without one, such as timm "
                                                                      "checkpoints");
}

// The preprocessing and labels a file lacks come from --config; ones it has stay, and a --config
// that says otherwise is an error (it was silently dropped: the file's crop_pct or labels were used).
void take_config_extras(ModelFile& fc, ModelFile& given, const std::string& config) {
  if (fc.preprocess && given.preprocess) {
    // only what the config says itself: its defaults for the rest (tta "none") are no claim about
    // the file (the shipped botnet-fmnist.json, with tta "hflip", was refused with fmnist_botnet)
    const json a = fc.preprocess->to_json(), b = given.preprocess->to_json();
    for (auto it = a.begin(); it != a.end(); ++it)
      RELPOS_CHECK(!given.preprocess_keys.count(it.key()) || (b.contains(it.key()) && b.at(it.key()) == it.value()),
                   "the file carries its own preprocessing, whose " << it.key() << " (" << it.value().dump()
                                                                   << ") differs from the config " << config << "'s ("
                                                                   << (b.contains(it.key()) ? b.at(it.key()).dump() : "none")
                                                                   << ") given for it (--config, LoadOptions::config), "
                                                                      "which does not change a file's preprocessing: "
                                                                      "give the preprocessing flags (Model::set_preprocess; "
                                                                      "relpos convert writes them into a file)");
  }
  if (!fc.labels.empty() && !given.labels.empty() && fc.labels != given.labels) {
    std::size_t i = 0;
    while (i < fc.labels.size() && i < given.labels.size() && fc.labels[i] == given.labels[i]) ++i;
    std::ostringstream at;
    if (i < fc.labels.size() && i < given.labels.size())
      at << "class " << i << " is '" << fc.labels[i] << "' in the file, '" << given.labels[i] << "' in the config";
    else
      at << fc.labels.size() << " labels in the file, " << given.labels.size() << " in the config";
    RELPOS_FAIL("the file carries its own labels, which differ from the config " << config << "'s (" << at.str()
                                                                                << ") given for it (--config, "
                                                                                   "LoadOptions::config); give --labels "
                                                                                   "(Model::set_labels) to change them");
  }
  if (!fc.preprocess) fc.preprocess = given.preprocess;
  if (fc.labels.empty()) fc.labels = std::move(given.labels);
}
}  // namespace

ModelFile read_safetensors_weights(const std::string& path, const std::string& config) {
  const SafetensorsFile f = SafetensorsFile::read(path);
  ModelFile fc, shipped;  // shipped: the config named by `config`, read once
  const auto& meta = f.metadata();
  try {
    if (!config.empty()) shipped = read_config_file(config);
    if (meta.count("relpos.config")) {
      fc.config = ModelConfig::from_json(parse_json_text(meta.at("relpos.config"), "relpos.config"));
      if (!config.empty()) check_config_agrees(fc.config, shipped.config, config);
    } else if (!config.empty()) {
      fc.config = shipped.config;
      // A file without relpos's metadata is timm's (or PyTorch's under timm's names), and timm's tiered
      // stems always stride 4: "none" strides 2, so its weights would load and answer wrongly
      RELPOS_CHECK(!(fc.config.stem.type == StemType::Tiered && fc.config.stem.pool == StemPool::None),
                   "the config " << config << " (--config, LoadOptions::config) has a tiered stem with \"pool\": \"none\" (relpos's own layout, "
                              "which timm cannot build), but this file holds no relpos config: a timm checkpoint. "
                              "timm's tiered stem pools with \"maxpool\" or, with stem_pool='' (resnet32ts, "
                              "resnet33ts), strides conv3: \"conv3\" (docs/config.md)");
    } else {
      RELPOS_FAIL("this safetensors file holds no model config (a timm checkpoint?); name the architecture (a config "
                  "file or a shipped name such as botnet26t_256) with --config, or LoadOptions::config in C++");
    }
    if (meta.count("relpos.version")) {
      const std::string v = meta.at("relpos.version");
      RELPOS_CHECK(v == std::to_string(kVersion) || v == std::to_string(kVersionInt8),
                   "weights format version " << v << " is not supported (this relpos reads versions " << kVersion
                                             << " and " << kVersionInt8 << ")");
    }
    if (meta.count("relpos.quantization")) {
      // as the JSON form: int8 layers came with format version 2; a file that says otherwise (or
      // nothing) is not one this relpos wrote
      RELPOS_CHECK(meta.count("relpos.version") && meta.at("relpos.version") == std::to_string(kVersionInt8),
                   "relpos.quantization needs relpos.version " << kVersionInt8 << ", the file has "
                                                               << (meta.count("relpos.version") ? meta.at("relpos.version") : "none"));
      fc.int8_layers = int8_layers_from_json(parse_json_text(meta.at("relpos.quantization"), "relpos.quantization"), "relpos.quantization");
    }
    if (meta.count("relpos.labels")) fc.labels = labels_from(parse_json_text(meta.at("relpos.labels"), "relpos.labels"), "labels");
    if (meta.count("relpos.preprocess")) {
      fc.preprocess = Preprocess::from_json(parse_json_text(meta.at("relpos.preprocess"), "relpos.preprocess"), default_preprocess(fc.config));
    }
    // the config may carry the preprocessing and labels its weights were trained with
    take_config_extras(fc, shipped, config);
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": bad relpos metadata (" << e.what() << ")");
  } catch (const Error& e) {
    RELPOS_FAIL(path << ": " << e.what());
  }
  // A training checkpoint holds the model's tensors as "model.*" next to the optimizer's "optim.*"
  // and, when the run kept an EMA of the weights, "ema.*": then those are the model (the weights the
  // run evaluated and saved).
  const bool checkpoint = meta.count("relpos.format") && meta.at("relpos.format") == "relpos-checkpoint";
  bool has_ema = false;
  for (const auto& e : f.entries()) has_ema = has_ema || (checkpoint && e.name.rfind("ema.", 0) == 0);
  const std::string prefix = has_ema ? "ema." : "model.";
  for (const auto& e : f.entries()) {
    if (!checkpoint && e.dtype == "I8") fc.int8_tensors.insert(e.name);
    if (!checkpoint) fc.tensors.emplace_back(e.name, f.tensor(e.name));
    else if (e.name.rfind(prefix, 0) == 0) fc.tensors.emplace_back(e.name.substr(prefix.size()), f.tensor(e.name));
  }
  return fc;
}

// The keys of the top-level object, until one says "weights file".
struct TopLevelKeys : nlohmann::json_sax<json> {
  int depth = 0;
  bool weights = false, stages = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return ++depth, true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth != 1) return true;
    if (k == "format" || k == "tensors") return weights = true, false;  // stop: a weights file
    if (k == "stages") stages = true;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

// For the message about a file that is neither JSON nor safetensors: what it seems to hold.
std::string what_file_holds(const unsigned char* head, std::uintmax_t size, char first) {
  const auto starts = [&](const char* magic, std::size_t n) { return size >= n && std::memcmp(head, magic, n) == 0; };
  if (starts("\x89PNG", 4)) return "a PNG image";
  if (starts("\xFF\xD8\xFF", 3)) return "a JPEG image";
  if (starts("GIF8", 4)) return "a GIF image";
  if (starts("RIFF", 4) && size >= 12) return "a RIFF file (a WebP image?)";
  if (size < 9) return "only " + std::to_string(size) + " bytes";
  if (first == '[' || first == '"' || first == '-' || std::isdigit(static_cast<unsigned char>(first)) || first == 't' ||
      first == 'f' || first == 'n')
    return std::string("JSON whose top level is not an object: it starts with '") + first + "'";
  std::ostringstream os;
  os << "its first bytes are" << std::hex;
  for (int i = 0; i < 8; ++i) os << ' ' << std::setw(2) << std::setfill('0') << static_cast<int>(head[i]);
  return os.str();
}

}  // namespace

ModelFileKind model_file_kind(const std::string& path) {
  std::error_code ec;
  RELPOS_CHECK(std::filesystem::exists(path, ec), path << ": no such file");
  RELPOS_CHECK(!std::filesystem::is_directory(path, ec),
               path << ": is a directory; expected a model file (.json or .safetensors)");
  check_regular_file(path, "model files");
  std::ifstream in(path, std::ios::binary);
  RELPOS_CHECK(in, path << ": cannot open the file");
  // safetensors: an 8-byte little-endian header length that fits the file, then the header's '{'.
  // Checked first, since the length's own bytes may be a space or a '{' (0x7B20 is both). No JSON
  // text passes: its eighth byte is printable or white space, which makes the length at least 2^57.
  unsigned char head[9] = {};
  const auto file_size = std::filesystem::file_size(path, ec);
  bool safetensors_like = false;  // the header's '{', or a header length that fits the file
  if (!ec && in.read(reinterpret_cast<char*>(head), 9)) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | head[i];
    const bool fits = n >= 2 && n <= file_size - 8;
    if (fits && head[8] == '{') return ModelFileKind::Safetensors;
    safetensors_like = fits || head[8] == '{';
  }
  in.clear();
  in.seekg(0);
  char c;
  // a UTF-8 byte-order mark (Windows editors write one) before the JSON
  char bom[3] = {};
  if (!(in.read(bom, 3) && bom[0] == '\xEF' && bom[1] == '\xBB' && bom[2] == '\xBF')) {
    in.clear();
    in.seekg(0);
  }
  while (in.get(c)) {
    if (std::isspace(static_cast<unsigned char>(c))) continue;
    // a damaged safetensors file (its length does not fit): its reader names the damage
    if (c != '{' && safetensors_like) return ModelFileKind::Safetensors;
    RELPOS_CHECK(c == '{', path << ": not a model file (" << what_file_holds(head, ec ? 0 : file_size, c)
                                << "); relpos reads weights and configs as JSON objects and safetensors files");
    // JSON: a weights file has "format" or "tensors" at the top; a config has "stages" and neither.
    // Read as a stream of events that stops at the first telling key, so that a large weights
    // file is not parsed here as well as by its reader.
    TopLevelKeys keys;
    std::ifstream whole(path, std::ios::binary);
    json::sax_parse(whole, &keys, json::input_format_t::json, /*strict=*/false);
    return keys.weights || !keys.stages ? ModelFileKind::WeightsJson : ModelFileKind::Config;
  }
  RELPOS_FAIL(path << ": empty file");
}

namespace {
// The value of the top-level "format" key of a JSON file, read as a stream of events that stops
// there (a weights file is not parsed whole to learn it); "" when there is none.
struct TopLevelFormat : nlohmann::json_sax<json> {
  int depth = 0;
  bool next_is_format = false;
  std::string format;
  bool null() override { return next_is_format = false, true; }
  bool boolean(bool) override { return next_is_format = false, true; }
  bool number_integer(number_integer_t) override { return next_is_format = false, true; }
  bool number_unsigned(number_unsigned_t) override { return next_is_format = false, true; }
  bool number_float(number_float_t, const string_t&) override { return next_is_format = false, true; }
  bool string(string_t& v) override {
    if (next_is_format) return format = v, false;  // found: stop
    return true;
  }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return next_is_format = false, ++depth <= kMaxJsonDepth; }
  bool end_object() override { return --depth > 0; }  // the top level's end: stop
  bool start_array(std::size_t) override { return next_is_format = false, ++depth <= kMaxJsonDepth; }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override { return next_is_format = depth == 1 && k == "format", true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};
}  // namespace

bool is_relpos_model_file(const std::string& path) {
  try {
    if (model_file_kind(path) == ModelFileKind::Safetensors) {
      // the header alone: its length, then the JSON text holding __metadata__
      std::ifstream in(path, std::ios::binary);
      unsigned char len[8];
      if (!in.read(reinterpret_cast<char*>(len), 8)) return false;
      std::uint64_t n = 0;
      for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
      if (n > (std::uint64_t{100} << 20)) return false;
      std::string header(static_cast<std::size_t>(n), '\0');
      if (!in.read(header.data(), static_cast<std::streamsize>(n))) return false;
      const json h = parse_json_text(header, path);
      return h.contains("__metadata__") && h["__metadata__"].is_object() &&
             h["__metadata__"].value("relpos.format", std::string()) == "relpos-weights";
    }
    std::ifstream in(path, std::ios::binary);
    TopLevelFormat sax;
    json::sax_parse(in, &sax, json::input_format_t::json, /*strict=*/false);
    return sax.format == kFormat;
  } catch (const std::exception&) {  // relpos::Error, a JSON type error, bad_alloc: not one to replace
    return false;
  }
}

ModelFile read_weights_file(const std::string& path, const std::string& config) {
  const ModelFileKind kind = model_file_kind(path);
  RELPOS_CHECK(kind != ModelFileKind::Config,
               path << ": this is a model config without weights; create a model from it (relpos train --config, "
                       "Model::create or Model::open) or pass weights");
  if (kind == ModelFileKind::Safetensors) return read_safetensors_weights(path, config);
  ModelFile fc = read_json_weights(path);
  if (!config.empty()) {
    // a shipped config may carry the preprocessing and labels its weights were trained with
    ModelFile c = read_config_file(config);
    try {
      check_config_agrees(fc.config, c.config, config);
      take_config_extras(fc, c, config);
    } catch (const Error& e) {
      RELPOS_FAIL(path << ": " << e.what());
    }
  }
  return fc;
}

ModelFile read_config_file(const std::string& path_or_name) {
  const std::string path = find_config(path_or_name);
  ModelFile fc;
  const json j = read_json_file(path);  // parsed once for the config, its labels and its preprocessing
  fc.config = config_in_file(j, path);
  try {
    if (j.contains("labels")) fc.labels = labels_from(j["labels"], path + ": labels");
    if (j.contains("preprocess")) {
      fc.preprocess = Preprocess::from_json(j["preprocess"], default_preprocess(fc.config));
      for (auto it = j["preprocess"].begin(); it != j["preprocess"].end(); ++it) fc.preprocess_keys.insert(it.key());
    }
  } catch (const Error& e) {
    RELPOS_FAIL(naming(path, e.what()));
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": unexpected JSON structure (" << e.what() << ")");
  }
  return fc;
}

std::string weights_json_text(const Model& model, TensorEncoding encoding) {
  ojson j;
  const bool int8 = !model.network().int8_layers().empty();
  j["format"] = kFormat;
  j["version"] = int8 ? kVersionInt8 : kVersion;  // a float model stays readable by older relpos
  j["config"] = model.network().config().to_json();
  j["labels"] = model.labels();
  j["preprocess"] = model.preprocess().to_json();
  if (int8) j["quantization"] = quantization_json(model.network());
  ojson tensors = ojson::object();
  for (const ParamRef& p : model.network().params()) {
    const Tensor t = p.value->to(Device::CPU).contiguous();
    ojson e;
    e["shape"] = t.shape();
    e["dtype"] = p.int8 ? "int8" : "float32";
    if (p.int8) {
      std::vector<std::int8_t> q(static_cast<std::size_t>(t.numel()));
      for (std::size_t i = 0; i < q.size(); ++i) q[i] = static_cast<std::int8_t>(t.data()[i]);
      if (encoding == TensorEncoding::Base64) {
        e["encoding"] = "base64";
        e["data"] = base64_encode(q.data(), q.size());
      } else {
        e["data"] = std::vector<int>(q.begin(), q.end());
      }
    } else if (encoding == TensorEncoding::Base64) {
      e["encoding"] = "base64";
      e["data"] = base64_encode(t.data(), t.bytes());
    } else {
      ojson values = ojson::array();
      for (std::int64_t i = 0; i < t.numel(); ++i) {
        const float v = t.data()[i];
        RELPOS_CHECK(std::isfinite(v), "tensor '" << p.name << "' holds " << v
                                                  << ", which plain JSON numbers cannot store; save with base64");
        values.push_back(static_cast<double>(v));
      }
      e["data"] = std::move(values);
    }
    tensors[p.name] = std::move(e);
  }
  j["tensors"] = std::move(tensors);
  return j.dump(encoding == TensorEncoding::Base64 ? -1 : 1);
}

std::map<std::string, std::string> model_metadata(const Model& model, const std::string& format) {
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"relpos.format", format},
                                          {"relpos.config", model.network().config().to_json().dump()},
                                          {"relpos.labels", json(model.labels()).dump()},
                                          {"relpos.preprocess", model.preprocess().to_json().dump()}};
  if (!model.network().int8_layers().empty()) {
    meta["relpos.version"] = std::to_string(kVersionInt8);
    meta["relpos.quantization"] = quantization_json(model.network()).dump();
  }
  return meta;
}

ojson quantization_json(const Network& net) {
  ojson layers = ojson::object();
  for (const Int8Layer& l : net.int8_layers()) layers[l.name] = {{"input", l.input_signed ? "s8" : "u8"}};
  return {{"weights", "int8, symmetric, per output channel"},
          {"activations", "static per-tensor scale (tensor <layer>.input_scale)"},
          {"layers", std::move(layers)}};
}

std::vector<Int8Layer> int8_layers_from_json(const json& q, const std::string& where) {
  RELPOS_CHECK(q.is_object() && q.contains("layers") && q["layers"].is_object(),
               where << ": needs a \"layers\" object (layer name -> {\"input\": \"u8\" or \"s8\"})");
  std::vector<Int8Layer> out;
  for (auto it = q["layers"].begin(); it != q["layers"].end(); ++it) {
    const json& l = it.value();
    RELPOS_CHECK(l.is_object() && l.contains("input") && l["input"].is_string() &&
                     (l["input"] == "u8" || l["input"] == "s8"),
                 where << ".layers." << it.key() << ": \"input\" must be \"u8\" or \"s8\"");
    out.push_back({it.key(), 1.0f, l["input"] == "s8"});  // the scale is the tensor <layer>.input_scale
  }
  return out;
}

void assign_tensors(Network& net, std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source,
                    const std::set<std::string>* int8_tensors) {
  std::map<std::string, Tensor*> given;
  for (auto& [name, t] : tensors) {
    if (name.size() >= 19 && name.compare(name.size() - 19, 19, "num_batches_tracked") == 0) continue;
    // a model wrapped by DistributedDataParallel (or an EMA of one) names its tensors module.<name>;
    // timm's load_checkpoint strips that, and so does relpos
    if (name.rfind("module.", 0) == 0) name.erase(0, 7);
    RELPOS_CHECK(given.emplace(name, &t).second, source << ": tensor '" << name << "' appears twice");
  }
  std::set<std::string> known;
  std::vector<std::string> missing;
  for (const ParamRef& p : net.params()) {
    known.insert(p.name);
    if (!given.count(p.name)) missing.push_back(p.name);
  }
  if (!missing.empty()) {
    // the tensor under a prefix (a training checkpoint's state_dict. or state_dict_ema., flattened)
    std::string prefixed;
    for (const auto& entry : given)
      if (entry.first.size() > missing.front().size() &&
          entry.first.compare(entry.first.size() - missing.front().size() - 1, std::string::npos, "." + missing.front()) == 0)
        prefixed = entry.first;
    RELPOS_CHECK(prefixed.empty(), source << ": missing tensor '" << missing.front() << "'"
                                          << (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : std::string())
                                          << "; the file has '" << prefixed << "': its names carry the prefix '"
                                          << prefixed.substr(0, prefixed.size() - missing.front().size())
                                          << "', which relpos does not strip (only DistributedDataParallel's 'module.')");
  }
  // Tensors the config has no place for say first that the file is of another architecture (timm's
  // final_conv, a squeeze-excitation's fc1, a halo or lambda layer): a shape or missing-tensor
  // error further down would name a side effect of that.
  std::vector<std::string> unknown;
  for (const auto& entry : given)
    if (!known.count(entry.first)) unknown.push_back(entry.first);
  if (!unknown.empty()) {
    std::ostringstream names;
    for (std::size_t i = 0; i < unknown.size() && i < 3; ++i) names << (i ? ", '" : "'") << unknown[i] << "'";
    RELPOS_FAIL(source << ": unknown tensor" << (unknown.size() > 1 ? "s " : " ") << names.str()
                       << (unknown.size() > 3 ? " (and " + std::to_string(unknown.size() - 3) + " more)" : std::string())
                       << " (not " << (unknown.size() > 1 ? "parameters" : "a parameter") << " of " << net.config().name
                       << (missing.empty() ? ")"
                                           : "; and it lacks '" + missing.front() + "'" +
                                                 (missing.size() > 1 ? " and " + std::to_string(missing.size() - 1) + " more" : std::string()) +
                                                 "): the file holds another architecture, or layers relpos does not have"));
  }
  for (const ParamRef& p : net.params()) {
    auto it = given.find(p.name);
    if (it == given.end()) continue;
    RELPOS_CHECK(it->second->shape() == p.value->shape(),
                 source << ": tensor '" << p.name << "' has shape " << to_string(it->second->shape()) << " but "
                        << net.config().name << " needs " << to_string(p.value->shape()));
    if (int8_tensors)  // (the file's names, which may carry the 'module.' dropped above)
      RELPOS_CHECK(p.int8 == (int8_tensors->count(p.name) != 0 || int8_tensors->count("module." + p.name) != 0),
                   source << ": tensor '" << p.name << "' is " << (p.int8 ? "not stored as int8" : "stored as int8")
                          << " but " << (p.int8 ? "an int8 layer's weights must be int8" : "only int8 layers' weights are int8"));
  }
  RELPOS_CHECK(missing.empty(), source << ": missing tensor '" << missing.front() << "'"
                                       << (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : std::string()));
  // A NaN or an infinity in a float tensor is a corrupt file or a diverged run: the network would
  // answer anyway (the convolutions' fused ReLU turns NaN into 0), so it is refused here, by name.
  for (const ParamRef& p : net.params()) {
    if (p.int8) continue;
    const Tensor& t = *given.at(p.name);
    const float* v = t.data();
    for (std::int64_t i = 0; i < t.numel(); ++i)
      RELPOS_CHECK(std::isfinite(v[i]), source << ": tensor '" << p.name << "' holds " << v[i] << " (element " << i
                                               << " of " << t.numel()
                                               << "); weights must be finite (a damaged file, or a run that diverged?)");
  }
  for (const ParamRef& p : net.params()) {
    if (!p.int8) continue;
    const Tensor& t = *given.at(p.name);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      RELPOS_CHECK(t.data()[i] >= -127.0f && t.data()[i] <= 127.0f && t.data()[i] == std::nearbyint(t.data()[i]),
                   source << ": tensor '" << p.name << "' holds " << t.data()[i]
                          << "; int8 weights must be integers in [-127, 127]");
  }
  // An int8 layer's scales multiply every output: zero, negative, subnormal (whose inverse is
  // infinite) or huge ones make any answer.
  for (const ParamRef& p : net.params()) {
    const auto ends_with = [&](const char* s) {
      const std::size_t n = std::strlen(s);
      return p.name.size() >= n && p.name.compare(p.name.size() - n, n, s) == 0;
    };
    if (!ends_with(".weight_scale") && !ends_with(".input_scale")) continue;
    const Tensor& t = *given.at(p.name);
    for (std::int64_t i = 0; i < t.numel(); ++i)
      RELPOS_CHECK(ops::usable_int8_scale(t.data()[i]),
                   source << ": tensor '" << p.name << "' holds " << t.data()[i] << " (element " << i << " of " << t.numel()
                          << "); an int8 layer's scales must be positive normal floats below 1e30");
  }
  for (const ParamRef& p : net.params()) p.value->copy_from(*given.at(p.name));
  net.prepare_inference();
}

}  // namespace relpos::detail
