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
import math
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
    "mobilenetv2": "mobilenetv2",
}
# Cases that are reduced versions of their example: the layer types they use must be the example's.
REDUCED = {"mobilenetv2"}
# Smallest distance of a ReLU/ReLU6 input from its kinks that those cases accept (f32 rounding of
# O(1) values is ~1e-7).
MIN_KINK_MARGIN = 2e-6

# Sequence cases (no example to match): token ids from data/kjv/genesis.txt (ASCII bytes), a batch
# of SEQ_BATCH windows of the model's input length, next-byte labels; cross-entropy over every token.
SEQ_CASES = ["gpt", "gpt_lora", "lstm", "gru"]
SEQ_BATCH = 4
KJV = os.path.join(ROOT, "data", "kjv", "genesis.txt")


class PosEmbedding(nn.Module):
    """frugal's pos_embedding: a learned [seq, dim] table added to every sequence."""

    def __init__(self, seq, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(seq, dim))

    def forward(self, x):
        return x + self.weight


class Attention(nn.Module):
    """frugal's attention: causal multi-head self-attention on [N, T, 3D] (q, k, v side by side)."""

    def __init__(self, heads):
        super().__init__()
        self.heads = heads

    def forward(self, qkv):
        n, t, d3 = qkv.shape
        d = d3 // 3
        dh = d // self.heads
        q, k, v = (z.reshape(n, t, self.heads, dh).transpose(1, 2) for z in qkv.split(d, dim=-1))
        s = q @ k.transpose(-1, -2) / math.sqrt(dh)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
        return (p @ v).transpose(1, 2).reshape(n, t, d)


class LoraLinear(nn.Module):
    """frugal's lora_linear (PEFT's layout): frozen weight/bias, trainable lora_A [r, in], lora_B [out, r];
    y = x·Wᵀ + b + (alpha/r)·x·Aᵀ·Bᵀ. B starts random here (PEFT: zero) so that A gets a gradient at
    the first step and the golden checks it."""

    def __init__(self, fin, fout, bias, rank, alpha):
        super().__init__()
        base = nn.Linear(fin, fout, bias=bias)
        self.weight = nn.Parameter(base.weight.detach().clone(), requires_grad=False)
        self.bias = nn.Parameter(base.bias.detach().clone(), requires_grad=False) if bias else None
        self.lora_A = nn.Linear(fin, rank, bias=False)
        self.lora_B = nn.Linear(rank, fout, bias=False)
        self.scale = alpha / rank

    def forward(self, x):
        return F.linear(x, self.weight, self.bias) + self.scale * self.lora_B(self.lora_A(x))


class LSTM(nn.LSTM):
    """frugal's lstm entry: one nn.LSTM layer, batch_first, zero initial state; every hidden state out."""

    def forward(self, x):
        return super().forward(x)[0]


class GRU(nn.GRU):
    """frugal's gru entry, as LSTM."""

    def forward(self, x):
        return super().forward(x)[0]


def frugal_name(k):
    """frugal's name of a state_dict entry: an lstm/gru entry's input projection is its own linear
    layer `{name}_ih` (weight_ih_l0, bias_ih_l0 -> {name}_ih.weight, {name}_ih.bias); every other name
    (weight_hh_l0, bias_hh_l0 included) is PyTorch's."""
    for suffix, new in ((".weight_ih_l0", "_ih.weight"), (".bias_ih_l0", "_ih.bias")):
        if k.endswith(suffix):
            return k[: -len(suffix)] + new
    return k


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


def make_divisible(v, d=8):
    """torchvision's MobileNet channel rounding (the nearest multiple of d, at least d, not below 90 %)."""
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def expand_layers(spec, shapes, L, i):
    """The plain layers one TOML entry stands for: the entry itself (conv2d out scaled by [model]
    width), or an inverted_residual's blocks, written out here independently of frugal's parser
    (MobileNetV2, Sandler et al. 2018: expand 1x1 -> BN -> ReLU6 -> depthwise 3x3 -> BN -> ReLU6 ->
    project 1x1 -> BN, + input where stride 1 and channels match)."""
    width = spec["model"].get("width")
    t = L["type"]
    name = L.get("name", f"{t}{i}")
    if t == "conv2d" and width is not None and L.get("scale_width", True):
        L = dict(L, out=make_divisible(L["out"] * width))
        L.pop("scale_width", None)
    if t != "inverted_residual":
        return [dict(L, name=name)]
    out = L["out"] if width is None else make_divisible(L["out"] * width)
    src = L.get("inputs", [None])[0]
    cin = shapes[src][0]
    extra = {} if L.get("trainable", True) else {"trainable": False}
    layers = []
    for b in range(L.get("repeat", 1)):
        s = L.get("stride", 1) if b == 0 else 1
        hidden = cin * L["expand"]
        block_in, x = src, src
        def push(suffix, **kw):
            nonlocal x
            layers.append(dict(name=f"{name}_{b}_{suffix}", inputs=[x], **kw, **extra))
            x = layers[-1]["name"]
        if L["expand"] != 1:
            push("expand", type="conv2d", out=hidden, kernel=1, bias=False)
            push("expand_bn", type="batchnorm2d")
            push("expand_relu", type="relu6")
        push("dw", type="conv2d", out=hidden, kernel=3, stride=s, padding=1, groups=hidden, bias=False)
        push("dw_bn", type="batchnorm2d")
        push("dw_relu", type="relu6")
        push("project", type="conv2d", out=out, kernel=1, bias=False)
        push("project_bn", type="batchnorm2d")
        if s == 1 and cin == out:
            layers.append(dict(name=f"{name}_{b}_add", type="add", inputs=[block_in, x], **extra))
            x = layers[-1]["name"]
        src = x
        cin = out
    return layers


class Net(nn.Module):
    """A frugal ModelSpec as a PyTorch module. Activations are kept as [N, C, H, W] throughout
    (a flat vector of F features is [N, F, 1, 1]), as in frugal."""

    def __init__(self, spec):
        super().__init__()
        c, h, w = spec["model"]["input"] + [1] * (3 - len(spec["model"]["input"]))
        shapes = {"input": (c, h, w)}
        if spec["layers"][0]["type"] == "embedding":  # token ids: [N, T]
            shapes = {"input": (c, 1, 1)}
        self.graph = []  # (name, type, input names, extra)
        prev = "input"
        self.lora = spec.get("lora")
        aliases = {}  # an inverted_residual's name -> its last generated layer
        for i, entry in enumerate(spec["layers"]):
            entry = dict(entry)
            entry["inputs"] = [aliases.get(s, s) for s in entry.get("inputs", [prev])]
            expanded = expand_layers(spec, shapes, entry, i)
            if entry["type"] == "inverted_residual":
                aliases[entry.get("name", f"inverted_residual{i}")] = expanded[-1]["name"]
            for L in expanded:
                prev = self.add_layer(L, shapes)

    def add_layer(self, L, shapes):
        t = L["type"]
        name = L["name"]
        assert name not in shapes, f"duplicate layer name {name}"
        srcs = L["inputs"]
        ins = [shapes[s] for s in srcs]
        c, h, w = ins[0]
        seq = c == "seq"
        extra = None
        lora = self.lora
        is_lora = t == "linear" and lora and any(
            name == tg or name.endswith("." + tg) for tg in lora["targets"])
        if is_lora:
            mod = LoraLinear(w if seq else c * h * w, L["out"], L.get("bias", True),
                             lora["rank"], lora.get("alpha", lora["rank"]))
            out = ("seq", h, L["out"]) if seq else (L["out"], 1, 1)
        elif t == "linear":
            mod = nn.Linear(w if seq else c * h * w, L["out"], bias=L.get("bias", True))
            out = ("seq", h, L["out"]) if seq else (L["out"], 1, 1)
        elif t == "embedding":
            mod, out = nn.Embedding(L["vocab"], L["dim"]), ("seq", c, L["dim"])
        elif t == "pos_embedding":
            mod, out = PosEmbedding(h, w), ins[0]
        elif t == "layernorm":
            mod, out = nn.LayerNorm(w, eps=L.get("eps", 1e-5)), ins[0]
        elif t == "rmsnorm":
            mod, out = nn.RMSNorm(w, eps=L.get("eps", 1e-6)), ins[0]
        elif t in ("gelu", "silu"):
            mod, out = (nn.GELU() if t == "gelu" else nn.SiLU()), ins[0]
        elif t == "attention":
            mod, out = Attention(L["heads"]), ("seq", h, w // 3)
        elif t in ("lstm", "gru"):
            mod = (LSTM if t == "lstm" else GRU)(w, L["hidden"], batch_first=True)
            out = ("seq", h, L["hidden"])
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
            self.put(name, mod)
            if lora and not is_lora:  # LoRA fine-tuning: everything but the adapters frozen
                mod.requires_grad_(False)
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
        return name

    def put(self, name, mod):
        """Adds `mod` under a dotted name (`h0.ln1`) through nested containers, so that state_dict
        keys are frugal's parameter names."""
        *path, last = name.split(".")
        parent = self
        for p in path:
            if not hasattr(parent, p):
                parent.add_module(p, nn.Module())
            parent = getattr(parent, p)
        parent.add_module(last, mod)

    def get(self, name):
        m = self
        for p in name.split("."):
            m = getattr(m, p)
        return m

    def train(self, mode=True):
        super().train(mode)
        for name, t, _, extra, _ in self.graph:  # a frozen BatchNorm runs in eval mode
            if t == "batchnorm2d" and extra == "frozen":
                self.get(name).eval()
        return self

    def forward(self, x):
        n = x.shape[0]
        if self.graph[0][1] == "embedding":
            x = x.long()
        acts = {"input": x}
        for name, t, srcs, _, out in self.graph:
            ins = [acts[s] for s in srcs]
            if t == "linear" and out[0] == "seq":
                y = self.get(name)(ins[0])
            elif t == "linear":
                y = self.get(name)(ins[0].reshape(n, -1)).reshape(n, *out)
            elif t in ("flatten", "reshape"):
                y = ins[0].reshape(n, *out)
            elif t == "add":
                y = ins[0] + ins[1]
            else:
                y = self.get(name)(ins[0])
            acts[name] = y
        return y if self.graph[-1][4][0] == "seq" else y.reshape(n, -1)


def make_optimizer(spec, params):
    o = spec["optimizer"]
    wd = o.get("weight_decay", 0.0)
    if o["type"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"], betas=(o.get("beta1", 0.9), o.get("beta2", 0.999)),
                                eps=o.get("eps", 1e-8), weight_decay=wd, foreach=False)
    if o["type"] == "adamw":
        return torch.optim.AdamW(params, lr=o["lr"], betas=(o.get("beta1", 0.9), o.get("beta2", 0.999)),
                                 eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01),
                                 foreach=False)
    if o["type"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o.get("momentum", 0.0), dampening=0.0,
                               nesterov=False, weight_decay=wd, foreach=False)
    sys.exit(f"unknown optimizer {o['type']}")


def state(model, prefix):
    return {f"{prefix}.{frugal_name(k)}": v.detach().clone().float().contiguous()
            for k, v in model.state_dict().items() if not k.endswith("num_batches_tracked")}


def f32_errors(spec, out, x, y):
    """PyTorch's own float32 error, per tensor, against the same 3 steps in float64 from the same
    initial state: `f32err.grad0.P` and `f32err.final.P`, each one value, norm-wise
    (||f32 - f64|| / ||f64||). Where a true value is zero or nearly so (a bias whose every path ends
    in a training-mode BatchNorm through linear maps: the batch mean removes it; a BatchNorm scale
    before ReLU6 and a depthwise convolution into BatchNorm), the float32 result is rounding noise and
    this is large: no float32 implementation can be expected nearer to PyTorch's than that."""
    model = Net(spec).double()
    model.train()
    model.load_state_dict({k[5:]: v.double() for k, v in out.items() if k.startswith("init.")},
                          strict=False)
    opt = make_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    errs = {}
    def err(a, b):
        return torch.tensor([((a.double() - b).norm() / b.norm().clamp_min(1e-300)).item()],
                            dtype=torch.float32)
    for step in range(STEPS):
        opt.zero_grad()
        F.cross_entropy(model(x.double()), y).backward()
        if step == 0:
            for k, p in model.named_parameters():
                if p.requires_grad:
                    errs[f"f32err.grad0.{k}"] = err(out[f"grad0.{k}"], p.grad)
        opt.step()
    for k, v in model.state_dict().items():
        if not k.endswith("num_batches_tracked"):
            errs[f"f32err.final.{k}"] = err(out[f"final.{k}"], v)
    return errs


def load_toml(path):
    with open(path, "rb") as f:
        return tomllib.load(f)


def run_case(name, x, y):
    spec = load_toml(os.path.join(HERE, f"{name}.toml"))
    if CASES.get(name) is not None:
        example = load_toml(os.path.join(ROOT, "examples", f"{CASES[name]}.toml"))
        if name in REDUCED:
            types = lambda s: {(L["type"], L.get("expand") == 1) for L in s["layers"]}
            assert types(spec) == types(example) and "width" in spec["model"], \
                f"{name}.toml no longer has the layer types of examples/{CASES[name]}.toml"
        else:
            assert spec["model"] == example["model"] and spec["layers"] == example["layers"], \
                f"{name}.toml no longer matches examples/{CASES[name]}.toml"
    assert spec["model"]["loss"] == "cross_entropy"

    torch.manual_seed(spec["model"].get("seed", 0))
    model = Net(spec)
    model.train()
    # How close any ReLU/ReLU6 input comes to a kink (0, or 6) over the 3 steps. An input within f32
    # rounding of one takes either side in another implementation, and that element's gradient is then
    # passed or dropped: a legitimate difference far above 1e-5 (a deep BatchNorm net has ~10^5 such
    # inputs per step). The deep cases pick a seed that keeps them clear (asserted below).
    margin = [float("inf")]
    def kink_hook(mod, inp, _out):
        v = inp[0].detach()
        d = v.abs().min().item()
        if isinstance(mod, nn.ReLU6):
            d = min(d, (v - 6).abs().min().item())
        margin[0] = min(margin[0], d)
    for mod in model.modules():
        if isinstance(mod, (nn.ReLU, nn.ReLU6)):
            mod.register_forward_hook(kink_hook)
    out = {"x": x.float(), "y": y.float()}
    out.update(state(model, "init"))
    opt = make_optimizer(spec, [p for p in model.parameters() if p.requires_grad])
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if step == 0:
            out["logits0"] = logits.detach().clone()
            for k, p in model.named_parameters():
                if p.requires_grad:
                    out[f"grad0.{frugal_name(k)}"] = p.grad.detach().clone()
        opt.step()
        losses.append(loss.item())
    if name in REDUCED:
        assert margin[0] > MIN_KINK_MARGIN, \
            f"{name}: an activation input is {margin[0]:.1e} from a kink; choose another [model] seed"
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    out.update(state(model, "final"))
    if name in REDUCED:
        out.update(f32_errors(spec, out, x, y))
    out = {k: v.contiguous() for k, v in out.items()}
    for k, v in out.items():
        assert v.dtype == torch.float32 and torch.isfinite(v).all(), k
    meta = {"case": name, "torch": torch.__version__, "steps": str(STEPS), "batch": str(x.shape[0]),
            "model": f"tests/golden/{name}.toml"}
    # One metadata key: safetensors writes a multi-key metadata map in random order.
    path = os.path.join(HERE, f"{name}.safetensors")
    save_file(out, path, metadata={"golden": json.dumps(meta, sort_keys=True)})
    os.chmod(path, 0o644)
    return losses, {k: list(v.shape) for k, v in sorted(out.items())}


def main():
    # `gen.py CASE...` regenerates only those cases (the manifest keeps the others): PyTorch's CPU
    # kernels may round differently on another machine, and unchanged cases should stay byte-identical.
    only = set(sys.argv[1:])
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    images = read_idx(os.path.join(DIGITS, "digits-train-images.idx"))
    labels = read_idx(os.path.join(DIGITS, "digits-train-labels.idx"))
    x = (images[:BATCH].float() / 16.0).reshape(BATCH, 1, 8, 8).contiguous()
    y = labels[:BATCH].long()
    manifest = {"torch": torch.__version__, "batch": BATCH, "steps": STEPS, "cases": {}}
    if only:
        with open(os.path.join(HERE, "manifest.json")) as f:
            manifest["cases"] = json.load(f)["cases"]
    for name in CASES:
        if only and name not in only:
            continue
        losses, shapes = run_case(name, x, y)
        manifest["cases"][name] = {"losses": losses, "tensors": shapes}
        print(f"{name:12s} losses " + " ".join(f"{l:.6f}" for l in losses))
    with open(KJV, "rb") as f:
        text = f.read()
    for name in SEQ_CASES:
        if only and name not in only:
            continue
        t = load_toml(os.path.join(HERE, f"{name}.toml"))["model"]["input"][0]
        ids = torch.tensor(list(text[: SEQ_BATCH * t + 1]), dtype=torch.long)
        assert int(ids.max()) < 128, "the golden sequence cases use ASCII text (vocab 128)"
        sx = ids[:-1].reshape(SEQ_BATCH, t)
        sy = ids[1:].reshape(SEQ_BATCH, t)
        losses, shapes = run_case(name, sx, sy)
        manifest["cases"][name] = {"losses": losses, "tensors": shapes}
        print(f"{name:12s} losses " + " ".join(f"{l:.6f}" for l in losses))
    with open(os.path.join(HERE, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
