// Internal: a training run's data checked for images it can read, before its first step.
#pragma once

#include <string>

#include "relpos/data.hpp"
#include "relpos/preprocess.hpp"

namespace relpos::detail {

// Throws relpos::Error naming `what` (the set: a folder, or a split of one) when the images of
// `data` cannot be read and preprocessed as the data loader would (`canvas` > 0: placed on a canvas
// first): with `every_class`, when some class has images but none of them can be; otherwise when
// none of the set's images can be. Stops at the first readable image of each class (or of the set),
// so a healthy set costs one image per class. Classes are tried in parallel (OpenMP).
void check_readable(const Dataset& data, const Preprocess& pre, int canvas, const std::string& what, bool every_class);

}  // namespace relpos::detail
