#!/usr/bin/env python3
"""Writes the golden data of tests/test_pil_resize.cpp: Pillow's own resizes of real photographs.

Sources are crops of tests/data/photos (scikit-image's photographs), chosen so that both of
Pillow's pass orders occur: Pillow 13 runs the vertical pass first when the height shrinks by more
than twice as many pixels as the width (Pillow 12 and older always run the horizontal pass
first). Each case stores the source crop and Pillow's output as lossless PNGs in
tests/golden/pil_resize/ and a line in tests/golden/pil_resize.json.

Run with any Python that has Pillow (>= 13) and numpy:
    python3 tools/make_pil_resize_golden.py
"""
import json
import os

import numpy as np
import PIL
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHOTOS = os.path.join(ROOT, "tests", "data", "photos")
OUT = os.path.join(ROOT, "tests", "golden", "pil_resize")

FILTERS = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "lanczos": Image.LANCZOS, "box": Image.BOX,
           "hamming": Image.HAMMING}

# (photo, crop box left, top, right, bottom, output w, h, filters)
CASES = [
    ("rocket.jpg", 100, 0, 164, 400, 48, 100, list(FILTERS)),  # tall strip, height shrinks most: vertical first
    ("rocket.jpg", 0, 40, 200, 340, 150, 100, ["bicubic", "bilinear"]),  # 200x300 -> 150x100: vertical first
    ("chelsea.png", 0, 0, 300, 200, 100, 150, ["bicubic"]),  # height grows: horizontal first
    ("chelsea.png", 10, 10, 266, 266, 224, 224, ["bicubic", "bilinear"]),  # square: horizontal first
    ("chelsea.png", 0, 0, 400, 60, 90, 20, ["bicubic"]),  # wide strip: horizontal first
    ("rocket.jpg", 50, 0, 60, 500, 7, 23, ["bicubic", "lanczos"]),  # 10x500 -> 7x23: vertical first
]


def main():
    os.makedirs(OUT, exist_ok=True)
    cases = []
    for photo, l, t, r, b, w, h, filters in CASES:
        src = Image.open(os.path.join(PHOTOS, photo)).convert("RGB").crop((l, t, r, b))
        src_name = f"{os.path.splitext(photo)[0]}_{l}_{t}_{r}_{b}.png"
        src.save(os.path.join(OUT, src_name))
        in_w, in_h = src.size
        vertical_first = (in_h - h) > 0 and (in_h - h) > (in_w - w) * 2
        for f in filters:
            out = src.resize((w, h), FILTERS[f])
            out_name = f"{os.path.splitext(src_name)[0]}__{f}_{w}x{h}.png"
            out.save(os.path.join(OUT, out_name))
            cases.append({"source": src_name, "filter": f, "width": w, "height": h, "output": out_name,
                          "vertical_first": vertical_first})
    with open(os.path.join(OUT, "..", "pil_resize.json"), "w") as fh:
        json.dump({"what": "Pillow resizes of photo crops (tools/make_pil_resize_golden.py)",
                   "pillow": PIL.__version__, "cases": cases}, fh, indent=1)
    print(f"{len(cases)} cases, Pillow {PIL.__version__}")


if __name__ == "__main__":
    main()
