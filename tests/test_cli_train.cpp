// relpos train / eval from the command line: outputs, Ctrl-C, SIGKILL and resuming.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "relpos/safetensors.hpp"
#include "test_util.hpp"

namespace fs = std::filesystem;
using relpos::test::TempDir;

namespace {

std::string cli() { return RELPOS_CLI_PATH; }

// Runs a shell script; returns its exit status.
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

int csv_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  int n = -1;  // header
  while (std::getline(in, line)) n += !line.empty();
  return n;
}

// Resumes the run in `out` for `more` epochs past those its log.csv holds (quietly, its output into
// d.file(log)): the run must finish and log exactly those epochs. Returns what it printed.
std::string resume_for(const TempDir& d, const std::string& out, int more, const std::string& log) {
  const int done = std::max(0, csv_rows(out + "/log.csv"));
  REQUIRE(sh(cli() + " train --resume " + out + "/checkpoint.safetensors --epochs " + std::to_string(done + more) +
             " -q > " + d.file(log) + " 2>&1") == 0);
  const std::string printed = slurp(d.file(log));
  INFO(printed);
  CHECK(csv_rows(out + "/log.csv") == done + more);
  return printed;
}

std::string train_cmd(const TempDir& d, const std::string& out, int epochs, int batch = 16) {
  return cli() + " train -c " + relpos::test::tiny_rgb_config() + " --data " + d.path + "/data -b " + std::to_string(batch) +
         " --threads 1 --epochs " + std::to_string(epochs) + " -o " + out;
}

// Starts args (the program first) with its stdout and stderr into the pipe's write end and
// SIGPIPE at its default, as in a login shell whatever the test runner set; closes the write end here.
pid_t start_into_pipe(std::vector<std::string> args, int fds[2]) {
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    if (fds[0] >= 0) close(fds[0]);
    close(fds[1]);
    std::signal(SIGPIPE, SIG_DFL);
    std::vector<char*> argv;
    for (std::string& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  return pid;
}

}  // namespace

TEST_CASE("relpos train writes model, log, curves and checkpoint; relpos eval reports accuracy and a confusion PNG") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 20, 8);
  const std::string out = d.path + "/run";
  REQUIRE(sh(train_cmd(d, out, 2) + " > " + d.file("log") + " 2>&1") == 0);
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find("epoch 2/2: train loss") != std::string::npos);
  CHECK(log.find("test accuracy") != std::string::npos);
  for (const char* f : {"model.json", "log.csv", "curves.png", "checkpoint.safetensors"}) CHECK(fs::exists(out + "/" + f));
  CHECK(csv_rows(out + "/log.csv") == 2);
  REQUIRE(sh(cli() + " eval -m " + out + "/model.json --data " + d.path + "/data --png " + d.file("cm.png") + " > " +
             d.file("eval") + " 2>&1") == 0);
  const std::string ev = slurp(d.file("eval"));
  INFO(ev);
  CHECK(ev.find("test: 24 images, top-1") != std::string::npos);
  CHECK(ev.find("per class:") != std::string::npos);
  CHECK(ev.find("confusion matrix") != std::string::npos);
  CHECK(fs::exists(d.file("cm.png")));
  // bad input: a data folder whose classes do not match the model's labels: the folder is named
  fs::create_directories(d.path + "/two/a");
  fs::create_directories(d.path + "/two/bars");
  fs::copy_file(d.path + "/data/test/bars/000.png", d.path + "/two/a/x.png");
  fs::copy_file(d.path + "/data/test/dots/000.png", d.path + "/two/bars/x.png");
  CHECK(sh(cli() + " eval -m " + out + "/model.json --data " + d.path + "/two > " + d.file("bad") + " 2>&1") == 1);
  CHECK(slurp(d.file("bad")).find("folder 'a' is not one of the model's 3 class labels") != std::string::npos);
  // a label without a folder is named too
  fs::remove_all(d.path + "/two/a");
  CHECK(sh(cli() + " eval -m " + out + "/model.json --data " + d.path + "/two > " + d.file("bad") + " 2>&1") == 1);
  CHECK(slurp(d.file("bad")).find("no folder for class") != std::string::npos);
}

TEST_CASE("--opt names the optimizer in words, in --help and in errors, and adamw trains") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 2);
  REQUIRE(sh(train_cmd(d, d.path + "/run", 1) + " --opt adamw --max-steps 1 > " + d.file("log") + " 2>&1") == 0);
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find(", adamw lr ") != std::string::npos);
  // the help printed the enum's bytes (0x00, 0x01) as its values
  REQUIRE(sh(cli() + " train --help > " + d.file("help") + " 2>&1") == 0);
  const std::string help = slurp(d.file("help"));
  CHECK(help.find("--opt TEXT:{sgd,adamw}=sgd") != std::string::npos);
  bool control = false;
  for (char c : help) control = control || (static_cast<unsigned char>(c) < 0x20 && c != '\n');
  CHECK_FALSE(control);
  CHECK(sh(cli() + " train -c fmnist_conv --opt adam > " + d.file("bad") + " 2>&1") == 2);
  CHECK(slurp(d.file("bad")).find("--opt: adam not in {sgd,adamw}") != std::string::npos);
}

TEST_CASE("Ctrl-C saves a checkpoint and exits 130; --resume finishes the run") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 40, 4);
  const std::string out = d.path + "/run";
  const std::string script = train_cmd(d, out, 500) + " > " + d.file("log") + " 2>&1 & pid=$!; " +
                             "for i in $(seq 1 600); do [ -f " + out + "/checkpoint.safetensors ] && break; sleep 0.05; done; " +
                             "kill -INT $pid; wait $pid; exit $?";
  CHECK(sh(script) == 130);
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find("resume with: relpos train --resume " + out + "/checkpoint.safetensors") != std::string::npos);
  CHECK(resume_for(d, out, 2, "log2").find("ETA") == std::string::npos);  // -q holds on resume too
  CHECK(fs::exists(out + "/model.json"));
}

TEST_CASE("a hang-up (the terminal gone, stderr a pipe without reader) saves a checkpoint and exits 129") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 40, 4);
  const std::string out = d.path + "/run";
  // stdout and stderr go into a pipe whose reader is closed before the hang-up, as when an ssh session
  // drops: the stop message then meets a pipe without reader, which must not kill the run unsaved. The
  // process is started and waited for here, not by a shell, so that an exit with 129 and death by the
  // signal (which a shell reports as 129 too) are told apart.
  const std::string config = relpos::test::tiny_rgb_config(), data = d.path + "/data";
  std::vector<std::string> args = {cli(), "train", "-c", config, "--data", data, "-b", "16", "--threads", "1",
                                   "--epochs", "500", "-o", out, "-q"};
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const pid_t pid = start_into_pipe(args, fds);
  for (int i = 0; i < 600 && !fs::exists(out + "/checkpoint.safetensors"); ++i) usleep(50000);
  close(fds[0]);  // the reader goes away, then the hang-up comes
  REQUIRE(kill(pid, SIGHUP) == 0);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  INFO("signalled " << WIFSIGNALED(st) << " by " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 129);
  // the checkpoint written at the hang-up resumes
  resume_for(d, out, 1, "log2");
}

TEST_CASE("under nohup (SIGHUP ignored) a hang-up does not stop a run") {
  // train put its own handler over the ignored signal: a closed terminal stopped a nohup'ed run
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 2);
  const std::string out = d.path + "/run";
  const std::string script = "trap \"\" HUP; " + train_cmd(d, out, 200) + " -q > " + d.file("log") +
                             " 2>&1 & pid=$!; for i in $(seq 1 600); do [ -f " + out +
                             "/checkpoint.safetensors ] && break; sleep 0.05; done; kill -HUP $pid || exit 99; " +
                             "wait $pid; exit $?";
  CHECK(sh(script) == 0);  // (99: the run had ended before the hang-up came)
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find("interrupted") == std::string::npos);
  CHECK(csv_rows(out + "/log.csv") == 200);
}

TEST_CASE("a run started with relative --data and --save resumes from another folder on the same data and file") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/work/data", 8, 2);
  fs::create_directories(d.path + "/elsewhere");
  const std::string start = "cd " + d.path + "/work && " + cli() + " train -c " + relpos::test::tiny_rgb_config() +
                            " --data data -b 16 --threads 1 --epochs 1 --save model.json -o run -q";
  REQUIRE(sh(start + " > " + d.file("log") + " 2>&1") == 0);
  fs::remove(d.path + "/work/model.json");
  // from another folder (which holds a data/ of its own, which must not be taken)
  relpos::test::make_pattern_dataset(d.path + "/elsewhere/data", 1, 1);
  const std::string resume = "cd " + d.path + "/elsewhere && " + cli() + " train --resume ../work/run/checkpoint.safetensors -q";
  REQUIRE(sh(resume + " --epochs 2 > " + d.file("log2") + " 2>&1") == 0);
  INFO(slurp(d.file("log2")));
  CHECK(fs::exists(d.path + "/work/model.json"));
  CHECK_FALSE(fs::exists(d.path + "/elsewhere/model.json"));
  CHECK(csv_rows(d.path + "/work/run/log.csv") == 2);
  // data moved away: the checkpoint names the folder it needs
  fs::rename(d.path + "/work/data", d.path + "/moved");
  CHECK(sh(resume + " --epochs 3 > " + d.file("log3") + " 2>&1") == 1);
  CHECK(slurp(d.file("log3")).find("the run's data folder '" + d.path + "/work/data' is not there") != std::string::npos);
}

TEST_CASE("a second run into the folder a run is writing is refused, even with --overwrite or --resume") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 40, 4);
  const std::string out = d.path + "/run";
  // the fresh-folder check alone lets two runs started together both write (each sees an empty folder)
  const std::string script =
      train_cmd(d, out, 500) + " -q > " + d.file("log") + " 2>&1 & pid=$!; " +
      "for i in $(seq 1 600); do [ -f " + out + "/checkpoint.safetensors ] && break; sleep 0.05; done; " +
      train_cmd(d, out, 2) + " --overwrite -q > " + d.file("log2") + " 2>&1; a=$?; " +
      cli() + " train --resume " + out + "/checkpoint.safetensors -q > " + d.file("log3") + " 2>&1; b=$?; " +
      "kill -INT $pid; wait $pid; echo $a $b > " + d.file("status");
  sh(script);
  CHECK(slurp(d.file("status")) == "1 1\n");
  for (const char* log : {"log2", "log3"}) {
    INFO(slurp(d.file(log)));
    CHECK(slurp(d.file(log)).find(out + ": another training run is writing to this output folder") != std::string::npos);
  }
  // once the first run has stopped, the folder is free again (one more step than the checkpoint's)
  const long step = nlohmann::json::parse(
                        relpos::SafetensorsFile::read(out + "/checkpoint.safetensors").metadata().at("relpos.progress"))
                        .at("step")
                        .get<long>();
  CHECK(sh(cli() + " train --resume " + out + "/checkpoint.safetensors --max-steps " + std::to_string(step + 1) +
           " -q > /dev/null 2>&1") == 0);
}

TEST_CASE("a run killed with SIGKILL resumes from its last checkpoint and finishes") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 40, 4);
  const std::string out = d.path + "/run";
  const std::string script = train_cmd(d, out, 500) + " -q > /dev/null 2>&1 & pid=$!; " +
                             "for i in $(seq 1 600); do [ -f " + out + "/checkpoint.safetensors ] && break; sleep 0.05; done; " +
                             "sleep 0.3; kill -KILL $pid; wait $pid; exit $?";
  CHECK(sh(script) == 137);
  // the last checkpoint is whole (files are replaced by rename), so resuming works
  resume_for(d, out, 2, "log");
  CHECK(fs::exists(out + "/model.json"));
  // and temporary files a kill left behind are gone
  for (const auto& e : fs::directory_iterator(out)) CHECK(e.path().string().find(".tmp.") == std::string::npos);
}

TEST_CASE("train: numbers as typed, output paths checked before any work, --save remembered by --resume") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 12, 4);
  // the log says lr 0.001 (not 0.00), 1 epoch (not 1 epochs), whole images (not 48.0)
  REQUIRE(sh(train_cmd(d, d.path + "/a", 1) + " --lr 0.001 -q > " + d.file("log") + " 2>&1") == 0);
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find("lr 0.001,") != std::string::npos);
  CHECK(log.find("1 epoch of batch 16") != std::string::npos);
  CHECK(log.find("trained on 32 images in") != std::string::npos);
  // an unwritable --save or --out fails at once, before training
  CHECK(sh(train_cmd(d, d.path + "/b", 1) + " --save /nonexistent-folder/m.json -q > " + d.file("log2") + " 2>&1") == 1);
  CHECK(slurp(d.file("log2")).find("/nonexistent-folder/m.json: cannot save the model there") != std::string::npos);
  CHECK(!fs::exists(d.path + "/b/checkpoint.safetensors"));
  CHECK(sh(train_cmd(d, "/proc/relpos-out", 1) + " -q > " + d.file("log3") + " 2>&1") == 1);
  CHECK(slurp(d.file("log3")).find("/proc/relpos-out: cannot create the output folder") != std::string::npos);
  // --save given to a run that stops early is honoured when the run is resumed without it
  REQUIRE(sh(train_cmd(d, d.path + "/c", 2) + " --save " + d.file("saved.json") + " --max-steps 2 -q > /dev/null 2>&1") == 0);
  CHECK(!fs::exists(d.file("saved.json")));
  REQUIRE(sh(cli() + " train --resume " + d.path + "/c/checkpoint.safetensors -q > " + d.file("log4") + " 2>&1") == 0);
  INFO(slurp(d.file("log4")));
  CHECK(fs::exists(d.file("saved.json")));
  CHECK(slurp(d.file("log4")).find("saved " + d.file("saved.json")) != std::string::npos);
}

TEST_CASE("train: a rate, momentum or fraction that cannot be (NaN, a rising cosine, hexadecimal) is a usage error") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 4, 2);
  // each trained before (--val-split nan and --min-lr above --lr exit 0 or 1, --momentum 5 diverged)
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--val-split nan", "--val-split: must be a number in [0..0.9], got nan"},
      {"--clip-grad nan", "--clip-grad: must be a number in [0..1e+09], got nan"},
      {"--ema-decay nan", "--ema-decay: must be a number in [0..0.999999], got nan"},
      {"--checkpoint-every nan", "--checkpoint-every: must be a number in [0..1e+06], got nan"},
      {"--bucket-mb nan", "--bucket-mb: must be a number in [0..1e+06], got nan"},
      {"--momentum 5", "--momentum: must be from 0 to below 1, got 5"},
      {"--lr 0x10", "--lr: must be a number, got '0x10'"},
      {"--lr 0.01 --min-lr 0.1", "--min-lr 0.1 is above --lr 0.01: the cosine goes down from --lr to --min-lr"},
  };
  for (const auto& c : cases) {
    const std::string flags = c.first, says = c.second;  // (not bindings: CAPTURE's lambda takes them)
    CAPTURE(flags);
    CHECK(sh(train_cmd(d, d.path + "/o", 1) + " " + flags + " -q > " + d.file("log") + " 2>&1") == 2);
    const std::string log = slurp(d.file("log"));
    INFO(log);
    CHECK(log.find(says) != std::string::npos);
    CHECK(!fs::exists(d.path + "/o/checkpoint.safetensors"));
  }
}

TEST_CASE("a new relpos train refuses a folder that holds an earlier run's results, unless --overwrite") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 4);
  const std::string out = d.path + "/run";
  REQUIRE(sh(train_cmd(d, out, 1) + " --max-steps 1 -q > /dev/null 2>&1") == 0);
  const std::string before = slurp(out + "/checkpoint.safetensors");
  REQUIRE(!before.empty());
  // a second run into the same folder stops before any work, naming the file and the ways on
  CHECK(sh(train_cmd(d, out, 2) + " --max-steps 1 -q > " + d.file("log") + " 2>&1") == 1);
  const std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find(out + "/checkpoint.safetensors: the output folder holds an earlier run's results") != std::string::npos);
  CHECK(log.find("--resume " + out + "/checkpoint.safetensors") != std::string::npos);
  CHECK(log.find("--overwrite") != std::string::npos);
  CHECK(slurp(out + "/checkpoint.safetensors") == before);
  // a folder with only an earlier model.json (or log.csv) is refused too
  fs::create_directories(d.path + "/other");
  std::ofstream(d.path + "/other/log.csv") << "epoch\n";
  CHECK(sh(train_cmd(d, d.path + "/other", 1) + " --max-steps 1 -q > " + d.file("log2") + " 2>&1") == 1);
  CHECK(slurp(d.file("log2")).find("/other/log.csv: the output folder holds an earlier run's results") !=
        std::string::npos);
  // --overwrite replaces them; --resume with --overwrite is a usage error (a resumed run writes its own folder)
  CHECK(sh(train_cmd(d, out, 2) + " --max-steps 1 --overwrite -q > /dev/null 2>&1") == 0);
  CHECK(slurp(out + "/checkpoint.safetensors") != before);
  CHECK(sh(cli() + " train --resume " + out + "/checkpoint.safetensors --overwrite -q > /dev/null 2>&1") == 2);
}

TEST_CASE("--overwrite keeps the earlier results when the new run cannot start") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 4);
  const std::string out = d.path + "/run";
  REQUIRE(sh(train_cmd(d, out, 1) + " -q > /dev/null 2>&1") == 0);
  const std::string model = slurp(out + "/model.json");
  REQUIRE(!model.empty());
  // a mistyped data folder: the run fails, and the results it was to replace are still there
  const std::string typo = cli() + " train -c " + relpos::test::tiny_rgb_config() + " --data " + d.path +
                           "/dataa -b 16 --threads 1 --epochs 1 -o " + out + " --overwrite -q";
  CHECK(sh(typo + " > " + d.file("log") + " 2>&1") == 1);
  INFO(slurp(d.file("log")));
  CHECK(slurp(out + "/model.json") == model);
  for (const char* f : {"checkpoint.safetensors", "log.csv", "curves.png"}) CHECK(fs::exists(out + "/" + f));
  // a run that starts replaces them, with none of the old ones left beside its own
  CHECK(sh(train_cmd(d, out, 1) + " --max-steps 1 --overwrite -q > /dev/null 2>&1") == 0);
  CHECK(!fs::exists(out + "/model.json"));
  CHECK(!fs::exists(out + "/log.csv"));
}

TEST_CASE("--max-steps, --resume --epochs and --save on a resume: what the run says and keeps is what it did") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 4);  // 3 classes x 8: 3 batches of 8 an epoch
  // a stop by --max-steps after an epoch has ended is a stop, not the end of the run
  const std::string out = d.path + "/run";
  REQUIRE(sh(train_cmd(d, out, 3, 8) + " --max-steps 4 > " + d.file("log") + " 2>&1") == 0);
  std::string log = slurp(d.file("log"));
  INFO(log);
  CHECK(log.find("relpos: stopped after --max-steps; checkpoint saved to " + out + "/checkpoint.safetensors") !=
        std::string::npos);
  CHECK(log.find("relpos: done") == std::string::npos);  // (it said done, and named a model.json it had not written)
  CHECK(!fs::exists(out + "/model.json"));
  // the checkpoint stands at step 1 of epoch 2 (3 steps an epoch): --epochs 1 would undo it
  CHECK(sh(cli() + " train --resume " + out + "/checkpoint.safetensors --epochs 1 -q > " + d.file("log2") + " 2>&1") == 1);
  log = slurp(d.file("log2"));
  CHECK(log.find("the run has done 1 epoch and 1 batch of epoch 2 already; --epochs 1 would undo them (give at "
                 "least 2)") != std::string::npos);
  // a relative --save given on --resume is kept as an absolute path, so the next resume from
  // elsewhere saves to the same file
  fs::create_directories(d.path + "/a");
  fs::create_directories(d.path + "/b");
  REQUIRE(sh("cd " + d.path + "/a && " + cli() + " train --resume ../run/checkpoint.safetensors --save m.json --max-steps 5 -q > " +
             d.file("log3") + " 2>&1") == 0);
  REQUIRE(sh("cd " + d.path + "/b && " + cli() + " train --resume ../run/checkpoint.safetensors -q > " + d.file("log4") +
             " 2>&1") == 0);
  INFO(slurp(d.file("log4")));
  CHECK(fs::exists(d.path + "/a/m.json"));
  CHECK(!fs::exists(d.path + "/b/m.json"));
}

TEST_CASE("a run stopped at an epoch's last batch and resumed logs the rate that epoch ended with") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 4);  // 3 batches of 8 an epoch
  REQUIRE(sh(train_cmd(d, d.path + "/whole", 2, 8) + " -q > /dev/null 2>&1") == 0);
  REQUIRE(sh(train_cmd(d, d.path + "/parts", 2, 8) + " --max-steps 3 -q > /dev/null 2>&1") == 0);
  REQUIRE(sh(cli() + " train --resume " + d.path + "/parts/checkpoint.safetensors -q > /dev/null 2>&1") == 0);
  // (the resumed epoch had no batch left and logged the next step's rate)
  const auto column = [&](const std::string& csv, int col) {
    std::istringstream in(slurp(csv));
    std::string line, out;
    std::getline(in, line);
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string cell;
      for (int i = 0; i <= col; ++i) std::getline(f, cell, ',');
      out += cell + ";";
    }
    return out;
  };
  CHECK(column(d.path + "/parts/log.csv", 1) == column(d.path + "/whole/log.csv", 1));  // lr
  CHECK(column(d.path + "/parts/log.csv", 2) == column(d.path + "/whole/log.csv", 2));  // train loss
}

TEST_CASE("a resume from another file than the folder's latest checkpoint, or to a --max-steps already passed, is refused") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 8, 4);  // 3 classes x 8, a fifth for validation
  const std::string out = d.path + "/run";
  REQUIRE(sh(train_cmd(d, out, 3, 4) + " --val-split 0.2 -q > " + d.file("log") + " 2>&1") == 0);
  REQUIRE(fs::exists(out + "/best.safetensors"));
  const std::string checkpoint = slurp(out + "/checkpoint.safetensors"), log_csv = slurp(out + "/log.csv");
  // best.safetensors is an earlier epoch's checkpoint: going on from it in this folder would write
  // over the latest checkpoint and log.csv (the epochs after it lost)
  CHECK(sh(cli() + " train --resume " + out + "/best.safetensors --epochs 4 -q > " + d.file("log2") + " 2>&1") == 1);
  const std::string said = slurp(d.file("log2"));
  INFO(said);
  CHECK(said.find("its folder holds the run's latest checkpoint, " + out + "/checkpoint.safetensors") != std::string::npos);
  CHECK(slurp(out + "/checkpoint.safetensors") == checkpoint);
  CHECK(slurp(out + "/log.csv") == log_csv);
  // a copy in a folder of its own goes on from there
  fs::create_directories(d.path + "/branch");
  fs::copy_file(out + "/best.safetensors", d.path + "/branch/best.safetensors");
  CHECK(sh(cli() + " train --resume " + d.path + "/branch/best.safetensors --epochs 4 -q > " + d.file("log3") + " 2>&1") == 0);
  CHECK(fs::exists(d.path + "/branch/model.json"));
  // --max-steps at or below the checkpoint's step: an error, not one more step
  CHECK(sh(cli() + " train --resume " + out + "/checkpoint.safetensors --epochs 4 --max-steps 2 -q > " + d.file("log4") +
           " 2>&1") == 1);
  CHECK(slurp(d.file("log4")).find("--max-steps 2 would stop before it") != std::string::npos);
  CHECK(slurp(out + "/checkpoint.safetensors") == checkpoint);
}

TEST_CASE("stderr a pipe whose reader went away: the run goes on and saves everything, exit 0 (not SIGPIPE's 141)") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 16, 4);
  const std::string out = d.path + "/run";
  std::vector<std::string> args = {cli(), "train", "-c", relpos::test::tiny_rgb_config(), "--data", d.path + "/data",
                                   "-b", "8", "--threads", "1", "--epochs", "2", "-o", out};
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  close(fds[0]);  // no reader from the start: the first progress line meets a broken pipe
  fds[0] = -1;
  const pid_t pid = start_into_pipe(args, fds);
  int st = 0;
  REQUIRE(waitpid(pid, &st, 0) == pid);
  INFO("signalled " << WIFSIGNALED(st) << " by " << (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
  REQUIRE(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(fs::exists(out + "/model.json"));
  CHECK(csv_rows(out + "/log.csv") == 2);
}

TEST_CASE("--save replaces only a relpos model file, and takes .json or .safetensors") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 4, 2);
  const std::string image = d.path + "/data/train/bars/000.png", bytes = slurp(image);
  std::ofstream(d.file("config.json")) << slurp(relpos::test::tiny_rgb_config());
  // a training image, a config and a file of another kind were replaced by the model, without a word
  for (const std::string& target : {image, d.file("config.json")}) {
    CAPTURE(target);
    CHECK(sh(train_cmd(d, d.path + "/r1", 1, 4) + " --save " + target + " -q > " + d.file("log") + " 2>&1") != 0);
    CHECK(slurp(d.file("log")).find(target + ": ") != std::string::npos);
  }
  CHECK(slurp(image) == bytes);
  CHECK(slurp(d.file("config.json")) == slurp(relpos::test::tiny_rgb_config()));
  // a usage error (exit 2), as convert's and quantize's output names
  CHECK(sh(train_cmd(d, d.path + "/r2", 1, 4) + " --overwrite --save " + d.file("m.txt") + " -q > " + d.file("log") + " 2>&1") == 2);
  CHECK(slurp(d.file("log")).find("give a file name with one of these extensions") != std::string::npos);
  CHECK(!fs::exists(d.file("m.txt")));
  // an earlier model is replaced, as a compiler's -o replaces its output
  for (const char* name : {"m.json", "m.safetensors"}) {
    CAPTURE(name);
    REQUIRE(sh(train_cmd(d, d.path + "/a_" + name, 1, 4) + " --save " + d.file(name) + " -q > /dev/null 2>&1") == 0);
    CHECK(sh(train_cmd(d, d.path + "/b_" + name, 1, 4) + " --save " + d.file(name) + " -q > " + d.file("log") + " 2>&1") == 0);
  }
}

TEST_CASE("train --init given a config (no weights) is a usage error, not a silent start from random weights") {
  TempDir d;
  relpos::test::make_pattern_dataset(d.path + "/data", 4, 2);
  CHECK(sh(cli() + " train --init " + relpos::test::tiny_rgb_config() + " --data " + d.path + "/data -b 4 --threads 1 " +
           "--epochs 1 -q -o " + d.path + "/run > " + d.file("log") + " 2>&1") == 2);
  CHECK(slurp(d.file("log")).find("is a model config (no weights); --init takes trained weights") != std::string::npos);
  CHECK(!fs::exists(d.path + "/run"));
  // a path that is not there says so (not that it is neither a file nor a shipped config)
  CHECK(sh(cli() + " train --init " + d.file("gone/model.json") + " --data " + d.path + "/data -b 4 --threads 1 " +
           "--epochs 1 -q -o " + d.path + "/run > " + d.file("log") + " 2>&1") == 1);
  CHECK(slurp(d.file("log")).find(d.file("gone/model.json") + ": no such file") != std::string::npos);
}
