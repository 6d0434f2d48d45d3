// The image files under a folder: the walk that `classify`/`quantize` take over folders given on the
// command line and that image-folder datasets take over each class folder.
#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "relpos/error.hpp"
#include "relpos/preprocess.hpp"

namespace relpos {

namespace fs = std::filesystem;

namespace {

struct Walk {
  std::vector<std::string> images;
  std::vector<std::pair<std::string, std::string>> problems;
  std::set<std::string> seen;  // folders walked, by their path with every link resolved

  void folder(const fs::path& dir) {
    std::error_code ec;
    const fs::path real = fs::canonical(dir, ec);
    if (ec) {
      problems.emplace_back(dir.string(), "cannot open folder: " + ec.message());
      return;
    }
    if (!seen.insert(real.string()).second) return;  // reached again through a link: walked once
    fs::directory_iterator it(dir, ec);
    if (ec) {
      problems.emplace_back(dir.string(), "cannot read folder: " + ec.message());
      return;
    }
    std::vector<fs::path> subfolders;
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      const fs::path p = it->path();
      // hidden entries (.ipynb_checkpoints/, macOS's ._name.png, .git/) are not the user's images
      if (p.filename().string().rfind('.', 0) == 0) continue;
      std::error_code se;
      const fs::file_status st = fs::status(p, se);  // through links
      const bool image_name = has_image_extension(p.string());
      if (fs::is_directory(st)) {
        subfolders.push_back(p);
      } else if (image_name && fs::is_regular_file(st)) {
        images.push_back(p.string());
      } else if (st.type() == fs::file_type::not_found) {
        // Only a link can be listed and not be there. Whatever its name, it may have led to images (a
        // folder on a disk not mounted, "photos.2019", a moved folder): left out, they would go unsaid.
        std::error_code le;
        const fs::path target = fs::read_symlink(p, le);
        problems.emplace_back(p.string(), le ? std::string("it is gone (removed while the folder was listed)")
                                             : "broken symbolic link: its target '" + target.string() +
                                                   "' does not exist");
      } else if (se) {
        // a link loop, a path longer than the system takes, a folder on the way that cannot be
        // searched: whatever it is (a folder of images, an image), it cannot be read
        problems.emplace_back(p.string(), "cannot open it: " + se.message());
      }
      // a FIFO, socket or device named like an image is not an image file: left out
    }
    if (ec) problems.emplace_back(dir.string(), "cannot read folder: " + ec.message());
    for (const fs::path& s : subfolders) folder(s);
  }
};

}  // namespace

std::vector<std::string> find_images(const std::string& folder,
                                     std::vector<std::pair<std::string, std::string>>* problems) {
  Walk w;
  w.folder(folder);
  std::sort(w.images.begin(), w.images.end());
  if (problems) {
    problems->insert(problems->end(), w.problems.begin(), w.problems.end());
  } else if (!w.problems.empty()) {
    const auto& [path, why] = w.problems.front();
    RELPOS_CHECK(false, path << ": " << why
                             << (w.problems.size() > 1
                                     ? " (and " + std::to_string(w.problems.size() - 1) + " more such files under " +
                                           folder + ")"
                                     : std::string()));
  }
  return w.images;
}

}  // namespace relpos
