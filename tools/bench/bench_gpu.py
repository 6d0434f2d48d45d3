#!/usr/bin/env python3
"""relpos vs PyTorch eager on one GPU, side by side (TF32 allowed for both, and said so):

1. botnet26t_256 inference at batch 1, 32 and 256, on the same weights and input; the logits are
   also compared with TF32 off (float32 parity);
2. the training step (forward, backward, SGD) at batch 32;
3. the BoTNet attention op alone at h = w = 16, 32, 64 and d = 64, 128 (4 heads, batch 8) against
   PyTorch's unfused relative-logits path (timm's pad/reshape rel_logits_1d) and against PyTorch's
   scaled_dot_product_attention without any position term (the floor).

    tools/bench/bench_gpu.sh
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
import timm
from safetensors.torch import load_file, save_file
from timm.layers.bottleneck_attn import PosEmbedRel


def cuda_time(fn, warmup=5, iters=30):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def relpos_bench(relpos, args):
    p = subprocess.run([relpos, "bench", "--device", "cuda", "--json", *args], capture_output=True, text=True)
    if p.returncode != 0:
        print(f"relpos bench {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()}", flush=True)
        return {"median_ms": float("nan")}
    return json.loads(p.stdout.strip().splitlines()[-1])


def unfused_attention(q, k, v, pos, scale):
    """timm BottleneckAttn's core: (q k^T) s + PosEmbedRel(q) (pad/reshape), softmax, @ v."""
    attn = (q @ k.transpose(-1, -2)) * scale + pos(q)
    return attn.softmax(dim=-1) @ v


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--relpos", default="build/relpos")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 256])
    ap.add_argument("--train-batch", type=int, default=32)
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="skip torch.compile (slow to start)")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}, timm {timm.__version__}; TF32 on for both")

    torch.manual_seed(0)
    model = timm.create_model("botnet26t_256", pretrained=False).cuda().eval()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "w.safetensors")
        save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, weights)
        extra, compiled = {}, None
        for b in a.batches:
            x = torch.randn(b, 3, 256, 256, generator=torch.Generator().manual_seed(b))
            inp, out = os.path.join(tmp, "x.safetensors"), os.path.join(tmp, "y.safetensors")
            save_file({"input": x}, inp)
            r = relpos_bench(a.relpos, ["-m", weights, "--config", "botnet26t_256", "--input", inp, "--tf32",
                                        "--iters", "30", "--warmup", "5"])
            xc = x.cuda()
            with torch.inference_mode():
                t_ms = cuda_time(lambda: model(xc))
            # float32 parity (TF32 off on both sides)
            relpos_bench(a.relpos, ["-m", weights, "--config", "botnet26t_256", "--input", inp, "--iters", "1",
                                    "--warmup", "0", "--save-logits", out])
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
            with torch.inference_mode():
                ref = model(xc).cpu()
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
            diff = (load_file(out)["logits"] - ref).abs().max().item() if os.path.exists(out) else float("nan")
            rows.append((f"inference b{b}", b * 1000 / r["median_ms"], b * 1000 / t_ms, f"fp32 logits max|diff| {diff:.1e}"))
            # PyTorch's faster modes, for reference (relpos has no half-precision path yet)
            with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
                bf_ms = cuda_time(lambda: model(xc))
            extra[b] = {"torch bf16 autocast": b * 1000 / bf_ms}
            if a.compile and b == max(a.batches):  # one size: each one compiles anew
                if compiled is None:
                    compiled = torch.compile(model)
                with torch.inference_mode():
                    extra[b]["torch.compile tf32"] = b * 1000 / cuda_time(lambda: compiled(xc))
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        extra[b]["torch.compile bf16"] = b * 1000 / cuda_time(lambda: compiled(xc))

        b = a.train_batch
        r = relpos_bench(a.relpos, ["-m", weights, "--config", "botnet26t_256", "--batch", str(b), "--train", "--tf32",
                                    "--iters", "20", "--warmup", "3"])
        model.train()
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, nesterov=True)
        x = torch.randn(b, 3, 256, 256, device="cuda")
        y = torch.arange(b, device="cuda") % 1000

        def step():
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t_ms = cuda_time(step, iters=20)
        rows.append((f"train step b{b}", b * 1000 / r["median_ms"], b * 1000 / t_ms, ""))

    print(f"\n{'botnet26t_256':<18} {'relpos img/s':>13} {'torch img/s':>12} {'ratio':>6}   (both TF32)")
    for name, rr, tt, note in rows:
        print(f"{name:<18} {rr:>13.1f} {tt:>12.1f} {rr / tt:>5.2f}x  {note}")
    for b, modes in extra.items():
        rr = next(r for n, r, _, _ in rows if n == f"inference b{b}")
        for mode, img_s in modes.items():
            print(f"  b{b}: {mode:<20} {img_s:>9.1f} img/s; relpos TF32 / this = {rr / img_s:.2f}x")

    print(f"\n{'attention op (ms), 4 heads, batch 8':<36} {'relpos':>8} {'unfused':>8} {'sdpa':>8} "
          f"{'vs unfused':>11} {'vs sdpa':>8}")
    heads, batch = 4, 8
    for backward in (False, True):
        for hw in (16, 32, 64):
            for d in (64, 128):
                r = relpos_bench(a.relpos, ["--attention", str(hw), str(hw), "--dim", str(d), "--heads", str(heads),
                                            "--batch", str(batch), "--tf32", "--iters", "30", "--warmup", "5"]
                                 + (["--backward"] if backward else []))
                n = hw * hw
                q, k, v = (torch.randn(batch * heads, n, d, device="cuda", requires_grad=backward) for _ in range(3))
                pos = PosEmbedRel((hw, hw), d, d ** -0.5).cuda()
                dout = torch.randn(batch * heads, n, d, device="cuda")

                def unfused():
                    o = unfused_attention(q, k, v, pos, d ** -0.5)
                    if backward:
                        torch.autograd.grad(o, (q, k, v, pos.height_rel, pos.width_rel), dout)

                def sdpa():
                    o = F.scaled_dot_product_attention(q, k, v)
                    if backward:
                        torch.autograd.grad(o, (q, k, v), dout)

                with torch.set_grad_enabled(backward):
                    u_ms = cuda_time(unfused)
                    s_ms = cuda_time(sdpa)
                name = f"{'fwd+bwd' if backward else 'fwd'} h=w={hw} d={d}"
                print(f"{name:<36} {r['median_ms']:>8.3f} {u_ms:>8.3f} {s_ms:>8.3f} "
                      f"{u_ms / r['median_ms']:>10.2f}x {s_ms / r['median_ms']:>7.2f}x", flush=True)

if __name__ == "__main__":
    sys.exit(main())
