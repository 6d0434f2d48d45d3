// relpos's preprocessing and classification against timm's own eval pipeline on real photographs
// (golden data from tools/make_timm_preprocess_golden.py): the same 8-bit pixels after resize and
// crop, the same normalised input, and botnet26t_256's logits within the forward tolerance, through
// the C++ API and through `relpos classify` on a timm-style checkpoint.
#include <doctest/doctest.h>
#include <sys/resource.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "cli_run.hpp"
#include "deterministic_weights.hpp"
#include "relpos/model.hpp"
#include "relpos/safetensors.hpp"
#include "test_util.hpp"

using nlohmann::json;
using namespace relpos;

namespace {
std::string golden_path(const std::string& name) { return test::source_dir() + "/tests/golden/" + name; }
std::string photo(const std::string& name) { return test::source_dir() + "/tests/data/photos/" + name; }

const json& golden() {
  static const json g = [] {
    std::ifstream in(golden_path("timm_preprocess.json"));
    REQUIRE(in);
    return json::parse(in);
  }();
  return g;
}

Preprocess preprocess_of(const json& c) {
  Preprocess p;
  p.height = c["input_size"][0], p.width = c["input_size"][1];
  p.channels = ChannelOrder::RGB;
  p.crop = true;
  p.crop_pct = c["crop_pct"];
  p.crop_mode = parse_crop_mode(c["crop_mode"]);
  p.interpolation = parse_interpolation(c["interpolation"]);
  for (int i = 0; i < 3; ++i) p.mean[i] = c["mean"][i], p.std[i] = c["std"][i];
  return p;
}

float tolerance(const std::vector<float>& ref) {
  float m = 1.0f;
  for (float v : ref) m = std::max(m, std::abs(v));
  return 1e-4f * m;
}
}  // namespace

TEST_CASE("resize and crop give timm's 8-bit pixels on real photos, and the input tensor is timm's") {
  for (const json& c : golden()["cases"]) {
    const std::string what = c["photo"].get<std::string>() + " " + c["case"].get<std::string>();
    CAPTURE(what);
    const Preprocess p = preprocess_of(c);
    const cv::Mat img = read_image(photo(c["photo"]));
    const cv::Mat got = resize_and_crop(img, p);
    cv::Mat want = cv::imread(golden_path("timm_preprocess/" + c["png"].get<std::string>()), cv::IMREAD_COLOR);
    REQUIRE(!want.empty());
    cv::cvtColor(want, want, cv::COLOR_BGR2RGB);
    REQUIRE(got.size() == want.size());
    REQUIRE(got.type() == want.type());
    cv::Mat diff;
    cv::absdiff(got, want, diff);
    double max_diff = 0;
    cv::minMaxLoc(diff.reshape(1), nullptr, &max_diff);
    const int differing = cv::countNonZero(diff.reshape(1));
    CHECK_MESSAGE(max_diff == 0, what << ": " << differing << " channel values differ, by up to " << max_diff);

    const Tensor x = make_batch({img}, p);  // (1, 3, H, W) channels-last
    const std::int64_t hw = static_cast<std::int64_t>(p.height) * p.width;
    float worst = 0;
    for (const json& s : c["samples"]) {
      const std::int64_t i = s[0], ch = i / hw, yx = i % hw;
      worst = std::max(worst, std::abs(x.data()[yx * 3 + ch] - s[1].get<float>()));
    }
    CHECK_MESSAGE(worst <= 1e-6f, what << ": input tensor differs from timm's by " << worst);
  }
}

TEST_CASE("botnet26t_256's shipped preprocessing is timm's pretrained config") {
  const Model m = Model::create("botnet26t_256");
  const json& cfg = golden()["model_cfg"];
  const Preprocess& p = m.preprocess();
  CHECK(p.channels == ChannelOrder::RGB);
  CHECK(p.crop);
  CHECK(p.height == cfg["input_size"][1]);
  CHECK(p.width == cfg["input_size"][2]);
  CHECK(p.crop_pct == doctest::Approx(cfg["crop_pct"].get<double>()));
  CHECK(to_string(p.crop_mode) == cfg["crop_mode"].get<std::string>());
  CHECK(p.interpolation == parse_interpolation(cfg["interpolation"]));
  for (int i = 0; i < 3; ++i) {
    CHECK(p.mean[i] == doctest::Approx(cfg["mean"][i].get<double>()));
    CHECK(p.std[i] == doctest::Approx(cfg["std"][i].get<double>()));
  }
}

TEST_CASE("botnet26t_256 logits on real photos equal timm's, through the API and through relpos classify") {
  Model m = Model::create("botnet26t_256");
  test::set_deterministic_weights(m.network());
  std::vector<const json*> cases;
  for (const json& c : golden()["cases"])
    if (c.contains("logits")) cases.push_back(&c);
  REQUIRE(cases.size() >= 3);

  // the C++ API: Model::logits on the model's own preprocessing
  for (const json* c : cases) {
    CAPTURE((*c)["photo"].get<std::string>());
    const std::vector<float> ref = (*c)["logits"];
    const Tensor logits = m.logits(make_batch({read_image(photo((*c)["photo"]))}, m.preprocess()));
    float worst = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(logits.data()[k] - ref[k]));
    CHECK(worst <= tolerance(ref));
    MESSAGE((*c)["photo"].get<std::string>() << ": API max |logit - timm| = " << worst);
    // classify() returns the same logits for its top classes
    const auto top = m.classify(read_image(photo((*c)["photo"])), 3);
    for (const Prediction& pr : top) CHECK(std::abs(pr.logit - ref[static_cast<std::size_t>(pr.index)]) <= tolerance(ref));
  }

  // the command line on a timm-style checkpoint (timm names, no relpos metadata) with --config
  test::TempDir d;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamRef& p : m.network().params()) tensors.emplace_back(p.name, p.value->contiguous());
  write_safetensors(d.file("botnet26t.safetensors"), tensors);
  std::string args = "classify -q --json --topk 1000 -m " + d.file("botnet26t.safetensors") + " --config botnet26t_256";
  for (const json* c : cases) args += " " + photo((*c)["photo"]);
  const test::CliRun r = test::run_cli(args, /*stdout_only=*/true);
  REQUIRE(r.status == 0);
  std::istringstream lines(r.out);
  std::string line;
  std::size_t seen = 0;
  while (std::getline(lines, line)) {
    const json j = json::parse(line);
    const json* c = nullptr;
    for (const json* k : cases)
      if (photo((*k)["photo"]) == j["image"]) c = k;
    REQUIRE(c != nullptr);
    const std::vector<float> ref = (*c)["logits"];
    REQUIRE(j["predictions"].size() == ref.size());
    float worst = 0;
    for (const json& pr : j["predictions"])
      worst = std::max(worst, std::abs(pr["logit"].get<float>() - ref[pr["index"].get<std::size_t>()]));
    CHECK(worst <= tolerance(ref));
    MESSAGE(j["image"].get<std::string>() << ": CLI max |logit - timm| = " << worst);
    ++seen;
  }
  CHECK(seen == cases.size());
}

TEST_CASE("an extreme aspect ratio costs no more than the crop: only the crop window is resized") {
  long before_kb = 0;
  {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    before_kb = ru.ru_maxrss;
  }
  const Model m = Model::create("botnet26t_256");
  for (const cv::Size size : {cv::Size(20000, 1), cv::Size(1, 20000), cv::Size(30000, 3)}) {
    CAPTURE(size);
    cv::Mat strip(size, CV_8UC3);
    cv::randu(strip, 0, 256);
    // timm would resize the 20000 x 1 strip to 5380000 x 269 (4.3 GB) before cropping 256 x 256
    const cv::Mat out = resize_and_crop(strip, m.preprocess());
    CHECK(out.rows == 256);
    CHECK(out.cols == 256);
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  CHECK(ru.ru_maxrss - before_kb < 256 * 1024);  // far below the 4.3 GB a full resize would take
}

TEST_CASE("a JPEG's EXIF orientation is not applied, as timm's loader (Pillow's open + convert) does not apply it") {
  // A phone photo says "rotate me" in its EXIF block; Pillow's Image.open(...).convert('RGB'), which
  // timm's datasets and its inference script use, returns the stored pixels as they are. OpenCV's
  // imread rotates them unless told not to: the logits would then be those of a rotated image.
  cv::Mat img(24, 40, CV_8UC3);  // wide: a rotation would make it tall
  for (int y = 0; y < img.rows; ++y)
    for (int x = 0; x < img.cols; ++x) img.at<cv::Vec3b>(y, x) = cv::Vec3b(static_cast<uchar>(6 * x), static_cast<uchar>(10 * y), 128);
  std::vector<uchar> jpeg;
  REQUIRE(cv::imencode(".jpg", img, jpeg, {cv::IMWRITE_JPEG_QUALITY, 95}));
  // APP1 "Exif": a little-endian TIFF header and one IFD entry, Orientation (0x0112) = 6 (90 degrees clockwise)
  const std::vector<uchar> app1 = {0xFF, 0xE1, 0x00, 0x22, 'E', 'x', 'i', 'f', 0, 0,  // marker, length 34
                                   'I', 'I', 0x2A, 0x00, 0x08, 0x00, 0x00, 0x00,      // TIFF header, IFD at 8
                                   0x01, 0x00,                                        // one entry
                                   0x12, 0x01, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
                                   0x00, 0x00, 0x00, 0x00};  // no next IFD
  REQUIRE(app1.size() == 2 + 0x22);
  std::vector<uchar> tagged(jpeg.begin(), jpeg.begin() + 2);  // SOI
  tagged.insert(tagged.end(), app1.begin(), app1.end());
  tagged.insert(tagged.end(), jpeg.begin() + 2, jpeg.end());
  test::TempDir dir;
  const std::string plain = dir.file("plain.jpg"), rotated = dir.file("rotated.jpg");
  std::ofstream(plain, std::ios::binary).write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
  std::ofstream(rotated, std::ios::binary).write(reinterpret_cast<const char*>(tagged.data()), static_cast<std::streamsize>(tagged.size()));
  // the tag is there: OpenCV's default read turns the image
  REQUIRE(cv::imread(rotated, cv::IMREAD_COLOR).size() == cv::Size(24, 40));
  const cv::Mat a = read_image(plain), b = read_image(rotated);
  CHECK(b.size() == cv::Size(40, 24));
  REQUIRE(a.size() == b.size());
  CHECK(cv::norm(a, b, cv::NORM_INF) == 0.0);
}
