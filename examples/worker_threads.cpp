// Several worker threads share one loaded model (classify() is const and thread-safe) and
// classify the images of a folder; each thread runs relpos with cores / workers OpenMP threads.
//   worker_threads MODEL FOLDER [WORKERS]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <opencv2/imgcodecs.hpp>
#include <string>
#include <thread>
#include <vector>

#include "relpos/error.hpp"
#include "relpos/model.hpp"
#include "relpos/ops.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL FOLDER [WORKERS]\n", argv[0]);
    return 2;
  }
  try {
    const relpos::Model model = relpos::Model::load(argv[1]);
    std::vector<std::string> files;
    for (const auto& e : std::filesystem::directory_iterator(argv[2]))
      if (e.is_regular_file()) files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    const int workers = argc > 3 ? std::max(1, std::atoi(argv[3])) : 2;
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    relpos::set_num_threads(std::max(1, cores / workers));  // no oversubscription
    std::vector<std::string> results(files.size());
    std::atomic<std::size_t> next{0};
    std::atomic<int> failed{0};
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (std::size_t i = next++; i < files.size(); i = next++) {
          const cv::Mat img = cv::imread(files[i], cv::IMREAD_UNCHANGED);
          if (img.empty()) {
            results[i] = "not a readable image";
            ++failed;
            continue;
          }
          const relpos::Prediction p = model.classify(img, 1).front();
          results[i] = p.label + " " + std::to_string(static_cast<int>(100.0f * p.probability + 0.5f)) + "%";
        }
      });
    for (auto& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < files.size(); ++i)
      std::printf("%s: %s\n", std::filesystem::path(files[i]).filename().c_str(), results[i].c_str());
    std::printf("%zu images, %d workers x %d threads, %.1f img/s\n", files.size(), workers, relpos::num_threads(),
                static_cast<double>(files.size()) / s);
    return failed ? 1 : 0;
  } catch (const relpos::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
