// Internal: image resizing that gives Pillow's pixels (PIL.Image.resize, reducing_gap None: what
// torchvision's Resize and so timm's eval transform run on a PIL image), bit for bit for 8-bit
// images. The convolution filters follow Pillow's separable scheme: the filter support widens with
// the scale factor when shrinking (antialiasing), weights are normalised per output pixel and, for
// 8-bit images, turned into 22-bit fixed point; the first pass's result is rounded and clipped to 8
// bits before the second. The horizontal pass runs first, except, as in Pillow 13, when the height
// shrinks by more than twice as many pixels as the width (Pillow 12 and older always go horizontal
// first, so such images can differ from theirs by a level or so). NEAREST is Pillow's scaling transform (source pixel at the floor of the accumulated
// centre coordinate).
#pragma once

#include "relpos/preprocess.hpp"

#include <opencv2/core.hpp>

namespace relpos {

using PilFilter = Interpolation;  // the public name of Pillow's filters

// Resizes src (CV_8UC1/3/4 or CV_32FC1/3/4; channels are filtered independently, as Pillow does for
// RGB and L images) to out_w x out_h as PIL.Image.resize((out_w, out_h), filter) would, computing
// only the output pixels inside `region` (a rectangle of the output, possibly all of it) and
// returning region.size() pixels equal to the full resize cropped to region. Work and memory are
// bounded by the region and the source rows and columns it reads, not by out_w x out_h. Float
// images use double weights and keep full precision between the passes (Pillow's mode "F").
cv::Mat pil_resize(const cv::Mat& src, int out_w, int out_h, PilFilter filter, cv::Rect region);

}  // namespace relpos
