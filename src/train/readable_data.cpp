#include "train/readable_data.hpp"

#include <omp.h>

#include <exception>
#include <vector>

#include "relpos/error.hpp"

namespace relpos::detail {

namespace {

// Whether sample i reads and preprocesses; `reason` gets the error of the first that does not.
bool readable(const Dataset& data, const Preprocess& pre, int canvas, std::size_t i, std::string& reason) {
  try {
    const cv::Mat img = data.image(i);
    (void)make_batch({canvas > 0 ? place_on_canvas(img, canvas, 0) : img}, pre);
    return true;
  } catch (const std::exception& e) {
    if (reason.empty()) reason = naming(data.name(i), e.what());
    return false;
  }
}

}  // namespace

void check_some_readable(const Dataset& data, const Preprocess& pre, int canvas, const std::string& what) {
  std::string reason;
  for (std::size_t i = 0; i < data.size(); ++i)
    if (readable(data, pre, canvas, i, reason)) return;
  RELPOS_CHECK(data.size() > 0, what << ": no images");
  RELPOS_FAIL(what << ": none of its " << data.size() << " images can be read (the first: " << reason << ")");
}

std::vector<std::string> unreadable_classes(const Dataset& data, const Preprocess& pre, int canvas, int shard,
                                            int shards) {
  const std::size_t classes = data.classes().size();
  std::vector<std::vector<std::size_t>> of(classes);
  for (std::size_t i = 0; i < data.size(); ++i) of.at(static_cast<std::size_t>(data.label(i))).push_back(i);
  std::vector<std::string> failed(classes);  // per class: the first image's error when none is readable
#pragma omp parallel for schedule(dynamic, 1)
  for (std::size_t c = 0; c < classes; ++c) {
    if (of[c].empty() || static_cast<int>(c % static_cast<std::size_t>(shards)) != shard) continue;
    std::string reason;
    bool any = false;
    for (const std::size_t i : of[c])
      if ((any = readable(data, pre, canvas, i, reason))) break;
    if (!any) failed[c] = reason;
  }
  return failed;
}

}  // namespace relpos::detail
