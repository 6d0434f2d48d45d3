#include "test_util.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace relpos::test {

double inner(const Tensor& a, const Tensor& g) {
  const auto va = a.to_vector(), vg = g.to_vector();
  double s = 0.0;
  for (std::size_t i = 0; i < va.size(); ++i) s += static_cast<double>(va[i]) * vg[i];
  return s;
}

void fd_check(const std::function<double()>& loss, Tensor& value, const Tensor& analytic, const std::string& what,
              float eps, double tol, int max_points) {
  REQUIRE_MESSAGE(analytic.defined(), what << ": no gradient");
  REQUIRE(analytic.shape() == value.shape());
  const auto grad = analytic.to_vector();
  double gmax = 1e-6;
  for (float v : grad) gmax = std::max(gmax, static_cast<double>(std::fabs(v)));
  std::vector<float> v = value.to_vector();
  const std::size_t n = v.size();
  const std::size_t step = std::max<std::size_t>(1, n / static_cast<std::size_t>(max_points));
  double worst = 0.0;
  for (std::size_t i = (n > 1 ? 1 : 0) % n; i < n; i += step) {
    const float keep = v[i];
    v[i] = keep + eps;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    const double up = loss();
    v[i] = keep - eps;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    const double down = loss();
    v[i] = keep;
    value.copy_from(Tensor::from_vector(value.shape(), v));
    worst = std::max(worst, std::fabs((up - down) / (2.0 * eps) - grad[i]));
  }
  INFO(what << ": worst |fd - analytic| " << worst << ", max |grad| " << gmax);
  CHECK(worst <= tol * gmax);
}

std::string golden_dir() { return RELPOS_OWN_GOLDEN_DIR; }

SafetensorsFile golden(const std::string& name) {
  const std::string path = golden_dir() + "/" + name + ".safetensors";
  if (!std::filesystem::exists(path))
    FAIL("golden file " << path << " not found; tools/make_goldens.py writes it");
  return SafetensorsFile::read(path);
}

std::string shared_golden_dir() {
  if (const char* env = std::getenv("RELPOS_GOLDEN_DIR")) return env;
  return RELPOS_GOLDEN_DIR;
}

std::optional<SafetensorsFile> shared_golden(const std::string& name) {
  const std::string dir = shared_golden_dir();
  if (!std::filesystem::is_directory(dir)) {
    MESSAGE("cross-check against " << dir << " skipped: no such folder (optional; set RELPOS_GOLDEN_DIR)");
    return std::nullopt;
  }
  const std::string path = dir + "/" + name + ".safetensors";
  if (!std::filesystem::exists(path)) FAIL("the cross-check folder " << dir << " lacks " << name << ".safetensors");
  return SafetensorsFile::read(path);
}

void for_each_golden(const std::string& name,
                     const std::function<void(const SafetensorsFile& f, const std::string& label)>& check) {
  check(golden(name), "tests/golden");
  if (auto shared = shared_golden(name)) check(*shared, "shared");
}

std::string source_dir() { return RELPOS_SOURCE_DIR; }

float max_abs(const Tensor& t) {
  float m = 0.0f;
  for (float v : t.to_vector()) m = std::max(m, std::fabs(v));
  return m;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  REQUIRE_MESSAGE(a.shape() == b.shape(), "shape " << to_string(a.shape()) << " vs " << to_string(b.shape()));
  const auto va = a.to_vector(), vb = b.to_vector();
  float m = 0.0f;
  for (std::size_t i = 0; i < va.size(); ++i) {
    const float d = std::fabs(va[i] - vb[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

void check_close(const Tensor& got, const Tensor& ref, float tol, const std::string& what) {
  const float diff = max_abs_diff(got, ref);
  INFO(what << ": max |diff| " << diff << ", tolerance " << tol << ", max |ref| " << max_abs(ref));
  CHECK(diff <= tol);
}

void check_forward(const Tensor& got, const Tensor& ref, const std::string& what) {
  check_close(got, ref, 1e-4f * std::max(1.0f, max_abs(ref)), what);
}

void check_grad(const Tensor& got, const Tensor& ref, const std::string& what) {
  check_close(got, ref, 1e-3f * max_abs(ref) + 1e-7f, what);
}

Tensor random_tensor(const Shape& shape, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(numel_of(shape)));
  for (auto& x : v) x = dist(rng);
  return Tensor::from_vector(shape, v);
}

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "relpos-test-XXXXXX").string();
  path = mkdtemp(tmpl.data());
}
TempDir::~TempDir() {
  if (std::getenv("RELPOS_KEEP_TEST_DIRS")) {  // for debugging a failed test: look at what it wrote
    std::fprintf(stderr, "kept %s\n", path.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

ScopedEnv::ScopedEnv(const char* name, const std::string& value) : name_(name) {
  if (const char* old = std::getenv(name)) had_ = true, old_ = old;
  setenv(name, value.c_str(), 1);
}

ScopedEnv::~ScopedEnv() {
  if (had_)
    setenv(name_, old_.c_str(), 1);
  else
    unsetenv(name_);
}

}  // namespace relpos::test

#include <opencv2/core.hpp>

#include "relpos/data.hpp"
#include "relpos/error.hpp"
#ifndef RELPOS_NO_IMAGE_CODECS
#include <opencv2/imgcodecs.hpp>
#endif

namespace relpos::test {

void make_pattern_dataset(const std::string& root, int per_class_train, int per_class_test, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(0, 60), pos(1, 10);
  const char* classes[] = {"bars", "columns", "dots"};
  for (const char* split : {"train", "test"}) {
    const int n = std::string(split) == "train" ? per_class_train : per_class_test;
    for (int c = 0; c < 3; ++c) {
      const auto dir = std::filesystem::path(root) / split / classes[c];
      std::filesystem::create_directories(dir);
      for (int i = 0; i < n; ++i) {
        cv::Mat img(12, 12, CV_8UC3);
        for (int y = 0; y < 12; ++y)
          for (int x = 0; x < 12; ++x) img.at<cv::Vec3b>(y, x) = cv::Vec3b(noise(rng), noise(rng), noise(rng));
        const int p = pos(rng);
        for (int k = 0; k < 12; ++k) {
          if (c == 0) img.at<cv::Vec3b>(p, k) = cv::Vec3b(250, 200, 220);
          if (c == 1) img.at<cv::Vec3b>(k, p) = cv::Vec3b(220, 250, 200);
          if (c == 2) img.at<cv::Vec3b>(pos(rng), pos(rng)) = cv::Vec3b(200, 220, 250);
        }
        char name[32];
        std::snprintf(name, sizeof(name), "%03d.png", i);
#ifndef RELPOS_NO_IMAGE_CODECS
        cv::imwrite((dir / name).string(), img);
#else
        RELPOS_FAIL("tests need image files: build with RELPOS_IMAGE_CODECS=ON");
#endif
      }
    }
  }
}

std::string tiny_rgb_config() { return source_dir() + "/tests/data/tiny_rgb_config.json"; }

}  // namespace relpos::test

namespace relpos::test {

bool make_fashion_mnist_folder(const std::string& root, const std::vector<int>& classes, int per_class_train,
                               int per_class_test, const std::vector<std::string>& folder_names) {
  const std::string dir = kFashionMnistDir;
  if (!std::filesystem::exists(dir + "/train-images-idx3-ubyte.gz")) return false;
  for (const char* split : {"train", "test"}) {
    const bool train = std::string(split) == "train";
    auto data = open_dataset("fashion-mnist", split);
    for (std::size_t k = 0; k < classes.size(); ++k) {
      const int c = classes[k];
      const std::string name = folder_names.empty() ? label_folder_name(data->classes().at(static_cast<std::size_t>(c)))
                                                    : folder_names.at(k);
      const auto folder = std::filesystem::path(root) / split / name;
      std::filesystem::create_directories(folder);
      int written = 0;
      // the first images of the class in the file's order
      for (std::size_t i = 0; i < data->size() && written < (train ? per_class_train : per_class_test); ++i) {
        if (data->label(i) != c) continue;
        char file[32];
        std::snprintf(file, sizeof(file), "%05zu.png", i);
#ifndef RELPOS_NO_IMAGE_CODECS
        cv::imwrite((folder / file).string(), data->image(i));
#else
        RELPOS_FAIL("tests need image files: build with RELPOS_IMAGE_CODECS=ON");
#endif
        ++written;
      }
    }
  }
  return true;
}

std::vector<float> weights_of(const Model& m) {
  std::vector<float> all;
  for (const auto& p : m.network().params()) {
    const auto v = p.value->to_vector();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

}  // namespace relpos::test
