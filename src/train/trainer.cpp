// The training loop and evaluation.
#include "relpos/trainer.hpp"
#include "relpos/runtime.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/runtime_internal.hpp"
#include "data/dataset_subset.hpp"
#include "io/atomic_file.hpp"
#include "io/json_reader.hpp"
#include "io/weights_file.hpp"
#include "relpos/error.hpp"
#include "relpos/ops.hpp"
#include "train/checkpoint.hpp"
#include "train/data_parallel.hpp"
#include "train/grad_clip.hpp"
#include "train/lr_plan.hpp"
#include "train/plots.hpp"
#include "train/readable_data.hpp"
#include "train/weight_ema.hpp"

namespace relpos {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


// The files a run writes into its output folder.
constexpr const char* kRunFiles[] = {"checkpoint.safetensors", "best.safetensors", "model.json", "log.csv", "curves.png"};

// Throws unless a file can be created in the folder (a probe file, removed again).
void check_writable_folder(const std::string& folder, const char* what) {
  const fs::path probe = fs::path(folder) / (".relpos-write-test." + std::to_string(::getpid()));
  int error = 0;
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    error = errno;
  } else {
    if (::write(fd, "x", 1) != 1) error = errno != 0 ? errno : ENOSPC;
    ::close(fd);
    std::error_code ec;
    fs::remove(probe, ec);  // whatever happened (a full disk left it behind)
  }
  RELPOS_CHECK(error == 0, folder << ": cannot write to " << what << " (" << std::strerror(error) << ")");
}

// A new run writes these files into its folder, replacing what an earlier run left there (the
// CLI's default folder is the same for every run), so it refuses a folder that holds any of them
// unless TrainOptions::overwrite (--overwrite) says to replace them.
void check_fresh_output(const std::string& out) {
  std::error_code ec;
  const fs::path ckpt = fs::path(out) / "checkpoint.safetensors";
  for (const char* f : {"checkpoint.safetensors", "best.safetensors", "model.json", "log.csv"}) {
    const fs::path p = fs::path(out) / f;
    RELPOS_CHECK(!fs::exists(p, ec), p.string() << ": the output folder holds an earlier run's results; "
                                                << (fs::exists(ckpt, ec) ? "continue it with --resume " + ckpt.string() + ", "
                                                                         : std::string())
                                                << "give another folder (-o), or add --overwrite to replace them "
                                                   "(TrainOptions::out, TrainOptions::overwrite)");
  }
}

// Holds the output folder for one run: two runs writing one folder at once would replace each
// other's checkpoints, logs and models, and the fresh-folder check cannot see a run that has not
// written yet. An advisory lock on the folder itself (flock), let go when the run ends or dies.
class OutputFolderLock {
 public:
  explicit OutputFolderLock(const std::string& folder) : fd_(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    RELPOS_CHECK(fd_ >= 0, folder << ": cannot open the output folder");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      RELPOS_FAIL(folder << ": another training run is writing to this output folder; wait for it to end (or stop "
                            "it), or start a new run in another folder (-o, TrainOptions::out)");
    }
  }
  ~OutputFolderLock() { ::close(fd_); }
  OutputFolderLock(const OutputFolderLock&) = delete;
  OutputFolderLock& operator=(const OutputFolderLock&) = delete;

 private:
  int fd_;
};

int argmax(const float* row, std::int64_t n) { return static_cast<int>(std::max_element(row, row + n) - row); }

void write_csv(const std::string& path, const std::vector<EpochLog>& history) {
  detail::write_atomically(path, [&](std::ostream& out) {
    out << "epoch,lr,train_loss,train_acc,val_loss,val_acc,test_loss,test_acc,seconds,img_per_s\n";
    for (const auto& e : history)
      out << e.epoch << ',' << e.lr << ',' << e.train_loss << ',' << e.train_acc << ',' << e.val_loss << ',' << e.val_acc
          << ',' << e.test_loss << ',' << e.test_acc << ',' << e.seconds << ',' << e.img_per_s << '\n';
  });
}

// Copies a file atomically (the copy appears whole or not at all).
void copy_atomically(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  RELPOS_CHECK(in, from << ": cannot read");
  detail::write_atomically(to, [&](std::ostream& out) { out << in.rdbuf(); });
}

bool is_folder_data(const std::string& spec) { return spec != "fashion-mnist" && spec != "fmnist"; }

}  // namespace

namespace detail {

EvalResult evaluate_readable(const Model& model, const Dataset& data, int batch,
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
  long correct = 0, in_top5 = 0;
  while (loader.next(b)) {
    if (b.labels.empty()) continue;
    const Tensor logits = model.logits(b.images);
    loss_sum += ops::cross_entropy(logits, b.labels).loss * static_cast<double>(b.labels.size());
    for (std::size_t i = 0; i < b.labels.size(); ++i) {
      const float* row = logits.data() + i * static_cast<std::size_t>(classes);
      const int p = argmax(row, classes);
      ++r.confusion[static_cast<std::size_t>(b.labels[i])][static_cast<std::size_t>(p)];
      correct += p == b.labels[i];
      // top-5: fewer than 5 classes score above the true one (ties go to the lower index, as argmax)
      const float truth = row[b.labels[i]];
      int above = 0;
      for (int c = 0; c < classes; ++c) above += row[c] > truth || (row[c] == truth && c < b.labels[i]);
      in_top5 += above < 5;
      r.predictions.push_back(p);
    }
    r.count += b.labels.size();
    if (progress) progress(r.count + loader.skipped(), data.size());
  }
  r.skipped = loader.skipped();
  if (r.count == 0) return r;
  r.loss = loss_sum / static_cast<double>(r.count);
  r.top1 = static_cast<double>(correct) / static_cast<double>(r.count);
  r.top5 = static_cast<double>(in_top5) / static_cast<double>(r.count);
  for (std::size_t c = 0; c < r.confusion.size(); ++c) {
    long n = 0;
    for (long v : r.confusion[c]) n += v;
    r.per_class.push_back(n ? static_cast<double>(r.confusion[c][c]) / static_cast<double>(n) : 0.0);
  }
  return r;
}

std::string nothing_to_evaluate(const Dataset& data) {
  return data.size() == 0 ? std::string("no images to evaluate")
                          : "none of the " + std::to_string(data.size()) + " images to evaluate can be read (the first: " +
                                data.name(0) + ")";
}

}  // namespace detail

EvalResult evaluate(const Model& model, const Dataset& data, int batch,
                    const std::function<void(std::size_t, std::size_t)>& progress) {
  EvalResult r = detail::evaluate_readable(model, data, batch, progress);
  RELPOS_CHECK(r.count > 0, detail::nothing_to_evaluate(data));
  return r;
}

TrainResult train(Model& model, const TrainOptions& options, const std::string& resume, const std::atomic<bool>* stop,
                  int resume_epochs) {
  TrainOptions opts = options;
  detail::FixedThreadCount fixed_threads;  // reproducible weights: no adaptive thread count
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
    // else where the run was told to save; absolute, as a new run's, for the next resume from elsewhere
    if (!options.save.empty()) {
      RELPOS_CHECK(detail::valid_utf8(options.save),
                   detail::printable_utf8(options.save) << ": the path of the model file (--save) is not valid UTF-8 "
                                                           "(the checkpoint records it as text); rename it");
      opts.save = fs::absolute(options.save).lexically_normal().string();
    }
    opts.extend = options.extend;
    opts.extend_lr = options.extend_lr;
    prog = ck->progress;
    // the thread count the run computed with (oneDNN's sums depend on it), unless one is set now
    if (num_threads() == 0 && prog.threads > 0) fixed_threads.use(prog.threads);
    if (resume_epochs > 0) {
      // a checkpoint taken inside an epoch has begun the next one: it cannot end before that one does
      const int begun = prog.epoch + (prog.batch_in_epoch > 0 ? 1 : 0);
      const auto count = [](long n, const char* one, const char* many) {
        return std::to_string(n) + " " + (n == 1 ? one : many);
      };
      RELPOS_CHECK(resume_epochs >= begun,
                   resume << ": the run has done " << count(prog.epoch, "epoch", "epochs")
                          << (prog.batch_in_epoch > 0 ? " and " + count(static_cast<long>(prog.batch_in_epoch), "batch", "batches") +
                                                            " of epoch " + std::to_string(prog.epoch + 1)
                                                      : std::string())
                          << " already; --epochs " << resume_epochs << " would undo them (give at least " << begun << ")");
      opts.epochs = resume_epochs;
    }
    opts.out = fs::path(resume).parent_path().string();
    if (opts.out.empty()) opts.out = ".";
    std::error_code ec;
    // The run goes on in the checkpoint's folder, over its checkpoint.safetensors and log.csv: from
    // another file there (best.safetensors, a copy of an earlier checkpoint) that would rewind the
    // run and lose the epochs after it.
    const fs::path latest = fs::path(opts.out) / "checkpoint.safetensors";
    RELPOS_CHECK(!fs::exists(latest, ec) || fs::equivalent(latest, resume, ec),
                 resume << ": its folder holds the run's latest checkpoint, " << latest.string()
                        << ", which resuming from this file would write over (with log.csv), losing the "
                           "epochs after it. Resume from that one, or copy this file into a new folder "
                           "and resume from the copy there");
    RELPOS_CHECK(opts.max_steps == 0 || opts.max_steps > prog.step,
                 resume << ": the checkpoint stands at step " << prog.step << " already; --max-steps "
                        << opts.max_steps << " would stop before it (give a larger one)");
    RELPOS_CHECK(!is_folder_data(opts.data) || fs::is_directory(opts.data, ec),
                 resume << ": the run's data folder '" << opts.data << "' is not there"
                        << (fs::path(opts.data).is_relative() ? " (from the current folder)" : ""));
  } else {
    // The checkpoint records where the data are and where the model is saved: as absolute paths,
    // so that a run resumed from another folder reads the same data and saves to the same file.
    if (is_folder_data(opts.data)) opts.data = fs::absolute(opts.data).lexically_normal().string();
    if (!opts.save.empty()) opts.save = fs::absolute(opts.save).lexically_normal().string();
    // an output folder inside the data folder would become a class (or an empty one) of the next run
    if (is_folder_data(opts.data)) {
      const fs::path data = fs::absolute(opts.data).lexically_normal(), out = fs::absolute(opts.out).lexically_normal();
      std::vector<fs::path> class_roots = {data / "train", data / "test", data / "val"};
      if (std::error_code e; !fs::is_directory(data / "train", e)) class_roots = {data};  // class folders in DIR itself
      for (const fs::path& root : class_roots) {
        const auto rel = out.lexically_relative(root);
        RELPOS_CHECK(rel.empty() || *rel.begin() == "..",
                     opts.out << ": the output folder is inside " << root.string()
                              << ", among the class folders (it would be taken for a class); give one outside it");
      }
    }
    // the checkpoint stores these paths as JSON text: bytes that are not UTF-8 would fail its first save
    for (const auto& [what, path] : {std::pair<const char*, const std::string&>{"the data folder", opts.data},
                                     {"the output folder", opts.out}, {"the model file (--save)", opts.save},
                                     {"the starting weights (--init)", opts.init},
                                     {"the starting weights' config", opts.init_config}})
      RELPOS_CHECK(detail::valid_utf8(path), detail::printable_utf8(path)
                                                 << ": the path of " << what
                                                 << " is not valid UTF-8 (the checkpoint records it as text); rename it");
  }
  RELPOS_CHECK(opts.epochs >= 1 && opts.batch >= 2, "need at least one epoch and batches of at least 2 images");
  // A new run's recipe (a resumed one keeps the recipe it began with; NaN is refused below, by name)
  RELPOS_CHECK(ck || !(opts.min_lr > opts.lr), "the learning rate would rise: min_lr (--min-lr) "
                                                   << opts.min_lr << " is above lr (--lr) " << opts.lr);
  RELPOS_CHECK(ck || !(opts.optimizer.momentum < 0.0f || opts.optimizer.momentum >= 1.0f),
               "the optimizer's momentum (--momentum) is " << opts.optimizer.momentum
                                                           << "; it must be from 0 to below 1");
  // NaN passes every range check (each comparison is false) and is saved as null, which no resume
  // reads back: a run given one trained with the option quietly off and could not be resumed
  {
    const std::function<void(const nlohmann::json&, const std::string&)> finite = [&](const nlohmann::json& j,
                                                                                     const std::string& key) {
      if (j.is_object())
        for (auto it = j.begin(); it != j.end(); ++it) finite(it.value(), key.empty() ? it.key() : key + "." + it.key());
      else if (j.is_array())
        for (std::size_t i = 0; i < j.size(); ++i) finite(j[i], key + "[" + std::to_string(i) + "]");
      else if (j.is_number_float())
        RELPOS_CHECK(std::isfinite(j.get<double>()),
                     "the training option " << key << " is " << j.get<double>() << "; it must be a finite number");
    };
    finite(opts.to_json(), "");
  }
  // before the output folder is made: an int8 model stopped at its first step, leaving it empty
  RELPOS_CHECK(model.network().int8_layers().empty(),
               (opts.init.empty() ? std::string("the model") : opts.init)
                   << " is an int8 model, which cannot be trained: train (or fine-tune) its float model, then quantize it");
  opts.processes = dp.size();
  // --canvas N: the model sees N x N canvases (its preprocessing must not resize them).
  const int canvas = opts.augment.canvas;
  RELPOS_CHECK(canvas >= 0, "--canvas must not be negative, got " << canvas);
  RELPOS_CHECK(canvas == 0 || (model.preprocess().height == canvas && model.preprocess().width == canvas),
               "--canvas " << canvas << ": the model's preprocessing takes " << model.preprocess().height << "x"
                           << model.preprocess().width << " input; give a config whose input_size is [" << canvas
                           << ", " << canvas << "]");
  // Every output path is checked before any work, so a run never fails at its end for a bad path.
  // Rank 0 alone writes (checkpoint, log, curves, model).
  std::error_code ec;
  std::optional<OutputFolderLock> folder_lock;  // held until train() returns
  if (dp.writer()) {
    fs::create_directories(opts.out, ec);
    RELPOS_CHECK(!ec && fs::is_directory(opts.out), opts.out << ": cannot create the output folder ("
                                                             << (ec ? ec.message() : "not a folder") << ")");
    check_writable_folder(opts.out, "the output folder");
    folder_lock.emplace(opts.out);  // before the check: a run that starts after this one sees it
    if (!ck && !opts.overwrite) check_fresh_output(opts.out);
    if (!opts.save.empty()) {
      for (const char* f : kRunFiles) {
        const fs::path own = fs::path(opts.out) / f;
        RELPOS_CHECK(!(fs::absolute(opts.save).lexically_normal() == fs::absolute(own).lexically_normal() ||
                       fs::equivalent(opts.save, own, ec)),
                     opts.save << ": --save names the run's own " << f << " (in its output folder); give another file");
      }
      const fs::path parent = fs::path(opts.save).parent_path().empty() ? fs::path(".") : fs::path(opts.save).parent_path();
      RELPOS_CHECK(fs::is_directory(parent, ec), opts.save << ": cannot save the model there (no folder " << parent.string() << ")");
      RELPOS_CHECK(!fs::is_directory(opts.save, ec), opts.save << ": is a folder; --save takes a file name");
      // the model is written as its extension says; a file already there is replaced only when it is a
      // relpos model (an image, a config or a timm checkpoint there would be lost)
      // (a resumed run's recorded --save was written as JSON under any name before this rule)
      const std::string ext = fs::path(opts.save).extension().string();
      RELPOS_CHECK((ck && options.save.empty()) || ext == ".json" || ext == ".safetensors",
                   opts.save << ": --save writes relpos weights JSON (.json) or safetensors (.safetensors); "
                                "give a file name with one of these extensions");
      RELPOS_CHECK(!fs::exists(opts.save, ec) || fs::file_size(opts.save, ec) == 0 || detail::is_relpos_model_file(opts.save),
                   opts.save << ": is there and is not a relpos model file; --save replaces only those (give "
                                "another file name, or remove it first)");
      check_writable_folder(parent.string(), "the folder of the model file");
    }
    // A run killed while writing leaves "<file>.tmp.<pid>" behind; the file itself is intact.
    for (const auto& e : fs::directory_iterator(opts.out)) {
      const std::string name = e.path().filename().string();
      for (const char* f : kRunFiles)
        if (name.rfind(std::string(f) + ".tmp.", 0) == 0) fs::remove(e.path());
    }
  }
  const std::string ckpt_path = (fs::path(opts.out) / "checkpoint.safetensors").string();
  const std::string best_path = (fs::path(opts.out) / "best.safetensors").string();

  TrainResult result;
  const auto report = [&](TrainEvent ev) {
    if (!opts.on_event) return;
    ev.epoch = prog.epoch + 1;
    ev.epochs = opts.epochs;
    opts.on_event(ev);
  };
  const auto note = [&](const std::string& text, bool warning = false) {
    TrainEvent ev;
    ev.kind = TrainEvent::Kind::Message;
    ev.warning = warning;
    ev.message = text;
    report(ev);
  };

  // A new run takes its classes from the data (a new classifier when the model's do not fit it).
  const auto two_classes = [&](const std::vector<std::string>& classes) {
    RELPOS_CHECK(classes.size() >= 2, opts.data << ": " << classes.size() << " class"
                                                << (classes.empty() ? std::string() : " ('" + classes.front() + "')")
                                                << ": a classifier learns to tell classes apart, so the data needs a "
                                                   "folder for each of at least two");
  };
  if (!ck) {
    const std::vector<std::string> classes =
        is_folder_data(opts.data) ? open_dataset(opts.data, "train")->classes() : fashion_mnist_classes();
    two_classes(classes);  // (before a new classifier is made, and said to be, for one class)
    const std::string changed = fit_to_data(model, classes, static_cast<std::uint32_t>(opts.seed));
    if (!changed.empty()) note(changed);
  }
  // The model's labels find their class folders by name.
  const auto train_all = open_dataset(opts.data, "train", model.labels());
  Network& net = model.network();
  two_classes(train_all->classes());
  RELPOS_CHECK(static_cast<int>(train_all->classes().size()) == net.config().num_classes,
               opts.data << " has " << train_all->classes().size() << " classes but the model has "
                         << net.config().num_classes << " outputs");
  // A grey model (Fashion-MNIST's) trained on colour folders sees them in grey: its preprocessing
  // comes with it, so say it once rather than let the colours vanish unnoticed.
  if (!ck && is_folder_data(opts.data) && model.preprocess().channels == ChannelOrder::Gray && train_all->size() > 0) {
    bool colour = false;
    try {
      colour = train_all->image(0).channels() >= 3;
    } catch (const Error&) {  // an unreadable image is named and skipped when a batch reaches it
    }
    if (colour)
      note("the model takes " + std::to_string(model.preprocess().width) + "x" +
               std::to_string(model.preprocess().height) + " GRAY input (its preprocessing), so the colour images of " +
               opts.data + " (" + train_all->name(0) +
               ", ...) are converted to grey; to learn from colour, start from a config with RGB input (in_chans 3, "
               "\"channels\": \"RGB\"; docs/training.md)",
           true);
  }
  // --train-images N: the first N images of the training set (before any validation split).
  std::optional<detail::DatasetSubset> train_head;
  const Dataset* train_pool = train_all.get();
  RELPOS_CHECK(opts.train_images >= 0, "--train-images must not be negative, got " << opts.train_images);
  if (opts.train_images > 0 && static_cast<std::size_t>(opts.train_images) < train_all->size()) {
    // Fashion-MNIST's order is random: its first N. A folder dataset lists class after class: N spread
    // evenly over it, so that every class is in them (its first N could all be one class).
    const std::size_t n = static_cast<std::size_t>(opts.train_images), all = train_all->size();
    std::vector<std::size_t> some(n);
    // (a run begun before the spread, whose checkpoint has no data fingerprint, goes on with its first N)
    const bool spread = is_folder_data(opts.data) && !(ck && ck->progress.data_fingerprint.empty());
    for (std::size_t i = 0; i < n; ++i) some[i] = spread ? i * all / n : i;
    train_head.emplace(*train_all, std::move(some));
    train_pool = &*train_head;
    std::vector<long> per_class(train_all->classes().size());
    for (std::size_t i = 0; i < train_head->size(); ++i) ++per_class.at(static_cast<std::size_t>(train_head->label(i)));
    const auto [lo, hi] = std::minmax_element(per_class.begin(), per_class.end());
    note("--train-images " + std::to_string(n) + ": " + std::to_string(n) + " of the " + std::to_string(all) +
         " training images, " + std::to_string(*lo) + " to " + std::to_string(*hi) + " per class");
  }
  // What the run trains on, to tell a resumed run whose data changed (its split and batches would not
  // be the run's): the images' names and classes, hashed (FNV-1a). The processes of a run compare
  // `placed`, the same with the names under the data folder (their absolute paths may differ).
  const auto mix = [](std::uint64_t& hash, const std::string& bytes) {
    for (unsigned char ch : bytes) hash = (hash ^ ch) * 1099511628211ull;
  };
  std::uint64_t fingerprint = 1469598103934665603ull, placed = fingerprint;
  const std::string root = is_folder_data(opts.data) ? opts.data : std::string();
  for (std::size_t i = 0; i < train_all->size(); ++i) {
    const std::string name = train_all->name(i), label = '\n' + std::to_string(train_all->label(i)) + '\n';
    mix(fingerprint, name + label);
    if (dp.size() > 1) mix(placed, (!root.empty() && name.rfind(root, 0) == 0 ? name.substr(root.size()) : name) + label);
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fingerprint));
  RELPOS_CHECK(!ck || ck->progress.data_fingerprint.empty() || ck->progress.data_fingerprint == hex,
               resume << ": the training data in " << opts.data << " changed since the run started (" << train_all->size()
                      << " images now" << (ck && ck->progress.data_images > 0 ? ", " + std::to_string(ck->progress.data_images) + " then" : "")
                      << ", or their names or classes differ): its validation split and batches would not be the "
                         "run's; restore the data, or start a new run");
  prog.data_fingerprint = hex;
  prog.data_images = static_cast<long>(train_all->size());
  // Every process must run the same recipe on the same data from the same point, or they wait for
  // each other forever (one stops earlier) or fail inside MPI (different sizes): checked up front.
  // (paths are left out: made absolute, they differ between machines whose processes start in
  // other folders; the images are compared by `placed`)
  if (dp.size() > 1) {
    nlohmann::json recipe = opts.to_json();
    for (const char* path : {"data", "save", "out", "init", "init_config", "workers"}) recipe.erase(path);
    dp.check_same_run(recipe.dump() + '\n' + net.config().to_json().dump() + '\n' + std::to_string(placed) + '\n' +
                      std::to_string(prog.step) + '\n' + std::to_string(prog.batch_in_epoch));
  }
  if (canvas > 0) check_fits_canvas(*train_pool, canvas);
  // Validation data: part of the training set (seeded), or a val/ folder.
  const Dataset* train_data = train_pool;
  std::optional<detail::DatasetSubset> train_part, val_part;
  std::unique_ptr<Dataset> val_folder;
  const Dataset* val_data = nullptr;
  if (opts.val_split > 0.0f) {
    auto [kept, held] = detail::split_for_validation(*train_pool, opts.val_split, opts.seed);
    train_part.emplace(*train_pool, std::move(kept));
    val_part.emplace(*train_pool, std::move(held));
    train_data = &*train_part;
    val_data = &*val_part;
    // a class with one image keeps it for training: say so, since its validation accuracy is absent
    std::vector<int> held_of(train_pool->classes().size()), all_of(train_pool->classes().size());
    for (std::size_t i = 0; i < val_part->size(); ++i) ++held_of.at(static_cast<std::size_t>(val_part->label(i)));
    for (std::size_t i = 0; i < train_pool->size(); ++i) ++all_of.at(static_cast<std::size_t>(train_pool->label(i)));
    std::vector<std::string> unseen;
    for (std::size_t c = 0; c < all_of.size(); ++c)
      if (all_of[c] > 0 && held_of[c] == 0) unseen.push_back("'" + train_pool->classes()[c] + "'");
    if (!unseen.empty()) {
      std::ostringstream os;
      os << "--val-split: " << unseen.size() << (unseen.size() == 1 ? " class has" : " classes have")
         << " one training image, kept for training, so validation has none of ";
      for (std::size_t i = 0; i < unseen.size() && i < 5; ++i) os << (i ? ", " : "") << unseen[i];
      if (unseen.size() > 5) os << " and " << unseen.size() - 5 << " more";
      note(os.str());
    }
  } else if (is_folder_data(opts.data) && fs::is_directory(fs::path(opts.data) / "val")) {
    val_folder = open_dataset(opts.data, "val", model.labels());
    val_data = val_folder.get();
  }
  // With validation the test set is scored once at the end; without, after every epoch.
  // A folder of class folders without train/ and test/ trains on all of it: it has no test set (one
  // taken from it would score the images trained on).
  const bool flat = is_folder_data(opts.data) && !fs::is_directory(fs::path(opts.data) / "train");
  if (flat && opts.eval_each_epoch)
    note(opts.data + " has no train/ and test/ folders: it is all training data, and there is no test accuracy" +
         (val_data ? "" : " (--val-split holds out part of it for validation)"));
  auto test_data = opts.eval_each_epoch && !flat ? open_dataset(opts.data, "test", model.labels()) : nullptr;
  // With a canvas, validation and test images sit at positions fixed per image (the same in every run).
  std::optional<CanvasDataset> val_canvas, test_canvas;
  if (canvas > 0 && val_data) val_data = &val_canvas.emplace(*val_data, canvas);
  const Dataset* test_set = test_data.get();
  if (canvas > 0 && test_set) test_set = &test_canvas.emplace(*test_set, canvas);
  // Before the first step: a class none of whose images can be read would never be trained (its
  // output a guess with a place in the model), and an evaluation set with no readable image would
  // stop the run when its first epoch ends (the canvas datasets place their images themselves).
  {
    const auto folder = [&](const char* split) {
      if (!is_folder_data(opts.data)) return "fashion-mnist's " + std::string(split) + " images";
      const fs::path p = fs::path(opts.data) / (std::string(split) == "training" ? "train" : split);
      return (fs::is_directory(p) ? p : fs::path(opts.data)).string();
    };
    // each process of a run tries its share of the classes; all of them stop together
    const std::vector<std::string> dead =
        detail::unreadable_classes(*train_data, model.preprocess(), canvas, dp.rank(), dp.size());
    std::vector<double> flags(dead.size());
    for (std::size_t c = 0; c < dead.size(); ++c) flags[c] = dead[c].empty() ? 0.0 : 1.0;
    if (dp.size() > 1 && !flags.empty()) dp.sum(flags.data(), flags.size());
    for (std::size_t c = 0; c < flags.size(); ++c) {
      std::size_t images = 0;
      if (flags[c] > 0.0)
        for (std::size_t i = 0; i < train_data->size(); ++i) images += train_data->label(i) == static_cast<int>(c);
      RELPOS_CHECK(flags[c] == 0.0, folder("training") << ": none of the " << images << " images of class '"
                                                       << train_data->classes()[c] << "' can be read ("
                                                       << (dead[c].empty() ? "another process of the run tried them"
                                                                           : "the first: " + dead[c])
                                                       << "); a class needs at least one image to train on: fix or "
                                                          "remove its folder");
    }
    if (val_data)
      detail::check_some_readable(*val_data, model.preprocess(), 0,
                                  val_folder ? folder("val") : "the validation images held out of " + folder("training"));
    if (test_set) detail::check_some_readable(*test_set, model.preprocess(), 0, folder("test"));
  }

  // The EMA of the weights (what is evaluated and saved when on) and a model to evaluate it in.
  std::optional<detail::WeightEma> ema;
  std::optional<Model> ema_model;
  if (opts.ema_decay > 0.0f) {
    ema.emplace(net, opts.ema_decay);
    if (ck && !ck->ema_state.empty()) ema->load_state(ck->ema_state, resume);
    ema_model.emplace(Network(net.config(), 0, /*initialize=*/false), model.labels(), model.preprocess());
    ema_model->to(model.device());
  }
  const auto scored_model = [&]() -> const Model& {
    if (!ema) return model;
    ema->copy_to(ema_model->network());
    ema_model->network().prepare_inference();
    return *ema_model;
  };

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
  // With --overwrite a new run replaces the earlier one's results, none left beside its own: only now
  // that its data are open and checked, so that a run that cannot start loses nothing.
  if (dp.writer() && !ck && opts.overwrite)
    for (const char* f : kRunFiles) fs::remove(fs::path(opts.out) / f, ec);
  const std::size_t per_epoch = loader.batches_per_epoch();
  RELPOS_CHECK(!ck || prog.batch_in_epoch <= per_epoch,
               resume << ": the checkpoint stands at batch " << prog.batch_in_epoch << " of an epoch of " << per_epoch
                      << " batches (damaged, or the data changed)");
  // The schedule the run was planned with, then its extensions (docs/training.md).
  const int planned_epochs = ck ? ck->options.epochs : opts.epochs;
  detail::LrPlan sched;
  sched.base.lr = opts.lr;
  sched.base.min_lr = opts.min_lr;
  sched.base.warmup_lr = opts.lr * 0.01f;
  sched.base.warmup_steps = static_cast<long>(opts.warmup_epochs * static_cast<float>(per_epoch));
  sched.base.total_steps = static_cast<long>(per_epoch) * planned_epochs;
  sched.segments = prog.lr_segments;
  RELPOS_CHECK(opts.epochs != planned_epochs || opts.extend_lr <= 0.0f,
               "a learning rate for an extension (--lr with --resume, TrainOptions::extend_lr) needs more epochs than "
               "the run's " << planned_epochs << " (--epochs N); it was given with " << opts.epochs);
  RELPOS_CHECK(opts.extend_lr <= 0.0f || opts.extend == "constant" || opts.extend_lr >= opts.min_lr,
               "the extension's learning rate (--lr with --resume) " << opts.extend_lr << " is below the run's min_lr "
                                                                     << opts.min_lr << ", so its cosine would rise; give "
                                                                                       "a larger one, or --extend constant");
  if (opts.epochs != planned_epochs) {
    const float from = sched.at(prog.step);
    sched.extend(prog.step, static_cast<long>(per_epoch) * opts.epochs, opts.extend, opts.extend_lr);
    // at a rate of 0 the extension would train nothing, yet move the batch-norm statistics
    RELPOS_CHECK(sched.segments.back().lr > 0.0f,
                 "the run goes on at a learning rate of 0 (where it ended), which trains nothing and only moves "
                 "the batch-norm statistics; give the extension's rate with --lr (TrainOptions::extend_lr)");
    prog.lr_segments = sched.segments;
    std::ostringstream os;
    os << "the run goes on to " << opts.epochs << " epochs (planned: " << planned_epochs << "); the learning rate "
       << (opts.extend == "constant" ? "stays at " : "follows a new cosine from ") << sched.segments.back().lr;
    if (opts.extend_lr > 0.0f) os << " (given; it was " << from << ")";
    if (opts.extend != "constant") os << " to " << opts.min_lr;
    note(os.str());
  }
  prog.threads = threads_in_use();  // recorded in each checkpoint
  const auto run_start = Clock::now();
  const double run_before = prog.run_seconds;
  auto last_save = Clock::now();
  // One model on every process; a warning when they had drifted apart (rank 0's copied to all).
  // The weight average's running statistics: each process averages its own, so (without sync-BN)
  // they are made the processes' mean with the network's, so that what is evaluated is what is saved.
  const auto ema_statistics = [&] { return ema ? ema->statistics(net) : std::vector<Tensor*>{}; };
  const auto synchronize = [&] {
    dp.average_statistics(ema_statistics());
    const std::string drift = dp.synchronize_state();
    if (drift.empty()) return;
    TrainEvent ev;
    ev.kind = TrainEvent::Kind::Message;
    ev.message = drift;
    report(ev);
  };
  auto save = [&] {
    prog.run_seconds = run_before + seconds_since(run_start);
    synchronize();
    if (dp.writer()) detail::save_checkpoint(ckpt_path, model, optimizer, opts, prog, ema ? &*ema : nullptr);
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
    // the rate of the epoch's last step: one resumed at its end runs none, and logs the one it ran before
    float lr = prog.batch_in_epoch > 0 && prog.step > 0 ? sched.at(prog.step - 1) : sched.at(prog.step);
    std::size_t done_now = 0;  // batches of this epoch run in this call
    while (loader.next(b)) {
      if (dp.size() > 1) {  // a process whose part of the batch was all unreadable: all skip the step
        double empty = b.labels.empty() ? 1.0 : 0.0;
        dp.sum(&empty, 1);
        if (empty > 0) {
          if (dp.writer()) {
            TrainEvent ev;
            ev.kind = TrainEvent::Kind::Message;
            ev.message = "skipped batch " + std::to_string(prog.batch_in_epoch + 1) + " of epoch " +
                         std::to_string(prog.epoch + 1) + ": " + std::to_string(static_cast<int>(empty)) +
                         " process(es) had no readable image in their part of it";
            report(ev);
          }
          ++prog.batch_in_epoch;
          continue;
        }
      }
      lr = sched.at(prog.step);
      const Tensor logits = net.forward(b.images.to(model.device()));
      const ops::CrossEntropy ce = ops::cross_entropy(logits, b.labels, opts.label_smoothing);
      RELPOS_CHECK(std::isfinite(ce.loss), "the loss became " << ce.loss << " at step " << prog.step
                                                              << " (learning rate too high?)");
      net.backward(ce.dlogits, dp.gradient_hook());
      dp.finish_gradients();
      if (opts.clip_grad > 0.0f) detail::clip_grad_norm(net.params(), opts.clip_grad);
      optimizer.step(lr);
      if (ema) ema->update(net);
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
        result.max_steps_reached = !stop_asked;
        result.history = prog.history;
        result.seconds = seconds_since(run_start);
        return result;
      }
      // Inside an epoch, a checkpoint every checkpoint_minutes (resuming from it is exact, as after Ctrl-C).
      if (opts.checkpoint_minutes > 0 && prog.batch_in_epoch < per_epoch && checkpoint_due) {
        net.release_saved();
        // the checkpoint holds the processes' mean running statistics; the run goes on with each
        // its own, so that when checkpoints fall (by the clock) does not change the run
        const std::vector<Tensor> own = dp.own_statistics();
        std::vector<Tensor> own_ema;
        if (!own.empty())
          for (Tensor* t : ema_statistics()) own_ema.push_back(t->clone());
        save();
        dp.restore_statistics(own);
        const std::vector<Tensor*> ema_now = ema_statistics();
        for (std::size_t i = 0; i < own_ema.size(); ++i) ema_now[i]->copy_from(own_ema[i]);
      }
    }
    train_seconds = result.step_seconds;
    net.release_saved();
    // the processes' mean statistics first: prepare_inference folds them into the evaluated
    // weights (the checkpoint below checks again)
    synchronize();
    net.prepare_inference();
    EpochLog e;
    e.epoch = prog.epoch + 1;
    e.lr = lr;
    e.train_loss = prog.loss_sum / std::max(1.0, prog.seen);
    e.train_acc = prog.correct / std::max(1.0, prog.seen);
    e.seconds = prog.seconds;
    e.img_per_s = prog.seen / std::max(1e-9, prog.seconds);
    const Model& scored = scored_model();
    try {
      if (val_data) {
        const EvalResult ev = dp.evaluate(scored, *val_data, opts.eval_batch);
        e.val_loss = ev.loss;
        e.val_acc = ev.top1;
      } else if (test_set) {
        const EvalResult ev = dp.evaluate(scored, *test_set, opts.eval_batch);
        e.test_loss = ev.loss;
        e.test_acc = ev.top1;
      }
    } catch (const Error& err) {
      // The epoch's training is not lost with its evaluation (its images changed since the run began
      // and can no longer be read, ...): saved as it stands, a resumed run evaluates it. One process
      // alone: the others of a run would have to save with it, and may not have failed.
      if (dp.size() > 1) throw;
      save();
      RELPOS_FAIL("evaluating epoch " << prog.epoch + 1 << ": " << err.what() << "; the epoch's training is saved in "
                                      << ckpt_path << ": once the data is fixed, relpos train --resume " << ckpt_path
                                      << " evaluates it and goes on");
    }
    const bool best = val_data && e.val_acc > prog.best_val_acc;
    if (best) {
      prog.best_epoch = e.epoch;
      prog.best_val_acc = e.val_acc;
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
    if (best) copy_atomically(ckpt_path, best_path);  // the best epoch's checkpoint, beside the last
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
  result.checkpoint = ckpt_path;  // also when a finished run was resumed without more epochs
  if (!dp.writer()) {  // the other processes are done: rank 0 writes the model (and scores the test set once)
    result.history = prog.history;
    result.seconds = seconds_since(run_start);
    return result;
  }
  // model.json (and --save): the best epoch by validation, else the last; the EMA when on.
  std::optional<Model> best_model;
  const Model* final_model = &scored_model();
  if (val_data && prog.best_epoch > 0 && fs::exists(best_path)) {
    best_model.emplace(load_checkpoint_model(best_path));
    best_model->to(model.device());
    final_model = &*best_model;
    result.best = best_path;
    result.best_epoch = prog.best_epoch;
    result.best_val_acc = prog.best_val_acc;
  }
  try {
    final_model->save_json((fs::path(opts.out) / "model.json").string());
    if (!opts.save.empty()) {
      const bool st = opts.save.size() > 12 && opts.save.compare(opts.save.size() - 12, 12, ".safetensors") == 0;
      if (st) final_model->save_safetensors(opts.save);
      else final_model->save_json(opts.save);
      result.saved = opts.save;
    }
  } catch (const Error& err) {  // (a full disk): the training is done and kept
    RELPOS_FAIL(err.what() << "; the training is complete in " << ckpt_path << ": relpos train --resume " << ckpt_path
                           << " writes the model files again");
  }
  if (val_data && test_set) {  // the test set, once
    const EvalResult ev = evaluate(*final_model, *test_set, opts.eval_batch);
    result.test_loss = ev.loss;
    result.test_acc = ev.top1;
  }
  result.history = prog.history;
  result.seconds = seconds_since(run_start);
  return result;
}

}  // namespace relpos
