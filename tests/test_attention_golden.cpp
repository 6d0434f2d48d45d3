// The attention ops against the reference tensors of tests/golden (tools/make_goldens.py; math in
// docs/attention.md), and of ../shared/golden as a cross-check when present, composed from ops
// exactly as the layers compose them: qkv 1x1 conv -> attention -> 2x2 avg pool when the stride is 2.
#include "relpos/attention_ops.hpp"
#include "relpos/error.hpp"
#include "relpos/ops.hpp"
#include "test_util.hpp"

using namespace relpos;
using relpos::test::check_forward;
using relpos::test::check_grad;

namespace {

int meta_int(const SafetensorsFile& f, const std::string& key) { return std::stoi(f.metadata().at(key)); }

struct AttnCase {
  Tensor y;
  Tensor dx, dw, dpos_h, dpos_w;
};

AttnCase run_bot(const SafetensorsFile& f, const BotAttnSpec& spec, int stride) {
  const Tensor x = f.tensor("x");
  const Tensor w = f.tensor("qkv.weight");
  const Tensor rh = f.tensor("pos_embed.height_rel");
  const Tensor rw = f.tensor("pos_embed.width_rel");
  const Tensor qkv = ops::conv2d(x, w, nullptr, {});
  Tensor probs;
  Tensor att = ops::bot_attention(qkv, rh, rw, spec, &probs);
  const ops::PoolSpec pool{ops::PoolKind::Avg, 2, 2, 0};
  AttnCase c;
  c.y = stride == 2 ? ops::pool2d(att, pool) : att;
  Tensor dy = f.tensor("grad_y");
  Tensor datt = stride == 2 ? ops::pool2d_backward(att, dy, pool) : dy;
  auto g = ops::bot_attention_backward(qkv, rh, rw, spec, probs, datt);
  auto cg = ops::conv2d_backward(x, w, g.dqkv, {}, true);
  c.dx = cg.dx;
  c.dw = cg.dw;
  c.dpos_h = g.dpos_h;
  c.dpos_w = g.dpos_w;
  return c;
}

void check_bot_case(const SafetensorsFile& f, const std::string& name) {
  BotAttnSpec spec;
  spec.heads = meta_int(f, "num_heads");
  spec.dqk = meta_int(f, "dim_head_qk");
  spec.dv = meta_int(f, "dim_head_v");
  const int stride = meta_int(f, "stride");
  AttnCase c = run_bot(f, spec, stride);
  check_forward(c.y, f.tensor("y"), name + " y");
  check_grad(c.dx, f.tensor("grad_x"), name + " grad_x");
  check_grad(c.dw, f.tensor("grad.qkv.weight"), name + " grad.qkv.weight");
  check_grad(c.dpos_h, f.tensor("grad.pos_embed.height_rel"), name + " grad.height_rel");
  check_grad(c.dpos_w, f.tensor("grad.pos_embed.width_rel"), name + " grad.width_rel");
}

void check_sasa_case(const SafetensorsFile& f, const std::string& name) {
  SasaSpec spec;
  spec.heads = meta_int(f, "heads");
  spec.dqk = meta_int(f, "dim_head_qk");
  spec.dv = meta_int(f, "dim_head_v");
  spec.kernel = meta_int(f, "kernel");
  const int stride = meta_int(f, "stride");
  const Tensor x = f.tensor("x"), w = f.tensor("qkv.weight");
  const Tensor rr = f.tensor("r_row"), rc = f.tensor("r_col");
  const Tensor qkv = ops::conv2d(x, w, nullptr, {});
  Tensor probs;
  Tensor att = ops::sasa_attention(qkv, rr, rc, spec, &probs);
  const ops::PoolSpec pool{ops::PoolKind::Avg, 2, 2, 0};
  Tensor y = stride == 2 ? ops::pool2d(att, pool) : att;
  check_forward(y, f.tensor("y"), name + " y");
  Tensor dy = f.tensor("grad_y");
  Tensor datt = stride == 2 ? ops::pool2d_backward(att, dy, pool) : dy;
  auto g = ops::sasa_attention_backward(qkv, rr, rc, spec, probs, datt);
  auto cg = ops::conv2d_backward(x, w, g.dqkv, {}, true);
  check_grad(cg.dx, f.tensor("grad_x"), name + " grad_x");
  check_grad(cg.dw, f.tensor("grad.qkv.weight"), name + " grad.qkv.weight");
  check_grad(g.dr_row, f.tensor("grad.r_row"), name + " grad.r_row");
  check_grad(g.dr_col, f.tensor("grad.r_col"), name + " grad.r_col");
}

}  // namespace

TEST_CASE("rel_logits_h5w7: q.Rh and q.Rw expanded over the key grid match timm's PosEmbedRel") {
  test::for_each_golden("rel_logits_h5w7", [](const SafetensorsFile& f, const std::string& label) {
    const int H = meta_int(f, "H"), W = meta_int(f, "W");
    Tensor got = ops::rel_pos_logits(f.tensor("q"), f.tensor("height_rel"), f.tensor("width_rel"), H, W);
    check_forward(got, f.tensor("rel_logits"), label + " rel_logits");
  });
}

TEST_CASE("bot_attn_s1_h6w8: BoTNet attention forward and backward match timm") {
  test::for_each_golden("bot_attn_s1_h6w8", [](const SafetensorsFile& f, const std::string& label) {
    check_bot_case(f, label + " bot_attn_s1_h6w8");
  });
}
TEST_CASE("bot_attn_s2_h8w6: stride 2 (attention then 2x2 average pool) matches timm") {
  test::for_each_golden("bot_attn_s2_h8w6", [](const SafetensorsFile& f, const std::string& label) {
    check_bot_case(f, label + " bot_attn_s2_h8w6");
  });
}
TEST_CASE("sasa_k7_s1_h9w11: local attention with masked borders matches the reference") {
  test::for_each_golden("sasa_k7_s1_h9w11", [](const SafetensorsFile& f, const std::string& label) {
    check_sasa_case(f, label + " sasa_k7_s1_h9w11");
  });
}
TEST_CASE("sasa_k3_s2_h8w6: local attention with stride 2 matches the reference") {
  test::for_each_golden("sasa_k3_s2_h8w6", [](const SafetensorsFile& f, const std::string& label) {
    check_sasa_case(f, label + " sasa_k3_s2_h8w6");
  });
}

TEST_CASE("a fixed-size attention layer rejects a map of another size with a clear message") {
  auto f = test::golden("bot_attn_s1_h6w8");
  BotAttnSpec spec;
  spec.heads = 4, spec.dqk = 8, spec.dv = 8;
  const Tensor qkv = Tensor::zeros({1, 96, 7, 8}, Device::CPU, Layout::ChannelsLast);
  CHECK_THROWS_WITH_AS(ops::bot_attention(qkv, f.tensor("pos_embed.height_rel"), f.tensor("pos_embed.width_rel"), spec),
                       doctest::Contains("fit a 6x8 feature map, but the map is 7x8"), Error);
}
