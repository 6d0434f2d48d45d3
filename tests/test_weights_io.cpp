// Weights files: bit-exact round trips of JSON (base64 and plain numbers) and safetensors, timm
// checkpoints by name, and malformed files failing with a message that names the problem.
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/atomic_file.hpp"
#include "io/base64.hpp"
#include "relpos/error.hpp"
#include "relpos/optim.hpp"
#include "train/checkpoint.hpp"
#include "relpos/model.hpp"
#include "test_util.hpp"

using namespace relpos;
using nlohmann::json;

namespace {

std::string tiny_config() { return test::source_dir() + "/models/tiny_botnet_96x64.json"; }

Model tiny_model(std::uint32_t seed = 7) {
  Model m = Model::create(tiny_config(), seed);
  // Make the running statistics non-trivial too, and plant awkward floats.
  for (const ParamRef& p : m.network().params()) {
    auto v = p.value->to_vector();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += 0.001f * static_cast<float>(i % 17);
    p.value->copy_from(Tensor::from_vector(p.value->shape(), v));
  }
  return m;
}

void check_bit_exact(const Model& a, const Model& b) {
  REQUIRE(a.network().params().size() == b.network().params().size());
  for (std::size_t i = 0; i < a.network().params().size(); ++i) {
    const ParamRef& pa = a.network().params()[i];
    const ParamRef* pb = b.network().find(pa.name);
    REQUIRE_MESSAGE(pb != nullptr, pa.name);
    const auto va = pa.value->to_vector(), vb = pb->value->to_vector();
    REQUIRE(va.size() == vb.size());
    CHECK_MESSAGE(std::memcmp(va.data(), vb.data(), va.size() * 4) == 0, pa.name << " differs");
  }
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

json read_json(const std::string& path) { return json::parse(detail::read_file(path)); }

}  // namespace

TEST_CASE("saving: a 255-byte file name, and a link, which stays a link to the new contents") {
  namespace fs = std::filesystem;
  test::TempDir dir;
  Model m = tiny_model(2);
  // the temporary "<name>.tmp.<pid>" beside it was over the 255-byte limit of a name
  const std::string longest = dir.file(std::string(250, 'e') + ".json");
  m.save_json(longest);
  check_bit_exact(m, Model::load(longest));
  // the link was replaced by a plain file, its target left as it was
  fs::create_directories(dir.file("real"));
  fs::create_symlink("real/m.safetensors", dir.file("link.safetensors"));
  m.save_safetensors(dir.file("link.safetensors"));
  CHECK(fs::is_symlink(dir.file("link.safetensors")));
  check_bit_exact(m, Model::load(dir.file("real/m.safetensors")));
  for (const auto& e : fs::directory_iterator(dir.path))  // no temporary left behind
    CHECK(e.path().filename().string().find(".tmp.") == std::string::npos);
  // a file replaced keeps its permissions (a private model became world-readable)
  for (const auto perms : {fs::perms::owner_read | fs::perms::owner_write, fs::perms::owner_all | fs::perms::group_read}) {
    m.save_json(dir.file("private.json"));
    fs::permissions(dir.file("private.json"), perms);
    m.save_json(dir.file("private.json"));
    CHECK(fs::status(dir.file("private.json")).permissions() == perms);
    m.save_safetensors(dir.file("link.safetensors"));  // through the link: its target's
    fs::permissions(dir.file("real/m.safetensors"), perms);
    m.save_safetensors(dir.file("link.safetensors"));
    CHECK(fs::status(dir.file("real/m.safetensors")).permissions() == perms);
  }
}

TEST_CASE("JSON weights round-trip bit for bit, base64 and plain numbers") {
  test::TempDir dir;
  Model m = tiny_model();
  m.set_labels({"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"});
  // values that text formats get wrong: -0, denormals, the largest float, 1/3
  const ParamRef* fc = m.network().find("head.fc.bias");
  REQUIRE(fc);
  fc->value->copy_from(Tensor::from_vector({10}, {-0.0f, std::numeric_limits<float>::denorm_min(), 1e-40f,
                                                   std::numeric_limits<float>::max(), 1.0f / 3.0f, -2.5e-8f, 7.0f,
                                                   0.1f, 123456.789f, -1e30f}));
  for (TensorEncoding enc : {TensorEncoding::Base64, TensorEncoding::Numbers}) {
    const std::string path = dir.file(enc == TensorEncoding::Base64 ? "m64.json" : "mnum.json");
    m.save_json(path, enc);
    Model back = Model::load(path);
    check_bit_exact(m, back);
    CHECK(back.labels() == m.labels());
    CHECK(back.network().config().to_json() == m.network().config().to_json());
    CHECK(back.preprocess().to_json() == m.preprocess().to_json());
    const json j = read_json(path);
    CHECK(j["format"] == "relpos-weights");
    CHECK(j["version"] == 1);
    CHECK(j["tensors"]["head.fc.bias"]["shape"] == json::array({10}));
  }
}

TEST_CASE("base64 keeps NaN and infinities bit for bit; plain numbers refuse them; loading refuses them") {
  test::TempDir dir;
  Model m = tiny_model();
  const ParamRef* b = m.network().find("head.fc.bias");
  std::vector<float> v(10, 1.0f);
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[1] = -std::numeric_limits<float>::infinity();
  b->value->copy_from(Tensor::from_vector({10}, v));
  m.save_json(dir.file("nan.json"));
  // the file holds the bits (the host is little-endian, as the format)
  const std::vector<unsigned char> bytes =
      detail::base64_decode(read_json(dir.file("nan.json"))["tensors"]["head.fc.bias"]["data"].get<std::string>());
  REQUIRE(bytes.size() == sizeof(float) * 10);
  CHECK(std::memcmp(bytes.data(), v.data(), bytes.size()) == 0);
  CHECK_THROWS_WITH_AS(m.save_json(dir.file("nan2.json"), TensorEncoding::Numbers),
                       doctest::Contains("head.fc.bias"), Error);
  // A network with a NaN weight still answers (the convolutions' fused ReLU turns NaN into 0), so a file
  // holding one is refused by name, in either format, and so is an infinity.
  m.save_safetensors(dir.file("nan.safetensors"));
  for (const char* name : {"nan.json", "nan.safetensors"}) {
    const std::string expected = std::string(name) + ": tensor 'head.fc.bias' holds nan (element 0 of 10)";
    CHECK_THROWS_WITH_AS(Model::load(dir.file(name)), doctest::Contains(expected.c_str()), Error);
  }
  v[0] = 1.0f;
  b->value->copy_from(Tensor::from_vector({10}, v));
  m.save_safetensors(dir.file("inf.safetensors"));
  CHECK_THROWS_WITH_AS(Model::load(dir.file("inf.safetensors")),
                       doctest::Contains("tensor 'head.fc.bias' holds -inf (element 1 of 10)"), Error);
  v[1] = 1.0f;
  b->value->copy_from(Tensor::from_vector({10}, v));
  m.save_safetensors(dir.file("fine.safetensors"));
  check_bit_exact(m, Model::load(dir.file("fine.safetensors")));
}

TEST_CASE("labels or preprocessing that do not fit the network are errors naming the file") {
  test::TempDir dir;
  const json base = read_json(test::source_dir() + "/models/botnet-fmnist.json");  // GRAY input, 10 classes
  json three = base;
  three["preprocess"]["mean"] = {0.1, 0.2, 0.3};  // only the first would reach the one channel
  write_text(dir.file("mean3.json"), three.dump());
  CHECK_THROWS_WITH_AS(Model::load(dir.file("mean3.json")),
                       doctest::Contains("mean3.json: preprocess: key 'mean' has 3 values, but the input is one "
                                         "channel (GRAY): give 1"),
                       Error);
  json labels = base;
  labels["labels"] = {"a", "b"};
  write_text(dir.file("labels2.json"), labels.dump());
  CHECK_THROWS_WITH_AS(Model::load(dir.file("labels2.json")),
                       doctest::Contains("labels2.json: 2 labels for a model with 10 classes"), Error);
  json rgb = base;
  rgb["preprocess"]["channels"] = "RGB";
  write_text(dir.file("rgb.json"), rgb.dump());
  CHECK_THROWS_WITH_AS(Model::load(dir.file("rgb.json")),
                       doctest::Contains("rgb.json: preprocessing gives 3-channel input (RGB) but botnet-fmnist takes 1"),
                       Error);
  json one = base;  // one value for the one channel loads
  one["preprocess"]["mean"] = {0.25};
  write_text(dir.file("mean1.json"), one.dump());
  CHECK(Model::load(dir.file("mean1.json")).preprocess().mean[0] == 0.25f);

  // An input size the position tables do not fit fails at load, not at the first image.
  json size = base;
  size["preprocess"]["input_size"] = {30, 30};
  write_text(dir.file("size30.json"), size.dump());
  CHECK_THROWS_WITH_AS(Model::load(dir.file("size30.json")),
                       doctest::Contains("size30.json: preprocess.input_size [30, 30] does not fit botnet-fmnist, "
                                         "which takes 28x28 input"),
                       Error);
  // A model without such tables takes another size, as timm's test_input_size.
  json conv = read_json(test::source_dir() + "/models/fmnist_conv.json");
  conv["preprocess"]["input_size"] = {32, 32};
  write_text(dir.file("conv32.json"), conv.dump());
  CHECK(Model::create(dir.file("conv32.json")).preprocess().height == 32);

  json negative = base;
  negative["preprocess"]["scale"] = -1;
  write_text(dir.file("negative.json"), negative.dump());
  CHECK_THROWS_WITH_AS(Model::load(dir.file("negative.json")),
                       doctest::Contains("negative.json: preprocess: key 'scale' must be a positive number"), Error);
}

TEST_CASE("safetensors round-trip bit for bit and carry config, labels and preprocessing") {
  test::TempDir dir;
  Model m = tiny_model(3);
  m.save_safetensors(dir.file("m.safetensors"));
  Model back = Model::load(dir.file("m.safetensors"));
  check_bit_exact(m, back);
  CHECK(back.preprocess().to_json() == m.preprocess().to_json());
  // JSON -> safetensors -> JSON is lossless too
  back.save_json(dir.file("m.json"));
  check_bit_exact(m, Model::load(dir.file("m.json")));
}

TEST_CASE("a timm checkpoint loads by timm names with --config; F16 and BF16 are converted") {
  test::TempDir dir;
  auto g = test::golden("tiny_botnet_96x64");
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& e : g.entries())
    if (e.name.rfind("param.", 0) == 0) tensors.emplace_back(e.name.substr(6), g.tensor(e.name));
  tensors.emplace_back("stem.conv1.bn.num_batches_tracked", Tensor::zeros({}));  // timm has these; ignored
  write_safetensors(dir.file("timm.safetensors"), tensors, {{"format", "pt"}});
  CHECK_THROWS_WITH_AS(Model::load(dir.file("timm.safetensors")), doctest::Contains("--config"), Error);
  LoadOptions opt;
  opt.config = tiny_config();
  Model m = Model::load(dir.file("timm.safetensors"), opt);
  const ParamRef* w = m.network().find("stages.2.1.self_attn.pos_embed.height_rel");
  REQUIRE(w);
  CHECK(test::max_abs_diff(*w->value, g.tensor("param.stages.2.1.self_attn.pos_embed.height_rel")) == 0.0f);

  // Half-precision files: hand-written F16 / BF16 entries of known values.
  const std::uint16_t f16[4] = {0x3c00, 0xc000, 0x3555, 0x0001};   // 1, -2, ~1/3, smallest subnormal
  const std::uint16_t bf16[4] = {0x3f80, 0xc000, 0x3eab, 0x0000};  // 1, -2, ~1/3, 0
  std::string header = R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
  std::string bytes(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(f16), 8);
  bytes.append(reinterpret_cast<const char*>(bf16), 8);
  write_text(dir.file("half.safetensors"), bytes);
  auto f = SafetensorsFile::read(dir.file("half.safetensors"));
  const auto a = f.tensor("a").to_vector(), b = f.tensor("b").to_vector();
  CHECK(a[0] == 1.0f);
  CHECK(a[1] == -2.0f);
  CHECK(a[2] == doctest::Approx(1.0f / 3.0f).epsilon(1e-3));
  CHECK(a[3] == doctest::Approx(5.960464477539063e-08f));
  CHECK(b[0] == 1.0f);
  CHECK(b[1] == -2.0f);
  CHECK(b[2] == doctest::Approx(1.0f / 3.0f).epsilon(1e-2));
  CHECK(f.tensor("b").shape() == Shape{2, 2});
}

TEST_CASE("a DistributedDataParallel state dict (module.<name>) loads as timm's does; other prefixes are named") {
  test::TempDir dir;
  auto g = test::golden("tiny_botnet_96x64");
  const auto saved = [&](const std::string& prefix) {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const auto& e : g.entries())
      if (e.name.rfind("param.", 0) == 0) tensors.emplace_back(prefix + e.name.substr(6), g.tensor(e.name));
    const std::string path = dir.file(prefix + "x.safetensors");
    write_safetensors(path, tensors, {{"format", "pt"}});
    return path;
  };
  LoadOptions opt;
  opt.config = tiny_config();
  // before: "missing tensor 'stem.conv1.conv.weight' (and N more)"; timm's load_checkpoint strips module.
  const Model m = Model::load(saved("module."), opt);
  const char* name = "stages.2.1.self_attn.pos_embed.height_rel";
  CHECK(test::max_abs_diff(*m.network().find(name)->value, g.tensor(std::string("param.") + name)) == 0.0f);
  // a flattened training checkpoint: the prefix is named, not only the first missing tensor
  CHECK_THROWS_WITH_AS(Model::load(saved("state_dict_ema."), opt),
                       doctest::Contains("its names carry the prefix 'state_dict_ema.', which relpos does not strip"), Error);
}

TEST_CASE("a safetensors file whose header length starts with the bytes of '{' or a space loads as safetensors") {
  // The 8-byte little-endian header length comes first. A length of 0x7B20 (31520, a multiple of 8
  // as padding writers leave it) starts with a space and a '{'; one of 0x..7B with a '{'. Neither
  // makes the file JSON.
  test::TempDir dir;
  Model m = tiny_model(5);
  m.save_safetensors(dir.file("m.safetensors"));
  const std::string good = detail::read_file(dir.file("m.safetensors"));
  std::uint64_t n = 0;
  std::memcpy(&n, good.data(), 8);
  const std::string header = good.substr(8, n), data = good.substr(8 + n);
  std::uint64_t odd = (n & ~std::uint64_t{0xFF}) + 0x7B;
  if (odd < n) odd += 0x100;
  for (const std::uint64_t len : {std::uint64_t{0x7B20}, odd}) {
    REQUIRE(len >= n);
    std::string bytes(8, '\0');
    std::memcpy(bytes.data(), &len, 8);
    bytes += header + std::string(len - n, ' ') + data;
    const std::string path = dir.file("padded_" + std::to_string(len) + ".safetensors");
    write_text(path, bytes);
    INFO("header length " << len);
    check_bit_exact(m, Model::load(path));
  }
}

TEST_CASE("--config with a file that carries its own architecture: the same one is fine, another an error") {
  // JSON weights ignored it silently; relpos safetensors obeyed it (and failed on the tensors' shapes)
  test::TempDir dir;
  Model m = tiny_model(4);
  m.save_json(dir.file("m.json"));
  m.save_safetensors(dir.file("m.safetensors"));
  for (const std::string f : {"m.json", "m.safetensors"}) {
    LoadOptions same, other;
    same.config = tiny_config();
    other.config = "fmnist_conv";
    check_bit_exact(m, Model::load(dir.file(f), same));
    CHECK_THROWS_WITH_AS(Model::load(dir.file(f), other),
                         doctest::Contains((f + ": the file carries its own architecture ('" + m.network().config().name +
                                            "'), which differs from the config fmnist_conv")
                                               .c_str()),
                         Error);
  }
}

TEST_CASE("malformed safetensors files fail with a message naming the problem") {
  test::TempDir dir;
  Model m = tiny_model();
  m.save_safetensors(dir.file("ok.safetensors"));
  const std::string good = detail::read_file(dir.file("ok.safetensors"));

  write_text(dir.file("short"), std::string("abc"));
  CHECK_THROWS_WITH_AS(Model::load(dir.file("short")), doctest::Contains("short: not a model file (only 3 bytes)"), Error);
  CHECK_THROWS_WITH_AS(SafetensorsFile::read(dir.file("short")), doctest::Contains("shorter than the 8-byte header length"),
                       Error);

  std::string truncated_header = good.substr(0, 100);
  write_text(dir.file("trunc_header"), truncated_header);
  CHECK_THROWS_WITH_AS(Model::load(dir.file("trunc_header")), doctest::Contains("truncated safetensors file"), Error);

  std::string oversized = good;
  const std::uint64_t huge = 1ull << 40;
  std::memcpy(oversized.data(), &huge, 8);
  write_text(dir.file("oversized"), oversized);
  CHECK_THROWS_WITH_AS(Model::load(dir.file("oversized")), doctest::Contains("larger than the 100 MiB limit"), Error);

  write_text(dir.file("trunc_data"), good.substr(0, good.size() - 100));
  CHECK_THROWS_WITH_AS(Model::load(dir.file("trunc_data")), doctest::Contains("outside the"), Error);

  // a damaged header's bytes are shown escaped (they went raw into the message: not UTF-8)
  std::string damaged = good;
  damaged[8 + 10] = '\xff';
  damaged[8 + 11] = '\x01';
  write_text(dir.file("damaged"), damaged);
  try {
    (void)Model::load(dir.file("damaged"));
    FAIL("loaded");
  } catch (const Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("not valid JSON") != std::string::npos);
    CHECK(what.find("\\xff") != std::string::npos);
    for (const char ch : what) CHECK((static_cast<unsigned char>(ch) >= 0x20 && static_cast<unsigned char>(ch) < 0x7f));
  }

  std::string badjson = good;
  badjson[8] = '#';
  write_text(dir.file("badjson"), badjson);
  CHECK_THROWS_WITH_AS(Model::load(dir.file("badjson")), doctest::Contains("not valid JSON"), Error);

  // wrong shape / unknown / missing tensors
  auto g = SafetensorsFile::read(dir.file("ok.safetensors"));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& e : g.entries()) ts.emplace_back(e.name, g.tensor(e.name));
  auto meta = g.metadata();
  {
    auto bad = ts;
    bad[0].second = Tensor::zeros({1, 2, 3});
    write_safetensors(dir.file("shape.safetensors"), bad, meta);
    CHECK_THROWS_WITH_AS(Model::load(dir.file("shape.safetensors")),
                         doctest::Contains(("tensor '" + ts[0].first + "' has shape [1, 2, 3]").c_str()), Error);
  }
  {
    auto bad = ts;
    bad.emplace_back("stages.9.extra.weight", Tensor::zeros({2}));
    write_safetensors(dir.file("unknown.safetensors"), bad, meta);
    CHECK_THROWS_WITH_AS(Model::load(dir.file("unknown.safetensors")),
                         doctest::Contains("unknown tensor 'stages.9.extra.weight'"), Error);
  }
  {
    // a timm checkpoint (no relpos metadata) under a config with a tiered stem without any pool: timm's
    // tiered stems stride 4, this one 2, and the same tensors loaded and answered wrongly
    json cfg = json::parse(std::ifstream(test::source_dir() + "/tests/data/tiny_stem4_config.json"));
    cfg["stem"]["pool"] = "none";
    std::ofstream(dir.file("stem_none.json")) << cfg.dump();
    const Model m = Model::create(dir.file("stem_none.json"), 3);
    m.save_safetensors(dir.file("with_meta.safetensors"));
    const SafetensorsFile w = SafetensorsFile::read(dir.file("with_meta.safetensors"));
    std::vector<std::pair<std::string, Tensor>> plain;
    for (const auto& e : w.entries()) plain.emplace_back(e.name, w.tensor(e.name));
    write_safetensors(dir.file("timm_like.safetensors"), plain, {{"format", "pt"}});
    LoadOptions lo;
    lo.config = dir.file("stem_none.json");
    CHECK_THROWS_WITH_AS(Model::load(dir.file("timm_like.safetensors"), lo),
                         doctest::Contains("has a tiered stem with \"pool\": \"none\""), Error);
    CHECK_NOTHROW(Model::load(dir.file("with_meta.safetensors")));  // relpos's own file: its own layout
  }
  {
    // another architecture (timm's final_conv before a wider head): the layers it has that the config
    // lacks are named, not the head's shape (a side effect of them)
    auto bad = ts;
    for (auto& [name, t] : bad)
      if (name == "head.fc.weight") t = Tensor::zeros({t.shape()[0], t.shape()[1] * 2});
    bad.emplace_back("final_conv.conv.weight", Tensor::zeros({4, 4, 1, 1}));
    bad.emplace_back("final_conv.bn.weight", Tensor::zeros({4}));
    write_safetensors(dir.file("final_conv.safetensors"), bad, meta);
    CHECK_THROWS_WITH_AS(Model::load(dir.file("final_conv.safetensors")),
                         doctest::Contains("unknown tensors 'final_conv.bn.weight', 'final_conv.conv.weight' (not parameters of"),
                         Error);
  }
  {
    auto bad = ts;
    const std::string gone = bad.back().first;
    bad.pop_back();
    write_safetensors(dir.file("missing.safetensors"), bad, meta);
    CHECK_THROWS_WITH_AS(Model::load(dir.file("missing.safetensors")), doctest::Contains(("missing tensor '" + gone + "'").c_str()),
                         Error);
  }
  // a byte range that disagrees with the shape
  std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  std::string bytes(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(bytes.data(), &n, 8);
  write_text(dir.file("size.safetensors"), bytes + header + std::string(8, '\0'));
  CHECK_THROWS_WITH_AS(SafetensorsFile::read(dir.file("size.safetensors")), doctest::Contains("tensor 'x': shape [3]"), Error);
  CHECK_THROWS_WITH_AS(Model::load(dir.file("nonexistent.safetensors")), doctest::Contains("nonexistent.safetensors: no such file"), Error);
}

TEST_CASE("malformed JSON weights fail with a message naming the problem") {
  test::TempDir dir;
  Model m = tiny_model();
  m.save_json(dir.file("ok.json"), TensorEncoding::Base64);
  const json good = read_json(dir.file("ok.json"));
  auto expect = [&](const json& j, const std::string& needle) {
    write_text(dir.file("bad.json"), j.dump());
    CHECK_THROWS_WITH_AS(Model::load(dir.file("bad.json")), doctest::Contains(needle.c_str()), Error);
  };
  {
    json j = good;
    j["version"] = 3;  // 2 is an int8 model's (docs/int8.md)
    expect(j, "version 3 is not supported");
    // a version past 32 bits wrapped: 4294967297 read as 1 and loaded
    for (const std::uint64_t v : {4294967297ULL, 4294967298ULL, 1099511627776ULL, 18446744073709551615ULL}) {
      j["version"] = v;
      expect(j, "version " + std::to_string(v) + " is not supported");
    }
    j["version"] = -4294967295LL;
    expect(j, "version -4294967295 is not supported");
  }
  {
    json j = good;
    j["format"] = "onnx";
    expect(j, "not a relpos weights file");
  }
  {
    json j = good;
    j["tensors"]["head.fc.weight"]["shape"] = {256, 10};
    expect(j, "tensor 'head.fc.weight' has shape [256, 10] but tiny_botnet_96x64 needs [10, 256]");
  }
  {
    json j = good;
    j["tensors"]["head.fc.weight"]["shape"] = {10, 128};
    expect(j, "holds 2560 values");
  }
  {
    json j = good;
    j["tensors"]["head.fc.extra"] = j["tensors"]["head.fc.bias"];
    expect(j, "unknown tensor 'head.fc.extra'");
  }
  {
    json j = good;
    j["tensors"].erase("stem.conv2.bn.running_var");
    expect(j, "missing tensor 'stem.conv2.bn.running_var'");
  }
  {
    json j = good;
    j["tensors"]["head.fc.bias"]["data"] = "@@@@";
    expect(j, "invalid base64");
  }
  {
    // three bytes too many said "holds 10 values but shape [10] needs 10"
    json j = good;
    j["tensors"]["head.fc.bias"]["data"] = detail::base64_encode(std::string(43, '\0').data(), 43);
    expect(j, "tensor 'head.fc.bias' holds 43 bytes, not a whole number of float32 values (shape [10] needs 40 bytes)");
    // these did not name the tensor
    j = good;
    j["tensors"]["head.fc.bias"]["shape"] = {1099511627776LL, 1099511627776LL};
    expect(j, "tensor 'head.fc.bias': tensor shape [1099511627776, 1099511627776]");
    j = good;
    j["tensors"]["head.fc.bias"]["encoding"] = 1;
    expect(j, "tensor 'head.fc.bias': unexpected JSON structure");
  }
  {
    json j = good;
    j["config"]["stages"][0]["chs"] = "many";
    expect(j, "bad.json: model config: stages[0]: key 'chs' must be a whole number, got \"many\"");
  }
  {
    json j = good;
    j["tensors"]["head.fc.bias"]["dtype"] = 5;
    expect(j, "bad.json: tensor 'head.fc.bias': \"dtype\" must be a string");
  }
  {
    json j = good;
    j["config"].erase("stem");
    expect(j, "bad.json: model config: missing \"stem\"");
  }
  {
    json j = good;
    j["version"] = "1";
    expect(j, "bad.json: \"version\" must be a whole number, got \"1\"");
  }
  write_text(dir.file("trunc.json"), detail::read_file(dir.file("ok.json")).substr(0, 5000));
  CHECK_THROWS_WITH_AS(Model::load(dir.file("trunc.json")), doctest::Contains("not valid JSON"), Error);
  try {  // the parser's "last read" text was 5000 characters of base64 here
    Model::load(dir.file("trunc.json"));
  } catch (const Error& e) {
    CHECK(std::string(e.what()).size() < 400);
  }
  CHECK_THROWS_WITH_AS(Model::load(tiny_config()), doctest::Contains("model config without weights"), Error);
  // files that are neither JSON objects nor safetensors say what they hold (they were read as
  // safetensors with a header "larger than the 100 MiB limit")
  write_text(dir.file("list.json"), "[1, 2, 3, 4, 5, 6, 7, 8, 9]");
  CHECK_THROWS_WITH_AS(Model::load(dir.file("list.json")),
                       doctest::Contains("list.json: not a model file (JSON whose top level is not an object: it starts "
                                         "with '[')"),
                       Error);
  write_text(dir.file("null.json"), "null");
  CHECK_THROWS_WITH_AS(Model::load(dir.file("null.json")), doctest::Contains("null.json: not a model file (only 4 bytes)"),
                       Error);
  write_text(dir.file("image.json"), std::string("\x89PNG\r\n\x1a\n") + std::string(64, '\0'));
  CHECK_THROWS_WITH_AS(Model::load(dir.file("image.json")), doctest::Contains("image.json: not a model file (a PNG image)"),
                       Error);
  CHECK_THROWS_WITH_AS(read_labels(dir.path), doctest::Contains((dir.path + ": is a folder; expected a labels file").c_str()), Error);
  // a blank line among the labels: named (dropped silently, the count came out one short); at the end: fine
  write_text(dir.file("labels.txt"), "a\r\nb\r\n\r\nc\r\n");
  CHECK_THROWS_WITH_AS(read_labels(dir.file("labels.txt")),
                       (dir.file("labels.txt") + ": line 3 is blank; a labels file has one label per line, in class order "
                                                 "(blank lines only at the end)").c_str(),
                       Error);
  write_text(dir.file("labels.txt"), "a\nb\nc\n\n\n");
  CHECK(read_labels(dir.file("labels.txt")) == std::vector<std::string>{"a", "b", "c"});
}

TEST_CASE("model configs reject unknown keys and impossible values") {
  json j = json::parse(detail::read_file(tiny_config()));
  j["stagse"] = 1;
  CHECK_THROWS_WITH_AS(ModelConfig::from_json(j), doctest::Contains("unknown key 'stagse'"), Error);
  j = json::parse(detail::read_file(tiny_config()));
  j["stages"][3]["type"] = "transformer";
  CHECK_THROWS_WITH_AS(ModelConfig::from_json(j), doctest::Contains("block type 'transformer'"), Error);
  j = json::parse(detail::read_file(tiny_config()));
  j["self_attn"]["pos"] = "rotary";
  CHECK_THROWS_WITH_AS(ModelConfig::from_json(j), doctest::Contains("position encoding 'rotary' is not known (expected relative, absolute or none)"), Error);
  const ModelConfig c = ModelConfig::load("tiny_botnet_96x64");
  CHECK(ModelConfig::from_json(c.to_json()).to_json() == c.to_json());
}

TEST_CASE("files that are not there, directories and configs without a stem fail naming the path") {
  test::TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  CHECK_THROWS_WITH_AS(Model::load(missing), doctest::Contains((missing + ": no such file").c_str()), Error);
  CHECK_THROWS_WITH_AS(Model::load(dir.path), doctest::Contains((dir.path + ": is a directory").c_str()), Error);
  CHECK_THROWS_WITH_AS(Model::create(dir.path), doctest::Contains((dir.path + ": is a directory").c_str()), Error);
  CHECK_THROWS_WITH_AS(detail::read_file(dir.path), doctest::Contains("is a directory"), Error);
  for (const char* key : {"stem", "stages"}) {
    json j = json::parse(detail::read_file(tiny_config()));
    j.erase(key);
    write_text(dir.file("cfg.json"), j.dump());
    const std::string want = dir.file("cfg.json") + ": model config: missing \"" + key + "\"";
    CHECK_THROWS_WITH_AS(Model::create(dir.file("cfg.json")), doctest::Contains(want.c_str()), Error);
    CHECK_THROWS_WITH_AS(ModelConfig::load(dir.file("cfg.json")), doctest::Contains(want.c_str()), Error);
  }
  // writing into a folder that is not there names the file asked for, not the temporary beside it
  const std::string into = dir.file("no-such-folder") + "/m.json";
  for (bool json : {true, false}) {
    try {
      if (json) tiny_model().save_json(into);
      else tiny_model().save_safetensors(dir.file("no-such-folder") + "/m.safetensors");
      FAIL("no error");
    } catch (const Error& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK(msg.find("cannot write '" + dir.file("no-such-folder") + "/m.") != std::string::npos);
      CHECK(msg.find(".tmp.") == std::string::npos);
    }
  }
}

TEST_CASE("a training checkpoint loads as a model (its model part)") {
  test::TempDir dir;
  Model m = tiny_model();
  m.network().prepare_inference();  // tiny_model() changed the weights after creation
  Model trained = tiny_model();
  Optimizer opt({}, trained.network().params());
  detail::TrainProgress progress;
  detail::save_checkpoint(dir.file("checkpoint.safetensors"), m, opt, TrainOptions{}, progress);
  const Model back = Model::load(dir.file("checkpoint.safetensors"));
  CHECK(back.labels() == m.labels());
  std::mt19937 rng(3);
  const Tensor x = test::random_tensor({2, 3, 96, 64}, rng, 1.0f);
  CHECK(test::max_abs_diff(back.logits(x), m.logits(x)) == 0.0f);
}

TEST_CASE("a preprocess block without input_size takes the model's input size, not 224") {
  test::TempDir dir;
  json j = json::parse(detail::read_file(tiny_config()));
  j["preprocess"] = {{"channels", "RGB"}, {"crop_pct", 0.9}};
  write_text(dir.file("cfg.json"), j.dump());
  const Model m = Model::create(dir.file("cfg.json"));
  CHECK(m.preprocess().height == 96);
  CHECK(m.preprocess().width == 64);
  CHECK(m.preprocess().crop_pct == doctest::Approx(0.9));
  m.save_json(dir.file("w.json"));
  json w = json::parse(detail::read_file(dir.file("w.json")));
  w["preprocess"].erase("input_size");
  write_text(dir.file("w2.json"), w.dump());
  CHECK(Model::load(dir.file("w2.json")).preprocess().height == 96);
}
