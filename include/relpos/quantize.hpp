// relpos: post-training int8 quantization of a float model (docs/int8.md).
//
//   relpos::Model model = relpos::Model::load("models/botnet-fmnist.json");
//   std::vector<relpos::Tensor> calib = {relpos::make_batch(images, model.preprocess())};
//   relpos::QuantizeReport r = relpos::quantize(model, calib);   // model is int8 now
//   model.save_json("botnet-fmnist-int8.json");
//
// Convolutions (batch norm folded) and the attention layers' qkv projections become int8:
// symmetric weights per output channel, and a static input scale per layer from calibration.
// The attention logits and softmax, the classifier and the other elementwise ops stay float32.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "relpos/model.hpp"

namespace relpos {

// How a layer's input range is chosen from what calibration saw: the largest |x| (MinMax), the
// given percentile of |x| (Percentile), or the clipping point with the least expected squared
// quantization error over the histogram of |x| (Mse).
enum class Calibration : std::uint8_t { MinMax, Percentile, Mse };
Calibration parse_calibration(const std::string& s);  // "minmax" | "percentile" | "mse"
std::string to_string(Calibration c);

struct QuantizeOptions {
  Calibration method = Calibration::Percentile;
  double percentile = 99.99;             // for Calibration::Percentile, in (0, 100]
  std::vector<std::string> keep_float;   // layers left in float32 (names as Network::quantizable_layers)
  int sensitivity_images = 32;           // images for the per-layer sensitivity (0: not measured)
};

struct LayerQuantization {
  std::string name;
  bool int8 = false;  // false: kept in float32
  float input_min = 0.0f, input_max = 0.0f;  // what calibration saw
  float input_scale = 0.0f;
  bool input_signed = false;
  // Relative RMS error of the logits when only this layer runs in int8 (-1: not measured).
  double sensitivity = -1.0;
};

struct QuantizeReport {
  std::vector<LayerQuantization> layers;  // in network order
  std::int64_t calibration_images = 0;
  std::int64_t check_images = 0;  // images the errors below were measured on (the first calibration ones)
  double logits_error = 0.0;      // relative RMS error of the logits of the int8 model
  double top1_agreement = 0.0;    // fraction of check images whose top-1 class is the float model's
};

// Quantizes a float32 CPU model in place, calibrating on preprocessed batches (N, C, H, W) as
// make_batch gives them. Labels and preprocessing stay. Throws relpos::Error when there is no
// calibration data, the model is already int8 or not on the CPU, a keep_float name is not a
// quantizable layer, every layer is kept in float, or a weight or activation is not finite.
QuantizeReport quantize(Model& model, const std::vector<Tensor>& calibration, const QuantizeOptions& options = {});

}  // namespace relpos
