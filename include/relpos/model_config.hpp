// relpos: a network described as data. A JSON model config names the stem, the stages of
// blocks (bottle | self_attn | sasa) with their widths and strides, the attention options and
// the head; relpos builds the network from it with timm's byobnet layout and tensor names.
//
//   {
//     "name": "botnet26t_256", "num_classes": 1000, "in_chans": 3, "input_size": [256, 256],
//     "stem": {"type": "tiered", "chs": 64, "pool": "maxpool"},
//     "stages": [
//       {"type": "bottle", "depth": 2, "chs": 256, "stride": 1, "br": 0.25},
//       {"types": ["bottle", "self_attn"], "chs": 1024, "stride": 2, "br": 0.25}, ...],
//     "self_attn": {"heads": 4, "pos": "relative", "clip": 0, "per_head": false, "scale_pos_embed": false},
//     "sasa": {"heads": 8, "kernel": 7}
//   }
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "relpos/attention_ops.hpp"
#include "relpos/json_abi.hpp"  // nlohmann/json, as librelpos was built with it
#include "relpos/ops.hpp"

namespace relpos {

// "tiered": 3x3/2 -> 3x3 -> 3x3 convolutions to 3c/8, c/2, c channels; "conv": one kxk convolution.
enum class StemType : std::uint8_t { Tiered, Conv };
// "maxpool": a 3x3/2 max pool with padding 1 after the stem's convolutions; "none"; "conv3" (tiered
// stems only): no pool, conv3 strides 2 instead (timm's tiered stem with stem_pool='', as resnet32ts).
enum class StemPool : std::uint8_t { None, MaxPool, StridedConv3 };
// "bottle": a ResNet bottleneck; "self_attn": BoTNet global attention; "sasa": k x k local attention.
enum class BlockType : std::uint8_t { Bottle, SelfAttn, Sasa };
// The names the config files use (parse_* throws relpos::Error listing the known names).
std::string to_string(StemType t);
std::string to_string(StemPool p);
std::string to_string(BlockType t);
StemType parse_stem_type(const std::string& s);
StemPool parse_stem_pool(const std::string& s);
BlockType parse_block_type(const std::string& s);

struct StemConfig {
  StemType type = StemType::Tiered;
  int chs = 64;
  int kernel = 3;  // "conv" stem only
  int stride = 2;  // "conv" stem only ("tiered": conv1 strides 2, and conv3 with pool "conv3")
  StemPool pool = StemPool::MaxPool;
  bool operator==(const StemConfig& o) const;
};

// Options of the BoTNet attention layers (docs/attention.md; keys in docs/config.md).
struct SelfAttnConfig {
  int heads = 4;
  double qk_ratio = 1.0;
  PosEncoding pos = PosEncoding::Relative;
  int clip = 0;
  bool per_head = false;
  bool scale_pos_embed = false;
  bool operator==(const SelfAttnConfig& o) const;
};

// Options of the SASA local attention layers (docs/attention.md; keys in docs/config.md).
struct SasaConfig {
  int heads = 8;
  int kernel = 7;
  double qk_ratio = 1.0;
  bool operator==(const SasaConfig& o) const;
};

struct BlockConfig {
  BlockType type = BlockType::Bottle;
  int chs = 0;
  int stride = 1;  // only the first block of a stage strides
  double br = 0.25;  // bottleneck ratio: mid = make_divisible(chs * br)
  int group_size = 0;  // 3x3 conv groups of this many channels (0: one group)
};

struct StageConfig {
  std::vector<BlockConfig> blocks;
  SelfAttnConfig self_attn;  // the model's, unless the stage overrides some fields
  SasaConfig sasa;
};

struct ModelConfig {
  std::string name = "model";
  int in_chans = 3;
  int num_classes = 1000;
  std::array<int, 2> input_size{224, 224};  // (height, width) the model is built for
  Act act = Act::ReLU;
  StemConfig stem;
  std::vector<StageConfig> stages;
  SelfAttnConfig self_attn;
  SasaConfig sasa;
  bool zero_init_last = true;

  // Throws relpos::Error naming the key on unknown keys, wrong types or impossible values.
  static ModelConfig from_json(const nlohmann::json& j);
  nlohmann::json to_json() const;
  // A path to a JSON config, or the name of one shipped in models/ (e.g. "botnet26t_256").
  // A config file may also carry "preprocess" and "labels" (read by Model::create), and a
  // weights file's config is read too.
  static ModelConfig load(const std::string& path_or_name);

  // True when some attention layer has position tables sized for input_size (relative without
  // clip, or absolute): such a model only runs at its input size.
  bool fixed_input_size() const;

  // What a network of this config costs, computed from the config alone (nothing allocated):
  // parameters, and the peak working set of one image's inference (the largest activations and
  // attention matrices alive at once, roughly).
  struct Estimate {
    double params = 0;             // number of parameters (with batch-norm statistics)
    double param_bytes = 0;        // float32
    double working_bytes = 0;      // batch 1 inference, input_size
    double total_bytes() const { return param_bytes + working_bytes; }
  };
  Estimate estimate() const;
  // Throws an Error naming the estimate when it is over the limit: RELPOS_MAX_MODEL_GB in the
  // environment, else 16 GiB (a network is checked before any of it is allocated).
  void check_memory() const;
};

// Where shipped models live, the first that exists of: $RELPOS_MODELS; <prefix>/share/relpos/models
// beside the installed shared library (found wherever the prefix was moved); for a program in
// relpos's build tree, the source tree's models/; the configured install location
// (CMAKE_INSTALL_PREFIX, which is how a static library's consumers find them: move the prefix and
// set RELPOS_MODELS); the source tree's models/; models/ in or beside the executable's folder.
std::string models_dir();
// The file a config argument names: the path itself, or models_dir()/<name>.json.
std::string find_config(const std::string& path_or_name);

}  // namespace relpos
