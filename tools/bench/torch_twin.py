"""The timm/PyTorch twin of a relpos model config: the same byobnet layout and tensor names, so a
relpos safetensors file loads into it strictly. Covers what timm can express: stems "tiered" and
"conv", blocks "bottle", "self_attn" (BoTNet attention with relative positions, no clip, shared
tables) and "sasa" (SasaAttn below: timm has no SASA layer, so the twin brings its own, with relpos's
tensor names). Used by the benchmark and parity scripts; not by relpos itself.
"""
import json

import torch
import torch.nn.functional as F
import timm  # noqa: F401  (registers the models)
from torch import nn
from timm.layers import ConvNormAct, make_divisible
from timm.models.byobnet import ByoBlockCfg, ByoModelCfg, ByobNet


class SasaAttn(nn.Module):
    """Stand-alone local self-attention as relpos computes it (docs/attention.md, "SASA local
    attention"): a 1x1 qkv projection, each pixel attends over the kernel x kernel window centred on
    it with keys outside the image masked out of the softmax, logits
    s * q.k + q[:dqk/2].r_row[dy] + q[dqk/2:].r_col[dx] with tables shared by the heads; stride 2
    average-pools the result 2x2. Windows come from F.unfold (zero padding, then masked), so the
    layer exports to ONNX. Tensors: qkv.weight, r_row, r_col (relpos's names)."""

    def __init__(self, dim, dim_out=None, stride=1, num_heads=8, kernel_size=7, qk_ratio=1.0, feat_size=None):
        super().__init__()
        dim_out = dim_out or dim
        assert dim_out % num_heads == 0 and kernel_size % 2 == 1
        self.heads, self.kernel = num_heads, kernel_size
        self.dqk = make_divisible(dim_out * qk_ratio, divisor=8) // num_heads
        self.dv = dim_out // num_heads
        assert self.dqk % 2 == 0, "SASA needs an even dqk"
        self.scale = self.dqk ** -0.5
        self.qkv = nn.Conv2d(dim, num_heads * (2 * self.dqk + self.dv), 1, bias=False)
        self.r_row = nn.Parameter(torch.zeros(kernel_size, self.dqk // 2))
        self.r_col = nn.Parameter(torch.zeros(kernel_size, self.dqk // 2))
        self.pool = nn.AvgPool2d(2, 2) if stride == 2 else nn.Identity()
        self._masks = {}
        nn.init.trunc_normal_(self.qkv.weight, std=dim ** -0.5)
        nn.init.trunc_normal_(self.r_row, std=self.scale)
        nn.init.trunc_normal_(self.r_col, std=self.scale)

    def _mask(self, H, W, x):
        """(k*k, H*W): 0 where the window entry lies inside the image, -inf outside (a constant)."""
        key = (H, W, x.dtype, x.device)
        if key not in self._masks:
            with torch.no_grad():
                inside = F.unfold(torch.ones(1, 1, H, W, dtype=x.dtype, device=x.device), self.kernel,
                                  padding=self.kernel // 2)[0]
                self._masks[key] = torch.zeros_like(inside).masked_fill(inside == 0, float("-inf"))
        return self._masks[key]

    def forward(self, x):
        B, _, H, W = x.shape
        h, dqk, dv, k, N = self.heads, self.dqk, self.dv, self.kernel, x.shape[2] * x.shape[3]
        q, kx, v = torch.split(self.qkv(x), [h * dqk, h * dqk, h * dv], dim=1)
        kw = F.unfold(kx, k, padding=k // 2).reshape(B, h, dqk, k * k, N)  # window keys, zero outside
        vw = F.unfold(v, k, padding=k // 2).reshape(B, h, dv, k * k, N)
        q = q.reshape(B, h, dqk, N)
        logits = (q.unsqueeze(3) * kw).sum(2) * self.scale  # (B, h, k*k, N)
        half = dqk // 2
        # window entry a*k + b is the key at (y + a - k//2, x + b - k//2): r_row[a], r_col[b]
        pr = torch.matmul(self.r_row, q[:, :, :half])  # (B, h, k, N)
        pc = torch.matmul(self.r_col, q[:, :, half:])
        logits = logits + (pr.unsqueeze(3) + pc.unsqueeze(2)).reshape(B, h, k * k, N) + self._mask(H, W, x)
        attn = logits.softmax(dim=2)
        out = (attn.unsqueeze(2) * vw).sum(3).reshape(B, h * dv, H, W)
        return self.pool(out)


def block_cfg(t, model_cfg, st, **kw):
    """A ByoBlockCfg for a relpos block type (of config `model_cfg`, stage `st`); "sasa" is timm's self_attn
    block with SasaAttn as its attention layer (the stage's sasa options over the model's)."""
    if t != "sasa":
        return ByoBlockCfg(type=t, **kw)
    s = {**model_cfg.get("sasa", {}), **st.get("sasa", {})}
    return ByoBlockCfg(type="self_attn", self_attn_layer=SasaAttn,
                       self_attn_kwargs=dict(num_heads=s.get("heads", 8), kernel_size=s.get("kernel", 7),
                                             qk_ratio=s.get("qk_ratio", 1.0)), **kw)


def load_config(path):
    with open(path) as f:
        j = json.load(f)
    if "tensors" in j and "config" in j:  # a relpos weights file
        j = j["config"]
    return j


def build(cfg_json):
    """A ByobNet matching a relpos config (dict), in eval mode."""
    c = cfg_json
    attn = c.get("self_attn", {})
    if attn.get("pos", "relative") != "relative" or attn.get("clip", 0) or attn.get("per_head", False):
        raise ValueError("timm's BottleneckAttn has only unclipped, shared relative tables")
    blocks = []
    for st in c["stages"]:
        types = st.get("types") or [st["type"]] * st.get("depth", 1)
        kw = dict(c=st["chs"], s=st.get("stride", 1), br=st.get("br", 0.25), gs=st.get("group_size", 0))
        if len(set(types)) == 1:
            blocks.append(block_cfg(types[0], c, st, d=len(types), **kw))
        else:
            blocks.append(tuple(block_cfg(t, c, st, d=1, **kw) for t in types))
    stem = c["stem"]
    h, w = c["input_size"]
    pool = stem.get("pool", "maxpool")
    if stem.get("type", "tiered") == "tiered":
        # timm's tiered stem strides 4 in all: conv1 and its pool, or conv1 and conv3 without one
        if pool in ("", "none"):
            raise ValueError("timm's tiered stem without a pool strides conv3 (relpos: \"pool\": \"conv3\")")
        pool = "" if pool == "conv3" else pool
        stem_type, img_size = "tiered", (h, w)
    else:
        # timm's single-conv stems stride 2; build with one and swap in the relpos stem, sizing the
        # attention tables for the feature maps the swapped stem gives.
        pool = "" if pool in ("", "none") else pool
        stem_type = ""
        s = stem.get("stride", 2)
        img_size = (h * 2 // s, w * 2 // s)
        if pool:
            raise ValueError("conv stem with a pool is not mapped")
    mcfg = ByoModelCfg(blocks=tuple(blocks), stem_chs=stem["chs"], stem_type=stem_type, stem_pool=pool,
                       fixed_input_size=True, act_layer=c.get("act", "relu"), self_attn_layer="bottleneck",
                       self_attn_kwargs=dict(num_heads=attn.get("heads", 4), qk_ratio=attn.get("qk_ratio", 1.0),
                                             scale_pos_embed=attn.get("scale_pos_embed", False)))
    model = ByobNet(mcfg, in_chans=c.get("in_chans", 3), num_classes=c["num_classes"], img_size=img_size)
    if stem_type == "":
        model.stem = ConvNormAct(c.get("in_chans", 3), stem["chs"], stem.get("kernel", 3), stride=stem.get("stride", 2),
                                 act_layer=c.get("act", "relu"))
    return model.eval()
