// Classifies every frame of a video, a camera or an image sequence and prints the top-1 class
// with the time it took.
//   classify_video MODEL SOURCE [MAX_FRAMES]
//   SOURCE: a video file, a camera index (0), or an image sequence such as frames/f_%02d.png
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <opencv2/videoio.hpp>
#include <string>

#include "relpos/error.hpp"
#include "relpos/model.hpp"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL SOURCE [MAX_FRAMES]\n", argv[0]);
    return 2;
  }
  try {
    const relpos::Model model = relpos::Model::load(argv[1]);
    const std::string source = argv[2];
    const long max_frames = argc > 3 ? std::atol(argv[3]) : -1;
    cv::VideoCapture cap;
    const bool camera = source.find_first_not_of("0123456789") == std::string::npos;
    if (camera) cap.open(std::atoi(source.c_str()));
    else cap.open(source);
    if (!cap.isOpened()) {
      std::fprintf(stderr, "cannot open %s\n", source.c_str());
      return 1;
    }
    cv::Mat frame;
    long n = 0;
    double total_ms = 0.0;
    while ((max_frames < 0 || n < max_frames) && cap.read(frame) && !frame.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      const relpos::Prediction top = model.classify(frame, 1).front();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      total_ms += ms;
      std::printf("frame %ld: %s %.1f%% (%.2f ms)\n", n, top.label.c_str(), 100.0 * top.probability, ms);
      ++n;
    }
    if (n > 0) std::printf("%ld frames, %.2f ms per frame\n", n, total_ms / static_cast<double>(n));
    return n > 0 ? 0 : 1;
  } catch (const relpos::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
