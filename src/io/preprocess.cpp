// Preprocessing: colour conversion, timm's resize and crop geometry with Pillow's resampling, and
// normalisation (docs/preprocessing.md).
#include "relpos/preprocess.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "io/image_file.hpp"
#include "io/pil_resample.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {
PilFilter pil_filter(const std::string& s) {
  if (s == "nearest") return PilFilter::Nearest;
  if (s == "bilinear" || s == "linear") return PilFilter::Bilinear;
  if (s == "bicubic" || s == "cubic") return PilFilter::Bicubic;
  if (s == "box" || s == "area") return PilFilter::Box;
  if (s == "hamming") return PilFilter::Hamming;
  if (s == "lanczos") return PilFilter::Lanczos;
  RELPOS_FAIL("unknown interpolation '" << s << "' (expected nearest, bilinear, bicubic, box, area, hamming or lanczos)");
}
}  // namespace

Preprocess Preprocess::from_json(const nlohmann::json& j) { return from_json(j, Preprocess{}); }

Preprocess Preprocess::from_json(const nlohmann::json& j, const Preprocess& base) {
  RELPOS_CHECK(j.is_object(), "preprocess must be a JSON object");
  Preprocess p = base;
  try {
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& k = it.key();
      if (k == "input_size") {
        RELPOS_CHECK(it->is_array() && it->size() == 2, "preprocess.input_size must be [height, width]");
        for (const auto& d : *it)  // checked before any conversion to int
          RELPOS_CHECK(d.is_number_integer() && d.get<long long>() >= 1 && d.get<long long>() <= 16384,
                       "preprocess.input_size: " << d.dump() << " is not a size from 1 to 16384");
        p.height = (*it)[0].get<int>(), p.width = (*it)[1].get<int>();
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
        p.crop_pct = it->get<double>();
      } else if (k == "crop_mode") {
        p.crop_mode = it->get<std::string>();
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
  RELPOS_CHECK(p.crop_mode == "center" || p.crop_mode == "squash" || p.crop_mode == "border",
               "preprocess.crop_mode must be center, squash or border, got '" << p.crop_mode << "'");
  RELPOS_CHECK(std::isfinite(p.scale) && p.scale != 0.0f, "preprocess.scale must be a non-zero number");
  for (float s : p.std) RELPOS_CHECK(std::isfinite(s) && s != 0.0f, "preprocess.std must be non-zero numbers");
  for (float m : p.mean) RELPOS_CHECK(std::isfinite(m), "preprocess.mean must be numbers");
  pil_filter(p.interpolation);
  RELPOS_CHECK(p.tta == "none" || p.tta == "hflip", "preprocess.tta must be none or hflip, got '" << p.tta << "'");
  return p;
}

nlohmann::json Preprocess::to_json() const {
  std::vector<float> m, s;
  for (int c = 0; c < in_chans(); ++c) {
    m.push_back(mean[static_cast<std::size_t>(c)]);
    s.push_back(std[static_cast<std::size_t>(c)]);
  }
  return {{"input_size", {height, width}}, {"channels", channels}, {"mean", m},
          {"std", s},  {"scale", scale},  {"crop", crop},
          {"crop_pct", crop_pct}, {"crop_mode", crop_mode}, {"interpolation", interpolation},
          {"tta", tta}};
}

std::string Preprocess::describe() const {
  std::ostringstream os;
  os << width << "x" << height << " " << channels << ", ";
  if (crop) os << "resize (" << crop_mode << ", crop_pct " << crop_pct << ") + centre crop";
  else os << "stretch";
  os << ", " << interpolation << ", (x * " << scale << " - [" << mean[0];
  if (in_chans() == 3) os << ", " << mean[1] << ", " << mean[2];
  os << "]) / [" << std[0];
  if (in_chans() == 3) os << ", " << std[1] << ", " << std[2];
  os << "]";
  if (tta == "hflip") os << ", logits averaged with the mirror image's";
  return os.str();
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

// Python's int(round(n / 2.0)) for an integer n >= 0 (round half to even), as torchvision's and
// timm's centre crops compute their offsets.
long half_even(long n) {
  const long h = n / 2;
  return (n % 2 == 0 || h % 2 == 0) ? h : h + 1;
}

long round_half_even(double x) { return static_cast<long>(std::nearbyint(x)); }

struct Geometry {
  long rh = 0, rw = 0;        // the resized image
  long oy = 0, ox = 0;        // crop window origin in resized coordinates (negative: padding)
  bool bilinear = false;      // timm resizes with bilinear here whatever the interpolation says
};

// timm's eval transform geometry (timm.data.transforms_factory.transforms_imagenet_eval, 0.9.x):
// the size the image is resized to and where the height x width window sits in it.
Geometry geometry(long ih, long iw, const Preprocess& p) {
  Geometry g;
  const long th = p.height, tw = p.width;
  if (!p.crop) {
    g.rh = th, g.rw = tw;
    return g;
  }
  const long sh = static_cast<long>(std::floor(static_cast<double>(th) / p.crop_pct));
  const long sw = static_cast<long>(std::floor(static_cast<double>(tw) / p.crop_pct));
  if (p.crop_mode == "squash") {
    g.rh = sh, g.rw = sw;
  } else if (p.crop_mode == "center" && sh == sw) {
    // torchvision Resize(int): the shorter side to sh, the longer to int(sh * long / short)
    const bool w_short = iw <= ih;
    const long s = w_short ? iw : ih, l = w_short ? ih : iw;
    const long nl = static_cast<long>(static_cast<double>(sh * l) / static_cast<double>(s));
    g.rw = w_short ? sh : nl;
    g.rh = w_short ? nl : sh;
  } else {
    // timm ResizeKeepRatio: longest = 0 (center) fits the shorter side, 1 (border) the longer
    const double ratio_h = static_cast<double>(ih) / static_cast<double>(sh);
    const double ratio_w = static_cast<double>(iw) / static_cast<double>(sw);
    const double ratio = p.crop_mode == "border" ? std::max(ratio_h, ratio_w) : std::min(ratio_h, ratio_w);
    // timm 0.9 builds ResizeKeepRatio(scale_size) without its interpolation for center mode, so
    // a non-square input size resizes with ResizeKeepRatio's default, bilinear.
    g.bilinear = p.crop_mode == "center";
    g.rh = round_half_even(static_cast<double>(ih) / ratio);
    g.rw = round_half_even(static_cast<double>(iw) / ratio);
  }
  // Pillow refuses a zero size; an extreme aspect ratio keeps at least one pixel.
  g.rh = std::max(1L, g.rh), g.rw = std::max(1L, g.rw);
  // CenterCrop (center, squash) and timm's CenterCropOrPad (border): pad a side smaller than the
  // crop (left/top get the smaller half), then take the window at round((size - crop) / 2).
  g.oy = th > g.rh ? -((th - g.rh) / 2) : half_even(g.rh - th);
  g.ox = tw > g.rw ? -((tw - g.rw) / 2) : half_even(g.rw - tw);
  return g;
}
}  // namespace

cv::Mat resize_and_crop(const cv::Mat& image, const Preprocess& p) {
  const cv::Mat img = to_channels(image, p.channels);
  const Geometry g = geometry(img.rows, img.cols, p);
  RELPOS_CHECK(g.rh <= (1L << 30) && g.rw <= (1L << 30),
               "image " << img.cols << "x" << img.rows << " would be resized to " << g.rw << "x" << g.rh
                        << ", too large");
  // Only the part of the resized image inside the window is computed.
  const long y0 = std::max(0L, g.oy), x0 = std::max(0L, g.ox);
  const long y1 = std::min(g.rh, g.oy + p.height), x1 = std::min(g.rw, g.ox + p.width);
  const cv::Rect region(static_cast<int>(x0), static_cast<int>(y0), static_cast<int>(x1 - x0),
                        static_cast<int>(y1 - y0));
  const cv::Mat inside =
      pil_resize(img, static_cast<int>(g.rw), static_cast<int>(g.rh),
                 g.bilinear ? PilFilter::Bilinear : pil_filter(p.interpolation), region);
  if (region.width == p.width && region.height == p.height) return inside;
  // Padding: 0 for center and squash (torchvision), the mean colour for border (timm).
  cv::Scalar fill = cv::Scalar::all(0);
  if (p.crop && p.crop_mode == "border")
    for (int c = 0; c < 3; ++c) {
      const double v = std::nearbyint(static_cast<double>(p.mean[static_cast<std::size_t>(c)]) / p.scale);
      fill[c] = img.depth() == CV_8U ? std::clamp(v, 0.0, 255.0) : v;
    }
  cv::Mat out(p.height, p.width, img.type(), fill);
  inside.copyTo(out(cv::Rect(static_cast<int>(x0 - g.ox), static_cast<int>(y0 - g.oy), region.width, region.height)));
  return out;
}

cv::Mat read_image(const std::string& path) { return detail::decode_image_file(path); }

bool has_image_extension(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot);
  for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* e : {".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm", ".pnm"})
    if (ext == e) return true;
  return false;
}

Tensor make_batch(const std::vector<cv::Mat>& images, const Preprocess& p) {
  const int c = p.in_chans();
  Tensor batch({static_cast<std::int64_t>(images.size()), c, p.height, p.width}, Device::CPU, Layout::ChannelsLast);
  const std::size_t per = static_cast<std::size_t>(p.height) * p.width * c;
  // timm's ToTensor divides 8-bit pixels by 255; with scale = 1/255 do the same division, so the
  // input matches timm's to the bit.
  const double inv = 1.0 / static_cast<double>(p.scale);
  const bool divide = std::abs(inv - std::round(inv)) < 1e-3 * std::max(1.0, std::abs(inv));
  const float divisor = static_cast<float>(std::round(inv));
  for (std::size_t n = 0; n < images.size(); ++n) {
    const cv::Mat img = resize_and_crop(images[n], p);
    cv::Mat f;
    img.convertTo(f, CV_32F);
    float* dst = batch.data() + n * per;
    for (int y = 0; y < p.height; ++y) {
      const float* row = f.ptr<float>(y);
      for (int x = 0; x < p.width; ++x)
        for (int ch = 0; ch < c; ++ch) {
          const auto k = static_cast<std::size_t>(ch);
          const float v = row[x * c + ch];
          const float scaled = divide ? v / divisor : v * p.scale;
          dst[(static_cast<std::size_t>(y) * p.width + x) * c + k] = (scaled - p.mean[k]) / p.std[k];
        }
    }
  }
  return batch;
}

}  // namespace relpos
