// Whole networks against timm: layouts, tensor names, parameter counts and logits.
#include <cmath>
#include <fstream>

#include "relpos/error.hpp"
#include "relpos/network.hpp"
#include "relpos/runtime.hpp"
#include "test_util.hpp"

using namespace relpos;

namespace {
// Copies every "param.<name>" tensor of the golden file into the network; fails on any name
// that does not match in either direction.
void load_golden_params(Network& net, const SafetensorsFile& f) {
  std::size_t used = 0;
  for (const auto& p : net.params()) {
    const std::string key = "param." + p.name;
    REQUIRE_MESSAGE(f.has(key), "golden file lacks " << key);
    const Tensor t = f.tensor(key);
    REQUIRE_MESSAGE(t.shape() == p.value->shape(), p.name << ": " << to_string(t.shape()) << " vs "
                                                          << to_string(p.value->shape()));
    p.value->copy_from(t);
    ++used;
  }
  std::size_t in_file = 0;
  for (const auto& e : f.entries())
    if (e.name.rfind("param.", 0) == 0 && e.name.find("num_batches_tracked") == std::string::npos) ++in_file;
  CHECK(used == in_file);
  net.prepare_inference();
}

// Leaves in `net` (loaded by load_golden_params) the running statistics from before the file's
// training step. The project's files (metadata param_stats = before_train_step) store those in
// param.*. The shared file's param.* hold the statistics *after* its step (they equal
// after_train_step.* exactly) while its logits_eval was computed before it; one training-mode
// forward moves them on once more (r2 = 0.9 after + 0.1 batch), which recovers the earlier ones:
// before = (after - 0.1 batch) / 0.9 = (1.9 after - r2) / 0.9.
void restore_stats_before_step(Network& net, const SafetensorsFile& f) {
  const auto& meta = f.metadata();
  const auto it = meta.find("param_stats");
  if (it != meta.end() && it->second == "before_train_step") return;
  net.forward(f.tensor("input"));
  for (const auto& p : net.params()) {
    if (p.grad) continue;
    const auto after = f.tensor("param." + p.name).to_vector();
    auto r2 = p.value->to_vector();
    for (std::size_t i = 0; i < r2.size(); ++i) r2[i] = (1.9f * after[i] - r2[i]) / 0.9f;
    p.value->copy_from(Tensor::from_vector(p.value->shape(), r2));
  }
  net.prepare_inference();
}

const char* kTiny = "tiny_botnet_96x64";
}  // namespace

TEST_CASE("tiny_botnet_96x64: eval logits from timm's parameters match timm") {
  test::for_each_golden(kTiny, [](const SafetensorsFile& f, const std::string& label) {
    Network net(ModelConfig::load(test::source_dir() + "/models/tiny_botnet_96x64.json"));
    CHECK(net.num_params() == std::stoll(f.metadata().at("params")));
    load_golden_params(net, f);
    restore_stats_before_step(net, f);
    const Tensor input = f.tensor("input");
    test::check_forward(net.infer(input), f.tensor("logits_eval"), label + " logits_eval");
    test::check_forward(net.forward(input), f.tensor("logits_train"), label + " logits_train (batch statistics)");
  });
}

TEST_CASE("a tiered stem with pool \"conv3\" strides conv3 as timm's does without a pool: logits match timm") {
  // before: no config could say it; "none" kept conv3 at stride 1, the weights loaded (same shapes)
  // and timm's resnet32ts gave wrong logits
  const SafetensorsFile f = test::golden("tiny_stem4_32x32");
  Network net(ModelConfig::load(test::source_dir() + "/tests/data/tiny_stem4_config.json"));
  CHECK(net.num_params() == std::stoll(f.metadata().at("params")));
  load_golden_params(net, f);
  test::check_forward(net.infer(f.tensor("input")), f.tensor("logits_eval"), "tiny_stem4_32x32 logits_eval");
  nlohmann::json j;
  std::ifstream(test::source_dir() + "/tests/data/tiny_stem4_config.json") >> j;
  // "none" keeps its meaning (conv1 alone strides): files written before "conv3" existed read as they did
  // (the attention sees 8x8, tables of 15 rows, where "conv3" gives 4x4 and 7 rows)
  const char* table = "stages.1.1.self_attn.pos_embed.height_rel";
  CHECK(net.find(table)->value->shape()[0] == 7);
  j["stem"]["pool"] = "none";
  const Network none(ModelConfig::from_json(j));
  CHECK(none.find(table)->value->shape()[0] == 15);
  CHECK(none.infer(f.tensor("input")).shape() == Shape{2, 5});
  // timm's spelling "" is ambiguous on a tiered stem; "conv3" on a conv stem means nothing
  j["stem"]["pool"] = "";
  CHECK_THROWS_WITH_AS(ModelConfig::from_json(j), doctest::Contains("write \"conv3\" for timm's tiered stem"), Error);
  j["stem"] = {{"type", "conv"}, {"chs", 16}, {"pool", "conv3"}};
  CHECK_THROWS_WITH_AS(ModelConfig::from_json(j), doctest::Contains("needs a tiered stem"), Error);
  // the pool survives a round trip through a model file's config
  CHECK(ModelConfig::from_json(ModelConfig::load(test::source_dir() + "/tests/data/tiny_stem4_config.json").to_json()).stem.pool ==
        StemPool::StridedConv3);
}

TEST_CASE("Network::infer writes identity blocks' outputs over their inputs, never over the caller's") {
  // infer() hands each block the previous one's output to overwrite (an identity shortcut's conv3
  // adds onto it in place); infer_attention() keeps every block's input. Same logits, bit for bit,
  // and the caller's input is untouched, also when it is already channels-last.
  test::for_each_golden(kTiny, [](const SafetensorsFile& f, const std::string& label) {
    Network net(ModelConfig::load(test::source_dir() + "/models/tiny_botnet_96x64.json"));
    load_golden_params(net, f);
    for (const Tensor& input : {f.tensor("input"), f.tensor("input").channels_last()}) {
      const std::vector<float> before = input.to_vector();
      const Tensor logits = net.infer(input);
      CHECK_MESSAGE(input.to_vector() == before, label);
      Tensor kept;
      (void)net.infer_attention(input, &kept);
      CHECK_MESSAGE(logits.to_vector() == kept.to_vector(), label);
      CHECK_MESSAGE(net.infer(input).to_vector() == logits.to_vector(), label);
    }
  });
}

TEST_CASE("tiny_botnet_96x64: param.* loads under timm's names and runs in eval mode") {
  test::for_each_golden(kTiny, [](const SafetensorsFile& f, const std::string&) {
    Network net(ModelConfig::load(test::source_dir() + "/models/tiny_botnet_96x64.json"));
    load_golden_params(net, f);
    const Tensor input = f.tensor("input");
    const Tensor logits = net.infer(input);
    CHECK(logits.shape() == Shape{input.shape()[0], 10});
    for (float v : logits.to_vector()) CHECK(std::isfinite(v));
  });
}

TEST_CASE("botnet26t_256 has timm's 12.49M parameters and feature sizes 64, 32, 16, 8") {
  Network net(ModelConfig::load(test::source_dir() + "/models/botnet26t_256.json"));
  CHECK(net.num_params() == 12488672);
  const auto rows = net.summarize(1);
  std::vector<std::int64_t> sizes;
  for (const char* last : {"stages.0.1.conv3_1x1", "stages.1.1.conv3_1x1", "stages.2.1.conv3_1x1", "stages.3.1.conv3_1x1"})
    for (const auto& r : rows)
      if (r.name == last) sizes.push_back(r.out_shape[2]);
  CHECK(sizes == std::vector<std::int64_t>{64, 32, 16, 8});
}

TEST_CASE("a fixed-size model names its input size when given another") {
  Network net(ModelConfig::load(test::source_dir() + "/models/tiny_botnet_96x64.json"));
  CHECK_THROWS_WITH_AS(net.infer(Tensor::zeros({1, 3, 64, 64})), doctest::Contains("takes 96x64 input"), Error);
  CHECK_THROWS_WITH_AS(net.infer(Tensor::zeros({1, 1, 96, 64})), doctest::Contains("(N, 3, H, W)"), Error);
}

TEST_CASE("tiny_botnet_96x64: one training step matches timm: logits, loss, every gradient, running stats") {
  // Two threads, whatever the machine's load. A ReLU's gradient jumps at zero, and on the shared
  // file's input one unit of the last block's output (channel 125) lies within rounding of it: on
  // one thread with the Winograd 3x3 kernels, whose sums then run in another order, it falls on
  // the other side, and that channel's gradients move by 4% (all else stays within 1e-6; 2 threads,
  // or 1 thread without Winograd, match timm's everywhere). Both sides are valid subgradients; a
  // fixed thread count makes the comparison deterministic instead of depending on the CI host.
  struct Threads {
    int old = num_threads();
    Threads() { set_num_threads(2); }
    ~Threads() { set_num_threads(old); }
  } threads;
  test::for_each_golden(kTiny, [](const SafetensorsFile& f, const std::string& label) {
    Network net(ModelConfig::load(test::source_dir() + "/models/tiny_botnet_96x64.json"));
    load_golden_params(net, f);
    restore_stats_before_step(net, f);  // one step from these must land on after_train_step.*
    const Tensor logits = net.forward(f.tensor("input"));
    test::check_forward(logits, f.tensor("logits_train"), label + " logits_train");
    std::vector<int> labels;
    for (float v : f.tensor("labels").to_vector()) labels.push_back(static_cast<int>(v));
    const ops::CrossEntropy ce = ops::cross_entropy(logits, labels);
    CHECK(ce.loss == doctest::Approx(f.tensor("loss").to_vector()[0]).epsilon(1e-5));
    net.backward(ce.dlogits);
    int grads = 0, stats = 0;
    for (const auto& p : net.params()) {
      if (p.grad) {
        REQUIRE_MESSAGE(p.grad->defined(), p.name << " got no gradient");
        test::check_grad(*p.grad, f.tensor("grad." + p.name), label + " grad." + p.name);
        ++grads;
      } else {
        test::check_forward(*p.value, f.tensor("after_train_step." + p.name), label + " after_train_step." + p.name);
        ++stats;
      }
    }
    CHECK(grads == 83);
    CHECK(stats == 50);
  });
}
