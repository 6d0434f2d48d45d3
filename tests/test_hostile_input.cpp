// Hostile input (issue 10): sizes read from files that would wrap in 64-bit arithmetic must fail
// with a relpos::Error that names the file and the field, never under-allocate or read past a buffer.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <opencv2/core.hpp>

#include <unistd.h>

#include "relpos/data.hpp"
#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/preprocess.hpp"
#include "relpos/safetensors.hpp"
#include "relpos/tensor.hpp"
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
