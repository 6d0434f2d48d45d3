// relpos train: train a model on Fashion-MNIST or an image folder.
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>

#include "cli_common.hpp"
#include "train_progress.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"

namespace relpos::cli {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int) {
  if (g_stop.exchange(true)) _exit(130);  // a second Ctrl-C: leave at once
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
  std::string config, resume;
  bool epochs_given = false;
  RunOptions run;
  std::uint32_t init_seed = 0;
  bool no_flip = false, quiet = false, no_eval = false;
  TrainOptions opt;
};

void run(TrainArgs a) {
  // first: under mpirun this joins MPI and picks this process's GPU before any CUDA work
  const TrainProcesses procs = train_processes();
  RELPOS_CHECK(procs.mpi || (procs.size == 1 && !a.opt.sync_bn),
               "this relpos was built without MPI, so data-parallel training (mpirun -np N relpos train, "
               "--sync-bn) is not available; rebuild it with MPI (docs/distributed.md)");
  const bool rank0 = procs.rank == 0;  // the others train quietly
  const Device device = a.run.apply();
  if (a.no_flip) a.opt.augment.hflip = false;
  if (rank0) a.opt.on_event = TrainProgress(a.quiet);
  if (a.no_eval) a.opt.eval_each_epoch = false;
  RELPOS_CHECK(!a.config.empty() || !a.resume.empty(), "give --config (a new run) or --resume (a checkpoint)");
  Model model = a.resume.empty() ? Model::create(a.config, a.init_seed) : load_checkpoint_model(a.resume);
  model.to(device);
  if (rank0 && a.resume.empty())
    std::cerr << "relpos: training " << model.network().config().name << " (" << std::fixed << std::setprecision(2)
              << static_cast<double>(model.network().num_params()) / 1e6 << " M parameters) on " << a.opt.data << ", "
              << count_text(a.opt.epochs, "epoch") << " of batch " << a.opt.batch
              << (procs.size > 1 ? " per process" : "") << ", " << to_string(a.opt.optimizer.kind) << " lr "
              << shortest(a.opt.lr) << ", " << threads_in_use() << " threads, " << to_string(device)
              << processes_text(procs, a.opt, device, false) << "; writing " << a.opt.out << "/\n";
  else if (rank0)
    std::cerr << "relpos: resuming " << a.resume << processes_text(procs, a.opt, device, true) << "\n";
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  const TrainResult r = train(model, a.opt, a.resume, &g_stop, a.epochs_given ? a.opt.epochs : 0);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (r.interrupted) {
    if (rank0)
      std::cerr << "relpos: interrupted; checkpoint saved to " << r.checkpoint
                << "\n  resume with: " << (procs.size > 1 ? "mpirun -np " + std::to_string(procs.size) + " " : "")
                << "relpos train --resume " << r.checkpoint << "\n";
    exit_status() = 130;
    return;
  }
  if (!rank0) return;
  if (r.images > 0)
    std::cerr << std::fixed << std::setprecision(1) << "relpos: trained on " << count_text(static_cast<long>(r.images), "image") << " in "
              << r.step_seconds << " s of training steps (" << r.images / r.step_seconds << " img/s)\n";
  if (!r.checkpoint.empty() && r.history.empty()) {
    std::cerr << "relpos: stopped after --max-steps; checkpoint saved to " << r.checkpoint << "\n";
    return;
  }
  const std::string out = std::filesystem::path(r.checkpoint).parent_path().string();
  if (!r.history.empty()) {
    const EpochLog& last = r.history.back();
    std::cerr << std::fixed << std::setprecision(2) << "relpos: done in " << r.seconds / 60.0 << " min";
    if (last.test_acc >= 0) std::cerr << "; test accuracy " << 100 * last.test_acc << "%";
    const std::string dir = out.empty() ? "." : out;
    std::cerr << "; wrote " << dir << "/model.json, log.csv"
              << (std::filesystem::exists(dir + "/curves.png") ? ", curves.png" : "") << "\n";
  }
  if (!r.saved.empty()) std::cerr << "relpos: saved " << r.saved << "\n";
}

}  // namespace

void register_train(CLI::App& app) {
  auto a = std::make_shared<TrainArgs>();
  CLI::App* sub = app.add_subcommand("train", "Train a model (Fashion-MNIST or a folder of class folders)");
  sub->add_option("-c,--config", a->config, "Model config (path or shipped name)");
  sub->add_option("--resume", a->resume, "Continue from a checkpoint (its options are used; --epochs extends the run)");
  sub->add_option("--data", a->opt.data, "fashion-mnist, or a folder with train/ and test/ of class folders")
      ->capture_default_str();
  sub->add_option("--epochs", a->opt.epochs, "Epochs")->check(CLI::PositiveNumber)->capture_default_str();
  sub->add_option("-b,--batch", a->opt.batch, "Batch size")->check(CLI::Range(2, 1 << 20))->capture_default_str();
  sub->add_option("--lr", a->opt.lr, "Peak learning rate")->capture_default_str();
  sub->add_option("--min-lr", a->opt.min_lr, "Learning rate at the end of the cosine")->capture_default_str();
  sub->add_option("--warmup", a->opt.warmup_epochs, "Warmup epochs (linear)")->capture_default_str();
  sub->add_option("--opt", a->opt.optimizer.kind, "sgd or adamw")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, OptimizerKind>{{"sgd", OptimizerKind::SGD}, {"adamw", OptimizerKind::AdamW}}))
      ->default_str(to_string(a->opt.optimizer.kind));
  sub->add_option("--momentum", a->opt.optimizer.momentum, "SGD momentum")->capture_default_str();
  sub->add_flag("!--no-nesterov", a->opt.optimizer.nesterov, "Plain momentum instead of Nesterov's");
  sub->add_option("--wd", a->opt.optimizer.weight_decay, "Weight decay")->capture_default_str();
  sub->add_option("--smoothing", a->opt.label_smoothing, "Label smoothing")->capture_default_str();
  sub->add_option("--pad", a->opt.augment.pad, "Random-crop padding in pixels (0: off)")->capture_default_str();
  sub->add_flag("--no-flip", a->no_flip, "No random horizontal flips");
  sub->add_option("--erase", a->opt.augment.erase_prob, "Random-erasing probability")->capture_default_str();
  sub->add_option("--seed", a->opt.seed, "Seed of data order and augmentation")->capture_default_str();
  sub->add_option("--init-seed", a->init_seed, "Seed of the initial weights")->capture_default_str();
  sub->add_option("-o,--out", a->opt.out, "Output folder")->capture_default_str();
  sub->add_option("--save", a->opt.save,
                  "Also write the trained model (relpos weights JSON) here; remembered by --resume");
  sub->add_option("--workers", a->opt.workers, "Data loader threads")->check(CLI::PositiveNumber)->capture_default_str();
  a->run.add(sub);
  sub->add_option("--max-steps", a->opt.max_steps, "Stop after this many steps (with a checkpoint)");
  sub->add_option("--checkpoint-every", a->opt.checkpoint_minutes,
                  "Minutes between checkpoints inside an epoch (0: at epoch ends only); a killed run loses at most "
                  "this much work")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  sub->add_flag("--sync-bn", a->opt.sync_bn,
                "Data-parallel runs (mpirun -np N): batch norm uses the statistics of the global batch");
  sub->add_option("--bucket-mb", a->opt.bucket_mb,
                  "Data-parallel runs: MiB of gradients per all-reduce, overlapped with the backward (0: one "
                  "all-reduce after it)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  sub->add_flag("--no-eval", a->no_eval, "Skip the test-set evaluation after each epoch");
  sub->add_flag("-q,--quiet", a->quiet, "No progress bar");
  sub->callback([a, sub] {
    a->epochs_given = sub->count("--epochs") > 0;
    run(*a);
  });
}

}  // namespace relpos::cli
