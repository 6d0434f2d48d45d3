#!/usr/bin/env python3
"""relpos vs PyTorch, ONNX Runtime and OpenVINO on the CPU, side by side on the same weights and
input (inference).

For each model: builds the PyTorch reference with random weights (timm's model when timm has it, e.g.
botnet26t_256; otherwise the twin of relpos's shipped config from torch_twin.py, e.g. sasa_resnet26
with its own SASA layer), saves its weights as safetensors (timm's names, which are relpos's), and
exports it to ONNX (opset 17; by default one export per batch size with a fixed batch, or one with a
dynamic batch with --dynamic-batch). Then, per batch size, times in alternating rounds
`relpos bench`, the PyTorch model (eager), ONNX Runtime (fp32, intra-op threads = --threads, inter-op
1, sequential, all graph optimizations) and OpenVINO (fp32, CPU, INFERENCE_NUM_THREADS = --threads,
LATENCY hint, f32 precision hint) on the same batch, prints img/s of each (the median over the rounds
of each round's median run) and relpos's ratios, and
checks that every engine's logits agree with PyTorch's (docs/attention.md: 1e-4 * max(1, max|ref|)).
With more than one model, relpos's throughput per multiply-add of each against the first is then
measured by `relpos bench --paired-with`: the two models in turn, one inference each per pair, and
the median over the pairs of the ratio (per_mac_comparison).
An engine that is not installed is skipped with a one-line message.
    tools/bench/bench_cpu.sh [--models botnet26t_256 sasa_resnet26] [--batches 1 8] [--threads 2]
                             [--seconds 10] [--rounds 2] [--engines relpos torch onnxruntime openvino]
"""
import argparse
import inspect
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import torch
import timm
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(__file__))
import torch_twin  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ENGINES = ["relpos", "torch", "onnxruntime", "openvino"]
ONNX_ENGINES = ["onnxruntime", "openvino"]


def time_loop(fn, seconds, warmup):
    """Per-run seconds of fn(): at least 3 runs and `seconds` in all, after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def time_relpos(relpos, weights, config, inp, threads, seconds, logits_path):
    cmd = [relpos, "bench", "-m", weights, "--config", config, "--input", inp, "--threads", str(threads),
           "--warmup", "3", "--iters", "3", "--min-seconds", str(seconds), "--json", "--save-logits", logits_path]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def randomize_bn(model):
    """Non-trivial batch-norm statistics, so that folding them is exercised."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.1, 0.1)


def build_reference(name):
    """(model, (H, W), what): timm's model when timm has it, else the twin of relpos's config."""
    torch.manual_seed(0)
    if timm.is_model(name):
        model = timm.create_model(name, pretrained=False).eval()
        return model, tuple(model.pretrained_cfg["input_size"][1:]), f"timm {timm.__version__}"
    path = name if name.endswith(".json") else os.path.join(ROOT, "models", name + ".json")
    cfg = torch_twin.load_config(path)
    return torch_twin.build(cfg), tuple(cfg["input_size"]), "PyTorch twin (tools/bench/torch_twin.py)"


def export_onnx(model, x, path, dynamic):
    kw = dict(opset_version=17, input_names=["input"], output_names=["logits"], do_constant_folding=True)
    if dynamic:
        kw["dynamic_axes"] = {"input": {0: "batch"}, "logits": {0: "batch"}}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kw["dynamo"] = False  # the TorchScript exporter on every torch version
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, x, path, **kw)


class OrtEngine:
    def __init__(self, path, threads):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])

    def __call__(self, x):
        return self.sess.run(None, {"input": x})[0]


class OpenVinoEngine:
    def __init__(self, path, threads):
        try:
            import openvino as ov
        except ImportError:  # releases before 2023.1
            import openvino.runtime as ov
        self.compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads,
                                                              "PERFORMANCE_HINT": "LATENCY",
                                                              "INFERENCE_PRECISION_HINT": "f32"})
        self.req = self.compiled.create_infer_request()

    def __call__(self, x):
        self.req.infer({0: x}, share_inputs=True)
        return self.req.get_output_tensor(0).data


def engine_versions(engines, relpos):
    """{engine: version} of the installed engines; prints one line for each one that is skipped."""
    out = {}
    for e in engines:
        if e == "relpos":
            if os.access(relpos, os.X_OK):
                out[e] = ""
            else:
                print(f"relpos: no binary at {relpos}, skipped (tools/setup.sh builds it)", flush=True)
        elif e == "torch":
            out[e] = torch.__version__
        else:
            try:
                mod = __import__(e)
                out[e] = str(getattr(mod, "__version__", "?")).split("-")[0]
            except Exception as ex:  # ImportError, or a broken install
                print(f"{e}: not available ({type(ex).__name__}: {str(ex).splitlines()[0] if str(ex) else ''}), "
                      f"skipped (pip install {e} into the bench Python)", flush=True)
    return out


def bench_model(a, name, engines, tmp):
    model, (H, W), what = build_reference(name)
    randomize_bn(model)
    weights = os.path.join(tmp, f"{name}.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, weights)
    config = name  # relpos's shipped config of the same name (or a config path)
    engines = list(engines)
    onnx_paths = {}

    def onnx_for(batch, x):
        key = "dyn" if a.dynamic_batch else batch
        if key not in onnx_paths:
            path = os.path.join(tmp, f"{name}_{key}.onnx")
            t0 = time.perf_counter()
            try:
                export_onnx(model, x, path, a.dynamic_batch)
                print(f"  {name}: ONNX export ({'dynamic' if a.dynamic_batch else f'fixed batch {batch}'}) "
                      f"{time.perf_counter() - t0:.1f} s", flush=True)
            except Exception as ex:
                print(f"  {name}: ONNX export failed ({type(ex).__name__}: {ex}); ONNX engines skipped", flush=True)
                path = None
            onnx_paths[key] = path
        return onnx_paths[key]

    rows = []
    for batch in a.batches:
        x = torch.randn(batch, 3, H, W, generator=torch.Generator().manual_seed(batch))
        xn = x.numpy()
        inp, out = os.path.join(tmp, "input.safetensors"), os.path.join(tmp, "logits.safetensors")
        save_file({"input": x}, inp)
        with torch.inference_mode():
            ref = model(x)
        runners = {}
        if "torch" in engines:
            def run_torch(x=x):
                with torch.inference_mode():
                    return model(x)
            runners["torch"] = run_torch
        wanted = [e for e in engines if e in ONNX_ENGINES]
        path = onnx_for(batch, x) if wanted else None
        for e in wanted if path else []:
            try:
                eng = (OrtEngine if e == "onnxruntime" else OpenVinoEngine)(path, a.threads)
                runners[e] = lambda eng=eng: eng(xn)
            except Exception as ex:
                print(f"  {e}: could not load the model ({type(ex).__name__}: {ex}), skipped", flush=True)
        logits = {}
        if "relpos" in engines:
            logits["relpos"] = None
        for e, fn in runners.items():  # checks before timing; torch is the reference itself
            if e != "torch":
                logits[e] = torch.as_tensor(fn()).clone()
        # Every engine is summarised the same way: each round's median run time, then the median of
        # the rounds' medians, so that every round counts once. (Pooling a Python engine's runs over
        # the rounds would count a fast round more, as more runs fit into its seconds, while relpos
        # reports one median per round.)
        ms = {e: [] for e in engines if e in logits or e in runners}
        for rnd in range(a.rounds):
            for e in ms:
                if e == "relpos":
                    r = time_relpos(a.relpos, weights, config, inp, a.threads, a.seconds, out)
                    ms[e].append(r["median_ms"])  # relpos reports the median of its runs
                else:
                    runs = time_loop(runners[e], a.seconds, warmup=3 if rnd == 0 else 1)
                    ms[e].append(1000 * statistics.median(runs))
            this = {e: batch * 1000 / v[-1] for e, v in ms.items()}
            onnx = {e: this[e] for e in ONNX_ENGINES if e in this}
            versus = (f"; relpos / best ONNX {fmt_ratio(this['relpos'], max(onnx.values()))}"
                      if onnx and "relpos" in this else "")
            print(f"  {name} batch {batch} round {rnd + 1}/{a.rounds}: " +
                  ", ".join(f"{e} {v:.2f}" for e, v in this.items()) +
                  f" img/s{versus} (load average {os.getloadavg()[0]:.1f})",
                  flush=True)
        if "relpos" in logits:
            logits["relpos"] = load_file(out)["logits"]
        tol = 1e-4 * max(1.0, ref.abs().max().item())
        diffs = {e: (v.float() - ref).abs().max().item() for e, v in logits.items()}
        ips = {e: batch * 1000 / statistics.median(v) for e, v in ms.items()}  # v: the rounds' medians
        rows.append((batch, ips, diffs, tol))
        del runners
    return what, rows, weights, (H, W)


def per_mac_comparison(a, infos, tmp):
    """relpos's throughput per multiply-add of each model against the first one's. Each round is one
    `relpos bench --paired-with` call per later model: the first model and the later one run in turn,
    one inference each per pair (the order swapped from pair to pair), for 2 x --seconds. The two runs
    of a pair meet the same host speed, which on a shared host changes from second to second, so the
    round's ratio is the median over its pairs of (later model's multiply-adds per second) / (first's).
    Prints one line per round and a table of GMAC/s (forward multiply-adds over each model's median
    run, as relpos bench reports them) with the median of the rounds' ratios."""
    names = [n for n, _, _ in infos]
    first, first_weights, first_size = infos[0]
    print(f"\nrelpos per multiply-add, each model paired with {first} run by run "
          f"(relpos bench --paired-with; {a.rounds} rounds x {2 * a.seconds:g} s), GMAC/s:", flush=True)

    def input_file(name, batch, size):
        inp = os.path.join(tmp, f"permac_{name}_{batch}.safetensors")
        if not os.path.exists(inp):
            x = torch.randn(batch, 3, size[0], size[1], generator=torch.Generator().manual_seed(batch))
            save_file({"input": x}, inp)
        return inp

    table = []
    for batch in a.batches:
        rates = {n: [] for n in names}
        ratios = {n: [] for n in names[1:]}
        quartiles = {n: [] for n in names[1:]}
        gmacs = {}
        for rnd in range(a.rounds):
            for name, weights, size in infos[1:]:
                cmd = [a.relpos, "bench", "-m", first_weights, "--config", first,
                       "--input", input_file(first, batch, first_size),
                       "--paired-with", weights, "--paired-config", name,
                       "--paired-input", input_file(name, batch, size), "--threads", str(a.threads),
                       "--warmup", "2", "--iters", "3", "--min-seconds", str(2 * a.seconds), "--json"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                one, other = r["paired"]
                if name == names[1]:
                    rates[first].append(one["forward_gmac_per_s"])
                    gmacs[first] = one["forward_gmacs_per_image"]
                rates[name].append(other["forward_gmac_per_s"])
                gmacs[name] = other["forward_gmacs_per_image"]
                ratios[name].append(r["per_mac_ratio"])
                quartiles[name].append((r["per_mac_ratio_q1"], r["per_mac_ratio_q3"], r["pairs"]))
            print(f"  batch {batch} round {rnd + 1}/{a.rounds}: " +
                  ", ".join(f"{n} {rates[n][-1]:.1f}" for n in names) + " GMAC/s; " +
                  ", ".join(f"{n} {ratios[n][-1]:.3f}x (quartiles {quartiles[n][-1][0]:.3f}x to "
                            f"{quartiles[n][-1][1]:.3f}x over {quartiles[n][-1][2]} pairs)" for n in names[1:]),
                  flush=True)
        table.append((batch, rates, ratios, gmacs))
    w = max(16, max(len(n) for n in names) + 2)
    print(f"{'batch':>5} |" + "".join(f"{n:>{w}}" for n in names) + " | per multiply-add against " + names[0])
    for batch, rates, ratios, gmacs in table:
        line = f"{batch:>5} |" + "".join(f"{statistics.median(rates[n]):>{w}.1f}" for n in names) + " |"
        for n in names[1:]:
            line += (f" {n} {statistics.median(ratios[n]):.2f}x (rounds " +
                     ", ".join(f"{q:.2f}x" for q in ratios[n]) + ")")
        print(line)
    print(f"{'':>5} |" + "".join(f"{f'{gmacs[n]:.2f} GMACs':>{w}}" for n in names) + " | (per image)")


def fmt_ratio(num, den):
    return f"{num / den:.2f}x" if num and den else "-"


def print_table(name, what, rows, engines, a):
    """img/s per engine and batch, relpos's ratios, then each engine's logits max|diff| against the
    PyTorch reference; returns whether all agree."""
    print(f"\n{name} inference, fp32, {a.threads} threads, {a.rounds} rounds x {a.seconds:g} s per engine "
          f"(img/s of the median of the rounds' median runs); "
          f"reference: {what}; ONNX opset 17, {'dynamic' if a.dynamic_batch else 'fixed'} batch")
    cols = [e for e in engines if any(e in r[1] for r in rows)]
    w = 13
    print(f"{'batch':>5} |" + "".join(f"{e:>{w}}" for e in cols) + f" | {'relpos/torch':>12}  relpos/best ONNX   (img/s)")
    for batch, ips, diffs, tol in rows:
        line = f"{batch:>5} |" + "".join(f"{ips[e]:>{w}.2f}" if e in ips else f"{'-':>{w}}" for e in cols)
        r = ips.get("relpos")
        onnx = {e: ips[e] for e in ONNX_ENGINES if e in ips}
        best = max(onnx, key=onnx.get) if onnx else None
        line += f" | {fmt_ratio(r, ips.get('torch')):>12}  "
        line += f"{fmt_ratio(r, onnx[best])} ({best})" if best and r else "-"
        print(line)
    ok = True
    print(f"{'':>5} |" + "".join(f"{e:>{w}}" for e in cols) + " | logits max|diff| vs the reference")
    for batch, ips, diffs, tol in rows:
        parts = []
        for e in cols:
            if e == "torch":
                parts.append(f"{'(ref)':>{w}}")
            elif e in diffs:
                agree = diffs[e] <= tol
                ok &= agree
                parts.append(f"{diffs[e]:>{w - 3}.1e} {'ok' if agree else '!!'}")
            else:
                parts.append(f"{'-':>{w}}")
        print(f"{batch:>5} |" + "".join(parts) + f" | tolerance 1e-4*max(1,max|ref|) = {tol:.1e}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", "--model", nargs="+", default=["botnet26t_256", "sasa_resnet26"],
                    help="timm model names or relpos shipped configs (a twin is built when timm lacks the model)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=10.0, help="timing per engine per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    ap.add_argument("--dynamic-batch", action="store_true",
                    help="one ONNX export with a dynamic batch instead of one per batch size")
    ap.add_argument("--relpos", default=os.path.join(ROOT, "build", "relpos"))
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    versions = engine_versions(a.engines, a.relpos)
    engines = [e for e in a.engines if e in versions]
    if not engines:
        sys.exit("no engine to run")
    print(f"CPU: {cpu}, {os.cpu_count()} logical CPUs; " +
          ", ".join([f"{e} {v}" for e, v in versions.items() if v] + [f"timm {timm.__version__}"]), flush=True)
    ok = True
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models:
            what, rows, weights, size = bench_model(a, name, engines, tmp)
            results.append((name, what, rows, weights, size))
        for name, what, rows, _, _ in results:
            ok &= print_table(name, what, rows, engines, a)
        if len(results) > 1 and "relpos" in engines:
            per_mac_comparison(a, [(n, wts, size) for n, _, _, wts, size in results], tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
