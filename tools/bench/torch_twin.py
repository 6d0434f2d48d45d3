"""The timm/PyTorch twin of a relpos model config: the same byobnet layout and tensor names, so a
relpos safetensors file loads into it strictly. Covers what timm can express: stems "tiered" and
"conv", blocks "bottle" and "self_attn" (BoTNet attention with relative positions, no clip, shared
tables). Used by the benchmark and parity scripts; not by relpos itself.
"""
import json

import timm  # noqa: F401  (registers the models)
from timm.layers import ConvNormAct
from timm.models.byobnet import ByoBlockCfg, ByoModelCfg, ByobNet


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
        if "sasa" in types:
            raise ValueError("timm has no SASA layer")
        kw = dict(c=st["chs"], s=st.get("stride", 1), br=st.get("br", 0.25), gs=st.get("group_size", 0))
        if len(set(types)) == 1:
            blocks.append(ByoBlockCfg(type=types[0], d=len(types), **kw))
        else:
            blocks.append(tuple(ByoBlockCfg(type=t, d=1, **kw) for t in types))
    stem = c["stem"]
    h, w = c["input_size"]
    pool = stem.get("pool", "maxpool")
    pool = "" if pool in ("", "none") else pool
    if stem.get("type", "tiered") == "tiered":
        stem_type, img_size = "tiered", (h, w)
    else:
        # timm's single-conv stems stride 2; build with one and swap in the relpos stem, sizing the
        # attention tables for the feature maps the swapped stem gives.
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
