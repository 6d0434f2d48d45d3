// Data-parallel training under mpirun: 2 processes x batch 16 with --sync-bn reach the weights of
// 1 process x batch 32, over TCP on loopback and over shared memory; the processes agree bit for
// bit; a checkpoint resumes only with as many processes. Skipped (status 77) without MPI.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "relpos/safetensors.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using relpos::test::TempDir;

namespace {

int sh(const std::string& script) {
  const int st = std::system(("bash -c '" + script + "'").c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Root is fine (CI runs as root); more processes than cores too; no pinning next to other tests.
std::string mpirun(int n, const std::string& transport) {
  return "mpirun --allow-run-as-root --oversubscribe --bind-to none -np " + std::to_string(n) + " --mca pml ob1 " +
         transport + " ";
}
const std::string kTcp = "--mca btl tcp,self --mca btl_tcp_if_include lo";
// (no single-copy CMA: containers without ptrace rights reject it)
const std::string kSharedMemory = "--mca btl vader,self --mca btl_vader_single_copy_mechanism none";

std::string train_args(const TempDir& d, int batch, const std::string& out) {
  return std::string(RELPOS_CLI_PATH) + " train -c " + relpos::test::tiny_rgb_config() + " --data " + d.path +
         "/data -b " + std::to_string(batch) + " --threads 1 --epochs 2 --max-steps 6 --seed 3 --lr 0.05 -q -o " + out;
}

// The checkpoint's "model." tensors (and those under `also`, when given).
std::map<std::string, std::vector<float>> weights(const std::string& checkpoint, const std::string& also = "") {
  std::map<std::string, std::vector<float>> w;
  const relpos::SafetensorsFile f = relpos::SafetensorsFile::read(checkpoint);
  for (const auto& e : f.entries())
    if (e.name.rfind("model.", 0) == 0 || (!also.empty() && e.name.rfind(also, 0) == 0))
      w[e.name] = f.tensor(e.name).to_vector();
  return w;
}

// Largest |a - b| over the largest |b|, tensor by tensor, the largest |b| taken as at least 1e-3: a
// batch-norm bias that feeds another batch norm gets no gradient (the second norm removes any
// shift), so it stays at rounding noise (~1e-8) whose relative difference says nothing.
double max_relative_difference(const std::map<std::string, std::vector<float>>& a,
                               const std::map<std::string, std::vector<float>>& b, std::string* worst) {
  double most = 0.0;
  for (const auto& entry : b) {
    const std::string& name = entry.first;  // not a structured binding: REQUIRE_MESSAGE captures it
    const std::vector<float>& vb = entry.second;
    const auto it = a.find(name);
    REQUIRE_MESSAGE(it != a.end(), name);
    REQUIRE(it->second.size() == vb.size());
    double diff = 0.0, scale = 1e-3;
    for (std::size_t i = 0; i < vb.size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(it->second[i] - vb[i])));
      scale = std::max(scale, static_cast<double>(std::fabs(vb[i])));
    }
    if (diff / scale > most) {
      most = diff / scale;
      *worst = name;
    }
  }
  return most;
}

bool can_run() {
  if (!relpos::train_processes().mpi) {
    MESSAGE("relpos was built without MPI: skipped");
    return false;
  }
  if (sh("command -v mpirun > /dev/null") != 0) {
    MESSAGE("no mpirun: skipped");
    return false;
  }
  return true;
}

}  // namespace

TEST_CASE("2 processes x batch 16 with --sync-bn train as 1 process x batch 32, over TCP and shared memory") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 43, 8);  // 129 images: 4 global batches of 32 an epoch
  REQUIRE(sh(train_args(d, 32, d.path + "/one") + " > " + d.file("one.log") + " 2>&1") == 0);
  const auto one = weights(d.path + "/one/checkpoint.safetensors");
  for (const std::string& transport : {kTcp, kSharedMemory}) {
    CAPTURE(transport);
    const std::string out = d.path + "/two";
    fs::remove_all(out);
    // 6 steps: an epoch end on the way (sharded evaluation, checkpoint), then a stop inside epoch 2
    const int status = sh(mpirun(2, transport) + train_args(d, 16, out) + " --sync-bn > " + d.file("two.log") + " 2>&1");
    const std::string log = slurp(d.file("two.log"));
    INFO(log);
    REQUIRE(status == 0);
    CHECK(log.find("disagreed") == std::string::npos);  // the processes' states are compared bit for bit at each checkpoint
    CHECK(relpos::SafetensorsFile::read(out + "/checkpoint.safetensors").metadata().at("relpos.train_options").find(
              "\"processes\":2") != std::string::npos);
    std::string worst;
    const double rel = max_relative_difference(weights(out + "/checkpoint.safetensors"), one, &worst);
    MESSAGE("largest relative difference " << rel << " in " << worst);
    CHECK(rel < 1e-4);
  }
  // the checkpoint of 2 processes: one process refuses it, 2 finish the run
  const std::string ck = d.path + "/two/checkpoint.safetensors";
  REQUIRE(sh(std::string(RELPOS_CLI_PATH) + " train --resume " + ck + " --threads 1 > " + d.file("bad.log") + " 2>&1") == 1);
  CHECK(slurp(d.file("bad.log")).find("written by a run of 2 processes") != std::string::npos);
  const int status = sh(mpirun(2, kSharedMemory) + std::string(RELPOS_CLI_PATH) + " train --resume " + ck +
                        " --threads 1 -q > " + d.file("resume.log") + " 2>&1");
  INFO(slurp(d.file("resume.log")));
  CHECK(status == 0);
  CHECK(fs::exists(d.path + "/two/model.json"));
  const std::string csv = slurp(d.path + "/two/log.csv");
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 3);  // header and 2 epochs
}

TEST_CASE("a process whose part of a batch is all unreadable: every process skips that step, none hangs") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 2);
  // three training images in four damaged: with 2 images per process, about half the parts of a
  // batch are all unreadable (before, that process skipped the step alone and the others waited
  // for it in the all-reduce forever)
  int n = 0, damaged = 0;
  for (const auto& e : fs::recursive_directory_iterator(d.path + "/data/train"))
    if (e.is_regular_file() && n++ % 4 != 0) {
      std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "not a png";
      ++damaged;
    }
  REQUIRE(damaged == 18);
  // the test set's every second image too: process 1 scores images 1, 3 and 5 of it, none readable
  // (its evaluation threw alone, where the other process went on to sum the scores with it)
  for (const char* c : {"bars", "columns", "dots"})
    std::ofstream(d.path + "/data/test/" + c + "/001.png", std::ios::binary | std::ios::trunc) << "not a png";
  const int status = sh("timeout 120 " + mpirun(2, kSharedMemory) + std::string(RELPOS_CLI_PATH) + " train -c " +
                        relpos::test::tiny_rgb_config() + " --data " + d.path + "/data -b 2 --threads 1 --epochs 1 -o " +
                        d.path + "/run > " + d.file("run.log") + " 2>&1");
  const std::string log = slurp(d.file("run.log"));
  INFO(log);
  REQUIRE(status == 0);  // 124: timed out, i.e. hung
  CHECK(log.find("process(es) had no readable image in their part of it") != std::string::npos);
  CHECK(log.find("not a readable image") != std::string::npos);  // the damaged files are named as they are skipped
  CHECK(fs::exists(d.path + "/run/model.json"));
  CHECK(log.find("test accuracy") != std::string::npos);
}

TEST_CASE("a class none of whose images can be read stops every process of a run before its first step") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 2);
  // the processes share the classes to try (class 1, 'columns', is process 1's): all stop together
  for (const auto& e : fs::directory_iterator(d.path + "/data/train/columns"))
    std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "not a png";
  const int status = sh("timeout 120 " + mpirun(2, kSharedMemory) + train_args(d, 4, d.path + "/run") + " > " +
                        d.file("run.log") + " 2>&1");
  const std::string log = slurp(d.file("run.log"));
  INFO(log);
  CHECK(status != 124);  // (hung)
  CHECK(status != 0);
  CHECK(log.find("none of the 8 images of class 'columns' can be read (the first: ") != std::string::npos);
  CHECK(!fs::exists(d.path + "/run/checkpoint.safetensors"));
}

TEST_CASE("processes given different commands, or one that fails before training, stop with an error; none hangs") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 2);
  const std::string launch = "timeout 120 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1 " +
                             kSharedMemory + " -np 1 ";
  // one process cannot read its config: it used to wait in MPI_Finalize and the other in the first
  // broadcast, forever
  std::string bad = std::string(RELPOS_CLI_PATH) + " train -c " + d.path + "/missing.json --data " + d.path +
                    "/data -b 4 --threads 1 --epochs 1 -q -o " + d.path + "/run1";
  int status = sh(launch + train_args(d, 4, d.path + "/run1") + " : -np 1 " + bad + " > " + d.file("log1") + " 2>&1");
  std::string log = slurp(d.file("log1"));
  INFO(log);
  CHECK(status != 0);
  CHECK(status != 124);  // 124: timed out, i.e. hung
  CHECK(log.find(d.path + "/missing.json") != std::string::npos);
  // another number of epochs (or --max-steps, --lr, data): every process stops, naming the one that differs
  status = sh(launch + train_args(d, 4, d.path + "/run2") + " : -np 1 " + train_args(d, 4, d.path + "/run2") +
              " --min-lr 0.001 > " + d.file("log2") + " 2>&1");
  log = slurp(d.file("log2"));
  INFO(log);
  CHECK(status != 0);
  CHECK(status != 124);
  CHECK(log.find("process 1 of 2 got other options, another model or other training data than process 0") !=
        std::string::npos);
}

TEST_CASE("without --sync-bn, checkpoints inside an epoch do not change the run") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 43, 2);
  // a checkpoint after every step (each averages the running statistics into the file) against none
  // inside the epochs: the same weights and statistics at the end, bit for bit (each checkpoint used to
  // leave every process the mean, so when the clock made one changed the run)
  // (with the weight average, whose running statistics are averaged as the network's)
  REQUIRE(sh(mpirun(2, kSharedMemory) + train_args(d, 16, d.path + "/none") + " --ema-decay 0.9 > " + d.file("a.log") +
             " 2>&1") == 0);
  REQUIRE(sh(mpirun(2, kSharedMemory) + train_args(d, 16, d.path + "/each") + " --ema-decay 0.9 --checkpoint-every 0.000001 > " +
             d.file("b.log") + " 2>&1") == 0);
  const auto a = weights(d.path + "/none/checkpoint.safetensors", "ema.");
  const auto b = weights(d.path + "/each/checkpoint.safetensors", "ema.");
  REQUIRE(a.size() == b.size());
  int running = 0, averaged = 0;
  for (const auto& entry : a) {
    const std::string& name = entry.first;
    CAPTURE(name);
    running += name.find("running_mean") != std::string::npos;
    averaged += name.rfind("ema.", 0) == 0;
    CHECK(entry.second == b.at(name));
  }
  CHECK(running > 0);
  CHECK(averaged > 0);
}

TEST_CASE("without --sync-bn, the logged test score is the saved model's, with and without the weight average") {
  if (!can_run()) return;
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 43, 20);
  // the processes' mean running statistics are what is saved; the evaluation after each epoch used
  // to fold each process's own into its weights first (and the average's were never averaged)
  for (const std::string ema : {"", " --ema-decay 0.9"}) {
    CAPTURE(ema);
    const std::string out = d.path + (ema.empty() ? "/plain" : "/ema");
    REQUIRE(sh(mpirun(2, kSharedMemory) + std::string(RELPOS_CLI_PATH) + " train -c " + relpos::test::tiny_rgb_config() +
               " --data " + d.path + "/data -b 4 --threads 1 --epochs 2 --seed 4 --lr 0.1 -q -o " + out + ema + " > " +
               d.file("log.txt") + " 2>&1") == 0);
    std::istringstream log(slurp(out + "/log.csv"));
    std::string header, row;
    std::getline(log, header);
    for (std::string line; std::getline(log, line);) row = line;  // the last epoch's
    REQUIRE(header.find("test_loss,test_acc") != std::string::npos);
    std::vector<std::string> cells;
    std::istringstream r(row);
    for (std::string c; std::getline(r, c, ',');) cells.push_back(c);
    REQUIRE(cells.size() >= 8);
    const double logged = std::stod(cells[6]);
    REQUIRE(sh(std::string(RELPOS_CLI_PATH) + " eval --threads 1 -q --json -m " + out + "/model.json --data " + d.path +
               "/data > " + d.file("eval.json")) == 0);
    const std::string ev = slurp(d.file("eval.json"));
    const auto at = ev.find("\"loss\":");
    REQUIRE(at != std::string::npos);
    const double evaluated = std::stod(ev.substr(at + 7));
    CHECK(std::fabs(logged - evaluated) <= 1e-5 * std::max(1.0, std::fabs(evaluated)));
  }
}
