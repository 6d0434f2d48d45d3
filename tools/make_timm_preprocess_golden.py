#!/usr/bin/env python3
"""Writes the golden data of relpos's timm-preprocessing test (tests/test_timm_preprocess.cpp).

For real photographs (tests/data/photos/, copied from scikit-image's skimage/data) and a set of
eval-transform settings, it runs timm's own `create_transform` (timm.data, the transform a timm user
gets from `resolve_data_config`) and stores:
  - the 8-bit image timm's transform has just before ToTensor (resize with Pillow + centre crop),
    as a lossless PNG in tests/golden/timm_preprocess/;
  - timm's normalised input tensor at a few hundred positions (index and value);
  - for timm's botnet26t_256 pretrained config, the logits of botnet26t_256 with deterministic
    weights (the same generator as tests/deterministic_weights.hpp: both sides compute every weight
    from its tensor name and index, so no 50 MB checkpoint needs to be committed).
Everything goes into tests/golden/timm_preprocess.json.

Run: tools/bench/python_env.sh prints the Python to use (Debian's torch + timm 0.9.16):
    $(tools/bench/python_env.sh) tools/make_timm_preprocess_golden.py
"""
import json
import math
import os
import sys

import numpy as np
import PIL
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHOTOS = os.path.join(ROOT, "tests", "data", "photos")
OUT = os.path.join(ROOT, "tests", "golden")
MASK64 = (1 << 64) - 1


def fnv1a64(name: str) -> int:
    h = 0xCBF29CE484222325
    for b in name.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK64
    return h


def splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def deterministic_tensor(name: str, shape) -> np.ndarray:
    """The value of every element from its tensor's name and its index (see the C++ twin)."""
    n = int(np.prod(shape)) if len(shape) else 1
    with np.errstate(over="ignore"):
        idx = np.arange(n, dtype=np.uint64)
        h = splitmix64(np.uint64(fnv1a64(name)) ^ (idx * np.uint64(0x9E3779B97F4A7C15)))
    u = (h >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)  # [0, 1), 24 bits, exact
    s = (np.float32(2.0) * u - np.float32(1.0)).astype(np.float32)  # [-1, 1), exact
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("running_var"):
        v = np.float32(0.5) + u
    elif name.endswith("running_mean") or leaf == "bias":
        v = s * np.float32(0.1)
    elif ".bn." in name or name.endswith("norm.weight") or (leaf == "weight" and len(shape) == 1):
        v = np.float32(1.0) + s * np.float32(0.25)
    else:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else int(shape[0])
        bound = np.float32(math.sqrt(3.0 / fan_in))
        v = s * bound
    return v.astype(np.float32).reshape(shape)


def deterministic_botnet():
    model = timm.create_model("botnet26t_256", pretrained=False)
    sd = model.state_dict()
    new = {}
    for k, t in sd.items():
        if k.endswith("num_batches_tracked"):
            new[k] = t
        else:
            new[k] = torch.from_numpy(deterministic_tensor(k, tuple(t.shape)))
    model.load_state_dict(new)
    return model.eval()


# (case name, settings, photos): settings as timm's create_transform takes them.
PHOTO_FILES = ["rocket.jpg", "chelsea.png", "coins.png", "horse.png"]
CASES = [
    ("botnet26t_256", None, PHOTO_FILES),  # timm's pretrained cfg of botnet26t_256
    ("bilinear_96", dict(input_size=(3, 96, 96), interpolation="bilinear", crop_pct=0.875, crop_mode="center"),
     PHOTO_FILES),
    ("bicubic_rect_64x96", dict(input_size=(3, 64, 96), interpolation="bicubic", crop_pct=0.875,
                                crop_mode="center"), ["rocket.jpg", "coins.png"]),
    ("squash_80x112", dict(input_size=(3, 80, 112), interpolation="bicubic", crop_pct=0.9, crop_mode="squash"),
     ["chelsea.png", "rocket.jpg"]),
    ("border_72x96", dict(input_size=(3, 72, 96), interpolation="bilinear", crop_pct=0.95, crop_mode="border"),
     ["chelsea.png", "coins.png"]),
    ("lanczos_64", dict(input_size=(3, 64, 64), interpolation="lanczos", crop_pct=0.875, crop_mode="center"),
     ["rocket.jpg"]),
    ("hamming_64", dict(input_size=(3, 64, 64), interpolation="hamming", crop_pct=0.875, crop_mode="center"),
     ["chelsea.png"]),
    ("box_64", dict(input_size=(3, 64, 64), interpolation="box", crop_pct=0.875, crop_mode="center"),
     ["coins.png"]),
    ("nearest_64", dict(input_size=(3, 64, 64), interpolation="nearest", crop_pct=0.875, crop_mode="center"),
     ["horse.png"]),
    # enlarging: the shorter side of the 400x328 horse goes to 480
    ("enlarge_bicubic_96", dict(input_size=(3, 96, 96), interpolation="bicubic", crop_pct=0.2,
                                crop_mode="center"), ["horse.png"]),
]


def main():
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    botnet = deterministic_botnet()
    botnet_cfg = resolve_data_config({}, model=botnet)
    out_dir = os.path.join(OUT, "timm_preprocess")
    os.makedirs(out_dir, exist_ok=True)
    cases = []
    for case, settings, photos in CASES:
        cfg = dict(botnet_cfg) if settings is None else dict(settings, mean=botnet_cfg["mean"], std=botnet_cfg["std"])
        full = create_transform(**cfg, is_training=False)
        # the same transform without ToTensor and Normalize: the 8-bit image just before them
        tfl = list(full.transforms)
        assert type(tfl[-1]).__name__ == "Normalize" and type(tfl[-2]).__name__ in ("ToTensor", "MaybeToTensor")
        pixels = tfl[:-2]
        for photo in photos:
            img = Image.open(os.path.join(PHOTOS, photo)).convert("RGB")  # as timm's ImageDataset loads it
            crop = img
            for t in pixels:
                crop = t(crop)
            x = full(img)
            # the normalised tensor must be (crop / 255 - mean) / std of the stored crop, as relpos computes it
            c = torch.from_numpy(np.asarray(crop, dtype=np.uint8).copy()).permute(2, 0, 1).float().div(255)
            ref = (c - torch.tensor(cfg["mean"]).view(3, 1, 1)) / torch.tensor(cfg["std"]).view(3, 1, 1)
            assert torch.equal(ref, x), f"{case} {photo}: normalisation is not what relpos assumes"
            png = f"{os.path.splitext(photo)[0]}__{case}.png"
            crop.save(os.path.join(out_dir, png))
            flat = x.numpy().reshape(-1)
            picks = np.sort(rng.choice(flat.size, size=min(256, flat.size), replace=False))
            entry = {
                "photo": photo, "case": case, "png": png,
                "input_size": list(cfg["input_size"][1:]), "interpolation": cfg["interpolation"],
                "crop_pct": cfg["crop_pct"], "crop_mode": cfg.get("crop_mode") or "center",
                "mean": list(cfg["mean"]), "std": list(cfg["std"]),
                # positions in timm's (3, H, W) tensor and their values
                "samples": [[int(i), float(flat[i])] for i in picks],
            }
            if settings is None:
                with torch.no_grad():
                    logits = botnet(x.unsqueeze(0))[0].numpy()
                entry["logits"] = [float(v) for v in logits]
                print(f"{photo}: logits in [{logits.min():.2f}, {logits.max():.2f}], top-1 {int(logits.argmax())}")
            cases.append(entry)
    golden = {
        "what": "timm eval-transform outputs and botnet26t_256 logits (deterministic weights) on real photos",
        "timm": timm.__version__, "torch": torch.__version__, "pillow": PIL.__version__,
        "model_cfg": {k: (list(v) if isinstance(v, tuple) else v) for k, v in botnet_cfg.items()},
        "cases": cases,
    }
    with open(os.path.join(OUT, "timm_preprocess.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
    print(f"wrote {len(cases)} cases to {OUT}/timm_preprocess.json and {out_dir}/", file=sys.stderr)


if __name__ == "__main__":
    main()
