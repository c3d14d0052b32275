"""The Python package's figures (run by `cargo xtask bench python`, which builds and installs the wheel
first):

1. Federated vs centralised: R rounds of FedAvg over C clients (Flower's simulation engine, the
   examples/flower app: non-IID digits, each client within its device class's budget,
   E local epochs a round) against one trainer on the whole training set for R x E epochs — the same
   sample-passes; held-out
   accuracy of both.
2. Every client's arena against its budget, per device class.
3. Python's per-call overhead: `Trainer.train_step` called from Python on the digits MLP at batch 32,
   against the same `train_batch` call made from Rust in a loop (`Trainer._time_steps`), in short
   alternating rounds.
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile
import time

import numpy as np

import frugal

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples" / "flower"))


def federated(rounds: int, clients: int) -> None:
    from flwr.simulation import run_simulation

    from frugal_flower import task
    from frugal_flower.client_app import make_client_app
    from frugal_flower.server_app import make_server_app

    out = pathlib.Path(tempfile.mkdtemp()) / "fl.json"
    t0 = time.perf_counter()
    run_simulation(
        server_app=make_server_app(
            **{"num-server-rounds": rounds, "min-nodes": clients, "results-path": str(out)}
        ),
        client_app=make_client_app(),
        num_supernodes=clients,
        backend_config={"client_resources": {"num_cpus": 1}},
    )
    fl_secs = time.perf_counter() - t0
    rec = json.loads(out.read_text())
    fed = rec["accuracy"][-1]["accuracy"]
    e = int(task.DEFAULTS["local-epochs"])
    cen = task.centralised(epochs=rounds * e)["accuracy"]
    print(f"\n## Federated vs centralised ({rounds} rounds x {clients} clients, non-IID digits)\n")
    print("| training | sample-passes | held-out accuracy |\n|---|---|---|")
    print(f"| FedAvg on Flower (simulation), {e} local epochs/round | {rounds * e} x 1437 | {fed:.4f} |")
    print(f"| centralised, {rounds * e} epochs | {rounds * e} x 1437 | {cen:.4f} |")
    gap = (cen - fed) * 100
    print(f"\ngap: {gap:+.2f} pt (centralised - federated); simulation took {fl_secs:.1f} s")
    print("per round:", " ".join(f"{a['accuracy']:.3f}" for a in rec["accuracy"]))

    print("\n## Arena vs budget per device class (every client, every round)\n")
    print("| class | budget | clients | arena (bytes) | allocated max | within budget | rung | recomputes/step |")
    print("|---|---|---|---|---|---|---|---|")
    for name, _ in task.DEVICE_CLASSES:
        rows = [c for c in rec["clients"] if task.device_class(c["partition-id"])[0] == name]
        if not rows:
            continue
        budget = rows[0]["budget"]
        ok = all(c["allocated-bytes"] <= c["budget"] for c in rows)
        print(
            f"| {name} | {budget} | {len({c['partition-id'] for c in rows})} | "
            f"{sorted({c['arena-bytes'] for c in rows})} | {max(c['allocated-bytes'] for c in rows)} | "
            f"{'yes' if ok else 'NO'} | {sorted({c['rung'] for c in rows})} | "
            f"{sorted({c['recomputes'] for c in rows})} |"
        )


def overhead(reps: int, steps: int) -> None:
    xtr, ytr, _, _ = frugal.digits()
    t = frugal.Trainer(str(REPO / "examples" / "digits-mlp.toml"))
    x, y = np.ascontiguousarray(xtr[:32]), ytr[:32]
    t._time_steps(x, y, steps)  # warm-up
    py, rs = [], []

    def from_python():
        s = time.perf_counter()
        for _ in range(steps):
            t.train_step(x, y)
        py.append((time.perf_counter() - s) / steps)

    def from_rust():
        rs.append(t._time_steps(x, y, steps) / steps)

    # Short rounds, alternating which goes first, so both see the same load on a shared machine.
    for r in range(reps):
        for f in (from_python, from_rust) if r % 2 == 0 else (from_rust, from_python):
            f()
    mp, mr = statistics.median(py), statistics.median(rs)
    print(f"\n## Python per-call overhead (digits MLP, batch 32, {reps} alternating rounds of {steps} steps)\n")
    print("| caller | median per step | fastest round per step |\n|---|---|---|")
    print(f"| Rust loop (`train_batch`) | {mr * 1e6:.1f} us | {min(rs) * 1e6:.1f} us |")
    print(f"| Python `train_step` | {mp * 1e6:.1f} us | {min(py) * 1e6:.1f} us |")
    ratios = sorted(p / r - 1 for p, r in zip(py, rs))
    print(
        f"\noverhead: {(mp - mr) * 1e6:.1f} us per call = {(mp - mr) / mr * 100:.2f} % of the step (medians); "
        f"total time {(sum(py) / sum(rs) - 1) * 100:.2f} %; median of the per-round ratios "
        f"{statistics.median(ratios) * 100:.2f} % (pairs from {ratios[0] * 100:.1f} % to "
        f"{ratios[-1] * 100:.1f} %: this machine's noise)"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="frugal's Python figures")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--only", choices=["fl", "overhead"], default=None)
    a = ap.parse_args()
    if a.only in (None, "overhead"):
        overhead(a.reps, a.steps)
    if a.only in (None, "fl"):
        federated(a.rounds, a.clients)
