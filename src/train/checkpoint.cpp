#include "train/checkpoint.hpp"

#include "io/model_file.hpp"
#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

namespace relpos {

using nlohmann::json;

nlohmann::json TrainOptions::to_json() const {
  return {{"data", data},
          {"epochs", epochs},
          {"batch", batch},
          {"lr", lr},
          {"min_lr", min_lr},
          {"warmup_epochs", warmup_epochs},
          {"label_smoothing", label_smoothing},
          {"optimizer",
           {{"kind", optimizer.kind}, {"momentum", optimizer.momentum}, {"nesterov", optimizer.nesterov},
            {"weight_decay", optimizer.weight_decay}, {"beta1", optimizer.beta1}, {"beta2", optimizer.beta2},
            {"eps", optimizer.eps}}},
          {"augment",
           {{"pad", augment.pad}, {"hflip", augment.hflip}, {"erase_prob", augment.erase_prob},
            {"erase_min_area", augment.erase_min_area}, {"erase_max_area", augment.erase_max_area}}},
          {"seed", seed},
          {"workers", workers},
          {"eval_batch", eval_batch},
          {"eval_each_epoch", eval_each_epoch},
          {"out", out},
          {"max_steps", max_steps},
          {"checkpoint_minutes", checkpoint_minutes}};
}

namespace {
// A key that is absent keeps its default: checkpoints written before an option existed still load.
template <class T>
void read_optional(const json& j, const char* key, T& into) {
  if (j.contains(key)) into = j.at(key).get<T>();
}
}  // namespace

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  TrainOptions o;
  try {
    read_optional(j, "data", o.data);
    read_optional(j, "epochs", o.epochs);
    read_optional(j, "batch", o.batch);
    read_optional(j, "lr", o.lr);
    read_optional(j, "min_lr", o.min_lr);
    read_optional(j, "warmup_epochs", o.warmup_epochs);
    read_optional(j, "label_smoothing", o.label_smoothing);
    if (j.contains("optimizer")) {
      const json& op = j.at("optimizer");
      read_optional(op, "kind", o.optimizer.kind);
      read_optional(op, "momentum", o.optimizer.momentum);
      read_optional(op, "nesterov", o.optimizer.nesterov);
      read_optional(op, "weight_decay", o.optimizer.weight_decay);
      read_optional(op, "beta1", o.optimizer.beta1);
      read_optional(op, "beta2", o.optimizer.beta2);
      read_optional(op, "eps", o.optimizer.eps);
    }
    if (j.contains("augment")) {
      const json& a = j.at("augment");
      read_optional(a, "pad", o.augment.pad);
      read_optional(a, "hflip", o.augment.hflip);
      read_optional(a, "erase_prob", o.augment.erase_prob);
      read_optional(a, "erase_min_area", o.augment.erase_min_area);
      read_optional(a, "erase_max_area", o.augment.erase_max_area);
    }
    read_optional(j, "seed", o.seed);
    read_optional(j, "workers", o.workers);
    read_optional(j, "eval_batch", o.eval_batch);
    read_optional(j, "eval_each_epoch", o.eval_each_epoch);
    read_optional(j, "out", o.out);
    read_optional(j, "max_steps", o.max_steps);
    read_optional(j, "checkpoint_minutes", o.checkpoint_minutes);
  } catch (const json::exception& e) {
    RELPOS_FAIL("training options in the checkpoint are incomplete (" << e.what() << ")");
  }
  return o;
}

namespace detail {

json epoch_log_json(const EpochLog& e) {
  return {{"epoch", e.epoch},       {"lr", e.lr},           {"train_loss", e.train_loss}, {"train_acc", e.train_acc},
          {"test_loss", e.test_loss}, {"test_acc", e.test_acc}, {"seconds", e.seconds},     {"img_per_s", e.img_per_s}};
}

EpochLog epoch_log_from(const json& j) {
  EpochLog e;
  e.epoch = j.at("epoch").get<int>();
  e.lr = j.at("lr").get<float>();
  e.train_loss = j.at("train_loss").get<double>();
  e.train_acc = j.at("train_acc").get<double>();
  e.test_loss = j.at("test_loss").get<double>();
  e.test_acc = j.at("test_acc").get<double>();
  e.seconds = j.at("seconds").get<double>();
  e.img_per_s = j.at("img_per_s").get<double>();
  return e;
}

void save_checkpoint(const std::string& path, const Model& model, const Optimizer& optimizer,
                     const TrainOptions& options, const TrainProgress& p) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamRef& r : model.network().params()) tensors.emplace_back("model." + r.name, *r.value);
  for (auto& [name, t] : optimizer.state()) tensors.emplace_back("optim." + name, t);
  json hist = json::array();
  for (const auto& e : p.history) hist.push_back(epoch_log_json(e));
  const json progress = {{"epoch", p.epoch},       {"batch_in_epoch", p.batch_in_epoch},
                         {"step", p.step},         {"optimizer_steps", optimizer.steps()},
                         {"loss_sum", p.loss_sum}, {"correct", p.correct},
                         {"seen", p.seen},         {"seconds", p.seconds},
                         {"run_seconds", p.run_seconds}, {"history", hist}};
  write_safetensors(path, tensors,
                    {{"format", "pt"},
                     {"relpos.format", "relpos-checkpoint"},
                     {"relpos.config", model.network().config().to_json().dump()},
                     {"relpos.labels", json(model.labels()).dump()},
                     {"relpos.preprocess", model.preprocess().to_json().dump()},
                     {"relpos.train_options", options.to_json().dump()},
                     {"relpos.progress", progress.dump()}});
}

Checkpoint load_checkpoint(const std::string& path) {
  const SafetensorsFile f = SafetensorsFile::read(path);
  const auto& meta = f.metadata();
  RELPOS_CHECK(meta.count("relpos.format") && meta.at("relpos.format") == "relpos-checkpoint",
               path << ": not a relpos training checkpoint");
  Checkpoint c;
  try {
    const ModelConfig config = ModelConfig::from_json(json::parse(meta.at("relpos.config")));
    const auto labels = json::parse(meta.at("relpos.labels")).get<std::vector<std::string>>();
    const Preprocess pre = Preprocess::from_json(json::parse(meta.at("relpos.preprocess")), default_preprocess(config));
    c.options = TrainOptions::from_json(json::parse(meta.at("relpos.train_options")));
    const json pj = json::parse(meta.at("relpos.progress"));
    c.progress.epoch = pj.at("epoch").get<int>();
    c.progress.batch_in_epoch = pj.at("batch_in_epoch").get<std::size_t>();
    c.progress.step = pj.at("step").get<long>();
    c.optimizer_steps = pj.at("optimizer_steps").get<long>();
    c.progress.loss_sum = pj.at("loss_sum").get<double>();
    c.progress.correct = pj.at("correct").get<double>();
    c.progress.seen = pj.at("seen").get<double>();
    c.progress.seconds = pj.at("seconds").get<double>();
    c.progress.run_seconds = pj.at("run_seconds").get<double>();
    for (const auto& e : pj.at("history")) c.progress.history.push_back(epoch_log_from(e));
    std::vector<std::pair<std::string, Tensor>> weights;
    for (const auto& e : f.entries()) {
      if (e.name.rfind("model.", 0) == 0) weights.emplace_back(e.name.substr(6), f.tensor(e.name));
      if (e.name.rfind("optim.", 0) == 0) c.optimizer_state.emplace_back(e.name.substr(6), f.tensor(e.name));
    }
    Network net(config, 0, /*initialize=*/false);
    assign_tensors(net, weights, path);
    c.model.emplace(std::move(net), labels, pre);
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": damaged checkpoint metadata (" << e.what() << ")");
  }
  return c;
}

}  // namespace detail

Model load_checkpoint_model(const std::string& checkpoint) { return std::move(*detail::load_checkpoint(checkpoint).model); }

}  // namespace relpos
