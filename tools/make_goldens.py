"""Regenerates relpos's own golden tensors, tests/golden/*.safetensors, that the test suite compares
the library against (docs/attention.md gives the math; tests/test_*_golden.cpp read the files).

    .venv-bench/bin/python tools/make_goldens.py [--out tests/golden] [--check]

Run it with PyTorch 1.13 and timm 0.9.16 (tools/bench/python_env.sh makes such an environment). Each
case has a fixed seed and headers are written in sorted order, so a rerun on the same torch build writes
the same bytes. The cases:

- rel_logits_h5w7:   timm's PosEmbedRel on a random q: q (B*heads, H*W, d), tables, rel_logits.
- bot_attn_s1_h6w8, bot_attn_s2_h8w6: one timm BottleneckAttn, forward and backward:
  x, y, grad_y, grad_x, its parameters and grad.<param>.
- sasa_k7_s1_h9w11, sasa_k3_s2_h8w6: one SASA local attention layer, from the direct PyTorch
  implementation below (sasa_forward), itself checked against plain loops on a tiny case first.
- tiny_botnet_96x64: timm's ByobNet built from models/tiny_botnet_96x64.json (tools/bench/torch_twin.py)
  with randomised weights and BatchNorm statistics: param.* (timm names, running statistics *before*
  the training step), input, logits_eval, then one training step: labels, logits_train, loss,
  grad.<param> and after_train_step.<running stat>.
- tiny_stem4_32x32: the same for tests/data/tiny_stem4_config.json, whose tiered stem has no pool and
  strides conv3 instead ("pool": "conv3"; timm's stem_pool='', as in resnet32ts): param.*, input,
  logits_eval.

To keep the files small, the tiny model's parameters and input are drawn, then rounded to float16 values
and stored as F16 (lossless: the model computes with exactly those values in float32); every result,
gradients included, is float32 (see TINY_GRAD_DTYPE). Integers are stored as F32.
"""
import argparse
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import timm
from timm.layers.bottleneck_attn import BottleneckAttn, PosEmbedRel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import torch_twin  # noqa: E402

TINY_GRAD_DTYPE = torch.float32  # float16 would save 330 kB but its rounding (2^-11) takes half the 1e-3 gradient tolerance


def common_meta(seed, what):
    return {"what": what, "seed": str(seed), "generator": "tools/make_goldens.py",
            "torch": torch.__version__, "timm": timm.__version__}


DTYPES = {torch.float32: "F32", torch.float16: "F16"}


def save(out_dir, name, tensors, meta):
    """Writes a safetensors file with its header in sorted order, so that a rerun gives the same bytes
    (the safetensors package orders __metadata__ differently on every run)."""
    header, blobs, offset = {"__metadata__": meta}, [], 0
    for k in sorted(tensors):
        t = tensors[k].detach().contiguous().cpu()
        data = t.numpy().tobytes()  # little-endian on every machine torch runs on here
        header[k] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = os.path.join(out_dir, name + ".safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    check = load_file(path)
    assert all(torch.equal(check[k], tensors[k].detach().cpu()) for k in tensors), path
    print(f"{path}: {len(tensors)} tensors, {os.path.getsize(path)} bytes")


# ---- rel_logits -----------------------------------------------------------------------------------

def make_rel_logits(out_dir, seed=101, B=2, heads=4, H=5, W=7, d=16):
    g = torch.Generator().manual_seed(seed)
    pe = PosEmbedRel((H, W), dim_head=d, scale=1.0)
    with torch.no_grad():
        pe.height_rel.copy_(torch.randn(2 * H - 1, d, generator=g))
        pe.width_rel.copy_(torch.randn(2 * W - 1, d, generator=g))
    q = torch.randn(B * heads, H * W, d, generator=g)
    with torch.no_grad():
        rel = pe(q)
    # Cross-check the index convention against the formula itself.
    yq = torch.arange(H * W) // W
    xq = torch.arange(H * W) % W
    dy = (yq[None, :] - yq[:, None]) + H - 1  # [query, key] -> row of height_rel
    dx = (xq[None, :] - xq[:, None]) + W - 1
    direct = (q @ pe.height_rel.T)[:, torch.arange(H * W)[:, None], dy] + (q @ pe.width_rel.T)[:, torch.arange(H * W)[:, None], dx]
    assert torch.allclose(direct, rel, atol=1e-5), "PosEmbedRel disagrees with the documented index rule"
    meta = common_meta(seed, "rel_logits = PosEmbedRel(q): (B*heads, H*W, H*W)")
    meta.update({"H": str(H), "W": str(W), "dim_head": str(d),
                 "index": "rel[(hq,wq),(hk,wk)] = q.height_rel[hk-hq+H-1] + q.width_rel[wk-wq+W-1]"})
    save(out_dir, "rel_logits_h5w7", {"q": q, "height_rel": pe.height_rel, "width_rel": pe.width_rel,
                                      "rel_logits": rel}, meta)


# ---- BoTNet attention ------------------------------------------------------------------------------

def make_bot_attn(out_dir, name, seed, dim, dim_out, feat, stride, B=2, heads=4):
    torch.manual_seed(seed)  # timm's own initialisation draws from the global generator
    layer = BottleneckAttn(dim, dim_out, feat_size=feat, stride=stride, num_heads=heads)
    x = torch.randn(B, dim, *feat, requires_grad=True)
    y = layer(x)
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    tensors = {"x": x, "y": y, "grad_y": grad_y, "grad_x": x.grad}
    for n, p in layer.named_parameters():
        tensors[n] = p
        tensors["grad." + n] = p.grad
    meta = common_meta(seed, "BottleneckAttn forward and backward")
    meta.update({"dim": str(dim), "dim_out": str(dim_out), "num_heads": str(heads),
                 "dim_head_qk": str(layer.dim_head_qk), "dim_head_v": str(layer.dim_head_v),
                 "stride": str(stride), "feat_size": json.dumps(list(feat))})
    save(out_dir, name, tensors, meta)


# ---- SASA local attention --------------------------------------------------------------------------

def sasa_forward(x, w, r_row, r_col, heads, dqk, dv, kernel, stride):
    """Stand-alone local attention (docs/attention.md): qkv 1x1 conv, each pixel attends over the
    kernel x kernel window centred on it, keys outside the image masked out of the softmax; stride 2
    pools the result 2x2/2."""
    B, _, H, W = x.shape
    qkv = F.conv2d(x, w)
    q, k, v = torch.split(qkv, [heads * dqk, heads * dqk, heads * dv], dim=1)
    q = q.reshape(B, heads, dqk, H, W)
    pad = kernel // 2

    def windows(t, d):  # (B, heads*d, H, W) -> (B, heads, d, kernel*kernel, H, W), zero outside
        u = F.unfold(t, kernel, padding=pad)  # (B, heads*d*kk, H*W)
        return u.reshape(B, heads, d, kernel * kernel, H, W)

    kw = windows(k, dqk)
    vw = windows(v, dv)
    inside = F.unfold(torch.ones(1, 1, H, W, dtype=x.dtype), kernel, padding=pad).reshape(kernel * kernel, H, W) > 0
    logits = (q.unsqueeze(3) * kw).sum(2) * dqk ** -0.5  # (B, heads, kk, H, W)
    half = dqk // 2
    # window position a*kernel + b is the key at (y + a - pad, x + b - pad): r_row[a], r_col[b]
    pr = torch.einsum("bhcyx,ac->bhayx", q[:, :, :half], r_row)  # (B, heads, kernel, H, W)
    pc = torch.einsum("bhcyx,ac->bhayx", q[:, :, half:], r_col)
    logits = logits + (pr.unsqueeze(3) + pc.unsqueeze(2)).reshape(B, heads, kernel * kernel, H, W)
    logits = logits.masked_fill(~inside, float("-inf"))
    a = logits.softmax(dim=2)
    out = (a.unsqueeze(2) * vw).sum(3).reshape(B, heads * dv, H, W)
    return F.avg_pool2d(out, 2, 2) if stride == 2 else out


def sasa_loops(x, w, r_row, r_col, heads, dqk, dv, kernel, stride):
    """The same layer with plain loops over pixels, heads and window positions (slow; tiny cases)."""
    B, _, H, W = x.shape
    qkv = torch.einsum("oc,bcyx->boyx", w[:, :, 0, 0], x)
    out = torch.zeros(B, heads * dv, H, W, dtype=x.dtype)
    pad, half, s = kernel // 2, dqk // 2, dqk ** -0.5
    for b in range(B):
        for h in range(heads):
            for yi in range(H):
                for xi in range(W):
                    q = qkv[b, h * dqk:(h + 1) * dqk, yi, xi]
                    logits, vals = [], []
                    for yj in range(yi - pad, yi + pad + 1):
                        for xj in range(xi - pad, xi + pad + 1):
                            if not (0 <= yj < H and 0 <= xj < W):
                                continue
                            kk = qkv[b, heads * dqk + h * dqk:heads * dqk + (h + 1) * dqk, yj, xj]
                            l = s * (q @ kk) + q[:half] @ r_row[yj - yi + pad] + q[half:] @ r_col[xj - xi + pad]
                            logits.append(l)
                            vals.append(qkv[b, 2 * heads * dqk + h * dv:2 * heads * dqk + (h + 1) * dv, yj, xj])
                    a = torch.stack(logits).softmax(0)
                    out[b, h * dv:(h + 1) * dv, yi, xi] = (a[:, None] * torch.stack(vals)).sum(0)
    return F.avg_pool2d(out, 2, 2) if stride == 2 else out


def check_sasa_against_loops():
    g = torch.Generator().manual_seed(7)
    for kernel, stride, H, W in ((3, 1, 4, 5), (5, 2, 4, 6)):
        heads, dqk, dv, C = 2, 4, 3, 5
        x = torch.randn(2, C, H, W, generator=g, dtype=torch.float64, requires_grad=True)
        w = torch.randn(2 * heads * dqk + heads * dv, C, 1, 1, generator=g, dtype=torch.float64, requires_grad=True)
        rr = torch.randn(kernel, dqk // 2, generator=g, dtype=torch.float64, requires_grad=True)
        rc = torch.randn(kernel, dqk // 2, generator=g, dtype=torch.float64, requires_grad=True)
        args = (heads, dqk, dv, kernel, stride)
        ya, yb = sasa_forward(x, w, rr, rc, *args), sasa_loops(x, w, rr, rc, *args)
        assert torch.allclose(ya, yb, atol=1e-12), f"sasa k{kernel} s{stride}: forward differs from the loops"
        dy = torch.randn(ya.shape, generator=g, dtype=torch.float64)
        ga = torch.autograd.grad(ya, (x, w, rr, rc), dy)
        gb = torch.autograd.grad(yb, (x, w, rr, rc), dy)
        for u, v in zip(ga, gb):
            assert torch.allclose(u, v, atol=1e-10), f"sasa k{kernel} s{stride}: gradient differs from the loops"
    print("sasa_forward agrees with plain loops (forward and gradients, k3 s1 and k5 s2, float64)")


def make_sasa(out_dir, name, seed, B, C, H, W, heads, dqk, dv, kernel, stride):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, C, H, W, generator=g).requires_grad_()
    w = (torch.randn(2 * heads * dqk + heads * dv, C, 1, 1, generator=g).clamp(-2, 2) * C ** -0.5).requires_grad_()
    r_row = (torch.randn(kernel, dqk // 2, generator=g).clamp(-2, 2) * dqk ** -0.5).requires_grad_()
    r_col = (torch.randn(kernel, dqk // 2, generator=g).clamp(-2, 2) * dqk ** -0.5).requires_grad_()
    y = sasa_forward(x, w, r_row, r_col, heads, dqk, dv, kernel, stride)
    grad_y = torch.randn(y.shape, generator=g)
    y.backward(grad_y)
    tensors = {"x": x, "qkv.weight": w, "r_row": r_row, "r_col": r_col, "y": y, "grad_y": grad_y,
               "grad_x": x.grad, "grad.qkv.weight": w.grad, "grad.r_row": r_row.grad, "grad.r_col": r_col.grad}
    meta = common_meta(seed, "SASA local attention forward and backward (docs/attention.md)")
    meta.update({"in_channels": str(C), "heads": str(heads), "dim_head_qk": str(dqk), "dim_head_v": str(dv),
                 "kernel": str(kernel), "stride": str(stride)})
    save(out_dir, name, tensors, meta)


# ---- the tiny BoTNet -------------------------------------------------------------------------------

def to_f16_values(t):
    return t.half().float()


def randomised_twin(cfg, seed):
    """timm's ByobNet for a relpos config, every parameter and running statistic drawn at random and
    rounded to a float16 value; returns it with the generator it drew from."""
    torch.manual_seed(seed)
    model = torch_twin.build(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # timm zero-initialises the last BatchNorm of each block and the classifier is nearly zero:
        # randomise them (and the running statistics) so every layer shapes the logits.
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                n = mod.num_features
                mod.weight.copy_(0.5 + torch.rand(n, generator=g))
                mod.bias.copy_(0.2 * torch.randn(n, generator=g))
                mod.running_mean.copy_(0.3 * torch.randn(n, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(n, generator=g))
        model.head.fc.weight.copy_(0.1 * torch.randn(model.head.fc.weight.shape, generator=g))
        model.head.fc.bias.copy_(0.1 * torch.randn(model.head.fc.bias.shape, generator=g))
        for t in list(model.parameters()) + [b for n, b in model.named_buffers() if "running" in n]:
            t.copy_(to_f16_values(t))
    return model, g


def make_tiny_botnet(out_dir, seed=606, batch=2):
    cfg = torch_twin.load_config(os.path.join(ROOT, "models", "tiny_botnet_96x64.json"))
    model, g = randomised_twin(cfg, seed)
    state = {k: v.clone() for k, v in model.state_dict().items() if "num_batches_tracked" not in k}
    x = to_f16_values(torch.randn(batch, cfg["in_chans"], *cfg["input_size"], generator=g))
    labels = torch.randint(0, cfg["num_classes"], (batch,), generator=g)

    model.eval()
    with torch.no_grad():
        logits_eval = model(x)
    model.train()
    logits_train = model(x)
    loss = F.cross_entropy(logits_train, labels)
    loss.backward()

    tensors = {"param." + k: v.half() for k, v in state.items()}
    tensors.update({"input": x.half(), "labels": labels.float(), "logits_eval": logits_eval,
                    "logits_train": logits_train, "loss": loss.reshape(1)})
    nparams = 0
    for n, p in model.named_parameters():
        tensors["grad." + n] = p.grad.to(TINY_GRAD_DTYPE)
        nparams += p.numel()
    for n, b in model.named_buffers():
        if "running" in n:
            tensors["after_train_step." + n] = b
    meta = common_meta(seed, "tiny BoTNet, 96x64 input")
    meta.update({"config": "models/tiny_botnet_96x64.json", "img_size": json.dumps(cfg["input_size"]),
                 "num_classes": str(cfg["num_classes"]), "params": str(nparams),
                 "param_stats": "before_train_step",
                 "notes": "param.* use timm state_dict names and hold the running statistics before the "
                          "training step; eval logits use them; train step: BN batch stats, momentum 0.1, "
                          "unbiased running_var; loss = mean CE; param.* and input are F16 values stored "
                          "exactly; grad.* are " + DTYPES[TINY_GRAD_DTYPE]})
    save(out_dir, "tiny_botnet_96x64", tensors, meta)


def make_tiny_stem4(out_dir, seed=707, batch=2):
    """timm's tiered stem without a pool, which strides conv3 as well (resnet32ts, resnet33ts)."""
    cfg = torch_twin.load_config(os.path.join(ROOT, "tests", "data", "tiny_stem4_config.json"))
    model, g = randomised_twin(cfg, seed)
    assert model.stem.conv3.conv.stride == (2, 2)
    state = {k: v for k, v in model.state_dict().items() if "num_batches_tracked" not in k}
    x = to_f16_values(torch.randn(batch, cfg["in_chans"], *cfg["input_size"], generator=g))
    with torch.no_grad():
        logits_eval = model.eval()(x)
    tensors = {"param." + k: v.half() for k, v in state.items()}
    tensors.update({"input": x.half(), "logits_eval": logits_eval})
    meta = common_meta(seed, "tiny ByobNet with timm's tiered stem without a pool (stem_pool=''), 32x32 input")
    meta.update({"config": "tests/data/tiny_stem4_config.json",
                 "params": str(sum(p.numel() for p in model.parameters())),
                 "notes": "param.* use timm state_dict names; param.* and input are F16 values stored exactly"})
    save(out_dir, "tiny_stem4_32x32", tensors, meta)


CASES = {
    "rel_logits_h5w7": lambda out: make_rel_logits(out),
    "bot_attn_s1_h6w8": lambda out: make_bot_attn(out, "bot_attn_s1_h6w8", seed=201, dim=32, dim_out=32, feat=(6, 8),
                                                  stride=1),
    "bot_attn_s2_h8w6": lambda out: make_bot_attn(out, "bot_attn_s2_h8w6", seed=202, dim=32, dim_out=64, feat=(8, 6),
                                                  stride=2),
    "sasa_k7_s1_h9w11": lambda out: make_sasa(out, "sasa_k7_s1_h9w11", seed=301, B=2, C=16, H=9, W=11, heads=2, dqk=8,
                                              dv=8, kernel=7, stride=1),
    "sasa_k3_s2_h8w6": lambda out: make_sasa(out, "sasa_k3_s2_h8w6", seed=302, B=1, C=16, H=8, W=6, heads=4, dqk=8, dv=4,
                                             kernel=3, stride=2),
    "tiny_botnet_96x64": lambda out: make_tiny_botnet(out),
    "tiny_stem4_32x32": lambda out: make_tiny_stem4(out),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "golden"))
    ap.add_argument("--check", action="store_true", help="only check the SASA implementation against loops")
    ap.add_argument("--only", nargs="+", choices=sorted(CASES), help="only these cases (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # the same summation order on every machine
    check_sasa_against_loops()
    if args.check:
        return
    os.makedirs(args.out, exist_ok=True)
    for name in args.only or CASES:
        CASES[name](args.out)


if __name__ == "__main__":
    main()
