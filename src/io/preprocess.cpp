// Preprocessing: colour conversion, timm's resize and crop geometry with Pillow's resampling, and
// normalisation (docs/preprocessing.md).
#include "relpos/preprocess.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <opencv2/imgproc.hpp>
#include <sstream>

#include "core/runtime_internal.hpp"
#include "io/image_file.hpp"
#include "io/json_reader.hpp"
#include "io/pil_resample.hpp"
#include "relpos/error.hpp"

namespace relpos {

namespace {

using detail::EnumName;

constexpr EnumName<ChannelOrder> kChannelOrders[] = {
    {ChannelOrder::RGB, "RGB"}, {ChannelOrder::BGR, "BGR"}, {ChannelOrder::Gray, "GRAY"}};
constexpr EnumName<CropMode> kCropModes[] = {
    {CropMode::Center, "center"}, {CropMode::Squash, "squash"}, {CropMode::Border, "border"}};
constexpr EnumName<Interpolation> kInterpolations[] = {
    {Interpolation::Nearest, "nearest"}, {Interpolation::Bilinear, "bilinear"}, {Interpolation::Bicubic, "bicubic"},
    {Interpolation::Box, "box"},         {Interpolation::Hamming, "hamming"},   {Interpolation::Lanczos, "lanczos"},
    {Interpolation::Box, "area"},        {Interpolation::Bilinear, "linear"},   {Interpolation::Bicubic, "cubic"}};
constexpr EnumName<Tta> kTtas[] = {{Tta::None, "none"}, {Tta::HFlip, "hflip"}};

// "mean" or "std": 1 value for every channel, or 3 (of RGB or BGR input; one-channel input takes 1,
// which the other two values would silently not reach).
std::array<float, 3> per_channel(detail::JsonReader& r, const std::string& k, const std::array<float, 3>& base,
                                 ChannelOrder channels) {
  const bool given = r.has(k);
  const auto v = r.get<std::vector<float>>(k, {base.begin(), base.end()});
  RELPOS_CHECK(v.size() == 1 || v.size() == 3, r.at(k) << " needs 1 or 3 values, got " << v.size());
  RELPOS_CHECK(!given || v.size() == 1 || channels != ChannelOrder::Gray,
               r.at(k) << " has 3 values, but the input is one channel (GRAY): give 1");
  std::array<float, 3> out{};
  for (std::size_t c = 0; c < 3; ++c) out[c] = v[v.size() == 1 ? 0 : c];
  return out;
}

}  // namespace

std::string to_string(ChannelOrder c) { return detail::enum_name(c, kChannelOrders); }
std::string to_string(CropMode m) { return detail::enum_name(m, kCropModes); }
std::string to_string(Interpolation i) { return detail::enum_name(i, kInterpolations); }
std::string to_string(Tta t) { return detail::enum_name(t, kTtas); }
ChannelOrder parse_channel_order(const std::string& s) { return detail::parse_enum(s, kChannelOrders, "channel order"); }
CropMode parse_crop_mode(const std::string& s) { return detail::parse_enum(s, kCropModes, "crop mode"); }
Interpolation parse_interpolation(const std::string& s) { return detail::parse_enum(s, kInterpolations, "interpolation"); }
Tta parse_tta(const std::string& s) { return detail::parse_enum(s, kTtas, "tta"); }

Preprocess Preprocess::from_json(const nlohmann::json& j) { return from_json(j, Preprocess{}); }

Preprocess Preprocess::from_json(const nlohmann::json& j, const Preprocess& base) {
  detail::JsonReader r(j, "preprocess");
  Preprocess p = base;
  if (r.has("input_size")) {
    const nlohmann::json& size = r.raw("input_size");
    RELPOS_CHECK(size.is_array() && size.size() == 2, r.at("input_size") << " must be [height, width]");
    p.height = r.check_int("input_size[0]", size[0], 1, 16384);
    p.width = r.check_int("input_size[1]", size[1], 1, 16384);
  }
  p.channels = r.enum_in("channels", p.channels, kChannelOrders);
  p.mean = per_channel(r, "mean", p.mean, p.channels);
  p.std = per_channel(r, "std", p.std, p.channels);
  p.scale = r.get("scale", p.scale);
  p.crop = r.get("crop", p.crop);
  p.crop_pct = r.num_in("crop_pct", p.crop_pct, 0.0, 1.0);
  p.crop_mode = r.enum_in("crop_mode", p.crop_mode, kCropModes);
  p.interpolation = r.enum_in("interpolation", p.interpolation, kInterpolations);
  p.tta = r.enum_in("tta", p.tta, kTtas);
  r.done();
  p.check();
  return p;
}

void Preprocess::check() const {
  const auto key = [](const char* k) { return std::string("preprocess: key '") + k + "'"; };
  RELPOS_CHECK(height >= 1 && height <= 16384 && width >= 1 && width <= 16384,
               key("input_size") << " must be 1 to 16384 on each side, got [" << height << ", " << width << "]");
  RELPOS_CHECK(std::isfinite(scale) && scale > 0.0f,
               key("scale") << " must be a positive number (pixel values are multiplied by it; 1/255 for timm), got "
                            << scale);
  for (int c = 0; c < in_chans(); ++c) {
    const float sd = std[static_cast<std::size_t>(c)], mn = mean[static_cast<std::size_t>(c)];
    RELPOS_CHECK(std::isfinite(sd) && sd != 0.0f, key("std") << " must be non-zero numbers");
    RELPOS_CHECK(std::isfinite(mn), key("mean") << " must be numbers");
    // the network's input, (pixel * scale - mean) / std, must stay a float: a std of 1e-45 (a
    // subnormal) made it infinite, and the network answered anyway
    const double widest = (std::fabs(static_cast<double>(mn)) + 255.0 * static_cast<double>(scale)) /
                          std::fabs(static_cast<double>(sd));
    // Far below float32's own limit: activations grow with the input through the network (an
    // attention logit is a product of two), and overflow there does not show: a ReLU maps the NaN it
    // makes to 0, as oneDNN's does, and botnet-fmnist answered with its classifier's biases at a
    // std of 1e-20 (inputs to 2.5e22). Sensible preprocessing gives inputs within a few hundred.
    RELPOS_CHECK(widest <= 1e6, key("std") << " " << sd << " (with mean " << mn << " and scale " << scale
                                           << ") makes input values up to " << widest
                                           << "; relpos takes preprocessing whose inputs stay within +-1e6 (inputs "
                                              "that large overflow float32 inside the network, and the answers "
                                              "mean nothing)");
  }
  RELPOS_CHECK(!crop || (std::isfinite(crop_pct) && crop_pct > 0.0 && crop_pct <= 1.0),
               key("crop_pct") << " must be in (0, 1], got " << crop_pct);
}

nlohmann::json Preprocess::to_json() const {
  std::vector<float> m, s;
  for (int c = 0; c < in_chans(); ++c) {
    m.push_back(mean[static_cast<std::size_t>(c)]);
    s.push_back(std[static_cast<std::size_t>(c)]);
  }
  return {{"input_size", {height, width}}, {"channels", to_string(channels)},
          {"mean", m},
          {"std", s},
          {"scale", scale},
          {"crop", crop},
          {"crop_pct", crop_pct},
          {"crop_mode", to_string(crop_mode)},
          {"interpolation", to_string(interpolation)},
          {"tta", to_string(tta)}};
}

std::string Preprocess::describe() const {
  std::ostringstream os;
  os << height << "x" << width << " (height x width) " << to_string(channels) << ", ";
  if (crop) os << "resize (" << to_string(crop_mode) << ", crop_pct " << crop_pct << ") + centre crop";
  else os << "stretch";
  os << ", " << to_string(interpolation) << ", (x * " << scale << " - [" << mean[0];
  if (in_chans() == 3) os << ", " << mean[1] << ", " << mean[2];
  os << "]) / [" << std[0];
  if (in_chans() == 3) os << ", " << std[1] << ", " << std[2];
  os << "]";
  if (tta == Tta::HFlip) os << ", logits averaged with the mirror image's";
  return os.str();
}

namespace {
// To 8-bit or float with the model's channel count and order.
cv::Mat to_channels(const cv::Mat& in, ChannelOrder channels) {
  RELPOS_CHECK(!in.empty(), "empty image");
  RELPOS_CHECK(in.dims == 2, "images must be 2-D (rows x columns, with channels), got a " << in.dims << "-D array");
  RELPOS_CHECK(in.channels() == 1 || in.channels() == 3 || in.channels() == 4,
               "images must have 1, 3 or 4 channels, got " << in.channels());
  cv::Mat img = in;
  if (img.depth() == CV_16U) img.convertTo(img, CV_8U, 1.0 / 257.0);
  else if (img.depth() != CV_8U && img.depth() != CV_32F) img.convertTo(img, CV_32F);
  // a float image's NaN or infinity would reach the logits as a confident-looking class (checked
  // after the conversion, which takes half floats and doubles to float)
  RELPOS_CHECK(img.depth() != CV_32F || cv::checkRange(img), "the image has NaN or infinite pixel values");
  cv::Mat out;
  const int c = img.channels();
  if (channels == ChannelOrder::Gray) {
    if (c == 1) out = img;
    else cv::cvtColor(img, out, c == 3 ? cv::COLOR_BGR2GRAY : cv::COLOR_BGRA2GRAY);
  } else if (channels == ChannelOrder::RGB) {
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
  // (checked before the conversion: a tiny crop_pct gives sizes beyond any integer)
  const double dsh = std::floor(static_cast<double>(th) / p.crop_pct), dsw = std::floor(static_cast<double>(tw) / p.crop_pct);
  RELPOS_CHECK(dsh <= 1 << 30 && dsw <= 1 << 30, "preprocess: crop_pct " << p.crop_pct << " would resize the image to "
                                                                      << dsw << "x" << dsh << " before the crop, too large");
  const long sh = static_cast<long>(dsh), sw = static_cast<long>(dsw);
  if (p.crop_mode == CropMode::Squash) {
    g.rh = sh, g.rw = sw;
  } else if (p.crop_mode == CropMode::Center && sh == sw) {
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
    const double ratio = p.crop_mode == CropMode::Border ? std::max(ratio_h, ratio_w) : std::min(ratio_h, ratio_w);
    // timm 0.9 builds ResizeKeepRatio(scale_size) without its interpolation for center mode, so
    // a non-square input size resizes with ResizeKeepRatio's default, bilinear.
    g.bilinear = p.crop_mode == CropMode::Center;
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
  const detail::ThreadScope threads;  // the resampling's OpenMP regions use relpos's thread setting
  p.check();
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
                 g.bilinear ? PilFilter::Bilinear : p.interpolation, region);
  if (region.width == p.width && region.height == p.height) return inside;
  // Padding: 0 for center and squash (torchvision), the mean colour for border (timm).
  cv::Scalar fill = cv::Scalar::all(0);
  if (p.crop && p.crop_mode == CropMode::Border)
    for (int c = 0; c < 3; ++c) {
      const double v = std::nearbyint(static_cast<double>(p.mean[static_cast<std::size_t>(c)]) / p.scale);
      fill[c] = img.depth() == CV_8U ? std::clamp(v, 0.0, 255.0) : v;
    }
  cv::Mat out(p.height, p.width, img.type(), fill);
  inside.copyTo(out(cv::Rect(static_cast<int>(x0 - g.ox), static_cast<int>(y0 - g.oy), region.width, region.height)));
  return out;
}

cv::Mat read_image(const std::string& path) { return detail::decode_image_file(path); }
void write_image(const std::string& path, const cv::Mat& image) { detail::encode_image_file(path, image); }

bool has_image_extension(const std::string& path) {
  const auto dot = path.rfind('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot);
  for (auto& ch : ext) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  for (const char* e : {".png", ".jpg", ".jpeg", ".jpe", ".jfif", ".bmp", ".dib", ".tif", ".tiff", ".webp", ".ppm",
                        ".pgm", ".pbm", ".pnm"})
    if (ext == e) return true;
  return false;
}

Tensor make_batch(const std::vector<cv::Mat>& images, const Preprocess& p) {
  const detail::ThreadScope threads;  // the resampling's OpenMP regions use relpos's thread setting
  p.check();
  const int c = p.in_chans();
  Tensor batch({static_cast<std::int64_t>(images.size()), c, p.height, p.width}, Device::CPU, Layout::ChannelsLast);
  const std::size_t per = static_cast<std::size_t>(p.height) * p.width * c;
  // timm's ToTensor divides 8-bit pixels by 255; with scale = 1/255 do the same division, so the
  // input matches timm's to the bit.
  const double inv = 1.0 / static_cast<double>(p.scale);
  const bool divide = std::abs(inv - std::round(inv)) < 1e-3 * std::max(1.0, std::abs(inv));
  const float divisor = static_cast<float>(std::round(inv));
  for (std::size_t n = 0; n < images.size(); ++n) {
    // An error names the image of a batch; OpenCV's own (out of memory in a colour conversion of a
    // huge image) becomes a relpos::Error, the one kind the API throws.
    const auto which = [&] {
      return images.size() > 1 ? "images[" + std::to_string(n) + "] (of " + std::to_string(images.size()) + "): "
                               : std::string();
    };
    cv::Mat f;
    try {
      resize_and_crop(images[n], p).convertTo(f, CV_32F);
    } catch (const Error& e) {
      if (images.size() > 1) RELPOS_FAIL(which() << e.what());
      throw;
    } catch (const cv::Exception& e) {
      RELPOS_FAIL(which() << "OpenCV could not preprocess the image: " << e.err);
    }
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
