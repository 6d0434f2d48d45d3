#include "train/checkpoint.hpp"

#include "io/json_reader.hpp"
#include "io/weights_file.hpp"
#include "relpos/error.hpp"
#include "relpos/safetensors.hpp"

namespace relpos {

using nlohmann::json;

namespace {

// Each option once, with its key: to_json and from_json both walk this list, so they cannot drift
// apart. `f(key, field)` for values, `f(key, struct, fields_of_struct)` for nested objects.
template <class Options, class F>
void each_option(Options& o, F&& f) {
  f("data", o.data);
  f("epochs", o.epochs);
  f("batch", o.batch);
  f("lr", o.lr);
  f("min_lr", o.min_lr);
  f("warmup_epochs", o.warmup_epochs);
  f("label_smoothing", o.label_smoothing);
  f.nested("optimizer", [&](auto& g) {
    g("kind", o.optimizer.kind);
    g("momentum", o.optimizer.momentum);
    g("nesterov", o.optimizer.nesterov);
    g("weight_decay", o.optimizer.weight_decay);
    g("beta1", o.optimizer.beta1);
    g("beta2", o.optimizer.beta2);
    g("eps", o.optimizer.eps);
  });
  f.nested("augment", [&](auto& g) {
    g("pad", o.augment.pad);
    g("hflip", o.augment.hflip);
    g("erase_prob", o.augment.erase_prob);
    g("erase_min_area", o.augment.erase_min_area);
    g("erase_max_area", o.augment.erase_max_area);
    g("canvas", o.augment.canvas);
  });
  f("train_images", o.train_images);
  f("seed", o.seed);
  f("workers", o.workers);
  f("eval_batch", o.eval_batch);
  f("eval_each_epoch", o.eval_each_epoch);
  f("val_split", o.val_split);
  f("ema_decay", o.ema_decay);
  f("clip_grad", o.clip_grad);
  f("init", o.init);
  f("init_config", o.init_config);
  f("extend", o.extend);
  f("extend_lr", o.extend_lr);
  f("out", o.out);
  f("save", o.save);
  f("max_steps", o.max_steps);
  f("checkpoint_minutes", o.checkpoint_minutes);
  f("processes", o.processes);
  f("sync_bn", o.sync_bn);
  f("bucket_mb", o.bucket_mb);
}

struct Writer {
  json& j;
  template <class T>
  void operator()(const char* key, const T& v) {
    j[key] = v;
  }
  void operator()(const char* key, const OptimizerKind& v) { j[key] = to_string(v); }
  template <class Body>
  void nested(const char* key, Body&& body) {
    Writer w{j[key] = json::object()};
    body(w);
  }
};

// Lenient: a key that is absent keeps its default, so checkpoints written before an option existed
// still load; a key this version does not know is ignored.
struct ReaderVisitor {
  detail::JsonReader r;
  template <class T>
  void operator()(const char* key, T& v) {
    r.read(key, v);
  }
  void operator()(const char* key, OptimizerKind& v) {
    if (!r.has(key)) return;
    try {
      v = parse_optimizer_kind(r.need<std::string>(key));
    } catch (const Error& e) {
      RELPOS_FAIL(r.at(key) << ": " << e.what());
    }
  }
  template <class Body>
  void nested(const char* key, Body&& body) {
    if (!r.has(key)) return;
    ReaderVisitor child{r.child(key)};
    body(child);
  }
};

}  // namespace

nlohmann::json TrainOptions::to_json() const {
  json j = json::object();
  each_option(*this, Writer{j});
  return j;
}

TrainOptions TrainOptions::from_json(const nlohmann::json& j) {
  TrainOptions o;
  each_option(o, ReaderVisitor{detail::JsonReader(j, "training options", /*strict=*/false)});
  return o;
}

namespace detail {

namespace {
template <class Log, class F>
void each_log_field(Log& e, F&& f) {
  f("epoch", e.epoch);
  f("lr", e.lr);
  f("train_loss", e.train_loss);
  f("train_acc", e.train_acc);
  f("val_loss", e.val_loss);
  f("val_acc", e.val_acc);
  f("test_loss", e.test_loss);
  f("test_acc", e.test_acc);
  f("seconds", e.seconds);
  f("img_per_s", e.img_per_s);
}
}  // namespace

json epoch_log_json(const EpochLog& e) {
  json j = json::object();
  each_log_field(e, Writer{j});
  return j;
}

EpochLog epoch_log_from(const json& j) {
  EpochLog e;
  each_log_field(e, ReaderVisitor{JsonReader(j, "training history", /*strict=*/false)});
  return e;
}

void save_checkpoint(const std::string& path, const Model& model, const Optimizer& optimizer,
                     const TrainOptions& options, const TrainProgress& p, const WeightEma* ema) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const ParamRef& r : model.network().params()) tensors.emplace_back("model." + r.name, *r.value);
  for (auto& [name, t] : optimizer.state()) tensors.emplace_back("optim." + name, t);
  if (ema)
    for (const auto& [name, t] : ema->state()) tensors.emplace_back("ema." + name, t);
  json hist = json::array();
  for (const auto& e : p.history) hist.push_back(epoch_log_json(e));
  const json progress = {{"epoch", p.epoch},       {"batch_in_epoch", p.batch_in_epoch},
                         {"step", p.step},         {"optimizer_steps", optimizer.steps()},
                         {"loss_sum", p.loss_sum}, {"correct", p.correct},
                         {"seen", p.seen},         {"seconds", p.seconds},
                         {"run_seconds", p.run_seconds}, {"history", hist},
                         {"best_epoch", p.best_epoch}, {"best_val_acc", p.best_val_acc},
                         {"lr_segments", lr_segments_json(p.lr_segments)}, {"threads", p.threads},
                         {"data_fingerprint", p.data_fingerprint}, {"data_images", p.data_images}};
  auto meta = model_metadata(model, "relpos-checkpoint");
  meta["relpos.train_options"] = options.to_json().dump();
  meta["relpos.progress"] = progress.dump();
  write_safetensors(path, tensors, meta);
}

Checkpoint load_checkpoint(const std::string& path) {
  // what else it may be, named: a folder, weights (JSON or safetensors), not a model file at all
  const ModelFileKind kind = model_file_kind(path);
  RELPOS_CHECK(kind == ModelFileKind::Safetensors,
               path << ": " << (kind == ModelFileKind::Config ? "a model config" : "a weights JSON file")
                    << ", not a training checkpoint (checkpoint.safetensors in a run's folder); to start from its "
                       "weights, use --init (TrainOptions::init)");
  const SafetensorsFile f = SafetensorsFile::read(path);
  const auto& meta = f.metadata();
  RELPOS_CHECK(meta.count("relpos.format") && meta.at("relpos.format") == "relpos-checkpoint",
               path << ": not a relpos training checkpoint"
                    << (meta.count("relpos.format") ? " (weights; to start from them, use --init)" : ""));
  Checkpoint c;
  const auto entry = [&](const std::string& key) -> const std::string& {
    const auto it = meta.find(key);
    RELPOS_CHECK(it != meta.end(), path << ": damaged checkpoint: no '" << key << "' in its metadata");
    return it->second;
  };
  try {
    const ModelConfig config = ModelConfig::from_json(parse_json_text(entry("relpos.config"), "relpos.config"));
    const auto labels = parse_json_text(entry("relpos.labels"), "relpos.labels").get<std::vector<std::string>>();
    const Preprocess pre = Preprocess::from_json(parse_json_text(entry("relpos.preprocess"), "relpos.preprocess"), default_preprocess(config));
    const json oj = parse_json_text(entry("relpos.train_options"), "relpos.train_options");
    // keys every checkpoint has had: without them the run would silently take defaults (10 epochs,
    // Fashion-MNIST) that are not its own
    for (const char* key : {"data", "epochs", "batch", "lr"})
      RELPOS_CHECK(oj.is_object() && oj.contains(key),
                   path << ": damaged checkpoint: no '" << key << "' in its training options (relpos.train_options)");
    c.options = TrainOptions::from_json(oj);
    RELPOS_CHECK(c.options.epochs >= 1 && c.options.batch >= 2,
                 path << ": damaged checkpoint: training options epochs " << c.options.epochs << ", batch " << c.options.batch
                      << " (relpos.train_options)");
    const json pj = parse_json_text(entry("relpos.progress"), "relpos.progress");
    // as wide integers, so that a damaged value is reported as written rather than wrapped
    const auto count = [&](const char* key) {
      const json& v = pj.at(key);
      RELPOS_CHECK(v.is_number_integer(), path << ": damaged checkpoint: progress " << key << " is " << v.dump()
                                                << ", not a whole number (relpos.progress)");
      const long long n = v.get<long long>();
      RELPOS_CHECK(n >= 0 && n <= (1LL << 50), path << ": damaged checkpoint: progress " << key << " " << n
                                                    << " (relpos.progress)");
      return n;
    };
    const long long epoch = count("epoch");
    RELPOS_CHECK(epoch <= c.options.epochs, path << ": damaged checkpoint: progress epoch " << epoch << " of a run of "
                                                 << c.options.epochs << " epochs (relpos.progress)");
    c.progress.epoch = static_cast<int>(epoch);
    c.progress.batch_in_epoch = static_cast<std::size_t>(count("batch_in_epoch"));
    c.progress.step = static_cast<long>(count("step"));
    c.optimizer_steps = static_cast<long>(count("optimizer_steps"));
    c.progress.loss_sum = pj.at("loss_sum").get<double>();
    c.progress.correct = pj.at("correct").get<double>();
    c.progress.seen = pj.at("seen").get<double>();
    c.progress.seconds = pj.at("seconds").get<double>();
    c.progress.run_seconds = pj.at("run_seconds").get<double>();
    for (const auto& e : pj.at("history")) c.progress.history.push_back(epoch_log_from(e));
    // keys added later: absent from older checkpoints
    c.progress.best_epoch = pj.value("best_epoch", 0);
    c.progress.best_val_acc = pj.value("best_val_acc", -1.0);
    if (pj.contains("lr_segments")) c.progress.lr_segments = lr_segments_from(pj.at("lr_segments"));
    c.progress.threads = pj.value("threads", 0);
    c.progress.data_fingerprint = pj.value("data_fingerprint", std::string());
    c.progress.data_images = pj.value("data_images", 0L);
    // every step takes at least one of the run's images
    RELPOS_CHECK(c.progress.data_images <= 0 ||
                     c.progress.step <= (c.progress.epoch + 1) * c.progress.data_images,
                 path << ": damaged checkpoint: progress step " << c.progress.step << " after " << c.progress.epoch
                      << " epochs of " << c.progress.data_images << " images (relpos.progress)");
    RELPOS_CHECK(c.progress.threads >= 0 && c.progress.threads <= 1024,
                 path << ": damaged checkpoint: " << c.progress.threads << " threads in its progress");
    RELPOS_CHECK(c.progress.epoch >= 0 && c.progress.step >= 0 && c.optimizer_steps >= 0 &&
                     std::isfinite(c.progress.seconds) && std::isfinite(c.progress.run_seconds),
                 path << ": damaged checkpoint: progress epoch " << c.progress.epoch << ", step " << c.progress.step
                      << ", optimizer steps " << c.optimizer_steps);
    std::vector<std::pair<std::string, Tensor>> weights;
    for (const auto& e : f.entries()) {
      if (e.name.rfind("model.", 0) == 0) weights.emplace_back(e.name.substr(6), f.tensor(e.name));
      if (e.name.rfind("optim.", 0) == 0) c.optimizer_state.emplace_back(e.name.substr(6), f.tensor(e.name));
      if (e.name.rfind("ema.", 0) == 0) c.ema_state.emplace_back(e.name.substr(4), f.tensor(e.name));
    }
    Network net(config, 0, /*initialize=*/false);
    assign_tensors(net, weights, path);
    c.model.emplace(std::move(net), labels, pre);
  } catch (const json::exception& e) {
    RELPOS_FAIL(path << ": damaged checkpoint metadata (" << e.what() << ")");
  } catch (const Error& e) {  // a config, option or tensor the checkpoint holds: named with the file
    const std::string what = e.what();
    if (what.rfind(path, 0) == 0) throw;
    RELPOS_FAIL(path << ": " << what);
  }
  return c;
}

}  // namespace detail

Model load_checkpoint_model(const std::string& checkpoint) {
  detail::Checkpoint c = detail::load_checkpoint(checkpoint);
  if (!c.ema_state.empty()) {  // the averaged weights, which the run evaluated and saved
    Network& net = c.model->network();
    detail::assign_tensors(net, c.ema_state, checkpoint + " (EMA)");  // prepares it for inference
  }
  return std::move(*c.model);
}

}  // namespace relpos
