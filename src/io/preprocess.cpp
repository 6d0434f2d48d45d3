#include "relpos/preprocess.hpp"

#include <cmath>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "relpos/error.hpp"

namespace relpos {

namespace {
int interp_flag(const std::string& s) {
  if (s == "nearest") return cv::INTER_NEAREST;
  if (s == "bilinear" || s == "linear") return cv::INTER_LINEAR;
  if (s == "bicubic" || s == "cubic") return cv::INTER_CUBIC;
  if (s == "area") return cv::INTER_AREA;
  RELPOS_FAIL("unknown interpolation '" << s << "' (expected nearest, bilinear, bicubic or area)");
}
}  // namespace

Preprocess Preprocess::from_json(const nlohmann::json& j) {
  RELPOS_CHECK(j.is_object(), "preprocess must be a JSON object");
  Preprocess p;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k == "input_size") {
        const auto s = it->get<std::vector<int>>();
        RELPOS_CHECK(s.size() == 2 && s[0] > 0 && s[1] > 0, "preprocess.input_size must be [height, width]");
        p.height = s[0], p.width = s[1];
      } else if (k == "channels") {
        p.channels = it->get<std::string>();
      } else if (k == "mean" || k == "std") {
        const auto v = it->get<std::vector<float>>();
        RELPOS_CHECK(v.size() == 1 || v.size() == 3, "preprocess." << k << " needs 1 or 3 values");
        for (int c = 0; c < 3; ++c) {
          const float x = v[v.size() == 1 ? 0 : static_cast<std::size_t>(c)];
          (k == "mean" ? p.mean : p.std)[static_cast<std::size_t>(c)] = x;
        }
      } else if (k == "scale") {
        p.scale = it->get<float>();
      } else if (k == "crop") {
        p.crop = it->get<bool>();
      } else if (k == "crop_pct") {
        p.crop_pct = it->get<float>();
      } else if (k == "interpolation") {
        p.interpolation = it->get<std::string>();
      } else if (k == "tta") {
        p.tta = it->get<std::string>();
      } else {
        RELPOS_FAIL("preprocess: unknown key '" << k << "'");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    RELPOS_FAIL("preprocess: a value has the wrong type (" << e.what() << ")");
  }
  RELPOS_CHECK(p.channels == "RGB" || p.channels == "BGR" || p.channels == "GRAY",
               "preprocess.channels must be RGB, BGR or GRAY, got '" << p.channels << "'");
  RELPOS_CHECK(p.crop_pct > 0 && p.crop_pct <= 1, "preprocess.crop_pct must be in (0, 1]");
  for (float s : p.std) RELPOS_CHECK(s != 0.0f, "preprocess.std must not be zero");
  interp_flag(p.interpolation);
  RELPOS_CHECK(p.tta == "none" || p.tta == "hflip", "preprocess.tta must be none or hflip, got '" << p.tta << "'");
  return p;
}

nlohmann::json Preprocess::to_json() const {
  std::vector<float> m, s;
  for (int c = 0; c < in_chans(); ++c) {
    m.push_back(mean[static_cast<std::size_t>(c)]);
    s.push_back(std[static_cast<std::size_t>(c)]);
  }
  return {{"input_size", {height, width}}, {"channels", channels}, {"mean", m}, {"std", s}, {"scale", scale},
          {"crop", crop}, {"crop_pct", crop_pct}, {"interpolation", interpolation}, {"tta", tta}};
}

std::string Preprocess::describe() const {
  std::ostringstream os;
  os << width << "x" << height << " " << channels << ", " << (crop ? "resize+centre crop" : "stretch");
  if (crop) os << " (crop_pct " << crop_pct << ")";
  os << ", " << interpolation << ", (x * " << scale << " - [" << mean[0];
  if (in_chans() == 3) os << ", " << mean[1] << ", " << mean[2];
  os << "]) / [" << std[0];
  if (in_chans() == 3) os << ", " << std[1] << ", " << std[2];
  os << "]";
  if (tta == "hflip") os << ", logits averaged with the mirror image's";
  return os.str();
}

cv::Mat read_image(const std::string& path) {
  cv::Mat img;
  try {
    img = cv::imread(path, cv::IMREAD_UNCHANGED);
  } catch (const cv::Exception& e) {
    RELPOS_FAIL(path << ": OpenCV could not decode it (" << e.what() << ")");
  }
  RELPOS_CHECK(!img.empty(), path << ": not a readable image");
  return img;
}

bool has_image_extension(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot);
  for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* e : {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"})
    if (ext == e) return true;
  return false;
}

namespace {
// To 8-bit or float with the model's channel count and order.
cv::Mat to_channels(const cv::Mat& in, const std::string& channels) {
  RELPOS_CHECK(!in.empty(), "empty image");
  RELPOS_CHECK(in.dims == 2 && (in.channels() == 1 || in.channels() == 3 || in.channels() == 4),
               "images must be 2-D with 1, 3 or 4 channels, got " << in.channels() << " channels");
  cv::Mat img = in;
  if (img.depth() == CV_16U) img.convertTo(img, CV_8U, 1.0 / 257.0);
  else if (img.depth() != CV_8U && img.depth() != CV_32F) img.convertTo(img, CV_32F);
  cv::Mat out;
  const int c = img.channels();
  if (channels == "GRAY") {
    if (c == 1) out = img;
    else cv::cvtColor(img, out, c == 3 ? cv::COLOR_BGR2GRAY : cv::COLOR_BGRA2GRAY);
  } else if (channels == "RGB") {
    cv::cvtColor(img, out, c == 1 ? cv::COLOR_GRAY2RGB : (c == 3 ? cv::COLOR_BGR2RGB : cv::COLOR_BGRA2RGB));
  } else {
    if (c == 3) out = img;
    else cv::cvtColor(img, out, c == 1 ? cv::COLOR_GRAY2BGR : cv::COLOR_BGRA2BGR);
  }
  return out;
}

cv::Mat resize_crop(const cv::Mat& img, const Preprocess& p) {
  const int flag = interp_flag(p.interpolation);
  cv::Mat out;
  if (!p.crop) {
    cv::resize(img, out, cv::Size(p.width, p.height), 0, 0, flag);
    return out;
  }
  // timm: square input -> shorter side to floor(size / crop_pct); else each side to floor(s / crop_pct).
  int rh, rw;
  if (p.height == p.width) {
    const int target = static_cast<int>(std::floor(p.height / p.crop_pct));
    if (img.rows <= img.cols) {
      rh = target;
      rw = std::max(target, static_cast<int>(std::lround(static_cast<double>(img.cols) * target / img.rows)));
    } else {
      rw = target;
      rh = std::max(target, static_cast<int>(std::lround(static_cast<double>(img.rows) * target / img.cols)));
    }
  } else {
    rh = static_cast<int>(std::floor(p.height / p.crop_pct));
    rw = static_cast<int>(std::floor(p.width / p.crop_pct));
  }
  cv::resize(img, out, cv::Size(rw, rh), 0, 0, flag);
  const int y0 = (rh - p.height) / 2, x0 = (rw - p.width) / 2;
  return out(cv::Rect(x0, y0, p.width, p.height));
}
}  // namespace

Tensor make_batch(const std::vector<cv::Mat>& images, const Preprocess& p) {
  const int c = p.in_chans();
  Tensor batch({static_cast<std::int64_t>(images.size()), c, p.height, p.width}, Device::CPU, Layout::ChannelsLast);
  const std::size_t per = static_cast<std::size_t>(p.height) * p.width * c;
  for (std::size_t n = 0; n < images.size(); ++n) {
    const cv::Mat img = resize_crop(to_channels(images[n], p.channels), p);
    cv::Mat f;
    img.convertTo(f, CV_32F);
    float* dst = batch.data() + n * per;
    for (int y = 0; y < p.height; ++y) {
      const float* row = f.ptr<float>(y);
      for (int x = 0; x < p.width; ++x)
        for (int ch = 0; ch < c; ++ch) {
          const auto k = static_cast<std::size_t>(ch);
          dst[(static_cast<std::size_t>(y) * p.width + x) * c + k] = (row[x * c + ch] * p.scale - p.mean[k]) / p.std[k];
        }
    }
  }
  return batch;
}

}  // namespace relpos
