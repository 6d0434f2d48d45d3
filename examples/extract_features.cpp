// Writes the per-stage feature maps of every image in a folder to one safetensors file: tensor
// "stage<i>" is (N, C, h, w) for the N images (stage0 is the stem), in the order of the file names
// listed in the metadata key "images".
//   extract_features MODEL FOLDER OUT.safetensors
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <vector>

#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/safetensors.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s MODEL FOLDER OUT.safetensors\n", argv[0]);
    return 2;
  }
  try {
    const relpos::Model model = relpos::Model::load(argv[1]);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(argv[2]))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::vector<std::string> names;
    std::vector<std::vector<float>> stages;  // per stage, all images' values
    std::vector<relpos::Shape> shapes;
    const std::size_t batch = 16;
    for (std::size_t at = 0; at < files.size(); at += batch) {
      std::vector<cv::Mat> imgs;
      for (std::size_t i = at; i < std::min(files.size(), at + batch); ++i) {
        cv::Mat img = cv::imread(files[i], cv::IMREAD_UNCHANGED);
        if (img.empty()) {
          std::fprintf(stderr, "skipped %s: not a readable image\n", files[i].c_str());
          continue;
        }
        imgs.push_back(img);
        names.push_back(std::filesystem::path(files[i]).filename().string());
      }
      if (imgs.empty()) continue;
      const std::vector<relpos::Tensor> maps = model.features(imgs);  // one pass for the batch
      stages.resize(maps.size());
      shapes.resize(maps.size());
      for (std::size_t s = 0; s < maps.size(); ++s) {
        const std::vector<float> v = maps[s].to_vector();
        stages[s].insert(stages[s].end(), v.begin(), v.end());
        shapes[s] = maps[s].shape();
      }
    }
    if (names.empty()) {
      std::fprintf(stderr, "no images in %s\n", argv[2]);
      return 1;
    }
    std::vector<std::pair<std::string, relpos::Tensor>> out;
    std::string list = "[";
    for (std::size_t i = 0; i < names.size(); ++i) list += (i ? ",\"" : "\"") + names[i] + "\"";
    list += "]";
    for (std::size_t s = 0; s < stages.size(); ++s) {
      relpos::Shape shape = shapes[s];
      shape[0] = static_cast<std::int64_t>(names.size());
      out.emplace_back("stage" + std::to_string(s), relpos::Tensor::from_vector(shape, stages[s]));
      std::printf("stage%zu: %s\n", s, relpos::to_string(shape).c_str());
    }
    relpos::write_safetensors(argv[3], out, {{"images", list}});
    std::printf("wrote %s (%zu images)\n", argv[3], names.size());
    return 0;
  } catch (const relpos::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
