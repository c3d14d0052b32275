#!/usr/bin/env python3
"""PyTorch-on-CPU reference ("anchor") for small-network training cost.

frugal's copy of the reference harness (../shared/reference/pytorch-harness), so that
`cargo xtask bench memory` can run PyTorch in the same sitting, alternating with frugal per workload.
The only change: the child also prints a `SUMMARY <ms/step median> <peak over baseline bytes>` line.

Every (workload, batch, threads) runs in a FRESH child process:
    import torch -> set threads -> build model + data -> measure baseline RSS
    -> warm-up steps -> reset the kernel's RSS high-water mark -> timed steps
    -> report peak RSS (ru_maxrss over the whole run) and per-step times.

Usage:
    python torch_ref.py                       # full matrix, writes results/torch_ref.jsonl + .md
    python torch_ref.py --only linear,mlp     # subset
    python torch_ref.py --threads 1           # only 1 thread
    python torch_ref.py --repeat 2            # run the matrix twice (fresh processes each)
    python torch_ref.py --md-only             # re-render results/torch_ref.md from the jsonl
One JSON line per run goes to stdout and to results/torch_ref.jsonl.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import ideal_memory  # noqa: E402

MiB = 2 ** 20

# (workload, batches, loss) -- shapes follow NNTrainer's Table 4 where one exists
MATRIX = [
    ("linear", [64]),
    ("conv2d", [64]),
    ("lstm", [64]),
    ("lstm_native", [64]),
    ("fc3", [2048]),
    ("fc3_frozen_mid", [2048]),
    ("conv_ac_fl", [64]),
    ("lenet5", [32, 64, 128]),
    ("mlp", [32, 128, 512]),
    ("small_cnn", [32, 128]),
]


# --------------------------------------------------------------------------- child
def proc_status():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                d[k] = int(v.split()[0]) * 1024  # bytes
    return d


def maxrss_bytes():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def reset_hwm():
    """Reset VmHWM (and ru_maxrss) to the current RSS; Linux >= 4.0. Returns success."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build(workload, batch):
    import torch
    from torch import nn
    n = batch
    if workload == "linear":
        model = nn.Linear(150528, 300)
        x = torch.randn(n, 150528)
        y = torch.randn(n, 300)
        loss_fn = nn.MSELoss()
    elif workload == "conv2d":
        model = nn.Conv2d(3, 3, 3, stride=2, padding=1)
        x = torch.randn(n, 3, 224, 224)
        y = torch.randn(n, 3, 112, 112)
        loss_fn = nn.MSELoss()
    elif workload in ("lstm", "lstm_native"):
        if workload == "lstm_native":
            # same model, but keep PyTorch off the oneDNN (mkldnn) RNN kernel, whose
            # training workspace is ~12 x N x I floats; uses ATen's generic LSTM cell instead
            torch.backends.mkldnn.enabled = False

        class LSTMOnly(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm = nn.LSTM(input_size=150528, hidden_size=10, batch_first=True)

            def forward(self, x):
                return self.lstm(x)[0]  # (N, 1, 10); h0 = c0 = 0
        model = LSTMOnly()
        x = torch.randn(n, 1, 150528)
        y = torch.randn(n, 1, 10)
        loss_fn = nn.MSELoss()
    elif workload in ("fc3", "fc3_frozen_mid"):
        # 784 -> 1024 -> 1024 -> 100, no activations (pure FC-FC-FC as in the paper's name)
        model = nn.Sequential(nn.Linear(784, 1024), nn.Linear(1024, 1024), nn.Linear(1024, 100))
        if workload == "fc3_frozen_mid":
            for p in model[1].parameters():
                p.requires_grad_(False)
        x = torch.randn(n, 784)
        y = torch.randn(n, 100)
        loss_fn = nn.MSELoss()
    elif workload == "conv_ac_fl":
        model = nn.Sequential(nn.Conv2d(3, 3, 3, stride=2, padding=1), nn.Sigmoid(), nn.Flatten())
        x = torch.randn(n, 3, 224, 224)
        y = torch.randn(n, 37632)
        loss_fn = nn.MSELoss()
    elif workload == "lenet5":
        # LeNet-5 (ReLU + max-pool variant), 1x28x28 with padding 2 on conv1
        model = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
        x = torch.randn(n, 1, 28, 28)
        y = torch.randint(0, 10, (n,))
        loss_fn = nn.CrossEntropyLoss()
    elif workload == "mlp":
        model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                              nn.Linear(128, 10))
        x = torch.randn(n, 784)
        y = torch.randint(0, 10, (n,))
        loss_fn = nn.CrossEntropyLoss()
    elif workload == "small_cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * 7 * 7, 10))
        x = torch.randn(n, 1, 28, 28)
        y = torch.randint(0, 10, (n,))
        loss_fn = nn.CrossEntropyLoss()
    else:
        raise KeyError(workload)
    return model, x, y, loss_fn


def saved_tensor_bytes(model, x, y, loss_fn):
    """Bytes of distinct storages autograd saves for backward that did not exist before the
    forward pass (i.e. excluding inputs, targets and parameters). Diagnostic, run after timing."""
    import torch
    seen = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            seen[st.data_ptr()] = st.nbytes()
        except Exception:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model(x), y)
    pre = {x.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
    pre |= {p.untyped_storage().data_ptr() for p in model.parameters()}
    b = sum(v for k, v in seen.items() if k not in pre)
    del loss
    return b


def child(spec):
    t_start = time.perf_counter()
    import gc
    import torch
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model, x, y, loss_fn = build(spec["workload"], spec["batch"])
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=spec["lr"])
    gc.collect()
    base = proc_status()
    base_maxrss = maxrss_bytes()  # includes import-time transients
    # start the training high-water mark at the baseline (drops import-time transients)
    base_reset = reset_hwm()

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss

    losses = []
    warm_times = []
    for _ in range(spec["warmup"]):
        t0 = time.perf_counter()
        losses.append(float(step()))
        warm_times.append(time.perf_counter() - t0)
    after_warm = proc_status()
    # adaptive step count: at least `steps`, and at least `min_time` seconds of timed steps
    est = max(min(warm_times[1:] or warm_times), 1e-6)
    nsteps = max(spec["steps"], min(spec["max_steps"], int(spec["min_time"] / est) + 1))
    hwm_reset = reset_hwm()
    times = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(nsteps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    cpu_util = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
    losses.append(float(loss))
    end = proc_status()
    peak = maxrss_bytes()  # since the post-warm-up reset (if the reset worked)
    steady_hwm = end["VmHWM"]
    res = dict(
        workload=spec["workload"], batch=spec["batch"], threads=spec["threads"],
        torch_num_threads=torch.get_num_threads(),
        baseline_rss_bytes=base["VmRSS"], baseline_anon_bytes=base["RssAnon"],
        baseline_file_bytes=base["RssFile"],
        baseline_hwm_bytes=base["VmHWM"],
        steady_hwm_bytes=steady_hwm, hwm_reset_ok=hwm_reset and base_reset,
        end_rss_bytes=end["VmRSS"], end_anon_bytes=end["RssAnon"], end_file_bytes=end["RssFile"],
        after_warmup_rss_bytes=after_warm["VmRSS"], after_warmup_hwm_bytes=after_warm["VmHWM"],
        baseline_maxrss_bytes=base_maxrss, maxrss_after_timed_bytes=peak,
        step_times_s=times, warmup_times_s=warm_times,
        ms_per_step_median=statistics.median(times) * 1e3,
        ms_per_step_min=min(times) * 1e3,
        ms_per_step_mean=statistics.mean(times) * 1e3,
        n_steps=len(times), n_warmup=len(warm_times),
        cpu_util_timed=cpu_util,  # process CPU seconds / wall seconds over the timed steps
        loss_first=losses[0], loss_last=losses[-1],
        n_params=sum(p.numel() for p in model.parameters()),
        n_params_trainable=sum(p.numel() for p in params),
    )
    res["torch_saved_bytes"] = saved_tensor_bytes(model, x, y, loss_fn)
    res["child_wall_s"] = time.perf_counter() - t_start
    print("RESULT " + json.dumps(res), flush=True)
    # One plain line for `cargo xtask bench memory` (which alternates this child with frugal's):
    # median ms/step and the training peak over the baseline, as the parent computes it.
    whole_peak = max(res["after_warmup_hwm_bytes"], res["maxrss_after_timed_bytes"])
    print(f"SUMMARY {res['ms_per_step_median']:.6f} {whole_peak - res['baseline_rss_bytes']}", flush=True)


# --------------------------------------------------------------------------- parent
def env_info():
    info = {"python": sys.version.split()[0]}
    try:
        out = subprocess.run([sys.executable, "-c",
                              "import torch,numpy;print(torch.__version__,numpy.__version__,"
                              "torch.backends.mkldnn.is_available(),"
                              "torch.backends.cpu.get_cpu_capability())"],
                             capture_output=True, text=True, timeout=120).stdout.split()
        info.update(torch=out[0], numpy=out[1], mkldnn=out[2] == "True", cpu_capability=out[3])
    except Exception as e:  # pragma: no cover
        info["env_error"] = repr(e)
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except Exception:
        pass
    info["nproc"] = os.cpu_count()
    return info


def cpu_ticks():
    """(busy, total) jiffies over all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def host_busy(interval=1.0):
    b0, t0 = cpu_ticks()
    time.sleep(interval)
    b1, t1 = cpu_ticks()
    return (b1 - b0) / max(t1 - t0, 1)


def wait_idle(max_wait, threshold=0.15):
    """Wait (up to max_wait s) until the host is < threshold busy; return last busy fraction."""
    deadline = time.time() + max_wait
    busy = host_busy()
    while busy > threshold and time.time() < deadline:
        busy = host_busy()
    return busy


def run_one(wl, batch, threads, args, info):
    spec = dict(workload=wl, batch=batch, threads=threads, lr=args.lr, warmup=args.warmup,
                steps=args.steps, max_steps=args.max_steps, min_time=args.min_time)
    env = dict(os.environ)
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = str(threads)
    busy_before = wait_idle(args.wait_idle) if args.wait_idle > 0 else host_busy(0.5)
    load_before = os.getloadavg()
    import resource
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    tb0, tt0 = cpu_ticks()
    t0 = time.time()
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                       capture_output=True, text=True, env=env, timeout=args.child_timeout)
    wall = time.time() - t0
    tb1, tt1 = cpu_ticks()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    hz = os.sysconf("SC_CLK_TCK")
    ncpu = os.cpu_count() or 1
    # CPU used by *other* processes while the child ran, as a fraction of the whole machine
    other_frac = max(0.0, ((tb1 - tb0) / hz - child_cpu) / (wall * ncpu))
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return dict(workload=wl, batch=batch, threads=threads, error=True,
                    returncode=p.returncode, stderr_tail=p.stderr[-2000:])
    r = json.loads(lines[-1][len("RESULT "):])
    # headline numbers
    whole_peak = max(r["after_warmup_hwm_bytes"], r["maxrss_after_timed_bytes"])
    r["peak_rss_bytes"] = whole_peak
    r["train_peak_over_baseline_bytes"] = whole_peak - r["baseline_rss_bytes"]
    r["steady_peak_over_baseline_bytes"] = r["steady_hwm_bytes"] - r["baseline_rss_bytes"]
    r["file_growth_bytes"] = r["end_file_bytes"] - r["baseline_file_bytes"]
    r["train_peak_over_baseline_anon_est_bytes"] = (r["train_peak_over_baseline_bytes"]
                                                    - r["file_growth_bytes"])
    ide = ideal_memory.ideal(wl, batch)
    r["ideal_bytes"] = ide["ideal_bytes"]
    r["ideal_over_baseline_bytes"] = ide["ideal_over_baseline_bytes"]
    r["ideal_breakdown_bytes"] = {k: ide[k] for k in ("W", "G", "D", "A", "T")}
    assert ide["params"] == r["n_params"], (wl, ide["params"], r["n_params"])
    assert ide["params_trainable"] == r["n_params_trainable"], wl
    r["host_busy_before"] = busy_before
    r["other_cpu_frac_during"] = other_frac
    r["loadavg_before"] = load_before
    r["loadavg_after"] = os.getloadavg()
    r["parent_wall_s"] = wall
    r["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    r.update(info)
    return r


LABEL = {
    "linear": "Linear 150528->300 (MSE)",
    "conv2d": "Conv2D 3->3 k3 s2 p1 (MSE)",
    "lstm": "LSTM I=150528 H=10 T=1 (MSE)",
    "lstm_native": "LSTM, oneDNN off (MSE)",
    "fc3": "FC-FC-FC 784-1024-1024-100 (MSE)",
    "fc3_frozen_mid": "FC-FC-FC, middle frozen (MSE)",
    "conv_ac_fl": "Conv-Sigmoid-Flatten (MSE)",
    "lenet5": "LeNet-5 28x28 (CE)",
    "mlp": "MLP 784-256-128-10 (CE)",
    "small_cnn": "SmallCNN c8-c16-fc10 (CE)",
}


CLEAN_SLACK = 0.20


def is_clean(r):
    """A run 'had its cores' if it got >= 90% of `threads` CPUs during the timed steps and other
    processes used no more than the cores it did not ask for (+20% of the machine; this share is
    measured over the whole child lifetime, imports included, so it is only a coarse guard)."""
    ncpu = r.get("nproc") or os.cpu_count() or 1
    free_share = max(0.0, 1.0 - r["threads"] / ncpu)
    return (r.get("cpu_util_timed", 0.0) >= 0.9 * r["threads"]
            and r.get("other_cpu_frac_during", 1.0) <= free_share + CLEAN_SLACK)


def render_md(rows, path):
    order = {wl: i for i, (wl, _) in enumerate(MATRIX)}
    groups = {}
    for r in rows:
        if r.get("error"):
            continue
        groups.setdefault((r["workload"], r["batch"], r["threads"]), []).append(r)

    def med(rs, k):
        return statistics.median(x[k] for x in rs)

    lines = []
    any_r = next((r for r in rows if not r.get("error")), {})
    lines.append("# PyTorch CPU training reference (anchor)\n")
    lines.append(f"torch {any_r.get('torch')} (CPU execution; PyPI wheel is the CUDA build), "
                 f"numpy {any_r.get('numpy')}, Python {any_r.get('python')}, "
                 f"CPU: {any_r.get('cpu')} x{any_r.get('nproc')}, "
                 f"ATen CPU capability {any_r.get('cpu_capability')}.\n")
    lines.append("SGD (lr=%s), float32, fresh process per row. Memory from RSS "
                 "(`ru_maxrss`/`VmHWM`), MiB = 2^20 bytes. Up to %s repetition(s) of the matrix.\n" % (
                     any_r.get("lr", "see jsonl"),
                     max((len(v) for v in groups.values()), default=0)))
    lines.append("| workload | batch | threads | baseline RSS MiB | training peak over baseline MiB "
                 "| ms/step | ideal MiB | ideal over baseline MiB | peak over baseline, anon est. MiB "
                 "| steady-state peak over baseline MiB | autograd-saved MiB | steps | CPU util | other load | clean/runs |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(groups, key=lambda k: (order.get(k[0], 99), k[1], k[2])):
        all_rs = groups[key]
        # prefer repetitions that had their cores to themselves (see is_clean)
        clean = [x for x in all_rs if is_clean(x)]
        rs = clean or all_rs
        wl, b, t = key
        lines.append("| %s | %d | %d | %.1f | %.1f | %.2f | %.1f | %.1f | %.1f | %.1f | %.2f | %d | %.2f | %.2f | %d/%d%s |" % (
            LABEL.get(wl, wl), b, t,
            med(rs, "baseline_rss_bytes") / MiB,
            med(rs, "train_peak_over_baseline_bytes") / MiB,
            med(rs, "ms_per_step_median"),
            rs[0]["ideal_bytes"] / MiB,
            rs[0]["ideal_over_baseline_bytes"] / MiB,
            med(rs, "train_peak_over_baseline_anon_est_bytes") / MiB,
            med(rs, "steady_peak_over_baseline_bytes") / MiB,
            med(rs, "torch_saved_bytes") / MiB,
            int(med(rs, "n_steps")),
            med(rs, "cpu_util_timed"),
            statistics.median(x.get("other_cpu_frac_during", float("nan")) for x in rs),
            len(clean), len(all_rs), "" if clean else " **noisy**"))
    errs = [r for r in rows if r.get("error")]
    if errs:
        lines.append("\nFailed runs:\n")
        for r in errs:
            lines.append(f"- {r['workload']} b={r['batch']} t={r['threads']}: rc={r['returncode']}")
    lines.append("\nColumns: see bench/README.md (\"Metrics\"). Each cell is the median over the "
                 "*clean* repetitions of that row: the run got >= 90%% of its threads' CPU time and other "
                 "processes used at most the cores it did not ask for + %d%% of the machine. Rows marked "
                 "**noisy** had no clean repetition and show the median of all of them; ms/step of noisy "
                 "2-thread rows is dominated by OpenMP stalls on a shared core, not by PyTorch's kernels.\n"
                 % int(CLEAN_SLACK * 100))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--only", default="", help="comma-separated workloads")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="minimum timed steps")
    ap.add_argument("--min-time", type=float, default=1.0,
                    help="keep stepping until this many seconds of timed steps (cap --max-steps)")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--wait-idle", type=float, default=0.0,
                    help="before each run wait up to this many s for the host to be <15%% busy")
    ap.add_argument("--child-timeout", type=int, default=600)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "torch_ref.jsonl"))
    ap.add_argument("--append", action="store_true", help="append to the jsonl instead of truncating")
    ap.add_argument("--md-only", action="store_true")
    args = ap.parse_args()

    if args.child:
        child(json.loads(args.child))
        return

    md_path = os.path.splitext(args.out)[0] + ".md"
    if args.md_only:
        with open(args.out) as f:
            render_md([json.loads(l) for l in f if l.strip()], md_path)
        print(f"wrote {md_path}", file=sys.stderr)
        return

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    only = set(filter(None, args.only.split(",")))
    threads = [int(t) for t in args.threads.split(",")]
    info = env_info()
    rows = []
    if args.append and os.path.exists(args.out):
        with open(args.out) as f:
            rows = [json.loads(l) for l in f if l.strip()]
    mode = "a" if args.append else "w"
    t_all = time.time()
    with open(args.out, mode) as fout:
        for rep in range(args.repeat):
            for wl, batches in MATRIX:
                if only and wl not in only:
                    continue
                for b in batches:
                    for t in threads:
                        r = run_one(wl, b, t, args, info)
                        r["repeat"] = rep
                        r["lr"] = args.lr
                        line = json.dumps(r)
                        print(line, flush=True)
                        fout.write(line + "\n")
                        fout.flush()
                        rows.append(r)
                        if not r.get("error"):
                            print(f"# {wl} b={b} t={t}: base {r['baseline_rss_bytes']/MiB:.0f} MiB, "
                                  f"+{r['train_peak_over_baseline_bytes']/MiB:.1f} MiB, "
                                  f"{r['ms_per_step_median']:.2f} ms/step, "
                                  f"ideal {r['ideal_bytes']/MiB:.1f} MiB", file=sys.stderr, flush=True)
                        else:
                            print(f"# {wl} b={b} t={t}: ERROR {r['stderr_tail'][-500:]}",
                                  file=sys.stderr, flush=True)
    render_md(rows, md_path)
    print(f"# total {time.time() - t_all:.0f}s; wrote {args.out} and {md_path}", file=sys.stderr)


if __name__ == "__main__":
    main()
