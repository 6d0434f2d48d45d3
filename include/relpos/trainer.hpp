// relpos: training and evaluation loops. train() writes to an output folder:
//   checkpoint.safetensors  model, optimizer state, EMA and progress (the last epoch), written
//                           atomically each epoch (and on Ctrl-C); train(resume=...) continues
//                           exactly where it stopped
//   best.safetensors        with validation: the checkpoint of the epoch with the best validation
//                           accuracy (a model file too: eval/classify take it)
//   log.csv                 one row per epoch: lr, train/val/test loss and accuracy, time
//   curves.png              learning curves
//   model.json              the trained weights with labels and preprocessing (relpos weights JSON):
//                           the best epoch's by validation when there is validation, else the last
//                           epoch's; the EMA weights when EMA is on
// Started by mpirun (relpos built with MPI), train() runs data-parallel over the processes: each
// trains on its shard of every global batch of processes x batch images, gradients are averaged,
// and rank 0 writes the files above (docs/distributed.md).
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "relpos/data.hpp"
#include "relpos/json_abi.hpp"  // nlohmann/json, as librelpos was built with it
#include "relpos/model.hpp"
#include "relpos/optim.hpp"

namespace relpos {

struct EpochLog {
  int epoch = 0;
  float lr = 0.0f;
  double train_loss = 0.0, train_acc = 0.0;
  double val_loss = -1.0, val_acc = -1.0;    // -1: not evaluated (no validation data)
  double test_loss = -1.0, test_acc = -1.0;  // -1: not evaluated
  double seconds = 0.0, img_per_s = 0.0;
};

// What train() reports while it runs, to TrainOptions::on_event (the CLI draws its progress bar
// and epoch lines from these; the library itself prints nothing).
struct TrainEvent {
  enum class Kind { Step, EpochEnd, Message };
  Kind kind = Kind::Step;
  int epoch = 0, epochs = 0;           // the current epoch (1-based) of how many
  std::size_t batch = 0, batches = 0;  // Step: batches done in this epoch, of how many
  double img_per_s = 0.0;              // Step: this epoch so far
  double loss = 0.0, acc = 0.0;        // Step: running means over this epoch
  float lr = 0.0f;
  double eta_epoch = 0.0, eta_run = 0.0;  // Step: seconds left in the epoch and in the run
  EpochLog log;                        // EpochEnd: the finished epoch
  std::string message;                 // Message: a warning (an image skipped, a picture not drawn)
                                       // or a note (a classifier replaced, an extended schedule)
  bool warning = true;                 // Message: false for a note
};

struct TrainOptions {
  std::string data = "fashion-mnist";  // "fashion-mnist" or a folder (see open_dataset)
  int epochs = 10;
  int batch = 128;
  float lr = 0.1f;
  float min_lr = 0.0f;
  float warmup_epochs = 1.0f;
  float label_smoothing = 0.1f;
  OptimizerConfig optimizer;
  Augment augment{2, true, 0.0f};  // augment.canvas > 0: the translation data (data.hpp), with the
                                   // validation and test images on canvases too (CanvasDataset)
  long train_images = 0;  // > 0: train on this many images of the training set only (Fashion-MNIST's first; a folder's spread evenly)
  std::uint64_t seed = 0;
  int workers = 1;        // data loader threads
  int eval_batch = 500;
  // With validation data (val_split > 0, or a val/ folder in a folder dataset), every epoch is
  // scored on it, the best epoch by validation accuracy is kept (best.safetensors, model.json) and
  // the test set is scored once, at the end, on that model. Without: the test set every epoch.
  bool eval_each_epoch = true;
  float val_split = 0.0f;   // this fraction of each class of the training set is held out (seeded)
  float ema_decay = 0.0f;   // > 0: an exponential moving average of the weights and batch-norm
                            // statistics (timm's ModelEmaV2) is what is evaluated and saved
  float clip_grad = 0.0f;   // > 0: gradients scaled so their global L2 norm is at most this
  // Fine-tuning: the weights the run started from ("": a config's random weights) and the
  // architecture given for them (a timm checkpoint). Recorded for the record; the model passed to
  // train() is what starts (see fit_to_data).
  std::string init, init_config;
  // train(resume=..., resume_epochs=N) with N different from the run's epochs continues the
  // learning rate from where it stands: "cosine" (a new cosine from the current learning rate, or
  // extend_lr when > 0, down to min_lr at the new end) or "constant" (that rate held). Taken from
  // the call's options, like save.
  std::string extend = "cosine";
  float extend_lr = 0.0f;
  std::string out = "runs/train";
  // A new run refuses an `out` folder that holds an earlier run's results (checkpoint.safetensors,
  // best.safetensors, model.json, log.csv), as they would be replaced; true replaces them. A resumed
  // run continues in its own folder. How to run, not the recipe (a checkpoint does not keep it).
  bool overwrite = false;
  std::string save;       // also write the trained model here at the end: safetensors for a .safetensors name, else weights JSON ("": no)
  // Called on the training thread after every step, at each epoch's end and with warnings; empty:
  // train() runs silently. Not part of the recipe (a checkpoint does not keep it).
  std::function<void(const TrainEvent&)> on_event;
  long max_steps = 0;     // stop after this many steps in total (0: no limit; for tests)
  // A checkpoint is also written inside an epoch once this many minutes have passed since the last
  // one (0: at epoch ends only), so a killed run loses at most that much work.
  double checkpoint_minutes = 2.0;
  // Data parallelism (see train_processes): `batch` is each process's share of the global batch.
  int processes = 1;      // set by train() to the processes of the run; a checkpoint resumes with as many
  bool sync_bn = false;   // batch norm normalises with the statistics of the global batch
  double bucket_mb = 4.0; // MiB of gradients per all-reduce, sent while the backward goes on
                          // (0: one all-reduce after the backward); how to run, not the recipe

  nlohmann::json to_json() const;
  static TrainOptions from_json(const nlohmann::json& j);
};

struct TrainResult {
  std::vector<EpochLog> history;
  bool interrupted = false;
  // The run stopped at TrainOptions::max_steps before its last epoch ended: a checkpoint was saved,
  // no model.json written.
  bool max_steps_reached = false;
  std::string checkpoint;
  double seconds = 0.0;  // training time of this run (resumed runs: this part only)
  double images = 0.0;   // images trained on in this run
  double step_seconds = 0.0;  // time inside training steps (data waits included, evaluation excluded)
  int checkpoints = 0;        // checkpoints written by this run
  std::string saved;          // where TrainOptions::save wrote the model ("" if not)
  int best_epoch = 0;         // with validation: the epoch model.json holds (1-based; 0: none)
  double best_val_acc = -1.0;
  std::string best;           // with validation: best.safetensors
  // With validation: the test set scored once at the end on model.json's weights (-1: not scored).
  double test_loss = -1.0, test_acc = -1.0;
};

// Trains model in place. If resume names a checkpoint, the model, options and progress come from
// it, except on_event, workers and max_steps, which come from `options` (with resume_epochs > 0
// the run goes on to that many epochs instead). `stop` (if given) is
// polled after every step: when it turns true the run saves a checkpoint and returns with
// interrupted = true.
TrainResult train(Model& model, const TrainOptions& options, const std::string& resume = "",
                  const std::atomic<bool>* stop = nullptr, int resume_epochs = 0);
// The processes of this run. A process started alone is the only one (rank 0 of 1). One that an
// MPI launcher started (mpirun -np N; relpos built with MPI) joins MPI on the first call, and, when
// its machine has several GPUs, takes GPU (local rank mod GPUs): call this before moving a model to
// the GPU. Built without MPI, `mpi` is false and train() refuses a launch of several processes.
struct TrainProcesses {
  int rank = 0, size = 1;
  bool mpi = false;       // relpos was built with MPI
  bool launched = false;  // an MPI launcher started this process
  bool nccl = false;      // GPU gradients are all-reduced with NCCL (else through MPI on the host)
};
TrainProcesses train_processes();
// For a process of a run of several (mpirun) that gives up outside train(), say on a missing file
// before it (train() does this itself when it throws): at exit it leaves MPI without finalizing, so
// that mpirun stops the other processes instead of their waiting for it forever. Alone: no effect.
void abandon_train_processes();

// The model a checkpoint holds (config, weights, labels, preprocessing): the EMA weights when the
// run kept an EMA (what it evaluated), else the trained weights.
Model load_checkpoint_model(const std::string& checkpoint);

// Makes a model fit a dataset's classes before training (train() calls it for a new run; the
// classes are `data.classes()` of a dataset opened without labels). A model whose labels name the
// data's class folders keeps its classifier and label order; a model without labels and with as
// many outputs as the data has classes keeps its classifier and takes the data's labels; any other
// model gets the data's labels and a new classifier (drawn with `seed`; every other tensor kept;
// when each of the data's classes is one of the model's labels, the classifier keeps those rows).
// Returns a sentence saying what changed ("" if nothing).
std::string fit_to_data(Model& model, const std::vector<std::string>& data_classes, std::uint32_t seed = 0);

struct EvalResult {
  std::size_t count = 0;
  double loss = 0.0;
  double top1 = 0.0;
  double top5 = 0.0;  // the true class among the 5 highest logits (1 with 5 classes or fewer)
  std::vector<std::string> classes;
  std::vector<std::vector<long>> confusion;  // [true][predicted]
  std::vector<double> per_class;             // accuracy per true class
  std::size_t skipped = 0;                   // images that could not be read (reported, not counted)
  std::vector<int> predictions;              // top-1 class of each counted image, in the data's order
};
// Scores the model on every image of the data. `progress(done, total)` is called after each batch
// when given (the CLI draws its progress bar with it).
EvalResult evaluate(const Model& model, const Dataset& data, int batch = 500,
                    const std::function<void(std::size_t, std::size_t)>& progress = {});

// The confusion matrix as text (rows: true class, columns: predicted).
std::string format_confusion(const EvalResult& result);
// The confusion matrix as a PNG picture.
void plot_confusion(const EvalResult& result, const std::string& path);

}  // namespace relpos
