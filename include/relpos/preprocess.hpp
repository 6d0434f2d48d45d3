// relpos: turning images into network input as the model file describes:
//   input = (pixel * scale - mean) / std   per channel, in the model's channel order,
// with mean and std in timm's 0..1 units and scale = 1/255 for 8-bit images. This is OpenCV
// dnn's (pixel - mean') * scale / std with mean' = mean / scale.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "relpos/tensor.hpp"

namespace relpos {

struct Preprocess {
  int height = 224, width = 224;          // network input size
  std::string channels = "RGB";           // "RGB", "BGR" or "GRAY" (the model's input channels)
  std::array<float, 3> mean{0.485f, 0.456f, 0.406f};  // after scaling (0..1 units), model order
  std::array<float, 3> std{0.229f, 0.224f, 0.225f};
  float scale = 1.0f / 255.0f;
  // crop: resize (keeping the aspect ratio) so the shorter side is size / crop_pct, then take
  // the centre (timm's eval transform); otherwise stretch to exactly height x width.
  bool crop = true;
  float crop_pct = 0.875f;
  std::string interpolation = "bilinear";  // "nearest" | "bilinear" | "bicubic" | "area"
  // Test-time augmentation: "none", or "hflip" (the logits are the mean of the image's and its
  // mirror image's; twice the inference work).
  std::string tta = "none";

  int in_chans() const { return channels == "GRAY" ? 1 : 3; }
  // File form: {"input_size": [h, w], "channels": "RGB", "mean": [...], "std": [...], "scale": ...,
  // "crop": true, "crop_pct": 0.875, "interpolation": "bilinear", "tta": "none"}.
  static Preprocess from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  std::string describe() const;
};

// Decodes an image file with OpenCV; throws relpos::Error naming the file if it is not an image.
cv::Mat read_image(const std::string& path);
// Whether a file name has an image extension OpenCV decodes (png, jpg, bmp, tif, webp, pnm, ...).
bool has_image_extension(const std::string& path);

// Preprocesses images (BGR, BGRA or grayscale, 8-bit or float) into one (N, C, H, W)
// channels-last batch on the CPU.
Tensor make_batch(const std::vector<cv::Mat>& images, const Preprocess& p);

}  // namespace relpos
