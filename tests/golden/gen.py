#!/usr/bin/env python3
"""Generate the PyTorch golden references in tests/golden/.

Run from anywhere, in the PyTorch venv (see README.md):
    ~/.cache/frugal-torch-venv/bin/python tests/golden/gen.py

For each case NAME in CASES, this reads tests/golden/NAME.toml (the frugal model format,
docs/model-format.md), builds the same network in PyTorch with one module per TOML layer, named
exactly like the layer (so state_dict keys are `conv1.weight`, `stem_bn.running_mean`, ...), and
with torch.manual_seed(0), float32, one thread, PyTorch's default init and model.train():

  x = the first 32 samples of data/digits/digits-train-images.idx, pixels / 16, shape [32,1,8,8]
  y = their labels, [32]
  3 times: zero_grad; logits = model(x); loss = F.cross_entropy(logits, y) (mean); backward;
           optimizer step (torch.optim.Adam / SGD, foreach=False)

and writes tests/golden/NAME.safetensors (all F32):
  x [32,1,8,8], y [32] (class indices as f32), losses [3],
  logits0 [32,10]   the logits of the first forward pass,
  init.P            every state_dict entry before training (num_batches_tracked skipped),
  grad0.P           the gradient of every trainable parameter at the first step,
  final.P           every state_dict entry after the 3 steps (BatchNorm running stats included),
plus tests/golden/manifest.json (torch version, per-case losses, tensor shapes). Deterministic:
rerunning with the same torch version reproduces the files byte for byte.
"""
import json
import os
import struct
import sys
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DIGITS = os.path.join(ROOT, "data", "digits")
BATCH = 32
STEPS = 3

# case name -> the example whose [model] and [[layers]] it must share (checked below).
CASES = {
    "mlp": "digits-mlp",
    "cnn": "digits-cnn",
    "residual_bn": "residual-bn",
    "cnn_sgd": "digits-cnn",
    # A sparse update (per-layer `update`: channel subsets, bias only, frozen) of the residual-BN
    # architecture; no example holds it.
    "sparse": None,
}


def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def read_idx(path):
    with open(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    assert magic >> 8 == 0x08, f"{path}: not a u8 IDX file"
    rank = magic & 0xFF
    dims = struct.unpack(f">{rank}I", data[4 : 4 + 4 * rank])
    body = data[4 + 4 * rank :]
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


class Net(nn.Module):
    """A frugal ModelSpec as a PyTorch module. Activations are kept as [N, C, H, W] throughout
    (a flat vector of F features is [N, F, 1, 1]), as in frugal."""

    def __init__(self, spec):
        super().__init__()
        c, h, w = spec["model"]["input"] + [1] * (3 - len(spec["model"]["input"]))
        shapes = {"input": (c, h, w)}
        self.graph = []  # (name, type, input names, extra)
        prev = "input"
        for i, L in enumerate(spec["layers"]):
            t = L["type"]
            name = L.get("name", f"{t}{i}")
            assert name not in shapes, f"duplicate layer name {name}"
            srcs = L.get("inputs", [prev])
            ins = [shapes[s] for s in srcs]
            c, h, w = ins[0]
            extra = None
            if t == "linear":
                mod = nn.Linear(c * h * w, L["out"], bias=L.get("bias", True))
                out = (L["out"], 1, 1)
            elif t == "conv2d":
                k, s, p = pair(L["kernel"]), pair(L.get("stride", 1)), pair(L.get("padding", 0))
                g = L.get("groups", 1)
                mod = nn.Conv2d(c, L["out"], k, s, p, groups=g, bias=L.get("bias", True))
                out = (L["out"], (h + 2 * p[0] - k[0]) // s[0] + 1, (w + 2 * p[1] - k[1]) // s[1] + 1)
            elif t in ("maxpool2d", "avgpool2d"):
                k = pair(L["kernel"])
                s = pair(L.get("stride", L["kernel"]))
                mod = (nn.MaxPool2d if t == "maxpool2d" else nn.AvgPool2d)(k, s)
                out = (c, (h - k[0]) // s[0] + 1, (w - k[1]) // s[1] + 1)
            elif t == "global_avgpool":
                mod, out = nn.AdaptiveAvgPool2d(1), (c, 1, 1)
            elif t in ("relu", "relu6", "sigmoid", "tanh"):
                mod = {"relu": nn.ReLU, "relu6": nn.ReLU6, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh}[t]()
                out = (c, h, w)
            elif t == "flatten":
                mod, out = None, (c * h * w, 1, 1)
            elif t == "reshape":
                mod, out = None, tuple(L["to"])
            elif t == "add":
                assert len(ins) == 2 and ins[0] == ins[1], f"{name}: add needs two equal shapes"
                mod, out = None, (c, h, w)
            elif t == "batchnorm2d":
                mod = nn.BatchNorm2d(c, eps=L.get("eps", 1e-5), momentum=L.get("momentum", 0.1))
                out = (c, h, w)
            else:
                sys.exit(f"{name}: layer type {t} not supported here (dropout masks would not match)")
            if mod is not None:
                self.add_module(name, mod)
                upd = L.get("update", "all")
                if not L.get("trainable", True) or upd == "frozen":
                    mod.requires_grad_(False)
                    extra = "frozen"
                elif upd == "bias":
                    # Only the bias (β) trains; a BatchNorm stays in training mode.
                    mod.weight.requires_grad_(False)
                elif isinstance(upd, dict):
                    # The leading ceil(f·C) output channels train (f·C rounded in f32, as frugal):
                    # the other rows' gradients are zeroed, so Adam (wd 0) leaves them unchanged.
                    rows = int(torch.ceil(torch.tensor(upd["channels"], dtype=torch.float32)
                                          * mod.weight.shape[0]).item())
                    for p in mod.parameters():
                        p.register_hook(lambda g, rows=rows: torch.cat([g[:rows], torch.zeros_like(g[rows:])]))
            self.graph.append((name, t, srcs, extra, out))
            shapes[name] = out
            prev = name

    def train(self, mode=True):
        super().train(mode)
        for name, t, _, extra, _ in self.graph:  # a frozen BatchNorm runs in eval mode
            if t == "batchnorm2d" and extra == "frozen":
                getattr(self, name).eval()
        return self

    def forward(self, x):
        n = x.shape[0]
        acts = {"input": x}
        for name, t, srcs, _, out in self.graph:
            ins = [acts[s] for s in srcs]
            if t == "linear":
                y = getattr(self, name)(ins[0].reshape(n, -1)).reshape(n, *out)
            elif t in ("flatten", "reshape"):
                y = ins[0].reshape(n, *out)
            elif t == "add":
                y = ins[0] + ins[1]
            else:
                y = getattr(self, name)(ins[0])
            acts[name] = y
        return y.reshape(n, -1)


def make_optimizer(spec, params):
    o = spec["optimizer"]
    wd = o.get("weight_decay", 0.0)
    if o["type"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"], betas=(o.get("beta1", 0.9), o.get("beta2", 0.999)),
                                eps=o.get("eps", 1e-8), weight_decay=wd, foreach=False)
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0), dampening=0.0,
                               nesterov=False, weight_decay=wd, foreach=False)
    sys.exit(f"unknown optimizer {o['type']}")


def state(model, prefix):
    return {f"{prefix}.{k}": v.detach().clone().float().contiguous()
            for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def load_toml(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def run_case(name, x, y):
    spec = load_toml(os.path.join(HERE, f"{name}.toml"))
    if CASES[name] is not None:
        example = load_toml(os.path.join(ROOT, "examples", f"{CASES[name]}.toml"))
        assert spec["model"] == example["model"] and spec["layers"] == example["layers"], \
            f"{name}.toml no longer matches examples/{CASES[name]}.toml"
    assert spec["model"]["loss"] == "cross_entropy"

    torch.manual_seed(spec["model"].get("seed", 0))
    model = Net(spec)
    model.train()
    out = {"x": x, "y": y.float()}
    out.update(state(model, "init"))
    opt = make_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        if step == 0:
            out["logits0"] = logits.detach().clone()
            for k, p in model.named_parameters():
                if p.requires_grad:
                    out[f"grad0.{k}"] = p.grad.detach().clone()
        opt.step()
        losses.append(loss.item())
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out.update(state(model, "final"))
    out = {k: v.contiguous() for k, v in out.items()}
    for k, v in out.items():
        assert v.dtype == torch.float32 and torch.isfinite(v).all(), k
    meta = {"case": name, "torch": torch.__version__, "steps": str(STEPS), "batch": str(BATCH),
            "model": f"tests/golden/{name}.toml"}
    # One metadata key: safetensors writes a multi-key metadata map in random order.
    path = os.path.join(HERE, f"{name}.safetensors")
    save_file(out, path, metadata={"golden": json.dumps(meta, sort_keys=True)})
    os.chmod(path, 0o644)
    return losses, {k: list(v.shape) for k, v in sorted(out.items())}


def main():
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    images = read_idx(os.path.join(DIGITS, "digits-train-images.idx"))
    labels = read_idx(os.path.join(DIGITS, "digits-train-labels.idx"))
    x = (images[:BATCH].float() / 16.0).reshape(BATCH, 1, 8, 8).contiguous()
    y = labels[:BATCH].long()
    manifest = {"torch": torch.__version__, "batch": BATCH, "steps": STEPS, "cases": {}}
    for name in CASES:
        losses, shapes = run_case(name, x, y)
        manifest["cases"][name] = {"losses": losses, "tensors": shapes}
        print(f"{name:12s} losses " + " ".join(f"{l:.6f}" for l in losses))
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
