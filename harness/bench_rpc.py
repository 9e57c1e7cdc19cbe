"""What ggml-rpc costs on loopback: llama-bench tok/s of the model split over rpc-servers against the
same model in one process, in one run (balanced AB/BA order, medians), and the bytes that cross the
rpc sockets per generated token.

    python -m harness.bench_rpc --bin BUILD/bin --model gemma-3-270m-q4_k_m.gguf [--servers 2] [--rounds 4]

Settings per round (order rotated each round): `local` (one process, default CPU buffers incl.
repacked weights), `local-norepack` (--repack 0: the kernels an rpc-server's CPU device runs), `rpc`
(all layers on --servers loopback rpc-servers, -ngl 99, even --tensor-split). Every process gets
-t THREADS; at batch 1 the rpc-servers compute one after another, never at the same time.

Transfer volume: llama-bench through a counting TCP proxy in front of each rpc-server, for two
generation lengths; the difference of the byte counts over the difference of the lengths is the
volume per generated token (client->server and server->client), the rest is set-up (weights upload,
graph reservation, prompt).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import threading
from pathlib import Path

from . import rpc, server


class CountingProxy:
    """127.0.0.1:port -> target, counting bytes each way (for all connections)."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        self.up = 0     # client -> server
        self.down = 0   # server -> client
        self.lock = threading.Lock()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(self.target)
            for a, b, attr in ((c, s, "up"), (s, c, "down")):
                threading.Thread(target=self._pump, args=(a, b, attr), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, attr: str):
        try:
            while True:
                b = src.recv(1 << 20)
                if not b:
                    break
                with self.lock:
                    setattr(self, attr, getattr(self, attr) + len(b))
                dst.sendall(b)
        except OSError:
            pass
        finally:
            for x in (src, dst):
                try:
                    x.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.up, self.down

    def close(self):
        self.sock.close()


def bench_once(bin_dir: Path, model: Path, threads: int, reps: int, tg: int, extra: list[str],
               timeout: float = 1800) -> float:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(model), "-t", str(threads), "-r", str(reps), "-o", "json",
           "-p", "0", "-n", str(tg), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    rows = json.loads(r.stdout)
    return float(rows[0]["avg_ts"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_rpc", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, required=True, help="folder with llama-bench and ggml-rpc-server")
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--servers", type=int, default=2, help="loopback rpc-servers to split over (default 2)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds, order rotated each round (default 4)")
    ap.add_argument("-t", "--threads", type=int, default=1, help="threads of every process (default 1)")
    ap.add_argument("-r", "--reps", type=int, default=3, help="llama-bench repetitions per run (default 3)")
    ap.add_argument("--tg", type=int, default=64, help="generated tokens (default 64)")
    ap.add_argument("--volume-tokens", default="16,80",
                    help="two generation lengths for the transfer volume (default 16,80)")
    ap.add_argument("--no-volume", action="store_true", help="skip the transfer-volume measurement")
    ap.add_argument("--local-ngl", default="0",
                    help="-ngl of the local settings (default 0: a CPU build; 99 to compare a local GPU with a GPU "
                         "rpc-server on the same machine)")
    args = ap.parse_args(argv)

    names = [f"bench-rpc-{os.getpid()}-{i}" for i in range(args.servers)]
    pair = []
    try:
        for n in names:
            pair.append(rpc.start(args.bin / rpc.EXE, server.free_port(), threads=args.threads, name=n))
        eps = [("127.0.0.1", p["port"]) for p in pair]
        ts = "/".join(["1"] * args.servers)
        rpc_args = ["--rpc", ",".join(f"{h}:{p}" for h, p in eps), "-ngl", "99", "-ts", ts]
        settings = {"local": ["-ngl", args.local_ngl], "local-norepack": ["-ngl", args.local_ngl, "--repack", "0"],
                    "rpc": rpc_args}
        keys = list(settings)
        res: dict[str, list[float]] = {k: [] for k in keys}
        for r in range(args.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            if r % 2:
                order = order[::-1]
            for k in order:
                v = bench_once(args.bin, args.model, args.threads, args.reps, args.tg, settings[k])
                res[k].append(v)
                print(f"round {r} {k:15s} tg{args.tg} {v:7.2f} tok/s", flush=True)
        print()
        print(f"{'setting':15s} {'tok/s':>8s} {'rpc/this':>9s}   (medians over {args.rounds} rounds, "
              f"-t {args.threads}, {args.servers} rpc-servers, {args.model.name})")
        for k in keys:
            ratio = statistics.median(b / a for a, b in zip(res[k], res["rpc"]))
            print(f"{k:15s} {statistics.median(res[k]):8.2f} {ratio:9.3f}")

        if not args.no_volume:
            n1, n2 = (int(x) for x in args.volume_tokens.split(","))
            proxies = [CountingProxy(ep) for ep in eps]
            try:
                pargs = ["--rpc", ",".join(f"127.0.0.1:{p.port}" for p in proxies), "-ngl", "99", "-ts", ts,
                         "--no-warmup"]
                got = []
                for n in (n1, n2):
                    before = [p.counts() for p in proxies]
                    bench_once(args.bin, args.model, args.threads, 1, n, pargs)
                    after = [p.counts() for p in proxies]
                    got.append([(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)])
            finally:
                for p in proxies:
                    p.close()
            print()
            print(f"transfer volume (llama-bench -n {n1} vs -n {n2}, -r 1, through counting proxies):")
            for i in range(args.servers):
                up = (got[1][i][0] - got[0][i][0]) / (n2 - n1)
                down = (got[1][i][1] - got[0][i][1]) / (n2 - n1)
                print(f"  rpc-server {i}: per token {up / 1024:8.1f} KiB to the server, {down / 1024:8.1f} KiB back; "
                      f"run of -n {n1}: {got[0][i][0] / 2**20:8.1f} MiB up, {got[0][i][1] / 2**20:6.2f} MiB down")
    finally:
        for n in names:
            rpc.stop(n)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
