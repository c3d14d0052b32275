#!/usr/bin/env python3
"""Convert scikit-learn's copy of the UCI handwritten digits into MNIST-style IDX files.

Source: ``sklearn/datasets/data/digits.csv.gz`` as shipped inside the scikit-learn wheel
(1797 rows; 64 pixel values 0..16 of an 8x8 image in row-major order, then the label 0..9).

Fixed, deterministic split: row ``i`` (0-based, in the file's order) goes to the TEST set iff
``i % 5 == 0`` (360 samples), otherwise to the TRAIN set (1437 samples). Order is kept.

Outputs (next to this script):
    digits-train-images.idx  magic 0x00000803, dims [1437, 8, 8], u8 pixels 0..16
    digits-train-labels.idx  magic 0x00000801, dims [1437],       u8 labels 0..9
    digits-test-images.idx   magic 0x00000803, dims [360, 8, 8],  u8 pixels 0..16
    digits-test-labels.idx   magic 0x00000801, dims [360],        u8 labels 0..9
IDX layout: 4-byte big-endian magic (0x0000, type 0x08 = u8, rank), rank big-endian u32 dims,
then the raw u8 data.

Usage:
    python3 data/digits/make.py [PATH/TO/digits.csv.gz]
Without a path it uses the file of an installed scikit-learn (located without importing it).
To get the file without installing scikit-learn:
    pip download --no-deps -d /tmp/skl scikit-learn
    unzip -j /tmp/skl/scikit_learn-*.whl sklearn/datasets/data/digits.csv.gz -d /tmp/skl
    python3 data/digits/make.py /tmp/skl/digits.csv.gz
Only the Python standard library is needed. The output bytes depend only on the CSV contents.
"""
import csv
import gzip
import importlib.util
import io
import os
import struct
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
N_EXPECTED = 1797


def default_source():
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("no path given and scikit-learn is not installed; see the docstring for how to get digits.csv.gz")
    return os.path.join(list(spec.submodule_search_locations)[0], "datasets", "data", "digits.csv.gz")


def read_rows(path):
    with open(path, "rb") as f:
        text = gzip.decompress(f.read()).decode("ascii")
    rows = []
    for rec in csv.reader(io.StringIO(text)):
        if not rec:
            continue
        vals = [int(float(v)) for v in rec]
        if len(vals) != 65:
            sys.exit(f"expected 65 columns, got {len(vals)}")
        pixels, label = vals[:64], vals[64]
        if not all(0 <= p <= 16 for p in pixels) or not 0 <= label <= 9:
            sys.exit(f"value out of range in row {len(rows)}")
        rows.append((bytes(pixels), label))
    if len(rows) != N_EXPECTED:
        sys.exit(f"expected {N_EXPECTED} rows, got {len(rows)}")
    return rows


def write_idx(path, dims, data):
    header = struct.pack(">I", 0x00000800 | len(dims)) + b"".join(struct.pack(">I", d) for d in dims)
    with open(path, "wb") as f:
        f.write(header + data)


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else default_source()
    rows = read_rows(src)
    splits = {
        "train": [r for i, r in enumerate(rows) if i % 5 != 0],
        "test": [r for i, r in enumerate(rows) if i % 5 == 0],
    }
    for name, part in splits.items():
        n = len(part)
        write_idx(os.path.join(HERE, f"digits-{name}-images.idx"), [n, 8, 8], b"".join(p for p, _ in part))
        write_idx(os.path.join(HERE, f"digits-{name}-labels.idx"), [n], bytes(l for _, l in part))
        counts = Counter(l for _, l in part)
        print(f"{name}: {n} samples; per class " + " ".join(f"{c}:{counts[c]}" for c in range(10)))


if __name__ == "__main__":
    main()
