#!/usr/bin/env python3
"""relpos vs timm on PyTorch, side by side on the same weights and input (inference).

Creates timm's model with random weights, saves them as safetensors (timm's names), then times
`relpos bench` and timm's forward in alternating rounds on the same batch, prints img/s of each and
the ratio, and checks that the logits agree (tolerance of docs/attention.md: 1e-4 * max(1, max|ref|)).
    tools/bench/bench_cpu.sh [--batches 1 8] [--threads 2] [--seconds 10]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import timm
from safetensors.torch import load_file, save_file


def time_torch(model, x, seconds, warmup=3):
    with torch.inference_mode():
        for _ in range(warmup):
            model(x)
        times = []
        start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - t0)
    return times


def time_relpos(relpos, weights, config, inp, threads, seconds, logits_path):
    cmd = [relpos, "bench", "-m", weights, "--config", config, "--input", inp, "--threads", str(threads),
           "--warmup", "3", "--iters", "3", "--min-seconds", str(seconds), "--json", "--save-logits", logits_path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="botnet26t_256", help="timm model name (and relpos shipped config)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="timing per framework per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--relpos", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "relpos"))
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = timm.create_model(a.model, pretrained=False).eval()
    # Make batch-norm statistics non-trivial so that folding them is exercised.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)
    H, W = model.pretrained_cfg["input_size"][1:]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "weights.safetensors")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
        for batch in a.batches:
            x = torch.randn(batch, 3, H, W, generator=torch.Generator().manual_seed(batch))
            inp, out = os.path.join(tmp, "input.safetensors"), os.path.join(tmp, "logits.safetensors")
            save_file({"input": x}, inp)
            r_ms, t_ms = [], []
            for _ in range(a.rounds):
                r = time_relpos(a.relpos, weights, a.model, inp, a.threads, a.seconds, out)
                r_ms.append(r["median_ms"])
                t_ms += [1000 * t for t in time_torch(model, x, a.seconds)]
            with torch.inference_mode():
                ref = model(x)
            got = load_file(out)["logits"]
            diff = (got - ref).abs().max().item()
            tol = 1e-4 * max(1.0, ref.abs().max().item())
            r_med, t_med = statistics.median(r_ms), statistics.median(t_ms)
            rows.append((batch, batch * 1000 / r_med, batch * 1000 / t_med, diff, tol))
    print(f"\n{a.model} inference, {a.threads} threads, torch {torch.__version__}, timm {timm.__version__}")
    print(f"{'batch':>5} {'relpos img/s':>13} {'timm img/s':>11} {'ratio':>6}  logits max|diff|")
    ok = True
    for batch, r, t, diff, tol in rows:
        agree = diff <= tol
        ok &= agree
        print(f"{batch:>5} {r:>13.2f} {t:>11.2f} {r / t:>5.2f}x  {diff:.2e} ({'agree' if agree else 'DISAGREE'}, tol {tol:.1e})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
