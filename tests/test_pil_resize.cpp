// pil_resize against Pillow itself (tests/golden/pil_resize.json, tools/make_pil_resize_golden.py):
// the same 8-bit pixels for every filter, with both of Pillow's pass orders (Pillow 13 filters
// vertically first when the height shrinks by more than twice as many pixels as the width), for
// the whole output and for a region of it.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>

#include "io/atomic_file.hpp"
#include "io/pil_resample.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {

PilFilter filter_named(const std::string& name) {
  if (name == "bilinear") return PilFilter::Bilinear;
  if (name == "bicubic") return PilFilter::Bicubic;
  if (name == "lanczos") return PilFilter::Lanczos;
  if (name == "box") return PilFilter::Box;
  if (name == "hamming") return PilFilter::Hamming;
  FAIL("unknown filter " << name);
  return PilFilter::Nearest;
}

int max_diff(const cv::Mat& a, const cv::Mat& b) {
  if (a.size() != b.size() || a.type() != b.type()) return 256;
  double m = 0.0;
  cv::Mat d;
  cv::absdiff(a, b, d);
  cv::minMaxLoc(d.reshape(1), nullptr, &m);
  return static_cast<int>(m);
}

}  // namespace

TEST_CASE("pil_resize gives Pillow's pixels with both pass orders, whole and by region") {
  const std::string dir = test::source_dir() + "/tests/golden/";
  const auto j = nlohmann::json::parse(detail::read_file(dir + "pil_resize.json"));
  int vertical_first = 0;
  for (const auto& c : j.at("cases")) {
    const std::string name = c.at("output").get<std::string>();
    CAPTURE(name);
    const cv::Mat src = cv::imread(dir + "pil_resize/" + c.at("source").get<std::string>(), cv::IMREAD_COLOR);
    const cv::Mat want = cv::imread(dir + "pil_resize/" + name, cv::IMREAD_COLOR);
    REQUIRE(!src.empty());
    REQUIRE(!want.empty());
    const int w = c.at("width"), h = c.at("height");
    const PilFilter f = filter_named(c.at("filter"));
    CHECK(max_diff(pil_resize(src, w, h, f, cv::Rect(0, 0, w, h)), want) == 0);
    const cv::Rect region(w / 4, h / 3, std::max(1, w / 2), std::max(1, h / 2));
    CHECK(max_diff(pil_resize(src, w, h, f, region), want(region)) == 0);
    vertical_first += c.at("vertical_first").get<bool>();
  }
  CHECK(vertical_first >= 5);  // the golden exercises both orders
}
