// A run extended on resume continues its learning rate from where it stands (a new cosine from
// the current rate, or a constant tail) instead of restarting the schedule; the extension is part
// of the checkpoint, so resuming an extended run is exact. Gradient-norm clipping.
#include <filesystem>

#include "cli_run.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"
#include "test_util.hpp"
#include "train/grad_clip.hpp"
#include "train/lr_plan.hpp"

using namespace relpos;
namespace fs = std::filesystem;

namespace {

using test::weights_of;

TrainOptions quick(const std::string& data, const std::string& out, int epochs) {
  TrainOptions o;
  o.data = data;
  o.epochs = epochs;
  o.batch = 16;
  o.lr = 0.05f;
  o.min_lr = 1e-4f;
  o.warmup_epochs = 0.5f;
  o.out = out;
  o.workers = 1;
  o.checkpoint_minutes = 0;
  return o;
}

}  // namespace

TEST_CASE("LrPlan: extensions start from the current rate and never jump up by themselves") {
  detail::LrPlan p;
  p.base.lr = 0.1f, p.base.min_lr = 0.001f, p.base.warmup_lr = 0.0f, p.base.warmup_steps = 10, p.base.total_steps = 110;
  CHECK(p.at(60) == doctest::Approx(0.0505f));
  // a finished run extended by 100 steps: a new cosine from min_lr stays at min_lr
  p.extend(110, 210, "cosine", 0.0f);
  CHECK(p.at(110) == doctest::Approx(0.001f));
  CHECK(p.at(160) == doctest::Approx(0.001f));
  // extended half-way: from the rate it had there, down to min_lr at the new end
  detail::LrPlan h;
  h.base = p.base;
  h.extend(60, 160, "cosine", 0.0f);
  CHECK(h.at(59) == doctest::Approx(p.base.at(59)));
  CHECK(h.at(60) == doctest::Approx(0.0505f));
  CHECK(h.at(110) == doctest::Approx(0.001f + 0.5f * (0.0505f - 0.001f)));
  CHECK(h.at(160) == doctest::Approx(0.001f));
  for (long s = 60; s < 200; ++s) CHECK(h.at(s + 1) <= h.at(s) + 1e-9f);
  // constant tail, a given rate, and a later extension replacing the previous one
  h.extend(100, 200, "constant", 0.0f);
  CHECK(h.at(150) == doctest::Approx(h.at(100)));
  h.extend(120, 220, "cosine", 0.02f);
  CHECK(h.at(120) == doctest::Approx(0.02f));
  CHECK(h.segments.size() == 3);  // from 60, 100 and 120
  CHECK_THROWS_WITH_AS(h.extend(130, 300, "linear", 0.0f), doctest::Contains("'cosine' or 'constant'"), Error);
  const auto back = detail::lr_segments_from(detail::lr_segments_json(h.segments));
  REQUIRE(back.size() == 3);
  CHECK(back[2].lr == 0.02f);
  CHECK(back[1].constant);
  CHECK(back[1].start == 100);
}

TEST_CASE("extending a finished run continues its learning rate instead of restarting the cosine; resuming it is exact") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 12, 3);  // 36 images: 2 steps of 16 per epoch
  const std::string data = d.path + "/data";
  Model m = Model::create(test::tiny_rgb_config(), 4);
  TrainOptions o = quick(data, d.path + "/run", 3);
  std::vector<float> first;
  o.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Step) first.push_back(e.lr);
  };
  train(m, o);
  REQUIRE(first.size() == 6);
  // --resume --epochs 5: before, the cosine restarted over 5 epochs (the rate jumped back up)
  std::vector<float> more;
  std::string note;
  TrainOptions ext = quick(data, "", 3);
  ext.on_event = [&](const TrainEvent& e) {
    if (e.kind == TrainEvent::Kind::Step) more.push_back(e.lr);
    if (e.kind == TrainEvent::Kind::Message) note = e.message;
  };
  const std::string ckpt = d.path + "/run/checkpoint.safetensors";
  fs::copy_file(ckpt, d.file("finished.safetensors"));
  Model e1 = Model::create(test::tiny_rgb_config(), 1);
  const TrainResult r = train(e1, ext, ckpt, nullptr, 5);
  INFO(note);
  CHECK(note.find("the run goes on to 5 epochs (planned: 3); the learning rate follows a new cosine from") != std::string::npos);
  REQUIRE(more.size() == 4);
  CHECK(r.history.size() == 5);
  for (float lr : more) CHECK(lr <= first.back() + 1e-9f);
  // a rate given for the extension (relpos train --resume ... --epochs 5 --lr X) starts it there
  fs::create_directories(d.path + "/given");
  fs::copy_file(d.file("finished.safetensors"), d.path + "/given/checkpoint.safetensors");
  more.clear();
  ext.extend_lr = 0.01f;
  Model e2 = Model::create(test::tiny_rgb_config(), 1);
  train(e2, ext, d.path + "/given/checkpoint.safetensors", nullptr, 5);
  REQUIRE(more.size() == 4);
  CHECK(more.front() == doctest::Approx(0.01f));
  CHECK(more.back() < 0.01f);
  // the extension is in the checkpoint: an extended run stopped and resumed ends with the same weights
  fs::create_directories(d.path + "/split");
  fs::copy_file(d.file("finished.safetensors"), d.path + "/split/checkpoint.safetensors");
  TrainOptions stop_early = ext;
  stop_early.max_steps = 7;  // one step into the extension
  Model s1 = Model::create(test::tiny_rgb_config(), 1);
  train(s1, stop_early, d.path + "/split/checkpoint.safetensors", nullptr, 5);
  Model s2 = Model::create(test::tiny_rgb_config(), 1);
  train(s2, quick(data, "", 3), d.path + "/split/checkpoint.safetensors");  // no --epochs: as the checkpoint says
  CHECK(weights_of(s2) == weights_of(e2));
}

TEST_CASE("relpos train --resume refuses flags that would change the recipe, and takes --lr/--extend only with --epochs") {
  test::TempDir d;
  test::make_pattern_dataset(d.path + "/data", 8, 2);
  const std::string run = d.path + "/run";
  REQUIRE(test::run_cli("train -c " + test::tiny_rgb_config() + " --data " + d.path + "/data -b 8 --threads 1 --epochs 1 -q -o " + run)
              .status == 0);
  const std::string resume = "train --resume " + run + "/checkpoint.safetensors --threads 1 -q ";
  // before: silently ignored (the checkpoint's batch size was used)
  auto r = test::run_cli(resume + "-b 4");
  INFO(r.out);
  CHECK(r.status == 2);
  CHECK(r.out.find("--batch cannot change a resumed run") != std::string::npos);
  r = test::run_cli(resume + "--lr 0.01");
  CHECK(r.status == 2);
  CHECK(r.out.find("give it with --epochs N") != std::string::npos);
  r = test::run_cli(resume + "--epochs 2 --extend constant");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("the learning rate stays at") != std::string::npos);
}

TEST_CASE("gradient-norm clipping scales all gradients together to the given norm") {
  Tensor w = Tensor::zeros({2}), g = Tensor::from_vector({2}, {3.0f, 0.0f});
  Tensor w2 = Tensor::zeros({1}), g2 = Tensor::from_vector({1}, {4.0f});
  Tensor buffer = Tensor::zeros({1});
  const std::vector<ParamRef> params = {{"a", &w, &g, false}, {"b", &w2, &g2, false}, {"running", &buffer, nullptr, false}};
  CHECK(detail::clip_grad_norm(params, 10.0) == doctest::Approx(5.0));
  CHECK(g.to_vector() == std::vector<float>{3.0f, 0.0f});  // under the limit: untouched
  CHECK(detail::clip_grad_norm(params, 1.0) == doctest::Approx(5.0));
  CHECK(g.to_vector()[0] == doctest::Approx(0.6f));
  CHECK(g2.to_vector()[0] == doctest::Approx(0.8f));
  CHECK(detail::clip_grad_norm(params, 1.0) == doctest::Approx(1.0).epsilon(1e-5));
}
