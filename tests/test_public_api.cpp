// The public API as a user meets it: what the installed headers expose (only what users call),
// Model::open, enums parsed once with the names the files use, and the library's messages going to
// the application's log handler.
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <fstream>
#include <sstream>

#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/optim.hpp"
#include "relpos/runtime.hpp"
#include "relpos/version.hpp"
#include "cli_run.hpp"
#include "test_util.hpp"

using namespace relpos;
namespace fs = std::filesystem;

namespace {
std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("public headers hold no internals and include only public headers") {
  const fs::path dir = fs::path(test::source_dir()) / "include" / "relpos";
  int headers = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string text = read_text(e.path());
    const std::string name = e.path().filename().string();
    ++headers;
    for (const char* banned : {"<mutex>", "<thread>", "<condition_variable>", "OpCache", "BatchStats",
                               "#include \"core/", "#include \"io/", "#include \"cpu/", "#include \"cuda/",
                               "#include \"layers/", "#include \"train/", "#include <dnnl", "#include <cuda", "omp.h"}) {
      INFO(name << " contains " << banned);
      CHECK(text.find(banned) == std::string::npos);
    }
    // each public header names where it is implemented, or its implementation bears its name
    const std::string stem = e.path().stem().string();
    bool found = text.find("Implemented") != std::string::npos || stem == "error";
    for (const auto& f : fs::recursive_directory_iterator(fs::path(test::source_dir()) / "src"))
      found = found || f.path().stem() == stem || f.path().filename() == stem;
    INFO(name << ": no src/**/" << stem << ".* and no note saying where it is implemented");
    CHECK(found);
  }
  CHECK(headers >= 10);
}

TEST_CASE("version: the library's is the headers' and the project's") {
  CHECK(relpos::version() == RELPOS_VERSION_STRING);
  CHECK(relpos::version() == std::to_string(RELPOS_VERSION_MAJOR) + "." + std::to_string(RELPOS_VERSION_MINOR) + "." +
                                 std::to_string(RELPOS_VERSION_PATCH));
}

TEST_CASE("Model::open takes a weights file, a config file or a shipped config's name") {
  test::TempDir dir;
  LoadOptions opt;
  opt.seed = 7;
  // a shipped name: the shipped weights, or random weights for a shipped config
  const Model shipped = Model::open("botnet-fmnist", opt);
  const Model loaded = Model::load(test::source_dir() + "/models/botnet-fmnist.json");
  CHECK(shipped.labels().size() == 10);
  CHECK(shipped.network().params().back().value->to_vector() == loaded.network().params().back().value->to_vector());
  const Model random = Model::open("botnet26t_256", opt);
  CHECK(random.network().config().name == "botnet26t_256");
  CHECK(random.labels().size() == 1000);
  const Model from_path = Model::open(test::tiny_rgb_config(), opt);  // a config file
  const Model again = Model::create(test::tiny_rgb_config(), 7);
  CHECK(from_path.network().params().front().value->to_vector() == again.network().params().front().value->to_vector());
  from_path.save_json(dir.file("w.json"));
  fs::copy_file(dir.file("w.json"), dir.file("weights-without-extension"));
  from_path.save_safetensors(dir.file("w.st"));
  for (const char* f : {"w.json", "weights-without-extension", "w.st"}) {  // contents decide, not names
    const Model m = Model::open(dir.file(f));
    CHECK(m.network().params().back().value->to_vector() == from_path.network().params().back().value->to_vector());
  }
  CHECK_THROWS_WITH_AS(Model::open(dir.file("missing.json")), doctest::Contains("missing.json: no such file"), relpos::Error);
  CHECK_THROWS_WITH_AS(Model::open("no-such-model"), doctest::Contains("'no-such-model' is neither a file nor a config"), relpos::Error);
  CHECK_THROWS_WITH_AS(Model::open(dir.path), doctest::Contains("is a directory"), relpos::Error);
  // RELPOS_MODELS set but empty is as unset (it searched the folder "")
  const char* before = std::getenv("RELPOS_MODELS");
  const std::string saved = before ? before : "";
  setenv("RELPOS_MODELS", "", 1);
  CHECK(Model::open("botnet-fmnist").labels().size() == 10);
  if (before) setenv("RELPOS_MODELS", saved.c_str(), 1);
  else unsetenv("RELPOS_MODELS");
}

TEST_CASE("enums: every value's name parses back; unknown names list the known ones") {
  for (auto v : {ChannelOrder::RGB, ChannelOrder::BGR, ChannelOrder::Gray}) CHECK(parse_channel_order(to_string(v)) == v);
  for (auto v : {CropMode::Center, CropMode::Squash, CropMode::Border}) CHECK(parse_crop_mode(to_string(v)) == v);
  for (auto v : {Interpolation::Nearest, Interpolation::Box, Interpolation::Bilinear, Interpolation::Hamming,
                 Interpolation::Bicubic, Interpolation::Lanczos})
    CHECK(parse_interpolation(to_string(v)) == v);
  CHECK(parse_interpolation("area") == Interpolation::Box);  // OpenCV's and timm's aliases
  CHECK(parse_interpolation("cubic") == Interpolation::Bicubic);
  for (auto v : {Tta::None, Tta::HFlip}) CHECK(parse_tta(to_string(v)) == v);
  for (auto v : {StemType::Tiered, StemType::Conv}) CHECK(parse_stem_type(to_string(v)) == v);
  for (auto v : {StemPool::None, StemPool::MaxPool}) CHECK(parse_stem_pool(to_string(v)) == v);
  for (auto v : {BlockType::Bottle, BlockType::SelfAttn, BlockType::Sasa}) CHECK(parse_block_type(to_string(v)) == v);
  for (auto v : {OptimizerKind::SGD, OptimizerKind::AdamW}) CHECK(parse_optimizer_kind(to_string(v)) == v);
  for (auto v : {Act::None, Act::ReLU, Act::SiLU}) CHECK(parse_act(to_string(v)) == v);
  CHECK(parse_act("swish") == Act::SiLU);
  for (auto v : {PosEncoding::Relative, PosEncoding::Absolute, PosEncoding::None}) CHECK(parse_pos_encoding(to_string(v)) == v);
  CHECK_THROWS_WITH_AS(parse_block_type("transformer"),
                       doctest::Contains("block type 'transformer' is not known (expected bottle, self_attn or sasa)"), relpos::Error);
  CHECK_THROWS_WITH_AS(parse_interpolation("cubicc"), doctest::Contains("nearest, bilinear, bicubic, box, hamming, lanczos"), relpos::Error);
}

TEST_CASE("config errors name the file and the key") {
  test::TempDir dir;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(test::tiny_rgb_config()));
  j["stem"]["type"] = "patchify";
  std::ofstream(dir.file("bad.json")) << j.dump();
  CHECK_THROWS_WITH_AS(Model::create(dir.file("bad.json")),
                       doctest::Contains("bad.json: model config: stem: key 'type' is \"patchify\" (expected tiered or conv)"),
                       relpos::Error);
  j["stem"]["type"] = "conv";
  j["preprocess"] = {{"interpolation", "bicubicc"}};
  std::ofstream(dir.file("bad2.json")) << j.dump();
  CHECK_THROWS_WITH_AS(Model::create(dir.file("bad2.json")), doctest::Contains("bad2.json: preprocess: key 'interpolation'"), relpos::Error);
  std::ofstream(dir.file("broken.json")) << "{\"stem\": ";
  CHECK_THROWS_WITH_AS(Model::create(dir.file("broken.json")), doctest::Contains("broken.json: not valid JSON"), relpos::Error);
}

TEST_CASE("threads: by default relpos leaves a core to each running thread of another process") {
  // Through the CLI, in a process of its own without ctest's OMP_NUM_THREADS (which fixes the
  // default): the thread count `relpos bench` reports while a neighbour process spins.
  const int cores = omp_get_num_procs();
  if (cores < 2 || sysconf(_SC_NPROCESSORS_ONLN) != cores) return;  // adaptive only without a narrower cpuset
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // a busy neighbour
    for (volatile unsigned long i = 0;; i = i + 1) {
    }
  }
  const auto run = test::run_cli("bench -m " + test::source_dir() + "/models/botnet-fmnist.json --iters 2 --warmup 1 --json",
                                 true, "-u OMP_NUM_THREADS -u RELPOS_ADAPTIVE_THREADS");
  const auto fixed = test::run_cli("bench -m " + test::source_dir() + "/models/botnet-fmnist.json --iters 2 --warmup 1 --json",
                                   true, "-u OMP_NUM_THREADS RELPOS_ADAPTIVE_THREADS=0");
  // a training run computes with OpenMP's default whatever the load, and says so (its first line
  // gave the adaptive count)
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 8, 2);
  const auto train = test::run_cli("train -c " + test::tiny_rgb_config() + " --data " + d.path +
                                       "/data -b 8 --epochs 1 --max-steps 1 --no-eval -o " + d.path + "/run",
                                   false, "-u OMP_NUM_THREADS -u RELPOS_ADAPTIVE_THREADS");
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  REQUIRE(run.status == 0);
  REQUIRE(fixed.status == 0);
  const auto last_json = [](const std::string& out) {
    return nlohmann::json::parse(out.substr(out.rfind('{')));
  };
  const int busy = last_json(run.out)["threads"].get<int>();
  CHECK(busy >= 1);
  CHECK(busy <= cores - 1);  // other tests running alongside only lower it further
  CHECK(last_json(fixed.out)["threads"].get<int>() == cores);  // RELPOS_ADAPTIVE_THREADS=0: OpenMP's default
  INFO(train.out);
  CHECK(train.status == 0);
  CHECK(train.out.find(", " + std::to_string(cores) + " threads, cpu") != std::string::npos);
}

TEST_CASE("threads: OMP_NUM_THREADS in the environment is the default") {
  // It used to fix the default at every core, whatever the variable said.
  const auto run = test::run_cli("bench -m " + test::source_dir() + "/models/botnet-fmnist.json --iters 1 --warmup 0 --json",
                                 true, "OMP_NUM_THREADS=1");
  REQUIRE(run.status == 0);
  CHECK(nlohmann::json::parse(run.out.substr(run.out.rfind('{')))["threads"].get<int>() == 1);
}

TEST_CASE("environment: a RELPOS_* setting with a value it does not take is an error naming it; empty means unset") {
  // They used to be ignored: RELPOS_SIMD=avx-512 ran the default kernels, RELPOS_HOST_CACHE_MB=lots
  // cached nothing, RELPOS_PROFILE= (empty) turned profiling on.
  const std::string classify = "classify -m " + test::source_dir() + "/models/botnet-fmnist.json " + test::source_dir() +
                               "/samples/bag_00018.png --topk 1";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"RELPOS_SIMD=avx-512", "RELPOS_SIMD='avx-512': expected generic, avx2 or avx512"},
      {"RELPOS_WINOGRAD=off", "RELPOS_WINOGRAD='off': expected 0 or 1"},
      {"RELPOS_HUGE_PAGES=no", "RELPOS_HUGE_PAGES='no': expected 0 or 1"},
      {"RELPOS_ADAPTIVE_THREADS=false", "RELPOS_ADAPTIVE_THREADS='false': expected 0 or 1"},
      {"RELPOS_MERGE_SHORTCUT=yes", "RELPOS_MERGE_SHORTCUT='yes'"},
      {"RELPOS_PROFILE=on", "RELPOS_PROFILE='on'"},
      {"RELPOS_HOST_CACHE_MB=lots", "RELPOS_HOST_CACHE_MB='lots': expected a whole number of MiB"},
      {"RELPOS_HOST_CACHE_MB=-1", "RELPOS_HOST_CACHE_MB='-1'"},
      {"RELPOS_CUDA_CACHE_MB=99999999999999999999", "RELPOS_CUDA_CACHE_MB='99999999999999999999'"},
      // each image was skipped for it (and a Fashion-MNIST run ignored it); OpenMP runs its own
      // default for a thread count it does not take, and relpos then stopped adapting to the load
      {"RELPOS_MAX_IMAGE_PIXELS=abc", "RELPOS_MAX_IMAGE_PIXELS='abc': expected a positive whole number"},
      {"RELPOS_PROGRESS_AFTER=soon", "RELPOS_PROGRESS_AFTER='soon'"},
      {"OMP_NUM_THREADS=abc", "OMP_NUM_THREADS='abc': expected a positive number of threads"},
      {"OMP_NUM_THREADS=0", "OMP_NUM_THREADS='0'"},
      {"OMP_NUM_THREADS=2,", "OMP_NUM_THREADS='2,'"},
  };
  for (const auto& env_message : bad) {  // (no structured binding: clang's INFO cannot capture one)
    const std::string& env = env_message.first;
    INFO(env);
    const auto run = test::run_cli(classify, false, env);
    INFO(run.out);
    CHECK(run.status == 1);
    CHECK(run.out.find("environment variable " + env_message.second) != std::string::npos);
    CHECK(run.out.find("Bag") == std::string::npos);
  }
  // said once, before any image: it was reported as each image's error, one "skipped" line each
  const auto folder = test::run_cli("classify -m " + test::source_dir() + "/models/botnet-fmnist.json " +
                                        test::source_dir() + "/samples",
                                    false, "RELPOS_SIMD=bad");
  INFO(folder.out);
  CHECK(folder.status == 1);
  CHECK(folder.out.find("skipped") == std::string::npos);
  CHECK(folder.out.find("RELPOS_SIMD='bad'") == folder.out.rfind("RELPOS_SIMD='bad'"));
  // empty (as unset) and the accepted values run
  const auto fine = test::run_cli(classify, false,
                                  "RELPOS_SIMD= RELPOS_PROFILE= RELPOS_HOST_CACHE_MB= RELPOS_WINOGRAD=1 RELPOS_HUGE_PAGES=1 "
                                  "RELPOS_CUDA_CACHE_MB=0 RELPOS_MAX_IMAGE_PIXELS= RELPOS_MAX_MODEL_GB= OMP_NUM_THREADS=2,1 "
                                  "RELPOS_PROGRESS_AFTER=");
  INFO(fine.out);
  CHECK(fine.status == 0);
  CHECK(fine.out.find("Bag") != std::string::npos);
  CHECK(fine.out.find("profile (RELPOS_PROFILE)") == std::string::npos);  // an empty RELPOS_PROFILE is no profile at exit
  CHECK(test::run_cli(classify, false, "RELPOS_PROFILE=1").out.find("profile (RELPOS_PROFILE)") != std::string::npos);
  const auto avx512 = test::run_cli(classify, true, "RELPOS_SIMD=avx512");
  CHECK(avx512.status == 0);
  // a folder without Fashion-MNIST given by the variable: said so (not "install the package")
  const auto fm = test::run_cli("eval -m " + test::source_dir() + "/models/botnet-fmnist.json", false,
                                "RELPOS_FASHION_MNIST=/nonexistent-fm");
  INFO(fm.out);
  CHECK(fm.status == 1);
  CHECK(fm.out.find("Fashion-MNIST not found at /nonexistent-fm (RELPOS_FASHION_MNIST): no t10k-images-idx3-ubyte.gz "
                    "there") != std::string::npos);
}

TEST_CASE("threads: the setting and what a call uses") {
  const int before = num_threads();
  set_num_threads(1);
  CHECK(num_threads() == 1);
  CHECK(threads_in_use() == 1);
  CHECK(training_threads() == 1);
  set_num_threads(before);
  CHECK_THROWS_AS(set_num_threads(-1), relpos::Error);
}

TEST_CASE("profiling: an op's parts are recorded only while profiling is on, and reset_profile clears them") {
  const Model m = Model::open(test::source_dir() + "/models/fmnist_sasa.json");
  const Tensor x = Tensor::zeros({1, 1, 28, 28});
  reset_profile();
  (void)m.logits(x);
  CHECK(profile_rows().empty());
  CHECK(profile_parts().empty());
  set_profiling(true);
  (void)m.logits(x);
  set_profiling(false);
  const auto rows = profile_rows();
  const auto parts = profile_parts();
  REQUIRE(parts.size() == 4);  // projection and attention of stages.1.1 and stages.2.1
  for (const ProfilePart& p : parts) {
    INFO(p.layer << " " << p.part);
    CHECK((p.layer == "stages.1.1" || p.layer == "stages.2.1"));
    CHECK(p.op == "sasa_projected_attention (cpu)");
    CHECK((p.part == "projection" || p.part == "attention"));
    CHECK(p.calls == 1);
    double op_ms = -1.0;
    for (const ProfileRow& r : rows)
      if (r.layer == p.layer && r.op == p.op) op_ms = r.ms;
    CHECK(p.ms >= 0.0);
    CHECK(p.ms <= op_ms);
  }
  (void)m.logits(x);  // profiling off: nothing more
  CHECK(profile_parts().size() == 4);
  reset_profile();
  CHECK(profile_parts().empty());
}
