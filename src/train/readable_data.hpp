// Internal: a training run's data checked for images it can read, before its first step.
#pragma once

#include <string>
#include <vector>

#include "relpos/data.hpp"
#include "relpos/preprocess.hpp"

namespace relpos::detail {

// Throws relpos::Error naming `what` (the set: a folder, or a split of one) when none of the images
// of `data` can be read and preprocessed as the data loader would (`canvas` > 0: placed on a canvas
// first). Stops at the first readable image, so a healthy set costs one image.
void check_some_readable(const Dataset& data, const Preprocess& pre, int canvas, const std::string& what);

// Per class of `data`: "" when some image of the class can be read and preprocessed (or the class
// has none here), else the first image's error. Only the classes c with c % shards == shard are
// tried (the processes of a data-parallel run share the work), the others get "". Stops at the
// first readable image of each class, so a healthy class costs one image; classes are tried in
// parallel (OpenMP).
std::vector<std::string> unreadable_classes(const Dataset& data, const Preprocess& pre, int canvas, int shard = 0,
                                            int shards = 1);

}  // namespace relpos::detail
