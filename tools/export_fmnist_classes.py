#!/usr/bin/env python3
"""Exports some Fashion-MNIST classes as a folder dataset of PNG files, for `relpos train --data`:
OUT/train/<class>/NNNNN.png and OUT/test/<class>/NNNNN.png (the first images of each class in the
files' order). Standard library only.

  tools/export_fmnist_classes.py OUT --classes 1,8,9 --train 300 --test 200
  tools/export_fmnist_classes.py OUT --classes 1,8,9 --names a,b,c     # folders not named as labels
"""
import argparse
import gzip
import os
import struct
import zlib

LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return dims, data[4 + 4 * ndim:]


def png_gray(width, height, pixels):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--classes", default="1,8,9", help="class indices, comma-separated (default: Trouser, Bag, Ankle boot)")
    ap.add_argument("--names", help="folder names, comma-separated (default: the labels, '/' written as '_')")
    ap.add_argument("--train", type=int, default=300, help="training images per class")
    ap.add_argument("--test", type=int, default=200, help="test images per class")
    ap.add_argument("--source", default="/usr/share/datasets/fashion-mnist")
    a = ap.parse_args()
    classes = [int(c) for c in a.classes.split(",")]
    names = a.names.split(",") if a.names else [LABELS[c].replace("/", "_") for c in classes]
    if len(names) != len(classes):
        ap.error("--names needs one name per class")
    for split, stem, count in (("train", "train", a.train), ("test", "t10k", a.test)):
        dims, pixels = read_idx(f"{a.source}/{stem}-images-idx3-ubyte.gz")
        h, w = dims[1], dims[2]
        _, labels = read_idx(f"{a.source}/{stem}-labels-idx1-ubyte.gz")
        for c, name in zip(classes, names):
            folder = os.path.join(a.out, split, name)
            os.makedirs(folder, exist_ok=True)
            written = 0
            for i, label in enumerate(labels):
                if written == count:
                    break
                if label != c:
                    continue
                with open(os.path.join(folder, f"{i:05d}.png"), "wb") as f:
                    f.write(png_gray(w, h, pixels[i * w * h:(i + 1) * w * h]))
                written += 1
        print(f"{split}: {len(classes)} classes, up to {count} images each, in {os.path.join(a.out, split)}")


if __name__ == "__main__":
    main()
