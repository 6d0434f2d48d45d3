// relpos eval: top-1, per-class accuracy and the confusion matrix on a test set.
#include <iomanip>
#include <iostream>
#include <memory>

#include "cli_common.hpp"
#include "progress_bar.hpp"
#include "relpos/trainer.hpp"

namespace relpos::cli {

namespace {
struct EvalArgs {
  ModelOptions model;
  PreprocessOptions pre;
  std::string data = "fashion-mnist", split = "test", png, compare;
  int batch = 500;
  bool json = false, quiet = false;
};

void run(const EvalArgs& a) {
  Model model = a.model.load();
  a.pre.apply(model);
  // Class folders are matched to the model's labels by name (docs/datasets.md).
  const auto data = open_dataset(a.data, a.split, model.labels());
  ProgressBar bar("eval", a.quiet);
  const EvalResult r = evaluate(model, *data, a.batch, [&](std::size_t done, std::size_t total) { bar.update(done, total); });
  bar.finish();
  // --compare: the top-1 agreement with another model (an int8 model's float one) on the same images
  double agreement = -1.0;
  if (!a.compare.empty()) {
    ModelOptions other = a.model;
    other.model = a.compare;
    Model m2 = other.load();
    a.pre.apply(m2);
    ProgressBar bar2("eval " + a.compare, a.quiet);
    const EvalResult r2 =
        evaluate(m2, *data, a.batch, [&](std::size_t done, std::size_t total) { bar2.update(done, total); });
    bar2.finish();
    RELPOS_CHECK(r2.predictions.size() == r.predictions.size(),
                 "--compare: " << a.compare << " scored " << r2.predictions.size() << " images, the model "
                               << r.predictions.size());
    std::size_t same = 0;
    for (std::size_t i = 0; i < r.predictions.size(); ++i) same += r.predictions[i] == r2.predictions[i];
    agreement = static_cast<double>(same) / static_cast<double>(r.predictions.size());
  }
  if (a.json) {
    nlohmann::json j = {{"data", a.data}, {"split", a.split}, {"images", r.count}, {"top1", r.top1},
                        {"loss", r.loss}, {"classes", r.classes}, {"per_class", r.per_class},
                        {"confusion", r.confusion}, {"skipped", r.skipped}};
    if (agreement >= 0) j["agreement"] = {{"model", a.compare}, {"top1", agreement}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << std::fixed << std::setprecision(2) << a.data << " " << a.split << ": " << r.count << " images";
    if (r.skipped) std::cout << " (" << r.skipped << " unreadable, skipped)";
    std::cout << ", top-1 "
              << 100 * r.top1 << "%, loss " << std::setprecision(4) << r.loss << "\nper class:\n";
    for (std::size_t c = 0; c < r.classes.size(); ++c)
      std::cout << "  " << std::left << std::setw(16) << r.classes[c] << std::right << std::setprecision(2)
                << std::setw(7) << 100 * r.per_class[c] << "%\n";
    std::cout << format_confusion(r);
    if (agreement >= 0)
      std::cout << std::setprecision(2) << "top-1 agreement with " << a.compare << ": " << 100 * agreement << "% of "
                << r.count << " images\n";
  }
  if (!a.png.empty()) {
    plot_confusion(r, a.png);
    std::cerr << "relpos: wrote " << a.png << "\n";
  }
  // As classify: images that could not be read make the run a failure, after the results.
  if (r.skipped > 0) {
    std::cerr << "relpos: " << r.skipped << " image" << (r.skipped == 1 ? "" : "s") << " could not be read\n";
    exit_status() = kExitFailure;
  }
}
}  // namespace

void register_eval(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "Accuracy, per-class accuracy and confusion matrix on a test set");
  a->model.add(sub);
  sub->add_option("--data", a->data, "fashion-mnist, or a folder (with test/ or of class folders)")->capture_default_str();
  sub->add_option("--split", a->split, "test or train")->check(CLI::IsMember({"test", "train"}))->capture_default_str();
  sub->add_option("-b,--batch", a->batch, "Images per forward pass")
      ->check(at_least_one("--batch", "images per forward pass"))
      ->capture_default_str();
  sub->add_flag("-q,--quiet", a->quiet, "No progress bar");
  sub->add_option("--png", a->png, "Also draw the confusion matrix into this PNG file");
  sub->add_flag("--json", a->json, "Print one JSON object");
  sub->add_option("--compare", a->compare,
                  "Also score this model and print the top-1 agreement of the two (e.g. an int8 model and its float one)");
  a->pre.add(sub);
  sub->callback([a] { run(*a); });
}

}  // namespace relpos::cli
