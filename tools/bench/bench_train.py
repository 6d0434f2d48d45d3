#!/usr/bin/env python3
"""Training relpos vs timm on PyTorch, side by side: same architecture, initial weights, data,
batch size, threads and recipe (SGD + Nesterov, warmup + cosine, label smoothing, random crop
with padding and flips) on Fashion-MNIST.

    tools/bench/bench_train.sh                      # throughput: 150 steps each, img/s and ratio
    tools/bench/bench_train.sh --rounds 5           # alternate relpos and torch 5 times (noisy hosts)
    tools/bench/bench_train.sh --epochs 1           # also train whole epochs and compare accuracy
"""
import argparse
import gzip
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(__file__))
import torch_twin  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_split(split, mean, std):
    stem = "train" if split == "train" else "t10k"
    x = read_idx(f"{FMNIST}/{stem}-images-idx3-ubyte.gz").astype(np.float32) / 255.0
    y = read_idx(f"{FMNIST}/{stem}-labels-idx1-ubyte.gz").astype(np.int64)
    x = (torch.from_numpy(x)[:, None] - mean) / std
    return x, torch.from_numpy(y)


def augment(x, pad, fill, gen):
    """Random crop with zero (black) padding and horizontal flips, per sample."""
    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad), value=fill)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=gen)
    rows = (dy[:, None] + torch.arange(h)[None]).view(n, 1, h, 1).expand(n, c, h, w)
    cols = (dx[:, None] + torch.arange(w)[None]).view(n, 1, 1, w).expand(n, c, h, w)
    out = padded[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None], rows, cols]
    flip = torch.rand(n, generator=gen) < 0.5
    out[flip] = out[flip].flip(-1)
    return out


def lr_at(step, a, per_epoch, total):
    warm = int(a.warmup * per_epoch)
    if step < warm:
        return a.lr * 0.01 + (a.lr - a.lr * 0.01) * step / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return 0.5 * a.lr * (1 + math.cos(math.pi * t))


def torch_train(a, cfg, init_weights, x, y, xt, yt, steps, epochs, fill):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = torch_twin.build(cfg)
    model.load_state_dict(load_file(init_weights), strict=True)
    model.train()
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or "pos_embed" in n else decay).append(p)
    opt = torch.optim.SGD([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=a.lr, momentum=0.9, nesterov=True)
    per_epoch = len(x) // a.batch
    total = per_epoch * (epochs if epochs else 1)
    gen = torch.Generator().manual_seed(a.seed)
    step, images, busy = 0, 0, 0.0
    for epoch in range(max(1, epochs)):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(per_epoch):
            if not epochs and step >= steps:
                break
            t0 = time.perf_counter()
            idx = perm[i * a.batch:(i + 1) * a.batch]
            xb = augment(x[idx], 2, fill, gen).contiguous(memory_format=torch.channels_last)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, a, per_epoch, total)
            loss = F.cross_entropy(model(xb), y[idx], label_smoothing=0.1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            busy += time.perf_counter() - t0
            step += 1
            images += len(idx)
    acc = None
    if epochs:
        model.eval()
        with torch.inference_mode():
            acc = sum((model(xt[i:i + 500]).argmax(1) == yt[i:i + 500]).sum().item() for i in range(0, len(xt), 500)) / len(xt)
    return images / busy, acc


def relpos_train(a, init_config, steps, epochs, out):
    cmd = [a.relpos, "train", "-c", init_config, "--threads", str(a.threads), "-b", str(a.batch), "--lr", str(a.lr),
           "--wd", str(a.wd), "--warmup", str(a.warmup), "--seed", str(a.seed), "--out", out, "-q",
           "--epochs", str(max(1, epochs))]
    if not epochs:
        cmd += ["--max-steps", str(steps), "--no-eval"]
    err = subprocess.run(cmd, check=True, capture_output=True, text=True).stderr
    ips = float(re.search(r"\(([0-9.]+) img/s\)", err).group(1))
    acc = re.search(r"test accuracy ([0-9.]+)%", err)
    return ips, float(acc.group(1)) / 100 if acc else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="models/fmnist_botnet.json")
    ap.add_argument("--relpos", default="build/relpos")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--wd", type=float, default=5e-5)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=150, help="steps for the throughput comparison")
    ap.add_argument("--rounds", type=int, default=3,
                    help="throughput rounds, relpos and torch alternating; the medians are compared")
    ap.add_argument("--epochs", type=int, default=0, help="also train this many epochs each and compare accuracy")
    a = ap.parse_args()

    cfg = torch_twin.load_config(a.config)
    with open(a.config) as f:
        pre = json.load(f).get("preprocess", {"mean": [0.5], "std": [0.5]})
    mean, std = pre["mean"][0], pre["std"][0]
    fill = (0.0 - mean) / std
    x, y = load_split("train", mean, std)
    xt, yt = load_split("test", mean, std)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        init = os.path.join(tmp, "init.json")
        subprocess.run([a.relpos, "convert", a.config, init], check=True, capture_output=True)
        init_st = os.path.join(tmp, "init.safetensors")
        subprocess.run([a.relpos, "convert", init, init_st], check=True, capture_output=True)
        r_all, t_all = [], []
        for k in range(max(1, a.rounds)):
            r_all.append(relpos_train(a, init, a.steps, 0, os.path.join(tmp, f"r{k}"))[0])
            t_all.append(torch_train(a, cfg, init_st, x, y, xt, yt, a.steps, 0, fill)[0])
            if a.rounds > 1:
                rows.append((f"round {k + 1}", r_all[-1], t_all[-1], None, None))
        rows.append(("median" if a.rounds > 1 else "throughput", statistics.median(r_all), statistics.median(t_all),
                     None, None))
        if a.epochs:
            r_ips2, r_acc = relpos_train(a, init, 0, a.epochs, os.path.join(tmp, "r2"))
            t_ips2, t_acc = torch_train(a, cfg, init_st, x, y, xt, yt, 0, a.epochs, fill)
            rows.append((f"{a.epochs} epoch(s)", r_ips2, t_ips2, r_acc, t_acc))
    print(f"\n{cfg['name']} training on Fashion-MNIST, batch {a.batch}, {a.threads} threads, torch {torch.__version__}")
    print(f"{'run':>12} {'relpos img/s':>13} {'torch img/s':>12} {'ratio':>6}  {'relpos acc':>10} {'torch acc':>9}")
    for name, r, t, ra, ta in rows:
        accs = f"{100 * ra:>9.2f}% {100 * ta:>8.2f}%" if ra is not None else ""
        print(f"{name:>12} {r:>13.1f} {t:>12.1f} {r / t:>5.2f}x  {accs}")


if __name__ == "__main__":
    main()
