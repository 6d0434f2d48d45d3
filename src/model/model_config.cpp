#include "relpos/model_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <dlfcn.h>

#include <filesystem>
#include <set>

#include "core/environment.hpp"
#include "io/json_reader.hpp"
#include "layers/blocks.hpp"
#include "model/config_file.hpp"
#include "relpos/error.hpp"

namespace relpos {

using nlohmann::json;

bool StemConfig::operator==(const StemConfig& o) const {
  return type == o.type && chs == o.chs && kernel == o.kernel && stride == o.stride && pool == o.pool;
}
bool SelfAttnConfig::operator==(const SelfAttnConfig& o) const {
  return heads == o.heads && qk_ratio == o.qk_ratio && pos == o.pos && clip == o.clip && per_head == o.per_head &&
         scale_pos_embed == o.scale_pos_embed;
}
bool SasaConfig::operator==(const SasaConfig& o) const {
  return heads == o.heads && kernel == o.kernel && qk_ratio == o.qk_ratio;
}

namespace {

using detail::EnumName;
using Reader = detail::JsonReader;

constexpr EnumName<StemType> kStemTypes[] = {{StemType::Tiered, "tiered"}, {StemType::Conv, "conv"}};
constexpr EnumName<StemPool> kStemPools[] = {
    {StemPool::MaxPool, "maxpool"}, {StemPool::None, "none"}, {StemPool::None, ""}, {StemPool::StridedConv3, "conv3"}};
constexpr EnumName<BlockType> kBlockTypes[] = {
    {BlockType::Bottle, "bottle"}, {BlockType::SelfAttn, "self_attn"}, {BlockType::Sasa, "sasa"}};

SelfAttnConfig read_self_attn(Reader r, SelfAttnConfig c) {
  c.heads = r.int_in("heads", c.heads, 1, 64);
  c.qk_ratio = static_cast<float>(r.num_in("qk_ratio", c.qk_ratio, 0.0, 4.0));
  c.pos = parse_pos_encoding(r.get("pos", to_string(c.pos)));
  c.clip = r.int_in("clip", c.clip, 0, 64);
  c.per_head = r.get("per_head", c.per_head);
  c.scale_pos_embed = r.get("scale_pos_embed", c.scale_pos_embed);
  r.done();
  return c;
}

SasaConfig read_sasa(Reader r, SasaConfig c) {
  c.heads = r.int_in("heads", c.heads, 1, 64);
  c.kernel = r.int_in("kernel", c.kernel, 1, 15);
  c.qk_ratio = static_cast<float>(r.num_in("qk_ratio", c.qk_ratio, 0.0, 4.0));
  r.done();
  RELPOS_CHECK(c.kernel % 2 == 1, r.at("kernel") << " must be odd, got " << c.kernel);
  return c;
}

json self_attn_json(const SelfAttnConfig& c) {
  return {{"heads", c.heads}, {"qk_ratio", c.qk_ratio}, {"pos", to_string(c.pos)}, {"clip", c.clip},
          {"per_head", c.per_head}, {"scale_pos_embed", c.scale_pos_embed}};
}
json sasa_json(const SasaConfig& c) { return {{"heads", c.heads}, {"kernel", c.kernel}, {"qk_ratio", c.qk_ratio}}; }

}  // namespace

std::string to_string(StemType t) { return detail::enum_name(t, kStemTypes); }
std::string to_string(StemPool p) { return detail::enum_name(p, kStemPools); }
std::string to_string(BlockType t) { return detail::enum_name(t, kBlockTypes); }
StemType parse_stem_type(const std::string& s) { return detail::parse_enum(s, kStemTypes, "stem type"); }
StemPool parse_stem_pool(const std::string& s) { return detail::parse_enum(s, kStemPools, "stem pool"); }
BlockType parse_block_type(const std::string& s) { return detail::parse_enum(s, kBlockTypes, "block type"); }

ModelConfig ModelConfig::from_json(const json& j) {
  RELPOS_CHECK(j.is_object(), "a model config must be a JSON object");
  for (const char* key : {"stem", "stages"})
    RELPOS_CHECK(j.contains(key), "model config: missing \"" << key << "\" (see docs/config.md)");
  Reader r(j, "model config");
  ModelConfig c;
  c.name = r.get<std::string>("name", c.name);
  RELPOS_CHECK(c.name.size() <= 128, "model config: name is longer than 128 characters");
  c.in_chans = r.int_in("in_chans", c.in_chans, 1, 3);
  c.num_classes = r.int_in("num_classes", c.num_classes, 1, 100000);
  if (r.has("input_size")) {
    const json& size = r.raw("input_size");
    RELPOS_CHECK(size.is_array() && size.size() == 2, "model config: input_size must be [height, width]");
    c.input_size = {r.check_int("input_size[0]", size[0], 1, 4096), r.check_int("input_size[1]", size[1], 1, 4096)};
  }
  c.act = parse_act(r.get<std::string>("act", to_string(c.act)));
  c.zero_init_last = r.get("zero_init_last", c.zero_init_last);
  if (r.has("self_attn")) c.self_attn = read_self_attn(r.child("self_attn"), c.self_attn);
  if (r.has("sasa")) c.sasa = read_sasa(r.child("sasa"), c.sasa);
  {
    Reader s = r.child("stem");
    c.stem.type = s.enum_in("type", c.stem.type, kStemTypes);
    c.stem.chs = s.need_int_in("chs", 8, 1024);
    c.stem.kernel = s.int_in("kernel", c.stem.kernel, 1, 15);
    c.stem.stride = s.int_in("stride", c.stem.stride, 1, 4);
    c.stem.pool = s.enum_in("pool", c.stem.pool, kStemPools);
    // timm's tiered stem without a pool strides in conv3 ("conv3"); relpos's "none" never did, and
    // keeps its meaning in files written before "conv3" was (which older relpos refuses, not misreads)
    RELPOS_CHECK(c.stem.pool != StemPool::StridedConv3 || c.stem.type == StemType::Tiered,
                 "model config: stem: \"pool\": \"conv3\" (conv3 strides instead of a pool) needs a tiered stem");
    // timm's spelling of no pool means a strided conv3 on a tiered stem: say which is meant
    RELPOS_CHECK(c.stem.type != StemType::Tiered || !s.has("pool") || s.get<std::string>("pool", "x") != "",
                 "model config: stem: \"pool\": \"\" on a tiered stem: write \"conv3\" for timm's tiered stem without a "
                 "pool (conv3 strides 2, as timm's stem_pool='' in resnet32ts) or \"none\" (no stride there)");
    s.done();
  }
  const json& stages = r.raw("stages");
  RELPOS_CHECK(stages.is_array() && !stages.empty() && stages.size() <= 16,
               "model config: stages must be an array of 1 to 16 stages");
  for (std::size_t i = 0; i < stages.size(); ++i) {
    const std::string where = "model config: stages[" + std::to_string(i) + "]";
    Reader s(stages[i], where);
    StageConfig st;
    std::vector<std::string> types;
    if (s.has("types")) {
      types = s.need<std::vector<std::string>>("types");
    } else {
      const auto type = s.need<std::string>("type");
      types.assign(static_cast<std::size_t>(s.int_in("depth", 1, 1, 64)), type);
    }
    RELPOS_CHECK(!types.empty() && types.size() <= 64, where << ": a stage needs 1 to 64 blocks");
    if (s.has("depth") && s.has("types"))
      RELPOS_CHECK(s.int_in("depth", 0, 1, 64) == static_cast<int>(types.size()), where << ": depth does not match types");
    const int chs = s.need_int_in("chs", 1, 8192);
    const int stride = s.int_in("stride", 1, 1, 2);
    const double br = s.num_in("br", 0.25, 0.0, 4.0);
    const int gs = s.int_in("group_size", 0, 0, 8192);
    st.self_attn = s.has("self_attn") ? read_self_attn(s.child("self_attn"), c.self_attn) : c.self_attn;
    st.sasa = s.has("sasa") ? read_sasa(s.child("sasa"), c.sasa) : c.sasa;
    s.done();
    for (std::size_t b = 0; b < types.size(); ++b) {
      const BlockType type = detail::parse_enum(types[b], kBlockTypes, where + ": block type");
      // a bottleneck's 3x3 convolution in groups of group_size channels: its chs x br middle
      // channels (rounded as timm rounds them) must split into whole groups
      if (type == BlockType::Bottle && gs > 0) {
        const int mid = make_divisible(chs * br);
        RELPOS_CHECK(mid % gs == 0, where << ": group_size " << gs << " does not divide the " << mid
                                          << " middle channels of its bottleneck blocks (chs " << chs << " x br " << br
                                          << "); give a divisor of " << mid);
      }
      st.blocks.push_back({type, chs, b == 0 ? stride : 1, br, gs});
    }
    c.stages.push_back(std::move(st));
  }
  r.done();
  return c;
}

json ModelConfig::to_json() const {
  json j;
  j["name"] = name;
  j["in_chans"] = in_chans;
  j["num_classes"] = num_classes;
  j["input_size"] = {input_size[0], input_size[1]};
  j["act"] = to_string(act);
  j["zero_init_last"] = zero_init_last;
  j["stem"] = {{"type", to_string(stem.type)}, {"chs", stem.chs}, {"pool", to_string(stem.pool)}};
  if (stem.type == StemType::Conv) j["stem"]["kernel"] = stem.kernel, j["stem"]["stride"] = stem.stride;
  j["self_attn"] = self_attn_json(self_attn);
  j["sasa"] = sasa_json(sasa);
  json stages_j = json::array();
  for (const auto& st : stages) {
    json types = json::array();
    for (const auto& b : st.blocks) types.push_back(to_string(b.type));
    const BlockConfig& b0 = st.blocks.front();
    json s = {{"types", types}, {"chs", b0.chs}, {"stride", b0.stride}, {"br", b0.br}};
    if (b0.group_size) s["group_size"] = b0.group_size;
    if (!(st.self_attn == self_attn)) s["self_attn"] = self_attn_json(st.self_attn);
    if (!(st.sasa == sasa)) s["sasa"] = sasa_json(st.sasa);
    stages_j.push_back(s);
  }
  j["stages"] = stages_j;
  return j;
}

namespace {
// Whether `file` lies under `dir` (both made absolute and without symlinks where they exist).
bool lies_under(const std::filesystem::path& file, const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path f = fs::weakly_canonical(file, ec);
  if (ec) return false;
  const fs::path d = fs::weakly_canonical(dir, ec);
  if (ec) return false;
  auto fi = f.begin();
  for (auto di = d.begin(); di != d.end(); ++di) {
    if (di->empty()) continue;  // the trailing "" of a path ending in '/'
    if (fi == f.end() || *fi != *di) return false;
    ++fi;
  }
  return true;
}
}  // namespace

std::string models_dir() {
  if (const char* env = std::getenv("RELPOS_MODELS"); env && *env) return env;  // set but empty: as unset
  namespace fs = std::filesystem;
  // The file holding this code: librelpos.so for a shared library, the program for a static one.
  Dl_info info{};
  fs::path image;
  if (dladdr(reinterpret_cast<void*>(&models_dir), &info) != 0 && info.dli_fname) {
    std::error_code ec;
    image = fs::weakly_canonical(fs::path(info.dli_fname), ec);
    if (ec) image.clear();
  }
  // Installed: <prefix>/<libdir>/librelpos.so and <prefix>/<datadir>/relpos/models, wherever the
  // prefix was copied to.
  if (!image.empty()) {
    const fs::path installed = (image.parent_path() / RELPOS_LIB_TO_MODELS).lexically_normal();
    if (fs::is_directory(installed)) return installed.string();  // <prefix>/share/..., not lib/../share/...
  }
  // The build tree's library and tests use this tree's models, not an older install's.
  if (!image.empty() && lies_under(image, RELPOS_BUILD_DIR) && fs::is_directory(RELPOS_MODELS_DIR))
    return RELPOS_MODELS_DIR;
  // A static librelpos is part of its consumer's program, which dladdr names: the models are then
  // found where CMAKE_INSTALL_PREFIX put them.
  if (fs::is_directory(RELPOS_INSTALLED_MODELS_DIR)) return RELPOS_INSTALLED_MODELS_DIR;
  if (fs::is_directory(RELPOS_MODELS_DIR)) return RELPOS_MODELS_DIR;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const fs::path& p : {exe.parent_path().parent_path() / "models", exe.parent_path() / "models"})
      if (fs::is_directory(p)) return p.string();
  }
  return "models";
}

std::string find_config(const std::string& path_or_name) {
  namespace fs = std::filesystem;
  const std::string shipped = models_dir() + "/" + path_or_name + ".json";
  std::error_code ec;
  // a folder named as a shipped model in the working folder (say a training run's output) does not
  // hide the shipped one; a file of that name does (it is what the user has there)
  if (fs::exists(path_or_name, ec) && !(fs::is_directory(path_or_name, ec) && fs::is_regular_file(shipped, ec)))
    return path_or_name;
  RELPOS_CHECK(fs::exists(shipped), "model config '" << path_or_name << "' is neither a file nor a config in "
                                                     << models_dir());
  return shipped;
}

ModelConfig ModelConfig::load(const std::string& path_or_name) {
  const std::string path = find_config(path_or_name);
  return detail::config_in_file(detail::read_json_file(path), path);
}

ModelConfig detail::config_in_file(json j, const std::string& path) {
  RELPOS_CHECK(j.is_object(), path << ": a model config must be a JSON object");
  // A weights file carries its config inside.
  if (j.contains("config") && j.contains("tensors")) j = j.at("config");
  j.erase("preprocess");
  j.erase("labels");
  try {
    return ModelConfig::from_json(j);
  } catch (const Error& e) {
    RELPOS_FAIL(path << ": " << e.what());
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": unexpected JSON structure in the model config (" << e.what() << ")");
  }
}

ModelConfig::Estimate ModelConfig::estimate() const {
  // Mirrors Network's construction (src/model/network.cpp, src/layers/) in doubles: no overflow.
  Estimate e;
  double params = 0.0, peak = 0.0;
  const auto conv = [&](double cin, double cout, double k, double groups) {
    params += cin / groups * cout * k * k + 4.0 * cout;  // weights + batch norm (weight, bias, mean, var)
  };
  const double H0 = input_size[0], W0 = input_size[1];
  double c = stem.chs;
  if (stem.type == StemType::Tiered) {
    conv(in_chans, 3.0 * c / 8, 3, 1), conv(3.0 * c / 8, c / 2, 3, 1), conv(c / 2, c, 3, 1);
  } else {
    conv(in_chans, c, stem.kernel, 1);
  }
  const double reduction = (stem.type == StemType::Tiered ? 2.0 : stem.stride) * (stem.pool == StemPool::None ? 1.0 : 2.0);
  // an odd side rounds up at each stride 2, as the layers compute it (Network's shape walk)
  double fh = std::max(1.0, std::ceil(H0 / reduction)), fw = std::max(1.0, std::ceil(W0 / reduction));
  peak = std::max(peak, (in_chans + c) * H0 * W0);
  double prev = c;
  for (const StageConfig& st : stages)
    for (const BlockConfig& b : st.blocks) {
      const double mid = make_divisible(b.chs * b.br);
      conv(prev, mid, 1, 1);
      double attn = 0.0;
      if (b.type == BlockType::Bottle) {
        conv(mid, mid, 3, b.group_size > 0 ? std::max(1.0, mid / b.group_size) : 1.0);
      } else {
        const bool bot = b.type == BlockType::SelfAttn;
        const int heads = bot ? st.self_attn.heads : st.sasa.heads;
        const double qk = bot ? st.self_attn.qk_ratio : st.sasa.qk_ratio;
        const double dqk = std::floor(make_divisible(mid * qk) / heads);  // head_dims() without its check
        params += mid * (2.0 * dqk * heads + mid);  // the qkv projection
        const double n = fh * fw;
        if (bot) {
          const SelfAttnConfig& a = st.self_attn;
          const double tables = a.pos == PosEncoding::Relative
                                    ? (a.clip ? 2.0 * (2 * a.clip + 1) : (2 * fh - 1) + (2 * fw - 1)) * dqk
                                : a.pos == PosEncoding::Absolute ? n * dqk
                                                                 : 0.0;
          params += tables * (a.per_head ? heads : 1);
          attn = heads * n * n + heads * n * ((2 * fh - 1) + (2 * fw - 1));  // probabilities + q.R tables
        } else {
          params += 2.0 * st.sasa.kernel * dqk / 2;
          attn = heads * n * st.sasa.kernel * st.sasa.kernel;
        }
        params += 4.0 * mid;  // the attention's batch norm
      }
      conv(mid, b.chs, 1, 1);
      if (prev != b.chs || b.stride != 1) conv(prev, b.chs, 1, 1);
      const double act = std::max({prev, mid * 3.0, static_cast<double>(b.chs)}) * fh * fw;
      peak = std::max(peak, 3.0 * act + attn);
      prev = b.chs;
      if (b.stride > 1) fh = std::max(1.0, std::ceil(fh / b.stride)), fw = std::max(1.0, std::ceil(fw / b.stride));
    }
  params += prev * num_classes + num_classes;
  e.params = params;
  e.param_bytes = 4.0 * params;
  e.working_bytes = 4.0 * peak;
  return e;
}

void ModelConfig::check_memory() const {
  const char* env = detail::setting("RELPOS_MAX_MODEL_GB");
  double limit_gb = 16.0;
  if (env) {
    char* end = nullptr;
    limit_gb = std::strtod(env, &end);
    RELPOS_CHECK(end != env && *end == '\0' && std::isfinite(limit_gb) && limit_gb > 0,
                 "RELPOS_MAX_MODEL_GB must be a positive number of GiB, got '" << env << "'");
  }
  const Estimate e = estimate();
  const double gib = 1024.0 * 1024.0 * 1024.0;
  RELPOS_CHECK(e.total_bytes() <= limit_gb * gib,
               "model config '" << name << "': a network of " << e.params / 1e6
                                << " M numbers (parameters and batch-norm statistics) needs an estimated "
                                << e.total_bytes() / gib << " GiB (parameters " << e.param_bytes / gib
                                << " GiB, one image's working set " << e.working_bytes / gib << " GiB), over the limit of "
                                << limit_gb << " GiB; set RELPOS_MAX_MODEL_GB (or relpos --max-model-gb) to allow it");
}

bool ModelConfig::fixed_input_size() const {
  for (const auto& st : stages)
    for (const auto& b : st.blocks)
      if (b.type == BlockType::SelfAttn && (st.self_attn.pos == PosEncoding::Absolute ||
                                    (st.self_attn.pos == PosEncoding::Relative && st.self_attn.clip == 0)))
        return true;
  return false;
}

}  // namespace relpos
