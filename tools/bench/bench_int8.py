#!/usr/bin/env python3
"""relpos int8 vs NNCF + OpenVINO int8 on the CPU, with relpos fp32 (and OpenVINO fp32), in one run.

For the model (default botnet26t_256, timm's, random weights with non-trivial batch norms): writes
--calib-images calibration images and --check-images other images (crops, flips and colour changes
of the photos in tests/data/photos, as PNG files), then
  - relpos: `relpos quantize -m weights.safetensors --config NAME --calib DIR` (percentile by default);
  - NNCF: the ONNX export read by OpenVINO, `nncf.quantize` on the same images preprocessed by timm's
    eval transform (which relpos's preprocessing matches);
then times, per batch size, in alternating rounds: relpos fp32, relpos int8, OpenVINO fp32 and
OpenVINO int8 (threads = --threads, LATENCY hint, f32 precision hint: without it OpenVINO runs an
fp32 model's float layers in bf16 on CPUs with AMX or AVX-512 BF16), prints img/s and the ratios, and the top-1
agreement of each int8 model with its own fp32 model on the check images.
    tools/bench/bench_int8.sh [--model botnet26t_256] [--batches 1 8] [--threads 2] [--seconds 10]
                              [--rounds 2] [--calib-images 64] [--check-images 64] [--method percentile]
"""
import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import timm
from PIL import Image, ImageEnhance
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
from bench_cpu import ROOT, export_onnx, randomize_bn, time_loop  # noqa: E402


def make_images(folder, count, seed):
    """`count` PNG files: random crops (with flips and colour changes) of tests/data/photos."""
    os.makedirs(folder, exist_ok=True)
    src = os.path.join(ROOT, "tests", "data", "photos")
    photos = [Image.open(os.path.join(src, f)).convert("RGB") for f in sorted(os.listdir(src))
              if f.lower().endswith((".png", ".jpg", ".jpeg"))]
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        im = photos[i % len(photos)]
        w, h = im.size
        s = int(min(w, h) * rng.uniform(0.4, 1.0))
        x0, y0 = int(rng.integers(0, w - s + 1)), int(rng.integers(0, h - s + 1))
        c = im.crop((x0, y0, x0 + s, y0 + s)).resize((320, 320), Image.BICUBIC)
        if rng.random() < 0.5:
            c = c.transpose(Image.FLIP_LEFT_RIGHT)
        c = ImageEnhance.Color(c).enhance(rng.uniform(0.5, 1.5))
        c = ImageEnhance.Brightness(c).enhance(rng.uniform(0.7, 1.3))
        p = os.path.join(folder, f"{i:04d}.png")
        c.save(p)
        paths.append(p)
    return paths


def timm_batch(model, paths):
    cfg = timm.data.resolve_data_config({}, model=model)
    tf = timm.data.create_transform(**cfg)
    return torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])


def relpos_logits(relpos, weights, config, x, tmp, threads):
    inp, out = os.path.join(tmp, "check_in.safetensors"), os.path.join(tmp, "check_out.safetensors")
    save_file({"input": x.contiguous()}, inp)
    cmd = [relpos, "bench", "-m", weights, "--input", inp, "--threads", str(threads), "--warmup", "0", "--iters", "1",
           "--save-logits", out] + (["--config", config] if config else [])
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return load_file(out)["logits"]


def relpos_ips(relpos, weights, config, inp, batch, threads, seconds):
    import json
    cmd = [relpos, "bench", "-m", weights, "--input", inp, "--threads", str(threads), "--warmup", "3", "--iters", "3",
           "--min-seconds", str(seconds), "--json"] + (["--config", config] if config else [])
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    return batch * 1000 / r["median_ms"]


def agreement(a, b):
    return float((torch.as_tensor(a).argmax(1) == torch.as_tensor(b).argmax(1)).float().mean())


def rel_error(ref, got):
    """Relative RMS difference of int8 logits from fp32 ones."""
    ref, got = torch.as_tensor(ref).double(), torch.as_tensor(got).double()
    return float((got - ref).norm() / ref.norm())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="botnet26t_256")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="timing per engine per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--calib-images", type=int, default=64)
    ap.add_argument("--check-images", type=int, default=64)
    ap.add_argument("--method", default="percentile", help="relpos quantize --method")
    ap.add_argument("--relpos", default=os.path.join(ROOT, "build", "relpos"))
    ap.add_argument("--nncf-python", default=os.path.join(ROOT, ".venv-nncf", "bin", "python"),
                    help="a Python with nncf and openvino (tools/bench/bench_int8.sh makes .venv-nncf)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
    try:
        import openvino as ov
        ov_version = ov.__version__.split("-")[0]
    except ImportError:
        ov, ov_version = None, None
    nncf_ok = a.nncf_python and os.access(a.nncf_python, os.X_OK)
    if not nncf_ok:
        print(f"nncf: no Python with NNCF at '{a.nncf_python}'; OpenVINO int8 skipped", flush=True)
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs, {' '.join(isa)}; torch {torch.__version__}, timm "
          f"{timm.__version__}, openvino {ov_version}", flush=True)

    torch.manual_seed(0)
    model = timm.create_model(a.model, pretrained=False).eval()
    randomize_bn(model)
    H, W = model.pretrained_cfg["input_size"][1:]
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "fp32.safetensors")
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
        calib = make_images(os.path.join(tmp, "calib"), a.calib_images, seed=1)
        check = make_images(os.path.join(tmp, "check"), a.check_images, seed=2)

        # relpos int8
        int8 = os.path.join(tmp, "int8.json")
        t0 = time.perf_counter()
        q = subprocess.run([a.relpos, "quantize", "-m", weights, "--config", a.model, "--calib",
                            os.path.join(tmp, "calib"), "-n", str(a.calib_images), "--method", a.method,
                            "--sensitivity-images", "0", "--threads", str(a.threads), "-o", int8, "-q"],
                           capture_output=True, text=True)
        if q.returncode != 0:
            sys.exit(f"relpos quantize failed:\n{q.stdout}{q.stderr}")
        print(f"relpos quantize ({a.method}, {a.calib_images} images): {time.perf_counter() - t0:.1f} s", flush=True)

        # OpenVINO fp32 and NNCF int8 from one ONNX export with a dynamic batch
        ov_fp32 = ov_int8 = None
        if ov is not None:
            onnx_path = os.path.join(tmp, "model.onnx")
            export_onnx(model, torch.randn(1, 3, H, W), onnx_path, dynamic=True)
            core = ov.Core()
            ov_fp32 = core.read_model(onnx_path)
            if nncf_ok:
                calib_npy, xml = os.path.join(tmp, "calib.npy"), os.path.join(tmp, "nncf_int8.xml")
                np.save(calib_npy, timm_batch(model, calib).numpy())
                r = subprocess.run([a.nncf_python, os.path.join(os.path.dirname(__file__), "nncf_quantize.py"),
                                    onnx_path, calib_npy, xml], capture_output=True, text=True)
                if r.returncode == 0:
                    print(r.stdout.strip().splitlines()[-1], flush=True)
                    ov_int8 = core.read_model(xml)
                else:
                    print(f"nncf: quantization failed, OpenVINO int8 skipped:\n{r.stderr[-2000:]}", flush=True)

        def compiled(m, batch):
            m.reshape({m.inputs[0]: [batch, 3, H, W]})
            # f32: as relpos, the layers that are not int8 stay float32 (OpenVINO's default on a CPU with
            # AMX or AVX-512 BF16 is bf16, which would make the "fp32" columns bf16)
            c = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY",
                                              "INFERENCE_PRECISION_HINT": "f32"})
            req = c.create_infer_request()

            def run(x):
                req.infer({0: x}, share_inputs=True)
                return req.get_output_tensor(0).data.copy()
            return run

        # top-1 agreement of each int8 model with its fp32 model on the check images
        xk = timm_batch(model, check)
        agree = {}
        rf = relpos_logits(a.relpos, weights, a.model, xk, tmp, a.threads)
        ri = relpos_logits(a.relpos, int8, None, xk, tmp, a.threads)
        agree["relpos"] = agreement(rf, ri)
        err = {"relpos": rel_error(rf, ri)}
        if ov_int8 is not None:
            of = compiled(ov_fp32, len(xk))(xk.numpy())
            oi = compiled(ov_int8, len(xk))(xk.numpy())
            agree["openvino"] = agreement(of, oi)
            err["openvino"] = rel_error(of, oi)
        with torch.inference_mode():
            ref = model(xk)
        print(f"relpos fp32 vs timm: max|logits diff| {(rf - ref).abs().max().item():.2e}", flush=True)

        rows = []
        for batch in a.batches:
            x = torch.randn(batch, 3, H, W, generator=torch.Generator().manual_seed(batch))
            inp = os.path.join(tmp, f"input{batch}.safetensors")
            save_file({"input": x}, inp)
            runners = {"relpos fp32": lambda: relpos_ips(a.relpos, weights, a.model, inp, batch, a.threads, a.seconds),
                       "relpos int8": lambda: relpos_ips(a.relpos, int8, None, inp, batch, a.threads, a.seconds)}
            if ov_fp32 is not None:
                f = compiled(ov_fp32, batch)
                runners["openvino fp32"] = lambda f=f: batch / statistics.median(
                    time_loop(lambda: f(x.numpy()), a.seconds, 3))
            if ov_int8 is not None:
                g = compiled(ov_int8, batch)
                runners["openvino int8"] = lambda g=g: batch / statistics.median(
                    time_loop(lambda: g(x.numpy()), a.seconds, 3))
            got = {k: [] for k in runners}
            for rnd in range(a.rounds):
                for k, fn in runners.items():
                    got[k].append(fn())
                print(f"  batch {batch} round {rnd + 1}/{a.rounds}: " +
                      ", ".join(f"{k} {v[-1]:.2f}" for k, v in got.items()) +
                      f" img/s (load average {os.getloadavg()[0]:.1f})", flush=True)
            rows.append((batch, {k: statistics.median(v) for k, v in got.items()}))

    cols = list(rows[0][1].keys())
    print(f"\n{a.model} inference, {a.threads} threads, {a.rounds} rounds x {a.seconds:g} s per engine (img/s, "
          f"median of rounds); relpos int8: --method {a.method}, {a.calib_images} calibration images")
    print(f"{'batch':>5} |" + "".join(f"{c:>15}" for c in cols) + " | int8 relpos/OpenVINO  relpos int8/fp32")
    for batch, ips in rows:
        line = f"{batch:>5} |" + "".join(f"{ips[c]:>15.2f}" for c in cols)
        ov8 = ips.get("openvino int8")
        line += f" | {ips['relpos int8'] / ov8:>20.2f}x" if ov8 else f" | {'-':>21}"
        line += f"  {ips['relpos int8'] / ips['relpos fp32']:>15.2f}x"
        print(line)
    print(f"top-1 agreement of int8 with fp32 on {a.check_images} check images: " +
          ", ".join(f"{k} {100 * v:.1f}%" for k, v in agree.items()))
    print("relative RMS error of int8 logits against fp32 logits: " +
          ", ".join(f"{k} {v:.4f}" for k, v in err.items()))


if __name__ == "__main__":
    main()
