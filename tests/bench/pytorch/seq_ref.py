#!/usr/bin/env python3
"""PyTorch reference for `cargo xtask bench seq`: examples/char-gpt.toml (or `--model`, e.g.
char-lstm.toml: nn.LSTM) built as a PyTorch module (by tests/golden/gen.py's Net, one module per TOML
layer), trained with the file's optimizer (gen.py's make_optimizer: AdamW, Adam) on windows of
data/kjv/genesis.txt; 1 thread (the caller sets OMP_NUM_THREADS too). Prints
`SUMMARY <median ms/step> <peak RSS over the baseline, bytes>`: the baseline is the RSS after the model
and data are built, the peak the kernel's high-water mark after it is reset there (as torch_ref.py).
AdamW allocates its state inside the first step, so the peak holds optimizer state, gradients and
activations but not the weights; the frugal side (`cargo xtask bench seq`) takes its baseline with the
weights written and its arena's optimizer state, gradients and activations not yet touched.
"""
import argparse
import os
import sys
import time
import tomllib

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
from gen import Net, make_optimizer  # noqa: E402


def kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--model", default="char-gpt.toml")
    a = ap.parse_args()
    torch.set_num_threads(1)
    with open(os.path.join(ROOT, "examples", a.model), "rb") as f:
        spec = tomllib.load(f)
    torch.manual_seed(1)
    model = Net(spec)
    model.train()
    opt = make_optimizer(spec, model.parameters())
    t = spec["model"]["input"][0]
    with open(os.path.join(ROOT, "data", "kjv", "genesis.txt"), "rb") as f:
        text = f.read()
    ids = torch.tensor(list(text[: a.batch * t + 1]), dtype=torch.long)
    x, y = ids[:-1].reshape(a.batch, t).float(), ids[1:].reshape(a.batch, t)
    base = kib("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

    def step():
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(a.steps):
        s = time.perf_counter()
        step()
        times.append((time.perf_counter() - s) * 1e3)
    times.sort()
    peak = kib("VmHWM:")
    print(f"SUMMARY {times[len(times) // 2]:.3f} {(peak - base) * 1024}")


if __name__ == "__main__":
    main()
