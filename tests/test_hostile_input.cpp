// Hostile input (issue 10): sizes read from files that would wrap in 64-bit arithmetic must fail
// with a relpos::Error that names the file and the field, never under-allocate or read past a buffer.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <opencv2/core.hpp>
#ifndef RELPOS_NO_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif

#include <unistd.h>
#include <zlib.h>

#include "relpos/data.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/ops.hpp"
#include "relpos/preprocess.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/tensor.hpp"
#include "relpos/trainer.hpp"
#include "io/image_file.hpp"
#include "io/image_header.hpp"
#include "cli_run.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

// A safetensors buffer with one F32 tensor `x` of the given JSON shape and `data_bytes` zero bytes.
std::vector<char> safetensors_bytes(const std::string& shape_json, std::uint64_t end, std::size_t data_bytes) {
  const std::string header =
      "{\"x\":{\"dtype\":\"F32\",\"shape\":" + shape_json + ",\"data_offsets\":[0," + std::to_string(end) + "]}}";
  std::vector<char> b(8 + header.size() + data_bytes, 0);
  const std::uint64_t hlen = header.size();
  std::memcpy(b.data(), &hlen, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  return b;
}

std::string error_of(const std::vector<char>& bytes) {
  try {
    SafetensorsFile::parse(bytes, "evil.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("safetensors: a shape whose byte size wraps 64 bits is rejected, naming file and tensor") {
  const std::string msg = error_of(safetensors_bytes("[4611686018427387905,1]", 4, 4));
  CHECK(msg.find("evil.safetensors") != std::string::npos);
  CHECK(msg.find("'x'") != std::string::npos);
  CHECK(msg.find("overflow") != std::string::npos);
}

TEST_CASE("safetensors: a shape whose element count overflows int64 is rejected") {
  const std::string msg = error_of(safetensors_bytes("[4294967296,4294967296]", 4, 4));
  CHECK(msg.find("evil.safetensors") != std::string::npos);
  CHECK(msg.find("'x'") != std::string::npos);
  CHECK(msg.find("overflow") != std::string::npos);
}

TEST_CASE("safetensors: a consistent small tensor still loads") {
  CHECK(error_of(safetensors_bytes("[1,1]", 4, 4)).empty());
}

TEST_CASE("JSON and safetensors headers: a key given twice is an error naming it; a byte-order mark is fine") {
  // the JSON library keeps the last value of a key given twice, silently
  const std::string one = "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}";
  const std::string header = "{\"x\":" + one + ",\"x\":" + one + "}";
  std::vector<char> b(8 + header.size() + 4, 0);
  const std::uint64_t hlen = header.size();
  std::memcpy(b.data(), &hlen, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  CHECK(error_of(b) == "evil.safetensors: the safetensors header: key 'x' appears twice");

  test::TempDir dir;
  std::ifstream in(test::source_dir() + "/models/botnet-fmnist.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto write = [&](const std::string& name, const std::string& body) {
    std::ofstream(dir.file(name), std::ios::binary) << body;
    return dir.file(name);
  };
  // a tensor given twice (docs/formats.md: an error naming the tensor), and the labels
  const std::size_t t = text.find("\"stem.conv.weight\"");
  REQUIRE(t != std::string::npos);
  const std::string tensor = text.substr(t, text.find('}', t) + 1 - t);
  std::string f = write("t.json", text.substr(0, t) + tensor + ", " + text.substr(t));
  CHECK_THROWS_WITH_AS(Model::load(f), (f + ": key 'stem.conv.weight' appears twice in 'tensors'").c_str(), Error);
  const std::size_t l = text.find("\"labels\"");
  f = write("l.json", text.substr(0, l) + "\"labels\": [\"a\"], " + text.substr(l));
  CHECK_THROWS_WITH_AS(Model::load(f), (f + ": key 'labels' appears twice").c_str(), Error);
  // a config's value given twice
  std::ifstream cin(test::tiny_rgb_config());
  const std::string config((std::istreambuf_iterator<char>(cin)), std::istreambuf_iterator<char>());
  const std::size_t n = config.find("\"num_classes\"");
  f = write("c.json", config.substr(0, n) + "\"num_classes\": 5, " + config.substr(n));
  CHECK_THROWS_WITH_AS(Model::create(f), doctest::Contains((f + ": key 'num_classes' appears twice").c_str()), Error);
  // a UTF-8 byte-order mark before a weights file or a config (Windows editors write one)
  const Model plain = Model::load(test::source_dir() + "/models/botnet-fmnist.json");
  const Model bom = Model::load(write("bom.json", "\xEF\xBB\xBF" + text));
  CHECK(test::weights_of(bom) == test::weights_of(plain));
  CHECK(bom.labels() == plain.labels());
  CHECK(Model::open(write("bomc.json", "\xEF\xBB\xBF" + config)).network().config().num_classes == 3);
}

TEST_CASE("JSON nested a hundred thousand levels deep: an error naming the file, not a stack overflow") {
  // copying a parsed value recurses once per level: 150000 levels overflowed the stack (exit 139)
  const int depth = 150000;
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  test::TempDir dir;
  std::ifstream cin(test::tiny_rgb_config());
  std::string config((std::istreambuf_iterator<char>(cin)), std::istreambuf_iterator<char>());
  config.insert(config.find('{') + 1, "\"labels\": " + deep + ", ");
  const std::string f = dir.file("deep.json");
  std::ofstream(f) << config;
  CHECK_THROWS_WITH_AS(Model::open(f), (f + ": JSON nested deeper than 64 levels").c_str(), Error);
  const std::string header = "{\"__metadata__\": {\"x\": " + deep + "}}";
  std::vector<char> b(8 + header.size(), 0);
  const std::uint64_t hlen = header.size();
  std::memcpy(b.data(), &hlen, 8);
  std::memcpy(b.data() + 8, header.data(), header.size());
  CHECK(error_of(b) == "evil.safetensors: the safetensors header: JSON nested deeper than 64 levels");
  // and JSON text inside a safetensors file's metadata
  const Model m = Model::open(test::tiny_rgb_config());
  m.save_safetensors(dir.file("m.safetensors"));
  const SafetensorsFile sf = SafetensorsFile::read(dir.file("m.safetensors"));
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const auto& e : sf.entries()) ts.emplace_back(e.name, sf.tensor(e.name));
  auto meta = sf.metadata();
  meta["relpos.labels"] = deep;
  write_safetensors(dir.file("deep.safetensors"), ts, meta);
  CHECK_THROWS_WITH_AS(Model::load(dir.file("deep.safetensors")),
                       doctest::Contains("relpos.labels: JSON nested deeper than 64 levels"), Error);
}

TEST_CASE("Tensor element counts that overflow int64 throw instead of wrapping") {
  CHECK_THROWS_AS(numel_of(Shape{std::int64_t{1} << 32, std::int64_t{1} << 32}), Error);
  CHECK_THROWS_AS(numel_of(Shape{-1, 4}), Error);
  CHECK(numel_of(Shape{3, 5, 7}) == 105);
}

namespace {

void write_idx(const std::string& path, std::vector<std::uint32_t> dims, std::size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  const char magic[4] = {0, 0, 8, static_cast<char>(dims.size())};
  out.write(magic, 4);
  for (std::uint32_t d : dims) {
    const char be[4] = {static_cast<char>(d >> 24), static_cast<char>(d >> 16), static_cast<char>(d >> 8),
                        static_cast<char>(d)};
    out.write(be, 4);
  }
  const std::vector<char> zeros(data_bytes, 0);
  out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
}

std::string idx_error(std::vector<std::uint32_t> image_dims, std::size_t image_bytes) {
  const auto dir = std::filesystem::temp_directory_path() / ("relpos_hostile_idx_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string images = (dir / "images-idx3-ubyte").string(), labels = (dir / "labels-idx1-ubyte").string();
  write_idx(images, image_dims, image_bytes);
  write_idx(labels, {image_dims[0]}, image_dims[0]);
  std::string msg;
  try {
    IdxDataset d(images, labels, std::vector<std::string>(10, "c"));
  } catch (const Error& e) {
    msg = e.what();
  }
  std::filesystem::remove_all(dir);
  return msg;
}

}  // namespace

TEST_CASE("IDX: dimensions whose product wraps 64 bits are rejected (issue 10 reproducer)") {
  const std::string msg = idx_error({8, 1824726041u, 1263665316u}, 32);
  CHECK(msg.find("images-idx3-ubyte") != std::string::npos);
  CHECK(msg.find("dimension") != std::string::npos);
}

TEST_CASE("IDX: images of 0 rows or columns are rejected; a sane file loads") {
  CHECK(idx_error({2, 0, 5}, 0).find("dimension 1") != std::string::npos);
  CHECK(idx_error({2, 5, 0}, 0).find("dimension 2") != std::string::npos);
  CHECK(idx_error({2, 3, 4}, 24).empty());
}

TEST_CASE("a model file whose preprocessing asks for a larger input than its config: memory checked at that size") {
  // the config's size was checked, and the model then ran (out of memory) at the preprocessing's
  test::TempDir dir;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(test::source_dir() + "/models/fmnist_conv.json"));
  j["preprocess"]["input_size"] = {16384, 16384};
  std::ofstream(dir.file("big.json")) << j.dump();
  CHECK_THROWS_WITH_AS(Model::open(dir.file("big.json")),
                       doctest::Contains("preprocess.input_size [16384, 16384]: model config"), Error);
  j["preprocess"]["input_size"] = {32, 32};
  std::ofstream(dir.file("small.json")) << j.dump();
  CHECK(Model::open(dir.file("small.json")).preprocess().height == 32);
}

TEST_CASE("weights JSON: a huge declared shape with little data fails before allocating, naming the tensor") {
  test::TempDir dir;
  const std::string path = dir.file("m.json");
  Model::create(test::source_dir() + "/models/tiny_botnet_96x64.json", 7).save_json(path, TensorEncoding::Base64);
  nlohmann::json j;
  std::ifstream(path) >> j;
  for (const nlohmann::json& data : {nlohmann::json(""), nlohmann::json::array()}) {
    j["tensors"]["head.fc.bias"]["shape"] = {1000000000};
    j["tensors"]["head.fc.bias"]["data"] = data;
    std::ofstream(path, std::ios::trunc) << j.dump();
    CHECK_THROWS_WITH_AS(Model::load(path), doctest::Contains("head.fc.bias"), Error);
  }
}

TEST_CASE("configs: out-of-range, fractional and huge values are errors naming the key; memory is estimated first") {
  test::TempDir dir;
  const nlohmann::json base = nlohmann::json::parse(std::ifstream(test::source_dir() + "/models/tiny_botnet_96x64.json"));
  const auto fails_with = [&](const std::function<void(nlohmann::json&)>& edit, const std::string& needle) {
    nlohmann::json j = base;
    edit(j);
    std::ofstream(dir.file("cfg.json")) << j.dump();
    CHECK_THROWS_WITH_AS(Model::create(dir.file("cfg.json")), doctest::Contains(needle.c_str()), Error);
  };
  // the reproducers
  fails_with([](auto& j) { j["input_size"] = {961000000, 64}; }, "cfg.json: model config: key 'input_size[0]' is 961000000");
  fails_with([](auto& j) { j["stages"][0]["depth"] = 22147483648LL; j["stages"][0].erase("types"); j["stages"][0]["type"] = "bottle"; },
             "stages[0]: key 'depth' is 22147483648");
  fails_with([](auto& j) { j["stages"][0]["br"] = 21.5; }, "key 'br' is 21.5");
  fails_with([](auto& j) { j["stages"][0]["chs"] = 2564294967296LL; }, "key 'chs' is 2564294967296");
  fails_with([](auto& j) { j["stages"][0]["chs"] = 4294967304LL; }, "key 'chs' is 4294967304");
  fails_with([](auto& j) { j["sasa"] = {{"kernel", 1e10}}; }, "sasa: key 'kernel' must be a whole number");
  fails_with([](auto& j) { j["self_attn"] = {{"clip", 1500000000}}; }, "self_attn: key 'clip' is 1500000000");
  fails_with([](auto& j) { j["preprocess"] = {{"input_size", {1e10, 3}}}; }, "key 'input_size[0]' must be a whole number, got 10000000000.0");
  fails_with([](auto& j) { j["num_classes"] = -3; }, "key 'num_classes' is -3");
  // a group size that does not divide a bottleneck's middle channels: the convolution's own error
  // named neither the key nor the stage ("bad convolution: ... groups 0")
  fails_with([](auto& j) { j["stages"][0]["group_size"] = 1000; }, "stages[0]: group_size 1000 does not divide the ");
  // within every bound, but global attention over a 1024 x 1024 stage map: stopped by the estimate
  fails_with([](auto& j) { j["input_size"] = {4096, 4096}; }, "over the limit of 16 GiB");
  // the estimate is close to the real parameter count
  const Model m = Model::create(test::source_dir() + "/models/botnet26t_256.json");
  const double real = static_cast<double>(m.network().num_params());
  CHECK(std::abs(m.network().config().estimate().params - real) < 0.01 * real);
}

TEST_CASE("IDX reproducer through the CLI: relpos eval on a hostile Fashion-MNIST folder exits 1 naming the file") {
  test::TempDir dir;
  // the files need not be gzip: zlib reads plain files too
  write_idx(dir.file("t10k-images-idx3-ubyte.gz"), {8, 1824726041u, 1263665316u}, 32);
  write_idx(dir.file("t10k-labels-idx1-ubyte.gz"), {8}, 8);
  const auto r = test::run_cli("eval -m " + test::source_dir() + "/models/botnet-fmnist.json --data fashion-mnist",
                               false, "RELPOS_FASHION_MNIST=" + dir.path);
  CHECK(r.status == 1);
  CHECK(r.out.find("t10k-images-idx3-ubyte.gz") != std::string::npos);
}

TEST_CASE("write_image: a PNG round trip; no extension, an empty image or a missing folder name the file") {
  test::TempDir dir;
  cv::Mat img(5, 7, CV_8UC3);
  for (int y = 0; y < img.rows; ++y)
    for (int x = 0; x < img.cols; ++x) img.at<cv::Vec3b>(y, x) = cv::Vec3b(uchar(10 * x), uchar(30 * y), uchar(x * y));
  write_image(dir.file("a.png"), img);
  const cv::Mat back = read_image(dir.file("a.png"));
  REQUIRE(back.size() == img.size());
  CHECK(cv::norm(back, img, cv::NORM_INF) == 0.0);
  CHECK(std::filesystem::directory_iterator(dir.path) != std::filesystem::directory_iterator());
  const auto error_of_write = [&](const std::string& path, const cv::Mat& m) -> std::string {
    try {
      write_image(path, m);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of_write(dir.file("noextension"), img).find("noextension: no file extension") != std::string::npos);
  CHECK(error_of_write(dir.file("empty.png"), cv::Mat()).find("empty.png: the image is empty") != std::string::npos);
  CHECK(error_of_write(dir.file("no/such/folder/b.png"), img).find("no/such/folder/b.png") != std::string::npos);
  CHECK(error_of_write(dir.file("a.unknownformat"), img).find("a.unknownformat") != std::string::npos);
  // a failed write leaves no temporary behind: only a.png is in the folder
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) files += e.is_regular_file() ? 1 : 0;
  CHECK(files == 1);
}

// ---- image files: the header is read before any decoder runs (decompression bombs, other formats)

namespace {

std::string image_error(const std::string& bytes, const std::string& name) {
  try {
    detail::decode_image_bytes(bytes, name, detail::max_image_pixels());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// v in n bytes, big- or little-endian (bytes beyond the eighth are zero)
std::string be(std::uint64_t v, int n) {
  std::string s;
  for (int i = n - 1; i >= 0; --i) s += static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xff : 0);
  return s;
}
std::string le(std::uint64_t v, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>(i < 8 ? (v >> (8 * i)) & 0xff : 0);
  return s;
}

// Headers (and no more) of each format claiming a w x h image.
std::string png_header(std::uint32_t w, std::uint32_t h) {
  return std::string("\x89PNG\r\n\x1a\n", 8) + be(13, 4) + "IHDR" + be(w, 4) + be(h, 4) + std::string("\x08\x02\0\0\0", 5) + be(0, 4);
}
std::string jpeg_header(std::uint32_t w, std::uint32_t h) {  // SOI, an APP0 to skip, fill bytes, SOF2
  return std::string("\xFF\xD8\xFF\xE0", 4) + be(6, 2) + "JFIF" + std::string("\xFF\xFF\xC2", 3) + be(11, 2) + "\x08" +
         be(h, 2) + be(w, 2) + "\x01" + std::string("\x01\x11\x00", 3);
}
std::string bmp_header(std::int32_t w, std::int32_t h) {  // pixels at byte 54, 24 bits, uncompressed
  return "BM" + le(0, 8) + le(54, 4) + le(40, 4) + le(static_cast<std::uint32_t>(w), 4) + le(static_cast<std::uint32_t>(h), 4) +
         le(1, 2) + le(24, 2) + le(0, 4);
}
std::string tiff_header(std::uint32_t w, std::uint32_t h, bool big_endian) {
  const auto u = [&](std::uint64_t v, int n) { return big_endian ? be(v, n) : le(v, n); };
  std::string s = big_endian ? std::string("MM\0*", 4) : std::string("II*\0", 4);
  s += u(8, 4) + u(3, 2);                                   // first directory at 8, three entries
  s += u(254, 2) + u(4, 2) + u(1, 4) + u(0, 4);             // NewSubfileType, skipped
  s += u(256, 2) + u(4, 2) + u(1, 4) + u(w, 4);             // ImageWidth, LONG
  s += u(257, 2) + u(3, 2) + u(1, 4) + u(h, 2) + u(0, 2);   // ImageLength, SHORT
  return s + u(0, 4);
}
std::string bigtiff_header(std::uint64_t w, std::uint64_t h) {
  std::string s = std::string("II+\0", 4) + le(8, 2) + le(0, 2) + le(16, 8) + le(2, 8);
  s += le(256, 2) + le(16, 2) + le(1, 8) + le(w, 8);  // LONG8
  s += le(257, 2) + le(4, 2) + le(1, 8) + le(h, 8);   // LONG
  return s + le(0, 8);
}
std::string webp_vp8x_header(std::uint32_t w, std::uint32_t h) {
  return "RIFF" + le(30, 4) + "WEBPVP8X" + le(10, 4) + le(0, 4) + le(w - 1, 3) + le(h - 1, 3);
}

}  // namespace

TEST_CASE("image headers: every format's size is read; a decompression bomb is refused before decoding") {
  const std::int64_t big = 100000;  // 10^10 pixels
  struct Case {
    std::string bytes, format;
    std::int64_t w, h;
  };
  const std::vector<Case> cases = {
      {png_header(7, 5), "PNG", 7, 5},
      {png_header(big, big), "PNG", big, big},
      {jpeg_header(7, 5), "JPEG", 7, 5},
      {jpeg_header(65535, 65535), "JPEG", 65535, 65535},
      {bmp_header(7, -5), "BMP", 7, 5},  // top-down rows
      {bmp_header(big, big), "BMP", big, big},
      {tiff_header(7, 5, false), "TIFF", 7, 5},
      {tiff_header(big, 40000, true), "TIFF", big, 40000},
      {bigtiff_header(std::uint64_t{1} << 33, 3), "TIFF", std::int64_t{1} << 33, 3},
      {webp_vp8x_header(7, 5), "WebP", 7, 5},
      {webp_vp8x_header(1u << 24, 1u << 24), "WebP", std::int64_t{1} << 24, std::int64_t{1} << 24},
      {"P6\n# a comment\n 7\t5\n255\n", "PNM", 7, 5},
      {"P5 999999999999 2 255 ", "PNM", 999999999999, 2},
  };
  for (const auto& c : cases) {
    CAPTURE(c.format);
    const detail::ImageHeader h = detail::read_image_header(c.bytes, "x");
    CHECK(std::string(h.format) == c.format);
    CHECK(h.width == c.w);
    CHECK(h.height == c.h);
    if (c.w * static_cast<double>(c.h) > 2 * 89478485.0) {
      const std::string e = image_error(c.bytes, "bomb.img");
      CHECK(e.find("bomb.img: " + c.format + " of " + std::to_string(c.w) + " x " + std::to_string(c.h) +
                   " pixels, over the limit of 178956970") != std::string::npos);
      CHECK(e.find("RELPOS_MAX_IMAGE_PIXELS") != std::string::npos);
    }
  }
  // the user's path: relpos classify on a 100,000 x 100,000 PNG of 33 bytes exits 1 naming it
  test::TempDir dir;
  {
    std::ofstream f(dir.file("bomb.png"), std::ios::binary);
    f << png_header(big, big);
  }
  const auto r = test::run_cli("classify -m " + test::source_dir() + "/models/botnet-fmnist.json " + dir.file("bomb.png"));
  CHECK(r.status == 1);
  CHECK(r.out.find("bomb.png: PNG of 100000 x 100000 pixels, over the limit") != std::string::npos);
  // a zero or negative size is damage, not an empty image
  CHECK(image_error(bmp_header(0, 5), "z.bmp").find("z.bmp: damaged BMP (its header gives a size of 0 x 5)") != std::string::npos);
  CHECK(image_error(bmp_header(-7, 5), "n.bmp").find("n.bmp: damaged BMP (its header gives a size of -7 x 5)") != std::string::npos);
}

TEST_CASE("image headers: cut short, damaged, or a format relpos does not read, each named") {
  const auto has = [](const std::string& bytes, const std::string& what) {
    const std::string e = image_error(bytes, "f.img");
    CAPTURE(e);
    CHECK(e.find("f.img: " + what) != std::string::npos);
  };
  // every cut of each header fails with a message, never a read past the end
  for (const std::string& full : {png_header(7, 5), jpeg_header(7, 5), bmp_header(7, 5), tiff_header(7, 5, false),
                                  tiff_header(7, 5, true), bigtiff_header(7, 5), webp_vp8x_header(7, 5)}) {
    for (std::size_t n = 1; n + 1 < full.size(); ++n) {
      CAPTURE(n);
      CHECK(!image_error(full.substr(0, n), "f.img").empty());
    }
  }
  has(std::string("\x89PNG\r\n\x1a\n", 8), "truncated PNG (the file ends at byte 8, inside the IHDR chunk)");
  has(jpeg_header(7, 5).substr(0, 14), "truncated JPEG");
  has(std::string("\xFF\xD8\xFF\xDA", 4) + be(2, 2), "damaged JPEG (no frame header before the image data)");
  has(std::string("\xFF\xD8\xFF\xE0", 4) + be(1, 2), "damaged JPEG (a segment at byte 4 claims 1 bytes)");
  has(std::string("II*\0", 4) + le(1000, 4), "damaged TIFF (the first directory's offset 1000 is past the end)");
  has(std::string("II*\0", 4) + le(8, 4) + le(0, 2) + le(0, 4), "damaged TIFF (no ImageWidth and ImageLength in the first directory)");
  has("P6 x", "damaged PNM (no width and height after the magic number)");
  has("P6 7 5 x", "damaged PNM (no largest value after the size)");
  // the image data the header promises must be in the file
  has(bmp_header(7, 5), "truncated BMP (the header places image data up to byte 174, but the file ends at byte 34)");
  has("P6\n7 5\n65535\n" + std::string(209, 'x'), "truncated PNM (the header places image data up to byte 223, but the file ends at byte 222)");
  has("P4 9 5\n" + std::string(9, 'x'), "truncated PNM (the header places image data up to byte 17, but the file ends at byte 16)");
  {  // a strip past the end of a TIFF: StripOffsets 100, StripByteCounts 50 in a 70-byte file
    std::string t = std::string("II*\0", 4) + le(8, 4) + le(4, 2);
    t += le(256, 2) + le(3, 2) + le(1, 4) + le(7, 4) + le(257, 2) + le(3, 2) + le(1, 4) + le(5, 4);
    t += le(273, 2) + le(4, 2) + le(1, 4) + le(100, 4) + le(279, 2) + le(4, 2) + le(1, 4) + le(50, 4) + le(0, 4);
    has(t + std::string(70 - t.size(), '\0'), "truncated TIFF (the header places image data up to byte 150, but the file ends at byte 70)");
  }
  has(webp_vp8x_header(7, 5), "truncated WebP (the header places image data up to byte 38, but the file ends at byte 30)");
  has("RIFF" + le(30, 4) + "WEBPVP8 " + le(10, 4) + std::string(10, '\0'), "damaged WebP (no VP8 start code)");
  // formats OpenCV would decode but relpos does not read never reach their decoders
  const std::string unsupported = "not a readable image (relpos reads PNG, JPEG, BMP, TIFF, WebP and PNM files";
  has(std::string("\xFF\x4F\xFF\x51\0\x2f", 6) + std::string(40, '\xff'), unsupported);  // JPEG 2000 codestream
  has(std::string("\0\0\0\x0cjP  \r\n\x87\n", 12) + std::string(40, '\0'), unsupported);  // JP2
  has("#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 100000 +X 100000\n", unsupported);
  has(std::string("v/1\x01", 4) + std::string(40, '\0'), unsupported);         // OpenEXR
  has(std::string("\x59\xa6\x6a\x95", 4) + std::string(40, '\0'), unsupported);  // Sun raster
  has("PF\n100000 100000\n-1.0\n", unsupported);                                // PFM
  has("P7\nWIDTH 100000\nHEIGHT 100000\nDEPTH 3\nMAXVAL 255\nENDHDR\n", unsupported);  // PAM
  has("GIF89a", unsupported);
  has("hello, not an image\n", unsupported);
}

TEST_CASE("RELPOS_MAX_IMAGE_PIXELS moves the limit; a bad value is an error naming it") {
  {
    test::ScopedEnv env("RELPOS_MAX_IMAGE_PIXELS", "34");
    CHECK(detail::max_image_pixels() == 34);
    CHECK(image_error(png_header(7, 5), "a.png").find("a.png: PNG of 7 x 5 pixels, over the limit of 34") != std::string::npos);
  }
  {
    test::ScopedEnv env("RELPOS_MAX_IMAGE_PIXELS", "35");
    // within the limit: the header passes and the PNG checks come next (this IHDR's CRC is 0)
    CHECK(image_error(png_header(7, 5), "a.png").find("a.png: damaged PNG (CRC mismatch in the IHDR chunk") != std::string::npos);
  }
  for (const char* bad : {"lots", "-1", "0", "12x"}) {
    test::ScopedEnv env("RELPOS_MAX_IMAGE_PIXELS", bad);
    CHECK(image_error(png_header(7, 5), "a.png").find(std::string("RELPOS_MAX_IMAGE_PIXELS='") + bad + "' is not a positive integer") !=
          std::string::npos);
  }
}

#ifndef RELPOS_NO_IMAGE_CODECS
TEST_CASE("image headers agree with OpenCV's decoders on files OpenCV writes, in every format relpos reads") {
  test::TempDir dir;
  cv::Mat color(5, 7, CV_8UC3), gray(5, 7, CV_8UC1), rgba(5, 7, CV_8UC4);
  cv::randu(color, 0, 255), cv::randu(gray, 0, 255), cv::randu(rgba, 0, 255);
  struct Case {
    const char* ext;
    cv::Mat img;
    std::vector<int> params;
    const char* format;
  };
  const std::vector<Case> cases = {
      {".png", color, {}, "PNG"},   {".jpg", color, {}, "JPEG"}, {".jpg", gray, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}, "JPEG"},
      {".bmp", color, {}, "BMP"},   {".tiff", color, {}, "TIFF"}, {".webp", color, {cv::IMWRITE_WEBP_QUALITY, 80}, "WebP"},
      {".webp", color, {cv::IMWRITE_WEBP_QUALITY, 101}, "WebP"},   {".webp", rgba, {cv::IMWRITE_WEBP_QUALITY, 80}, "WebP"},
      {".ppm", color, {}, "PNM"},   {".pgm", gray, {}, "PNM"},   {".pgm", gray, {cv::IMWRITE_PXM_BINARY, 0}, "PNM"},
  };
  for (const auto& c : cases) {
    const std::string ext = c.ext, format = c.format;
    CAPTURE(ext);
    CAPTURE(format);
    const int channels = c.img.channels();
    CAPTURE(channels);
    std::vector<unsigned char> buf;
    REQUIRE(cv::imencode(c.ext, c.img, buf, c.params));
    const std::string bytes(buf.begin(), buf.end());
    const detail::ImageHeader h = detail::read_image_header(bytes, "x");
    CHECK(std::string(h.format) == c.format);
    CHECK(h.width == 7);
    CHECK(h.height == 5);
    const cv::Mat back = detail::decode_image_bytes(bytes, "x", 35);  // exactly at the limit
    CHECK(back.cols == 7);
    CHECK(back.rows == 5);
    // one byte short: named as truncated from the header's offsets (PNG and JPEG: their own checks;
    // ASCII PNM has no byte count to check, OpenCV's decoder refuses it)
    const std::string cut = image_error(bytes.substr(0, bytes.size() - 1), "cut");
    CAPTURE(cut);
    const bool ascii = c.params.size() == 2 && c.params[0] == cv::IMWRITE_PXM_BINARY;
    if (ascii)
      CHECK(cut.find("cut: not a readable image") != std::string::npos);
    else
      CHECK(cut.find(std::string("cut: truncated ") + c.format) != std::string::npos);
  }
  // JPEG 2000: OpenCV writes it, relpos refuses to read it (as it never collects .jp2 from folders)
  std::vector<unsigned char> jp2;
  bool encoded = false;
  try {
    encoded = cv::imencode(".jp2", cv::Mat(64, 64, CV_8UC3, cv::Scalar(1, 2, 3)), jp2);
  } catch (const cv::Exception&) {  // an OpenCV built without OpenJPEG's encoder
  }
  if (encoded) {
    const std::string e = image_error(std::string(jp2.begin(), jp2.end()), "photo.jp2");
    CHECK(e.find("photo.jp2: not a readable image") != std::string::npos);
  }
}
#endif

TEST_CASE("labels and paths that are not UTF-8, and labels given twice, fail before any work, naming them") {
  test::TempDir dir;
  Model m = Model::create(test::tiny_rgb_config(), 1);  // 3 classes
  // save_json / save_safetensors threw the JSON library's exception after a run's work
  CHECK_THROWS_WITH_AS(m.set_labels({"a", "b\xff" "c", "d"}),
                       doctest::Contains("label 1 ('b\xEF\xBF\xBD" "c') is not valid UTF-8 text"), Error);
  m.set_labels({"a", "b", "a"});  // labels may repeat (ImageNet's have 'crane' twice) ...

  // a class folder's name becomes a label: named at the dataset, before training
  test::make_pattern_dataset(dir.path + "/data", 4, 1);
  namespace fs = std::filesystem;
  const std::string bad = std::string("b\xff") + "d";
  fs::create_directories(dir.path + "/data/train/" + bad);
  fs::copy_file(dir.path + "/data/train/dots/000.png", dir.path + "/data/train/" + bad + "/000.png");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path + "/data", "train"),
                       doctest::Contains("/data/train/b\xEF\xBF\xBD" "d: a class folder's name must be valid UTF-8"), Error);
  fs::remove_all(dir.path + "/data/train/" + bad);
  // ... but not with class folders, where the second found no folder ("no folder for class 'a'" with
  // the folder there)
  CHECK_THROWS_WITH_AS(open_dataset(dir.path + "/data", "train", m.labels()),
                       doctest::Contains("the model's classes 0 ('a') and 2 ('a') would both be in folder 'a'"), Error);
  m.set_labels({"a", "b", "c"});

  // the checkpoint records the data folder's path as text: a run whose path is not UTF-8 lost its work
  // at the first save; now it is refused before anything is written
  const std::string odd = dir.path + "/da\xfe" "ta";
  fs::rename(dir.path + "/data", odd);
  TrainOptions o;
  o.data = odd;
  o.epochs = 1;
  o.batch = 4;
  o.out = dir.path + "/run";
  CHECK_THROWS_WITH_AS(train(m, o), doctest::Contains("the path of the data folder is not valid UTF-8"), Error);
  CHECK_FALSE(fs::exists(dir.path + "/run"));

  // a split folder that is not there is named (DIR's other split folders were taken for classes)
  fs::rename(odd, dir.path + "/data");
  fs::remove_all(dir.path + "/data/train");
  CHECK_THROWS_WITH_AS(open_dataset(dir.path + "/data", "train"), doctest::Contains("/data: no train/ folder (it has test/)"),
                       Error);
}

TEST_CASE("an undefined Tensor holds no elements: reading it is empty, writing into it is an error") {
  relpos::Tensor t;
  CHECK(!t.defined());
  CHECK(t.numel() == 0);  // (it said 1, and to_vector, fill and clone read or wrote through null)
  CHECK(t.bytes() == 0);
  CHECK(t.to_vector().empty());
  t.fill(1.0f);
  CHECK(!t.clone().defined());
  CHECK(!t.to(relpos::Device::CPU).defined());
  CHECK_THROWS_WITH_AS(t.copy_from(relpos::Tensor::zeros({})), "copy_from: into an undefined tensor", relpos::Error);
  CHECK_THROWS_WITH_AS(relpos::Tensor::zeros({}).copy_from(t), "copy_from: from an undefined tensor", relpos::Error);
  CHECK_THROWS_WITH_AS(t.reshape({1}), "reshape of an undefined tensor", relpos::Error);
  // a defined scalar still has its one element
  CHECK(relpos::Tensor::full({}, 2.0f).to_vector() == std::vector<float>{2.0f});
}

TEST_CASE("images and preprocessing that give meaningless input are errors, through every entry point") {
  relpos::Model m = relpos::Model::load(relpos::test::source_dir() + "/models/botnet-fmnist.json");
  // NaN in a half-float or double image (only float32 and double were checked, before conversion)
  cv::Mat half(28, 28, CV_16FC1, cv::Scalar(std::nan("")));
  CHECK_THROWS_WITH_AS(m.classify(half, 1), "the image has NaN or infinite pixel values", relpos::Error);
  cv::Mat huge(28, 28, CV_64FC1, cv::Scalar(1e300));  // finite as a double, infinite as a float
  CHECK_THROWS_WITH_AS(m.classify(huge, 1), "the image has NaN or infinite pixel values", relpos::Error);
  CHECK(m.classify(cv::Mat(28, 28, CV_16FC1, cv::Scalar(100.0)), 1).size() == 1);
  // a 3-D array is named as such, not as a channel count
  const int dims[] = {4, 4, 4};
  CHECK_THROWS_WITH_AS(m.classify(cv::Mat(3, dims, CV_8UC1, cv::Scalar(0)), 1),
                       "images must be 2-D (rows x columns, with channels), got a 3-D array", relpos::Error);
  // Model::set_preprocess checks what Preprocess::from_json checks
  const relpos::Preprocess good = m.preprocess();
  const auto refused = [&](const std::function<void(relpos::Preprocess&)>& change, const std::string& key) {
    relpos::Preprocess p = good;
    change(p);
    CAPTURE(key);
    CHECK_THROWS_WITH_AS(m.set_preprocess(p), doctest::Contains(("preprocess: key '" + key + "'").c_str()),
                         relpos::Error);
    CHECK_THROWS_WITH_AS(relpos::make_batch({cv::Mat(28, 28, CV_8UC1, cv::Scalar(0))}, p),
                         doctest::Contains(("preprocess: key '" + key + "'").c_str()), relpos::Error);
  };
  refused([](relpos::Preprocess& p) { p.std[0] = 0.0f; }, "std");
  // a subnormal std: the input became infinite and the network answered anyway
  refused([](relpos::Preprocess& p) { p.std[0] = std::numeric_limits<float>::denorm_min(); }, "std");
  refused([](relpos::Preprocess& p) { p.mean[0] = std::nanf(""); }, "mean");
  refused([](relpos::Preprocess& p) { p.scale = -1.0f; }, "scale");
  refused(
      [](relpos::Preprocess& p) {
        p.crop = true;
        p.crop_pct = 5.0;
      },
      "crop_pct");
  refused([](relpos::Preprocess& p) { p.height = 0; }, "input_size");
  CHECK(m.preprocess().std[0] == good.std[0]);  // unchanged by the refused calls
  // a tiny crop_pct: the resize size is checked before it becomes an integer (it overflowed)
  relpos::Preprocess tiny = relpos::Preprocess::from_json({{"crop_pct", 1e-300}});
  CHECK_THROWS_WITH_AS(relpos::resize_and_crop(cv::Mat(10, 10, CV_8UC3, cv::Scalar::all(9)), tiny),
                       doctest::Contains("preprocess: crop_pct 1e-300 would resize the image to"), relpos::Error);
}

#ifndef RELPOS_NO_IMAGE_CODECS
TEST_CASE("a floating-point TIFF reads as Pillow converts it: clipped to 0..255 and truncated to 8 bits; NaN refused") {
  // taken as 0..255 floats unclipped, a file holding 0..255000 gave a confident wrong class
  test::TempDir dir;
  cv::Mat f(1, 6, CV_32FC1);
  const float values[6] = {-5.0f, 0.5f, 1.99f, 127.7f, 254.9f, 1e6f};
  for (int i = 0; i < 6; ++i) f.at<float>(0, i) = values[i];
  REQUIRE(cv::imwrite(dir.file("f.tif"), f));
  const cv::Mat got = read_image(dir.file("f.tif"));
  REQUIRE(got.type() == CV_8UC1);
  const int want[6] = {0, 0, 1, 127, 254, 255};
  for (int i = 0; i < 6; ++i) CHECK(static_cast<int>(got.at<std::uint8_t>(0, i)) == want[i]);
  f.at<float>(0, 2) = std::nanf("");
  REQUIRE(cv::imwrite(dir.file("nan.tif"), f));
  CHECK_THROWS_WITH_AS(read_image(dir.file("nan.tif")), doctest::Contains("NaN or infinite"), Error);
}
#endif

#ifndef RELPOS_NO_IMAGE_CODECS
TEST_CASE("a PNG beyond libpng's million pixels on a side is named as such, not as damaged") {
  test::TempDir dir;
  // (OpenCV's PNG writer refuses it too: the file is put together here, one grey pixel a row)
  const auto png = [](std::uint32_t height) {
    const auto be = [](std::string& out, std::uint32_t v) {
      for (int s = 24; s >= 0; s -= 8) out += static_cast<char>((v >> s) & 0xff);
    };
    const auto chunk = [&](std::string& out, const char* type, const std::string& data) {
      be(out, static_cast<std::uint32_t>(data.size()));
      const std::string body = std::string(type, 4) + data;
      out += body;
      be(out, static_cast<std::uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
    };
    std::string ihdr;
    be(ihdr, 1);
    be(ihdr, height);
    ihdr += std::string("\x08\x00\x00\x00\x00", 5);  // 8-bit grey, no interlace
    const std::string raw(2 * static_cast<std::size_t>(height), '\0');  // filter byte 0, pixel 0
    uLongf n = compressBound(static_cast<uLong>(raw.size()));
    std::string z(n, '\0');
    REQUIRE(compress2(reinterpret_cast<Bytef*>(z.data()), &n, reinterpret_cast<const Bytef*>(raw.data()),
                      static_cast<uLong>(raw.size()), 9) == Z_OK);
    z.resize(n);
    std::string out = "\x89PNG\r\n\x1a\n";
    chunk(out, "IHDR", ihdr);
    chunk(out, "IDAT", z);
    chunk(out, "IEND", "");
    return out;
  };
  std::ofstream(dir.file("tall.png"), std::ios::binary) << png(1000001);
  std::ofstream(dir.file("ok.png"), std::ios::binary) << png(1000000);
  CHECK_THROWS_WITH_AS(read_image(dir.file("tall.png")),
                       doctest::Contains("PNG of 1 x 1000001 pixels: the PNG decoder takes at most 1000000 pixels on a side"),
                       Error);
  CHECK(read_image(dir.file("ok.png")).rows == 1000000);
}
#endif

TEST_CASE("convolution arguments that do not fit are errors naming them, before either backend runs") {
  // checked once for both backends: the CUDA one divided by a zero stride or group count and read
  // past a short bias, residual or gradient (the CPU one checked only some of these)
  const Tensor x = Tensor::zeros({1, 4, 6, 6}), w = Tensor::zeros({8, 4, 3, 3}), bias = Tensor::zeros({8});
  const auto fails = [&](const std::function<void()>& call, const char* says) {
    CHECK_THROWS_WITH_AS(call(), doctest::Contains(says), Error);
  };
  fails([&] { ops::conv2d(x, w, &bias, ops::ConvSpec{0, 1, 1}); }, "conv2d: stride 0, padding 1 and 1 groups");
  fails([&] { ops::conv2d(x, w, &bias, ops::ConvSpec{1, 1, 0}); }, "the stride and groups must be at least 1");
  fails([&] { ops::conv2d(x, w, &bias, ops::ConvSpec{1, -1, 1}); }, "the padding not negative");
  fails([&] { ops::conv2d(x, w, &bias, ops::ConvSpec{1, 1, 3}); }, "does not fit input [1, 4, 6, 6] with 3 groups");
  const Tensor short_bias = Tensor::zeros({5});
  fails([&] { ops::conv2d(x, w, &short_bias, ops::ConvSpec{1, 1, 1}); }, "must have one value per output channel (8)");
  const Tensor residual = Tensor::zeros({1, 8, 5, 6});
  fails([&] { ops::conv2d(x, w, &bias, ops::ConvSpec{1, 1, 1}, {&residual}); },
        "conv2d: residual [1, 8, 5, 6] float32 cpu does not match the output [1, 8, 6, 6]");
  fails([&] { ops::conv2d(Tensor::zeros({1, 4, 2, 2}), w, nullptr, ops::ConvSpec{1, 0, 1}); },
        "is smaller than the 3x3 kernel");
  fails([&] { ops::conv2d_backward(x, w, Tensor::zeros({1, 8, 6, 5}), ops::ConvSpec{1, 1, 1}, true); },
        "conv2d backward: gradient");
  // and what fits still runs
  CHECK(ops::conv2d(x, w, &bias, ops::ConvSpec{1, 1, 1}).shape() == Shape({1, 8, 6, 6}));
}
