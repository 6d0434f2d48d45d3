// relpos: turning images into network input as the model file describes, the way timm's eval
// transform does (docs/preprocessing.md):
//   1. colour: to the model's channel order (RGB, BGR or GRAY); 16-bit images to 8 bits;
//   2. resize with Pillow's resampling (antialiased when shrinking, rounded to 8 bits between the
//      horizontal and the vertical pass, bit-exact with PIL.Image.resize), sizes as timm computes
//      them from crop_pct and crop_mode, then the centre crop (or pad) to height x width;
//   3. input = (pixel * scale - mean) / std per channel, with mean and std in timm's 0..1 units and
//      scale = 1/255: OpenCV dnn's (pixel - mean') * scale / std with mean' = mean / scale.
// Images may be CV_8U (0..255), CV_16U (scaled to 0..255) or CV_32F, which is taken in the same
// 0..255 units as 8-bit pixels and resized with the same filters without rounding.
#pragma once

#include <array>
#include <cstdint>
#include <opencv2/core.hpp>
#include <string>
#include <utility>
#include <vector>

#include "relpos/json_abi.hpp"  // nlohmann/json, as librelpos was built with it
#include "relpos/tensor.hpp"

namespace relpos {

// The model's input channels (what the first convolution was trained on).
enum class ChannelOrder : std::uint8_t { RGB, BGR, Gray };
// How timm's eval transform sizes the image before the centre crop (see Preprocess::crop).
enum class CropMode : std::uint8_t { Center, Squash, Border };
// Pillow's resampling filters.
enum class Interpolation : std::uint8_t { Nearest, Box, Bilinear, Hamming, Bicubic, Lanczos };
// Test-time augmentation.
enum class Tta : std::uint8_t { None, HFlip };
// The names the files and the command line use: "RGB" "BGR" "GRAY"; "center" "squash" "border";
// "nearest" "box" (or "area") "bilinear" (or "linear") "hamming" "bicubic" (or "cubic") "lanczos";
// "none" "hflip". parse_* throws relpos::Error listing the known names.
std::string to_string(ChannelOrder c);
std::string to_string(CropMode m);
std::string to_string(Interpolation i);
std::string to_string(Tta t);
ChannelOrder parse_channel_order(const std::string& s);
CropMode parse_crop_mode(const std::string& s);
Interpolation parse_interpolation(const std::string& s);
Tta parse_tta(const std::string& s);

struct Preprocess {
  int height = 224, width = 224;          // network input size
  ChannelOrder channels = ChannelOrder::RGB;
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};  // after scaling (0..1 units), model order
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  float scale = 1.0f / 255.0f;
  // crop: timm's eval transform: resize to size / crop_pct as crop_mode says, then centre-crop
  //   Center: keep the aspect ratio, the shorter side fits (timm's default);
  //   Squash: both sides to size / crop_pct, aspect ratio not kept;
  //   Border: keep the aspect ratio, the longer side fits, pad with the mean colour.
  // Otherwise (crop false) stretch to exactly height x width.
  bool crop = true;
  double crop_pct = 0.875;
  CropMode crop_mode = CropMode::Center;
  Interpolation interpolation = Interpolation::Bilinear;
  // HFlip: the logits are the mean of the image's and its mirror image's (twice the work).
  Tta tta = Tta::None;

  int in_chans() const { return channels == ChannelOrder::Gray ? 1 : 3; }
  // File form: {"input_size": [h, w], "channels": "RGB", "mean": [...], "std": [...], "scale": ...,
  // "crop": true, "crop_pct": 0.875, "crop_mode": "center", "interpolation": "bilinear", "tta": "none"}.
  // Keys the JSON leaves out keep base's values (pass the model's default_preprocess, so that a
  // "preprocess" without "input_size" uses the model's input size, not 224).
  static Preprocess from_json(const nlohmann::json& j, const Preprocess& base);
  static Preprocess from_json(const nlohmann::json& j);  // base: Preprocess{}
  nlohmann::json to_json() const;
  std::string describe() const;
  // Throws relpos::Error naming the field when no image can be preprocessed with these settings
  // (a size outside 1..16384, a scale, mean or std that is not a finite number, std 0, with crop a
  // crop_pct outside (0, 1]). from_json, Model::set_preprocess, make_batch and resize_and_crop check.
  void check() const;
};

// Decodes an image file with OpenCV; throws relpos::Error naming the file if it is not an image.
cv::Mat read_image(const std::string& path);
// Writes an image file in the format its extension names (.png, .jpg, ...), atomically; throws
// relpos::Error naming the file if it cannot.
void write_image(const std::string& path, const cv::Mat& image);
// Whether a file name has an image extension OpenCV decodes (png, jpg, bmp, tif, webp, pnm, ...).
bool has_image_extension(const std::string& path);
// The image files (by has_image_extension) in a folder and all its subfolders, sorted by path.
// Symbolic links to folders are followed, each folder walked once (so a link cycle ends). A broken
// symbolic link with an image name, or a folder that cannot be read, is a problem: with `problems`
// given, its path and what is wrong are appended there and the walk goes on; without, the first one
// throws relpos::Error naming it. Image-folder datasets and the command line list folders this way.
std::vector<std::string> find_images(const std::string& folder,
                                     std::vector<std::pair<std::string, std::string>>* problems = nullptr);

// Preprocesses images (BGR, BGRA or grayscale, 8-bit, 16-bit or float) into one (N, C, H, W)
// channels-last batch on the CPU.
Tensor make_batch(const std::vector<cv::Mat>& images, const Preprocess& p);
// Steps 1 and 2 only: the resized and cropped image in the model's channel order, 8-bit for 8-bit
// and 16-bit input (these are the pixels timm's transform has before ToTensor), float otherwise.
cv::Mat resize_and_crop(const cv::Mat& image, const Preprocess& p);

}  // namespace relpos
