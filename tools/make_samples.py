#!/usr/bin/env python3
"""Writes a few Fashion-MNIST test images per class as PNGs (samples/<class>_<test index>.png).

Uses only the standard library: the IDX files from Debian's dataset-fashion-mnist package.
    python3 tools/make_samples.py [--per-class 3] [--out samples]
"""
import argparse
import gzip
import os
import struct
import zlib

CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def write_png(path, width, height, pixels):
    raw = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-class", type=int, default=3)
    ap.add_argument("--out", default="samples")
    a = ap.parse_args()
    (n, h, w), images = read_idx(os.path.join(DATA, "t10k-images-idx3-ubyte.gz"))
    _, labels = read_idx(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz"))
    os.makedirs(a.out, exist_ok=True)
    count = [0] * 10
    for i in range(n):
        c = labels[i]
        if count[c] >= a.per_class:
            continue
        count[c] += 1
        slug = CLASSES[c].lower().replace("/", "-").replace(" ", "-")
        write_png(os.path.join(a.out, f"{slug}_{i:05d}.png"), w, h, images[i * h * w:(i + 1) * h * w])
        if min(count) >= a.per_class:
            break


if __name__ == "__main__":
    main()
