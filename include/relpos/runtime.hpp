// relpos: process-wide settings: CPU threads, TF32 on the GPU, and where library messages go.
// Implemented in src/core/runtime.cpp. (relpos::synchronize() is in tensor.hpp.)
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace relpos {

// CPU threads for relpos's work (OpenMP regions and oneDNN), process-wide. n = 0 (the default)
// adapts to the machine: all cores (OpenMP's default), less one for every thread of another
// process that is running when relpos looks (every 200 ms), so that a busy neighbour does not
// leave relpos's parallel regions waiting for a descheduled thread. OMP_NUM_THREADS in the
// environment, or RELPOS_ADAPTIVE_THREADS=0, fixes the default instead. Each relpos call applies the
// setting to the calling thread, so it also holds in threads the application starts later. An
// application running W threads that each call relpos should set about cores / W, so that the
// W x n OpenMP threads do not oversubscribe the cores (docs/threads.md). At most 1024.
void set_num_threads(int n);
int num_threads();      // the setting (0: the adaptive default)
int threads_in_use();   // the threads a relpos call from this thread would use now
// The threads a new training run computes with: the setting, else OpenMP's default (OMP_NUM_THREADS,
// else every core), never the adaptive count, so that its weights do not depend on the load.
int training_threads();

// Whether the CUDA backend may use TF32 tensor cores for float32 convolutions and matrix
// products (faster, about 3 significant digits). Off by default, so that GPU results match the
// CPU and timm to float32 rounding. The CPU backend always computes in float32.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Where the library's messages go (an image skipped by a data loader, a picture not drawn, the
// RELPOS_PROFILE table). The default writes "relpos: <message>" lines to stderr; an application may
// route them to its own log, or pass an empty function to drop them. (A GPU error while freeing
// memory always goes to stderr: frees run under locks and at thread exit, where no handler can
// safely be called.) The handler may be called from relpos's worker threads. Training progress is not a
// message: it goes to TrainOptions::on_event.
void set_log_handler(std::function<void(const std::string&)> handler);

// For an application's signal handler (SIGINT, SIGTERM, ...): removes the temporary files of the
// files relpos is writing at that moment. Each file relpos writes (models, checkpoints, pictures,
// logs) is written as "<name>.tmp.<pid>" beside it and renamed when complete, so a process stopped
// mid-write keeps the old file whole, but leaves the temporary behind unless its handler calls
// this. Async-signal-safe (it only unlinks); the `relpos` command line calls it.
void remove_temporary_files() noexcept;

// Per-layer timing (`relpos bench --profile`). While profiling is on, every op a network runs is
// timed (waiting for the GPU before and after, so the run is slower) and charged to the layer it
// ran in: "stem", "stages.I.J" (a block) or "head", or "" outside a network. Ops inside ops are
// part of their caller's time. Process-wide; the rows add up until reset_profile().
struct ProfileRow {
  std::string layer;  // "stages.1.0"
  std::string op;     // "conv2d (cpu)"
  long calls = 0;
  double ms = 0.0;    // total wall time
};
void set_profiling(bool on);
std::vector<ProfileRow> profile_rows();  // in the order the layers first ran, ops by time within each
// Some ops also time their phases: sasa_projected_attention its "projection" (the qkv planes) and
// its "attention" (the window kernels). A part's time is inside its op's row, so a sum over the
// rows must not add the parts again.
struct ProfilePart {
  std::string layer;  // "stages.1.0"
  std::string op;     // "sasa_projected_attention (cpu)": the row it belongs to
  std::string part;   // "projection"
  long calls = 0;
  double ms = 0.0;  // total wall time
};
std::vector<ProfilePart> profile_parts();  // in the order the layers first ran, parts by time within each
void reset_profile();

}  // namespace relpos
