"""Runs the app on Flower's deployment engine on this machine: a SuperLink and N SuperNodes as separate
processes on 127.0.0.1 (over Flower's gRPC), the run submitted with ``flwr run``, everything stopped
afterwards. Used by ``python/tests/test_flower.py`` and by hand:

    python -m frugal_flower.deploy --nodes 3 --rounds 2 --results /tmp/run.json
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

APP = pathlib.Path(__file__).resolve().parents[1]


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _tool(name: str) -> str:
    """A Flower command from this interpreter's environment (a venv's bin/), else PATH."""
    here = pathlib.Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def _stop(procs: list[subprocess.Popen]) -> None:
    """Stops each process group (the SuperLink and SuperNodes start the app processes as children)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def run_deployment(nodes: int, rounds: int, results: str, timeout: float = 300.0) -> dict:
    """Starts a SuperLink and ``nodes`` SuperNodes, runs ``rounds`` rounds of the app over them and
    returns the ServerApp's JSON record. Raises ``RuntimeError`` (with the processes' logs) when the
    run fails or takes longer than ``timeout`` seconds; every process is stopped either way."""
    home = pathlib.Path(tempfile.mkdtemp(prefix="frugal-flwr-"))
    # Flower >= 1.2x serves the SuperLink's Fleet, Control and Runtime APIs on one HTTP port.
    link, *node_rt = _free_ports(1 + nodes)
    (home / "config.toml").write_text(
        '[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
        f'address = "127.0.0.1:{link}"\ninsecure = true\n'
    )
    # The SuperLink and SuperNodes start Flower's other commands (SuperExec, the app processes) by
    # name: this interpreter's bin/ goes first on PATH.
    path = os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, FLWR_HOME=str(home), PATH=path)
    logs = []
    procs: list[subprocess.Popen] = []

    def start(name: str, cmd: list[str]) -> None:
        log = open(home / f"{name}.log", "w")
        logs.append(home / f"{name}.log")
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

    try:
        start(
            "superlink",
            [
                _tool("flower-superlink"),
                "--insecure",
                "--host=127.0.0.1",
                f"--port={link}",
            ],
        )
        for i in range(nodes):
            start(
                f"supernode{i}",
                [
                    _tool("flower-supernode"),
                    "--insecure",
                    f"--superlink=127.0.0.1:{link}",
                    "--host=127.0.0.1",
                    f"--port={node_rt[i]}",
                    f"--node-config=partition-id={i} num-partitions={nodes}",
                ],
            )
        cfg = f"num-server-rounds={rounds} min-nodes={nodes} results-path='{results}'"
        deadline = time.monotonic() + timeout
        # The SuperLink's Control API may take a moment to listen: retry the submission briefly.
        while True:
            r = subprocess.run(
                [_tool("flwr"), "run", str(APP), "deploy", "--run-config", cfg, "--stream"],
                env=env,
                capture_output=True,
                text=True,
                timeout=max(1.0, deadline - time.monotonic()),
            )
            logs.append(("flwr run", r.stdout + r.stderr))
            if pathlib.Path(results).exists() or time.monotonic() > deadline - 5:
                break
            if r.returncode == 0:
                # --stream returned before the ServerApp wrote its record: wait for it.
                while not pathlib.Path(results).exists() and time.monotonic() < deadline:
                    time.sleep(0.5)
                break
            time.sleep(2)
        if not pathlib.Path(results).exists():
            raise RuntimeError("the deployment run wrote no results:\n" + _dump(logs))
        with open(results) as f:
            return json.load(f)
    except subprocess.TimeoutExpired as e:
        raise RuntimeError(f"the deployment run took over {timeout} s:\n{_dump(logs)}") from e
    finally:
        _stop(procs)
        shutil.rmtree(home, ignore_errors=True)


def _dump(logs) -> str:
    out = []
    for item in logs:
        if isinstance(item, tuple):
            out.append(f"--- {item[0]}\n{item[1][-4000:]}")
        elif pathlib.Path(item).exists():
            out.append(f"--- {item.name}\n{pathlib.Path(item).read_text()[-4000:]}")
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--results", default="deployment.json")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    rec = run_deployment(a.nodes, a.rounds, os.path.abspath(a.results), a.timeout)
    for r in rec["accuracy"]:
        print(f"round {r['round']}: held-out accuracy {r['accuracy']:.4f}")
