// Fine-tuning: a model made to fit a dataset's classes (labels, and a new classifier when needed).
#include <algorithm>
#include <iomanip>
#include <sstream>

#include "core/name_list.hpp"
#include "relpos/error.hpp"
#include "relpos/trainer.hpp"

namespace relpos {

namespace {

// The model's labels name exactly the data's class folders (in any order)?
bool labels_name_folders(const std::vector<std::string>& labels, const std::vector<std::string>& folders) {
  if (labels.size() != folders.size()) return false;
  std::vector<std::string> a, b = folders;
  for (const auto& l : labels) a.push_back(label_folder_name(l));
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  // a folder may also carry the label itself (labels without '/')
  return a == b || std::is_permutation(labels.begin(), labels.end(), folders.begin());
}

}  // namespace

std::string fit_to_data(Model& model, const std::vector<std::string>& data_classes, std::uint32_t seed) {
  RELPOS_CHECK(!data_classes.empty(), "the data has no classes");
  const ModelConfig& config = model.network().config();
  const int n = static_cast<int>(data_classes.size());
  if (!model.labels().empty() && labels_name_folders(model.labels(), data_classes)) return "";
  if (model.labels().empty() && config.num_classes == n) {
    model.set_labels(data_classes);
    return "";
  }
  // A new classifier: every tensor whose name and shape the new network shares is kept. When each
  // of the data's classes is one of the model's labels, the classifier's rows for those labels are
  // kept too (the model already knows the classes; only the others are dropped).
  const Device device = model.device();
  model.to(Device::CPU);
  ModelConfig fitted = config;
  fitted.num_classes = n;
  Network net(fitted, seed);
  std::vector<int> row_of(data_classes.size(), -1);
  bool all_known = !model.labels().empty();
  for (std::size_t c = 0; c < data_classes.size() && all_known; ++c) {
    for (std::size_t l = 0; l < model.labels().size() && row_of[c] < 0; ++l)
      if (data_classes[c] == model.labels()[l] || data_classes[c] == label_folder_name(model.labels()[l]))
        row_of[c] = static_cast<int>(l);
    all_known = row_of[c] >= 0;
  }
  std::vector<std::string> fresh, rows;
  for (const ParamRef& p : net.params()) {
    const ParamRef* old = model.network().find(p.name);
    const Shape& want = p.value->shape();
    if (old && old->value->shape() == want) {
      p.value->copy_from(*old->value);
      continue;
    }
    const bool per_class = old && !want.empty() && want[0] == n && old->value->shape()[0] == config.num_classes &&
                           Shape(old->value->shape().begin() + 1, old->value->shape().end()) == Shape(want.begin() + 1, want.end());
    if (!(all_known && per_class)) {
      fresh.push_back(p.name);
      continue;
    }
    const std::vector<float> from = old->value->to_vector();  // logical order: class rows first
    const std::size_t row = from.size() / static_cast<std::size_t>(config.num_classes);
    std::vector<float> to;
    for (int r : row_of) to.insert(to.end(), from.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(r)),
                                   from.begin() + static_cast<std::ptrdiff_t>(row * static_cast<std::size_t>(r + 1)));
    p.value->copy_from(Tensor::from_vector(want, to));
    rows.push_back(p.name);
  }
  std::ostringstream what;
  if (model.labels().empty())
    what << "the model has " << config.num_classes << " outputs but the data " << n << " classes (" << detail::listed_names(data_classes)
         << "): a new classifier for " << n << " classes";
  else
    what << "the model's " << model.labels().size() << " classes (" << detail::listed_names(model.labels()) << ") are not the data's " << n
         << " (" << detail::listed_names(data_classes) << "): a new classifier";
  if (!fresh.empty()) what << " (" << detail::listed_names(fresh) << " start from random weights)";
  if (!rows.empty()) what << " (" << detail::listed_names(rows) << " keep the rows of the data's classes)";
  std::vector<std::string> labels = data_classes;  // a known class keeps the model's spelling of it
  if (all_known)
    for (std::size_t c = 0; c < labels.size(); ++c) labels[c] = model.labels()[static_cast<std::size_t>(row_of[c])];
  model = Model(std::move(net), std::move(labels), model.preprocess());
  model.to(device);
  // the run's first line counted the old classifier's parameters
  what << "; " << std::fixed << std::setprecision(2) << static_cast<double>(model.network().num_params()) / 1e6
       << " M parameters now";
  return what.str();
}

}  // namespace relpos
