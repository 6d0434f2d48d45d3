// The training loop and evaluation.
#include "relpos/trainer.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "io/atomic_file.hpp"
#include "relpos/error.hpp"
#include "relpos/ops.hpp"
#include "train/checkpoint.hpp"
#include "train/data_parallel.hpp"
#include "train/plots.hpp"

namespace relpos {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


// Throws unless a file can be created in the folder (a probe file, removed again).
void check_writable_folder(const std::string& folder, const char* what) {
  const fs::path probe = fs::path(folder) / (".relpos-write-test." + std::to_string(::getpid()));
  {
    std::ofstream f(probe);
    RELPOS_CHECK(f && (f << 'x') && f.flush(), folder << ": cannot write to " << what);
  }
  std::error_code ec;
  fs::remove(probe, ec);
}

int argmax(const float* row, std::int64_t n) { return static_cast<int>(std::max_element(row, row + n) - row); }

void write_csv(const std::string& path, const std::vector<EpochLog>& history) {
  detail::write_atomically(path, [&](std::ostream& out) {
    out << "epoch,lr,train_loss,train_acc,test_loss,test_acc,seconds,img_per_s\n";
    for (const auto& e : history)
      out << e.epoch << ',' << e.lr << ',' << e.train_loss << ',' << e.train_acc << ',' << e.test_loss << ','
          << e.test_acc << ',' << e.seconds << ',' << e.img_per_s << '\n';
  });
}

}  // namespace

EvalResult evaluate(const Model& model, const Dataset& data, int batch,
                    const std::function<void(std::size_t, std::size_t)>& progress) {
  RELPOS_CHECK(batch >= 1, "evaluation batch must be at least 1");
  const int classes = model.network().config().num_classes;
  RELPOS_CHECK(static_cast<int>(data.classes().size()) == classes,
               "the data has " << data.classes().size() << " classes but the model " << classes);
  EvalResult r;
  r.classes = model.labels().empty() ? data.classes() : model.labels();
  r.confusion.assign(static_cast<std::size_t>(classes), std::vector<long>(static_cast<std::size_t>(classes), 0));
  DataLoader::Options lo;
  lo.batch = batch;
  lo.shuffle = false;
  lo.drop_last = false;
  lo.workers = 1;
  DataLoader loader(data, model.preprocess(), lo);
  loader.start_epoch(0);
  Batch b;
  double loss_sum = 0.0;
  long correct = 0;
  while (loader.next(b)) {
    const Tensor logits = model.logits(b.images);
    loss_sum += ops::cross_entropy(logits, b.labels).loss * static_cast<double>(b.labels.size());
    for (std::size_t i = 0; i < b.labels.size(); ++i) {
      const int p = argmax(logits.data() + i * static_cast<std::size_t>(classes), classes);
      ++r.confusion[static_cast<std::size_t>(b.labels[i])][static_cast<std::size_t>(p)];
      correct += p == b.labels[i];
    }
    r.count += b.labels.size();
    if (progress) progress(r.count + loader.skipped(), data.size());
  }
  r.skipped = loader.skipped();
  RELPOS_CHECK(r.count > 0, "no readable images to evaluate");
  r.loss = loss_sum / static_cast<double>(r.count);
  r.top1 = static_cast<double>(correct) / static_cast<double>(r.count);
  for (std::size_t c = 0; c < r.confusion.size(); ++c) {
    long n = 0;
    for (long v : r.confusion[c]) n += v;
    r.per_class.push_back(n ? static_cast<double>(r.confusion[c][c]) / static_cast<double>(n) : 0.0);
  }
  return r;
}

TrainResult train(Model& model, const TrainOptions& options, const std::string& resume, const std::atomic<bool>* stop,
                  int resume_epochs) {
  TrainOptions opts = options;
  detail::DataParallel dp;  // the processes of this run (one, or those mpirun started)
  detail::TrainProgress prog;
  std::optional<detail::Checkpoint> ck;
  if (!resume.empty()) {
    const Device device = model.device();
    ck = detail::load_checkpoint(resume);
    model = std::move(*ck->model);
    model.to(device);
    opts = ck->options;  // the recipe comes from the checkpoint; how to run it from this call
    opts.on_event = options.on_event;
    opts.workers = options.workers;
    opts.max_steps = options.max_steps;
    opts.checkpoint_minutes = options.checkpoint_minutes;
    opts.bucket_mb = options.bucket_mb;
    dp.check_resume(opts.processes, resume);
    if (!options.save.empty()) opts.save = options.save;  // else where the run was told to save
    if (resume_epochs > 0) opts.epochs = resume_epochs;
    opts.out = fs::path(resume).parent_path().string();
    if (opts.out.empty()) opts.out = ".";
    prog = ck->progress;
  }
  RELPOS_CHECK(opts.epochs >= 1 && opts.batch >= 2, "need at least one epoch and batches of at least 2 images");
  opts.processes = dp.size();
  // Every output path is checked before any work, so a run never fails at its end for a bad path.
  // Rank 0 alone writes (checkpoint, log, curves, model).
  std::error_code ec;
  if (dp.writer()) {
    fs::create_directories(opts.out, ec);
    RELPOS_CHECK(!ec && fs::is_directory(opts.out), opts.out << ": cannot create the output folder ("
                                                             << (ec ? ec.message() : "not a folder") << ")");
    check_writable_folder(opts.out, "the output folder");
    if (!opts.save.empty()) {
      const fs::path parent = fs::path(opts.save).parent_path().empty() ? fs::path(".") : fs::path(opts.save).parent_path();
      RELPOS_CHECK(fs::is_directory(parent, ec), opts.save << ": cannot save the model there (no folder " << parent.string() << ")");
      RELPOS_CHECK(!fs::is_directory(opts.save, ec), opts.save << ": is a folder; --save takes a file name");
      check_writable_folder(parent.string(), "the folder of the model file");
    }
    // A run killed while writing leaves "<file>.tmp.<pid>" behind; the file itself is intact.
    for (const auto& e : fs::directory_iterator(opts.out)) {
      const std::string name = e.path().filename().string();
      for (const char* f : {"checkpoint.safetensors.tmp.", "log.csv.tmp.", "model.json.tmp.", "curves.png.tmp."})
        if (name.rfind(f, 0) == 0) fs::remove(e.path());
    }
  }
  const std::string ckpt_path = (fs::path(opts.out) / "checkpoint.safetensors").string();

  // A model that already has labels (resumed, or loaded from a file) finds its class folders by name.
  auto train_data = open_dataset(opts.data, "train", model.labels());
  auto test_data = opts.eval_each_epoch ? open_dataset(opts.data, "test", train_data->classes()) : nullptr;
  Network& net = model.network();
  RELPOS_CHECK(static_cast<int>(train_data->classes().size()) == net.config().num_classes,
               opts.data << " has " << train_data->classes().size() << " classes but the model has "
                         << net.config().num_classes << " outputs");
  if (model.labels().empty()) model.set_labels(train_data->classes());

  Optimizer optimizer(opts.optimizer, net.params());
  if (ck) optimizer.load_state(ck->optimizer_state, ck->optimizer_steps);
  dp.start(net, optimizer, opts);
  DataLoader::Options lo;
  lo.batch = opts.batch;
  lo.augment = opts.augment;
  lo.seed = opts.seed;
  lo.workers = opts.workers;
  dp.shard(lo);
  RELPOS_CHECK(train_data->size() >= static_cast<std::size_t>(opts.batch) * static_cast<std::size_t>(dp.size()),
               opts.data << ": " << train_data->size() << " training images, fewer than one global batch ("
                         << dp.size() << " x " << opts.batch << ")");
  DataLoader loader(*train_data, model.preprocess(), lo);
  const std::size_t per_epoch = loader.batches_per_epoch();
  LrSchedule sched;
  sched.lr = opts.lr;
  sched.min_lr = opts.min_lr;
  sched.warmup_lr = opts.lr * 0.01f;
  sched.warmup_steps = static_cast<long>(opts.warmup_epochs * static_cast<float>(per_epoch));
  sched.total_steps = static_cast<long>(per_epoch) * opts.epochs;

  TrainResult result;
  const auto report = [&](TrainEvent ev) {
    if (!opts.on_event) return;
    ev.epoch = prog.epoch + 1;
    ev.epochs = opts.epochs;
    opts.on_event(ev);
  };
  const auto run_start = Clock::now();
  const double run_before = prog.run_seconds;
  auto last_save = Clock::now();
  auto save = [&] {
    prog.run_seconds = run_before + seconds_since(run_start);
    const std::string drift = dp.synchronize_state();
    if (!drift.empty()) {
      TrainEvent ev;
      ev.kind = TrainEvent::Kind::Message;
      ev.message = drift;
      report(ev);
    }
    if (dp.writer()) detail::save_checkpoint(ckpt_path, model, optimizer, opts, prog);
    result.checkpoint = ckpt_path;
    ++result.checkpoints;
    last_save = Clock::now();
  };
  const int classes = net.config().num_classes;
  double train_seconds = 0.0;  // in finished epochs of this run
  while (prog.epoch < opts.epochs) {
    loader.start_epoch(prog.epoch, prog.batch_in_epoch);
    auto epoch_start = Clock::now();
    const double epoch_before = prog.seconds;
    const double seen_before = prog.seen;
    Batch b;
    float lr = sched.at(prog.step);
    std::size_t done_now = 0;  // batches of this epoch run in this call
    while (loader.next(b)) {
      lr = sched.at(prog.step);
      const Tensor logits = net.forward(b.images.to(model.device()));
      const ops::CrossEntropy ce = ops::cross_entropy(logits, b.labels, opts.label_smoothing);
      RELPOS_CHECK(std::isfinite(ce.loss), "the loss became " << ce.loss << " at step " << prog.step
                                                              << " (learning rate too high?)");
      net.backward(ce.dlogits, dp.gradient_hook());
      dp.finish_gradients();
      optimizer.step(lr);
      const Tensor host = logits.to(Device::CPU);
      // this step's counts, and whether to stop or checkpoint: summed over the processes, so that
      // every one keeps the same progress and takes the same decisions
      double step[5] = {ce.loss * static_cast<double>(b.labels.size()), 0.0, static_cast<double>(b.labels.size()),
                        stop && stop->load() ? 1.0 : 0.0,
                        seconds_since(last_save) >= 60.0 * opts.checkpoint_minutes ? 1.0 : 0.0};
      for (std::size_t i = 0; i < b.labels.size(); ++i)
        step[1] += argmax(host.data() + i * static_cast<std::size_t>(classes), classes) == b.labels[i];
      dp.sum(step, 5);
      prog.loss_sum += step[0];
      prog.correct += step[1];
      prog.seen += step[2];
      const bool stop_asked = step[3] > 0, checkpoint_due = step[4] > 0;
      ++prog.step;
      ++prog.batch_in_epoch;
      ++done_now;
      result.images += step[2];
      prog.seconds = epoch_before + seconds_since(epoch_start);
      result.step_seconds = train_seconds + (prog.seconds - epoch_before);
      const double img_s = (prog.seen - seen_before) / std::max(1e-9, prog.seconds - epoch_before);
      const double step_s = (prog.seconds - epoch_before) / static_cast<double>(done_now);
      const double left_epoch = static_cast<double>(per_epoch - prog.batch_in_epoch) * step_s;
      const double left_run = left_epoch + static_cast<double>((opts.epochs - prog.epoch - 1) * per_epoch) * step_s;
      TrainEvent ev;
      ev.batch = prog.batch_in_epoch;
      ev.batches = per_epoch;
      ev.img_per_s = img_s;
      ev.loss = prog.loss_sum / prog.seen;
      ev.acc = prog.correct / prog.seen;
      ev.lr = lr;
      ev.eta_epoch = left_epoch;
      ev.eta_run = left_run;
      report(ev);
      const bool stop_now = stop_asked || (opts.max_steps > 0 && prog.step >= opts.max_steps);
      if (stop_now) {
        net.release_saved();
        net.prepare_inference();
        save();
        result.interrupted = stop_asked;
        result.history = prog.history;
        result.seconds = seconds_since(run_start);
        return result;
      }
      // Inside an epoch, a checkpoint every checkpoint_minutes (resuming from it is exact, as after Ctrl-C).
      if (opts.checkpoint_minutes > 0 && prog.batch_in_epoch < per_epoch && checkpoint_due) {
        net.release_saved();
        save();
      }
    }
    train_seconds = result.step_seconds;
    net.release_saved();
    net.prepare_inference();
    EpochLog e;
    e.epoch = prog.epoch + 1;
    e.lr = lr;
    e.train_loss = prog.loss_sum / std::max(1.0, prog.seen);
    e.train_acc = prog.correct / std::max(1.0, prog.seen);
    e.seconds = prog.seconds;
    e.img_per_s = prog.seen / std::max(1e-9, prog.seconds);
    if (test_data) {
      dp.synchronize_state();  // one model on every process (before the checkpoint below, which checks again)
      const EvalResult ev = dp.evaluate(model, *test_data, opts.eval_batch);
      e.test_loss = ev.loss;
      e.test_acc = ev.top1;
    }
    prog.history.push_back(e);
    {
      TrainEvent ev;
      ev.kind = TrainEvent::Kind::EpochEnd;
      ev.lr = lr;
      ev.log = e;
      report(ev);
    }
    ++prog.epoch;  // done: the checkpoint records where the next epoch starts
    prog.batch_in_epoch = 0;
    prog.loss_sum = prog.correct = prog.seen = prog.seconds = 0.0;
    save();
    if (!dp.writer()) continue;
    write_csv((fs::path(opts.out) / "log.csv").string(), prog.history);
    try {  // a picture is not worth failing a run for
      plot_learning_curves(prog.history, (fs::path(opts.out) / "curves.png").string());
    } catch (const Error& e) {
      TrainEvent ev;
      ev.kind = TrainEvent::Kind::Message;
      ev.message = std::string("learning curves not drawn: ") + e.what();
      report(ev);
    }
  }
  if (dp.writer()) model.save_json((fs::path(opts.out) / "model.json").string());
  if (!opts.save.empty() && dp.writer()) {
    model.save_json(opts.save);
    result.saved = opts.save;
  }
  result.history = prog.history;
  result.seconds = seconds_since(run_start);
  return result;
}

}  // namespace relpos
