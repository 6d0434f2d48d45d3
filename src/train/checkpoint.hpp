// Internal: training checkpoints (safetensors). Tensors "model.<name>" (parameters and
// buffers), "optim.<name>.m1/.m2" and, with EMA, "ema.<name>"; metadata holds the config, labels, preprocessing, the
// training options and where training stands.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "relpos/trainer.hpp"
#include "train/lr_plan.hpp"
#include "train/weight_ema.hpp"

namespace relpos::detail {

struct TrainProgress {
  int epoch = 0;                  // epochs completed before the current one
  std::size_t batch_in_epoch = 0; // next batch of the current epoch
  long step = 0;                  // steps done in total
  double loss_sum = 0.0, correct = 0.0, seen = 0.0, seconds = 0.0;  // current epoch so far
  double run_seconds = 0.0;       // training time of all earlier parts of the run
  std::vector<EpochLog> history;
  int best_epoch = 0;             // with validation: the best epoch so far (1-based; 0: none yet)
  double best_val_acc = -1.0;
  std::vector<LrSegment> lr_segments;  // the schedule after extensions (see LrPlan)
  int threads = 0;                // CPU threads the run computed with: a resumed run takes the same (0: unknown)
  std::string data_fingerprint;   // the training images' names and classes, hashed ("": unknown)
  long data_images = 0;           // how many there were
};

void save_checkpoint(const std::string& path, const Model& model, const Optimizer& optimizer,
                     const TrainOptions& options, const TrainProgress& progress, const WeightEma* ema = nullptr);

struct Checkpoint {
  std::optional<Model> model;
  TrainOptions options;
  TrainProgress progress;
  long optimizer_steps = 0;
  std::vector<std::pair<std::string, Tensor>> optimizer_state;
  std::vector<std::pair<std::string, Tensor>> ema_state;  // empty without EMA
};
Checkpoint load_checkpoint(const std::string& path);

nlohmann::json epoch_log_json(const EpochLog& e);
EpochLog epoch_log_from(const nlohmann::json& j);

}  // namespace relpos::detail
