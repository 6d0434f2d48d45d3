// The relpos command line: the pictures of `relpos explain` (docs/explain.md), drawn from what
// relpos/attention_maps.hpp computes.
#pragma once

#include <opencv2/core.hpp>
#include <string>
#include <vector>

#include "heatmap_drawing.hpp"
#include "relpos/attention_maps.hpp"

namespace relpos::cli {

// Each head's attention for one query over the input image (BGR, 8-bit, as the network saw it), one
// panel per head with one colour scale and a colour bar, beside a panel with the map's cells and
// their row and column offsets from the query.
void draw_attention_picture(const AttentionMaps& m, const QueryTerms& t, const AttentionDistance& dist,
                            const cv::Mat& image_bgr, const std::vector<int>& heads, const std::string& title,
                            const std::string& path);

// One row per head: the content term s q.k, the position term and their sum (the logit) over the
// query's keys, on one colour scale per head.
void draw_terms_picture(const AttentionMaps& m, const QueryTerms& t, const std::vector<int>& heads,
                        const std::string& title, const std::string& path);

// The learned position tables: the cosine similarity between every pair of row offsets and of column
// offsets (relative and local tables, the clipped end rows marked), or between every pair of absolute
// positions; a note for a layer without tables.
void draw_tables_picture(const AttentionMaps& m, const std::string& title, const std::string& path);

// The mean attention distance of each head of each layer, in input pixels, with the uniform-attention
// reference per layer.
void draw_distance_chart(const std::vector<AttentionMaps>& layers, const std::vector<AttentionDistance>& dists,
                         const std::string& title, const std::string& path);

// A query's tensor of one head (probs, content or position) as a grid over the keys: the h x w map
// (Global) or the k x k window (Local, keys outside the map invalid).
Grid key_grid(const AttentionMaps& m, const QueryTerms& t, const Tensor& values, int head);

// How a layer's position encoding reads in titles and the JSON: "relative", "relative, clip 2",
// "absolute", "none", "relative (k x k window)".
std::string position_text(const AttentionMaps& m);

}  // namespace relpos::cli
