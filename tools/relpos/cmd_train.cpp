// relpos train: train a model on Fashion-MNIST or an image folder.
#include <exception>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <set>
#include <utility>
#include <vector>
#include <memory>

#include "cli_common.hpp"
#include "train_progress.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"

namespace relpos::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};  // the signal that asked the run to stop

// SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal or ssh session went away) all stop the run after
// the current step with a checkpoint; the exit status is then 128 + the signal, as the shell reports it
extern "C" void on_signal(int sig) {
  if (g_stop.exchange(true)) {  // a second Ctrl-C: leave at once, and say what that costs
    relpos::remove_temporary_files();  // (a checkpoint being written stays as it was)
    const char msg[] = "\nrelpos: quitting now, without a checkpoint: the run resumes from its last one, if any\n";
    const ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(128 + sig);
  }
  g_signal.store(sig);
  const char msg[] = "\nrelpos: stopping after this step; saving a checkpoint (Ctrl-C again to quit now)\n";
  const ssize_t ignored = write(STDERR_FILENO, msg, sizeof(msg) - 1);
  (void)ignored;
}

// ", 2 processes (global batch 2 x 64), sync-BN, MPI" for a data-parallel run, else "".
// (A resumed run takes its batch and sync-BN from the checkpoint: neither is shown then.)
std::string processes_text(const TrainProcesses& p, const TrainOptions& o, Device device, bool resumed) {
  if (p.size == 1 && !p.launched) return "";
  std::string s = ", " + std::to_string(p.size) + (p.size == 1 ? " process" : " processes");
  if (p.size > 1 && !resumed) s += " (global batch " + std::to_string(p.size) + " x " + std::to_string(o.batch) + ")";
  if (o.sync_bn && !resumed) s += ", sync-BN";
  return s + (p.nccl && device == Device::CUDA ? " (NCCL)" : " (MPI)");
}

struct TrainArgs {
  std::string config, resume, init;
  bool epochs_given = false, lr_given = false, ema = false;
  RunOptions run;
  std::uint32_t init_seed = 0;
  bool no_flip = false, quiet = false, no_eval = false;
  TrainOptions opt;
};

// The model a new run starts from: trained weights (--init, or a weights file given as --config)
// or a config's random weights.
Model starting_model(TrainArgs& a, Device device) {
  if (a.init.empty() && holds_weights(a.config)) {
    std::cerr << "relpos: " << a.config << " holds trained weights: fine-tuning from them (as --init " << a.config
              << "); for random weights give an architecture config\n";
    a.init = a.config;
    a.config.clear();
  }
  if (a.init.empty()) return Model::create(a.config, a.init_seed);
  // a config given as --init started from random weights, as if fine-tuning, without a word (a path
  // that is not there: holds_weights says "no such file", as Model::open does)
  RELPOS_USAGE_CHECK(holds_weights(a.init), "--init " << a.init << " is a model config (no weights); --init takes trained "
                                                      "weights to fine-tune from: give a config as --config");
  a.opt.init = a.init;
  a.opt.init_config = a.config;
  LoadOptions lo;
  lo.config = a.config;
  lo.device = device;
  return Model::open(a.init, lo);
}

// While it lives, an error leaving run() in one process of a run of several (a missing checkpoint on
// one machine) makes mpirun stop them all, instead of the others waiting for this one forever.
struct AbandonOnError {
  const int uncaught = std::uncaught_exceptions();
  ~AbandonOnError() {
    if (std::uncaught_exceptions() > uncaught) abandon_train_processes();
  }
};

void run(TrainArgs a) {
  // What training prints goes to stderr, which may be a pipe whose reader goes away (| tee killed,
  // | less quit, an ssh session dropped): a write to it must not kill the run (SIGPIPE, exit 141)
  // between checkpoints. Ignored, the write fails and the run goes on, still saving its files.
  std::signal(SIGPIPE, SIG_IGN);
  // first: under mpirun this joins MPI and picks this process's GPU before any CUDA work
  const TrainProcesses procs = train_processes();
  const AbandonOnError abandon_on_error;
  RELPOS_CHECK(procs.mpi || (procs.size == 1 && !a.opt.sync_bn),
               "this relpos was built without MPI, so data-parallel training (mpirun -np N relpos train, "
               "--sync-bn) is not available; rebuild it with MPI (docs/distributed.md)");
  const bool rank0 = procs.rank == 0;  // the others train quietly
  const Device device = a.run.apply();
  if (a.no_flip) a.opt.augment.hflip = false;
  if (rank0) a.opt.on_event = TrainProgress(a.quiet);
  if (a.no_eval) a.opt.eval_each_epoch = false;
  if (a.ema && a.opt.ema_decay <= 0.0f) a.opt.ema_decay = 0.9998f;  // timm's default
  if (!a.resume.empty() && a.lr_given) a.opt.extend_lr = a.opt.lr;  // the extension's starting rate
  RELPOS_CHECK(!a.config.empty() || !a.resume.empty() || !a.init.empty(),
               "give --config (a new run), --init (fine-tuning) or --resume (a checkpoint)");
  Model model = a.resume.empty() ? starting_model(a, device) : load_checkpoint_model(a.resume);
  model.to(device);
  if (rank0 && a.resume.empty())
    std::cerr << "relpos: training " << model.network().config().name << " (" << std::fixed << std::setprecision(2)
              << static_cast<double>(model.network().num_params()) / 1e6 << " M parameters"
              << (a.init.empty() ? "" : ", from " + a.init) << ") on " << a.opt.data << ", "
              << count_text(a.opt.epochs, "epoch") << " of batch " << a.opt.batch
              << (procs.size > 1 ? " per process" : "") << ", " << to_string(a.opt.optimizer.kind) << " lr "
              << shortest(a.opt.lr) << ", " << count_text(training_threads(), "thread") << ", " << to_string(device)
              << processes_text(procs, a.opt, device, false) << "; writing " << a.opt.out << "/\n";
  else if (rank0)
    std::cerr << "relpos: resuming " << a.resume << processes_text(procs, a.opt, device, true) << "\n";
  // A hang-up the parent set to be ignored (nohup) stays ignored. SIGINT and SIGTERM stop the run
  // with a checkpoint whatever the parent set (a shell script's background job ignores SIGINT, and
  // `kill -INT` of it saved a checkpoint before). After the run the handlers from before it (main's,
  // which removes a temporary file) are back.
  std::vector<std::pair<int, struct sigaction>> before;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || (sig == SIGHUP && old.sa_handler == SIG_IGN)) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;  // (as std::signal did: reads of the data are not cut short)
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
    before.emplace_back(sig, old);
  }
  const TrainResult r = train(model, a.opt, a.resume, &g_stop, a.epochs_given ? a.opt.epochs : 0);
  for (const auto& sig_old : before) sigaction(sig_old.first, &sig_old.second, nullptr);
  if (r.interrupted) {
    if (rank0)
      std::cerr << "relpos: interrupted; checkpoint saved to " << r.checkpoint
                << "\n  resume with: " << (procs.size > 1 ? "mpirun -np " + std::to_string(procs.size) + " " : "")
                << "relpos train --resume " << r.checkpoint << "\n";
    exit_status() = 128 + (g_signal.load() != 0 ? g_signal.load() : SIGINT);
    return;
  }
  if (!rank0) return;
  if (r.images > 0)
    std::cerr << std::fixed << std::setprecision(1) << "relpos: trained on " << count_text(static_cast<long>(r.images), "image") << " in "
              << r.step_seconds << " s of training steps (" << r.images / r.step_seconds << " img/s)\n";
  if (r.max_steps_reached) {
    std::cerr << "relpos: stopped after --max-steps; checkpoint saved to " << r.checkpoint << "\n";
    return;
  }
  const std::string out = std::filesystem::path(r.checkpoint).parent_path().string();
  if (!r.history.empty()) {
    const EpochLog& last = r.history.back();
    std::cerr << std::fixed << std::setprecision(2) << "relpos: done in " << r.seconds / 60.0 << " min";
    if (r.best_epoch > 0) {
      std::cerr << "; best epoch " << r.best_epoch << " by validation (val accuracy " << 100 * r.best_val_acc << "%)";
      if (r.test_acc >= 0) std::cerr << ", test accuracy " << 100 * r.test_acc << "% on it";
    } else if (last.test_acc >= 0) {
      std::cerr << "; test accuracy " << 100 * last.test_acc << "%";
    }
    const std::string dir = out.empty() ? "." : out;
    std::cerr << "; wrote " << dir << "/model.json" << (r.best_epoch > 0 ? " (the best epoch), best.safetensors" : "")
              << ", log.csv" << (std::filesystem::exists(dir + "/curves.png") ? ", curves.png" : "") << "\n";
  }
  if (!r.saved.empty()) std::cerr << "relpos: saved " << r.saved << "\n";
}

// A resumed run follows its checkpoint's recipe: a flag that would change it is an error, not
// silently ignored.
void check_resume_flags(const CLI::App& sub, bool epochs_given) {
  static const std::set<std::string> how = {"resume",    "epochs",           "save",         "workers",   "threads",
                                            "device",    "quiet",            "max-steps",    "checkpoint-every",
                                            "max-model-gb", "bucket-mb",     "help"};
  for (const CLI::Option* o : sub.get_options()) {
    if (o->count() == 0) continue;
    const auto& names = o->get_lnames();
    const std::string name = names.empty() ? o->get_name() : names.front();
    if (how.count(name)) continue;
    if (name == "lr" || name == "extend") {
      RELPOS_USAGE_CHECK(epochs_given, "--" << name << " with --resume says how an extended run's learning rate goes "
                                                      "on; give it with --epochs N");
      continue;
    }
    RELPOS_USAGE_CHECK(false, "--" << name << " cannot change a resumed run: its options come from the checkpoint "
                                            "(with --resume: --epochs, --lr and --extend to extend it, --save, --workers, "
                                            "--threads, --device, --max-steps, --checkpoint-every, --bucket-mb, --max-model-gb, -q)");
  }
}

}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "Train a model (Fashion-MNIST or a folder of class folders)");
  sub->add_option("-c,--config", a->config,
                  "Model config (path or shipped name); with --init, the architecture of a timm checkpoint");
  sub->add_option("--init", a->init,
                  "Fine-tune: start from these weights (relpos JSON or safetensors, a training checkpoint, or a timm "
                  "checkpoint with --config); the classes come from the data (a new classifier when they differ)");
  sub->add_option("--resume", a->resume,
                  "Continue from a checkpoint (its options are used; --epochs extends the run, --lr and --extend say "
                  "how its learning rate goes on)");
  sub->add_option("--data", a->opt.data,
                  "fashion-mnist, or a folder: with train/ (and test/, val/) of class folders, or of class folders itself")
      ->capture_default_str();
  sub->add_option("--epochs", a->opt.epochs, "Epochs")->check(at_least_one("--epochs", "epochs to train"))->capture_default_str();
  sub->add_option("-b,--batch", a->opt.batch, "Batch size")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  sub->add_option("--lr", a->opt.lr, "Peak learning rate")->check(kNonNegative)->capture_default_str();
  sub->add_option("--min-lr", a->opt.min_lr, "Learning rate at the end of the cosine")
      ->check(kNonNegative)
      ->capture_default_str();
  sub->add_option("--warmup", a->opt.warmup_epochs, "Warmup epochs (linear)")->check(kNonNegative)->capture_default_str();
  sub->add_option_function<std::string>(
         "--opt", [a](const std::string& name) { a->opt.optimizer.kind = parse_optimizer_kind(name); }, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->default_str(to_string(a->opt.optimizer.kind));
  sub->add_option("--momentum", a->opt.optimizer.momentum, "SGD momentum (0 to below 1)")->check(kFraction)->capture_default_str();
  sub->add_flag("!--no-nesterov", a->opt.optimizer.nesterov, "Plain momentum instead of Nesterov's");
  sub->add_option("--wd", a->opt.optimizer.weight_decay, "Weight decay")->check(kNonNegative)->capture_default_str();
  sub->add_option("--smoothing", a->opt.label_smoothing, "Label smoothing")->check(kFraction)->capture_default_str();
  sub->add_option("--pad", a->opt.augment.pad, "Random-crop padding in pixels (0: off)")->check(kNonNegative)->capture_default_str();
  sub->add_flag("--no-flip", a->no_flip, "No random horizontal flips");
  sub->add_option("--erase", a->opt.augment.erase_prob, "Random-erasing probability")->check(kProbability)->capture_default_str();
  sub->add_option("--canvas", a->opt.augment.canvas,
                  "Translation data: place each image at a random position (per epoch and image, seeded) on a black "
                  "N x N canvas before preprocessing; validation and test images at positions fixed per image. The "
                  "model's input size must be N x N (0: off)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  sub->add_option("--train-images", a->opt.train_images,
                  "Train on N images of the training set only (0: all): Fashion-MNIST's first N, or N spread evenly over a "
                  "folder dataset's classes")
      ->check(CLI::Range(0L, 1L << 40))
      ->capture_default_str();
  sub->add_option("--seed", a->opt.seed, "Seed of data order and augmentation")->capture_default_str();
  sub->add_option("--init-seed", a->init_seed, "Seed of the initial weights")->capture_default_str();
  sub->add_option("-o,--out", a->opt.out,
                  "Output folder (a new run refuses one that holds an earlier run's checkpoint, best.safetensors, "
                  "model.json or log.csv)")
      ->capture_default_str();
  sub->add_flag("--overwrite", a->opt.overwrite, "Let a new run replace an earlier run's results in the output folder");
  sub->add_option("--save", a->opt.save,
                  "Also write the trained model here (FILE.json: relpos weights JSON, FILE.safetensors; replaces only a relpos model file); remembered by --resume");
  sub->add_option("--workers", a->opt.workers, "Data loader threads")
      ->check(at_least_one("--workers", "data loader threads"))->capture_default_str();
  a->run.add(sub);
  // a run does not adapt its thread count to the load (docs/threads.md): the shared text says it does
  sub->get_option("--threads")
      ->description("CPU threads (default: OMP_NUM_THREADS, else all cores, kept from start to end of the run; 1 to 1024)");
  sub->add_option("--max-steps", a->opt.max_steps, "Stop after this many steps (with a checkpoint; 0: no limit)")
      ->check(kNonNegative);
  sub->add_option("--checkpoint-every", a->opt.checkpoint_minutes,
                  "Minutes between checkpoints inside an epoch (0: at epoch ends only); a killed run loses at most "
                  "this much work")
      ->check(number_in(0.0, 1e6))
      ->capture_default_str();
  sub->add_flag("--sync-bn", a->opt.sync_bn,
                "Data-parallel runs (mpirun -np N): batch norm uses the statistics of the global batch");
  sub->add_option("--bucket-mb", a->opt.bucket_mb,
                  "Data-parallel runs: MiB of gradients per all-reduce, overlapped with the backward (0: one "
                  "all-reduce after it)")
      ->check(number_in(0.0, 1e6))
      ->capture_default_str();
  sub->add_flag("--no-eval", a->no_eval, "Do not score the test set (after each epoch, or at the end with validation)");
  sub->add_option("--val-split", a->opt.val_split,
                  "Hold out this fraction of each training class (seeded) for validation: model selection on it, "
                  "best.safetensors, the test set scored once at the end (a val/ folder does the same)")
      ->check(number_in(0.0, 0.9));
  sub->add_flag("--ema", a->ema, "Keep an EMA of the weights (decay 0.9998, timm's ModelEmaV2); it is evaluated and saved");
  sub->add_option("--ema-decay", a->opt.ema_decay, "EMA decay (implies --ema)")->check(number_in(0.0, 0.999999));
  sub->add_option("--clip-grad", a->opt.clip_grad, "Clip the global gradient L2 norm to this (0: off)")
      ->check(number_in(0.0, 1e9));
  sub->add_option("--extend", a->opt.extend,
                  "With --resume --epochs N: the learning rate goes on as a new cosine from where it stands (or from "
                  "--lr) down to --min-lr, or stays constant")
      ->check(CLI::IsMember({"cosine", "constant"}))
      ->capture_default_str();
  sub->add_flag("-q,--quiet", a->quiet, "No progress bar");
  sub->callback([a, sub] {
    a->epochs_given = sub->count("--epochs") > 0;
    a->lr_given = sub->count("--lr") > 0;
    if (!a->resume.empty()) check_resume_flags(*sub, a->epochs_given);
    // (a resumed run's rates come from its checkpoint; its --lr starts an extension, checked there)
    RELPOS_USAGE_CHECK(!a->resume.empty() || a->opt.min_lr <= a->opt.lr,
                       "--min-lr " << shortest(a->opt.min_lr) << " is above --lr " << shortest(a->opt.lr)
                                   << ": the cosine goes down from --lr to --min-lr");
    const std::string& save = a->opt.save;
    RELPOS_USAGE_CHECK(save.empty() || ends_with(save, ".json") || ends_with(save, ".safetensors"),
                       "--save " << save << ": writes relpos weights JSON (.json) or safetensors (.safetensors); give a "
                                            "file name with one of these extensions");
    run(*a);
  });
}

}  // namespace relpos::cli
